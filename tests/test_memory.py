"""The memory files (``engine.memory``, ``engine.memoryfiles``): Hermes' format, the limits, the lock and the atomic
write, hand-edited and malformed files, the settings, the secret screen, the tool's arguments
(``engine.tools.memory``) and each mode's decision (``access.PathApprovals.decideMemory``)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_acp.engine.access import EditProposal, PathApprovals
from hermes_acp.engine.approval import REJECT_ALWAYS
from hermes_acp.engine.memory import MemorySettings, MemoryStore, Operation, memorySettings
from hermes_acp.engine.memoryfiles import DELIMITER, parseEntries, writeAtomically
from hermes_acp.engine.secrets import secretLike


def allow(path: Path, old: str, new: str) -> None:
    return None


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    return tmp_path


def store(home: Path, **settings: object) -> MemoryStore:
    return MemoryStore(home / "memories", MemorySettings(**settings), secrets=lambda: [])


def add(memory: MemoryStore, content: str, target: str = "memory") -> dict:
    return memory.change(target, [Operation("add", content)], allow).reply


def test_filesAreHermesFormat(home: Path) -> None:
    """Entries joined by a line holding only §, no final newline, the folder and files private;
    Hermes' own file (a final newline) reads back the same."""
    memory = store(home)
    add(memory, "first")
    add(memory, "second\nwith two lines")
    path = home / "memories" / "MEMORY.md"
    assert path.read_text() == "first\n§\nsecond\nwith two lines"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    path.write_text("first\n§\nsecond\nwith two lines\n")
    assert memory.read("memory").entries == ("first", "second\nwith two lines")


def test_handEditsAreReadLeniently() -> None:
    assert parseEntries("a\r\n§\r\n\r\n§\n  b  \n§\na\n§\n") == ["a", "b"]
    assert parseEntries("a § b\n§c") == ["a § b\n§c"]  # only a line holding § alone separates


def test_addReplaceRemoveAndTheirRefusals(home: Path) -> None:
    memory = store(home)
    assert add(memory, "uses pytest")["message"] == "Entry added."
    assert add(memory, "uses pytest")["message"] == "Entry already exists (no duplicate added)."
    add(memory, "uses ruff")
    ambiguous = memory.change("memory", [Operation("remove", oldText="uses")], allow).reply
    assert ambiguous["success"] is False and ambiguous["matches"] == ["uses pytest", "uses ruff"]
    missing = memory.change("memory", [Operation("replace", "x", "nothing")], allow).reply
    assert missing["current_entries"] == ["uses pytest", "uses ruff"] and missing["usage"] == "23/2,200"
    replaced = memory.change("memory", [Operation("replace", "uses pytest -q", "pytest")], allow).reply
    assert replaced["message"] == "Entry replaced." and replaced["entry_count"] == 2
    memory.change("memory", [Operation("remove", oldText="ruff")], allow)
    assert memory.read("memory").entries == ("uses pytest -q",)


def test_aBatchIsAllOrNothingAndTheLimitCountsItsResult(home: Path) -> None:
    memory = store(home, memoryChars=30)
    add(memory, "a" * 20)
    failing = [Operation("add", "new"), Operation("remove", oldText="absent")]
    reply = memory.change("memory", failing, allow).reply
    assert reply["error"].startswith("Operation 2 (remove): No entry matched 'absent'")
    assert memory.read("memory").entries == ("a" * 20,)
    over = add(memory, "b" * 10)
    assert over["error"].startswith("Memory at 20/30 chars. Adding this entry (10 chars) would exceed the limit.")
    swap = memory.change("memory", [Operation("remove", oldText="aaa"), Operation("add", "b" * 25)], allow).reply
    assert swap["success"] is True and swap["usage"] == "83% — 25/30 chars"
    assert swap["message"] == "Applied 2 operation(s)."


def test_aFileOverItsLimitByHandCanBeTrimmedNotGrown(home: Path) -> None:
    """The prompt shows it cut and marked over budget; adding is refused, shrinking is not."""
    memory = store(home, memoryChars=100)
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_text(DELIMITER.join(["x" * 150, "y" * 150]))
    assert add(memory, "z")["success"] is False
    shorter = memory.change("memory", [Operation("replace", "x" * 10, "x" * 150)], allow).reply
    assert shorter["success"] is True  # still over, but smaller
    snapshot = store(home, memoryChars=1000).snapshot()
    assert "⚠ OVER BUDGET" not in snapshot
    (home / "memories" / "MEMORY.md").write_text("w" * 9000)
    cut = store(home, memoryChars=1000).snapshot()
    assert "MEMORY (your personal notes) [100% — 9,000/1,000 chars ⚠ OVER BUDGET]" in cut
    assert "chars cut: memory is over its limit (9,000/1,000)" in cut and len(cut) < 4300
    tiny = store(home, memoryChars=10)  # read up to 64 bytes a character of the limit: 640
    assert tiny.read("memory").problem.startswith("it is over 640 bytes")
    assert add(tiny, "z")["success"] is False


def test_malformedFilesAreShownToNobodyAndNeverRewritten(home: Path) -> None:
    memories = home / "memories"
    memories.mkdir()
    (memories / "USER.md").write_bytes(b"Name: Bob\n\xff broken")
    memory = store(home)
    reply = add(memory, "likes tea", "user")
    assert reply["success"] is False and "it is not UTF-8 text" in reply["error"]
    assert (memories / "USER.md").read_bytes() == b"Name: Bob\n\xff broken"
    assert "USER.md needs the user's attention: it is not UTF-8 text" in memory.snapshot()
    (home / ".env").write_text("OPENAI_API_KEY=sk-secret-value-0123456789abcdef\n")
    (memories / "MEMORY.md").symlink_to(home / ".env")
    file = memory.read("memory")
    assert file.entries == () and file.problem.startswith("it is a link to the agent's own settings")
    assert "sk-secret" not in memory.snapshot() and add(memory, "x")["success"] is False
    (memories / "MEMORY.md").unlink()
    os.mkfifo(memories / "MEMORY.md")  # a reader that would block for ever
    assert memory.read("memory").problem == "it is not a regular file"
    (memories / "MEMORY.md").unlink()
    (memories / "MEMORY.md").mkdir()  # not an error that stops every session's start
    assert memory.read("memory").problem == "it is not a regular file"
    assert "MEMORY.md needs the user's attention: it is not a regular file" in memory.snapshot()
    assert add(memory, "x")["success"] is False and (memories / "MEMORY.md").is_dir()


def test_aLinkToTheUsersOwnFileStaysALink(home: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    dotfiles = tmp_path_factory.mktemp("dotfiles")
    (dotfiles / "MEMORY.md").write_text("kept in dotfiles")
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").symlink_to(dotfiles / "MEMORY.md")
    add(store(home), "added")
    assert (home / "memories" / "MEMORY.md").is_symlink()
    assert (dotfiles / "MEMORY.md").read_text() == "kept in dotfiles\n§\nadded"


def test_aHermesHomeReachedThroughALinkWorks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "link"))
    memory = store(tmp_path / "link")
    assert add(memory, "first")["success"] is True and add(memory, "second")["success"] is True
    assert memory.read("memory").problem is None and "first\n§\nsecond" in memory.snapshot()


def test_writesAreAtomic(tmp_path: Path) -> None:
    """A write that fails leaves the old file whole and no temporary file behind."""
    path = tmp_path / "MEMORY.md"
    writeAtomically(path, "old")
    with pytest.raises(UnicodeEncodeError):
        writeAtomically(path, "new \ud800")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["MEMORY.md"]


def test_aLockedFileWaitsThenGivesUp(home: Path) -> None:
    """Another holder of Hermes' lock file (another agent, Hermes) makes a write wait; past the
    bound it fails with a message and changes nothing; once released, writes go through."""
    memory = store(home, lockSeconds=0.3)
    add(memory, "first")
    holder = os.open(home / "memories" / "MEMORY.md.lock", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        reply = add(memory, "second")
        assert reply == {"success": False, "error": "MEMORY.md stayed locked by another process (another agent, or "
                                                    "Hermes) for 0.3 s; nothing was changed, try again."}
    finally:
        os.close(holder)
    assert add(memory, "second")["success"] is True
    assert memory.read("memory").entries == ("first", "second")


def test_twoProcessesAddingAtOnceLoseNothing(home: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from hermes_acp.engine.memory import MemorySettings, MemoryStore, Operation\n"
        "memory = MemoryStore(Path(sys.argv[1]), MemorySettings(memoryChars=100000), secrets=lambda: [])\n"
        "for n in range(25):\n"
        "    assert memory.change('memory', [Operation('add', f'{sys.argv[2]} {n}')], lambda *a: None).reply['success']\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", code, str(home / "memories"), name]) for name in ("one", "two")]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    entries = store(home).read("memory").entries
    assert sorted(entries) == sorted(f"{name} {n}" for name in ("one", "two") for n in range(25))


def test_settingsComeFromConfigYamlUnderTheOverrides(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert memorySettings(home) == MemorySettings()
    (home / "config.yaml").write_text("memory:\n  memory_char_limit: 3000\n  user_char_limit: 500\n"
                                      "  user_profile_enabled: false\n")
    assert memorySettings(home) == MemorySettings(user=False, memoryChars=3000, userChars=500)
    assert memorySettings(home, memoryChars=10).memoryChars == 10
    (home / "config.yaml").write_text("memory:\n  memory_char_limit: lots\n")
    assert memorySettings(home).memoryChars == 2200 and "memory.memory_char_limit" in caplog.text
    (home / "config.yaml").write_text("model:\n  since: 2024-02-30\nmemory:\n  user_char_limit: 500\n")
    assert memorySettings(home) == MemorySettings()  # a date YAML cannot build: logged, not a failed session
    assert "day is out of range for month" in caplog.text
    disabled = store(home, user=False)
    assert disabled.settings.targets == ("memory",)
    assert "turned off in config.yaml" in add(disabled, "x", "user")["error"]


def test_theEnvironmentsBoundsAreChecked() -> None:
    from hermes_acp.config import ConfigError, Settings

    settings = Settings.fromEnv({"HERMES_ACP_MEMORY_CHARS": "500", "HERMES_ACP_MEMORY_LOCK_SECONDS": "2.5"})
    assert (settings.memoryChars, settings.userChars, settings.memoryLockSeconds) == (500, None, 2.5)
    with pytest.raises(ConfigError, match="HERMES_ACP_USER_CHARS must be at least 1"):
        Settings.fromEnv({"HERMES_ACP_USER_CHARS": "-3"})
    with pytest.raises(ConfigError, match="HERMES_ACP_MEMORY_LOCK_SECONDS"):
        Settings.fromEnv({"HERMES_ACP_MEMORY_LOCK_SECONDS": "inf"})


@pytest.mark.parametrize(("value", "kind"), [
    ("User prefers tabs over spaces", None),
    ("The key is OPENAI_API_KEY in $HERMES_HOME/.env", None),
    ("commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39", None),
    ("id 123e4567-e89b-12d3-a456-426614174000", None),
    ("lives in /home/Alice/Projects2024/SomeLongModuleName/src/Main.java", None),
    ("uses the 1Password password manager; token: see `gh auth token`", None),
    ("see https://github.com/NousResearch/hermes-agent", None),
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx1234", "an API key (sk-...)"),
    ("ghp_0123456789abcdefghijABCDEFGHIJ0123456789", "a GitHub token"),
    ("AKIAIOSFODNN7EXAMPLE", "an AWS access key"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "a private key"),
    ("password: hunter2hunter2!", "a password or key written as a value"),
    ("Authorization: Bearer abcdefghijklmnop1234", "a bearer token"),
    ("clone https://bob:s3cretpass@git.example.com/x", "a URL with a password"),
    ("Zx9Qp2Lm7Rt4Vb8Nc1Kd6Hs3Fg5Jw0Ye", "a long random-looking value (a key or token)"),
])
def test_secretsByTheirLook(value: str, kind: str | None) -> None:
    assert secretLike(value) == kind


def test_theSecretScreenTakesTimeInProportionToTheText(home: Path) -> None:
    """A hand-edited MEMORY.md of one long word (140 KB, what is read of it) took the URL shape
    42 s per look (it tried every position as a scheme); a model's long content hung its call.
    Measured after the fix: 0.02 s; 5 s here leaves room for a loaded machine."""
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_text("a" * 140_000)
    started = time.monotonic()
    assert secretLike("a" * 140_000 + " clone https://bob:s3cretpass@git.example.com/x") == "a URL with a password"
    assert "a" * 1000 in store(home).snapshot()
    assert time.monotonic() - started < 5


def test_secretEntriesAreLeftOutOfThePromptAndTheView(home: Path) -> None:
    (home / "memories").mkdir()
    (home / "memories" / "USER.md").write_text("Name: Ada\n§\nbank pin is Quokka-Marble-11\n§\ntoken ghp_" + "x1Y2" * 9)
    memory = MemoryStore(home / "memories", secrets=lambda: ["Quokka-Marble-11"])
    for shown in (memory.snapshot(), memory.describe(None)):
        assert "Name: Ada" in shown and "Quokka" not in shown and "ghp_" not in shown
        assert shown.count("it holds what looks like a secret") == 2
    assert memory.change("user", [Operation("add", "pin Quokka-Marble-11")], allow).failed


def test_toolArgumentsAreChecked(bench, home: Path) -> None:
    bench.agent.memory = store(home)
    bench.agent.setEditMode("accept_edits")
    assert bench.call("memory", target="memory", action="remove").text.startswith(
        "Error: old_text is required for 'remove'")
    assert bench.call("memory", target="memory").text == (
        "Error: give an action (add, replace or remove) or a list of operations")
    assert "unknown field(s): text" in bench.call("memory", target="memory", operations=[{"action": "add", "text": "x"}]).text
    assert "must be one of memory, user" in bench.call("memory", target="notes", action="add", content="x").text
    joinedTwo = bench.call("memory", target="memory", action="add", content="one\n§\ntwo")
    assert "a line holding only § separates entries" in joinedTwo.text and not (home / "memories").exists()
    done = bench.call("memory", target="memory", action="add", content="  padded  ")
    assert json.loads(done.text)["success"] is True and done.extras["newText"] == "padded"
    bench.agent.memory = None
    assert "not available" in bench.call("memory", target="memory", action="add", content="x").text


@pytest.mark.parametrize(("mode", "asked", "allowed"), [
    ("default", True, True), ("accept_edits", False, True), ("dont_ask", False, True), ("plan", False, False),
])
def test_eachModeDecidesAboutMemory(mode: str, asked: bool, allowed: bool) -> None:
    approvals = PathApprovals.forWorkspace("/work/project", mode=mode)
    questions: list[EditProposal] = []
    proposal = EditProposal("memory", "/home/u/.hermes/memories/MEMORY.md", "", "new")
    verdict = approvals.decideMemory(proposal, lambda p: questions.append(p) or "allow_once")
    assert (bool(questions), verdict.allowed) == (asked, allowed)


def test_rejectAlwaysStopsAskingForTheSession() -> None:
    approvals = PathApprovals.forWorkspace("/work/project")
    proposal = EditProposal("memory", "/home/u/.hermes/memories/USER.md", "", "new")
    assert not approvals.decideMemory(proposal, lambda p: REJECT_ALWAYS).allowed
    verdict = approvals.decideMemory(proposal, lambda p: pytest.fail("asked again"))
    assert not verdict.allowed and "for the rest of the session" in verdict.message


def test_theCardsTitleSaysWhatChanges() -> None:
    from hermes_acp.render import Renderer

    title = Renderer("/work").title
    assert title("memory", {"target": "user", "action": "add", "content": "x"}) == "Update memory (user profile): add"
    assert title("memory", {"target": "memory", "operations": [{}, {}]}) == "Update memory (notes): 2 changes"
    assert title("memory", {"operations": 5, "action": "x" * 50}) == f"Update memory (notes): {'x' * 19}…"
