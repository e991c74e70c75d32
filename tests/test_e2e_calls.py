"""Tool calls keyed by the engine's call ids, mode changes told at once, and sessions
that move folders (issue 12), through the real process and the SDK client."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest_twisted

from .e2e import answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop

DANGEROUS = "rm -rf scratch"



@pytest_twisted.ensureDeferred
async def test_twoIdenticalCommandsAskUnderTheirOwnCards(scriptedServer, tmp_path) -> None:
    """Two identical dangerous commands in one reply: two questions, each naming its
    own card; the first is allowed and runs, the second is rejected; each card's
    status follows its own answer."""
    server, url = scriptedServer
    (tmp_path / "scratch").mkdir()
    server.default.responses += [
        [{"tool_calls": [{"id": "same", "name": "terminal", "arguments": {"command": DANGEROUS}},
                         {"id": "same", "name": "terminal", "arguments": {"command": DANGEROUS}}]}],
        [{"text": "done"}],
    ]  # the model even gave them one id
    client = RecordingClient(permission=answers("allow_once", "reject_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("clean twice")]), 30)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    cards = toolCalls(found)
    assert len(cards) == 2
    asked = [toolCall.tool_call_id for _, toolCall, _ in client.permissionRequests]
    assert sorted(asked) == sorted(cards) and len(set(asked)) == 2
    statuses = {callId: cards[callId]["status"] for callId in asked}
    assert list(statuses.values()) == ["completed", "failed"]  # each card got its own answer
    assert not (tmp_path / "scratch").exists()


@pytest_twisted.ensureDeferred
async def test_alwaysAllowAnnouncesTheModeAtOnce(scriptedServer, tmp_path) -> None:
    """"Allow edits for this session" on the first edit: the editor hears the new mode
    before the next tool event of the same turn, and the second edit does not ask."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "write_file", "arguments": {"path": "a.txt", "content": "1"}}]}],
        [{"tool_calls": [{"id": "b", "name": "write_file", "arguments": {"path": "b.txt", "content": "2"}}]}],
        [{"text": "both written"}],
    ]
    client = RecordingClient(permission=answers("allow_always"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("write two files")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert len(client.permissionRequests) == 1
    kinds = [(u["sessionUpdate"], u.get("status"), u.get("currentModeId")) for u in found]
    mode = kinds.index(("current_mode_update", None, "accept_edits"))
    firstDone = next(i for i, k in enumerate(kinds) if k[:2] == ("tool_call_update", "completed"))
    assert mode < firstDone  # announced before the edit's own end, mid-turn
    options = next(u for u in found[mode:] if u["sessionUpdate"] == "config_option_update")
    assert {o["id"]: o["currentValue"] for o in options["configOptions"]}["mode"] == "accept_edits"
    assert (tmp_path / "a.txt").read_text() == "1" and (tmp_path / "b.txt").read_text() == "2"


@pytest_twisted.ensureDeferred
async def test_sessionLoadedOrResumedUnderAnotherFolder(scriptedServer, tmp_path) -> None:
    """A session loaded in another folder works there from its next turn on (the
    model is told the new folder, relative paths start there), and one resumed with
    other additional folders is told those."""
    server, url = scriptedServer
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "where.txt").write_text("in the second folder\n")
    server.addRule("hello", [[{"text": "hi"}]])
    server.addRule("read where", [
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "where.txt"}}]}],
        [{"text": "read it"}],
    ])  # fmt: skip
    server.addRule("which folders", [[{"text": "these"}]])
    home = tempfile.mkdtemp()
    extra = tempfile.mkdtemp()

    async def scenario():
        async with connect(env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(first), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("hello")])
        async with connect(env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(second), mcp_servers=[])
            await conn.prompt(session_id=sid, prompt=[text("read where")])
            await conn.resume_session(session_id=sid, cwd=str(second), additional_directories=[extra])
            await conn.prompt(session_id=sid, prompt=[text("which folders")])
            return wire.problems()

    problems = await onLoop(scenario())
    assert problems == []
    system = lambda body: body["messages"][0]["content"]  # noqa: E731
    requests = server.chatRequests
    assert f"Working directory: {first}" in system(requests[0])
    assert f"Working directory: {second}" in system(requests[1])
    tool = [m for m in requests[2]["messages"] if m["role"] == "tool"][0]["content"]
    assert "in the second folder" in tool
    assert extra in system(requests[-1]) and Path(extra).is_dir()
