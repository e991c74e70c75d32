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

A server cannot make us hold its connections: at most ``maxPosts`` POSTs are
open at once (each is a connection), the messages beyond them wait their turn
(``MAX_WAITING`` at most: past that a request fails at once and anything else
is dropped), a POST that carries no request (our answer to the server's
``ping``, a notification) is given up after ``POST_TIMEOUT``, only the first
``MAX_BATCH`` messages of a batch are read, and closing drops every connection.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError, succeed
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from .. import safejson
from ..engine import exhausted
from ..engine.sse import EventDecoder, EventTooBig
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
#: A GET stream that stayed open this long counts as working (its reopenings start over).
LISTEN_STEADY = 30.0
#: The most messages waiting for a free connection (then requests fail, other messages are dropped).
MAX_WAITING = 256
#: A POST that carries no request (an answer, a notification) gets this long to be taken.
POST_TIMEOUT = 30.0
#: The most messages of one JSON-RPC batch from a server that are read (the rest are dropped).
MAX_BATCH = 64
#: The methods whose name or URI goes into ``Mcp-Name`` (modern era).
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def _hangUp(protocol: Protocol) -> Callable[[Deferred[Any]], None]:
    """A canceller for what waits on a response body: it closes the connection."""

    def cancel(d: Deferred[Any]) -> None:
        if protocol.transport is not None:
            protocol.transport.stopProducing()

    return cancel


class _Collect(Protocol):
    """A response body, up to ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.done: Deferred[bytes] = Deferred(_hangUp(self))

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self.transport.stopProducing()
            return
        self.parts.append(data)

    def connectionLost(self, reason: Failure) -> None:
        if self.done.called:
            return  # (given up on: the one who waited has gone)
        if self.size > self.limit:
            self.done.errback(TransportError(f"the answer exceeded {self.limit} bytes"))
        else:  # complete, or cut short: what arrived is parsed as far as it goes
            self.done.callback(b"".join(self.parts))


class EventStream(Protocol):
    """Server-sent events on Twisted: the bytes go through the one decoder
    (``engine.sse.EventDecoder``), each event's data to ``onData`` (``named``: its
    name and data), empty ones (a "priming" event) skipped; ``ended`` fires at the end.
    An event (or a line) bigger than ``limit`` closes the stream: a server cannot grow
    us without bound."""

    def __init__(self, onData: Callable[..., None], limit: int, named: bool = False) -> None:
        self.onData = onData
        self.limit = limit
        self.named = named
        self._decoder = EventDecoder(limit, named)
        self._closed = False
        #: The stream was closed for an event over ``limit``.
        self.tooBig = False
        self.ended: Deferred[None] = Deferred(_hangUp(self))

    def dataReceived(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            events = self._decoder.feed(data)
        except EventTooBig:
            self._tooBig()
            return
        for event in events:
            self._dispatch(event)
            if self._closed:
                return

    def _dispatch(self, event: Any) -> None:
        if event is None:
            return
        if not self.named:
            if event.strip():
                self.onData(event)
        elif event[1].strip():
            self.onData(*event)

    def _tooBig(self) -> None:
        log.warn("an MCP event stream sent an event over {limit} bytes; the stream is closed", limit=self.limit)
        self._closed = self.tooBig = True
        if self.transport is not None:
            self.transport.stopProducing()

    def connectionLost(self, reason: Failure) -> None:
        if not self._closed:
            self._dispatch(self._decoder.end())
        if not self.ended.called:  # (cancelled: its canceller closed the connection)
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


class _QuietPool(HTTPConnectionPool):
    """Its connections are not logged one by one (Twisted's factories log each start and
    stop at info: a server that makes us open many would fill the log)."""

    class _factory(HTTPConnectionPool._factory):  # type: ignore[name-defined,misc]
        noisy = False


def _isAnswer(body: bytes, requestId: Any) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and "error" in message and message.get("id") == requestId


class HTTPChannel(_Unpaced):
    """The transport of one HTTP server's ``MCPConnection`` (writes are posted as they
    come: nothing to pace)."""

    def __init__(self, spec: ServerSpec, reactor: Any, connection: MCPConnection, maxBody: int,
                 maxPosts: int) -> None:
        self.spec = spec
        self.reactor = reactor
        self.connection = connection
        self.maxBody = maxBody
        self.url = spec.url.encode("ascii", "ignore")
        self.shownURL = spec.where
        self._pool = _QuietPool(reactor, persistent=True)
        self._agent = Agent(reactor, connectTimeout=CONNECT_TIMEOUT, pool=self._pool)
        self.sessionId: str | None = None
        #: Set by the link once the handshake agreed on one; ``modern`` for the 2026 era.
        self.protocolVersion: str | None = None
        self.modern = False
        self.maxPosts = maxPosts
        #: Every POST still open (sent, or its answer being read); what waits for one to end.
        self._posts: set[Deferred[Any]] = set()
        self._waiting: deque[tuple[bytes, dict[str, Any]]] = deque()
        self._dropped = 0
        self._pumping = False
        self._inFlight: dict[Any, Deferred[Any]] = {}
        self._streams: dict[Any, Protocol] = {}
        self._listening: Deferred[None] | None = None
        self.closed = False
        #: The OAuth token to send (``Authorization: Bearer``), if the link signed in.
        self.bearer: Callable[[], str | None] | None = None

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
        token = self.bearer() if self.bearer is not None else None
        if token:
            headers.setRawHeaders("authorization", [f"Bearer {token}"])
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
        if message.get("method") == "notifications/cancelled":
            requestId = (message.get("params") or {}).get("requestId")
            if self._unqueue(requestId):
                return  # never sent: nothing to tell
            self._abort(requestId)
            if self.modern:
                return  # closing the stream is the modern cancel
        if len(self._posts) < self.maxPosts:
            self._send(line, message)
        elif len(self._waiting) < MAX_WAITING:
            self._waiting.append((line, message))
        else:
            self._refuse(message)

    def _refuse(self, message: dict[str, Any]) -> None:
        """No connection free and too many messages waiting: a request fails, anything else is dropped."""
        method = message.get("method")
        if isinstance(method, str) and "id" in message:
            self.connection.failOutgoing(message["id"], TransportError(
                f"{self.spec.name} has {len(self._posts)} requests open and {len(self._waiting)} waiting; "
                f"{method} was not sent"))
            return
        self._dropped += 1
        if self._dropped in (1, 100) or self._dropped % 10_000 == 0:
            log.warn("MCP server {name} is not taking our messages ({open} open, {waiting} waiting); "
                     "{n} dropped so far", name=self.spec.name, open=len(self._posts), waiting=len(self._waiting),
                     n=self._dropped)

    def _unqueue(self, requestId: Any) -> bool:
        """Take a request still waiting for a connection out of the queue; whether it was there."""
        for entry in self._waiting:
            if entry[1].get("id") == requestId and isinstance(entry[1].get("method"), str):
                self._waiting.remove(entry)
                return True
        return False

    def _send(self, line: bytes, message: dict[str, Any]) -> None:
        method = message.get("method")
        isRequest = isinstance(method, str) and "id" in message
        requestId = message.get("id") if isRequest else None
        carried = self.sessionId
        try:
            d = self._agent.request(b"POST", self.url, self._headers(message), _Body(line))
        except Exception as e:  # a bad header name or value
            self._failed(requestId, method, Failure(e))
            return
        self._posts.add(d)
        if isRequest:
            self._inFlight[requestId] = d
        d.addCallback(self._answered, requestId, method, carried)
        if not isRequest:  # (a request's time is bounded by its caller, who cancels it)
            d.addTimeout(POST_TIMEOUT, self.reactor)
        d.addErrback(lambda f: self._failed(requestId, method, f))
        d.addBoth(lambda _: self._ended(d, requestId))

    def _ended(self, d: Deferred[Any], requestId: Any) -> None:
        """One POST is over: the next message waiting takes its place."""
        self._posts.discard(d)
        if requestId is not None and self._inFlight.get(requestId) is d:
            del self._inFlight[requestId]
        if self._pumping:
            return  # (a POST that ended at once, inside the loop below: the loop goes on)
        self._pumping = True
        try:
            while self._waiting and len(self._posts) < self.maxPosts and not self.closed:
                self._send(*self._waiting.popleft())
        finally:
            self._pumping = False

    async def _answeredAsync(self, response: IResponse, requestId: Any, method: Any, carried: str | None) -> None:
        status = response.code
        given = response.headers.getRawHeaders("mcp-session-id")
        if given and method == "initialize" and status < 300:
            self.sessionId = given[0]
        if status >= 400 or (requestId is not None and status in (202, 204)):
            body = await self._collect(response, 64 * 1024)
            answer = _isAnswer(body, requestId)
            if carried is not None and method != "initialize" and (status == 404 or (status == 400 and not answer)):
                if carried == self.sessionId:
                    self.sessionId = None  # (a later 404 for an older session leaves a new one alone)
                raise TransportError(f"{self.spec.name} forgot our session (HTTP {status})", sessionLost=True,
                                     status=status)
            if answer:
                self._received(body)  # a JSON-RPC error sent with an HTTP error status: the answer
                return
            error = self._httpError(status, response.phrase, body, method)
            error.challenge = response.headers.getRawHeaders("www-authenticate")
            raise error
        kind = (response.headers.getRawHeaders("content-type") or [""])[0].split(";")[0].strip().lower()
        if kind == "text/event-stream":

            def received(data: bytes) -> None:
                self._received(data)
                if requestId is not None and not self.connection.awaiting(requestId) and stream.transport:
                    stream.transport.stopProducing()  # answered: a stream the server keeps open holds nothing

            stream = EventStream(received, self.maxBody)
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

    def _answered(self, response: IResponse, requestId: Any, method: Any, carried: str | None) -> Deferred[None]:
        return Deferred.fromCoroutine(self._answeredAsync(response, requestId, method, carried))

    async def _collect(self, response: IResponse, limit: int) -> bytes:
        collector = _Collect(limit)
        response.deliverBody(collector)
        return await collector.done

    def _httpError(self, status: int, phrase: bytes, body: bytes, method: Any) -> TransportError:
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
        """One JSON-RPC message (or a batch of them, the first ``MAX_BATCH``) from the
        server; the connection reads each (and refuses what ``safejson`` refuses)."""
        data = data.replace(b"\r", b" ").replace(b"\n", b" ")
        if not data.lstrip().startswith(b"["):
            self.connection.lineReceived(data)
            return
        try:
            batch, _ = safejson.parse(data)
        except (ValueError, safejson.Refused):
            batch = None
        if isinstance(batch, list) and len(batch) > MAX_BATCH:
            log.warn("MCP server {name} sent a batch of {n} messages; only the first {limit} are read",
                     name=self.spec.name, n=len(batch), limit=MAX_BATCH)
            del batch[MAX_BATCH:]
        for item in batch if isinstance(batch, list) else [data]:
            self.connection.lineReceived(item if isinstance(item, bytes) else json.dumps(item).encode())

    def _failed(self, requestId: Any, method: Any, failure: Failure) -> None:
        if failure.check(CancelledError) or self.closed:
            return
        if failure.check(TimeoutError):
            error = TransportError(f"{self.spec.name} did not take it within {POST_TIMEOUT:g} s")
        elif failure.check(TransportError):
            error = failure.value
        else:
            shown = exhausted.orShown(failure.getErrorMessage() or failure.type.__name__)
            error = TransportError(f"cannot reach {self.shownURL}: {shown}")
        if requestId is None:
            log.info("MCP server {name}: {what} was not delivered: {error}", name=self.spec.name,
                     what=method or "our answer", error=str(error))
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
        """Open the optional GET stream (legacy era, once a session exists), on which the
        server sends what no request asked for (``list_changed``, its own requests); a
        server that offers none (405) is left at that. Called again after a new handshake."""
        if not self.closed and not self.modern and self.sessionId is not None and self._listening is None:
            self._listening = Deferred.fromCoroutine(self._listen())
            self._listening.addErrback(lambda f: None if f.check(CancelledError) else log.debug(
                "MCP server {name}: GET stream: {e}", name=self.spec.name, e=f.getErrorMessage()))
            self._listening.addBoth(lambda _: setattr(self, "_listening", None))

    async def _listen(self) -> None:
        attempts = 0
        while not self.closed and self.sessionId is not None and attempts < LISTEN_ATTEMPTS:
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
                return  # 405: the server has no such stream (or our session is gone: a POST will say)
            stream = self._streams["GET"] = EventStream(self._received, self.maxBody)
            opened = self.reactor.seconds()
            response.deliverBody(stream)
            await stream.ended
            self._streams.pop("GET", None)
            attempts = 0 if self.reactor.seconds() - opened > LISTEN_STEADY else attempts + 1
            if not self.closed:  # the server (or a proxy) closed it: open it again, a moment later
                self._inFlight["GET"] = pause = deferLater(self.reactor, LISTEN_AGAIN, lambda: None)
                try:
                    await pause
                finally:
                    self._inFlight.pop("GET", None)

    # -- closing ---------------------------------------------------------------------

    def close(self) -> Deferred[None]:
        """Stop every request; DELETE the session (bounded); close the connection."""
        if self.closed:
            return succeed(None)
        self.closed = True
        self._waiting.clear()
        for requestId in list(self._inFlight) + list(self._streams):
            self._abort(requestId)
        for d in list(self._posts):
            d.cancel()
        return Deferred.fromCoroutine(self._close())

    async def _close(self) -> None:
        try:
            if self.sessionId is not None:
                d = self._agent.request(b"DELETE", self.url, self._headers({}))
                d.addTimeout(2.0, self.reactor)
                try:
                    response = await d
                    await self._collect(response, 4096)
                except Exception as e:
                    log.debug("MCP server {name}: DELETE of the session failed: {e}", name=self.spec.name, e=str(e))
        finally:
            self.connection.connectionLost(Failure(TransportError("closed")))
            await self._pool.closeCachedConnections()
