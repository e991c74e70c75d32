"""The worker pool and the bridge back to the reactor, on the real reactor."""

from __future__ import annotations

import threading
import time

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from hermes_acp.threads import JOIN_TIMEOUT, SpareThreads, WorkerPool, callInReactor

from .test_background import until


@pytest_twisted.ensureDeferred
async def test_runsOnOwnPoolAndCallsBack() -> None:
    """Work runs on a 'hermes-agent' worker; callInReactor waits for a Deferred on the reactor."""
    pool = WorkerPool(reactor, 2)
    pool.startService()
    try:
        def work() -> tuple[str, str, bool]:
            def onReactor() -> Deferred[str]:
                return deferLater(reactor, 0.01, lambda: threading.current_thread().name)

            return threading.current_thread().name, callInReactor(reactor, onReactor), threading.current_thread().daemon

        worker, reactorThread, daemon = await pool.run(work)
        assert "hermes-agent" in worker
        assert reactorThread == threading.current_thread().name
        assert daemon
    finally:
        await pool.stopService()


def test_callInReactorRefusesReactorThread() -> None:
    """On the reactor thread callInReactor raises instead of deadlocking."""
    with pytest.raises(RuntimeError, match="deadlock"):
        callInReactor(reactor, lambda: None)


@pytest_twisted.ensureDeferred
async def test_stopDoesNotHangOnStuckWorker() -> None:
    """A worker that never returns does not hold shutdown beyond JOIN_TIMEOUT."""
    pool = WorkerPool(reactor, 1)
    pool.startService()
    release = threading.Event()
    pool.run(release.wait)
    started = time.monotonic()
    await pool.stopService()
    assert time.monotonic() - started < JOIN_TIMEOUT + 1.0
    release.set()


@pytest_twisted.ensureDeferred
async def test_manyWorkersStartWithoutHoldingTheCaller() -> None:
    """Handing work to 64 new workers does not wait for each to start (issue 27), and every
    piece of work runs, each on a thread of its own, all at once."""
    width = 64
    pool = WorkerPool(reactor, width)
    pool.startService()
    try:
        barrier = threading.Barrier(width, timeout=20)  # bounded: a regression fails, it does not hang
        results = [pool.run(lambda: (barrier.wait(), threading.get_ident())[1]) for _ in range(width)]
        idents = [await d for d in results]
        assert len(set(idents)) == width
    finally:
        await pool.stopService()


@pytest_twisted.ensureDeferred
async def test_noThreadLeftTheHelperDoesTheWork(monkeypatch) -> None:
    """When the process can have no more threads, the work still runs (on the helper that
    tried to start the worker) instead of waiting for a worker that never comes."""
    pool = WorkerPool(reactor, 2)
    pool.startService()
    original = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        if "hermes-agent" in self.name:
            raise RuntimeError("can't start new thread")
        original(self)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    try:
        assert await pool.run(lambda: 42) == 42
    finally:
        monkeypatch.undo()
        await pool.stopService()


def test_spareThreadsRunEachJobAtOnceAndKeepAFewForTheNext() -> None:
    """Jobs that block do not hold the next one up; a thread left idle takes the next job
    instead of a new one starting; no more than ``keep`` wait idle; a job that raises is
    logged and its thread goes on."""
    spares = SpareThreads("hermes-test-spares", keep=2, idleSeconds=30)
    release, running = threading.Event(), threading.Semaphore(0)
    threads: list[threading.Thread] = []

    def blocked() -> None:
        threads.append(threading.current_thread())
        running.release()
        release.wait(10)

    for _ in range(4):
        spares.run(blocked)
    for _ in range(4):  # each started without waiting for the others
        assert running.acquire(timeout=10)
    assert len(set(threads)) == 4
    release.set()
    until(lambda: sum(t.is_alive() for t in threads) == 2, 10, "two kept; the other two ended")
    assert len(spares._idle) == 2
    kept = [t for t in threads if t.is_alive()]

    done, where = threading.Event(), []

    def failing() -> None:
        where.append(threading.current_thread())
        raise ValueError("a job that fails")

    def after() -> None:
        where.append(threading.current_thread())
        done.set()

    spares.run(failing)
    until(lambda: len(spares._idle) == 2, 10, "its thread idle again")
    spares.run(after)
    spares.run(after)
    assert done.wait(10)
    until(lambda: len(where) == 3, 10, "both jobs run")
    assert set(where) <= set(kept)  # the kept threads took them: nothing new started


def test_spareThreadsEndOnceIdleForLong() -> None:
    """A kept thread waits ``idleSeconds`` for another job, then ends."""
    spares = SpareThreads("hermes-test-idle", keep=4, idleSeconds=0.2)
    ran = threading.Event()
    spares.run(ran.set)
    assert ran.wait(10)
    until(lambda: not any(t.name == "hermes-test-idle" for t in threading.enumerate()), 10, "the idle thread's end")
    assert spares._idle == []

