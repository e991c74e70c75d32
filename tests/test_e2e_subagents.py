"""``delegate_task`` (issue 24 §2) through the real process: children with a fresh context run
in parallel, the editor sees their work attributed to them (cards, questions; the unstable
``subagent_update`` / ``session_message`` form where the editor advertises ``subagents``), the
parent reads their summaries only, a cancel ends them all at once, a child's failure is a failed
task, a load replays them, and their words are searchable outside the model's history.

The scripted model tells parent from child by the system prompt (``system:`` rules): a child's
says it is a subagent and names its task."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from hermes_acp.store import SessionDB

from acp.schema import DeniedOutcome, RequestPermissionResponse

from .e2e import answers, commandRunning, modelEnv, text, toolCalls, uniqueSleep, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, until
from .sdkclient import raw as rawRequest
from .test_e2e_safety import approve
from .test_e2e_compaction import RawEditor

GOALS = ("look into alpha", "look into beta", "look into gamma")


def delegate(*goals: str, callId: str = "d") -> dict[str, Any]:
    return {"tool_calls": [{"id": callId, "name": "delegate_task",
                            "arguments": {"tasks": [{"goal": g, "context": f"context of {g}"} for g in goals]}}]}


def child(goal: str, steps: list[list[dict[str, Any]]]) -> tuple[str, list[list[dict[str, Any]]]]:
    return f"system:Your task: {goal}\n", steps


def threeChildren(server: Any, tmp_path: Path, first: list[dict[str, Any]] | None = None) -> None:
    """The parent delegates three tasks; each child (all three waiting until the parent's
    request and theirs have all arrived: only children running side by side get there) reads
    its file, then answers with a summary; child 2 also writes a file (a question)."""
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / f"{name}.txt").write_text(f"SECRET-{name.upper()}-CONTENT\n")
    server.addRule("please delegate", [[delegate(*GOALS)], [{"text": "all three reported"}]])
    for index, name in enumerate(("alpha", "beta", "gamma")):
        calls = [{"id": f"r{index}", "name": "read_file", "arguments": {"path": f"{name}.txt"}}]
        if name == "beta":
            calls.append({"id": "w", "name": "write_file", "arguments": {"path": "beta-notes.txt", "content": "n"}})
        server.addRule(*child(GOALS[index], [
            [*(first or [{"barrier": 4}]), {"text": f"checking {name}. "}, {"tool_calls": calls}],
            [{"text": f"summary-{name}: the file holds one line"}],
        ]))


def toolNames(body: dict[str, Any]) -> set[str]:
    return {tool["function"]["name"] for tool in body.get("tools") or []}


def isChild(body: dict[str, Any]) -> bool:
    return "You are a Hermes subagent" in body["messages"][0]["content"]


@pytest_twisted.ensureDeferred
async def test_threeChildrenInParallelAttributedAndSummarised(scriptedServer, tmp_path) -> None:
    """Three children run at once (each model answer waits until all their requests arrived);
    each of their calls is a card titled with the child's name, linked to the parent call in
    ``_meta``; the child's permission question names it; each child has a card with its answer;
    the parent's card shows progress and ends with the three summaries; the parent's next
    request holds the three summaries and nothing of the children's transcripts; children
    have neither delegate_task nor clarify, and a system prompt of their own."""
    server, url = scriptedServer
    threeChildren(server, tmp_path)
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("please delegate")]), 60)
            return sid, response, wire

    sid, response, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert response.stop_reason == "end_turn"
    found = updates(wire, sid)
    cards = toolCalls(found)
    delegated = [c for c in cards.values() if c.get("title") == "Delegate 3 tasks to subagents"]
    assert len(delegated) == 1 and delegated[0]["status"] == "completed"
    parentId = delegated[0]["toolCallId"]
    progress = [u for u in found if u.get("toolCallId") == parentId and "Subagents:" in json.dumps(u.get("content"))]
    assert progress and "3 of 3 done" in json.dumps(progress[-1]["content"])
    final = json.dumps(delegated[0]["content"])
    for name in ("alpha", "beta", "gamma"):
        assert f"summary-{name}" in final

    def tag(card: dict[str, Any]) -> dict[str, Any]:
        return card.get("_meta", {}).get("hermesAcp", {}).get("subagent", {})

    childCards = [c for c in cards.values() if tag(c).get("role") == "child"]
    assert sorted(c["title"].split(":")[0] for c in childCards) == ["Subagent 1", "Subagent 2", "Subagent 3"]
    assert all(c["status"] == "completed" for c in childCards)
    for index, name in enumerate(("alpha", "beta", "gamma")):
        own = next(c for c in childCards if c["title"].startswith(f"Subagent {index + 1}:"))
        assert f"summary-{name}" in json.dumps(own["content"]) and f"checking {name}" in json.dumps(own["content"])
    calls = [c for c in cards.values() if tag(c).get("role") == "call"]
    assert sorted(c["title"] for c in calls) == [
        "Subagent 1: Read alpha.txt", "Subagent 2: Read beta.txt", "Subagent 2: Write beta-notes.txt",
        "Subagent 3: Read gamma.txt"]
    assert all(c["status"] == "completed" and tag(c)["parentToolCallId"] == parentId for c in calls)
    assert len({tag(c)["sessionId"] for c in calls}) == 3
    # the question is the child's, and says so
    asked = [f["params"] for f in wire.received if f.get("method") == "session/request_permission"]
    assert [a["toolCall"]["title"] for a in asked] == ["Subagent 2: Write beta-notes.txt"]
    assert asked[0]["toolCall"]["_meta"]["hermesAcp"]["subagent"]["name"] == "Subagent 2"
    assert (tmp_path / "beta-notes.txt").read_text() == "n"
    # no child text in the parent's message
    assert not any("checking" in u["content"]["text"] for u in found if u["sessionUpdate"] == "agent_message_chunk")
    # the model: the parent reads summaries only; children have their own prompt and fewer tools
    parent = [b for b in server.chatRequests if not isChild(b)]
    children = [b for b in server.chatRequests if isChild(b)]
    assert len(parent) == 2 and len(children) == 6
    results = json.loads(next(m for m in parent[1]["messages"] if m["role"] == "tool")["content"])["results"]
    assert [(r["task_index"], r["status"]) for r in results] == [(0, "completed"), (1, "completed"), (2, "completed")]
    assert results[0]["summary"] == "summary-alpha: the file holds one line"
    assert results[1]["tool_trace"][1]["tool"] == "write_file"
    assert "SECRET-ALPHA-CONTENT" not in json.dumps(parent[1]) and "checking alpha" not in json.dumps(parent[1])
    assert "delegate_task" in toolNames(parent[0]) and "clarify" in toolNames(parent[0])
    for body in children:
        assert not toolNames(body) & {"delegate_task", "clarify"} and "read_file" in toolNames(body)
    assert children[0]["messages"][1]["content"].startswith("look into ")  # the goal, then its context
    assert "Context:\ncontext of look into" in children[0]["messages"][1]["content"]


@pytest_twisted.ensureDeferred
async def test_cancelEndsEveryChildAtOnce(scriptedServer, tmp_path) -> None:
    """Cancel while one child streams (stalled), one runs a command and one waits for the
    user's answer: the prompt answers cancelled at once, the stream is dropped, the command
    killed, the question withdrawn, every card is final, and the next prompt works."""
    server, url = scriptedServer
    command = uniqueSleep(41)
    server.addRule("please delegate", [[delegate(*GOALS)]])
    server.addRule("again", [[{"text": "fine again"}]])
    server.addRule(*child(GOALS[0], [[{"text": "working. "}, {"stall": True}]]))
    server.addRule(*child(GOALS[1], [[{"tool_calls": [{"id": "s", "name": "terminal", "arguments": {"command": command}}]}]]))
    server.addRule(*child(GOALS[2], [[{"tool_calls": [
        {"id": "w", "name": "write_file", "arguments": {"path": "never.txt", "content": "x"}}]}]]))
    asked = asyncio.Event()

    async def wait(request):
        asked.set()
        await asyncio.sleep(30)
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    async def scenario():
        async with connect(RecordingClient(permission=wait), env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("please delegate")]))
            await asyncio.wait_for(asked.wait(), 30)
            await until(lambda: server.stalls >= 1 and commandRunning(command), what="the stream and the command")
            began = time.monotonic()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            took = time.monotonic() - began
            await until(lambda: server.abandoned >= 1 and not commandRunning(command), 10, "the stream and command to end")
            ended = time.monotonic() - began
            again = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("again")]), 30)
            return sid, response, took, ended, again, wire

    sid, response, took, ended, again, wire = await onLoop(scenario())
    print(f"cancel with three children: answered in {took:.3f} s, stream dropped and command killed in {ended:.3f} s")
    assert wire.problems() == []
    assert response.stop_reason == "cancelled" and again.stop_reason == "end_turn"
    assert took < 3 and ended < 3  # measured: 0.02-0.05 s and 0.05-0.06 s
    assert any(f.get("method") == "$/cancel_request" for f in wire.received)
    assert not (tmp_path / "never.txt").exists()
    cards = toolCalls(updates(wire, sid))
    assert cards and all(c["status"] in ("completed", "failed") for c in cards.values())


@pytest_twisted.ensureDeferred
async def test_childFailureIsAFailedTaskSingleForm(scriptedServer, tmp_path) -> None:
    """The single form (goal + context): the child's model fails (a 400), and the parent reads a
    failed task with the error; the turn goes on and ends normally. A child that asks for
    delegate_task anyway is told there is no such tool."""
    server, url = scriptedServer
    server.addRule("one task", [
        [{"tool_calls": [{"id": "d", "name": "delegate_task", "arguments": {"goal": "doomed work", "context": "x"}}]}],
        [{"tool_calls": [{"id": "e", "name": "delegate_task", "arguments": {"goal": "nested try"}}]}],
        [{"text": "noted the failure"}],
    ])
    server.addRule(*child("doomed work", [[{"status": 400, "error": "bad request for the child"}]]))
    server.addRule(*child("nested try", [
        [{"tool_calls": [{"id": "n", "name": "delegate_task", "arguments": {"goal": "deeper"}}]}],
        [{"text": "could not delegate"}]]))

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("one task")]), 60)
            return sid, response, wire

    sid, response, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert response.stop_reason == "end_turn"
    parent = [b for b in server.chatRequests if not isChild(b)]
    tools = [m["content"] for m in parent[-1]["messages"] if m["role"] == "tool"]
    first, second = (json.loads(t)["results"][0] for t in tools)
    assert first["status"] == "failed" and "bad request for the child" in first["error"]
    assert second["status"] == "completed" and second["summary"] == "could not delegate"
    nested = [b for b in server.chatRequests if isChild(b) and "nested try" in b["messages"][0]["content"]][-1]
    assert "unknown tool 'delegate_task'" in next(m for m in nested["messages"] if m["role"] == "tool")["content"]
    cards = toolCalls(updates(wire, sid))
    delegated = [c for c in cards.values() if c.get("title") == "Delegate 1 task to subagents"]
    assert [c["status"] for c in delegated] == ["failed", "completed"]
    assert "bad request for the child" in json.dumps(delegated[0]["content"])


def childFrames(frames: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f["params"]["sessionId"], f["params"]["update"]) for f in frames if f.get("method") == "session/update"]


@pytest_twisted.ensureDeferred
async def test_subagentCapabilityLoadAndSearch(scriptedServer, tmp_path) -> None:
    """An editor with ``subagents``: each child is announced (``subagent_update``, running) on
    the parent before anything names it, its task and result are ``session_message``s, its
    answer and calls come under its own session id, and it ends ``idle``. After a restart a
    load replays the children in the loading editor's form (sessions, or attributed cards), and
    their words are found by the session search but never loaded into the model's history."""
    server, url = scriptedServer
    threeChildren(server, tmp_path)
    server.rules = [r for r in server.rules if "beta" not in r[0]]  # no question: the raw editor answers none
    server.addRule(*child(GOALS[1], [[{"barrier": 4}, {"tool_calls": [
        {"id": "rb", "name": "read_file", "arguments": {"path": "beta.txt"}}]}], [{"text": "summary-beta: fine"}]]))
    home = str(tmp_path / "home")
    env = modelEnv(url, home)
    caps = {"subagents": {}}

    async def scenario():
        editor = await RawEditor.start(env, caps)
        sid = (await editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
        stop = await editor.prompt(sid, "please delegate")
        await editor.close()
        later = await RawEditor.start(env, caps)
        await later.request("session/load", {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []})
        await later.close()
        async with connect(env=env) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            plain = updates(wire, sid)
            plainProblems = wire.problems()
        return sid, stop, editor, later, plain, plainProblems

    sid, stop, editor, later, plain, plainProblems = await onLoop(scenario())
    assert stop == "end_turn"
    for raw in (editor, later):
        assert raw.problems() == []
        sent = childFrames(raw.frames)
        announced = [u["sessionId"] for s, u in sent if u["sessionUpdate"] == "subagent_update" and s == sid
                     and u.get("state") == {"state": "running"}]
        assert len(announced) == 3
        for childId in announced:
            first = next(i for i, (s, u) in enumerate(sent) if s == childId or u.get("recipientSessionId") == childId)
            announce = next(i for i, (s, u) in enumerate(sent) if u.get("sessionId") == childId)
            assert announce < first
            own = [u for s, u in sent if s == childId]
            assert {u["sessionUpdate"] for u in own} >= {"tool_call", "tool_call_update", "agent_message_chunk"}
            messages = [u for s, u in sent if u["sessionUpdate"] == "session_message" and s == sid
                        and childId in (u["senderSessionId"], u["recipientSessionId"])]
            assert [m["recipientSessionId"] == childId for m in messages] == [True, False]
            assert "summary-" in messages[1]["content"][0]["text"]
            assert {"sessionUpdate": "subagent_update", "sessionId": childId,
                    "state": {"state": "idle", "stopReason": "end_turn"}} in [u for s, u in sent if s == sid]
        assert not any(u["sessionUpdate"] == "tool_call" and "Subagent" in u.get("title", "") for s, u in sent if s == sid)
    # the plain editor's replay: the cards, attributed
    assert plainProblems == []
    titles = sorted(c.get("title", "") for c in toolCalls(plain).values())
    assert "Subagent 1: Read alpha.txt" in titles and "Delegate 3 tasks to subagents" in titles
    assert sum(t.startswith("Subagent ") and ": look into" in t for t in titles) == 3
    # searchable, and not in the model's history
    with SessionDB(Path(home) / "state.db") as db:
        hits = db.searchMessages("SECRET ALPHA CONTENT", 5)
        history = json.dumps(db.loadMessages(sid))
    assert [hit["sessionId"] for hit in hits] == [sid]
    assert "SECRET-ALPHA-CONTENT" not in history and "summary-alpha" in history


@pytest_twisted.ensureDeferred
async def test_sixteenSessionsEachWithThreeChildren(scriptedServer, tmp_path) -> None:
    """The thread model: 16 sessions each delegate three children, and every child's first model
    answer waits until all 64 requests (16 parents, 48 children) have arrived: only if every turn
    has its worker and all 48 children run beside them at once. Each child then runs a tool call
    (the process's 16 tool slots; the delegate calls hold none) and answers."""
    server, url = scriptedServer
    (tmp_path / "f.txt").write_text("x\n")
    for s in range(16):
        goals = [f"job {s}-{c}" for c in range(3)]
        server.addRule(f"session {s} delegates", [[delegate(*goals)], [{"text": f"session {s} done"}]])
        for goal in goals:
            server.addRule(*child(goal, [
                [{"barrier": 64}, {"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "f.txt"}}]}],
                [{"text": f"summary of {goal}"}]]))

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            ids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(16)]
            began = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*[
                conn.prompt(session_id=sid, prompt=[text(f"session {s} delegates")]) for s, sid in enumerate(ids)]), 120)
            return results, time.monotonic() - began, wire.problems()

    results, took, problems = await onLoop(scenario())
    print(f"16 sessions x 3 children: {took:.2f} s")
    assert problems == []
    assert [r.stop_reason for r in results] == ["end_turn"] * 16
    parents = [b for b in server.chatRequests if not isChild(b)]
    for body in parents[16:]:
        summaries = [r["summary"] for r in json.loads(body["messages"][-1]["content"])["results"]]
        assert len(summaries) == 3 and all(s.startswith("summary of job") for s in summaries)


@pytest_twisted.ensureDeferred
async def test_aChildsBackgroundProcessStaysItsCard(scriptedServer, tmp_path) -> None:
    """A child starts a background process: it is the session's (``/ps`` lists it, it outlives
    the child), and its card stays the child's: for an editor with ``subagents`` every update
    of it (running, its end after ``/kill``) goes to the child's session, where the card was
    shown, never to the parent's, which has no such card; each carries the child's tag and the
    background tag both."""
    server, url = scriptedServer
    sleep = uniqueSleep(373)
    server.addRule("please delegate", [[delegate("start the server")], [{"text": "the child started it"}]])
    server.addRule(*child("start the server", [
        [{"tool_calls": [{"id": "b", "name": "terminal", "arguments": {"command": sleep, "background": True}}]}],
        [{"text": "summary: started"}]]))
    env = modelEnv(url, str(tmp_path / "home"))

    async def scenario():
        editor = await RawEditor.start(env, {"subagents": {}})
        try:
            sid = (await editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            assert await editor.prompt(sid, "please delegate") == "end_turn"
            assert commandRunning(sleep)
            await editor.prompt(sid, "/ps")
            listed = "".join(u["content"]["text"] for s, u in childFrames(editor.frames)
                             if s == sid and u["sessionUpdate"] == "agent_message_chunk")
            assert sleep in listed
            await editor.prompt(sid, "/kill 1")
            await until(lambda: not commandRunning(sleep), 10, "the child's process to end")
            await editor.prompt(sid, "/ps")
        finally:
            await editor.close()
        return sid, editor

    sid, editor = await onLoop(scenario())
    assert editor.problems() == []
    sent = childFrames(editor.frames)
    started = [(s, u) for s, u in sent if u["sessionUpdate"] == "tool_call" and "sleep" in json.dumps(u)]
    assert len(started) == 1 and started[0][0] != sid
    childId, card = started[0][0], started[0][1]["toolCallId"]
    about = [(s, u) for s, u in sent if u.get("toolCallId") == card]
    assert {s for s, _ in about} == {childId}
    ends = [u for _, u in about if u.get("status") in ("completed", "failed")]
    assert len(ends) == 1 and "killed" in json.dumps(ends[0]["content"])
    shown = [u for _, u in about if "background" in u.get("_meta", {}).get("hermesAcp", {})]
    assert len(shown) >= 2 and ends[0] in shown and all("subagent" in u["_meta"]["hermesAcp"] for u in shown)


@pytest.mark.parametrize("ending", ["session/close", "session/delete"])
@pytest_twisted.ensureDeferred
async def test_closeOrDeleteWhileChildrenRunEndsThemAndTheirProcesses(scriptedServer, tmp_path, ending) -> None:
    """The session is closed (or deleted) while its children work: one has started a background
    process and streams (stalled), one runs a command, one streams. The prompt answers, the
    streams are dropped, the command and the background process end, and the agent goes on
    (a new session's prompt works)."""
    server, url = scriptedServer
    command, daemon = uniqueSleep(43 + 2 * ("delete" in ending)), uniqueSleep(44 + 2 * ("delete" in ending))
    server.addRule("please delegate", [[delegate(*GOALS)]])
    server.addRule("again", [[{"text": "fine again"}]])
    server.addRule(*child(GOALS[0], [[{"tool_calls": [{"id": "b", "name": "terminal",
                                                       "arguments": {"command": daemon, "background": True}}]}],
                                     [{"text": "started. "}, {"stall": True}]]))
    server.addRule(*child(GOALS[1], [[{"tool_calls": [{"id": "s", "name": "terminal", "arguments": {"command": command}}]}]]))
    server.addRule(*child(GOALS[2], [[{"text": "working. "}, {"stall": True}]]))

    async def scenario():
        async with connect(RecordingClient(permission=approve), env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("please delegate")]))
            await until(lambda: server.stalls >= 2 and commandRunning(command) and commandRunning(daemon),
                        30, "the streams and the commands")
            began = time.monotonic()
            await rawRequest(conn, ending, {"sessionId": sid})
            response = await asyncio.wait_for(running, 30)
            took = time.monotonic() - began
            await until(lambda: server.abandoned >= 2 and not commandRunning(command) and not commandRunning(daemon),
                        10, "the streams and commands to end")
            ended = time.monotonic() - began
            other = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            again = await asyncio.wait_for(conn.prompt(session_id=other, prompt=[text("again")]), 30)
            return response, took, ended, again, wire

    response, took, ended, again, wire = await onLoop(scenario())
    print(f"{ending} with three children: answered in {took:.3f} s, everything ended in {ended:.3f} s")
    assert wire.problems() == []
    assert response.stop_reason == "cancelled" and again.stop_reason == "end_turn"
    assert took < 3 and ended < 5
