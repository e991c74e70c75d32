"""``hermes-acp prompt``: the headless client, run as users run it, against a scripted model.

The client runs as its own process (it spawns the agent); the scripted model
server runs on this test's reactor, so the client is driven with
``spawnProcess`` rather than a blocking ``subprocess.run``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.protocol import ProcessProtocol

from hermes_acp.headless import (
    EXIT_AUTH,
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_MAX_TOKENS,
    EXIT_MAX_TURN_REQUESTS,
    EXIT_OK,
    EXIT_REFUSAL,
    EXIT_TERMINATED,
    EXIT_USAGE,
)

from . import acpschema
from .agentproc import ENTRY_POINTS, agentEnv
from .e2e import modelEnv
from .scripted_model import Script

TIMEOUT = 60
TOOL_TURN = [
    [{"tool_calls": [{"id": "t1", "name": "todo", "arguments": {"todos": [
        {"id": "1", "content": "Write the note", "status": "in_progress"},
        {"id": "2", "content": "Clean the build", "status": "pending"}]}}]}],
    [{"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "notes/a.txt", "content": "alpha\n"}}]}],
    [{"tool_calls": [{"id": "c1", "name": "terminal", "arguments": {"command": "rm -r build"}}]}],
    [{"text": "Done: "}, {"text": "wrote the note."}],
]


class CLIRun(ProcessProtocol):
    """One ``hermes-acp`` process: its output so far, and its exit code."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.code: Deferred[int] = Deferred()
        self._watches: list[tuple[Callable[[], bool], Deferred[None]]] = []

    def outReceived(self, data: bytes) -> None:
        self.out += data
        self._check()

    def errReceived(self, data: bytes) -> None:
        self.err += data
        self._check()

    def _check(self) -> None:
        for watch in list(self._watches):
            if watch[0]():
                self._watches.remove(watch)
                watch[1].callback(None)

    def when(self, condition: Callable[[], bool]) -> Deferred[None]:
        """Fires once the output so far meets ``condition``; fails the test after TIMEOUT."""
        d: Deferred[None] = Deferred()
        self._watches.append((condition, d))
        self._check()

        def timedOut(failure: Any) -> None:
            failure.trap(TimeoutError)
            self.transport.signalProcess("KILL")
            raise AssertionError(f"output never came; stdout {self.out[-500:]!r}; stderr {self.err[-2000:]!r}")

        return d.addTimeout(TIMEOUT, reactor).addErrback(timedOut)

    def processEnded(self, reason: Any) -> None:
        self.code.callback(reason.value.exitCode if reason.value.signal is None else -reason.value.signal)

    @property
    def stderr(self) -> str:
        return self.err.decode()

    @property
    def stdout(self) -> str:
        return self.out.decode()


def start(args: list[str], env: dict[str, str], cwd: Path, stdin: bytes | int | None = None) -> CLIRun:
    """Start ``hermes-acp ARGS``; ``stdin`` is bytes to pipe in, an fd to hand over, or None (EOF)."""
    run = CLIRun()
    argv = ENTRY_POINTS["hermes-acp"] + args
    childFDs: dict[int, Any] = {0: stdin if isinstance(stdin, int) else "w", 1: "r", 2: "r"}
    transport = reactor.spawnProcess(run, argv[0], argv, env=env, path=str(cwd), childFDs=childFDs)
    if not isinstance(stdin, int):
        if stdin:
            transport.write(stdin)
        transport.closeStdin()
    run.transport = transport
    return run


async def finished(run: CLIRun) -> int:
    """The exit code; a run that outlives TIMEOUT is killed and fails the test."""
    d = run.code
    d.addTimeout(TIMEOUT, reactor)
    try:
        return await d
    except TimeoutError:
        run.transport.signalProcess("KILL")
        raise AssertionError(f"hermes-acp did not finish: {run.stderr[-2000:]}")


async def prompt(args: list[str], env: dict[str, str], cwd: Path, stdin: bytes | None = None) -> CLIRun:
    run = start(["prompt", *args], env, cwd, stdin)
    run.exitCode = await finished(run)
    return run


def cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """For runs that need no model server: a plain blocking run."""
    return subprocess.run(ENTRY_POINTS["hermes-acp"] + args, capture_output=True, text=True, env=env,
                          cwd=cwd, stdin=subprocess.DEVNULL, timeout=TIMEOUT)


def stopLine(run: CLIRun) -> tuple[str, str]:
    """The stop reason and session id from the client's closing line (the agent may
    still log to stderr after it, while it shuts down)."""
    found = re.findall(r"^\[(\w+)\] session (\S+)$", run.stderr, re.M)
    assert len(found) == 1, run.stderr
    return found[0]


def sessionOf(run: CLIRun) -> str:
    return stopLine(run)[1]


def processesWith(home: str) -> list[int]:
    """Live processes whose environment has this HERMES_HOME (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"HERMES_HOME={home}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out.o").write_text("object")
    return tmp_path


@pytest_twisted.ensureDeferred
async def test_yesDrivesAToolTurn(scriptedServer, tmp_path) -> None:
    """`prompt --yes` allows an edit and a dangerous command once each; the file is
    written, the command ran, the plan and every tool status are shown, the answer
    alone is on stdout, the session ran in the current directory, exit 0."""
    server, url = scriptedServer
    server.default.responses += TOOL_TURN
    cwd = workdir(tmp_path)
    run = await prompt(["--yes", "write the note"], modelEnv(url), cwd)
    assert run.exitCode == EXIT_OK, run.stderr
    assert run.stdout == "Done: wrote the note.\n"
    assert (cwd / "notes" / "a.txt").read_text() == "alpha\n"
    assert not (cwd / "build").exists()
    lines = run.stderr.splitlines()
    for expected in (
        "[tool] Update plan (2 items) (think): pending",
        "[plan]", "  [>] Write the note", "  [ ] Clean the build",
        "[tool] Write notes/a.txt (edit): pending", "[tool] Write notes/a.txt: in_progress",
        "[permission] Write notes/a.txt (edit)", "  +alpha",
        "[tool] Write notes/a.txt: completed",
        "[permission] Run rm -r build (execute)", "  recursive delete",
        "[tool] Run rm -r build: completed (exit code 0)",
    ):
        assert expected in lines, (expected, run.stderr)
    assert lines.count("[permission] allowed once (--yes)") == 2
    assert stopLine(run)[0] == "end_turn"
    system = server.chatRequests[0]["messages"][0]["content"]
    assert f"Working directory: {cwd}" in system
    assert server.chatRequests[0]["messages"][-1] == {"role": "user", "content": "write the note"}


@pytest.mark.parametrize("flags, said", [(["--deny"], "rejected (--deny)"),
                                         ([], "rejected: no terminal to ask on (pass --yes or --deny)")])
@pytest_twisted.ensureDeferred
async def test_denied(scriptedServer, tmp_path, flags, said) -> None:
    """`--deny`, or no terminal and no flag: the edit is rejected and says so; the
    model hears it; the turn still ends normally."""
    server, url = scriptedServer
    server.default.responses += [TOOL_TURN[1], [{"text": "I could not write it."}]]
    run = await prompt([*flags, "write the note"], modelEnv(url), tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    assert not (tmp_path / "notes").exists()
    assert f"[permission] {said}" in run.stderr.splitlines()
    assert re.search(r"^\[tool\] Write notes/a.txt: failed - Error: Edit not approved", run.stderr, re.M), run.stderr
    toolResult = [m for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"][0]
    assert "not approved" in toolResult["content"]


@pytest.mark.parametrize("steps, repeat, code, stop", [
    ([[{"refusal": "I will not do that."}]], False, EXIT_REFUSAL, "refusal"),
    ([[{"text": "cut sh"}, {"finish": "length"}]], True, EXIT_MAX_TOKENS, "max_tokens"),  # after 3 continuations
    pytest.param([[{"tool_calls": [{"name": "todo", "arguments": {}}]}]], True, EXIT_MAX_TURN_REQUESTS,
                 "max_turn_requests", marks=pytest.mark.slow),  # 90 model requests
])
@pytest_twisted.ensureDeferred
async def test_stopReasonExitCodes(scriptedServer, tmp_path, steps, repeat, code, stop) -> None:
    """Each stop reason has its own exit code, and is named on stderr."""
    server, url = scriptedServer
    server.default = Script(steps, repeat)
    run = await prompt(["do it"], modelEnv(url), tmp_path)
    assert run.exitCode == code, run.stderr
    assert stopLine(run)[0] == stop


@pytest_twisted.ensureDeferred
async def test_modelFailureIsAnError(scriptedServer, tmp_path) -> None:
    """A model endpoint that fails the turn fails the run: a refused key is exit 3
    (set up again), any other model error exit 1; the client reads the agent's error
    answer, never the chat's text."""
    server, url = scriptedServer
    server.default.responses += [[{"status": 401, "error": "Incorrect API key provided"}],
                                 [{"status": 400, "error": "context too long for this model"}]]
    refused = await prompt(["hi"], modelEnv(url), tmp_path)
    assert refused.exitCode == EXIT_AUTH, refused.stderr
    assert "rejected the API key" in refused.stderr and "hermes-acp --setup" in refused.stderr
    failed = await prompt(["hi"], modelEnv(url), tmp_path)
    assert failed.exitCode == EXIT_ERROR, failed.stderr
    assert "hermes-acp prompt: the turn failed: Model error: " in failed.stderr
    assert "context too long for this model" in failed.stderr
    assert stopLine(failed)[0] == "failed"
    assert "**" not in failed.stderr and failed.stdout == ""


@pytest_twisted.ensureDeferred
async def test_stdinPromptThenContinueTheSession(scriptedServer, tmp_path) -> None:
    """A prompt piped on stdin runs; `--session ID` continues it with its history
    (the replayed history is not printed again)."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "Paris."}], [{"text": "About 2 million."}]]
    env = modelEnv(url)
    first = await prompt([], env, tmp_path, stdin=b"What is the capital of France?\n")
    assert first.exitCode == EXIT_OK, first.stderr
    assert first.stdout == "Paris.\n"
    second = await prompt(["--session", sessionOf(first), "-"], env, tmp_path, stdin=b"How many people live there?")
    assert second.exitCode == EXIT_OK, second.stderr
    assert second.stdout == "About 2 million.\n"
    assert sessionOf(second) == sessionOf(first)
    messages = server.chatRequests[1]["messages"]
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "What is the capital of France?"), ("assistant", "Paris."), ("user", "How many people live there?")]


@pytest_twisted.ensureDeferred
async def test_jsonPrintsTheAgentsFrames(scriptedServer, tmp_path) -> None:
    """`--json`: stdout is exactly the agent's frames (the --trace "out" side),
    each valid against the ACP schema."""
    server, url = scriptedServer
    server.default.responses += [TOOL_TURN[0], [{"text": "Planned."}]]
    trace = tmp_path / "trace.jsonl"
    run = start(["--trace", str(trace), "prompt", "--json", "plan it"], modelEnv(url), tmp_path)
    assert await finished(run) == EXIT_OK, run.stderr
    printed = [json.loads(line) for line in run.stdout.splitlines()]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert printed == [r["frame"] for r in records if r["dir"] == "out"]
    sent = [r["frame"] for r in records if r["dir"] == "in"]
    methods = {json.dumps(f["id"]): f["method"] for f in sent if "method" in f and "id" in f}
    assert sorted(set(methods.values())) == ["initialize", "session/new", "session/prompt"]
    assert sent[0]["params"]["clientCapabilities"] == {}
    for frame in printed:
        assert acpschema.checkAgentFrame(frame, methods) == [], frame
    kinds = [f["params"]["update"]["sessionUpdate"] for f in printed if f.get("method") == "session/update"]
    assert "plan" in kinds and "tool_call" in kinds
    assert printed[-1]["result"]["stopReason"] == "end_turn"


@pytest_twisted.ensureDeferred
async def test_ctrlCCancelsTheTurn(scriptedServer, tmp_path) -> None:
    """SIGINT mid-turn sends session/cancel: the agent answers "cancelled" and the
    client exits 130."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Working"}, {"stall": True}])
    run = start(["prompt", "go"], modelEnv(url), tmp_path)
    await run.when(lambda: b"Working" in run.out)
    run.transport.signalProcess("INT")
    assert await finished(run) == EXIT_CANCELLED, run.stderr
    lines = run.stderr.splitlines()
    assert "[cancelling; press Ctrl-C again to stop at once]" in lines
    assert stopLine(run)[0] == "cancelled"


@pytest_twisted.ensureDeferred
async def test_sigtermTakesTheAgentAlong(scriptedServer, tmp_path) -> None:
    """SIGTERM mid-turn: the client stops its agent and exits 143; the agent does not
    outlive it."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Working"}, {"stall": True}])
    env = modelEnv(url)
    run = start(["prompt", "go"], env, tmp_path)
    await run.when(lambda: b"Working" in run.out)
    assert processesWith(env["HERMES_HOME"]) != []  # the agent, while the client runs
    run.transport.signalProcess("TERM")
    assert await finished(run) == EXIT_TERMINATED, run.stderr
    assert processesWith(env["HERMES_HOME"]) == []


@pytest_twisted.ensureDeferred
async def test_askOnTheTerminal(scriptedServer, tmp_path) -> None:
    """On a terminal the client asks; "a" picks allow_always, so the second edit in
    the session is not asked about (the agent switched to accept_edits)."""
    server, url = scriptedServer
    second = [{"tool_calls": [{"id": "w2", "name": "write_file", "arguments": {"path": "notes/b.txt", "content": "beta\n"}}]}]
    server.default.responses += [TOOL_TURN[1], second, [{"text": "Both written."}]]
    primary, secondary = os.openpty()
    try:
        run = start(["prompt", "write two notes"], modelEnv(url), tmp_path, stdin=secondary)
        await run.when(lambda: b"Allow? [y] once, [a] always, [n] no:" in run.err)
        os.write(primary, b"maybe\n")  # not an answer: asked again
        await run.when(lambda: run.err.count(b"Allow?") == 2)
        os.write(primary, b"a\n")
        assert await finished(run) == EXIT_OK, run.stderr
    finally:
        os.close(primary)
        os.close(secondary)
    lines = run.stderr.splitlines()
    assert lines.count("  Allow? [y] once, [a] always, [n] no: maybe") == 1
    assert lines.count("  Allow? [y] once, [a] always, [n] no: a") == 1
    assert "[permission] allowed for this session" in lines
    assert (tmp_path / "notes" / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "notes" / "b.txt").read_text() == "beta\n"
    assert run.stdout == "Both written.\n"


def test_notConfigured(tmp_path) -> None:
    """Without an endpoint the agent refuses the session (-32000): exit 3, and the
    way out is named."""
    out = cli(["prompt", "hello"], agentEnv(), tmp_path)
    assert out.returncode == EXIT_AUTH, out.stderr
    assert "Authentication required: no model endpoint" in out.stderr
    assert "Run `hermes-acp --setup`" in out.stderr
    assert out.stdout == ""


def test_unknownSession(tmp_path) -> None:
    out = cli(["prompt", "--session", "no-such-session", "hello"],
              agentEnv(HERMES_BASE_URL="http://127.0.0.1:9/v1", HERMES_MODEL="m", HERMES_MODELS="m"), tmp_path)
    assert out.returncode == EXIT_ERROR, out.stderr
    assert "the agent answered error -32002" in out.stderr


@pytest.mark.parametrize("args", [
    ["prompt", "--yes", "--deny", "hi"],
    ["prompt"],
    ["prompt", "   "],
    ["--check", "prompt", "hi"],
    ["prompt", "--bogus", "hi"],
    ["prompt", "--model", " ", "hi"],
    ["prompt", "--answer", "", "hi"],
])
def test_usageErrors(tmp_path, args) -> None:
    """Bad command lines exit 64 before any agent starts (stdin here is not a terminal
    but is empty, so a missing prompt is an empty one)."""
    out = cli(args, agentEnv(), tmp_path)
    assert out.returncode == EXIT_USAGE, (args, out.stderr)
    assert out.stdout == ""


@pytest_twisted.ensureDeferred
async def test_modelAndContextInOneShotPrompts(scriptedServer, tmp_path) -> None:
    """`/model` in a one-shot prompt waits for the endpoint's list; a model that is not
    in it can still be chosen and is shown as current and marked; `/context` in a
    later process agrees with the last usage_update the editor got."""
    server, url = scriptedServer
    server.models = ["scripted-model", "other-model"]
    server.default.responses.append([{"text": "hello"}, {"usage": {"prompt_tokens": 1234, "completion_tokens": 2}}])
    env = modelEnv(url)
    listed = await prompt(["/model"], env, tmp_path)
    assert listed.exitCode == EXIT_OK, listed.stderr
    assert "- `scripted-model` (current)" in listed.stdout and "- `other-model`" in listed.stdout
    sid = sessionOf(listed)
    switched = await prompt(["--session", sid, "/model", "my-own-model"], env, tmp_path)
    assert "Model switched to `my-own-model` (not in the endpoint's model list" in switched.stdout, switched.stderr
    shown = await prompt(["--session", sid, "/model"], env, tmp_path)
    assert "- `my-own-model` (current; not in the endpoint's model list)" in shown.stdout
    await prompt(["--session", sid, "hi"], env, tmp_path)
    context = await prompt(["--session", sid, "/context"], env, tmp_path)
    assert "| Context used | 1,234 of 128,000 tokens (0%) |" in context.stdout, context.stdout


def test_badQuestionBound(tmp_path) -> None:
    out = cli(["prompt", "hi"], agentEnv(HERMES_ACP_PROMPT_QUESTION_CHARS="5"), tmp_path)
    assert out.returncode == EXIT_USAGE
    assert "HERMES_ACP_PROMPT_QUESTION_CHARS must be at least 20, got 5" in out.stderr


def test_helpAndUsageSynopses(tmp_path) -> None:
    """--help starts with a Usage line naming every global option; a mistake after
    `prompt` shows the prompt command's synopsis."""
    from hermes_acp.tap import Options

    out = cli(["--help"], agentEnv(), tmp_path)
    first = out.stdout.splitlines()[0]
    assert first.startswith("Usage: hermes-acp ")
    for name, *_ in Options.optFlags + Options.optParameters + [["version"], ["help"]]:
        assert f"--{name}" in first, name
    wrong = cli(["prompt", "--bogus", "hi"], agentEnv(), tmp_path)
    assert "Usage: hermes-acp [--trace FILE] [--log-level LEVEL] prompt [--session ID]" in wrong.stderr


@pytest_twisted.ensureDeferred
async def test_failedCommandsShowExitCodeAndOutputTail(scriptedServer, tmp_path) -> None:
    """A command that exits non-zero shows its exit code and the last 10 lines of its
    output; one that succeeds shows its exit code and its last 3 lines."""
    server, url = scriptedServer
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "terminal", "arguments": {"command": "seq 1 5"}}]}],
        [{"tool_calls": [{"id": "b", "name": "terminal", "arguments": {"command": "seq 1 30; echo broken >&2; exit 3"}}]}],
        [{"text": "checked"}],
    ]  # fmt: skip
    run = await prompt(["--yes", "run them"], modelEnv(url), tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    lines = run.stderr.splitlines()
    fine = lines.index("[tool] Run seq 1 5: completed (exit code 0)")
    assert lines[fine + 1 : fine + 5] == ["  | 3", "  | 4", "  | 5", "[tool] Run seq 1 30; echo broken >&2; exit 3 (execute): pending"]
    assert "[tool] Run seq 1 30; echo broken >&2; exit 3: completed (exit code 3)" in lines
    tail = lines[lines.index("[tool] Run seq 1 30; echo broken >&2; exit 3: completed (exit code 3)") + 1 :][:10]
    assert tail[-1] == "  | broken" and "  | 22" in tail and "  | 20" not in tail


@pytest_twisted.ensureDeferred
async def test_permissionTimeoutEndsTheQuestionLine(scriptedServer, tmp_path) -> None:
    """A question nobody answers in time is withdrawn by the agent: its line ends,
    and what follows starts on a line of its own."""
    server, url = scriptedServer
    server.default.responses += [TOOL_TURN[1], [{"text": "Never mind."}]]
    primary, secondary = os.openpty()
    try:
        run = start(["prompt", "write it"], modelEnv(url, HERMES_ACP_PERMISSION_TIMEOUT="1"), tmp_path, stdin=secondary)
        assert await finished(run) == EXIT_OK, run.stderr
    finally:
        os.close(primary)
        os.close(secondary)
    lines = run.stderr.splitlines()
    asked = lines.index("  Allow? [y] once, [a] always, [n] no: ")
    assert lines[asked + 1] == "[permission] withdrawn by the agent: no answer in time"
    assert not (tmp_path / "notes" / "a.txt").exists()


def test_notAServiceUnderTwist(tmp_path) -> None:
    out = subprocess.run(ENTRY_POINTS["twist hermes-acp"] + ["prompt", "hi"], capture_output=True, text=True,
                         env=agentEnv(), cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    assert out.returncode == EXIT_USAGE
    assert "hermes-acp prompt ..." in out.stderr


# -- on a terminal: spinner, reasoning, colours -------------------------------------------


class TTYRun(ProcessProtocol):
    """``hermes-acp`` with stdin, stdout and stderr on a pseudo-terminal: what the
    terminal showed, and the exit code."""

    def __init__(self) -> None:
        self.screen = b""
        self.code: Deferred[int] = Deferred()
        self._reader: Any = None

    def processEnded(self, reason: Any) -> None:
        self.code.callback(reason.value.exitCode if reason.value.signal is None else -reason.value.signal)


async def promptOnTTY(args: list[str], env: dict[str, str], cwd: Path) -> TTYRun:
    import threading

    primary, secondary = os.openpty()
    run = TTYRun()
    argv = ENTRY_POINTS["hermes-acp"] + ["prompt", *args]
    run.transport = reactor.spawnProcess(run, argv[0], argv, env=env, path=str(cwd),
                                         childFDs={0: secondary, 1: secondary, 2: secondary})
    os.close(secondary)

    def read() -> None:
        while True:
            try:
                data = os.read(primary, 4096)
            except OSError:  # EIO: the last process on the terminal is gone
                data = b""
            if not data:
                break
            run.screen += data

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run.exitCode = await finished(run)  # type: ignore[arg-type]
    finally:
        reader.join(TIMEOUT)
        os.close(primary)
    return run


THINK_TURN = [
    [{"stall": 1.0}, {"reasoning": "Let me count."}, {"tool_calls": [{"id": "c", "name": "terminal",
                                                                      "arguments": {"command": "seq 1 4"}}]}],
    [{"text": "Counted."}],
]  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_terminalShowsSpinnerReasoningAndColours(scriptedServer, tmp_path) -> None:
    """On a terminal: a spinner while the model is quiet, its reasoning dimmed, the
    statuses coloured, a successful command's last lines; the answer is plain."""
    server, url = scriptedServer
    server.default.responses += THINK_TURN
    run = await promptOnTTY(["count"], modelEnv(url, TERM="xterm"), tmp_path)
    screen = run.screen.decode()
    assert run.exitCode == EXIT_OK, screen
    assert re.search(r"\r\x1b\[2m[|/\\-] working\x1b\[0m\x1b\[K", screen), screen
    assert "\x1b[2mLet me count.\x1b[0m\r\n" in screen
    assert "\x1b[32m[tool] Run seq 1 4: completed (exit code 0)\x1b[0m\r\n\x1b[2m  | 2\x1b[0m" in screen
    assert "\r\nCounted.\r\n" in screen
    assert "\x1b[" not in screen.split("Counted.")[1].split("[end_turn]")[0]


@pytest.mark.parametrize("env, spinner", [({"NO_COLOR": "1", "TERM": "xterm"}, True), ({"TERM": "dumb"}, False)])
@pytest_twisted.ensureDeferred
async def test_terminalWithoutColours(scriptedServer, tmp_path, env, spinner) -> None:
    """`NO_COLOR` turns the colours off (the spinner stays); `TERM=dumb` turns off both.
    The reasoning is still shown, plain."""
    server, url = scriptedServer
    server.default.responses += THINK_TURN
    run = await promptOnTTY(["count"], modelEnv(url, **env), tmp_path)
    screen = run.screen.decode()
    assert run.exitCode == EXIT_OK, screen
    assert "\x1b[0m" not in screen and "\x1b[2m" not in screen and "\x1b[3" not in screen
    assert ("\r| working\x1b[K" in screen or "\r/ working\x1b[K" in screen) is spinner, screen
    assert "Let me count.\r\n" in screen
    assert "[tool] Run seq 1 4: completed (exit code 0)\r\n  | 2\r\n  | 3\r\n  | 4\r\n" in screen


@pytest_twisted.ensureDeferred
async def test_noReasoningOrSpinnerWithoutATerminal(scriptedServer, tmp_path) -> None:
    """Without a terminal nothing is redrawn or coloured, and the reasoning is not shown:
    the output stays what scripts read."""
    server, url = scriptedServer
    server.default.responses += THINK_TURN
    run = await prompt(["--yes", "count"], modelEnv(url, TERM="xterm"), tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    assert run.stdout == "Counted.\n"
    assert "\x1b" not in run.stderr and "\r" not in run.stderr and "Let me count." not in run.stderr


@pytest_twisted.ensureDeferred
async def test_modelOption(scriptedServer, tmp_path) -> None:
    """`--model NAME` sets the session's model (its config option) before the prompt:
    the endpoint is asked with that model, and the session keeps it."""
    server, url = scriptedServer
    server.models = ["scripted-model", "other-model"]
    server.default.responses += [[{"text": "hi"}], [{"text": "again"}]]
    env = modelEnv(url)
    run = await prompt(["--model", "other-model", "hi"], env, tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    assert "[model] other-model" in run.stderr.splitlines()
    assert server.chatRequests[0]["model"] == "other-model"
    again = await prompt(["--session", sessionOf(run), "again"], env, tmp_path)
    assert again.exitCode == EXIT_OK, again.stderr
    assert server.chatRequests[1]["model"] == "other-model"


# -- questions (elicitation/create) ---------------------------------------------------------

#: A test double for the agent, speaking raw lines: it records the client's capabilities,
#: and in its one turn sends each form of argv[1] as elicitation/create (or, when the client
#: did not advertise form elicitation, none), then tells what it got as the answer text.
FAKE_AGENT = r"""
import json, sys
def send(m): sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    line = sys.stdin.readline()
    if not line: sys.exit(0)
    return json.loads(line)
forms = json.loads(sys.argv[1])
while True:
    m = read()
    if m.get("method") == "initialize":
        caps = m["params"]["clientCapabilities"]
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif m.get("method") == "session/new":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"sessionId": "s1"}})
    elif m.get("method") == "session/prompt":
        answers = []
        if ((caps.get("elicitation") or {}).get("form")) is not None:
            for n, params in enumerate(forms):
                if params.get("toolCallId"):
                    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": {
                        "sessionUpdate": "tool_call", "toolCallId": params["toolCallId"],
                        "title": "docs-server: ask_user", "kind": "other", "status": "in_progress"}}})
                send({"jsonrpc": "2.0", "id": "e%d" % n, "method": "elicitation/create", "params": params})
                if (params.get("_meta") or {}).get("test/withdraw"):  # as the agent does at its time-out
                    import time; time.sleep(0.5)
                    send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "e%d" % n}})
                reply = read()
                answers.append(reply.get("result", reply.get("error")))
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": json.dumps({"caps": caps, "answers": answers})}}}})
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"stopReason": "end_turn"}})
"""

PICK = {"sessionId": "s1", "mode": "form", "message": "Which database?\nIt decides the driver.",
        "requestedSchema": {"type": "object", "properties": {
            "answer": {"type": "string", "title": "Database", "oneOf": [
                {"const": "pg", "title": "PostgreSQL"}, {"const": "sqlite", "title": "SQLite"}]},
            "other": {"type": "string", "title": "Something else", "maxLength": 100}}},
        "_meta": {"hermes-acp": {"clarify": True}}}  # fmt: skip
REQUIRED_TEXT = {"sessionId": "s1", "mode": "form", "message": "Name the branch",
                 "requestedSchema": {"properties": {"name": {"type": "string"}}, "required": ["name"]},
                 "_meta": {"hermes-acp": {"clarify": True}}}


class FakeAgentClient:
    """``PromptClient`` (the real one) talking to ``FAKE_AGENT``; what it printed."""

    def __init__(self, forms: list[dict[str, Any]], interactive: bool = False, answer: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        import io
        import sys

        from hermes_acp.elicitform import Limits
        from hermes_acp.headless import PromptClient, Terminal

        self.stdinRead, self.stdinWrite = os.pipe()
        self.out = io.TextIOWrapper(io.BytesIO(), write_through=True)
        self.err = io.TextIOWrapper(io.BytesIO(), write_through=True)
        ui = Terminal(self.out, self.err)
        client = self.client = PromptClient(reactor, "go", ui, None, [], interactive=interactive,
                                            stdinFd=self.stdinRead, answer=answer, limits=Limits.fromEnv(env or {}))
        argv = [sys.executable, "-c", FAKE_AGENT, json.dumps(forms)]
        client.spawn = lambda: reactor.spawnProcess(client.process, sys.executable, argv, env=dict(os.environ))

    @property
    def stderr(self) -> str:
        return self.err.buffer.getvalue().decode()

    def reported(self) -> dict[str, Any]:
        return json.loads(self.out.buffer.getvalue().decode())

    async def shown(self, text: str, times: int = 1) -> None:
        """Once ``text`` was shown ``times`` times (the test fails after TIMEOUT)."""
        from twisted.internet.task import deferLater

        for _ in range(TIMEOUT * 20):
            if self.stderr.count(text) >= times:
                return
            await deferLater(reactor, 0.05, lambda: None)
        raise AssertionError(f"never asked {text!r}: {self.stderr}")

    async def run(self, typed: list[tuple[str, bytes | None]] = ()) -> int:
        """Run the turn; for each (prompt, line), once ``prompt`` is shown once more, type ``line``
        (None closes the input)."""
        running = Deferred.fromCoroutine(self.client.run())
        running.addTimeout(TIMEOUT, reactor)
        try:
            for n, (shown, line) in enumerate(typed):
                await self.shown(shown, 1 + sum(1 for s, _ in typed[:n] if s == shown))
                if line is None:
                    os.close(self.stdinWrite)
                else:
                    os.write(self.stdinWrite, line)
            try:
                return await running
            except TimeoutError:
                raise AssertionError(f"the run did not finish: {self.stderr}") from None
        finally:
            for fd in (self.stdinRead, self.stdinWrite):
                try:
                    os.close(fd)
                except OSError:
                    pass


def checkAnswers(answers: list[Any]) -> None:
    for answer in answers:
        assert acpschema.problems(answer, "CreateElicitationResponse") == [], answer


CHOOSE = "Choose 1-2 or type an answer (empty line skips): "


@pytest.mark.parametrize("typed, answer, said", [
    ([(CHOOSE, b"2\n")], {"action": "accept", "content": {"answer": "sqlite"}}, "answered"),
    ([(CHOOSE, b"postgresql\n")], {"action": "accept", "content": {"answer": "pg"}}, "answered"),
    ([(CHOOSE, b"MariaDB, please\n")], {"action": "accept", "content": {"other": "MariaDB, please"}}, "answered"),
    ([(CHOOSE, b"\n"), ("Answer (empty line skips): ", b"\n")], {"action": "decline"}, "declined"),
    ([(CHOOSE, None)], {"action": "cancel"}, "cancelled (input closed)"),
])  # fmt: skip
@pytest_twisted.ensureDeferred
async def test_questionAnsweredOnTheTerminal(typed, answer, said) -> None:
    """On a terminal the client advertises form elicitation and asks: the choices are
    numbered, a number or a choice's name picks it, other text is the free answer, an
    empty line declines, closed input (Ctrl-D) cancels; the answer is valid ACP."""
    fake = FakeAgentClient([PICK], interactive=True)
    assert await fake.run(typed) == EXIT_OK, fake.stderr
    report = fake.reported()
    assert report["caps"] == {"elicitation": {"form": {}}}
    assert acpschema.problems({"protocolVersion": 1, "clientCapabilities": report["caps"]}, "InitializeRequest") == []
    assert report["answers"] == [answer]
    checkAnswers(report["answers"])
    lines = fake.stderr.splitlines()
    asked = lines.index("[question] from the agent")
    assert lines[asked + 1 : asked + 6] == ["  Which database?", "  It decides the driver.", "  Database",
                                            "    1. PostgreSQL", "    2. SQLite"]
    assert f"[question] {said}" in lines


@pytest_twisted.ensureDeferred
async def test_questionRequiredAndRetried() -> None:
    """A required free-text field: an empty line declines; a choice that is not one is
    asked again; a tool's question names the tool call it comes from."""
    fromTool = {**PICK, "toolCallId": "mcp-1"}
    fake = FakeAgentClient([REQUIRED_TEXT, fromTool], interactive=True)
    code = await fake.run([("Answer (empty line declines): ", b"   \n"), (CHOOSE, b"7\n")])
    assert code == EXIT_OK, fake.stderr
    # "7" is no choice, but there is a free-text field: it is that answer.
    assert fake.reported()["answers"] == [{"action": "decline"}, {"action": "accept", "content": {"other": "7"}}]
    assert "[question] from the tool call docs-server: ask_user" in fake.stderr.splitlines()


@pytest_twisted.ensureDeferred
async def test_questionNumberOutOfRangeAskedAgain() -> None:
    onlyChoices = {**PICK, "requestedSchema": {"properties": {"answer": PICK["requestedSchema"]["properties"]["answer"]},
                                               "required": ["answer"]}}
    fake = FakeAgentClient([onlyChoices], interactive=True)
    prompt_ = "Choose 1-2 (empty line declines): "
    assert await fake.run([(prompt_, b"3\n"), (prompt_, b"1\n")]) == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [{"action": "accept", "content": {"answer": "pg"}}]
    assert "  (choose 1-2)" in fake.stderr.splitlines()


@pytest.mark.parametrize("text, answers", [
    ("SQLite", [{"action": "accept", "content": {"answer": "sqlite"}}, {"action": "accept", "content": {"name": "SQLite"}}]),
    ("Oracle", [{"action": "accept", "content": {"other": "Oracle"}}, {"action": "accept", "content": {"name": "Oracle"}}]),
])  # fmt: skip
@pytest_twisted.ensureDeferred
async def test_answerOption(text, answers) -> None:
    """`--answer TEXT` without a terminal: form elicitation is advertised and every question
    is answered with TEXT: the matching choice, else free text."""
    fake = FakeAgentClient([PICK, REQUIRED_TEXT], answer=text)
    assert await fake.run() == EXIT_OK, fake.stderr
    report = fake.reported()
    assert report["caps"] == {"elicitation": {"form": {}}}
    assert report["answers"] == answers
    checkAnswers(answers)
    assert fake.stderr.splitlines().count("[question] answered (--answer)") == 2


@pytest_twisted.ensureDeferred
async def test_answerThatFitsNoChoiceDeclines() -> None:
    onlyChoices = {**PICK, "requestedSchema": {"properties": {"answer": PICK["requestedSchema"]["properties"]["answer"]}}}
    fake = FakeAgentClient([onlyChoices], answer="Oracle")
    assert await fake.run() == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [{"action": "decline"}]
    assert "[question] declined: --answer fits none of the choices" in fake.stderr.splitlines()


@pytest_twisted.ensureDeferred
async def test_noTerminalNoAnswerAdvertisesNothing() -> None:
    """Without a terminal and without --answer, nobody can answer: the client does not
    advertise elicitation (the agent falls back), and one sent anyway is refused at once
    with -32602, never waited on."""
    fake = FakeAgentClient([PICK])
    assert await fake.run() == EXIT_OK, fake.stderr
    assert fake.reported() == {"caps": {}, "answers": []}
    from hermes_acp.jsonrpc import InvalidParams

    with pytest.raises(InvalidParams, match="did not advertise elicitation"):
        await fake.client.elicit(PICK)


@pytest.mark.parametrize("params, env, problem", [
    ({**PICK, "mode": "url", "url": "https://example.com", "elicitationId": "x"}, {}, "only form elicitation"),
    ({**PICK, "sessionId": "other"}, {}, "not this client's session"),
    ({**PICK, "requestedSchema": {"properties": {"a": {"title": "no type"}}}}, {}, "has no type"),
    ({**PICK, "requestedSchema": {"properties": {"a": {"type": "string", "enum": [str(n) for n in range(51)]}}}},
     {}, "more than 50 choices"),
    (PICK, {"HERMES_ACP_PROMPT_QUESTION_CHOICES": "1"}, "more than 1 choices"),
    ({**PICK, "requestedSchema": {"properties": {f"f{n}": {"type": "string"} for n in range(21)}}}, {},
     "more than 20 fields"),
    (PICK, {"HERMES_ACP_PROMPT_QUESTION_FIELDS": "1"}, "more than 1 fields"),
    ({**PICK, "message": 7}, {}, "message must be a string"),
])  # fmt: skip
@pytest_twisted.ensureDeferred
async def test_badQuestionsAreRefused(params, env, problem) -> None:
    """A request that is not a form this client can show (or bigger than its bounds) is
    answered -32602, saying why."""
    fake = FakeAgentClient([params], answer="x", env=env)
    assert await fake.run() == EXIT_OK, fake.stderr
    [error] = fake.reported()["answers"]
    assert error["code"] == -32602 and problem in error["message"], error


@pytest_twisted.ensureDeferred
async def test_questionTextIsBoundedAndHasNoEscapes() -> None:
    """What an MCP server asks is shown without terminal escape sequences and cut to a
    bound, however long it is."""
    hostile = {**PICK, "message": "\x1b]0;pwned\x07\x1b[2JClear?\n" + "line\n" * 100 + "x" * 5000,
               "requestedSchema": {"properties": {"a": {"type": "string", "title": "\x1b[31mred" + "t" * 1000}}}}
    fake = FakeAgentClient([hostile], answer="fine")
    assert await fake.run() == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [{"action": "accept", "content": {"a": "fine"}}]
    assert "\x1b" not in fake.stderr and "\x07" not in fake.stderr
    assert "  ]0;pwned[2JClear?" in fake.stderr.splitlines()
    assert "  ... " in fake.stderr and len(fake.stderr) < 4000


@pytest_twisted.ensureDeferred
async def test_answerLeavesAToolsQuestionAlone() -> None:
    """`--answer` answers the model's own questions (marked so by the agent), never an
    MCP server's: `--answer yes` must not confirm what a tool asks. Without a terminal
    such a question is declined."""
    serverQuestion = {key: value for key, value in PICK.items() if key != "_meta"}
    fake = FakeAgentClient([serverQuestion], answer="SQLite")
    assert await fake.run() == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [{"action": "decline"}]
    assert "[question] declined: --answer answers the model's own questions, not a tool's" in fake.stderr.splitlines()


@pytest_twisted.ensureDeferred
async def test_ctrlCWhileAskedCancelsTheQuestion() -> None:
    """Ctrl-C while a question waits answers it "cancel" at once, and cancels the turn."""
    fake = FakeAgentClient([PICK], interactive=True)
    running = Deferred.fromCoroutine(fake.run())
    await fake.shown(CHOOSE)
    fake.client.interrupt()
    assert await running == EXIT_OK, fake.stderr  # this agent ends the turn normally
    assert fake.reported()["answers"] == [{"action": "cancel"}]
    lines = fake.stderr.splitlines()
    assert lines[lines.index("  " + CHOOSE) + 1 :][:2] == ["[cancelling; press Ctrl-C again to stop at once]",
                                                          "[question] cancelled"]


@pytest.mark.parametrize("field, typed, value", [
    ({"type": "integer", "minimum": 1, "maximum": 9}, [b"12\n", b"x\n", b"4\n"], 4),
    ({"type": "number", "minimum": 0}, [b"inf\n", b"-1\n", b"2.5\n"], 2.5),
    ({"type": "boolean"}, [b"maybe\n", b"yes\n"], True),
    ({"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}, [b"1,2,3\n", b"c, 1\n"], ["c", "a"]),
    ({"type": "string", "minLength": 3}, [b"ab\n", b"abc\n"], "abc"),
])  # fmt: skip
@pytest_twisted.ensureDeferred
async def test_questionFieldsAreChecked(field, typed, value) -> None:
    """Numbers, yes/no, several choices and bounded text: an answer that does not fit is
    asked again, saying what fits; what is sent back fits the field."""
    form = {**REQUIRED_TEXT, "requestedSchema": {"properties": {"v": field}, "required": ["v"]}}
    fake = FakeAgentClient([form], interactive=True)
    prompt_ = ": "  # every field's prompt ends so; each is shown once per line typed
    assert await fake.run([(prompt_, line) for line in typed]) == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [{"action": "accept", "content": {"v": value}}]
    assert fake.stderr.count("  (") == len(typed) - 1


@pytest.mark.parametrize("line, answer", [(b"y\n", {"action": "accept", "content": {}}), (b"\n", {"action": "decline"})])
@pytest_twisted.ensureDeferred
async def test_questionWithoutFields(line, answer) -> None:
    """A question with nothing to fill in asks whether to go on."""
    form = {**REQUIRED_TEXT, "requestedSchema": {"type": "object", "properties": {}}}
    fake = FakeAgentClient([form], interactive=True)
    assert await fake.run([("Accept? [y] yes, [n] no (empty line declines): ", line)]) == EXIT_OK, fake.stderr
    assert fake.reported()["answers"] == [answer]
    checkAnswers([answer])


@pytest_twisted.ensureDeferred
async def test_questionWithdrawnByTheAgent() -> None:
    """A question the agent withdraws ($/cancel_request, as at its time-out) ends at once:
    its line ends, the client says so, and the turn goes on."""
    fake = FakeAgentClient([{**PICK, "_meta": {"test/withdraw": True}}], interactive=True)
    assert await fake.run() == EXIT_OK, fake.stderr
    [error] = fake.reported()["answers"]
    assert error["code"] == -32800, error
    lines = fake.stderr.splitlines()
    assert lines[lines.index("  " + CHOOSE) + 1] == "[question] withdrawn by the agent: no answer in time"


CLARIFY = [[{"tool_calls": [{"id": "q", "name": "clarify",
                             "arguments": {"question": "Which one?", "choices": ["alpha", "beta"]}}]}],
           [{"text": "Noted."}]]


@pytest_twisted.ensureDeferred
async def test_yesNeverAnswersTheModelsQuestion(scriptedServer, tmp_path) -> None:
    """Without a terminal or --answer, the real agent asks `clarify` as a permission
    request (the client offers no forms): --yes allows permissions, but never picks a
    choice the model would take for the user's; the model hears that nobody can answer."""
    server, url = scriptedServer
    server.default.responses += CLARIFY
    run = await prompt(["--yes", "pick one"], modelEnv(url), tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    assert "[question] not answered: no terminal to ask on" in run.stderr.splitlines()
    [result] = [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    said = json.loads(result)["user_response"]
    assert "alpha" not in said and "nobody can answer" in said, said


@pytest_twisted.ensureDeferred
async def test_answerReachesTheModelsQuestion(scriptedServer, tmp_path) -> None:
    """`--answer beta`: the client offers forms, the real agent's `clarify` arrives as
    `elicitation/create`, and the model reads the answer."""
    server, url = scriptedServer
    server.default.responses += CLARIFY
    run = await prompt(["--answer", "beta", "pick one"], modelEnv(url), tmp_path)
    assert run.exitCode == EXIT_OK, run.stderr
    [result] = [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    assert json.loads(result)["user_response"] == "beta"


def test_theModelsTextCannotDriveTheTerminal() -> None:
    """A plan, a permission's content (the plan of exit_plan_mode, a command) and a tool's
    title come from the model: what the terminal shows of them has no escape sequence."""
    import io

    err = io.TextIOWrapper(io.BytesIO(), write_through=True)
    from hermes_acp.headless import Terminal

    ui = Terminal(io.TextIOWrapper(io.BytesIO(), write_through=True), err)
    evil = "step\x1b]0;pwned\x07 one\x1b[2J\x9b31m"
    ui.update({"sessionUpdate": "plan", "entries": [{"content": evil, "status": "pending", "priority": "medium"}]})
    ui.permission({"title": evil, "kind": "switch_mode", "content": [{"type": "content",
                                                                       "content": {"type": "text", "text": evil}}]})
    ui.update({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": evil, "kind": "execute"})
    shown = err.buffer.getvalue().decode()
    assert shown.count("step") == 4 and "one" in shown, shown
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown), repr(shown)


@pytest_twisted.ensureDeferred
async def test_aQuestionWithItsOwnOptionsShowsThem() -> None:
    """The plan of plan mode is asked with options of its own ("implement and accept
    edits"): the terminal shows what each key does before the usual y/a/n prompt."""
    from hermes_acp.permissions import permissionOptions

    fake = FakeAgentClient([], interactive=True)
    params = {"sessionId": "s1", "toolCall": {"toolCallId": "c1", "title": "Ready to implement this plan?"},
              "options": permissionOptions("plan")}
    try:
        asking = Deferred.fromCoroutine(fake.client.requestPermission(params))
        await fake.shown("Allow? [y] once, [a] always, [n] no: ")
        os.write(fake.stdinWrite, b"a\n")
        answer = await asking.addTimeout(TIMEOUT, reactor)
    finally:
        for fd in (fake.stdinRead, fake.stdinWrite):
            os.close(fd)
    assert answer == {"outcome": {"outcome": "selected", "optionId": "allow_always"}}
    lines = fake.stderr.splitlines()
    assert "  [y] Yes, implement it (ask before each edit)" in lines, lines
    assert "  [a] Yes, implement it and accept edits" in lines, lines
    assert "  [n] No, keep planning" in lines, lines
