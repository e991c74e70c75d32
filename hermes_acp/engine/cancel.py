"""A turn's cancellation: a flag, a wake-up for every thread waiting on a queue, and calls
that end what cannot wait on one (a model request's socket)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
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
        self._calls: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        """Only the first call wakes the waiters; later ones change nothing."""
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            waiting, calls = list(self._queues), list(self._calls)
        for q in waiting:
            q.put(CANCELLED)
        for call in calls:
            call()

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

    @contextmanager
    def calling(self, call: Callable[[], None]) -> Iterator[None]:
        """While inside, cancelling calls ``call`` (in the cancelling thread; at once when
        already cancelled)."""
        with self._lock:
            self._calls.append(call)
            cancelled = self.event.is_set()
        if cancelled:
            call()
        try:
            yield
        finally:
            with self._lock:
                self._calls.remove(call)

    def sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True when cancelled meanwhile."""
        return self.event.wait(seconds)
