"""The lifeline: a watchdog that ends what the agent leaves behind when it dies.

The agent ends its commands itself when it can (``processes.end`` on cancel,
``processes.endAll`` at exit), but a SIGKILL, a crash or an out-of-memory kill
gives it no chance: its children, and what they spawned and it adopted as a
subreaper, go to init and run on. So with its first command (or MCP server)
the agent starts one watchdog, this file run as a script by a bare
interpreter (``python -I -S``: the standard library only, an empty
environment, in a session of its own, unsandboxed, outside every folder).
It holds the read end of a pipe whose write end only the agent holds
(``O_CLOEXEC``: no command inherits it), so the pipe reaches end-of-file
exactly when the agent is gone, however it went.

Before the watchdog starts, the agent sets its own hard ``RLIMIT_RTTIME`` (the CPU
time a *real-time* scheduled process may use without blocking; ordinary
processes never meet it) to a value of its own: an odd, huge number that
every process it starts inherits, and that neither ``env -i``, ``setsid``
nor a double fork changes (a process could lower it on purpose; nothing does
so by accident). It is the one mark a process that left everything else
behind still carries.

While the agent lives, the agent writes on the pipe each process it starts
(``PID STARTTIME``, the start time telling a reused pid apart; ``-PID`` once it
has collected its exit status), and each process it adopted that still runs
when one of its own ends (what a command leaves is adopted as it ends); the
watchdog also looks, about once a second and only while such a process lives,
at the agent's children for processes it adopted. At end-of-file the watchdog
stops (SIGSTOP, so nothing forks any more) every process it finds, pass after
pass until a pass finds no new one, then kills them all (SIGKILL) and exits.
It finds:

- the processes it was told about and those it saw adopted (a pid whose start
  time changed is someone else's now, and is left alone);
- every member of their process groups and sessions (a command's group and
  session have its pid's number; ``setsid`` leaves them);
- every process whose environment carries the agent's mark (the per-agent
  prefix of ``HERMES_ACP_COMMAND``; ``env -i`` sheds it), or whose
  ``RLIMIT_RTTIME`` is the agent's;
- and every descendant of all of those.

Without ``/proc`` (macOS) it can only kill the process groups of the
processes it was told about.
"""

from __future__ import annotations

import os
import random
import resource
import select
import signal
import subprocess
import sys
import time

#: How often the watchdog looks for processes the agent adopted, while any it knows of lives.
POLL = 1.0
#: The longest line the agent writes (``PID STARTTIME``); anything longer is not the agent's.
MAX_LINE = 64
#: A sweep gives up finding more after this many passes (a fork bomb is stopped as it is found).
MAX_PASSES = 200
_PROC = "/proc"


def startTime(pid: int) -> int:
    """When ``pid`` started (clock ticks after boot); 0 where there is no
    ``/proc``; -1 when no such process exists."""
    if not os.path.isdir(_PROC):
        return 0
    fields = _stat(pid)
    return -1 if fields is None else int(fields[19])


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: state, ppid, pgrp, session, ... ."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode("ascii").split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (an adopted process may belong to any)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"{_PROC}/{pid}/task/{task}/children") as f:
                found.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            pass
    return found


# --- the agent's side ---


class Lifeline:
    """The agent's end: starts the watchdog and tells it about processes.

    Not thread-safe by itself: ``processes`` calls it under its lock."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # how the agent's mark begins in a process's environment: ``NAME=AGENT.``
        self.process: subprocess.Popen[bytes] | None = None
        self._write: int | None = None
        self.limit: int | None = None  # the agent's RLIMIT_RTTIME mark (0: none)

    def _markLimit(self) -> int:
        """Set (once) the agent's hard ``RLIMIT_RTTIME`` to a value of its own, below
        the one it inherited (a process may lower its hard limit, never raise it),
        and the soft one no higher (a lower soft limit, the user's realtime budget,
        stays); 0 where that cannot be done."""
        if self.limit is None:
            self.limit = 0
            try:
                number = resource.RLIMIT_RTTIME
                soft, hard = resource.getrlimit(number)
                top = 1 << 50 if hard == resource.RLIM_INFINITY else min(hard, 1 << 50)
                value = (top - 2 - random.randrange(1 << 30)) | 1
                if value > 1:
                    resource.setrlimit(number, (value if soft == resource.RLIM_INFINITY else min(soft, value), value))
                    self.limit = value
            except (AttributeError, ValueError, OSError):  # no RLIMIT_RTTIME (macOS)
                pass
        return self.limit

    def start(self) -> int:
        """Start a watchdog (the previous one is gone); its pid."""
        if self._write is not None:
            os.close(self._write)
            self._write = None
        if self.process is not None:
            self.process.poll()  # collect the old one
        read, write = os.pipe()  # both O_CLOEXEC: only the watchdog gets the read end
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), self.prefix,
                 str(self._markLimit()), str(read)],
                env={}, cwd="/", pass_fds=(read,), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        os.set_blocking(write, False)  # a stopped watchdog must never block the agent
        self._write = write
        return self.process.pid

    @property
    def started(self) -> bool:
        return self._write is not None

    def tell(self, pids: list[int]) -> bool:
        """Tell the watchdog about ``pids``; False when it is gone (start another).
        A message the pipe has no room for is dropped: the watchdog then finds
        that process by its group, session, marks or parent."""
        return self._send("".join(f"{pid} {startTime(pid)}\n" for pid in pids))

    def forget(self, pid: int) -> None:
        """``pid`` has ended and its exit status was collected: its number may be
        anyone's from now on."""
        self._send(f"-{pid}\n")

    def _send(self, text: str) -> bool:
        if self._write is None:
            return False
        message = text.encode()
        try:
            while message:
                message = message[os.write(self._write, message[:512]):]
        except BlockingIOError:
            pass
        except OSError:  # EPIPE: the watchdog was killed
            return False
        return True


# --- the watchdog's side ---


def _table() -> dict[int, tuple[str, int, int, int, int]]:
    """Every process: pid → (state, ppid, process group, session, start time)."""
    table = {}
    for name in os.listdir(_PROC):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None:
                table[int(name)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    return table


def _marked(pid: int, entry: bytes) -> bool:
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as f:
            return any(item.startswith(entry) for item in f.read().split(b"\0"))
    except OSError:
        return False


def _limited(pid: int, limit: str) -> bool:
    """Whether ``pid``'s ``RLIMIT_RTTIME`` is ``limit``."""
    try:
        with open(f"{_PROC}/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max realtime timeout"):
                    return limit in line.split()[3:5]
    except OSError:
        pass
    return False


def _found(known: dict[int, int], prefix: str, limit: int, skip: set[int]) -> set[int]:
    """Every live process that is the agent's, as the module docstring lists them."""
    table = _table()
    mine = {pid for pid, start in known.items() if pid in table and table[pid][4] == start}
    # A group or session keeps the number of its first leader while it has members.
    leaders = {pid for pid, start in known.items() if pid not in table or table[pid][4] == start}
    entry = prefix.encode()
    for pid, (state, _, group, session, _) in table.items():
        if pid in mine or state == "Z":
            continue
        if group in leaders or session in leaders or _marked(pid, entry) or (limit and _limited(pid, str(limit))):
            mine.add(pid)
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    pending = list(mine)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in mine:
                mine.add(child)
                pending.append(child)
    return {pid for pid in mine - skip if table[pid][0] != "Z"}


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def sweep(known: dict[int, int], prefix: str, limit: int, skip: set[int]) -> int:
    """Stop every process found, until a pass finds no new one, then kill them
    all; how many were killed."""
    if not os.path.isdir(_PROC):
        for pid in known:
            _signal(-pid, signal.SIGKILL)
            _signal(pid, signal.SIGKILL)
        return len(known)
    stopped: set[int] = set()
    for _ in range(MAX_PASSES):
        new = _found(known, prefix, limit, skip) - stopped
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    return len(stopped)


def _adopted(agent: int, known: dict[int, int], skip: set[int]) -> None:
    """Remember the agent's children that are new."""
    for pid in children(agent):
        if pid not in known and pid not in skip:
            start = startTime(pid)
            if start >= 0:
                known[pid] = start


def _forgetEnded(known: dict[int, int]) -> None:
    """Forget the known processes that have ended: what they left in their group
    or session is below a known process, or was adopted by the agent and is
    known itself (and a number no longer in use may be reused by anyone)."""
    for pid, start in list(known.items()):
        if startTime(pid) != start:
            del known[pid]


def _read(line: bytes, known: dict[int, int]) -> None:
    """One line from the agent: ``PID STARTTIME`` (it started that process), or
    ``-PID`` (it collected that one's exit)."""
    try:
        if line.startswith(b"-"):
            known.pop(int(line[1:]), None)
        else:
            pid, start = (int(field) for field in line.split())
            known[pid] = start
    except ValueError:
        pass


def watch(agent: int, prefix: str, limit: int, fd: int) -> None:
    """Wait for the agent's end, keeping track of its processes; then sweep."""
    known: dict[int, int] = {}
    skip = {os.getpid(), agent}
    hasProc = os.path.isdir(_PROC)
    pending = b""
    looked = time.monotonic()
    while True:
        timeout = POLL if known and hasProc else None
        if select.select([fd], [], [], timeout)[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            pending = pending[:MAX_LINE]
            for line in lines:
                _read(line, known)
        if hasProc and time.monotonic() - looked >= POLL:
            looked = time.monotonic()
            _adopted(agent, known, skip)
            _forgetEnded(known)
    if hasProc:
        _adopted(agent, known, skip)  # the agent's children may not have been handed on yet
    sweep(known, prefix, limit, skip)


def main(argv: list[str]) -> int:
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)
    agent, prefix, limit, fd = int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    watch(agent, prefix, limit, fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
