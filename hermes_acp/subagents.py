"""How the editor sees ``delegate_task``'s children (``engine.subagents``).

A turn shows each child as a card of its own (its answer as content) under the parent's call, and
each of the child's tool calls as an ordinary card titled with the child's name; every one of
these updates carries ``_meta.hermesAcp.subagent``: the child's session id and name, the parent
call's ``toolCallId``, and its ``role`` (``child``: the child's own card; ``call``: one of its tool
calls). That card form is what the journal keeps and what an editor without the ``subagents``
capability gets.

An editor that advertises ``clientCapabilities.subagents`` (unstable ACP) gets the other form,
made here from the same updates (``SubagentView.shown``), live and on replay: the child is
announced with ``subagent_update`` on the parent (before anything names it), its task and its
result are ``session_message``s between the two sessions, its answer is ``agent_message_chunk``s
and its tool calls are cards, both under the child's session id, and its end is a
``subagent_update`` to ``idle``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .render import CONTENT_LIMIT, textContent, truncateMiddle

META = "hermesAcp"
CHILD, CALL, TEXT = "child", "call", "text"
#: Children a connection remembers having announced (the oldest are forgotten past it; one
#: announced again is merely announced twice).
MAX_ANNOUNCED = 4096


def tagOf(update: dict[str, Any]) -> dict[str, Any] | None:
    """The subagent tag of an update, or None for the parent's own."""
    meta = update.get("_meta")
    ours = meta.get(META) if isinstance(meta, dict) else None
    tag = ours.get("subagent") if isinstance(ours, dict) else None
    return tag if isinstance(tag, dict) and isinstance(tag.get("sessionId"), str) else None


def tagged(update: dict[str, Any], tag: dict[str, Any], title: bool = False) -> dict[str, Any]:
    """``update`` with the tag in its ``_meta`` (and its title led by the child's name)."""
    meta = update.get("_meta") or {}
    ours = meta.get(META) if isinstance(meta.get(META), dict) else {}
    update = {**update, "_meta": {**meta, META: {**ours, "subagent": tag}}}  # a background card keeps its own tag
    if title and isinstance(update.get("title"), str):
        update["title"] = f"{tag['name']}: {update['title']}"
    return update


def childStarted(toolCallId: str, tag: dict[str, Any], goal: str) -> dict[str, Any]:
    """The child's own card, as it starts."""
    return tagged({"sessionUpdate": "tool_call", "toolCallId": toolCallId, "title": f"{tag['name']}: {_line(goal)}",
                   "kind": "think", "status": "in_progress", "rawInput": {"goal": goal}},
                  {**tag, "role": CHILD, "goal": truncateMiddle(goal, 2000)})


def childText(toolCallId: str, tag: dict[str, Any], text: str) -> dict[str, Any]:
    """The child's answer so far, in its card (live only: the end carries it all)."""
    return tagged({"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                   "content": [textContent(truncateMiddle(text, CONTENT_LIMIT))]}, {**tag, "role": CHILD})


def childChunk(tag: dict[str, Any], text: str) -> dict[str, Any]:
    """A piece of the child's answer, for an editor that shows the child as a session."""
    return tagged({"sessionUpdate": "agent_message_chunk", "messageId": f"{tag['sessionId']}-answer",
                   "content": {"type": "text", "text": text}}, {**tag, "role": TEXT})


def childEnded(toolCallId: str, tag: dict[str, Any], status: str, text: str, summary: str) -> dict[str, Any]:
    """The child's card at its end: its answer (or why it failed)."""
    shown = truncateMiddle(text.strip(), CONTENT_LIMIT) or "_No answer._"
    if status != "completed":
        shown += f"\n\n_{'Interrupted' if status == 'interrupted' else 'Failed'}: {_line(summary, 500)}_"
    return tagged({"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                   "status": "completed" if status == "completed" else "failed", "content": [textContent(shown)]},
                  {**tag, "role": CHILD, "state": status})


def progress(done: int, running: int, total: int) -> str:
    waiting = max(0, total - done - running)
    return f"Subagents: {done} of {total} done, {running} running" + (f", {waiting} waiting" if waiting else "")


def _line(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


@attrs.define(eq=False)
class ChildCards:
    """One turn's children of ``delegate_task`` as cards: their tags, their answers so far, the
    progress on the parent's card, and their transcripts (``asides``) for the store.

    ``send(update, journal)`` sends on the parent's session; ``cards`` is the turn's own table of
    open cards (engine call id -> toolCallId, name, arguments), where each child's card joins the
    others so that the turn's end closes it like any; ``live`` is whether the editor takes
    ``subagents`` (then the answer goes as chunks of the child's session)."""

    sessionId: str
    send: Callable[[dict[str, Any], bool], None]
    cards: dict[str, tuple[str, str, dict[str, Any]]]
    live: bool = False
    #: toolCallId -> its tag, for every open card of a child (its own, its calls').
    tags: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: "CALLID/CHILD" -> (its card's toolCallId, its tag, its answer so far).
    children: dict[str, tuple[str, dict[str, Any], list[str]]] = attrs.field(factory=dict)
    #: The delegate call's id -> [children ended, children started].
    counts: dict[str, list[int]] = attrs.field(factory=dict)
    asides: list[dict[str, Any]] = attrs.field(factory=list)

    def tagged(self, update: dict[str, Any], title: bool = False) -> dict[str, Any]:
        """``update`` as sent: tagged when the card is a child's."""
        tag = self.tags.get(update.get("toolCallId", ""))
        return update if tag is None else tagged(update, tag, title)

    def callStarted(self, toolCallId: str, extras: dict[str, Any]) -> None:
        """A call starts; a child's (``extras["subagent"]``) is tagged with its child."""
        child = extras.get("subagent")
        parent = self.cards.get(child.get("parentCallId", "")) if isinstance(child, dict) else None
        if isinstance(child, dict) and parent is not None:
            self.tags[toolCallId] = {**self._tag(parent[0], child["child"], child["name"]), "role": CALL}

    def callEnded(self, toolCallId: str, name: str, extras: dict[str, Any]) -> dict[str, Any]:
        """A call ended: the extras its card shows (a delegate call's transcripts are kept aside)."""
        transcripts = extras.get("transcripts") if name == "delegate_task" else None
        if isinstance(transcripts, list):
            extras = {k: v for k, v in extras.items() if k != "transcripts"}
            self.asides += [m for t in transcripts if isinstance(t, dict)
                            for m in t.get("messages", ()) if isinstance(m, dict)]
        return extras

    def forget(self, toolCallId: str) -> bool:
        """The card is closed; whether it was a child's."""
        return self.tags.pop(toolCallId, None) is not None

    def _tag(self, parentToolCallId: str, child: int, name: str) -> dict[str, Any]:
        return {"sessionId": f"{self.sessionId}-{parentToolCallId}-{child}", "name": name,
                "parentToolCallId": parentToolCallId}

    def started(self, callId: str, child: int, name: str, goal: str) -> None:
        """A child of the delegate call ``callId`` starts: its card, and the call's progress."""
        parent = self.cards.get(callId)
        if parent is None:
            return
        toolCallId = f"{parent[0]}/{child}"
        tag = self._tag(parent[0], child, name)
        update = childStarted(toolCallId, tag, goal)
        self.tags[toolCallId] = tagOf(update) or tag
        self.children[f"{callId}/{child}"] = (toolCallId, tag, [])
        self.cards[f"{callId}/{child}"] = (toolCallId, "subagent", {"goal": goal})
        self.send(update, True)
        self.counts.setdefault(callId, [0, 0])[1] += 1
        self._progress(callId)

    def text(self, callId: str, child: int, delta: str) -> None:
        """A piece of a child's answer: a chunk of the child's session for an editor that shows
        children so, else the card's content so far (not journaled: its end carries it)."""
        entry = self.children.get(f"{callId}/{child}")
        if entry is None or not delta:
            return
        toolCallId, tag, parts = entry
        if sum(map(len, parts)) < 4 * CONTENT_LIMIT:
            parts.append(delta)
        self.send(childChunk(tag, delta) if self.live else childText(toolCallId, tag, "".join(parts)), False)

    def ended(self, callId: str, child: int, status: str, summary: str) -> None:
        entry = self.children.pop(f"{callId}/{child}", None)
        self.cards.pop(f"{callId}/{child}", None)
        if entry is None:
            return
        toolCallId, tag, parts = entry
        self.tags.pop(toolCallId, None)
        self.send(childEnded(toolCallId, tag, status, "".join(parts), summary), True)
        self.counts.setdefault(callId, [0, 0])[0] += 1
        self._progress(callId)

    def _progress(self, callId: str) -> None:
        """The delegate call's card says how many children are done, running and waiting."""
        card = self.cards.get(callId)
        if card is None:
            return
        done, started = self.counts.get(callId, [0, 0])
        tasks = card[2].get("tasks")
        total = len(tasks) if isinstance(tasks, list) and tasks else 1
        self.send(self.tagged({"sessionUpdate": "tool_call_update", "toolCallId": card[0], "status": "in_progress",
                               "content": [textContent(progress(done, started - done, total))]}), False)

    def clear(self) -> None:
        self.tags.clear()
        self.children.clear()


@attrs.define(eq=False)
class SubagentView:
    """One connection's rendering of child updates for an editor with ``subagents``."""

    announced: dict[str, None] = attrs.field(factory=dict)

    def shown(self, sessionId: str, update: dict[str, Any], replaying: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """``(sessionId, update)`` pairs to send for ``update`` of session ``sessionId``."""
        tag = tagOf(update)
        if tag is None:
            return [(sessionId, update)]
        child = tag["sessionId"]
        sent: list[tuple[str, dict[str, Any]]] = []
        if child not in self.announced:
            self._remember(child)
            announce: dict[str, Any] = {"sessionUpdate": "subagent_update", "sessionId": child,
                                        "title": str(tag.get("name", "Subagent")), "state": {"state": "running"}}
            if isinstance(tag.get("goal"), str):
                announce["description"] = tag["goal"]
            sent.append((sessionId, announce))
        role, kind = tag.get("role"), update.get("sessionUpdate")
        if role == CALL:
            sent.append((child, update))
        elif role == TEXT:
            sent.append((child, update))
        elif kind == "tool_call":  # the child's card starts: its task, sent to it
            sent.append((sessionId, _message(f"{child}-task", sessionId, child, str(tag.get("goal", "")))))
        elif update.get("status") in ("completed", "failed"):  # the child's end
            text = _text(update)
            if replaying and text:  # live, its answer came as chunks
                sent.append((child, childChunk(tag, text)))
            sent.append((sessionId, _message(f"{child}-result", child, sessionId, text)))
            state: dict[str, Any] = {"state": "idle"}
            if tag.get("state") in ("completed", "interrupted"):
                state["stopReason"] = "end_turn" if tag["state"] == "completed" else "cancelled"
            sent.append((sessionId, {"sessionUpdate": "subagent_update", "sessionId": child, "state": state}))
        return sent  # a live update of the card's text: the chunks said it

    def _remember(self, child: str) -> None:
        self.announced[child] = None
        if len(self.announced) > MAX_ANNOUNCED:
            del self.announced[next(iter(self.announced))]


def _message(messageId: str, sender: str, recipient: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": "session_message", "messageId": messageId, "senderSessionId": sender,
            "recipientSessionId": recipient, "content": [{"type": "text", "text": text}]}


def _text(update: dict[str, Any]) -> str:
    content = update.get("content")
    if not isinstance(content, list):
        return ""
    return "\n\n".join(item["content"].get("text", "") for item in content
                       if isinstance(item, dict) and isinstance(item.get("content"), dict))
