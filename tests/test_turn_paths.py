"""Turn paths the real engine never takes: an engine that crashes mid-call, or
leaves a call open. The ACP layer must still finalize every tool call and
answer exactly once. In-process, on the real reactor, with a StringTransport."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.internet.testing import StringTransport
from zope.interface import implementer

from hermes_acp.acp import ACPAgent
from hermes_acp.config import Endpoint, Settings
from hermes_acp.engine.agent import TurnResult, TurnUsage
from hermes_acp.interfaces import IAgentFactory
from hermes_acp.sessions import SessionManager
from hermes_acp.threads import WorkerPool

from . import acpschema


@attrs.define(eq=False)
class ScriptedAgent:
    """Stands in for the engine: runs ``behaviour`` in the worker thread."""

    behaviour: Any
    editMode: str = "default"
    interrupted: threading.Event = attrs.field(factory=threading.Event)
    stream_delta_callback: Any = None
    thinking_callback: Any = None
    tool_progress_callback: Any = None
    command_approval_callback: Any = None
    edit_approval_callback: Any = None
    workspace: Any = None

    def interrupt(self) -> None:
        self.interrupted.set()

    def run_conversation(self, content: Any, history: list[dict[str, Any]], cancelEvent: Any = None) -> TurnResult:
        return self.behaviour(self, content)

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


class Harness:
    def __init__(self, behaviour: Any) -> None:
        home = Path(tempfile.mkdtemp())
        self.sessions = SessionManager(reactor, home / "state.db")
        self.workers = WorkerPool(reactor, 4)
        self.sessions.dbThread.startService()
        self.workers.startService()
        endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", "k", "m")
        self.agent = ACPAgent(reactor, Settings(), self.sessions, self.workers, lambda: endpoint, ScriptedFactory(behaviour))
        self.connection = self.agent.buildProtocol()
        self.transport = StringTransport()
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

    async def answer(self, requestId: int, timeout: float = 10) -> dict[str, Any]:
        for _ in range(int(timeout / 0.01)):
            for frame in self.frames():
                if frame.get("id") == requestId and "method" not in frame:
                    return frame
            await deferLater(reactor, 0.01, lambda: None)
        raise AssertionError(f"no answer to {requestId}")

    def problems(self) -> list[str]:
        return [p for f in self.frames() for p in acpschema.checkAgentFrame(f, self.methods)]

    async def stop(self) -> None:
        await self.agent.shutdown()
        await self.workers.stopService()
        await self.sessions.dbThread.stopService()


async def runTurn(behaviour: Any) -> tuple[Harness, dict[str, Any], list[dict[str, Any]]]:
    h = Harness(behaviour)
    try:
        h.send("initialize", {"protocolVersion": 1})
        created = await h.answer(h.send("session/new", {"cwd": tempfile.gettempdir(), "mcpServers": []}))
        sessionId = created["result"]["sessionId"]
        response = await h.answer(h.send("session/prompt", {"sessionId": sessionId, "prompt": [{"type": "text", "text": "go"}]}))
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

    def crash(agent: ScriptedAgent, content: Any) -> TurnResult:
        agent.tool_progress_callback("started", "terminal", "c1", {"command": "make"}, {})
        raise RuntimeError("engine bug")

    h, response, updates = await runTurn(crash)
    assert response["result"]["stopReason"] == "end_turn"
    assert finalStatuses(updates) and set(finalStatuses(updates).values()) == {"failed"}
    assert any("Internal error" in u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_callLeftOpenIsSwept() -> None:
    """The engine returns without finishing a call it started: the sweep gives it
    a final status before the response, and nothing is sent after the response."""

    def forgetful(agent: ScriptedAgent, content: Any) -> TurnResult:
        agent.tool_progress_callback("started", "read_file", "r1", {"path": "a.txt"}, {"path": "/tmp/a.txt"})
        agent.stream_delta_callback("partial answer")
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

    def quick(agent: ScriptedAgent, content: Any) -> TurnResult:
        leak["send"] = agent.stream_delta_callback
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

    def busy(agent: ScriptedAgent, content: Any) -> TurnResult:
        for index in range(10):
            agent.tool_progress_callback("started", "read_file", f"r{index}", {"path": f"{index}.txt"}, {})
            agent.tool_progress_callback("finished", "read_file", f"r{index}", f"text {index}", {})
        return TurnResult("", [{"role": "user", "content": "go"}], TurnUsage(), "end_turn")

    h = Harness(busy)
    try:
        h.send("initialize", {"protocolVersion": 1})
        created = await h.answer(h.send("session/new", {"cwd": tempfile.gettempdir(), "mcpServers": []}))
        sessionId = created["result"]["sessionId"]
        await h.answer(h.send("session/prompt", {"sessionId": sessionId, "prompt": [{"type": "text", "text": "go"}]}))
        live = [f["params"]["update"] for f in h.frames() if f.get("method") == "session/update"]
        mark = len(h.frames())
        await h.answer(h.send("session/load", {"sessionId": sessionId, "cwd": tempfile.gettempdir(), "mcpServers": []}))
        replay = [f["params"]["update"] for f in h.frames()[mark:] if f.get("method") == "session/update"]
    finally:
        await h.stop()
    notice, *tail = replay[:-1]  # the last one is the commands update after the response
    assert "not replayed" in notice["content"]["text"]
    assert tail == live[-5:]
    assert h.problems() == []


@pytest_twisted.ensureDeferred
async def test_turnEndRefusedByTheStoreDoesNotWedge() -> None:
    """Another process marked the running turn interrupted (a second editor window
    loaded the session): the prompt still answers its stop reason, the turn's
    messages are kept, and the next prompt works."""
    ids: dict[str, str] = {}

    def meddled(agent: ScriptedAgent, content: Any) -> TurnResult:
        harness.sessions._database().recoverInterrupted(ids["session"])  # as another process would
        return TurnResult("ok", [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}], TurnUsage(), "end_turn")

    harness = h = Harness(meddled)
    try:
        h.send("initialize", {"protocolVersion": 1})
        created = await h.answer(h.send("session/new", {"cwd": tempfile.gettempdir(), "mcpServers": []}))
        ids["session"] = sessionId = created["result"]["sessionId"]
        prompt = {"sessionId": sessionId, "prompt": [{"type": "text", "text": "go"}]}
        first = await h.answer(h.send("session/prompt", prompt))
        second = await h.answer(h.send("session/prompt", prompt))
        stored = await h.sessions.call("loadMessages", sessionId)
    finally:
        await h.stop()
    assert first["result"]["stopReason"] == "end_turn"
    assert second["result"]["stopReason"] == "end_turn"
    assert [m["content"] for m in stored] == ["go", "ok", "go", "ok"]
