"""patch: exact and tolerant matching, uniqueness, diffs and failure hints."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_acp.engine.tools.patching import findMatches, replaceMatches

SOURCE = """\
def greet(name):
    if name:
        print("hello", name)
    return name


def other():
    return 1
"""


def patched(content: str, old: str, new: str) -> tuple[str | None, str]:
    strategy, matches = findMatches(content, old, new)
    return strategy, replaceMatches(content, matches)


def test_exact() -> None:
    strategy, result = patched(SOURCE, 'print("hello", name)', 'print("hi", name)')
    assert strategy == "exact"
    assert result == SOURCE.replace('"hello"', '"hi"')


def test_trailingWhitespaceIgnored() -> None:
    strategy, result = patched(SOURCE, "    if name:   \n        print(\"hello\", name)", "    if name:\n        pass")
    assert strategy == "trailing_whitespace"
    assert "        pass\n    return name" in result


def test_indentationFlexibleReindentsTheReplacement() -> None:
    """A snippet quoted without its indentation still matches; the new text gets the file's indentation."""
    old = 'if name:\n    print("hello", name)'
    new = 'if name:\n    print("hello", name)\n    log(name)'
    strategy, result = patched(SOURCE, old, new)
    assert strategy == "indentation_flexible"
    assert '    if name:\n        print("hello", name)\n        log(name)\n    return name' in result


def test_whitespaceRunsNormalized() -> None:
    strategy, result = patched(SOURCE, 'print("hello",    name)', 'print("bye", name)')
    assert strategy == "whitespace_normalized"
    assert '        print("bye", name)\n' in result


def test_escapedNewlinesNormalized() -> None:
    """A model that double-escaped its newlines still gets its edit."""
    strategy, result = patched(SOURCE, "def other():\\n    return 1", "def other():\\n    return 2")
    assert strategy == "escape_normalized"
    assert result.endswith("def other():\n    return 2\n")


def test_typographicQuotesNormalized() -> None:
    strategy, result = patched(SOURCE, "print(\u201chello\u201d, name)", 'print("hey", name)')
    assert strategy == "unicode_normalized"
    assert 'print("hey", name)' in result


def test_blockAnchorTakesASimilarMiddle() -> None:
    old = 'def greet(name):\n    if name:\n        print("helo", nme)\n    return name'
    new = "def greet(name):\n    return name.upper()"
    strategy, result = patched(SOURCE, old, new)
    assert strategy == "block_anchor"
    assert result.startswith("def greet(name):\n    return name.upper()\n\n\ndef other")


def test_deletingLinesTakesTheLineBreak() -> None:
    _, result = patched("a\n  b\nc\n", "b", "")
    assert result == "a\n  \nc\n"  # exact: only the text
    strategy, result = patched("a\n  b  \nc\n", "b\n", "")
    assert strategy == "line_trimmed"
    assert result == "a\nc\n"


def test_noMatch() -> None:
    assert findMatches(SOURCE, "class Missing:\n    pass", "x") == (None, [])


def test_patchToolWritesAndReturnsADiff(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    (tmp_path / "m.py").write_text(SOURCE)
    outcome = bench.call("patch", path="m.py", old_string="return 1", new_string="return 42")
    assert not outcome.failed, outcome.text
    assert (tmp_path / "m.py").read_text() == SOURCE.replace("return 1", "return 42")
    assert outcome.text.startswith("Patched m.py (1 replacement(s)).\n--- a/m.py\n+++ b/m.py\n")
    assert "-    return 1\n+    return 42\n" in outcome.extras["diff"]
    assert outcome.extras["oldText"] == SOURCE and outcome.extras["path"] == str(tmp_path / "m.py")


def test_patchNamesTheToleranceUsed(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    (tmp_path / "m.py").write_text(SOURCE)
    outcome = bench.call("patch", path="m.py", old_string="return   1", new_string="return 2")
    assert "matched whitespace normalized" in outcome.text


def test_patchNeedsAUniqueMatch(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    (tmp_path / "dup.txt").write_text("x = 1\ny = 2\nx = 1\n")
    outcome = bench.call("patch", path="dup.txt", old_string="x = 1", new_string="x = 3")
    assert outcome.failed
    assert "matches 2 places in dup.txt (lines 1, 3)" in outcome.text
    assert (tmp_path / "dup.txt").read_text() == "x = 1\ny = 2\nx = 1\n"
    outcome = bench.call("patch", path="dup.txt", old_string="x = 1", new_string="x = 3", replace_all=True)
    assert "2 replacement(s)" in outcome.text
    assert (tmp_path / "dup.txt").read_text() == "x = 3\ny = 2\nx = 3\n"


def test_patchFailureShowsTheClosestSections(bench, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SOURCE)
    outcome = bench.call("patch", path="m.py", old_string="def greeting(nom):\n    if nom:", new_string="x")
    assert outcome.failed
    assert "old_string not found in m.py" in outcome.text
    assert "Did you mean one of these sections?" in outcome.text
    assert "lines 1-2" in outcome.text and "     1|def greet(name):" in outcome.text


def test_patchPreservesCRLF(bench, tmp_path: Path) -> None:
    bench.agent.setEditMode("accept_edits")
    (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    outcome = bench.call("patch", path="w.txt", old_string="two\nthree", new_string="2\n3")
    assert not outcome.failed, outcome.text
    assert (tmp_path / "w.txt").read_bytes() == b"one\r\n2\r\n3\r\n"


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"path": "m.py", "old_string": "", "new_string": "x"}, "old_string is empty"),
        ({"path": "m.py", "old_string": "a", "new_string": "a"}, "identical"),
        ({"path": "nope.py", "old_string": "a", "new_string": "b"}, "use write_file to create it"),
        ({"path": "m.py", "old_string": "a"}, "missing required argument(s) for patch: new_string"),
    ],
)
def test_patchBadArguments(bench, tmp_path: Path, arguments: dict, words: str) -> None:
    (tmp_path / "m.py").write_text(SOURCE)
    outcome = bench.call("patch", **arguments)
    assert outcome.failed and words in outcome.text


def test_deniedPatchLeavesTheFile(bench, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SOURCE)
    bench.observer.editAnswer = "reject_once"
    outcome = bench.call("patch", path="m.py", old_string="return 1", new_string="return 2")
    seen = [proposal for _, proposal in bench.observer.edits]
    assert outcome.failed and "was not modified" in outcome.text
    assert (tmp_path / "m.py").read_text() == SOURCE
    assert seen[0].toolName == "patch" and seen[0].newText == SOURCE.replace("return 1", "return 2")
