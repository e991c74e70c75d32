"""The line framer: linear, tolerant, and alive after an over-long line."""

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.framing import LineProtocol


class Recorder(LineProtocol):
    maxLength = 32

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[bytes] = []
        self.overflows: list[int] = []
        self.ended = False

    def lineReceived(self, line: bytes) -> None:
        self.lines.append(line)

    def lineLengthExceeded(self, size: int) -> None:
        self.overflows.append(size)

    def inputEnded(self) -> None:
        self.ended = True


def connected() -> Recorder:
    protocol = Recorder()
    protocol.makeConnection(StringTransport())
    return protocol


class FramingTests(SynchronousTestCase):
    def test_splitsLinesAcrossChunks(self) -> None:
        """Lines arrive whole however the bytes are chunked."""
        protocol = connected()
        for chunk in (b'{"a"', b":1}\n{", b'"b":2}\n\n', b'{"c":3}\r\n'):
            protocol.dataReceived(chunk)
        self.assertEqual(protocol.lines, [b'{"a":1}', b'{"b":2}', b'{"c":3}'])

    def test_blankLinesIgnored(self) -> None:
        """Blank and whitespace-only lines are not messages."""
        protocol = connected()
        protocol.dataReceived(b"\n\r\n   \n{}\n")
        self.assertEqual(protocol.lines, [b"{}"])

    def test_overlongLineSkippedToNextNewline(self) -> None:
        """An over-long line is reported once, its tail discarded, the next line kept."""
        protocol = connected()
        protocol.dataReceived(b"x" * 20)
        protocol.dataReceived(b"y" * 20)
        self.assertEqual(len(protocol.overflows), 1)
        protocol.dataReceived(b"z" * 100)
        protocol.dataReceived(b"tail\n{}\n")
        self.assertEqual(protocol.lines, [b"{}"])
        self.assertEqual(len(protocol.overflows), 1)

    def test_overlongLineInOneChunk(self) -> None:
        """A complete over-long line in a single chunk is refused too."""
        protocol = connected()
        protocol.dataReceived(b"q" * 40 + b"\n{}\n")
        self.assertEqual(protocol.lines, [b"{}"])
        self.assertEqual(protocol.overflows, [40])

    def test_finalLineWithoutNewline(self) -> None:
        """At EOF an unterminated last line is still delivered, then inputEnded."""
        protocol = connected()
        protocol.dataReceived(b'{"last":1}')
        self.assertEqual(protocol.lines, [])
        protocol.readConnectionLost()
        self.assertEqual(protocol.lines, [b'{"last":1}'])
        self.assertTrue(protocol.ended)

    def test_sendLineAppendsNewline(self) -> None:
        """sendLine writes the line and one newline."""
        protocol = connected()
        protocol.sendLine(b"{}")
        self.assertEqual(protocol.transport.value(), b"{}\n")

    def test_manySmallChunksOfOneLargeLine(self) -> None:
        """A 4 MiB line fed in 8 KiB chunks arrives intact (linear scanning)."""
        protocol = connected()
        protocol.maxLength = 8 * 1024 * 1024
        payload = b"a" * (4 * 1024 * 1024)
        for start in range(0, len(payload), 8192):
            protocol.dataReceived(payload[start : start + 8192])
        protocol.dataReceived(b"\n")
        self.assertEqual([len(line) for line in protocol.lines], [len(payload)])

    def test_whatTheLinesOfOneReadSendLeavesInOneWrite(self) -> None:
        """Answers to the lines of one read are written together, after the last line: a
        burst of a hundred cancels is one write, not a hundred (docs/performance.md)."""

        class Echo(Recorder):
            def lineReceived(self, line: bytes) -> None:
                super().lineReceived(line)
                self.sendLine(line.upper())

        protocol, writes = Echo(), []
        protocol.makeConnection(StringTransport())
        protocol.transport.write = writes.append
        protocol.transport.writeSequence = lambda parts: writes.append(b"".join(parts))
        protocol.dataReceived(b"a\nb\nc")
        self.assertEqual(writes, [b"A\nB\n"])
        protocol.dataReceived(b"\n")
        self.assertEqual(writes, [b"A\nB\n", b"C\n"])
        protocol.sendLine(b"alone")  # outside a read: at once
        self.assertEqual(writes[-1], b"alone\n")

    def test_aPeerBehindStillPausesTheRestOfARead(self) -> None:
        """Gathered answers are written once they reach ``GATHERED_BYTES``: a peer that is not
        reading pauses our input there, and the read's other lines wait (the bound on what an
        editor that is behind makes us hold)."""

        class Big(Recorder):
            def lineReceived(self, line: bytes) -> None:
                super().lineReceived(line)
                self.sendLine(b"x" * 40_000)

        protocol, writes = Big(), []
        protocol.makeConnection(StringTransport())
        protocol.maxLength = 1024

        def write(data: bytes) -> None:
            writes.append(len(data))
            protocol.pauseInput()  # the transport's buffer is full: it pauses its producer

        protocol.transport.write = write
        protocol.dataReceived(b"".join(b"%d\n" % n for n in range(10)))
        self.assertEqual(protocol.lines, [b"0", b"1"])
        self.assertEqual(writes, [80_002])
        protocol.transport.write = writes.append  # the peer caught up
        protocol.resumeInput()
        self.assertEqual(len(protocol.lines), 10)
