"""Frames go straight to stdout while nothing is buffered (``stdio.directStandardIO``), and
through Twisted's buffer, in order and with its flow control, when the pipe does not take them."""

from __future__ import annotations

import fcntl
import os
from typing import Any

from twisted.internet import main
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from hermes_acp.stdio import directStandardIO

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@implementer(IPushProducer)
class Producer:
    def __init__(self) -> None:
        self.paused = 0

    def pauseProducing(self) -> None:
        self.paused += 1

    def resumeProducing(self) -> None:
        self.paused -= 1

    def stopProducing(self) -> None:
        pass


class DirectWriteTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactor()
        self.stdinRead, self.stdinWrite = os.pipe()
        self.outRead, self.outWrite = os.pipe()
        self.capacity = fcntl.fcntl(self.outWrite, F_SETPIPE_SZ, 4096)
        os.set_blocking(self.outRead, False)
        self.protocol = Protocol()
        self.transport: Any = directStandardIO()(self.protocol, stdin=self.stdinRead, stdout=self.outWrite,
                                                 reactor=self.reactor)
        self.writer = self.transport._writer
        self.addCleanup(self.close)

    def close(self) -> None:
        for fd in (self.stdinRead, self.stdinWrite, self.outRead, self.outWrite):
            try:
                os.close(fd)
            except OSError:
                pass

    def drain(self) -> bytes:
        """Everything in the pipe now (the editor reads)."""
        out = b""
        while True:
            try:
                data = os.read(self.outRead, 1 << 16)
            except BlockingIOError:
                return out
            if not data:
                return out
            out += data

    def test_aFrameTheEditorKeepsUpWithIsWrittenAtOnce(self) -> None:
        """No buffering and no registration with the reactor: the frame is in the pipe."""
        self.transport.writeSequence((b'{"frame":1}', b"\n"))
        self.transport.write(b'{"frame":2}\n')
        self.assertEqual(self.drain(), b'{"frame":1}\n{"frame":2}\n')
        self.assertNotIn(self.writer, self.reactor.getWriters())

    def test_whatThePipeDoesNotTakeIsBufferedInOrder(self) -> None:
        """A partial write leaves the rest in Twisted's buffer; the frames after it queue
        behind it (never overtaking), and the reactor writes them when the pipe has room."""
        big = b"a" * (self.capacity + 1000) + b"\n"
        self.transport.write(big)
        self.assertIn(self.writer, self.reactor.getWriters())
        self.transport.write(b"second\n")
        self.transport.write(b"third\n")
        received = self.drain()
        self.assertEqual(len(received), self.capacity)  # all the pipe took; the rest waits
        while self.writer in self.reactor.getWriters():
            self.assertIsNone(self.writer.doWrite())
            received += self.drain()
        self.assertEqual(received, big + b"second\nthird\n")
        self.transport.write(b"fourth\n")  # the buffer is empty again: straight to the pipe
        self.assertNotIn(self.writer, self.reactor.getWriters())
        self.assertEqual(self.drain(), b"fourth\n")

    def test_aFullPipePausesTheProducer(self) -> None:
        """EAGAIN: the frame is buffered, and past the buffer's size the producer (the
        JSON-RPC connection, which then stops reading the editor's requests) is paused."""
        producer = Producer()
        self.transport.registerProducer(producer, True)
        os.write(self.outWrite, b"x" * self.capacity)  # the editor is not reading
        frame = b"f" * 1000 + b"\n"
        for _ in range(self.writer.bufferSize // len(frame) + 2):
            self.transport.write(frame)
        self.assertGreaterEqual(producer.paused, 1)  # (Twisted tells it again at each write past the size)
        self.assertIn(self.writer, self.reactor.getWriters())

    def test_aFrameBiggerThanTheBufferPausesTheProducerAsBefore(self) -> None:
        """A frame over Twisted's buffer size goes through that buffer, even to an empty pipe:
        the producer is paused until the pipe took it, as without the direct path."""
        producer = Producer()
        self.transport.registerProducer(producer, True)
        frame = b"b" * self.writer.bufferSize + b"\n"
        self.transport.write(frame)
        self.assertEqual(producer.paused, 1)
        received = b""
        while self.writer in self.reactor.getWriters():
            self.assertIsNone(self.writer.doWrite())
            received += self.drain()
        self.assertEqual((received, producer.paused), (frame, 0))

    def test_aGoneEditorEndsTheConnectionAsBefore(self) -> None:
        """EPIPE is not swallowed: Twisted's own write meets it and reports the loss."""
        os.close(self.outRead)
        self.transport.write(b"frame\n")
        self.assertIn(self.writer, self.reactor.getWriters())
        self.assertIs(self.writer.doWrite(), main.CONNECTION_LOST)
