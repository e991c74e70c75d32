"""Memory end to end, through the real process: Hermes' ``memory`` tool writes Hermes' files,
the next session's system prompt carries them (also after a restart) while the session that
wrote keeps the snapshot it started with, two agents writing at once lose nothing, the limits
and the secret refusal reach the model, ``/memory`` shows the files, and each mode decides as
documented."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest_twisted

from .e2e import agentText, answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop

DELIMITER = "\n§\n"


def memoryCall(callId: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": callId, "name": "memory", "arguments": arguments}]}


def requestFor(server: Any, word: str, index: int = 0) -> dict[str, Any]:
    """The ``index``-th chat request whose latest user message holds ``word``."""
    found = [body for body in server.chatRequests
             if any(word in str(m.get("content")) for m in body["messages"] if m["role"] == "user")]
    return found[index]


def systemOf(body: dict[str, Any]) -> str:
    assert body["messages"][0]["role"] == "system"
    return body["messages"][0]["content"]


def toolResults(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


def memoryFile(home: str, name: str) -> str:
    return (Path(home) / "memories" / name).read_text(encoding="utf-8")


@pytest_twisted.ensureDeferred
async def test_memoryReachesTheNextSessionAlsoAfterARestartAndTheWriterKeepsItsSnapshot(scriptedServer, tmp_path) -> None:
    """A session (edits accepted) saves a user preference: the file is Hermes' USER.md, the card
    shows the change, the model reads Hermes' result. The same session's next request keeps the
    prompt it started with (``/memory`` there says memory changed since); a new session's prompt
    has the entry under Hermes' heading. After a
    restart, the loaded session's prompt is byte for byte what it was (a hand edit since is not
    in it) and a new session gets the file as it is now."""
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    server.addRule("alpha-one", [
        [memoryCall("m1", action="add", target="user", content="Prefers tabs over spaces")],
        [{"text": "Saved."}],
    ])
    for word in ("alpha-two", "bravo-one", "bravo-two", "charlie"):
        server.addRule(word, [[{"text": "ok"}]])

    async def firstLife() -> tuple[str, list[dict[str, Any]], list[str]]:
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            alpha = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=alpha, mode_id="accept_edits")
            await conn.prompt(session_id=alpha, prompt=[text("alpha-one: remember that I like tabs")])
            await conn.prompt(session_id=alpha, prompt=[text("alpha-two")])
            before = len(updates(wire, alpha))
            await conn.prompt(session_id=alpha, prompt=[text("/memory")])
            shown = agentText(updates(wire, alpha)[before:])
            assert "1. Prefers tabs over spaces" in shown and "Changed since this session started" in shown
            bravo = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=bravo, prompt=[text("bravo-one")])
            return bravo, updates(wire, alpha)[:before], wire.problems()

    async def secondLife(bravo: str) -> list[str]:
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id=bravo, mcp_servers=[])
            await conn.prompt(session_id=bravo, prompt=[text("bravo-two")])
            charlie = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=charlie, prompt=[text("charlie")])
            return wire.problems()

    bravo, alphaUpdates, problems = await onLoop(firstLife())
    assert problems == []
    assert memoryFile(home, "USER.md") == "Prefers tabs over spaces"
    card = toolCalls(alphaUpdates)[next(iter(toolCalls(alphaUpdates)))]
    assert card["status"] == "completed" and card["kind"] == "edit"
    diff = next(c for c in card["content"] if c["type"] == "diff")
    assert diff["path"] == str(Path(home) / "memories" / "USER.md") and diff["newText"] == "Prefers tabs over spaces"
    result = json.loads(toolResults(requestFor(server, "alpha-one", 1))["m1"])
    assert result == {"success": True, "done": True, "target": "user", "usage": "1% — 24/1,375 chars",
                      "entry_count": 1, "message": "Entry added.",
                      "note": "Write saved. This update is complete — do not repeat it."}

    alphaFirst, alphaNext = systemOf(requestFor(server, "alpha-one")), systemOf(requestFor(server, "alpha-two"))
    assert alphaNext == alphaFirst and "Prefers tabs" not in alphaNext  # frozen: memory was empty at its start
    bravoPrompt = systemOf(requestFor(server, "bravo-one"))
    assert "USER PROFILE (who the user is) [1% — 24/1,375 chars]\n" in bravoPrompt
    assert bravoPrompt.endswith("\nPrefers tabs over spaces")

    memories = Path(home) / "memories"
    (memories / "MEMORY.md").write_text("Written by hand in between\n", encoding="utf-8")
    problems = await onLoop(secondLife(bravo))
    assert problems == []
    assert systemOf(requestFor(server, "bravo-two")) == bravoPrompt  # the snapshot came back with the session
    charliePrompt = systemOf(requestFor(server, "charlie"))
    assert "MEMORY (your personal notes) [1% — 26/2,200 chars]" in charliePrompt
    assert "Written by hand in between" in charliePrompt and "Prefers tabs over spaces" in charliePrompt


@pytest_twisted.ensureDeferred
async def test_twoAgentsWritingAtOnceLoseNothing(scriptedServer, tmp_path) -> None:
    """Two agent processes on one HERMES_HOME each add 20 entries in one reply (four at a time
    in each process), their replies released together: all 40 are in MEMORY.md, in Hermes'
    format, and no temporary file is left."""
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")

    def batch(agent: str) -> list[list[dict[str, Any]]]:
        calls = [{"id": f"{agent}{n}", "name": "memory",
                  "arguments": {"action": "add", "target": "memory", "content": f"fact {n:02d} from agent {agent}"}}
                 for n in range(20)]
        return [[{"barrier": 2}, {"tool_calls": calls}], [{"text": f"{agent} done"}]]

    server.addRule("agent one", batch("one"))
    server.addRule("agent two", batch("two"))

    async def agent(name: str) -> tuple[str, list[str]]:
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="dont_ask")
            response = await conn.prompt(session_id=sid, prompt=[text(f"agent {name}: remember these")])
            return response.stop_reason, wire.problems()

    async def both() -> list[tuple[str, list[str]]]:
        return await asyncio.gather(agent("one"), agent("two"))

    for stopReason, problems in await onLoop(both()):
        assert stopReason == "end_turn" and problems == []
    entries = memoryFile(home, "MEMORY.md").split(DELIMITER)
    expected = {f"fact {n:02d} from agent {a}" for n in range(20) for a in ("one", "two")}
    assert len(entries) == 40 and set(entries) == expected
    results = [json.loads(r) for body in server.chatRequests[2:] for r in toolResults(body).values()]
    assert len(results) == 40 and all(r["success"] for r in results)
    assert sorted(p.name for p in (Path(home) / "memories").iterdir()) == ["MEMORY.md", "MEMORY.md.lock"]


@pytest_twisted.ensureDeferred
async def test_limitsAndSecretsAreRefusedWithAMessageToTheModel(scriptedServer, tmp_path) -> None:
    """With the user profile limited to 60 characters: an add that would pass it is refused with
    the usage and the entries; a token-shaped value and one of the user's own .env secrets are
    refused without being written or echoed; a batch that frees room and adds in one call works."""
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    secret = "Zebra-Lantern-Quiet-93"
    Path(home, ".env").write_text(f"BILLING_SERVICE_PASSWORD={secret}\n", encoding="utf-8")
    token = "ghp_" + "A1b2C3d4E5" * 4
    server.addRule("limits", [
        [memoryCall("a", action="add", target="user", content="Name: Ada Lovelace, mathematician")],
        [memoryCall("b", action="add", target="user", content="Works on the analytical engine, in London")],
        [memoryCall("c", action="add", target="user", content=f"GitHub token is {token}")],
        [memoryCall("d", action="add", target="memory", content=f"The billing password is {secret}")],
        [memoryCall("e", target="user", operations=[
            {"action": "remove", "old_text": "Ada"},
            {"action": "add", "content": "Works on the analytical engine, in London"},
        ])],
        [{"text": "done"}],
    ])
    env = modelEnv(url, home, HERMES_ACP_USER_CHARS="60")
    async def run() -> list[str]:
        async with connect(env=env) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="accept_edits")
            await conn.prompt(session_id=sid, prompt=[text("limits and secrets")])
            return wire.problems()

    assert await onLoop(run()) == []
    results = {k: json.loads(v) for k, v in toolResults(server.chatRequests[-1]).items()}
    assert results["a"]["success"] is True
    full = results["b"]
    assert full["success"] is False and full["usage"] == "33/60"
    assert full["error"].startswith("Memory at 33/60 chars. Adding this entry (41 chars) would exceed the limit.")
    assert full["current_entries"] == ["Name: Ada Lovelace, mathematician"]
    for key, kind in (("c", "a GitHub token"), ("d", "one of your secret values")):
        assert results[key]["success"] is False and kind in results[key]["error"]
        assert "Secrets never go into memory" in results[key]["error"]
    assert results["e"]["success"] is True and results["e"]["usage"] == "68% — 41/60 chars"
    assert memoryFile(home, "USER.md") == "Works on the analytical engine, in London"
    assert not (Path(home) / "memories" / "MEMORY.md").exists()
    told = json.dumps([toolResults(body) for body in server.chatRequests])
    assert token not in told and secret not in told  # the refusals name the kind, never the value


@pytest_twisted.ensureDeferred
async def test_modesDecideAboutMemory(scriptedServer, tmp_path) -> None:
    """The default mode asks like an edit (the question shows the file's change); a rejection
    writes nothing and the model hears it; plan mode refuses without asking."""
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    server.addRule("ask me", [
        [memoryCall("yes", action="add", target="memory", content="Tests run with pytest -q")],
        [memoryCall("no", action="add", target="memory", content="Deploys on Fridays")],
        [{"text": "ok"}],
    ])
    server.addRule("while planning", [
        [memoryCall("plan", action="add", target="memory", content="Planned note")],
        [{"text": "ok"}],
    ])
    client = RecordingClient(permission=answers("allow_once", "reject_once"))

    async def run() -> list[str]:
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("ask me")])
            await conn.set_session_mode(session_id=sid, mode_id="plan")
            await conn.prompt(session_id=sid, prompt=[text("while planning")])
            return wire.problems()

    assert await onLoop(run()) == []
    assert len(client.permissionRequests) == 2  # plan mode asked nothing
    asked = client.permissionRequests[0][1].model_dump(by_alias=True, exclude_none=True)
    assert asked["kind"] == "edit"
    assert asked["content"][0] == {"type": "diff", "path": str(Path(home) / "memories" / "MEMORY.md"),
                                   "oldText": "", "newText": "Tests run with pytest -q"}
    results = toolResults(requestFor(server, "ask me", 2))
    assert json.loads(results["yes"])["success"] is True
    assert "not approved (the user denied it)" in json.loads(results["no"])["error"]
    assert "Blocked in plan mode" in json.loads(toolResults(requestFor(server, "while planning", 1))["plan"])["error"]
    assert memoryFile(home, "MEMORY.md") == "Tests run with pytest -q"


@pytest_twisted.ensureDeferred
async def test_slashMemoryShowsTheFilesAsTheUserEditedThem(scriptedServer, tmp_path) -> None:
    """``/memory`` is an advertised command. It shows both files as the user wrote them by hand
    (CRLF, blank entries), with a secret entry left out, and a file that is not UTF-8 marked as one
    the tool will not change; the model is not asked."""
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    memories = Path(home) / "memories"
    memories.mkdir(mode=0o700)
    (memories / "MEMORY.md").write_bytes(
        "Repo uses tox\r\n§\r\n\r\n§\r\nAWS key AKIAIOSFODNN7EXAMPLE\r\n§\r\nCI is GitHub Actions\r\n".encode())
    (memories / "USER.md").write_bytes(b"Name: Bob\n\xff\xfe broken")

    async def run() -> tuple[list[dict[str, Any]], list[str]]:
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("/memory")])
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(run())
    assert problems == [] and server.chatRequests == []
    commands = next(u for u in found if u["sessionUpdate"] == "available_commands_update")["availableCommands"]
    assert "memory" in {c["name"] for c in commands}
    shown = agentText(found)
    assert "1. Repo uses tox\n2. [An entry of MEMORY.md was left out: it holds what looks like a secret " \
           "(an AWS access key)" in shown
    assert "3. CI is GitHub Actions" in shown and "AKIA" not in shown
    assert "⚠ it is not UTF-8 text: the memory tool will not change it until you fix it." in shown
