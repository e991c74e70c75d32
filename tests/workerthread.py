"""A fake reactor for code that runs in a worker thread and crosses to the reactor.

The test's own thread plays the reactor: ``callFromThread`` only queues, and
``ThreadedClock.runInWorker`` runs a function in a real worker thread while
it runs whatever the worker queued, in order, until the worker returns. Time is
a ``twisted.internet.task.Clock``, moved by the test (or by the worker
through ``callInReactor(reactor, reactor.advance, seconds)``), never by sleeping.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock

#: A safety net against a hung worker; no test waits this long when it passes.
HANG = 30.0


class ThreadedClock(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.queued: queue.Queue[Callable[[], Any]] = queue.Queue()
        self.ran = 0

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.queued.put(lambda: f(*args, **kwargs))

    def runInWorker(self, work: Callable[[], Any], between: Callable[[], Any] | None = None) -> Any:
        """``work()`` in a new thread; here, what it queues, then ``between()`` after each.

        Returns what ``work`` returned, or raises what it raised."""
        finished = object()
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["result"] = work()
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = e
            finally:
                self.queued.put(lambda: finished)

        worker = threading.Thread(target=target, name="test-worker", daemon=True)
        worker.start()
        while True:
            try:
                call = self.queued.get(timeout=HANG)
            except queue.Empty:
                raise AssertionError(f"the worker did not finish within {HANG} s") from None
            if call() is finished:
                break
            self.ran += 1
            if between is not None:
                between()
        worker.join(HANG)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")
