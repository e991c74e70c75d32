"""The permission broker: answers, timeout-to-deny, cancel, serialization."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from hermes_acp.interfaces import IPermissionBroker
from hermes_acp.permissions import PermissionBroker, permissionOptions

from .test_jsonrpc import Harness

CALL = {"toolCallId": "call-1", "title": "Run rm -rf build", "kind": "execute"}


def broker(timeout: float = 60.0) -> tuple[Harness, PermissionBroker]:
    h = Harness()
    return h, PermissionBroker(h.connection.callRemote, h.clock, timeout)


def answer(h: Harness, requestId: int, outcome: dict) -> None:
    h.send({"jsonrpc": "2.0", "id": requestId, "result": {"outcome": outcome}})


class BrokerTests(SynchronousTestCase):
    def test_provides(self) -> None:
        """PermissionBroker provides IPermissionBroker."""
        self.assertTrue(verifyObject(IPermissionBroker, broker()[1]))

    def test_offersAllFourKinds(self) -> None:
        """The request carries the tool call and the four spec option kinds."""
        h, b = broker()
        b.requestPermission("s1", CALL, "execute")
        [sent] = h.frames()
        self.assertEqual(sent["method"], "session/request_permission")
        self.assertEqual(sent["params"]["toolCall"], CALL)
        kinds = [o["kind"] for o in sent["params"]["options"]]
        self.assertEqual(kinds, ["allow_once", "allow_always", "reject_once", "reject_always"])

    def test_selectedOptionIsTheOutcome(self) -> None:
        """Each offered option id maps to its kind."""
        for option in permissionOptions("edit"):
            h, b = broker()
            d = b.requestPermission("s1", CALL, "edit")
            answer(h, 0, {"outcome": "selected", "optionId": option["optionId"]})
            self.assertEqual(self.successResultOf(d), option["kind"])

    def test_unofferedOptionAndGarbageDeny(self) -> None:
        """An option id we did not offer, or a malformed answer, is 'failed' (deny)."""
        for result in ({"outcome": "selected", "optionId": "yes-please"}, {"outcome": "maybe"}, "nonsense"):
            h, b = broker()
            d = b.requestPermission("s1", CALL, "edit")
            h.send({"jsonrpc": "2.0", "id": 0, "result": {"outcome": result}})
            self.assertEqual(self.successResultOf(d), "failed")

    def test_clientCancelledOutcome(self) -> None:
        """The client's 'cancelled' outcome is reported as such."""
        h, b = broker()
        d = b.requestPermission("s1", CALL, "edit")
        answer(h, 0, {"outcome": "cancelled"})
        self.assertEqual(self.successResultOf(d), "cancelled")

    def test_clientErrorDenies(self) -> None:
        """A JSON-RPC error from the client is 'failed' (deny)."""
        h, b = broker()
        d = b.requestPermission("s1", CALL, "edit")
        h.send({"jsonrpc": "2.0", "id": 0, "error": {"code": -32601, "message": "no UI"}})
        self.assertEqual(self.successResultOf(d), "failed")

    def test_timeoutDeniesAndWithdraws(self) -> None:
        """No answer within the timeout: 'timeout', and the client gets $/cancel_request."""
        h, b = broker(timeout=2.0)
        d = b.requestPermission("s1", CALL, "execute")
        h.frames()
        h.clock.advance(1.9)
        self.assertNoResult(d)
        h.clock.advance(0.1)
        self.assertEqual(self.successResultOf(d), "timeout")
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 0}}])
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_cancelWithdraws(self) -> None:
        """Cancelling (the turn was cancelled) answers 'cancelled' and tells the client."""
        h, b = broker()
        d = b.requestPermission("s1", CALL, "execute")
        h.frames()
        d.cancel()
        self.assertEqual(self.successResultOf(d), "cancelled")
        self.assertEqual(h.frames()[0]["method"], "$/cancel_request")
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_serializedPerSession(self) -> None:
        """A second request in the same session waits for the first; other sessions do not."""
        h, b = broker(timeout=10)
        first = b.requestPermission("s1", CALL, "edit")
        second = b.requestPermission("s1", CALL, "edit")
        other = b.requestPermission("s2", CALL, "edit")
        self.assertEqual([f["id"] for f in h.frames()], [0, 1])  # s1's first and s2's
        answer(h, 1, {"outcome": "selected", "optionId": "reject_once"})
        self.assertEqual(self.successResultOf(other), "reject_once")
        h.clock.advance(9)
        answer(h, 0, {"outcome": "selected", "optionId": "allow_once"})
        self.assertEqual(self.successResultOf(first), "allow_once")
        [sent] = h.frames()
        self.assertEqual(sent["id"], 2)
        h.clock.advance(9)  # the second's timeout counts from its own sending
        self.assertNoResult(second)
        answer(h, 2, {"outcome": "selected", "optionId": "reject_always"})
        self.assertEqual(self.successResultOf(second), "reject_always")

    def test_cancelWhileQueued(self) -> None:
        """A request cancelled while waiting its turn is never sent."""
        h, b = broker()
        b.requestPermission("s1", CALL, "edit")
        queued = b.requestPermission("s1", CALL, "edit")
        h.frames()
        queued.cancel()
        self.assertEqual(self.successResultOf(queued), "cancelled")
        answer(h, 0, {"outcome": "selected", "optionId": "allow_once"})
        self.assertEqual(h.frames(), [])


class ChooseTests(SynchronousTestCase):
    """``choose``: a question whose options are answers (``clarify`` without forms)."""

    OPTIONS = [{"optionId": "choice-0", "name": "red", "kind": "allow_once"},
               {"optionId": "decline", "name": "Don't answer", "kind": "reject_once"}]

    def test_theChosenOptionIdIsTheAnswer(self) -> None:
        h, b = broker()
        d = b.choose("s1", CALL, self.OPTIONS)
        [sent] = h.frames()
        self.assertEqual(sent["params"]["options"], self.OPTIONS)
        answer(h, 0, {"outcome": "selected", "optionId": "choice-0"})
        self.assertEqual(self.successResultOf(d), "choice-0")

    def test_anUnofferedIdFails(self) -> None:
        h, b = broker()
        d = b.choose("s1", CALL, self.OPTIONS)
        answer(h, 0, {"outcome": "selected", "optionId": "choice-9"})
        self.assertEqual(self.successResultOf(d), "failed")

    def test_nobodyToAnswerIsSaid(self) -> None:
        """A client with nobody to ask marks its answer so (``_meta``): that, not the option
        it had to pick, is the answer; a permission request ignores the mark."""
        h, b = broker()
        d = b.choose("s1", CALL, self.OPTIONS)
        h.send({"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "decline"},
                                                      "_meta": {"hermes-acp": {"unanswerable": True}}}})
        self.assertEqual(self.successResultOf(d), "unanswerable")
        asked = b.requestPermission("s1", CALL, "edit")
        h.send({"jsonrpc": "2.0", "id": 1, "result": {"outcome": {"outcome": "selected", "optionId": "reject_once"},
                                                      "_meta": {"hermes-acp": {"unanswerable": True}}}})
        self.assertEqual(self.successResultOf(asked), "reject_once")

    def test_itWaitsItsTurnAndTimesOut(self) -> None:
        """Behind another question of the session; then the same timeout."""
        h, b = broker(timeout=5)
        first = b.requestPermission("s1", CALL, "edit")
        second = b.choose("s1", CALL, self.OPTIONS)
        self.assertEqual(len(h.frames()), 1)
        answer(h, 0, {"outcome": "selected", "optionId": "allow_once"})
        self.assertEqual(self.successResultOf(first), "allow_once")
        self.assertNoResult(second)
        h.clock.advance(5)
        self.assertEqual(self.successResultOf(second), "timeout")
