"""An MCP server's ``elicitation/create`` (issue 23) through the real process: forwarded to
an editor that takes forms, marked as the server's and tied to the call's card, the answer
back to the server; refused where the editor cannot ask, and when it is too large."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest_twisted

from . import mcp_scripted
from .e2e import answers, modelEnv, text, toolCalls, updates
from .mcp_e2e import call, log, scripted, toolMessages
from .sdkclient import RecordingClient, connect, initialized, onLoop, until
from .test_e2e_ask import FORM

REGION = {"message": "Pick a region", "requestedSchema": {
    "type": "object", "properties": {"region": {"type": "string", "enum": ["eu", "us"]}}, "required": ["region"]}}


async def mcpTurn(client: RecordingClient, url: str, cwd: str, server: Any, form: bool, **env: str):
    async with connect(client, env=modelEnv(url, **env)) as (conn, _, wire, process):
        await initialized(conn, **({"elicitation": FORM} if form else {}))
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[server])).session_id
        response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("deploy")]), 30)
        return response, updates(wire, sid), wire.problems()


def initializeCapabilities(serverLog: Any) -> dict[str, Any]:
    return mcp_scripted.received(log(serverLog), "initialize")[0]["params"]["capabilities"]


@pytest_twisted.ensureDeferred
async def test_aServersQuestionReachesAnElicitingEditorAndTheAnswerGoesBack(scriptedServer, tmp_path) -> None:
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("deploy", {"elicit": REGION})])
    model.default.responses += [call("d", "mcp__srv__deploy"), [{"text": "deployed"}]]
    client = RecordingClient(permission=answers("allow_once"),
                             elicitation=lambda request: {"action": "accept", "content": {"region": "eu"}})
    response, found, problems = await onLoop(mcpTurn(client, url, str(tmp_path), server, form=True))
    assert problems == []
    assert response.stop_reason == "end_turn"
    assert initializeCapabilities(serverLog)["elicitation"] == {"form": {}}  # form only: the editor has no url mode
    [(message, mode)] = client.elicitations
    assert "MCP server “srv”" in message and "not the agent" in message and message.endswith("Pick a region")
    assert mode["toolCallId"] in toolCalls(found) and mode["requestedSchema"] == REGION["requestedSchema"]
    assert json.loads(toolMessages(model.chatRequests[1])[-1]) == {"action": "accept", "content": {"region": "eu"}}


@pytest_twisted.ensureDeferred
async def test_withoutElicitationTheServerIsNotToldItMayAsk(scriptedServer, tmp_path) -> None:
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("deploy", {"elicit": REGION})])
    model.default.responses += [call("d", "mcp__srv__deploy"), [{"text": "could not"}]]
    client = RecordingClient(permission=answers("allow_once"))
    response, found, problems = await onLoop(mcpTurn(client, url, str(tmp_path), server, form=False))
    assert problems == []
    assert "elicitation" not in initializeCapabilities(serverLog)
    assert client.elicitations == []
    assert json.loads(toolMessages(model.chatRequests[1])[-1])["error"]["code"] == -32601


@pytest_twisted.ensureDeferred
async def test_anOversizedOrMalformedQuestionIsRefusedToTheServer(scriptedServer, tmp_path) -> None:
    model, url = scriptedServer
    huge = {**REGION, "message": "x" * 2000}
    nested = {"message": "Deep?", "requestedSchema": {"type": "object", "properties": {"a": {"type": "object"}}}}
    link = {"mode": "url", "message": "Open", "url": "https://example.invalid/x", "elicitationId": "e1"}
    server, serverLog = scripted(tmp_path, "srv", tools=[
        mcp_scripted.tool("huge", {"elicit": huge}), mcp_scripted.tool("nested", {"elicit": nested}),
        mcp_scripted.tool("link", {"elicit": link})])
    model.default.responses += [[{"tool_calls": [
        {"id": n, "name": f"mcp__srv__{n}", "arguments": {}} for n in ("huge", "nested", "link")]}], [{"text": "no"}]]
    client = RecordingClient(permission=lambda request: answers("allow_always")(request),
                             elicitation=lambda request: {"action": "accept", "content": {}})
    response, found, problems = await onLoop(mcpTurn(client, url, str(tmp_path), server, form=True,
                                                     HERMES_ACP_MCP_ELICITATION_BYTES="1024"))
    assert problems == []
    assert client.elicitations == []
    errors = [json.loads(m)["error"] for m in toolMessages(model.chatRequests[1])]
    assert [e["code"] for e in errors] == [-32602] * 3
    assert "HERMES_ACP_MCP_ELICITATION_BYTES" in errors[0]["message"]
    assert "flat" in errors[1]["message"] and "'url' is not supported" in errors[2]["message"]


@pytest_twisted.ensureDeferred
async def test_aCancelWithdrawsTheServersQuestion(scriptedServer, tmp_path) -> None:
    """The user cancels the turn while the server's question is open: the editor's request
    is withdrawn, and the server hears "cancel"."""
    model, url = scriptedServer
    server, serverLog = scripted(tmp_path, "srv", tools=[mcp_scripted.tool("deploy", {"elicit": REGION})])
    model.default.responses += [call("d", "mcp__srv__deploy"), [{"text": "never"}]]
    asked = asyncio.Event()

    async def never(request: dict[str, Any]) -> Any:
        asked.set()
        await asyncio.sleep(600)

    client = RecordingClient(permission=answers("allow_once"), elicitation=never)

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn, elicitation=FORM)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("deploy")]))
            await asyncio.wait_for(asked.wait(), 30)
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(prompt, 30)
            await until(lambda: any(e.get("event") == "response" for e in log(serverLog)), 10,
                        "the server's question answered")
            return response, wire

    response, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert response.stop_reason == "cancelled"
    assert any(f.get("method") == "$/cancel_request" for f in wire.received)
    [answered] = [e for e in log(serverLog) if e.get("event") == "response"]
    assert answered["message"]["result"] == {"action": "cancel"}
