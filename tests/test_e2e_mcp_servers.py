"""MCP servers' lives and transports through the real process (issue 14): one set
per session, none left after close, delete or stdin EOF, re-created after a
restart; streamable HTTP with its session, headers and loss; the modern era;
real servers built with the ``mcp`` package."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

import pytest
import pytest_twisted
from acp.schema import AllowedOutcome, McpServerStdio, RequestPermissionResponse

from . import mcp_scripted
from .agentproc import processGone
from .e2e import agentText, modelEnv, text, updates
from .mcp_e2e import FASTMCP, call, fastmcp, http, log, scripted, toolMessages, withEnv
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw, until


def allowAll(request):
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))


async def startedPid(path) -> int:
    await until(lambda: os.path.exists(path) and open(path).read().strip(), 20, f"{path}")
    return int(open(path).read())


@pytest_twisted.ensureDeferred
async def test_serversBelongToTheirSessionAndEndWithIt(scriptedServer, tmp_path) -> None:
    """Two sessions listing the same server get a process each; close ends one
    session's (its whole process group), delete the other's, stdin EOF the last."""
    model, url = scriptedServer
    pids = {name: tmp_path / f"{name}.pid" for name in ("a", "b", "c", "child")}
    servers = {}
    for name in ("a", "b", "c"):
        script = {"pidFile": str(pids[name])}
        if name == "a":
            script["childPidFile"] = str(pids["child"])
        servers[name], _ = scripted(tmp_path, name, **script)
    same = servers["a"].model_copy(update={"name": "shared"})
    found = {}

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            first = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[same])).session_id
            firstPid = await startedPid(pids["a"])
            child = await startedPid(pids["child"])
            os.unlink(pids["a"])
            second = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[same, servers["b"]])).session_id
            secondPid = await startedPid(pids["a"])
            found["shared"] = (firstPid, secondPid)
            await raw(conn, "session/close", {"sessionId": first})
            await until(lambda: processGone(firstPid) and processGone(child), 15, "the closed session's servers to end")
            await until(lambda: not os.path.exists(f"/proc/{child}"), 10, "what the server left to be reaped")
            assert not processGone(secondPid)
            bPid = await startedPid(pids["b"])
            await raw(conn, "session/delete", {"sessionId": second})
            await until(lambda: processGone(secondPid) and processGone(bPid), 15, "the deleted session's servers")
            await conn.new_session(cwd=str(tmp_path), mcp_servers=[servers["c"]])
            found["c"] = await startedPid(pids["c"])
            return wire.problems()

    assert await onLoop(scenario()) == []
    assert found["shared"][0] != found["shared"][1]
    await onLoop(until(lambda: processGone(found["c"]), 15, "the last server to end after stdin EOF"))


@pytest.mark.parametrize("end", ["stdin EOF", "SIGKILL"])
@pytest_twisted.ensureDeferred
async def test_stubbornServerEndsWithTheAgent(scriptedServer, tmp_path, end) -> None:
    """A server that ignores stdin EOF and SIGTERM is gone once the agent is: after
    its shutdown (which escalates), and even when it was killed outright (no shutdown
    runs: the server dies with its parent)."""
    model, url = scriptedServer
    server, _ = scripted(tmp_path, "stubborn", pidFile=str(tmp_path / "s.pid"), ignoreStdinEOF=True,
                         ignoreSIGTERM=True)

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])
            pid = await startedPid(tmp_path / "s.pid")
            if end == "SIGKILL":
                process.kill()
        await asyncio.wait_for(process.wait(), 20)
        await until(lambda: processGone(pid), 10, f"the stubborn server to end after the agent's {end}")

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_serversComeBackAfterARestartAndLoad(scriptedServer, tmp_path) -> None:
    """After the agent restarts, session/load starts the listed servers again and
    their tools work in the next prompt."""
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", pidFile=str(tmp_path / "srv.pid"))
    home = tempfile.mkdtemp(prefix="hermes-home-")
    model.default.responses += [[{"text": "first"}], call("e", "mcp__srv__echo", text="back again"), [{"text": "ok"}]]

    async def first():
        async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hello")]), 30)
            return sid, await startedPid(tmp_path / "srv.pid")

    sid, oldPid = await onLoop(first())
    await onLoop(until(lambda: processGone(oldPid), 15, "the first agent's server to end"))
    os.unlink(tmp_path / "srv.pid")

    async def second():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[server])
            newPid = await startedPid(tmp_path / "srv.pid")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 30)
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[server])
            kept = not processGone(newPid) and int(open(tmp_path / "srv.pid").read()) == newPid
            await conn.resume_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            await until(lambda: processGone(newPid), 15, "the server a resume without it dropped")
            return newPid, kept, wire.problems()

    newPid, kept, problems = await onLoop(second())
    assert problems == [] and newPid != oldPid
    assert kept  # a load listing the same servers keeps them
    assert toolMessages(model.chatRequests[-1]) == ["back again"]


@pytest_twisted.ensureDeferred
async def test_childEnvironmentAndFolder(scriptedServer, tmp_path) -> None:
    """A stdio server starts in the session's folder with the agent's environment
    (PATH intact) plus the request's entries, and without the agent's credentials;
    its own token does not reach the model; its ping and roots/list are answered."""
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("env", "env")], pingClient=True,
                                 rootsList=True)
    server = withEnv(server, PROJECT_FLAVOUR="given-by-the-editor", PROJECT_TOKEN="a-token-for-the-server")
    names = ["PATH", "PROJECT_FLAVOUR", "PROJECT_TOKEN", "HERMES_API_KEY", "OPENAI_API_KEY", "HOME"]
    model.default.responses += [call("e", "mcp__srv__env", names=names), [{"text": "ok"}]]
    env = modelEnv(url, OPENAI_API_KEY="sk-agent-secret")

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("env")]), 30)
            return wire.problems()

    assert await onLoop(scenario()) == []
    seen = json.loads(toolMessages(model.chatRequests[-1])[0])
    assert seen["PATH"] == env["PATH"] and seen["HOME"] == env.get("HOME")
    assert seen["PROJECT_FLAVOUR"] == "given-by-the-editor"
    assert seen["PROJECT_TOKEN"] == "[REDACTED]"  # the server had it; the model does not read it
    assert seen["HERMES_API_KEY"] is None and seen["OPENAI_API_KEY"] is None
    assert os.path.realpath(seen["cwd"]) == os.path.realpath(tmp_path)
    answers = {e["method"]: e["message"] for e in log(serverLog) if e.get("event") == "response"}
    assert answers["ping"]["result"] == {}  # the server's own requests are answered
    assert answers["roots/list"]["result"]["roots"] == [{"uri": tmp_path.as_uri(), "name": tmp_path.name}]


@pytest_twisted.ensureDeferred
async def test_floodsOverlongLinesCrashesAndListChanges(scriptedServer, tmp_path) -> None:
    """A server that floods stderr still works; an over-long line from it is dropped
    and its answer still arrives; tools it adds after the handshake are offered;
    one that crashes mid-call fails that call and is reported."""
    model, url = scriptedServer
    loud, _ = scripted(tmp_path, "loud", stderrAtStart=1024 * 1024,
                       tools=[mcp_scripted.tool("long", {"hugeLine": {"bytes": 300_000}})],
                       listChangedAfterInitialized={"addTools": [mcp_scripted.tool("late")]})
    fragile, _ = scripted(tmp_path, "fragile", tools=[mcp_scripted.tool("boom", "crash")])
    model.default.responses += [
        call("l", "mcp__loud__long", text="survived"), call("b", "mcp__fragile__boom", text="x"),
        [{"text": "ok"}], [{"text": "and again"}],
    ]

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MAX_LINE="100000")
        async with connect(RecordingClient(permission=allowAll), env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[loud, fragile])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 40)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 40)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert "mcp__loud__late" in [t["function"]["name"] for t in model.chatRequests[0]["tools"]]
    results = toolMessages(model.chatRequests[2])
    assert results[0] == "survived"
    assert results[1].startswith("Error:") and "fragile" in results[1]
    assert "MCP server fragile is not available" in agentText(found) and "crashing" in agentText(found)
    assert "mcp__fragile__boom" not in [t["function"]["name"] for t in model.chatRequests[-1]["tools"]]


@pytest.mark.parametrize("mode, lost", [("sse", 404), ("json", 400)])
@pytest_twisted.ensureDeferred
async def test_streamableHTTPWithSessionLoss(scriptedServer, httpMCP, tmp_path, mode, lost) -> None:
    """An HTTP server (answering JSON, or SSE with a priming event) gets the
    request's headers and the session id it issued; when it forgets the session (404,
    or 400 as some servers say) the agent shakes hands again and the call goes
    through; closing the session sends DELETE."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({"responseMode": mode, "requireHeaders": {"Authorization": "Bearer t0ken"},
                           "sessionLostStatus": lost})
    model.default.responses += [
        call("a", "mcp__web__echo", text="over http"), [{"text": "one"}],
        call("b", "mcp__web__echo", text="after the loss"), [{"text": "two"}],
    ]

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            server = http("web", mcpURL, Authorization="Bearer t0ken")
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("first")]), 30)
            web.expireSessions()
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("second")]), 30)
            await raw(conn, "session/close", {"sessionId": sid})
            await until(lambda: web.deleted, 10, "the DELETE")
            return wire.problems()

    assert await onLoop(scenario()) == []
    assert toolMessages(model.chatRequests[1]) == ["over http"]
    assert toolMessages(model.chatRequests[3])[-1] == "after the loss"
    assert web.initializeCount == 2
    posts = [r for r in web.requests if r.method == "POST"]
    assert all(r.headers.get("authorization") == "Bearer t0ken" for r in posts)
    assert all("text/event-stream" in r.headers.get("accept", "") for r in posts)
    assert any(r.headers.get("mcp-protocol-version") == "2025-11-25" for r in posts)


@pytest_twisted.ensureDeferred
async def test_httpRefusalIsReported(scriptedServer, httpMCP, tmp_path) -> None:
    """A 401 (wrong token) and an unreachable URL: both told, naming the cause."""
    model, url = scriptedServer
    _, mcpURL = httpMCP({"requireHeaders": {"Authorization": "Bearer right"}})
    model.default.responses += [[{"text": "ok"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            servers = [http("locked", mcpURL, Authorization="Bearer wrong"), http("nowhere", "http://127.0.0.1:9/mcp")]
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=servers)).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    shown = agentText(found)
    assert "MCP server locked is not available" in shown and "HTTP 401" in shown and "authorization" in shown
    assert "MCP server nowhere is not available" in shown and "cannot reach http://127.0.0.1:9/mcp" in shown


@pytest_twisted.ensureDeferred
async def test_modernEraOverStdioAndHTTP(scriptedServer, httpMCP, tmp_path) -> None:
    """Servers that refuse the handshake but answer server/discover are spoken to in
    the 2026-07-28 era: every request carries the envelope (and, over HTTP, the headers)."""
    model, url = scriptedServer
    local, localLog = scripted(tmp_path, "local", era="modern")
    web, mcpURL = httpMCP({"era": "modern"})
    model.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "mcp__local__echo", "arguments": {"text": "modern stdio"}},
                         {"id": "b", "name": "mcp__web__echo", "arguments": {"text": "modern http"}}]}],
        [{"text": "done"}],
    ]

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            servers = [local, http("web", mcpURL)]
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=servers)).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("modern")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert sorted(toolMessages(model.chatRequests[1])) == ["modern http", "modern stdio"]
    assert agentText(found).count("modern era") == 2
    calls = mcp_scripted.received(log(localLog), "tools/call")
    assert calls[0]["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    posted = [r for r in web.requests if r.method == "POST" and r.rpcMethod == "tools/call"]
    assert posted[0].headers["mcp-method"] == "tools/call" and posted[0].headers["mcp-name"] == "echo"


@pytest_twisted.ensureDeferred
async def test_realServersFromTheMcpPackage(scriptedServer, tmp_path) -> None:
    """Servers built with the PyPI ``mcp`` package, over stdio and streamable HTTP."""
    model, url = scriptedServer
    model.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "mcp__real__add", "arguments": {"a": 2, "b": 3}},
                         {"id": "b", "name": "mcp__realweb__shout", "arguments": {"text": "quiet"}}]}],
        [{"text": "done"}],
    ]

    async def scenario():
        web = await asyncio.create_subprocess_exec(sys.executable, FASTMCP, "http", "0", stdout=asyncio.subprocess.PIPE)
        try:
            webURL = (await asyncio.wait_for(web.stdout.readline(), 30)).decode().strip()
            env = modelEnv(url, HERMES_ACP_MCP_STARTUP_TIMEOUT="30")
            async with connect(RecordingClient(permission=allowAll), env=env) as (conn, _, wire, process):
                await initialized(conn)
                servers = [fastmcp("real"), http("realweb", webURL)]
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=servers)).session_id
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add and shout")]), 60)
                return wire.problems()
        finally:
            web.kill()
            await web.wait()

    assert await onLoop(scenario()) == []
    results = toolMessages(model.chatRequests[1])
    assert results[0].strip() == "5" and results[1].strip() == "QUIET"


@pytest_twisted.ensureDeferred
async def test_httpServerChangesItsToolsOnTheGetStream(scriptedServer, httpMCP, tmp_path) -> None:
    """An HTTP server that offers the standalone GET stream tells the agent there when
    its tools change; the next prompt offers the new tool."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({"getStream": True})
    model.default.responses += [[{"text": "one"}], call("n", "mcp__web__added", text="new tool"), [{"text": "two"}]]

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("web", mcpURL)])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("first")]), 30)
            await asyncio.wait_for(web.whenGetStreams(1).asFuture(asyncio.get_running_loop()), 10)
            listed = web.counts["tools/list"]
            web.notifyToolsChanged([mcp_scripted.tool("added")])
            await until(lambda: web.counts["tools/list"] > listed, 10, "the agent to list the tools again")
            for _ in range(50):  # /tools shows when the new list has been taken in
                before = len(updates(wire, sid))
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/tools")]), 30)
                if "mcp__web__added" in agentText(updates(wire, sid)[before:]):
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("second")]), 30)
            return wire.problems()

    assert await onLoop(scenario()) == []
    assert "mcp__web__added" not in [t["function"]["name"] for t in model.chatRequests[0]["tools"]]
    assert "mcp__web__added" in [t["function"]["name"] for t in model.chatRequests[1]["tools"]]
    assert toolMessages(model.chatRequests[2]) == ["new tool"]


@pytest_twisted.ensureDeferred
async def test_serverThatClosesItsOutputIsToldWithItsLastWords(scriptedServer, tmp_path) -> None:
    """A server that closes stdout, then explains itself on stderr and exits 3: the
    user reads both its status and its words."""
    model, url = scriptedServer
    code = ("import os, sys, time\nos.close(1)\ntime.sleep(0.3)\n"
            "sys.stderr.write('FATAL: no config here\\n'); sys.stderr.flush(); sys.exit(3)\n")
    quitter = McpServerStdio(name="quitter", command=sys.executable, args=["-c", code], env=[])
    model.default.responses += [[{"text": "ok"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[quitter])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    shown = agentText(found)
    assert "exit status 3" in shown and "FATAL: no config here" in shown


@pytest_twisted.ensureDeferred
async def test_parallelCallsAfterASessionLossShakeHandsOnce(scriptedServer, httpMCP, tmp_path) -> None:
    """Three calls at once find the server forgot the session: one new handshake,
    and every call goes through."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({})
    model.default.responses += [
        [{"text": "ready"}],
        [{"tool_calls": [{"id": f"c{n}", "name": "mcp__web__echo", "arguments": {"text": f"call {n}"}}
                         for n in range(3)]}],
        [{"text": "done"}],
    ]

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("web", mcpURL)])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("first")]), 30)
            web.expireSessions()
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("three at once")]), 30)
            return wire.problems()

    assert await onLoop(scenario()) == []
    assert sorted(toolMessages(model.chatRequests[2])) == ["call 0", "call 1", "call 2"]
    assert web.initializeCount == 2
