"""Background processes: commands that outlive the turn that started them.

``terminal(background=true)`` starts a command through ``processes.spawn`` (the
same guard, sandbox and marks as a foreground command, so ``processes.endAll``
and the lifeline end it with the agent, however it dies) and answers at once.
The process then belongs to its session's ``SessionProcesses``, not to the turn:
it runs on between turns, and ends when it exits, when the model or the user
kills it, or when the session is closed or deleted (``BackgroundProcesses.drop``).

One thread reads every background process's output (``OutputReader``: a
``selectors`` loop over the output pipes and, where Linux has them, pidfds that
become readable when a process exits), so 16 sessions with 2 processes each
cost one thread, never a turn worker or a tool slot. Output goes to a bounded
``OutputCap`` per process (head and tail kept, the cut said). What changed is
reported to ``BackgroundProcesses.listener(sessionId, kind, snapshot)`` from
the reader's thread ("output" at most every ``outputreader.OUTPUT_EVERY`` seconds, "ended"
once), as plain dicts: the ACP side turns them into card updates.

No Twisted here: the listener is whatever the caller wires.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from hermes_acp.engine.outputreader import OutputReader
from hermes_acp.engine.secrets import redact, secretValues
from hermes_acp.engine.workspace import _CHILD_ENV, OutputCap

if TYPE_CHECKING:
    from hermes_acp.engine.processes import Limits
    from hermes_acp.engine.sandbox import Policy

#: The most bytes one ``write``/``submit`` sends to a process's input.
MAX_WRITE = 64 * 1024
#: The marks a session keeps of the processes it started (``SessionProcesses.endAll``).
MAX_MARKS = 256
#: What a card and ``poll`` show of the output, and what the model is told of a process that ended.
PREVIEW_CHARS, ENDED_CHARS, ENDED_LINES = 1000, 1000, 10
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")

RUNNING, EXITED = "running", "exited"


class BackgroundError(Exception):
    """A background request cannot be done; the message goes to the model (or the user)."""


def plainText(text: str) -> str:
    """Output without ANSI escapes (colours, cursor moves)."""
    return _ANSI.sub("", text)


@attrs.frozen
class BackgroundLimits:
    """How much background work there may be: running processes per session, bytes
    of output kept per process, running processes in the whole agent."""

    perSession: int = 8
    outputBytes: int = 200_000
    total: int = 64


@attrs.define(eq=False)
class BackgroundProcess:
    """One background process. Its fields change under its owner's lock."""

    processId: str
    number: int
    command: str
    cwd: str
    popen: subprocess.Popen[bytes]
    mark: str
    output: OutputCap
    #: It runs in the sandbox: what its input makes it do stays there too.
    confined: bool = False
    startedAt: float = attrs.field(factory=time.monotonic)
    status: str = RUNNING
    exitCode: int | None = None
    #: How it ended: "exited", "killed" (by the model or the user), "session_closed" (closed or deleted).
    completionReason: str | None = None
    terminationSource: str | None = None
    #: The model has seen that it ended (poll, wait, log, or the note at the next prompt).
    told: bool = False
    #: Its exit has been collected; its output pipe is closed.
    exited: bool = False
    closed: bool = False
    exitedAt: float | None = None
    shownAt: float = 0.0
    unshown: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    @property
    def inputClosed(self) -> bool:
        return self.popen.stdin is None or self.popen.stdin.closed

    def lastLines(self, chars: int, lines: int | None = None) -> str:
        text = plainText(self.output.tail(chars * 2 + 256))
        kept = text.splitlines()[-lines:] if lines else text.splitlines()
        return "\n".join(kept)[-chars:]

    def snapshot(self) -> dict[str, Any]:
        """What the editor's card shows of it (redacted of known secret values)."""
        secrets = secretValues()
        return {"processId": self.processId, "number": self.number, "command": redact(self.command, secrets),
                "pid": self.pid, "status": self.status, "exitCode": self.exitCode,
                "reason": self.completionReason, "tail": redact(self.lastLines(PREVIEW_CHARS * 4), secrets),
                "truncated": bool(self.output.dropped)}

    def describe(self) -> dict[str, Any]:
        """The ``list`` entry (Hermes' fields)."""
        entry = {"session_id": self.processId, "number": self.number, "command": self.command, "pid": self.pid,
                 "status": self.status, "uptime_seconds": round((self.exitedAt or time.monotonic()) - self.startedAt),
                 "output_bytes": self.output.total}
        if not self.running:
            entry.update(exit_code=self.exitCode, completion_reason=self.completionReason)
        return entry


Listener = Callable[[str, str, dict[str, Any]], object]


@attrs.define(eq=False)
class SessionProcesses:
    """One session's background processes: what ``terminal(background=true)`` starts
    through, what the ``process`` tool and ``/ps`` and ``/kill`` act on. Plain Python,
    used from tool threads, the reactor and the reader's thread alike (one lock)."""

    sessionId: str
    registry: BackgroundProcesses
    _procs: dict[str, BackgroundProcess] = attrs.field(factory=dict)
    _numbers: int = 0
    _starting: int = 0  # being started: they count against the limit already
    _closed: bool = False
    #: Processes that ended with the agent's previous process (``session/load`` after a restart).
    _lost: list[dict[str, Any]] = attrs.field(factory=list)
    #: Notes of ended processes forgotten (``_trim``) before the model was told, and how many more.
    _unreported: list[str] = attrs.field(factory=list)
    _unreportedMore: int = 0
    #: The marks of the processes it started, the newest ``MAX_MARKS``: what they left running
    #: (a daemon out of their process group) ends with the session too (older: with the agent).
    _marks: deque[str] = attrs.field(factory=lambda: deque(maxlen=MAX_MARKS))
    _changed: threading.Condition = attrs.field(factory=threading.Condition)

    # -- starting ------------------------------------------------------------------

    def start(self, command: str, cwd: str, policy: Policy | None, limits: Limits | None,
              env: Mapping[str, str] | None = None) -> BackgroundProcess:
        """Start ``command`` (``/bin/sh -c``) in the background; ``BackgroundError`` over a limit."""
        from hermes_acp.engine import processes
        from hermes_acp.engine.secrets import childEnvironment

        registry = self.registry
        with self._changed:
            if self._closed:
                raise BackgroundError("the session is closed; nothing starts in it any more")
            running = sum(proc.running for proc in self._procs.values()) + self._starting
            if running >= registry.limits.perSession:
                raise BackgroundError(
                    f"this session already runs {running} background processes, the most it may "
                    f"(HERMES_ACP_BACKGROUND_PROCESSES={registry.limits.perSession}); kill one with "
                    "process(action='kill', session_id=...) first, or run the command in the foreground")
            if not registry.claim():
                raise BackgroundError(
                    f"the agent already runs {registry.limits.total} background processes in all its sessions, "
                    f"the most it may (HERMES_ACP_BACKGROUND_TOTAL); kill one first")
            self._numbers += 1
            self._starting += 1
            number = self._numbers
        try:
            popen, mark = processes.spawn(
                ["/bin/sh", "-c", command], cwd,
                {**childEnvironment(), **_CHILD_ENV, "PYTHONUNBUFFERED": "1", **(env or {})}, policy,
                limits or processes.Limits(),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except BaseException:
            registry.unclaim()
            with self._changed:
                self._starting -= 1
            raise
        assert popen.stdin is not None
        os.set_blocking(popen.stdin.fileno(), False)  # a process that does not read never blocks a write
        proc = BackgroundProcess(f"proc_{uuid.uuid4().hex[:12]}", number, command, cwd, popen, mark,
                                 OutputCap(registry.limits.outputBytes), policy is not None)
        with self._changed:
            self._starting -= 1
            self._procs[proc.processId] = proc
            self._marks.append(mark)
            self._trim()
            closed = self._closed
        registry.watch(self, proc)
        if closed:  # the session was closed while it started (a call that outlived its turn's cancel)
            self.kill(proc, "session_closed", "session.closed", wait=0)
            raise BackgroundError("the session was closed as the process started; it was ended")
        return proc

    def _trim(self) -> None:
        """Under the lock: keep at most ``perSession`` ended processes (what each kept is
        memory), forgetting the oldest first; of one the model was not told of yet, only
        the note it will read stays (at most ``perSession`` of those too, then a count)."""
        limit = self.registry.limits.perSession
        ended = sorted((p for p in self._procs.values() if not p.running), key=lambda p: (not p.told, p.number))
        for proc in ended[:max(0, len(ended) - limit)]:
            del self._procs[proc.processId]
            if not proc.told:
                self._unreported.append(_noteOf(proc))
        if len(self._unreported) > limit:
            self._unreportedMore += len(self._unreported) - limit
            del self._unreported[:-limit]

    # -- finding -------------------------------------------------------------------

    def find(self, ref: Any) -> BackgroundProcess:
        """A process by its id (``proc_…``) or its number in the session (``3``, ``"#3"``)."""
        text = str(ref).strip().lstrip("#")
        with self._changed:
            proc = self._procs.get(text)
            if proc is None and text.isdigit():
                proc = next((p for p in self._procs.values() if p.number == int(text)), None)
            if proc is None:
                raise BackgroundError(f"no background process {ref!r} in this session; "
                                      "process(action='list') lists them")
            return proc

    def processes(self) -> list[BackgroundProcess]:
        with self._changed:
            return sorted(self._procs.values(), key=lambda p: p.number)

    @property
    def runningCount(self) -> int:
        with self._changed:
            return sum(p.running for p in self._procs.values())

    # -- acting ----------------------------------------------------------------------

    def seen(self, proc: BackgroundProcess) -> None:
        """The model has read that ``proc`` ended: the next prompt need not tell it."""
        with self._changed:
            if not proc.running:
                proc.told = True

    def wait(self, proc: BackgroundProcess, timeout: float, cancelEvent: threading.Event) -> str:
        """Until ``proc`` ends, ``timeout`` passes or ``cancelEvent`` is set: "exited",
        "timeout" or "interrupted"."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while proc.running:
                if cancelEvent.is_set():
                    return "interrupted"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                self._changed.wait(min(left, 0.2))
        return EXITED

    def kill(self, proc: BackgroundProcess, reason: str = "killed", source: str = "process.kill",
             wait: float = 2.0) -> bool:
        """End ``proc`` and everything it started; False when it had already ended.
        Waits up to ``wait`` seconds for the reader to collect its end."""
        from hermes_acp.engine import processes

        with self._changed:
            # Once its exit is collected its pid may be anyone's: what it left ends with the agent.
            if not proc.running or proc.exited or proc.completionReason is not None:
                return False
            proc.completionReason, proc.terminationSource = reason, source
        processes.end(proc.popen, proc.mark)
        if wait:
            deadline = time.monotonic() + wait
            with self._changed:
                while proc.running and time.monotonic() < deadline:
                    self._changed.wait(0.1)
        return True

    def write(self, proc: BackgroundProcess, data: str) -> int:
        """Send ``data`` to the process's input; the bytes written (a full pipe takes fewer)."""
        encoded = data.encode("utf-8")
        if len(encoded) > MAX_WRITE:
            raise BackgroundError(f"data is {len(encoded)} bytes; at most {MAX_WRITE} bytes go in one write")
        with self._changed:
            if not proc.running:
                raise BackgroundError(f"{proc.processId} has already exited")
            if proc.inputClosed:
                raise BackgroundError(f"the input of {proc.processId} was closed")
            assert proc.popen.stdin is not None
            try:
                return os.write(proc.popen.stdin.fileno(), encoded) if encoded else 0
            except BlockingIOError:
                return 0
            except OSError as e:
                if e.errno == errno.EPIPE:
                    raise BackgroundError(f"{proc.processId} does not read its input any more") from e
                raise BackgroundError(f"cannot write to {proc.processId}: {e.strerror}") from e

    def closeInput(self, proc: BackgroundProcess) -> bool:
        """Close the process's input (it reads end-of-file); False when it already was."""
        with self._changed:
            if proc.inputClosed:
                return False
            assert proc.popen.stdin is not None
            proc.popen.stdin.close()
            return True

    def endAll(self, reason: str) -> None:
        """End every running process (the session is closed or deleted), and what those that
        ended left running; nothing starts after."""
        from hermes_acp.engine import processes

        with self._changed:
            self._closed = True
            marks = set(self._marks)
        for proc in self.processes():
            self.kill(proc, reason, f"session.{reason}", wait=0)
        processes.endMarked(marks)

    # -- what the reader reports -------------------------------------------------------

    def ended(self, proc: BackgroundProcess) -> None:
        with self._changed:
            proc.exitCode = proc.popen.returncode
            proc.status = EXITED
            proc.completionReason = proc.completionReason or "exited"
            proc.terminationSource = proc.terminationSource or "process"
            if proc.popen.stdin is not None:
                proc.popen.stdin.close()
            self._trim()
            self._changed.notify_all()

    # -- telling the model ------------------------------------------------------------

    def lost(self, entries: list[dict[str, Any]]) -> None:
        """Processes of the session that ended with the agent's previous process."""
        with self._changed:
            known = {entry.get("processId") for entry in self._lost}
            self._lost.extend(e for e in entries if e.get("processId") not in known
                              and e.get("processId") not in self._procs)

    def endedNote(self) -> str | None:
        """What the model has not been told yet of processes that ended (then it has)."""
        with self._changed:
            fresh = sorted((p for p in self._procs.values() if not p.running and not p.told), key=lambda p: p.number)
            lost, self._lost = self._lost, []
            notes, self._unreported = [*self._unreported, *map(_noteOf, fresh)], []
            more, self._unreportedMore = self._unreportedMore, 0
            for proc in fresh:
                proc.told = True
        if not notes and not lost and not more:
            return None
        parts = ["[Background processes that ended since your last turn:"]
        if more:
            parts.append(f"- {more} more that ended earlier (not listed)")
        parts += notes
        for entry in lost:
            parts.append(f"- {entry.get('processId')} (#{entry.get('number')}) `{entry.get('command')}`: ended when "
                         "the agent's previous process stopped (it was restarted); exit code unknown")
        return redact("\n".join(parts) + "]", secretValues())


def _noteOf(proc: BackgroundProcess) -> str:
    """How one process that ended is told to the model: how it ended and its last lines."""
    how = {"killed": "killed", "session_closed": "ended"}.get(proc.completionReason or "", "exited")
    note = f"- {proc.processId} (#{proc.number}) `{proc.command}`: {how}, exit code {proc.exitCode}"
    last = proc.lastLines(ENDED_CHARS, ENDED_LINES)
    if last.strip():
        note += "\n  last lines:\n" + "\n".join(f"    {line}" for line in last.splitlines())
    return note


@attrs.define(eq=False)
class BackgroundProcesses:
    """Every session's background processes in the agent, the shared reader and the
    agent-wide limit. ``listener(sessionId, kind, snapshot)`` hears of output
    ("output") and ends ("ended"), in the reader's thread."""

    limits: BackgroundLimits = attrs.field(factory=BackgroundLimits)
    listener: Listener | None = None
    _sessions: dict[str, SessionProcesses] = attrs.field(factory=dict)
    _owners: dict[int, SessionProcesses] = attrs.field(factory=dict)  # id(proc) -> its session
    _running: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _reader: OutputReader = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._reader = OutputReader(self._output, self._ended)

    def forSession(self, sessionId: str) -> SessionProcesses:
        with self._lock:
            owner = self._sessions.get(sessionId)
            if owner is None:
                owner = self._sessions[sessionId] = SessionProcesses(sessionId, self)
            return owner

    def find(self, sessionId: str) -> SessionProcesses | None:
        with self._lock:
            return self._sessions.get(sessionId)

    def ownerOf(self, processId: str) -> str | None:
        """The session that runs (or ran) ``processId`` in this agent; None: none does."""
        with self._lock:
            owners = list(self._sessions.values())
        return next((owner.sessionId for owner in owners
                     if any(proc.processId == processId for proc in owner.processes())), None)

    def drop(self, sessionId: str, reason: str = "session_closed") -> None:
        """The session is closed or deleted: its processes end, and it is forgotten."""
        with self._lock:
            owner = self._sessions.pop(sessionId, None)
        if owner is not None:
            owner.endAll(reason)

    def claim(self) -> bool:
        with self._lock:
            if self._running >= self.limits.total:
                return False
            self._running += 1
            return True

    def unclaim(self) -> None:
        with self._lock:
            self._running -= 1

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def watch(self, owner: SessionProcesses, proc: BackgroundProcess) -> None:
        with self._lock:
            self._owners[id(proc)] = owner
        self._reader.add(proc)

    def _output(self, proc: BackgroundProcess) -> None:
        owner = self._owners.get(id(proc))
        if owner is not None and self.listener is not None:
            self.listener(owner.sessionId, "output", proc.snapshot())

    def _ended(self, proc: BackgroundProcess) -> None:
        with self._lock:
            owner = self._owners.pop(id(proc), None)
            self._running -= 1
        if owner is None:
            return
        owner.ended(proc)
        if self.listener is not None:
            self.listener(owner.sessionId, "ended", proc.snapshot())
