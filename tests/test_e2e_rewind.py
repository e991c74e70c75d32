"""Rewinds end to end: the real process, the SDK client and the scripted model. Four turns
(writes, a patch, a command that deletes a file and changes a binary one, a command that
makes a build folder) are taken back to before turn 2, byte for byte; the model's next
request, a reload after a restart and the store agree; a user's edit is asked about; /undo
twice; session/delete and pruning of the checkpoints."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest_twisted
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

from hermes_acp.store import SessionDB

from .e2e import agentText, modelEnv, text, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw, settled
from .test_checkpoints import tree

BINARY = bytes(range(256)) * 8


def call(name: str, **arguments: Any) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"id": name[:2], "name": name, "arguments": arguments}]}]


def command(line: str) -> list[dict[str, Any]]:
    return call("terminal", command=line)


class Editor(RecordingClient):
    """Allows every tool call; answers a rewind's question about the user's files with the
    next of ``choices`` (an option id, or None to dismiss it)."""

    def __init__(self, *choices: str | None) -> None:
        super().__init__(self.answer)
        self.choices = list(choices)
        self.rewindQuestions: list[Any] = []

    def answer(self, request: dict[str, Any]) -> RequestPermissionResponse:
        ids = [option.option_id for option in request["options"]]
        if "overwrite" not in ids:
            return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))
        self.rewindQuestions.append(request["toolCall"])
        choice = self.choices.pop(0)
        if choice is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))


async def say(conn: Any, client: Editor, sessionId: str, words: str) -> str:
    """One prompt; the agent's text in answer to it."""
    before = len(client.updates)
    await conn.prompt(session_id=sessionId, prompt=[text(words)])
    found = [u.model_dump(by_alias=True, exclude_none=True) for _, u in client.updates[before:]]
    return agentText(found)


def project(root: Path) -> Path:
    root.mkdir()
    (root / "notes.txt").write_text("one\n")
    (root / "logo.bin").write_bytes(BINARY)
    (root / "doomed.txt").write_text("delete me\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("build/\n")
    return root


def userTexts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


@pytest_twisted.ensureDeferred
async def test_rewindToTurnTwoThroughTheRealProcess(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    home = str(tmp_path / "home")
    folder = project(tmp_path / "project")
    server.addRule("turn one", [call("write_file", path="a.txt", content="alpha\n"), [{"text": "Done one."}]])
    server.addRule("turn two", [
        [{"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "notes.txt", "content": "two\n"}},
                         {"id": "w2", "name": "write_file", "arguments": {"path": "src/new.txt", "content": "new\n"}}]}],
        [{"text": "Done two."}]])
    server.addRule("turn three", [
        call("patch", path="notes.txt", old_string="two", new_string="three"),
        command("rm doomed.txt && printf 'XYZ' > logo.bin && chmod 600 run.sh"),
        [{"text": "Done three."}]])
    server.addRule("turn four", [command("mkdir -p build/out && echo obj > build/out/main.o"), [{"text": "Done four."}]])
    server.addRule("after the rewind", [[{"text": "Fresh start."}]])
    server.addRule("after the restart", [[{"text": "Still here."}]])
    client = Editor(None, "overwrite")
    state: dict[str, Any] = {}

    async def firstLife() -> None:
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sessionId = state["id"] = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            commands = await client.waitForUpdate(lambda _, u: u["sessionUpdate"] == "available_commands_update")
            assert {"rewind", "undo"} <= {c["name"] for c in commands["availableCommands"]}
            await say(conn, client, sessionId, "turn one")
            state["before two"] = tree(folder)
            await say(conn, client, sessionId, "turn two")
            await say(conn, client, sessionId, "turn three")
            (folder / "notes.txt").write_text("the user's edit\n")  # after turn 3: asked about
            await say(conn, client, sessionId, "turn four")
            assert (folder / "build" / "out" / "main.o").exists() and not (folder / "doomed.txt").exists()

            listing = await say(conn, client, sessionId, "/rewind")
            for number, words in enumerate(["turn one", "turn two", "turn three", "turn four"], 1):
                assert f"{number}. “{words}”" in listing
            assert "1 created (`a.txt`)" in listing and "`doomed.txt`" in listing
            assert "1 ignored path(s)" in listing  # build/, said

            # Dismissing the question cancels the whole rewind: nothing changed.
            changed = tree(folder)
            reply = await say(conn, client, sessionId, "/rewind 2")
            assert "Rewind cancelled" in reply and tree(folder) == changed
            question = client.rewindQuestions[0]
            assert [Path(location.path).name for location in question.locations] == ["notes.txt"]
            assert "notes.txt" in question.content[0].content.text

            reply = await say(conn, client, sessionId, "/rewind 2")
            assert tree(folder) == state["before two"]  # byte for byte: binary, mode, deletions, build/
            assert "Overwrote your changes to `notes.txt`" in reply
            assert "cannot be undone" in reply and "3 turns" in reply

            await say(conn, client, sessionId, "after the rewind")
            sent = server.chatRequests[-1]["messages"]
            assert userTexts(server.chatRequests[-1]) == ["turn one", "after the rewind"]
            assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
            assert sent[4]["content"] == "Done one."
            state["live"] = updates(wire, sessionId)
            assert wire.problems() == []

    async def secondLife() -> None:
        async with connect(Editor(), env=modelEnv(url, home)) as (conn, client_, wire, process):
            await initialized(conn)
            sessionId = state["id"]
            await conn.load_session(cwd=str(folder), session_id=sessionId, mcp_servers=[])
            replayed = updates(wire, sessionId)
            prompts = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
            assert prompts == ["turn one", "/rewind 2", "after the rewind"]
            said = agentText(replayed)
            assert "Done one." in said and "Fresh start." in said
            assert not any(words in said for words in ("Done two.", "Done three.", "Done four."))
            await conn.prompt(session_id=sessionId, prompt=[text("after the restart")])
            assert userTexts(server.chatRequests[-1]) == ["turn one", "after the rewind", "after the restart"]
            # The checkpoints survived the restart: turn 1's is there to rewind to.
            listing = await say(conn, client_, sessionId, "/rewind")
            assert "1. “turn one” — 1 created (`a.txt`)" in listing and "3. “after the restart”" in listing
            await say(conn, client_, sessionId, "/rewind 1")
            assert not (folder / "a.txt").exists()
            assert wire.problems() == []

    await onLoop(firstLife())
    await onLoop(secondLife())
    with SessionDB(Path(home) / "state.db") as db:  # the cut turns stay searchable
        hits = db.searchMessages("turn three")
        assert any(hit["sessionId"] == state["id"] and hit["seq"] < 0 for hit in hits)


@pytest_twisted.ensureDeferred
async def test_undoTwiceKeepsTheUsersEditAndDeleteRemovesCheckpoints(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    home = tmp_path / "home"
    folder = project(tmp_path / "project")
    server.addRule("first", [call("write_file", path="a.txt", content="a1\n"), [{"text": "one"}]])
    server.addRule("second", [call("write_file", path="b.txt", content="b\n"), [{"text": "two"}]])
    server.addRule("third", [
        [{"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "a.txt", "content": "a3\n"}},
                         {"id": "w2", "name": "write_file", "arguments": {"path": "c.txt", "content": "c\n"}}]}],
        [{"text": "three"}]])
    server.addRule("next", [[{"text": "ok"}]])
    client = Editor("keep")

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            for words in ("first", "second", "third"):
                await say(conn, client, sessionId, words)
            (folder / "c.txt").write_text("the user's c\n")
            reply = await say(conn, client, sessionId, "/undo")
            assert "before turn 3" in reply and "Kept your changes to `c.txt`" in reply
            assert (folder / "a.txt").read_text() == "a1\n" and (folder / "c.txt").read_text() == "the user's c\n"
            reply = await say(conn, client, sessionId, "/undo")
            assert "before turn 2" in reply and not (folder / "b.txt").exists()
            assert (folder / "a.txt").read_text() == "a1\n"
            await say(conn, client, sessionId, "next")
            assert userTexts(server.chatRequests[-1]) == ["first", "next"]
            assert len(client.rewindQuestions) == 1
            sessions = home / "checkpoints" / "sessions"
            assert (sessions / sessionId).is_dir()
            assert await raw(conn, "session/delete", {"sessionId": sessionId}) == {}
            assert not (sessions / sessionId).exists()
            assert not [name for _, _, names in os.walk(home / "checkpoints" / "objects") for name in names]
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_theStoreIsPrunedToItsBound(scriptedServer, tmp_path) -> None:
    """With HERMES_ACP_CHECKPOINT_STORE_MAX at 1 MiB, turns that each write 400 kB of new
    content leave the store under it, and /rewind says which turns lost their checkpoints."""
    server, url = scriptedServer
    home = tmp_path / "home"
    folder = project(tmp_path / "project")
    server.repeat = True
    server.addRule("grow", [command("head -c 400000 /dev/urandom > big.bin"), [{"text": "grown"}]])
    client = Editor()

    async def scenario() -> None:
        env = modelEnv(url, str(home), HERMES_ACP_CHECKPOINT_STORE_MAX=str(1024 * 1024))
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            for _ in range(5):
                await say(conn, client, sessionId, "grow")
            listing = await say(conn, client, sessionId, "/rewind")
            assert "checkpoint was pruned" in listing
            size = sum(p.stat().st_size for p in (home / "checkpoints").rglob("*") if p.is_file())
            assert size <= 1024 * 1024
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aRewindSentDuringATurnWaitsForIt(scriptedServer, tmp_path) -> None:
    """/undo sent while a turn runs is queued behind it (slash commands are turns): it answers
    after that turn, and takes that turn back, its file included."""
    server, url = scriptedServer
    folder = project(tmp_path / "project")
    server.addRule("slow", [call("write_file", path="slow.txt", content="s\n"),
                            [{"stall": 1.0}, {"text": "Slow done."}]])
    client = Editor()

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(tmp_path / "home"))) as (conn, _, wire, process):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            slow = asyncio.ensure_future(conn.prompt(session_id=sessionId, prompt=[text("slow")]))
            await settled(server.whenChatRequests(2))  # written; the model now stalls a second
            assert (folder / "slow.txt").exists()
            undo = asyncio.ensure_future(conn.prompt(session_id=sessionId, prompt=[text("/undo")]))
            done, _ = await asyncio.wait([slow, undo], return_when=asyncio.FIRST_COMPLETED, timeout=30)
            assert done == {slow}
            await asyncio.wait_for(undo, 30)
            assert not (folder / "slow.txt").exists()
            assert "Rewound to before turn 1" in agentText(updates(wire, sessionId))
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_withCheckpointsOffARewindCutsTheConversationOnly(scriptedServer, tmp_path) -> None:
    """HERMES_ACP_CHECKPOINTS=off: no store is written; /undo says files stay, and cuts the turn."""
    server, url = scriptedServer
    home = tmp_path / "home"
    folder = project(tmp_path / "project")
    server.addRule("write it", [call("write_file", path="kept.txt", content="k\n"), [{"text": "written"}]])
    server.addRule("next", [[{"text": "ok"}]])
    client = Editor()

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(home), HERMES_ACP_CHECKPOINTS="off")) as (conn, _, wire, _p):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            await say(conn, client, sessionId, "write it")
            assert "HERMES_ACP_CHECKPOINTS=off" in await say(conn, client, sessionId, "/rewind")
            reply = await say(conn, client, sessionId, "/undo")
            assert "no file was put back" in reply and (folder / "kept.txt").exists()
            await say(conn, client, sessionId, "next")
            assert userTexts(server.chatRequests[-1]) == ["next"]
            assert not (home / "checkpoints").exists()
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aRewindAsksBeforeTakingBackAnotherSessionsWork(scriptedServer, tmp_path) -> None:
    """Two sessions in one folder: B's turn writes while A's turn runs, so A's record of what
    its turn changed holds B's file too. A's /undo takes back A's file, asks about B's, and
    keeps it when told to; a session working after A's turn ended is not asked about."""
    server, url = scriptedServer
    folder = project(tmp_path / "project")
    server.addRule("slow", [call("write_file", path="mine.txt", content="A's\n"), [{"stall": True}]])
    server.addRule("meanwhile", [call("write_file", path="theirs.txt", content="B's work\n"), [{"text": "B done."}]])
    server.addRule("later", [call("write_file", path="later.txt", content="B later\n"), [{"text": "B again."}]])
    client = Editor("keep")

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(tmp_path / "home"))) as (conn, _, wire, process):
            await initialized(conn)
            a = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            b = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            slow = asyncio.ensure_future(conn.prompt(session_id=a, prompt=[text("slow")]))
            await settled(server.whenStalled(1))  # A wrote mine.txt; its model now never answers
            await asyncio.wait_for(say(conn, client, b, "meanwhile"), 30)
            await conn.cancel(session_id=a)
            await asyncio.wait_for(slow, 30)
            await asyncio.wait_for(say(conn, client, b, "later"), 30)
            reply = await asyncio.wait_for(say(conn, client, a, "/undo"), 30)
            assert len(client.rewindQuestions) == 1
            question = client.rewindQuestions[0]
            assert [Path(location.path).name for location in question.locations] == ["theirs.txt"]
            assert "another session" in question.content[0].content.text
            assert "Kept your changes to `theirs.txt`" in reply
            assert not (folder / "mine.txt").exists()
            assert (folder / "theirs.txt").read_text() == "B's work\n"
            assert (folder / "later.txt").read_text() == "B later\n"
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aSessionLoadedInAnotherFolderLeavesTheOldOneAlone(scriptedServer, tmp_path) -> None:
    """A session loaded with another working folder: /undo cuts the turn but writes nothing in
    the folder the turn ran in, which is no longer one of the session's, and says so."""
    server, url = scriptedServer
    home = str(tmp_path / "home")
    first, second = project(tmp_path / "first"), project(tmp_path / "second")
    server.addRule("write it", [call("write_file", path="a.txt", content="a\n"), [{"text": "written"}]])
    state: dict[str, Any] = {}

    async def write() -> None:
        client = Editor()
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, _p):
            await initialized(conn)
            state["id"] = (await conn.new_session(cwd=str(first), mcp_servers=[])).session_id
            await say(conn, client, state["id"], "write it")

    async def undoElsewhere() -> None:
        client = Editor()
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, _p):
            await initialized(conn)
            await conn.load_session(cwd=str(second), session_id=state["id"], mcp_servers=[])
            reply = await say(conn, client, state["id"], "/undo")
            assert "Rewound to before turn 1" in reply
            assert f"{os.path.realpath(first)} is not one of this session's folders now" in reply
            assert (first / "a.txt").read_text() == "a\n"
            assert wire.problems() == []

    await onLoop(write())
    await onLoop(undoElsewhere())


@pytest_twisted.ensureDeferred
async def test_anIgnoredFolderTheUserWroteInIsAskedAbout(scriptedServer, tmp_path) -> None:
    """An ignored folder a turn created is removed by its /undo (no copy of it is kept),
    unless something in it changed after the turn: then the user is asked, and "keep" keeps it.
    An ignored folder no one touched since goes without a question."""
    server, url = scriptedServer
    folder = project(tmp_path / "project")
    server.addRule("build it", [command("mkdir -p build && echo generated > build/gen.txt"), [{"text": "built"}]])
    server.addRule("again", [command("mkdir -p build && echo generated > build/gen.txt"), [{"text": "built"}]])
    client = Editor("keep")

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(tmp_path / "home"))) as (conn, _, wire, _p):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            await say(conn, client, sessionId, "build it")
            await asyncio.sleep(0.05)  # past the file system's clock tick
            (folder / "build" / "mine.txt").write_text("the user's own notes\n")
            reply = await say(conn, client, sessionId, "/undo")
            assert [Path(location.path).name for location in client.rewindQuestions[0].locations] == ["build"]
            assert "Kept your changes to `build`" in reply
            assert (folder / "build" / "mine.txt").read_text() == "the user's own notes\n"
            (folder / "build" / "mine.txt").unlink()
            (folder / "build" / "gen.txt").unlink()
            (folder / "build").rmdir()
            await say(conn, client, sessionId, "again")
            await say(conn, client, sessionId, "/undo")
            assert not (folder / "build").exists() and len(client.rewindQuestions) == 1
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_whatABackgroundProcessWritesAfterItsTurnIsAskedAboutNotUndone(scriptedServer, tmp_path) -> None:
    """A turn writes a file and starts a background process that appends to it and makes
    another after the turn ended: /undo asks before overwriting the appended file, keeps it
    when told, and leaves the process's new file alone."""
    server, url = scriptedServer
    folder = project(tmp_path / "project")
    server.addRule("start it", [
        call("write_file", path="out.txt", content="agent\n"),
        [{"tool_calls": [{"id": "bg", "name": "terminal", "arguments": {
            "command": "sleep 3 && echo bg >> out.txt && echo made > bg.txt", "background": True}}]}],
        [{"text": "started"}]])
    client = Editor("keep")

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(tmp_path / "home"))) as (conn, _, wire, _p):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            await say(conn, client, sessionId, "start it")
            for _ in range(300):  # the process writes 3 s after it starts, long after the turn's end
                if (folder / "bg.txt").exists():
                    break
                await asyncio.sleep(0.1)
            assert (folder / "out.txt").read_text() == "agent\nbg\n" and (folder / "bg.txt").exists()
            reply = await say(conn, client, sessionId, "/undo")
            assert [Path(location.path).name for location in client.rewindQuestions[0].locations] == ["out.txt"]
            assert "Kept your changes to `out.txt`" in reply
            assert (folder / "out.txt").read_text() == "agent\nbg\n" and (folder / "bg.txt").read_text() == "made\n"
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aResetAndAForkBoundWhatCanBeRewound(scriptedServer, tmp_path) -> None:
    """After /reset the turns before it are listed as not rewindable and /rewind to one of
    them changes nothing; /undo takes back the turn after it. A fork rewinds only its own
    turns: its /undo leaves the parent's files."""
    server, url = scriptedServer
    folder = project(tmp_path / "project")
    for name in ("one", "two", "three", "forked"):
        server.addRule(f"write {name}", [call("write_file", path=f"{name}.txt", content=f"{name}\n"),
                                         [{"text": f"wrote {name}"}]])
    client = Editor()

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(tmp_path / "home"))) as (conn, _, wire, _p):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            await say(conn, client, sessionId, "write one")
            await say(conn, client, sessionId, "write two")
            await say(conn, client, sessionId, "/reset")
            await say(conn, client, sessionId, "write three")
            listing = await say(conn, client, sessionId, "/rewind")
            assert listing.count("cannot be rewound to") == 2 and "3. “write three”" in listing
            reply = await say(conn, client, sessionId, "/rewind 1")
            assert "cannot be rewound to" in reply and "Nothing changed" in reply
            assert all((folder / f"{name}.txt").exists() for name in ("one", "two", "three"))
            reply = await say(conn, client, sessionId, "/undo")
            assert "before turn 3" in reply and not (folder / "three.txt").exists()
            assert (folder / "two.txt").exists()

            fork = (await conn.fork_session(session_id=sessionId, cwd=str(folder), mcp_servers=[])).session_id
            assert "No turn to rewind to yet" in await say(conn, client, fork, "/rewind")
            await say(conn, client, fork, "write forked")
            reply = await say(conn, client, fork, "/undo")
            assert "before turn 1" in reply and not (folder / "forked.txt").exists()
            assert (folder / "one.txt").exists() and (folder / "two.txt").exists()
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aFailedCheckpointIsSaidNotTakenForNoChange(scriptedServer, tmp_path) -> None:
    """The store cannot be written ($HERMES_HOME/checkpoints is a file): the turn still runs,
    and /rewind and /undo say its checkpoint failed instead of "no file changes"."""
    server, url = scriptedServer
    home = tmp_path / "home"
    home.mkdir()
    (home / "checkpoints").write_text("not a folder\n")
    folder = project(tmp_path / "project")
    server.addRule("write it", [call("write_file", path="a.txt", content="a\n"), [{"text": "written"}]])
    client = Editor()

    async def scenario() -> None:
        async with connect(client, env=modelEnv(url, str(home))) as (conn, _, wire, _p):
            await initialized(conn)
            sessionId = (await conn.new_session(cwd=str(folder), mcp_servers=[])).session_id
            await say(conn, client, sessionId, "write it")
            assert (folder / "a.txt").exists()
            listing = await say(conn, client, sessionId, "/rewind")
            assert "1. “write it” — its checkpoint failed" in listing and "no file changes" not in listing
            reply = await say(conn, client, sessionId, "/undo")
            assert "A checkpoint of these turns failed" in reply and (folder / "a.txt").exists()
            assert wire.problems() == []

    await onLoop(scenario())
