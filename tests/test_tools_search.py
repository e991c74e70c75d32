"""search_files: content and file-name search, with rg and with the Python fallback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hermes_acp.engine.tools import search

BACKENDS = ["python", pytest.param("rg", marks=pytest.mark.skipif(not shutil.which("rg"), reason="rg not installed"))]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(search.shutil, "which", lambda name: None)
    return request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "core.py").write_text("import os\n\ndef load():\n    return os.environ\n")
    (tmp_path / "src" / "util.py").write_text("# helper\ndef load_all():\n    pass\n")
    (tmp_path / "README.md").write_text("Call load() first.\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "secret.py").write_text("def load(): ...\n")
    (tmp_path / "blob.bin").write_bytes(b"load\x00\x01\x02")
    return tmp_path


def run(bench, **arguments) -> dict:
    outcome = bench.call("search_files", **arguments)
    assert not outcome.failed, outcome.text
    result = json.loads(outcome.text)
    assert result == outcome.extras["result"]
    return result


def test_contentMatches(bench, tree: Path, backend: str) -> None:
    """Matches come sorted by path and line, relative to the session folder; hidden and binary files are skipped."""
    result = run(bench, pattern=r"def load")
    assert result == {
        "matches": [
            {"path": "src/pkg/core.py", "line": 3, "text": "def load():"},
            {"path": "src/util.py", "line": 2, "text": "def load_all():"},
        ],
        "total": 2,
    }


def test_fileGlobAndPath(bench, tree: Path, backend: str) -> None:
    assert run(bench, pattern="load", file_glob="*.md")["matches"] == [
        {"path": "README.md", "line": 1, "text": "Call load() first."}
    ]
    assert [m["path"] for m in run(bench, pattern="load", path="src/pkg")["matches"]] == ["src/pkg/core.py"]


def test_contextLines(bench, tree: Path, backend: str) -> None:
    [match] = run(bench, pattern="return os", context=2)["matches"]
    assert match["before"] == ["", "def load():"]
    assert match["after"] == []  # the file ends there: no phantom line after its last newline


def test_contextReadsEachFileOnceAndOnlyAsFarAsNeeded(bench, tmp_path: Path, backend: str) -> None:
    """Context for many hits in a big file: one pass, stopping after the last line it
    needs (a 64 MB file used to be read and split whole for every hit)."""
    big = tmp_path / "big.txt"
    with open(big, "w") as f:
        f.write("needle one\nneedle two\nthree\n")
        f.writelines("filler line\n" for _ in range(200_000))
    result = run(bench, pattern="needle", context=1)
    assert [(m["line"], m["before"], m["after"]) for m in result["matches"]] == [
        (1, [], ["needle two"]), (2, ["needle one"], ["three"])]


def test_limitsOnPagingAndContext(bench, tree: Path) -> None:
    """limit and context have maxima the model is told about."""
    assert "at most 500" in bench.call("search_files", pattern="x", limit=501).text
    assert "at most 20" in bench.call("search_files", pattern="x", context=21).text
    assert "NUL" in bench.call("search_files", pattern="a\0b").text


def test_pagingHint(bench, tree: Path, backend: str) -> None:
    first = run(bench, pattern="load", limit=2)
    assert first["total"] == 3
    assert first["hint"] == "Results truncated. Use offset=2 to see more."
    second = run(bench, pattern="load", limit=2, offset=2)
    assert "hint" not in second
    assert [m["path"] for m in first["matches"] + second["matches"]] == [
        "README.md", "src/pkg/core.py", "src/util.py",
    ]


def test_filesByGlobNewestFirst(bench, tree: Path, backend: str) -> None:
    os.utime(tree / "src" / "util.py", (1_000_000, 1_000_000))
    os.utime(tree / "src" / "pkg" / "core.py", (2_000_000, 2_000_000))
    assert run(bench, pattern="*.py", target="files") == {"files": ["src/pkg/core.py", "src/util.py"], "total": 2}
    assert run(bench, pattern="READ", target="files")["files"] == ["README.md"]


def test_invalidRegex(bench, tree: Path, backend: str) -> None:
    outcome = bench.call("search_files", pattern="(unclosed")
    assert outcome.failed
    assert "unclosed" in outcome.text.lower()


def test_missingPath(bench, tree: Path) -> None:
    outcome = bench.call("search_files", pattern="x", path="nowhere")
    assert outcome.failed and "path not found" in outcome.text


def test_badTarget(bench, tree: Path) -> None:
    outcome = bench.call("search_files", pattern="x", target="symbols")
    assert outcome.failed and "must be one of content, files" in outcome.text


def test_collectionIsBounded(bench, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "COLLECT_LIMIT", 10)
    (tmp_path / "many.txt").write_text("hit\n" * 50)
    result = run(bench, pattern="hit", limit=3)
    assert result["total"] == 10
    assert "stopped counting at 10" in result["note"]


def test_runawayPatternIsStoppedByTheDeadline(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(a+)+$ against a's and a '!' backtracks for ever in Python's re: the search runs
    in a child process, which the deadline kills; the model hears why."""
    monkeypatch.setattr(search.shutil, "which", lambda name: None)
    monkeypatch.setattr(search, "SEARCH_TIMEOUT", 0.5)
    (tmp_path / "trap.txt").write_text("a" * 40 + "!\n")
    result = run(bench, pattern="(a+)+$")
    assert result["matches"] == [] and "stopped after" in result["note"]


def test_cancelKillsTheSearch(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel during a search that would never end stops it within a poll."""
    import threading

    monkeypatch.setattr(search.shutil, "which", lambda name: None)
    (tmp_path / "trap.txt").write_text("a" * 40 + "!\n")
    threading.Timer(0.3, bench.cancelEvent.set).start()
    outcome = bench.call("search_files", pattern="(a+)+$")
    assert outcome.failed and "cancelled" in outcome.text



@pytest.mark.skipif(not shutil.which("rg"), reason="rg not installed")
def test_ripgrepIsBoundedWithinOneBigFile(bench, tmp_path: Path) -> None:
    """rg buffers a file's whole output before printing any of it: a file with
    millions of matches is cut at the collect limit per file, not after minutes."""
    (tmp_path / "huge.txt").write_bytes(b"x\n" * 3_000_000)
    result = run(bench, pattern="x")
    assert result["note"].startswith("stopped counting at 5000")
    assert len(result["matches"]) == 50


def test_matchesInSecretFilesAreLeftOut(bench, tmp_path) -> None:
    """A search shows no line of a key or credentials file (read_file asks for those)."""
    (tmp_path / "app.py").write_text("TOKEN = load()\n")
    (tmp_path / "deploy.pem").write_text("TOKEN-PRIVATE-KEY-MATERIAL\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "credentials.json").write_text('{"TOKEN": "s3cr3t"}\n')
    outcome = bench.call("search_files", pattern="TOKEN", context=5)
    report = json.loads(outcome.text)
    assert [m["path"] for m in report["matches"]] == ["app.py"]
    assert "PRIVATE-KEY" not in outcome.text and "s3cr3t" not in outcome.text
    assert "2 match(es) in 2 secret file(s)" in report["secrets"]
