"""Bounded work per reply through the real process: a reply of 400 ``terminal`` calls keeps the
agent's threads and child processes bounded while it runs (sampled from /proc), shows each
card pending until its call starts, refuses the calls past the cap with a result each, and the
next request is valid; several sessions at once share the process's tool slots."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest_twisted

from acp.schema import AllowedOutcome, RequestPermissionResponse

from .e2e import answers, commandRunning, modelEnv, text, toolCalls, uniqueSleep, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, until

CALLS = 400
SLEEP = "sleep 0.5"
#: What the held-out check allows the agent process while such a reply runs.
MOST_THREADS, MOST_CHILDREN = 64, 32


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the task or process ended while we looked
        return ""


def children(pid: int) -> list[int]:
    """The process's children, from each of its threads' ``children`` list."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(child) for task in tasks for child in _read(f"/proc/{pid}/task/{task}/children").split()]


def descendants(pid: int) -> list[int]:
    found, todo = [], children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children(child))
    return found


class Sampler:
    """Samples the agent's threads, children and running ``sleep`` commands until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = self.children = self.sleeps = self.samples = 0
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.threads = max(self.threads, len(os.listdir(f"/proc/{self.pid}/task")))
            except OSError:
                return
            self.children = max(self.children, len(children(self.pid)))
            running = [p for p in descendants(self.pid) if _read(f"/proc/{p}/comm").strip() == "sleep"]
            self.sleeps = max(self.sleeps, len(running))
            self.samples += 1
            try:
                await asyncio.wait_for(self.stopped.wait(), 0.02)
            except asyncio.TimeoutError:
                pass


def reply(prefix: str) -> list[list[dict[str, Any]]]:
    calls = [{"id": f"{prefix}{i}", "name": "terminal", "arguments": {"command": SLEEP}} for i in range(CALLS)]
    return [[{"tool_calls": calls}], [{"text": f"{prefix} done"}]]


async def promptAll(conn: Any, tmp_path: Any, prompts: list[str], sampler: Sampler) -> list[Any]:
    await initialized(conn)
    ids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in prompts]
    sampling = asyncio.ensure_future(sampler.run())
    try:
        return [ids, await asyncio.wait_for(asyncio.gather(
            *(conn.prompt(session_id=sid, prompt=[text(p)]) for sid, p in zip(ids, prompts))), 240)]
    finally:
        sampler.stopped.set()
        await sampling


@pytest_twisted.ensureDeferred
async def test_aReplyOf400CommandsStaysBounded(scriptedServer, tmp_path) -> None:
    """400 ``sleep`` calls in one reply, default settings: the first 32 run, four at a time,
    each card pending, then in progress, then completed; the other 368 are refused (failed),
    and the next request answers every call id. Threads and children stay within bounds."""
    server, url = scriptedServer
    server.addRule("many", reply("c"))
    client = RecordingClient(permission=answers(*["allow_once"] * CALLS))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            sampler = Sampler(process.pid)
            ids, responses = await promptAll(conn, tmp_path, ["many"], sampler)
            return responses, updates(wire, ids[0]), wire.problems(), sampler

    [response], found, problems, sampler = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    print(f"sampled {sampler.samples} times: at most {sampler.threads} threads, {sampler.children} children, "
          f"{sampler.sleeps} sleeps running")
    assert sampler.samples >= 10
    assert sampler.threads <= MOST_THREADS and sampler.children <= MOST_CHILDREN
    assert 1 <= sampler.sleeps <= 4
    calls = list(toolCalls(found).values())
    assert len(calls) == CALLS
    assert [c["statuses"] for c in calls[:32]] == [["pending", "in_progress", "completed"]] * 32
    assert [c["statuses"] for c in calls[32:]] == [["pending", "failed"]] * (CALLS - 32)
    assert "asked for 400 tool calls" in str(calls[-1]["content"])
    firstRunning = next(i for i, u in enumerate(found) if u.get("status") == "in_progress")
    assert sum(u["sessionUpdate"] == "tool_call" for u in found[:firstRunning]) == CALLS  # every card first, pending
    results = [m for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [f"c{i}" for i in range(CALLS)]
    assert sum("not run" in m["content"] for m in results) == CALLS - 32


@pytest_twisted.ensureDeferred
async def test_sessionsTogetherShareTheProcessSlots(scriptedServer, tmp_path) -> None:
    """Three sessions each with a reply of 400 commands, five tool slots for the process: never
    more than five commands run at once, and every turn ends."""
    server, url = scriptedServer
    prompts = ["first", "second", "third"]
    for prompt in prompts:
        server.addRule(prompt, reply(prompt))
    client = RecordingClient(permission=answers(*["allow_once"] * CALLS * 3))
    env = modelEnv(url, HERMES_ACP_TOOL_THREADS="5", HERMES_ACP_MAX_TOOL_CALLS="12")

    async def scenario():
        async with connect(client, env=env) as (conn, _, wire, process):
            sampler = Sampler(process.pid)
            ids, responses = await promptAll(conn, tmp_path, prompts, sampler)
            return responses, [updates(wire, sid) for sid in ids], wire.problems(), sampler

    responses, found, problems, sampler = await onLoop(scenario())
    assert problems == []
    assert [r.stop_reason for r in responses] == ["end_turn"] * 3
    print(f"sampled {sampler.samples} times: at most {sampler.threads} threads, {sampler.children} children, "
          f"{sampler.sleeps} sleeps running")
    assert sampler.threads <= MOST_THREADS and sampler.children <= MOST_CHILDREN
    assert 1 <= sampler.sleeps <= 5
    for session in found:
        statuses = [c["status"] for c in toolCalls(session).values()]
        assert statuses == ["completed"] * 12 + ["failed"] * (CALLS - 12)


@pytest_twisted.ensureDeferred
async def test_cancelWithCallsRunningAndWaiting(scriptedServer, tmp_path) -> None:
    """Twelve long commands, four running and eight waiting: a cancel answers at once, every
    card ends failed, the waiting ones never started (pending, then failed), and no command
    is left running."""
    server, url = scriptedServer
    command = uniqueSleep(53)
    server.default.responses += [
        [{"tool_calls": [{"id": f"s{i}", "name": "terminal", "arguments": {"command": command}} for i in range(12)]}],
        [{"text": "never reached"}],
    ]
    client = RecordingClient(permission=answers(*["allow_once"] * 12))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("run them")]))
            await until(lambda: sum(u.get("status") == "in_progress" for _, u in
                                    ((s, u.model_dump(by_alias=True, exclude_none=True)) for s, u in client.updates)) == 4,
                        60, "four running calls")
            await until(lambda: commandRunning(command), 30, "the commands to start")
            began = time.monotonic()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            return response, time.monotonic() - began, updates(wire, sid), wire.problems()

    response, elapsed, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "cancelled"
    print(f"cancel answered in {elapsed:.3f} s")
    assert elapsed < 5
    calls = list(toolCalls(found).values())
    assert [c["statuses"] for c in calls] == [["pending", "in_progress", "failed"]] * 4 + [["pending", "failed"]] * 8
    await onLoop(until(lambda: not commandRunning(command), 10, "the commands to be killed"))


@pytest_twisted.ensureDeferred
async def test_aWaitingCallAsksOnlyWhenItStarts(scriptedServer, tmp_path) -> None:
    """One call at a time and no sandbox (each command asks): the editor is asked about the
    second command only after the first one's card completed."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "terminal", "arguments": {"command": "touch a"}},
                         {"id": "b", "name": "terminal", "arguments": {"command": "touch b"}}]}],
        [{"text": "touched"}],
    ]
    seen: list[tuple[str, list[str]]] = []
    client: RecordingClient

    def answer(request: dict[str, Any]) -> RequestPermissionResponse:
        shown = [u.model_dump(by_alias=True, exclude_none=True) for _, u in client.updates]
        seen.append((request["toolCall"].tool_call_id, [u["toolCallId"] for u in shown if u.get("status") == "completed"]))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))

    client = RecordingClient(permission=answer)
    env = modelEnv(url, HERMES_ACP_SANDBOX="off", HERMES_ACP_TOOL_PARALLEL="1")

    async def scenario():
        async with connect(client, env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await conn.prompt(session_id=sid, prompt=[text("touch both")])
            return response, updates(wire, sid), wire.problems()

    response, found, problems = await onLoop(scenario())
    assert problems == []
    assert response.stop_reason == "end_turn"
    first, second = toolCalls(found)
    assert seen == [(first, []), (second, [first])]
    assert (tmp_path / "a").exists() and (tmp_path / "b").exists()
