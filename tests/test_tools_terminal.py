"""terminal: process groups, stdin, output caps, timeouts, interrupts and the guard."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from hermes_acp.engine.workspace import OutputCap

from .agentproc import processGone


def result(outcome) -> dict:
    return json.loads(outcome.text)


def gone(pid: int, within: float = 3.0) -> bool:
    """Whether ``pid`` died (a zombie waiting for init to reap it counts as dead)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if processGone(pid):
            return True
        time.sleep(0.05)
    return False


def test_runsInTheSessionFolder(bench, tmp_path: Path) -> None:
    outcome = bench.call("terminal", command="pwd; echo oops >&2; exit 3")
    assert not outcome.failed
    assert result(outcome) == {"output": f"{tmp_path}\noops\n", "exit_code": 3}
    assert outcome.extras["exitCode"] == 3 and outcome.extras["cwd"] == str(tmp_path)


def test_workdirIsRelativeToTheSession(bench, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert result(bench.call("terminal", command="pwd", workdir="sub"))["output"] == f"{tmp_path}/sub\n"
    assert "is not a directory" in bench.call("terminal", command="pwd", workdir="missing").text


def test_stdinIsEmpty(bench) -> None:
    """A command that reads stdin sees end-of-file at once instead of the agent's protocol stream."""
    outcome = bench.call("terminal", command="cat; read line; echo read=$?", timeout=10)
    assert result(outcome)["output"] == "read=1\n"


def test_ownProcessGroup(bench, tmp_path: Path) -> None:
    (tmp_path / "group.py").write_text("import os; print(os.getpgrp() == os.getpid(), os.getpgrp() != %d)" % os.getpgrp())
    outcome = bench.call("terminal", command=f"exec {sys.executable} group.py")
    assert result(outcome)["output"] == "True True\n"


def test_outputKeepsHeadAndTail(bench, tmp_path: Path) -> None:
    (tmp_path / "loud.py").write_text("print('A' * 1000); print('B' * 200000); print('Z' * 1000)")
    outcome = bench.call("terminal", command=f"{sys.executable} loud.py")
    output = result(outcome)["output"]
    assert output.startswith("A" * 1000)
    assert output.rstrip().endswith("Z" * 1000)
    assert "bytes of output omitted" in output
    assert len(output) < 51_000
    assert outcome.extras["truncated"] is True


def test_outputCapArithmetic() -> None:
    cap = OutputCap(10)
    for piece in (b"0123", b"456789", b"abcdef"):
        cap.feed(piece)
    assert cap.dropped == 6
    assert cap.text() == "0123\n\n... [6 bytes of output omitted] ...\n\nabcdef"


def test_timeoutKillsTheWholeGroup(bench, tmp_path: Path) -> None:
    started = time.monotonic()
    outcome = bench.call("terminal", command="sleep 60 & echo $! > bg.pid; sleep 60", timeout=1)
    assert time.monotonic() - started < 5
    assert outcome.failed
    assert "timed out after 1 s" in result(outcome)["error"]
    assert gone(int((tmp_path / "bg.pid").read_text()))


def test_interruptKillsTheWholeGroup(bench, tmp_path: Path) -> None:
    threading.Timer(0.5, bench.cancelEvent.set).start()
    started = time.monotonic()
    outcome = bench.call("terminal", command="sleep 60 & echo $! > bg.pid; echo partial; sleep 60")
    assert time.monotonic() - started < 10  # not the 60 s the command asked for
    assert outcome.failed
    assert "interrupted by the user" in outcome.text and "partial" in outcome.text
    assert gone(int((tmp_path / "bg.pid").read_text()))


def test_aCancelledTurnRunsNoCommand(bench, tmp_path: Path) -> None:
    """Cancelled before the command started (while it was approved, say): it never runs,
    not even for the moment it would take to see the cancel."""
    bench.cancelEvent.set()
    outcome = bench.call("terminal", command="touch made")
    assert outcome.failed and "not run: the user cancelled the turn" in outcome.text
    assert not (tmp_path / "made").exists()


def test_backgroundJobDoesNotHoldTheCall(bench) -> None:
    """A job left running with the output pipe open does not keep the call waiting."""
    started = time.monotonic()
    outcome = bench.call("terminal", command="sleep 30 & echo started")
    assert time.monotonic() - started < 5
    assert result(outcome) == {"output": "started\n", "exit_code": 0}


def test_dangerousCommandAsksAndDenialDoesNotRun(bench, tmp_path: Path) -> None:
    (tmp_path / "victim").mkdir()
    bench.observer.commandAnswer = "reject_once"
    outcome = bench.call("terminal", command="rm -rf victim")
    assert outcome.failed and outcome.extras["denied"] is True
    assert "BLOCKED" in outcome.text and "recursive delete" in outcome.text
    assert bench.observer.commands == [("bench.1", "rm -rf victim", "recursive delete")]
    assert (tmp_path / "victim").is_dir()


def test_approvedDangerousCommandRuns(bench, tmp_path: Path) -> None:
    (tmp_path / "victim").mkdir()
    bench.observer.commandAnswer = "allow_once"
    assert not bench.call("terminal", command="rm -rf victim").failed
    assert not (tmp_path / "victim").exists()


def test_hardBlockedNeverAsks(bench) -> None:
    bench.observer.commandAnswer = "allow_once"
    outcome = bench.call("terminal", command="mkfs.ext4 /dev/sdz9")
    assert outcome.failed and "never allowed" in outcome.text
    assert bench.observer.commands == []


def test_outputCapKeepsCharactersWhole() -> None:
    cap = OutputCap(100)  # the head keeps 40 bytes: the 21st character is cut in two there
    cap.feed(("a" + "é" * 30).encode())
    assert cap.text() == "a" + "é" * 30
