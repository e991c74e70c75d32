"""Chat Completions over HTTP with the standard library: where to connect (proxies from the
environment, TLS with the system's certificates or ``SSL_CERT_FILE``'s), one streaming request,
its server-sent events, and kept-alive connections (no Twisted, no SDK).

The ``openai`` SDK did this before; its import alone took most of a second on every path a user
waits on (docs/performance.md, "The model client"). ``http.client`` and ``ssl`` take a few
dozen milliseconds, and reading the stream ourselves costs a ``json.loads`` per event.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from hermes_acp import __version__

USER_AGENT = f"hermes-acp/{__version__}"
#: Idle connections kept per endpoint, and how long draining the end of a stream may take
#: before its connection is dropped instead of kept.
IDLE_CONNECTIONS, DRAIN_SECONDS = 8, 0.5
_NOT_SENT = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected, http.client.BadStatusLine)


class HTTPStatus(Exception):
    """The endpoint answered with an error status; ``body`` is its JSON (or text)."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.headers = status, body, headers


class Unreachable(Exception):
    """The request did not get an answer: refused, reset, timed out (``timedOut``), bad TLS."""

    def __init__(self, reason: str, timedOut: bool = False) -> None:
        super().__init__(reason)
        self.timedOut = timedOut


@attrs.frozen
class Target:
    """Where requests to one base URL go: the origin, the path prefix, and the proxy
    (``proxyHost``, ``proxyPort``, ``proxyAuth``: a Basic credential) if any."""

    https: bool
    host: str
    port: int
    path: str
    proxyHost: str | None = None
    proxyPort: int = 0
    proxyAuth: str | None = None

    @classmethod
    def of(cls, baseURL: str, environ: Mapping[str, str] | None = None) -> Target:
        """The target of ``baseURL``, through the proxy the environment names for it
        (``https_proxy``, ``http_proxy``, ``all_proxy``; ``no_proxy`` exempts hosts)."""
        url = urllib.parse.urlsplit(baseURL)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {baseURL}")
        https = url.scheme == "https"
        port = url.port or (443 if https else 80)
        proxies = urllib.request.getproxies_environment() if environ is None else {
            k[:-6].lower(): v for k, v in environ.items() if k.lower().endswith("_proxy") and v}
        proxy = proxies.get(url.scheme) or proxies.get("all")
        bypass = proxies.get("no", "")
        if not proxy or _bypassed(url.hostname, port, bypass):
            return cls(https, url.hostname, port, url.path.rstrip("/"))
        parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        auth = None
        if parsed.username is not None:
            pair = f"{urllib.parse.unquote(parsed.username)}:{urllib.parse.unquote(parsed.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(https, url.hostname, port, url.path.rstrip("/"), parsed.hostname, parsed.port or 8080, auth)

    @property
    def key(self) -> tuple[Any, ...]:
        return attrs.astuple(self)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (not yet open): direct, tunnelled through the proxy (HTTPS),
        or to the proxy itself (plain HTTP, absolute URLs)."""
        proxyHeaders = {"Proxy-Authorization": self.proxyAuth} if self.proxyAuth else None
        if self.https:
            host, port = (self.proxyHost, self.proxyPort) if self.proxyHost else (self.host, self.port)
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=tlsContext())
            if self.proxyHost:
                connection.set_tunnel(self.host, self.port, headers=proxyHeaders)
            return connection
        if self.proxyHost:
            return http.client.HTTPConnection(self.proxyHost, self.proxyPort, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def requestPath(self, path: str) -> str:
        """What goes on the request line: a path, or the whole URL when talking to a plain proxy."""
        full = self.path + path
        if self.proxyHost and not self.https:
            return f"http://{self.host}:{self.port}{full}"
        return full

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.proxyAuth} if self.proxyAuth and not self.https else {}


def _bypassed(host: str, port: int, noProxy: str) -> bool:
    """Whether ``no_proxy`` (comma-separated names, ``.suffix`` or ``*``) exempts ``host``."""
    host = host.lower()
    for entry in (e.strip().lower() for e in noProxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, onlyPort = entry.partition(":") if entry.count(":") == 1 else (entry, "", "")
        if onlyPort and onlyPort != str(port):
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


_tls: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_tlsLock = threading.Lock()


def tlsContext() -> ssl.SSLContext:
    """The verifying TLS context: the system's certificates, or those of ``SSL_CERT_FILE``
    / ``SSL_CERT_DIR`` (OpenSSL reads them). Built once per value of those (it loads the store)."""
    where = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _tlsLock:
        if where not in _tls:
            _tls[where] = ssl.create_default_context()
        return _tls[where]


class Pool:
    """Idle kept-alive connections, by target; any thread."""

    def __init__(self) -> None:
        self._idle: dict[tuple[Any, ...], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, target: Target) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(target.key)
            return idle.pop() if idle else None

    def give(self, target: Target, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(target.key, [])
            if len(idle) < IDLE_CONNECTIONS:
                idle.append(connection)
                return
        connection.close()


POOL = Pool()


class Aborted(Exception):
    """``Exchange.abort`` was called."""


class Exchange:
    """One request and its streamed response. ``abort``, from any thread, ends it at once:
    it shuts the socket, which wakes a read (or a wait for the answer) that is blocked on a
    stalled server."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.connection: http.client.HTTPConnection | None = None
        self.response: http.client.HTTPResponse | None = None
        self.aborted = False
        #: The stream said ``[DONE]`` (or was one JSON answer): it ended, rather than broke off.
        self.completed = False
        self._done = False

    def abort(self) -> None:
        self.aborted = True
        sock = self.connection.sock if self.connection is not None else None
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def post(self, path: str, body: dict[str, Any], headers: Mapping[str, str], connectTimeout: float,
             readTimeout: float) -> None:
        """Send ``body`` as JSON and wait for a 2xx answer, or raise ``HTTPStatus`` (its error
        body read), ``Unreachable`` or ``Aborted``. A kept-alive connection the server had
        closed meanwhile is replaced once, at no cost to the caller's retries."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        sent = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
                "User-Agent": USER_AGENT, **self.target.headers(), **headers}
        for attempt in (0, 1):
            reused = POOL.take(self.target)
            connection = self.connection = reused or self.target.connect(connectTimeout)
            try:
                if connection.sock is None:
                    connection.connect()
                if self.aborted:
                    raise Aborted()
                connection.sock.settimeout(readTimeout)
                connection.request("POST", self.target.requestPath(path), payload, sent)
                response = connection.getresponse()
            except Aborted:
                connection.close()
                raise
            except _NOT_SENT as e:
                connection.close()
                if self.aborted:
                    raise Aborted() from e
                if reused is not None and attempt == 0:
                    continue  # the server closed it while it was idle
                raise Unreachable(str(e) or type(e).__name__) from e
            except (socket.timeout, TimeoutError) as e:
                connection.close()
                raise Unreachable("timed out", timedOut=True) from e
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                if self.aborted:
                    raise Aborted() from e
                raise Unreachable(_reason(e)) from e
            if response.status >= 300:
                raw = _readError(response)
                connection.close()
                raise HTTPStatus(response.status, raw, {k.lower(): v for k, v in response.getheaders()})
            self.response = response
            return

    def events(self) -> Iterator[Any]:
        """The JSON of each ``data:`` event, until ``[DONE]`` or the end of the body; a
        whole JSON answer (a server that does not stream) is one event."""
        response = self.response
        assert response is not None
        if "json" in (response.getheader("content-type") or ""):
            yield json.loads(response.read())
            self.completed = True
            self._finished()
            return
        data: list[str] = []
        for raw in response:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[6:] if line[5:6] == " " else line[5:])
                continue
            if line or not data:
                continue  # comments (": keep-alive"), event names, ids
            payload, data = "\n".join(data), []
            if payload.strip() == "[DONE]":
                self.completed = True
                self._finished()
                return
            yield json.loads(payload)
        if data:
            if data[0].strip() == "[DONE]":
                self.completed = True
            else:
                yield json.loads("\n".join(data))
        self._finished()

    def _finished(self) -> None:
        """Read what is left of the body, briefly; keep the connection if that worked."""
        self._done = True
        connection, response = self.connection, self.response
        assert connection is not None and response is not None
        try:
            if not response.isclosed():
                if connection.sock is not None:
                    connection.sock.settimeout(DRAIN_SECONDS)
                response.read()
            if not response.will_close and not self.aborted:
                POOL.give(self.target, connection)
                return
        except (OSError, http.client.HTTPException, ValueError):
            pass
        connection.close()

    def close(self) -> None:
        """Done with it: a connection whose answer was not read to its end is closed."""
        if not self._done and self.connection is not None:
            self.abort()
            self.connection.close()


def _readError(response: http.client.HTTPResponse) -> Any:
    try:
        raw = response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()


def _reason(error: BaseException) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({error.verify_message}); set SSL_CERT_FILE to your CA bundle"
    if isinstance(error, socket.gaierror):
        return f"name not found ({error.strerror})"
    return str(error) or type(error).__name__
