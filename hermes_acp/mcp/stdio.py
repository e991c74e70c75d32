"""A stdio MCP server: a child in a process group of its own, on the reactor.

The child is started through a few lines of Python that call ``setsid`` and
exec the server, so the server and everything it starts (``npx`` wraps
``node``) can be ended together. Its stderr is read all the time (a server
blocked on a full stderr pipe answers nothing): the last few KB are kept for
the user, lines go to the log at debug level up to a bound. Stopping closes
its stdin, then sends SIGTERM to the group, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import attrs
from twisted.internet.defer import TimeoutError
from twisted.logger import Logger

from ..child import RPCChild
from ..engine import processes
from ..engine.secrets import childEnvironment, redact
from .specs import ServerSpec
from .wire import MCPConnection

log = Logger()

# argv: the agent's pid, the folder to start in (empty: stay), then the server's command line.
# The folder is changed here, not by spawnProcess: given none, the reactor can posix_spawn
# instead of fork. On Linux the server is killed if the agent dies (even by SIGKILL, when no
# shutdown runs): PR_SET_PDEATHSIG, which survives exec; an agent already gone ends it here.
_BOOT = (
    "import os, sys\n"
    "os.setsid()\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "except (ImportError, OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "try:\n"
    "    if sys.argv[2]:\n"
    "        os.chdir(sys.argv[2])\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'cannot start {sys.argv[3]!r}: {e.strerror}\\n')\n"
    "    sys.stderr.flush()\n"
    "    os._exit(127)\n"
)
#: How much of a server's stderr is kept to show the user, and how much is logged.
STDERR_TAIL = 4096
STDERR_LOGGED = 256 * 1024
#: Each step of a stop (stdin closed, SIGTERM, SIGKILL) waits this long.
STOP_STEP = 2.0
#: After a server's end, what it left behind is reaped again this much later.
REAP_AGAIN = 0.5


def environment(spec: ServerSpec) -> dict[str, str]:
    """The agent's environment without its credentials, and the server's own entries."""
    return {**childEnvironment(), **dict(spec.env)}


@attrs.define(eq=False)
class StdioServer:
    """One running stdio server process."""

    spec: ServerSpec
    reactor: Any
    connection: MCPConnection
    cwd: str
    process: RPCChild = attrs.field(init=False)
    pid: int | None = None
    _tail: bytearray = attrs.Factory(bytearray)
    _logged: int = 0
    _partial: bytes = b""

    def start(self) -> None:
        """Spawn it; an ``OSError`` when even the launcher cannot start."""
        self.process = RPCChild(self.connection, self._stderr)
        cwd = self.cwd if os.path.isdir(self.cwd) else ""
        argv = [sys.executable, "-I", "-S", "-c", _BOOT, str(os.getpid()), cwd, self.spec.command, *self.spec.args]
        # A mark of its own: what it leaves is found by the agent's lifeline, and no command's cancel ends it.
        env = {**environment(self.spec), processes.MARK: processes.newMark()}
        self.pid = processes.started(
            lambda: self.reactor.spawnProcess(self.process, sys.executable, argv, env=env).pid)
        self.process.whenEnded().addCallback(lambda _: self._ended())

    def _ended(self) -> None:
        processes.unregister(self.pid)
        self._reap()

    def _reap(self) -> None:
        """The agent is a subreaper: what the server left behind and then died comes
        back to it, and is collected now and a moment later (a killed group takes a
        little while to die)."""
        processes.reapAdopted()
        self.reactor.callLater(REAP_AGAIN, processes.reapAdopted)

    @property
    def stderrTail(self) -> str:
        return self._tail.decode("utf-8", "replace").strip()

    def _stderr(self, data: bytes) -> None:
        self._tail += data
        del self._tail[:-STDERR_TAIL]
        if self._logged >= STDERR_LOGGED:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._logged += len(line)
            shown = redact(line.decode("utf-8", "replace")[:2000], self.spec.secrets)
            log.debug("MCP server {name}: {line}", name=self.spec.name, line=shown)
        if self._logged >= STDERR_LOGGED:
            log.info("MCP server {name} writes a lot to stderr; the rest is not logged", name=self.spec.name)
        elif len(self._partial) > STDERR_TAIL:
            self._partial = b""

    def describeEnd(self) -> str:
        return self.process.describeEnd()

    async def stop(self, step: float = STOP_STEP) -> None:
        """Close its stdin; SIGTERM, then SIGKILL, its group while it lingers;
        at the end, whatever is left of its group is killed."""
        try:
            for signalNumber in (None, signal.SIGTERM, signal.SIGKILL):
                if self.process.ended:
                    break
                if signalNumber is None:
                    self.connection.closeInput()
                else:
                    self._signalGroup(signalNumber)
                ended = self.process.whenEnded()
                ended.addTimeout(step, self.reactor)
                try:
                    await ended
                except TimeoutError:
                    pass
        finally:
            self._signalGroup(signal.SIGKILL)
            self._reap()

    def _signalGroup(self, signalNumber: int) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signalNumber)
        except (ProcessLookupError, PermissionError):
            pass
