"""``engine.subagents`` with the real AIAgent against the scripted model: the tool slots a
delegation must not hold, a child's bounds and failures, its observer, the argument checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from zope.interface.verify import verifyObject

from hermes_acp.engine.background import BackgroundProcesses
from hermes_acp.engine.subagents import ChildObserver, SubagentSettings, Task, bounded
from hermes_acp.engine.tools.delegate import tasksOf
from hermes_acp.engine.tools.registry import ToolError
from hermes_acp.engine.toolslots import ToolSlots
from hermes_acp.interfaces import ITurnObserver

from .observers import RecordingObserver
from .test_engine_agent import OBSERVERS, call, interruptOnce, makeAgent, run, tools, workspace  # noqa: F401 (a fixture)


SLOT_WAIT = 30


def delegated(*goals: str) -> list[dict[str, Any]]:
    return tools(call("d", "delegate_task", tasks=[{"goal": g} for g in goals]))


def mostAtOnce(observer: Any) -> int:
    """The most children the observer saw running at once (its started and ended events)."""
    running, most = 0, 0
    for event in observer.children:
        running += {"started": 1, "ended": -1}.get(event[0], 0)
        most = max(most, running)
    return most


def results(server: Any) -> list[dict[str, Any]]:
    parent = [b for b in server.chatRequests if "You are a Hermes subagent" not in b["messages"][0]["content"]]
    return json.loads(next(m for m in parent[-1]["messages"] if m["role"] == "tool")["content"])["results"]


@pytest_twisted.ensureDeferred
async def test_oneToolSlotStillRunsThreeChildren(scriptedServer, workspace: Path) -> None:
    """With a single tool slot in the process, a delegation of three children that each read a
    file finishes: the delegate call holds no slot while its children's calls wait for one (it
    would wait for them for ever if it did)."""
    server, url = scriptedServer
    (workspace / "f.txt").write_text("hello\n")
    server.addRule("go", [delegated("task a", "task b", "task c"), [{"text": "done"}]])
    for goal in ("task a", "task b", "task c"):
        server.addRule(f"system:Your task: {goal}\n", [tools(call("r", "read_file", path="f.txt")),
                                                      [{"text": f"read it for {goal}"}]])
    agent, observer = makeAgent(url, workspace, toolSlots=ToolSlots(1),
                                subagents=SubagentSettings(parallel=3, slots=ToolSlots(2)))
    try:
        result = await run(agent, "go").addTimeout(SLOT_WAIT, reactor)
    except BaseException:  # Twisted's TimeoutError: a deadlock fails the test; the cancel unwinds it
        agent.interrupt()
        raise
    assert result.final_text == "done"
    assert [r["summary"] for r in results(server)] == ["read it for task a", "read it for task b", "read it for task c"]
    started = sorted(e[2:4] for e in observer.children if e[0] == "started")
    assert started == [(0, "Subagent 1"), (1, "Subagent 2"), (2, "Subagent 3")]
    assert sorted(e[3] for e in observer.children if e[0] == "ended") == ["completed"] * 3
    childCalls = [e[2] for e in observer.events if e[0] == "started" and e[1] == "read_file"]
    assert sorted(childCalls) == ["1.0/0/1.0", "1.0/1/1.0", "1.0/2/1.0"]
    assert agent.toolSlots.free == 1 and agent.subagents.slots.free == 2


@pytest_twisted.ensureDeferred
async def test_aChildThatRunsOutOfRequestsIsAFailedTask(scriptedServer, workspace: Path) -> None:
    """A child has the parent's bounds: one that keeps calling tools past ``maxIterations``
    requests is a failed task (exit_reason max_iterations); the parent goes on."""
    server, url = scriptedServer
    (workspace / "f.txt").write_text("hello\n")
    server.addRule("go", [delegated("loop forever"), [{"text": "the child gave up"}]])
    server.addRule("system:Your task: loop forever\n",
                   [tools(call(f"r{n}", "read_file", path="f.txt")) for n in range(3)])
    agent, _ = makeAgent(url, workspace, maxIterations=3)
    result = await run(agent, "go").addTimeout(30, reactor)
    assert result.final_text == "the child gave up" and result.stop_reason == "end_turn"
    [report] = results(server)
    assert report["status"] == "failed" and report["exit_reason"] == "max_iterations"
    assert "3 model requests" in report["error"] and report["api_calls"] == 3


@pytest_twisted.ensureDeferred
async def test_moreTasksThanTheParallelLimitWait(scriptedServer, workspace: Path) -> None:
    """Five tasks with a limit of two at once: never more than two children's requests are
    open together, and all five report, in task order."""
    server, url = scriptedServer
    goals = [f"job {n}" for n in range(5)]
    server.addRule("go", [delegated(*goals), [{"text": "all five"}]])
    for goal in goals:
        server.addRule(f"system:Your task: {goal}\n", [[{"stall": 0.1}, {"text": f"did {goal}"}]])
    agent, observer = makeAgent(url, workspace, subagents=SubagentSettings(parallel=2))
    result = await run(agent, "go").addTimeout(30, reactor)
    assert result.final_text == "all five"
    assert [r["summary"] for r in results(server)] == [f"did {g}" for g in goals]
    assert mostAtOnce(observer) == 2


@pytest_twisted.ensureDeferred
async def test_delegateCallsOfOneReplyShareTheParallelLimit(scriptedServer, workspace: Path) -> None:
    """A reply with several delegate_task calls (a model that wants more children at once)
    still runs at most ``parallel`` children of the turn at once: the calls take turns, as in
    Hermes, and every task of both reports."""
    server, url = scriptedServer
    goals = [f"job {n}" for n in range(6)]
    server.addRule("go", [tools(call("d1", "delegate_task", tasks=[{"goal": g} for g in goals[:3]]),
                                call("d2", "delegate_task", tasks=[{"goal": g} for g in goals[3:]])),
                          [{"text": "all six"}]])
    for goal in goals:
        server.addRule(f"system:Your task: {goal}\n", [[{"stall": 0.2}, {"text": f"did {goal}"}]])
    agent, observer = makeAgent(url, workspace, subagents=SubagentSettings(parallel=3))
    result = await run(agent, "go").addTimeout(30, reactor)
    assert result.final_text == "all six"
    parent = [b for b in server.chatRequests if "You are a Hermes subagent" not in b["messages"][0]["content"]]
    reported = [json.loads(m["content"])["results"] for m in parent[-1]["messages"] if m["role"] == "tool"]
    assert [[r["summary"] for r in batch] for batch in reported] == [[f"did {g}" for g in goals[:3]],
                                                                     [f"did {g}" for g in goals[3:]]]
    assert mostAtOnce(observer) == 3


@pytest_twisted.ensureDeferred
async def test_aCancelEndsTheDelegateCallThatWaitsItsTurn(scriptedServer, workspace: Path) -> None:
    """Two delegate calls in one reply, the first one's child stalled: a cancel ends the run at
    once, and the second call, still waiting its turn, reports its task interrupted before it
    started."""
    server, url = scriptedServer
    server.addRule("go", [tools(call("d1", "delegate_task", goal="stall"), call("d2", "delegate_task", goal="never"))])
    server.addRule("system:Your task: stall\n", [[{"stall": True}]])
    agent, observer = makeAgent(url, workspace)
    result = await interruptOnce(agent, server.whenStalled(), run(agent, "go"))
    assert result.stop_reason == "cancelled"
    ended = {e[2]: e[3] for e in observer.events if e[0] in ("failed", "finished")}
    assert "interrupted by the user" in ended["1.1"]  # before it started (or, late under load, before it finished)
    assert [b for b in server.chatRequests if "Your task: never" in b["messages"][0]["content"]] == []


@pytest_twisted.ensureDeferred
async def test_aChildIsNotToldWhatTheSessionsProcessesDid(scriptedServer, workspace: Path) -> None:
    """A background process of the session ends during the turn, before the parent delegates:
    the child's task does not carry the note of it (the child did not start it, and taking the
    note would keep it from the parent); the parent's next prompt does."""
    server, url = scriptedServer
    server.addRule("go", [tools(call("b", "terminal", command="echo bye; exit 3", background=True)),
                          tools(call("s", "terminal", command="sleep 2")),
                          delegated("task a"), [{"text": "done"}]])
    server.addRule("again", [[{"text": "fine"}]])
    server.addRule("system:Your task: task a\n", [[{"text": "did task a"}]])
    owner = BackgroundProcesses().forSession("s")
    agent, observer = makeAgent(url, workspace, background=owner)
    observer.commandAnswer = "allow_once"
    try:
        assert (await run(agent, "go").addTimeout(30, reactor)).final_text == "done"
        await run(agent, "again").addTimeout(30, reactor)
    finally:
        owner.endAll("session_closed")
    [childRequest] = [b for b in server.chatRequests if "You are a Hermes subagent" in b["messages"][0]["content"]]
    assert "Background processes that ended" not in json.dumps(childRequest["messages"])
    told = server.chatRequests[-1]["messages"][-1]["content"]
    assert "Background processes that ended" in told and "exit code 3" in told and "bye" in told


def test_theChildObserverTagsEveryCall() -> None:
    """A child's calls get ids under the parent's call and a tag; its text is its own."""
    parent = RecordingObserver()
    child = ChildObserver(parent, "2.1", Task(1, "goal"))
    verifyObject(ITurnObserver, child)
    child.toolStarted("1.0", "read_file", {"path": "x"}, {})
    child.text("hello")
    assert parent.events[0][2] == "2.1/1/1.0"
    assert parent.events[0][4]["subagent"] == {"parentCallId": "2.1", "child": 1, "name": "Subagent 2"}
    assert parent.texts == [] and parent.children == [("text", "2.1", 1, "hello")]


def test_taskArguments() -> None:
    assert [t.goal for t in tasksOf(" one ", "ctx", None, None, 3)] == ["one"]
    assert [t.index for t in tasksOf(None, None, None, [{"goal": "a"}, {"goal": "b", "role": "leaf"}], 3)] == [0, 1]
    for goal, tasks, said in ((None, None, "give a goal"), ("a", [{"goal": "b"}], "not both"),
                              (None, [{"goal": "x"}] * 4, "at most 3 tasks"), (None, [{"goal": ""}], r"tasks\[0\]\.goal"),
                              (None, [{"goal": "x", "extra": 1}], "unknown field"), (None, ["x"], "must be an object")):
        with pytest.raises(ToolError, match=said):
            tasksOf(goal, None, None, tasks, 3)


def test_boundedSummary() -> None:
    assert bounded("short", 100) == "short"
    cut = bounded("x" * 1000, 200)
    assert len(cut) <= 200 and "characters of the summary cut" in cut
