"""Context habits (issue 15, first part) through the real process: project
instructions in the system prompt, reasoning sent back with tool calls, tool
names on cards, and ``usage_update`` after every session setup."""

from __future__ import annotations

import asyncio

import pytest
import pytest_twisted

from .e2e import agentText, modelEnv, text, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, until


@pytest_twisted.ensureDeferred
async def test_projectInstructionsJoinTheSystemPrompt(scriptedServer, tmp_path) -> None:
    """AGENTS.md at the repository root and CLAUDE.md in the session's folder reach the
    model (outermost first); one that links outside its folder does not; /context
    lists the files used."""
    model, url = scriptedServer
    repo = tmp_path / "repo"
    sub = repo / "pkg"
    sub.mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "AGENTS.md").write_text("Always run the tests with -q.\n")
    (sub / "CLAUDE.md").write_text("In pkg, keep functions short.\n")
    secret = tmp_path / "outside.txt"
    secret.write_text("outside the repository\n")
    (sub / "HERMES.md").symlink_to(secret)
    model.default.responses += [[{"text": "ok"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(sub), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/context")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    system = model.chatRequests[0]["messages"][0]["content"]
    assert system.index("Always run the tests with -q.") < system.index("In pkg, keep functions short.")
    assert "outside the repository" not in system
    shown = agentText(found)
    assert str(repo / "AGENTS.md") in shown and str(sub / "CLAUDE.md") in shown and "HERMES.md" not in shown


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest_twisted.ensureDeferred
async def test_reasoningGoesBackWithToolCalls(scriptedServer, tmp_path, field) -> None:
    """The reasoning of a reply that called tools is sent back with it, under the
    field the endpoint used; the tool card carries the tool's name."""
    model, url = scriptedServer
    (tmp_path / "a.txt").write_text("alpha\n")
    step = {"reasoning": "I should read a.txt first."}
    if field == "reasoning":
        step["field"] = "reasoning"
    model.default.responses += [
        [step, {"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "a.txt"}}]}],
        [{"text": "read it"}],
    ]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("read")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assistant = next(m for m in model.chatRequests[1]["messages"] if m["role"] == "assistant")
    assert assistant[field] == "I should read a.txt first." and assistant["tool_calls"]
    other = "reasoning" if field == "reasoning_content" else "reasoning_content"
    assert other not in assistant
    assert [u["name"] for u in found if u["sessionUpdate"] == "tool_call"] == ["read_file"]


@pytest_twisted.ensureDeferred
async def test_usageAfterEverySessionSetup(scriptedServer, tmp_path) -> None:
    """new, load, resume and fork each tell the editor how full the context is."""
    model, url = scriptedServer
    model.default.responses += [[{"text": "hi"}, {"usage": {"prompt_tokens": 321, "completion_tokens": 2}}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hello")]), 30)
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            await conn.resume_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            forked = (await conn.fork_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])).session_id
            # (a session's updates follow its answer, written once the answer is: a moment later)
            await until(lambda: any(u["sessionUpdate"] == "usage_update" for u in updates(wire, forked)), 10,
                        "the fork's usage_update")
            return updates(wire, sid), updates(wire, forked), wire.problems()

    original, forked, problems = await onLoop(scenario())
    assert problems == []
    used = [u["used"] for u in original if u["sessionUpdate"] == "usage_update"]
    assert used[0] == 0 and used[-2:] == [321, 321]  # new; then after the turn, load and resume
    assert [u["used"] for u in forked if u["sessionUpdate"] == "usage_update"] == [321]


@pytest_twisted.ensureDeferred
async def test_theWindowComesFromTheModelListThenFromAnOverflow(scriptedServer, tmp_path) -> None:
    """usage_update.size is the model's window from /models; a context-length error
    says so plainly and teaches the window it names."""
    model, url = scriptedServer
    model.models = ["listed-model", "scripted-model"]
    model.windows = {"listed-model": 32768}
    overflow = ("This model's maximum context length is 16384 tokens. However, your messages resulted "
                "in 20000 tokens. Please reduce the length of the messages.")
    model.default.responses += [[{"text": "ok"}], [{"status": 400, "error": overflow, "code": "context_length_exceeded"}]]

    async def scenario():
        env = {**modelEnv(url), "HERMES_MODEL": "listed-model"}
        async with connect(RecordingClient(), env=env) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/model")]), 30)  # waits for the list
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hello")]), 30)
            try:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("too long")]), 30)
            except Exception as e:  # the SDK's RequestError
                error = str(e)
            else:
                error = ""
            return updates(wire, sid), error, wire.problems()

    found, error, problems = await onLoop(scenario())
    assert problems == []
    sizes = [u["size"] for u in found if u["sessionUpdate"] == "usage_update"]
    assert sizes[-2:] == [32768, 16384]
    assert "no longer fits" in error and "16384" in error


@pytest_twisted.ensureDeferred
async def test_costAddsUpAcrossTurnsAndRestarts(scriptedServer, tmp_path) -> None:
    """Where the endpoint reports ``usage.cost`` (OpenRouter), ``usage_update`` carries the
    session's total, in every turn and after a restart; without it, no cost at all."""
    model, url = scriptedServer
    priced = {"prompt_tokens": 100, "completion_tokens": 5, "cost": 0.00125}
    model.default.responses += [[{"text": "one"}, {"usage": priced}], [{"text": "two"}, {"usage": priced}],
                                [{"text": "three"}, {"usage": priced}]]
    env = modelEnv(url, str(tmp_path / "home"))

    async def session(load=None):
        async with connect(RecordingClient(), env=env) as (conn, _, wire, process):
            await initialized(conn)
            if load is None:
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                prompts = ["a", "b"]
            else:
                sid = load
                await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
                prompts = ["c"]
            for words in prompts:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(words)]), 30)
            return sid, [u for u in updates(wire, sid) if u["sessionUpdate"] == "usage_update"], wire.problems()

    sid, first, problems = await onLoop(session())
    _, second, moreProblems = await onLoop(session(sid))
    assert problems == moreProblems == []
    assert "cost" not in first[0]  # before any request
    assert [u["cost"] for u in first[1:]] == [{"amount": 0.00125, "currency": "USD"}, {"amount": 0.0025, "currency": "USD"}]
    assert second[-1]["cost"] == {"amount": 0.00375, "currency": "USD"}
