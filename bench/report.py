"""The Markdown table, the machine it ran on, and its place in docs/performance.md."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .cases import MiB, Result
from .client import REPO

BEGIN = "<!-- bench:begin (written by `python bench/run.py --write-docs`; edit outside these markers) -->"
END = "<!-- bench:end -->"


def _show(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value * 1000:.1f} ms"
    if unit == "MiB":
        return f"{value / MiB:.1f} MiB"
    if unit == "µs":
        return f"{value * 1e6:.1f} µs"
    if unit == "ratio":
        return f"{value:.2f}"
    return f"{value:.3f} s"


def table(results: list[Result]) -> str:
    lines = [
        "| measure | median | runs | min – max | target | within target? | notes |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        verdict = {None: "—", True: "yes", False: "**no**"}[r.within]
        spread = f"{_show(min(r.samples), r.unit)} – {_show(max(r.samples), r.unit)}"
        lines.append(f"| {r.label} | {_show(r.median, r.unit)} | {len(r.samples)} | {spread} | {r.targetText} | {verdict} | {r.note} |")
    return "\n".join(lines)


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _cpuModel() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _revision() -> str:
    """The agent's git commit, and whether its package has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=False).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "hermes_acp")
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"
    return f"commit {commit or 'unknown'}" + (" + uncommitted changes in hermes_acp/" if dirty else "")


def loadAverage() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def machine() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"CPU {_cpuModel()}, {os.cpu_count()} cores ({usable} usable); "
        f"{platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}; Twisted {_package('twisted')}; "
        f"hermes-acp {_package('hermes-acp-twisted')} ({_revision()})"
    )


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def render(results: list[Result], mode: str, when: str, loads: tuple[str, str]) -> str:
    return (
        f"Run: {when}, `python bench/run.py{mode}`\n\n"
        f"Machine: {machine()}; load average {loads[0]} at the start, {loads[1]} at the end\n\n"
        f"{table(results)}\n"
    )


def writeDocs(path: Path, block: str) -> None:
    """Replace the generated block of ``path`` (or start the file with one)."""
    generated = f"{BEGIN}\n{block}{END}"
    text = path.read_text() if path.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    head, found, rest = text.partition(BEGIN)
    if not found or END not in rest:
        raise SystemExit(f"{path}: the markers of the generated block are missing")
    path.write_text(head + generated + rest.split(END, 1)[1])
