"""HTTP+SSE, the 2024-11-05 transport, under an ``MCPConnection``.

The client GETs the server's URL and keeps that event stream open: its first
``endpoint`` event names where to POST messages (a URL on the same origin; one
on another origin is refused: it would send our headers, and the model's
arguments, to a host the user never named). Every message is then POSTed
there, the server takes it (202), and the answers, with whatever else the
server says, arrive as ``message`` events on the stream.

Everything else is streamable HTTP's (``http.HTTPChannel``): the same bounds
(an event over ``maxBody`` closes the stream, ``maxPosts`` POSTs open at once,
``MAX_WAITING`` messages waiting), the same errors told, and closing ends the
GET and every POST. The stream's end is the connection's: ``onEnded`` tells the
link, which fails the server with that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse

from ..engine import exhausted
from .http import EventStream, HTTPChannel, _isAnswer
from .wire import TransportError

log = Logger()

#: The longest endpoint URL taken from the server.
MAX_ENDPOINT = 4096
_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _PORTS.get(scheme)


def endpointURL(streamURL: str, given: str) -> str:
    """Where to post, from the ``endpoint`` event's data (relative to the stream's URL);
    ``TransportError`` when it is not on the stream's origin or not a URL at all."""
    given = given.strip()
    if not given or len(given) > MAX_ENDPOINT or any(c in given for c in "\r\n\0 "):
        raise TransportError("its endpoint event does not hold a URL")
    try:
        url = urljoin(streamURL, given)
        same = _origin(url) == _origin(streamURL)
    except ValueError:
        raise TransportError("its endpoint event does not hold a URL") from None
    if not same:
        scheme, host, port = _origin(url)
        raise TransportError(f"its endpoint event names another origin ({scheme}://{host}:{port}); the agent posts "
                             "only to the server's own origin")
    return url


class SSEChannel(HTTPChannel):
    """The transport of one HTTP+SSE server's ``MCPConnection``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streamURL = self.url
        self.endpoint: str | None = None
        #: Told once, with the reason, when the stream ends after it named its endpoint.
        self.onEnded: Callable[[str], None] | None = None
        self._found: Deferred[None] = Deferred()

    async def connect(self) -> None:
        """Open the event stream; fires once it named the endpoint (``TransportError``
        when it is no event stream, ends first, or names another origin)."""
        headers = self._headers({})
        headers.setRawHeaders("accept", ["text/event-stream"])
        headers.removeHeader("content-type")
        d = self._inFlight["GET"] = self._agent.request(b"GET", self.streamURL, headers)
        try:
            response: IResponse = await d
        except CancelledError:
            raise
        except Exception as e:
            shown = exhausted.orShown(str(e) or type(e).__name__)
            raise TransportError(f"cannot reach {self.shownURL}: {shown}") from None
        finally:
            self._inFlight.pop("GET", None)
        kind = (response.headers.getRawHeaders("content-type") or [""])[0].split(";")[0].strip().lower()
        if response.code >= 400 and response.code not in (404, 405, 406):
            raise self._httpError(response.code, response.phrase, await self._collect(response, 4096), "GET")
        if response.code != 200 or kind != "text/event-stream":
            await self._collect(response, 4096)
            raise TransportError(f"{self.shownURL} is not an HTTP+SSE event stream (HTTP {response.code}, "
                                 f"{kind or 'no content type'}); is it a streamable HTTP server (type http)?")
        stream = self._streams["GET"] = EventStream(self._event, self.maxBody, named=True)
        response.deliverBody(stream)
        stream.ended.addBoth(lambda _: self._streamEnded(stream))
        await self._found

    def _event(self, name: bytes, data: bytes) -> None:
        if name == b"endpoint":
            if self.endpoint is not None:
                log.info("MCP server {name} named its endpoint again; the first is kept", name=self.spec.name)
                return
            try:
                self.endpoint = endpointURL(self.spec.url, data.decode("utf-8", "replace"))
            except TransportError as e:
                if not self._found.called:
                    self._found.errback(e)
                self._abort("GET")
                return
            self.url = self.endpoint.encode("ascii", "ignore")
            if not self._found.called:  # (a start that ran out of time cancelled the wait)
                self._found.callback(None)
        elif name == b"message":
            self._received(data)
        # other events mean nothing to this client

    def _streamEnded(self, stream: EventStream) -> None:
        """Nothing more can come from the server: what waits for an answer fails, and the
        link is told why."""
        self._streams.pop("GET", None)
        if self.closed:
            return
        if stream.tooBig:
            reason = (f"it sent an event over {self.maxBody} bytes (HERMES_ACP_MAX_LINE), so its event stream "
                      "was closed")
        else:
            reason = "its event stream ended (the server closed it, or the connection dropped)"
        if not self._found.called:
            self._found.errback(TransportError(f"{reason} before it named an endpoint"))
        elif self.endpoint is not None:
            self.connection.connectionLost(Failure(TransportError(reason)))
            if self.onEnded is not None:
                self.onEnded(reason)

    async def _answeredAsync(self, response: IResponse, requestId: Any, method: Any, carried: str | None) -> None:
        """A POST is only taken (202): its answer comes on the stream. An error status
        fails the request it carried."""
        body = await self._collect(response, 64 * 1024)
        if response.code < 400:
            return
        if _isAnswer(body, requestId):
            self._received(body)
            return
        raise self._httpError(response.code, response.phrase, body, method)

    def listen(self) -> None:
        """The stream opened by ``connect`` is the only one."""

    def close(self) -> Deferred[None]:
        if not self._found.called:
            self._found.errback(Failure(TransportError("closed")))
            self._found.addErrback(lambda _: None)
        return super().close()
