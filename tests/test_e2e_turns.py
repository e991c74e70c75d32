"""Prompt turns end to end: permissions, cancel, parallel tool calls, concurrent
sessions, queued prompts, the editor's fs and terminals, prompt content."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
import tempfile

import acp
import pytest
import pytest_twisted
from acp.schema import (
    AllowedOutcome,
    CreateTerminalResponse,
    DeniedOutcome,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
)

from hermes_acp.commands import COMMANDS

from .e2e import agentText, answers, commandRunning, modelEnv, text, toolCalls, uniqueSleep, updates
from .imagedata import png
from .scripted_model import FRAMINGS
from .sdkclient import RecordingClient, connect, initialized, onLoop, rawNotify, settled, until


def choose(optionId: str):
    def answer(request):
        offered = [o.option_id for o in request["options"]]
        assert offered == ["allow_once", "allow_always", "reject_once", "reject_always"]
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=optionId))

    return answer


def toolResults(server) -> list[str]:
    return [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]


async def session(conn, cwd, **caps):
    await initialized(conn, **caps)
    return (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id


@pytest_twisted.ensureDeferred
async def test_editAsksWithDiffAndDenialLeavesFileUntouched(scriptedServer, tmp_path) -> None:
    """Default mode: an edit asks with the diff and all four option kinds; reject
    leaves the file as it was, the call fails, and the model is told."""
    server, url = scriptedServer
    target = tmp_path / "keep.txt"
    target.write_text("original\n")
    server.default.responses += [
        [{"tool_calls": [{"id": "p", "name": "patch", "arguments": {"path": "keep.txt", "old_string": "original", "new_string": "changed"}}]}],
        [{"text": "Understood."}],
    ]
    client = RecordingClient(permission=choose("reject_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            sid = await session(conn, tmp_path)
            response = await conn.prompt(session_id=sid, prompt=[text("change it")])
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert target.read_text() == "original\n"
    [(sid, toolCall, options)] = client.permissionRequests
    shown = toolCall.model_dump(by_alias=True, exclude_none=True)
    assert shown["content"][0] == {"type": "diff", "path": str(target), "oldText": "original\n", "newText": "changed\n"}
    [call] = toolCalls(found).values()
    assert call["toolCallId"] == shown["toolCallId"]
    assert call["status"] == "failed"
    assert "denied" in toolResults(server)[0].lower()


@pytest_twisted.ensureDeferred
async def test_unansweredPermissionDeniesAfterTimeout(scriptedServer, tmp_path) -> None:
    """With HERMES_ACP_PERMISSION_TIMEOUT=2, a request the editor never answers
    denies once the timeout passes; the dangerous command does not run; the model hears it timed out."""
    server, url = scriptedServer
    marker = tmp_path / "ran"
    server.default.responses += [
        [{"tool_calls": [{"id": "d", "name": "terminal", "arguments": {"command": f"rm -rf {tmp_path}/junk && touch {marker}"}}]}],
        [{"text": "ok, not run"}],
    ]
    never = asyncio.Event()

    async def hang(request):
        await never.wait()

    client = RecordingClient(permission=hang)

    async def scenario():
        async with connect(client, env=modelEnv(url, HERMES_ACP_PERMISSION_TIMEOUT="2")) as (conn, _, wire, process):
            sid = await session(conn, tmp_path)
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("clean up")]), 30)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert not marker.exists()
    [call] = toolCalls(found).values()
    assert call["kind"] == "execute" and call["status"] == "failed"
    assert "time" in toolResults(server)[0].lower()
    [(_, toolCall, _)] = client.permissionRequests
    assert "rm -rf" in str(toolCall.model_dump(by_alias=True))


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest_twisted.ensureDeferred
async def test_cancelMidStreamThenNextPromptWorks(scriptedServer, tmp_path) -> None:
    """Cancel against a stalled model answers cancelled (bench/ measures how fast);
    the next prompt works."""
    server, url = scriptedServer
    server.addRule("stall", [[{"text": "partial"}, {"stall": True}]])
    server.addRule("again", [[{"text": "fine again"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("stall please")]))
            await client.waitForUpdate(lambda s, u: u["sessionUpdate"] == "agent_message_chunk" and u["content"]["text"] == "partial")
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            again = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 30)
            return response, again, updates(wire, sid), wire.problems()

    response, again, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"
    assert again.stop_reason == "end_turn"
    assert agentText(found).endswith("fine again")


@pytest_twisted.ensureDeferred
async def test_cancelMidToolKillsIt(scriptedServer, tmp_path) -> None:
    """Cancel while a command runs: the process is killed, the call ends failed."""
    server, url = scriptedServer
    command = uniqueSleep(37)
    server.default.responses += [
        [{"tool_calls": [{"id": "s", "name": "terminal", "arguments": {"command": command}}]}],
        [{"text": "never reached"}],
    ]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("run it")]))
            await client.waitForUpdate(lambda s, u: u.get("status") == "in_progress")
            await until(lambda: commandRunning(command), what="the command to start")
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"
    assert [c["status"] for c in toolCalls(found).values()] == ["failed"]
    # the turn answers once its tool threads did, or after a short grace when one is starved
    await onLoop(until(lambda: not commandRunning(command), 10, "the command to be killed"))


@pytest_twisted.ensureDeferred
async def test_cancelMidPermission(scriptedServer, tmp_path) -> None:
    """Cancel while the editor is asked: the turn answers cancelled, nothing is
    written, and the call is final."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "x.txt", "content": "x"}}]}],
        [{"text": "never"}],
    ]
    asked = asyncio.Event()

    async def wait(request):
        asked.set()
        await asyncio.sleep(30)
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    client = RecordingClient(permission=wait)

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            sid = await session(conn, tmp_path)
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("write")]))
            await asyncio.wait_for(asked.wait(), 10)
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 5)
            return response, updates(wire, sid), wire.problems(), wire.received

    response, found, problems, received = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"
    assert not (tmp_path / "x.txt").exists()
    assert [c["status"] for c in toolCalls(found).values()] == ["failed"]
    assert any(f.get("method") == "$/cancel_request" for f in received)


@pytest_twisted.ensureDeferred
async def test_fiveParallelReadsEachComplete(scriptedServer, tmp_path) -> None:
    """Five read_file calls in one step: five cards, each completed with its own file."""
    server, url = scriptedServer
    for index in range(5):
        (tmp_path / f"f{index}.txt").write_text(f"content-{index}\n")
    server.default.responses += [
        [{"tool_calls": [{"id": f"r{i}", "name": "read_file", "arguments": {"path": f"f{i}.txt"}} for i in range(5)]}],
        [{"text": "read them all"}],
    ]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            await conn.prompt(session_id=sid, prompt=[text("read five")])
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    calls = list(toolCalls(found).values())
    assert len(calls) == 5
    for call in calls:
        assert call["status"] == "completed"
        index = call["rawInput"]["path"][1]
        assert f"content-{index}" in str(call["content"])
    assert len(set(c["toolCallId"] for c in calls)) == 5


@pytest_twisted.ensureDeferred
async def test_eightConcurrentSessions(scriptedServer, tmp_path) -> None:
    """Eight sessions prompting at once all finish, and run at the same time: each
    model answer waits until all eight requests have arrived, which only turns running
    side by side can do."""
    server, url = scriptedServer
    for index in range(8):
        server.addRule(f"session-{index}", [[{"barrier": 8}, {"text": f"answer-{index}"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            ids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(8)]
            prompts = [conn.prompt(session_id=sid, prompt=[text(f"session-{i}")]) for i, sid in enumerate(ids)]
            results = await asyncio.wait_for(asyncio.gather(*prompts), 60)
            return ids, results, wire, wire.problems()

    ids, results, wire, problems = await onLoop(scenario())
    assert problems == []
    assert [r.stop_reason for r in results] == ["end_turn"] * 8
    for index, sid in enumerate(ids):
        assert agentText(updates(wire, sid)) == f"answer-{index}"


@pytest_twisted.ensureDeferred
async def test_promptSentMidTurnRunsAfterIt(scriptedServer, tmp_path) -> None:
    """A prompt sent while a turn runs waits; it is echoed as user_message_chunk when
    it starts and answered after the first, in order; the model sees both."""
    server, url = scriptedServer
    server.addRule("first", [[{"stall": 0.5}, {"text": "one"}]])
    server.addRule("second", [[{"text": "two"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            order = []

            async def send(words):
                response = await conn.prompt(session_id=sid, prompt=[text(words)])
                order.append(words)
                return response

            first = asyncio.ensure_future(send("first"))
            await settled(server.whenChatRequests(1))  # the first turn is running
            second = asyncio.ensure_future(send("second"))
            await asyncio.gather(first, second)
            return order, updates(wire, sid), wire.problems()

    order, found, problems = await onLoop(scenario())
    assert problems == []
    assert order == ["first", "second"]
    kinds = [(u["sessionUpdate"], u.get("content", {}).get("text")) for u in found if "content" in u]
    assert kinds.index(("user_message_chunk", "second")) > kinds.index(("agent_message_chunk", "one"))
    assert [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] in ("user", "assistant")] == ["first", "one", "second"]


class EditorClient(RecordingClient):
    """An editor with unsaved buffers and its own terminals."""

    def __init__(self) -> None:
        super().__init__(permission=choose("allow_once"))
        self.buffers = {}
        self.calls = []

    async def read_text_file(self, session_id, path, line=None, limit=None, **kw):
        self.calls.append(("read", path))
        if path not in self.buffers:
            raise acp.RequestError.resource_not_found(path)
        return ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(self, session_id, path, content, **kw):
        self.calls.append(("write", path))
        self.buffers[path] = content
        return None

    async def create_terminal(self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kw):
        self.calls.append(("terminal", command, tuple(args or ()), cwd))
        return CreateTerminalResponse(terminal_id="term-1")

    async def wait_for_terminal_exit(self, session_id, terminal_id, **kw):
        self.calls.append(("wait", terminal_id))
        return WaitForTerminalExitResponse(exit_code=0)

    async def terminal_output(self, session_id, terminal_id, **kw):
        return TerminalOutputResponse(output="from the editor terminal\n", truncated=False, exit_status=TerminalExitStatus(exit_code=0))

    async def release_terminal(self, session_id, terminal_id, **kw):
        self.calls.append(("release", terminal_id))
        return None

    async def kill_terminal(self, session_id, terminal_id, **kw):
        self.calls.append(("kill", terminal_id))
        return None


def liveOutputs(found: list[dict], card: dict) -> list[str]:
    """What the card showed while its command ran (the updates before its status), as JSON."""
    return [json.dumps(u["content"]) for u in found
            if u.get("toolCallId") == card["toolCallId"] and u.get("content") and "status" not in u]


@pytest_twisted.ensureDeferred
async def test_commandOutputShowsAsItComes(scriptedServer, tmp_path) -> None:
    """A command that runs here (in the sandbox, even for an editor with terminals)
    shows its output in the card while it runs, a few times a second, as the editor's
    terminal would; the card's last update has all of it, and only that is journaled."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    command = "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.3; done"
    server.default.responses += [
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": command}}]}],
        [{"text": "done"}],
    ]
    client = EditorClient()

    async def scenario():
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn, terminal=True)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("count")])
            return sid, updates(wire, sid), wire.problems()

    sid, found, problems = await onLoop(scenario())
    assert problems == []
    assert not [c for c in client.calls if c[0] == "terminal"]  # the sandbox ran it, not the editor
    [card] = [c for c in toolCalls(found).values() if c["kind"] == "execute"]
    shown = liveOutputs(found, card)
    assert any("line1" in s and "line6" not in s for s in shown), shown  # seen before the command ended
    assert card["status"] == "completed" and "line6" in json.dumps(card["content"])
    with sqlite3.connect(os.path.join(home, "state.db"), timeout=5) as db:
        journal = [p for (p,) in db.execute("SELECT payload FROM acp_journal WHERE session_id = ?", (sid,))]
    assert not any("line1" in p and "line6" not in p for p in journal)


@pytest_twisted.ensureDeferred
async def test_commandOutputAsItComesHasNoSecret(scriptedServer, tmp_path) -> None:
    """The output shown while a command runs is redacted as its final output is: the
    agent's key, printed by a project file, never reaches the editor."""
    server, url = scriptedServer
    key = "test-key-not-secret"  # modelEnv's HERMES_API_KEY
    (tmp_path / "settings.txt").write_text(f"api_key = {key}\n")
    command = "cat settings.txt; sleep 1.5; echo end"
    server.default.responses += [
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": command}}]}],
        [{"text": "done"}],
    ]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("show settings")])
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    [card] = [c for c in toolCalls(found).values() if c["kind"] == "execute"]
    shown = liveOutputs(found, card)
    assert any("api_key" in s and "end" not in s for s in shown), shown  # seen while it ran
    assert key not in json.dumps(found)


@pytest_twisted.ensureDeferred
async def test_editorFilesAndTerminal(scriptedServer, tmp_path) -> None:
    """With fs and terminal capabilities, reads see the editor's unsaved buffer,
    writes go to the editor, and commands run in its terminal (created,
    waited for, read and released); the card shows the terminal."""
    server, url = scriptedServer
    path = str(tmp_path / "buffer.py")
    server.default.responses += [
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "buffer.py"}}]}],
        [{"tool_calls": [{"id": "p", "name": "patch", "arguments": {"path": "buffer.py", "old_string": "unsaved", "new_string": "saved"}}]}],
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": "echo hi"}}]}],
        [{"text": "done"}],
    ]
    client = EditorClient()
    client.buffers[path] = "x = 'unsaved'\n"

    async def scenario():  # without a sandbox: a sandboxed command runs in the agent (test_e2e_unconfined)
        async with connect(client, env=modelEnv(url, HERMES_ACP_SANDBOX="off")) as (conn, _, wire, process):
            await initialized(conn, fs={"readTextFile": True, "writeTextFile": True}, terminal=True)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("edit the buffer")])
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert not os.path.exists(path)  # nothing touched the disk
    assert client.buffers[path] == "x = 'saved'\n"
    assert "unsaved" in toolResults(server)[0]
    assert ("terminal", "/bin/sh", ("-c", "echo hi"), str(tmp_path)) in client.calls
    assert client.calls[-1] == ("release", "term-1")
    terminal = [c for c in toolCalls(found).values() if c["kind"] == "execute"][0]
    assert {"type": "terminal", "terminalId": "term-1"} in terminal["content"]
    # The terminal was embedded while it ran, before the card's final update.
    shown = [u for u in found if u.get("toolCallId") == terminal["toolCallId"] and u.get("content") == [{"type": "terminal", "terminalId": "term-1"}]]
    assert shown and "status" not in shown[0]
    assert "from the editor terminal" in toolResults(server)[2]


@pytest_twisted.ensureDeferred
async def test_promptContent(scriptedServer, tmp_path) -> None:
    """A prompt of only resources is a real prompt; linked and embedded files are
    inlined for the model and stay in the history; images become image parts."""
    server, url = scriptedServer
    server.default.repeat = True
    server.default.responses.append([{"text": "seen"}])
    linked = tmp_path / "linked.md"
    linked.write_text("LINKED-CONTENT\n")
    pixel = base64.b64encode(png()).decode()

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            first = await conn.prompt(session_id=sid, prompt=[
                acp.resource_link_block(name="linked.md", uri=linked.as_uri()),
                acp.resource_block(acp.embedded_text_resource(uri="file:///virtual/embedded.txt", text="EMBEDDED-CONTENT")),
            ])
            await conn.prompt(session_id=sid, prompt=[text("and this picture"), acp.image_block(pixel, "image/png")])
            return first, wire.problems()

    first, problems = await onLoop(scenario())
    assert problems == []
    assert first.stop_reason == "end_turn"
    firstRequest, secondRequest = server.chatRequests[:2]
    assert "LINKED-CONTENT" in firstRequest["messages"][-1]["content"]
    assert "EMBEDDED-CONTENT" in firstRequest["messages"][-1]["content"]
    parts = secondRequest["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "and this picture"}
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert any("LINKED-CONTENT" in str(m.get("content")) for m in secondRequest["messages"][:-1])


@pytest_twisted.ensureDeferred
async def test_slashCommands(scriptedServer, tmp_path) -> None:
    """Known /commands are answered by the agent without the model; /title sets the
    title; an unknown /word goes to the model."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "model reply"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            replies = []
            for command in ("/help", "/title My thread", "/mode accept_edits", "/model", "/doctor", "/context", "/tools"):
                mark = len(updates(wire, sid))
                response = await conn.prompt(session_id=sid, prompt=[text(command)])
                assert response.stop_reason == "end_turn"
                replies.append(agentText(updates(wire, sid)[mark:]))
            requestsBefore = len(server.chatRequests)
            await conn.prompt(session_id=sid, prompt=[text("/unknown thing")])
            return replies, requestsBefore, updates(wire, sid), wire.problems()

    replies, requestsBefore, found, problems = await onLoop(scenario())
    assert problems == []
    assert requestsBefore == 0
    assert len(server.chatRequests) == 1
    assert "/doctor" in replies[0]
    assert "Title set: My thread" in replies[1]
    assert any(u["sessionUpdate"] == "session_info_update" and u.get("title") == "My thread" for u in found)
    assert any(u["sessionUpdate"] == "current_mode_update" and u["currentModeId"] == "accept_edits" for u in found)
    assert "scripted-model" in replies[3]
    assert "hermes-acp" in replies[4] and "Endpoint:" in replies[4]
    assert "read_file" in replies[6]
    # Markdown lists, one item a line, so that editors do not run them together.
    assert sum(line.startswith("- `/") for line in replies[0].splitlines()) == len(COMMANDS)
    rows = [line for line in replies[4].splitlines() if line.startswith("- **")]
    assert len(rows) >= 12 and {"Web search", "Images", "Skills"} <= {row[4:].split(":**")[0] for row in rows}
    assert "- **Commands:** " in replies[4] and ("sandboxed (Landlock" in replies[4] or "asks before it runs" in replies[4])
    assert sum(line.startswith("- `") for line in replies[6].splitlines()) >= 6


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest_twisted.ensureDeferred
async def test_cancelAnswersQueuedPromptsToo(scriptedServer, tmp_path) -> None:
    """session/cancel with a prompt queued behind a running one answers both
    cancelled; the queued prompt never reaches the model."""
    server, url = scriptedServer
    server.addRule("running", [[{"stall": True}]])
    server.addRule("queued", [[{"text": "must not run"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            first = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("running")]))
            await settled(server.whenChatRequests(1))
            second = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("queued")]))
            await until(lambda: sum(m.get("method") == "session/prompt" for m in wire.sent) == 2, what="the second prompt")
            await conn.cancel(session_id=sid)
            results = await asyncio.wait_for(asyncio.gather(first, second), 30)
            return results, wire.problems()

    results, problems = await onLoop(scenario())
    assert problems == []
    assert [r.stop_reason for r in results] == ["cancelled", "cancelled"]
    assert len(server.chatRequests) == 1


@pytest.mark.parametrize("scriptedServer", FRAMINGS, indirect=True)
@pytest_twisted.ensureDeferred
async def test_cancelRequestOnThePrompt(scriptedServer, tmp_path) -> None:
    """$/cancel_request naming the prompt's request id cancels the turn like session/cancel."""
    server, url = scriptedServer
    server.default.responses.append([{"stall": True}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("wait forever")]))
            await settled(server.whenChatRequests(1))
            promptId = [m["id"] for m in wire.sent if m.get("method") == "session/prompt"][0]
            await rawNotify(conn, "$/cancel_request", {"requestId": promptId})
            return await asyncio.wait_for(running, 30), wire.problems()

    response, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"


@pytest_twisted.ensureDeferred
async def test_disconnectMidTurn(scriptedServer, tmp_path) -> None:
    """The editor goes away mid-turn (stdin closes): the agent exits 0 within 2 s,
    kills the running command, and the session loads afterwards with the turn in it."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    command = uniqueSleep(41)
    server.addRule("long", [
        [{"tool_calls": [{"id": "s", "name": "terminal", "arguments": {"command": command}}]}],
        [{"text": "never"}],
    ])

    async def vanish():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("long job")]))
            await client.waitForUpdate(lambda s, u: u.get("status") == "in_progress")
            process.stdin.close()
            code = await asyncio.wait_for(process.wait(), 30)
            return sid, code

    async def reload(sid):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            return updates(wire, sid), wire.problems()

    sid, code = await onLoop(vanish())
    assert code == 0
    assert not commandRunning(command)  # killed before the agent exited
    replayed, problems = await onLoop(reload(sid))
    assert problems == []
    assert [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"] == ["long job"]
    assert [c["status"] for c in toolCalls(replayed).values()] == ["failed"]


@pytest_twisted.ensureDeferred
async def test_everyToolInOneTurn(scriptedServer, tmp_path) -> None:
    """One turn uses every tool: write, patch, read, search, run, plan, search past
    sessions. Each reaches completed, the files are right, the model sees every result."""
    server, url = scriptedServer
    server.addRule("earlier", [[{"text": "noted the zebra"}]])
    calls = [
        ("write_file", {"path": "src/app.py", "content": "def greet():\n    return 'hi'\n\nprint(greet())\n"}),
        ("patch", {"path": "src/app.py", "old_string": "return 'hi'", "new_string": "return 'hello'"}),
        ("read_file", {"path": "src/app.py"}),
        ("search_files", {"pattern": "hello", "path": "src"}),
        ("terminal", {"command": "python3 src/app.py"}),
        ("todo", {"todos": [{"id": "1", "content": "greet politely", "status": "completed"}, {"id": "2", "content": "ship", "status": "pending"}]}),
        ("session_search", {"query": "zebra"}),
    ]
    server.addRule("everything", [[{"tool_calls": [{"id": f"c{i}", "name": n, "arguments": a}]}] for i, (n, a) in enumerate(calls)] + [[{"text": "all done"}]])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            await conn.prompt(session_id=sid, prompt=[text("remember the earlier zebra")])
            await conn.set_session_mode(session_id=sid, mode_id="accept_edits")
            response = await conn.prompt(session_id=sid, prompt=[text("do everything")])
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert (tmp_path / "src" / "app.py").read_text() == "def greet():\n    return 'hello'\n\nprint(greet())\n"
    cards = list(toolCalls(found).values())
    assert [c["status"] for c in cards] == ["completed"] * 7
    assert [c["kind"] for c in cards] == ["edit", "edit", "read", "search", "execute", "think", "search"]
    results = toolResults(server)
    assert "hello" in results[2] and "app.py" in results[3] and "hello" in results[4]
    assert "zebra" in results[6]
    [plan] = [u for u in found if u["sessionUpdate"] == "plan"]
    assert [e["status"] for e in plan["entries"]] == ["completed", "pending"]


@pytest_twisted.ensureDeferred
async def test_unadvertisedContentIsRefused(scriptedServer, tmp_path) -> None:
    """An audio block (not advertised) is -32602 naming the block; the session goes on."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "fine"}])

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            sid = await session(conn, tmp_path)
            try:
                await conn.prompt(session_id=sid, prompt=[acp.audio_block("AAAA", "audio/wav")])
            except acp.RequestError as e:
                error = e
            response = await conn.prompt(session_id=sid, prompt=[text("plain")])
            return error, response, wire.problems()

    error, response, problems = await onLoop(scenario())
    assert problems == []
    assert error.code == -32602 and "prompt[0]" in str(error)
    assert response.stop_reason == "end_turn"


class StuckTerminalEditor(EditorClient):
    """An editor that never answers terminal/create."""

    async def create_terminal(self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kw):
        self.calls.append(("terminal", command))
        await asyncio.sleep(60)


@pytest_twisted.ensureDeferred
async def test_cancelDoesNotWaitForAStuckEditor(scriptedServer, tmp_path) -> None:
    """Cancel while the editor sits on terminal/create: the turn still answers
    cancelled promptly, and the call is final."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": "make"}}]}],
        [{"text": "never"}],
    ]
    client = StuckTerminalEditor()

    async def scenario():  # without a sandbox: a sandboxed command runs in the agent (test_e2e_unconfined)
        async with connect(client, env=modelEnv(url, HERMES_ACP_SANDBOX="off")) as (conn, _, wire, process):
            await initialized(conn, terminal=True)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("build")]))
            await until(lambda: bool(client.calls), what="the editor's terminal")
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"
    assert [c["status"] for c in toolCalls(found).values()] == ["failed"]


@pytest_twisted.ensureDeferred
async def test_cancelWhileWaitingForAWorker(scriptedServer, tmp_path) -> None:
    """With every worker busy, a prompt waits for one; cancelling it answers at once
    instead of waiting for the busy turn to end."""
    server, url = scriptedServer
    server.addRule("hog", [[{"stall": True}]])
    server.addRule("waiter", [[{"text": "must not run"}]])

    async def scenario():
        async with connect(env=modelEnv(url, HERMES_ACP_THREADS="1")) as (conn, client, wire, process):
            await initialized(conn)
            a = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            b = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            hog = asyncio.ensure_future(conn.prompt(session_id=a, prompt=[text("hog")]))
            await settled(server.whenChatRequests(1))  # the one worker runs the hog's turn now
            waiter = asyncio.ensure_future(conn.prompt(session_id=b, prompt=[text("waiter")]))
            await until(lambda: sum(m.get("method") == "session/prompt" for m in wire.sent) == 2, what="the second prompt")
            await conn.cancel(session_id=b)
            answer = await asyncio.wait_for(waiter, 30)
            hogStillRunning = not hog.done()
            await conn.cancel(session_id=a)
            await asyncio.wait_for(hog, 30)
            return answer, hogStillRunning, wire.problems()

    answer, hogStillRunning, problems = await onLoop(scenario())
    assert problems == []
    assert answer.stop_reason == "cancelled"
    assert hogStillRunning  # answered without waiting for the busy worker
    assert len(server.chatRequests) == 1
