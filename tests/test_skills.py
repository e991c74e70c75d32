"""Skills (``engine.skills``, ``engine.tools.skills``): parsing, validation, where they are
found, the system prompt's list, and the skill tools on a real folder."""

from __future__ import annotations

import json
import os
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from hermes_acp.config import Endpoint
from hermes_acp.engine import skills as skillsModule
from hermes_acp.engine.agent import AIAgent
from hermes_acp.engine.skills import Catalog, InvalidSkill, SkillLibrary, parseDocument
from hermes_acp.session_state import SessionState
from hermes_acp.skillcommands import SCAN_WAIT, SkillCommands

from .conftest import ToolBench
from .observers import RecordingObserver


def skillText(name: str, description: str = "Does a thing. Use when testing.", body: str = "Step one.\n",
              extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}"


def makeSkill(root: Path, name: str, text: str | None = None, category: str | None = None) -> Path:
    folder = root / category / name if category else root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(skillText(name) if text is None else text)
    return folder


# -- parsing -------------------------------------------------------------------------


def test_aValidDocument() -> None:
    document = parseDocument(skillText("pdf-tools", extra="license: MIT\nmetadata:\n  author: me\n"))
    assert document.front["name"] == "pdf-tools" and document.front["metadata"] == {"author": "me"}
    assert document.body == "Step one.\n"


def test_anUnquotedColonIsForgiven() -> None:
    """``description: Use when: x`` is invalid YAML; the client guide says to retry it quoted."""
    assert parseDocument(skillText("a", "Use when: the user asks")).front["description"] == "Use when: the user asks"


@pytest.mark.parametrize("text, reason", [
    ("no front matter\n", "does not start with front matter"),
    ("---\nname: a\ndescription: b\n", "not closed"),
    ("---\nname: [a\ndescription: b\n---\n", "not valid YAML"),
    ("---\n- a\n- b\n---\n", "not a mapping"),
    ("---\ndescription: b\n---\n", "no name"),
    ("---\nname: Has Caps\ndescription: b\n---\n", "not lowercase"),
    ("---\nname: -dash\ndescription: b\n---\n", "not lowercase"),
    (f"---\nname: {'a' * 65}\ndescription: b\n---\n", "65 characters"),
    ("---\nname: a\n---\n", "no description"),
    ("---\nname: a\ndescription: '  '\n---\n", "no description"),
    (f"---\nname: a\ndescription: {'d' * 1025}\n---\n", "1,025 characters"),
    ("---\nname: a\ndescription: b\n---\n\0\0", "binary"),
    (skillText("a", body="x" * 100_001), "characters long"),
    # values YAML reads and then cannot build: before, each stopped the whole catalog (every turn)
    (skillText("a", extra="updated: 2024-02-30\n"), r"not valid YAML \(day is out of range for month\)"),
    (skillText("a", extra="version: !!int one\n"), "not valid YAML"),
    (skillText("a", extra="x: " + "[" * 90_000 + "\n"), "nested too deeply"),
])
def test_invalidDocumentsSayWhy(text: str, reason: str) -> None:
    with pytest.raises(InvalidSkill, match=reason):
        parseDocument(text)


# -- finding them ----------------------------------------------------------------------


@pytest.fixture
def place(tmp_path: Path) -> dict[str, Path]:
    home, project = tmp_path / "home" / "skills", tmp_path / "repo"
    home.mkdir(parents=True)
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    return {"user": home, "project": project, "cwd": project / "src", "tmp": tmp_path}


def test_userAndProjectSkillsWithCategories(place: dict[str, Path]) -> None:
    makeSkill(place["user"], "deploy", category="devops")
    makeSkill(place["project"] / ".agents" / "skills", "lint")
    makeSkill(place["cwd"] / ".claude" / "skills", "format")
    catalog = SkillLibrary(str(place["user"])).catalog(str(place["cwd"]))
    found = {(s.name, s.source, s.category) for s in catalog.skills}
    assert found == {("deploy", "user", "devops"), ("lint", "project", None), ("format", "project", None)}
    assert [s.name for s in catalog.skills][0] == "deploy" and catalog.problems == ()


def test_theUsersSkillWinsAndTheOtherIsReported(place: dict[str, Path]) -> None:
    makeSkill(place["user"], "review", skillText("review", "the user's own"))
    project = makeSkill(place["project"] / ".agents" / "skills", "review", skillText("review", "the repo's"))
    catalog = SkillLibrary(str(place["user"])).catalog(str(place["cwd"]))
    assert [s.description for s in catalog.skills] == ["the user's own"]
    [problem] = catalog.problems
    assert problem.path == str(project / "SKILL.md") and "same name" in problem.reason


def test_badSkillsAreSkippedWithTheReason(place: dict[str, Path]) -> None:
    user = place["user"]
    makeSkill(user, "fine")
    makeSkill(user, "huge", skillText("huge", body="x" * 200_000))
    binary = user / "binary"
    binary.mkdir()
    (binary / "SKILL.md").write_bytes(b"---\nname: binary\n\x00\x01\x02")
    latin = user / "latin"
    latin.mkdir()
    (latin / "SKILL.md").write_bytes(skillText("latin", "caf\xe9").encode("latin-1"))
    makeSkill(user, "other-name", skillText("renamed"))  # loads, with a warning
    makeSkill(user, "badopt", skillText("badopt", extra="compatibility: [1, 2]\n"))  # loads, field ignored
    catalog = SkillLibrary(str(user)).catalog(str(place["cwd"]))
    assert sorted(s.name for s in catalog.skills) == ["badopt", "fine", "renamed"]
    reasons = {Path(p.path).parent.name: p.reason for p in catalog.problems}
    assert "characters long" in reasons["huge"]
    assert "binary" in reasons["binary"] and "not UTF-8" in reasons["latin"]
    assert "differs from its folder" in reasons["other-name"] and "compatibility" in reasons["badopt"]


def test_linksOutOfTheFolderAreNotFollowed(place: dict[str, Path]) -> None:
    """A SKILL.md that links to a file elsewhere, and a skill folder that is a link to one
    elsewhere, are not read; both are reported."""
    outside = place["tmp"] / "outside"
    makeSkill(outside, "stolen", skillText("stolen", body="secret instructions"))
    linkedFile = place["user"] / "linked-file"
    linkedFile.mkdir()
    (linkedFile / "SKILL.md").symlink_to(outside / "stolen" / "SKILL.md")
    (place["project"] / ".agents" / "skills").mkdir(parents=True)
    (place["project"] / ".agents" / "skills" / "stolen").symlink_to(outside / "stolen")
    catalog = SkillLibrary(str(place["user"])).catalog(str(place["cwd"]))
    assert catalog.skills == ()
    reasons = sorted(p.reason for p in catalog.problems)
    assert len(reasons) == 2 and all("outside" in reason for reason in reasons)


def test_theSearchIsBounded(place: dict[str, Path]) -> None:
    for index in range(30):
        makeSkill(place["user"], f"s{index:02d}")
    catalog = SkillLibrary(str(place["user"]), scanDirs=10).catalog(str(place["cwd"]))
    assert 0 < len(catalog.skills) < 10
    assert any("HERMES_ACP_SKILLS_SCAN_DIRS" in p.reason for p in catalog.problems)


def test_aChangedFileIsReadAgainAndOnlyThen(place: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = makeSkill(place["user"], "edit-me", skillText("edit-me", "first"))
    library = SkillLibrary(str(place["user"]))
    parsed = []
    original = skillsModule.parseDocument
    monkeypatch.setattr(skillsModule, "parseDocument", lambda text: parsed.append(1) or original(text))
    assert library.catalog(str(place["cwd"])).skills[0].description == "first"
    assert library.catalog(str(place["cwd"])).skills[0].description == "first"
    assert len(parsed) == 1
    (folder / "SKILL.md").write_text(skillText("edit-me", "second, and longer"))
    assert library.catalog(str(place["cwd"])).skills[0].description == "second, and longer"
    assert len(parsed) == 2


def test_thePromptListIsBounded(place: dict[str, Path]) -> None:
    for index in range(40):
        makeSkill(place["user"], f"skill-{index:02d}", skillText(f"skill-{index:02d}", "word " * 150))
    catalog = SkillLibrary(str(place["user"])).catalog(str(place["cwd"]))
    full = catalog.promptSection(100_000)
    assert full.count("\n- skill-") == 40 and "word " * 150 in full.replace("word\n", "word ")
    shortened = catalog.promptSection(8000)
    assert len(shortened) <= 8000 and shortened.count("\n- skill-") == 40 and "…" in shortened
    cut = catalog.promptSection(2000)
    assert len(cut) <= 2000 and "more skill(s): skills_list lists them all" in cut
    assert catalog.promptSection(0) == "" and SkillLibrary(str(place["tmp"] / "none")).catalog(
        str(place["cwd"])).promptSection(8000) == ""


# -- the tools -------------------------------------------------------------------------


class SkillBench(ToolBench):
    """An agent with skills whose tools are called directly."""

    def __init__(self, place: dict[str, Path], mode: str = "default", editAnswer: str = "allow_once") -> None:
        super().__init__(str(place["cwd"]))
        self.library = SkillLibrary(str(place["user"]), reserved=frozenset({"model", "help"}))
        self.agent = AIAgent(Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), str(place["cwd"]),
                             skills=self.library)
        self.agent.setEditMode(mode)
        self.observer = RecordingObserver(editAnswer=editAnswer)

    def ok(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        outcome = self.call(tool, **arguments)
        assert not outcome.failed, outcome.text
        return json.loads(outcome.text)

    def error(self, tool: str, /, **arguments: Any) -> str:
        outcome = self.call(tool, **arguments)
        assert outcome.failed, outcome.text
        return outcome.text


def test_theAgentListsSkillsAndHasTheTools(place: dict[str, Path]) -> None:
    makeSkill(place["user"], "deploy", skillText("deploy", "Ship the app. Use when deploying."))
    bench = SkillBench(place)
    assert {"skills_list", "skill_view", "skill_manage"} <= set(bench.agent.activeTools())
    listed = bench.ok("skills_list")
    assert listed["skills"] == [{"name": "deploy", "description": "Ship the app. Use when deploying.",
                                 "category": None, "source": "user"}] and listed["count"] == 1
    without = AIAgent(Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), str(place["cwd"]))
    assert "skill_view" not in without.activeTools()


def test_theFirstSystemPromptListsTheSkillsTheTurnRead(place: dict[str, Path]) -> None:
    """Given the skills the turn just read (``skillsCatalog``), a run's first system prompt
    lists them without reading them again; a later one (after a plan is approved) reads anew."""
    from hermes_acp.engine.agent import _Conversation
    from hermes_acp.engine.cancel import Cancellation
    from hermes_acp.engine.workspace import LocalWorkspace

    makeSkill(place["user"], "deploy", skillText("deploy", "Ship the app. Use when deploying."))
    bench = SkillBench(place)
    read = bench.library.catalog(str(place["cwd"]))
    makeSkill(place["user"], "later", skillText("later", "Made meanwhile. Use later."))
    run = _Conversation(bench.agent, Cancellation(), bench.observer, LocalWorkspace(), [], "hi", {}, None, read)
    first, second = run._system()["content"], run._system()["content"]
    assert "- deploy: Ship the app." in first and "later" not in first
    assert "- later: Made meanwhile." in second


def test_skillViewReadsTheSkillAndItsFilesOnly(place: dict[str, Path]) -> None:
    folder = makeSkill(place["user"], "pdf", category="docs")
    (folder / "references").mkdir()
    (folder / "references" / "api.md").write_text("The API.\n")
    (folder / "assets").mkdir()
    (folder / "assets" / "logo.bin").write_bytes(b"\x89PNG\0\0")
    (folder / "references" / "big.md").write_text("x" * (1024 * 1024 + 1))
    (place["tmp"] / "secret.txt").write_text("outside\n")
    (folder / "references" / "escape.md").symlink_to(place["tmp"] / "secret.txt")
    (folder / "references" / ".env").write_text("KEY=1\n")
    bench = SkillBench(place)
    viewed = bench.ok("skill_view", name="pdf")
    assert viewed["content"].startswith("---\nname: pdf") and viewed["skill_dir"] == str(folder)
    assert viewed["linked_files"]["references"] == ["references/api.md", "references/big.md", "references/escape.md"]
    assert bench.ok("skill_view", name="docs/pdf", file_path="references/api.md")["content"] == "The API.\n"
    assert "outside the skill's folder" in bench.error("skill_view", name="pdf", file_path="references/escape.md")
    assert "'..'" in bench.error("skill_view", name="pdf", file_path="../../../../etc/passwd")
    assert "relative" in bench.error("skill_view", name="pdf", file_path="/etc/passwd")
    assert "binary" in bench.error("skill_view", name="pdf", file_path="assets/logo.bin")
    assert "1,048,576" in bench.error("skill_view", name="pdf", file_path="references/big.md")
    assert "environment" in bench.error("skill_view", name="pdf", file_path="references/.env")
    assert "not found" in bench.error("skill_view", name="pdf", file_path="references/none.md")
    assert "not found" in bench.error("skill_view", name="nope")
    assert "not a skill name" in bench.error("skill_view", name="../pdf")


def test_skillManageCreatesAndChangesTheUsersSkills(place: dict[str, Path]) -> None:
    bench = SkillBench(place)
    created = bench.ok("skill_manage", action="create", name="release", category="ops",
                       content=skillText("release", "Cut a release. Use when releasing.", "1. Tag.\n"))
    path = place["user"] / "ops" / "release" / "SKILL.md"
    assert created["skill_md"] == str(path) and path.read_text().endswith("1. Tag.\n")
    assert bench.observer.edits[-1][1].path == str(path) and bench.observer.edits[-1][1].oldText is None
    bench.ok("skill_manage", action="patch", name="release", old_string="1. Tag.", new_string="1. Tag.\n2. Push.")
    assert path.read_text().endswith("2. Push.\n")
    bench.ok("skill_manage", action="write_file", name="release", file_path="references/notes.md",
             file_content="notes\n")
    assert (path.parent / "references" / "notes.md").read_text() == "notes\n"
    bench.ok("skill_manage", action="patch", name="release", file_path="references/notes.md",
             old_string="notes", new_string="more notes")
    assert (path.parent / "references" / "notes.md").read_text() == "more notes\n"
    bench.ok("skill_manage", action="remove_file", name="release", file_path="references/notes.md")
    assert not (path.parent / "references").exists()
    bench.ok("skill_manage", action="edit", name="release", content=skillText("release", "New.", "Again.\n"))
    assert "Again." in path.read_text()
    bench.ok("skill_manage", action="delete", name="release")
    assert not (place["user"] / "ops").exists()
    assert len(bench.observer.edits) == 7  # each change was asked, with its diff


def test_skillManageRefusesWhatItMustNot(place: dict[str, Path]) -> None:
    makeSkill(place["project"] / ".agents" / "skills", "repo-skill")
    makeSkill(place["user"], "mine")
    bench = SkillBench(place)
    good = skillText("x")
    assert "read-only" in bench.error("skill_manage", action="delete", name="repo-skill")
    assert "already exists" in bench.error("skill_manage", action="create", name="mine", content=skillText("mine"))
    assert "the project's (read-only); choose another name" in bench.error(
        "skill_manage", action="create", name="repo-skill", content=skillText("repo-skill"))
    assert "slash commands" in bench.error("skill_manage", action="create", name="model", content=skillText("model"))
    assert "not lowercase" in bench.error("skill_manage", action="create", name="Bad Name", content=good)
    assert "must be the skill's name" in bench.error("skill_manage", action="create", name="y", content=good)
    assert "one folder name" in bench.error("skill_manage", action="create", name="x", category="../up", content=good)
    assert "is a skill, not a category" in bench.error("skill_manage", action="create", name="x", category="mine",
                                                       content=good)  # made there, it would never be found
    assert not (place["user"] / "mine" / "x").exists()
    assert "no description" in bench.error("skill_manage", action="create", name="x", content="---\nname: x\n---\nA\n")
    assert "'..'" in bench.error("skill_manage", action="write_file", name="mine", file_path="../../escape.md",
                                 file_content="x")
    assert "under references" in bench.error("skill_manage", action="write_file", name="mine", file_path="run.sh",
                                             file_content="x")
    assert "1,048,576" in bench.error("skill_manage", action="write_file", name="mine",
                                      file_path="assets/big.txt", file_content="x" * (1024 * 1024 + 1))
    (place["user"] / "mine" / "scripts").symlink_to(place["tmp"])
    assert "link" in bench.error("skill_manage", action="write_file", name="mine", file_path="scripts/a.sh",
                                 file_content="x")
    assert "must be the skill's name" in bench.error("skill_manage", action="patch", name="mine", old_string="name: mine",
                                            new_string="name: other")
    assert not (place["tmp"] / "a.sh").exists() and (place["user"] / "mine" / "SKILL.md").read_text() == skillText("mine")
    assert bench.observer.edits == []  # nothing refused was ever asked


def test_theModeDecidesAsForAnEdit(place: dict[str, Path]) -> None:
    """default asks (a refusal leaves nothing); accept_edits writes without asking, though the
    skills live in $HERMES_HOME; plan mode refuses without asking."""
    content = skillText("noted")
    refused = SkillBench(place, editAnswer="reject_once")
    assert "not approved" in refused.error("skill_manage", action="create", name="noted", content=content)
    assert not (place["user"] / "noted").exists() and len(refused.observer.edits) == 1
    planning = SkillBench(place, mode="plan")
    assert "plan mode" in planning.error("skill_manage", action="create", name="noted", content=content)
    assert planning.observer.edits == []
    accepting = SkillBench(place, mode="accept_edits")
    accepting.ok("skill_manage", action="create", name="noted", content=content)
    assert (place["user"] / "noted" / "SKILL.md").exists() and accepting.observer.edits == []


def test_skillsListWithNoSkillsOrNoFolder(place: dict[str, Path]) -> None:
    bench = SkillBench(place)
    assert bench.ok("skills_list")["skills"] == []
    os.rmdir(place["user"])
    assert bench.ok("skills_list")["count"] == 0


def test_noSecretGoesIntoASkillOrOutOfOne(place: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """skill_manage refuses to write the agent's key; /NAME redacts one a skill holds."""
    key = "sk-test-skill-0123456789abcdef"
    monkeypatch.setenv("HERMES_API_KEY", key)
    bench = SkillBench(place)
    assert "secret" in bench.error("skill_manage", action="create", name="leaky",
                                   content=skillText("leaky", body=f"Use {key}.\n"))
    home = place["tmp"] / "hermes-home"
    home.mkdir()
    (home / ".env").write_text("SERVICE_TOKEN=only-in-the-dotenv-0451\n")
    monkeypatch.setenv("HERMES_HOME", str(home))  # .env as it is now, not only what the agent started with
    assert "secret" in bench.error("skill_manage", action="create", name="leaky",
                                   content=skillText("leaky", body="Use only-in-the-dotenv-0451.\n"))
    bench.ok("skill_manage", action="create", name="configured",  # a key's shape alone is not refused
             content=skillText("configured", body="Write `token: ${GITHUB_TOKEN}` in the config.\n"))
    makeSkill(place["user"], "holder", skillText("holder", body=f"The key is {key}.\n"))
    [skill] = [s for s in bench.library.catalog(str(place["cwd"])).skills if s.name == "holder"]
    text = bench.library.activation(skill, "go")
    assert key not in text and "The key is [REDACTED]." in text


# -- skills as commands (``skillcommands``), on a clock ------------------------------------


class ThreadReactor(Clock):
    """A clock whose ``callFromThread`` calls wait in a queue until the test runs them."""

    def __init__(self) -> None:
        super().__init__()
        self.fromThreads: queue.Queue[Any] = queue.Queue()

    def callFromThread(self, f: Any, *args: Any) -> None:
        self.fromThreads.put((f, args))

    def runOne(self) -> None:
        f, args = self.fromThreads.get(timeout=10)
        f(*args)


class SentUpdates:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, state: Any, update: dict[str, Any], journal: bool = True) -> None:
        self.sent.append(update)


def refreshed(reactor: ThreadReactor, commands: SkillCommands, state: SessionState) -> Any:
    results: list[Any] = []
    Deferred.fromCoroutine(commands.refresh(state)).addBoth(results.append)
    reactor.runOne()
    return results[0]


def test_commandsAreAnnouncedWhenTheyChange(place: dict[str, Path]) -> None:
    makeSkill(place["user"], "deploy", skillText("deploy", extra="argument-hint: where to\n"))
    makeSkill(place["user"], "help")  # the agent's own command: no skill command
    reactor, updates = ThreadReactor(), SentUpdates()
    library = SkillLibrary(str(place["user"]), reserved=frozenset({"help"}))
    commands = SkillCommands(library, reactor, updates, [{"name": "help", "description": "List the commands"}])
    state = SessionState("s", str(place["cwd"]), announced=True)
    assert [s.name for s in refreshed(reactor, commands, state).skills] == ["deploy", "help"]
    assert refreshed(reactor, commands, state) is not None
    [update] = updates.sent  # the second read found nothing new
    assert update["availableCommands"] == [
        {"name": "help", "description": "List the commands"},
        {"name": "deploy", "description": "Skill: Does a thing. Use when testing.", "input": {"hint": "where to"}}]
    makeSkill(place["user"], "later")
    catalog = refreshed(reactor, commands, state)
    assert [c["name"] for c in updates.sent[-1]["availableCommands"]] == ["help", "deploy", "later"]
    skill, request = commands.invoked(catalog, "/Deploy  to prod\nnow", [{"type": "text"}])
    assert skill.name == "deploy" and request == "to prod\nnow"
    assert commands.invoked(catalog, "/help", [{"type": "text"}]) is None
    assert commands.invoked(catalog, "/deploy", [{"type": "text"}, {"type": "image"}]) is None
    assert "loaded, but not the command /help" in commands.describe(state)


def test_aStuckReadIsNotWaitedForLong(place: dict[str, Path]) -> None:
    """A file system that does not answer costs a turn at most SCAN_WAIT: it goes on with the
    skills it had (none here), and the read's late answer is not lost for the next turn."""
    makeSkill(place["user"], "deploy")
    release = threading.Event()

    class StuckLibrary(SkillLibrary):
        def catalog(self, cwd: str) -> Catalog:
            release.wait(10)
            return super().catalog(cwd)

    reactor, updates = ThreadReactor(), SentUpdates()
    commands = SkillCommands(StuckLibrary(str(place["user"])), reactor, updates, [])
    state = SessionState("s", str(place["cwd"]), announced=True)
    results: list[Any] = []
    Deferred.fromCoroutine(commands.refresh(state)).addBoth(results.append)
    reactor.advance(SCAN_WAIT)
    assert results == [None] and updates.sent == []
    release.set()
    reactor.runOne()  # the late read ends
    assert [s.name for s in refreshed(reactor, commands, state).skills] == ["deploy"]


def test_commandsAreBounded(place: dict[str, Path]) -> None:
    for name in ("alpha", "beta", "gamma"):
        makeSkill(place["user"], name)
    reactor = ThreadReactor()
    commands = SkillCommands(SkillLibrary(str(place["user"]), commandCount=2), reactor, SentUpdates(), [])
    state = SessionState("s", str(place["cwd"]), announced=True)
    catalog = refreshed(reactor, commands, state)
    assert [s.name for s in commands.commandSkills(catalog)] == ["alpha", "beta"]
    assert commands.invoked(catalog, "/gamma", [{"type": "text"}]) is None
    assert "1 skill(s) past the first 2 are not slash commands (HERMES_ACP_SKILL_COMMANDS)" in commands.describe(state)
