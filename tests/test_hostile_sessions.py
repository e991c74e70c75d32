"""A careless model and odd editors (issue 10): nothing poisons a session for good,
no tool freezes the agent or wedges a turn, and editors that answer a missing file
their own way can still have files created.

Through the real process with the official SDK client and the scripted model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import acp
import pytest
import pytest_twisted
from acp.schema import ReadTextFileResponse, ResourceContentBlock

from .e2e import agentText, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw
from .test_e2e_turns import choose

#: A PATH without ripgrep, so search_files takes its pure-Python path.
NO_RG_PATH = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if not shutil.which("rg", path=p))
BAD = "\ud800"  # a lone surrogate: JSON can escape it, UTF-8 cannot carry it


def modelErrors(found: list[dict[str, Any]]) -> list[str]:
    return [line for line in agentText(found).splitlines() if "error" in line.lower()]


def userTexts(body: dict[str, Any]) -> list[str]:
    return [json.dumps(m["content"], ensure_ascii=False) for m in body["messages"] if m["role"] == "user"]


@pytest_twisted.ensureDeferred
async def test_loneSurrogatesAndNaNNeverPoisonASession(scriptedServer, tmp_path) -> None:
    """Lone surrogates in prompt text, an additional directory, a model name, a
    session_search query, a model's own delta and a file name found by the Python
    search: every turn answers, every later request reaches the model (with U+FFFD),
    and after a restart the session loads and answers. NaN in a content block is
    refused with -32602 naming it, and never journaled."""
    server, url = scriptedServer
    (tmp_path / os.fsdecode(b"caf\xe9.txt")).write_text("needle here\n")
    server.addRule("search please", [
        [{"tool_calls": [{"id": "s", "name": "search_files", "arguments": {"pattern": "needle"}}]}],
        [{"text": "found it"}],
    ])  # fmt: skip
    server.addRule("past please", [
        [{"tool_calls": [{"id": "q", "name": "session_search", "arguments": '{"query": "\\ud800 needle"}'}]}],
        [{"text": "searched"}],
    ])  # fmt: skip
    server.addRule("odd reply", [[{"text": f"half {BAD} a character"}]])
    server.default.repeat = True
    server.default.responses.append([{"text": "fine"}])
    home = tempfile.mkdtemp()
    env = modelEnv(url, home, PATH=NO_RG_PATH)

    async def scenario():
        async with connect(env=env, cwd=str(tmp_path)) as (conn, client, wire, process):
            await initialized(conn)
            created = await raw(conn, "session/new", {"cwd": str(tmp_path), "mcpServers": [],
                                                      "additionalDirectories": [f"/tmp/x{BAD}"]})
            sid = created["sessionId"]
            reasons = []
            for words in (f"hello {BAD} world", "search please", "past please", "odd reply"):
                reasons.append((await conn.prompt(session_id=sid, prompt=[text(words)])).stop_reason)
            await raw(conn, "session/set_config_option", {"sessionId": sid, "configId": "model", "value": f"scripted{BAD}"})
            with pytest.raises(acp.RequestError) as refused:
                await raw(conn, "session/prompt", {"sessionId": sid, "prompt": [
                    {"type": "text", "text": "weighted", "annotations": {"priority": float("nan")}}]})
            reasons.append((await conn.prompt(session_id=sid, prompt=[text("final check")])).stop_reason)
            return sid, reasons, refused.value, updates(wire, sid), wire.problems()

    sid, reasons, refused, found, problems = await onLoop(scenario())
    assert problems == []
    assert reasons == ["end_turn"] * 5
    assert modelErrors(found) == []
    assert refused.code == -32602 and "prompt[0].annotations.priority" in str(refused)
    assert "weighted" not in json.dumps(found)
    last = server.chatRequests[-1]
    assert "final check" in userTexts(last)[-1]
    assert last["model"] == "scripted\ufffd"
    everything = json.dumps(server.chatRequests, ensure_ascii=False)
    assert "hello \ufffd world" in everything and "/tmp/x\ufffd" in everything and "half \ufffd a" in everything
    assert "caf\ufffd.txt" in everything  # the search result, as the model read it

    async def afterRestart():
        async with connect(env=env, cwd=str(tmp_path)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            response = await conn.prompt(session_id=sid, prompt=[text("after restart")])
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(afterRestart())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert modelErrors(found) == []
    assert "after restart" in userTexts(server.chatRequests[-1])[-1]


def poisonedStore(home: str, cwd: str) -> str:
    """A state.db as older versions could leave it: a NaN in a journaled content block,
    escaped lone surrogates in messages, the journal and a folder list."""
    from hermes_acp.store import SessionDB, SessionRecord

    path = Path(home) / "state.db"
    with SessionDB(path) as db:
        db.createSession(SessionRecord("old-session", cwd, model="scripted-model"))
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("UPDATE acp_sessions SET additional_directories = ? WHERE session_id = 'old-session'",
                    ('["/tmp/gone\\ud800"]',))
        journal = [
            '{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"hi","annotations":{"priority":NaN}}}',
            '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"bad \\ud800 reply"}}',
        ]
        raw.executemany("INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) VALUES ('old-session', ?, 1, ?, ?)",
                        [(n + 1, payload, len(payload)) for n, payload in enumerate(journal)])
        messages = ['{"role":"user","content":"hi \\ud800 there"}', '{"role":"assistant","content":"bad \\ud800 reply"}']
        raw.executemany("INSERT INTO acp_messages (session_id, seq, role, message, stored_text) "
                        "VALUES ('old-session', ?, ?, ?, '')",
                        [(n, ("user", "assistant")[n], message) for n, message in enumerate(messages)])
        raw.execute("UPDATE acp_sessions SET message_count = 2, turn = 1 WHERE session_id = 'old-session'")
    raw.close()
    return "old-session"


@pytest_twisted.ensureDeferred
async def test_sessionsPoisonedByOlderVersionsLoad(scriptedServer, tmp_path) -> None:
    """A session an older version journaled with NaN and lone surrogates loads (its
    replay is valid, NaN shown as null and surrogates as U+FFFD) and answers."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "healed"}])
    home = tempfile.mkdtemp()
    sid = poisonedStore(home, str(tmp_path))

    async def scenario():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replayed = updates(wire, sid)
            response = await conn.prompt(session_id=sid, prompt=[text("still there?")])
            return replayed, response, updates(wire, sid), wire.problems()

    replayed, response, found, problems = await onLoop(scenario())
    assert problems == []
    assert [u["sessionUpdate"] for u in replayed[:2]] == ["user_message_chunk", "agent_message_chunk"]
    assert replayed[1]["content"]["text"] == "bad \ufffd reply"
    assert response.stop_reason == "end_turn" and agentText(found).endswith("healed")
    sent = json.dumps(server.chatRequests[-1], ensure_ascii=False)
    assert "hi \ufffd there" in sent and "/tmp/gone\ufffd" in sent


@pytest_twisted.ensureDeferred
async def test_catastrophicPatternFreezesNothing(scriptedServer, tmp_path) -> None:
    """search_files with (a+)+$ against 35 a's and a "!" (the pure-Python search):
    while it runs another session still answers, and a cancel ends the turn; the
    session then answers again."""
    server, url = scriptedServer
    (tmp_path / "trap.txt").write_text("a" * 35 + "!\n")
    server.addRule("hard search", [
        [{"tool_calls": [{"id": "h", "name": "search_files", "arguments": {"pattern": "(a+)+$"}}]}],
        [{"text": "never mind"}],
    ])  # fmt: skip
    server.default.repeat = True
    server.default.responses.append([{"text": "back"}])
    env = modelEnv(url, PATH=NO_RG_PATH)

    async def scenario():
        async with connect(env=env, cwd=str(tmp_path)) as (conn, client, wire, process):
            await initialized(conn)
            stuck = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            other = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=stuck, prompt=[text("hard search")]))
            await client.waitForUpdate(lambda s, u: s == stuck and u.get("status") == "in_progress")
            helped = await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("/help")]), 15)
            await conn.cancel(session_id=stuck)
            cancelled = await asyncio.wait_for(running, 15)
            again = await asyncio.wait_for(conn.prompt(session_id=stuck, prompt=[text("hello")]), 15)
            return helped, cancelled, again, updates(wire, stuck), wire.problems()

    helped, cancelled, again, found, problems = await onLoop(scenario())
    assert problems == []
    assert helped.stop_reason == "end_turn"
    assert cancelled.stop_reason == "cancelled"
    assert again.stop_reason == "end_turn" and agentText(found).endswith("back")
    [call] = toolCalls(found).values()
    assert call["status"] == "failed"


@pytest_twisted.ensureDeferred
async def test_attachmentsThatWouldBlock(scriptedServer, tmp_path) -> None:
    """resource_links to a named pipe, a device, a socket and a folder: none is
    opened for good; the model reads what each is, and the turn answers."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "noted"}])
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    links = [("pipe", fifo), ("zero", Path("/dev/zero")), ("sock", tmp_path / "sock"), ("folder", tmp_path)]
    blocks = [text("what are these?")] + [
        ResourceContentBlock(type="resource_link", uri=f"file://{path}", name=name) for name, path in links
    ] + [ResourceContentBlock(type="resource_link", uri=uri, name=name)
         for name, uri in (("v6", "file://[::1"), ("nul", "file:///tmp/a%00b"), ("web", "http://[x"))]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=blocks), 30)
            return response, wire.problems()

    try:
        response, problems = await onLoop(scenario())
    finally:
        listener.close()
    assert problems == []
    assert response.stop_reason == "end_turn"
    sent = server.chatRequests[-1]["messages"][-1]["content"]
    for phrase in ("a named pipe, so not read", "a device, so not read", "a folder, so not read", "a socket, so not read"):
        assert phrase in sent
    for name in ("v6", "nul", "web"):  # malformed or impossible URIs: named, never a crash
        assert f"[Linked resource: {name}]" in sent
    assert "Internal error" not in json.dumps(server.chatRequests)


class TypeScriptStyleEditor(RecordingClient):
    """Answers fs/read_text_file for a missing file the way the TypeScript SDK does:
    -32603 with the Node error in data, not -32002."""

    def __init__(self, locked: str) -> None:
        super().__init__(permission=choose("allow_once"))
        self.locked = locked
        self.written: dict[str, str] = {}

    async def read_text_file(self, session_id, path, line=None, limit=None, **kw):
        if path == self.locked:
            raise acp.RequestError(-32603, "Internal error", {"details": f"EACCES: permission denied, open '{path}'"})
        if not os.path.exists(path):
            raise acp.RequestError(-32603, "Internal error", {"details": f"ENOENT: no such file or directory, open '{path}'"})
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, session_id, path, content, **kw):
        self.written[path] = content
        Path(path).write_text(content)
        return None


@pytest_twisted.ensureDeferred
async def test_editorThatAnswersMissingFilesWithInternalError(scriptedServer, tmp_path) -> None:
    """With an editor that answers a missing file with -32603 (TypeScript SDK), the
    model can create a file; a read the editor really refuses fails with the
    editor's details in what the model reads."""
    server, url = scriptedServer
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    server.default.responses += [
        [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "new.txt", "content": "hello\n"}}]}],
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "locked.txt"}}]}],
        [{"text": "done"}],
    ]
    client = TypeScriptStyleEditor(str(locked))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn, fs={"readTextFile": True, "writeTextFile": True})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await conn.prompt(session_id=sid, prompt=[text("make a file")])
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert client.written == {str(tmp_path / "new.txt"): "hello\n"}
    write, read = [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    assert write.startswith("Created new.txt")
    assert "EACCES: permission denied" in read


@pytest_twisted.ensureDeferred
async def test_pathologicalCommandFreezesNothing(scriptedServer, tmp_path) -> None:
    """A 120 KB command of one word (the command guard's fork-bomb pattern used to
    be quadratic on it, holding the GIL for minutes): another session answers
    meanwhile, and the turn ends normally."""
    server, url = scriptedServer
    server.addRule("long command", [
        [{"tool_calls": [{"id": "c", "name": "terminal", "arguments": {"command": "a" * 120_000}}]}],
        [{"text": "that failed"}],
    ])  # fmt: skip

    async def scenario():
        async with connect(RecordingClient(permission=choose("allow_once")), env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            first = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            other = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=first, prompt=[text("long command")]))
            await client.waitForUpdate(lambda s, u: s == first and u.get("status") == "in_progress")
            helped = await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("/help")]), 15)
            done = await asyncio.wait_for(running, 30)
            return helped, done, wire.problems()

    helped, done, problems = await onLoop(scenario())
    assert problems == []
    assert helped.stop_reason == "end_turn" and done.stop_reason == "end_turn"
