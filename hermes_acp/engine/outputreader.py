"""The one thread that reads every background process's output and sees it exit
(``engine.background``): a ``selectors`` loop over their output pipes and, where
Linux has them, pidfds that become readable when a process exits."""

from __future__ import annotations

import logging
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

from hermes_acp.engine.workspace import OutputCap

log = logging.getLogger(__name__)

#: How often a running process's output is reported (its card's tail).
OUTPUT_EVERY = 1.0
#: After a process exits, how long its output pipe may stay open (a child it left holds it).
DRAIN_GRACE = 0.5
#: Without pidfds, how often the reader looks whether a process has exited.
POLL = 0.25


class BackgroundProcess(Protocol):
    """What the reader reads and marks of a process (``engine.background.BackgroundProcess``)."""

    popen: subprocess.Popen[bytes]
    output: OutputCap
    #: Its exit status was collected, and when; its output pipe reached end-of-file.
    exited: bool
    exitedAt: float | None
    closed: bool
    #: Output read since it was last reported, and when that was.
    unshown: bool
    shownAt: float


class OutputReader:
    """The one thread that reads every background process's output and sees it exit.

    ``add`` hands it a process; it reads the output into the process's buffer,
    reports it (``onOutput``) at most every ``OUTPUT_EVERY`` seconds, and, once the
    process has exited and its output pipe is closed (or ``DRAIN_GRACE`` later),
    reports the end (``onEnded``). The thread starts with the first process and
    sleeps in ``select`` while nothing happens."""

    def __init__(self, onOutput: Callable[[BackgroundProcess], None],
                 onEnded: Callable[[BackgroundProcess], None]) -> None:
        self._onOutput, self._onEnded = onOutput, onEnded
        self._lock = threading.Lock()
        self._added: list[BackgroundProcess] = []
        self._procs: dict[int, tuple[BackgroundProcess, int | None]] = {}  # id -> (process, pidfd)
        self._selector: selectors.BaseSelector | None = None
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def add(self, proc: BackgroundProcess) -> None:
        with self._lock:
            self._added.append(proc)
            if self._thread is None:  # the first process, or the first since the reader went idle
                self._selector = selectors.DefaultSelector()
                self._wake = os.pipe()
                os.set_blocking(self._wake[1], False)
                self._selector.register(self._wake[0], selectors.EVENT_READ, None)
                self._thread = threading.Thread(target=self._run, name="hermes-background", daemon=True)
                self._thread.start()
        self.wake()

    def wake(self) -> None:
        with self._lock:
            if self._wake is not None:
                try:
                    os.write(self._wake[1], b"x")
                except OSError:  # full: it will wake anyway
                    pass

    def _register(self) -> None:
        assert self._selector is not None
        with self._lock:
            added, self._added = self._added, []
        for proc in added:
            pidfd = None
            try:
                pidfd = os.pidfd_open(proc.pid)
                self._selector.register(pidfd, selectors.EVENT_READ, ("exit", proc))
            except (AttributeError, OSError):  # no pidfds (macOS, old kernels): polled instead
                pidfd = None
            assert proc.popen.stdout is not None
            self._selector.register(proc.popen.stdout.fileno(), selectors.EVENT_READ, ("out", proc))
            self._procs[id(proc)] = (proc, pidfd)

    def _run(self) -> None:
        while not self._idle():
            try:
                self._step()
            except Exception:  # the reader must go on for the other processes
                log.exception("the background output reader failed; it goes on")
                time.sleep(POLL)

    def _idle(self) -> bool:
        """With no process left to read, the thread ends (the next ``add`` starts another)."""
        with self._lock:
            if self._procs or self._added:
                return False
            assert self._selector is not None and self._wake is not None
            self._selector.close()
            for fd in self._wake:
                os.close(fd)
            self._selector = self._wake = self._thread = None
            return True

    def _step(self) -> None:
        assert self._selector is not None and self._wake is not None
        timeout = self._timeout()
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                try:
                    os.read(self._wake[0], 4096)
                except BlockingIOError:
                    pass
                self._register()
                continue
            kind, proc = key.data
            if kind == "out":
                self._read(proc)
            else:
                self._exited(proc)
        now = time.monotonic()
        for proc, pidfd in list(self._procs.values()):
            if pidfd is None and not proc.exited and proc.popen.poll() is not None:
                self._exited(proc)
            if proc.exited and (proc.closed or now - (proc.exitedAt or now) >= DRAIN_GRACE):
                self._finish(proc)
            elif proc.unshown and now - proc.shownAt >= OUTPUT_EVERY:
                proc.unshown, proc.shownAt = False, now
                self._onOutput(proc)

    def _timeout(self) -> float | None:
        if not self._procs:
            return None
        waits = [POLL if pidfd is None else None for _, pidfd in self._procs.values()]
        waits += [DRAIN_GRACE / 2 for proc, _ in self._procs.values() if proc.exited]
        waits += [OUTPUT_EVERY / 2 for proc, _ in self._procs.values() if proc.unshown]
        found = [w for w in waits if w is not None]
        return min(found) if found else None

    def _read(self, proc: BackgroundProcess) -> None:
        assert proc.popen.stdout is not None and self._selector is not None
        fd = proc.popen.stdout.fileno()
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if chunk:
            proc.output.feed(chunk)
            proc.unshown = True
        else:
            self._selector.unregister(fd)
            proc.closed = True

    def _exited(self, proc: BackgroundProcess) -> None:
        """Its exit status is collected at once (the pidfd said it exited)."""
        assert self._selector is not None
        entry = self._procs.get(id(proc))
        if entry is not None and entry[1] is not None:
            self._selector.unregister(entry[1])
            os.close(entry[1])
            self._procs[id(proc)] = (proc, None)
        if not proc.exited:
            proc.popen.wait()
            proc.exited, proc.exitedAt = True, time.monotonic()

    def _finish(self, proc: BackgroundProcess) -> None:
        """Exited, and its output read (or given up on): the process ends here."""
        from hermes_acp.engine import processes

        assert self._selector is not None and proc.popen.stdout is not None
        if not proc.closed:
            self._selector.unregister(proc.popen.stdout.fileno())
        proc.popen.stdout.close()
        self._procs.pop(id(proc), None)
        processes.release(proc.popen)
        self._onEnded(proc)
