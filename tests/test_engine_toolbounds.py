"""Bounded work per reply: a few of a reply's tool calls run at once, the rest wait their turn
(pending), calls past the cap are refused with a result each, and the process's tool slots bound
every session together. The real AIAgent against the scripted model server, real commands."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults
from twisted.internet.threads import deferToThread

from hermes_acp.config import DEFAULT_MAX_TOOL_CALLS, DEFAULT_TOOL_PARALLEL, DEFAULT_TOOL_THREADS, ConfigError, Endpoint, Settings
from hermes_acp.engine.approval import ALLOW_ONCE
from hermes_acp.engine.toolslots import GRANTED, ToolSlots
from hermes_acp.engine.tools.registry import Tool
from hermes_acp.engine_factory import EngineAgentFactory
from hermes_acp.session_state import SessionState

from .e2e import uniqueSleep
from .observers import RecordingObserver
from .sdkclient import onLoop, until
from .test_engine_agent import call, makeAgent, run, toolResults, tools

#: Each command notes how many of the calls' commands run at that moment (it may count fewer,
#: never more), then stays a while so that the next ones overlap it if they are let.
COUNTING = ("mkdir -p run; touch run/$$.start; "
            "echo $(( $(ls run | grep -c start) - $(ls run | grep -c end) )) >> counts; "
            "sleep 0.3; touch run/$$.end")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def mostAtOnce(seen: RecordingObserver) -> int:
    """The most calls the run reported running at once (between ``toolRunning`` and the end)."""
    running = dict(seen.running)  # call id -> events before it ran
    marks = sorted([(position, 1) for position in running.values()]
                   + [(position, -1) for position, event in enumerate(seen.events)
                      if event[0] != "started" and event[2] in running],
                   key=lambda mark: (mark[0], -mark[1]))  # a start at a position came before that event
    now = most = 0
    for _, step in marks:
        now += step
        most = max(most, now)
    return most


def counted(workspace: Path) -> list[int]:
    return [int(line) for line in (workspace / "counts").read_text().split()]


def test_slotsAreGrantedInTheOrderAsked() -> None:
    slots = ToolSlots(2)
    first, second, third = queue.Queue(), queue.Queue(), queue.Queue()
    for inbox in (first, first, second, third):
        slots.ask(inbox)
    assert (first.qsize(), second.qsize(), third.qsize(), slots.free) == (2, 0, 0, 0)
    slots.release()
    assert (second.get_nowait(), third.qsize()) == (GRANTED, 0)
    slots.release()
    assert third.get_nowait() is GRANTED
    slots.release()
    slots.release()
    assert slots.free == 2
    with pytest.raises(RuntimeError):
        slots.release()


def test_withdrawnAsksAreNeverGranted() -> None:
    slots = ToolSlots(1)
    holder, gone, later = queue.Queue(), queue.Queue(), queue.Queue()
    for inbox in (holder, gone, gone, later):
        slots.ask(inbox)
    assert slots.withdraw(gone) == 2
    slots.release()
    assert (gone.qsize(), later.get_nowait()) == (0, GRANTED)
    with pytest.raises(ValueError):
        ToolSlots(0)


def test_settingsAndTheFactoryShareOneSetOfSlots() -> None:
    settings = Settings.fromEnv({})
    assert (settings.maxToolCalls, settings.toolParallel, settings.toolThreads) == (
        DEFAULT_MAX_TOOL_CALLS, DEFAULT_TOOL_PARALLEL, DEFAULT_TOOL_THREADS) == (32, 4, 16)
    settings = Settings.fromEnv({"HERMES_ACP_MAX_TOOL_CALLS": "5", "HERMES_ACP_TOOL_PARALLEL": "2",
                                 "HERMES_ACP_TOOL_THREADS": "3"})
    for name in ("HERMES_ACP_MAX_TOOL_CALLS", "HERMES_ACP_TOOL_PARALLEL", "HERMES_ACP_TOOL_THREADS"):
        with pytest.raises(ConfigError, match=name):
            Settings.fromEnv({name: "0"})
    factory = EngineAgentFactory(lambda: Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), settings=settings)
    one, two = (factory.buildAgent(SessionState(sessionId=s, cwd="/")) for s in "ab")
    assert one.toolSlots is two.toolSlots is factory.toolSlots
    assert (one.maxToolCalls, one.toolParallel, one.toolSlots.size) == (5, 2, 3)


@pytest_twisted.ensureDeferred
async def test_aFewCallsRunAtOnceAndTheRestWaitPending(scriptedServer, workspace: Path) -> None:
    """Eight commands in one reply: every card shows before any call runs, at most four run at
    once (as the commands themselves count), and all eight complete in order."""
    server, url = scriptedServer
    server.default.responses += [tools(*(call(f"c{i}", "terminal", command=COUNTING) for i in range(8))),
                                 [{"text": "done"}]]
    agent, seen = makeAgent(url, workspace, toolParallel=4)
    seen.commandAnswer = ALLOW_ONCE
    result = await run(agent, "go")
    assert result.stop_reason == "end_turn"
    assert seen.ends() == {f"1.{i}": "finished" for i in range(8)}
    assert [callId for callId, _ in seen.running] == [f"1.{i}" for i in range(8)]
    assert min(position for _, position in seen.running) == 8  # all eight cards came first, pending
    assert mostAtOnce(seen) == 4
    assert len(counted(workspace)) == 8 and max(counted(workspace)) <= 4
    assert list(toolResults(server.chatRequests[-1])) == [f"c{i}" for i in range(8)]
    assert agent.toolSlots.free == agent.toolSlots.size


@pytest_twisted.ensureDeferred
async def test_callsPastTheCapAreRefusedWithAResultEach(scriptedServer, workspace: Path) -> None:
    """Five reads where three are allowed: three run, two are refused (failed, never run) with a
    message naming the cap, and the next request carries a result for every call id."""
    server, url = scriptedServer
    for i in range(5):
        (workspace / f"f{i}.txt").write_text(f"content-{i}\n")
    server.default.responses += [tools(*(call(f"r{i}", "read_file", path=f"f{i}.txt") for i in range(5))),
                                 [{"text": "read three"}]]
    agent, seen = makeAgent(url, workspace, maxToolCalls=3)
    result = await run(agent, "read")
    assert result.stop_reason == "end_turn"
    assert seen.ends() == {"1.0": "finished", "1.1": "finished", "1.2": "finished", "1.3": "failed", "1.4": "failed"}
    assert [callId for callId, _ in seen.running] == ["1.0", "1.1", "1.2"]
    results = toolResults(server.chatRequests[1])
    assert list(results) == [f"r{i}" for i in range(5)]
    assert all(f"content-{i}" in results[f"r{i}"] for i in range(3))
    for refused in ("r3", "r4"):
        assert "not run" in results[refused] and "asked for 5 tool calls" in results[refused]
        assert "at most 3" in results[refused]


@pytest_twisted.ensureDeferred
async def test_theProcessSlotsBoundEverySessionTogether(scriptedServer, workspace: Path) -> None:
    """Two sessions' agents share two slots: their eight commands never run more than two at
    once, however many each reply may run."""
    server, url = scriptedServer
    for prompt in ("first", "second"):
        server.addRule(prompt, [tools(*(call(f"{prompt}{i}", "terminal", command=COUNTING) for i in range(4))),
                                [{"text": f"{prompt} done"}]])
    slots = ToolSlots(2)
    agents = [makeAgent(url, workspace, toolParallel=4, toolSlots=slots) for _ in range(2)]
    for _, seen in agents:
        seen.commandAnswer = ALLOW_ONCE
    results = await gatherResults([run(agent, prompt) for (agent, _), prompt in zip(agents, ("first", "second"))])
    assert [r.final_text for r in results] == ["first done", "second done"]
    assert all(seen.ends() == {f"1.{i}": "finished" for i in range(4)} for _, seen in agents)
    assert len(counted(workspace)) == 8 and max(counted(workspace)) <= 2
    assert slots.free == 2


@pytest_twisted.ensureDeferred
async def test_cancelEndsWaitingCallsWithoutStartingThem(scriptedServer, workspace: Path) -> None:
    """Six long commands, two at a time: a cancel while two run ends all six at once; the four
    waiting ones never start, and every slot comes back."""
    server, url = scriptedServer
    server.default.responses += [tools(*(call(f"s{i}", "terminal", command=uniqueSleep(60)) for i in range(6)))]
    agent, seen = makeAgent(url, workspace, toolParallel=2)
    seen.commandAnswer = ALLOW_ONCE
    turn = run(agent, "sleep")
    await onLoop(until(lambda: len(seen.running) == 2, 20, "two running calls"))
    began = time.monotonic()
    agent.interrupt()
    result = await turn.addTimeout(10, reactor)
    elapsed = time.monotonic() - began
    assert result.stop_reason == "cancelled"
    assert elapsed < 5, elapsed  # the grace is 0.4 s
    assert seen.ends() == {f"1.{i}": "failed" for i in range(6)}
    assert [callId for callId, _ in seen.running] == ["1.0", "1.1"]
    results = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert len(results) == 6 and all("interrupted by the user" in text for text in results)
    assert all("before it ran" in text for text in results[2:])
    await onLoop(until(lambda: agent.toolSlots.free == agent.toolSlots.size, 20, "the slots back"))


@pytest_twisted.ensureDeferred
async def test_aQueuedCallAsksOnlyWhenItStarts(scriptedServer, workspace: Path) -> None:
    """One at a time, without a sandbox (so each command asks): the second call's question
    comes after the first call ended, never while it waits."""
    server, url = scriptedServer
    server.default.responses += [tools(call("a", "terminal", command="touch a"), call("b", "terminal", command="touch b")),
                                 [{"text": "done"}]]
    agent, seen = makeAgent(url, workspace, toolParallel=1, sandbox=None)
    asked: list[tuple[str, list[str]]] = []

    def answer(command: str) -> str:
        asked.append((command, [e[2] for e in seen.events if e[0] != "started"]))
        return ALLOW_ONCE

    seen.commandAnswer = answer
    result = await run(agent, "touch")
    assert result.stop_reason == "end_turn"
    assert asked == [("touch a", []), ("touch b", ["1.0"])]
    assert (workspace / "a").exists() and (workspace / "b").exists()


@pytest_twisted.ensureDeferred
async def test_delegatedCallsAreBoundedToo(scriptedServer, workspace: Path) -> None:
    """An MCP tool's calls (delegated to the turn) wait their turn like the built-in ones: six
    calls, three at a time, meet in threes and never more."""
    server, url = scriptedServer
    server.default.responses += [tools(*(call(f"m{i}", "mcp_echo", word=str(i)) for i in range(6))),
                                 [{"text": "echoed"}]]
    lock, now, most = threading.Lock(), [0], [0]
    together = threading.Barrier(3, timeout=20)  # three at a time must meet, or the answers fail

    def answer(name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        together.wait()
        with lock:
            now[0] -= 1
        return f"echo {arguments['word']}", False, {}

    echo = Tool("mcp_echo", "echoes", {"type": "object"}, lambda ctx, /, **a: ctx.delegate("mcp_echo", a),
                passthrough=True)
    agent, _ = makeAgent(url, workspace, toolParallel=3)
    seen = RecordingObserver(toolAnswer=answer)
    result = await deferToThread(agent.run_conversation, "echo", None, seen, None, None, {"mcp_echo": echo})
    assert result.stop_reason == "end_turn"
    assert sorted(arguments["word"] for _, _, arguments in seen.delegated) == [str(i) for i in range(6)]
    assert most[0] == 3
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == [f"echo {i}" for i in range(6)]
