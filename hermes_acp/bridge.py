"""The worker-thread side of a turn: engine callbacks → the reactor, in order.

Text and thought deltas are coalesced: the first delta of a batch arms a
short timer on the reactor, later deltas join the batch, and anything else
(a tool event, the other kind of text, the turn's end) sends the batch first.
A 4,000-delta answer costs a few dozen thread hops, never reordered,
duplicated or dropped. Every other event crosses with ``callInReactor`` and
waits until the editor has caught up (back-pressure instead of memory growth).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger

from .threads import callInReactor

log = Logger()

#: How long deltas may wait to be batched, and the most a batch may hold.
COALESCE_SECONDS = 0.005
MAX_BATCH_BYTES = 64 * 1024

Deliver = Callable[[list[tuple[str, Any]]], Any]


class EventBridge:
    """Carries one turn's events from its threads to ``deliver`` on the reactor.

    ``deliver(events)`` runs in the reactor thread with a list of
    ``(kind, payload)`` pairs and may return a Deferred that fires when the
    editor can take more. Kinds: "agent_message_chunk", "agent_thought_chunk"
    (payload: text) and "event" (payload: anything the turn understands).
    """

    def __init__(self, reactor: Any, deliver: Deliver, paused: Callable[[], bool] = lambda: False) -> None:
        self.reactor = reactor
        self.deliver = deliver
        self.paused = paused
        self._lock = threading.Lock()
        self._kind: str | None = None
        self._parts: list[str] = []
        self._size = 0
        self._armed = False

    def message(self, text: str) -> None:
        self._text("agent_message_chunk", text)

    def thought(self, text: str) -> None:
        self._text("agent_thought_chunk", text)

    def _text(self, kind: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            pending = self._take() if self._kind not in (None, kind) else []
        if pending:  # the other kind of text goes out first, in order
            self._send(pending)
        with self._lock:
            self._kind = kind
            self._parts.append(text)
            self._size += len(text.encode("utf-8", "surrogatepass"))
            full = self._size >= MAX_BATCH_BYTES
            arm = not self._armed and not full
            self._armed = self._armed or arm
        if full:
            self.flush()
        elif arm:
            self.reactor.callFromThread(self.reactor.callLater, COALESCE_SECONDS, self._timerFired)

    def _take(self) -> list[tuple[str, Any]]:
        """Empty the batch (the lock is held)."""
        if not self._parts:
            return []
        batch = [(self._kind or "agent_message_chunk", "".join(self._parts))]
        self._parts, self._size, self._kind = [], 0, None
        return batch

    def _timerFired(self) -> None:
        """In the reactor thread: send whatever the batch holds now.

        While the editor is behind, the batch keeps growing instead; once full,
        the worker's own flush waits for the editor (back-pressure). A timer
        that finds the batch already gone stops (the next delta arms a new one)."""
        paused = self.paused()
        with self._lock:
            holding = paused and bool(self._parts)
            self._armed = holding
            batch = [] if holding else self._take()
        if holding:
            self.reactor.callLater(COALESCE_SECONDS, self._timerFired)
        elif batch:
            d = maybeDeferred(self.deliver, batch)
            d.addErrback(lambda f: log.failure("delivering coalesced text failed", f))

    def flush(self) -> None:
        """Send the batch now (from a worker thread) and wait for the editor."""
        with self._lock:
            batch = self._take()
        if batch:
            self._send(batch)

    def event(self, payload: Any) -> Any:
        """Send the batch, then this event; returns what ``deliver`` returned."""
        with self._lock:
            batch = self._take()
        return self._send(batch + [("event", payload)])

    def call(self, f: Callable[..., Any], *args: Any) -> Any:
        """Run ``f`` in the reactor thread after the batch (e.g. to ask permission)."""
        self.flush()
        return callInReactor(self.reactor, f, *args)

    def _send(self, events: list[tuple[str, Any]]) -> Any:
        return callInReactor(self.reactor, self.deliver, events)
