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
import logging
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from hermes_acp import __version__
from hermes_acp.engine import httpbody, sse
from hermes_acp.engine.secrets import redactURL

log = logging.getLogger(__name__)

USER_AGENT = f"hermes-acp/{__version__}"
#: Idle connections kept per endpoint, how long one may idle before it is dropped rather than
#: reused, and how long (and how many bytes) draining the end of a stream may take before its
#: connection is dropped rather than kept: a finished answer never waits longer for its connection.
#: As many are kept as the default worker pool has threads (``HERMES_ACP_THREADS``), so that many
#: turns at once find their connections again next time rather than each opening (and, to a real
#: endpoint, shaking hands for) a new one; a burst's sockets are already open then, and those left
#: idle are closed once ``IDLE_SECONDS`` old (``Pool._sweep``).
IDLE_CONNECTIONS, IDLE_SECONDS, DRAIN_SECONDS, DRAIN_BYTES = 256, 30.0, 0.2, 64 * 1024
_NOT_SENT = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected, http.client.BadStatusLine)


class HTTPStatus(Exception):
    """The endpoint answered with an error status; ``body`` is its JSON (or text)."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.headers = status, body, headers


class Unreachable(Exception):
    """The request did not get an answer: refused, reset, timed out (``timedOut``), bad TLS
    (``permanent``: retrying will not help)."""

    def __init__(self, reason: str, timedOut: bool = False, permanent: bool = False) -> None:
        super().__init__(reason)
        self.timedOut, self.permanent = timedOut, permanent


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@attrs.frozen
class Target:
    """Where requests to one base URL go: the origin, the path prefix, the credential in
    the URL itself (``originAuth``, Basic), and the proxy (``proxyHost``, ``proxyPort``,
    ``proxyAuth``: a Basic credential) if any. Credentials stay out of ``repr``."""

    https: bool
    host: str
    port: int
    path: str
    proxyHost: str | None = None
    proxyPort: int = 0
    proxyAuth: str | None = attrs.field(default=None, repr=False)
    originAuth: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def of(cls, baseURL: str, environ: Mapping[str, str] | None = None) -> Target:
        """The target of ``baseURL``, through the proxy the environment names for it
        (``https_proxy``, ``http_proxy``, ``all_proxy``; ``no_proxy`` exempts hosts)."""
        url = urllib.parse.urlsplit(baseURL)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {redactURL(baseURL)}")
        https = url.scheme == "https"
        port = url.port or (443 if https else 80)
        origin = _basic(url)
        proxies = urllib.request.getproxies_environment() if environ is None else {
            k[:-6].lower(): v for k, v in environ.items() if k.lower().endswith("_proxy") and v}
        proxy = proxies.get(url.scheme) or proxies.get("all")
        if not proxy or _bypassed(url.hostname, port, proxies.get("no", "")):
            return cls(https, url.hostname, port, url.path.rstrip("/"), originAuth=origin)
        parsed = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"the proxy {redactURL(proxy)} cannot be used: only http:// proxies are "
                             "supported (for HTTPS too, through CONNECT)")
        return cls(https, url.hostname, port, url.path.rstrip("/"), parsed.hostname, parsed.port or 80,
                   _basic(parsed), origin)

    @property
    def key(self) -> tuple[Any, ...]:
        return attrs.astuple(self)

    def url(self, path: str) -> str:
        return f"{'https' if self.https else 'http'}://{_host(self.host)}:{self.port}{self.path}{path}"

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
        return self.url(path) if self.proxyHost and not self.https else self.path + path

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.proxyAuth} if self.proxyAuth and not self.https else {}


def _basic(url: urllib.parse.SplitResult) -> str | None:
    """The Basic credential of the user information in ``url``, if it has some."""
    if url.username is None:
        return None
    pair = f"{urllib.parse.unquote(url.username)}:{urllib.parse.unquote(url.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def _bypassed(host: str, port: int, noProxy: str) -> bool:
    """Whether ``no_proxy`` (comma-separated names, ``.suffix``, ``host:port``, ``[v6]``,
    ``scheme://host`` or ``*``) exempts ``host``."""
    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in noProxy.split(",")):
        entry = entry.split("://", 1)[-1].rstrip("/")
        if not entry:
            continue
        if entry == "*":
            return True
        if entry.startswith("["):
            name, _, rest = entry[1:].partition("]")
            onlyPort = rest.lstrip(":")
        elif entry.count(":") == 1:
            name, _, onlyPort = entry.partition(":")
        else:
            name, onlyPort = entry, ""
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
    / ``SSL_CERT_DIR`` (OpenSSL reads them); where the system has none (a python.org build on
    macOS before "Install Certificates"), certifi's, if it is installed. Built once per value
    of those variables (loading the store takes tens of milliseconds)."""
    where = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _tlsLock:
        if where not in _tls:
            context = ssl.create_default_context()
            if where == (None, None) and not context.cert_store_stats().get("x509_ca"):
                try:
                    import certifi
                except ImportError:
                    pass
                else:
                    context.load_verify_locations(certifi.where())
            _tls[where] = context
        return _tls[where]


#: A target's idle connections, each with when it was kept, oldest first.
_Idle = list[tuple[http.client.HTTPConnection, float]]


class Pool:
    """Idle kept-alive connections, by target; any thread. A connection the server has
    closed meanwhile (it reads as ready) or that idled too long is never handed out, and one
    idle for ``IDLE_SECONDS`` is closed (looked for every ``IDLE_SECONDS`` while any is kept,
    by ``later``: ``DEADLINES``' thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 later: Callable[[float, Callable[[], None]], object] | None = None) -> None:
        self._idle: dict[tuple[Any, ...], _Idle] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._later = later or (lambda seconds, then: DEADLINES.add(seconds, then))
        self._sweeping = False

    def take(self, target: Target) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                expired = self._expired()
                idle = self._idle.get(target.key)
                connection = idle.pop()[0] if idle else None
            for old in expired:
                old.close()
            if connection is None:
                return None
            sock = connection.sock
            try:
                alive = sock is not None and not select.select([sock], [], [], 0)[0]
            except (OSError, ValueError):
                alive = False
            if alive:
                return connection
            connection.close()

    def give(self, target: Target, connection: http.client.HTTPConnection) -> None:
        """Keep ``connection`` for the next request (newest first); past ``IDLE_CONNECTIONS``
        the target's oldest goes."""
        with self._lock:
            expired = self._expired()
            idle = self._idle.setdefault(target.key, [])
            idle.append((connection, self._clock()))
            if len(idle) > IDLE_CONNECTIONS:
                expired.append(idle.pop(0)[0])
            sweep, self._sweeping = not self._sweeping, True
        for old in expired:
            old.close()
        if sweep:
            self._later(IDLE_SECONDS, self._sweep)

    def _sweep(self) -> None:
        """Close what idled too long; look again later while any connection is kept."""
        with self._lock:
            expired = self._expired()
            again = self._sweeping = bool(self._idle)
        for old in expired:
            old.close()
        if again:
            self._later(IDLE_SECONDS, self._sweep)

    def _expired(self) -> list[http.client.HTTPConnection]:
        """Take every target's connections idle for ``IDLE_SECONDS`` out of the pool (the lock
        is held): a burst's connections that are not used again, whichever endpoint they are
        for, end the next time any request takes or gives one. Each list is oldest first."""
        now, expired = self._clock(), []
        for key, idle in list(self._idle.items()):
            count = 0
            while count < len(idle) and now - idle[count][1] >= IDLE_SECONDS:
                count += 1
            expired += [connection for connection, _ in idle[:count]]
            del idle[:count]
            if not idle:
                del self._idle[key]
        return expired

    def drop(self, target: Target) -> None:
        """Close the target's idle connections (one turned out dead: the others may be too)."""
        with self._lock:
            idle = self._idle.pop(target.key, [])
        for connection, _ in idle:
            connection.close()


POOL = Pool()


class Deadlines:
    """Calls due at a time, for every exchange of the process, from one thread (started with
    the first): a thread per exchange would add one for each session waiting on the model.
    A call runs in that thread and must not block (``Exchange.abort`` shuts a socket).

    It also shuts the sockets of the exchanges aborted from other threads (due at once): a
    socket's ``shutdown`` wakes the thread reading it, and the thread that shut it then waits
    for the GIL that one took; done here, the reactor cancelling 200 turns at once does not
    wait 200 times (it did for about 180 ms), and this thread shuts them in one go (``hold``)."""

    def __init__(self) -> None:
        self._due: dict[object, tuple[float, Callable[[], None]]] = {}
        self._changed = threading.Condition()
        self._started = False
        self._held = 0

    def add(self, seconds: float, then: Callable[[], None]) -> object:
        """Call ``then`` in ``seconds``; the key that ``cancel`` takes. While ``held``, a call
        does not wake the thread (it runs at ``release``, or with the next one due)."""
        key = object()
        with self._changed:
            if not self._started:
                threading.Thread(target=self._run, name="hermes-model-watchdog", daemon=True).start()
                self._started = True
            self._due[key] = (time.monotonic() + max(0.0, seconds), then)
            if not self._held:
                self._changed.notify()
        return key

    def hold(self) -> None:
        """Gather the calls added from now until ``release`` (a burst of cancels): the sockets
        are then shut in one go, after the thread cancelling them is done with the burst,
        rather than each shutdown waking a reader that takes the GIL from it meanwhile."""
        with self._changed:
            self._held += 1

    def release(self) -> None:
        with self._changed:
            self._held -= 1
            self._changed.notify()

    def cancel(self, key: object) -> None:
        """``then`` is not called, unless it already is being called."""
        with self._changed:
            self._due.pop(key, None)

    def __len__(self) -> int:
        with self._changed:
            return len(self._due)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                calls = [self._due.pop(key)[1] for key, (when, _) in list(self._due.items()) if when <= now]
                if not calls:
                    self._changed.wait(min((when for when, _ in self._due.values()), default=now + 3600) - now)
                    continue
            for call in calls:
                try:
                    call()
                except Exception:  # noqa: BLE001 - the other deadlines still come
                    log.exception("a model request's deadline failed")


DEADLINES = Deadlines()


class Aborted(Exception):
    """``Exchange.abort`` was called."""


class NotAStream(Exception):
    """A 2xx answer that is neither an event stream nor a JSON document."""


class Exchange:
    """One request and its streamed response. ``abort``, from any thread, ends it at once:
    it stops waiting for a connection being made (DNS and connect go on in a helper thread,
    which closes what it made) and has ``DEADLINES``' thread shut the socket, which wakes a
    read, or a wait for the answer, blocked on a stalled server. Once the connection is back
    in the pool, an abort does nothing (another request may be using it).

    The exchange keeps the socket itself: ``http.client`` hands it to the response and forgets
    it (``connection.sock`` is None) when the answer ends with the connection (HTTP/1.0, or
    ``Connection: close`` without a length), and the abort must reach it all the same.

    ``seconds``: the whole exchange's time, from the request to the answer's end; then it is
    aborted as by ``abort``, and ``expired`` is set."""

    def __init__(self, target: Target, seconds: float | None = None) -> None:
        self.target = target
        self.connection: http.client.HTTPConnection | None = None
        self.response: http.client.HTTPResponse | None = None
        self.aborted = False
        #: The exchange's time ran out (``seconds``): the abort was the deadline's.
        self.expired = False
        #: The stream said ``[DONE]`` (or was one JSON answer): it ended, rather than broke off.
        self.completed = False
        self.seconds = seconds
        self._sock: socket.socket | None = None
        self._body: httpbody.Body | None = None
        self._released = False
        #: The connection was closed (``_drop``): its socket is not to be shut any more.
        self._dropped = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watchdog: object | None = None

    def abort(self) -> None:
        with self._lock:
            if self._released:
                return
            self.aborted = True
            self._wake.set()
            sock = None if self._dropped else self._sock
        if sock is not None:  # not here: a cancel of 200 turns at once shuts their sockets in one go
            DEADLINES.add(0, self._shutNow)

    def _shutNow(self) -> None:
        """Shut the socket (``DEADLINES``' thread), unless it was closed meanwhile: its number
        may be another socket's by now."""
        with self._lock:
            if not self._dropped:
                _shut(self._sock)

    def _expire(self) -> None:
        self.expired = True
        self.abort()

    def _watch(self, seconds: float, then: Callable[[], None]) -> None:
        """Call ``then`` in ``seconds`` (``DEADLINES``' thread), instead of the call set before."""
        self._unwatch()
        self._watchdog = DEADLINES.add(seconds, then)

    def _unwatch(self) -> None:
        if self._watchdog is not None:
            DEADLINES.cancel(self._watchdog)
            self._watchdog = None

    def _bind(self, connection: http.client.HTTPConnection) -> None:
        """Hold on to the open connection's socket (an abort that came first shuts it at once)."""
        with self._lock:
            sock = self._sock = connection.sock
            aborted = self.aborted
        if aborted:
            _shut(sock)

    def _open(self, connection: http.client.HTTPConnection) -> None:
        """Connect (DNS, TCP, a proxy's CONNECT, TLS) in a helper thread; give up at an abort."""
        failure: list[BaseException] = []
        done = threading.Event()

        def connect() -> None:
            try:
                connection.connect()
            except BaseException as e:  # handed to the waiting thread
                failure.append(e)
            finally:
                done.set()
                self._wake.set()
                if self.aborted:
                    connection.close()

        threading.Thread(target=connect, name="hermes-model-connect", daemon=True).start()
        self._wake.wait()
        if not done.is_set() or self.aborted:
            raise Aborted()
        self._wake.clear()
        if failure:
            raise failure[0]

    def post(self, path: str, body: dict[str, Any] | bytes, headers: Mapping[str, str], connectTimeout: float,
             readTimeout: float) -> None:
        """Send ``body`` as JSON (or as it is, already encoded) and wait for a 2xx answer (see ``send``)."""
        payload = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False,
                                                                  separators=(",", ":")).encode("utf-8")
        self.send("POST", path, payload, {"Content-Type": "application/json",
                                          "Accept": "text/event-stream, application/json", **headers},
                  connectTimeout, readTimeout)

    def json(self, path: str, headers: Mapping[str, str], timeout: float, limit: int) -> Any:
        """GET ``path`` and return its JSON (``/models``), at most ``limit`` bytes; the errors
        of ``send``, ``sse.EventTooBig``, or ValueError."""
        self.send("GET", path, None, {"Accept": "application/json", **headers}, timeout, timeout)
        value = json.loads(self._whole(limit))
        self._finished()
        return value

    def send(self, method: str, path: str, payload: bytes | None, headers: Mapping[str, str],
             connectTimeout: float, readTimeout: float) -> None:
        """Send the request and wait for a 2xx answer, or raise ``HTTPStatus`` (its error
        body read), ``Unreachable`` or ``Aborted``. A kept-alive connection the server closed
        meanwhile is replaced by a new one at no cost to the caller's retries; a 307 or 308
        is followed (five at most; the credentials only to the same host)."""
        if self.seconds is not None and self._watchdog is None:
            self._watch(self.seconds, self._expire)
        sent = {"User-Agent": USER_AGENT, **headers}
        target, redirects, fresh = self.target, 0, False
        while True:
            if self.aborted:
                raise Aborted()
            reused = None if fresh else POOL.take(target)
            connection = reused or target.connect(connectTimeout)
            with self._lock:
                self.connection, self._sock = connection, None
            try:
                if connection.sock is None:
                    self._open(connection)
                self._bind(connection)
                connection.sock.settimeout(readTimeout)
                connection.request(method, target.requestPath(path), payload, {**target.headers(), **sent})
                response = connection.getresponse()
            except Aborted:
                connection.close()
                raise
            except _NOT_SENT as e:
                connection.close()
                if self.aborted:
                    raise Aborted() from e
                if reused is not None:
                    POOL.drop(target)  # the server closed it while it was idle: the others too, likely
                    fresh = True
                    continue
                raise Unreachable(str(e) or type(e).__name__) from e
            except (socket.timeout, TimeoutError) as e:
                connection.close()
                raise Unreachable("timed out", timedOut=True) from e
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                if self.aborted:
                    raise Aborted() from e
                raise Unreachable(_reason(e), permanent=isinstance(e, ssl.SSLCertVerificationError)) from e
            fresh = False
            location = response.getheader("location")
            if response.status in (307, 308) and location and redirects < 5:
                _readError(response)
                response.close()
                connection.close()
                moved = Target.of(urllib.parse.urljoin(target.url(path), location))
                if (moved.host, moved.port) != (target.host, target.port):
                    sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                target, path, redirects = moved, "", redirects + 1  # the new URL's path is all of it
                continue
            if response.status >= 300:
                raw = _readError(response)
                response.close()
                connection.close()
                headers = {k.lower(): v for k, v in response.getheaders()}
                raise HTTPStatus(response.status, raw, headers)
            self.target, self.response, self._body = target, response, None
            return

    def events(self, limit: int) -> Iterator[Any]:
        """The JSON of each ``data:`` event, until ``[DONE]`` or the end of the body; a
        whole JSON answer (a server that does not stream) is one event. An event the end
        of the body cut in half is not one: the stream broke (``completed`` stays false).
        An event, a line or a JSON answer over ``limit`` bytes raises ``sse.EventTooBig``."""
        response = self.response
        assert response is not None
        kind = (response.getheader("content-type") or "").lower()
        if response.getheader("content-encoding", "identity").lower() not in ("identity", ""):
            raise NotAStream(f"a {response.getheader('content-encoding')}-encoded body (none was asked for)")
        body = self._reader()
        first = body.read()
        start = first[:64].lstrip(b"\xef\xbb\xbf \r\n")
        looksLikeEvents = start.startswith((b"data:", b":", b"event:"))  # whatever its content type says
        if "json" in kind and not looksLikeEvents:
            yield json.loads(self._whole(limit, first))
            self.completed = True
            self._finished()
            return
        if "event-stream" not in kind and not looksLikeEvents:
            while len(first) < 300 and (more := body.read(300 - len(first))):
                first += more
            snippet = " ".join(first[:300].decode("utf-8", "replace").split())[:200]
            raise NotAStream(f"content type {kind or 'unknown'!r}: {snippet}")
        decoder = sse.EventDecoder(limit)
        feed, read, chunk, loads = decoder.feed, body.read, first, json.loads
        while chunk:
            for data in feed(chunk):
                if data.strip() == b"[DONE]":
                    self.completed = True
                    self._finished()
                    return
                yield loads(data.decode("utf-8", "replace"))
            chunk = read()
        last = decoder.end()
        if last is not None and last.strip() == b"[DONE]":
            self.completed = True
        self._finished()

    def _reader(self) -> httpbody.Body:
        """The response's body, read from the socket from now on (``httpbody``)."""
        assert self.response is not None and self._sock is not None
        if self._body is None:
            self._body = httpbody.Body(self.response, self._sock)
        return self._body

    def _whole(self, limit: int, first: bytes = b"") -> bytes:
        """The rest of the body, at most ``limit`` bytes (``sse.EventTooBig`` beyond: it is one event)."""
        body = self._reader()
        parts, size = [first], len(first)
        while size <= limit and (chunk := body.read()):
            size += len(chunk)
            parts.append(chunk)
        if size > limit:
            raise sse.EventTooBig(limit)
        return b"".join(parts)

    def _finished(self) -> None:
        """The answer ended: keep the connection if the rest of its body (a chunked body's
        last chunk) comes within ``DRAIN_SECONDS`` and ``DRAIN_BYTES``; else close it. An answer
        that ends with its connection is not waited for at all: whatever the server does after
        ``[DONE]``, the caller goes on at once."""
        connection, response = self.connection, self.response
        assert connection is not None and response is not None
        body = self._reader()
        keep = False
        if not response.will_close and not self.aborted:
            self._watch(DRAIN_SECONDS, self.abort)  # a timer, not a read timeout: a trickle cannot stretch it
            try:
                budget = DRAIN_BYTES
                while budget > 0 and not body.done and (chunk := body.read(budget)):
                    budget -= len(chunk)
            except (OSError, http.client.HTTPException, ValueError):
                pass
            self._unwatch()
            with self._lock:
                keep = self._released = body.done and not body.extra and not self.aborted
        else:
            self._unwatch()
        if keep:
            response.close()  # (http.client's own end of a body: the connection takes a request again)
            POOL.give(self.target, connection)
            return
        self._drop()

    def _drop(self) -> None:
        """Close the connection and the response (which holds the socket of an answer that
        ends with its connection)."""
        with self._lock:
            self._dropped = True
        if self.response is not None:
            self.response.close()
        if self.connection is not None:
            self.connection.close()

    def close(self) -> None:
        """Done with it: a connection whose answer was not read to its end is closed."""
        self._unwatch()
        with self._lock:
            if self._released or self.connection is None:
                return
            self.aborted = True
        self._drop()  # (the reading thread's own close: nothing to wake)


def _shut(sock: socket.socket | None) -> None:
    """Shut ``sock`` both ways, which wakes a thread blocked reading it. The plain socket's
    ``shutdown``: TLS's own would also drop the TLS state under the reading thread's feet."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, ValueError):
        pass


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
