"""Prompt turns end to end: the real process, the SDK client, a scripted model."""

from __future__ import annotations

import pytest_twisted

from .e2e import agentText, modelEnv, text, toolCalls, updates
from .sdkclient import connect, initialized, onLoop


@pytest_twisted.ensureDeferred
async def test_textTurn(scriptedServer, tmp_path) -> None:
    """A plain answer streams as agent_message_chunk; the turn ends with usage,
    a title and stopReason end_turn; every frame validates."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Hello"}, {"text": " world"}, {"usage": {"prompt_tokens": 12, "completion_tokens": 2}}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            response = await conn.prompt(session_id=session.session_id, prompt=[text("hi there")])
            return response, updates(wire, session.session_id), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert agentText(found) == "Hello world"
    kinds = [u["sessionUpdate"] for u in found]
    assert kinds[0] == "available_commands_update"
    assert "usage_update" in kinds and "session_info_update" in kinds
    info = [u for u in found if u["sessionUpdate"] == "session_info_update"][0]
    assert info["title"] == "hi there"
    usage = [u for u in found if u["sessionUpdate"] == "usage_update"][-1]
    assert usage["used"] == 12
    assert server.chatRequests[0]["messages"][-1] == {"role": "user", "content": "hi there"}


@pytest_twisted.ensureDeferred
async def test_toolTurnWritesAndReads(scriptedServer, tmp_path) -> None:
    """A write then a read: the file is on disk, each call goes pending →
    in_progress → completed with a diff for the write, and the model sees both results."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "notes/a.txt", "content": "alpha\n"}}]}],
        [{"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes/a.txt"}}]}],
        [{"text": "Done."}],
    ]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await conn.set_session_mode(session_id=session.session_id, mode_id="accept_edits")
            response = await conn.prompt(session_id=session.session_id, prompt=[text("write it")])
            return response, updates(wire, session.session_id), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert (tmp_path / "notes" / "a.txt").read_text() == "alpha\n"
    calls = toolCalls(found)
    assert [c["statuses"] for c in calls.values()] == [["pending", "in_progress", "completed"]] * 2
    write, read = calls.values()
    assert write["kind"] == "edit" and write["title"] == "Write notes/a.txt"
    assert {"type": "diff", "path": str(tmp_path / "notes" / "a.txt"), "oldText": None, "newText": "alpha\n"} in write["content"]
    assert read["locations"][0]["path"] == str(tmp_path / "notes" / "a.txt")
    toolResults = [m for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    assert len(toolResults) == 2 and "alpha" in toolResults[1]["content"]
