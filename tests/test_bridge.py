"""The event bridge, driven from a real worker thread against a fake reactor
whose thread is the test's (see ``tests.workerthread``)."""

from __future__ import annotations

import random
import threading
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.bridge import COALESCE_SECONDS, MAX_BATCH_BYTES, EventBridge
from hermes_acp.threads import callInReactor

from .workerthread import ThreadedClock

MESSAGE, THOUGHT = "agent_message_chunk", "agent_thought_chunk"


def note(payload: Any) -> None:
    """The handler of the tests' events (the bridge only carries it)."""


class BridgeTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ThreadedClock()
        self.deliveries: list[list[tuple[str, Any]]] = []
        self.answer: Any = None
        self.isPaused = False
        self.bridge = EventBridge(self.reactor, self.deliver, paused=lambda: self.isPaused)

    def deliver(self, events: list[tuple[str, Any]]) -> Any:
        assert threading.current_thread() is threading.main_thread(), "deliver must run on the reactor"
        # An event is a (handler, args) pair; these tests send note(payload) and look at the payload.
        self.deliveries.append([(kind, payload[1][0] if kind == "event" else payload) for kind, payload in events])
        return self.answer() if callable(self.answer) else self.answer

    def onReactor(self, f: Any, *args: Any) -> Any:
        """From the worker: run ``f`` on the reactor and wait (everything queued before runs first)."""
        return callInReactor(self.reactor, f, *args)

    def advance(self, seconds: float = COALESCE_SECONDS) -> None:
        self.onReactor(self.reactor.advance, seconds)


class CoalescingTests(BridgeTestCase):
    def busy(self) -> threading.Event:
        """From the worker: keep the reactor busy until the returned event is set."""
        gate = threading.Event()
        self.reactor.callFromThread(gate.wait, 10)
        return gate

    def test_fourThousandDeltasExactly(self) -> None:
        """4,000 deltas that arrive in 16 bursts while the reactor is busy go out in 16
        deliveries (one per burst) and concatenate exactly."""
        deltas = [f"{i}," for i in range(4000)]

        def work() -> None:
            for start in range(0, 4000, 250):
                gate = self.busy()
                for delta in deltas[start:start + 250]:
                    self.bridge.message(delta)
                gate.set()
                self.onReactor(lambda: None)  # the reactor took the burst
                self.advance()
            self.bridge.flush()

        self.reactor.runInWorker(work)
        self.assertEqual(len(self.deliveries), 16)
        self.assertEqual(
            self.deliveries, [[(MESSAGE, "".join(deltas[i : i + 250]))] for i in range(0, 4000, 250)]
        )
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_racingTimerNeverReordersDuplicatesOrDrops(self) -> None:
        """With the timer firing between every hop, in whatever order the threads meet,
        message and thought text and events come out in order, each piece once."""
        rng = random.Random(7)
        script: list[tuple[str, Any]] = []
        kind = MESSAGE
        for i in range(4000):
            if rng.random() < 0.02:
                kind = THOUGHT if kind == MESSAGE else MESSAGE
            script.append((kind, f"<{i}>"))
            if rng.random() < 0.01:
                script.append(("event", i))

        def work() -> None:
            for kind, payload in script:
                if kind == "event":
                    self.bridge.event(note, payload)
                elif kind == MESSAGE:
                    self.bridge.message(payload)
                else:
                    self.bridge.thought(payload)
            self.bridge.flush()

        self.reactor.runInWorker(work, between=lambda: self.reactor.advance(COALESCE_SECONDS))
        self.assertEqual(merged([e for batch in self.deliveries for e in batch]), merged(script))

    def test_switchingKindFlushesInOrder(self) -> None:
        """A thought after message text sends the message first (and back again)."""
        seen: list[Any] = []

        def work() -> None:
            self.bridge.message("a")
            self.bridge.message("b")
            self.bridge.thought("c")
            seen.append(list(self.deliveries))
            self.bridge.thought("d")
            self.bridge.message("e")
            seen.append(list(self.deliveries))
            self.bridge.flush()

        self.reactor.runInWorker(work)
        self.assertEqual(seen[0], [[(MESSAGE, "ab")]])
        self.assertEqual(seen[1], [[(MESSAGE, "ab")], [(THOUGHT, "cd")]])
        self.assertEqual(self.deliveries, [[(MESSAGE, "ab")], [(THOUGHT, "cd")], [(MESSAGE, "e")]])

    def test_eventSendsTextFirst(self) -> None:
        """An event after text goes out in the same delivery, after the text; event()
        returns what deliver returned."""
        self.answer = "ack"

        def work() -> Any:
            self.bridge.thought("hmm")
            self.bridge.message("x")
            self.bridge.message("y")
            return self.bridge.event(note, ("started", "terminal"))

        self.assertEqual(self.reactor.runInWorker(work), "ack")
        self.assertEqual(self.deliveries, [[(THOUGHT, "hmm")], [(MESSAGE, "xy"), ("event", ("started", "terminal"))]])

    def test_callRunsAfterTheText(self) -> None:
        """call() sends the pending text, then runs f on the reactor and returns its result."""
        asked: list[Any] = []
        answers: list[Deferred[str]] = []

        def ask(question: str) -> Deferred[str]:
            asked.append((question, list(self.deliveries)))
            answers.append(Deferred())
            return answers[-1]

        def answer() -> None:
            while answers:
                answers.pop().callback("yes")

        def work() -> Any:
            self.bridge.message("before")
            return self.bridge.call(ask, "rm")

        self.assertEqual(self.reactor.runInWorker(work, between=answer), "yes")
        self.assertEqual(asked, [("rm", [[(MESSAGE, "before")]])])

    def test_emptyDeltasCostNothing(self) -> None:
        """Empty text neither arms a timer nor delivers anything."""

        def work() -> None:
            self.bridge.message("")
            self.bridge.thought("")
            self.bridge.flush()

        self.reactor.runInWorker(work)
        self.assertEqual((self.reactor.ran, self.deliveries), (0, []))


class BatchLimitTests(BridgeTestCase):
    def test_fullBatchFlushesSynchronously(self) -> None:
        """The delta that fills the batch to MAX_BATCH_BYTES is delivered before message() returns."""
        seen: list[Any] = []

        def work() -> None:
            self.bridge.message("a" * (MAX_BATCH_BYTES - 1))
            seen.append(len(self.deliveries))
            self.bridge.message("b")
            seen.append(list(self.deliveries))

        self.reactor.runInWorker(work)
        self.assertEqual(seen, [0, [[(MESSAGE, "a" * (MAX_BATCH_BYTES - 1) + "b")]]])

    def test_fullMeansBytes(self) -> None:
        """Multi-byte text fills the batch by its UTF-8 size, not its length in characters."""
        seen: list[Any] = []

        def work() -> None:
            self.bridge.thought("é" * (MAX_BATCH_BYTES // 2))
            seen.append(list(self.deliveries))

        self.reactor.runInWorker(work)
        self.assertEqual(seen, [[[(THOUGHT, "é" * (MAX_BATCH_BYTES // 2))]]])


class DrainTests(BridgeTestCase):
    def test_firstDeltaGoesAtOnce(self) -> None:
        """A delta crosses to the reactor at once: no timer, no waiting for more."""
        seen: list[Any] = []

        def work() -> None:
            self.bridge.message("hello")
            self.onReactor(lambda: None)
            seen.append((list(self.deliveries), len(self.reactor.getDelayedCalls())))
            self.advance()
            self.bridge.message(" world")
            self.onReactor(lambda: None)

        self.reactor.runInWorker(work)
        self.assertEqual(seen, [([[(MESSAGE, "hello")]], 0)])
        self.assertEqual(self.deliveries, [[(MESSAGE, "hello")], [(MESSAGE, " world")]])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_atMostOneBatchAWindow(self) -> None:
        """Text that follows a batch within COALESCE_SECONDS waits for the rest of that window,
        gathering what comes meanwhile: a fast stream makes one frame a window."""
        seen: list[Any] = []

        def work() -> None:
            self.bridge.message("a")
            self.onReactor(lambda: None)
            self.advance(COALESCE_SECONDS / 5)
            self.bridge.message("b")
            self.bridge.message("c")
            self.onReactor(lambda: None)
            seen.append(list(self.deliveries))
            self.advance(COALESCE_SECONDS * 4 / 5)

        self.reactor.runInWorker(work)
        self.assertEqual(seen, [[[(MESSAGE, "a")]]])
        self.assertEqual(self.deliveries, [[(MESSAGE, "a")], [(MESSAGE, "bc")]])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_deltasWhileTheReactorIsBusyJoin(self) -> None:
        """Deltas that arrive before the reactor gets to the first one go out with it: one hop."""

        def work() -> None:
            gate = threading.Event()
            self.reactor.callFromThread(gate.wait, 10)
            for delta in "abc":
                self.bridge.message(delta)
            gate.set()

        self.reactor.runInWorker(work)
        self.assertEqual(self.deliveries, [[(MESSAGE, "abc")]])
        self.assertEqual(self.reactor.ran, 2)  # the gate and one drain

    def test_drainAfterTheBatchLeftStops(self) -> None:
        """A drain whose batch an event already took sends nothing; the next delta asks for a new one."""

        def work() -> None:
            gate = threading.Event()
            self.reactor.callFromThread(gate.wait, 10)
            self.bridge.message("a")
            self.bridge.event(note, "e")  # queued behind the drain: the batch goes with the event
            gate.set()
            self.bridge.message("b")
            self.onReactor(lambda: None)
            self.advance()

        self.reactor.runInWorker(work)
        self.assertEqual(self.deliveries, [[(MESSAGE, "a"), ("event", "e")], [(MESSAGE, "b")]])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_pausedDrainHoldsTheBatch(self) -> None:
        """While the editor is behind, the batch is held (it grows) and looked at again every
        COALESCE_SECONDS; once the editor catches up, the next look sends it all, and stops."""
        self.isPaused = True
        seen: list[Any] = []

        def work() -> None:
            self.bridge.message("a")
            for _ in range(5):
                self.advance()
            self.bridge.message("b")
            self.advance()
            seen.append((list(self.deliveries), len(self.reactor.getDelayedCalls())))
            self.isPaused = False
            self.advance()

        self.reactor.runInWorker(work)
        self.assertEqual(seen, [([], 1)])
        self.assertEqual(self.deliveries, [[(MESSAGE, "ab")]])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_pausedDrainWithNothingLeftStops(self) -> None:
        """If the batch went out another way (the turn's final flush), a held batch's timer
        does not keep ticking for ever."""
        self.isPaused = True

        def work() -> None:
            self.bridge.message("a")
            self.bridge.flush()
            self.advance()

        self.reactor.runInWorker(work)
        self.assertEqual(self.deliveries, [[(MESSAGE, "a")]])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_drainDeliveryFailureIsLogged(self) -> None:
        """A failing delivery from the drain is logged, not raised into the reactor; so is
        a Deferred it returns that fails."""

        def broken(events: Any) -> None:
            raise ValueError("no connection")

        self.bridge.deliver = broken

        def work() -> None:
            self.bridge.message("a")
            self.onReactor(lambda: None)

        self.reactor.runInWorker(work)
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)

        failing: Deferred[None] = Deferred()
        self.bridge.deliver = lambda events: failing
        self.reactor.advance(COALESCE_SECONDS)
        self.reactor.runInWorker(work)
        failing.errback(KeyError("gone"))
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)


class BackPressureTests(BridgeTestCase):
    def waitsForTheEditor(self, work: Any) -> list[str]:
        """Run ``work``; each delivery answers a Deferred that fires only after a check
        that the worker is still waiting for it."""
        order: list[str] = []
        pending: list[Deferred[None]] = []
        resumed = threading.Event()

        def answer() -> Deferred[None]:
            d: Deferred[None] = Deferred()
            pending.append(d)
            return d

        def between() -> None:
            while pending:
                resumed.wait(0.05)  # a bridge that did not wait would resume here
                order.append("editor caught up")
                pending.pop(0).callback(None)

        def worker() -> None:
            work()
            order.append("worker resumed")
            resumed.set()

        self.answer = answer
        self.reactor.runInWorker(worker, between)
        return order

    def test_eventWaitsForTheEditor(self) -> None:
        """event() returns only once the editor has taken the update."""
        order = self.waitsForTheEditor(lambda: self.bridge.event(note, "tool"))
        self.assertEqual(order, ["editor caught up", "worker resumed"])

    def test_fullBatchWaitsForTheEditor(self) -> None:
        """A full batch blocks the worker until the editor catches up."""
        order = self.waitsForTheEditor(lambda: self.bridge.message("z" * MAX_BATCH_BYTES))
        self.assertEqual(order, ["editor caught up", "worker resumed"])
        self.assertEqual(self.deliveries, [[(MESSAGE, "z" * MAX_BATCH_BYTES)]])


def merged(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Adjacent text of one kind joined: what the editor shows."""
    out: list[tuple[str, Any]] = []
    for kind, payload in events:
        if out and kind != "event" and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + payload)
        else:
            out.append((kind, payload))
    return out


class _QueueReactor:
    """callFromThread and callLater as one FIFO queue, run by hand: an interleaving of
    threads replayed step by step."""

    def __init__(self) -> None:
        self.queue: list[tuple[Any, tuple[Any, ...]]] = []

    def seconds(self) -> float:
        return 100.0

    def callFromThread(self, f: Any, *args: Any) -> None:
        self.queue.append((f, args))

    def callLater(self, delay: float, f: Any, *args: Any) -> None:
        self.queue.append((f, args))

    def run(self) -> None:
        while self.queue:
            f, args = self.queue.pop(0)
            f(*args)


class ParallelTextTests(SynchronousTestCase):
    def test_aBatchTakenByAnotherThreadIsNotOvertaken(self) -> None:
        """Children stream at once through one bridge: when one child's tool call makes the
        other's batch go out, text the other adds before that batch reaches the reactor follows it,
        never overtakes it (the drain queued for the first delta waits for the batch)."""
        import hermes_acp.bridge as bridge

        reactor, sent = _QueueReactor(), []
        self.patch(bridge, "callInReactor", lambda r, f, *args: r.callFromThread(f, *args))
        shared = EventBridge(reactor, sent.extend)
        first, second = "subagent_chunk\tc\t1", "subagent_chunk\tc\t2"
        send = shared._send

        def sendingLate(events: list[tuple[str, Any]]) -> Any:
            self.patch(shared, "_send", send)  # once
            shared._text(first, "a2 ")  # child 1 streams on while child 2 hands over its batch
            return send(events)

        shared._text(first, "a1 ")  # a drain is queued
        self.patch(shared, "_send", sendingLate)
        shared.event(note, "child 2 calls a tool")  # child 2's thread takes child 1's batch
        reactor.run()
        self.assertEqual([text for kind, text in sent if kind == first], ["a1 ", "a2 "])


class SettleTests(BridgeTestCase):
    def test_settleDeliversTheBatchThenCalls(self) -> None:
        """``settle`` (a cancel's answer) delivers the text the batch holds, then calls
        ``then``: what came before the cancel is shown before the prompt answers."""
        done: list[Any] = []

        def work() -> None:
            self.bridge.message("a")
            self.onReactor(lambda: None)  # "a" went out
            self.bridge.message("b")  # within the window: held until its timer
            self.onReactor(self.bridge.settle, lambda: done.append(list(self.deliveries)))

        self.reactor.runInWorker(work)
        self.assertEqual(done, [[[(MESSAGE, "a")], [(MESSAGE, "b")]]])

    def test_settleWaitsForABatchBeingHandedOver(self) -> None:
        """A batch a worker took and is still handing over goes out before ``then``."""
        done: list[Any] = []
        gate = threading.Event()

        def work() -> None:
            self.bridge.message("before")
            with self.bridge._lock:  # the worker took the batch (``flush``) and has not handed it over yet
                batch = self.bridge._take()
                self.bridge._inFlight += 1
            self.reactor.callFromThread(self.bridge.settle, lambda: done.append(list(self.deliveries)))
            self.reactor.callFromThread(gate.set)
            assert gate.wait(10)
            self.onReactor(lambda: None)
            self.bridge._send(batch)
            self.onReactor(self.reactor.advance, 0)

        self.reactor.runInWorker(work)
        self.assertEqual(done, [[[(MESSAGE, "before")]]])
