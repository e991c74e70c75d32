"""The real AIAgent against the scripted model server, with real tools on a temp workspace."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from hermes_acp.config import Endpoint
from hermes_acp.engine.agent import AIAgent, TurnUsage
from hermes_acp.engine.model import ModelClient


def call(ident: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": ident, "name": name, "arguments": arguments}


def tools(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tool_calls": list(calls)}]


class Recorder:
    """Everything the agent reported, from whichever thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.events: list[tuple] = []
        self.steps: list[tuple[int, list[str]]] = []
        self.commands: list[tuple[str, str]] = []
        self.commandAnswer = "deny"
        self.gotText = threading.Event()
        self.toolStarted = threading.Event()

    def attach(self, agent: AIAgent) -> AIAgent:
        agent.stream_delta_callback = self.onText
        agent.thinking_callback = self.thinking.append
        agent.tool_progress_callback = self.onTool
        agent.step_callback = lambda step, names: self.steps.append((step, names))
        agent.command_approval_callback = self.onCommand
        return agent

    def onText(self, text: str) -> None:
        self.text.append(text)
        self.gotText.set()

    def onTool(self, event: str, name: str, callId: str, payload: Any, extras: dict) -> None:
        with self.lock:
            self.events.append((event, name, callId, payload, extras))
        if event == "started":
            self.toolStarted.set()

    def onCommand(self, command: str, reason: str) -> str:
        self.commands.append((command, reason))
        return self.commandAnswer

    def ends(self) -> dict[str, str]:
        """call id -> how it ended; fails if a call ended twice or never started."""
        started = {e[2] for e in self.events if e[0] == "started"}
        ended: dict[str, str] = {}
        for event, _, callId, _, _ in self.events:
            if event != "started":
                assert callId in started and callId not in ended
                ended[callId] = event
        assert set(ended) == started
        return ended


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def makeAgent(url: str, workspace: Path, **kw: Any) -> tuple[AIAgent, Recorder]:
    endpoint = Endpoint("custom", url, "test-key", "scripted-model")
    agent = AIAgent(endpoint, str(workspace), client=ModelClient(endpoint, backoff=0.01), **kw)
    recorder = Recorder()
    return recorder.attach(agent), recorder


def run(agent: AIAgent, message: str, history: list | None = None):
    return deferToThread(agent.run_conversation, message, history)


def sleep(seconds: float):
    return deferLater(reactor, seconds, lambda: None)


async def interruptOnce(agent: AIAgent, busy: threading.Event, turn) -> tuple[Any, float]:
    """Interrupt the turn a moment after C{busy} is set; return its result and how long it took to end."""
    await deferToThread(busy.wait, 10)
    await sleep(0.3)
    began = time.monotonic()
    agent.interrupt()
    result = await turn
    return result, time.monotonic() - began


def toolResults(request: dict) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


@pytest_twisted.ensureDeferred
async def test_aFullTaskWithEveryTool(scriptedServer, workspace: Path) -> None:
    """Write, patch, read, search, run a command and keep a plan; every result reaches the model."""
    server, url = scriptedServer
    server.addRule("build the greeter", [
        [{"reasoning": "Plan first."}, {"text": "I'll plan. "},
         *tools(call("c1", "todo", todos=[{"id": "1", "content": "Write greeter", "status": "in_progress"},
                                          {"id": "2", "content": "Run it", "status": "pending"}])),
         {"usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}],
        tools(call("c2", "write_file", path="app/greet.py",
                   content="def greet(name):\n    return 'Hello ' + name\n\nprint(greet('world'))\n")),
        tools(call("c3", "patch", path="app/greet.py", old_string="return 'Hello ' + name",
                   new_string="return f'Hello, {name}!'")),
        tools(call("c4", "read_file", path="app/greet.py")),
        tools(call("c5", "search_files", pattern="def greet", target="content")),
        tools(call("c6", "terminal", command="python3 app/greet.py")),
        tools(call("c7", "terminal", command="rm -rf app")),
        tools(call("c8", "todo", todos=[{"id": "1", "content": "Write greeter", "status": "completed"},
                                        {"id": "2", "content": "Run it", "status": "completed"}])),
        [{"text": "Done: app/greet.py prints a greeting."},
         {"usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320,
                    "prompt_tokens_details": {"cached_tokens": 64},
                    "completion_tokens_details": {"reasoning_tokens": 5}}}],
    ])
    agent, seen = makeAgent(url, workspace)
    agent.setEditMode("accept_edits")
    result = await run(agent, "Please build the greeter")

    assert result.stop_reason == "end_turn" and result.error is None
    assert result.final_text == "Done: app/greet.py prints a greeting."
    assert (workspace / "app" / "greet.py").read_text() == (
        "def greet(name):\n    return f'Hello, {name}!'\n\nprint(greet('world'))\n"
    )
    # The dangerous command asked, was denied, and did not run.
    assert seen.commands == [("rm -rf app", "recursive delete")]
    assert (workspace / "app").is_dir()

    requests = server.chatRequests
    assert len(requests) == 9
    results = toolResults(requests[-1])
    assert json.loads(results["c1"])["summary"]["in_progress"] == 1
    assert results["c2"] == "Created app/greet.py (4 lines, 67 bytes)."
    assert "+    return f'Hello, {name}!'" in results["c3"]
    assert results["c4"].startswith("     1|def greet(name):\n     2|    return f'Hello, {name}!'")
    assert json.loads(results["c5"])["matches"] == [{"path": "app/greet.py", "line": 1, "text": "def greet(name):"}]
    assert json.loads(results["c6"]) == {"output": "Hello, world!\n", "exit_code": 0}
    assert results["c7"].startswith("Error: BLOCKED") and "recursive delete" in results["c7"]
    assert json.loads(results["c8"])["summary"]["completed"] == 2
    assert agent.todos[1] == {"id": "2", "content": "Run it", "status": "completed"}

    # Every tool call was reported from start to end, with the editor's extras.
    assert seen.ends() == {f"c{n}": "finished" for n in range(1, 9) if n != 7} | {"c7": "failed"}
    byId = {e[2]: e for e in seen.events if e[0] != "started"}
    assert byId["c3"][4]["oldText"].startswith("def greet") and byId["c3"][4]["diff"].startswith("--- a/app/greet.py")
    assert byId["c6"][4]["exitCode"] == 0
    assert byId["c8"][4]["todos"][0]["status"] == "completed"
    started = {e[2]: e for e in seen.events if e[0] == "started"}
    assert started["c2"][3]["path"] == "app/greet.py"
    assert started["c2"][4]["path"] == str(workspace / "app" / "greet.py")

    assert seen.thinking == ["Plan first."]
    assert "".join(seen.text) == "I'll plan. Done: app/greet.py prints a greeting."
    assert [step for step, _ in seen.steps] == list(range(1, 10))
    assert seen.steps[1] == (2, ["todo"]) and seen.steps[7] == (8, ["terminal"])
    assert result.usage == TurnUsage(400, 30, 430, 5, 64)
    assert result.last_prompt_tokens == 300

    # The new history: user, then assistant/tool pairs, then the answer; reasoning kept but never sent.
    roles = [m["role"] for m in result.messages]
    assert roles == ["user"] + ["assistant", "tool"] * 8 + ["assistant"]
    assert result.messages[1]["reasoning"] == "Plan first."
    assert all("reasoning" not in m for r in requests for m in r["messages"])


@pytest_twisted.ensureDeferred
async def test_historyIsSentAndTheNextTurnContinues(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([[{"text": "first answer"}], [{"text": "second answer"}]])
    agent, _ = makeAgent(url, workspace)
    first = await run(agent, "one")
    second = await run(agent, "two", first.messages)
    assert second.final_text == "second answer"
    sent = server.chatRequests[1]["messages"]
    assert sent[0]["role"] == "system" and str(workspace) in sent[0]["content"]
    assert sent[1:] == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "first answer"},
                        {"role": "user", "content": "two"}]
    tools = [t["function"]["name"] for t in server.chatRequests[0]["tools"]]
    assert tools == ["read_file", "write_file", "patch", "search_files", "terminal", "todo"]


@pytest_twisted.ensureDeferred
async def test_parallelToolCalls(scriptedServer, workspace: Path) -> None:
    """Two commands that each wait for the other can only finish if they run at the same time."""
    server, url = scriptedServer
    meet = "touch {me}; for i in $(seq 100); do [ -e {other} ] && echo met-{me} && exit 0; sleep 0.05; done; exit 1"
    server.default.responses.extend([
        tools(call("a", "terminal", command=meet.format(me="a", other="b")),
              call("b", "terminal", command=meet.format(me="b", other="a"))),
        [{"text": "both ran"}],
    ])
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "go")
    assert result.stop_reason == "end_turn"
    results = [m for m in result.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["a", "b"]
    assert [json.loads(m["content"]) for m in results] == [
        {"output": "met-a\n", "exit_code": 0}, {"output": "met-b\n", "exit_code": 0},
    ]
    assert seen.ends() == {"a": "finished", "b": "finished"}


@pytest_twisted.ensureDeferred
async def test_iterationBudget(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default = type(server.default)([tools(call("loop", "todo"))], repeat=True)
    agent, seen = makeAgent(url, workspace, maxIterations=3)
    result = await run(agent, "never stop")
    assert result.stop_reason == "max_turn_requests"
    assert len(server.chatRequests) == 3
    assert [m["role"] for m in result.messages] == ["user"] + ["assistant", "tool"] * 3
    assert [e[0] for e in seen.events] == ["started", "finished"] * 3


@pytest_twisted.ensureDeferred
async def test_interruptAStalledStream(scriptedServer, workspace: Path) -> None:
    """Cancelling against a stalled model answers "cancelled" quickly, and the next prompt works."""
    server, url = scriptedServer
    server.addRule("slow", [[{"text": "Working on it"}, {"stall": True}]])
    server.addRule("again", [[{"text": "Back to normal."}]])
    agent, seen = makeAgent(url, workspace)
    result, latency = await interruptOnce(agent, seen.gotText, run(agent, "slow question"))
    assert latency < 0.5, latency
    assert result.stop_reason == "cancelled"
    assert result.messages == [{"role": "user", "content": "slow question"},
                               {"role": "assistant", "content": "Working on it"}]
    following = await run(agent, "again please", result.messages)
    assert (following.stop_reason, following.final_text) == ("end_turn", "Back to normal.")


@pytest_twisted.ensureDeferred
async def test_interruptARunningCommand(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.append(tools(call("t", "terminal", command="echo $$ > pid; sleep 60")))
    agent, seen = makeAgent(url, workspace)
    result, latency = await interruptOnce(agent, seen.toolStarted, run(agent, "run something long"))
    assert latency < 0.5, latency
    assert result.stop_reason == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(int((workspace / "pid").read_text()), 0)
    assert seen.ends() == {"t": "failed"}
    assert "interrupted by the user" in result.messages[-1]["content"]
    assert len(server.chatRequests) == 1


@pytest_twisted.ensureDeferred
async def test_idleInterruptDoesNotLeak(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"text": "fine"}])
    agent, _ = makeAgent(url, workspace)
    agent.interrupt()
    result = await run(agent, "hello")
    assert (result.stop_reason, result.final_text) == ("end_turn", "fine")


@pytest_twisted.ensureDeferred
async def test_badToolCallsAreReportedToTheModel(scriptedServer, workspace: Path) -> None:
    """Malformed JSON, unknown tools and bad arguments fail the call, not the loop."""
    server, url = scriptedServer
    server.default.responses.extend([
        [{"tool_calls": [{"id": "m1", "name": "read_file", "arguments": '{"path": "a.txt"'},
                         {"id": "m2", "name": "browser", "arguments": {}},
                         {"id": "m3", "name": "read_file", "arguments": {"file": "a.txt"}}]}],
        [{"text": "I'll stop guessing."}],
    ])
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "read it")
    assert result.stop_reason == "end_turn"
    results = toolResults(server.chatRequests[1])
    assert results["m1"].startswith("Error: the arguments are not valid JSON")
    assert results["m2"].startswith("Error: unknown tool 'browser'; available: read_file")
    assert results["m3"].startswith("Error: unknown argument(s) for read_file: file")
    assert seen.ends() == {"m1": "failed", "m2": "failed", "m3": "failed"}


@pytest_twisted.ensureDeferred
async def test_deniedEditIsNotWrittenAndTheModelIsTold(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("w", "write_file", path="x.txt", content="data")),
                                     [{"text": "ok"}]])
    agent, seen = makeAgent(url, workspace)
    proposals = []
    agent.edit_approval_callback = lambda proposal: proposals.append(proposal) or "deny"
    await run(agent, "write it")
    assert not (workspace / "x.txt").exists()
    assert proposals[0].path == str(workspace / "x.txt") and proposals[0].oldText is None
    assert "was not modified" in toolResults(server.chatRequests[1])["w"]
    assert seen.ends() == {"w": "failed"}


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ([{"text": "cut"}, {"finish": "length"}], "max_tokens"),
        ([{"text": "no"}, {"finish": "content_filter"}], "refusal"),
        ([{"refusal": "I can't help with that."}], "refusal"),
        ([*tools(call("x", "todo")), {"finish": "length"}], "max_tokens"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_stopReasons(scriptedServer, workspace: Path, steps, reason: str) -> None:
    server, url = scriptedServer
    server.default.responses.append(steps)
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert result.stop_reason == reason
    assert seen.events == []  # a cut-off tool call is not run


@pytest_twisted.ensureDeferred
async def test_modelErrorEndsTheTurnWithAMessage(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.apiKey = "another-key"
    agent, _ = makeAgent(url, workspace)
    result = await run(agent, "hi")
    assert result.stop_reason == "end_turn"
    assert "rejected the API key" in result.error
    assert result.messages == [{"role": "user", "content": "hi"}]


@pytest_twisted.ensureDeferred
async def test_failingCallbacksDoNotBreakTheTurn(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("t", "todo")), [{"text": "done"}]])
    agent, _ = makeAgent(url, workspace)

    def broken(*args: Any) -> None:
        raise RuntimeError("client went away")

    agent.stream_delta_callback = agent.tool_progress_callback = agent.step_callback = broken
    result = await run(agent, "hi")
    assert (result.stop_reason, result.final_text) == ("end_turn", "done")


@pytest_twisted.ensureDeferred
async def test_oneTurnAtATime(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"text": "slow"}, {"stall": True}])
    agent, seen = makeAgent(url, workspace)
    d = run(agent, "first")
    await deferToThread(seen.gotText.wait, 10)
    assert agent.running
    with pytest.raises(RuntimeError, match="already running"):
        agent.run_conversation("second")
    agent.interrupt()
    assert (await d).stop_reason == "cancelled"
    assert not agent.running
