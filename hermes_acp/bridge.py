"""The worker-thread side of a turn: an engine run's events → the reactor, in order.

Text and thought deltas are coalesced: the first delta of a batch crosses to
the reactor at once (one ``callFromThread``, no timer, no Deferred), and the
deltas that arrive before the reactor gets to it join the batch; a batch that
starts within ``COALESCE_SECONDS`` of the last one sent waits for the rest of
that window (a fast stream makes at most one frame a window, as the editor
can take them). Anything else (a tool event, the other kind of text, the
turn's end) sends the batch first. So a slow stream shows each delta at once
for one hop, and a fast one costs a hop per window, never reordered,
duplicated or dropped. While the editor is behind, the batch is held (and
grows) and looked at again every ``COALESCE_SECONDS``. Every other event
crosses with ``callInReactor`` and waits until the editor has caught up
(back-pressure instead of memory growth).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import implementer

from .interfaces import ITurnObserver
from .threads import callInReactor

if TYPE_CHECKING:
    from .engine.access import EditProposal

log = Logger()

#: The shortest time between two batches of text (and how often a batch held while the
#: editor is behind is looked at again), and the most a batch may hold.
COALESCE_SECONDS = 0.005
MAX_BATCH_BYTES = 64 * 1024

Deliver = Callable[[list[tuple[str, Any]]], Any]
SUMMARY_CHUNK = "compaction_summary_chunk"
#: The kind of a child's text: ``SUBAGENT_CHUNK`` + ``"\t"`` + the delegate call's id + ``"\t"`` + the child.
SUBAGENT_CHUNK = "subagent_chunk"


class EventBridge:
    """Carries one turn's events from its threads to ``deliver`` on the reactor.

    ``deliver(events)`` runs in the reactor thread with a list of
    ``(kind, payload)`` pairs and may return a Deferred that fires when the
    editor can take more. Kinds: "agent_message_chunk", "agent_thought_chunk",
    "compaction_summary_chunk" (payload: text) and "event" (payload: a
    ``(handler, args)`` pair to call).
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
        #: Batches a worker took and has not yet handed to the reactor (``_send``): a drain
        #: waits for them, or text added since would overtake them.
        self._inFlight = 0
        #: When the last batch went out (``_drain``): at most one a ``COALESCE_SECONDS``.
        self._sent = float("-inf")

    def message(self, text: str) -> None:
        self._text("agent_message_chunk", text)

    def thought(self, text: str) -> None:
        self._text("agent_thought_chunk", text)

    def summary(self, text: str) -> None:
        """A piece of a compaction's summary (coalesced like the answer)."""
        self._text(SUMMARY_CHUNK, text)

    def childText(self, callId: str, child: int, text: str) -> None:
        """A piece of a child's answer: coalesced like the parent's, one batch per child."""
        self._text(f"{SUBAGENT_CHUNK}\t{callId}\t{child}", text)

    def _text(self, kind: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            pending = self._take() if self._kind not in (None, kind) else None
            if pending:
                self._inFlight += 1
            else:
                self._kind = kind
                self._parts.append(text)
                self._size += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
                full = self._size >= MAX_BATCH_BYTES
                arm = not self._armed and not full
                self._armed = self._armed or arm
        if pending:  # the other kind of text goes out first, in order
            self._send(pending)
            self._text(kind, text)
        elif full:
            self.flush()
        elif arm:
            wait = self._sent + COALESCE_SECONDS - self.reactor.seconds()
            if wait > 0:  # a frame went out just now: this one gathers what comes for the rest of the window
                self.reactor.callFromThread(self.reactor.callLater, wait, self._drain)
            else:
                self.reactor.callFromThread(self._drain)

    def _take(self) -> list[tuple[str, Any]]:
        """Empty the batch (the lock is held)."""
        if not self._parts:
            return []
        batch = [(self._kind or "agent_message_chunk", "".join(self._parts))]
        self._parts, self._size, self._kind = [], 0, None
        return batch

    def _drain(self) -> None:
        """In the reactor thread: send whatever the batch holds now.

        While the editor is behind, the batch keeps growing instead (looked at again
        every ``COALESCE_SECONDS``); once full, the worker's own flush waits for the
        editor (back-pressure). A drain that finds the batch already gone stops (the
        next delta asks for a new one)."""
        paused = self.paused()
        with self._lock:
            # Paused with text, or a worker's batch still on its way: this batch must follow it.
            holding = bool(self._parts) and (paused or self._inFlight > 0)
            self._armed = holding
            batch = [] if holding else self._take()
        if holding:
            self.reactor.callLater(COALESCE_SECONDS, self._drain)
        elif batch:
            self._sent = self.reactor.seconds()
            try:
                sent = self.deliver(batch)  # (when the editor caught up: only the worker's waits need it)
            except Exception:
                log.failure("delivering coalesced text failed")
            else:
                if sent is not None and isinstance(sent, Deferred):  # (an ABC check: not per frame)
                    sent.addErrback(lambda f: log.failure("delivering coalesced text failed", f))

    def flush(self) -> None:
        """Send the batch now (from a worker thread) and wait for the editor."""
        with self._lock:
            batch = self._take()
            if batch:
                self._inFlight += 1
        if batch:
            self._send(batch)

    def settle(self, then: Callable[[], None]) -> None:
        """In the reactor thread: deliver what the batch holds now, then call ``then``; a batch
        a worker took and is still handing over goes first (the hop is queued: this looks
        again after it). A cancelled turn answers so: what came before the cancel is shown."""
        with self._lock:
            handing = self._inFlight > 0
            batch = [] if handing else self._take()
        if handing:
            self.reactor.callLater(0, self.settle, then)
            return
        if batch:
            self.deliver(batch)
        then()

    def event(self, handler: Callable[..., Any], *args: Any) -> Any:
        """Send the batch, then ``handler(*args)``; returns what ``deliver`` returned."""
        with self._lock:
            batch = self._take()
            self._inFlight += 1
        return self._send(batch + [("event", (handler, args))])

    def call(self, f: Callable[..., Any], *args: Any) -> Any:
        """Run ``f`` in the reactor thread after the batch (e.g. to ask permission)."""
        self.flush()
        return callInReactor(self.reactor, f, *args)

    def _send(self, events: list[tuple[str, Any]]) -> Any:
        """Hand a batch taken by a worker (counted in ``_inFlight``) to the reactor, in order."""

        def deliver() -> Any:
            with self._lock:
                self._inFlight -= 1
            return self.deliver(events)

        return callInReactor(self.reactor, deliver)


class TurnEvents(Protocol):
    """The reactor side of one turn, as an engine run's observer reaches it."""

    def toolStarted(self, callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None: ...

    def toolRunning(self, callId: str) -> None: ...

    def toolEnded(self, callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None: ...

    def terminalStarted(self, callId: str, terminalId: str) -> None: ...

    def commandOutput(self, callId: str, output: str) -> None: ...

    def askCommand(self, callId: str, command: str, reason: str) -> Deferred[str]: ...

    def askEdit(self, callId: str, proposal: EditProposal) -> Deferred[str]: ...

    def askRead(self, callId: str, path: str, reason: str) -> Deferred[str]: ...

    def askPlan(self, callId: str, plan: str) -> Deferred[str]: ...

    def callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> Deferred[tuple[str, bool, dict[str, Any]]]: ...

    def askUser(self, callId: str, question: str, choices: list[str]) -> Deferred[tuple[str, str]]: ...

    def compactionStarted(self, compactionId: str, reason: str) -> None: ...

    def compactionEnded(self, compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None: ...

    def subagentStarted(self, callId: str, child: int, name: str, goal: str) -> None: ...

    def subagentEnded(self, callId: str, child: int, status: str, summary: str) -> None: ...


@implementer(ITurnObserver)
@attrs.frozen
class BridgedObserver:
    """An engine run's observer: each event crosses to the turn on the reactor, in
    the order the engine reported it; a question waits there for its answer."""

    bridge: EventBridge
    turn: TurnEvents

    def text(self, delta: str) -> None:
        self.bridge.message(delta)

    def thought(self, delta: str) -> None:
        self.bridge.thought(delta)

    def toolStarted(self, callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None:
        self.bridge.event(self.turn.toolStarted, callId, name, arguments, extras)

    def toolRunning(self, callId: str) -> None:
        self.bridge.event(self.turn.toolRunning, callId)

    def toolEnded(self, callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None:
        self.bridge.event(self.turn.toolEnded, callId, name, result, failed, extras)

    def terminalStarted(self, callId: str, terminalId: str) -> None:
        self.bridge.event(self.turn.terminalStarted, callId, terminalId)

    def commandOutput(self, callId: str, output: str) -> None:
        self.bridge.event(self.turn.commandOutput, callId, output)

    def approveCommand(self, callId: str, command: str, reason: str) -> str:
        answer: str = self.bridge.call(self.turn.askCommand, callId, command, reason)
        return answer

    def approveEdit(self, callId: str, proposal: EditProposal) -> str:
        answer: str = self.bridge.call(self.turn.askEdit, callId, proposal)
        return answer

    def approveRead(self, callId: str, path: str, reason: str) -> str:
        answer: str = self.bridge.call(self.turn.askRead, callId, path, reason)
        return answer

    def approvePlan(self, callId: str, plan: str) -> str:
        answer: str = self.bridge.call(self.turn.askPlan, callId, plan)
        return answer

    def callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        outcome: tuple[str, bool, dict[str, Any]] = self.bridge.call(self.turn.callTool, callId, name, arguments)
        return outcome

    def askUser(self, callId: str, question: str, choices: list[str]) -> tuple[str, str]:
        answer: tuple[str, str] = self.bridge.call(self.turn.askUser, callId, question, choices)
        return answer

    def compactionStarted(self, compactionId: str, reason: str) -> None:
        self.bridge.event(self.turn.compactionStarted, compactionId, reason)

    def compactionText(self, compactionId: str, delta: str) -> None:
        self.bridge.summary(delta)  # a run compacts once at a time: the turn knows which

    def compactionEnded(self, compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None:
        self.bridge.event(self.turn.compactionEnded, compactionId, status, summary, error, before, after)

    def subagentStarted(self, callId: str, child: int, name: str, goal: str) -> None:
        self.bridge.event(self.turn.subagentStarted, callId, child, name, goal)

    def subagentText(self, callId: str, child: int, delta: str) -> None:
        self.bridge.childText(callId, child, delta)

    def subagentEnded(self, callId: str, child: int, status: str, summary: str) -> None:
        self.bridge.event(self.turn.subagentEnded, callId, child, status, summary)
