"""The checkpoint store and rewinds of it (``engine.checkpoints``, ``engine.restore``,
``engine.ignore``), on real folders."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from hermes_acp.engine import restore
from hermes_acp.engine.checkpoints import HUGE, IGNORED, CheckpointStore, Limits, TurnCheckpoint
from hermes_acp.engine.ignore import IgnoreRules

BINARY = bytes(range(256)) * 40


def tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Everything under ``root``: path -> (kind, mode, content or link target)."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder) / name
            relative = str(path.relative_to(root))
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("l", 0, os.readlink(path).encode())
            elif stat.S_ISDIR(info.st_mode):
                found[relative] = ("d", stat.S_IMODE(info.st_mode), b"")
            else:
                found[relative] = ("f", stat.S_IMODE(info.st_mode), path.read_bytes())
    return found


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "logo.bin").write_bytes(BINARY)
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "doomed.txt").write_text("delete me\n")
    (root / "link").symlink_to("src/app.py")
    (root / ".gitignore").write_text("build/\n*.log\n")
    return root


def store(tmp_path: Path, **limits: int) -> CheckpointStore:
    return CheckpointStore(tmp_path / "home" / "checkpoints", Limits(**limits))


def turn(checkpoints: CheckpointStore, number: int, root: Path, change) -> None:
    """One turn: its checkpoint before the change, what it changed after."""
    checkpoint = TurnCheckpoint(checkpoints, "s1", number, (str(root),))
    checkpoint.beforeChange()
    checkpoint.beforeChange()  # once a turn
    change()
    checkpoint.finish()


def agentTurns(root: Path) -> list:
    def two():
        (root / "src" / "app.py").write_text("print('changed')\n")
        (root / "logo.bin").write_bytes(BINARY[::-1])
        (root / "run.sh").chmod(0o644)
        (root / "new.txt").write_text("created\n")

    def three():
        (root / "doomed.txt").unlink()
        (root / "link").unlink()
        (root / "link").symlink_to("elsewhere")
        (root / "deep" / "er").mkdir(parents=True)
        (root / "deep" / "er" / "x.txt").write_text("x")

    def four():
        (root / "build" / "out").mkdir(parents=True)
        (root / "build" / "out" / "a.o").write_bytes(b"\0" * 100)
        (root / "debug.log").write_text("noise")

    return [two, three, four]


def test_rewindPutsTheFolderBackByteForByte(tmp_path, project) -> None:
    """Writes, binary content, a mode, a deletion, a swapped link, new folders, an ignored
    build folder and log the turns created: all back as they were before turn 2."""
    checkpoints = store(tmp_path)
    before = tree(project)
    for number, change in enumerate(agentTurns(project), 2):
        turn(checkpoints, number, project, change)
    assert tree(project) != before
    plan = restore.plan(checkpoints, "s1", [2, 3, 4])
    assert plan.conflicts == []
    assert restore.apply(checkpoints, plan, overwrite=False) == []
    assert tree(project) == before


def test_rewindSurvivesARestart(tmp_path, project) -> None:
    """A new store on the same folder (a new process) reads the checkpoints and restores."""
    before = tree(project)
    for number, change in enumerate(agentTurns(project), 2):
        turn(store(tmp_path), number, project, change)
    again = store(tmp_path)
    assert again.turns("s1") == [2, 3, 4]
    assert restore.apply(again, restore.plan(again, "s1", [2, 3, 4]), overwrite=False) == []
    assert tree(project) == before


def test_userEditsAreConflictsAndKeptUnlessOverwritten(tmp_path, project) -> None:
    """A file the user changed after the agent (and one the user created, never the agent's)
    is not put back silently: a conflict, kept unless the rewind overwrites."""
    checkpoints = store(tmp_path)
    before = tree(project)
    for number, change in enumerate(agentTurns(project), 2):
        turn(checkpoints, number, project, change)
    (project / "src" / "app.py").write_text("the user's own edit\n")
    (project / "mine.txt").write_text("never the agent's\n")
    plan = restore.plan(checkpoints, "s1", [2, 3, 4])
    assert [c.path for c in plan.conflicts] == ["src/app.py"]
    restore.apply(checkpoints, plan, overwrite=False)
    assert (project / "src" / "app.py").read_text() == "the user's own edit\n"
    assert (project / "mine.txt").exists()
    assert (project / "logo.bin").read_bytes() == BINARY
    plan = restore.plan(checkpoints, "s1", [2, 3, 4])
    restore.apply(checkpoints, plan, overwrite=True)
    after = tree(project)
    assert after.pop("mine.txt")[2] == b"never the agent's\n"
    assert after == before


def test_anotherSessionsTurnInTheFolderIsAskedAboutOnlyWhenItOverlapped(tmp_path, project) -> None:
    """A turn of session B that ran before A's turn is not A's concern: A's rewind puts
    back the file both changed without a question. One that ran while A's turn did may
    have made A's recorded changes: those are conflicts, whatever the disk holds."""
    checkpoints = store(tmp_path)
    other = TurnCheckpoint(checkpoints, "s2", 1, (str(project),))
    other.beforeChange()
    (project / "src" / "app.py").write_text("B's version\n")
    other.finish()
    turn(checkpoints, 2, project, lambda: (project / "src" / "app.py").write_text("A's version\n"))
    plan = restore.plan(checkpoints, "s1", [2])
    assert [c.path for c in plan.restore] == ["src/app.py"] and plan.conflicts == []

    def meanwhile() -> None:
        (project / "run.sh").write_text("A's\n")
        other = TurnCheckpoint(checkpoints, "s2", 2, (str(project),))
        other.beforeChange()
        (project / "theirs.txt").write_text("B's\n")
        other.finish()

    turn(checkpoints, 3, project, meanwhile)
    plan = restore.plan(checkpoints, "s1", [3])
    assert [c.path for c in plan.restore] == ["run.sh"]
    assert [c.path for c in plan.conflicts] == ["theirs.txt"]
    assert "another session" in plan.conflicts[0].conflict()
    restore.apply(checkpoints, plan, overwrite=False)
    assert (project / "theirs.txt").read_text() == "B's\n"


def test_aFolderTheTurnReplacedWithAFileComesBackWithoutAQuestion(tmp_path, project) -> None:
    """A turn that removed a folder and made a file of its name (and the reverse): the rewind
    puts both back as they were, asking nothing (no one else touched them)."""
    checkpoints = store(tmp_path)
    before = tree(project)

    def swap() -> None:
        (project / "src" / "app.py").unlink()
        (project / "src").rmdir()
        (project / "src").write_text("now a file\n")
        (project / "doomed.txt").unlink()
        (project / "doomed.txt").mkdir()
        (project / "doomed.txt" / "inner").write_text("x")

    turn(checkpoints, 2, project, swap)
    plan = restore.plan(checkpoints, "s1", [2])
    assert plan.conflicts == []
    assert restore.apply(checkpoints, plan, overwrite=False) == []
    assert tree(project) == before


def test_onlyTheLaterTurnsAreUndone(tmp_path, project) -> None:
    """Undoing turn 4 alone leaves turns 2 and 3's changes."""
    checkpoints = store(tmp_path)
    for number, change in enumerate(agentTurns(project), 2):
        turn(checkpoints, number, project, change)
    restore.apply(checkpoints, restore.plan(checkpoints, "s1", [4]), overwrite=False)
    assert not (project / "build").exists() and not (project / "debug.log").exists()
    assert (project / "deep" / "er" / "x.txt").exists()
    assert (project / "src" / "app.py").read_text() == "print('changed')\n"


def test_unchangedFilesAreNotReadAgain(tmp_path, project, monkeypatch) -> None:
    """A second checkpoint keeps the hashes of files whose size, times and inode are unchanged."""
    checkpoints = store(tmp_path)
    turn(checkpoints, 1, project, lambda: None)
    read = []
    original = checkpoints.put
    monkeypatch.setattr(checkpoints, "put", lambda data: (read.append(data), original(data))[1])
    turn(checkpoints, 2, project, lambda: (project / "new.txt").write_text("only this\n"))
    assert read == [b"only this\n"]
    # A new process finds the last walk through the newest checkpoint: it too reads only what changed.
    again = store(tmp_path)
    opened = []
    monkeypatch.setattr("hermes_acp.engine.checkpoints.readFile", lambda path, limit: opened.append(path) or b"")
    turn(again, 3, project, lambda: None)
    assert opened == []
    # ... also when a rewind took back the turn that walked last: the newest one left serves.
    again.removeTurns("s1", [3])
    turn(store(tmp_path), 4, project, lambda: None)
    assert opened == []


def test_ignoredHugeAndNotedPaths(tmp_path, project) -> None:
    """.gitignore rules (nested ones too) and tool folders are recorded as present only; a file
    over the bound by its size; both said in the notes."""
    (project / "node_modules" / "x").mkdir(parents=True)
    (project / "src" / ".gitignore").write_text("*.tmp\n!keep.tmp\n")
    (project / "src" / "a.tmp").write_text("t")
    (project / "src" / "keep.tmp").write_text("k")
    (project / "big.dat").write_bytes(b"b" * 5000)
    checkpoints = store(tmp_path, fileMax=4096)
    manifest = checkpoints.record("s1", 1, [str(project)])
    entries = manifest["roots"][str(project.resolve())]
    assert entries["node_modules"] == [IGNORED] and entries["src/a.tmp"] == [IGNORED]
    assert entries["src/keep.tmp"][0] == "f" and entries["big.dat"][0] == HUGE
    assert "node_modules/x" not in entries
    assert any("ignored" in note for note in manifest["notes"])
    assert any("over 4,096 bytes" in note for note in manifest["notes"])


def test_aGitignoreChangeDeletesNothing(tmp_path, project) -> None:
    """A turn that makes src/ ignored must not make its files look deleted or created (the
    Cline bug: a restore that deleted untracked files)."""
    checkpoints = store(tmp_path)
    turn(checkpoints, 1, project, lambda: (project / ".gitignore").write_text("src/\n"))
    plan = restore.plan(checkpoints, "s1", [1])
    assert [c.path for c in plan.restore] == [".gitignore"]
    restore.apply(checkpoints, plan, overwrite=False)
    assert (project / "src" / "app.py").read_text() == "print('hello')\n"


def test_pruneDropsTheOldestAndUnusedCopies(tmp_path, project) -> None:
    """Past the store's bound the oldest turns' checkpoints go, with the copies only they
    named; the newest stays; a session's removal takes its checkpoints and copies."""
    checkpoints = store(tmp_path, storeMax=60_000)
    for number in range(1, 8):
        turn(checkpoints, number, project,
             lambda n=number: (project / "grow.bin").write_bytes(os.urandom(8000 + n)))
    kept = checkpoints.turns("s1")
    assert kept[-1] == 7 and kept[0] > 1 and checkpoints.pruned("s1", 1)
    assert checkpoints.used() <= 60_000
    objects = sum(len(files) for _, _, files in os.walk(checkpoints.folder / "objects"))
    checkpoints.removeSession("s1")
    assert checkpoints.turns("s1") == []
    assert sum(len(files) for _, _, files in os.walk(checkpoints.folder / "objects")) == 0 < objects


def test_tooManyFilesIsSaid(tmp_path, project) -> None:
    manifest = store(tmp_path, maxFiles=3).record("s1", 1, [str(project)])
    assert manifest["roots"][str(project.resolve())] is None
    assert "HERMES_ACP_CHECKPOINT_MAX_FILES" in manifest["notes"][0]


@pytest.mark.parametrize(("rules", "path", "folder", "ignored"), [
    ("build/", "build", True, True),
    ("build/", "build", False, False),
    ("*.log", "a/b/c.log", False, True),
    ("/top.txt", "top.txt", False, True),
    ("/top.txt", "a/top.txt", False, False),
    ("docs/**/*.md", "docs/x/y/z.md", False, True),
    ("**/cache", "a/cache", True, True),
    ("*.log\n!keep.log", "keep.log", False, False),
    ("# comment\n\n", "x", False, False),
    ("a/b", "a/b", False, True),
    ("a/b", "c/a/b", False, False),
])
def test_gitignoreRules(rules, path, folder, ignored) -> None:
    assert IgnoreRules().below(rules, "").ignored(path, path.rsplit("/", 1)[-1], folder) is ignored


def test_nestedRulesApplyBelowTheirFolder() -> None:
    rules = IgnoreRules().below("*.tmp", "src")
    assert rules.ignored("src/a.tmp", "a.tmp", False)
    assert not rules.ignored("a.tmp", "a.tmp", False)


def test_checkSaysWhetherCheckpointsWork(tmp_path) -> None:
    """``hermes-acp --check`` says whether turns are checkpointed, where, and that git is not needed."""
    from hermes_acp.check import checkpointSummary
    from hermes_acp.config import Settings

    assert "git not needed" in checkpointSummary(Settings(), tmp_path)
    assert checkpointSummary(Settings(checkpoints=False), tmp_path).startswith("off (HERMES_ACP_CHECKPOINTS=off)")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root writes anywhere
        assert checkpointSummary(Settings(), locked).startswith("not working")


def test_aLinkSwappedInForAFolderLeadsNoRestoreOutside(tmp_path, project) -> None:
    """A parent folder replaced by a link to elsewhere since: the file is not written there."""
    checkpoints = store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    turn(checkpoints, 1, project, lambda: (project / "src" / "app.py").unlink())
    os.rename(project / "src", tmp_path / "src-moved")
    (project / "src").symlink_to(outside)
    plan = restore.plan(checkpoints, "s1", [1])
    problems = restore.apply(checkpoints, plan, overwrite=True)
    assert problems and "outside" in problems[0]
    assert list(outside.iterdir()) == []


def test_aFileChangedAfterThePlanIsLeftAlone(tmp_path, project) -> None:
    """What changes between the plan and its application (while the user is asked) is not overwritten."""
    checkpoints = store(tmp_path)
    turn(checkpoints, 1, project, lambda: (project / "src" / "app.py").write_text("agent\n"))
    plan = restore.plan(checkpoints, "s1", [1])
    (project / "src" / "app.py").write_text("typed meanwhile\n")
    problems = restore.apply(checkpoints, plan, overwrite=False)
    assert problems == ["src/app.py: changed again since the rewind looked at it, left as it is"]
    assert (project / "src" / "app.py").read_text() == "typed meanwhile\n"


def test_aFifoAtTheOldTemporaryNameDoesNotBlockARewind(tmp_path, project) -> None:
    """Something (a command of the model's) left a FIFO where a restore used to write its
    temporary copy: the rewind still finishes, and the FIFO is not touched."""
    checkpoints = store(tmp_path)
    turn(checkpoints, 2, project, lambda: (project / "run.sh").write_text("changed\n"))
    fifo = project / "run.sh.hermes-rewind.tmp"
    os.mkfifo(fifo)
    plan = restore.plan(checkpoints, "s1", [2])
    done: list[list[str]] = []
    worker = threading.Thread(target=lambda: done.append(restore.apply(checkpoints, plan, overwrite=False)),
                              daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked opening the FIFO: a reader lets it go, then the test fails
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        worker.join(10)
    assert done == [[]] and not worker.is_alive()
    assert (project / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_anotherSessionInASubfolderCountsToo(tmp_path, project) -> None:
    """Session B works in a folder inside A's: what B's turn changed while A's ran is a
    conflict of A's rewind too."""
    checkpoints = store(tmp_path)

    def meanwhile() -> None:
        (project / "run.sh").write_text("A's\n")
        other = TurnCheckpoint(checkpoints, "s2", 1, (str(project / "src"),))
        other.beforeChange()
        (project / "src" / "theirs.txt").write_text("B's\n")
        other.finish()

    turn(checkpoints, 2, project, meanwhile)
    plan = restore.plan(checkpoints, "s1", [2])
    assert [c.path for c in plan.restore] == ["run.sh"]
    assert [c.path for c in plan.conflicts] == ["src/theirs.txt"]


def test_aFileTheTurnMadeAFolderOfIsNotPutBackOverTheUsersFiles(tmp_path, project) -> None:
    """A turn replaced a file with a folder, and the user then put a file of theirs in it:
    the rewind removes the turn's files but not the user's, says why the file is not back,
    and puts it back once the folder is the turn's alone."""
    checkpoints = store(tmp_path)

    def swap() -> None:
        (project / "doomed.txt").unlink()
        (project / "doomed.txt" / "sub").mkdir(parents=True)
        (project / "doomed.txt" / "sub" / "agent.txt").write_text("agent\n")

    turn(checkpoints, 2, project, swap)
    (project / "doomed.txt" / "mine.txt").write_text("the user's\n")
    plan = restore.plan(checkpoints, "s1", [2])
    problems = restore.apply(checkpoints, plan, overwrite=False)
    assert (project / "doomed.txt" / "mine.txt").read_text() == "the user's\n"
    assert not (project / "doomed.txt" / "sub" / "agent.txt").exists()
    assert len(problems) == 1 and problems[0].startswith("doomed.txt: not restored")
    (project / "doomed.txt" / "mine.txt").unlink()
    restore.apply(checkpoints, restore.plan(checkpoints, "s1", [2]), overwrite=False)
    assert (project / "doomed.txt").read_text() == "delete me\n"


def test_filesATurnChangedAndHidHaveTheirCopiesBack(tmp_path, project) -> None:
    """A turn that rewrites files and makes them ignored (a new .gitignore rule, for the file or
    its folder): their copies from before were kept, so the rewind offers them back (asking,
    since what the turn left there is not known), and puts them back when told to."""
    (project / ".env").write_text("TOKEN=the user's\n")
    (project / "conf").mkdir()
    (project / "conf" / "key.txt").write_text("the user's key\n")
    (project / "debug.txt").write_text("untouched\n")
    checkpoints = store(tmp_path)
    before = tree(project)

    def hide() -> None:
        (project / ".gitignore").write_text("build/\n*.log\n.env\nconf/\ndebug.txt\n")
        (project / ".env").write_text("TOKEN=\n")
        (project / "conf" / "key.txt").write_text("\n")

    turn(checkpoints, 2, project, hide)
    plan = restore.plan(checkpoints, "s1", [2])
    assert [c.path for c in plan.restore] == [".gitignore"]
    assert sorted(c.path for c in plan.conflicts) == [".env", "conf/key.txt"]
    assert "ignore rules" in plan.conflicts[0].conflict()
    assert restore.apply(checkpoints, plan, overwrite=True) == []
    assert tree(project) == before


def test_aFileATurnMadeHugeComesBack(tmp_path, project) -> None:
    """A turn grew a file past HERMES_ACP_CHECKPOINT_FILE_MAX: its copy from before was kept,
    so the rewind puts it back (unless it changed again since: then it asks)."""
    checkpoints = store(tmp_path, fileMax=4096)
    before = tree(project)
    turn(checkpoints, 2, project, lambda: (project / "run.sh").write_bytes(b"x" * 10000))
    plan = restore.plan(checkpoints, "s1", [2])
    assert [c.path for c in plan.restore] == ["run.sh"] and plan.conflicts == []
    assert restore.apply(checkpoints, plan, overwrite=False) == []
    assert tree(project) == before
    turn(checkpoints, 3, project, lambda: (project / "run.sh").write_bytes(b"x" * 10000))
    (project / "run.sh").write_bytes(b"y" * 20000)
    assert [c.path for c in restore.plan(checkpoints, "s1", [3]).conflicts] == ["run.sh"]
