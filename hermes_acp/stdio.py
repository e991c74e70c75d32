"""Own the process's stdin and stdout for the protocol, and nothing else.

``claimStdio`` moves the protocol onto private, non-inheritable duplicates
of fds 0 and 1, then points fd 1 at stderr and fd 0 at ``/dev/null``. After it,
a stray ``print``, a C extension, ``twist``'s own log file or a child process
writes to stderr and reads nothing, and only protocol frames reach the real
stdout.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import sys
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.logger import Logger

log = Logger()


@attrs.frozen
class StdioFDs:
    stdin: int
    stdout: int


def claimStdio() -> StdioFDs:
    """Take fds 0 and 1 for the protocol; idempotent per process."""
    global _claimed
    if _claimed is None:
        sys.stdout.flush()
        protocolIn = os.dup(0)  # os.dup makes non-inheritable fds (PEP 446)
        protocolOut = os.dup(1)
        os.dup2(2, 1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        _claimed = StdioFDs(protocolIn, protocolOut)
    return _claimed


_claimed: StdioFDs | None = None


#: A pipe's writer closed (POLLHUP), or a socket's peer shut down its writing half
#: (POLLRDHUP, Linux): libuv-based clients (Node, the TypeScript SDK) give children
#: socketpairs, and their ``stdin.end()`` is a half-close.
_HANGUP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


def hungUp(fd: int) -> bool:
    """Whether the writer of ``fd`` has closed it, without reading."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | getattr(select, "POLLRDHUP", 0))
    return any(events & _HANGUP for _, events in poller.poll(0))


@functools.cache
def directStandardIO() -> type:
    """``StandardIO`` whose writes go straight to stdout while nothing is buffered.

    Twisted buffers every write and registers stdout with the reactor for it, then writes in
    the reactor's next iteration and unregisters: two ``epoll_ctl`` calls and a whole extra
    iteration for each streamed ``session/update`` frame (docs/performance.md, "Streamed
    frames"). While the editor keeps up, its pipe takes a frame at once: one ``write``. What
    the pipe does not take (a partial write, ``EAGAIN``), and every write while anything is
    buffered, goes through Twisted's buffer as before, so frames keep their order and the
    buffer still pauses the producer (the editor is behind: we stop reading its requests). So
    does a frame bigger than the buffer (a batch of a fast stream): Twisted pauses the producer
    for it at once, until the pipe took it, and the turn's text waits meanwhile; written
    directly, it would leave that much more queued ahead of a cancel's answer. Any other error
    is left for Twisted's own write to meet and report (the editor is gone)."""

    from twisted.internet.stdio import StandardIO

    class DirectStandardIO(StandardIO):
        def write(self, data: bytes) -> None:
            writer = getattr(self, "_writer", None)  # (posix: a ProcessWriter)
            if writer is not None and data and len(data) <= writer.bufferSize and _idle(writer):
                try:
                    written = os.write(writer.fd, data)
                except OSError as e:  # (BlockingIOError: the pipe is full)
                    if e.errno not in (errno.EAGAIN, errno.EINTR):
                        writer.write(data)  # its own write meets the error and ends the connection
                        return
                    written = 0
                if written == len(data):
                    return
                data = data[written:]
            super().write(data)

        def writeSequence(self, data: Iterable[bytes]) -> None:
            self.write(b"".join(data))

    return DirectStandardIO


def _idle(writer: Any) -> bool:
    """Whether a Twisted ``FileDescriptor`` writer holds nothing to write and takes writes
    (not closing): then a write of ours cannot overtake one of its. Its buffer is private
    state; a Twisted without it is always treated as busy (every write buffered, as before)."""
    try:
        return (writer.connected and not writer.disconnecting and not writer._writeDisconnecting
                and not writer._writeDisconnected and not writer._tempDataLen
                and writer.offset >= len(writer.dataBuffer))
    except AttributeError:
        return False


class StdioService(Service):
    """Connects one protocol to the claimed stdio when the service starts.

    ``onDone`` runs once the connection is gone (stdin EOF or a write error):
    the entry point stops the reactor there, never right after a write.
    """

    def __init__(
        self,
        protocolFactory: Callable[[], Protocol],
        onDone: Callable[[], None],
        reactor: object = None,
    ) -> None:
        self.protocolFactory = protocolFactory
        self.onDone = onDone
        self.reactor = reactor
        self.protocol: Protocol | None = None

    def startService(self) -> None:
        fds = claimStdio()
        Service.startService(self)
        self.protocol = self.protocolFactory()
        if hasattr(self.protocol, "inputHungUp"):
            self.protocol.inputHungUp = lambda: hungUp(fds.stdin)
        directStandardIO()(self.protocol, stdin=fds.stdin, stdout=fds.stdout, reactor=self.reactor)
        done: Deferred[None] = self.protocol.whenDone()  # type: ignore[attr-defined]
        done.addCallback(lambda _: self.onDone())

    def stopService(self) -> None:
        Service.stopService(self)
        transport = getattr(self.protocol, "transport", None)
        if transport is not None:
            transport.loseConnection()
