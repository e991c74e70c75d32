"""Processes that try to outlive their command (engine.processes): found through
the subreaper and the command's mark, ended on cancel and at exit, and reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_acp.engine import processes

from .agentproc import processGone


def alive(pid: int) -> bool:
    return not processGone(pid)


def waitFor(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def escapee(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    """A command that starts ``setsid sleep`` in a new session and waits."""
    pidFile = tmp_path / "pid"
    process, mark = processes.spawn(
        ["/bin/sh", "-c", f"setsid sh -c 'echo $$ > {pidFile}; exec sleep 60' & wait"],
        str(tmp_path), dict(os.environ), stdout=subprocess.DEVNULL)
    assert waitFor(lambda: pidFile.exists() and pidFile.read_text().strip() != "")
    return process, mark, int(pidFile.read_text())


@pytest.mark.skipif(not processes.becomeSubreaper(), reason="no child subreaper on this system")
def test_endKillsWhatLeftTheGroup(tmp_path: Path) -> None:
    process, mark, pid = escapee(tmp_path)
    assert os.getpgid(pid) != process.pid  # it left the command's group
    processes.end(process, mark)
    process.wait(10)
    processes.release(process)
    assert waitFor(lambda: not alive(pid))


@pytest.mark.skipif(not processes.becomeSubreaper(), reason="no child subreaper on this system")
def test_anOrphanIsAdoptedFoundByItsMarkAndReaped(tmp_path: Path) -> None:
    """The command exits, its escaped child lives on as ours; ending the command
    by its mark still finds it, and its exit is collected (no zombie left)."""
    pidFile = tmp_path / "pid"
    process, mark = processes.spawn(
        ["/bin/sh", "-c", f"setsid sh -c 'echo $$ > {pidFile}; exec sleep 60' &"],
        str(tmp_path), dict(os.environ), stdout=subprocess.DEVNULL)
    process.wait(10)
    assert waitFor(lambda: pidFile.exists() and pidFile.read_text().strip() != "")
    pid = int(pidFile.read_text())
    assert waitFor(lambda: pid in processes._adopted())
    processes.end(process, mark)
    processes.release(process)
    assert waitFor(lambda: not os.path.exists(f"/proc/{pid}") or (processes.reapAdopted() or False))
    assert waitFor(lambda: not os.path.exists(f"/proc/{pid}"))


@pytest.mark.skipif(not processes.becomeSubreaper(), reason="no child subreaper on this system")
def test_anotherCommandsEscapeeIsLeftAlone(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, firstMark, firstPid = escapee(tmp_path / "a")
    second, secondMark, secondPid = escapee(tmp_path / "b")
    try:
        processes.end(first, firstMark)
        first.wait(10)
        assert waitFor(lambda: not alive(firstPid))
        assert alive(secondPid)
    finally:
        processes.end(second, secondMark)
        second.wait(10)
        processes.release(first)
        processes.release(second)


def test_exitStatusesSurviveConcurrentReaping(tmp_path: Path) -> None:
    """Reaping adopted processes never takes the status of one the agent waits for."""
    for code in range(20):
        process, _ = processes.spawn(["/bin/sh", "-c", f"exit {code}"], str(tmp_path), dict(os.environ))
        processes.reapAdopted()
        assert process.wait(10) == code
        processes.release(process)


def test_cpuLimitEndsABusyCommand(tmp_path: Path) -> None:
    process, mark = processes.spawn(["/bin/sh", "-c", "while :; do :; done"], str(tmp_path), dict(os.environ),
                                    limits=processes.Limits(cpuSeconds=1))
    try:
        code = process.wait(30)
    finally:
        processes.end(process, mark)
        processes.release(process)
    assert code in (-24, -9)  # SIGXCPU at the soft limit (the hard one kills)


@pytest.mark.skipif(os.geteuid() == 0, reason="the kernel does not apply RLIMIT_NPROC to root")
def test_processLimitStopsAForkBomb(tmp_path: Path) -> None:
    """With a limit of processes, a command cannot start more than that (counting
    every process of the user)."""
    running = sum(1 for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid == os.getuid())
    process, mark = processes.spawn(
        ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait"], str(tmp_path), dict(os.environ),
        limits=processes.Limits(processes=running + 3), stderr=subprocess.PIPE)
    try:
        _, err = process.communicate(timeout=30)
    finally:
        processes.end(process, mark)
        processes.release(process)
    assert b"fork" in err.lower() or b"resource" in err.lower()


def python(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter of this environment (module state of its own)."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)


_AFTER_THE_END = """
import os, subprocess, sys
from hermes_acp.engine import processes

def startedAfterTheList():
    # endAll runs between the refusal check and the fork: it lists no children
    processes.endAll()
    return subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL).pid

pid = processes.started(startedAfterTheList)
print(pid, flush=True)
try:
    processes.spawn(["sleep", "30"], None, dict(os.environ))
except processes.Ending as e:
    print("refused:", e, flush=True)
"""


def test_nothingOutlivesTheEnd(tmp_path: Path) -> None:
    """Once ``endAll`` has run (the agent is exiting) nothing starts, and a process
    forked while it ran is killed all the same (a cancelled turn's command used to
    start just after the end and outlive the agent)."""
    run = python(_AFTER_THE_END)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stderr
    assert lines[1] == "refused: the agent is shutting down; nothing new starts"
    assert waitFor(lambda: not alive(int(lines[0])))


_HALF_IMPORTED = """
import importlib, importlib.machinery, sys, threading, time
from hermes_acp.tap import endCommands

NAME = "hermes_acp.engine.processes"

class Slow:
    # the module's body runs half a second late, as under a loaded machine
    def find_spec(self, name, path, target=None):
        if name != NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        spec.loader.exec_module = lambda module: (time.sleep(0.5), run(module))
        return spec

sys.meta_path.insert(0, Slow())
threading.Thread(target=importlib.import_module, args=(NAME,)).start()
time.sleep(0.1)
assert NAME in sys.modules and not hasattr(sys.modules[NAME], "endAll")
endCommands()
print("ended", sys.modules[NAME]._ended)
"""


def test_theExitSweepWaitsForAHalfImportedEngine() -> None:
    """The agent exits while another thread is still importing the process module:
    the sweep waits for it, it does not fail on it."""
    run = python(_HALF_IMPORTED)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ended True\n"
