"""Argument checking, the tool set, todo and session_search."""

from __future__ import annotations

import json

import pytest

from hermes_acp.engine.tools.builtin import BUILTIN_TOOLS, selectTools
from hermes_acp.engine.tools.registry import ToolError, checkArguments, parseArguments


def test_hermesToolNames() -> None:
    assert list(BUILTIN_TOOLS) == [
        "read_file", "write_file", "patch", "search_files", "terminal", "todo", "session_search", "clarify",
        "delegate_task", "process", "web_search", "web_extract", "memory", "skills_list", "skill_view", "skill_manage",
    ]
    for tool in BUILTIN_TOOLS.values():
        schema = tool.schema()["function"]
        assert schema["name"] == tool.name and schema["description"]
        assert set(schema["parameters"]["required"]) <= set(schema["parameters"]["properties"])


def test_selectTools() -> None:
    assert list(selectTools(["terminal", "todo"])) == ["terminal", "todo"]
    with pytest.raises(ValueError, match="unknown tool"):
        selectTools(["browser"])


def test_defaultsAndCoercion() -> None:
    tool = BUILTIN_TOOLS["read_file"]
    assert checkArguments(tool, {"path": "a"}) == {"path": "a", "offset": 1, "limit": 500}
    assert checkArguments(tool, {"path": "a", "offset": "3", "limit": 10.0}) == {"path": "a", "offset": 3, "limit": 10}
    assert checkArguments(BUILTIN_TOOLS["patch"], {"path": "a", "old_string": "x", "new_string": "y",
                                                   "replace_all": "true"})["replace_all"] is True


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({}, "missing required argument(s) for read_file: path"),
        ({"path": 3}, "'path' must be string, not int"),
        ({"path": "a", "offset": "three"}, "'offset' must be integer"),
        ({"path": "a", "offset": True}, "'offset' must be integer"),
        ({"path": "a", "offset": 0}, "'offset' must be at least 1"),
        ({"path": "a", "mode": "fast"}, "unknown argument(s) for read_file: mode; accepted: path, offset, limit"),
        (["a"], "must be a JSON object"),
    ],
)
def test_badArgumentsAreExplained(arguments, words: str) -> None:
    with pytest.raises(ToolError) as caught:
        checkArguments(BUILTIN_TOOLS["read_file"], arguments)
    assert words in str(caught.value)


def test_parseArguments() -> None:
    assert parseArguments("") == {}
    assert parseArguments('{"a": 1}') == {"a": 1}
    with pytest.raises(ToolError, match="not valid JSON"):
        parseArguments('{"a": ')


def test_todoReplacesAndSummarizes(bench) -> None:
    todos = [{"id": "1", "content": "Write tests", "status": "in_progress"},
             {"id": "2", "content": "Ship", "status": "pending"}]
    outcome = bench.call("todo", todos=todos)
    assert not outcome.failed
    body = json.loads(outcome.text)
    assert body["todos"] == todos
    assert body["summary"] == {"total": 2, "pending": 1, "in_progress": 1, "completed": 0, "cancelled": 0}
    assert outcome.extras["todos"] == todos
    assert bench.agent.todos == todos


def test_todoMergeByIdAndRead(bench) -> None:
    bench.call("todo", todos=[{"id": "1", "content": "a", "status": "pending"},
                              {"id": "2", "content": "b", "status": "pending"}])
    bench.call("todo", merge=True, todos=[{"id": "2", "content": "b", "status": "completed"},
                                          {"id": 3, "content": "c", "status": "pending"}])
    read = json.loads(bench.call("todo").text)
    assert [(t["id"], t["status"]) for t in read["todos"]] == [("1", "pending"), ("2", "completed"), ("3", "pending")]


@pytest.mark.parametrize(
    ("todos", "words"),
    [
        ([{"id": "1", "content": "x", "status": "done"}], "status must be one of pending, in_progress"),
        ([{"id": "1", "content": "", "status": "pending"}], "content must be a non-empty string"),
        (["x"], "must be an object"),
        ([{"id": "1", "content": "a"}, {"id": "1", "content": "b"}], "ids must be unique"),
    ],
)
def test_todoValidation(bench, todos, words: str) -> None:
    outcome = bench.call("todo", todos=todos)
    assert outcome.failed and words in outcome.text
    assert bench.agent.todos == []


def test_sessionSearchUsesTheSessionLayer(bench) -> None:
    """The search gets the scope: this project unless the model asks for all."""
    calls = []

    def searcher(query: str, limit: int, allProjects: bool) -> list[dict]:
        calls.append((query, limit, allProjects))
        return [{"session_id": "s1", "title": "Fix parser", "snippet": "the [parser] bug"}]

    bench.agent.sessionSearch = searcher
    outcome = bench.call("session_search", query="parser")
    body = json.loads(outcome.text)
    assert body["results"][0]["session_id"] == "s1" and body["scope"] == "this project"
    outcome = bench.call("session_search", query="parser", limit=3, all_projects=True)
    assert json.loads(outcome.text)["scope"] == "all projects"
    assert calls == [("parser", 10, False), ("parser", 3, True)]


def test_engineFactoryBindsTheSessionsProject(tmp_path) -> None:
    """Each agent's search is the store's, bound to its session's folder; all
    projects means no folder at all."""
    from hermes_acp.config import Endpoint
    from hermes_acp.engine_factory import EngineAgentFactory
    from hermes_acp.session_state import SessionState

    calls = []
    factory = EngineAgentFactory(lambda: Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"),
                                 lambda query, limit, cwd: calls.append((query, limit, cwd)) or [])
    agent = factory.buildAgent(SessionState(sessionId="s", cwd=str(tmp_path)))
    agent.sessionSearch("q", 5, False)
    agent.sessionSearch("q", 5, True)
    assert calls == [("q", 5, str(tmp_path)), ("q", 5, None)]
    assert EngineAgentFactory(factory.endpointSource).buildAgent(SessionState(sessionId="t", cwd="/")).sessionSearch is None


def test_sessionSearchWithoutAStore(bench) -> None:
    outcome = bench.call("session_search", query="x")
    assert outcome.failed and "not available" in outcome.text
    assert "session_search" not in bench.agent.activeTools()


def test_sessionSearchFailureIsReported(bench) -> None:
    def broken(query: str, limit: int, allProjects: bool) -> list[dict]:
        raise RuntimeError("database is locked")

    bench.agent.sessionSearch = broken
    outcome = bench.call("session_search", query="x")
    assert outcome.failed and "database is locked" in outcome.text


def test_specialNumbersAreNotJSON() -> None:
    """NaN, Infinity and 1e400 in arguments are refused, naming where (they could
    not be sent on to the editor); a lone surrogate is repaired, so no tool and
    no history entry ever holds one."""
    import pytest

    from hermes_acp.engine.tools.registry import ToolError, parseArguments

    for raw in ('{"limit": NaN}', '{"limit": Infinity}', '{"x": -Infinity}', '{"x": [1e400]}'):
        with pytest.raises(ToolError, match="not a finite number"):
            parseArguments(raw)
    with pytest.raises(ToolError, match="nested deeper"):
        parseArguments("[" * 200 + "]" * 200)
    with pytest.raises(ToolError, match="not valid JSON"):
        parseArguments("[" * 5000 + "]" * 5000)
    assert parseArguments('{"limit": 5}') == {"limit": 5}
    assert parseArguments('{"query": "a\\ud800b"}') == {"query": "a\ufffdb"}


def test_knownSecretsNeverLeaveATool(monkeypatch) -> None:
    """runTool redacts the known secret values (read when the call ends, so a key
    set at runtime counts) from the text and from every string in the extras,
    for outcomes, ToolErrors and crashes alike."""
    from hermes_acp.engine.tools.registry import Tool, ToolOutcome, parameters, runTool

    key, password = "sk-live-0123456789abcdef", "s3cretpass"
    monkeypatch.setenv("HERMES_API_KEY", key)
    monkeypatch.setenv("HERMES_BASE_URL", f"http://user:{password}@127.0.0.1:1/v1")

    def leaky(ctx, mode: str) -> ToolOutcome:
        if mode == "error":
            raise ToolError(f"refused {key}", {"output": f"log: {password}"})
        if mode == "crash":
            raise RuntimeError(f"boom {key}")
        return ToolOutcome(f"HERMES_API_KEY={key}\n", {"output": f"{key} and {password}", "exitCode": 0,
                                                        "diff": [{"newText": f"pw={password}"}]})

    tool = Tool("leaky", "leaks", parameters(["mode"], mode={"type": "string"}), leaky)
    found = {mode: runTool(tool, None, {"mode": mode}) for mode in ("ok", "error", "crash")}  # type: ignore[arg-type]
    assert found["ok"].text == "HERMES_API_KEY=[REDACTED]\n"
    assert found["ok"].extras == {"output": "[REDACTED] and [REDACTED]", "exitCode": 0, "diff": [{"newText": "pw=[REDACTED]"}]}
    assert found["error"].failed and found["error"].text == "Error: refused [REDACTED]"
    assert found["error"].extras == {"output": "log: [REDACTED]"}
    assert found["crash"].failed and found["crash"].text.endswith("boom [REDACTED]")
    assert key not in repr(found) and password not in repr(found)
    monkeypatch.setenv("HERMES_API_KEY", "sk-rotated-0123456789")
    assert runTool(tool, None, {"mode": "ok"}).text == f"HERMES_API_KEY={key}\n"  # type: ignore[arg-type]


def test_redactionCostsLittle(monkeypatch) -> None:
    """Redacting a 50 KB output (its text and the same again in extras) is cheap:
    about 0.1 ms a call where this was written; the bound leaves room for slow machines."""
    import time

    from hermes_acp.engine.tools.registry import Tool, ToolOutcome, parameters, runTool

    monkeypatch.setenv("HERMES_API_KEY", "sk-live-0123456789abcdef")
    output = ("ordinary build output, nothing secret 0123456789\n" * 1100)[:50_000]
    tool = Tool("big", "big", parameters(), lambda ctx: ToolOutcome(output, {"output": output}))
    runTool(tool, None, {})  # type: ignore[arg-type]
    began = time.perf_counter()
    for _ in range(100):
        runTool(tool, None, {})  # type: ignore[arg-type]
    assert (time.perf_counter() - began) / 100 < 0.005
