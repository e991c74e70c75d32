"""JSON-RPC 2.0 both ways, on a StringTransport with a Clock."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp import safejson
from hermes_acp.jsonrpc import (
    DRAIN_GRACE,
    InvalidParams,
    JSONRPCConnection,
    RemoteError,
    Reply,
)


class Harness:
    def __init__(self, requests: dict[str, Any] | None = None, notifications: dict[str, Any] | None = None, maxLength: int | None = None) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.connection = JSONRPCConnection(requests or {}, notifications or {}, self.clock, maxLength)
        self.connection.makeConnection(self.transport)

    def send(self, message: Any) -> None:
        raw = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.connection.dataReceived(raw + b"\n")

    def frames(self) -> list[dict[str, Any]]:
        data = self.transport.value()
        self.transport.clear()
        return [json.loads(line) for line in data.splitlines()]


def request(requestId: Any, method: str, params: Any = None) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": requestId, "method": method}
    if params is not None:
        message["params"] = params
    return message


class IncomingTests(SynchronousTestCase):
    def test_idsEchoedUnchanged(self) -> None:
        """String, integer, float, negative, huge and null ids come back as sent."""
        h = Harness({"echo": lambda p: p})
        ids = ["abc", 0, 7, -3, 2.5, 2**62, None, "", "1"]
        for requestId in ids:
            h.send(request(requestId, "echo", {"v": 1}))
        frames = h.frames()
        self.assertEqual([f["id"] for f in frames], ids)
        self.assertEqual([type(f["id"]) for f in frames], [type(i) for i in ids])
        self.assertTrue(all(f["result"] == {"v": 1} for f in frames))

    def test_parseError(self) -> None:
        """Bad JSON and invalid UTF-8 get -32700 with a null id, and serving goes on."""
        h = Harness({"ping": lambda p: {}})
        h.send(b"{nope")
        h.send(b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}')
        h.send(request(2, "ping"))
        frames = h.frames()
        self.assertEqual([(f["id"], f.get("error", {}).get("code")) for f in frames], [(None, -32700), (None, -32700), (2, None)])

    def test_invalidRequests(self) -> None:
        """Batches, scalars, wrong version, bad method and bad id types get -32600
        (an id that is not a valid id is answered with null, as JSON-RPC says)."""
        h = Harness({"ping": lambda p: {}})
        h.send([request(1, "ping")])
        h.send(b"42")
        h.send({"id": 3, "method": "ping"})
        h.send({"jsonrpc": "2.0", "id": 4, "method": 5})
        h.send({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"})
        h.send({"jsonrpc": "2.0", "id": 6})
        frames = h.frames()
        self.assertEqual([f["error"]["code"] for f in frames], [-32600] * 6)
        self.assertEqual([f["id"] for f in frames], [None, None, 3, 4, None, 6])

    def test_methodNotFound(self) -> None:
        """Unknown methods, `_` extensions included, get -32601 naming the method."""
        h = Harness()
        h.send(request(1, "nope"))
        h.send(request(2, "_vendor/thing", {"_meta": {"a": 1}}))
        frames = h.frames()
        self.assertEqual([f["error"]["code"] for f in frames], [-32601, -32601])
        self.assertEqual(frames[1]["error"]["data"], {"method": "_vendor/thing"})

    def test_notificationsNeverAnswered(self) -> None:
        """Notifications, known or not, never get a response, not even an error."""
        seen = []
        h = Harness(notifications={"tell": seen.append})
        h.send({"jsonrpc": "2.0", "method": "tell", "params": {"x": 1}})
        h.send({"jsonrpc": "2.0", "method": "_unknown/notice"})
        h.send({"jsonrpc": "2.0", "method": "tell", "params": [1]})
        self.assertEqual(h.frames(), [])
        self.assertEqual(seen, [{"x": 1}])

    def test_paramsMustBeObject(self) -> None:
        """Positional params get -32602; absent or null params are an empty object."""
        h = Harness({"echo": lambda p: p})
        h.send(request(1, "echo", [1, 2]))
        h.send(request(2, "echo"))
        h.send({"jsonrpc": "2.0", "id": 3, "method": "echo", "params": None})
        frames = h.frames()
        self.assertEqual(frames[0]["error"]["code"], -32602)
        self.assertEqual([frames[1]["result"], frames[2]["result"]], [{}, {}])

    def test_handlerErrors(self) -> None:
        """A JSON-RPC error keeps its code and data; any other exception is -32603,
        with the traceback only in the log."""

        def bad(p: dict[str, Any]) -> None:
            raise InvalidParams("Invalid params: cwd must be absolute", {"field": "cwd"})

        def broken(p: dict[str, Any]) -> None:
            raise ZeroDivisionError("secret detail")

        h = Harness({"bad": bad, "broken": broken})
        h.send(request(1, "bad"))
        h.send(request(2, "broken"))
        frames = h.frames()
        self.assertEqual(frames[0]["error"], {"code": -32602, "message": "Invalid params: cwd must be absolute", "data": {"field": "cwd"}})
        self.assertEqual(frames[1]["error"]["code"], -32603)
        self.assertNotIn("secret detail", json.dumps(frames[1]))
        self.assertNotIn("Traceback", json.dumps(frames[1]))
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_anOSErrorSaysWhatRanOut(self) -> None:
        """An OSError's own words reach the editor (running out of descriptors or memory
        must never read as something else), but not the path it was about."""

        def starved(p: dict[str, Any]) -> None:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), "/home/u/secret-project/file")

        h = Harness({"starved": starved})
        h.send(request(1, "starved"))
        message = h.frames()[0]["error"]["message"]
        self.assertEqual(message, "Internal error: OSError while handling starved: Too many open files")
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_coroutineHandlers(self) -> None:
        """A coroutine handler's return value is the result."""
        waiting: Deferred[int] = Deferred()

        async def slow(p: dict[str, Any]) -> dict[str, int]:
            return {"n": await waiting}

        h = Harness({"slow": slow})
        h.send(request(1, "slow"))
        self.assertEqual(h.frames(), [])
        waiting.callback(5)
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "id": 1, "result": {"n": 5}}])

    def test_concurrentRequestsAnswerOutOfOrder(self) -> None:
        """The read loop never waits for a handler: a later request can finish first."""
        first: Deferred[dict[str, Any]] = Deferred()
        h = Harness({"wait": lambda p: first, "now": lambda p: {"now": True}})
        h.send(request(1, "wait"))
        h.send(request(2, "now"))
        first.callback({"waited": True})
        self.assertEqual([f["id"] for f in h.frames()], [2, 1])

    def test_duplicateIdInFlight(self) -> None:
        """A second request reusing an id still in flight is refused."""
        h = Harness({"wait": lambda p: Deferred()})
        h.send(request(1, "wait"))
        h.send(request(1, "wait"))
        self.assertEqual([(f["id"], f["error"]["code"]) for f in h.frames()], [(None, -32600)])

    def test_cancelRequest(self) -> None:
        """$/cancel_request cancels the running handler, which answers -32800."""
        cancelled = []
        h = Harness({"wait": lambda p: Deferred(lambda d: cancelled.append(True))})
        h.send(request("a", "wait"))
        h.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "a"}})
        h.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "unknown"}})
        self.assertEqual(cancelled, [True])
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "id": "a", "error": {"code": -32800, "message": "Request cancelled"}}])

    def test_cancelledCoroutineMayAnswerNormally(self) -> None:
        """A coroutine that catches the cancel can still return a result."""
        inner: Deferred[None] = Deferred()

        async def turn(p: dict[str, Any]) -> dict[str, str]:
            try:
                await inner
            except CancelledError:
                return {"stopReason": "cancelled"}
            return {"stopReason": "end_turn"}

        h = Harness({"turn": turn})
        h.send(request(9, "turn"))
        h.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 9}})
        self.assertEqual(h.frames()[0]["result"], {"stopReason": "cancelled"})

    def test_replyRunsAfterResponseWritten(self) -> None:
        """Work attached to a Reply runs once the response is written, and what it sends
        follows the response in the same write (the peer reads them together)."""
        h = Harness()
        writes = []
        h.transport.write = lambda data, write=h.transport.write: (writes.append(data), write(data))[1]

        def after() -> None:
            h.connection.notify("later", {})

        h.connection._requests = {"new": lambda p: Reply({"sessionId": "s"}, after)}
        h.send(request(1, "new"))
        frames = h.frames()
        self.assertEqual(frames[0]["result"], {"sessionId": "s"})
        self.assertEqual([f.get("method") for f in frames], [None, "later"])
        self.assertEqual(len(writes), 1)

    def test_overlongLine(self) -> None:
        """An over-long line gets -32600 with id null and the next request is served."""
        h = Harness({"ping": lambda p: {}}, maxLength=64)
        h.send(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"x" * 200 + b'"}}')
        h.send(request(2, "ping"))
        frames = h.frames()
        self.assertEqual([(f["id"], f.get("error", {}).get("code")) for f in frames], [(None, -32600), (2, None)])
        self.assertIn("HERMES_ACP_MAX_LINE", frames[0]["error"]["message"])


class OutgoingTests(SynchronousTestCase):
    def test_notifyEncodedWritesTheSameLine(self) -> None:
        """A notification whose params are already encoded is the line ``notify`` writes,
        byte for byte (lone surrogates repaired alike); a trace sees it decoded."""
        params = {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
                                                "content": {"type": "text", "text": "é \ud800 ok"}}}
        h = Harness()
        h.connection.notify("session/update", params)
        plain = h.transport.value()
        h.transport.clear()
        traced: list[Any] = []
        h.connection.trace = lambda direction, line, message: traced.append((direction, line, message))
        h.connection.notifyEncoded("session/update", safejson.encode(params), lambda: params)
        self.assertEqual(h.transport.value(), plain)
        self.assertEqual(traced, [("out", plain.rstrip(b"\n"), {"jsonrpc": "2.0", "method": "session/update",
                                                                "params": params})])

    def test_responseResolves(self) -> None:
        """Our requests use our own id space and fire with the client's result."""
        h = Harness()
        d = h.connection.callRemote("fs/read_text_file", {"path": "/a"})
        d2 = h.connection.callRemote("fs/read_text_file", {"path": "/b"})
        sent = h.frames()
        self.assertEqual([f["id"] for f in sent], [0, 1])
        h.send({"jsonrpc": "2.0", "id": 1, "result": {"content": "b"}})
        h.send({"jsonrpc": "2.0", "id": 0, "result": {"content": "a"}})
        self.assertEqual(self.successResultOf(d), {"content": "a"})
        self.assertEqual(self.successResultOf(d2), {"content": "b"})

    def test_errorFails(self) -> None:
        """An error response fails the Deferred with RemoteError carrying code and data."""
        h = Harness()
        d = h.connection.callRemote("terminal/create", {})
        h.send({"jsonrpc": "2.0", "id": 0, "error": {"code": -32002, "message": "gone", "data": {"x": 1}}})
        error = self.failureResultOf(d, RemoteError).value
        self.assertEqual((error.code, error.message, error.data), (-32002, "gone", {"x": 1}))

    def test_timeoutCancelsAndTellsPeer(self) -> None:
        """A timeout fails the call and sends $/cancel_request; a late answer is dropped."""
        h = Harness()
        d = h.connection.callRemote("session/request_permission", {}, timeout=5)
        h.frames()
        h.clock.advance(4.9)
        self.assertNoResult(d)
        h.clock.advance(0.2)
        self.failureResultOf(d, TimeoutError)
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 0}}])
        h.send({"jsonrpc": "2.0", "id": 0, "result": {}})
        self.assertEqual(h.frames(), [])
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_cancelTellsPeer(self) -> None:
        """Cancelling our own request sends $/cancel_request for it."""
        h = Harness()
        d = h.connection.callRemote("terminal/wait_for_exit", {})
        h.frames()
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(h.frames()[0]["params"], {"requestId": 0})

    def test_connectionLossFailsPending(self) -> None:
        """Losing the connection fails every outstanding request."""
        h = Harness()
        d = h.connection.callRemote("fs/read_text_file", {})
        h.connection.connectionLost(Failure(ConnectionLost()))
        self.failureResultOf(d, ConnectionLost)
        later = h.connection.callRemote("fs/read_text_file", {})
        self.failureResultOf(later, ConnectionDone)


class ShutdownTests(SynchronousTestCase):
    def test_eofFlushesAndCloses(self) -> None:
        """stdin EOF: answers already due are written, our own requests fail, the
        input-ended hook runs, and the connection closes once nothing is running."""
        ended = []
        release: Deferred[dict] = Deferred()
        h = Harness({"ping": lambda p: {}, "wait": lambda p: release})
        h.connection.onInputEnded = lambda: ended.append(True)
        h.send(request(1, "wait"))
        h.connection.dataReceived(b'{"jsonrpc":"2.0","id":2,"method":"ping"}')
        pending = h.connection.callRemote("fs/read_text_file", {})
        h.connection.readConnectionLost()
        self.assertEqual(ended, [True])
        self.failureResultOf(pending, ConnectionDone)
        self.assertFalse(h.transport.disconnecting)
        release.callback({"done": True})
        frames = [f for f in h.frames() if "method" not in f]
        self.assertEqual([(f["id"], f.get("result")) for f in frames], [(2, {}), (1, {"done": True})])
        self.assertTrue(h.transport.disconnecting)

    def test_eofGraceIsBounded(self) -> None:
        """A request still running DRAIN_GRACE after EOF is cancelled (-32800) and
        the connection closes even if the handler never answers."""
        h = Harness({"stuck": lambda p: Deferred(lambda d: None)})
        h.send(request(1, "stuck"))
        h.connection.readConnectionLost()
        self.assertFalse(h.transport.disconnecting)
        h.clock.advance(DRAIN_GRACE)
        self.assertEqual(h.frames()[0]["error"]["code"], -32800)
        self.assertTrue(h.transport.disconnecting)

        async def ignores(p: dict[str, Any]) -> None:
            try:
                await Deferred()
            except CancelledError:
                await Deferred()  # never fires

        h2 = Harness({"x": ignores})
        h2.send(request(1, "x"))
        h2.connection.readConnectionLost()
        h2.clock.advance(DRAIN_GRACE)
        self.assertTrue(h2.transport.disconnecting)

    def test_finalLineAnsweredAtEof(self) -> None:
        """A request read after EOF began (the final unterminated line) still gets an answer."""
        h = Harness({"ping": lambda p: {}})
        h.connection.dataReceived(b'{"jsonrpc":"2.0","id":3,"method":"ping"}')
        h.connection.readConnectionLost()
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "id": 3, "result": {}}])

    def test_noNewRequestsAfterEof(self) -> None:
        """Once stdin closed nobody can answer us, so a new request fails at once
        instead of holding up the drain."""
        h = Harness({"wait": lambda p: Deferred()})
        h.send(request(1, "wait"))
        h.connection.readConnectionLost()
        h.frames()
        self.failureResultOf(h.connection.callRemote("terminal/kill", {}), ConnectionDone)
        self.assertEqual(h.frames(), [])

    def test_whenWritable(self) -> None:
        """whenWritable waits while the transport has paused us."""
        h = Harness()
        self.successResultOf(h.connection.whenWritable())
        h.connection.pauseProducing()
        d = h.connection.whenWritable()
        self.assertNoResult(d)
        h.connection.resumeProducing()
        self.successResultOf(d)

    def test_whenWritableSurvivesARepause(self) -> None:
        """Lines held back while paused are read on resume; if their answers fill the
        buffer again at once, the writers already waiting still wake on the next resume."""
        h = Harness()
        h.connection.pauseProducing()
        d = h.connection.whenWritable()
        held = h.connection.resumeInput
        h.connection.resumeInput = lambda: (held(), h.connection.pauseProducing())  # type: ignore[method-assign]
        h.connection.resumeProducing()
        self.assertNoResult(d)
        h.connection.resumeInput = held  # type: ignore[method-assign]
        h.connection.resumeProducing()
        self.successResultOf(d)

    def test_whenDone(self) -> None:
        """whenDone gives each caller its own Deferred, fired on connection loss."""
        h = Harness()
        a, b = h.connection.whenDone(), h.connection.whenDone()
        self.assertIsNot(a, b)
        h.connection.connectionLost(Failure(ConnectionDone()))
        self.successResultOf(a)
        self.successResultOf(b)
        self.successResultOf(h.connection.whenDone())
