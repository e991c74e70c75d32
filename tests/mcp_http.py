"""The scripted MCP server (``tests/mcp_scripted.py``) over MCP streamable HTTP, on twisted.web, in-process.

``ScriptedHTTPMCP(script)`` is a ``Resource`` serving ``/mcp``; ``listen(resource)``
returns ``(port, url)``. It takes the same scripts as the stdio server (the
stdio-only keys are ignored) plus these HTTP keys:

  "responseMode"       "json" (default): one application/json answer per request.
                       "sse": text/event-stream: first an empty priming event
                       (``id: N`` / ``data: ``), then the request's notifications (progress,
                       notify, hugeLine as a non-JSON ``data:``) as they happen, then the answer.
  "sessionLostStatus"  status for an unknown or expired Mcp-Session-Id (404 default; 400 as
                       some servers do).
  "requireHeaders"     {name: value}: 401 (with WWW-Authenticate) unless all are present.
  "requireProtocolVersionHeader"  default true: legacy requests after ``initialize`` need
                       ``MCP-Protocol-Version`` equal to the negotiated version (else 400).
  "modernErrorStatus"  default true: in the modern era, JSON-mode JSON-RPC errors get the HTTP
                       status the 2026-07-28 spec and the mcp SDK use (-32700/-32600/-32602/
                       -32020/-32021/-32022 → 400, -32601 → 404); false: 200.
  "getStream"          true (legacy era): offer the optional standalone GET stream (below).
  "toolsListBatch"     N (legacy era): ``tools/list`` is answered with a JSON-RPC batch (application/json):
                       its result first, then N ``ping`` requests.
  "sseKeepOpen"        true (with "sse"): a request's event stream stays open after its answer (kept in
                       ``held``, as the spec says a server SHOULD close it, and some do not).
  "holdResponses"      true: a POST carrying the client's answer (a response) is held open forever,
                       unanswered (kept in ``held``; ``heldOpen`` counts those still connected).

Rules: POST only, with ``Accept`` naming both application/json and text/event-stream
(else 406) and ``Content-Type: application/json`` (else 415); batches → 400.
Notifications and client responses → 202, empty. DELETE with the session → 200 and
the session is forgotten. GET → 405 (no standalone stream: messages not tied to a
request, like list_changed, a server ping or roots/list, are kept in ``undelivered``),
unless "getStream" is set (legacy era only; other eras stay 405):

GET stream: ``GET /mcp`` needs ``Accept`` naming text/event-stream (else 406), then the
session checks of a POST (no ``Mcp-Session-Id`` → 400, unknown → ``sessionLostStatus``,
``MCP-Protocol-Version`` as "requireProtocolVersionHeader" says → 400); a session that
already has one open → 409 (as the mcp SDKs answer). Otherwise a long-lived 200
``text/event-stream`` response: first an empty priming event (``id: N`` / ``data: ``),
then every message of that session not tied to a POST (list_changed, server pings and
roots/list, ``notifyToolsChanged``) as an ``event: message`` event; only while no GET
stream is open do they go to ``undelivered``. (Answers and a request's notifications
never go there; ``Last-Event-ID`` is recorded but nothing is replayed.) The stream ends
cleanly (the response finishes) on ``disconnectAll()``, on DELETE of its session, or
``_GetStream.end()``; ``expireSessions()`` leaves it open. Events: "getStreamOpened"
(session, number), "getStreamClosed" (the client hung up), "getStreamEnded" (the server
finished it: reason "disconnectAll" / "delete" / "ended"). ``getStreams`` lists every
stream ever opened (``_GetStream``: session, record, sent, open), ``openGetStreams``
counts the open ones, ``whenGetStreams(n)`` fires with the n-th opened.
``notifyToolsChanged(addTools)`` adds tools to every live session's list and sends each
``notifications/tools/list_changed`` (GET stream, else ``undelivered``).

Legacy era: ``initialize`` creates a session (``Mcp-Session-Id`` on its answer, one
``ScriptedMCP`` core per session); later requests without the header → 400, with an
unknown one → ``sessionLostStatus``. ``expireSessions()`` forgets them all.

Modern era: no sessions; every POST needs ``MCP-Protocol-Version: 2026-07-28`` and
``Mcp-Method`` (and ``Mcp-Name`` for tools/call) matching the body, else 400 with a
-32020 error body (``initialize`` is answered -32022 whatever its headers). Closing
the response stream cancels the call (in both eras; logged as "cancelled").

"silent" era: every POST is held open forever (``disconnectAll()`` drops them).
Behaviour "crash" closes the connection after what was written (no answer);
JSON mode drops a request's notifications (kept in ``undelivered``).

Everything is recorded: ``requests`` (``Recorded``: HTTP method, path, lower-cased headers,
body, status), ``counts`` (JSON-RPC methods of the POSTs past the auth/Accept/Content-Type/JSON
checks, session checks not yet applied; GETs are not counted), ``events`` (the cores' log
entries plus "session", "delete", "expired", "streamClosed", "getStreamOpened", "getStreamClosed",
"getStreamEnded"; also appended to script["log"] like the stdio server).
``whenEvent``/``whenCancelled``/``whenRequests``/``whenMethod``/``whenGetStreams`` return Deferreds.
"""

from __future__ import annotations

import copy
import itertools
import json
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from .mcp_scripted import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MODERN_VERSION,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    ScriptedMCP,
    _key,
)

MODERN_ERROR_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
                       -32021: 400, UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404}


@attrs.define
class Recorded:
    """One HTTP request the server received (``status`` is set once it is answered)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int | None = None

    @property
    def rpcMethod(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None


def _rpcError(code: int, message: str, requestId: Any = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": requestId, "error": {"code": code, "message": message}}).encode()


class _GetStream:
    """One open standalone GET stream of a legacy session: messages not tied to a POST go here."""

    def __init__(self, server: ScriptedHTTPMCP, request: Request, record: Recorded, session: _Session,
                 number: int) -> None:
        self.server = server
        self.request = request
        self.record = record
        self.session = session
        self.number = number
        self.sent: list[dict[str, Any]] = []
        self.open = True
        request.notifyFinish().addErrback(self._lost)

    def start(self) -> None:
        self.request.setResponseCode(200)
        self.record.status = 200
        self.request.setHeader("content-type", "text/event-stream")
        self.request.setHeader("cache-control", "no-cache")
        self.request.write(f"id: {self.server.nextEventId()}\ndata: \n\n".encode())

    def deliver(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        data = json.dumps(message).encode()
        self.request.write(b"event: message\nid: " + self.server.nextEventId().encode() + b"\ndata: " + data + b"\n\n")

    def end(self, reason: str = "ended") -> None:
        """Finish the response cleanly (the client sees the stream end)."""
        if not self.open:
            return
        self.open = False
        self.server._forgetGetStream(self)
        self.server._event("getStreamEnded", session=self.session.ident, number=self.number, reason=reason)
        self.request.finish()

    def _lost(self, reason: object) -> None:
        if not self.open:
            return
        self.open = False
        self.server._forgetGetStream(self)
        self.server._event("getStreamClosed", session=self.session.ident, number=self.number)


class _Exchange:
    """One POSTed request and the HTTP response its answer (and, over SSE, its notifications) go to."""

    def __init__(self, server: ScriptedHTTPMCP, request: Request, record: Recorded, requestId: Any,
                 core: ScriptedMCP, sse: bool, modern: bool) -> None:
        self.server = server
        self.request = request
        self.record = record
        self.requestId = requestId
        self.core = core
        self.sse = sse
        self.modern = modern
        self.done = False
        request.notifyFinish().addErrback(self._lost)

    def start(self) -> None:
        if self.sse:
            self.request.setHeader("content-type", "text/event-stream")
            self.request.setHeader("cache-control", "no-cache")
            self.record.status = 200
            self.request.write(f"id: {self.server.nextEventId()}\ndata: \n\n".encode())

    def _event(self, data: bytes) -> None:
        self.request.write(b"event: message\nid: " + self.server.nextEventId().encode() + b"\ndata: " + data + b"\n\n")

    def deliver(self, message: dict[str, Any]) -> None:
        if self.done:
            return
        isAnswer = "method" not in message and _key(message.get("id")) == _key(self.requestId)
        data = json.dumps(message).encode()
        if self.sse:
            self._event(data)
        elif not isAnswer:
            self.server.undelivered.append(message)  # JSON mode carries only the answer
            return
        else:
            status = 200
            error = message.get("error")
            if self.modern and error and self.server.script.get("modernErrorStatus", True):
                status = MODERN_ERROR_STATUS.get(error.get("code"), 200)
            self.request.setResponseCode(status)
            self.record.status = status
            self.request.setHeader("content-type", "application/json")
            self.request.setHeader("content-length", str(len(data)))
            self.request.write(data)
        if isAnswer and self.sse and self.server.script.get("sseKeepOpen"):
            self._end(finish=False)
            self.server.held.append(self.request)
        elif isAnswer:
            self._end()

    def raw(self, data: bytes) -> None:
        if self.done:
            return
        if self.sse:
            self.request.write(b"data: " + data + b"\n\n")
        else:
            self.server.undelivered.append({"raw": len(data)})

    def abort(self, flush: bool = False) -> None:
        """Drop the connection (``flush``: after what was written, as a crashed process's socket does)."""
        if not self.done:
            self._end(finish=False)
            transport = self.request.channel.transport
            if flush:
                transport.loseConnection()
            else:
                transport.abortConnection()

    def _end(self, finish: bool = True) -> None:
        self.done = True
        self.server._forget(self)
        if finish:
            self.request.finish()

    def _lost(self, reason: object) -> None:
        if self.done:
            return
        self.done = True
        self.server._forget(self)
        self.server._event("streamClosed", requestId=self.requestId)
        if self.core.isPending(self.requestId):
            self.core.cancel(self.requestId, "stream closed")


@attrs.define(eq=False)
class _Session:
    ident: str
    core: ScriptedMCP
    protocolVersion: str | None = None


class ScriptedHTTPMCP(Resource):
    """The scripted MCP server as a twisted.web resource (mount it at the root; it answers ``/mcp``)."""

    isLeaf = True

    def __init__(self, script: dict[str, Any] | None = None, clock: IReactorTime | None = None) -> None:
        super().__init__()
        if clock is None:
            from twisted.internet import reactor as clock  # type: ignore[assignment]
        self.clock = clock
        self.script = dict(script or {})
        self.era = self.script.get("era", "legacy")
        self.sse = self.script.get("responseMode", "json") == "sse"
        self.sessionLostStatus = int(self.script.get("sessionLostStatus", 404))
        self.requireHeaders: dict[str, str] = dict(self.script.get("requireHeaders") or {})
        self.sessions: dict[str, _Session] = {}
        self.requests: list[Recorded] = []
        self.counts: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.undelivered: list[Any] = []
        self.held: list[Request] = []
        self._exchanges: dict[tuple[int, str], _Exchange] = {}
        self.getStream = bool(self.script.get("getStream"))
        self.getStreams: list[_GetStream] = []  # every GET stream ever opened, oldest first
        self._openGetStreams: dict[int, _GetStream] = {}  # id(session core) -> its open GET stream
        self._eventIds = itertools.count(1)
        self._waiting: list[tuple[Callable[[], Any], Deferred[Any]]] = []
        self._eventCore = self._core(None)  # logs the HTTP-level events

    # --- observing ---

    @property
    def initializeCount(self) -> int:
        return self.counts["initialize"]

    def rpcBodies(self, method: str | None = None) -> list[Any]:
        """The JSON-RPC bodies POSTed (only those of ``method`` if given), oldest first."""
        return [r.body for r in self.requests if r.method == "POST" and (method is None or r.rpcMethod == method)]

    def whenEvent(self, kind: str, count: int = 1) -> Deferred[dict[str, Any]]:
        """Fires with the ``count``-th event of that kind (at once if it happened)."""

        def reached() -> dict[str, Any] | None:
            matching = [e for e in self.events if e["event"] == kind]
            return matching[count - 1] if len(matching) >= count else None

        return self._when(reached)

    def whenCancelled(self, count: int = 1) -> Deferred[dict[str, Any]]:
        """Fires with the ``count``-th cancel (a ``notifications/cancelled`` or a closed stream)."""
        return self.whenEvent("cancelled", count)

    def whenRequests(self, count: int) -> Deferred[Recorded]:
        """Fires with the ``count``-th HTTP request once it has arrived."""
        return self._when(lambda: self.requests[count - 1] if len(self.requests) >= count else None)

    def whenMethod(self, method: str, count: int = 1) -> Deferred[Any]:
        """Fires with the body of the ``count``-th JSON-RPC message of ``method``."""

        def reached() -> Any:
            bodies = self.rpcBodies(method)
            return bodies[count - 1] if len(bodies) >= count else None

        return self._when(reached)

    @property
    def heldOpen(self) -> int:
        """How many held POSTs are still connected (the client has not hung up)."""
        return sum(1 for request in self.held if not request.finished and not request._disconnected)

    @property
    def openGetStreams(self) -> int:
        """How many GET streams are open now."""
        return len(self._openGetStreams)

    def whenGetStreams(self, count: int) -> Deferred[_GetStream]:
        """Fires with the ``count``-th GET stream once that many have been opened in total."""
        return self._when(lambda: self.getStreams[count - 1] if len(self.getStreams) >= count else None)

    def _when(self, reached: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        value = reached()
        if value is not None:
            d.callback(value)
        else:
            self._waiting.append((reached, d))
        return d

    def _wake(self) -> None:
        for entry in list(self._waiting):
            value = entry[0]()
            if value is not None:
                self._waiting.remove(entry)
                entry[1].callback(value)

    def _event(self, kind: str, **fields: Any) -> None:
        self._eventCore.event(kind, **fields)  # one path for the log file and ``events``

    def _onEvent(self, entry: dict[str, Any]) -> None:
        self.events.append(entry)
        path = self.script.get("log")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, default=repr) + "\n")
        self._wake()

    # --- controlling ---

    def expireSessions(self) -> None:
        """Forget every session: later requests with their ids get ``sessionLostStatus``."""
        self._event("expired", sessions=list(self.sessions))
        self.sessions.clear()

    def disconnectAll(self) -> None:
        """Drop every response still open (held silent requests, pending calls); GET streams end cleanly."""
        for stream in list(self._openGetStreams.values()):
            stream.end("disconnectAll")
        for exchange in list(self._exchanges.values()):
            exchange.abort()
        for request in self.held:
            if not request.finished and request.channel is not None:
                request.channel.transport.abortConnection()
        self.held.clear()

    def notifyToolsChanged(self, addTools: list[dict[str, Any]] | None = None) -> int:
        """For every live session: add ``addTools`` to its tool list and send it
        ``notifications/tools/list_changed`` (on its GET stream if open, else to ``undelivered``).
        Returns how many sessions were notified."""
        sessions = list(self.sessions.values())
        for session in sessions:
            core = session.core
            with core._lock:
                core.tools.extend(copy.deepcopy(addTools or []))
                core.event("listChanged", tools=[t.get("name") for t in core.tools], session=session.ident)
                core._notify("notifications/tools/list_changed", None)
        return len(sessions)

    def nextEventId(self) -> str:
        return str(next(self._eventIds))

    # --- the cores ---

    def _core(self, session: _Session | None) -> ScriptedMCP:
        def later(seconds: float, function: Callable[[], None]) -> Callable[[], None]:
            call = self.clock.callLater(seconds, function)
            return lambda: call.cancel() if call.active() else None

        def exchangeFor(related: Any) -> _Exchange | None:
            return None if related is None else self._exchanges.get((id(core), _key(related)))

        def send(message: dict[str, Any], related: Any) -> None:
            exchange = exchangeFor(related)
            if exchange is not None:
                exchange.deliver(message)
                return
            stream = self._openGetStreams.get(id(core)) if related is None else None
            if stream is not None:  # not tied to a request: the session's GET stream carries it
                stream.deliver(message)
            else:
                self.undelivered.append(message)

        def rawWrite(data: bytes, related: Any) -> None:
            exchange = exchangeFor(related)
            if exchange is not None:
                exchange.raw(data)

        def crash(related: Any) -> None:
            exchange = exchangeFor(related)
            if exchange is not None:
                exchange.abort(flush=True)

        core = ScriptedMCP(self.script, send, later=later, rawWrite=rawWrite, crash=crash, onEvent=self._onEvent)
        return core

    def _forget(self, exchange: _Exchange) -> None:
        self._exchanges.pop((id(exchange.core), _key(exchange.requestId)), None)

    def _forgetGetStream(self, stream: _GetStream) -> None:
        if self._openGetStreams.get(id(stream.session.core)) is stream:
            del self._openGetStreams[id(stream.session.core)]

    # --- HTTP ---

    def _record(self, request: Request, body: Any) -> Recorded:
        headers = {k.decode().lower(): v[-1].decode() for k, v in request.requestHeaders.getAllRawHeaders()}
        record = Recorded(request.method.decode(), request.path.decode(), headers, body)
        self.requests.append(record)
        self._wake()
        return record

    def _refuse(self, request: Request, record: Recorded, status: int, message: str, code: int = -32000,
                requestId: Any = None) -> bytes:
        request.setResponseCode(status)
        record.status = status
        request.setHeader("content-type", "application/json")
        return _rpcError(code, message, requestId)

    def _empty(self, request: Request, record: Recorded, status: int) -> bytes:
        request.setResponseCode(status)
        record.status = status
        return b""

    def _gate(self, request: Request, record: Recorded) -> bytes | None:
        """Path and authorization checks shared by every HTTP method."""
        if request.path.rstrip(b"/") != b"/mcp":
            return self._refuse(request, record, 404, "Not Found")
        for name, value in self.requireHeaders.items():
            if request.getHeader(name) != value:
                request.setHeader("www-authenticate", 'Bearer realm="scripted-mcp"')
                return self._refuse(request, record, 401, "Unauthorized")
        return None

    def _sessionOf(self, request: Request, record: Recorded) -> tuple[_Session | None, bytes | None]:
        ident = request.getHeader("mcp-session-id")
        if ident is None:
            return None, self._refuse(request, record, 400, "Bad Request: Mcp-Session-Id header is required")
        session = self.sessions.get(ident)
        if session is None:
            return None, self._refuse(request, record, self.sessionLostStatus, "Session not found", -32001)
        return session, None

    def _protocolVersionProblem(self, request: Request, record: Recorded, session: _Session,
                                requestId: Any = None) -> bytes | None:
        if self.script.get("requireProtocolVersionHeader", True):
            version = request.getHeader("mcp-protocol-version")
            if version != session.protocolVersion:
                return self._refuse(request, record, 400, f"Bad Request: MCP-Protocol-Version must be "
                                    f"{session.protocolVersion} (got {version})", -32000, requestId)
        return None

    def render_GET(self, request: Request) -> bytes | int:
        record = self._record(request, None)
        refused = self._gate(request, record)
        if refused is not None:
            return refused
        if not self.getStream or self.era != "legacy":
            request.setHeader("allow", "POST, DELETE")
            return self._refuse(request, record, 405, "Method Not Allowed: no standalone SSE stream")
        if "text/event-stream" not in (request.getHeader("accept") or "").lower():
            return self._refuse(request, record, 406, "Not Acceptable: Client must accept text/event-stream")
        session, refused = self._sessionOf(request, record)
        if refused is not None:
            return refused
        assert session is not None
        refused = self._protocolVersionProblem(request, record, session)
        if refused is not None:
            return refused
        if id(session.core) in self._openGetStreams:
            return self._refuse(request, record, 409, "Conflict: Only one SSE stream is allowed per session")
        stream = _GetStream(self, request, record, session, len(self.getStreams) + 1)
        self._openGetStreams[id(session.core)] = stream
        self.getStreams.append(stream)
        stream.start()
        self._event("getStreamOpened", session=session.ident, number=stream.number)
        return NOT_DONE_YET

    def render_DELETE(self, request: Request) -> bytes:
        record = self._record(request, None)
        refused = self._gate(request, record)
        if refused is not None:
            return refused
        if self.era != "legacy":
            request.setHeader("allow", "POST")
            return self._refuse(request, record, 405, "Method Not Allowed: no sessions")
        session, refused = self._sessionOf(request, record)
        if refused is not None:
            return refused
        assert session is not None
        del self.sessions[session.ident]
        self.deleted.append(session.ident)
        for exchange in [e for e in self._exchanges.values() if e.core is session.core]:
            if session.core.isPending(exchange.requestId):
                session.core.cancel(exchange.requestId, "session deleted")
            exchange.abort()
        stream = self._openGetStreams.get(id(session.core))
        if stream is not None:
            stream.end("delete")
        self._event("delete", session=session.ident)
        return self._empty(request, record, 200)

    def render_POST(self, request: Request) -> bytes | int:
        raw = request.content.read()
        try:
            body: Any = json.loads(raw)
            parsed = True
        except ValueError:
            body, parsed = raw.decode("utf-8", "replace"), False
        record = self._record(request, body)
        refused = self._gate(request, record)
        if refused is not None:
            return refused
        accept = (request.getHeader("accept") or "").lower()
        if "application/json" not in accept or "text/event-stream" not in accept:
            return self._refuse(request, record, 406, "Not Acceptable: Client must accept both application/json "
                                "and text/event-stream")
        if not (request.getHeader("content-type") or "").lower().startswith("application/json"):
            return self._refuse(request, record, 415, "Unsupported Media Type: Content-Type must be application/json")
        if not parsed:
            return self._refuse(request, record, 400, "Parse error", PARSE_ERROR)
        if isinstance(body, list):
            return self._refuse(request, record, 400, "batches are not supported", INVALID_REQUEST)
        if not isinstance(body, dict):
            return self._refuse(request, record, 400, "Invalid Request", INVALID_REQUEST)
        if isinstance(body.get("method"), str):
            self.counts[body["method"]] += 1  # past the transport checks (auth, Accept, Content-Type, JSON)
        if self.era == "silent":
            self._eventCore.event("recv", message=body)
            self.held.append(request)
            return NOT_DONE_YET
        if self.script.get("holdResponses") and "method" not in body and ("result" in body or "error" in body):
            self.counts["(response)"] += 1
            self.held.append(request)
            return NOT_DONE_YET
        isRequest = isinstance(body.get("method"), str) and "id" in body
        if self.era == "modern":
            return self._modern(request, record, body, isRequest)
        return self._legacy(request, record, body, isRequest)

    def _modern(self, request: Request, record: Recorded, body: dict[str, Any], isRequest: bool) -> bytes | int:
        core = self._core(None)  # stateless: a fresh core per POST, so clients' request ids never collide
        method = body.get("method")
        if method != "initialize" and isRequest:
            problem = None
            if request.getHeader("mcp-protocol-version") != MODERN_VERSION:
                problem = f"MCP-Protocol-Version header must be {MODERN_VERSION}"
            elif request.getHeader("mcp-method") != method:
                problem = "Mcp-Method header does not match the request body's method"
            elif method == "tools/call" and request.getHeader("mcp-name") != (body.get("params") or {}).get("name"):
                problem = "Mcp-Name header does not match the request body's name"
            if problem is not None:
                core.event("recv", message=body)
                core.event("headerMismatch", problem=problem)
                return self._refuse(request, record, 400, problem, HEADER_MISMATCH, body.get("id"))
        if not isRequest:
            core.receive(body)
            return self._empty(request, record, 202)
        return self._exchange(request, record, body, core, modern=True)

    def _legacy(self, request: Request, record: Recorded, body: dict[str, Any], isRequest: bool) -> bytes | int:
        if isRequest and body["method"] == "initialize":
            ident = secrets.token_hex(16)
            session = _Session(ident, self._core(None))
            self.sessions[ident] = session
            session.protocolVersion = session.core.protocolVersion
            self._event("session", session=ident)
            request.setHeader("mcp-session-id", ident)
            return self._exchange(request, record, body, session.core, modern=False)
        found, refused = self._sessionOf(request, record)
        if refused is not None:
            return refused
        assert found is not None
        refused = self._protocolVersionProblem(request, record, found, body.get("id"))
        if refused is not None:
            return refused
        if not isRequest:
            found.core.receive(body)
            return self._empty(request, record, 202)
        if body["method"] == "tools/list" and self.script.get("toolsListBatch"):
            found.core.event("recv", message=body)
            tools = [{k: v for k, v in t.items() if k != "behaviour"} for t in found.core.tools]
            batch = [{"jsonrpc": "2.0", "id": body["id"], "result": {"tools": tools}}]
            batch += [{"jsonrpc": "2.0", "id": f"flood-{n}", "method": "ping"}
                      for n in range(int(self.script["toolsListBatch"]))]
            request.setHeader("content-type", "application/json")
            record.status = 200
            return json.dumps(batch).encode()
        return self._exchange(request, record, body, found.core, modern=False)

    def _exchange(self, request: Request, record: Recorded, body: dict[str, Any], core: ScriptedMCP,
                  modern: bool) -> int:
        exchange = _Exchange(self, request, record, body["id"], core, self.sse, modern)
        self._exchanges[(id(core), _key(body["id"]))] = exchange
        exchange.start()
        core.receive(body)
        return NOT_DONE_YET


def listen(resource: ScriptedHTTPMCP, reactor: IReactorTCP | None = None, port: int = 0) -> tuple[IListeningPort, str]:
    """Serve ``resource`` on 127.0.0.1; return the listening port and the endpoint URL (ending in /mcp)."""
    if reactor is None:
        from twisted.internet import reactor  # type: ignore[assignment]
    site = Site(resource)
    site.noisy = False
    listening = reactor.listenTCP(port, site, interface="127.0.0.1")
    return listening, f"http://127.0.0.1:{listening.getHost().port}/mcp"


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.mcp_http [SCRIPT.json] [--port N]``: print the URL, serve until killed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", nargs="?")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args(argv)
    script: dict[str, Any] = {}
    if options.script:
        with open(options.script, encoding="utf-8") as f:
            script = json.load(f)
    from twisted.internet import reactor

    _, url = listen(ScriptedHTTPMCP(script), reactor, options.port)
    sys.stdout.write(url + "\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
