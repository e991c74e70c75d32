"""A child process that speaks JSON-RPC on its stdin and stdout: the agent
under ``hermes-acp prompt``, and every stdio MCP server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from .oneshot import OneShot


class RPCChild(ProcessProtocol):
    """Puts a JSON-RPC connection on a child's stdin and stdout; its stderr goes to ``onStderr``."""

    def __init__(self, connection: Any, onStderr: Callable[[bytes], None]) -> None:
        self.connection = connection
        self.onStderr = onStderr
        self.status: Failure | None = None
        self._ended: OneShot[None] = OneShot()

    def connectionMade(self) -> None:
        self.connection.makeConnection(self.transport)

    def outReceived(self, data: bytes) -> None:
        self.connection.dataReceived(data)

    def errReceived(self, data: bytes) -> None:
        self.onStderr(data)

    def outConnectionLost(self) -> None:
        self.connection.readConnectionLost()

    def processEnded(self, reason: Failure) -> None:
        self.status = reason
        self.connection.connectionLost(reason)
        self._ended.fire(None)

    @property
    def ended(self) -> bool:
        return self.status is not None

    def whenEnded(self) -> Deferred[None]:
        return self._ended.when()

    def describeEnd(self) -> str:
        value = self.status.value if self.status is not None else None
        if getattr(value, "signal", None):
            return f"killed by signal {value.signal}"  # type: ignore[union-attr]
        return f"exit status {getattr(value, 'exitCode', None)}"
