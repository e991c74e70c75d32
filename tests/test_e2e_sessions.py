"""Sessions end to end: restart survival and exact replay, fork, list, close,
delete, unknown ids, modes and config options, crash recovery, private state
files, and session_search kept to the session's project."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import tempfile
from pathlib import Path

import acp
import pytest
import pytest_twisted

from .e2e import agentText, commandRunning, journaled, modelEnv, text, toolCalls, uniqueSleep, updates
from .sdkclient import connect, initialized, onLoop, raw, until
from .test_e2e_turns import EditorClient

JOURNALED_ONLY = {"user_message_chunk"}  # journaled, not sent live (the editor shows its own prompt)
# Sent live, not journaled: commands after each new/load; mode and options (a load answers with them).
LIVE_ONLY = {"available_commands_update", "current_mode_update", "config_option_update"}


def comparable(found: list[dict], drop: set[str]) -> list[dict]:
    return [u for u in found if u["sessionUpdate"] not in drop]


@pytest_twisted.ensureDeferred
async def test_restartLoadReplaysExactlyAndContinues(scriptedServer, tmp_path) -> None:
    """new → text and tool turns → exit → new process → load replays what the client
    saw live (plus the user's prompts), before answering; the next prompt sends the
    restored history to the model."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.addRule("first", [[{"reasoning": "thinking hard"}, {"text": "Answer one."}]])
    server.addRule("second", [
        [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "f.txt", "content": "x\n"}}]}],
        [{"tool_calls": [{"id": "t", "name": "todo", "arguments": {"todos": [{"id": "1", "content": "ship", "status": "in_progress"}]}}]}],
        [{"text": "Answer two."}],
    ])
    server.addRule("third", [[{"text": "Answer three."}]])

    async def firstLife():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await conn.set_session_mode(session_id=session.session_id, mode_id="accept_edits")
            await conn.prompt(session_id=session.session_id, prompt=[text("first question")])
            await conn.prompt(session_id=session.session_id, prompt=[text("second question")])
            return session.session_id, updates(wire, session.session_id), wire.problems()

    async def secondLife(sessionId):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id=sessionId, mcp_servers=[])
            replayed = updates(wire, sessionId)
            answered = next(i for i, f in enumerate(wire.received) if "modes" in f.get("result", {}))
            # (the commands and the usage follow the answer, a moment later)
            await until(lambda: len(wire.received) >= answered + 3, 10, "the updates after the load's answer")
            before = [f["params"]["update"] for f in wire.received[:answered] if f.get("method") == "session/update"]
            after = [f["params"]["update"] for f in wire.received[answered:] if f.get("method") == "session/update"]
            await conn.prompt(session_id=sessionId, prompt=[text("third question")])
            return replayed, (before, after), wire.problems()

    sessionId, live, problems = await onLoop(firstLife())
    assert problems == []
    replayed, (before, after), problems = await onLoop(secondLife(sessionId))
    assert problems == []
    # The whole replay came before the load response; only the commands and the usage after it.
    assert [u["sessionUpdate"] for u in after] == ["available_commands_update", "usage_update"]
    replayed = before
    setup = next(i for i, u in enumerate(live) if u["sessionUpdate"] == "usage_update")
    live = live[:setup] + live[setup + 1:]  # the usage after session/new is live only, like the commands
    assert comparable(replayed, JOURNALED_ONLY | LIVE_ONLY) == comparable(live, LIVE_ONLY)
    prompts = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
    assert prompts == ["first question", "second question"]
    assert agentText(replayed, "agent_thought_chunk") == "thinking hard"
    assert all(call["status"] == "completed" for call in toolCalls(replayed).values())
    assert any(u["sessionUpdate"] == "plan" for u in replayed)
    history = server.chatRequests[-1]["messages"]
    said = [m["content"] for m in history if m["role"] in ("user", "assistant") and m.get("content")]
    assert said[:2] == ["first question", "Answer one."]
    assert "second question" in said and "Answer two." in said and said[-1] == "third question"


@pytest_twisted.ensureDeferred
async def test_forkListCloseDeleteResume(scriptedServer, tmp_path) -> None:
    """Fork copies history and journal under a new id with its own cwd and they
    diverge; list pages newest first with a cwd filter; resume does not replay;
    close and delete free the session; unknown ids are -32002 everywhere."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])
    other = tmp_path / "other"
    other.mkdir()

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            a = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=a, prompt=[text("hello a")])
            b = (await conn.fork_session(session_id=a, cwd=str(other), mcp_servers=[])).session_id
            assert b != a
            await conn.prompt(session_id=b, prompt=[text("only in b")])
            history = server.chatRequests[-1]["messages"]
            assert [m["content"] for m in history if m["role"] == "user"] == ["hello a", "only in b"]
            await conn.prompt(session_id=a, prompt=[text("only in a")])
            history = server.chatRequests[-1]["messages"]
            assert [m["content"] for m in history if m["role"] == "user"] == ["hello a", "only in a"]

            listed = await conn.list_sessions()
            ids = [s.session_id for s in listed.sessions]
            assert ids[:2] == [a, b]  # a was used last
            filtered = await conn.list_sessions(cwd=str(other))
            assert [s.session_id for s in filtered.sessions] == [b]
            assert filtered.sessions[0].title == "hello a"  # the fork keeps the title

            before = len(updates(wire, b))
            await conn.resume_session(session_id=b, cwd=str(other), mcp_servers=[])
            # (a session's updates follow its answer, a moment later; none is a replay)
            await until(lambda: len(updates(wire, b)) >= before + 2, 10, "the resumed session's updates")
            after = updates(wire, b)[before:]
            assert [u["sessionUpdate"] for u in after] == ["available_commands_update", "usage_update"]

            await conn.close_session(session_id=b)
            await conn.load_session(session_id=b, cwd=str(other), mcp_servers=[])  # closed, still on disk
            assert await raw(conn, "session/delete", {"sessionId": b}) == {}
            for call in (
                lambda: conn.load_session(session_id=b, cwd=str(other), mcp_servers=[]),
                lambda: conn.resume_session(session_id="nope", cwd=str(other), mcp_servers=[]),
                lambda: conn.fork_session(session_id="nope", cwd=str(other), mcp_servers=[]),
                lambda: conn.close_session(session_id="nope"),
                lambda: conn.prompt(session_id="nope", prompt=[text("x")]),
                lambda: conn.set_session_mode(session_id="nope", mode_id="default"),
                lambda: conn.set_config_option(session_id="nope", config_id="mode", value="default"),
                lambda: raw(conn, "session/delete", {"sessionId": "nope"}),
            ):
                with pytest.raises(acp.RequestError) as caught:
                    await call()
                assert caught.value.code == -32002
            assert [s.session_id for s in (await conn.list_sessions()).sessions] == [a]
            return wire.problems()

    assert await onLoop(scenario()) == []


@pytest_twisted.ensureDeferred
async def test_listPaginationAndBadInput(scriptedServer, tmp_path) -> None:
    """More sessions than a page: the cursor walks them all once, newest first; a
    made-up cursor and a relative cwd are -32602."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            made = []
            for index in range(55):
                sessionId = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                await conn.prompt(session_id=sessionId, prompt=[text(f"s{index}")])
                made.append(sessionId)
            seen, cursor, pages = [], None, 0
            while True:
                page = await conn.list_sessions(cursor=cursor)
                seen += [s.session_id for s in page.sessions]
                pages += 1
                cursor = page.next_cursor
                if not cursor:
                    break
            assert pages == 2
            assert seen == list(reversed(made))
            for params in ({"cursor": "bogus"}, {"cwd": "relative/path"}):
                with pytest.raises(acp.RequestError) as caught:
                    await raw(conn, "session/list", params)
                assert caught.value.code == -32602
            with pytest.raises(acp.RequestError) as caught:
                await conn.new_session(cwd="not/absolute", mcp_servers=[])
            assert caught.value.code == -32602 and "cwd" in str(caught.value)
            return wire.problems()

    assert await onLoop(scenario()) == []


@pytest_twisted.ensureDeferred
async def test_modesAndConfigOptions(scriptedServer, tmp_path) -> None:
    """set_mode sends current_mode_update after its response; set_config_option
    returns the full set; the model switch keeps the history; the legacy
    session/set_model works; bad values are -32602."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "ok"}])

    async def scenario():
        async with connect(env=modelEnv(url, HERMES_MODELS="scripted-model,other-model")) as (conn, client, wire, process):
            await initialized(conn)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            assert session.modes.current_mode_id == "default"
            ids = [o.id for o in session.config_options]
            assert ids == ["model", "mode", "thought_level"]
            await conn.set_session_mode(session_id=sid, mode_id="dont_ask")
            answer = [i for i, f in enumerate(wire.received) if "result" in f][-1]
            await until(lambda: any(f.get("method") == "session/update"
                                    and f["params"]["update"]["sessionUpdate"] == "current_mode_update"
                                    for f in wire.received[answer + 1:]), 10, "current_mode_update after the answer")
            await conn.prompt(session_id=sid, prompt=[text("before switch")])
            result = await conn.set_config_option(session_id=sid, config_id="model", value="other-model")
            options = {o.id: o.current_value for o in result.config_options}
            assert options == {"model": "other-model", "mode": "dont_ask", "thought_level": "default"}
            result = await conn.set_config_option(session_id=sid, config_id="thought_level", value="high")
            await conn.prompt(session_id=sid, prompt=[text("after switch")])
            request = server.chatRequests[-1]
            assert request["model"] == "other-model"
            assert request.get("reasoning_effort") == "high"
            assert [m["content"] for m in request["messages"] if m["role"] == "user"] == ["before switch", "after switch"]
            assert await raw(conn, "session/set_model", {"sessionId": sid, "modelId": "scripted-model"}) == {}
            for config, value in (("mode", "yolo"), ("nope", "x"), ("thought_level", "max")):
                with pytest.raises(acp.RequestError) as caught:
                    await conn.set_config_option(session_id=sid, config_id=config, value=value)
                assert caught.value.code == -32602
            with pytest.raises(acp.RequestError):
                await conn.set_session_mode(session_id=sid, mode_id="yolo")
            return wire.problems()

    assert await onLoop(scenario()) == []


@pytest_twisted.ensureDeferred
async def test_killedMidTurnLoadsWithNothingSpinning(scriptedServer, tmp_path) -> None:
    """kill -9 during a running tool call: the next process loads the completed
    turn and the interrupted one, and no tool call is left without a final status."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.addRule("finished", [[{"text": "first turn done"}]])
    command = uniqueSleep(30)  # still running when the kill lands, however slow the machine
    server.addRule("slow", [
        [{"tool_calls": [{"id": "s", "name": "terminal", "arguments": {"command": command}}]}],
        [{"text": "never"}],
    ])

    async def doomed():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("finished turn")])
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("slow turn")]))
            await journaled(home, sid, "in_progress")
            process.kill()
            await process.wait()
            running.cancel()
            await until(lambda: not commandRunning(command), 30, "the killed agent's command to end (its lifeline)")
            return sid

    async def reborn(sid):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            replayed = updates(wire, sid)
            server.addRule("after", [[{"text": "back"}]])
            response = await conn.prompt(session_id=sid, prompt=[text("after the crash")])
            return replayed, response, wire.problems()

    sid = await onLoop(doomed())
    replayed, response, problems = await onLoop(reborn(sid))
    assert problems == []
    assert "first turn done" in agentText(replayed)
    calls = toolCalls(replayed)
    assert len(calls) == 1
    assert list(calls.values())[0]["status"] == "failed"
    assert response.stop_reason == "end_turn"


def modes(home: Path) -> dict[str, int]:
    """The permission bits of ``home`` and of everything in it."""
    found = {"home": stat.S_IMODE(home.stat().st_mode)}
    found.update((path.name, stat.S_IMODE(path.stat().st_mode)) for path in home.iterdir())
    return found


@pytest_twisted.ensureDeferred
async def test_stateIsPrivate(scriptedServer, tmp_path) -> None:
    """Under umask 022, the agent makes HERMES_HOME 0700 and state.db, -wal and -shm
    0600 once a session exists; a later agent finds them opened up and tightens them
    again, saying so in its log."""
    server, url = scriptedServer
    home = tmp_path / "home"  # the agent creates it
    argv = ["/bin/sh", "-c", 'umask 022 && exec "$0" -m hermes_acp', sys.executable]
    private = {"home": 0o700, "state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600}
    log = tmp_path / "agent.log"

    async def life():
        with open(log, "wb") as stderr:
            async with connect(env=modelEnv(url, str(home)), argv=argv, stderr=stderr) as (conn, client, wire, process):
                await initialized(conn)
                await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
                return modes(home), wire.problems()

    found, problems = await onLoop(life())
    assert problems == []
    assert found == private
    assert "could be read by others" not in log.read_text()
    home.chmod(0o755)
    (home / "state.db").chmod(0o644)
    found, problems = await onLoop(life())
    assert problems == []
    assert found == private
    said = log.read_text()
    assert f"{home} could be read by others (mode 0755); it is now private to you (0700)" in said
    assert f"{home / 'state.db'} could be read by others (mode 0644); it is now private to you (0600)" in said


@pytest_twisted.ensureDeferred
async def test_sessionSearchStaysInTheProject(scriptedServer, tmp_path) -> None:
    """A session in project B searching past sessions does not find project A's
    words, unless the model asks for all projects; the card then says so."""
    server, url = scriptedServer
    projectA, projectB = tmp_path / "a", tmp_path / "b"
    projectA.mkdir()
    projectB.mkdir()
    server.addRule("remember", [[{"text": "noted"}]])
    for words, arguments in (("search here", {"query": "aardvark"}),
                             ("search everywhere", {"query": "aardvark", "all_projects": True})):
        server.addRule(words, [[{"tool_calls": [{"id": "s", "name": "session_search", "arguments": arguments}]}],
                               [{"text": "searched"}]])

    def searched() -> dict:
        """What the last session_search told the model."""
        return json.loads([m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"][-1])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            a = (await conn.new_session(cwd=str(projectA), mcp_servers=[])).session_id
            await conn.prompt(session_id=a, prompt=[text("remember the aardvark")])
            b = (await conn.new_session(cwd=str(projectB), mcp_servers=[])).session_id
            await conn.prompt(session_id=b, prompt=[text("search here")])
            here = searched()
            await conn.prompt(session_id=b, prompt=[text("search everywhere")])
            everywhere = searched()
            return a, here, everywhere, toolCalls(updates(wire, b)), wire.problems()

    a, here, everywhere, cards, problems = await onLoop(scenario())
    assert problems == []
    assert here["scope"] == "this project" and a not in {hit["sessionId"] for hit in here["results"]}
    assert everywhere["scope"] == "all projects"
    [hit] = [hit for hit in everywhere["results"] if hit["sessionId"] == a]
    assert hit["cwd"] == str(projectA) and "aardvark" in hit["snippet"]
    assert [card["title"] for card in cards.values()] == [
        'Search past sessions: "aardvark"', 'Search past sessions in all projects: "aardvark"',
    ]
    assert all(card["status"] == "completed" for card in cards.values())


@pytest_twisted.ensureDeferred
async def test_replayedEditorTerminalIsText(scriptedServer, tmp_path) -> None:
    """A command that ran in the editor's terminal is replayed after a restart without
    the terminal (its id names nothing any more, and Zed drops a whole update naming an
    unknown terminal): the card keeps the output it showed, as text."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.default.responses += [
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": "echo hi"}}]}],
        [{"text": "done"}],
    ]
    env = modelEnv(url, home, HERMES_ACP_SANDBOX="off")

    async def firstLife():
        async with connect(EditorClient(), env=env) as (conn, client, wire, process):
            await initialized(conn, terminal=True)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("run it")])
            return sid, updates(wire, sid), wire.problems()

    async def secondLife(sessionId):
        async with connect(EditorClient(), env=env) as (conn, client, wire, process):
            await initialized(conn, terminal=True)
            await conn.load_session(cwd=str(tmp_path), session_id=sessionId, mcp_servers=[])
            return updates(wire, sessionId), wire.problems()

    sessionId, live, problems = await onLoop(firstLife())
    assert problems == []
    assert any(c.get("type") == "terminal" for u in live for c in u.get("content") or [] if isinstance(c, dict))
    replayed, problems = await onLoop(secondLife(sessionId))
    assert problems == []
    shown = [c for u in replayed if u["sessionUpdate"].startswith("tool_call") for c in u.get("content") or []]
    assert shown and not any(c.get("type") == "terminal" for c in shown)
    [card] = [c for c in toolCalls(replayed).values() if c["kind"] == "execute"]
    assert card["status"] == "completed"
    assert "from the editor terminal" in json.dumps(card["content"])


@pytest_twisted.ensureDeferred
async def test_longReplayArrivesWholeAndInOrder(scriptedServer, tmp_path) -> None:
    """A journal of many updates (more than one replay batch, and more than the pipe holds)
    is replayed whole, in order, before the load's answer: the batches wait for the editor
    to read, and none is lost or reordered."""
    from hermes_acp.sessions import REPLAY_BATCH_BYTES
    from hermes_acp.store import SessionDB, SessionRecord

    _, url = scriptedServer
    home = tempfile.mkdtemp()
    filler = "x" * 20_000
    count = 3 * REPLAY_BATCH_BYTES // len(filler) + 7  # about 1.6 MB in all
    with SessionDB(Path(home) / "state.db") as db:
        db.createSession(SessionRecord(sessionId="long", cwd=str(tmp_path)))
        db.appendUpdates("long", 1, [{"sessionUpdate": "agent_message_chunk", "messageId": f"m{n}",
                                      "content": {"type": "text", "text": f"[{n}]{filler}"}} for n in range(count)])

    async def load():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id="long", mcp_servers=[])
            answered = next(i for i, f in enumerate(wire.received) if "modes" in f.get("result", {}))
            before = [f["params"]["update"] for f in wire.received[:answered] if f.get("method") == "session/update"]
            return before, wire.problems()

    before, problems = await onLoop(load())
    assert problems == []
    texts = [u["content"]["text"] for u in before if u["sessionUpdate"] == "agent_message_chunk"]
    assert [t.split("]")[0] + "]" for t in texts] == [f"[{n}]" for n in range(count)]
    assert all(t.endswith(filler) for t in texts)


@pytest_twisted.ensureDeferred
async def test_aStreamedAnswerIsReplayedInAFewChunks(scriptedServer, tmp_path) -> None:
    """An answer streamed as dozens of frames (one every 10 ms) is journaled a batch at a time
    (consecutive chunks of one message as one row): a load in a new process shows the same
    text, in order, in a few chunks instead of one per frame."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    events = 60
    FLOOD_EVENT = 1061  # the bytes of one of the flood's events (1,000 characters of text)
    server.addRule("stream", [[{"text": "Start: "}, {"flood": "text", "every": 0.01, "bytes": events * FLOOD_EVENT},
                               {"text": " end."}]])

    async def firstLife():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            assert (await conn.prompt(session_id=sid, prompt=[text("stream please")])).stop_reason == "end_turn"
            return sid, updates(wire, sid), wire.problems()

    async def secondLife(sessionId):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id=sessionId, mcp_servers=[])
            return updates(wire, sessionId), wire.problems()

    sessionId, live, problems = await onLoop(firstLife())
    assert problems == []
    replayed, problems = await onLoop(secondLife(sessionId))
    assert problems == []
    chunks = [[u for u in found if u["sessionUpdate"] == "agent_message_chunk"] for found in (live, replayed)]
    assert agentText(live) == agentText(replayed) == "Start: " + "x" * 1000 * events + " end."
    assert len(chunks[1]) * 4 <= len(chunks[0])  # (a row per 0.2 s flush, against a frame per 10 ms)
