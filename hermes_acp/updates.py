"""``session/update`` to the editor, and into the journal that ``session/load`` replays.

A compaction has two forms: ``compaction_update`` (and ``compaction_summary_chunk``) for editors
that advertise ``session.compaction``, else a "Compact conversation" tool card of kind ``think``
with the summary as its content, as codex-acp and the Claude adapter show it. The journal keeps
the card (tagged in ``_meta``, its id ``compaction-…``), so that a crash's recovery fails it like
any open card, and a replay turns it into the form the *loading* editor takes.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import implementer

from . import safejson
from .catalog import ModelCatalog
from .client import ClientInfo
from .render import textContent
from .interfaces import ISessionStore, IUpdateChannel
from .jsonrpc import JSONRPCConnection
from .session_state import SessionState
from .subagents import SubagentView

log = Logger()


@implementer(IUpdateChannel)
@attrs.define(eq=False)
class UpdateChannel:
    """One connection's updates for all its sessions."""

    connection: JSONRPCConnection
    store: ISessionStore
    client: ClientInfo
    #: How children of ``delegate_task`` are shown to an editor with ``subagents``.
    subagents: SubagentView = attrs.field(factory=SubagentView)
    #: The start of a session's ``session/update`` params, by session id (``send``).
    _heads: dict[str, bytes] = attrs.field(factory=dict, init=False)

    @property
    def paused(self) -> bool:
        return self.connection.paused

    def send(self, state: SessionState, update: dict[str, Any], journal: bool = True) -> None:
        """Show ``update`` and journal it, encoded once: the frame carries those bytes and the
        journal keeps the same text (``safejson.Encoded``)."""
        encoded = None if self.client.subagents and "_meta" in update else self._encoded(state, update)
        if encoded is None:  # a child's update (shown in its own form), or one with no JSON form
            self._show(state, update)
        if journal:
            self.store.journalUpdate(state, update if encoded is None else encoded)

    def _encoded(self, state: SessionState, update: dict[str, Any]) -> safejson.Encoded | None:
        """Send ``update`` as ``_show`` would, from one encoding of it; None when it has none
        (``_show`` then logs and drops it, and the journal heals what it can)."""
        try:
            encoded = safejson.Encoded(update, safejson.encode(update))
        except (TypeError, ValueError, RecursionError):
            return None
        head = self._head(state)
        self.connection.notifyEncoded("session/update", head + encoded.data + b"}",
                                      lambda: {"sessionId": state.sessionId, "update": update})
        return encoded

    def notice(self, state: SessionState, severity: str, title: str, description: str, journal: bool = True) -> None:
        if self.client.notices:
            update = {"sessionUpdate": "notice", "severity": severity, "title": title, "description": description}
        else:
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"_{title}: {description}_\n\n"}}
        self.send(state, update, journal=journal)

    def compaction(self, state: SessionState, compactionId: str, status: str, text: str = "") -> None:
        card = compactionCard(compactionId, status, text)
        if self.client.compaction:
            self.send(state, compactionUpdate(card), journal=False)
            self.store.journalUpdate(state, card)
        else:
            self.send(state, card)

    def compactionChunk(self, state: SessionState, compactionId: str, text: str) -> None:
        if self.client.compaction and text:
            update = {"sessionUpdate": "compaction_summary_chunk", "compactionId": compactionId,
                      "content": {"type": "text", "text": text}}
            self.send(state, update, journal=False)

    def replay(self, state: SessionState, update: dict[str, Any]) -> None:
        shown = withoutEditorTerminals(update)
        if shown is not update and shown.keys() <= {"sessionUpdate", "toolCallId"}:
            return  # it only showed a terminal
        self._show(state, compactionUpdate(shown) if self.client.compaction and isCompactionCard(shown) else shown,
                   replaying=True)

    def replayRows(self, state: SessionState, rows: list[tuple[int, bytes, bool, bool]]) -> list[dict[str, Any]]:
        """Send journal rows again (``session/load``), from their stored text: (seq, the
        update's JSON text, whether the row is sound, whether it holds one of
        ``REPLAY_MARKS``; ``SessionDB.journalTexts``). A sound row without a mark is one
        ``replay`` would not change: it goes out as it is, in a frame built around it, with
        no decoding and no encoding (the text is what the update was first sent as), a
        batch of such frames in one write. Any other row is decoded (healed) and sent
        through ``replay``; a row that is not an update at all is logged and left out.
        Returns the updates decoded."""
        prefix = _REPLAY_HEAD + self._head(state)
        if all(sound and not marked for _, _, sound, marked in rows):  # the common case: the batch as it is
            self.connection.writeLines(prefix + (b"}}\n" + prefix).join(text for _, text, _, _ in rows) + b"}}\n",
                                       len(rows))
            return []
        decoded: list[dict[str, Any]] = []
        kept: list[bytes] = []
        for _, text, sound, marked in rows:
            if sound and not marked:
                kept.append(text)
                continue
            if kept:
                self.connection.writeLines(prefix + (b"}}\n" + prefix).join(kept) + b"}}\n", len(kept))
                kept = []
            try:
                update = safejson.loads(text.decode("utf-8", "replace"))
            except ValueError:
                update = None
            if not (isinstance(update, dict) and isinstance(update.get("sessionUpdate"), str)):
                log.warn("session {id}: a damaged journal row is not replayed: {text!r:.200}",
                         id=state.sessionId, text=text)
                continue
            self.replay(state, update)
            decoded.append(update)
        if kept:
            self.connection.writeLines(prefix + (b"}}\n" + prefix).join(kept) + b"}}\n", len(kept))
        return decoded

    def _head(self, state: SessionState) -> bytes:
        """The start of a ``session/update``'s params for ``state``'s session, up to its update."""
        head = self._heads.get(state.sessionId)
        if head is None:
            if len(self._heads) > 1024:
                self._heads.clear()
            head = self._heads[state.sessionId] = b'{"sessionId":' + safejson.encode(state.sessionId) + b',"update":'
        return head

    def _show(self, state: SessionState, update: dict[str, Any], replaying: bool = False) -> None:
        if self.client.subagents and "_meta" in update:  # a child's, maybe: in its session's form
            for sessionId, shown in self.subagents.shown(state.sessionId, update, replaying):
                self.connection.notify("session/update", {"sessionId": sessionId, "update": shown})
        else:
            self.connection.notify("session/update", {"sessionId": state.sessionId, "update": update})

    def whenWritable(self) -> Deferred[None]:
        return self.connection.whenWritable()



#: A ``session/update`` frame up to its params (``JSONRPCConnection.notifyEncoded``'s).
_REPLAY_HEAD = b'{"jsonrpc":"2.0","method":' + safejson.encode("session/update") + b',"params":'
#: What ``replay`` may change in a stored update, as it shows in the update's text: a
#: child's or a background card's ``_meta``, an editor terminal, a compaction card. A row
#: with none of them can be replayed as it is (``replayRows``). (A lone surrogate, which
#: ``safejson`` repairs, is never in a stored text: every row is written through
#: ``safejson``, and the store's migration to v6 healed older rows.)
REPLAY_MARKS = ('"_meta"', '"terminal"', '"compaction-')


def withoutEditorTerminals(update: dict[str, Any]) -> dict[str, Any]:
    """``update`` without the editor terminals its content embeds. A terminal lives only as
    long as the agent that created it: replayed after a restart its id names nothing, and
    Zed drops a whole update that names an unknown terminal (zed#64538). What the terminal
    showed is not lost: a command's final update carries its output as text beside it."""
    content = update.get("content")
    if not isinstance(content, list) or not any(_isTerminal(item) for item in content):
        return update
    kept = [item for item in content if not _isTerminal(item)]
    return {**{k: v for k, v in update.items() if k != "content"}, **({"content": kept} if kept else {})}


def _isTerminal(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "terminal"


def usageUpdate(state: SessionState, catalog: ModelCatalog) -> dict[str, Any]:
    """``usage_update``: the context used of the session's model's window, and the cost
    where the endpoint told it."""
    update: dict[str, Any] = {"sessionUpdate": "usage_update", "used": state.contextUsed,
                              "size": catalog.window(state.model)}
    if state.cost is not None:
        update["cost"] = {"amount": round(state.cost, 6), "currency": "USD"}
    return update


COMPACTION_TITLE = "Compact conversation"
_CARD_PREFIX = "compaction-"


def compactionCard(compactionId: str, status: str, text: str = "") -> dict[str, Any]:
    """The card form of a compaction's start ("in_progress") or end."""
    meta = {"hermesAcp": {"compactionId": compactionId, "status": status}}
    toolCallId = _CARD_PREFIX + compactionId
    if status == "in_progress":
        return {"sessionUpdate": "tool_call", "toolCallId": toolCallId, "title": COMPACTION_TITLE, "kind": "think",
                "status": "in_progress", "_meta": meta}
    return {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
            "status": "completed" if status == "completed" else "failed",
            "content": [textContent(text or status)], "_meta": meta}


def isCompactionCard(update: dict[str, Any]) -> bool:
    return (update.get("sessionUpdate") in ("tool_call", "tool_call_update")
            and str(update.get("toolCallId", "")).startswith(_CARD_PREFIX))


def compactionUpdate(card: dict[str, Any]) -> dict[str, Any]:
    """A compaction card as ``compaction_update``. A failed update without our tag is the
    recovery's, after a crash mid-compaction."""
    compactionId = card["toolCallId"].removeprefix(_CARD_PREFIX)
    meta = card.get("_meta")
    tagged = meta.get("hermesAcp") if isinstance(meta, dict) else None
    status = tagged.get("status") if isinstance(tagged, dict) else card.get("status")
    update: dict[str, Any] = {"sessionUpdate": "compaction_update", "compactionId": compactionId,
                              "status": status if status in ("in_progress", "completed", "cancelled") else "failed"}
    content = card.get("content")
    text = next((c["content"].get("text", "") for c in content if isinstance(c, dict) and isinstance(c.get("content"), dict)),
                "") if isinstance(content, list) else ""
    if update["status"] == "completed":
        update["summary"] = [{"type": "text", "text": text}]
    elif update["status"] != "in_progress":
        update["summary"] = None  # clears what streamed: a summary only with "completed"
        if update["status"] == "failed":
            update["error"] = text or "the compaction did not finish"
    return update
