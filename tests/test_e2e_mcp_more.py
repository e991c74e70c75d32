"""MCP resources, prompts and the HTTP+SSE transport through the real process (issue 29 §2, §3):
the npm reference server ``server-everything``, servers built with the PyPI ``mcp`` package
(stdio and its ``SseServerTransport``), and scripted servers for the bad inputs."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest_twisted
from acp.schema import McpServerStdio, SseMcpServer

from .e2e import agentText, answers, modelEnv, text, updates
from .mcp_e2e import FASTMCP, call, fastmcp, http, toolMessages
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw, until


def commandNames(found: list[dict[str, Any]]) -> list[list[str]]:
    """The command names of each available_commands_update, in order."""
    return [[c["name"] for c in u["availableCommands"]] for u in found
            if u["sessionUpdate"] == "available_commands_update"]


def userText(request: dict[str, Any]) -> str:
    """The last user message of a model request, as text."""
    content = [m for m in request["messages"] if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


def sse(name: str, url: str) -> SseMcpServer:
    return SseMcpServer(type="sse", name=name, url=url, headers=[])


async def fastmcpSSE() -> tuple[Any, str]:
    web = await asyncio.create_subprocess_exec(sys.executable, FASTMCP, "sse", "0", stdout=asyncio.subprocess.PIPE)
    return web, (await asyncio.wait_for(web.stdout.readline(), 30)).decode().strip()


@pytest_twisted.ensureDeferred
async def test_everythingServerResourcesAndPrompts(scriptedServer, everythingServer, tmp_path) -> None:
    """server-everything (npm): its prompts are slash commands (arguments by position or
    name; a missing required one is told, the server is not asked); its resources are
    listed, templates too, and read (asked first: the server is not trusted), and its
    embedded-resource prompt carries the resource's text to the model."""
    model, url = scriptedServer
    everything = McpServerStdio(name="ev", command=everythingServer[0], args=everythingServer[1:], env=[])
    model.default.responses += [
        [{"text": "prompted"}],  # /mcp__ev__args-prompt Paris
        [{"text": "prompted again"}],  # resource-prompt
        call("l", "list_mcp_resources", server="ev"),
        call("t", "list_mcp_resource_templates"),
        call("r", "read_mcp_resource", server="ev", uri="demo://resource/static/document/architecture.md"),
        call("x", "read_mcp_resource", server="nope", uri="demo://x"),
        [{"text": "read"}],
    ]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MCP_STARTUP_TIMEOUT="30")
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[everything])).session_id
            await until(lambda: any("mcp__ev__args-prompt" in names for names in commandNames(updates(wire, sid))),
                        30, "the prompts as commands")
            for prompt in ("/mcp__ev__args-prompt", "/mcp__ev__args-prompt Paris", "/mcp__ev__args-prompt state=Texas",
                           "/mcp__ev__resource-prompt Text 3", "show me the resources", "/mcp"):
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(prompt)]), 60)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    names = commandNames(found)[-1]
    assert {"help", "mcp__ev__simple-prompt", "mcp__ev__args-prompt", "mcp__ev__resource-prompt"} <= set(names)
    shown = agentText(found)
    assert "/mcp__ev__args-prompt needs city (Name of the city)" in shown  # twice: no argument, then only state
    assert shown.count("needs city") == 2
    assert userText(model.chatRequests[0]) == "What's weather in Paris?"
    embedded = userText(model.chatRequests[1])
    assert "This prompt includes the Text resource with id: 3" in embedded
    assert "[resource demo://resource/dynamic/text/3]\nResource 3: This is a plaintext resource" in embedded
    listed = json.loads(toolMessages(model.chatRequests[3])[0])
    assert listed["server"] == "ev" and any(r["uri"] == "demo://resource/static/document/architecture.md"
                                            for r in listed["resources"])
    templates = json.loads(toolMessages(model.chatRequests[4])[1])
    assert templates["servers"][0]["resourceTemplates"][0]["uriTemplate"] == "demo://resource/dynamic/text/{resourceId}"
    results = toolMessages(model.chatRequests[6])
    assert "Everything Server – Architecture" in results[2]
    assert "'nope' is not an MCP server of this session that offers resources" in results[3]
    assert len(client.permissionRequests) == 1  # the read; the listings ran without asking
    assert "demo://resource/static/document/architecture.md" in json.dumps(
        client.permissionRequests[0][1].model_dump(by_alias=True, exclude_none=True))
    assert "Prompts: " in shown and "`/mcp__ev__simple-prompt`" in shown and "Resources (the model lists" in shown


@pytest_twisted.ensureDeferred
async def test_resourceBoundsLinksAndPromptListChanged(scriptedServer, tmp_path) -> None:
    """A huge resource reaches the model cut at the setting, and says so; a tool's
    resource link tells the model how to read it, and the read works; a server that
    adds a prompt and says so (list_changed) gets a new command in the editor, and a
    resource it adds (and says so) is in the next listing; a prompt's arguments by name
    and by position; "always" covers the server's later reads."""
    model, url = scriptedServer
    model.default.responses += [
        call("a", "read_mcp_resource", server="real", uri="note://big"),
        call("b", "mcp__real__linked"),
        call("c", "read_mcp_resource", server="real", uri="note://greeting"),
        call("d", "mcp__real__teach", word="taught"),
        call("p", "mcp__real__publish", word="fresh"),
        call("q", "list_mcp_resources", server="real"),
        [{"text": "done"}],
        [{"text": "reviewed"}],
        [{"text": "taught prompt ran"}],
    ]
    client = RecordingClient(permission=answers("allow_always", "allow_once", "allow_once", "allow_once"))

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MCP_RESOURCE_BYTES="4096")
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[fastmcp("real")])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("read things")]), 60)
            await until(lambda: any("mcp__real__taught" in n for n in commandNames(updates(wire, sid))), 20,
                        "the new prompt's command")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text('/mcp__real__review "x = 1" style=long')]), 60)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp__real__taught")]), 60)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    big = toolMessages(model.chatRequests[1])[0]
    assert 4096 <= big.count("b") < 4200 and "1,048,576 bytes in all, the first 4,096 shown" in big
    link = toolMessages(model.chatRequests[2])[1]
    assert 'read it with read_mcp_resource(server="real", uri="note://greeting")' in link
    assert "hello from a resource" in toolMessages(model.chatRequests[3])[2]
    assert len(client.permissionRequests) == 4  # big (always), linked, teach, publish; the second read was remembered
    fresh = json.loads(toolMessages(model.chatRequests[6])[5])  # listed after the resource list changed
    assert "note://fresh" in [r["uri"] for r in fresh["resources"]]
    assert "Please review this code (long):\nx = 1" in userText(model.chatRequests[7])
    assert "You were taught taught." in userText(model.chatRequests[8])
    lists = commandNames(found)
    assert "mcp__real__review" in lists[0] or "mcp__real__review" in lists[1]
    assert "mcp__real__taught" not in lists[0] and "mcp__real__taught" in lists[-1]


@pytest_twisted.ensureDeferred
async def test_legacySSEServerFromTheMcpPackage(scriptedServer, tmp_path) -> None:
    """A server on the 2024-11-05 HTTP+SSE transport (the mcp package's SseServerTransport):
    initialize advertises sse; its tools and resources work; when it goes away the user is told."""
    model, url = scriptedServer
    model.default.responses += [
        call("a", "mcp__old__add", a=2, b=40),
        call("b", "read_mcp_resource", server="old", uri="note://echo/sse"),
        [{"text": "done"}],
        [{"text": "after"}],
    ]
    client = RecordingClient(permission=answers("allow_once", "allow_once"))

    async def scenario():
        web, webURL = await fastmcpSSE()
        try:
            async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
                init = await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[sse("old", webURL)])).session_id
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add")]), 60)
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
                web.kill()
                await web.wait()
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 60)
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
                return init, updates(wire, sid), wire.problems()
        finally:
            if web.returncode is None:
                web.kill()
                await web.wait()

    init, found, problems = await onLoop(scenario())
    assert problems == []
    assert init.agent_capabilities.mcp_capabilities.sse is True
    results = toolMessages(model.chatRequests[2])
    assert results[0].strip() == "42" and "echo: sse" in results[1]
    shown = agentText(found)
    assert "| `old` | ready | sse, legacy era" in shown
    assert "| `old` | failed | sse" in shown and "its event stream ended" in shown


@pytest_twisted.ensureDeferred
async def test_sseBadInputsAreToldAndCloseEndsTheStream(scriptedServer, sseMCP, httpMCP, tmp_path) -> None:
    """An endpoint event naming another origin is refused (nothing is posted there); an
    event over the agent's line bound closes the stream and the server fails, told; a
    streamable HTTP server listed as sse is told as such; a session's close ends the GET
    stream of its healthy server."""
    model, url = scriptedServer
    _, streamableURL = httpMCP({})
    evil, evilURL = sseMCP({"endpoint": "http://127.0.0.2:9/messages?session=1"})
    huge, hugeURL = sseMCP({"tools": [{"name": "huge", "inputSchema": {"type": "object"},
                                       "behaviour": {"hugeLine": {"bytes": 200_000}}}]})
    good, goodURL = sseMCP({})
    model.default.responses += [call("h", "mcp__huge__huge", text="x"), [{"text": "ok"}],
                                call("e", "mcp__good__echo", text="fine"), [{"text": "ok"}]]
    client = RecordingClient(permission=answers("allow_once", "allow_once"))

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MAX_LINE="65536")
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            servers = [sse("evil", evilURL), sse("huge", hugeURL), sse("good", goodURL), sse("wrong", streamableURL)]
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=servers)).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 60)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 60)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
            assert len(good.streams) == 1
            await raw(conn, "session/close", {"sessionId": sid})
            await until(lambda: good.closedByClient == 1, 10, "the closed session's GET stream to end")
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    shown = agentText(found)
    assert "MCP server evil is not available" in shown and "endpoint event names another origin" in shown
    assert evil.posts == 0
    assert "MCP server wrong is not available" in shown and "is it a streamable HTTP server (type http)?" in shown
    assert toolMessages(model.chatRequests[1]) == [
        "Error: huge: it sent an event over 65536 bytes (HERMES_ACP_MAX_LINE), so its event stream was closed"]
    assert "MCP server huge is not available" in shown and "event over 65536 bytes" in shown
    assert toolMessages(model.chatRequests[3])[-1] == "fine"


@pytest_twisted.ensureDeferred
async def test_cancelWhileAPromptOrAResourceIsFetched(scriptedServer, tmp_path) -> None:
    """A prompt command whose server takes its time: a cancel answers the turn at once
    (the server is told), no model turn runs; the same for a resource read that takes
    its time (the call fails "interrupted"); /help lists the prompt commands."""
    model, url = scriptedServer
    model.default.responses += [call("s", "read_mcp_resource", server="real", uri="note://slow")]
    client = RecordingClient(permission=answers("allow_once"))

    async def cancelled(conn, sid, prompt, started):
        turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text(prompt)]))
        await until(started, 30, "the slow request")
        await asyncio.sleep(0.5)
        began = asyncio.get_running_loop().time()
        await conn.cancel(session_id=sid)
        answer = await asyncio.wait_for(turn, 30)
        return answer.stop_reason, asyncio.get_running_loop().time() - began

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[fastmcp("real")])).session_id
            await until(lambda: any("mcp__real__slow" in n for n in commandNames(updates(wire, sid))), 30,
                        "the prompt commands")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/help")]), 60)
            prompt = await cancelled(conn, sid, "/mcp__real__slow 60", lambda: True)
            requestsBefore = len(model.chatRequests)
            read = await cancelled(conn, sid, "read it", lambda: client.permissionRequests)
            return prompt, requestsBefore, read, updates(wire, sid), wire.problems()

    prompt, requestsBefore, read, found, problems = await onLoop(scenario())
    assert problems == []
    assert prompt[0] == "cancelled" and prompt[1] < 5  # (the prompt would take 60 s)
    assert requestsBefore == 0  # the cancelled prompt command never reached the model
    assert read[0] == "cancelled" and read[1] < 5  # (the read would take 60 s)
    cards = [u for u in found if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "failed"]
    assert cards and "interrupted by the user" in json.dumps(cards[-1])
    assert "`/mcp__real__review code [style]`: [real MCP prompt] Review a piece of code." in agentText(found)


@pytest_twisted.ensureDeferred
async def test_cancelledStreamedCallLogsNoTraceback(scriptedServer, tmp_path) -> None:
    """A call to a streamable HTTP server (the mcp package's, which answers on an event
    stream) cancelled while it runs: the turn answers cancelled, and the agent's log holds
    no traceback (the cancelled stream's end is not fired twice)."""
    model, url = scriptedServer
    model.default.responses += [call("n", "mcp__web__nap", seconds=30)]
    agentLog = tmp_path / "agent.log"

    async def scenario():
        web = await asyncio.create_subprocess_exec(sys.executable, FASTMCP, "http", "0", stdout=asyncio.subprocess.PIPE)
        try:
            webURL = (await asyncio.wait_for(web.stdout.readline(), 30)).decode().strip()
            with open(agentLog, "wb") as stderr:
                client = RecordingClient(permission=answers("allow_once"))
                async with connect(client, env=modelEnv(url), stderr=stderr) as (conn, _, wire, process):
                    await initialized(conn)
                    sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("web", webURL)])).session_id
                    turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("nap")]))
                    await until(lambda: client.permissionRequests, 30, "the call's permission request")
                    await asyncio.sleep(0.5)  # the call is under way
                    await conn.cancel(session_id=sid)
                    answer = await asyncio.wait_for(turn, 30)
                    await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
                    return answer, wire.problems()
        finally:
            web.kill()
            await web.wait()

    answer, problems = await onLoop(scenario())
    assert problems == [] and answer.stop_reason == "cancelled"
    logged = agentLog.read_text(errors="replace")
    assert "Traceback" not in logged and "AlreadyCalledError" not in logged, logged[-3000:]
