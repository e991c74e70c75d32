"""The scripted MCP server (``tests/mcp_scripted.py``) over the 2024-11-05 HTTP+SSE transport,
on twisted.web, in-process: for the edges a well-kept server will not show (an endpoint on
another origin, an event over the agent's bound, a stream that ends). Interop with a real
server is ``tests/mcp_fastmcp.py sse``.

``ScriptedSSEMCP(script)`` is a ``Resource``: ``GET /sse`` opens the event stream (one at a
time per client; each gets its own ``ScriptedMCP``) whose first event is
``event: endpoint`` naming ``/messages?session=N`` (or the script's "endpoint", as given);
``POST /messages?session=N`` takes one JSON-RPC message (202, empty) and every message the
core sends goes out on that stream as ``event: message``. An unknown session → 404.
``hugeLine`` tools write their bytes as one ``data:`` line. ``streams`` lists the open
GET requests; ``disconnectAll()`` finishes them (the server going away); ``posts`` counts
POSTs; ``closedByClient`` counts streams the client hung up.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from .mcp_scripted import ScriptedMCP


class ScriptedSSEMCP(Resource):
    isLeaf = True

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.script = dict(script or {})
        self.sessions: dict[str, tuple[Request, ScriptedMCP]] = {}
        self.streams: list[Request] = []
        self.posts = 0
        self.closedByClient = 0
        self._ids = itertools.count(1)

    def render_GET(self, request: Request) -> Any:
        if request.path != b"/sse":
            request.setResponseCode(404)
            return b""
        session = str(next(self._ids))
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")

        def send(message: dict[str, Any], related: Any = None) -> None:
            self._event(request, b"message", json.dumps(message).encode())

        def raw(data: bytes, related: Any = None) -> None:
            self._event(request, b"message", data)

        core = ScriptedMCP(self.script, send, later=lambda seconds, f: reactor.callLater(seconds, f).cancel,
                           rawWrite=raw)
        self.sessions[session] = (request, core)
        self.streams.append(request)

        def gone(_: Any) -> None:
            self.sessions.pop(session, None)
            if request in self.streams:
                self.streams.remove(request)
                self.closedByClient += 1

        request.notifyFinish().addBoth(gone)
        endpoint = self.script.get("endpoint", f"/messages?session={session}")
        self._event(request, b"endpoint", endpoint.encode())
        return NOT_DONE_YET

    def render_POST(self, request: Request) -> bytes:
        self.posts += 1
        session = (request.args.get(b"session") or [b""])[0].decode()
        if request.path != b"/messages" or session not in self.sessions:
            request.setResponseCode(404)
            return b"no such session"
        request.setResponseCode(202)
        body = request.content.read()
        core = self.sessions[session][1]
        reactor.callLater(0, core.receiveLine, body)
        return b"Accepted"

    def _event(self, request: Request, name: bytes, data: bytes) -> None:
        if request in self.streams:
            request.write(b"event: " + name + b"\ndata: " + data + b"\n\n")

    def disconnectAll(self) -> None:
        for request in list(self.streams):
            self.streams.remove(request)
            request.finish()


def listen(resource: ScriptedSSEMCP) -> tuple[Any, str]:
    """Serve on 127.0.0.1; the listening port and the event stream's URL."""
    site = Site(resource)
    site.noisy = False
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    return port, f"http://127.0.0.1:{port.getHost().port}/sse"
