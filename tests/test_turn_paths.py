"""Turn paths the real engine never takes: an engine that crashes mid-call, or
leaves a call open. The ACP layer must still finalize every tool call and
answer exactly once. In-process, on the real reactor, with a StringTransport."""

from __future__ import annotations

import gc
import json
import tempfile
import threading
import weakref
from pathlib import Path
from collections.abc import Callable
from typing import Any

import attrs
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.internet.testing import StringTransport
from zope.interface import implementer

from hermes_acp.acp import ACPServer
from hermes_acp.config import Endpoint, Settings
from hermes_acp.engine.access import EditProposal
from hermes_acp.engine.result import TurnResult, TurnUsage
from hermes_acp.engine.skills import Catalog, SkillLibrary
from hermes_acp.interfaces import IAgentFactory, IEngineAgent
from hermes_acp.sessions import SessionManager
from hermes_acp.threads import WorkerPool

from . import acpschema


@implementer(IEngineAgent)
@attrs.define(eq=False)
class ScriptedAgent:
    """Stands in for the engine: runs ``behaviour(agent, content, observer)`` in the
    worker thread, reporting through the run's observer as the engine does."""

    behaviour: Any
    editMode: str = "default"
    contextWindow: int | None = None
    vision: bool | None = None
    interrupted: threading.Event = attrs.field(factory=threading.Event)
    skillsCatalog: Any = None  # the last run's

    def interrupt(self) -> None:
        self.interrupted.set()

    def run_conversation(self, user_message: Any, conversation_history: Any, observer: Any, workspace: Any = None,
                         cancelEvent: Any = None, extraTools: Any = None, checkpoint: Any = None,
                         skillsCatalog: Any = None) -> TurnResult:
        self.skillsCatalog = skillsCatalog
        return self.behaviour(self, user_message, observer)

    def compact(self, conversation_history: Any, observer: Any, focus: str = "", cancelEvent: Any = None,
                extraTools: Any = None) -> TurnResult:
        return self.behaviour(self, None, observer)

    def activeTools(self) -> dict[str, Any]:
        return {}

    def setEditMode(self, mode: str) -> None:
        self.editMode = mode


@implementer(IAgentFactory)
@attrs.define
class ScriptedFactory:
    behaviour: Any

    def buildAgent(self, session: Any) -> ScriptedAgent:
        return ScriptedAgent(self.behaviour)

    def configure(self, agent: ScriptedAgent, session: Any) -> None:
        agent.setEditMode(session.mode)


class WatchedTransport(StringTransport):
    """A StringTransport that says when what it was written holds a wanted frame."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: list[tuple[Callable[[], bool], Deferred[None]]] = []

    def writeSequence(self, data: Any) -> None:
        self.write(b"".join(data))

    def write(self, data: bytes) -> None:
        super().write(data)
        for watch in list(self.watches):
            if watch[0]():
                self.watches.remove(watch)
                reactor.callLater(0, watch[1].callback, None)  # after the writer has finished

    def when(self, condition: Callable[[], bool], timeout: float = 10) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if condition():
            d.callback(None)
        else:
            self.watches.append((condition, d))
        return d.addTimeout(timeout, reactor)


class Harness:
    def __init__(self, behaviour: Any, models: tuple[str, ...] = (), transport: WatchedTransport | None = None) -> None:
        home = Path(tempfile.mkdtemp())
        self.sessions = SessionManager(reactor, home / "state.db")
        self.workers = WorkerPool(reactor, 4)
        self.sessions.dbThread.startService()
        self.workers.startService()
        endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", "k", "m", models)
        self.server = ACPServer(reactor, Settings(), self.sessions, self.workers, lambda: endpoint, ScriptedFactory(behaviour))
        self.connection = self.server.buildProtocol()
        self.transport = WatchedTransport() if transport is None else transport
        self.connection.makeConnection(self.transport)
        self.nextId = 0
        self.methods: dict[str, str] = {}

    def send(self, method: str, params: dict[str, Any]) -> int:
        self.nextId += 1
        self.methods[json.dumps(self.nextId)] = method
        frame = {"jsonrpc": "2.0", "id": self.nextId, "method": method, "params": params}
        self.connection.dataReceived(json.dumps(frame).encode() + b"\n")
        return self.nextId

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.transport.value().splitlines()]

    def _answer(self, requestId: int) -> dict[str, Any] | None:
        return next((f for f in self.frames() if f.get("id") == requestId and "method" not in f), None)

    async def answer(self, requestId: int, timeout: float = 10) -> dict[str, Any]:
        """The answer to a request, once it is written (at most ``timeout`` s)."""
        await self.transport.when(lambda: self._answer(requestId) is not None, timeout)
        found = self._answer(requestId)
        assert found is not None
        return found

    def problems(self) -> list[str]:
        return [p for f in self.frames() for p in acpschema.checkAgentFrame(f, self.methods)]

    async def stop(self) -> None:
        await self.server.shutdown()
        await self.workers.stopService()
        await self.sessions.dbThread.stopService()


async def sessionOn(h: Harness) -> str:
    h.send("initialize", {"protocolVersion": 1})
    created = await h.answer(h.send("session/new", {"cwd": tempfile.gettempdir(), "mcpServers": []}))
    return created["result"]["sessionId"]


def prompt(h: Harness, sessionId: str, text: str = "go") -> int:
    return h.send("session/prompt", {"sessionId": sessionId, "prompt": [{"type": "text", "text": text}]})


async def runTurn(behaviour: Any) -> tuple[Harness, dict[str, Any], list[dict[str, Any]]]:
    h = Harness(behaviour)
    try:
        sessionId = await sessionOn(h)
        response = await h.answer(prompt(h, sessionId))
        updates = [f["params"]["update"] for f in h.frames() if f.get("method") == "session/update"]
        return h, response, updates
    finally:
        await h.stop()


def finalStatuses(updates: list[dict[str, Any]]) -> dict[str, str]:
    statuses: dict[str, str] = {}
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update") and "status" in update:
            statuses[update["toolCallId"]] = update["status"]
    return statuses


@pytest_twisted.ensureDeferred
async def test_engineCrashMidCall() -> None:
    """The engine starts a call and then raises: the call is swept to failed, the
    user is told, and the prompt is answered (not left hanging)."""

    def crash(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        observer.toolStarted("1.0", "terminal", {"command": "make"}, {})
        raise RuntimeError("engine bug")

    h, response, updates = await runTurn(crash)
    assert response["error"]["code"] == -32603 and "stopped unexpectedly" in response["error"]["message"]
    assert finalStatuses(updates) and set(finalStatuses(updates).values()) == {"failed"}
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_aFinishedTurnIsFreedWithoutTheCollector() -> None:
    """Once answered and saved, a turn holds no cycle: it is freed when the last reference
    goes, not left for the garbage collector's full passes, which hold every thread for tens
    of milliseconds once many sessions are open (issue 27)."""
    turns: list[weakref.ref[Any]] = []

    def answer(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        turns.append(weakref.ref(observer.turn))
        observer.text("done")
        return TurnResult("done", [{"role": "user", "content": "go"}, {"role": "assistant", "content": "done"}],
                          TurnUsage(), "end_turn")

    h = Harness(answer)
    gc.collect()
    gc.disable()
    try:
        sessionId = await sessionOn(h)
        for n in range(3):
            assert "result" in await h.answer(prompt(h, sessionId, f"turn {n}"))
        await h.server._prompts.saved(h.sessions.sessions[sessionId])  # the last turn's save, too
        await deferLater(reactor, 0.05, lambda: None)  # (what its callbacks still hold, let go)
        assert len(turns) == 3
        assert [ref() for ref in turns] == [None, None, None]
    finally:
        gc.enable()
        await h.stop()


@pytest_twisted.ensureDeferred
async def test_aTurnReadsTheSkillsAgainAtItsEndOnlyWhenItCalledATool(monkeypatch) -> None:
    """A turn reads the session's skills at its start and gives the engine what it found (the
    system prompt lists them without a read of its own); it reads them again at its end only
    when the model called a tool (``skill_manage``, a command or a write may have changed them)."""
    reads: list[str] = []
    catalog = SkillLibrary.catalog
    monkeypatch.setattr(SkillLibrary, "catalog", lambda self, cwd: reads.append(cwd) or catalog(self, cwd))
    given: list[Any] = []

    def behaviour(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        given.append(agent.skillsCatalog)
        called = [{"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c", "content": "ok"}] if "call" in str(content) else []
        return TurnResult("done", [{"role": "user", "content": str(content)}, *called,
                                   {"role": "assistant", "content": "done"}], TurnUsage(), "end_turn")

    h = Harness(behaviour)
    try:
        sessionId = await sessionOn(h)
        assert "result" in await h.answer(prompt(h, sessionId, "first"))  # (the session's own read is over)
        counted = []
        for text in ("plain", "call", "plain"):
            reads.clear()
            assert "result" in await h.answer(prompt(h, sessionId, text))
            counted.append(len(reads))
        assert counted == [1, 2, 1]
        assert len(given) == 4 and all(isinstance(found, Catalog) for found in given)
        assert h.problems() == []
    finally:
        await h.stop()


@pytest_twisted.ensureDeferred
async def test_callLeftOpenIsSwept() -> None:
    """The engine returns without finishing a call it started: the sweep gives it
    a final status before the response, and nothing is sent after the response."""

    def forgetful(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        observer.toolStarted("1.0", "read_file", {"path": "a.txt"}, {"path": "/tmp/a.txt"})
        observer.text("partial answer")
        return TurnResult("partial answer", [{"role": "user", "content": "go"}], TurnUsage(), "end_turn")

    h, response, updates = await runTurn(forgetful)
    assert finalStatuses(updates) == {list(finalStatuses(updates))[0]: "failed"}
    frames = h.frames()
    answered = next(i for i, f in enumerate(frames) if f.get("id") == response["id"])
    assert [f for f in frames[answered + 1 :] if f.get("method") == "session/update"] == []
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_lateEventsAfterAnswerAreDropped() -> None:
    """Text the engine emits after its turn was answered never reaches the editor."""
    leak: dict[str, Any] = {}

    def quick(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        leak["send"] = observer.text
        return TurnResult("", [], TurnUsage(), "end_turn")

    h, response, updates = await runTurn(quick)
    before = len(h.frames())
    await deferToThread(leak["send"], "late text")
    await deferLater(reactor, 0.1, lambda: None)  # past the bridge's coalescing timer
    assert len(h.frames()) == before
    assert "late text" not in h.transport.value().decode()


@pytest_twisted.ensureDeferred
async def test_longSessionReplaysItsTailWithANotice(monkeypatch: Any) -> None:
    """Over the replay caps, session/load replays the newest updates whole and says
    what it left out (as text when the editor takes no notices)."""
    import hermes_acp.sessions

    monkeypatch.setattr(hermes_acp.sessions, "REPLAY_MAX_UPDATES", 5)

    def busy(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        for index in range(10):
            observer.toolStarted(f"1.{index}", "read_file", {"path": f"{index}.txt"}, {})
            observer.toolEnded(f"1.{index}", "read_file", f"text {index}", False, {})
        return TurnResult("", [{"role": "user", "content": "go"}], TurnUsage(), "end_turn")

    h = Harness(busy)
    try:
        sessionId = await sessionOn(h)
        await h.answer(prompt(h, sessionId))
        live = [f["params"]["update"] for f in h.frames() if f.get("method") == "session/update"]
        mark = len(h.frames())
        await h.answer(h.send("session/load", {"sessionId": sessionId, "cwd": tempfile.gettempdir(), "mcpServers": []}))
        replay = [f["params"]["update"] for f in h.frames()[mark:] if f.get("method") == "session/update"]
    finally:
        await h.stop()
    notice, *tail = replay[:-2]  # the last two are the commands and usage updates after the response
    assert "not replayed" in notice["content"]["text"]
    assert tail == live[-5:]
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_turnEndRefusedByTheStoreDoesNotWedge() -> None:
    """Another process marked the running turn interrupted (a second editor window
    loaded the session): the prompt still answers its stop reason, the turn's
    messages are kept, and the next prompt works."""
    ids: dict[str, str] = {}

    def meddled(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        harness.sessions._database().recoverInterrupted(ids["session"])  # as another process would
        return TurnResult("ok", [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}], TurnUsage(), "end_turn")

    harness = h = Harness(meddled)
    try:
        ids["session"] = sessionId = await sessionOn(h)
        first = await h.answer(prompt(h, sessionId))
        second = await h.answer(prompt(h, sessionId))
        stored = await h.sessions.call("loadMessages", sessionId)
    finally:
        await h.stop()
    assert first["result"]["stopReason"] == "end_turn"
    assert second["result"]["stopReason"] == "end_turn"
    assert [m["content"] for m in stored] == ["go", "ok", "go", "ok"]


@pytest_twisted.ensureDeferred
async def test_allowAlwaysSwitchesTheModeWhenAnswered() -> None:
    """"Allow edits for this session" switches the session to accept_edits as the
    answer arrives: the engine already runs in the new mode when it hears the
    answer, and a mode the user picks afterwards is the one that stays."""
    answered, proceed = threading.Event(), threading.Event()
    seen: dict[str, str] = {}

    def edits(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        observer.toolStarted("1.0", "write_file", {"path": "a.txt"}, {})
        proposal = EditProposal("write_file", "/tmp/a.txt", None, "new")
        seen["answer"] = observer.approveEdit("1.0", proposal)
        seen["modeOnAnswer"] = agent.editMode
        answered.set()
        proceed.wait(10)
        observer.toolEnded("1.0", "write_file", "written", False, {})
        return TurnResult("", [{"role": "user", "content": "go"}], TurnUsage(), "end_turn")

    h = Harness(edits)
    try:
        sessionId = await sessionOn(h)
        turn = prompt(h, sessionId)
        await h.transport.when(lambda: any(f.get("method") == "session/request_permission" for f in h.frames()))
        question = next(f for f in h.frames() if f.get("method") == "session/request_permission")
        reply = {"jsonrpc": "2.0", "id": question["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow_always"}}}
        h.connection.dataReceived(json.dumps(reply).encode() + b"\n")
        assert await deferToThread(answered.wait, 10)
        await h.answer(h.send("session/set_mode", {"sessionId": sessionId, "modeId": "default"}))
        proceed.set()
        response = await h.answer(turn)
    finally:
        proceed.set()
        await h.stop()
    assert seen == {"answer": "allow_always", "modeOnAnswer": "accept_edits"}
    assert response["result"]["stopReason"] == "end_turn"
    modes = [f["params"]["update"]["currentModeId"] for f in h.frames()
             if f.get("method") == "session/update" and f["params"]["update"]["sessionUpdate"] == "current_mode_update"]
    assert modes == ["accept_edits", "default"]
    assert h.sessions.sessions[sessionId].mode == "default"
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_promptSentDuringCloseIsCancelled() -> None:
    """session/close cancels the running turn and waits for it; a prompt that
    arrives meanwhile is cancelled too, never run on the forgotten session."""
    running, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        runs.append(str(content))
        running.set()
        agent.interrupted.wait(10)
        release.wait(10)
        return TurnResult("", [{"role": "user", "content": content}], TurnUsage(), "cancelled")

    h = Harness(slow)
    try:
        sessionId = await sessionOn(h)
        first = prompt(h, sessionId, "first")
        assert await deferToThread(running.wait, 10)
        closing = h.send("session/close", {"sessionId": sessionId})
        second = prompt(h, sessionId, "second")
        release.set()
        answers = [await h.answer(first), await h.answer(second), await h.answer(closing)]
    finally:
        release.set()
        await h.stop()
    assert [a["result"].get("stopReason") for a in answers] == ["cancelled", "cancelled", None]
    assert len(runs) == 1
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_aTurnFailingWithCancelledErrorStillAnswers() -> None:
    """A store failure that is a CancelledError answers the prompt with an internal
    error; it is not taken for the editor cancelling the request (-32800)."""

    def unused(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        raise AssertionError("the engine must not run")

    h = Harness(unused)

    async def refused(state: Any, prompt: Any = None) -> None:
        raise CancelledError("the database went away")

    try:
        sessionId = await sessionOn(h)
        h.sessions.beginTurn = refused  # type: ignore[method-assign]
        response = await h.answer(prompt(h, sessionId))
    finally:
        await h.stop()
    assert response["error"]["code"] == -32603 and "stopped unexpectedly" in response["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_noQuestionAfterTheTurnWasCancelled() -> None:
    """A tool thread that asks after its turn was cancelled (a late approval, a
    read, a command) is answered "cancelled" at once; the editor is never asked."""
    answers: list[str] = []

    def late(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        observer.toolStarted("1.0", "terminal", {"command": "rm -rf x"}, {})
        observer.toolStarted("1.1", "read_file", {"path": "/etc/x"}, {"path": "/etc/x"})
        assert agent.interrupted.wait(10)
        answers.append(observer.approveCommand("1.0", "rm -rf x", "recursive delete"))
        answers.append(observer.approveRead("1.1", "/etc/x", "reads outside the workspace"))
        return TurnResult("", [{"role": "user", "content": "go"}], TurnUsage(), "cancelled")

    h = Harness(late)
    try:
        sessionId = await sessionOn(h)
        running = prompt(h, sessionId)
        await h.transport.when(lambda: sum(f.get("method") == "session/update" and
                                           f["params"]["update"]["sessionUpdate"] == "tool_call" for f in h.frames()) >= 2)
        frame = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sessionId}}
        h.connection.dataReceived(json.dumps(frame).encode() + b"\n")
        response = await h.answer(running)
    finally:
        await h.stop()
    assert response["result"]["stopReason"] == "cancelled"
    assert answers == ["cancelled", "cancelled"]
    assert not any(f.get("method") == "session/request_permission" for f in h.frames())


@pytest_twisted.ensureDeferred
async def test_aCancelledStreamAnswersBeforeItsWorkerIsDone() -> None:
    """A cancel of a turn that is only streaming text answers ``cancelled`` at once, after the
    text sent before it; what its worker sends afterwards never reaches the editor, and the
    session's next prompt starts only once that worker is done and the turn is saved."""
    streaming, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def stream(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        runs.append(str(content))
        if len(runs) > 1:
            return TurnResult("next", [{"role": "user", "content": content}, {"role": "assistant", "content": "next"}],
                              TurnUsage(), "end_turn")
        observer.text("before the cancel")
        streaming.set()
        assert agent.interrupted.wait(10)
        release.wait(10)  # the worker is slow to unwind
        observer.text("after the cancel")
        return TurnResult("before the cancel", [{"role": "user", "content": content},
                                                {"role": "assistant", "content": "before the cancel"}],
                          TurnUsage(), "cancelled")

    h = Harness(stream)
    try:
        sessionId = await sessionOn(h)
        first = prompt(h, sessionId, "first")
        assert await deferToThread(streaming.wait, 10)
        await h.transport.when(lambda: "before the cancel" in h.transport.value().decode())
        h.connection.dataReceived(json.dumps({"jsonrpc": "2.0", "method": "session/cancel",
                                              "params": {"sessionId": sessionId}}).encode() + b"\n")
        answered = await h.answer(first)
        second = prompt(h, sessionId, "second")
        await deferLater(reactor, 0.2, lambda: None)
        waited = list(runs)  # the second prompt waits for the first turn's worker
        release.set()
        answers = [answered, await h.answer(second)]
        history = [m["content"] for m in h.sessions.sessions[sessionId].history]
    finally:
        release.set()
        await h.stop()
    assert [a["result"]["stopReason"] for a in answers] == ["cancelled", "end_turn"]
    assert waited == ["first"] and len(runs) == 2
    assert "after the cancel" not in h.transport.value().decode()
    assert history == ["first", "before the cancel", "second", "next"]
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_theContextACancelledTurnUsedIsToldByTheNextTurn() -> None:
    """A turn answered ``cancelled`` before its worker is done sends nothing after that answer
    (ACP: a turn's updates come before its answer), even once its worker says how much context
    its requests used; the session's next turn tells the editor first thing, then its own."""
    release = threading.Event()
    runs: list[Any] = []
    inner = slowToUnwind(release, runs)

    def stream(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        result = inner(agent, content, observer)
        return attrs.evolve(result, last_prompt_tokens=4321 if len(runs) == 1 else 99)

    def usage(frames: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(i, f["params"]["update"]["used"]) for i, f in enumerate(frames) if f.get("method") == "session/update"
                and f["params"]["update"]["sessionUpdate"] == "usage_update"]

    h = Harness(stream)
    try:
        sessionId = await sessionOn(h)
        answered = await cancelledEarly(h, sessionId)
        release.set()
        state = h.sessions.sessions[sessionId]
        for _ in range(200):  # (at most 10 s) until the cancelled turn is saved
            if len(state.history) == 2:
                break
            await deferLater(reactor, 0.05, lambda: None)
        assert len(state.history) == 2
        await deferLater(reactor, 0.1, lambda: None)
        silent = h.frames()
        second = prompt(h, sessionId, "second")
        await h.answer(second)
        frames = h.frames()
    finally:
        release.set()
        await h.stop()
    assert answered["result"]["stopReason"] == "cancelled"
    cancelledAt = next(i for i, f in enumerate(frames) if f.get("result", {}).get("stopReason") == "cancelled")
    assert [f for f in silent[cancelledAt + 1:] if f.get("method") == "session/update"] == []
    answeredAt = next(i for i, f in enumerate(frames) if f.get("result", {}).get("stopReason") == "end_turn")
    assert [(n, i < answeredAt) for i, n in usage(frames) if i > cancelledAt] == [(4321, True), (99, True)]
    assert h.problems() == []


def slowToUnwind(release: threading.Event, runs: list[Any], first: Callable[[ScriptedAgent], None] = lambda agent: None
                 ) -> Callable[[ScriptedAgent, Any, Any], TurnResult]:
    """An engine whose first run streams, is cancelled, and unwinds only once ``release`` is
    set (its turn answers ``cancelled`` before that); the next runs answer at once."""

    def stream(agent: ScriptedAgent, content: Any, observer: Any) -> TurnResult:
        runs.append((str(content), agent.vision))
        if len(runs) > 1:
            return TurnResult("next", [{"role": "user", "content": content}, {"role": "assistant", "content": "next"}],
                              TurnUsage(), "end_turn")
        first(agent)
        observer.text("before the cancel")
        assert agent.interrupted.wait(10)
        release.wait(10)
        return TurnResult("before the cancel", [{"role": "user", "content": content},
                                                {"role": "assistant", "content": "before the cancel"}],
                          TurnUsage(), "cancelled")

    return stream


async def cancelledEarly(h: Harness, sessionId: str) -> dict[str, Any]:
    """Prompt "first", cancel it once its text is shown: its answer (its worker still runs)."""
    first = prompt(h, sessionId, "first")
    await h.transport.when(lambda: "before the cancel" in h.transport.value().decode())
    h.connection.dataReceived(json.dumps({"jsonrpc": "2.0", "method": "session/cancel",
                                          "params": {"sessionId": sessionId}}).encode() + b"\n")
    return await h.answer(first)


@pytest_twisted.ensureDeferred
async def test_aForkAfterACancelHasTheCancelledTurn() -> None:
    """A fork asked for once a cancelled turn has answered (its worker still unwinding) has
    that turn's prompt and answer so far in its history, as it would once the turn is saved:
    the copy waits for the save, rather than copying a turn cut off as interrupted."""
    release = threading.Event()
    runs: list[Any] = []
    h = Harness(slowToUnwind(release, runs))
    try:
        sessionId = await sessionOn(h)
        answered = await cancelledEarly(h, sessionId)
        fork = h.send("session/fork", {"sessionId": sessionId, "cwd": tempfile.gettempdir(), "mcpServers": []})
        await deferLater(reactor, 0.2, lambda: None)
        release.set()
        forked = await h.answer(fork)
        history = [m["content"] for m in h.sessions.sessions[forked["result"]["sessionId"]].history]
    finally:
        release.set()
        await h.stop()
    assert answered["result"]["stopReason"] == "cancelled"
    assert history == ["first", "before the cancel"]
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_aModelChosenAfterACancelIsNotTakenForTheCancelledTurnsModel() -> None:
    """What a cancelled turn learned of its model (it takes no images) is its model's, also
    when the user picks another model before its worker is done: the next turn's model is
    still shown images."""
    release = threading.Event()
    runs: list[Any] = []

    def blind(agent: ScriptedAgent) -> None:
        agent.vision = False  # the endpoint refused the images of model "m"

    h = Harness(slowToUnwind(release, runs, blind), models=("m", "m2"))
    try:
        sessionId = await sessionOn(h)
        await cancelledEarly(h, sessionId)
        chosen = await h.answer(h.send("session/set_config_option",
                                       {"sessionId": sessionId, "configId": "model", "value": "m2"}))
        release.set()
        answered = await h.answer(prompt(h, sessionId, "second"))
        catalog = h.server._prompts.services.catalog
    finally:
        release.set()
        await h.stop()
    assert "result" in chosen and answered["result"]["stopReason"] == "end_turn"
    assert [vision for _, vision in runs] == [None, None]
    assert catalog.sees("m") is False and catalog.sees("m2") is None
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_aListAfterACancelledFirstPromptHasTheSession() -> None:
    """A session whose first prompt was cancelled (answered, its worker still unwinding) is
    listed at once, with the title the editor was told: the list waits for the turn's save."""
    release = threading.Event()
    h = Harness(slowToUnwind(release, []))
    try:
        sessionId = await sessionOn(h)
        await cancelledEarly(h, sessionId)
        listing = h.send("session/list", {})
        await deferLater(reactor, 0.2, lambda: None)
        release.set()
        listed = (await h.answer(listing))["result"]["sessions"]
    finally:
        release.set()
        await h.stop()
    assert [(s["sessionId"], s.get("title")) for s in listed] == [(sessionId, "first")]
    assert h.problems() == []
