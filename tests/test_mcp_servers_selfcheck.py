"""The MCP test servers themselves (tests/mcp_scripted.py, mcp_http.py, mcp_fastmcp.py) behave as documented.

The stdio servers run as subprocesses driven with raw JSON lines; the HTTP one
runs on this test's reactor and is driven with blocking ``http.client`` calls
in a thread. Every wait is bounded.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import queue
import struct
import subprocess
import sys
import threading
import time
import wave
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from .mcp_scripted import (
    CLIENT_CAPABILITIES_META,
    EVERY_CONTENT_TYPE,
    MODERN_VERSION,
    PROTOCOL_VERSION_META,
    TINY_PNG,
    TINY_WAV,
    readLog,
    received,
    stdioCommand,
    tool,
)

WAIT = 5.0
HERE = Path(__file__).parent
MODERN_META = {PROTOCOL_VERSION_META: MODERN_VERSION, CLIENT_CAPABILITIES_META: {}}
INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "selfcheck", "version": "0"}}


class Peer:
    """A server subprocess spoken to with raw JSON lines; stdout and stderr are read by threads."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.stderr = bytearray()
        self.notifications: list[dict[str, Any]] = []
        threading.Thread(target=self._readOut, daemon=True).start()
        self._err = threading.Thread(target=self._readErr, daemon=True)
        self._err.start()

    def _readOut(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
        self.lines.put(None)

    def _readErr(self) -> None:
        while chunk := self.process.stderr.read1(65536):  # type: ignore[union-attr]
            self.stderr += chunk

    def send(self, message: dict[str, Any]) -> None:
        self.process.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]

    def line(self, timeout: float = WAIT) -> bytes | None:
        return self.lines.get(timeout=timeout)

    def message(self, timeout: float = WAIT) -> dict[str, Any]:
        line = self.line(timeout)
        assert line is not None, "the server closed stdout"
        return json.loads(line)

    def request(self, ident: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its response; notifications meanwhile go to ``notifications``."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            body["params"] = params
        self.send(body)
        while True:
            message = self.message()
            if message.get("id") == ident and "method" not in message:
                return message
            self.notifications.append(message)

    def silentFor(self, seconds: float) -> bool:
        try:
            self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> int:
        if self.process.poll() is None:
            self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(WAIT)
        self._err.join(WAIT)
        return self.process.returncode


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Any]:
    """Start tests/mcp_scripted.py on a script (a dict); every peer is ended afterwards."""
    peers: list[Peer] = []

    def start(script: dict[str, Any]) -> Peer:
        path = tmp_path / f"script{len(peers)}.json"
        path.write_text(json.dumps(script))
        peer = Peer(stdioCommand(path))
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        if peer.process.poll() is None:
            peer.process.kill()
        peer.close()


def handshake(peer: Peer) -> dict[str, Any]:
    answer = peer.request(1, "initialize", INITIALIZE)
    peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return answer


def call(peer: Peer, ident: int, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    return peer.request(ident, "tools/call", {"name": name, "arguments": arguments or {}, **params})


def test_everyContentTypeIsValid() -> None:
    png = TINY_PNG
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    offset, kinds = 8, []
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset:offset + 4])
        kind, data = png[offset + 4:offset + 8], png[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", png[offset + 8 + length:offset + 12 + length])
        assert zlib.crc32(kind + data) == crc
        if kind == b"IDAT":
            assert zlib.decompress(data) == b"\x00\xff\x00\x00\xff"
        kinds.append(kind)
        offset += 12 + length
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]
    assert wave.open(io.BytesIO(TINY_WAV)).getnframes() == 80
    assert {b["type"] for b in EVERY_CONTENT_TYPE} == {"text", "image", "audio", "resource_link", "resource"}
    assert base64.b64decode(EVERY_CONTENT_TYPE[1]["data"]) == TINY_PNG


def test_stdioLegacyHandshakePagingAndCalls(scripted: Any, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    tools = [tool(f"t{n}") for n in range(4)] + [
        tool("structured", "structured"), tool("error", "error"), tool("rpcError", "jsonrpcError"),
        tool("every", {"content": EVERY_CONTENT_TYPE}), tool("progress", {"progress": {"steps": 2, "delay": 0.01}}),
        tool("env", "env"),
    ]
    peer = scripted({"tools": tools, "pageSize": 3, "log": str(log), "instructions": "be nice",
                     "listChangedAfterInitialized": {"addTools": [tool("late")]}})
    answer = handshake(peer)["result"]
    assert answer["protocolVersion"] == "2025-11-25"
    assert answer["capabilities"]["tools"] == {"listChanged": True}
    assert answer["serverInfo"] == {"name": "scripted", "version": "1"} and answer["instructions"] == "be nice"
    assert peer.message()["method"] == "notifications/tools/list_changed"
    names, cursor, pages = [], None, 0
    while True:
        page = peer.request(10 + pages, "tools/list", {"cursor": cursor} if cursor else {})["result"]
        assert all("behaviour" not in t for t in page["tools"]) and len(page["tools"]) <= 3
        names += [t["name"] for t in page["tools"]]
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert names == [t["name"] for t in tools] + ["late"] and pages == 4
    assert peer.request(30, "tools/list", {"cursor": "bogus"})["error"]["code"] == -32602

    assert call(peer, 40, "t0", {"text": "hi"})["result"] == {"content": [{"type": "text", "text": "hi"}]}
    assert call(peer, 41, "structured", {"text": "x"})["result"] == {"content": [], "structuredContent": {"echo": {"text": "x"}}}
    failed = call(peer, 42, "error", {"text": "x"})["result"]
    assert failed["isError"] is True and failed["content"][0]["text"] == "it went wrong: x"
    assert call(peer, 43, "rpcError")["error"]["code"] == -32603
    assert call(peer, 44, "every")["result"]["content"] == EVERY_CONTENT_TYPE
    unknown = call(peer, 45, "nope")["result"]
    assert unknown == {"isError": True, "content": [{"type": "text", "text": "unknown tool nope"}]}
    assert call(peer, 46, "t1", {"text": 3})["result"]["isError"] is True  # wrong argument type
    assert call(peer, 47, "t1")["result"]["isError"] is True  # missing required argument
    done = call(peer, 48, "progress", {}, _meta={"progressToken": "tok"})["result"]
    assert done["content"][0]["text"] == "done in 2 steps"
    assert [n["params"] for n in peer.notifications if n["method"] == "notifications/progress"] == [
        {"progressToken": "tok", "progress": 1, "total": 2, "message": "step 1"},
        {"progressToken": "tok", "progress": 2, "total": 2, "message": "step 2"},
    ]
    env = json.loads(call(peer, 49, "env", {"names": ["PATH", "NOPE_NOT_SET"]})["result"]["content"][0]["text"])
    assert env["PATH"] and env["NOPE_NOT_SET"] is None and env["cwd"]
    assert peer.request(50, "ping")["result"] == {}
    assert peer.request(51, "server/discover", {})["error"]["code"] == -32601
    assert peer.request(52, "no/such")["error"]["code"] == -32601
    assert peer.close() == 0
    entries = readLog(log)
    assert entries[0]["event"] == "start" and entries[0]["env"]["PATH"]
    assert len(received(entries, "notifications/initialized")) == 1
    assert entries[-1]["event"] == "stdinEOF"


def test_stdioCancelPingAndCrash(scripted: Any, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    peer = scripted({"tools": [tool("slow", {"slow": {"seconds": 0.3}}), tool("forever", "sleepForever"),
                               tool("crash", "crash")], "log": str(log), "pingClient": True})
    handshake(peer)
    ping = peer.message()
    assert ping["method"] == "ping"
    peer.send({"jsonrpc": "2.0", "id": ping["id"], "result": {}})
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {}}})
    peer.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "user"}})
    assert peer.silentFor(0.5)  # the slow call never answers once cancelled
    entries = readLog(log)
    assert [e for e in entries if e["event"] == "response"][0]["message"] == {"jsonrpc": "2.0", "id": ping["id"], "result": {}}
    cancel = [e for e in entries if e["event"] == "cancelled"]
    assert cancel == [{**cancel[0], "requestId": 2, "reason": "user", "pending": True}]
    assert call(peer, 3, "slow", {"text": "late"})["result"]["content"][0]["text"] == "late"
    peer.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "crash", "arguments": {}}})
    assert peer.line() is None
    assert peer.close() == 1
    assert b"crashing" in peer.stderr


def test_stdioModernEra(scripted: Any) -> None:
    peer = scripted({"era": "modern"})
    assert peer.request(1, "server/discover", {})["error"]["code"] == -32602
    discovered = peer.request(2, "server/discover", {"_meta": MODERN_META})["result"]
    assert discovered["supportedVersions"] == [MODERN_VERSION] and discovered["resultType"] == "complete"
    assert discovered["capabilities"] == {"tools": {}}
    refused = peer.request(3, "initialize", INITIALIZE)["error"]
    assert refused["code"] == -32022 and refused["data"] == {"supported": [MODERN_VERSION], "requested": "2025-11-25"}
    other = {"_meta": {**MODERN_META, PROTOCOL_VERSION_META: "2099-01-01"}}
    assert peer.request(4, "tools/list", other)["error"]["code"] == -32022
    listed = peer.request(5, "tools/list", {"_meta": MODERN_META})["result"]
    assert [t["name"] for t in listed["tools"]] == ["echo"] and listed["resultType"] == "complete"
    answer = call(peer, 6, "echo", {"text": "hi"}, _meta=MODERN_META)["result"]
    assert answer["content"] == [{"type": "text", "text": "hi"}] and answer["resultType"] == "complete"
    assert peer.request(7, "ping", {"_meta": MODERN_META})["error"]["code"] == -32601


def test_stdioStartupEdges(scripted: Any, tmp_path: Path) -> None:
    exiting = scripted({"exitAtStart": {"code": 3, "stderr": "boom: missing API key"}})
    assert exiting.line() is None and exiting.close() == 3
    assert b"boom: missing API key" in exiting.stderr

    silent = scripted({"era": "silent"})
    silent.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE})
    assert silent.silentFor(0.3)

    pidFile = tmp_path / "pid"
    flooding = scripted({"stderrAtStart": 1 << 20, "pidFile": str(pidFile),
                         "tools": [tool("huge", {"hugeLine": {"bytes": 200_000}})]})
    assert handshake(flooding)["result"]["protocolVersion"] == "2025-11-25"
    flooding.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "huge", "arguments": {}}})
    assert flooding.line() == b"x" * 200_000 + b"\n"
    assert flooding.message()["result"]["content"][0]["text"] == "after a line of 200000 bytes"
    assert int(pidFile.read_text()) == flooding.process.pid
    assert flooding.close() == 0
    assert len(flooding.stderr) == 1 << 20


# --- streamable HTTP ---

ACCEPT = "application/json, text/event-stream"


def _post(url: str, body: Any, headers: dict[str, str] | None = None, method: str = "POST",
          closeAfter: int | None = None, holdUntil: threading.Event | None = None) -> tuple[int, dict[str, str], bytes]:
    """One blocking HTTP request; ``closeAfter``: read that many SSE events (then wait for
    ``holdUntil`` if given), then hang up."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT)
    sent = {"Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})}
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    connection.request(method, parts.path, data, sent)
    response = connection.getresponse()
    got = {k.lower(): v for k, v in response.getheaders()}
    if closeAfter is not None:
        text = b""
        while text.count(b"\n\n") < closeAfter:
            line = response.readline()
            if not line:  # the stream ended early
                break
            text += line
        if holdUntil is not None:
            holdUntil.wait(WAIT)
        connection.close()
        return response.status, got, text
    payload = response.read()
    connection.close()
    return response.status, got, payload


def post(url: str, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> Any:
    d = deferToThread(_post, url, body, headers, **kw)
    return d.addTimeout(WAIT * 2, reactor)


def rpc(ident: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if ident is not None:
        body["id"] = ident
    if params is not None:
        body["params"] = params
    return body


@pytest_twisted.ensureDeferred
async def test_httpLegacySessions(httpMCP: Any) -> None:
    server, url = httpMCP({"requireHeaders": {"Authorization": "Bearer t0ken"}})
    auth = {"Authorization": "Bearer t0ken"}
    status, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    assert status == 401 and "www-authenticate" in headers
    assert (await post(url, rpc(1, "initialize", INITIALIZE), {**auth, "Accept": "application/json"}))[0] == 406
    assert (await post(url, rpc(1, "initialize", INITIALIZE), {**auth, "Content-Type": "text/plain"}))[0] == 415
    status, headers, body = await post(url, rpc(1, "initialize", INITIALIZE), auth)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["result"]["protocolVersion"] == "2025-11-25"
    session = headers["mcp-session-id"]
    assert session in server.sessions
    assert (await post(url, rpc(None, "notifications/initialized"), auth))[0] == 400  # no session header
    inSession = {**auth, "Mcp-Session-Id": session}
    assert (await post(url, rpc(None, "notifications/initialized"), inSession))[0] == 400  # no protocol version
    inSession["MCP-Protocol-Version"] = "2025-11-25"
    status, _, body = await post(url, rpc(None, "notifications/initialized"), inSession)
    assert (status, body) == (202, b"")
    status, _, body = await post(url, rpc(2, "tools/list"), inSession)
    assert status == 200 and [t["name"] for t in json.loads(body)["result"]["tools"]] == ["echo"]
    server.expireSessions()
    status, _, body = await post(url, rpc(3, "tools/list"), inSession)
    assert status == 404 and json.loads(body)["error"]["message"] == "Session not found"
    status, headers, _ = await post(url, rpc(4, "initialize", INITIALIZE), auth)
    fresh = {**inSession, "Mcp-Session-Id": headers["mcp-session-id"]}
    assert fresh["Mcp-Session-Id"] != session and server.initializeCount == 2
    assert (await post(url, None, fresh, method="GET"))[0] == 405
    assert (await post(url, None, fresh, method="DELETE"))[0] == 200
    assert server.deleted == [fresh["Mcp-Session-Id"]] and not server.sessions
    assert (await post(url, rpc(5, "tools/list"), fresh))[0] == 404
    recorded = [r for r in server.requests if r.rpcMethod == "tools/list"][0]
    assert recorded.headers["mcp-session-id"] == session and recorded.headers["authorization"] == "Bearer t0ken"
    assert server.counts["notifications/initialized"] == 3


@pytest_twisted.ensureDeferred
async def test_httpSessionLost400(httpMCP: Any) -> None:
    server, url = httpMCP({"sessionLostStatus": 400})
    _, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    server.expireSessions()
    lost = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    assert (await post(url, rpc(2, "tools/list"), lost))[0] == 400


def sseEvents(raw: bytes) -> list[dict[str, str]]:
    events = []
    for block in raw.decode().split("\n\n"):
        if block:
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                name, _, value = line.partition(":")
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
            events.append(fields)
    return events


@pytest_twisted.ensureDeferred
async def test_httpSSEPrimingProgressAndCancel(httpMCP: Any, tmp_path: Path) -> None:
    log = tmp_path / "http.jsonl"
    server, url = httpMCP({"responseMode": "sse", "log": str(log), "tools": [
        tool("progress", {"progress": {"steps": 2, "delay": 0.01}}), tool("slow", {"slow": {"seconds": 30}})]})
    status, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    inSession = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    params = {"name": "progress", "arguments": {}, "_meta": {"progressToken": 7}}
    status, headers, raw = await post(url, rpc(2, "tools/call", params), inSession)
    assert raw.startswith(b"id: ") and raw.split(b"\n")[1] == b"data: "
    events = sseEvents(raw)
    assert events[0]["data"] == "" and "id" in events[0]
    messages = [json.loads(e["data"]) for e in events[1:]]
    assert [m.get("method") for m in messages] == ["notifications/progress"] * 2 + [None]
    assert messages[-1]["result"]["content"][0]["text"] == "done in 2 steps"
    status, _, raw = await post(url, rpc(3, "tools/call", {"name": "slow", "arguments": {}}), inSession, closeAfter=1)
    assert sseEvents(raw)[0]["data"] == ""
    cancelled = await server.whenCancelled().addTimeout(WAIT, reactor)
    assert (cancelled["requestId"], cancelled["reason"], cancelled["pending"]) == (3, "stream closed", True)
    assert any(e["event"] == "cancelled" for e in readLog(log))


@pytest_twisted.ensureDeferred
async def test_httpCancelCrashHugeLine(httpMCP: Any) -> None:
    server, url = httpMCP({"responseMode": "sse", "listChangedAfterInitialized": {"addTools": [tool("late")]},
                              "tools": [tool("forever", "sleepForever"), tool("crash", "crash"),
                                        tool("huge", {"hugeLine": {"bytes": 100_000}})]})
    _, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    inSession = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await post(url, rpc(None, "notifications/initialized"), inSession)
    assert server.undelivered == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]  # no GET stream
    hangUp = threading.Event()
    pending = post(url, rpc(2, "tools/call", {"name": "forever", "arguments": {}}), inSession, closeAfter=1,
                   holdUntil=hangUp)
    await server.whenMethod("tools/call").addTimeout(WAIT, reactor)
    cancel = rpc(None, "notifications/cancelled", {"requestId": 2, "reason": "user"})
    assert (await post(url, cancel, inSession))[0] == 202
    cancelled = await server.whenCancelled().addTimeout(WAIT, reactor)
    assert (cancelled["reason"], cancelled["pending"]) == ("user", True)
    hangUp.set()
    await pending
    await server.whenEvent("streamClosed").addTimeout(WAIT, reactor)
    with pytest.raises(http.client.HTTPException):  # the connection drops mid-stream
        await post(url, rpc(3, "tools/call", {"name": "crash", "arguments": {}}), inSession)
    _, _, raw = await post(url, rpc(4, "tools/call", {"name": "huge", "arguments": {}}), inSession)
    events = sseEvents(raw)
    assert events[1] == {"data": "x" * 100_000}
    assert json.loads(events[2]["data"])["id"] == 4
    assert len([e for e in server.events if e["event"] == "cancelled"]) == 1  # a closed stream after a cancel is not a second one


@pytest_twisted.ensureDeferred
async def test_httpModernEra(httpMCP: Any) -> None:
    server, url = httpMCP({"era": "modern"})
    status, headers, body = await post(url, rpc(1, "initialize", INITIALIZE))
    assert status == 400 and "mcp-session-id" not in headers
    assert json.loads(body)["error"]["code"] == -32022
    modern = {"MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "server/discover"}
    status, _, body = await post(url, rpc(2, "server/discover", {"_meta": MODERN_META}), modern)
    assert status == 200 and json.loads(body)["result"]["supportedVersions"] == [MODERN_VERSION]
    status, _, body = await post(url, rpc(3, "tools/list", {"_meta": MODERN_META}), modern)
    assert status == 400 and json.loads(body)["error"]["code"] == -32020
    params = {"name": "echo", "arguments": {"text": "hi"}, "_meta": MODERN_META}
    callHeaders = {"MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "tools/call", "Mcp-Name": "other"}
    assert (await post(url, rpc(4, "tools/call", params), callHeaders))[0] == 400
    status, _, body = await post(url, rpc(5, "tools/call", params), {**callHeaders, "Mcp-Name": "echo"})
    assert status == 200 and json.loads(body)["result"]["content"] == [{"type": "text", "text": "hi"}]
    assert (await post(url, None, {}, method="DELETE"))[0] == 405
    assert not server.sessions


class EventReader:
    """A GET stream read by a thread: each SSE event (``sseEvents`` fields) onto a queue, None at its end."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.queue: queue.Queue[dict[str, str] | None] = queue.Queue()
        self.status: Deferred[int] = Deferred()
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT)
        self.connection.request("GET", parts.path, None, {"Accept": "text/event-stream", **headers})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            response = self.connection.getresponse()
            reactor.callFromThread(self.status.callback, response.status)
            block = b""
            while True:
                line = response.readline()
                if not line:
                    break
                block += line
                if line == b"\n":
                    self.queue.put(sseEvents(block)[0])
                    block = b""
        except Exception:  # a timeout or a reset: the end, as far as the test is concerned
            pass
        finally:
            self.connection.close()
            self.queue.put(None)

    def next(self) -> Any:
        """A Deferred firing with the next event (None: the stream ended); bounded."""
        return deferToThread(self.queue.get, True, WAIT).addTimeout(WAIT * 2, reactor)


@pytest_twisted.ensureDeferred
async def test_httpGetStream(httpMCP: Any) -> None:
    plain, plainUrl = httpMCP({})
    _, headers, _ = await post(plainUrl, rpc(1, "initialize", INITIALIZE))
    status, headers, _ = await post(plainUrl, None, {"Mcp-Session-Id": headers["mcp-session-id"],
                                                     "MCP-Protocol-Version": "2025-11-25"}, method="GET")
    assert status == 405 and headers["allow"] == "POST, DELETE"  # no "getStream": no GET stream

    server, url = httpMCP({"getStream": True})
    _, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    inSession = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await post(url, rpc(None, "notifications/initialized"), inSession)
    assert (await post(url, None, {"MCP-Protocol-Version": "2025-11-25"}, method="GET"))[0] == 400
    assert (await post(url, None, {**inSession, "Mcp-Session-Id": "nope"}, method="GET"))[0] == 404
    assert (await post(url, None, {**inSession, "Accept": "application/json"}, method="GET"))[0] == 406
    reader = EventReader(url, inSession)
    assert await reader.status.addTimeout(WAIT, reactor) == 200
    priming = await reader.next()
    assert priming["data"] == "" and "id" in priming
    stream = await server.whenGetStreams(1).addTimeout(WAIT, reactor)
    assert server.openGetStreams == 1 and stream.record.method == "GET" and stream.record.status == 200
    assert stream.record.headers["mcp-session-id"] == inSession["Mcp-Session-Id"]
    assert (await post(url, None, inSession, method="GET"))[0] == 409  # one per session
    assert server.notifyToolsChanged([tool("late")]) == 1
    changed = await reader.next()
    assert changed["event"] == "message" and int(changed["id"]) > int(priming["id"])
    assert json.loads(changed["data"]) == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert server.undelivered == [] and stream.sent == [json.loads(changed["data"])]
    _, _, body = await post(url, rpc(2, "tools/list"), inSession)
    assert [t["name"] for t in json.loads(body)["result"]["tools"]] == ["echo", "late"]
    assert (await post(url, None, inSession, method="DELETE"))[0] == 200
    assert await reader.next() is None  # ended cleanly with the session
    assert server.openGetStreams == 0
    assert [e["reason"] for e in server.events if e["event"] == "getStreamEnded"] == ["delete"]
    assert [e["event"] for e in server.events if e["event"].startswith("getStream")] == [
        "getStreamOpened", "getStreamEnded"]


@pytest_twisted.ensureDeferred
async def test_httpGetStreamClientCloseAndDisconnect(httpMCP: Any) -> None:
    server, url = httpMCP({"getStream": True, "responseMode": "sse"})
    _, headers, _ = await post(url, rpc(1, "initialize", INITIALIZE))
    inSession = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    status, headers, raw = await post(url, None, {**inSession, "Accept": "text/event-stream"}, method="GET",
                                      closeAfter=1)
    assert status == 200 and headers["content-type"] == "text/event-stream" and sseEvents(raw)[0]["data"] == ""
    closed = await server.whenEvent("getStreamClosed").addTimeout(WAIT, reactor)
    assert closed["session"] == inSession["Mcp-Session-Id"] and server.openGetStreams == 0
    server.notifyToolsChanged()  # no GET stream open: kept
    assert server.undelivered == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]
    reader = EventReader(url, inSession)
    await server.whenGetStreams(2).addTimeout(WAIT, reactor)
    assert (await reader.next())["data"] == ""
    server.disconnectAll()
    assert await reader.next() is None
    assert server.events[-1]["event"] == "getStreamEnded" and server.events[-1]["reason"] == "disconnectAll"
    assert len(server.undelivered) == 1 and server.openGetStreams == 0


# --- the mcp package's own server ---


def test_fastmcpStdio() -> None:
    pytest.importorskip("mcp.server.mcpserver")
    peer = Peer([sys.executable, str(HERE / "mcp_fastmcp.py"), "stdio"])
    try:
        started = time.monotonic()
        answer = peer.request(1, "initialize", INITIALIZE)
        assert answer["result"]["serverInfo"]["name"] == "fastmcp-test", time.monotonic() - started
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        names = {t["name"] for t in peer.request(2, "tools/list", {})["result"]["tools"]}
        assert {"add", "shout", "pixel", "stats"} <= names
        assert call(peer, 3, "shout", {"text": "hi"})["result"]["content"][0]["text"] == "HI"
        assert call(peer, 4, "stats", {"text": "a b"})["result"]["structuredContent"] == {
            "length": 3, "words": 2, "upper": "A B"}
    finally:
        assert peer.close() == 0
