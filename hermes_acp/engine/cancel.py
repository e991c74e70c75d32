"""A turn's cancellation: a flag plus a wake-up for every thread waiting on a queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Put into a watched queue when the turn is cancelled.
CANCELLED = object()


class Cancellation:
    """Set once by ``cancel`` (from any thread); waits end at once when it is."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Any]] = []

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        """Only the first call wakes the waiters; later ones change nothing."""
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            waiting = list(self._queues)
        for q in waiting:
            q.put(CANCELLED)

    @contextmanager
    def watching(self, q: queue.Queue[Any]) -> Iterator[queue.Queue[Any]]:
        """While inside, cancelling puts ``CANCELLED`` into ``q``."""
        with self._lock:
            self._queues.append(q)
            if self.event.is_set():
                q.put(CANCELLED)
        try:
            yield q
        finally:
            with self._lock:
                self._queues.remove(q)

    def sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True when cancelled meanwhile."""
        return self.event.wait(seconds)
