"""Reads and writes of secret and protected paths (engine.sensitive, engine.access):
judged by where a path leads, and asking in the modes the safety model says."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hermes_acp.engine.access import EditProposal, PathApprovals
from hermes_acp.engine.sensitive import hiddenPaths, protectedKind, secretKind


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY")
    (home / ".hermes").mkdir()
    (home / ".hermes" / ".env").write_text("HERMES_API_KEY=x")
    (home / ".bashrc").write_text("# rc")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HERMES_HOME", str(home / ".hermes"))
    return home


def test_secretsByPathLinkAndHardLink(home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    assert secretKind(str(home / ".ssh" / "id_ed25519")) == "SSH keys and configuration"
    assert "HERMES_HOME" in secretKind(str(home / ".hermes" / ".env"))
    (work / "notes.txt").symlink_to(home / ".ssh" / "id_ed25519")
    assert secretKind(str(work / "notes.txt")) == "SSH keys and configuration"
    os.link(home / ".ssh" / "id_ed25519", work / "harmless.txt")
    assert secretKind(str(work / "harmless.txt")) == "SSH keys and configuration"
    os.link(home / ".bashrc", work / "rc.txt")
    assert secretKind(str(work / "rc.txt")) is None
    assert protectedKind(str(work / "rc.txt")) == "a shell startup file"
    for name in (".env", ".env.local", "server.pem", "credentials.json"):
        assert secretKind(str(work / name)), name
    assert secretKind(str(work / "main.py")) is None
    assert protectedKind("/etc/hosts") == "system configuration under /etc"
    assert str(home / ".hermes") in hiddenPaths()


def test_pathsTooLongForTheKernelAreJudgedByName(home: Path, tmp_path: Path) -> None:
    """A path no system call takes (PATH_MAX and more, model-chosen text) is judged by its
    name at once (``realpath`` would spend a system call per component), and a secret
    still shows through ``.`` and ``..``."""
    long = str(home / ".ssh") + "/." * 3000 + "/id_ed25519"
    assert secretKind(long) == "SSH keys and configuration"
    script = "s/x/y/;" * 30_000
    started = time.thread_time()
    assert secretKind(script) is None and protectedKind(script) is None
    assert time.thread_time() - started < 1  # it took 6 s of CPU


@pytest.mark.parametrize("mode", ["default", "accept_edits", "dont_ask"])
def test_secretReadsAskInEveryMode(home: Path, tmp_path: Path, mode: str) -> None:
    approvals = PathApprovals.forWorkspace(str(tmp_path), mode=mode)
    asked: list[tuple[str, str]] = []
    verdict = approvals.decideRead(str(home / ".ssh" / "id_ed25519"), lambda p, r: asked.append((p, r)) or "reject_once")
    assert not verdict.allowed and "was not read" in verdict.message
    assert asked and asked[0][1] == "reads SSH keys and configuration"
    assert approvals.decideRead(str(tmp_path / ".env"), lambda p, r: "allow_always").allowed
    assert not approvals.decideRead(str(tmp_path / ".env"), None).allowed  # "always" never covers a secret


@pytest.mark.parametrize(("mode", "asks"), [("default", True), ("accept_edits", True), ("dont_ask", False)])
def test_readsOutsideTheWorkspace(home: Path, tmp_path: Path, mode: str, asks: bool) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "a.txt").write_text("a")
    approvals = PathApprovals(roots=(str(work),), mode=mode)
    assert approvals.decideRead(str(work / "x.py"), None).allowed
    assert approvals.decideRead(str(outside / "a.txt"), None).allowed is not asks
    (work / "link").symlink_to(outside)
    assert approvals.decideRead(str(work / "link" / "a.txt"), None).allowed is not asks


def test_alwaysAllowARead(home: Path, tmp_path: Path) -> None:
    """"Always" allows the folder of the file for the session; "never" refuses the path."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    approvals = PathApprovals(roots=(str(work),))
    assert approvals.decideRead(str(outside / "a.txt"), lambda p, r: "allow_always").allowed
    assert approvals.decideRead(str(outside / "b.txt"), None).allowed
    assert not approvals.decideRead(str(tmp_path / "c.txt"), lambda p, r: "reject_always").allowed
    assert "for the rest of the session" in approvals.decideRead(str(tmp_path / "c.txt"), None).message


def test_dontAskNeverWritesStartupFilesOrEtcSilently(home: Path, tmp_path: Path) -> None:
    approvals = PathApprovals(roots=(str(tmp_path),), mode="dont_ask")
    for path in (home / ".bashrc", home / ".zshrc", Path("/etc/profile.d/x.sh"), home / ".hermes" / ".env"):
        assert not approvals.decide(EditProposal("write_file", str(path), None, "x"), None).allowed, path
    assert approvals.decide(EditProposal("write_file", str(tmp_path / "main.py"), None, "x"), None).allowed


def test_aLinkSwappedInAfterTheCheckIsNotFollowed(tmp_path: Path) -> None:
    """The tools judge the real path; the workspace then opens exactly it, so a
    link put in its place (or above it) since fails instead of leading elsewhere."""
    from hermes_acp.engine.workspace import LocalWorkspace, WorkspaceError

    secret, work = tmp_path / "secret", tmp_path / "work"
    secret.mkdir()
    (secret / "f.txt").write_text("KEY")
    work.mkdir()
    (work / "f.txt").write_text("ok")
    workspace = LocalWorkspace()
    assert workspace.readText(str(work / "f.txt")) == "ok"
    (work / "f.txt").unlink()
    (work / "f.txt").symlink_to(secret / "f.txt")
    with pytest.raises(OSError):
        workspace.readText(str(work / "f.txt"))
    with pytest.raises(OSError):
        workspace.writeText(str(work / "f.txt"), "changed")
    moved = tmp_path / "moved"
    work.rename(moved)
    work.symlink_to(secret)
    with pytest.raises(WorkspaceError, match="changed while it was opened"):
        workspace.readText(str(work / "f.txt"))
    with pytest.raises(WorkspaceError):
        workspace.writeText(str(work / "f.txt"), "changed")
    assert (secret / "f.txt").read_text() == "KEY"
