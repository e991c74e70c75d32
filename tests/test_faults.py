"""The fault suite: what the user sees when things go wrong, and that nothing is lost.

Each case says what the user sees in its docstring.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import acp
import pytest
import pytest_twisted

from .e2e import agentText, modelEnv, text, toolCalls, updates
from .sdkclient import connect, initialized, onLoop


async def oneTurn(url: str, cwd: Path, words: str, **env: str):
    async with connect(env=modelEnv(url, **env)) as (conn, client, wire, process):
        await initialized(conn)
        sid = (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id
        response = await conn.prompt(session_id=sid, prompt=[text(words)])
        again = await conn.prompt(session_id=sid, prompt=[text("are you still there")])
        return response, again, updates(wire, sid), wire.problems()


@pytest_twisted.ensureDeferred
async def test_serverErrorThenSuccessIsRetried(scriptedServer, tmp_path) -> None:
    """A 500 followed by a good answer: the user just sees the answer."""
    server, url = scriptedServer
    server.addRule("flaky", [[{"status": 500, "error": "upstream hiccup"}], [{"text": "recovered"}]])
    server.addRule("still there", [[{"text": "yes"}]])
    response, again, found, problems = await onLoop(oneTurn(url, tmp_path, "flaky please"))
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert agentText(found).startswith("recovered")


@pytest.mark.parametrize(
    "failure, code, shown",
    [
        ([{"status": 401, "error": "invalid api key"}], -32000, "rejected the API key"),
        ([{"text": "half an ans"}, {"raw": "data: {not json\n\n"}], -32603, "Model error"),
        ([{"text": "cut short"}, {"close": True}], -32603, "Model error"),
    ],
    ids=["bad-key", "malformed-sse", "closed-mid-stream"],
)
@pytest_twisted.ensureDeferred
async def test_brokenModelAnswers(scriptedServer, tmp_path, failure, code, shown) -> None:
    """A bad key, malformed SSE or a connection closed mid-stream: the prompt fails
    with an error that says so (a refused key asks for authentication again), what
    had streamed stays, a reload explains the failure, and the next prompt works."""
    server, url = scriptedServer
    server.addRule("break", [failure])
    server.addRule("still there", [[{"text": "yes, here"}]])
    home = tempfile.mkdtemp()

    async def scenario():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            with pytest.raises(acp.RequestError) as caught:
                await conn.prompt(session_id=sid, prompt=[text("break now")])
            again = await conn.prompt(session_id=sid, prompt=[text("are you still there")])
            live = updates(wire, sid)
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            return caught.value, again, live, updates(wire, sid), wire.problems()

    error, again, live, replay, problems = await onLoop(scenario())
    assert problems == []
    assert error.code == code and shown in str(error)
    assert error.data["reason"] == "model"
    assert again.stop_reason == "end_turn"
    assert agentText(live).endswith("yes, here")
    assert shown in agentText(replay)


@pytest_twisted.ensureDeferred
async def test_tenMegabytesOfToolOutput(scriptedServer, tmp_path) -> None:
    """A command printing 10 MB: the card shows a capped, marked excerpt; no frame
    is huge; the model gets a capped result; the turn completes."""
    server, url = scriptedServer
    server.addRule("flood", [
        [{"tool_calls": [{"id": "f", "name": "terminal", "arguments": {"command": "head -c 10000000 /dev/zero | tr '\\0' a"}}]}],
        [{"text": "that was a lot"}],
    ])
    server.addRule("still there", [[{"text": "yes"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await conn.prompt(session_id=sid, prompt=[text("flood it")])
            biggest = max(len(str(f)) for f in wire.received)
            return response, updates(wire, sid), biggest, wire.problems()

    response, found, biggest, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    [call] = toolCalls(found).values()
    assert call["status"] == "completed"
    assert "omitted" in str(call["content"])
    assert biggest < 300_000
    toolMessage = [m for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"][0]
    assert len(toolMessage["content"]) < 100_000


@pytest.mark.parametrize("damage", ["corrupt", "home-is-a-file"])
@pytest_twisted.ensureDeferred
async def test_unusableStateDatabase(scriptedServer, damage) -> None:
    """A corrupt state.db, or a HERMES_HOME that cannot hold one: initialize still
    works, session/new fails with a clear -32603 naming the file, nothing crashes."""
    server, url = scriptedServer
    home = Path(tempfile.mkdtemp())
    if damage == "corrupt":
        (home / "state.db").write_bytes(b"this is not a database" * 100)
    else:
        home = home / "file"
        home.write_text("not a folder")

    async def scenario():
        async with connect(env=modelEnv(url, str(home))) as (conn, client, wire, process):
            result = await initialized(conn)
            with pytest.raises(acp.RequestError) as caught:
                await conn.new_session(cwd=tempfile.gettempdir(), mcp_servers=[])
            again = await initialized(conn)
            return result, caught.value, again, process.returncode, wire.problems()

    result, error, again, code, problems = await onLoop(scenario())
    assert problems == []
    assert error.code == -32603
    assert "state.db" in str(error) or str(home) in str(error)
    assert again.protocol_version == 1 and code is None


@pytest_twisted.ensureDeferred
async def test_fiftySessionsPromptingAtOnce(scriptedServer, tmp_path) -> None:
    """Fifty sessions prompting at the same moment each get their own answer."""
    server, url = scriptedServer
    for index in range(50):
        server.addRule(f"session number {index}.", [[{"text": f"reply {index}"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            ids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(50)]
            results = await asyncio.wait_for(
                asyncio.gather(*[conn.prompt(session_id=sid, prompt=[text(f"session number {i}.")]) for i, sid in enumerate(ids)]),
                120,
            )
            return ids, results, wire

    ids, results, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert [r.stop_reason for r in results] == ["end_turn"] * 50
    for index, sid in enumerate(ids):
        assert agentText(updates(wire, sid)) == f"reply {index}"


@pytest_twisted.ensureDeferred
async def test_cancelRacingTheFinalResponse(scriptedServer, tmp_path) -> None:
    """A cancel sent as a fast turn finishes: each prompt is answered exactly once
    (end_turn or cancelled), nothing arrives after the answer, the session goes on."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "quick"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            reasons = []
            for delay in (0, 0.001, 0.005, 0.01, 0.02, 0.05):
                running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("race")]))
                await asyncio.sleep(delay)
                await conn.cancel(session_id=sid)
                reasons.append((await asyncio.wait_for(running, 5)).stop_reason)
            final = await conn.prompt(session_id=sid, prompt=[text("after the races")])
            answers = [f for f in wire.received if "result" in f and "stopReason" in f["result"]]
            return reasons, final, len(answers), wire.problems()

    reasons, final, answers, problems = await onLoop(scenario())
    assert problems == []
    assert set(reasons) <= {"end_turn", "cancelled"}
    assert answers == 7
    assert final.stop_reason == "end_turn"
