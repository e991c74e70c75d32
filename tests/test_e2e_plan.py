"""Plan mode (issue 23): the model reads and plans, changes nothing, and ends with a plan the
user approves, through the real process and the SDK client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_twisted

from .e2e import answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, until

PLAN = "1. Write a.txt\n2. Report"
PLANNING = [
    [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "refused.txt", "content": "no"}},
                     {"id": "r", "name": "read_file", "arguments": {"path": "notes.txt"}},
                     {"id": "t", "name": "terminal", "arguments": {"command": "ls"}},
                     {"id": "x", "name": "terminal", "arguments": {"command": "touch made.txt"}}]}],
    [{"tool_calls": [{"id": "p", "name": "exit_plan_mode", "arguments": {"plan": PLAN}}]}],
]
IMPLEMENTING = [
    [{"tool_calls": [{"id": "e", "name": "write_file", "arguments": {"path": "a.txt", "content": "done"}}]}],
    [{"text": "implemented"}],
]


def toolResults(request: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


def toolNames(request: dict[str, Any]) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


Updates = list[dict[str, Any]]


async def planTurn(tmp_path, url, client, enter: str) -> tuple[Any, Updates, list[str], Updates]:
    """A session put in plan mode by ``enter`` (``set_mode``, ``config`` or ``/plan``), then
    one prompt; the prompt's answer, the session's updates, the frames' problems and the
    updates the way in sent."""

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            if enter == "set_mode":
                await conn.set_session_mode(session_id=sid, mode_id="plan")
            elif enter == "config":
                await conn.set_config_option(session_id=sid, config_id="mode", value="plan")
            else:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/plan")]), 30)
            # (set_mode's and the option's current_mode_update follow their answer, a moment later)
            await until(lambda: "plan" in modeUpdates(updates(wire, sid)), 10, "the mode's update")
            before = len(updates(wire, sid))
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add a.txt")]), 60)
            found = updates(wire, sid)
            return response, found[before:], wire.problems(), found[:before]

    return await onLoop(scenario())


def checkPlanning(tmp_path, server, client, found) -> None:
    """What every plan turn shares: the write and the other command refused without a
    question, the read and the read-only command done, the plan shown and asked about."""
    first, second = server.chatRequests[0], server.chatRequests[1]
    assert "PLAN MODE" in first["messages"][0]["content"]
    assert "exit_plan_mode" in toolNames(first)
    results = toolResults(second)
    assert "Blocked in plan mode" in results["w"] and "Blocked in plan mode" in results["x"]
    assert "planning notes" in results["r"]
    assert "notes.txt" in results["t"]  # ls ran
    assert not (tmp_path / "refused.txt").exists() and not (tmp_path / "made.txt").exists()
    _, toolCall, options = client.permissionRequests[0]  # the first question is the plan's
    assert toolCall.kind == "switch_mode" and PLAN in toolCall.content[0].content.text
    assert [(o.option_id, o.kind) for o in options] == [
        ("allow_once", "allow_once"), ("allow_always", "allow_always"), ("reject_once", "reject_once")]
    plans = [u for u in found if u["sessionUpdate"] == "plan"]
    assert [e["content"] for e in plans[-1]["entries"]] == ["Write a.txt", "Report"]
    card = toolCalls(found)[toolCall.tool_call_id]
    assert card["content"][0]["content"]["text"] == PLAN  # the plan stays in its card


def modeUpdates(found: list[dict[str, Any]]) -> list[str]:
    return [u["currentModeId"] for u in found if u["sessionUpdate"] == "current_mode_update"]


def optionMode(found: list[dict[str, Any]]) -> str:
    options = [u for u in found if u["sessionUpdate"] == "config_option_update"][-1]
    return {o["id"]: o["currentValue"] for o in options["configOptions"]}["mode"]


@pytest_twisted.ensureDeferred
async def test_implementAsksEditsAfterwards(scriptedServer, tmp_path) -> None:
    """"Implement": the mode is the default one at once, the turn goes on without plan
    mode, and its edit is asked."""
    server, url = scriptedServer
    (tmp_path / "notes.txt").write_text("planning notes\n")
    server.default.responses += PLANNING + IMPLEMENTING
    client = RecordingClient(permission=answers("allow_once", "allow_once"))
    response, found, problems, before = await planTurn(tmp_path, url, client, "set_mode")
    assert problems == []
    assert modeUpdates(before) == ["plan"] and optionMode(before) == "plan"
    checkPlanning(tmp_path, server, client, found)
    assert response.stop_reason == "end_turn"
    assert modeUpdates(found) == ["default"] and optionMode(found) == "default"
    assert len(client.permissionRequests) == 2  # the plan, then the edit
    assert client.permissionRequests[1][1].kind == "edit"
    third = server.chatRequests[2]
    assert "approved the plan" in toolResults(third)["p"]
    assert "PLAN MODE" not in third["messages"][0]["content"] and "exit_plan_mode" not in toolNames(third)
    assert (tmp_path / "a.txt").read_text() == "done"


@pytest_twisted.ensureDeferred
async def test_implementAcceptingEditsAsksNothingMore(scriptedServer, tmp_path) -> None:
    """``/plan`` enters plan mode; "implement and accept edits": the mode accepts edits at
    once and the turn's edit is not asked."""
    server, url = scriptedServer
    (tmp_path / "notes.txt").write_text("planning notes\n")
    server.default.responses += PLANNING + IMPLEMENTING
    client = RecordingClient(permission=answers("allow_always"))
    response, found, problems, before = await planTurn(tmp_path, url, client, "/plan")
    assert problems == []
    commands = [u for u in before if u["sessionUpdate"] == "available_commands_update"][-1]
    assert "plan" in {c["name"] for c in commands["availableCommands"]}
    assert modeUpdates(before) == ["plan"]
    checkPlanning(tmp_path, server, client, found)
    assert response.stop_reason == "end_turn"
    assert modeUpdates(found) == ["accept_edits"] and optionMode(found) == "accept_edits"
    assert len(client.permissionRequests) == 1
    assert (tmp_path / "a.txt").read_text() == "done"


@pytest.mark.parametrize("answer", ["reject_once", "cancelled"])
@pytest_twisted.ensureDeferred
async def test_keepPlanningEndsTheTurnInPlanMode(scriptedServer, tmp_path, answer) -> None:
    """"Keep planning" (or no answer): the session stays in plan mode, the turn ends after
    the call (the model is not asked again), and the model's next turn hears why."""
    server, url = scriptedServer
    (tmp_path / "notes.txt").write_text("planning notes\n")
    server.default.responses += PLANNING + IMPLEMENTING

    def policy(request: Any) -> Any:
        from acp.schema import DeniedOutcome, RequestPermissionResponse

        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return answers(answer)(request)

    client = RecordingClient(permission=policy)
    response, found, problems, _ = await planTurn(tmp_path, url, client, "config")
    assert problems == []
    checkPlanning(tmp_path, server, client, found)
    assert response.stop_reason == "end_turn"
    assert len(server.chatRequests) == 2  # nothing after the plan's answer
    assert modeUpdates(found) == []
    assert not (tmp_path / "a.txt").exists()
    card = toolCalls(found)[client.permissionRequests[0][1].tool_call_id]
    assert card["status"] == "failed"
    assert "still in plan mode" in card["content"][1]["content"]["text"]


@pytest_twisted.ensureDeferred
async def test_mcpToolsInPlanModeOnlyWhenKnownToRead(scriptedServer, tmp_path) -> None:
    """In plan mode a trusted server's read-only tool runs; the same server's other tool,
    and an untrusted server's read-only claim, are refused without a question and never
    reach their servers."""
    from . import mcp_scripted
    from .mcp_e2e import call, scripted, toolMessages

    model, url = scriptedServer
    readOnly = {"annotations": {"readOnlyHint": True}}
    trusted, trustedLog = scripted(tmp_path, "trusted", tools=[mcp_scripted.tool("look", **readOnly),
                                                               mcp_scripted.tool("change")])
    stranger, strangerLog = scripted(tmp_path, "stranger", tools=[mcp_scripted.tool("look", **readOnly)])
    model.default.responses += [call("a", "mcp__trusted__look", text="t"), call("b", "mcp__trusted__change", text="c"),
                                call("c", "mcp__stranger__look", text="s"), [{"text": "planned"}]]
    client = RecordingClient(permission=answers())

    async def scenario():
        async with connect(client, env=modelEnv(url, HERMES_ACP_MCP_TRUSTED="trusted")) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[trusted, stranger])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="plan")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("look around")]), 30)
            return wire.problems()

    problems = await onLoop(scenario())
    assert problems == []
    assert client.permissionRequests == []
    told = toolMessages(model.chatRequests[-1])
    assert "Blocked in plan mode" not in told[0]
    assert "Blocked in plan mode" in told[1] and "Blocked in plan mode" in told[2]
    assert "tools/call" in trustedLog.read_text() and "change" not in trustedLog.read_text().split("tools/call", 1)[1]
    assert "tools/call" not in strangerLog.read_text()
