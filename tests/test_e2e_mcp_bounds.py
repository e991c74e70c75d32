"""Hostile MCP servers cannot exhaust the agent (issue 22, item 4), through the real
process: its open file descriptors and memory are sampled from /proc while a
server holds every connection, floods requests without reading, pages huge tool
lists or floods log messages; a later command still works, closing the session
gives the descriptors back, a server that will not read is stopped and the user
told, and stderr stays small."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys

import pytest
import pytest_twisted
from acp.exceptions import RequestError
from acp.schema import AllowedOutcome, RequestPermissionResponse

from . import mcp_scripted
from .agentproc import processGone
from .e2e import agentText, modelEnv, text, updates
from .mcp_e2e import call, http, log, scripted, toolMessages
from .sdkclient import RecordingClient, connect, initialized, onLoop, raw, until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def allowAll(request):
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def memory(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def terminal(command: str) -> list[dict]:
    return [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": command}}]}]


@pytest_twisted.ensureDeferred
async def test_httpServerThatHoldsEveryConnection(scriptedServer, httpMCP, tmp_path) -> None:
    """A server that answers tools/list with a batch of 3,000 pings and never answers
    our answers holds at most a bounded number of the agent's sockets; a command in
    another session still works meanwhile; closing the session gives them all back."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({"toolsListBatch": 3000, "holdResponses": True})
    model.default.responses += [terminal("echo still-works"), [{"text": "done"}]]
    stderr = open(tmp_path / "agent.err", "wb")
    env = modelEnv(url, HERMES_ACP_MCP_STARTUP_TIMEOUT="120")
    seen = {}

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=env, stderr=stderr) as (conn, _, wire, process):
            await initialized(conn)
            pid = process.pid
            other = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            seen["base"] = fds(pid)
            hostile = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("hostile", mcpURL)])).session_id
            await until(lambda: web.counts["(response)"] >= 16, 30, "the agent to answer the pings")
            await asyncio.sleep(1.5)  # time enough to open many more, if it would
            seen["during"], seen["held"] = fds(pid), web.counts["(response)"]
            await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("run it")]), 60)
            await raw(conn, "session/close", {"sessionId": hostile})
            await until(lambda: fds(pid) <= seen["base"] + 6, 15, "the closed session's sockets to be released")
            await until(lambda: web.heldOpen == 0, 15, "the server to see every held connection closed")
            seen["after"] = fds(pid)
            return wire.problems()

    assert await onLoop(scenario()) == []
    stderr.close()
    print(f"fds: base {seen['base']}, during {seen['during']} ({seen['held']} answers held), after {seen['after']}; "
          f"stderr {os.path.getsize(tmp_path / 'agent.err')} bytes")
    assert seen["held"] <= 16  # at most this many POSTs at once (HERMES_ACP_MCP_HTTP_CONNECTIONS)
    assert seen["during"] <= seen["base"] + 16 + 8
    assert json.loads(toolMessages(model.chatRequests[-1])[0])["output"].strip() == "still-works"
    assert os.path.getsize(tmp_path / "agent.err") < 64 * 1024


@pytest_twisted.ensureDeferred
async def test_stdioServerThatFloodsAndNeverReads(scriptedServer, tmp_path) -> None:
    """A server that sends requests as fast as it can and never reads our answers is
    stopped once a bounded backlog of them waits; the user is told why; the agent's
    memory stays small; the session goes on."""
    model, url = scriptedServer
    flood, floodLog = scripted(tmp_path, "flood", pidFile=str(tmp_path / "flood.pid"),
                               flood={"after": "tools/list", "message": {"jsonrpc": "2.0", "id": 0, "method": "ping"}})
    model.default.responses += [[{"text": "still here"}]]
    stderr = open(tmp_path / "agent.err", "wb")
    seen = {}

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url), stderr=stderr) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[flood])).session_id
            pid = int(await _text(tmp_path / "flood.pid"))
            began = asyncio.get_running_loop().time()
            await until(lambda: processGone(pid), 30, "the flooding server to be stopped")
            seen["stopped after"] = asyncio.get_running_loop().time() - began
            seen["rss"], seen["peak"] = memory(process.pid), memory(process.pid, "VmHWM")
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 60)
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    stderr.close()
    size = os.path.getsize(tmp_path / "agent.err")
    print(f"flooding server stopped after {seen['stopped after']:.1f} s; agent RSS {seen['rss'] >> 20} MB "
          f"(peak {seen['peak'] >> 20} MB); stderr {size} bytes")
    assert problems == [] and response.stop_reason == "end_turn"
    assert any(e.get("event") == "flooding" for e in log(floodLog))
    shown = agentText(found)
    assert "MCP server flood is not available" in shown and "does not read" in shown
    assert seen["peak"] < 200 << 20
    assert size < 64 * 1024


async def _text(path) -> str:
    await until(lambda: os.path.exists(path) and open(path).read().strip(), 20, f"{path}")
    return open(path).read().strip()


@pytest_twisted.ensureDeferred
async def test_hugeToolListsAreNotReadPastTheCut(scriptedServer, tmp_path) -> None:
    """Ten 8 MB pages of tools: the agent stops reading at the first page past the
    128-tool / 256 KB cut, its memory stays small, and the user is told."""
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "big", manyTools={"count": 80_000, "descriptionBytes": 1000},
                                 pageSize=8_000)
    model.default.responses += [[{"text": "ok"}]]

    async def scenario():
        env = modelEnv(url, HERMES_ACP_MCP_STARTUP_TIMEOUT="120")
        async with connect(RecordingClient(), env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 120)
            return response, memory(process.pid, "VmHWM"), updates(wire, sid), wire.problems()

    response, peak, found, problems = await onLoop(scenario())
    pages = mcp_scripted.received(log(serverLog), "tools/list")
    print(f"tools/list pages read: {len(pages)}; agent peak RSS {peak >> 20} MB")
    assert problems == [] and response.stop_reason == "end_turn"
    assert len(pages) == 1
    assert peak < 160 << 20  # (it peaked at 82 MB; reading every page, at 234 MB)
    assert "Some tools of MCP server big are not offered" in agentText(found)
    assert sum(name.startswith("mcp__big__") for name in
               [t["function"]["name"] for t in model.chatRequests[0]["tools"]]) == 128


@pytest_twisted.ensureDeferred
async def test_logMessageFloodIsRateLimited(scriptedServer, tmp_path) -> None:
    """A server that sends notifications/message as fast as it can: the agent's
    stderr gets a few of them and how many were not logged; its tools still work."""
    model, url = scriptedServer
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "y" * 200}}
    loud, loudLog = scripted(tmp_path, "loud", flood={"after": "tools/list", "message": note, "readStdin": True})
    model.default.responses += [call("e", "mcp__loud__echo", text="heard"), [{"text": "done"}]]
    stderr = open(tmp_path / "agent.err", "wb")

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=modelEnv(url), stderr=stderr) as (
                conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[loud])).session_id
            await until(lambda: any(e.get("event") == "flooding" for e in log(loudLog)), 30, "the flood")
            await asyncio.sleep(3)
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("echo")]), 60)
            await raw(conn, "session/close", {"sessionId": sid})
            return response, wire.problems()

    response, problems = await onLoop(scenario())
    stderr.close()
    written = (tmp_path / "agent.err").read_text()
    print(f"stderr: {len(written)} bytes, {written.count('MCP server loud says')} of its messages logged")
    assert problems == [] and response.stop_reason == "end_turn"
    assert toolMessages(model.chatRequests[-1]) == ["heard"]
    assert 0 < written.count("MCP server loud says") <= 20 + 2 * 60
    assert "were not logged" in written
    assert len(written) < 64 * 1024


@pytest_twisted.ensureDeferred
async def test_runningOutOfDescriptorsIsNamed(scriptedServer, httpMCP, tmp_path) -> None:
    """With the connection bound raised past the agent's descriptor limit, a server
    that holds every connection runs the agent out of file descriptors: what fails
    then says so ("Too many open files", never "Permission denied"), and once the
    session is closed, commands run again (nothing broken was kept)."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({"toolsListBatch": 3000, "holdResponses": True})
    model.default.responses += [terminal("echo again"), [{"text": "two"}]]
    env = modelEnv(url, HERMES_ACP_MCP_HTTP_CONNECTIONS="1000", HERMES_ACP_MCP_STARTUP_TIMEOUT="120")
    stderr = open(tmp_path / "agent.err", "wb")

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=env, stderr=stderr) as (conn, _, wire, process):
            await initialized(conn)
            pid = process.pid
            other = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            limit = fds(pid) + 30
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
            hostile = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("hostile", mcpURL)])).session_id
            await until(lambda: fds(pid) >= limit - 1, 30, "the agent to run out of descriptors")
            try:
                await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("first")]), 60)
                refused = None
            except RequestError as e:
                refused = str(e)
            await raw(conn, "session/close", {"sessionId": hostile})
            await until(lambda: fds(pid) < limit - 20, 15, "the descriptors to be released")
            again = await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("again")]), 60)
            return refused, again, wire.problems()

    refused, again, problems = await onLoop(scenario())
    stderr.close()
    print(f"out of descriptors, the prompt was refused with: {refused}")
    assert problems == []
    assert refused is not None and "Too many open files" in refused and "Permission denied" not in refused
    assert again.stop_reason == "end_turn"
    assert json.loads(toolMessages(model.chatRequests[-1])[0])["output"].strip() == "again"


@pytest_twisted.ensureDeferred
async def test_eventStreamsLeftOpenAfterTheirAnswerAreClosed(scriptedServer, httpMCP, tmp_path) -> None:
    """A server that answers each call on an event stream it never closes: the agent
    closes each once its answer is in, so call after call goes through (more calls
    than it keeps connections) and no connection is left held."""
    model, url = scriptedServer
    web, mcpURL = httpMCP({"responseMode": "sse", "sseKeepOpen": True})
    calls = 20
    for n in range(calls):
        model.default.responses.append(call(f"c{n}", "mcp__web__echo", text=f"call {n}"))
    model.default.responses.append([{"text": "done"}])
    env = modelEnv(url, HERMES_ACP_MCP_CALL_TIMEOUT="10")

    async def scenario():
        async with connect(RecordingClient(permission=allowAll), env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("web", mcpURL)])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("call away")]), 120)
            await until(lambda: web.heldOpen == 0, 10, "the answered streams to be closed")
            return response, wire.problems()

    response, problems = await onLoop(scenario())
    assert problems == [] and response.stop_reason == "end_turn"
    assert toolMessages(model.chatRequests[-1]) == [f"call {n}" for n in range(calls)]
