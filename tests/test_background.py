"""Background processes, engine side: the ring buffer, the session's owner (start, limits,
poll, log, wait, kill, write, submit, close, what the model is told) and the ``process``
tool, on real processes. Every wait is bounded."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import pytest

from hermes_acp.engine.background import BackgroundError, BackgroundLimits, BackgroundProcesses
from hermes_acp.engine.workspace import OutputCap

from .agentproc import processGone


def until(condition: Any, timeout: float = 15, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


HEARD: list[tuple[str, str, dict[str, Any]]] = []


@pytest.fixture
def registry() -> Any:
    HEARD.clear()
    found = BackgroundProcesses(BackgroundLimits(perSession=2, outputBytes=4000, total=3),
                                listener=lambda sid, kind, snap: HEARD.append((sid, kind, snap)))
    yield found
    for sessionId in ("s", "t"):
        found.drop(sessionId)


@pytest.fixture
def session(bench, registry) -> Any:
    bench.agent.background = registry.forSession("s")
    return bench


def call(bench: Any, name: str, **arguments: Any) -> dict[str, Any]:
    outcome = bench.call(name, **arguments)
    try:
        return json.loads(outcome.text)
    except ValueError:
        return {"error": outcome.text}


# -- the ring buffer ---------------------------------------------------------------------


def test_theRingKeepsHeadAndTailAndSaysTheCut() -> None:
    cap = OutputCap(100)
    for i in range(100):
        cap.feed(f"line {i:03d}\n".encode())
    text = cap.text()
    assert text.startswith("line 000\n") and text.rstrip().endswith("line 099")
    assert f"[{cap.dropped} bytes of output omitted]" in text
    assert cap.total == 900 and cap.dropped == 900 - 100
    assert cap.tail(18) == "line 098\nline 099\n"


def test_theRingTailOfShortOutputIsAllOfIt() -> None:
    cap = OutputCap(100)
    cap.feed(b"hello\n")
    assert cap.tail(1000) == "hello\n" and cap.total == 6 and not cap.dropped


# -- the owner and the process tool ------------------------------------------------------


def test_backgroundAnswersAtOnceAndTheProcessRunsOn(session, registry) -> None:
    began = time.monotonic()
    started = call(session, "terminal", command="echo ready; sleep 30", background=True)
    assert time.monotonic() - began < 5
    assert started["output"] == "Background process started" and started["session_id"].startswith("proc_")
    assert started["exit_code"] == 0 and started["error"] is None
    owner = registry.forSession("s")
    proc = owner.find(started["session_id"])
    assert owner.find(1) is proc and owner.find("#1") is proc and proc.running
    until(lambda: "ready" in proc.output.text(), what="its output")
    polled = call(session, "process", action="poll", session_id=started["session_id"])
    assert polled["status"] == "running" and polled["pid"] == started["pid"] and "ready" in polled["output_preview"]
    listed = call(session, "process", action="list")
    assert [p["session_id"] for p in listed["processes"]] == [started["session_id"]]
    killed = call(session, "process", action="kill", session_id=1)
    assert killed["status"] == "killed" and killed["termination_source"] == "process.kill"
    assert processGone(started["pid"])
    assert call(session, "process", action="kill", session_id=1)["status"] == "already_exited"
    # The model saw it end (kill): the next prompt's note does not repeat it.
    assert owner.endedNote() is None


def test_waitWriteSubmitClose(session, registry) -> None:
    session.observer.commandAnswer = "allow_once"  # inline Python asks, as in the foreground
    script = "import sys\nfor line in sys.stdin: print('got', line.strip(), flush=True)\nprint('eof'); sys.exit(3)"
    started = call(session, "terminal", command=f"{sys.executable} -c \"{script}\"", background=True)
    pid = started["session_id"]
    assert call(session, "process", action="write", session_id=pid, data="one\n") == {"status": "ok", "bytes_written": 4}
    assert call(session, "process", action="submit", session_id=pid, data="two")["bytes_written"] == 4
    waited = call(session, "process", action="wait", session_id=pid, timeout=1)
    assert waited["status"] == "running" or waited["status"] == "timeout"
    assert call(session, "process", action="close", session_id=pid)["status"] == "ok"
    waited = call(session, "process", action="wait", session_id=pid, timeout=20)
    assert waited["status"] == "exited" and waited["exit_code"] == 3
    assert "got one" in waited["output"] and "got two" in waited["output"] and "eof" in waited["output"]
    assert call(session, "process", action="write", session_id=pid, data="x")["status"] == "error"
    ended = [snap for sid, kind, snap in HEARD if kind == "ended"]
    assert ended and ended[-1]["exitCode"] == 3 and "eof" in ended[-1]["tail"]


def test_inputIsJudgedAsPipedIntoTheCommand(session) -> None:
    """A shell fed commands through its input is judged as ``printf ... | sh``: it asks."""
    started = call(session, "terminal", command="sh", background=True)
    refused = session.call("process", action="submit", session_id=started["session_id"], data="touch ~/x")
    assert refused.failed and "BLOCKED" in refused.text
    asked = session.observer.commands[-1]
    assert "touch ~/x" in str(asked) and "| sh" in str(asked)


@pytest.mark.parametrize("command", ["cd . && sh", "true; sh", "sh -c 'cd . && sh'", "(sh)", "echo $(sh)", "bash -lc sh"])
def test_inputToAShellInsideACompoundCommandIsJudgedToo(session, command: str) -> None:
    """The input reaches every program of a list, a group, a substitution or a shell's ``-c``
    script, not only the first: piped into such a command the guard would see no shell reading
    it, so the input is judged as piped into a shell (``git push --force`` asks: it always does)."""
    started = call(session, "terminal", command=command, background=True)
    refused = session.call("process", action="submit", session_id=started["session_id"], data="git push --force")
    assert refused.failed and "BLOCKED" in refused.text
    asked = session.observer.commands[-1]
    assert "git push --force" in str(asked) and "| sh" in str(asked) and command in str(asked)


def test_inputToAPlainCommandIsJudgedPipedIntoIt(session) -> None:
    """A single program (or pipeline) fed input is judged with the input piped into it: ``cat``
    fed a command runs nothing, and nothing is asked."""
    started = call(session, "terminal", command="cat > /dev/null", background=True)
    done = call(session, "process", action="submit", session_id=started["session_id"], data="git push --force")
    assert done["status"] == "ok"


def test_waitIsInterruptedByACancel(session) -> None:
    started = call(session, "terminal", command="sleep 30", background=True)
    threading.Timer(0.3, session.cancelEvent.set).start()
    began = time.monotonic()
    waited = call(session, "process", action="wait", session_id=started["session_id"], timeout=60)
    assert waited["status"] == "interrupted" and time.monotonic() - began < 10


def test_logPagesThroughTheOutput(session, registry) -> None:
    started = call(session, "terminal", command="for i in $(seq 1 50); do echo line $i; done", background=True)
    proc = registry.forSession("s").find(started["session_id"])
    until(lambda: not proc.running, what="the process to end")
    last = call(session, "process", action="log", session_id=1, limit=5)
    assert last["output"].splitlines() == [f"line {i}" for i in range(46, 51)] and last["total_lines"] == 50
    page = call(session, "process", action="log", session_id=1, offset=10, limit=3)
    assert page["output"].splitlines() == ["line 11", "line 12", "line 13"] and page["showing"] == "3 lines from line 10"


def test_aLongOutputKeepsHeadAndTailAndLogSaysTheCut(session, registry) -> None:
    started = call(session, "terminal", command="for i in $(seq 1 2000); do echo line $i; done", background=True)
    proc = registry.forSession("s").find(started["session_id"])
    until(lambda: not proc.running, what="the process to end")
    assert proc.output.total > 4000 and proc.output.dropped == proc.output.total - 4000
    logged = call(session, "process", action="log", session_id=1, offset=0, limit=100000)
    assert logged["output"].startswith("line 1\n") and logged["output"].endswith("line 2000")
    assert "bytes of output omitted" in logged["output"] and "truncated" in logged


def test_limitsGiveClearMessages(session, registry, bench) -> None:
    first = call(session, "terminal", command="sleep 30", background=True)
    call(session, "terminal", command="sleep 30", background=True)
    refused = bench.call("terminal", command="sleep 30", background=True)
    assert refused.failed and "already runs 2 background processes" in refused.text
    assert "HERMES_ACP_BACKGROUND_PROCESSES" in refused.text
    other = registry.forSession("t")
    other.start("sleep 30", str(bench.agent.cwd), None, None)
    with pytest.raises(BackgroundError, match="HERMES_ACP_BACKGROUND_TOTAL"):
        other.start("sleep 30", str(bench.agent.cwd), None, None)
    assert registry.running == 3
    call(session, "process", action="kill", session_id=first["session_id"])
    until(lambda: registry.running == 2, what="the count to drop")
    assert call(session, "terminal", command="sleep 30", background=True)["session_id"].startswith("proc_")


def test_theNextPromptIsToldWhatEnded(session, registry) -> None:
    started = call(session, "terminal", command="echo built; exit 4", background=True)
    owner = registry.forSession("s")
    proc = owner.find(started["session_id"])
    until(lambda: not proc.running, what="the process to end")
    note = owner.endedNote()
    assert note is not None and started["session_id"] in note and "exit code 4" in note and "built" in note
    assert owner.endedNote() is None  # told once
    owner.lost([{"processId": "proc_0123456789ab", "number": 7, "command": "npm run dev"}])
    note = owner.endedNote()
    assert note is not None and "proc_0123456789ab" in note and "previous process" in note


def test_theNoteGoesBeforeTheUsersMessage() -> None:
    from hermes_acp.engine.agent import withNote

    assert withNote("hi", None) == "hi"
    assert withNote("hi", "[note]") == "[note]\n\nhi"
    assert withNote([{"type": "text", "text": "hi"}], "[note]") == [{"type": "text", "text": "[note]"},
                                                                   {"type": "text", "text": "hi"}]


def test_droppingTheSessionEndsItsProcesses(session, registry) -> None:
    pids = [call(session, "terminal", command="sleep 30", background=True)["pid"] for _ in range(2)]
    registry.drop("s")
    until(lambda: all(processGone(pid) for pid in pids), what="the processes to end")
    until(lambda: registry.running == 0, what="the count to drop")


def test_withoutAnOwnerBackgroundIsRefused(bench) -> None:
    outcome = bench.call("terminal", command="sleep 1", background=True)
    assert outcome.failed and "not available" in outcome.text
    assert "process" not in bench.agent.activeTools()


def test_oneReaderThreadForAllProcesses(session, registry) -> None:
    """Two sessions' three processes are read by one thread, which ends once none is left."""
    before = set(threading.enumerate())
    other = registry.forSession("t")
    for _ in range(2):
        call(session, "terminal", command="echo x; sleep 30", background=True)
    other.start("echo x; sleep 30", str(session.agent.cwd), None, None)
    new = [t for t in set(threading.enumerate()) - before if t.name != "hermes-sandbox"]  # the sandbox's spawner
    assert [t.name for t in new] == ["hermes-background"]
    registry.drop("s")
    registry.drop("t")
    until(lambda: not any(t.is_alive() for t in new), what="the reader to end")


def test_planModeRefusesABackgroundCommandThatChangesThings(session) -> None:
    """The plan rules apply as to a foreground command: refused without a question."""
    session.agent.setEditMode("plan")
    refused = session.call("terminal", command="touch made.txt", background=True)
    assert refused.failed and session.observer.commands == []
    assert session.agent.background.processes() == []


def test_endedProcessesKeptAreBounded(session, registry) -> None:
    """Past ``perSession`` ended processes the oldest are forgotten; the model still hears of
    those it was not told of (their note), and of how many more past that."""
    owner = registry.forSession("s")
    for n in range(6):
        proc = owner.start(f"echo run {n}", str(session.agent.cwd), None, None)
        until(lambda: not proc.running, what="the process to end")
    assert [p.number for p in owner.processes()] == [5, 6]
    note = owner.endedNote()
    assert note is not None and "2 more that ended earlier" in note
    assert all(f"run {n}" in note for n in (2, 3, 4, 5)) and "run 1" not in note


def test_nothingStartsInADroppedSession(session, registry) -> None:
    owner = registry.forSession("s")
    registry.drop("s")
    with pytest.raises(BackgroundError, match="closed"):
        owner.start("sleep 30", str(session.agent.cwd), None, None)
    assert registry.running == 0
