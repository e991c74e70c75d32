"""The model requests' bodies through the real process: the agent keeps each history entry's
bytes and joins them, so every body must be byte for byte what a fresh encoding of the same
request gives, and must carry the history as it is after each change to it (a compaction, an
``/undo`` that cuts a turn, a ``session/load`` in a new process that has no bytes kept)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest_twisted

from hermes_acp import safejson

from .e2e import modelEnv, text
from .sdkclient import RecordingClient, connect, initialized, onLoop
from .test_e2e_compaction import summarised


def assistant(words: str) -> dict[str, Any]:
    return {"role": "assistant", "content": words}


@pytest_twisted.ensureDeferred
async def test_everyBodyIsAFreshEncodingOfTheHistoryAsItIs(scriptedServer, tmp_path: Path) -> None:
    """A read of a non-ASCII file, a turn, ``/compact``, a turn, ``/undo``, a turn, and a turn in a
    new process after ``session/load``: each body is its own compact re-encoding, and each
    request's history is the one before it as that change left it."""
    model, url = scriptedServer
    home, folder = str(tmp_path / "home"), tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("café — naïve ✓ \U0001f600\n" + "a line of notes\n" * 400, encoding="utf-8")
    model.addRule("read it", [[{"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}]}],
                              [{"text": "read ✓"}]])
    for n in range(1, 5):
        model.addRule(f"question {n}", [[{"text": f"answer {n} ü " + "y" * 2000}]])
    env = modelEnv(url, home, HERMES_ACP_CHECKPOINTS="off")

    async def prompt(conn: Any, sid: str, words: str) -> str:
        return (await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(words)]), 30)).stop_reason

    async def scenario() -> str:
        async with connect(RecordingClient(), env=env) as (conn, _, wire, _p):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            for words in ("read it", "question 1", "/compact", "question 2", "/undo", "question 3"):
                assert await prompt(conn, sid, words) == "end_turn", words
            assert wire.problems() == []
        async with connect(RecordingClient(), env=env) as (conn, _, wire, _p):  # no bytes kept in this one
            await initialized(conn)
            await asyncio.wait_for(conn.load_session(session_id=sid, cwd=str(folder), mcp_servers=[]), 30)
            assert await prompt(conn, sid, "question 4") == "end_turn"
            assert wire.problems() == []
        return sid

    await onLoop(scenario())
    bodies = [(r.raw, r.body) for r in model.chatRecords]
    assert len(bodies) == 6
    for raw, body in bodies:
        assert raw == safejson.encode(body)
    read, afterRead, first, second, third, fourth = (body["messages"] for _, body in bodies)
    assert read[-1]["content"] == "read it" and "café — naïve ✓ \U0001f600" in afterRead[-1]["content"]
    # A plain turn: the last request's history, the answer, the new prompt.
    assert first[:-1] == afterRead + [assistant("read ✓")]
    # After /compact: the summary joins the system prompt; the history it replaced is gone.
    assert summarised(second) and not any(m["role"] == "tool" or m.get("content") == "read it" for m in second)
    # /undo cut "question 2": the next request carries the history from before it.
    assert third[:-1] == second[:-1] and third[-1]["content"] == "question 3"
    # A new process, from the store: the same history, and the answer to "question 3".
    assert fourth[:-1] == third + [assistant("answer 3 ü " + "y" * 2000)] and fourth[-1]["content"] == "question 4"
