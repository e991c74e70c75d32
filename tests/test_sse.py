"""``engine.sse``: server-sent events decoded as the bytes arrive, with a bound."""

from __future__ import annotations

import pytest

from hermes_acp.engine.sse import EventDecoder, EventTooBig

STREAM = (b"\xef\xbb\xbf: comment\r\nevent: x\r\ndata: one\r\n\r\n"
          b"data:two\rdata: lines\r\rid: 7\ndata: three\n\ndata: [DONE]")


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(STREAM)])
def test_eventsWhateverTheLineEndsAndPieces(size: int) -> None:
    """LF, CRLF and a lone CR end lines, even when a CRLF is split between two pieces; a
    leading BOM, comments and other fields are skipped; the last line needs no line end."""
    decoder = EventDecoder(1024)
    events = [e for i in range(0, len(STREAM), size) for e in decoder.feed(STREAM[i : i + size])]
    assert (events, decoder.end()) == ([b"one", b"two\nlines", b"three"], b"[DONE]")


def test_noEventLeftAtTheEnd() -> None:
    decoder = EventDecoder(1024)
    assert decoder.feed(b"data: a\n\n: bye\n") == [b"a"] and decoder.end() is None


@pytest.mark.parametrize("stream", [
    b"data: " + b"x" * 2000,  # one endless line
    b"".join(b"data: " + b"y" * 100 + b"\n" for _ in range(20)),  # an event of many lines
])
def test_aLineOrEventOverTheLimit(stream: bytes) -> None:
    decoder = EventDecoder(1024)
    with pytest.raises(EventTooBig) as raised:
        for i in range(0, len(stream), 100):
            decoder.feed(stream[i : i + 100])
    assert raised.value.limit == 1024


def test_eventsUpToTheLimitPass() -> None:
    decoder = EventDecoder(1024)
    assert decoder.feed(b"data: " + b"z" * 1000 + b"\n\n") == [b"z" * 1000]
