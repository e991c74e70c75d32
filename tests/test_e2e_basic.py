"""Prompt turns end to end: the real process, the SDK client, a scripted model."""

from __future__ import annotations

import asyncio

import pytest
import pytest_twisted

from .agentproc import ENTRY_POINTS
from .e2e import agentText, answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop


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


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest_twisted.ensureDeferred
async def test_routineWorkIsQuietOnStderr(scriptedServer, tmp_path, entry) -> None:
    """At the default log level a routine session writes nothing to stderr: a turn
    with an edit allowed and one denied, a cancel of an idle session and the exit.
    Some editors (acp.el) show every stderr line as an error."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "write_file", "arguments": {"path": "a.txt", "content": "a\n"}}]}],
        [{"tool_calls": [{"id": "b", "name": "write_file", "arguments": {"path": "b.txt", "content": "b\n"}}]}],
        [{"text": "Done."}],
    ]
    client = RecordingClient(permission=answers("allow_once", "reject_once"))
    stderr = tmp_path / "stderr"

    async def scenario():
        with open(stderr, "wb") as sink:
            async with connect(client, env=modelEnv(url), argv=ENTRY_POINTS[entry], stderr=sink) as (conn, _, wire, process):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                response = await conn.prompt(session_id=sid, prompt=[text("write a and b")])
                await conn.cancel(session_id=sid)
            return response, await asyncio.wait_for(process.wait(), 15), wire.problems()

    response, code, problems = await onLoop(scenario())
    assert (response.stop_reason, code, problems) == ("end_turn", 0, [])
    assert (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    assert len(client.permissionRequests) == 2
    assert stderr.read_bytes() == b""


@pytest_twisted.ensureDeferred
async def test_mcpServersAndCompactionAreQuietOnStderr(scriptedServer, httpMCP, tmp_path) -> None:
    """A session with MCP servers (stdio and HTTP) whose tools are called, on a small window
    that a compaction (with the model's summary) keeps working, writes nothing to stderr at
    the default level: a server ready and a compaction done are routine."""
    from .mcp_e2e import call, http, scripted
    from .test_e2e_compaction import files, reading

    model, url = scriptedServer
    model.window = model.windows["scripted-model"] = 8000
    turns = 6
    model.addRule("echo it", [call("e", "mcp__srv__echo", text="hi"), call("w", "mcp__web__echo", text="hi"),
                              [{"text": "echoed"}]])
    _, webURL = httpMCP({})
    reading(model, turns)
    files(tmp_path, turns)
    server, _ = scripted(tmp_path, "srv")
    stderr = tmp_path / "stderr"

    async def scenario():
        with open(stderr, "wb") as sink:
            client = RecordingClient(permission=answers("allow_once", "allow_once"))
            async with connect(client, env=modelEnv(url), stderr=sink) as (conn, _, wire, process):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server, http("web", webURL)])).session_id
                stops = [(await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("echo it")]), 30)).stop_reason]
                for n in range(turns):
                    prompt = [text(f"turn {n} please")]
                    stops.append((await asyncio.wait_for(conn.prompt(session_id=sid, prompt=prompt), 30)).stop_reason)
            return stops, await asyncio.wait_for(process.wait(), 15), wire.problems()

    stops, code, problems = await onLoop(scenario())
    assert (stops, code, problems) == (["end_turn"] * (turns + 1), 0, [])
    assert model.summaryRequests, "a compaction asked for a summary"
    echoed = [m["content"] for m in model.chatRequests[2]["messages"] if m["role"] == "tool"]
    assert len(echoed) == 2 and all("hi" in e for e in echoed), echoed
    assert stderr.read_text() == ""
