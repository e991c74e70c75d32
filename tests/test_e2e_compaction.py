"""Compaction and overflow recovery (issue 15) through the real process, against a
scripted model with a small window: it refuses requests over the window with OpenAI's
400 ``context_length_exceeded`` and reports ``prompt_tokens`` of the others.

Editors without ``session.compaction`` are driven by the SDK client (they see a
"Compact conversation" card); editors with it by raw lines (the SDK does not know
``compaction_update``), every frame checked against the schema."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from . import acpschema
from hermes_acp.engine.compaction import FRAME
from hermes_acp.store import SessionDB

from .agentproc import frame
from .e2e import agentText, journaled, modelEnv, text, toolCalls, updates
from .scripted_model import Script, ScriptedModel, tokensOf
from .sdkclient import RecordingClient, connect, initialized, onLoop
from .test_compaction import wellFormed

WINDOW = 8000
FILE_SIZE = 6000


def reading(model: ScriptedModel, turns: int) -> None:
    """Each prompt "turn N" reads its own big file (read_N.txt), then answers "done N"."""
    for n in range(turns):
        model.addRule(f"turn {n} ", [
            [{"tool_calls": [{"id": f"r{n}", "name": "read_file", "arguments": {"path": f"read_{n}.txt"}}]}],
            [{"text": f"done {n}"}],
        ])


def files(folder: Path, turns: int, size: int = FILE_SIZE) -> None:
    for n in range(turns):
        (folder / f"read_{n}.txt").write_text(f"file {n}\n" + "".join(f"{n}:{i} " + "z" * 70 + "\n" for i in range(size // 76)))


def summarised(messages: list[dict[str, Any]]) -> bool:
    """The request starts from a summary: in the system prompt (before a user message), or
    as the first message; and no two user messages follow each other."""
    roles = [m["role"] for m in messages]
    alternating = all(not (a == b == "user") for a, b in zip(roles, roles[1:]))
    return alternating and (FRAME in messages[0]["content"] or messages[1]["content"].startswith(FRAME))


def compactionCards(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in toolCalls(found).values() if c.get("title") == "Compact conversation"]


def usedAfter(found: list[dict[str, Any]]) -> list[int]:
    return [u["used"] for u in found if u["sessionUpdate"] == "usage_update"]


@pytest.mark.parametrize("known", [True, False], ids=["window-from-models", "window-from-overflow"])
@pytest_twisted.ensureDeferred
async def test_longSessionOnASmallWindowKeepsWorking(scriptedServer, tmp_path, known) -> None:
    """120 turns, each reading a 6 KB file, on an 8,000-token model: every prompt ends
    normally, no request is over the window (after the first overflow, when the window was
    not known), every request is well-formed, and each compaction shows as a card."""
    model, url = scriptedServer
    turns = 120
    model.window = WINDOW
    if known:
        model.windows["scripted-model"] = WINDOW
    reading(model, turns)
    files(tmp_path, turns)

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            stops = []
            for n in range(turns):
                answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(f"turn {n} please")]), 30)
                stops.append(answer.stop_reason)
            return stops, updates(wire, sid), wire.problems()

    stops, found, problems = await onLoop(scenario())
    assert problems == []
    assert stops == ["end_turn"] * turns
    over = [body for body in model.chatRequests + model.summaryRequests if tokensOf(body) > WINDOW]
    assert len(over) == model.overflows == (0 if known else 1)
    for body in model.chatRequests + model.summaryRequests:
        wellFormed(body["messages"])
        roles = [m["role"] for m in body["messages"]]
        assert ("user", "user") not in zip(roles, roles[1:]), "two user turns in a row"
    cards = compactionCards(found)
    assert len(cards) >= 10
    assert all(c["status"] == "completed" and c["kind"] == "think" for c in cards)
    assert model.summaryRequests, "some compactions needed the model's summary"
    last = model.chatRequests[-1]["messages"]
    assert summarised(last)
    assert any(m["role"] == "user" and m["content"] == f"turn {turns - 1} please" for m in last)
    assert "done 119" in agentText(found)
    assert "compaction_update" not in json.dumps(found)


class RawEditor:
    """An editor that speaks raw lines (the SDK does not know ``compaction_*``): requests
    one at a time, every frame kept and checked against the schema."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.frames: list[dict[str, Any]] = []
        self.methods: dict[str, str] = {}
        self.nextId = 0

    @classmethod
    async def start(cls, env: dict[str, str], capabilities: dict[str, Any]) -> RawEditor:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hermes_acp", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=env, limit=1 << 24)
        editor = cls(process)
        await editor.request("initialize", {"protocolVersion": 1, "clientCapabilities": capabilities})
        return editor

    async def request(self, method: str, params: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        self.nextId += 1
        requestId = self.nextId
        self.methods[json.dumps(requestId)] = method
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(frame(method, params, requestId))
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), deadline - asyncio.get_running_loop().time())
            assert line, "the agent closed stdout"
            message = json.loads(line)
            self.frames.append(message)
            if message.get("id") == requestId and "method" not in message:
                assert "result" in message, message
                return message["result"]

    async def prompt(self, sessionId: str, words: str) -> str:
        result = await self.request("session/prompt", {"sessionId": sessionId, "prompt": [{"type": "text", "text": words}]})
        return str(result["stopReason"])

    def updates(self) -> list[dict[str, Any]]:
        return [f["params"]["update"] for f in self.frames if f.get("method") == "session/update"]

    def problems(self) -> list[str]:
        return [p for f in self.frames for p in acpschema.checkAgentFrame(f, self.methods)]

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), 15)


COMPACTION = {"session": {"compaction": {}}}


def compactionUpdates(found: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each compaction's updates (compaction_update and chunks), in order."""
    byId: dict[str, list[dict[str, Any]]] = {}
    for u in found:
        if u["sessionUpdate"] in ("compaction_update", "compaction_summary_chunk"):
            byId.setdefault(u["compactionId"], []).append(u)
    return byId


@pytest_twisted.ensureDeferred
async def test_editorWithTheCapabilitySeesCompactionUpdates(scriptedServer, tmp_path) -> None:
    """With ``session.compaction``: ``compaction_update`` in_progress, the summary's chunks,
    completed with the summary, then a lower ``usage_update``; never a card. ``/compact
    FOCUS`` asks for that focus. After a restart, a load replays the finished compactions
    in the loading editor's form (updates, or cards for an editor without the capability),
    the model continues from the summary, and the older messages are still searchable."""
    model, url = scriptedServer
    model.window = WINDOW
    model.windows["scripted-model"] = WINDOW
    model.summaries = Script([[{"text": "## Goal\nRead the files"}, {"text": " one by one."}]], repeat=True)
    reading(model, 8)
    files(tmp_path, 8)
    home = str(tmp_path / "home")
    env = modelEnv(url, home)

    async def scenario():
        editor = await RawEditor.start(env, COMPACTION)
        sid = (await editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
        stops = [await editor.prompt(sid, f"turn {n} please") for n in range(6)]
        stops.append(await editor.prompt(sid, "/compact keep the file names"))
        await editor.close()
        later = await RawEditor.start(env, COMPACTION)
        await later.request("session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
        replayed = later.updates()
        stops.append(await later.prompt(sid, "turn 6 please"))
        await later.close()
        plain = await RawEditor.start(env, {})
        await plain.request("session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
        await plain.close()
        return sid, stops, editor, replayed, later, plain

    sid, stops, editor, replayed, later, plain = await onLoop(scenario())
    assert editor.problems() == later.problems() == plain.problems() == []
    assert stops == ["end_turn"] * 8
    live = editor.updates()
    assert not [u for u in live if u["sessionUpdate"] == "tool_call" and u["title"] == "Compact conversation"]
    compactions = compactionUpdates(live)
    assert len(compactions) >= 2
    for entries in compactions.values():
        assert entries[0] == {"sessionUpdate": "compaction_update", "compactionId": entries[0]["compactionId"],
                              "status": "in_progress"}
        assert entries[-1]["sessionUpdate"] == "compaction_update" and entries[-1]["status"] == "completed"
        assert all(e["sessionUpdate"] == "compaction_summary_chunk" for e in entries[1:-1])
        end = live.index(entries[-1])
        usage = next(u for u in live[end:] if u["sessionUpdate"] == "usage_update")
        before = [u["used"] for u in live[:end] if u["sessionUpdate"] == "usage_update"][-1]
        assert usage["used"] < before or before == 0
    requested = list(compactions.values())[-1]
    chunks = [e["content"]["text"] for e in requested[1:-1]]
    assert chunks and "".join(chunks) == "## Goal\nRead the files one by one."  # deltas coalesce
    assert requested[-1]["summary"][0]["text"].startswith("## Goal\nRead the files one by one.")
    assert "Focus on: keep the file names" in model.summaryRequests[-1]["messages"][1]["content"]
    # the replay: finished compactions as updates, without chunks, in the same places
    again = compactionUpdates(replayed)
    assert set(again) == set(compactions)
    assert all([e["status"] for e in entries] == ["in_progress", "completed"] for entries in again.values())
    cards = compactionCards(plain.updates())
    assert len(cards) == len(compactions) and all(c["status"] == "completed" for c in cards)
    assert "compaction_" not in json.dumps(plain.updates())
    # the model continues from the summary after the restart
    first = next(b for b in model.chatRequests if any(m.get("content") == "turn 6 please" for m in b["messages"]))
    assert summarised(first["messages"])
    assert "Read the files one by one." in json.dumps(first["messages"][:2])
    assert not any(m.get("content") == "turn 0 please" for m in first["messages"])
    with SessionDB(Path(home) / "state.db") as db:
        hits = db.searchMessages("turn 0 please")
    assert [h["sessionId"] for h in hits] == [sid], "the compacted-away prompt is still found, once"


def _bigSize() -> int:
    """Characters of a big prompt: three fit the small window's compaction threshold (0.9 of it
    less the reply's room, an eighth) beside the system prompt and the tools, whatever tools there
    are, and four do not, each with a margin of half a prompt."""
    from hermes_acp.engine.tools.builtin import BUILTIN_TOOLS

    fixed = len(json.dumps([tool.schema() for tool in BUILTIN_TOOLS.values()])) + 600  # and the prompt
    return (int(0.9 * (WINDOW - WINDOW // 8)) * 4 - fixed) * 2 // 7


BIG = _bigSize()


def big(n: int) -> str:
    """A big prompt (``BIG``): prompts are never shortened, so only a summary helps."""
    return f"big {n} " + "w" * BIG


def smallWindow(model: ScriptedModel, summaries: list[Any]) -> None:
    """The model has the small window (and says so in /models); it answers prompts "ok"
    and summary requests with ``summaries``."""
    model.window = WINDOW
    model.windows["scripted-model"] = WINDOW
    model.summaries = Script(summaries, repeat=True)
    model.default = Script([[{"text": "ok"}]], repeat=True)


async def stalledCompaction(conn: Any, model: ScriptedModel, cwd: Path) -> tuple[str, Any, list[str]]:
    """Big prompts until one's compaction's summary request stalls (the third or fourth, as
    the tools' schemas take more or less of the window): the session, that prompt's answer to
    come, and the prompts sent ("big 0", ...)."""
    sid = (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id
    for n in range(8):
        running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text(big(n))]))
        deadline = asyncio.get_running_loop().time() + 30
        while model.stalls < 1 and not running.done():
            assert asyncio.get_running_loop().time() < deadline, "the prompt neither ended nor stalled a summary"
            await asyncio.sleep(0.02)
        if model.stalls >= 1:
            return sid, running, [f"big {k}" for k in range(n + 1)]
        running.result()
    raise AssertionError("the summary request never came")


def liveMessages(home: str, sessionId: str) -> list[dict[str, Any]]:
    with SessionDB(Path(home) / "state.db") as db:
        return db.loadMessages(sessionId)


@pytest_twisted.ensureDeferred
async def test_compactCommandAndItsAlias(scriptedServer, tmp_path) -> None:
    """``/compact FOCUS`` (and ``/compress``) runs one compaction as a turn, queued like a
    prompt: a card for an editor without the capability, the focus in the summary request,
    the model's next request starting from the summary, the title left alone."""
    model, url = scriptedServer
    model.default.responses += [[{"text": f"answer {n} " + "y" * 2000}] for n in range(4)]
    home = str(tmp_path / "home")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            for n in range(2):
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(f"question {n}")]), 30)
            queued = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("/compact the API names")]))
            after = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("question 2")]))
            stops = [(await asyncio.wait_for(queued, 30)).stop_reason, (await asyncio.wait_for(after, 30)).stop_reason]
            stops.append((await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/compress")]), 30)).stop_reason)
            return sid, stops, updates(wire, sid), wire.problems()

    sid, stops, found, problems = await onLoop(scenario())
    assert problems == []
    assert stops == ["end_turn"] * 3
    cards = compactionCards(found)
    assert len(cards) == 2 and all(c["status"] == "completed" for c in cards)
    assert "Scripted summary 1." in cards[0]["content"][0]["content"]["text"]
    assert "Focus on: the API names" in model.summaryRequests[0]["messages"][1]["content"]
    assert "USER: question 0" in model.summaryRequests[0]["messages"][1]["content"]
    third = model.chatRequests[2]["messages"]
    assert summarised(third)
    assert [m["content"] for m in third if m["role"] == "user"][-1] == "question 2"
    assert "The previous summary" in model.summaryRequests[1]["messages"][1]["content"]
    history = liveMessages(home, sid)
    assert sum("compaction" in m for m in history) == 1
    assert not any(u["sessionUpdate"] == "session_info_update" and u["title"].startswith("/") for u in found)


@pytest_twisted.ensureDeferred
async def test_refusedSummariesSetTheOldestPromptsAside(scriptedServer, tmp_path) -> None:
    """Big prompts (the cheap pass cannot shorten them) and summaries the endpoint refuses:
    ``/compact`` sets the older prompts aside and says why (the endpoint's words); each later
    compaction sets the oldest aside too, without saying it again; after two failed summaries
    the agent stops asking for one; every prompt ends normally, without an overflow."""
    model, url = scriptedServer
    smallWindow(model, [[{"status": 400, "error": "summaries are not allowed here"}]])
    home = str(tmp_path / "home")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id

            async def prompt(words: str) -> str:
                return (await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(words)]), 30)).stop_reason

            stops = [await prompt(big(0)), await prompt(big(1))]
            before = liveMessages(home, sid)
            stops.append(await prompt("/compact"))
            compacted = liveMessages(home, sid)
            stops += [await prompt(big(n)) for n in range(2, 10)]
            return sid, stops, before, compacted, updates(wire, sid), wire.problems()

    sid, stops, before, compacted, found, problems = await onLoop(scenario())
    assert problems == []
    assert stops == ["end_turn"] * 11
    cards = compactionCards(found)
    assert len(cards) >= 3 and all(c["status"] == "completed" for c in cards)
    shown = [c["content"][0]["content"]["text"] for c in cards]
    assert shown[0].startswith("The summary could not be written (the summary request failed: ")
    assert "summaries are not allowed here" in shown[0] and "Set aside the 2 oldest messages" in shown[0]
    assert [m["content"][:5] for m in compacted[1:]] == ["big 1", "ok"] and "'big 0 w" in compacted[0]["content"]
    assert len(compacted) < len(before)
    assert all(s.startswith("Set aside the") for s in shown[1:]), "told once"
    assert len(model.summaryRequests) == 2 and model.overflows == 0  # /compact's, then one more
    history = liveMessages(home, sid)
    assert [m["content"][:6] for m in history if m["role"] == "user"][-1] == "big 9 "
    assert history[0]["content"].startswith("[Left out") and re.search(r"requests 'big \d+ w", history[0]["content"])


@pytest_twisted.ensureDeferred
async def test_cancelDuringACompaction(scriptedServer, tmp_path) -> None:
    """A cancel while the summary is being written ends the prompt as cancelled at once; the
    card ends failed ("Cancelled."), and the history is left as it was."""
    model, url = scriptedServer
    smallWindow(model, [[{"text": "## Goal\nhalf"}, {"stall": True}]])
    home = str(tmp_path / "home")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid, running, sent = await stalledCompaction(conn, model, tmp_path)
            before = len(liveMessages(home, sid)) + 1  # the last prompt's, once it has answered
            await conn.cancel(session_id=sid)
            stop = (await asyncio.wait_for(running, 10)).stop_reason
            return sid, before, stop, updates(wire, sid), sent, wire.problems()

    sid, before, stop, found, sent, problems = await onLoop(scenario())
    assert problems == []
    assert stop == "cancelled"
    cards = compactionCards(found)
    assert [c["status"] for c in cards] == ["failed"]
    assert cards[0]["content"][0]["content"]["text"] == "Cancelled."
    history = liveMessages(home, sid)
    assert not any("compaction" in m for m in history)
    assert [m["content"][:5] for m in history if m["role"] == "user"] == sent
    assert len(history) == before


@pytest_twisted.ensureDeferred
async def test_crashMidCompactionKeepsThePreviousHistory(scriptedServer, tmp_path) -> None:
    """kill -9 while the summary is being written: the next process loads the session with
    the compaction's card failed, the previous history (and an account of the cut turn) for
    the model, and goes on."""
    model, url = scriptedServer
    smallWindow(model, [[{"stall": True}]])
    home = str(tmp_path / "home")

    async def doomed():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid, running, sent = await stalledCompaction(conn, model, tmp_path)
            await journaled(home, sid, "Compact conversation")
            process.kill()
            await process.wait()
            running.cancel()
            return sid, sent

    async def reborn(sid):
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replayed = updates(wire, sid)
            return replayed, wire.problems()

    sid, sent = await onLoop(doomed())
    replayed, problems = await onLoop(reborn(sid))
    assert problems == []
    cards = compactionCards(replayed)
    assert [c["status"] for c in cards] == ["failed"]
    history = liveMessages(home, sid)
    assert not any("compaction" in m for m in history)
    assert [m["content"][:5] for m in history if m["role"] == "user"] == sent


@pytest_twisted.ensureDeferred
async def test_noProgressLeavesTheHistoryAndSaysSo(scriptedServer, tmp_path) -> None:
    """A prompt that alone nearly fills the window: there is nothing to compact it with, so
    each compaction makes no progress and is shown failed; the overflow that follows fails the
    prompt with advice (/compact, /reset). The next prompt compacts that exchange away and goes
    on, without a /reset."""
    model, url = scriptedServer
    smallWindow(model, [[{"text": "## Goal\nsay hi"}]])
    home = str(tmp_path / "home")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            error = None
            try:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("huge " + "h" * 30_000)]), 30)
            except Exception as e:  # the SDK's RequestError
                error = e
            kept = [m["content"][:5] for m in liveMessages(home, sid) if m["role"] == "user"]
            after = (await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi again")]), 30)).stop_reason
            return kept, error, after, updates(wire, sid), wire.problems()

    kept, error, after, found, problems = await onLoop(scenario())
    assert problems == []
    assert error is not None and "/reset" in str(error)
    cards = compactionCards(found)
    assert [c["status"] for c in cards] == ["failed", "failed", "completed"]
    assert all("no progress" in c["content"][0]["content"]["text"] for c in cards[:2])
    assert after == "end_turn"
    assert kept == ["hi", "huge "]  # the history as it was
    assert model.summaryRequests and all(tokensOf(b) <= WINDOW for b in model.summaryRequests)
    assert not any("h" * 1000 in json.dumps(m) for m in model.chatRequests[-1]["messages"])


#: Summary requests that fail: a reasoning model spending all its ``max_tokens`` thinking (an
#: empty answer), an HTTP error, and garbage where the stream should be (broken SSE, a web page).
FAILING_SUMMARIES = {
    "empty": [{"reasoning": "Let me think about how to summarise this. " * 20}, {"finish": "length"}],
    "http-error": [{"status": 400, "error": "summaries are not allowed here"}],
    "garbage": [{"raw": "data: {this is not JSON\n\n"}],
    "html": [{"status": 200, "body": "<html><body>Welcome to our portal</body></html>"}],
}


@pytest.mark.parametrize("failure", list(FAILING_SUMMARIES))
@pytest_twisted.ensureDeferred
async def test_aFailingSummaryNeverStopsTheSession(scriptedServer, tmp_path, failure) -> None:
    """A summary model that fails every time (issue 22, item 8): 14 turns of 8 KB reads in a
    8,000-token window (about 3,400 of it the tools' schemas) all end ``end_turn``: the oldest exchanges are set aside instead (the
    card says so, and that the summary failed), every request fits and is well-formed, the
    user's latest request reaches the model verbatim, and what was set aside is still found
    by a search. ``/compact`` makes room the same way, and says so."""
    model, url = scriptedServer
    window, turns = 8000, 14
    model.window = window
    model.windows["scripted-model"] = window
    model.summaries = Script([FAILING_SUMMARIES[failure]], repeat=True)
    reading(model, turns)
    model.addRule("one more", [[{"text": "sure"}]])
    files(tmp_path, turns, 8192)
    home = str(tmp_path / "home")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            stops = []
            for n in range(turns):
                answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(f"turn {n} please")]), 60)
                stops.append(answer.stop_reason)
            stops.append((await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/compact")]), 60)).stop_reason)
            stops.append((await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("one more")]), 60)).stop_reason)
            return sid, stops, updates(wire, sid), wire.problems()

    sid, stops, found, problems = await onLoop(scenario())
    assert problems == []
    assert stops == ["end_turn"] * (turns + 2)
    assert model.overflows == 0
    for body in model.chatRequests:
        wellFormed(body["messages"])
        roles = [m["role"] for m in body["messages"]]
        assert ("user", "user") not in zip(roles, roles[1:]), "two user turns in a row"
        assert tokensOf(body) <= window
    for n in range(turns):
        first = next(b for b in model.chatRequests if any(m.get("content") == f"turn {n} please" for m in b["messages"]))
        assert first["messages"][-1] == {"role": "user", "content": f"turn {n} please"}
    assert "done 13" in agentText(found)
    cards = compactionCards(found)
    assert len(cards) >= 5 and all(c["status"] == "completed" for c in cards)
    shown = [c["content"][0]["content"]["text"] for c in cards]
    automatic, requested = shown[:-1], shown[-1]
    assert automatic[0].startswith("The summary could not be written (")
    assert not any("could not be written" in s for s in automatic[1:]), "told once, not at every compaction"
    assert all("oldest messages: they are archived, and session_search still finds them" in s for s in automatic)
    assert len(model.summaryRequests) == 2 + 1, "two failures in a row, then only /compact asks"
    assert requested.startswith("The summary could not be written (")  # /compact says so, and made room
    before, after = (int(n.replace(",", "")) for n in re.findall(r"_About ([\d,]+) → ([\d,]+) tokens\._", requested)[0])
    assert after < before
    last = model.chatRequests[-1]["messages"]
    assert "Left out to fit the context window" in last[0]["content"] and "session_search" in last[0]["content"]
    named = re.findall(r"'(turn \d+ please)'", last[0]["content"])
    assert len(named) == 5 and not any(m.get("content") in named for m in last[1:]), "it names the newest left out"
    assert not any(m.get("content") == "turn 0 please" for m in last)
    assert last[-1] == {"role": "user", "content": "one more"}
    with SessionDB(Path(home) / "state.db") as db:
        hits = db.searchMessages("turn 0 please")
    assert [h["sessionId"] for h in hits] == [sid], "what was set aside is still found, once"
