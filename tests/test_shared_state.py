"""Two processes on one state.db, and a process killed mid-turn (issue 10).

A second editor window that loads a session while the first is running a turn
leaves that turn alone; a turn whose process was killed is closed on the next
load, and the editor's replay and the model's history tell the same story.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import acp
import pytest
import pytest_twisted

from .e2e import agentText, journaled, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop
from .test_e2e_turns import choose


def waitingCommand(flag: Path) -> str:
    """A command that runs until ``flag`` exists (30 s at most)."""
    return f"for i in $(seq 600); do [ -e {flag} ] && break; sleep 0.05; done; echo released"


def statuses(found: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {callId: call["statuses"] for callId, call in toolCalls(found).items()}


@pytest_twisted.ensureDeferred
async def test_secondWindowLeavesARunningTurnAlone(scriptedServer, tmp_path) -> None:
    """While window A runs a turn, window B loads the session (and its replay shows
    no failure), B's prompt is refused with a message naming A's process, A's turn
    completes, and every later replay shows the call completed, never failed."""
    server, url = scriptedServer
    flag = tmp_path / "go"
    server.addRule("slow one", [
        [{"tool_calls": [{"id": "w", "name": "terminal", "arguments": {"command": waitingCommand(flag)}}]}],
        [{"text": "finished"}],
    ])  # fmt: skip
    home = tempfile.mkdtemp()
    env = modelEnv(url, home)

    async def scenario():
        clientA = RecordingClient(permission=choose("allow_once"))
        async with connect(clientA, env=env) as (connA, _, wireA, processA):
            await initialized(connA)
            sid = (await connA.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(connA.prompt(session_id=sid, prompt=[text("slow one")]))
            await clientA.waitForUpdate(lambda s, u: u.get("status") == "in_progress")
            await journaled(home, sid, "in_progress")
            async with connect(env=env) as (connB, _, wireB, processB):
                await initialized(connB)
                await connB.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
                seenByB = updates(wireB, sid)
                with pytest.raises(acp.RequestError) as busy:
                    await connB.prompt(session_id=sid, prompt=[text("me too")])
                problemsB = wireB.problems()
            flag.touch()
            answer = await asyncio.wait_for(running, 30)
            problemsA = wireA.problems()
        async with connect(env=env) as (connC, _, wireC, processC):
            await initialized(connC)
            await connC.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replay = updates(wireC, sid)
        return seenByB, busy.value, answer, replay, problemsA + problemsB + wireC.problems()

    seenByB, busy, answer, replay, problems = await onLoop(scenario())
    assert problems == []
    assert all("failed" not in s for s in statuses(seenByB).values()), statuses(seenByB)
    assert "running a turn in process" in str(busy)
    assert answer.stop_reason == "end_turn"
    [history] = statuses(replay).values()
    assert history[-1] == "completed" and "failed" not in history
    assert agentText(replay).endswith("finished")


@pytest_twisted.ensureDeferred
async def test_killedMidTurnReplaysAsInterrupted(scriptedServer, tmp_path) -> None:
    """kill -9 during a turn: the next load replays the open call as failed and a
    line saying the turn was interrupted, and the model's next request carries the
    same account (the user's words, and that the turn was interrupted)."""
    server, url = scriptedServer
    flag = tmp_path / "never"
    server.addRule("long job", [
        [{"text": "Starting the long job."},
         {"tool_calls": [{"id": "w", "name": "terminal", "arguments": {"command": waitingCommand(flag)}}]}],
    ])  # fmt: skip
    server.addRule("what happened", [[{"text": "It was interrupted."}]])
    home = tempfile.mkdtemp()
    env = modelEnv(url, home)

    async def scenario():
        client = RecordingClient(permission=choose("allow_once"))
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("run the long job")]))
            await client.waitForUpdate(lambda s, u: u.get("status") == "in_progress")
            await journaled(home, sid, "in_progress")
            process.kill()
            await process.wait()
        flag.touch()  # lets the orphaned command end
        async with connect(env=env) as (conn, _, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replay = updates(wire, sid)
            response = await conn.prompt(session_id=sid, prompt=[text("what happened?")])
            return replay, response, wire.problems()

    replay, response, problems = await onLoop(scenario())
    assert problems == []
    [history] = statuses(replay).values()
    assert history[-1] == "failed"
    assert "This turn was interrupted" in agentText(replay)
    assert response.stop_reason == "end_turn"
    messages = server.chatRequests[-1]["messages"]
    said = [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant")]
    assert said[0] == ("user", "run the long job")
    assert said[1][0] == "assistant" and "Starting the long job." in said[1][1] and "interrupted" in said[1][1]
    assert said[2] == ("user", "what happened?")


@pytest_twisted.ensureDeferred
async def test_secondWindowSeesTheOtherWindowsTurns(scriptedServer, tmp_path) -> None:
    """Window B loaded the session, then window A ran another turn in it: B's next
    prompt sends the model the whole history, A's newest turn included."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])
    env = modelEnv(url, tempfile.mkdtemp())

    async def scenario():
        async with connect(env=env) as (connA, _, wireA, processA):
            await initialized(connA)
            sid = (await connA.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(connA.prompt(session_id=sid, prompt=[text("first from A")]), 30)
            async with connect(env=env) as (connB, _, wireB, processB):
                await initialized(connB)
                await asyncio.wait_for(connB.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[]), 30)
                await asyncio.wait_for(connA.prompt(session_id=sid, prompt=[text("second from A")]), 30)
                await asyncio.wait_for(connB.prompt(session_id=sid, prompt=[text("third from B")]), 30)
                return wireA.problems() + wireB.problems()

    problems = await onLoop(scenario())
    assert problems == []
    said = [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "user"]
    assert said == ["first from A", "second from A", "third from B"]
