"""The worker pool and the bridge back to the reactor, on the real reactor."""

from __future__ import annotations

import threading
import time

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from hermes_acp.threads import JOIN_TIMEOUT, WorkerPool, callInReactor


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
