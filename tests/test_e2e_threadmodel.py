"""The thread model of issue 24 §3 through the real process: background processes and
subagents together do not starve the session's turns nor other sessions.

16 sessions each start 2 background processes that print all the time, then each delegates 3
children; every child's first model answer waits (a barrier in the scripted model) until all
80 model requests have arrived: the 32 requests of the 16 parent turns and the first of all 48
children. Only if every turn has its worker and every child its thread at once, beside 32
running processes, does any of them get an answer. The figures (time, the agent's threads at
their most) are printed: run with ``-s`` to read them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest_twisted

from .agentproc import processGone
from .e2e import modelEnv, text, toolCalls, uniqueSleep, updates
from .sdkclient import RecordingClient, connect, initialized, leavingNoProcess
from .test_e2e_safety import approve
from .test_e2e_subagents import child, delegate, isChild

SESSIONS, CHILDREN, PROCESSES = 16, 3, 2


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


@pytest_twisted.ensureDeferred
async def test_sixteenSessionsThreeChildrenTwoProcessesEachEveryTurnGetsAWorker(scriptedServer, tmp_path: Path) -> None:
    server, url = scriptedServer
    sleep = uniqueSleep(371)
    chatty = f"while true; do echo tick; sleep 0.2; done & {sleep}"
    barrier = SESSIONS * 2 + SESSIONS * CHILDREN
    for s in range(SESSIONS):
        goals = [f"job {s}-{c}" for c in range(CHILDREN)]
        server.addRule(f"session {s} works", [
            [{"tool_calls": [{"id": f"b{p}", "name": "terminal", "arguments": {"command": chatty, "background": True}}
                             for p in range(PROCESSES)]}],
            [delegate(*goals)],
            [{"text": f"session {s} done"}]])
        for goal in goals:
            # A child sees the session's background processes through its own process tool.
            server.addRule(*child(goal, [
                [{"barrier": barrier}, {"tool_calls": [{"id": "l", "name": "process", "arguments": {"action": "list"}}]}],
                [{"text": f"summary of {goal}"}]]))
    found: dict[str, Any] = {"most": 0}

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=modelEnv(url)) as (conn, _, wire, agent):
            await initialized(conn)
            sids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(SESSIONS)]
            found["idle"] = threads(agent.pid)
            sampling = True

            async def sample() -> None:
                while sampling:
                    found["most"] = max(found["most"], threads(agent.pid))
                    await asyncio.sleep(0.05)

            sampler = asyncio.ensure_future(sample())
            began = time.monotonic()
            answers = await asyncio.wait_for(asyncio.gather(*(
                conn.prompt(session_id=sid, prompt=[text(f"session {s} works")]) for s, sid in enumerate(sids))), 180)
            found["took"] = time.monotonic() - began
            sampling = False
            await sampler
            assert [a.stop_reason for a in answers] == ["end_turn"] * SESSIONS
            pids = found["pids"] = [call["rawOutput"]["pid"] for sid in sids
                                    for call in toolCalls(updates(wire, sid)).values()
                                    if "background" in json.dumps(call.get("_meta", {}))]
            assert len(set(pids)) == SESSIONS * PROCESSES and not any(processGone(pid) for pid in pids)
            found["after"] = threads(agent.pid)
            assert wire.problems() == []
            agent.stdin.close()
            await asyncio.wait_for(agent.wait(), 60)

    await leavingNoProcess(scenario(), lambda: found.get("pids", []))
    print(f"\n{SESSIONS} sessions x ({CHILDREN} children + {PROCESSES} background processes): "
          f"{found['took']:.2f} s; agent threads idle {found['idle']}, at most {found['most']}, after {found['after']}")
    children = [b for b in server.chatRequests if isChild(b)]
    assert len(children) == SESSIONS * CHILDREN * 2
    for body in children:
        if body["messages"][-1]["role"] == "tool":  # what the child's process tool listed: its session's two
            listed = json.loads(body["messages"][-1]["content"])["processes"]
            assert len(listed) == PROCESSES and all(p["status"] == "running" for p in listed)
    parents = [b for b in server.chatRequests if not isChild(b) and b["messages"][-1]["role"] == "tool"
               and "results" in b["messages"][-1]["content"]]
    assert len(parents) == SESSIONS
    for body in parents:
        summaries = [r["summary"] for r in json.loads(body["messages"][-1]["content"])["results"]]
        assert len(summaries) == CHILDREN and all(s.startswith("summary of job") for s in summaries)
