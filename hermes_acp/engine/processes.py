"""The processes the agent starts, and the ones that try to outlive them.

Every command and search starts through ``spawn``: in its own process group,
sandboxed when a policy is given, with a *mark* in its environment
(``HERMES_ACP_COMMAND``) that its descendants inherit. The agent is a child
subreaper (``PR_SET_CHILD_SUBREAPER``): a process that leaves its command's
group and loses its parent (``setsid``, ``nohup``, a double fork) becomes the
agent's child instead of init's, so it can still be found. ``end`` kills a
command's group, its descendants and every adopted process with its mark (on
cancel and timeout); ``endAll`` kills everything the agent started (at exit).

Adopted processes that exit are reaped here; the agent's own children are
registered while they run so that they are never reaped behind their owner's
back (anything else that starts processes must start them through ``spawn``,
or register them with ``started``).

None of that runs when the agent is killed: so the first process started also
starts the agent's watchdog (``lifeline``), and every one started is reported
to it; when the agent is gone, however it went, the watchdog ends them all,
and whatever they left running.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from hermes_acp.engine import lifeline, sandbox
from hermes_acp.engine.lifeline import children
from hermes_acp.engine.secrets import AGENT_CREDENTIALS, ENDPOINT_URLS

log = logging.getLogger(__name__)

MARK = "HERMES_ACP_COMMAND"
#: This agent's part of every mark (``AGENT.COMMAND``): the watchdog finds its processes by it.
_AGENT = uuid.uuid4().hex[:16]
_PR_SET_CHILD_SUBREAPER, _PR_SET_DUMPABLE = 36, 4

#: Variables whose startup values are blanked: the agent's keys, and its URLs (which may hold a password).
CREDENTIAL_VARIABLES = frozenset(AGENT_CREDENTIALS + ENDPOINT_URLS)

_lock = threading.Lock()
_registered: set[int] = set()
_subreaper: bool | None = None
_ended = False  # endAll has run: the agent is exiting and starts nothing more
_lifeline = lifeline.Lifeline(f"{MARK}={_AGENT}.")


class Ending(OSError):
    """The agent is exiting: no process starts any more."""

    def __init__(self) -> None:
        super().__init__("the agent is shutting down; nothing new starts")


@attrs.frozen
class Limits:
    """Optional resource limits for each command (None: unlimited)."""

    processes: int | None = None
    cpuSeconds: int | None = None

    def apply(self) -> None:
        """In the child, before exec."""
        if self.processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.processes, self.processes))
        if self.cpuSeconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpuSeconds, self.cpuSeconds))

    @property
    def empty(self) -> bool:
        return self.processes is None and self.cpuSeconds is None


def becomeSubreaper() -> bool:
    """Before the first process starts (once): make the agent the subreaper of
    what it starts, and keep its credentials from what it starts: not dumpable
    (no debugger attaches, ``/proc`` keeps its memory private from other users'
    processes) and its credentials blanked in the environment it was started
    with (which ``/proc/PID/environ`` shows even to a sandboxed child when the
    agent runs as root). False where the system has no subreapers (escaped
    processes then go to init)."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
            _blankStartupCredentials()
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def _blankStartupCredentials() -> None:
    """Overwrite, in the process's own memory, the values of the agent's
    credentials in its startup environment block (``os.environ`` is a copy made
    at startup and keeps them)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
    except (OSError, ValueError, IndexError):
        return
    if not 0 < start < end:
        return
    block = ctypes.string_at(start, end - start)
    offset = 0
    for entry in block.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if value and name.decode("ascii", "replace") in CREDENTIAL_VARIABLES:
            ctypes.memset(start + offset + len(name) + 1, ord("*"), len(value))
        offset += len(entry) + 1


def unregister(pid: int) -> None:
    """``pid``, one of the agent's own, has ended and been waited for."""
    with _lock:
        _registered.discard(pid)
        _lifeline.forget(pid)


def spawn(
    argv: list[str], cwd: str | None, env: Mapping[str, str], policy: sandbox.Policy | None = None,
    limits: Limits = Limits(), **popen: Any,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` in a new session (process group), sandboxed by ``policy``
    when given; returns the process and its mark. A ``SandboxError`` or another
    ``OSError`` when it cannot start. Call ``release`` once it has been waited for."""
    becomeSubreaper()
    mark = newMark()
    environment = {**env, MARK: mark}
    start: Callable[[], subprocess.Popen[bytes]] = lambda: subprocess.Popen(  # noqa: E731
        argv, cwd=cwd, env=environment, start_new_session=True,
        preexec_fn=None if limits.empty else limits.apply, **popen)
    with _lock:  # no reaping between the fork and the registration
        _refuseWhenEnding()
        _startLifeline()  # in this thread: the watchdog is never sandboxed
        process = start() if policy is None else sandbox.runConfined(policy, start)
        _registered.add(process.pid)
        _watched(process.pid)
        _killWhenEnding(process.pid)
    return process, mark


def newMark() -> str:
    """A mark for one command (or MCP server) of this agent: what it starts inherits it."""
    return f"{_AGENT}.{uuid.uuid4().hex}"


def started(start: Callable[[], int]) -> int:
    """Run ``start`` (which starts a process some other way, such as the
    reactor's ``spawnProcess``, and returns its pid) and register that pid as
    the agent's own, so it is never reaped here; ``unregister`` it once its
    owner has collected its exit status."""
    becomeSubreaper()
    with _lock:
        _refuseWhenEnding()
        _startLifeline()
        pid = start()
        _registered.add(pid)
        _watched(pid)
        _killWhenEnding(pid)
    return pid


def _startLifeline() -> None:
    """Under the lock, before the first process starts: the watchdog that ends
    what the agent leaves when it dies."""
    if not _lifeline.started:
        _newLifeline()


def _newLifeline() -> None:
    if _lifeline.process is not None:
        _registered.discard(_lifeline.process.pid)
    try:
        _registered.add(_lifeline.start())
    except OSError as e:
        raise OSError(e.errno, f"cannot start the agent's watchdog: {e.strerror}") from e


def _watched(pid: int) -> None:
    """Under the lock: tell the watchdog about ``pid``. One that is gone (a
    command killed it) is replaced, and told about every child of the agent."""
    if not _lifeline.tell([pid]):
        try:
            _newLifeline()
        except OSError as e:  # the process runs: the next one tries again
            log.warning("%s; processes may outlive the agent if it is killed", e.strerror)
            return
        _lifeline.tell(children(os.getpid()))


def _refuseWhenEnding() -> None:
    if _ended:
        raise Ending()


def _killWhenEnding(pid: int) -> None:
    """Just after a fork: when ``endAll`` ran meanwhile it may have listed the
    children before this one existed, so this one is killed here (``endAll``
    marks the end before it lists them: one of the two always sees it)."""
    if _ended:
        _kill(descendants([pid]))


def release(process: subprocess.Popen[bytes]) -> None:
    unregister(process.pid)
    reapAdopted()


def descendants(roots: Iterable[int]) -> list[int]:
    """``roots`` and every process below them, parents first."""
    order: list[int] = []
    pending = list(roots)
    seen: set[int] = set()
    while pending:
        pid = pending.pop()
        if pid not in seen:
            seen.add(pid)
            order.append(pid)
            pending.extend(children(pid))
    return order


def _markOf(pid: int) -> str | None:
    """The command mark in ``pid``'s environment; None when it has none (it
    cleared its environment, ``env -i``, or dropped the mark)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARK}=".encode()
    return next((e[len(prefix):].decode("ascii", "replace") for e in entries if e.startswith(prefix)), None)


def _adopted() -> list[int]:
    """The agent's children that it did not start itself."""
    with _lock:
        registered = set(_registered)
    return [pid for pid in children(os.getpid()) if pid not in registered]


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def end(process: subprocess.Popen[bytes], mark: str) -> None:
    """Kill the command: its process group, everything below it, and every
    adopted process that carries its mark, or no mark at all (one that shed
    its mark cannot be told apart, so it ends too), and what is below those."""
    escaped = [pid for pid in _adopted() if _markOf(pid) in (mark, None)]
    _kill(descendants([process.pid, *escaped]))
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def endMarked(marks: Collection[str]) -> None:
    """Kill the adopted processes that carry one of ``marks``, and what is below them: what
    commands that have ended left running (a daemon that left their process group)."""
    if marks:
        _kill(descendants([pid for pid in _adopted() if _markOf(pid) in marks]))


def endAll() -> None:
    """Kill every process the agent started, and all their descendants (at exit;
    takes no lock, so a stuck thread cannot stop it). Afterwards nothing starts:
    a command a cancelled turn was about to run when the agent began exiting
    would otherwise outlive it."""
    global _ended
    _ended = True
    watchdog = _lifeline.process.pid if _lifeline.process is not None else None
    _kill(descendants(pid for pid in children(os.getpid()) if pid != watchdog)[::-1])


def reapAdopted() -> None:
    """Collect the exit status of adopted processes that have ended (never of
    the agent's own children: their owners wait for them), and tell the
    watchdog about those that run on: one that shed every mark is found by
    nothing else if the agent dies before the watchdog looked."""
    with _lock:
        running = []
        for pid in children(os.getpid()):
            if pid not in _registered:
                try:
                    if os.waitpid(pid, os.WNOHANG) == (0, 0):
                        running.append(pid)
                except ChildProcessError:
                    pass
        if running:
            _lifeline.tell(running)
