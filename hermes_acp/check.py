"""``hermes-acp --check``: is this machine ready to run turns?"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from . import __version__
from .config import ConfigError, Settings, envFile, hermesHome, resolveEndpoint, stateDatabase
from .engine.sandbox import describe
from .engine.tools.websearch import searchLimits, searchStatus
from .engine.webfetch import FetchSettings


def stateProblem(path: Path) -> str | None:
    """Why ``state.db`` could not be written, or None when it can."""
    if path.exists():
        try:
            connection = sqlite3.connect(path, timeout=2)
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("ROLLBACK")
            finally:
                connection.close()
        except sqlite3.Error as e:
            return f"{path} is not writable: {e}"
        return None
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create {path}: {folder} is not writable"
    return None


def mcpSummary(home: Path) -> str:
    """config.yaml's MCP servers (the editor lists its own per session), and what is wrong with them."""
    from .mcp.specs import ConfiguredServers, configFile

    path = configFile(home)
    specs, problems = ConfiguredServers(path).read()
    if not specs and not problems:
        return f"none in {path} (editors list their own per session)"
    listed = ", ".join(f"{spec.name} ({spec.transport})" for spec in specs) or "none usable"
    return f"{listed} from {path}" + "".join(f"\n{'':13}problem: {problem}" for problem in problems)


def skillsSummary(settings: Settings, env: Mapping[str, str]) -> str:
    """The skills of ``$HERMES_HOME/skills`` and of the current folder's project, and each
    one skipped with its reason (as ``/doctor`` shows them in a session)."""
    from .commands import commandNames
    from .skillcommands import describe, skillLibrary

    library = skillLibrary(settings, commandNames(), env)
    return describe(library, library.catalog(os.getcwd())).replace("\n", f"\n{'':13}")


def checkpointSummary(settings: Settings, home: Path) -> str:
    """Whether turns are checkpointed (``/rewind`` puts files back), where, and how full."""
    if not settings.checkpoints:
        return "off (HERMES_ACP_CHECKPOINTS=off): /rewind and /undo take back the conversation only"
    folder = home / "checkpoints"
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"not working: {existing} is not writable, so /rewind cannot put files back"
    used = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    return (f"on, in {folder} ({used / 2**20:.1f} of {settings.checkpointStoreMax / 2**20:.0f} MiB used); "
            "its own store, git not needed")


def runCheck(out: TextIO, env: Mapping[str, str] | None = None) -> int:
    """Print what hermes-acp resolved; 0 when ready, 1 with the reasons when not."""
    env = os.environ if env is None else env
    endpoint = resolveEndpoint(env)
    dotenv = envFile(env)
    state = stateDatabase(env)
    problems = endpoint.problems()
    stateIssue = stateProblem(state)
    if stateIssue:
        problems.append(stateIssue)
    try:
        settings = Settings.fromEnv(env)
    except ConfigError as e:
        problems.append(str(e))
        settings = Settings()
    try:
        FetchSettings.fromEnv(env)
        searchLimits(env)
    except ConfigError as e:
        problems.append(str(e))
    rows = [
        ("version", __version__),
        ("home", str(hermesHome(env))),
        ("config file", f"{dotenv} ({'found' if dotenv.is_file() else 'not found'})"),
        ("provider", endpoint.provider),
        ("endpoint", endpoint.shownURL),
        ("model", endpoint.model or "(none)"),
        ("API key", "present" if endpoint.keyPresent else "not set"),
        ("state.db", f"{state} ({'not writable' if stateIssue else 'writable'})"),
        ("commands", describe(settings.sandbox != "off", settings.sandboxNetwork)),
        ("MCP servers", mcpSummary(hermesHome(env))),
        ("web search", searchStatus(env)[1]),
        ("skills", skillsSummary(settings, env)),
        ("checkpoints", checkpointSummary(settings, hermesHome(env))),
    ]
    for name, value in rows:
        out.write(f"{name + ':':13}{value}\n")
    if problems:
        out.write("\nNot ready:\n")
        out.writelines(f"  - {p}\n" for p in problems)
        return 1
    out.write("\nReady.\n")
    return 0
