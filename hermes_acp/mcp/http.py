"""Streamable HTTP under an ``MCPConnection``: each line it writes is a POST.

The answer to a POST is JSON, or an event stream (``text/event-stream``) whose
events carry the answer and whatever the server says on the way (progress);
an event with empty data (a "priming" event) is skipped. The session id the
server gives with the ``initialize`` answer goes with every later request,
and so does the protocol version once it is agreed; a 404 (400 from some
servers) for a request that carried a session id means the server forgot the
session: the request fails with ``TransportError(sessionLost=True)`` and the
link shakes hands again. Closing sends DELETE.

Cancelling a request closes its event stream; in the legacy era the cancel
notification is also posted. HTTP errors and unreachable servers fail the
request they carried with a message that says which.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from .specs import ServerSpec
from .wire import MCPConnection, TransportError

log = Logger()

ACCEPT = "application/json, text/event-stream"
CONNECT_TIMEOUT = 10.0
#: The most of an error body quoted to the user.
ERROR_SNIPPET = 300
#: A GET stream the server closes is opened again after this long, this many times at most.
LISTEN_AGAIN = 1.0
LISTEN_ATTEMPTS = 5
#: The methods whose name or URI goes into ``Mcp-Name`` (modern era).
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


class _Collect(Protocol):
    """A response body, up to ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.done: Deferred[bytes] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self.transport.stopProducing()
            return
        self.parts.append(data)

    def connectionLost(self, reason: Failure) -> None:
        if self.size > self.limit:
            self.done.errback(TransportError(f"the answer exceeded {self.limit} bytes"))
        else:  # complete, or cut short: what arrived is parsed as far as it goes
            self.done.callback(b"".join(self.parts))


class EventStream(Protocol):
    """Server-sent events: each event's data goes to ``onData``; ``ended`` fires at the end."""

    def __init__(self, onData: Callable[[bytes], None], limit: int) -> None:
        self.onData = onData
        self.limit = limit
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self.ended: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            self._line(line)
        if len(self._buffer) > self.limit:
            log.warn("an MCP event stream sent a line over {limit} bytes; the stream is closed", limit=self.limit)
            self._buffer.clear()
            self.transport.stopProducing()

    def _line(self, line: bytes) -> None:
        if not line:
            data, self._data = b"\n".join(self._data), []
            if data.strip():
                self.onData(data)
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        # event:, id:, retry: and comments change nothing here

    def connectionLost(self, reason: Failure) -> None:
        if self._data:
            self._line(b"")
        self.ended.callback(None)


class _Unpaced:
    """A producer that has nothing to pace: its pause, resume and stop do nothing."""

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _Body(_Unpaced):
    """What ``IBodyProducer`` asks of a request body of known bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self.data)
        return succeed(None)


def _isAnswer(body: bytes, requestId: Any) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and "error" in message and message.get("id") == requestId


class HTTPChannel(_Unpaced):
    """The transport of one HTTP server's ``MCPConnection`` (writes are posted as they
    come: nothing to pace)."""

    def __init__(self, spec: ServerSpec, reactor: Any, connection: MCPConnection, maxBody: int) -> None:
        self.spec = spec
        self.reactor = reactor
        self.connection = connection
        self.maxBody = maxBody
        self.url = spec.url.encode("ascii", "ignore")
        self.shownURL = spec.where
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._agent = Agent(reactor, connectTimeout=CONNECT_TIMEOUT, pool=self._pool)
        self.sessionId: str | None = None
        #: Set by the link once the handshake agreed on one; ``modern`` for the 2026 era.
        self.protocolVersion: str | None = None
        self.modern = False
        self._inFlight: dict[Any, Deferred[Any]] = {}
        self._streams: dict[Any, Protocol] = {}
        self._listening: Deferred[None] | None = None
        self.closed = False

    # -- what the connection calls -----------------------------------------------

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line.strip():
                self._post(line)

    def writeSequence(self, data: list[bytes]) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        self.close()

    # -- posting -------------------------------------------------------------------

    def _headers(self, message: dict[str, Any]) -> Headers:
        headers = Headers()
        for name, value in self.spec.headers:
            headers.addRawHeader(name, value)
        headers.setRawHeaders("accept", [ACCEPT])
        headers.setRawHeaders("content-type", ["application/json"])
        if self.sessionId is not None:
            headers.setRawHeaders("mcp-session-id", [self.sessionId])
        if self.protocolVersion is not None:
            headers.setRawHeaders("mcp-protocol-version", [self.protocolVersion])
        method = message.get("method")
        if self.modern and isinstance(method, str):
            headers.setRawHeaders("mcp-method", [method])
            named = NAMED_METHODS.get(method)
            value = (message.get("params") or {}).get(named) if named else None
            if isinstance(value, str):
                headers.setRawHeaders("mcp-name", [value])
        return headers

    def _post(self, line: bytes) -> None:
        if self.closed:
            return
        message = json.loads(line)
        method = message.get("method")
        requestId = message.get("id") if isinstance(method, str) else None
        isRequest = isinstance(method, str) and "id" in message
        if method == "notifications/cancelled":
            self._abort((message.get("params") or {}).get("requestId"))
            if self.modern:
                return  # closing the stream is the modern cancel
        try:
            d = self._agent.request(b"POST", self.url, self._headers(message), _Body(line))
        except Exception as e:  # a bad header name or value
            self._failed(requestId if isRequest else None, method, Failure(e))
            return
        if isRequest:
            self._inFlight[requestId] = d
        d.addCallback(self._answered, requestId if isRequest else None, method, message)
        d.addErrback(lambda f: self._failed(requestId if isRequest else None, method, f))
        d.addBoth(lambda _: self._inFlight.pop(requestId, None) if isRequest else None)

    async def _answeredAsync(self, response: IResponse, requestId: Any, method: Any, message: dict[str, Any]) -> None:
        status = response.code
        given = response.headers.getRawHeaders("mcp-session-id")
        if given and method == "initialize" and status < 300:
            self.sessionId = given[0]
        if status >= 400 or (requestId is not None and status in (202, 204)):
            body = await self._collect(response, 64 * 1024)
            error = self._httpError(status, response.phrase, body, method)
            if not error.sessionLost and _isAnswer(body, requestId):
                self._received(body)  # a JSON-RPC error sent with an HTTP error status: the answer
                return
            raise error
        kind = (response.headers.getRawHeaders("content-type") or [""])[0].split(";")[0].strip().lower()
        if kind == "text/event-stream":
            stream = EventStream(self._received, self.maxBody)
            if requestId is not None:
                self._streams[requestId] = stream
            response.deliverBody(stream)
            try:
                await stream.ended
            finally:
                self._streams.pop(requestId, None)
        else:
            body = await self._collect(response, self.maxBody)
            if body.strip():
                self._received(body)
        if requestId is not None:
            self.connection.failOutgoing(
                requestId, TransportError(f"{self.spec.name} ended its answer to {method} without a result"))

    def _answered(self, response: IResponse, requestId: Any, method: Any, message: dict[str, Any]) -> Deferred[None]:
        return Deferred.fromCoroutine(self._answeredAsync(response, requestId, method, message))

    async def _collect(self, response: IResponse, limit: int) -> bytes:
        collector = _Collect(limit)
        response.deliverBody(collector)
        return await collector.done

    def _httpError(self, status: int, phrase: bytes, body: bytes, method: Any) -> TransportError:
        sessionLost = self.sessionId is not None and method != "initialize" and status in (400, 404)
        if sessionLost:
            self.sessionId = None
            return TransportError(f"{self.spec.name} forgot our session (HTTP {status})", sessionLost=True, status=status)
        snippet = body.decode("utf-8", "replace").strip()[:ERROR_SNIPPET]
        hint = ""
        if status in (401, 403):
            hint = ("; the server wants authorization: check the headers given for it in the editor's MCP "
                    "settings or config.yaml")
        elif status in (202, 204):
            return TransportError(f"{self.spec.name} accepted {method} but sent no answer (HTTP {status})", status=status)
        reason = phrase.decode("latin-1", "replace")
        return TransportError(f"HTTP {status} {reason} from {self.shownURL}{hint}" + (f": {snippet}" if snippet else ""),
                              status=status)

    def _received(self, data: bytes) -> None:
        """One JSON-RPC message (or a batch of them) from the server."""
        try:
            decoded = json.loads(data)
        except ValueError:
            decoded = None
        if isinstance(decoded, list):
            for item in decoded:
                self.connection.lineReceived(json.dumps(item).encode())
        else:
            self.connection.lineReceived(data.replace(b"\n", b" "))

    def _failed(self, requestId: Any, method: Any, failure: Failure) -> None:
        if failure.check(CancelledError):
            return
        error = failure.value if failure.check(TransportError) else TransportError(
            f"cannot reach {self.shownURL}: {failure.getErrorMessage() or failure.type.__name__}")
        if requestId is None:
            log.info("MCP server {name}: {method} was not delivered: {error}", name=self.spec.name,
                     method=method, error=str(error))
        else:
            self.connection.failOutgoing(requestId, error)

    def _abort(self, requestId: Any) -> None:
        stream = self._streams.pop(requestId, None)
        if stream is not None and stream.transport is not None:
            stream.transport.stopProducing()
        d = self._inFlight.pop(requestId, None)
        if d is not None:
            d.cancel()

    # -- what the server says unasked -------------------------------------------------

    def listen(self) -> None:
        """Open the optional GET stream (legacy era), on which the server sends what
        no request asked for (``list_changed``, its own requests); a server that
        offers none (405) is left at that."""
        if not self.closed and not self.modern and self._listening is None:
            self._listening = Deferred.fromCoroutine(self._listen())
            self._listening.addErrback(lambda f: log.debug("MCP server {name}: GET stream: {e}",
                                                           name=self.spec.name, e=f.getErrorMessage()))

    async def _listen(self) -> None:
        for _ in range(LISTEN_ATTEMPTS):
            headers = self._headers({})
            headers.setRawHeaders("accept", ["text/event-stream"])
            d = self._agent.request(b"GET", self.url, headers)
            self._inFlight["GET"] = d
            try:
                response = await d
            finally:
                self._inFlight.pop("GET", None)
            kind = (response.headers.getRawHeaders("content-type") or [""])[0].split(";")[0].strip().lower()
            if response.code != 200 or kind != "text/event-stream":
                await self._collect(response, 4096)
                return  # 405: the server has no such stream
            stream = self._streams["GET"] = EventStream(self._received, self.maxBody)
            response.deliverBody(stream)
            await stream.ended
            self._streams.pop("GET", None)
            if self.closed:
                return
            await deferLater(self.reactor, LISTEN_AGAIN, lambda: None)  # the server closed it: open it again

    # -- closing ---------------------------------------------------------------------

    def close(self) -> Deferred[None]:
        """Stop every request; DELETE the session (bounded); close the connection."""
        if self.closed:
            return succeed(None)
        self.closed = True
        for requestId in list(self._inFlight) + list(self._streams):
            self._abort(requestId)
        return Deferred.fromCoroutine(self._close())

    async def _close(self) -> None:
        try:
            if self.sessionId is not None:
                headers = Headers({"mcp-session-id": [self.sessionId]})
                for name, value in self.spec.headers:
                    headers.addRawHeader(name, value)
                d = self._agent.request(b"DELETE", self.url, headers)
                d.addTimeout(2.0, self.reactor)
                try:
                    response = await d
                    await self._collect(response, 4096)
                except Exception as e:
                    log.debug("MCP server {name}: DELETE of the session failed: {e}", name=self.spec.name, e=str(e))
        finally:
            self.connection.connectionLost(Failure(TransportError("closed")))
            await self._pool.closeCachedConnections()
