"""Where the tools touch the user's machine: file text and shell commands.

``read_file``, ``write_file``, ``patch`` and ``terminal`` go through a
``Workspace``, so the ACP layer can swap in the editor's own ``fs/*`` and
``terminal/*`` methods. ``LocalWorkspace`` is the default: the local disk and a
local shell. Everything here is synchronous and runs in worker threads.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import attrs

if TYPE_CHECKING:  # the process machinery loads with the first command, not at startup
    from hermes_acp.engine.processes import Limits
    from hermes_acp.engine.sandbox import Policy

DEFAULT_OUTPUT_LIMIT = 50_000
# Give the shell's last output this long to arrive after it exits; a background
# job that keeps the pipe open does not hold the tool call past it.
_DRAIN_GRACE = 0.5
_POLL = 0.05
#: How often a running command's output so far is shown (``Workspace.runCommand``'s ``onOutput``).
OUTPUT_EVERY = 0.5
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

    ``runCommand`` runs a command with a sandbox ``policy`` on this machine, in
    that sandbox (with ``limits``); one without may run in the editor's terminal.
    Either way the guard judged it as confined exactly when ``policy`` is given.

    Paths are absolute. ``readText`` raises ``FileNotFoundError`` for a missing
    file and ``WorkspaceError`` (or another ``OSError``) for anything it cannot
    read; ``writeText`` creates missing parent directories. ``runCommand`` runs
    ``command`` with no input, ends it (and everything it started) on timeout or
    as soon as ``cancelEvent`` is set, and keeps about ``outputLimit`` characters
    of output, from the start and the end; ``meta`` carries anything extra the
    editor should know (such as a client terminal id). When the command runs in
    one of the editor's terminals, ``onStarted(terminalId)`` is called (in the
    caller's thread) as soon as the terminal exists; when it runs here,
    ``onOutput(text)`` gets the output so far (capped the same way) as it comes,
    at most every ``OUTPUT_EVERY`` seconds, so the card shows what the editor's
    terminal would. ``env`` adds to the command's environment (a read-only git's
    safe settings).
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
        policy: Policy | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        onOutput: Callable[[str], object] | None = None,
    ) -> CommandResult: ...


def looksBinary(data: bytes) -> bool:
    return b"\0" in data[:8192]


class OutputCap:
    """Keep the head and the tail of a byte stream, counting what falls between
    (a foreground command's output, and each background process's ring buffer)."""

    def __init__(self, limit: int) -> None:
        self._headLimit = int(limit * 0.4)
        self._tailLimit = limit - self._headLimit
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0
        self.total = 0  # every byte fed, kept or not

    def tail(self, limit: int) -> str:
        """About the last ``limit`` bytes kept, as text (the whole text when it is shorter)."""
        kept = self._tail if self.dropped else self._head + self._tail
        return bytes(kept[-limit:]).decode("utf-8", "replace")

    def feed(self, data: bytes) -> None:
        self.total += len(data)
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


def _opened(path: str, flags: int) -> BinaryIO:
    """``path`` opened where it is, not where a link leads: the tools judged the
    real path, and a link swapped into it since (or into a folder above it)
    fails instead of leading the read or the write elsewhere."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        where = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else path
    except OSError:
        where = path
    if where != path:
        os.close(fd)
        raise WorkspaceError(f"{path} changed while it was opened (it now leads to {where}); nothing was done")
    return os.fdopen(fd, "rb" if flags == os.O_RDONLY else "wb")


def readBytes(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the local file ``path``, opened as ``_opened`` does (images:
    an editor's ``fs/read_text_file`` carries text only)."""
    with _opened(path, os.O_RDONLY) as f:
        return f.read(limit)


@attrs.frozen
class LocalWorkspace:
    """The local file system and a local ``/bin/sh``."""

    def readText(self, path: str) -> str:
        with _opened(path, os.O_RDONLY) as f:
            data = f.read()
        if looksBinary(data):
            raise WorkspaceError(f"{path} is a binary file")
        return data.decode("utf-8", "replace")

    def writeText(self, path: str, content: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with _opened(path, os.O_WRONLY | os.O_CREAT) as f:
            f.truncate()
            f.write(content.encode("utf-8"))

    def runCommand(
        self,
        command: str,
        cwd: str,
        timeout: float,
        cancelEvent: threading.Event,
        outputLimit: int = DEFAULT_OUTPUT_LIMIT,
        onStarted: Callable[[str], object] | None = None,
        policy: Policy | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        onOutput: Callable[[str], object] | None = None,
    ) -> CommandResult:
        """Run ``command`` in its own process group with stdin from /dev/null,
        sandboxed by ``policy`` when given, without the agent's credentials.

        A timeout or ``cancelEvent`` kills the whole group, and whatever left it.
        """
        from hermes_acp.engine import processes
        from hermes_acp.engine.secrets import childEnvironment

        try:
            process, mark = processes.spawn(
                ["/bin/sh", "-c", command], cwd, {**childEnvironment(), **_CHILD_ENV, **(env or {})}, policy,
                limits or processes.Limits(),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
        except OSError as e:
            raise WorkspaceError(f"cannot start the command in {cwd}: {e.strerror or e}") from e
        assert process.stdout is not None
        fd = process.stdout.fileno()
        cap = OutputCap(outputLimit)
        deadline = time.monotonic() + timeout
        timedOut = cancelled = eof = unshown = False
        exitedAt: float | None = None
        showAt = time.monotonic() + OUTPUT_EVERY
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
                    unshown = unshown or bool(chunk)
                if cancelEvent.is_set():
                    cancelled = True
                    break
                now = time.monotonic()
                if unshown and onOutput is not None and now >= showAt and process.poll() is None:
                    onOutput(cap.text())
                    unshown, showAt = False, now + OUTPUT_EVERY
                if now > deadline:
                    timedOut = True
                    break
                if process.poll() is not None:
                    exitedAt = now if exitedAt is None else exitedAt
                    if eof or now - exitedAt > _DRAIN_GRACE:
                        break
        finally:
            if cancelled or timedOut or process.poll() is None:
                processes.end(process, mark)
            process.stdout.close()
            exitCode = process.wait()
            processes.release(process)
        return CommandResult(
            output=cap.text(),
            exitCode=None if (cancelled or timedOut) else exitCode,
            timedOut=timedOut,
            truncated=bool(cap.dropped),
            cancelled=cancelled,
        )
