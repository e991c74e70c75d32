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
    update = {**update, "_meta": {**(update.get("_meta") or {}), META: {"subagent": tag}}}
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
