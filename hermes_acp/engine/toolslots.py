"""How many tool calls run at once in the whole process.

Every run shares one ``ToolSlots`` (the agent factory gives each session's agent the same
one): a call's thread starts only once the call holds a slot, so threads and the processes
commands start stay bounded however many sessions run replies full of tool calls. A slot is
granted by putting ``GRANTED`` into the asking run's queue, the one it already waits on for
its calls' outcomes and for a cancel, so a run waits for all three in one place and a cancel
never waits for a slot. Slots go to the runs that asked, first come first served.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any

#: Put into an asking run's queue when one of its asks is granted.
GRANTED = object()


class ToolSlots:
    """``size`` slots for running tool calls, granted in the order they were asked for."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"ToolSlots needs at least one slot, not {size}")
        self.size = size
        self._free = size
        self._asks: deque[queue.Queue[Any]] = deque()
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        with self._lock:
            return self._free

    def ask(self, inbox: queue.Queue[Any]) -> None:
        """Ask for one slot: ``GRANTED`` goes into ``inbox`` now or when one is released.
        Whoever receives it holds the slot until ``release``."""
        with self._lock:
            if self._free and not self._asks:
                self._free -= 1
                inbox.put(GRANTED)
            else:
                self._asks.append(inbox)

    def release(self) -> None:
        """Give a held slot back: to the longest-waiting ask, else to the free ones."""
        with self._lock:
            if self._asks:
                self._asks.popleft().put(GRANTED)
            elif self._free < self.size:
                self._free += 1
            else:
                raise RuntimeError("released a tool slot that was never granted")

    def releaseGrants(self, inbox: queue.Queue[Any]) -> list[Any]:
        """Give back the slots granted to ``inbox`` that its owner no longer needs (after
        ``withdraw``, no more come); the other items it held, in order."""
        others = []
        while True:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                return others
            if item is GRANTED:
                self.release()
            else:
                others.append(item)

    def withdraw(self, inbox: queue.Queue[Any]) -> int:
        """Take back every ask of ``inbox`` not granted yet; how many there were. After it no
        grant reaches ``inbox`` for them (grants already in it are the caller's to release)."""
        with self._lock:
            kept = deque(q for q in self._asks if q is not inbox)
            withdrawn = len(self._asks) - len(kept)
            self._asks = kept
            return withdrawn
