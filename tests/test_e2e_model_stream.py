"""The model's stream through the real process (issue 22): a cancel answers at once whatever
the endpoint's framing (chunked, or ended by the connection) and whether the stream stalls or
never ends, and nothing of the cancelled answer follows the prompt's answer; a finished answer
ends the turn whatever the connection does next; an endless line or reply is cut at its bound,
with an error naming it, the agent's memory stays small, and the session goes on."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import acp
import pytest
import pytest_twisted

from .e2e import agentText, modelEnv, text, updates
from .scripted_model import FRAMINGS
from .sdkclient import connect, initialized, onLoop


def peakRSS(pid: int) -> int:
    """The most resident memory the process has had (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def chunksAfter(wire, sid: str, answer: dict) -> list[dict]:
    """The message chunks of session ``sid`` the agent sent after the frame ``answer``."""
    frames = [f for direction, f in wire.order if direction == "received"]
    later = frames[frames.index(answer) + 1:]
    return [f for f in later if f.get("method") == "session/update" and f["params"]["sessionId"] == sid
            and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("stream", ["stalled", "endless"])
@pytest_twisted.ensureDeferred
async def test_cancelAnswersAtOnceWhateverTheStream(scriptedServer, tmp_path, stream) -> None:
    """Cancel while the model streams: answered ``cancelled`` at once (the bound is generous
    for a loaded machine: before, a close-delimited stream ran to its end or the 600 s read
    timeout); no text of that answer follows the answer; the next prompt works."""
    server, url = scriptedServer
    endless = {"flood": "text", "every": 0.002}  # 500 KB/s: faster than any model (bench/ also floods)
    server.addRule("stream", [[{"text": "partial"}, {"stall": True} if stream == "stalled" else endless]])
    server.addRule("again", [[{"text": "fine again"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("stream please")]))
            await client.waitForUpdate(lambda s, u: u["sessionUpdate"] == "agent_message_chunk")
            if stream == "endless":
                await asyncio.sleep(0.3)
            began = time.monotonic()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            took = time.monotonic() - began
            answer = next(f for f in wire.received if f.get("result", {}).get("stopReason") == "cancelled")
            await asyncio.sleep(0.5)  # anything the cancelled answer still had would arrive now
            late = chunksAfter(wire, sid, answer)
            again = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 30)
            return response, took, late, again, updates(wire, sid), wire.problems()

    response, took, late, again, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled" and took < 3.0, took
    assert late == []
    assert again.stop_reason == "end_turn" and agentText(found).endswith("fine again")


@pytest.mark.parametrize("scriptedServer", ["chunked+open", "close+open"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_aFinishedAnswerEndsTheTurnOnAConnectionLeftOpen(scriptedServer, tmp_path) -> None:
    """``[DONE]`` on a connection the server leaves open (the body never ends): the turn ends
    at once, not at the read timeout; so does the next, on a new connection."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "done"}], [{"text": "done again"}]]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            took = []
            for words in ("one", "two"):
                began = time.monotonic()
                answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(words)]), 30)
                took.append(time.monotonic() - began)
                assert answer.stop_reason == "end_turn"
            return took, updates(wire, sid), wire.problems()

    took, found, problems = await onLoop(scenario())
    assert problems == []
    assert max(took) < 3.0, took
    assert agentText(found) == "donedone again"


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest.mark.parametrize("flood, env, variable", [
    ("line", {}, "HERMES_ACP_MODEL_MAX_EVENT"),  # the default bound: 8 MiB
    ("text", {"HERMES_ACP_MODEL_MAX_REPLY": str(2 * 1024 * 1024)}, "HERMES_ACP_MODEL_MAX_REPLY"),
])
@pytest_twisted.ensureDeferred
async def test_anEndlessReplyIsCut(scriptedServer, tmp_path, flood, env, variable) -> None:
    """One endless ``data:`` line, or endless valid deltas (the server would send 200+ MB of
    either): the prompt fails with an error naming the bound and its variable, the agent's
    memory never comes near what was offered, what was shown is kept once (a reload replays
    it, then the failure), and the next prompt works with a history the model accepts."""
    server, url = scriptedServer
    server.addRule("flood", [[{"text": "start "}, {"flood": flood, "bytes": 256 * 1024 * 1024}]])
    server.addRule("after", [[{"text": "still here"}]])
    home = tempfile.mkdtemp(prefix="hermes-home-")

    async def scenario():
        async with connect(env=modelEnv(url, home, **env)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            with pytest.raises(acp.RequestError) as caught:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("flood me")]), 60)
            peak = peakRSS(process.pid)
            live = updates(wire, sid)
            again = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("after that")]), 30)
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replay = updates(wire, sid)
            return caught.value, peak, live, again, replay, wire.problems()

    error, peak, live, again, replay, problems = await onLoop(scenario())
    assert problems == []
    assert variable in str(error) and error.data["reason"] == "model"
    assert server.flooded < 64 * 1024 * 1024  # the agent stopped reading long before the 256 MB
    assert peak < 160 * 1024 * 1024, peak  # far below what was offered (about 45 MiB at rest)
    shown = agentText(live)
    assert shown.startswith("start ") and set(shown[6:]) <= {"x"}
    assert agentText(replay).startswith(shown + "\n\n_Model error: ") and variable in agentText(replay)
    assert again.stop_reason == "end_turn"
    [following] = [r for r in server.chatRequests if "after that" in str(r["messages"][-1])]
    assert len(str(following["messages"])) < 100_000  # the cut reply is not sent back
