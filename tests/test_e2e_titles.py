"""Sessions have names: after the first exchange the model's title arrives as a
``session_info_update``, is saved and listed; the first prompt line stays when the title
request fails or answers garbage, and when the first turn failed; ``/title`` wins over a
late model title; the title request never delays a prompt's answer, and a cancel, a close
or the agent's exit drops it at once."""

from __future__ import annotations

import asyncio
import tempfile
import time

import acp
import pytest
import pytest_twisted
from hermes_acp.engine.titles import MAX_TOKENS, TITLE_PROMPT

from .e2e import modelEnv, text, updates
from .sdkclient import connect, initialized, onLoop, until


def titles(wire, sessionId: str) -> list[str]:
    return [u["title"] for u in updates(wire, sessionId) if u["sessionUpdate"] == "session_info_update"]


@pytest_twisted.ensureDeferred
async def test_modelTitleArrivesIsSavedAndAskedOnce(scriptedServer, tmp_path) -> None:
    """The first line at once, then the model's title, cleaned; a second turn and a
    restart ask nothing more; session/list shows the title after the restart."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.addRule("plan a trip", [[{"text": "Start in Lyon, then go south."}]])
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])
    server.titles.responses.append([{"text": '**Title:** "Trip\x1b planning in `France`."\nsecond line'}])

    async def firstLife():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sessionId, prompt=[text("plan a trip to France\nwith trains")])
            await until(lambda: len(titles(wire, sessionId)) == 2, 30, "the model's title")
            await conn.prompt(session_id=sessionId, prompt=[text("and back")])
            return sessionId, titles(wire, sessionId), wire.problems()

    async def secondLife(sessionId):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            listed = await conn.list_sessions()
            await conn.load_session(cwd=str(tmp_path), session_id=sessionId, mcp_servers=[])
            await conn.prompt(session_id=sessionId, prompt=[text("once more")])
            return [s.title for s in listed.sessions if s.session_id == sessionId], wire.problems()

    sessionId, shown, problems = await onLoop(firstLife())
    assert problems == []
    assert shown == ["plan a trip to France", "Trip planning in France"]
    [request] = server.titleRequests
    assert request["messages"][0] == {"role": "system", "content": TITLE_PROMPT}
    assert "plan a trip to France" in request["messages"][1]["content"]
    assert "Start in Lyon" in request["messages"][1]["content"]
    assert request["max_tokens"] == MAX_TOKENS and "tools" not in request
    listed, problems = await onLoop(secondLife(sessionId))
    assert problems == []
    assert listed == ["Trip planning in France"]
    assert len(server.titleRequests) == 1  # asked once in the session's life
    assert len(server.chatRequests) == 3


@pytest_twisted.ensureDeferred
async def test_userTitleWinsOverLateModelTitle(scriptedServer, tmp_path) -> None:
    """``/title`` while the model's title is on its way: the user's stays."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Sure."}])
    server.titles.responses.append([{"stall": 1.5}, {"text": "Model title"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sessionId, prompt=[text("refactor the parser")])
            await until(lambda: server.stalls == 1, 30, "the title request")
            await conn.prompt(session_id=sessionId, prompt=[text("/title My parser work")])
            await asyncio.sleep(3)  # the model's answer (after 1.5 s) has come and gone
            listed = await conn.list_sessions()
            return titles(wire, sessionId), [s.title for s in listed.sessions], wire.problems()

    shown, listed, problems = await onLoop(scenario())
    assert problems == []
    assert shown == ["refactor the parser", "My parser work"]
    assert listed == ["My parser work"]
    assert len(server.titleRequests) == 1


@pytest.mark.parametrize("reply", [
    [{"status": 500, "error": "boom"}],
    [{"text": "```\n**\n> \n"}],
    [{"close": True}],
], ids=["error", "garbage", "dropped"])
@pytest_twisted.ensureDeferred
async def test_failedTitleKeepsFirstLine(scriptedServer, tmp_path, reply) -> None:
    """A title request that fails or answers nothing usable changes nothing; it is not
    retried; it is routine, so the log (at the default level) says nothing of it."""
    server, url = scriptedServer
    server.default.responses.extend([[{"text": "Done."}], [{"text": "Again."}]])
    server.titles.responses.append(reply)
    log = tmp_path / "agent.log"

    async def scenario():
        with open(log, "wb") as stderr:
            return await run(stderr)

    async def run(stderr):
        async with connect(env=modelEnv(url), stderr=stderr) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sessionId, prompt=[text("fix the flaky test")])
            await until(lambda: len(server.titleRequests) == 1, 30, "the title request")
            await asyncio.sleep(1)  # its answer has come and gone
            await conn.prompt(session_id=sessionId, prompt=[text("thanks")])
            listed = await conn.list_sessions()
            return titles(wire, sessionId), [s.title for s in listed.sessions], wire.problems()

    shown, listed, problems = await onLoop(scenario())
    assert problems == []
    assert shown == listed == ["fix the flaky test"]
    assert len(server.titleRequests) == 1
    assert log.read_text() == ""


@pytest_twisted.ensureDeferred
async def test_titleRequestNeverDelaysTheAnswer(scriptedServer, tmp_path) -> None:
    """The title's reply stalls for good: the prompt answers at once, the next one too,
    and the agent exits without waiting for it."""
    server, url = scriptedServer
    server.default.responses.extend([[{"text": "First."}], [{"text": "Second."}]])
    server.titles.responses.append([{"stall": True}])
    timings = {}

    async def scenario():
        async with connect(env=modelEnv(url, HERMES_ACP_TITLE_SECONDS="600")) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            began = time.monotonic()
            first = await conn.prompt(session_id=sessionId, prompt=[text("write a haiku")])
            timings["first"] = time.monotonic() - began
            await until(lambda: server.stalls == 1, 30, "the title request")
            began = time.monotonic()
            second = await conn.prompt(session_id=sessionId, prompt=[text("another")])
            timings["second"] = time.monotonic() - began
            closing = time.monotonic()
        timings["exit"] = time.monotonic() - closing
        return first, second, titles(wire, sessionId), wire.problems()

    first, second, shown, problems = await onLoop(scenario())
    assert problems == []
    assert first.stop_reason == second.stop_reason == "end_turn"
    assert shown == ["write a haiku"]
    print("timings", timings)
    # Generous bounds (a shared machine): the stalled title would make these 600 s.
    assert timings["first"] < 10 and timings["second"] < 10 and timings["exit"] < 15


@pytest.mark.parametrize("action", ["cancel", "close"])
@pytest_twisted.ensureDeferred
async def test_cancelOrCloseDropsTheTitleRequest(scriptedServer, tmp_path, action) -> None:
    """``session/cancel`` or ``session/close`` while the title's reply stalls: the agent
    hangs up on it at once, and nothing is sent for it."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Hello."}])
    server.titles.responses.append([{"stall": True}])

    async def scenario():
        async with connect(env=modelEnv(url, HERMES_ACP_TITLE_SECONDS="600")) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sessionId, prompt=[text("say hello")])
            await until(lambda: server.stalls == 1, 30, "the title request")
            began = time.monotonic()
            if action == "cancel":
                await conn.cancel(session_id=sessionId)
            else:
                await conn.close_session(session_id=sessionId)
            await until(lambda: server.abandoned == 1, 10, "the title request to be dropped")
            dropped = time.monotonic() - began
            listed = await conn.list_sessions()
            return dropped, titles(wire, sessionId), [s.title for s in listed.sessions], wire.problems()

    dropped, shown, listed, problems = await onLoop(scenario())
    assert problems == []
    assert shown == listed == ["say hello"]
    print("dropped after", dropped)
    assert dropped < 5  # generous: a shared machine; the stall would hold it for 600 s


@pytest_twisted.ensureDeferred
async def test_failedFirstTurnIsNotNamed(scriptedServer, tmp_path) -> None:
    """A first turn the model failed keeps its first line, and a later good turn asks nothing."""
    server, url = scriptedServer
    server.default.responses.extend([[{"status": 400, "error": "bad request"}], [{"text": "Fine now."}]])
    server.titles.responses.append([{"text": "Never asked"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            with pytest.raises(acp.RequestError):
                await conn.prompt(session_id=sessionId, prompt=[text("first try")])
            await conn.prompt(session_id=sessionId, prompt=[text("second try")])
            await asyncio.sleep(1)  # a title request would have come by now
            return titles(wire, sessionId), wire.problems()

    shown, problems = await onLoop(scenario())
    assert problems == []
    assert shown == ["first try"]
    assert server.titleRequests == []
