"""An HTTP/1.1 response body read straight from its socket: chunked, ``Content-Length`` or
to the connection's close (no Twisted).

``http.client`` reads a chunked body through five Python layers per chunk (``read1``,
``_read1_chunked``, ``_get_chunk_left``, ``_read_next_chunk_size``, a ``readline`` on a
``SocketIO``), and a model streams one chunk per event. Here a chunk that arrives in one
piece costs one ``recv`` and a few slices (docs/performance.md, "Streamed frames").
``http.client`` still sends the request and reads the status line and headers; this reads
what follows them.
"""

from __future__ import annotations

import http.client
import socket
from typing import Any

#: The most read from the socket at once (a fast stream is read in pieces this big), and the
#: least asked of it. A blocked ``recv`` holds all it was asked for until bytes come (CPython
#: allocates it first and shrinks it to what came), so a stream that waits asks for little:
#: 200 streams waiting on their models hold 200 × 4 KiB, not 200 × 64 KiB.
READ_SIZE, LEAST_READ = 64 * 1024, 4 * 1024
#: The longest chunk-size or trailer line, and the most trailer lines (``http.client``'s).
MAX_LINE, MAX_TRAILERS = 65536, 100


class Body:
    """The body of ``response`` (whose headers ``http.client`` has read), from ``sock``.

    ``read`` returns the next bytes of the body (what one ``recv`` brought, at most ``size``),
    ``b""`` once it has ended; ``done`` says whether it ended as its framing says (a chunked
    body's last chunk and trailers, all of a ``Content-Length``, or the close of a body that
    ends with its connection). The connection ending before that raises
    ``http.client.IncompleteRead``, as ``http.client`` does; a read timeout, ``socket.timeout``.
    Bytes after the body's end are never taken as more of it (``extra`` says some came)."""

    def __init__(self, response: http.client.HTTPResponse, sock: socket.socket) -> None:
        self._sock = sock
        self._fp: Any = response.fp  # what http.client buffered past the headers is read first
        self._ask = LEAST_READ  # what the next read asks for (``_recv``)
        self.chunked = bool(response.chunked)
        self._length: int | None = None if self.chunked else response.length
        #: What was received of a chunked body and not yet taken, from ``_at`` on (an offset,
        #: not a copy per step: one ``recv`` of a fast stream holds dozens of chunks).
        self._buffer = b""
        self._at = 0
        self._left = 0  # bytes left of the current chunk
        self._state = _SIZE if self.chunked else _DATA
        self._trailers = 0
        self.done = self._length == 0
        self.extra = False

    def read(self, size: int = READ_SIZE) -> bytes:
        if self.done:
            return b""
        if not self.chunked:
            return self._plain(size)
        out: list[bytes] = []
        while True:
            piece = self._chunked(size)
            if piece:
                out.append(piece)
                size -= len(piece)
            if self.done or size <= 0 or (out and (piece is None or self._at == len(self._buffer))):
                return b"".join(out)
            if piece is None:  # a chunk's size line or its end is not all here yet
                self._more()

    def _recv(self, size: int) -> bytes:
        """What one read brought, at most ``size`` bytes. It asks for twice what the last one
        brought, from ``LEAST_READ`` to ``READ_SIZE``: a stream that keeps the socket full is
        read in big pieces, one that trickles (and so waits in ``recv``) in small ones."""
        ask = self._ask
        if size < ask:
            ask = size
        fp = self._fp
        data = b""
        if fp is not None:  # (its read1: what it holds, else one raw read; never more than asked)
            self._fp = None
            data = fp.read1(ask)
            if len(data) == ask:
                self._fp = fp  # it may hold more
        if not data:
            data = self._sock.recv(ask)
        if ask == self._ask:
            self._ask = min(max(2 * len(data), LEAST_READ), READ_SIZE)
        return data

    def _more(self) -> None:
        rest = self._buffer[self._at:]  # (an unfinished line: short)
        data = self._recv(READ_SIZE)
        if not data:
            raise http.client.IncompleteRead(rest)
        self._buffer, self._at = rest + data if rest else data, 0

    def _plain(self, size: int) -> bytes:
        length = self._length
        data = self._recv(size)
        if not data:
            if length is not None:
                raise http.client.IncompleteRead(b"", length)
            self.done = True
            return data
        if length is not None:
            if len(data) > length:
                data, self.extra = data[:length], True
            self._length = length = length - len(data)
            self.done = length == 0
        return data

    def _chunked(self, size: int) -> bytes | None:
        """One step over what is buffered: the data of the current chunk (at most ``size``),
        ``b""`` after a chunk's size line or end, None when more must be read first."""
        buffer, at = self._buffer, self._at
        state = self._state
        if state is _DATA:
            if at == len(buffer):
                return None
            take = min(self._left, size, len(buffer) - at)
            data = buffer if take == len(buffer) else buffer[at:at + take]
            self._at = at + take
            self._left -= take
            if not self._left:
                self._state = _END
            return data
        end = buffer.find(b"\n", at)
        if end < 0:
            if len(buffer) - at > MAX_LINE:
                raise http.client.LineTooLong("chunk size" if state is _SIZE else "trailer line")
            return None
        line, self._at = buffer[at:end], end + 1
        if state is _END:  # the CRLF after a chunk's data
            if line.strip():
                raise http.client.IncompleteRead(b"")
            self._state = _SIZE
        elif state is _SIZE:
            try:
                self._left = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise http.client.IncompleteRead(b"") from None
            left = self._left
            if left < 0:
                raise http.client.IncompleteRead(b"")
            start = end + 1
            if 0 < left <= size and buffer[start + left:start + left + 2] == b"\r\n":  # all here: one step
                self._at, self._left = start + left + 2, 0
                return buffer[start:start + left]
            self._state, self._trailers = (_DATA, 0) if left else (_TRAILER, 0)
        else:  # a trailer line, until the blank one that ends the body
            self._trailers += 1
            if not line.strip():
                self.done = True
                self.extra = self._at < len(buffer)
            elif self._trailers > MAX_TRAILERS:
                raise http.client.HTTPException(f"more than {MAX_TRAILERS} trailer lines")
        return b""


_SIZE, _DATA, _END, _TRAILER = "size", "data", "end", "trailer"
