"""Skills (issue 25 §1) through the real process: found in ``$HERMES_HOME/skills`` and in the
project, listed in the system prompt and as slash commands, ``/NAME`` runs a turn with the
skill, ``skill_view`` reads a linked file, ``skill_manage`` makes a skill that the next
``available_commands_update`` carries, and bad skills are skipped and said in ``/doctor``
and ``--check``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest_twisted

from .agentproc import ENTRY_POINTS, agentEnv
from .e2e import agentText, answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop


def skillText(name: str, description: str, body: str = "Follow these steps.\n", extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}"


def makeSkill(root: Path, name: str, content: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).mkdir()
    (root / name / "SKILL.md").write_text(content)
    return root / name


def setUp(tmp_path: Path) -> tuple[Path, Path]:
    """A HERMES_HOME with a user skill (in a category, with a linked file) and a project with one."""
    home, project = tmp_path / "home", tmp_path / "repo"
    (project / ".git").mkdir(parents=True)
    deploy = makeSkill(home / "skills" / "devops", "deploy", skillText(
        "deploy", "Deploy the app to an environment. Use when the user asks to deploy or ship.",
        "1. Read references/checklist.md.\n2. Run the deploy script.\n", "argument-hint: environment name\n"))
    (deploy / "references").mkdir()
    (deploy / "references" / "checklist.md").write_text("- tests green\n- changelog written\n")
    makeSkill(project / ".agents" / "skills", "lint-rules", skillText(
        "lint-rules", "The project's lint rules. Use when fixing style or lint errors."))
    return home, project


def commandLists(found: list[dict[str, Any]]) -> list[list[str]]:
    return [[c["name"] for c in u["availableCommands"]] for u in found if u["sessionUpdate"] == "available_commands_update"]


@pytest_twisted.ensureDeferred
async def test_skillsInThePromptAsCommandsAndRunBySlash(scriptedServer, tmp_path) -> None:
    """Both skills are in the system prompt (name and description) and in the commands (with
    the argument hint); ``/deploy staging`` sends the skill's instructions and the request, the
    model reads the linked file with skill_view, and a path out of the skill is refused."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    model.default.responses += [
        [{"text": "hello"}],
        [{"tool_calls": [
            {"id": "v", "name": "skill_view", "arguments": {"name": "deploy", "file_path": "references/checklist.md"}},
            {"id": "x", "name": "skill_view", "arguments": {"name": "deploy", "file_path": "../../../.env"}},
        ]}],
        [{"text": "deployed"}],
    ]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/deploy staging")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    first = next(u for u in found if u["sessionUpdate"] == "available_commands_update")
    byName = {c["name"]: c for c in first["availableCommands"]}
    assert {"help", "model", "deploy", "lint-rules"} <= set(byName)
    assert byName["deploy"]["input"] == {"hint": "environment name"}
    assert byName["deploy"]["description"].startswith("Skill: Deploy the app")
    system = model.chatRequests[0]["messages"][0]["content"]
    assert "- deploy: Deploy the app to an environment." in system
    assert "- lint-rules: The project's lint rules." in system
    assert {"skills_list", "skill_view", "skill_manage"} <= {t["function"]["name"] for t in model.chatRequests[0]["tools"]}
    invoked = model.chatRequests[1]["messages"][-1]
    assert invoked["role"] == "user" and "2. Run the deploy script." in invoked["content"]
    assert "The user's request: staging" in invoked["content"] and "name: deploy" not in invoked["content"]
    results = {m["tool_call_id"]: m["content"] for m in model.chatRequests[2]["messages"] if m["role"] == "tool"}
    assert json.loads(results["v"])["content"] == "- tests green\n- changelog written\n"
    assert results["x"].startswith("Error:") and "leads out of the skill's folder" in results["x"]
    calls = toolCalls(found)
    assert sorted(c["title"] for c in calls.values()) == ["Read skill deploy: ../../../.env",
                                                         "Read skill deploy: references/checklist.md"]
    assert "deployed" in agentText(found)


@pytest_twisted.ensureDeferred
async def test_aSkillMadeBySkillManageIsTheNextCommand(scriptedServer, tmp_path) -> None:
    """The model creates a skill; the user is asked with the diff; before the prompt's answer
    the editor hears the commands with it, and ``/release`` runs it in the next turn."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    content = skillText("release", "Cut a release. Use when the user says release.", "Tag and push.\n")
    model.default.responses += [
        [{"tool_calls": [{"id": "c", "name": "skill_manage",
                          "arguments": {"action": "create", "name": "release", "content": content}}]}],
        [{"text": "saved"}],
        [{"text": "released"}],
    ]
    client = RecordingClient(permission=answers("allow_once"))

    async def scenario():
        async with connect(client, env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("remember how to release")]), 30)
            answered = len(wire.received)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/release v2")]), 30)
            return updates(wire, sid), answered, wire, wire.problems()

    found, answered, wire, problems = await onLoop(scenario())
    assert problems == []
    lists = commandLists(found)
    assert "release" not in lists[0] and "release" in lists[1]
    heard = next(i for i, f in enumerate(wire.received) if f.get("method") == "session/update"
                 and f["params"]["update"]["sessionUpdate"] == "available_commands_update"
                 and "release" in [c["name"] for c in f["params"]["update"]["availableCommands"]])
    assert heard < answered  # before the answer of the prompt that made it
    [(_, toolCall, _)] = client.permissionRequests
    asked = toolCall.model_dump(by_alias=True, exclude_none=True)
    assert asked["content"][0]["type"] == "diff" and asked["content"][0]["newText"] == content
    assert (home / "skills" / "release" / "SKILL.md").read_text() == content
    assert "Tag and push." in model.chatRequests[2]["messages"][-1]["content"]


@pytest_twisted.ensureDeferred
async def test_skillsChangedOnDiskCountFromTheNextTurn(scriptedServer, tmp_path) -> None:
    """A skill added to the project between turns is a command from the next turn on (the
    editor hears the new list), and one removed goes away."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    model.default.responses += [[{"text": "one"}], [{"text": "two"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            makeSkill(project / ".claude" / "skills", "new-one", skillText("new-one", "Added later. Use when asked."))
            (project / ".agents" / "skills" / "lint-rules" / "SKILL.md").unlink()
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/help")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    lists = commandLists(found)
    assert len(lists) == 2 and "lint-rules" in lists[0] and "new-one" not in lists[0]
    assert "new-one" in lists[1] and "lint-rules" not in lists[1]
    assert "`/new-one`" in agentText(found)  # /help lists the skills too
    assert "- new-one: Added later." in model.chatRequests[0]["messages"][0]["content"]


def badSkills(home: Path, project: Path, outside: Path) -> None:
    user = home / "skills"
    makeSkill(user, "huge", skillText("huge", "Too big.", "x" * 150_000))
    (user / "binary").mkdir()
    (user / "binary" / "SKILL.md").write_bytes(b"---\nname: binary\ndescription: b\n---\n\x00\xff\xfe")
    makeSkill(user, "model", skillText("model", "Collides with /model. Use never."))
    makeSkill(user, "shouty", skillText("Shouty", "A bad name."))
    makeSkill(user, "vague", "---\nname: vague\n---\nNo description.\n")
    makeSkill(outside, "escape", skillText("escape", "Outside the folder."))
    (project / ".agents" / "skills").mkdir(parents=True, exist_ok=True)
    (project / ".agents" / "skills" / "escape").symlink_to(outside / "escape")


@pytest_twisted.ensureDeferred
async def test_badSkillsAreSkippedAndSaid(scriptedServer, tmp_path) -> None:
    """A huge, a binary, a badly named and an undescribed SKILL.md, and a project skill that
    links out of its folder, are skipped with the reason in /doctor; a skill named like a
    built-in command is no command (and /model stays the agent's own)."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    badSkills(home, project, tmp_path / "outside")

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/doctor")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/model")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    [commands] = commandLists(found)
    assert commands.count("model") == 1 and "deploy" in commands
    assert not {"huge", "binary", "shouty", "Shouty", "vague", "escape"} & set(commands)
    shown = agentText(found)
    for needle in ("huge/SKILL.md: skipped: it is 150,", "binary/SKILL.md: skipped: it is a binary file",
                   "shouty/SKILL.md: skipped: its name 'Shouty'", "vague/SKILL.md: skipped: its front matter has no description",
                   f"escape/SKILL.md: skipped: it is a link to {tmp_path / 'outside' / 'escape'}",
                   "model/SKILL.md: loaded, but not the command /model", "Current model: `scripted-model`"):
        assert needle in shown, needle
    assert model.chatRequests == []


def test_checkListsSkillsAndWhySomeAreSkipped(tmp_path) -> None:
    home, project = setUp(tmp_path)
    badSkills(home, project, tmp_path / "outside")
    out = subprocess.run(ENTRY_POINTS["hermes-acp"] + ["--check"], capture_output=True, text=True, timeout=60,
                         env=agentEnv(str(home)), cwd=str(project), stdin=subprocess.DEVNULL).stdout
    line = next(line for line in out.splitlines() if line.startswith("skills:"))
    assert f"2 in {home / 'skills'}, 1 from the project" in line  # deploy and model; lint-rules
    assert "binary/SKILL.md: skipped: it is a binary file" in out and "escape/SKILL.md: skipped" in out


@pytest_twisted.ensureDeferred
async def test_aHostileProjectsSkillsCannotBreakTurnsOrFloodTheEditor(scriptedServer, tmp_path) -> None:
    """A project whose ``SKILL.md`` is a folder, or whose front matter nests 90,000 lists deep,
    is skipped with the reason (the turn still runs and the model still gets its system
    prompt), and a skill's 90,000-character argument hint
    reaches the editor shortened, not whole in every ``available_commands_update``."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    (project / ".agents" / "skills" / "trap" / "SKILL.md").mkdir(parents=True)
    makeSkill(project / ".agents" / "skills", "deep", "---\nname: deep\ndescription: d\nx: " + "[" * 90_000 + "\n---\n")
    makeSkill(project / ".agents" / "skills", "hinty", skillText(
        "hinty", "Has a long hint. Use never.", extra="argument-hint: " + "h" * 90_000 + "\n"))
    model.default.responses += [[{"text": "still here"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/doctor")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == []
    assert "still here" in agentText(found)
    assert "- lint-rules: The project's lint rules." in model.chatRequests[0]["messages"][0]["content"]
    assert "trap/SKILL.md: skipped: it is not a regular file" in agentText(found)
    assert "deep/SKILL.md: skipped: its front matter is nested too deeply" in agentText(found)
    [commands] = [u["availableCommands"] for u in found if u["sessionUpdate"] == "available_commands_update"]
    hint = next(c for c in commands if c["name"] == "hinty")["input"]["hint"]
    assert len(hint) <= 200 and hint.startswith("hhh") and hint.endswith("…")


@pytest_twisted.ensureDeferred
async def test_aSkillInAFolderWhoseNameIsNotUTF8IsShownAndItsCardEnds(scriptedServer, tmp_path) -> None:
    """A project skill in a folder whose name is not UTF-8 (byte 0xff): skill_view's card
    completes (its rendering failed on the lone surrogate and left the card running for ever)."""
    model, url = scriptedServer
    home, project = setUp(tmp_path)
    folder = os.path.join(os.fsencode(project / ".agents" / "skills"), b"odd\xff")
    os.makedirs(folder)
    with open(os.path.join(folder, b"SKILL.md"), "w") as f:
        f.write(skillText("odd", "Odd folder. Use never."))
    model.default.responses += [[{"tool_calls": [{"id": "v", "name": "skill_view", "arguments": {"name": "odd"}}]}],
                                [{"text": "read it"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, str(home))) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/odd go")]), 30)
            return updates(wire, sid), wire.problems()

    found, problems = await onLoop(scenario())
    assert problems == [] and "read it" in agentText(found)
    [card] = toolCalls(found).values()
    assert card["status"] == "completed" and "Follow these steps." in card["content"][0]["content"]["text"]
