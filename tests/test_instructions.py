"""Project instructions (``engine.instructions``): which files, in which order, how much."""

from __future__ import annotations

from pathlib import Path

from hermes_acp.engine import instructions
from hermes_acp.engine.instructions import projectInstructions


def test_fromTheRepositoryRootDown(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "AGENTS.md").write_text("root rules")
    (tmp_path / "a" / "HERMES.md").write_text("a rules")
    (deep / "AGENTS.md").write_text("b rules")
    (deep / "CLAUDE.md").write_text("   \n")  # empty: not used
    found = projectInstructions(str(deep))
    assert found.files == (str(tmp_path / "AGENTS.md"), str(tmp_path / "a" / "HERMES.md"), str(deep / "AGENTS.md"))
    assert found.text.index("root rules") < found.text.index("a rules") < found.text.index("b rules")


def test_withoutARepositoryOnlyTheFolder(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("above")
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "AGENTS.md").write_text("here")
    assert projectInstructions(str(tmp_path / "here")).files == (str(tmp_path / "here" / "AGENTS.md"),)


def test_sizeCapsAndLinksLeftOut(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(instructions, "FILE_LIMIT", 100)
    monkeypatch.setattr(instructions, "TOTAL_LIMIT", 150)
    (tmp_path / ".git").mkdir()
    (tmp_path / "AGENTS.md").write_text("x" * 500)
    (tmp_path / "HERMES.md").write_text("y" * 500)
    (tmp_path / "CLAUDE.md").symlink_to("/etc/hostname")
    found = projectInstructions(str(tmp_path))
    assert found.files == (str(tmp_path / "AGENTS.md"), str(tmp_path / "HERMES.md"))
    assert "x" * 100 in found.text and "x" * 101 not in found.text and "cut" in found.text
    assert found.text.count("y") <= 50


def test_nothingFound(tmp_path: Path) -> None:
    assert projectInstructions(str(tmp_path)) == instructions.Instructions()
