"""The real AIAgent against the scripted model server, with real tools on a temp workspace."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import DeferredList
from twisted.internet.threads import deferToThread

from hermes_acp.config import Endpoint
from hermes_acp.engine.agent import CONTINUE, AIAgent
from hermes_acp.engine.result import TurnUsage
from hermes_acp.engine.approval import REJECT_ONCE
from hermes_acp.engine.model import ModelClient
from hermes_acp.engine.tools.registry import Tool

from .scripted_model import Script
from .observers import RecordingObserver
from .sdkclient import onLoop, until


def call(ident: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": ident, "name": name, "arguments": arguments}


def tools(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tool_calls": list(calls)}]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def makeAgent(url: str, workspace: Path, **kw: Any) -> tuple[AIAgent, RecordingObserver]:
    endpoint = Endpoint("custom", url, "test-key", "scripted-model")
    agent = AIAgent(endpoint, str(workspace), client=ModelClient(endpoint, backoff=0.01), **kw)
    observer = OBSERVERS[id(agent)] = RecordingObserver()
    return agent, observer


#: Each test agent's observer (agents are slotted attrs classes: nothing can be hung on them).
OBSERVERS: dict[int, RecordingObserver] = {}


def run(agent: AIAgent, message: str, history: list | None = None, observer: Any = None):
    """A run on a thread; the agent's own observer from makeAgent unless one is given."""
    return deferToThread(agent.run_conversation, message, history, observer or OBSERVERS[id(agent)])


async def interruptOnce(agent: AIAgent, ready: Any, turn) -> Any:
    """Interrupt the run once ``ready`` (an awaitable) has fired; the run must end
    within 10 s of it (the model stalls forever, the command sleeps for a minute)."""
    await ready
    agent.interrupt()
    return await turn.addTimeout(10, reactor)


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

    assert result.stop_reason == "end_turn" and result.failure is None
    assert result.final_text == "Done: app/greet.py prints a greeting."
    assert (workspace / "app" / "greet.py").read_text() == (
        "def greet(name):\n    return f'Hello, {name}!'\n\nprint(greet('world'))\n"
    )
    # The dangerous command asked, was denied, and did not run.
    assert seen.commands == [("7.0", "rm -rf app", "recursive delete")]  # step 7's first call
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
    # Every tool call was reported from start to end under an id of its own (step.index),
    # with the editor's extras.
    assert seen.ends() == {f"{n}.0": "finished" for n in range(1, 9) if n != 7} | {"7.0": "failed"}
    byId = {e[2]: e for e in seen.events if e[0] != "started"}
    assert byId["3.0"][4]["oldText"].startswith("def greet") and byId["3.0"][4]["diff"].startswith("--- a/app/greet.py")
    assert byId["6.0"][4]["exitCode"] == 0
    assert byId["8.0"][4]["todos"][0]["status"] == "completed"
    started = {e[2]: e for e in seen.events if e[0] == "started"}
    assert started["2.0"][3]["path"] == "app/greet.py"
    assert started["2.0"][4]["path"] == str(workspace / "app" / "greet.py")

    assert seen.thoughts == ["Plan first."]
    assert "".join(seen.texts) == "I'll plan. Done: app/greet.py prints a greeting."
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
    assert tools == ["read_file", "write_file", "patch", "search_files", "terminal", "todo", "clarify", "delegate_task",
                     "web_extract"]


@pytest_twisted.ensureDeferred
async def test_withoutUsageTheContextIsTheHistoryAsSent(scriptedServer, workspace: Path) -> None:
    """An endpoint that reports no usage: a run's context is its history as the endpoint
    receives it (the next request shows it), about 4 characters a token; tool results too."""
    server, url = scriptedServer
    server.default.responses.extend([
        [{"tool_calls": [{"id": "r1", "name": "read_file", "arguments": '{"path": "notes.txt"}'}]}],
        [{"text": "first answer, héllo"}],
        [{"text": "second answer"}]])
    (workspace / "notes.txt").write_text("".join(f"line {n}\n" for n in range(200)))
    agent, _ = makeAgent(url, workspace)
    first = await run(agent, "one")
    await run(agent, "two", first.messages)
    assert first.usage == TurnUsage()  # nothing reported
    sent = server.chatRequests[-1]["messages"][1:-1]  # the first run's history, as the next request carries it
    assert len(sent) == 4 and sent[2]["role"] == "tool"
    assert first.last_prompt_tokens == len(json.dumps(sent, ensure_ascii=False)) // 4


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
    assert seen.ends() == {"1.0": "finished", "1.1": "finished"}


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
    """Cancelling against a stalled model answers "cancelled", and the next prompt works."""
    server, url = scriptedServer
    server.addRule("slow", [[{"text": "Working on it"}, {"stall": True}]])
    server.addRule("again", [[{"text": "Back to normal."}]])
    agent, seen = makeAgent(url, workspace)
    stalled = DeferredList([server.whenStalled().addTimeout(10, reactor), deferToThread(seen.gotText.wait, 10)], fireOnOneErrback=True)
    result = await interruptOnce(agent, stalled, run(agent, "slow question"))
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
    pid = workspace / "pid"
    result = await interruptOnce(agent, onLoop(until(lambda: pid.exists() and pid.read_text().strip() != "", 10, "the pid file")),
                                 run(agent, "run something long"))
    assert result.stop_reason == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(int((workspace / "pid").read_text()), 0)
    assert seen.ends() == {"1.0": "failed"}
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
    assert seen.ends() == {"1.0": "failed", "1.1": "failed", "1.2": "failed"}


@pytest_twisted.ensureDeferred
async def test_deniedEditIsNotWrittenAndTheModelIsTold(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("w", "write_file", path="x.txt", content="data")),
                                     [{"text": "ok"}]])
    agent, seen = makeAgent(url, workspace)
    seen.editAnswer = REJECT_ONCE
    await run(agent, "write it")
    assert not (workspace / "x.txt").exists()
    [(callId, proposal)] = seen.edits
    assert callId == "1.0" and proposal.path == str(workspace / "x.txt") and proposal.oldText is None
    assert "was not modified" in toolResults(server.chatRequests[1])["w"]
    assert seen.ends() == {"1.0": "failed"}


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ([{"text": "no"}, {"finish": "content_filter"}], "refusal"),
        ([{"refusal": "I can't help with that."}], "refusal"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_stopReasons(scriptedServer, workspace: Path, steps, reason: str) -> None:
    server, url = scriptedServer
    server.default.responses.append(steps)
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert result.stop_reason == reason
    assert seen.events == []


@pytest_twisted.ensureDeferred
async def test_cutAnswerGoesOn(scriptedServer, workspace: Path) -> None:
    """An answer the output limit cut goes on: the model is asked to continue, and the
    answer is the two parts together."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "The answer is"}, {"finish": "length"}], [{"text": " forty-two."}]]
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert (result.stop_reason, result.final_text) == ("end_turn", "The answer is forty-two.")
    assert "".join(seen.texts) == "The answer is forty-two."
    sent = server.chatRequests[1]["messages"]
    assert sent[-2] == {"role": "assistant", "content": "The answer is"}
    assert sent[-1] == {"role": "user", "content": CONTINUE}


@pytest_twisted.ensureDeferred
async def test_cutAnswerStopsAfterThreeContinuations(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default = Script([[{"text": "more "}, {"finish": "length"}]], repeat=True)
    agent, _ = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert (result.stop_reason, result.final_text) == ("max_tokens", "more " * 4)
    assert len(server.chatRequests) == 4


@pytest_twisted.ensureDeferred
async def test_cutToolCallIsAskedForAgainWithMoreRoom(scriptedServer, workspace: Path) -> None:
    """A tool call the output limit cut is not run: the request goes again with a larger
    ``max_tokens``, and the whole call that comes back runs once."""
    server, url = scriptedServer
    server.default.responses += [
        [{"text": "I will write it."},
         {"tool_calls": [{"id": "w", "name": "write_file", "arguments": '{"path": "a.txt", "content": "hal'}]},
         {"usage": {"prompt_tokens": 50, "completion_tokens": 6000}}, {"finish": "length"}],
        [{"text": "I will "}, {"text": "write it."}, *tools(call("w", "todo"))],
        [{"text": " Done."}],
    ]
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert result.stop_reason == "end_turn"
    assert "max_tokens" not in server.chatRequests[0]
    assert server.chatRequests[1]["max_tokens"] == 12000
    assert "max_tokens" not in server.chatRequests[2]  # for the one request only
    assert [e[:2] for e in seen.events] == [("started", "todo"), ("finished", "todo")]
    assert not (workspace / "a.txt").exists()
    assert "".join(seen.texts) == "I will write it. Done."  # the repeated part is not shown twice


@pytest_twisted.ensureDeferred
async def test_cutToolCallAndLargerLimitRefused(scriptedServer, workspace: Path) -> None:
    """An endpoint that refuses the larger ``max_tokens`` ends the turn as the cut did."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "w", "name": "todo", "arguments": '{"todos": [{"con'}]}, {"finish": "length"}],
        [{"status": 400, "error": "max_tokens is too large: 12000. This model supports at most 4096."}],
    ]
    agent, seen = makeAgent(url, workspace)
    result = await run(agent, "q")
    assert (result.stop_reason, result.failure, seen.events) == ("max_tokens", None, [])


@pytest_twisted.ensureDeferred
async def test_windowInferredFromAnOverflowIsKept(scriptedServer, workspace: Path) -> None:
    """An overflow that does not name the window: the agent takes it to be below the request
    that failed, compacts, retries, and hands that window back for the next turns."""
    server, url = scriptedServer
    (workspace / "big.txt").write_text("".join(f"{n} " + "b" * 96 + "\n" for n in range(300)))
    server.default.responses += [
        tools(call("r", "read_file", path="big.txt")),
        [{"status": 400, "error": "the prompt is too long for this model"}],
        [{"text": "fits now"}],
    ]
    agent, seen = makeAgent(url, workspace)
    agent.contextWindow = 128_000
    result = await run(agent, "q")
    assert (result.stop_reason, result.final_text) == ("end_turn", "fits now")
    assert result.window is not None and result.window < 12_000
    assert agent.contextWindow == result.window
    assert [c[2] for c in seen.compactions if c[0] == "ended"] == ["completed"]


@pytest_twisted.ensureDeferred
async def test_modelErrorEndsTheTurnWithAMessage(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.apiKey = "another-key"
    agent, _ = makeAgent(url, workspace)
    result = await run(agent, "hi")
    assert result.stop_reason == "end_turn"
    assert "rejected the API key" in str(result.failure) and result.failure.auth
    assert result.messages == [{"role": "user", "content": "hi"}]


@pytest_twisted.ensureDeferred
async def test_failingObserverDoesNotBreakTheTurn(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("t", "todo")), [{"text": "done"}]])
    agent, seen = makeAgent(url, workspace)

    def broken(*args: Any) -> None:
        raise RuntimeError("client went away")

    seen.text = seen.toolStarted = seen.toolEnded = broken  # type: ignore[method-assign]
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
        agent.run_conversation("second", [], seen)
    agent.interrupt()
    assert (await d).stop_reason == "cancelled"
    assert not agent.running


@pytest_twisted.ensureDeferred
async def test_toolResultsFitTheWindow(scriptedServer, workspace: Path) -> None:
    """With a small window, a big result keeps its head and tail and says what was cut,
    and the results of one turn together stay within half the window."""
    server, url = scriptedServer
    (workspace / "big.txt").write_text("".join(f"line {n:05d} " + "x" * 80 + "\n" for n in range(400)))
    server.addRule("read big", [
        tools(call("a", "read_file", path="big.txt", limit=2000)),
        tools(call("b", "read_file", path="big.txt", limit=2000), call("c", "read_file", path="big.txt", limit=2000)),
        [{"text": "done"}],
    ])
    agent, _ = makeAgent(url, workspace)
    agent.contextWindow = 8000  # 8,000 characters a result, 16,000 a turn
    result = await run(agent, "read big")
    assert result.stop_reason == "end_turn"
    first = toolResults(server.chatRequests[1])["a"]
    assert len(first) < 8000 + 300 and "characters cut here" in first
    assert "line 00000" in first and "line 00399" in first  # head and tail
    later = {k: v for k, v in toolResults(server.chatRequests[2]).items() if k != "a"}
    assert len(first) + sum(map(len, later.values())) < 16000 + 4000 + 900  # the turn's half, then the floor
    assert len(later["c"]) < 4000 + 300
    server.addRule("read whole", [tools(call("w", "read_file", path="big.txt", limit=2000)), [{"text": "done"}]])
    agent.contextWindow = None  # unknown: nothing is cut
    await run(agent, "read whole")
    assert "characters cut" not in toolResults(server.chatRequests[-1])["w"]


@pytest_twisted.ensureDeferred
async def test_compactCountsTheToolsTheNextTurnSends(scriptedServer, workspace: Path) -> None:
    """``/compact`` reckons with the session's MCP tools as a turn does: their schemas take
    room beside the history (they were left out of its before and after)."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "## Goal\nkeep going"}], [{"text": "## Goal\nkeep going"}]]
    history = [m for n in range(6) for m in ({"role": "user", "content": f"ask {n} " + "q" * 800},
                                            {"role": "assistant", "content": f"answer {n} " + "a" * 800})]
    wide = Tool("mcp__docs__lookup", "d" * 8000, {"type": "object", "properties": {}}, lambda **_: None)
    agent, seen = makeAgent(url, workspace)
    await deferToThread(agent.compact, history, seen)
    await deferToThread(agent.compact, history, seen, "", None, {wide.name: wide})
    plain, withTools = [c[5:] for c in seen.compactions if c[0] == "ended"]
    assert withTools[0] - plain[0] >= 2000 and withTools[1] - plain[1] >= 2000  # 8,000 characters ≈ 2,000 tokens


@pytest_twisted.ensureDeferred
async def test_aCompactionThatCannotHelpIsNotTriedAtEveryStep(scriptedServer, workspace: Path) -> None:
    """A prompt over the threshold on its own: its compaction fails (nothing old enough, and
    no summary is asked for), and the turn's next steps do not try again (nor show another
    failed card) until the request has grown by a tenth of the window."""
    server, url = scriptedServer
    server.default.responses += [tools(call(f"t{n}", "todo")) for n in range(4)] + [[{"text": "done"}]]
    agent, seen = makeAgent(url, workspace)
    agent.contextWindow = 8000
    result = await run(agent, "p" * 26_000)
    assert (result.stop_reason, result.final_text) == ("end_turn", "done")
    ended = [c for c in seen.compactions if c[0] == "ended"]
    assert [c[2] for c in ended] == ["failed"] and "nothing old enough" in ended[0][4]
    assert server.summaryRequests == [] and len(server.chatRequests) == 5


def test_anotherModelOrThoughtLevelIsAskedForSummariesAgain(tmp_path: Path) -> None:
    """Summaries stopped after failures come back when the session changes its model or
    thought level (another may write them), and only then."""
    from hermes_acp.engine_factory import EngineAgentFactory
    from hermes_acp.session_state import SessionState

    factory = EngineAgentFactory(lambda: Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"))
    session = SessionState(sessionId="s", cwd=str(tmp_path), model="a")
    agent = factory.buildAgent(session)
    for change in (None, "model", "thought_level"):
        agent.summaryFailures = 2
        if change == "model":
            session.model = "b"
        elif change == "thought_level":
            session.config["thought_level"] = "low"
        factory.configure(agent, session)
        assert agent.summaryFailures == (2 if change is None else 0), change
    assert (agent.model, agent.reasoningEffort) == ("b", "low")
