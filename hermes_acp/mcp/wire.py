"""JSON-RPC to one MCP server: the project's own connection, with MCP's rules.

An outgoing cancel is ``notifications/cancelled``; a line the server should
not have written (too long, not JSON) is logged and dropped, never answered;
the server's own requests (``ping``, ``roots/list``) are answered by the
handlers the link gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from ..jsonrpc import Handler, JSONRPCConnection, JSONRPCError

log = Logger()

#: How many lines from a server that are not messages are logged (a chatty server is not a flood).
STRAYS_LOGGED = 5


class TransportError(Exception):
    """A request that got no JSON-RPC answer: an HTTP error or an unreachable
    server; ``sessionLost`` when an HTTP server forgot our session."""

    def __init__(self, message: str, sessionLost: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.sessionLost = sessionLost
        self.status = status


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

    def connectionMade(self) -> None:
        """No back-pressure on the server's input: only our requests go there."""

    def cancelParams(self, requestId: int) -> dict[str, Any]:
        return {"requestId": requestId, "reason": "cancelled by the user"}

    def _closeNow(self) -> None:
        """The server closed its output: close its input, and no more. A process may
        still write its reasons to stderr and exit with a status that says more; its
        end (``RPCChild.processEnded``) closes the rest."""
        closeStdin = getattr(self.transport, "closeStdin", None)
        if closeStdin is None:
            super()._closeNow()
        else:
            closeStdin()

    def lineLengthExceeded(self, size: int) -> None:
        log.warn("MCP server {name} wrote a line of at least {size} bytes, over the {limit}-byte limit; "
                 "it was dropped", name=self.name, size=size, limit=self.maxLength)

    def _sendError(self, requestId: Any, error: JSONRPCError) -> None:
        if requestId is None:  # a line that is no message: nobody to answer
            self._strays += 1
            if self._strays <= STRAYS_LOGGED:
                log.warn("MCP server {name} wrote something that is not a JSON-RPC message ({error}){more}",
                         name=self.name, error=error.message[:200],
                         more="; more of these are not logged" if self._strays == STRAYS_LOGGED else "")
            return
        super()._sendError(requestId, error)
