"""Our own worker pool for agent turns, threads for work that may block, and the way back
to the reactor.

Never the reactor's shared pool (it also serves DNS and has 10 threads), and
never ``blockingCallFromThread`` on the reactor thread (it deadlocks).
"""

from __future__ import annotations

import _thread
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail
from twisted.internet.threads import blockingCallFromThread, deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadable import isInIOThread
from twisted.python.threadpool import ThreadPool

log = Logger()
P = ParamSpec("P")
T = TypeVar("T")

#: How long shutdown waits for workers before leaving them (they are daemons).
JOIN_TIMEOUT = 0.5


class _QuickStartThread(threading.Thread):
    """A thread whose ``start`` returns at once.

    ``Thread.start`` waits until the new thread runs; the pool starts its workers from the
    thread that hands it work (the reactor), and with many threads busy that wait is
    milliseconds each: 200 turns prompted at once spent a second of the reactor's time just
    starting their workers (issue 27). The wait is left to a short-lived helper instead; when
    the process can have no more threads, the helper is the worker (a failure to start even
    the helper raises here, as ``Thread.start`` would)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decided = threading.Event()  # started, or the helper took the work
        self._helperDone: threading.Event | None = None

    def start(self) -> None:
        _thread.start_new_thread(self._startFromHelper, ())

    def _startFromHelper(self) -> None:
        try:
            threading.Thread.start(self)
        except RuntimeError:  # "can't start new thread": this one does the work instead
            self._helperDone = threading.Event()
            self._decided.set()
            try:
                self.run()
            finally:
                self._helperDone.set()
        else:
            self._decided.set()

    def join(self, timeout: float | None = None) -> None:
        if not self._decided.wait(timeout):
            return  # not even started within the time: as a join that timed out
        if self._helperDone is not None:
            self._helperDone.wait(timeout)
        else:
            super().join(timeout)


class _DaemonThreadPool(ThreadPool):
    """A stuck model call must never keep the process from exiting."""

    def threadFactory(self, *args: Any, **kwargs: Any) -> threading.Thread:  # type: ignore[override]
        return _QuickStartThread(*args, daemon=True, **kwargs)


class SpareThreads:
    """Threads for jobs that must never wait behind one another (a read of a stuck file
    system blocks only its own thread): each job runs at once, on a thread left idle by an
    earlier one, or on a new one (started without waiting, as the pool's). Up to
    ``keep`` idle threads wait ``idleSeconds`` for another job, then end; so a job of
    every turn starts no thread, and a burst leaves no crowd behind. Daemon threads, with
    nothing to stop: a job they are in at exit is abandoned, as a stuck one would be."""

    def __init__(self, name: str, keep: int = 4, idleSeconds: float = 60.0) -> None:
        self.name, self.keep, self.idleSeconds = name, keep, idleSeconds
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` (which reports its own result and failures) on a thread of its own."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            _QuickStartThread(target=self._serve, args=(inbox,), name=self.name, daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        job = inbox.get()
        while True:
            try:
                job()
            except Exception:
                log.failure("a {name} job failed", name=self.name)
            del job  # (what it holds goes now, not when the next job comes)
            with self._lock:
                if len(self._idle) >= self.keep:
                    return
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=self.idleSeconds)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # taken from the idle ones just now: its job is on the way


class WorkerPool(Service):
    """A bounded pool started and stopped with the service."""

    def __init__(self, reactor: Any, size: int, name: str = "hermes-agent") -> None:
        self.reactor = reactor
        self.name = name
        self.pool = _DaemonThreadPool(minthreads=0, maxthreads=size, name=name)

    def startService(self) -> None:
        Service.startService(self)
        self.pool.start()

    def run(self, f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Deferred[T]:
        """Run ``f`` on a worker; the Deferred fires in the reactor thread.

        A stopped pool would silently drop the work (and the Deferred would never
        fire), so that fails at once instead.
        """
        if self.pool.joined:
            return fail(RuntimeError(f"the {self.name} threads have stopped"))
        return deferToThreadPool(self.reactor, self.pool, f, *args, **kwargs)

    def stopService(self) -> Deferred[None]:
        """Join the workers off the reactor thread, for at most JOIN_TIMEOUT."""
        Service.stopService(self)
        done: Deferred[None] = Deferred()

        def join() -> None:
            self.pool.stop()
            self.reactor.callFromThread(lambda: done.called or done.callback(None))

        threading.Thread(target=join, name="hermes-pool-join", daemon=True).start()
        done.addTimeout(JOIN_TIMEOUT, self.reactor)
        # Debug only: what such a thread is doing (a turn that did not answer, which
        # shutdown reports itself) matters no more at exit.
        done.addErrback(lambda f: log.debug("{name} threads still busy at shutdown; exiting without them", name=self.name))
        return done


def callInReactor(reactor: Any, f: Callable[P, Any], *args: P.args, **kwargs: P.kwargs) -> Any:
    """From a worker thread: run ``f`` in the reactor thread and wait for its result.

    Raises RuntimeError on the reactor thread, where waiting would deadlock.
    """
    if isInIOThread():
        raise RuntimeError("callInReactor called from the reactor thread; it would deadlock")
    return blockingCallFromThread(reactor, f, *args, **kwargs)
