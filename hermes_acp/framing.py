"""Newline-delimited framing for the stdio transport.

``LineReceiver`` is quadratic for large lines and drops the connection on an
over-long one; this framer appends to a ``bytearray``, scans only the new bytes,
and after an over-long line discards input up to the next newline while the
connection stays up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from .config import DEFAULT_MAX_LINE


@implementer(IHalfCloseableProtocol)
class LineProtocol(Protocol):
    """Frames ``\\n``-terminated lines; tolerates ``\\r\\n`` and blank lines.

    Subclasses implement ``lineReceived``, ``lineLengthExceeded`` and
    ``inputEnded``; ``pauseInput`` and ``resumeInput`` hold lines
    back (and stop reading) while the peer is not taking our answers.
    """

    delimiter = b"\n"
    maxLength = DEFAULT_MAX_LINE
    #: The most a ``together`` block holds before writing (Twisted's buffer size for stdout, past
    #: which a write pauses our input while the peer is behind).
    GATHERED_BYTES = 64 * 1024

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer already known to hold no newline
        self._discarding = False
        self._inputPaused = False
        self._gathered: list[bytes] | None = None
        self._gatheredSize = 0

    def dataReceived(self, data: bytes) -> None:
        if self._discarding:
            end = data.find(self.delimiter)
            if end < 0:
                return
            self._discarding = False
            data = data[end + 1 :]
        self._buffer += data
        self._deliverBuffered()

    def _deliverBuffered(self) -> None:
        """Deliver the complete lines buffered, until input is paused. What they send at
        once leaves in one write after the last (``together``): a read can hold a hundred
        ``session/cancel`` lines, and a write for each answer let the reactor lose the GIL to
        the cancelled turns' threads as many times (docs/performance.md, issue 27)."""
        with self.together():
            self._deliverLines()

    def _deliverLines(self) -> None:
        start = 0
        while not self._inputPaused:
            end = self._buffer.find(self.delimiter, max(start, self._scanned))
            if end < 0:
                break
            line = bytes(self._buffer[start:end])
            start = end + 1
            self._deliver(line)
        del self._buffer[:start]
        if self._inputPaused:
            self._scanned = 0  # held lines are scanned again on resume
            return
        self._scanned = len(self._buffer)
        if len(self._buffer) > self.maxLength:
            size = len(self._buffer)
            self._buffer.clear()
            self._scanned = 0
            self._discarding = True
            self.lineLengthExceeded(size)

    def _deliver(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.maxLength:
            self.lineLengthExceeded(len(line))
        elif line.strip():
            self.lineReceived(line)

    def pauseInput(self) -> None:
        """Deliver no more lines and stop reading until ``resumeInput``."""
        self._inputPaused = True
        self.transport.pauseProducing()

    def resumeInput(self) -> None:
        """Deliver the lines held back, and read again."""
        if not self._inputPaused:
            return
        self._inputPaused = False
        self.transport.resumeProducing()
        self._deliverBuffered()

    def sendLine(self, line: bytes) -> None:
        if self._gathered is not None:
            self._gather(line, self.delimiter)
            return
        self.transport.writeSequence((line, self.delimiter))

    def sendFramed(self, data: bytes) -> None:
        """Whole lines already framed (each ending in the delimiter), in order with ``sendLine``'s."""
        if self._gathered is not None:
            self._gather(data)
            return
        self.transport.write(data)

    @contextmanager
    def together(self) -> Iterator[None]:
        """The lines sent meanwhile leave in one write, at the end: an answer and the updates
        that follow it (``jsonrpc.Reply``) reach the peer in one read, as when every write
        waited for the reactor's next turn (stdout is now written at once, ``stdio``). Once
        ``GATHERED_BYTES`` are gathered they are written at once, and gathering goes on: a
        peer that is behind pauses our input then, as it would have without the gathering."""
        if self._gathered is not None:
            yield
            return
        self._gathered, self._gatheredSize = [], 0
        try:
            yield
        finally:
            lines, self._gathered = self._gathered, None
            if lines:
                self.transport.write(b"".join(lines))

    def _gather(self, *parts: bytes) -> None:
        assert self._gathered is not None
        self._gathered += parts
        self._gatheredSize += sum(len(part) for part in parts)
        if self._gatheredSize >= self.GATHERED_BYTES:
            self._writeGathered()

    def _writeGathered(self) -> None:
        lines, self._gathered, self._gatheredSize = self._gathered, [], 0
        if lines:
            self.transport.write(b"".join(lines))

    def readConnectionLost(self) -> None:
        """stdin reached EOF: the lines held back and a final unterminated line
        still count (what is left is bounded: reading had to resume to see EOF)."""
        self._inputPaused = False
        self._deliverBuffered()
        rest, self._buffer = bytes(self._buffer), bytearray()
        if rest and not self._discarding:
            self._deliver(rest)
        self.inputEnded()

    def writeConnectionLost(self) -> None:
        """The reader of our stdout went away: nothing more can be said, so the
        connection ends now (StandardIO would only stop reading, and wait)."""
        self.transport.loseConnection()
        self.connectionLost(Failure(ConnectionDone("the peer stopped reading our output")))

    def lineReceived(self, line: bytes) -> None:
        raise NotImplementedError

    def lineLengthExceeded(self, size: int) -> None:
        raise NotImplementedError

    def inputEnded(self) -> None:
        raise NotImplementedError
