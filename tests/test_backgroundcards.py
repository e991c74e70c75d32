"""What a load keeps of a journal's background cards: one entry per card left open, not the
updates that went by. A session that delegated a lot has every one of its children's updates
tagged in ``_meta``, so a load decodes them all; it must let each go once seen."""

from __future__ import annotations

import gc
import tempfile
import tracemalloc
from collections.abc import Iterator
from itertools import chain
from typing import Any

import pytest_twisted

from hermes_acp.backgroundcards import LOST, ReplayedCards, backgroundMeta
from hermes_acp.render import textContent
from hermes_acp.subagents import CALL, tagged

from .test_turn_paths import Harness, WatchedTransport, sessionOn

CHILD = {"sessionId": "s-d-1", "name": "Subagent 1", "parentToolCallId": "d"}
FILLER = b"filler-"


def started(processId: str, toolCallId: str, child: dict[str, Any] | None = None) -> dict[str, Any]:
    """A background card's start as ``BackgroundCards.adopt`` journals it (a child's: tagged)."""
    snapshot = {"processId": processId, "number": int(processId[1:]), "command": f"serve {processId}", "pid": 1}
    update = {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId, "status": "in_progress",
              "content": [textContent("Running in the background")], "rawOutput": {"processId": processId, "pid": 1},
              "_meta": backgroundMeta(snapshot, "running")}
    return update if child is None else tagged(update, {**child, "role": CALL})


def ended(processId: str, toolCallId: str, status: str = "exited") -> dict[str, Any]:
    """Its end (``exited``), or its failure at an earlier load (``lost``)."""
    return {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId, "status": "failed",
            "content": [textContent("exit code 1")], "_meta": backgroundMeta({"processId": processId}, status)}


def childCalls(start: int, count: int, size: int) -> Iterator[dict[str, Any]]:
    """A child's tool calls as the journal keeps them, made one at a time: each update tagged,
    each call's end with ``size`` characters of output."""
    tag, filler = {**CHILD, "role": CALL}, FILLER.decode()
    for index in range(start, start + count):
        yield tagged({"sessionUpdate": "tool_call", "toolCallId": f"c{index}", "title": f"read_file {filler}{index}",
                      "kind": "read", "status": "in_progress"}, tag)
        yield tagged({"sessionUpdate": "tool_call_update", "toolCallId": f"c{index}", "status": "completed",
                      "content": [textContent(f"{filler}{index} " + "x" * size)]}, tag)


def journal(calls: int, size: int) -> Iterator[dict[str, Any]]:
    """A parent's card that ends, a child's card left running (its process ended with the
    agent), a card an earlier load failed, and between them ``calls`` calls of the child."""
    return chain(
        [started("p1", "b1")], childCalls(0, calls // 2, size),
        [started("p2", "b2", CHILD), ended("p1", "b1"), started("p3", "b3")],
        childCalls(calls // 2, calls - calls // 2, size),
        [ended("p3", "b3", "lost")],
    )  # fmt: skip


def expectedOpen() -> dict[str, Any]:
    card = started("p2", "b2", CHILD)["_meta"]["hermesAcp"]
    return {"p2": ("b2", card["background"], card["subagent"])}


def test_aReplayKeepsOneEntryPerOpenCardNotOnePerUpdate() -> None:
    """16 MB of a child's updates go by: what is kept is the one card left open (with its
    child's tag, for its failure to go where the card is), kilobytes, not the megabytes."""
    cards = ReplayedCards()
    gc.collect()
    tracemalloc.start()
    try:
        cards.see(journal(2000, 8000))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert cards.open == expectedOpen()
    assert held < 1024 * 1024, f"{held} bytes held after the replay"


def test_cardsKeepTheirOrderOfStart() -> None:
    """``loaded`` fails the open cards in the order they started, as the journal showed them."""
    cards = ReplayedCards()
    cards.see([started("p1", "b1"), started("p2", "b2"), started("p3", "b3"), ended("p2", "b2"),
               started("p1", "b1")])
    cards.see([{"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}},
               started("p4", "b4")])
    assert [(processId, toolCallId) for processId, (toolCallId, _, _) in cards.open.items()] == [
        ("p1", "b1"), ("p3", "b3"), ("p4", "b4")]


class ReplayDropped(WatchedTransport):
    """Keeps the frames it is written but the lines holding ``FILLER`` (counted), so that a
    long replay's frames do not pile up in the test's own memory."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def write(self, data: bytes) -> None:
        *lines, rest = data.split(b"\n")
        kept = [line + b"\n" for line in lines if FILLER not in line]
        self.dropped += len(lines) - len(kept)
        super().write(b"".join(kept) + rest)


@pytest_twisted.ensureDeferred
async def test_aLoadHoldsTheOpenCardsNotTheChildsUpdates() -> None:
    """Through ``session/load``: a journal of 19 MB of a child's tagged updates is replayed
    whole, the card the child left running fails (tagged with its child, as it was shown)
    and the model will be told, and the load's memory at its peak is a few batches of rows,
    not the journal (every update with a ``_meta`` was kept until the load's end before)."""
    calls, size = 800, 24000
    h = Harness(lambda *args: None, transport=ReplayDropped())
    try:
        sessionId = await sessionOn(h)
        state = h.sessions.sessions[sessionId]
        for update in journal(calls, size):
            h.sessions.journalUpdate(state, update)
        assert await h.sessions.flush(state) is None
        mark = len(h.frames())
        gc.collect()
        tracemalloc.start()
        try:
            load = h.send("session/load", {"sessionId": sessionId, "cwd": tempfile.gettempdir(), "mcpServers": []})
            await h.answer(load, timeout=60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        told = h.server.background.forSession(sessionId).endedNote()
        frames = h.frames()[mark:]
    finally:
        await h.stop()
    assert h.transport.dropped == 2 * calls  # every update of the child was replayed
    cards = [f["params"]["update"] for f in frames
             if f.get("method") == "session/update" and "background" in str(f["params"]["update"].get("_meta"))]
    assert [u["toolCallId"] for u in cards] == ["b1", "b2", "b1", "b3", "b3", "b2"]  # replayed, then b2's failure
    lost = cards[-1]
    assert lost["status"] == "failed" and LOST in str(lost["content"])
    assert lost["_meta"]["hermesAcp"]["subagent"] == {**CHILD, "role": CALL}
    assert lost["_meta"]["hermesAcp"]["background"]["status"] == "lost"
    assert told is not None and "p2" in told and "serve p2" in told and "p1" not in told and "p3" not in told
    assert h.problems() == []
    assert peak < 8 * 1024 * 1024, f"the load's peak was {peak} bytes, for a journal of {calls * size} bytes"
