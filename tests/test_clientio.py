"""The workspace through the editor: fs/* and terminal/* requests, their order,
timeouts, cancels and clean-up."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.clientio import CANCEL_POLL, FILE_TIMEOUT, ClientWorkspace
from hermes_acp.engine.workspace import CommandResult, WorkspaceError
from hermes_acp.jsonrpc import RemoteError

from .workerthread import ThreadedClock

CREATE, WAIT, KILL, OUTPUT, RELEASE = (
    "terminal/create",
    "terminal/wait_for_exit",
    "terminal/kill",
    "terminal/output",
    "terminal/release",
)


@attrs.define
class Request:
    method: str
    params: dict[str, Any]
    timeout: float | None
    track: bool
    d: Deferred[Any]


class FakeEditor:
    """``call(method, params, timeout, track=True)`` like the turn's: a Deferred with
    the connection's timeout; answered by the test, or at once from ``script``."""

    def __init__(self, clock: Any, script: dict[str, Any] | None = None) -> None:
        self.clock = clock
        self.script = script or {}
        self.requests: list[Request] = []

    def call(self, method: str, params: dict[str, Any], timeout: float | None = None, track: bool = True) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.requests.append(Request(method, params, timeout, track, d))
        if method in self.script:
            answer = self.script[method]
            if isinstance(answer, Exception):
                d.errback(answer)
            else:
                d.callback(answer)
        elif timeout is not None:
            d.addTimeout(timeout, self.clock)
        return d

    @property
    def methods(self) -> list[str]:
        return [r.method for r in self.requests]

    def last(self, method: str) -> Request:
        return [r for r in self.requests if r.method == method][-1]

    def answer(self, method: str, result: Any) -> None:
        request = self.last(method)
        if isinstance(result, Exception):
            request.d.errback(result)
        else:
            request.d.callback(result)


class TerminalTests(SynchronousTestCase):
    """``_create`` then ``_finish`` (what ``runCommand`` runs on the reactor, around
    telling the turn of the terminal) as one coroutine on the test's thread, time
    from a Clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.editor = FakeEditor(self.clock)
        self.workspace = ClientWorkspace(self.clock, "s1", self.editor.call, terminals=True)
        self.cancel = threading.Event()

    def command(self, command: str = "pytest -q", timeout: float = 30.0) -> Deferred[CommandResult]:
        async def run() -> CommandResult:
            terminalId = await self.workspace._create(command, "/w", 1000)
            return await self.workspace._finish(terminalId, timeout, self.cancel)

        return Deferred.fromCoroutine(run())

    def started(self, **kwargs: Any) -> Deferred[CommandResult]:
        d = self.command(**kwargs)
        self.editor.answer(CREATE, {"terminalId": "t1"})
        return d

    def assertCleanedUp(self, methods: list[str]) -> None:
        self.assertEqual(self.editor.methods, methods)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_normalOrder(self) -> None:
        """create → wait_for_exit → output → release; the result waits for the release."""
        d = self.command()
        create = self.editor.last(CREATE)
        self.assertEqual(
            create.params,
            {
                "sessionId": "s1",
                "command": "/bin/sh",
                "args": ["-c", "pytest -q"],
                "env": [
                    {"name": "PAGER", "value": "cat"},
                    {"name": "GIT_PAGER", "value": "cat"},
                    {"name": "GIT_TERMINAL_PROMPT", "value": "0"},
                    {"name": "TERM", "value": "dumb"},
                ],
                "cwd": "/w",
                "outputByteLimit": 1000,
            },
        )
        self.editor.answer(CREATE, {"terminalId": "t1"})
        self.assertEqual(self.editor.methods, [CREATE, WAIT])
        self.editor.answer(WAIT, {"exitCode": 0})
        self.editor.answer(OUTPUT, {"output": "3 passed\n", "truncated": False, "exitStatus": {"exitCode": 0}})
        self.assertNoResult(d)
        self.editor.answer(RELEASE, {})
        self.assertEqual(
            self.successResultOf(d),
            CommandResult(output="3 passed\n", exitCode=0, meta={"terminalId": "t1", "signal": None}),
        )
        self.assertCleanedUp([CREATE, WAIT, OUTPUT, RELEASE])
        ids = {"sessionId": "s1", "terminalId": "t1"}
        self.assertEqual([r.params for r in self.editor.requests[1:]], [ids, ids, ids])

    def test_onlyTheWaitIsTracked(self) -> None:
        """The turn may cancel wait_for_exit (with the command's timeout); create and the
        clean-up always run to their end."""
        d = self.started()
        self.editor.answer(WAIT, {"exitCode": 1})
        self.editor.answer(OUTPUT, {"output": ""})
        self.editor.answer(RELEASE, {})
        self.successResultOf(d)
        self.assertEqual(
            [(r.method, r.track, r.timeout) for r in self.editor.requests],
            [(CREATE, False, FILE_TIMEOUT), (WAIT, True, 30.0), (OUTPUT, False, FILE_TIMEOUT), (RELEASE, False, FILE_TIMEOUT)],
        )

    def test_timeoutKillsThenReadsThenReleases(self) -> None:
        """When the timer wins the race: kill, then output, then release; timedOut."""
        d = self.started(timeout=5.0)
        self.clock.advance(4.9)
        self.assertEqual(self.editor.methods, [CREATE, WAIT])
        self.clock.advance(0.2)
        self.assertEqual(self.editor.methods, [CREATE, WAIT, KILL])
        self.editor.answer(KILL, {})
        self.editor.answer(OUTPUT, {"output": "partial", "truncated": True, "exitStatus": {"exitCode": None, "signal": "SIGKILL"}})
        self.editor.answer(RELEASE, {})
        result = self.successResultOf(d)
        self.assertEqual((result.timedOut, result.cancelled, result.exitCode), (True, False, None))
        self.assertEqual((result.output, result.truncated, result.meta["signal"]), ("partial", True, "SIGKILL"))
        self.assertCleanedUp([CREATE, WAIT, KILL, OUTPUT, RELEASE])

    def test_turnCancelKillsAndReleases(self) -> None:
        """A cancelled turn cancels wait_for_exit: kill, output, release; cancelled."""
        d = self.started()
        self.editor.last(WAIT).d.cancel()
        self.editor.answer(KILL, {})
        self.editor.answer(OUTPUT, {"output": "so far", "exitStatus": {"exitCode": 137}})
        self.editor.answer(RELEASE, {})
        result = self.successResultOf(d)
        self.assertEqual((result.cancelled, result.timedOut, result.exitCode, result.output), (True, False, None, "so far"))
        self.assertCleanedUp([CREATE, WAIT, KILL, OUTPUT, RELEASE])

    def test_cancelEventStopsTheWait(self) -> None:
        """The tool's cancel event alone ends the wait within CANCEL_POLL seconds."""
        d = self.started()
        self.clock.advance(CANCEL_POLL * 3)
        self.assertEqual(self.editor.methods, [CREATE, WAIT])
        self.cancel.set()
        self.clock.advance(CANCEL_POLL)
        self.assertEqual(self.editor.methods, [CREATE, WAIT, KILL])
        self.assertTrue(self.editor.last(WAIT).d.called)
        self.editor.answer(KILL, {})
        self.editor.answer(OUTPUT, {"output": ""})
        self.editor.answer(RELEASE, {})
        self.assertTrue(self.successResultOf(d).cancelled)
        self.assertCleanedUp([CREATE, WAIT, KILL, OUTPUT, RELEASE])

    def test_cancelDuringCreateStillReleases(self) -> None:
        """A cancel while terminal/create is in flight does not orphan the terminal: its id
        is awaited, then it is killed and released without waiting for it."""
        d = self.command()
        self.cancel.set()
        self.assertFalse(self.editor.last(CREATE).d.called)
        self.editor.answer(CREATE, {"terminalId": "t9"})
        self.editor.answer(KILL, {})
        self.editor.answer(OUTPUT, {"output": ""})
        self.editor.answer(RELEASE, {})
        self.assertTrue(self.successResultOf(d).cancelled)
        self.assertCleanedUp([CREATE, KILL, OUTPUT, RELEASE])
        self.assertEqual(self.editor.last(RELEASE).params["terminalId"], "t9")

    def test_releaseEvenWhenOutputAndKillFail(self) -> None:
        """Failed clean-up requests are logged; release still happens, the result still comes."""
        d = self.started(timeout=1.0)
        self.clock.advance(1.0)
        self.editor.answer(KILL, RemoteError(-32603, "kill failed"))
        self.editor.answer(OUTPUT, ConnectionDone("gone"))
        self.assertEqual(self.editor.methods, [CREATE, WAIT, KILL, OUTPUT, RELEASE])
        self.editor.answer(RELEASE, {})
        result = self.successResultOf(d)
        self.assertEqual((result.output, result.timedOut), ("", True))

    def test_releaseWhenTheOutputAnswerIsGarbage(self) -> None:
        """A malformed output answer reads as no output; the exit code still comes from wait_for_exit."""
        d = self.started()
        self.editor.answer(WAIT, {"exitCode": 3, "signal": None})
        self.editor.answer(OUTPUT, ["not", "an", "object"])
        self.editor.answer(RELEASE, {})
        result = self.successResultOf(d)
        self.assertEqual((result.output, result.exitCode), ("", 3))

    def test_exitCodeFromWaitForExit(self) -> None:
        """An output answer without exitStatus keeps the code wait_for_exit gave."""
        d = self.started()
        self.editor.answer(WAIT, {"exitCode": 2})
        self.editor.answer(OUTPUT, {"output": "boom", "truncated": False})
        self.editor.answer(RELEASE, {})
        self.assertEqual(self.successResultOf(d).exitCode, 2)

    def test_waitFailureStillCleansUp(self) -> None:
        """If wait_for_exit itself fails, the command is killed, read and released, and the
        tool hears a WorkspaceError."""
        d = self.started()
        self.editor.answer(WAIT, RemoteError(-32603, "terminal vanished"))
        self.editor.answer(KILL, {})
        self.editor.answer(OUTPUT, {"output": ""})
        self.assertNoResult(d)
        self.editor.answer(RELEASE, {})
        failure = self.failureResultOf(d, WorkspaceError)
        self.assertIn("terminal vanished", str(failure.value))
        self.assertCleanedUp([CREATE, WAIT, KILL, OUTPUT, RELEASE])

    def test_createFailures(self) -> None:
        """A refused or malformed create is a WorkspaceError, with nothing to release."""
        for answer in (RemoteError(-32603, "no terminals here"), ConnectionDone("closed"), {"id": "t1"}, None):
            self.editor.requests.clear()
            d = self.command()
            self.editor.answer(CREATE, answer)
            self.failureResultOf(d, WorkspaceError)
            self.assertCleanedUp([CREATE])


class FakeLocal:
    """Stands in for the local workspace to show which calls reach it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def readText(self, path: str) -> str:
        self.calls.append(("readText", path))
        return "local text"

    def writeText(self, path: str, content: str) -> None:
        self.calls.append(("writeText", path, content))

    def runCommand(self, *args: Any) -> CommandResult:
        self.calls.append(("runCommand", *args))
        return CommandResult(output="local", exitCode=0)


class WorkerSideTests(SynchronousTestCase):
    """The public methods, called from a real worker thread as the tools call them."""

    def workspace(self, script: dict[str, Any], **capabilities: bool) -> ClientWorkspace:
        self.reactor = ThreadedClock()
        self.editor = FakeEditor(self.reactor, script)
        self.local = FakeLocal()
        return ClientWorkspace(self.reactor, "s1", self.editor.call, local=self.local, **capabilities)

    def inWorker(self, workspace: ClientWorkspace, method: str, *args: Any) -> Any:
        return self.reactor.runInWorker(lambda: getattr(workspace, method)(*args))

    def test_runCommandInAnEditorTerminal(self) -> None:
        """From a worker thread, the whole terminal sequence crosses to the reactor."""
        script = {CREATE: {"terminalId": "t1"}, WAIT: {"exitCode": 0}, OUTPUT: {"output": "hi\n"}, RELEASE: {}}
        workspace = self.workspace(script, terminals=True)
        result = self.inWorker(workspace, "runCommand", "echo hi", "/w", 10.0, threading.Event())
        self.assertEqual((result.output, result.exitCode, result.meta["terminalId"]), ("hi\n", 0, "t1"))
        self.assertEqual(self.editor.methods, [CREATE, WAIT, OUTPUT, RELEASE])
        self.assertEqual(self.editor.last(CREATE).params["outputByteLimit"], 50_000)
        self.assertEqual(self.local.calls, [])

    def test_sandboxedCommandsRunHereEvenWithTerminals(self) -> None:
        """A command with a sandbox policy runs in the agent's sandbox: the editor's
        terminal would not confine it (issue 22)."""
        workspace = self.workspace({}, terminals=True)
        event, policy = threading.Event(), object()
        shown = []
        result = self.inWorker(workspace, "runCommand", "sh x.sh", "/w", 5.0, event, 99, None, policy, None, {"A": "1"},
                               shown.append)
        self.assertEqual(result.output, "local")
        # Its output is shown as it comes (the card stands in for the terminal).
        self.assertEqual(self.local.calls,
                         [("runCommand", "sh x.sh", "/w", 5.0, event, 99, None, policy, None, {"A": "1"}, shown.append)])
        self.assertEqual(self.editor.requests, [])

    def test_theCommandsEnvironmentReachesTheTerminal(self) -> None:
        """What the tool adds to a command's environment (a read-only git's safe
        settings) goes with terminal/create."""
        script = {CREATE: {"terminalId": "t1"}, WAIT: {"exitCode": 0}, OUTPUT: {"output": ""}, RELEASE: {}}
        workspace = self.workspace(script, terminals=True)
        self.inWorker(workspace, "runCommand", "git status", "/w", 10.0, threading.Event(), 100, None, None, None,
                      {"GIT_PAGER": "cat", "GIT_CONFIG_COUNT": "1"})
        env = {e["name"]: e["value"] for e in self.editor.last(CREATE).params["env"]}
        self.assertEqual((env["GIT_CONFIG_COUNT"], env["GIT_PAGER"], env["TERM"]), ("1", "cat", "dumb"))

    def test_alreadyCancelledCreatesNothing(self) -> None:
        """A command whose turn is already cancelled never reaches the editor."""
        workspace = self.workspace({}, terminals=True)
        cancelled = threading.Event()
        cancelled.set()
        result = self.inWorker(workspace, "runCommand", "ls", "/w", 10.0, cancelled)
        self.assertEqual((result.cancelled, result.exitCode, result.output), (True, None, ""))
        self.assertEqual(self.editor.methods, [])

    def test_terminalShownBeforeTheWait(self) -> None:
        """onStarted hears of the terminal in the worker's thread as soon as it exists,
        before wait_for_exit; a failing onStarted is logged and the command still runs
        and is released."""
        script = {CREATE: {"terminalId": "t1"}, WAIT: {"exitCode": 0}, OUTPUT: {"output": ""}, RELEASE: {}}
        workspace = self.workspace(script, terminals=True)
        heard: list[tuple[str, list[str], str]] = []

        def onStarted(terminalId: str) -> None:
            heard.append((terminalId, list(self.editor.methods), threading.current_thread().name))

        result = self.inWorker(workspace, "runCommand", "ls", "/w", 10.0, threading.Event(), 100, onStarted)
        self.assertEqual(heard, [("t1", [CREATE], "test-worker")])

        def broken(terminalId: str) -> None:
            raise RuntimeError("hook")

        workspace = self.workspace(script, terminals=True)
        result = self.inWorker(workspace, "runCommand", "ls", "/w", 10.0, threading.Event(), 100, broken)
        self.assertEqual((result.exitCode, self.editor.methods), (0, [CREATE, WAIT, OUTPUT, RELEASE]))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_readThroughTheEditor(self) -> None:
        """fs/read_text_file with the session and path; the content comes back."""
        workspace = self.workspace({"fs/read_text_file": {"content": "unsaved"}}, readFiles=True)
        self.assertEqual(self.inWorker(workspace, "readText", "/w/a.py"), "unsaved")
        [request] = self.editor.requests
        self.assertEqual((request.method, request.params, request.timeout), ("fs/read_text_file", {"sessionId": "s1", "path": "/w/a.py"}, FILE_TIMEOUT))
        self.assertEqual(self.local.calls, [])

    def test_writeThroughTheEditor(self) -> None:
        """fs/write_text_file carries the path and the whole content."""
        workspace = self.workspace({"fs/write_text_file": None}, writeFiles=True)
        self.assertIsNone(self.inWorker(workspace, "writeText", "/w/a.py", "x = 1\n"))
        self.assertEqual(self.editor.requests[0].params, {"sessionId": "s1", "path": "/w/a.py", "content": "x = 1\n"})

    def test_readErrors(self) -> None:
        """-32002 is FileNotFoundError. Any other failure for a file that exists
        locally is a WorkspaceError that keeps the editor's details; for a path
        that is not on the shared disk it is FileNotFoundError too (the TypeScript
        SDK answers a missing file with -32603 and "ENOENT" in data). A read that got
        no answer (cancelled, timed out) is never taken for a missing file."""
        present = str(Path(tempfile.mkdtemp()) / "present.txt")
        Path(present).write_text("x")
        enoent = RemoteError(-32603, "Internal error", {"details": "ENOENT: no such file or directory"})
        cases = [
            (RemoteError(-32002, "Resource not found"), present, FileNotFoundError),
            (enoent, "/w/gone.py", FileNotFoundError),
            (CancelledError(), "/w/gone.py", WorkspaceError),  # no answer at all: not "missing"
            (RemoteError(-32603, "Internal error", {"details": "EACCES: permission denied"}), present, WorkspaceError),
            (CancelledError(), present, WorkspaceError),
            (ConnectionDone("input closed"), present, WorkspaceError),
        ]
        for error, path, expected in cases:
            workspace = self.workspace({"fs/read_text_file": error}, readFiles=True)
            with self.assertRaises(expected) as caught:
                self.inWorker(workspace, "readText", path)
            if isinstance(error, RemoteError) and expected is WorkspaceError:
                self.assertIn("EACCES: permission denied", str(caught.exception))
        workspace = self.workspace({"fs/read_text_file": {"text": "wrong key"}}, readFiles=True)
        with self.assertRaises(WorkspaceError):
            self.inWorker(workspace, "readText", "/w/a.py")
        workspace = self.workspace({"fs/write_text_file": RemoteError(-32002, "no")}, writeFiles=True)
        with self.assertRaises(FileNotFoundError):
            self.inWorker(workspace, "writeText", "/w/new/a.py", "")

    def test_readTimesOut(self) -> None:
        """A read the editor never answers gives up after FILE_TIMEOUT."""
        workspace = self.workspace({}, readFiles=True)
        present = str(Path(tempfile.mkdtemp()) / "present.txt")
        Path(present).write_text("x")

        def work() -> str:
            return workspace.readText(present)

        with self.assertRaises(WorkspaceError) as caught:
            self.reactor.runInWorker(work, between=lambda: self.reactor.advance(FILE_TIMEOUT))
        self.assertIn("TimeoutError", str(caught.exception))

    def test_withoutCapabilitiesEverythingIsLocal(self) -> None:
        """An editor that offers nothing is never asked; the local workspace does the work."""
        workspace = self.workspace({})
        event = threading.Event()

        def work() -> Any:
            return workspace.readText("/w/a"), workspace.writeText("/w/b", "x"), workspace.runCommand("ls", "/w", 5.0, event, 99)

        text, _, result = self.reactor.runInWorker(work)
        self.assertEqual((text, result.output), ("local text", "local"))
        self.assertEqual(self.local.calls, [("readText", "/w/a"), ("writeText", "/w/b", "x"), ("runCommand", "ls", "/w", 5.0, event, 99, None, None, None, None, None)])
        self.assertEqual(self.editor.requests, [])
