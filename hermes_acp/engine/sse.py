"""Server-sent events, decoded as the bytes arrive, with a bound: no I/O of its own, so any
HTTP client (the model's ``http.client`` in ``chat_http``, or one on Twisted) feeds it what it
reads and gets whole events back.

Lines end with LF, CRLF or a lone CR, and each byte is scanned once. A line, or an event's
data, longer than ``limit`` bytes raises ``EventTooBig``: a server that sends one endless line
cannot grow the reader without bound.
"""

from __future__ import annotations

from typing import Any

_BOM = b"\xef\xbb\xbf"


class EventTooBig(ValueError):
    """A line or an event passed the decoder's limit (in bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an event or line over {limit} bytes")
        self.limit = limit


class EventDecoder:
    """``feed`` the stream's bytes and get the data of each event it completed (its ``data:``
    lines joined by LF); ``end`` at the end of the stream. ``named`` events come as (name,
    data) pairs instead, the name from the event's ``event:`` line ("message" without one:
    the legacy MCP transport tells its ``endpoint`` event apart so). Comments, ``id:`` and
    ``retry:`` lines change nothing here."""

    def __init__(self, limit: int, named: bool = False) -> None:
        self.limit = limit
        self.named = named
        self._event = b"message"
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no line end
        self._skipLF = False  # the last line ended with CR: a LF next belongs to it
        self._started = False
        self._data: list[bytes] = []
        self._size = 0
        self._pending = False  # a data: line arrived since the last event

    def feed(self, data: bytes) -> list[Any]:
        if not self._started and data:
            self._started = True
            data = data[len(_BOM):] if data.startswith(_BOM) else data
        if data:
            if self._skipLF and data[:1] == b"\n":
                data = data[1:]
            self._skipLF = False
        buffer = self._buffer
        buffer += data
        events: list[bytes] = []
        start, size = 0, len(buffer)
        lf = buffer.find(b"\n", self._scanned)
        cr = buffer.find(b"\r", self._scanned)
        while lf >= 0 or cr >= 0:
            end = lf if cr < 0 or 0 <= lf < cr else cr
            line = bytes(buffer[start:end])
            start = end + 1
            if end == cr:  # CR: the LF of a CRLF belongs to it
                if start < size:
                    start += buffer[start] == 0x0A
                else:
                    self._skipLF = True
            self._line(line, events)
            if lf >= 0 and lf < start:
                lf = buffer.find(b"\n", start)
            if cr >= 0 and cr < start:
                cr = buffer.find(b"\r", start)
        del buffer[:start]
        self._scanned = len(buffer)
        if len(buffer) > self.limit:
            self._reset()
            raise EventTooBig(self.limit)
        return events

    def end(self) -> Any:
        """The stream ended: the data of an event it left undispatched (no blank line after
        it; a last line without its line end counts), or None when there is none."""
        if self._buffer:
            self._line(bytes(self._buffer), [])
            self._buffer.clear()
        data = b"\n".join(self._data) if self._pending else None
        event = self._event
        self._reset()
        return (event, data) if self.named and data is not None else data

    def _line(self, line: bytes, events: list[Any]) -> None:
        if not line:
            if self._pending:
                data = b"\n".join(self._data)
                events.append((self._event, data) if self.named else data)
                self._data, self._size, self._pending = [], 0, False
            self._event = b"message"
        elif line.startswith(b"event:"):
            self._event = line[6:].strip()[:64] or b"message"
        elif line.startswith(b"data:"):
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._size += len(value) + 1
            if self._size > self.limit:
                self._reset()
                raise EventTooBig(self.limit)
            self._data.append(value)
            self._pending = True

    def _reset(self) -> None:
        self._buffer.clear()
        self._scanned = 0
        self._data, self._size, self._pending = [], 0, False
        self._event = b"message"
