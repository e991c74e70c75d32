"""Run the real agent process the ways users do, with a private HERMES_HOME."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

BIN = Path(sys.executable).parent
ENTRY_POINTS: dict[str, list[str]] = {
    "python -m hermes_acp": [sys.executable, "-m", "hermes_acp"],
    "hermes-acp": [str(BIN / "hermes-acp")],
    "twist hermes-acp": [str(BIN / "twist"), "hermes-acp"],
}
_MODEL_VARS = (
    "HERMES_BASE_URL", "HERMES_API_KEY", "HERMES_MODEL", "HERMES_MODELS", "HERMES_PROVIDER",
    "OPENROUTER_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "NOUS_API_KEY",
    # the web search backends (a developer's own would offer web_search to every test's model)
    "SEARXNG_URL", "BRAVE_SEARCH_API_KEY", "TAVILY_API_KEY", "EXA_API_KEY", "FIRECRAWL_API_KEY", "FIRECRAWL_API_URL",
)


def processGone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped while being read
        return True


def agentEnv(home: str | os.PathLike[str] | None = None, **extra: str) -> dict[str, str]:
    """The test process's environment minus model settings, with its own HERMES_HOME."""
    env = {k: v for k, v in os.environ.items() if k not in _MODEL_VARS and not k.startswith("HERMES_ACP_")}
    env["HERMES_HOME"] = str(home) if home is not None else tempfile.mkdtemp(prefix="hermes-home-")
    env.update(extra)
    return env


def frame(method: str, params: Mapping[str, Any] | None = None, requestId: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if requestId is not None:
        message["id"] = requestId
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


def initialize(requestId: Any = 0, **params: Any) -> bytes:
    return frame("initialize", {"protocolVersion": 1, "clientCapabilities": {}, **params}, requestId)


@attrs.frozen
class Run:
    stdout: bytes
    stderr: bytes
    returncode: int

    def frames(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as JSON; any other line fails the test."""
        lines = self.stdout.split(b"\n")
        assert lines[-1] == b"", f"stdout does not end with a newline: {self.stdout[-200:]!r}"
        parsed = []
        for line in lines[:-1]:
            try:
                value = json.loads(line)
            except ValueError:
                raise AssertionError(f"non-JSON line on stdout: {line[:200]!r}") from None
            assert isinstance(value, dict) and value.get("jsonrpc") == "2.0", line[:200]
            parsed.append(value)
        return parsed

    def byId(self) -> dict[Any, dict[str, Any]]:
        return {json.dumps(f.get("id")): f for f in self.frames() if "method" not in f}


def runAgent(
    stdin: bytes | Iterable[bytes],
    argv: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: str | None = None,
) -> Run:
    """Feed ``stdin`` to the agent, close it, and collect everything it wrote."""
    data = stdin if isinstance(stdin, bytes) else b"".join(stdin)
    result = subprocess.run(
        argv or ENTRY_POINTS["python -m hermes_acp"],
        input=data,
        capture_output=True,
        env=dict(env) if env is not None else agentEnv(),
        timeout=timeout,
        cwd=cwd or tempfile.gettempdir(),
    )
    return Run(result.stdout, result.stderr, result.returncode)


class LiveAgent:
    """An agent process we talk to line by line (for timing EOF and signals)."""

    def __init__(
        self, argv: list[str] | None = None, env: Mapping[str, str] | None = None,
        preexec: Callable[[], Any] | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            argv or ENTRY_POINTS["python -m hermes_acp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env) if env is not None else agentEnv(),
            cwd=tempfile.gettempdir(),
            preexec_fn=preexec,
        )

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def readFrame(self, timeout: float = 30) -> dict[str, Any]:
        """The next frame the agent writes; fails after ``timeout`` seconds without one."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        line = b""
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise AssertionError(f"no frame from the agent within {timeout} s")
            chunk = os.read(fd, 1)  # byte by byte: nothing read past the line stays unseen
            assert chunk, "agent closed stdout"
            line += chunk
        return json.loads(line)

    def closeStdinAndWait(self, timeout: float = 10) -> int:
        """Close stdin; the exit code (fails if the process outlives ``timeout`` seconds)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
