"""What the agent saves, end to end: a turn the store refuses (a full disk) is kept and
saved later, and the user hears of it; stdin closing mid-turn shuts down without a
traceback and with the turn saved; ``session/list`` offers only sessions with a
conversation."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import sqlite3
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import acp
import pytest
import pytest_twisted

from hermes_acp.sessions import NOT_SAVED, SAVED

from .e2e import agentText, journaled, modelEnv, text, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw, settled, until


@pytest.fixture
def smallDisk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (a disk that fills up); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; returns it (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


def chat(url: str, words: str) -> None:
    """One chat request of our own to the scripted model (it lets a ``barrier`` pass)."""
    body = json.dumps({"model": "scripted-model", "messages": [{"role": "user", "content": words}]}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def told(wire, sessionId: str) -> list[tuple[str, str]]:
    """The (title, description) of each notice about saving: a ``notice``, or its text in
    an ``agent_message_chunk`` for an editor that takes no notices."""
    found = []
    for update in updates(wire, sessionId):
        if update["sessionUpdate"] == "notice":
            found.append((update["title"], update["description"]))
        elif update["sessionUpdate"] == "agent_message_chunk":
            found += re.findall(rf"^_({NOT_SAVED}|{SAVED}): (.*)_\n\n$", update["content"]["text"], re.S)
    return found


NOTICES = {"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}}


async def turnWhileTheDiskFills(server, url: str, conn, sid: str, disk: Path) -> tuple[object, Path]:
    """Prompt "second" and fill ``disk`` while its turn runs (its reply waits for one more
    chat request, made once the disk is full); its answer, and the file to delete to free
    the space."""
    server.addRule("release", [[{"text": "released"}]])
    server.addRule("second", [[{"text": "two, "}, {"barrier": len(server.chatRequests) + 2}, {"text": "done"}]])
    second = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("second")]))
    await settled(server.whenChatRequests(len(server.chatRequests) + 1))
    filler = fill(disk)
    await asyncio.to_thread(chat, url, "release")
    return await asyncio.wait_for(second, 60), filler


async def replayedByANewProcess(url: str, home: str, sid: str, cwd: Path) -> tuple[list[dict], list[str]]:
    """A new agent process loads the session: what it replayed, and any problem on the wire."""
    async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
        await initialized(conn)
        await conn.load_session(session_id=sid, cwd=str(cwd), mcp_servers=[])
        return updates(wire, sid), wire.problems()


def said(server) -> list[str]:
    """What the conversation in the model's last request said."""
    return [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] in ("user", "assistant")]


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
@pytest_twisted.ensureDeferred
async def test_turnOnAFullDiskIsKeptAndSavedLater(scriptedServer, smallDisk, tmp_path, notices) -> None:
    """The disk fills during a turn: the turn answers, the user is told it is not saved
    yet (a notice, or a line of text for an editor without notices); a prompt while the
    disk is still full is refused with the store's error (and the kept turn is not lost
    to a reload); once space is freed the next prompt saves the kept turn first (the
    user is told) and the model sees it. A new process loads every turn."""
    server, url = scriptedServer
    home = smallDisk / "home"
    server.addRule("first", [[{"text": "one"}]])
    server.addRule("third", [[{"text": "three"}]])
    server.addRule("fourth", [[{"text": "four"}]])

    async def firstLife():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, client, wire, process):
            await (raw(conn, "initialize", NOTICES) if notices else initialized(conn))
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            assert (await conn.prompt(session_id=sid, prompt=[text("first")])).stop_reason == "end_turn"
            answered, filler = await turnWhileTheDiskFills(server, url, conn, sid, smallDisk)
            toldThen = told(wire, sid)
            with pytest.raises(acp.RequestError) as refused:
                await conn.prompt(session_id=sid, prompt=[text("while full")])
            filler.unlink()
            third = await conn.prompt(session_id=sid, prompt=[text("third")])
            return sid, answered, toldThen, refused.value, third, told(wire, sid), said(server), wire.problems()

    async def secondLife(sid):
        async with connect(env=modelEnv(url, str(home))) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replayed, toldAgain = updates(wire, sid), told(wire, sid)
            await conn.prompt(session_id=sid, prompt=[text("fourth")])
            return replayed, toldAgain, said(server), wire.problems()

    sid, answered, toldThen, refused, third, allTold, seen, problems = await onLoop(firstLife())
    assert problems == []
    assert answered.stop_reason == "end_turn"
    assert [title for title, _ in toldThen] == [NOT_SAVED]
    assert "full" in toldThen[0][1] and "kept in memory" in toldThen[0][1]
    assert refused.code == -32603 and "full" in str(refused) and "kept in memory" in str(refused)
    assert third.stop_reason == "end_turn"
    assert [title for title, _ in allTold] == [NOT_SAVED, SAVED]
    assert seen == ["first", "one", "second", "two, done", "third"]  # the kept turn, not "while full"

    replayed, toldAgain, seen, problems = await onLoop(secondLife(sid))
    assert problems == []
    assert toldAgain == []  # the notices told of then; a replay does not repeat them
    prompts = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
    assert prompts == ["first", "second", "third"]
    assert agentText(replayed) == "onetwo, donethree"
    assert seen == ["first", "one", "second", "two, done", "third", "three", "fourth"]


@pytest_twisted.ensureDeferred
async def test_keptTurnOfAClosedSessionIsSavedWhenItLoads(scriptedServer, smallDisk, tmp_path) -> None:
    """A session closed while its last turn is kept in memory: loading it after space is
    freed saves that turn first, so it replays as it ended (not as interrupted), in this
    process and the next."""
    server, url = scriptedServer
    home = smallDisk / "home"
    server.addRule("after", [[{"text": "later"}]])

    async def firstLife():
        async with connect(env=modelEnv(url, str(home))) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            answered, filler = await turnWhileTheDiskFills(server, url, conn, sid, smallDisk)
            await conn.close_session(session_id=sid)
            filler.unlink()
            before = len(updates(wire, sid))
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replayed = updates(wire, sid)[before:]
            await conn.prompt(session_id=sid, prompt=[text("after")])
            return sid, answered, replayed, said(server), wire.problems()

    sid, answered, replayed, seen, problems = await onLoop(firstLife())
    assert problems == []
    assert answered.stop_reason == "end_turn"
    assert agentText(replayed) == "two, done"
    assert seen == ["second", "two, done", "after"]
    replayed, problems = await onLoop(replayedByANewProcess(url, str(home), sid, tmp_path))
    assert problems == []
    assert agentText(replayed) == "two, donelater"


@pytest_twisted.ensureDeferred
async def test_stdinClosedMidTurnShutsDownQuietly(scriptedServer, tmp_path) -> None:
    """stdin closes during a turn while another process holds state.db's write lock for
    longer than the shutdown's grace: the agent waits for the turn's save before it
    closes the store, exits 0 without a traceback or a critical line, and the turn is
    saved as ended (not recovered as interrupted)."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.addRule("long", [[{"text": "partial"}, {"stall": True}]])
    log = tmp_path / "agent.log"

    async def vanish():
        with open(log, "wb") as stderr:
            async with connect(env=modelEnv(url, home), stderr=stderr) as (conn, client, wire, process):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("long job")]))
                await settled(server.whenStalled())
                await journaled(home, sid, "partial")
                other = sqlite3.connect(Path(home) / "state.db", isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")
                    process.stdin.close()
                    await asyncio.sleep(3)  # beyond the 1 s shutdown grace; within the 10 s busy timeout
                    other.execute("COMMIT")
                finally:
                    other.close()
                code = await asyncio.wait_for(process.wait(), 30)
                prompt.cancel()
                return sid, code

    sid, code = await onLoop(vanish())
    said = log.read_text()
    assert code == 0
    assert "Traceback" not in said and "#critical" not in said, said
    with sqlite3.connect(Path(home) / "state.db") as db:
        state, count = db.execute("SELECT turn_state, message_count FROM acp_sessions WHERE session_id = ?",
                                  (sid,)).fetchone()
    assert (state, count) == ("idle", 2)  # ended, with the user's words and the answer so far
    replayed, problems = await onLoop(replayedByANewProcess(url, home, sid, tmp_path))
    assert problems == []
    assert [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"] == ["long job"]
    assert agentText(replayed) == "partial"  # no "interrupted" line: the turn ended in order


@pytest_twisted.ensureDeferred
async def test_listOffersOnlySessionsWithAConversation(scriptedServer, tmp_path) -> None:
    """``session/list`` leaves out a session that never got a prompt and one that got only
    slash commands; one with a prompt, or named with ``/title``, is listed. Every one of
    them still loads by id."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            new = lambda: conn.new_session(cwd=str(tmp_path), mcp_servers=[])  # noqa: E731
            empty = (await new()).session_id
            commanded = (await new()).session_id
            await conn.prompt(session_id=commanded, prompt=[text("/help")])
            named = (await new()).session_id
            await conn.prompt(session_id=named, prompt=[text("/title Named chat")])
            prompted = (await new()).session_id
            await conn.prompt(session_id=prompted, prompt=[text("hello there")])
            untouched = (await new()).session_id  # the newest: it used to come first, as a bare id
            listed = [(s.session_id, s.title) for s in (await conn.list_sessions()).sessions]
            filtered = [s.session_id for s in (await conn.list_sessions(cwd=str(tmp_path))).sessions]
            for sid in (empty, commanded, untouched):
                await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            return (empty, commanded, named, prompted, untouched), listed, filtered, wire.problems()

    (empty, commanded, named, prompted, untouched), listed, filtered, problems = await onLoop(scenario())
    assert problems == []
    assert listed == [(prompted, "hello there"), (named, "Named chat")]
    assert filtered == [prompted, named]


@pytest_twisted.ensureDeferred
async def test_aCancelledTurnNotSavedSaysNothingAfterItsAnswer(scriptedServer, tmp_path) -> None:
    """A turn cancelled while its text streams answers "cancelled" before it is saved. When
    the store refuses that save (another process holds state.db's write lock past the busy
    timeout, twice: about 20 s), an editor that takes no notices gets no line of text about
    it after that answer (it would read as part of no turn); the next prompt saves the kept
    turn (and says so, in its turn), and the model sees it."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.addRule("first", [[{"text": "one"}]])
    server.addRule("second", [[{"text": "two, "}, {"stall": True}]])
    server.addRule("third", [[{"text": "three"}]])
    log = tmp_path / "agent.log"

    async def life():
        with open(log, "wb") as stderr:
            async with connect(RecordingClient(), env=modelEnv(url, home), stderr=stderr) as (conn, client, wire, process):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                assert (await conn.prompt(session_id=sid, prompt=[text("first")])).stop_reason == "end_turn"
                second = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("second")]))
                await settled(server.whenStalled())
                await journaled(home, sid, "two, ")  # what it showed is saved: its end is what is refused
                other = sqlite3.connect(Path(home) / "state.db", isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")
                    await conn.cancel(session_id=sid)
                    answered = await asyncio.wait_for(second, 30)
                    await until(lambda: b"not saved yet" in log.read_bytes(), 40, "the turn's save refused")
                    other.execute("COMMIT")
                finally:
                    other.close()
                third = await conn.prompt(session_id=sid, prompt=[text("third")])
                answerAt = next(i for i, f in enumerate(wire.received)
                                if isinstance(f.get("result"), dict) and f["result"].get("stopReason") == "cancelled")
                afterAnswer = [f["params"]["update"] for f in wire.received[answerAt:] if f.get("method") == "session/update"]
                return answered, third, afterAnswer, told(wire, sid), said(server), wire.problems()

    answered, third, afterAnswer, allTold, seen, problems = await onLoop(life())
    assert problems == []
    assert answered.stop_reason == "cancelled" and third.stop_reason == "end_turn"
    assert [u["content"]["text"] for u in afterAnswer if NOT_SAVED in u.get("content", {}).get("text", "")] == []
    assert [title for title, _ in allTold] == [SAVED]  # by the next prompt, in its turn
    assert seen == ["first", "one", "second", "two, ", "third"]
