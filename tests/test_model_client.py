"""The model client's wire (``engine.chat_http`` under ``engine.model``): proxies from the
environment (plain and CONNECT, with credentials, ``no_proxy``), kept-alive connections,
``Retry-After``, and the quirks of the providers in docs/getting-started.md, each against the
scripted server on loopback."""

from __future__ import annotations

import itertools
import json
import threading
import time
import tracemalloc
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor, ssl
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.web import http, proxy
from twisted.web.server import Site

from hermes_acp.config import Endpoint
from hermes_acp.engine import chat_http, httpbody
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.model import ModelClient, ModelError, ReplyLimits, _Accumulator, listModels

from .scripted_model import FRAMINGS, ScriptedModel
from .test_e2e_tls import selfSigned

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def noProxies(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def complete(url: str, texts: list[str] | None = None) -> Any:
    """One request of a fresh client, in a thread (the client blocks)."""
    client = ModelClient(Endpoint("custom", url, "test-key", "scripted-model"), backoff=0.01)
    seen = texts if texts is not None else []
    return deferToThread(client.complete, "scripted-model", [{"role": "user", "content": "hi"}], [], Cancellation(),
                         seen.append, lambda text: None)


async def failure(d: Any) -> ModelError:
    try:
        await d
    except ModelError as e:
        return e
    raise AssertionError("no ModelError")


class _Tunnel(protocol.Protocol):
    """One connection to the CONNECT proxy: the request head, then bytes both ways."""

    def __init__(self, seen: list[tuple[str, list[str]]]) -> None:
        self.seen, self.buffer, self.peer = seen, b"", None

    def dataReceived(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.transport.write(data)
            return
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        head, rest = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        self.seen.append((lines[0], lines[1:]))
        host, port = lines[0].split(" ")[1].rsplit(":", 1)
        self.transport.pauseProducing()
        creator = protocol.ClientCreator(reactor, _Pipe, self)
        creator.connectTCP(host, int(port)).addCallback(self._connected, rest)

    def _connected(self, pipe: _Pipe, rest: bytes) -> None:
        self.peer = pipe
        self.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.transport.resumeProducing()
        if rest:
            pipe.transport.write(rest)

    def connectionLost(self, reason: Any) -> None:
        if self.peer is not None:
            self.peer.transport.loseConnection()


class _Pipe(protocol.Protocol):
    def __init__(self, client: _Tunnel) -> None:
        self.client = client

    def dataReceived(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connectionLost(self, reason: Any) -> None:
        self.client.transport.loseConnection()


class _Recorded(proxy.ProxyRequest):
    def process(self) -> None:
        self.channel.factory.seen.append((self.uri.decode(), self.getHeader("proxy-authorization")))
        super().process()


class _Forwarding(proxy.Proxy):
    requestFactory = _Recorded


def listening(factory: protocol.Factory) -> tuple[Any, int]:
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    return port, port.getHost().port


def test_targetsFollowTheEnvironment() -> None:
    direct = chat_http.Target.of("https://api.example.com/v1", {})
    assert (direct.https, direct.host, direct.port, direct.path, direct.proxyHost) == (True, "api.example.com", 443, "/v1", None)
    environ = {"HTTPS_PROXY": "http://bob:s%40cret@proxy.corp:3128", "no_proxy": "localhost,.internal,10.0.0.1:8000"}
    tunnelled = chat_http.Target.of("https://api.example.com/v1/", environ)
    assert (tunnelled.proxyHost, tunnelled.proxyPort, tunnelled.path) == ("proxy.corp", 3128, "/v1")
    assert tunnelled.proxyAuth == "Basic Ym9iOnNAY3JldA=="  # bob:s@cret
    for exempt in ("http://localhost:11434/v1", "https://llm.internal/v1", "https://a.b.internal/v1"):
        assert chat_http.Target.of(exempt, {**environ, "http_proxy": "proxy.corp:3128"}).proxyHost is None, exempt
    assert chat_http.Target.of("http://10.0.0.1:9000/v1", {"http_proxy": "p:1", "no_proxy": "10.0.0.1:8000"}).proxyHost == "p"
    plain = chat_http.Target.of("http://10.1.1.1:8000/v1", {"ALL_PROXY": "http://p:8080"})
    assert plain.requestPath("/chat/completions") == "http://10.1.1.1:8000/v1/chat/completions"
    assert chat_http.Target.of("http://10.1.1.1:8000/v1", {"no_proxy": "*", "all_proxy": "p:1"}).proxyHost is None
    with pytest.raises(ValueError):
        chat_http.Target.of("ftp://example.com", {})


@pytest_twisted.ensureDeferred
async def test_plainProxyWithCredentials(scriptedServer, noProxies) -> None:
    """``http_proxy`` with a user: the request goes to the proxy, whole URL and credentials."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "via the proxy"}])
    factory = http.HTTPFactory()
    factory.protocol, factory.seen = _Forwarding, []
    port, number = listening(factory)
    noProxies.setenv("http_proxy", f"http://alice:pw@127.0.0.1:{number}")
    try:
        reply = await complete(url)
    finally:
        await port.stopListening()
    assert reply.text == "via the proxy"
    assert factory.seen == [(f"{url}/chat/completions", "Basic YWxpY2U6cHc=")]


@pytest_twisted.ensureDeferred
async def test_httpsThroughAConnectProxy(tmp_path, noProxies) -> None:
    """``https_proxy``: a CONNECT tunnel, TLS inside it verified against ``SSL_CERT_FILE``."""
    caFile, pem = selfSigned(tmp_path)
    model = ScriptedModel([[{"text": "tunnelled"}]])
    tlsPort = reactor.listenSSL(0, Site(model), ssl.PrivateCertificate.loadPEM(pem).options(), interface="127.0.0.1")
    seen: list[Any] = []
    factory = protocol.Factory.forProtocol(lambda: _Tunnel(seen))
    port, number = listening(factory)
    noProxies.setenv("https_proxy", f"http://127.0.0.1:{number}")
    noProxies.setenv("SSL_CERT_FILE", str(caFile))
    target = tlsPort.getHost().port
    try:
        reply = await complete(f"https://127.0.0.1:{target}/v1")
    finally:
        await port.stopListening()
        await tlsPort.stopListening()
    assert reply.text == "tunnelled"
    assert seen[0][0] == f"CONNECT 127.0.0.1:{target} HTTP/1.0"


@pytest_twisted.ensureDeferred
async def test_connectionsAreKeptAlive(scriptedServer, noProxies) -> None:
    """Requests after the first reuse its connection (one TCP connection for three)."""
    server, url = scriptedServer
    server.default.responses += [[{"text": f"answer {n}"}] for n in range(3)]
    client = ModelClient(Endpoint("custom", url, "test-key", "scripted-model"))
    for n in range(3):
        reply = await deferToThread(client.complete, "scripted-model", [{"role": "user", "content": "hi"}], [],
                                    Cancellation(), lambda text: None, lambda text: None)
        assert reply.text == f"answer {n}"
    assert len(server.chatRequests) == 3 and len(server.peers) == 1


@pytest_twisted.ensureDeferred
async def test_aBurstOfRequestsFindsItsConnectionsAgain(noProxies) -> None:
    """Ten requests at once (the reactor's thread pool), then ten again: the second burst
    reuses the first's ten connections (the pool used to keep eight: two new ones a burst)."""
    model = ScriptedModel([[{"stall": 0.2}, {"text": f"answer {n}"}] for n in range(20)])
    port, number = listening(Site(model))
    url = f"http://127.0.0.1:{number}/v1"
    try:
        await defer.gatherResults([complete(url) for _ in range(10)])
        opened = len(model.peers)
        await defer.gatherResults([complete(url) for _ in range(10)])
    finally:
        await port.stopListening()
    assert len(model.chatRequests) == 20 and opened > 8 and len(model.peers) == opened


def test_connectionsIdleTooLongAreClosed() -> None:
    """A burst's connections that are not used again are closed once ``IDLE_SECONDS`` old: by
    the pool's next ``give`` or ``take`` of any endpoint, else by its sweep, which looks while
    any connection is kept; none of them is handed out. Past ``IDLE_CONNECTIONS`` the oldest goes."""
    import socket

    now, sweeps = [1000.0], []
    pairs = [socket.socketpair() for _ in range(5)]

    class Connection:
        def __init__(self, sock: socket.socket) -> None:
            self.sock, self.closed = sock, False

        def close(self) -> None:
            self.closed = True

    try:
        pool = chat_http.Pool(clock=lambda: now[0], later=lambda seconds, then: sweeps.append((seconds, then)))
        target, other = (chat_http.Target.of(f"http://127.0.0.1:{port}/v1", {}) for port in (9, 10))
        burst = [Connection(a) for a, _ in pairs[:3]]
        for connection in burst:
            pool.give(target, connection)
        assert [seconds for seconds, _ in sweeps] == [chat_http.IDLE_SECONDS]  # one sweep at a time
        now[0] += chat_http.IDLE_SECONDS - 1
        assert pool.take(target) is burst[-1] and not any(c.closed for c in burst)
        now[0] += 2  # the other two are past IDLE_SECONDS
        elsewhere = Connection(pairs[3][0])
        pool.give(other, elsewhere)  # another endpoint's give ends them
        assert [c.closed for c in burst] == [True, True, False] and pool.take(target) is None
        now[0] += chat_http.IDLE_SECONDS
        sweeps.pop(0)[1]()  # nothing taken or given meanwhile: the sweep ends it
        assert elsewhere.closed and pool.take(other) is None
        assert sweeps == []  # nothing kept: no more sweeps until the next give
        kept = [Connection(pairs[4][0]) for _ in range(chat_http.IDLE_CONNECTIONS + 1)]
        for connection in kept:
            pool.give(target, connection)
        assert [c.closed for c in kept] == [True] + [False] * chat_http.IDLE_CONNECTIONS
    finally:
        for a, b in pairs:
            a.close()
            b.close()


@pytest_twisted.ensureDeferred
async def test_retryAfterIsHonoured(scriptedServer, noProxies) -> None:
    server, url = scriptedServer
    server.default.responses += [[{"status": 429, "error": "slow down", "headers": {"Retry-After": "0.4"}}],
                                 [{"text": "later"}]]
    began = time.monotonic()
    reply = await complete(url)
    assert reply.text == "later" and time.monotonic() - began >= 0.4


@pytest.mark.parametrize("steps, check", [
    # OpenRouter: keep-alive comments, reasoning under "reasoning", usage with a cost in the last chunk
    ([{"raw": ": OPENROUTER PROCESSING\n\n"}, {"reasoning": "think", "field": "reasoning"}, {"text": "ok"},
      {"usage": {"prompt_tokens": 3, "completion_tokens": 1, "cost": 0.0002}}],
     lambda r: (r.text, r.reasoning, r.reasoningField, r.usage["cost"]) == ("ok", "think", "reasoning", 0.0002)),
    # DeepSeek and vLLM: reasoning_content
    ([{"reasoning": "hmm"}, {"text": "fine"}], lambda r: (r.reasoning, r.reasoningField) == ("hmm", "reasoning_content")),
    # Ollama and llama.cpp without usage: none reported
    ([{"text": "no usage"}], lambda r: r.usage is None and r.finishReason == "stop"),
    # a tool call in pieces across chunks
    ([{"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a/b.txt"}}], "split": 7}],
     lambda r: [(c.name, c.arguments) for c in r.toolCalls] == [("read_file", '{"path": "a/b.txt"}')]),
    # "data:" without its space, and CRLF line ends
    ([{"raw": 'data:{"choices":[{"index":0,"delta":{"content":"tight"}}]}\r\n\r\n'}], lambda r: r.text == "tight"),
    # lines ended by a bare CR
    ([{"raw": 'data: {"choices":[{"index":0,"delta":{"content":"cr"}}]}\r\r'}], lambda r: r.text == "cr"),
])
@pytest_twisted.ensureDeferred
async def test_providerQuirks(scriptedServer, noProxies, steps, check) -> None:
    server, url = scriptedServer
    server.default.responses.append(steps)
    assert check(await complete(url))


@pytest_twisted.ensureDeferred
async def test_aWholeJSONAnswerInsteadOfAStream(scriptedServer, noProxies) -> None:
    """A server that ignores ``stream`` and answers one JSON document is understood."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "all at once"}])
    server.streaming = False
    texts: list[str] = []
    reply = await complete(url, texts)
    assert (reply.text, texts) == ("all at once", ["all at once"])


@pytest.mark.parametrize("step, said", [
    ({"status": 502, "body": "<html><body><h1>502 Bad Gateway</h1>\n<p>nginx</p></body></html>"},
     "had a server error (HTTP 502): <html><body><h1>502 Bad Gateway</h1> <p>nginx</p>"),
    ({"status": 400, "error": "Invalid 'messages': empty"}, "rejected the request (HTTP 400): Invalid 'messages': empty"),
])
@pytest_twisted.ensureDeferred
async def test_errorBodies(scriptedServer, noProxies, step, said) -> None:
    """The provider's own message, JSON or a proxy's HTML page (whitespace folded, cut)."""
    server, url = scriptedServer
    server.default.responses += [[step]] * 5
    error = await failure(complete(url))
    assert said in str(error)


@pytest_twisted.ensureDeferred
async def test_anErrorEventMidStream(scriptedServer, noProxies) -> None:
    """OpenRouter reports an upstream failure as an event in the stream: it is said as such."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "par"}, {"raw": 'data: {"error": {"message": "upstream timed out", "code": 502}}\n\n'}])
    error = await failure(complete(url))
    assert "upstream timed out" in str(error) and "mid-answer" in str(error)


# -- what an independent review of the first version found --------------------------------------


@pytest_twisted.ensureDeferred
async def test_connectionsTheServerClosedAreNotRetriedOneByOne(noProxies) -> None:
    """Idle connections a server closed (uvicorn drops them after 5 s) cost nothing: the next
    request goes out at once on a new one, without a retry's backoff."""
    model = ScriptedModel([[{"stall": 0.2}, {"text": f"answer {n}"}] for n in range(3)] + [[{"text": "fresh"}]])
    site = Site(model, timeout=0.3)
    port, number = listening(site)
    url = f"http://127.0.0.1:{number}/v1"
    try:
        await defer.gatherResults([complete(url) for _ in range(3)])  # three connections, then idle
        await deferLater(reactor, 0.8, lambda: None)  # the server times them out
        began = time.monotonic()
        reply = await complete(url)
    finally:
        await port.stopListening()
    assert reply.text == "fresh" and time.monotonic() - began < 0.3
    assert len(model.chatRequests) == 4


@pytest_twisted.ensureDeferred
async def test_aStreamCutInsideAnEventIsRetried(scriptedServer, noProxies) -> None:
    """Half an event and then the end of the body is a broken connection, not a malformed
    answer: nothing was shown yet, so it is retried."""
    server, url = scriptedServer
    server.default.responses += [[{"raw": 'data: {"choices":[{"index":0,"delta":{"content":"par'}, {"close": True}],
                                 [{"text": "whole"}]]
    assert (await complete(url)).text == "whole"


@pytest_twisted.ensureDeferred
async def test_cancelWhileConnectingReturnsAtOnce(tmp_path, noProxies) -> None:
    """A server that accepts the connection and never shakes hands: a cancel during the TLS
    handshake returns at once."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    client = ModelClient(Endpoint("custom", f"https://127.0.0.1:{silent.getsockname()[1]}/v1", "k", "m"))
    cancellation = Cancellation()
    d = deferToThread(client.complete, "m", [{"role": "user", "content": "hi"}], [], cancellation,
                      lambda text: None, lambda text: None)
    await deferLater(reactor, 0.3, cancellation.cancel)
    began = time.monotonic()
    reply = await d
    silent.close()
    assert reply.finishReason == "cancelled" and time.monotonic() - began < 0.5


@pytest_twisted.ensureDeferred
async def test_credentialsInTheBaseURL(scriptedServer, noProxies) -> None:
    """``http://user:password@host/v1`` is Basic authentication, as the SDK made it."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "basic"}])
    assert (await complete(url.replace("http://", "http://ann:s3cret@"))).text == "basic"
    assert server.requests[-1].headers["authorization"] == "Basic YW5uOnMzY3JldA=="
    endpoint = Endpoint("custom", url.replace("http://", "http://ann:s3cret@"), "test-key", "scripted-model")
    assert await deferToThread(listModels, endpoint, 5) == [("scripted-model", None)]  # /models: the same way
    assert server.requests[-1].path.endswith("/models")
    assert server.requests[-1].headers["authorization"] == "Basic YW5uOnMzY3JldA=="


@pytest_twisted.ensureDeferred
async def test_aLateAbortLeavesAPooledConnectionAlone(scriptedServer, noProxies) -> None:
    """A cancel that lands after a stream ended, once its connection is back in the pool,
    does not break the next request on that connection."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "one"}], [{"text": "two"}]]
    target = chat_http.Target.of(url, {})

    def twice() -> list[str]:
        texts = []
        for _ in range(2):
            exchange = chat_http.Exchange(target)
            exchange.post("/chat/completions", {"model": "m", "messages": [], "stream": True}, {}, 5, 5)
            texts += [e["choices"][0]["delta"].get("content", "") for e in exchange.events(1 << 20) if e.get("choices")]
            exchange.abort()  # too late: its connection is another request's now
            exchange.close()
        return texts

    assert "".join(await deferToThread(twice)) == "onetwo"
    assert len(server.peers) == 1


@pytest_twisted.ensureDeferred
async def test_redirectsAndAnswersThatAreNotStreams(scriptedServer, noProxies) -> None:
    server, url = scriptedServer
    moved = url.replace("/v1", "/v2") + "/chat/completions"
    server.default.responses += [[{"status": 308, "error": "moved", "headers": {"Location": moved}}],
                                 [{"text": "found it"}],
                                 [{"status": 200, "body": "<html><body>Welcome to nginx</body></html>"}]]
    assert (await complete(url)).text == "found it"
    assert [r.path for r in server.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    error = await failure(complete(url))
    assert "something other than a stream" in str(error) and "Welcome to nginx" in str(error)
    assert not error.retryable and len(server.chatRequests) == 3


@pytest_twisted.ensureDeferred
async def test_anOverflowEventMidStream(scriptedServer, noProxies) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"raw": 'data: {"error": {"message": "request exceeds the available context size (8192)", '
                                             '"code": "exceed_context_size_error"}}\n\n'}])
    error = await failure(complete(url))
    assert error.overflow and error.window == 8192


def test_retryAfterForms() -> None:
    import email.utils

    from hermes_acp.engine.model import _retryAfter

    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert _retryAfter({"retry-after": "2"}) == 2.0
    assert _retryAfter({"retry-after-ms": "250"}) == 0.25
    assert 3.0 < _retryAfter({"retry-after": soon}) <= 5.0
    assert _retryAfter({"retry-after": "-1"}) is None and _retryAfter({"retry-after": "soon"}) is None
    assert _retryAfter({"retry-after": "9999"}) == 30.0


def test_proxyForms() -> None:
    with pytest.raises(ValueError, match="only http:// proxies"):
        chat_http.Target.of("https://api.example.com/v1", {"ALL_PROXY": "socks5h://user:pw@127.0.0.1:1080"})
    assert chat_http.Target.of("http://10.0.0.2/v1", {"http_proxy": "http://p"}).proxyPort == 80
    for noProxy in ("[::1]", "http://[::1]", "::1"):
        assert chat_http.Target.of("http://[::1]:8000/v1", {"http_proxy": "p:1", "no_proxy": noProxy}).proxyHost is None
    assert "ann:" not in repr(chat_http.Target.of("http://ann:secret@h/v1", {"http_proxy": "http://bob:pw@p:3"}))
    with pytest.raises(ValueError) as raised:
        chat_http.Target.of("htps://bob:hunter22@example.com/v1", {})
    assert "hunter22" not in str(raised.value)


# -- issue 22: cancel whatever the framing, a finished answer ends at once, bounded replies ------


def client(url: str, limits: ReplyLimits = ReplyLimits()) -> ModelClient:
    return ModelClient(Endpoint("custom", url, "test-key", "scripted-model"), backoff=0.01, readTimeout=60,
                       limits=limits)


async def cancelled(url: str, texts: list[str], stream: str) -> tuple[Any, float]:
    """Start a request, cancel it once some text arrived (and, for an endless stream, a while
    later); the reply and how long the cancel took."""
    cancellation = Cancellation()
    d = deferToThread(client(url).complete, "scripted-model", [{"role": "user", "content": "hi"}], [], cancellation,
                      texts.append, lambda text: None)
    for _ in range(200):
        if texts:
            break
        await deferLater(reactor, 0.05, lambda: None)
    if stream == "endless":
        await deferLater(reactor, 0.3, lambda: None)
    began = time.monotonic()
    cancellation.cancel()
    reply = await d
    return reply, time.monotonic() - began


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("stream", ["stalled", "endless"])
@pytest_twisted.ensureDeferred
async def test_cancelWhateverTheFraming(scriptedServer, noProxies, stream) -> None:
    """A cancel ends a stalled or never-ending stream at once, chunked or ended by the
    connection (where ``http.client`` hands the socket to the response); nothing read past
    the cancel is shown. The bound is generous (a loaded machine); bench/ measures."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "partial"}, {"stall": True}] if stream == "stalled"
                                    else [{"text": "partial"}, {"flood": "text", "every": 0.002}])
    texts: list[str] = []
    reply, took = await cancelled(url, texts, stream)
    shown = len(texts)
    await deferLater(reactor, 0.2, lambda: None)
    assert reply.finishReason == "cancelled" and took < 3.0
    assert len(texts) == shown and "".join(texts) == reply.text and reply.text.startswith("partial")


@pytest.mark.parametrize("scriptedServer", [*FRAMINGS, "chunked+open", "close+open"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_aFinishedAnswerEndsAtOnce(scriptedServer, noProxies) -> None:
    """After ``[DONE]`` the reply is the caller's at once, whatever the connection does next:
    a chunked body that never ends, or a connection the server leaves open, is closed, not
    drained (not waited on for the read timeout). A connection that ended cleanly is reused."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "one"}], [{"text": "two"}]]
    model = client(url)
    for expected in ("one", "two"):
        began = time.monotonic()
        reply = await deferToThread(model.complete, "scripted-model", [{"role": "user", "content": "hi"}], [],
                                    Cancellation(), lambda text: None, lambda text: None)
        assert (reply.text, reply.finishReason) == (expected, "stop") and time.monotonic() - began < 3.0
    assert len(server.peers) == (1 if server.framing == "chunked" and not server.holdOpen else 2)


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("steps, check", [
    ([{"text": "a"}, {"reasoning": "b"}, {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "x"}}],
                                          "split": 4}],
     lambda r: (r.text, r.reasoning, [(c.name, c.arguments) for c in r.toolCalls]) == ("a", "b", [("read_file", '{"path": "x"}')])),
    ([{"raw": 'data: {"choices":[{"index":0,"delta":{"content":"cr"}}]}\r\r'}, {"text": "!"}],
     lambda r: r.text == "cr!"),
])
@pytest_twisted.ensureDeferred
async def test_streamsInBothFramings(scriptedServer, noProxies, steps, check) -> None:
    server, url = scriptedServer
    server.default.responses.append(steps)
    assert check(await complete(url))


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest_twisted.ensureDeferred
async def test_aCutStreamIsRetriedInBothFramings(scriptedServer, noProxies) -> None:
    server, url = scriptedServer
    server.default.responses += [[{"raw": 'data: {"choices":[{"index":0,"delta":{"content":"par'}, {"close": True}],
                                 [{"text": "whole"}]]
    assert (await complete(url)).text == "whole"


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("flood, limits, variable", [
    ("line", ReplyLimits(maxEvent=64 * 1024), "HERMES_ACP_MODEL_MAX_EVENT"),
    ("text", ReplyLimits(maxReply=256 * 1024), "HERMES_ACP_MODEL_MAX_REPLY"),
])
@pytest_twisted.ensureDeferred
async def test_endlessRepliesAreCut(scriptedServer, noProxies, flood, limits, variable) -> None:
    """One endless ``data:`` line, or an endless stream of valid deltas: the reply ends at
    its bound with an error that names it and the variable that raises it; it is not
    retried, and what was shown is the reply's first part, nothing twice."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "start "}, {"flood": flood}]] * 2
    texts: list[str] = []
    model = client(url, limits)
    d = deferToThread(model.complete, "scripted-model", [{"role": "user", "content": "hi"}], [], Cancellation(),
                      texts.append, lambda text: None)
    error = await failure(d)
    assert variable in str(error) and not error.retryable and len(server.chatRequests) == 1
    shown = "".join(texts)
    assert shown.startswith("start ") and set(shown[6:]) <= {"x"} and len(shown) <= limits.maxReply
    assert server.flooded < 64 * 1024 * 1024  # it stopped reading (the rest sits in socket buffers at most)


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("steps", [
    [{"text": "slow"}, {"stall": True}],
    [{"text": "trickle"}, *[{"raw": ": keep-alive\n\n"}, {"stall": 0.1}] * 100],  # bytes keep coming, no delta
])
@pytest_twisted.ensureDeferred
async def test_aReplyHasATimeLimit(scriptedServer, noProxies, steps) -> None:
    """A reply that goes on too long ends at ``seconds`` (not the 600 s read timeout, which
    comments would keep resetting), with an error that names the bound."""
    server, url = scriptedServer
    server.default.responses.append(steps)
    began = time.monotonic()
    d = deferToThread(client(url, ReplyLimits(seconds=1.0)).complete, "scripted-model",
                      [{"role": "user", "content": "hi"}], [], Cancellation(), lambda text: None, lambda text: None)
    error = await failure(d)
    assert "HERMES_ACP_MODEL_REPLY_SECONDS" in str(error) and 1.0 <= time.monotonic() - began < 6.0


@pytest_twisted.ensureDeferred
async def test_oneThreadWatchesEveryReplysTime(scriptedServer, noProxies) -> None:
    """Replies stalled at once, one per session: one thread keeps all their time bounds (a
    thread each would add one per session waiting on the model), each ends at its bound, and
    no deadline is left behind."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "slow"}, {"stall": True}]] * 6
    ds = [deferToThread(client(url, ReplyLimits(seconds=1.5)).complete, "scripted-model", [{"role": "user", "content": "hi"}], [], Cancellation(),
                        lambda text: None, lambda text: None) for _ in range(6)]
    await server.whenStalled(6).addTimeout(10, reactor)
    watchdogs = [t for t in threading.enumerate() if t.name == "hermes-model-watchdog"]
    errors = [await failure(d) for d in ds]
    assert len(watchdogs) == 1
    assert all("HERMES_ACP_MODEL_REPLY_SECONDS" in str(e) for e in errors)
    assert len(chat_http.DEADLINES) == int(chat_http.POOL._sweeping)  # (the pool's one sweep, if it keeps any)


@pytest_twisted.ensureDeferred
async def test_toolCallsOfNoBytesCountToo(scriptedServer, noProxies) -> None:
    """A reply of tool calls that carry only an index (no name, no arguments: nothing of the
    reply's bytes) is bounded all the same, and quickly: each call counts."""
    server, url = scriptedServer
    events = [{"index": 0, "delta": {"tool_calls": [{"index": i} for i in range(n, n + 1000)]}}
             for n in range(0, 20_000, 1000)]
    server.default.responses.append([{"raw": "".join(f"data: {json.dumps({'choices': [e]})}\n\n" for e in events)}])
    began = time.monotonic()
    d = deferToThread(client(url, ReplyLimits(maxReply=256 * 1024)).complete, "scripted-model",
                      [{"role": "user", "content": "hi"}], [], Cancellation(), lambda text: None, lambda text: None)
    assert "HERMES_ACP_MODEL_MAX_REPLY" in str(await failure(d))
    assert time.monotonic() - began < 5.0


def test_aReplyOfTinyFragmentsStaysSmallAndQuick() -> None:
    """A reply comes a token or two at a time: what the client keeps of it weighs about what it
    holds (half a million two-byte strings in a list took 30 MB for 1 MB of text), and a tool call's
    arguments grow in linear time (growing a string took 36 s for 1 MiB of 4-byte fragments)."""
    accumulator = _Accumulator(lambda text: None, lambda text: None, ReplyLimits(maxReply=1024 * 1024))
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match="HERMES_ACP_MODEL_MAX_REPLY"):
            for n in itertools.count():
                accumulator.absorb({"choices": [{"index": 0, "delta": {"content": str(10 + n % 90)}}]})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak
    accumulator = _Accumulator(lambda text: None, lambda text: None)
    began = time.monotonic()
    accumulator.absorb({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "w", "function": {"name": "write_file", "arguments": ""}}]}}]})
    fragment = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "abcd"}}]}}]}
    for _ in range(256 * 1024):
        accumulator.absorb(fragment)
    [call] = accumulator.reply().toolCalls
    assert call.arguments == "abcd" * 256 * 1024 and time.monotonic() - began < 10.0


@pytest_twisted.ensureDeferred
async def test_aWholeJSONAnswerIsBoundedToo(scriptedServer, noProxies) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"text": "y" * 100_000}])
    server.streaming = False
    d = deferToThread(client(url, ReplyLimits(maxEvent=10_000)).complete, "scripted-model",
                      [{"role": "user", "content": "hi"}], [], Cancellation(), lambda text: None, lambda text: None)
    assert "HERMES_ACP_MODEL_MAX_EVENT" in str(await failure(d))


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest_twisted.ensureDeferred
async def test_cancelOverTLS(tmp_path, noProxies, framing) -> None:
    """Over HTTPS too: the plain socket is shut under the TLS layer, which wakes the read."""
    caFile, pem = selfSigned(tmp_path)
    model = ScriptedModel([[{"text": "partial"}, {"stall": True}]])
    model.setFraming(framing)
    tlsPort = reactor.listenSSL(0, Site(model), ssl.PrivateCertificate.loadPEM(pem).options(), interface="127.0.0.1")
    noProxies.setenv("SSL_CERT_FILE", str(caFile))
    texts: list[str] = []
    try:
        reply, took = await cancelled(f"https://127.0.0.1:{tlsPort.getHost().port}/v1", texts, "stalled")
    finally:
        await tlsPort.stopListening()
    assert (reply.finishReason, reply.text) == ("cancelled", "partial") and took < 3.0


def test_theBoundsComeFromTheEnvironment(tmp_path) -> None:
    """``HERMES_ACP_MODEL_*`` reach each session's model client; a value it cannot use is
    refused at start, naming the variable."""
    from hermes_acp.config import ConfigError, Settings
    from hermes_acp.engine_factory import EngineAgentFactory
    from hermes_acp.session_state import SessionState

    settings = Settings.fromEnv({"HERMES_ACP_MODEL_MAX_EVENT": "4096", "HERMES_ACP_MODEL_MAX_REPLY": "65536",
                                 "HERMES_ACP_MODEL_REPLY_SECONDS": "90"})
    factory = EngineAgentFactory(lambda: Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), settings=settings)
    agent = factory.buildAgent(SessionState("s", str(tmp_path)))
    assert agent.modelClient().limits == ReplyLimits(4096, 65536, 90.0)
    assert Settings.fromEnv({}).modelMaxReply == ReplyLimits().maxReply == 32 * 1024 * 1024
    for name, value in (("HERMES_ACP_MODEL_MAX_EVENT", "100"), ("HERMES_ACP_MODEL_REPLY_SECONDS", "inf")):
        with pytest.raises(ConfigError, match=name):
            Settings.fromEnv({name: value})


@pytest_twisted.ensureDeferred
async def test_abortsWhileHeldAreShutTogetherAtTheRelease(scriptedServer, noProxies) -> None:
    """Requests cancelled while the deadlines are held (the reactor answering a burst of
    cancels) keep their sockets until the release, then all end at once, cancelled: their
    readers do not take the GIL from the thread still cancelling."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "slow"}, {"stall": True}]] * 3
    cancels = [Cancellation() for _ in range(3)]
    ds = [deferToThread(client(url).complete, "scripted-model", [{"role": "user", "content": "hi"}], [], cancel,
                        lambda text: None, lambda text: None) for cancel in cancels]
    await server.whenStalled(3).addTimeout(10, reactor)
    await deferLater(reactor, 0.5, lambda: None)  # the watchdog is back to waiting (awake, it takes what is due)
    chat_http.DEADLINES.hold()
    try:
        for cancel in cancels:
            cancel.cancel()
        await deferLater(reactor, 0.3, lambda: None)
        held = [d.called for d in ds]
    finally:
        chat_http.DEADLINES.release()
    replies = [await d.addTimeout(5, reactor) for d in ds]
    assert held == [False, False, False]
    assert [reply.finishReason for reply in replies] == ["cancelled"] * 3


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest_twisted.ensureDeferred
async def test_repliesWaitingOnTheModelHoldLittle(scriptedServer, noProxies) -> None:
    """Replies waiting for the model's next delta each hold a few KiB of read buffer, not the
    64 KiB a fast stream is read in (a ``recv`` holds all it asked for while it waits: 200
    sessions waiting held 12.5 MiB), chunked or ended by the connection."""
    server, url = scriptedServer
    count = 6
    server.default.responses += [[{"text": "slow"}, {"stall": True}]] * count
    cancels = [Cancellation() for _ in range(count)]
    texts: list[list[str]] = [[] for _ in range(count)]
    tracemalloc.start()
    try:
        ds = [deferToThread(client(url).complete, "scripted-model", [{"role": "user", "content": "hi"}], [], cancel,
                            seen.append, lambda text: None) for cancel, seen in zip(cancels, texts)]
        await server.whenStalled(count).addTimeout(10, reactor)
        for _ in range(200):
            if all(texts):
                break
            await deferLater(reactor, 0.05, lambda: None)
        await deferLater(reactor, 0.3, lambda: None)  # each reader is back in its read, waiting
        held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, httpbody.__file__)])
    finally:
        tracemalloc.stop()
        for cancel in cancels:
            cancel.cancel()
    replies = [await d.addTimeout(5, reactor) for d in ds]
    assert all(seen == ["slow"] for seen in texts)
    assert [reply.finishReason for reply in replies] == ["cancelled"] * count
    size = sum(stat.size for stat in held.statistics("filename"))
    assert 0 < size < count * 16 * 1024, size
