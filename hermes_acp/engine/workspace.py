"""Where the tools touch the user's machine: file text and shell commands.

``read_file``, ``write_file``, ``patch`` and ``terminal`` go through a
``Workspace``, so the ACP layer can swap in the editor's own ``fs/*`` and
``terminal/*`` methods. ``LocalWorkspace`` is the default: the local disk and a
local shell. Everything here is synchronous and runs in worker threads.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

DEFAULT_OUTPUT_LIMIT = 50_000
# Give the shell's last output this long to arrive after it exits; a background
# job that keeps the pipe open does not hold the tool call past it.
_DRAIN_GRACE = 0.5
_POLL = 0.05
# The shell's output is read through a pipe; the shell is told to be non-interactive.
_CHILD_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0", "TERM": "dumb"}


class WorkspaceError(Exception):
    """A file or command request failed; the message is shown to the model."""


@attrs.frozen
class CommandResult:
    """What a finished (or killed) command left behind."""

    output: str
    exitCode: int | None
    timedOut: bool = False
    truncated: bool = False
    cancelled: bool = False
    meta: dict[str, Any] = attrs.field(factory=dict)


class Workspace(Protocol):
    """File text and command execution for the tools (called in worker threads).

    Paths are absolute. ``readText`` raises ``FileNotFoundError`` for a missing
    file and ``WorkspaceError`` (or another ``OSError``) for anything it cannot
    read; ``writeText`` creates missing parent directories. ``runCommand`` runs
    ``command`` with no input, ends it (and everything it started) on timeout or
    as soon as ``cancelEvent`` is set, and keeps about ``outputLimit`` characters
    of output, from the start and the end; ``meta`` carries anything extra the
    editor should know (such as a client terminal id). When the command runs in
    one of the editor's terminals, ``onStarted(terminalId)`` is called (in the
    caller's thread) as soon as the terminal exists.
    """

    def readText(self, path: str) -> str: ...

    def writeText(self, path: str, content: str) -> None: ...

    def runCommand(
        self,
        command: str,
        cwd: str,
        timeout: float,
        cancelEvent: threading.Event,
        outputLimit: int = DEFAULT_OUTPUT_LIMIT,
        onStarted: Callable[[str], object] | None = None,
    ) -> CommandResult: ...


def looksBinary(data: bytes) -> bool:
    return b"\0" in data[:8192]


class OutputCap:
    """Keep the head and the tail of a byte stream, counting what falls between."""

    def __init__(self, limit: int) -> None:
        self._headLimit = int(limit * 0.4)
        self._tailLimit = limit - self._headLimit
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self._headLimit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        excess = len(self._tail) - self._tailLimit
        if excess > 0:
            del self._tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self._head + self._tail).decode("utf-8", "replace")
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        return f"{head}\n\n... [{self.dropped} bytes of output omitted] ...\n\n{tail}"


def _killGroup(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@attrs.frozen
class LocalWorkspace:
    """The local file system and a local ``/bin/sh``."""

    def readText(self, path: str) -> str:
        with open(path, "rb") as f:
            data = f.read()
        if looksBinary(data):
            raise WorkspaceError(f"{path} is a binary file")
        return data.decode("utf-8", "replace")

    def writeText(self, path: str, content: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)

    def runCommand(
        self,
        command: str,
        cwd: str,
        timeout: float,
        cancelEvent: threading.Event,
        outputLimit: int = DEFAULT_OUTPUT_LIMIT,
        onStarted: Callable[[str], object] | None = None,
    ) -> CommandResult:
        """Run ``command`` in its own process group with stdin from /dev/null.

        A timeout or ``cancelEvent`` kills the whole group.
        """
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **_CHILD_ENV},
            )
        except OSError as e:
            raise WorkspaceError(f"cannot start the command in {cwd}: {e}") from e
        assert process.stdout is not None
        fd = process.stdout.fileno()
        cap = OutputCap(outputLimit)
        deadline = time.monotonic() + timeout
        timedOut = cancelled = eof = False
        exitedAt: float | None = None
        try:
            while True:
                if eof:
                    try:
                        process.wait(_POLL)
                    except subprocess.TimeoutExpired:
                        pass
                elif select.select([fd], [], [], _POLL)[0]:
                    chunk = os.read(fd, 65536)
                    cap.feed(chunk)
                    eof = not chunk
                if cancelEvent.is_set():
                    cancelled = True
                    break
                now = time.monotonic()
                if now > deadline:
                    timedOut = True
                    break
                if process.poll() is not None:
                    exitedAt = now if exitedAt is None else exitedAt
                    if eof or now - exitedAt > _DRAIN_GRACE:
                        break
        finally:
            if cancelled or timedOut or process.poll() is None:
                _killGroup(process)
            process.stdout.close()
            exitCode = process.wait()
        return CommandResult(
            output=cap.text(),
            exitCode=None if (cancelled or timedOut) else exitCode,
            timedOut=timedOut,
            truncated=bool(cap.dropped),
            cancelled=cancelled,
        )
