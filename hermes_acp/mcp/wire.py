"""JSON-RPC to one MCP server: the project's own connection, with MCP's rules.

An outgoing cancel is ``notifications/cancelled``; a line the server should
not have written (too long, not JSON) is logged and dropped, never answered;
the server's own requests (``ping``, ``roots/list``) are answered by the
handlers the link gives. A server that asks without reading the answers
(a stdio server whose stdin is full) gets ``MAX_BACKLOG`` bytes of them
waiting at most: then ``onOverrun`` tells the link, and nothing more is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from ..jsonrpc import Handler, JSONRPCConnection, JSONRPCError

log = Logger()

#: How many lines from a server that are not messages are logged (a chatty server is not a flood).
STRAYS_LOGGED = 5
#: The most bytes of our answers to a server's requests written while it does not read them
#: (beyond the pipe and the transport's own 64 KiB); past that it is stopped.
MAX_BACKLOG = 1024 * 1024


class TransportError(Exception):
    """A request that got no JSON-RPC answer: an HTTP error or an unreachable
    server; ``sessionLost`` when an HTTP server forgot our session."""

    def __init__(self, message: str, sessionLost: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.sessionLost = sessionLost
        self.status = status
        #: An HTTP error's ``WWW-Authenticate`` values (what a 401 or 403 asks for).
        self.challenge: list[str] | None = None


class CallFailed(Exception):
    """A tool call that got no result; the message says why, for the model and the user."""


class MCPConnection(JSONRPCConnection):
    """The client end of one server's JSON-RPC stream (stdio or HTTP)."""

    cancelMethod = "notifications/cancelled"

    def __init__(self, name: str, requests: Mapping[str, Handler], notifications: Mapping[str, Handler],
                 clock: IReactorTime, maxLength: int | None = None) -> None:
        super().__init__(requests, notifications, clock, maxLength)
        self.name = name
        self._strays = 0
        #: Called once with the bytes waiting when the server is past ``MAX_BACKLOG``.
        self.onOverrun: Callable[[int], None] | None = None
        self._behind = 0
        self._lastLine = 0
        self._overrun = False

    def connectionMade(self) -> None:
        """Told (``pauseProducing``) when the server is behind on reading what we write.
        Its output is read all the same: a server must not block on us."""
        self.transport.registerProducer(self, True)

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused, self._behind = False, 0

    def sendLine(self, line: bytes) -> None:
        self._lastLine = len(line) + 1
        super().sendLine(line)

    def _write(self, message: Mapping[str, Any]) -> bool:
        """Our answers count while the server is not reading; past ``MAX_BACKLOG`` of them
        nothing more is written (the link stops the server)."""
        if self._overrun:
            return True
        written = super()._write(message)
        if self.paused and "method" not in message:
            self._behind += self._lastLine
            if self._behind > MAX_BACKLOG:
                self._overrun = True
                if self.onOverrun is not None:
                    self.onOverrun(self._behind)
        return written

    def awaiting(self, requestId: Any) -> bool:
        """Whether our request ``requestId`` still waits for its answer."""
        return requestId in self._outgoing

    def cancelParams(self, requestId: int) -> dict[str, Any]:
        return {"requestId": requestId, "reason": "cancelled by the user"}

    def _closeNow(self) -> None:
        """The server closed its output: close its input, and no more. A process may
        still write its reasons to stderr and exit with a status that says more; its
        end (``RPCChild.processEnded``) closes the rest."""
        if getattr(self.transport, "closeStdin", None) is None:
            super()._closeNow()
        else:
            self.closeInput()

    def closeInput(self) -> None:
        """Close a stdio server's stdin (its EOF). We stop being its producer first: a
        pipe that paused us would otherwise wait for us for ever before it closed."""
        self.transport.unregisterProducer()
        self.transport.closeStdin()

    def lineLengthExceeded(self, size: int) -> None:
        log.warn("MCP server {name} wrote a line of at least {size} bytes, over the {limit}-byte limit; "
                 "it was dropped", name=self.name, size=size, limit=self.maxLength)

    def _sendError(self, requestId: Any, error: JSONRPCError) -> None:
        if requestId is None:  # a line that is no message: nobody to answer
            self._stray(f"something that is not a JSON-RPC message ({error.message[:200]})")
            return
        super()._sendError(requestId, error)

    def _notificationReceived(self, method: str, params: Any) -> None:
        if params is not None and not isinstance(params, dict):
            self._stray(f"a notification {method[:100]} whose params are not an object")
            return
        super()._notificationReceived(method, params)

    def _refused(self, message: dict[str, Any], problem: Any) -> None:
        if "method" in message and "id" not in message:
            self._stray(f"a notification it cannot have meant ({str(problem)[:200]})")
            return
        super()._refused(message, problem)

    def _stray(self, what: str) -> None:
        """Logged the first few times: a server that floods them cannot flood the log."""
        self._strays += 1
        if self._strays <= STRAYS_LOGGED:
            log.warn("MCP server {name} wrote {what}; it was dropped{more}", name=self.name, what=what,
                     more="; more of these are not logged" if self._strays == STRAYS_LOGGED else "")
