"""The agent's watchdog (engine.lifeline), in fresh interpreters that die the way an
agent can: what their commands left running ends with them, a watchdog a command
killed is replaced, and a process that only shares a reused pid is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_acp.engine import lifeline

from .agentproc import processGone
from .test_processes import waitFor

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watchdog finds processes in /proc")


def sleeping(pid: int, seconds: str) -> bool:
    """Whether ``pid`` is still one of this test's sleepers (a reused pid is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return seconds.encode() in f.read() and not processGone(pid)
    except OSError:
        return False


def unique(base: int) -> str:
    return f"{base}.{os.getpid() % 10_000:04d}"


# argv: a folder for the pid files, the sleep, whether to kill the watchdog first.
_AGENT = """
import os, signal, subprocess, sys, time
from hermes_acp.engine import processes

folder, seconds, killWatchdog = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

def run(command):
    process, _ = processes.spawn(["/bin/sh", "-c", command], folder, dict(os.environ))
    return process

if killWatchdog:
    run("true").wait()
    first = processes._lifeline.process.pid
    os.kill(first, signal.SIGKILL)  # as a command could
    while open(f"/proc/{first}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # a watchdog still dying reads what it is told (and loses it)
    run("true").wait()  # finds the watchdog gone, starts another
    assert processes._lifeline.process.pid != first
    print(first, flush=True)
sleeper = lambda name: f"sh -c 'echo $$ > {name}.pid; exec sleep {seconds}' > /dev/null 2>&1"
run(f"(env -i setsid {sleeper('a')} &); setsid {sleeper('b')} & nohup {sleeper('c')} & {sleeper('d')}")
while len([n for n in os.listdir(folder) if n.endswith('.pid') and open(os.path.join(folder, n)).read()]) < 4:
    time.sleep(0.01)
print(processes._lifeline.process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # at once: the watchdog has had no time to look around
"""


@pytest.mark.parametrize("killWatchdog", [False, True])
def test_whatAKilledAgentLeftEndsWithIt(tmp_path: Path, killWatchdog: bool) -> None:
    """The agent is killed the moment its command's processes have escaped (one
    left its session and parent and shed its environment): they all end, and the
    watchdog exits. A watchdog a command killed had been replaced."""
    seconds = unique(317 + killWatchdog)
    run = subprocess.run([sys.executable, "-c", _AGENT, str(tmp_path), seconds, "1" if killWatchdog else "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stderr
    watchdogs = [int(line) for line in run.stdout.split()]
    pids = [int((tmp_path / f"{name}.pid").read_text()) for name in "abcd"]
    try:
        assert waitFor(lambda: not any(sleeping(pid, seconds) for pid in pids), 30)
        assert waitFor(lambda: all(processGone(pid) for pid in watchdogs), 30)
    finally:
        for pid in pids:
            if sleeping(pid, seconds):
                os.kill(pid, 9)


def test_aReusedPidIsLeftAlone() -> None:
    """A process told about whose pid now belongs to another process (its start
    time differs) is not the agent's: neither it nor its session is swept."""
    seconds = unique(319)
    other = subprocess.Popen(["sleep", seconds], start_new_session=True)
    try:
        start = lifeline.startTime(other.pid)
        assert other.pid in lifeline._found({other.pid: start}, "HERMES_ACP_COMMAND=no-such-agent.", 0, set())
        assert lifeline._found({other.pid: start - 1}, "HERMES_ACP_COMMAND=no-such-agent.", 0, set()) == set()
    finally:
        other.kill()
        other.wait()


def test_commandsHoldNoEndOfTheLifeline(tmp_path: Path) -> None:
    """A command inherits neither end of the watchdog's pipe (holding the write end
    would keep the watchdog waiting after the agent's death): only its stdio."""
    from hermes_acp.engine import processes

    listing = ("import os\n"
               "for fd in os.listdir('/proc/self/fd'):\n"
               "    try:\n"
               "        print(fd, os.readlink('/proc/self/fd/' + fd))\n"
               "    except OSError:\n"
               "        pass  # the listing's own\n")
    process, _ = processes.spawn([sys.executable, "-I", "-c", listing], str(tmp_path), dict(os.environ),
                                 stdout=subprocess.PIPE)
    try:
        out, _ = process.communicate(timeout=30)
    finally:
        processes.release(process)
    assert processes._lifeline.started
    pipes = [int(line.split()[0]) for line in out.decode().splitlines() if line.split()[1].startswith("pipe:")]
    assert pipes == [1]


def test_withoutProcTheGroupsOfKnownProcessesEnd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no ``/proc`` (macOS) the sweep kills the process group of
    each process it was told about, with whatever stayed in it."""
    seconds = unique(320)
    leader = subprocess.Popen(["/bin/sh", "-c", f"sleep {seconds} & echo $!; wait"], stdout=subprocess.PIPE,
                              start_new_session=True, text=True)
    child = int(leader.stdout.readline())
    try:
        monkeypatch.setattr(lifeline, "_PROC", "/no-proc-here")
        assert lifeline.startTime(leader.pid) == 0
        lifeline.sweep({leader.pid: 0}, "HERMES_ACP_COMMAND=no-such-agent.", 0, set())
        assert leader.wait(30) == -9
        assert waitFor(lambda: not sleeping(child, seconds), 30)
    finally:
        if sleeping(child, seconds):
            os.kill(child, 9)
        leader.kill()
        leader.wait()


_NO_WATCHDOG = """
import os, sys
from hermes_acp.engine import lifeline, processes

real = sys.executable
sys.executable = "/no/such/python"  # the watchdog cannot start
try:
    processes.spawn(["true"], None, dict(os.environ))
except OSError as e:
    print("refused:", e.strerror, flush=True)
sys.executable = real
process, _ = processes.spawn(["true"], None, dict(os.environ))
print("then:", process.wait(30), processes._lifeline.started, flush=True)
"""


def test_noCommandRunsWithoutAWatchdog() -> None:
    """A command the agent could not end if it died does not run: when the
    watchdog cannot start, the command fails and says why; the next one tries again."""
    run = subprocess.run([sys.executable, "-c", _NO_WATCHDOG], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "refused: cannot start the agent's watchdog: No such file or directory", "then: 0 True"]


def test_theMarkKeepsTheUsersSoftLimit() -> None:
    """A user's own soft ``RLIMIT_RTTIME`` (a realtime budget) stays what it was: the mark
    is the hard limit, which is what every descendant carries and cannot raise."""
    script = ("import resource, sys; from hermes_acp.engine import lifeline\n"
              "R = resource.RLIMIT_RTTIME\n"
              "resource.setrlimit(R, (200000, resource.getrlimit(R)[1]))\n"
              "mark = lifeline.Lifeline('HERMES_ACP_COMMAND=x.')._markLimit()\n"
              "print(mark, *resource.getrlimit(R))\n")
    mark, soft, hard = map(int, subprocess.run([sys.executable, "-c", script], capture_output=True, check=True,
                                               timeout=30).stdout.split())
    assert mark > 1 << 40 and (soft, hard) == (200000, mark)
