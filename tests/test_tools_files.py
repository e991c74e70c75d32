"""read_file, write_file and edit approval on a temp workspace."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from hermes_acp.engine.access import EDIT_MODES, EditProposal, PathApprovals, modeAfter
from hermes_acp.engine.sensitive import protectedKind
from hermes_acp.engine.tools import files


def test_readNumberedLines(bench, tmp_path: Path) -> None:
    """Lines come numbered; a relative path starts at the session's folder."""
    (tmp_path / "a.txt").write_text("alpha\nbeta\ngamma\n")
    outcome = bench.call("read_file", path="a.txt")
    assert not outcome.failed
    assert outcome.text == "     1|alpha\n     2|beta\n     3|gamma"
    assert outcome.extras["path"] == str(tmp_path / "a.txt")
    assert outcome.extras["totalLines"] == 3


def test_readPagesWithAHint(bench, tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 101)))
    outcome = bench.call("read_file", path="long.txt", offset=10, limit=5)
    lines = outcome.text.split("\n")
    assert lines[0] == "    10|line 10"
    assert lines[4] == "    14|line 14"
    assert lines[5] == "[Showing lines 10-14 of 100. Use offset=15 to read more.]"
    assert bench.call("read_file", path="long.txt", offset=200).text.startswith("Error: offset 200 is past the end")


def test_readCapsCharactersAtALineBoundary(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_CHARS", 100)
    (tmp_path / "wide.txt").write_text("".join(f"{n:02d}" + "x" * 20 + "\n" for n in range(1, 21)))
    outcome = bench.call("read_file", path="wide.txt")
    body = outcome.text.split("\n")
    assert body[-1].startswith("[Showing lines 1-3 of 20. Use offset=4")
    assert all(len(line) == len("     1|") + 22 for line in body[:-1])


def test_readCutsVeryLongLines(bench, tmp_path: Path) -> None:
    (tmp_path / "min.js").write_text("x" * (files.MAX_LINE_CHARS + 50))
    assert f"[line cut, {files.MAX_LINE_CHARS + 50} chars]" in bench.call("read_file", path="min.js").text


def test_readLimitIsCapped(bench, tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("y\n" * 3000)
    outcome = bench.call("read_file", path="big.txt", limit=5000)
    assert outcome.extras["endLine"] == files.MAX_LIMIT


@pytest.mark.parametrize(
    ("make", "path", "words"),
    [
        (lambda p: (p / "img.png").write_bytes(b"\x89PNG"), "img.png", "named like an image but its content is none"),
        (lambda p: (p / "a.zip").write_bytes(b"PK\x03\x04"), "a.zip", "binary"),
        (lambda p: (p / "data").write_bytes(b"abc\x00def"), "data", "binary"),
        (lambda p: (p / "folder").mkdir(), "folder", "is a directory"),
        (lambda p: None, "/dev/zero", "device"),
        (lambda p: os.mkfifo(p / "pipe"), "pipe", "not a regular file"),
        (lambda p: (p / "readme.md").write_text("x"), "readme.mdd", "Similar names there: readme.md"),
    ],
)
def test_readRefuses(bench, tmp_path: Path, make, path: str, words: str) -> None:
    """Binary files, devices, folders and missing files get a clear error, not a hang."""
    make(tmp_path)
    outcome = bench.call("read_file", path=path)
    assert outcome.failed
    assert words in outcome.text


def test_readEmptyFile(bench, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    assert bench.call("read_file", path="empty").text == "(empty file)"


def test_writeCreatesParents(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    outcome = bench.call("write_file", path="deep/er/new.py", content="print(1)\nprint(2)\n")
    assert not outcome.failed, outcome.text
    assert (tmp_path / "deep/er/new.py").read_text() == "print(1)\nprint(2)\n"
    assert outcome.text == "Created deep/er/new.py (2 lines, 18 bytes)."
    assert outcome.extras == {"path": str(tmp_path / "deep/er/new.py"), "oldText": None,
                              "newText": "print(1)\nprint(2)\n"}


def test_writeReportsTheChange(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    (tmp_path / "f.txt").write_text("a\nb\nc\n")
    outcome = bench.call("write_file", path="f.txt", content="a\nB\nc\nd\n")
    assert outcome.text == "Updated f.txt: +2 -1 lines (8 bytes)."
    assert outcome.extras["oldText"] == "a\nb\nc\n"
    unchanged = bench.call("write_file", path="f.txt", content="a\nB\nc\nd\n")
    assert "nothing changed" in unchanged.text


def test_writeRefusesNumberedContent(bench, tmp_path: Path) -> None:
    """Pasting read_file's output back would corrupt the file."""
    outcome = bench.call("write_file", path="x.py", content="     1|a\n     2|b\n     3|c")
    assert outcome.failed and "line-number" in outcome.text
    assert not (tmp_path / "x.py").exists()


def test_defaultModeAsksWithTheProposal(bench, tmp_path: Path) -> None:
    """In the default mode every edit asks, with the absolute path and both texts."""
    (tmp_path / "f.txt").write_text("old\n")
    bench.observer.editAnswer = "allow_once"
    bench.call("write_file", path="f.txt", content="new\n")
    bench.call("write_file", path="g.txt", content="brand new\n")
    assert [callId for callId, _ in bench.observer.edits] == ["bench.1", "bench.2"]  # each asks under its own call
    assert [proposal for _, proposal in bench.observer.edits] == [
        EditProposal("write_file", str(tmp_path / "f.txt"), "old\n", "new\n"),
        EditProposal("write_file", str(tmp_path / "g.txt"), None, "brand new\n"),
    ]


@pytest.mark.parametrize("answer", ["reject_once", "timeout", "cancelled", "failed", None, "what?"])
def test_deniedEditIsNotWritten(bench, tmp_path: Path, answer) -> None:
    (tmp_path / "f.txt").write_text("keep\n")
    bench.observer.editAnswer = answer
    outcome = bench.call("write_file", path="f.txt", content="lost\n")
    assert outcome.failed
    assert "was not modified" in outcome.text
    assert outcome.extras["denied"] is True
    assert (tmp_path / "f.txt").read_text() == "keep\n"


def test_allowAlwaysLeavesTheModeToItsOwner(bench, tmp_path: Path) -> None:
    """"allow_always" allows the edit; the mode is the session owner's to switch
    (``modeAfter`` says to what), so the engine keeps asking until it is told."""
    bench.observer.editAnswer = "allow_always"
    assert not bench.call("write_file", path="a.txt", content="1").failed
    assert bench.agent.editMode == "default"
    bench.call("write_file", path="b.txt", content="2")
    assert len(bench.observer.edits) == 2
    bench.agent.setEditMode(modeAfter("default", "allow_always"))
    bench.call("write_file", path="c.txt", content="3")
    assert len(bench.observer.edits) == 2 and (tmp_path / "c.txt").read_text() == "3"


def test_modeAfter() -> None:
    """Only "allow_always" in the default mode changes it."""
    assert modeAfter("default", "allow_always") == "accept_edits"
    for mode in EDIT_MODES:
        for answer in ("allow_once", "reject_once", "reject_always", "cancelled", "timeout", "failed"):
            assert modeAfter(mode, answer) == mode
    assert modeAfter("dont_ask", "allow_always") == "dont_ask"


def test_neverRefusesThatPathWithoutAsking(bench, tmp_path: Path) -> None:
    bench.observer.editAnswer = "reject_always"
    bench.call("write_file", path="a.txt", content="1")
    outcome = bench.call("write_file", path="a.txt", content="2")
    assert outcome.failed and "rest of the session" in outcome.text
    assert len(bench.observer.edits) == 1 and not (tmp_path / "a.txt").exists()


def test_acceptEditsStillAsksOutsideTheWorkspace(tmp_path: Path) -> None:
    work = tmp_path / "work"
    approvals = PathApprovals(roots=(str(work),), mode="accept_edits")
    inside = EditProposal("write_file", str(work / "a.txt"), None, "x")
    outside = EditProposal("write_file", str(tmp_path / "elsewhere.txt"), None, "x")
    assert approvals.decide(inside, None).allowed
    assert not approvals.decide(outside, None).allowed
    assert approvals.decide(outside, lambda p: "allow_once").allowed


def test_dontAskAllowsAnywhere(tmp_path: Path) -> None:
    approvals = PathApprovals(roots=(str(tmp_path / "work"),), mode="dont_ask")
    assert approvals.decide(EditProposal("patch", "/somewhere/else.txt", "a", "b"), None).allowed


@pytest.mark.parametrize("name", [".git/config", ".ssh/config", ".env", ".env.production", "id_rsa", "server.pem"])
@pytest.mark.parametrize("mode", ["accept_edits", "dont_ask"])
def test_sensitivePathsAlwaysAsk(tmp_path: Path, name: str, mode: str) -> None:
    approvals = PathApprovals(roots=(str(tmp_path),), mode=mode)
    proposal = EditProposal("write_file", str(tmp_path / name), None, "x")
    assert not approvals.decide(proposal, None).allowed
    assert approvals.decide(proposal, lambda p: "allow_once").allowed


def test_symlinkToSensitiveFileAsks(tmp_path: Path) -> None:
    """A harmless-looking name that links to a key is sensitive: the check resolves first."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("KEY")
    (tmp_path / "notes.txt").symlink_to(tmp_path / ".ssh" / "id_ed25519")
    assert protectedKind(str(tmp_path / "notes.txt"))
    approvals = PathApprovals(roots=(str(tmp_path),), mode="dont_ask")
    assert not approvals.decide(EditProposal("write_file", str(tmp_path / "notes.txt"), "KEY", "x"), None).allowed


def test_symlinkOutOfTheWorkspaceAsks(tmp_path: Path) -> None:
    """accept_edits judges where a symlink really points."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "link.txt").symlink_to(outside / "target.txt")
    approvals = PathApprovals(roots=(str(work),), mode="accept_edits")
    assert not approvals.decide(EditProposal("write_file", str(work / "link.txt"), None, "x"), None).allowed


def test_workspaceIncludesAdditionalDirectories(tmp_path: Path) -> None:
    approvals = PathApprovals.forWorkspace(str(tmp_path / "a"), [str(tmp_path / "b")], mode="accept_edits")
    assert approvals.insideWorkspace(str(tmp_path / "b" / "x.txt"))
    assert approvals.insideWorkspace(os.path.join(tempfile.gettempdir(), "scratch.txt"))
    assert not approvals.insideWorkspace("/usr/local/share/x.txt")


def test_readRefusesHugeFiles(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 10)
    (tmp_path / "big.log").write_text("x" * 11)
    outcome = bench.call("read_file", path="big.log")
    assert outcome.failed and "too large to read" in outcome.text


def test_unknownEditModeIsRejected(bench) -> None:
    with pytest.raises(ValueError):
        bench.agent.setEditMode("yolo")
    assert bench.agent.editMode == "default"


def test_readCountsLinesAsEditorsDo(bench, tmp_path: Path) -> None:
    """Only line breaks start lines: a form feed or CRLF does not shift the numbers."""
    (tmp_path / "odd.txt").write_bytes(b"one\r\ntwo \x0c page\r\nthree")
    assert bench.call("read_file", path="odd.txt").text == "     1|one\n     2|two \x0c page\n     3|three"
