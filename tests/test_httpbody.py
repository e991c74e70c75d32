"""``engine.httpbody``: a response body read from its socket, whatever the framing and however
the bytes are cut (the model's stream goes through it: tests/test_model_client.py)."""

from __future__ import annotations

import http.client
import io
import socket
import threading
from typing import Any

import pytest

from hermes_acp.engine.chat_http import _shut
from hermes_acp.engine.httpbody import MAX_LINE, READ_SIZE, Body

EVENTS = [b"data: {\"a\":1}\n\n", b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
CHUNKED = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\nX-Trailer: t\r\n\r\n"


class Pieces:
    """A socket whose ``recv`` hands out scripted pieces, then the connection's end."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [p for p in pieces if p]  # (an empty recv is the end)

    def recv(self, size: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > size:
            piece, rest = piece[:size], piece[size:]
            self.pieces.insert(0, rest)
        return piece


class Response:
    """What ``Body`` takes of an ``http.client.HTTPResponse``: what it buffered past the
    headers, and the framing the headers said."""

    def __init__(self, buffered: bytes = b"", chunked: bool = False, length: int | None = None) -> None:
        self.fp = io.BufferedReader(io.BytesIO(buffered))  # type: ignore[arg-type]
        self.chunked, self.length = chunked, length


def body(pieces: list[bytes], buffered: bytes = b"", **framing: Any) -> Body:
    return Body(Response(buffered, **framing), Pieces(pieces))  # type: ignore[arg-type]


def readAll(reader: Body, size: int = 64 * 1024) -> bytes:
    out = []
    while piece := reader.read(size):
        assert len(piece) <= size
        out.append(piece)
    return b"".join(out)


def test_chunkedSplitAtEveryByte() -> None:
    """However the chunked body is cut into two reads (and whatever http.client had buffered),
    the body is its chunks' data, and it ends at the last chunk and its trailers."""
    for cut in range(len(CHUNKED) + 1):
        for buffered in (0, min(cut, 5)):
            reader = body([CHUNKED[buffered:cut], CHUNKED[cut:]], CHUNKED[:buffered], chunked=True)
            assert readAll(reader) == b"".join(EVENTS), cut
            assert reader.done and not reader.extra, cut


def test_chunkedByteByByteAndWithinABudget() -> None:
    reader = body([CHUNKED[i : i + 1] for i in range(len(CHUNKED))], chunked=True)
    assert readAll(reader, size=7) == b"".join(EVENTS) and reader.done


def test_aChunkedEventArrivesWhole() -> None:
    """One event in one chunk in one ``recv`` is one read (the streaming case)."""
    reader = body([CHUNKED], chunked=True)
    assert [reader.read() for _ in range(2)] == [b"".join(EVENTS), b""]


def test_theConnectionEndingInsideAChunkedBody() -> None:
    for cut in (3, 10, len(CHUNKED) - 5):
        reader = body([CHUNKED[:cut]], chunked=True)
        with pytest.raises(http.client.IncompleteRead):
            readAll(reader)
        assert not reader.done


@pytest.mark.parametrize("raw, error", [
    (b"zz\r\nabc\r\n", http.client.IncompleteRead),  # not a size
    (b"-3\r\nabc\r\n", http.client.IncompleteRead),
    (b"3\r\nabcdef\r\n", http.client.IncompleteRead),  # more data than the size said
    (b"1" * (MAX_LINE + 10), http.client.LineTooLong),  # an endless size line
    (b"0\r\n" + b"X: y\r\n" * 101 + b"\r\n", http.client.HTTPException),  # endless trailers
])
def test_malformedChunkedBodies(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        readAll(body([raw[i : i + 4096] for i in range(0, len(raw), 4096)], chunked=True))


def test_bytesAfterTheBodyAreNotTakenForIt() -> None:
    """A server that sends more after a body's end: the body is not longer, and ``extra``
    tells the connection must not be kept."""
    reader = body([CHUNKED + b"HTTP/1.1 200 OK\r\n"], chunked=True)
    assert readAll(reader) == b"".join(EVENTS) and reader.done and reader.extra
    reader = body([b"hello world"], length=5)
    assert readAll(reader) == b"hello" and reader.done and reader.extra


def test_contentLength() -> None:
    for cut in range(12):
        reader = body([b"hello world"[:cut], b"hello world"[cut:]], length=11)
        assert readAll(reader, size=4) == b"hello world" and reader.done and not reader.extra
    with pytest.raises(http.client.IncompleteRead):
        readAll(body([b"hello"], length=11))
    assert body([], length=0).read() == b""


def test_aBodyThatEndsWithItsConnection() -> None:
    """HTTP/1.0 (or ``Connection: close`` without a length): the close is the end."""
    reader = body([b"data: a\n\n", b"data: b"], b"data: ")
    assert readAll(reader, size=5) == b"data: data: a\n\ndata: b" and reader.done


def test_anAbortWakesARead() -> None:
    """A read blocked on a silent server ends when another thread shuts the socket, as
    ``Exchange.abort`` does: the chunked body is incomplete, a close-delimited one ends."""
    for chunked in (True, False):
        ours, server = socket.socketpair()
        try:
            server.sendall(b"5\r\nhello\r\n" if chunked else b"hello")
            ours.settimeout(10)  # bounded: a regression fails, it does not hang
            reader = Body(Response(chunked=chunked), ours)  # type: ignore[arg-type]
            assert reader.read() == b"hello"
            outcome: list[Any] = []

            def read() -> None:
                try:
                    outcome.append(reader.read())
                except Exception as e:  # noqa: BLE001 - the test looks at it
                    outcome.append(e)

            thread = threading.Thread(target=read)
            thread.start()
            thread.join(0.2)
            assert thread.is_alive()  # waiting for the server
            _shut(ours)
            thread.join(5)
            assert not thread.is_alive()
            if chunked:
                assert isinstance(outcome[0], http.client.IncompleteRead) and not reader.done
            else:
                assert outcome == [b""] and reader.done
        finally:
            ours.close()
            server.close()


class Recording(socket.socket):
    """A real socket that notes the size of every read asked of it: ``recv``, and the
    ``recv_into`` of the buffered reader ``http.client`` reads the headers with (what a read
    waiting for bytes holds: CPython allocates all of it before it waits)."""

    asked: list[int]

    def recv(self, size: int, *flags: int) -> bytes:
        self.asked.append(size)
        return super().recv(size, *flags)

    def recv_into(self, buffer: Any, size: int = 0, *flags: int) -> int:
        self.asked.append(size or len(buffer))
        return super().recv_into(buffer, size, *flags)


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_aWaitingReadAsksForLittleAFastBodyIsReadInBigPieces(framing: str) -> None:
    """A stream that trickles asks the socket for a few KiB at a time, from the first read on
    (a read asked for 64 KiB held 64 KiB while it waited: 12.5 MiB for 200 waiting streams); a
    stream that keeps the socket full is read in pieces of up to ``READ_SIZE``; and after it,
    a trickle asks for little again from its second read. Through ``http.client``'s response,
    as ``chat_http`` reads it."""
    chunked = framing == "chunked"
    event = b"data: " + b"x" * 1000 + b"\n\n"
    sent = b"%x\r\n%s\r\n" % (len(event), event) if chunked else event
    ours, server = socket.socketpair()
    sock = Recording(fileno=ours.detach())
    try:
        sock.asked = []
        sock.settimeout(10)  # bounded: a regression fails, it does not hang
        framed = b"Transfer-Encoding: chunked" if chunked else b"Connection: close"
        server.sendall(b"HTTP/1.1 200 OK\r\n" + framed + b"\r\n\r\n")
        response = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
        response.begin()
        reader = Body(response, sock)
        sock.asked.clear()  # (http.client's own read of the headers)

        def taken() -> list[int]:
            asked = sock.asked[:]
            sock.asked.clear()
            return asked

        def trickle() -> list[int]:
            for _ in range(5):
                server.sendall(sent)
                assert reader.read() == event
            return taken()

        assert max(trickle()) <= READ_SIZE // 8
        fast = 1000
        writer = threading.Thread(target=server.sendall, args=(sent * fast,))
        writer.start()
        got = 0
        while got < len(event) * fast:
            got += len(reader.read())
        writer.join(10)
        asked = taken()
        assert READ_SIZE in asked and len(asked) <= len(event) * fast // (READ_SIZE // 4), asked
        assert max(trickle()[1:]) <= READ_SIZE // 8
    finally:
        sock.close()
        server.close()
