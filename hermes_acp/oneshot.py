"""One event, any number of waiters: the "fire every waiter once" helper.

``when()`` hands each caller a Deferred of its own (as txtorcon and
magic-wormhole learned to): cancelling one waiter leaves the event and the other
waiters alone, and a waiter that comes after the event gets the result at once.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

T = TypeVar("T")


class OneShot(Generic[T]):
    """Fires once, with a result or a Failure; later ``fire`` calls do nothing."""

    def __init__(self) -> None:
        self._waiters: list[Deferred[T]] = []
        self._fired = False
        self._result: Any = None

    @property
    def fired(self) -> bool:
        return self._fired

    def when(self) -> Deferred[T]:
        """A fresh Deferred with the event's result."""
        d: Deferred[T] = Deferred(lambda d: self._waiters.remove(d) if d in self._waiters else None)
        if self._fired:
            d.callback(self._result)
        else:
            self._waiters.append(d)
        return d

    def fire(self, result: T | Failure) -> None:
        if self._fired:
            return
        self._fired, self._result = True, result
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(result)
