"""JSON-RPC 2.0 in both directions over the line framer.

Incoming requests run concurrently as Deferreds (a handler may return a plain
value, a Deferred or a coroutine); ``$/cancel_request`` cancels one. Outgoing
requests get their own id space and return Deferreds that fire with the
client's result, or fail with ``RemoteError``, a timeout, a cancel or the
connection's loss.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail, maybeDeferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from . import safejson
from .logs import debugging
from .framing import LineProtocol
from .oneshot import OneShot

log = Logger()

Handler = Callable[[dict[str, Any]], Any]

#: After stdin closes, how long running requests get to answer before they are cancelled.
DRAIN_GRACE = 1.0
#: After we close, how long our last frames get to reach a peer that is not reading.
CLOSE_GRACE = 0.5
#: While input is paused (the peer is not reading), how often to look for its hang-up.
HANGUP_POLL = 0.5


class JSONRPCError(Exception):
    """An error answered to the peer; subclasses fix the code."""

    code = -32603
    default = "Internal error"

    def __init__(self, message: str | None = None, data: Any = None) -> None:
        super().__init__(message or self.default)
        self.message = message or self.default
        self.data = data

    def toJSON(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(JSONRPCError):
    code, default = -32700, "Parse error"


class InvalidRequest(JSONRPCError):
    code, default = -32600, "Invalid request"


class MethodNotFound(JSONRPCError):
    code, default = -32601, "Method not found"


class InvalidParams(JSONRPCError):
    code, default = -32602, "Invalid params"


class InternalError(JSONRPCError):
    code, default = -32603, "Internal error"


class AuthRequired(JSONRPCError):
    code, default = -32000, "Authentication required"


class ResourceNotFound(JSONRPCError):
    code, default = -32002, "Resource not found"


class RequestCancelled(JSONRPCError):
    code, default = -32800, "Request cancelled"


class RemoteError(Exception):
    """The peer answered one of our requests with an error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.data = code, message, data


@attrs.frozen
class Reply:
    """A handler result plus work to run only once the response is written."""

    result: Any
    afterSent: Callable[[], None]


def _idKey(requestId: Any) -> str:
    return json.dumps(requestId, sort_keys=True)


def _validId(requestId: Any) -> bool:
    """A string, a number or null (non-finite numbers never get this far)."""
    return requestId is None or (
        isinstance(requestId, (str, int, float)) and not isinstance(requestId, bool)
    )


class JSONRPCConnection(LineProtocol):
    """One JSON-RPC peer on the other end of stdio."""

    #: The notification that cancels a request, both ways (ACP's; MCP has its own).
    cancelMethod = "$/cancel_request"

    def __init__(
        self,
        requests: Mapping[str, Handler],
        notifications: Mapping[str, Handler],
        clock: IReactorTime,
        maxLength: int | None = None,
        trace: Callable[[str, bytes, Any], None] | None = None,
    ) -> None:
        super().__init__()
        self._requests = requests
        self._notifications = notifications
        self._clock = clock
        if maxLength is not None:
            self.maxLength = maxLength
        self._incoming: dict[str, Deferred[Any]] = {}
        self._outgoing: dict[int, Deferred[Any]] = {}
        # For the debug log: when each request arrived or left, and its method.
        self._began: dict[str, tuple[str, float]] = {}
        self._lineSize = 0
        self._nextId = 0
        self._draining = False
        self._closed = False
        self._done: OneShot[None] = OneShot()
        self._writable: OneShot[None] = OneShot()
        self._writable.fire(None)
        #: The start of a notification's line, by method (``notifyEncoded``).
        self._heads: dict[str, bytes] = {}
        self.paused = False
        self.onInputEnded: Callable[[], object] | None = None
        #: Whether our input has hung up; set by whoever owns the file descriptor
        #: (``StdioService``), so EOF is noticed while reading is paused.
        self.inputHungUp: Callable[[], bool] = lambda: False
        self._hangupProbe: Any = None
        self._inputHungUp = False
        self._abandonCall: Any = None
        #: Called with ("in" | "out", line, message) for every frame read or written
        #: (``--trace``); message is the decoded frame, or None for a line that is not JSON.
        self.trace = trace

    def connectionMade(self) -> None:
        # Told to pause when the editor reads our stdout slower than we write it.
        self.transport.registerProducer(self, True)

    def pauseProducing(self) -> None:
        """The editor is behind on our output: stop reading its requests too, so a
        client that floods without reading cannot grow us without bound."""
        if self._writable.fired:  # else writers from before a re-pause still wait on it
            self._writable = OneShot()
        self.paused = True
        if self._closed or self._inputHungUp:
            return  # what is left of a closed input is bounded: read it, to reach EOF
        self.pauseInput()
        if self._hangupProbe is None:
            self._hangupProbe = LoopingCall(self._probeHangup)
            self._hangupProbe.clock = self._clock
            self._hangupProbe.start(HANGUP_POLL, now=False)

    def resumeProducing(self) -> None:
        self.paused = False
        self._stopProbe()
        if not self._closed:
            self.resumeInput()  # the lines held back may fill the buffer, and pause us again
        if not self.paused:
            self._releaseWriters()

    def stopProducing(self) -> None:
        self.paused = False
        self._stopProbe()
        self._releaseWriters()

    def _releaseWriters(self) -> None:
        self._writable.fire(None)

    def _probeHangup(self) -> None:
        """Paused, but stdin was closed: read what is left, so EOF ends us."""
        if self.inputHungUp():
            self._inputHungUp = True
            self._stopProbe()
            self.resumeInput()

    def _stopProbe(self) -> None:
        if self._hangupProbe is not None:
            probe, self._hangupProbe = self._hangupProbe, None
            if probe.running:
                probe.stop()

    def whenWritable(self) -> Deferred[None]:
        """Fires once the editor has caught up with what we wrote (at once if it has)."""
        if not self.paused or self._closed:
            return succeed(None)
        return self._writable.when()

    # -- receiving ---------------------------------------------------------

    def lineReceived(self, line: bytes) -> None:
        """One line from the peer. Nothing here may raise: an exception out of
        ``dataReceived`` would end the connection, and the agent with it."""
        try:
            self._lineReceived(line)
        except Exception:
            log.failure("handling a line from the peer failed")
            self._sendError(None, InternalError("Internal error: the agent could not handle this message"))

    def _lineReceived(self, line: bytes) -> None:
        self._lineSize = len(line)
        try:
            message, problem = safejson.parse(line)
        except safejson.Refused as e:
            self._trace("in", line, None)
            self._sendError(None, InvalidRequest(f"Invalid request: {e}"))
            return
        except ValueError as e:
            self._trace("in", line, None)
            self._sendError(None, ParseError(f"Parse error: {e}"))
            return
        self._trace("in", line, message)
        if isinstance(message, list):
            self._sendError(None, InvalidRequest("Invalid request: batches are not supported"))
            return
        if not isinstance(message, dict):
            self._sendError(None, InvalidRequest("Invalid request: not a JSON object"))
            return
        if problem is not None:
            self._refused(message, problem)
            return
        hasId = "id" in message
        requestId = message.get("id")
        if "method" in message:
            method = message["method"]
            if message.get("jsonrpc") != "2.0":
                self._sendError(requestId, InvalidRequest('Invalid request: "jsonrpc" must be "2.0"'))
            elif not isinstance(method, str):
                self._sendError(requestId, InvalidRequest('Invalid request: "method" must be a string'))
            elif hasId and not _validId(requestId):
                self._sendError(None, InvalidRequest('Invalid request: "id" must be a string, number or null'))
            elif hasId:
                self._requestReceived(requestId, method, message.get("params"))
            else:
                self._notificationReceived(method, message.get("params"))
        elif hasId and ("result" in message) != ("error" in message):
            self._responseReceived(requestId, message)
        else:
            self._sendError(requestId if _validId(requestId) else None,
                            InvalidRequest("Invalid request: neither a request nor a response"))

    def _refused(self, message: dict[str, Any], problem: safejson.Refused) -> None:
        """A message holding a value the rule refuses (see ``hermes_acp.safejson``):
        the error goes to the request's id when that id itself is fine."""
        requestId = message.get("id")
        idUsable = not problem.path.startswith(("id.", "id[")) and problem.path != "id" and _validId(requestId)
        if "method" in message:
            if "id" not in message:
                log.warn("ignoring a notification: {problem}", problem=str(problem))
            elif not idUsable:
                self._sendError(None, InvalidRequest(f"Invalid request: {problem}"))
            elif problem.path.startswith("params"):
                self._sendError(requestId, InvalidParams(f"Invalid params: {problem}", {"field": problem.path}))
            else:
                self._sendError(requestId, InvalidRequest(f"Invalid request: {problem}"))
        elif idUsable and ("result" in message or "error" in message):
            self._responseReceived(
                requestId, {"error": {"code": InvalidRequest.code, "message": f"the answer was refused: {problem}"}}
            )
        else:
            self._sendError(None, InvalidRequest(f"Invalid request: {problem}"))

    def _requestReceived(self, requestId: Any, method: str, params: Any) -> None:
        key = _idKey(requestId)
        if key in self._incoming:
            # Answered with id null: the id belongs to the request still running.
            self._sendError(None, InvalidRequest(f"Invalid request: id {key} is already in use"))
            return
        if self._draining:
            self._sendError(requestId, RequestCancelled("Request cancelled: input closed"))
            return
        if debugging():  # (one per request: not built unless someone reads it)
            log.debug("request {method} id {id} ({size} bytes)", method=method, id=key, size=self._lineSize)
        self._began[key] = (method, self._clock.seconds())
        handler = self._requests.get(method)
        if handler is None:
            self._sendError(requestId, MethodNotFound(f"Method not found: {method}", {"method": method}))
            return
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self._sendError(requestId, InvalidParams("Invalid params: params must be an object"))
            return
        d = maybeDeferred(handler, params)
        self._incoming[key] = d
        d.addCallbacks(
            lambda result: self._sendResult(requestId, result),
            lambda failure: self._sendFailure(requestId, method, failure),
        )
        d.addBoth(lambda _: self._requestFinished(key))

    def _notificationReceived(self, method: str, params: Any) -> None:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            log.warn("ignoring notification {method} with non-object params", method=method)
            return
        if method == self.cancelMethod:
            self.cancelIncoming(params.get("requestId"))
            return
        handler = self._notifications.get(method)
        if debugging():
            log.debug("notification {method} ({size} bytes)", method=method, size=self._lineSize)
        if handler is None:
            log.debug("ignoring unknown notification {method}", method=method)
            return
        d = maybeDeferred(handler, params)
        d.addErrback(
            lambda f: log.failure("notification {method} failed", f, method=method)
        )

    def _responseReceived(self, requestId: Any, message: dict[str, Any]) -> None:
        d = self._outgoing.pop(requestId, None) if isinstance(requestId, int) else None
        if d is None:
            log.debug("dropping response to unknown or cancelled request {id!r}", id=requestId)
            return
        error = message.get("error")
        self._logAnswer(f"our {requestId}", "error" if error is not None else "ok", self._lineSize)
        if error is None:
            d.callback(message.get("result"))
            return
        if not isinstance(error, dict):
            error = {"code": InternalError.code, "message": repr(error)}
        d.errback(
            RemoteError(
                error.get("code") if isinstance(error.get("code"), int) else InternalError.code,
                str(error.get("message", "")),
                error.get("data"),
            )
        )

    def cancelIncoming(self, requestId: Any) -> None:
        """Cancel the handler running for one of the peer's requests."""
        d = self._incoming.get(_idKey(requestId))
        if d is not None:
            d.cancel()

    # -- sending -----------------------------------------------------------

    def _trace(self, direction: str, line: bytes, message: Any) -> None:
        if self.trace is None:
            return
        try:
            self.trace(direction, line, message)
        except Exception:
            log.failure("tracing a frame failed; tracing stops")
            self.trace = None

    def _write(self, message: Mapping[str, Any]) -> bool:
        """Encode and send one message; False (logged) when it has no JSON form."""
        try:
            line = safejson.encode(message)
        except (TypeError, ValueError, RecursionError):
            log.failure("dropping a {kind} that is not JSON", kind=message.get("method", "response"))
            return False
        if self._closed or self.transport is None:
            log.debug("connection closed; dropping {method}", method=message.get("method"))
            return True
        self._trace("out", line, message)
        self.sendLine(line)
        if "method" in message:
            if debugging():  # a line per frame: not even built unless someone reads it
                log.debug("sent {kind} {method} ({size} bytes)", kind="request" if "id" in message else "notification",
                          method=message["method"], size=len(line))
        else:
            outcome = f"error {message['error'].get('code')}" if "error" in message else "ok"
            self._logAnswer(_idKey(message.get("id")), outcome, len(line))
        return True

    def _logAnswer(self, key: str, outcome: str, size: int) -> None:
        """At debug level: a request and its answer, with the time between them."""
        method, began = self._began.pop(key, ("?", None))
        if not debugging():
            return
        took = "" if began is None else f", {1000 * (self._clock.seconds() - began):.1f} ms"
        request = f"our {method} id {key[4:]}" if key.startswith("our ") else f"{method} id {key}"
        log.debug("answer to {request}: {outcome} ({size} bytes{took})",
                  request=request, outcome=outcome, size=size, took=took)

    def _sendResult(self, requestId: Any, result: Any) -> None:
        afterSent = None
        if isinstance(result, Reply):
            result, afterSent = result.result, result.afterSent
        with self.together():  # (with what follows the answer)
            if not self._write({"jsonrpc": "2.0", "id": requestId, "result": result}):
                self._sendError(requestId, InternalError("Internal error: result is not JSON"))
            elif afterSent is not None:
                afterSent()

    def _sendError(self, requestId: Any, error: JSONRPCError) -> None:
        self._write({"jsonrpc": "2.0", "id": requestId, "error": error.toJSON()})

    def _sendFailure(self, requestId: Any, method: str, failure: Failure) -> None:
        if failure.check(JSONRPCError):
            self._sendError(requestId, failure.value)
        elif failure.check(CancelledError):
            self._sendError(requestId, RequestCancelled())
        else:
            log.failure("request {method} (id {id!r}) failed", failure, method=method, id=requestId)
            # An OSError's own words name what ran out ("Too many open files"), never a path.
            error = failure.value
            said = f": {error.strerror}" if isinstance(error, OSError) and error.strerror else ""
            self._sendError(requestId, InternalError(f"Internal error: {failure.type.__name__} while handling {method}{said}"))

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        """Send a notification."""
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def notifyEncoded(self, method: str, params: bytes, value: Callable[[], Mapping[str, Any]]) -> None:
        """Send a notification whose ``params`` are already encoded (``safejson.encode``):
        the same line ``notify`` would write, without encoding them again. ``value()``
        gives them decoded, for a trace."""
        if self._closed or self.transport is None:
            log.debug("connection closed; dropping {method}", method=method)
            return
        head = self._heads.get(method)
        if head is None:
            head = self._heads[method] = b'{"jsonrpc":"2.0","method":' + safejson.encode(method) + b',"params":'
        line = head + params + b"}"
        if self.trace is not None:
            self._trace("out", line, {"jsonrpc": "2.0", "method": method, "params": value()})
        self.sendLine(line)
        if debugging():
            log.debug("sent notification {method} ({size} bytes)", method=method, size=len(line))

    def writeLines(self, data: bytes, count: int) -> None:
        """Write ``count`` whole frames already encoded, each ending in a line break, in
        one write (a ``session/load`` replays stored updates as they are, a batch at a time)."""
        if self._closed or self.transport is None:
            log.debug("connection closed; dropping {count} frames", count=count)
            return
        if self.trace is not None:
            for line in data.split(self.delimiter)[:-1]:
                self._trace("out", line, json.loads(line))
        self.sendFramed(data)
        if debugging():
            log.debug("sent {count} frames ({size} bytes)", count=count, size=len(data))

    def failOutgoing(self, requestId: Any, error: Exception) -> None:
        """Fail our request ``requestId`` from below: the transport knows no answer
        will come (an HTTP error, say). Nothing happens if it was answered."""
        d = self._outgoing.pop(requestId, None) if isinstance(requestId, int) else None
        if d is not None:
            self._began.pop(f"our {requestId}", None)
            d.errback(error)

    def cancelParams(self, requestId: int) -> dict[str, Any]:
        """What the cancel notification for our request ``requestId`` says."""
        return {"requestId": requestId}

    def callRemote(
        self, method: str, params: Mapping[str, Any], timeout: float | None = None, tellCancel: bool = True
    ) -> Deferred[Any]:
        """Send a request; cancelling the Deferred tells the peer (``cancelMethod``)
        unless ``tellCancel`` is false (MCP's ``initialize`` must never be cancelled)."""
        if self._closed or self._draining:
            return fail(ConnectionDone("connection closed"))
        requestId = self._nextId
        self._nextId += 1

        def cancel(d: Deferred[Any]) -> None:
            self._began.pop(f"our {requestId}", None)
            if self._outgoing.pop(requestId, None) is not None and tellCancel:
                self.notify(self.cancelMethod, self.cancelParams(requestId))

        d: Deferred[Any] = Deferred(cancel)
        self._outgoing[requestId] = d
        self._began[f"our {requestId}"] = (method, self._clock.seconds())
        if not self._write({"jsonrpc": "2.0", "id": requestId, "method": method, "params": params}):
            self._outgoing.pop(requestId, None)
            return fail(ValueError(f"{method}: the request is not JSON"))
        if timeout is not None:
            d.addTimeout(timeout, self._clock)
        return d

    # -- over-long lines and shutdown -------------------------------------

    def lineLengthExceeded(self, size: int) -> None:
        self._sendError(
            None,
            InvalidRequest(
                f"Invalid request: message of at least {size} bytes exceeds the "
                f"{self.maxLength}-byte limit (HERMES_ACP_MAX_LINE); it was skipped"
            ),
        )

    def inputEnded(self) -> None:
        """stdin closed: the peer can answer nothing more, so our own requests fail
        (now and later); running requests get DRAIN_GRACE to answer (``onInputEnded``
        cancels long work), then the rest are cancelled and the connection closes."""
        self._draining = True
        self._failOutgoing(Failure(ConnectionDone("input closed")))
        if self.onInputEnded is not None:
            try:
                self.onInputEnded()
            except Exception:
                log.failure("cancelling work at end of input failed")
        if self._incoming:
            self._clock.callLater(DRAIN_GRACE, self._giveUp)
        else:
            self._closeNow()

    def _giveUp(self) -> None:
        for d in list(self._incoming.values()):
            d.cancel()
        self._closeNow()

    def _requestFinished(self, key: str) -> None:
        self._incoming.pop(key, None)
        if self._draining and not self._incoming:
            self._closeNow()

    def _closeNow(self) -> None:
        """Close; a peer that does not take our last frames within CLOSE_GRACE
        does not keep us alive (they are dropped)."""
        if self.transport is not None and not self._closed:
            self.transport.loseConnection()
            if self._abandonCall is None:
                self._abandonCall = self._clock.callLater(CLOSE_GRACE, self._abandon)

    def _abandon(self) -> None:
        if not self._closed:
            log.warn("the peer is not reading; closing without the last frames")
            self.connectionLost(Failure(ConnectionDone("output not drained")))

    def _failOutgoing(self, reason: Failure) -> None:
        outgoing, self._outgoing = self._outgoing, {}
        for d in outgoing.values():
            d.errback(reason)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        if self._closed:
            return
        self._closed = True
        if self._abandonCall is not None and self._abandonCall.active():
            self._abandonCall.cancel()
        self.stopProducing()
        self._failOutgoing(reason)
        for d in list(self._incoming.values()):
            d.cancel()
        self._done.fire(None)

    def whenDone(self) -> Deferred[None]:
        """A fresh Deferred that fires once the connection is gone."""
        return self._done.when()
