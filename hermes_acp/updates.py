"""``session/update`` to the editor, and into the journal that ``session/load`` replays."""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred
from zope.interface import implementer

from .client import ClientInfo
from .interfaces import ISessionStore, IUpdateChannel
from .jsonrpc import JSONRPCConnection
from .session_state import SessionState


@implementer(IUpdateChannel)
@attrs.define(eq=False)
class UpdateChannel:
    """One connection's updates for all its sessions."""

    connection: JSONRPCConnection
    store: ISessionStore
    client: ClientInfo

    @property
    def paused(self) -> bool:
        return self.connection.paused

    def send(self, state: SessionState, update: dict[str, Any], journal: bool = True) -> None:
        self.connection.notify("session/update", {"sessionId": state.sessionId, "update": update})
        if journal:
            self.store.journalUpdate(state, update)

    def notice(self, state: SessionState, severity: str, title: str, description: str, journal: bool = True) -> None:
        if self.client.notices:
            update = {"sessionUpdate": "notice", "severity": severity, "title": title, "description": description}
        else:
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"_{title}: {description}_\n\n"}}
        self.send(state, update, journal=journal)

    def whenWritable(self) -> Deferred[None]:
        return self.connection.whenWritable()

