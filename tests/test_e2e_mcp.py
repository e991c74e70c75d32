"""The editor's MCP servers through the real process (issue 14): tools offered to the
model under their sanitized names, calls asked about and run, results rendered,
failures told, and no server left running."""

from __future__ import annotations

import asyncio
import json

import pytest_twisted

from acp.schema import SseMcpServer

from hermes_acp.mcp.toolset import exposedName

from . import mcp_scripted
from .e2e import agentText, answers, modelEnv, text, toolCalls, updates
from .mcp_e2e import call, log, offered, scripted, toolMessages
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw

LONG = "a_tool_name_that_goes_on_and_on_far_beyond_what_any_model_api_accepts"



@pytest_twisted.ensureDeferred
async def test_toolsOfferedCalledAndRendered(scriptedServer, tmp_path) -> None:
    """Every page of a server's tools is offered under its sanitized name; a call asks
    with all four options, titled "server: tool"; the result reaches the model, and
    every content type reaches the editor as ACP content."""
    model, url = scriptedServer
    tools = [mcp_scripted.tool("echo"), mcp_scripted.tool("do.thing/x"), mcp_scripted.tool(LONG),
             mcp_scripted.tool("everything", {"content": mcp_scripted.EVERY_CONTENT_TYPE})]
    server, serverLog = scripted(tmp_path, "srv", tools=tools, pageSize=2)
    longName = exposedName("srv", LONG, set())
    model.default.responses += [
        call("e", "mcp__srv__echo", text="hello from mcp"),
        call("c", "mcp__srv__everything", text="all"),
        [{"text": "done"}],
    ]
    client = RecordingClient(permission=answers("allow_once", "allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("use the tools")]), 30)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    names = offered(model.chatRequests[0])
    assert {"mcp__srv__echo", "mcp__srv__do_thing_x", longName, "mcp__srv__everything"} <= set(names)
    assert len(longName) <= 64 and all(len(n) <= 64 for n in names)
    assert "read_file" in names  # the built-in tools stay
    assert toolMessages(model.chatRequests[1]) == ["hello from mcp"]
    seen = toolMessages(model.chatRequests[2])[-1]
    assert "plain text" in seen and "embedded text" in seen and "[image: image/png" in seen
    asked = client.permissionRequests
    assert len(asked) == 2
    _, toolCall, options = asked[0]
    assert toolCall.title == "srv: echo" and toolCall.kind == "other"
    assert {o.kind for o in options} == {"allow_once", "allow_always", "reject_once", "reject_always"}
    cards = toolCalls(found)
    finals = [card for card in cards.values() if card.get("status") == "completed"]
    everything = next(card for card in finals if card["title"] == "srv: everything")
    kinds = [block["content"]["type"] for block in everything["content"]]
    assert kinds == ["text", "image", "audio", "resource_link", "resource", "resource"]
    calls = [m for m in mcp_scripted.received(log(serverLog), "tools/call")]
    assert [c["params"]["name"] for c in calls] == ["echo", "everything"]  # the real names went back


@pytest_twisted.ensureDeferred
async def test_alwaysAllowIsRememberedPerTool(scriptedServer, tmp_path) -> None:
    """"Always allow" for one tool: its next call does not ask; another tool still does."""
    model, url = scriptedServer
    server, _ = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("echo"), mcp_scripted.tool("other")])
    model.default.responses += [
        call("a", "mcp__srv__echo", text="one"), call("b", "mcp__srv__echo", text="two"),
        call("c", "mcp__srv__other", text="three"), [{"text": "done"}],
    ]
    client = RecordingClient(permission=answers("allow_always", "reject_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 30)
            return wire.problems()

    assert await onLoop(scenario()) == []
    assert [r[1].title for r in client.permissionRequests] == ["srv: echo", "srv: other"]
    results = toolMessages(model.chatRequests[-1])
    assert results[:2] == ["one", "two"] and "was not run" in results[2]


@pytest_twisted.ensureDeferred
async def test_brokenServersAreToldAndTheOthersWork(scriptedServer, tmp_path) -> None:
    """A server that exits at start and one that never answers the handshake: the
    session is created at once, the prompt waits only the startup bound, the user
    is told of both (with the dying one's stderr), the healthy server's tool works,
    and /mcp lists each with its state."""
    model, url = scriptedServer
    good, _ = scripted(tmp_path, "good")
    dead, _ = scripted(tmp_path, "dead", exitAtStart={"code": 3, "stderr": "boom: missing API key"})
    silent, _ = scripted(tmp_path, "silent", era="silent")
    model.default.responses += [call("e", "mcp__good__echo", text="still here"), [{"text": "ok"}]]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MCP_STARTUP_TIMEOUT="5")
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            began = asyncio.get_running_loop().time()
            old = SseMcpServer(type="sse", name="old", url="http://127.0.0.1:9/sse", headers=[])
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[good, dead, silent, old])).session_id
            created = asyncio.get_running_loop().time() - began
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("try")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
            return created, updates(wire, sid), wire.problems()

    created, found, problems = await onLoop(scenario())
    assert problems == []
    assert created < 3  # nothing waited for the servers (the silent one takes 5 s)
    assert toolMessages(model.chatRequests[-1]) == ["still here"]
    shown = agentText(found)
    assert "MCP server dead is not available" in shown and "boom: missing API key" in shown
    assert "MCP server silent is not available" in shown and "no answer to the handshake" in shown
    assert "MCP server old is not available" in shown and "cannot reach http://127.0.0.1:9/sse" in shown
    table = shown[shown.index("**MCP servers**"):]
    assert "| `good` | ready | stdio" in table and "| `dead` | failed |" in table and "| `silent` | failed |" in table


@pytest_twisted.ensureDeferred
async def test_noticeWhereTheEditorTakesThem(scriptedServer, tmp_path) -> None:
    """An editor that takes notices hears of a failed server as a notice, at once,
    without a prompt."""
    model, url = scriptedServer
    dead, _ = scripted(tmp_path, "dead", exitAtStart={"code": 3, "stderr": "no such token"})

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, client, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[dead])).session_id
            for _ in range(500):
                if any(u.get("sessionUpdate") == "notice" for u in updates(wire, sid)):
                    break
                await asyncio.sleep(0.02)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    notice = next(u for u in found if u.get("sessionUpdate") == "notice")
    assert notice["title"] == "MCP server dead is not available"
    assert "exit status 3" in notice["description"] and "no such token" in notice["description"]


@pytest_twisted.ensureDeferred
async def test_cancelTellsTheServer(scriptedServer, tmp_path) -> None:
    """Cancelling a turn in an MCP call sends notifications/cancelled for that request,
    and the turn answers cancelled at once."""
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("wait", {"slow": {"seconds": 30}})])
    model.default.responses += [call("w", "mcp__srv__wait", text="x"), [{"text": "never"}]]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("wait")]))
            await client.waitForUpdate(lambda s, u: u.get("status") == "in_progress")
            for _ in range(500):
                if mcp_scripted.received(log(serverLog), "tools/call"):
                    break
                await asyncio.sleep(0.02)
            began = asyncio.get_running_loop().time()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(prompt, 10)
            return response, asyncio.get_running_loop().time() - began, wire.problems()

    response, took, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled" and took < 3
    entries = log(serverLog)
    callId = mcp_scripted.received(entries, "tools/call")[0]["id"]
    cancels = mcp_scripted.received(entries, "notifications/cancelled")
    assert [c["params"]["requestId"] for c in cancels] == [callId]


@pytest_twisted.ensureDeferred
async def test_progressErrorsAndStructuredResults(scriptedServer, tmp_path) -> None:
    """Progress shows in the card; isError fails the call with the server's words;
    structuredContent reaches the model as JSON when there is no text."""
    model, url = scriptedServer
    tools = [mcp_scripted.tool("steps", {"progress": {"steps": 3, "delay": 0.15}}),
             mcp_scripted.tool("broken", "error"), mcp_scripted.tool("data", "structured")]
    server, _ = scripted(tmp_path, "srv", tools=tools)
    model.default.responses += [
        call("p", "mcp__srv__steps", text="walked"), call("b", "mcp__srv__broken", text="x"),
        call("d", "mcp__srv__data", text="y"), [{"text": "done"}],
    ]
    client = RecordingClient(permission=answers("allow_once", "allow_once", "allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    progress = [u for u in found if u.get("sessionUpdate") == "tool_call_update" and "Progress:" in json.dumps(u)]
    assert len(progress) >= 2 and "3 of 3" in json.dumps(progress[-1])
    results = toolMessages(model.chatRequests[-1])
    assert results[0] == "walked"
    assert results[1].startswith("Error:") and "it went wrong" in results[1]
    assert json.loads(results[2]) == {"echo": {"text": "y"}}
    statuses = [card["status"] for card in toolCalls(found).values()]
    assert statuses == ["completed", "failed", "completed"]


@pytest_twisted.ensureDeferred
async def test_configuredServersJoinAndTheEditorWins(scriptedServer, tmp_path) -> None:
    """config.yaml's mcp_servers join every session (a disabled one does not, a bad
    one is told); on a name clash the editor's server is used."""
    model, url = scriptedServer
    home = tmp_path / "home"
    home.mkdir()
    mine, _ = scripted(tmp_path, "mine", tools=[mcp_scripted.tool("from_config")])
    clash, _ = scripted(tmp_path, "clash", tools=[mcp_scripted.tool("from_config_clash")])
    editors, _ = scripted(tmp_path, "editors", tools=[mcp_scripted.tool("from_editor")])
    editors = editors.model_copy(update={"name": "clash"})
    (home / "config.yaml").write_text(
        "model:\n  default: whatever\n"
        "mcp_servers:\n"
        f"  mine:\n    command: {json.dumps(mine.command)}\n    args: {json.dumps(mine.args)}\n"
        f"  clash:\n    command: {json.dumps(clash.command)}\n    args: {json.dumps(clash.args)}\n"
        "  off:\n    command: /nonexistent\n    enabled: false\n"
        "  broken:\n    args: [no command]\n")
    model.default.responses += [[{"text": "ok"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[editors])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/tools")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    names = offered(model.chatRequests[0])
    assert "mcp__mine__from_config" in names and "mcp__clash__from_editor" in names
    assert not any("from_config_clash" in n or "__off__" in n for n in names)
    shown = agentText(found)
    assert "mcp_servers.broken needs a command" in shown
    assert "| `mine` | ready | stdio, legacy era | 1 | config |" in shown
    assert "| `clash` | ready | stdio, legacy era | 1 | editor |" in shown
    assert "`mcp__mine__from_config`" in shown[shown.index("**Tools**"):]


@pytest_twisted.ensureDeferred
async def test_annotationsAreBelievedOnlyFromTrustedServers(scriptedServer, tmp_path) -> None:
    """A read-only tool of a server the user trusts runs without asking, shown as a
    read; the same claim from an untrusted server still asks, shown as other."""
    model, url = scriptedServer
    readOnly = {"annotations": {"readOnlyHint": True}}
    trusted, _ = scripted(tmp_path, "trusted", tools=[mcp_scripted.tool("look", **readOnly)])
    stranger, _ = scripted(tmp_path, "stranger", tools=[mcp_scripted.tool("look", **readOnly)])
    model.default.responses += [call("a", "mcp__trusted__look", text="t"), call("b", "mcp__stranger__look", text="s"),
                                [{"text": "ok"}]]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MCP_TRUSTED="trusted")
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[trusted, stranger])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("look")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert [r[1].title for r in client.permissionRequests] == ["stranger: look"]
    assert "not marked trusted" in json.dumps(client.permissionRequests[0][1].model_dump(by_alias=True))
    kinds = {card["title"]: card["kind"] for card in toolCalls(found).values()}
    assert kinds == {"trusted: look": "read", "stranger: look": "other"}
    assert toolMessages(model.chatRequests[-1]) == ["t", "s"]


@pytest_twisted.ensureDeferred
async def test_badServerEntriesAreInvalidParams(scriptedServer, tmp_path) -> None:
    """Malformed mcpServers entries get -32602 naming the entry, and no session."""
    model, url = scriptedServer
    good = {"name": "a", "command": "/bin/true", "args": [], "env": []}
    cases = [
        ([good, dict(good)], "listed twice"),
        ([{"name": "x", "command": "", "args": [], "env": []}], "mcpServers[0].command"),
        ([{"type": "websocket", "name": "w", "url": "ws://127.0.0.1:9"}], "mcpServers[0].type"),
        ([{"type": "http", "name": "h", "url": "ftp://nowhere", "headers": []}], "mcpServers[0].url"),
        ([{**good, "env": [{"name": "A"}]}], "mcpServers[0].env[0]"),
    ]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            errors = []
            for servers, _ in cases:
                try:
                    await raw(conn, "session/new", {"cwd": str(tmp_path), "mcpServers": servers})
                except Exception as e:  # the SDK's RequestError
                    errors.append((getattr(e, "code", None), str(e)))
            listed = await raw(conn, "session/list", {})
            return errors, listed, wire.problems()

    errors, listed, problems = await onLoop(scenario())
    assert problems == []
    assert len(errors) == len(cases)
    for (code, message), (_, needle) in zip(errors, cases):
        assert code == -32602 and needle in message
    assert listed["sessions"] == []
