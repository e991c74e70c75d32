"""``session/prompt`` and ``session/cancel``: one turn at a time per session.

A turn runs the blocking agent on the worker pool; its events come back
through an :class:`EventBridge` and become ``session/update``s. Every tool call
that starts reaches a final status, whatever happens; nothing is sent for a
turn after its response; a prompt that arrives while the session is busy waits
its turn and is answered when that turn ends.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.logger import Logger

from .bridge import EventBridge
from .clientio import ClientWorkspace
from .commands import runCommand, slashCommand
from .intake import checkPrompt, promptText, toModelContent
from .params import field
from .permissions import ALLOW_ALWAYS, ALLOW_ONCE, REJECT_ALWAYS, REJECT_ONCE, TIMEOUT
from .render import Renderer, planEntries, textContent
from .sessions import SessionState
from .store import timestamp

if TYPE_CHECKING:
    from .acp import ACPAgent
    from .engine.edits import EditProposal

log = Logger()

#: What the engine hears for each permission outcome; anything else denies.
ANSWERS = {ALLOW_ONCE: "once", ALLOW_ALWAYS: "always", REJECT_ONCE: "deny", REJECT_ALWAYS: "never", TIMEOUT: "timeout"}
TITLE_LENGTH = 60
_ids = itertools.count(1)


def turnUsage(usage: Any) -> dict[str, int]:
    return {
        "inputTokens": usage.inputTokens,
        "outputTokens": usage.outputTokens,
        "totalTokens": usage.totalTokens,
        "thoughtTokens": usage.thoughtTokens,
        "cachedReadTokens": usage.cachedReadTokens,
    }


def estimateTokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4


@attrs.define(eq=False)
class PromptTurn:
    """One prompt: waiting, running, then answered exactly once."""

    hub: ACPAgent
    state: SessionState
    blocks: list[dict[str, Any]]
    renderer: Renderer
    turnId: str = attrs.field(factory=lambda: uuid.uuid4().hex[:12])
    answered: bool = False
    calls: set[Deferred[Any]] = attrs.field(factory=set)
    openCalls: dict[str, tuple[str, dict[str, Any]]] = attrs.field(factory=dict)
    fifo: dict[tuple[str, str], deque[str]] = attrs.field(factory=lambda: defaultdict(deque))
    messageSeq: int = 0
    _myTurn: Deferred[None] = attrs.field(factory=Deferred)
    _waiters: list[Deferred[dict[str, Any]]] = attrs.field(factory=list)
    _result: Any = None
    cancelEvent: threading.Event = attrs.field(factory=threading.Event)
    _startLock: threading.Lock = attrs.field(factory=threading.Lock)
    _started: bool = False
    _notStarted: Deferred[None] | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancelEvent.is_set()

    # -- the request side ---------------------------------------------------

    def start(self) -> None:
        d = Deferred.fromCoroutine(self._lifecycle())
        d.addBoth(self._finished)

    def _finished(self, result: Any) -> None:
        self._result = result
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(result)

    def whenDone(self) -> Deferred[dict[str, Any]]:
        """A fresh Deferred with the turn's result; cancelling it leaves the turn alone."""
        if self._result is not None:
            d: Deferred[dict[str, Any]] = Deferred()
            d.callback(self._result)
            return d
        d = Deferred()
        self._waiters.append(d)
        return d

    def cancel(self) -> None:
        """Stop the model, tools, client terminals and permission requests."""
        if self.cancelled or self.answered:
            return
        with self._startLock:
            self.cancelEvent.set()  # seen by the engine if its turn has not begun yet
            notStarted = not self._started
        if self.state.running is self:
            if notStarted and self._notStarted is not None:
                self._notStarted.callback(None)  # still waiting for a worker: answer now
            elif self.state.agent is not None:
                self.state.agent.interrupt()
            for d in list(self.calls):
                d.cancel()
        elif self in self.state.queued:
            self.state.queued.remove(self)
            self._myTurn.callback(None)

    # -- running --------------------------------------------------------------

    async def _lifecycle(self) -> dict[str, Any]:
        state = self.state
        queued = state.running is not None or bool(state.queued)
        if queued:
            state.queued.append(self)
            await self._myTurn
            if self.cancelled:
                self.answered = True
                return {"stopReason": "cancelled"}
        state.running = self
        try:
            return await self._execute(echo=queued)
        finally:
            state.running = None
            self.answered = True
            if state.queued:
                state.queued.popleft()._myTurn.callback(None)

    async def _execute(self, echo: bool) -> dict[str, Any]:
        state, hub = self.state, self.hub
        text = promptText(self.blocks)
        command = slashCommand(text, self.blocks)
        if command is None:
            hub.requireAuthenticated()
        await hub.sessions.beginTurn(state)
        userMessage = f"{self.turnId}-user"
        for block in self.blocks:
            update = {"sessionUpdate": "user_message_chunk", "content": block, "messageId": userMessage}
            if echo:
                hub.sendUpdate(state, update)
            else:
                hub.sessions.journalUpdate(state, update)
        messages: list[dict[str, Any]] = []
        response: dict[str, Any] = {"stopReason": "end_turn"}
        try:
            if command is not None:
                reply = await runCommand(hub, state, *command)
                self.sendText("agent_message_chunk", reply)
            elif not self.cancelled and (result := await self._runAgent()) is not None:
                messages = result.messages
                response = {"stopReason": result.stop_reason, "usage": turnUsage(result.usage)}
                for name, count in response["usage"].items():
                    state.usageTotals[name] = state.usageTotals.get(name, 0) + count
                if state.agent is not None and state.agent.editMode != state.mode:
                    hub.lifecycle.applyMode(state, state.agent.editMode)  # "always allow" an edit
                if result.error:
                    self.sendText("agent_message_chunk", f"\n\n**Model error:** {result.error}")
                state.contextUsed = result.last_prompt_tokens or estimateTokens(state.history + messages)
        except Exception:
            log.failure("turn {turn} in session {id} crashed", turn=self.turnId, id=state.sessionId)
            self.sendText("agent_message_chunk", "\n\n**Internal error:** the agent stopped unexpectedly; see the agent's log.")
        finally:
            self.sweep()
        if self.cancelled:
            response["stopReason"] = "cancelled"
        if command is None:
            hub.sendUpdate(state, {"sessionUpdate": "usage_update", "used": state.contextUsed, "size": hub.settings.contextWindow})
        if state.title is None and text and command is None:
            state.title = _title(text)
            hub.sendUpdate(state, {"sessionUpdate": "session_info_update", "title": state.title, "updatedAt": timestamp()})
        state.history.extend(messages)
        await hub.sessions.endTurn(state, messages)
        self.answered = True
        return response

    async def _runAgent(self) -> Any:
        state, hub = self.state, self.hub
        agent = hub.agentFor(state)
        bridge = EventBridge(hub.reactor, self.deliver, paused=lambda: hub.connection is not None and hub.connection.paused)
        agent.stream_delta_callback = bridge.message
        agent.thinking_callback = bridge.thought
        agent.tool_progress_callback = lambda *event: bridge.event(event)
        agent.command_approval_callback = lambda command, reason: bridge.call(self.askCommand, command, reason)
        agent.edit_approval_callback = lambda proposal: bridge.call(self.askEdit, proposal)
        agent.workspace = hub.workspaceFor(state, self.request, self.terminalStarted)
        history = list(state.history)

        def work() -> Any:
            with self._startLock:
                if self.cancelEvent.is_set():
                    return None  # cancelled while waiting for a worker; already answered
                self._started = True
            try:
                content = toModelContent(self.blocks, self.cancelEvent)
                return agent.run_conversation(content, history, self.cancelEvent)
            finally:
                bridge.flush()

        outcome: Deferred[Any] = Deferred()
        self._notStarted = Deferred()
        self._notStarted.addCallback(lambda _: outcome.called or outcome.callback(None))
        hub.workers.run(work).addBoth(lambda result: None if outcome.called else outcome.callback(result))
        try:
            return await outcome
        finally:
            agent.stream_delta_callback = agent.thinking_callback = agent.tool_progress_callback = None
            agent.command_approval_callback = agent.edit_approval_callback = None

    # -- events from the worker (reactor thread) ------------------------------

    def deliver(self, events: list[tuple[str, Any]]) -> Any:
        if self.answered:
            log.warn("dropping {n} late event(s) for turn {turn}", n=len(events), turn=self.turnId)
            return None
        for kind, payload in events:
            if kind == "event":
                self.toolEvent(*payload)
            else:
                self.sendText(kind, payload)
        return self.hub.connection.whenWritable() if self.hub.connection is not None else None

    def sendText(self, kind: str, text: str) -> None:
        """Chunks of one message share its id; thoughts are a message of their own."""
        if text:
            messageId = f"{self.turnId}-{self.messageSeq}" + ("-thought" if kind == "agent_thought_chunk" else "")
            self.hub.sendUpdate(
                self.state, {"sessionUpdate": kind, "content": {"type": "text", "text": text}, "messageId": messageId}
            )

    def terminalStarted(self, command: str, terminalId: str) -> None:
        """The editor made a terminal for a command: show it in the card while it runs."""
        found = self._openCall("terminal", lambda args: args.get("command") == command)
        if found is not None and not self.answered:
            update = {"sessionUpdate": "tool_call_update", "toolCallId": found[0], "content": [{"type": "terminal", "terminalId": terminalId}]}
            self.hub.sendUpdate(self.state, update)

    def toolEvent(self, event: str, name: str, providerId: str, payload: Any, extras: dict[str, Any] | None) -> None:
        self.messageSeq += 1  # text after a tool call is a new message
        extras = extras or {}
        if event == "started":
            callId = f"{self.turnId}-{next(_ids)}"
            args = payload if isinstance(payload, dict) else {"arguments": payload}
            self.fifo[(name, providerId)].append(callId)
            self.openCalls[callId] = (name, args)
            self.hub.sendUpdate(self.state, self.renderer.toolStarted(callId, name, args, extras))
            self.hub.sendUpdate(self.state, {"sessionUpdate": "tool_call_update", "toolCallId": callId, "status": "in_progress"})
            return
        queue = self.fifo.get((name, providerId))
        if not queue:
            log.warn("{event} for unknown tool call {name}/{id}", event=event, name=name, id=providerId)
            return
        callId = queue.popleft()
        name, args = self.openCalls.pop(callId)
        failed = event != "finished"
        self.hub.sendUpdate(self.state, self.renderer.toolFinished(callId, name, args, payload, failed, extras))
        if name == "todo" and not failed and isinstance(extras.get("todos"), list):
            self.hub.sendUpdate(self.state, {"sessionUpdate": "plan", "entries": planEntries(extras["todos"])})

    def sweep(self) -> None:
        """Give every tool call still open a final status."""
        for callId in list(self.openCalls):
            self.openCalls.pop(callId)
            reason = "cancelled" if self.cancelled else "the turn ended before it finished"
            self.hub.sendUpdate(
                self.state,
                {"sessionUpdate": "tool_call_update", "toolCallId": callId, "status": "failed", "content": [textContent(f"Not completed: {reason}.")]},
            )
        self.fifo.clear()

    # -- requests to the editor for this turn ----------------------------------

    def request(self, method: str, params: dict[str, Any], timeout: float | None = None, track: bool = True) -> Deferred[Any]:
        """A request the turn owns: cancelling the turn cancels it."""
        if track and self.cancelled:
            return fail(CancelledError(f"{method}: the turn was cancelled"))
        d = self.hub.connection.callRemote(method, params, timeout)
        if track:
            self.calls.add(d)
            d.addBoth(lambda result: (self.calls.discard(d), result)[1])
        return d

    def _openCall(self, name: str, matches: Any) -> tuple[str, dict[str, Any]] | None:
        for callId, (callName, args) in self.openCalls.items():
            if callName == name and matches(args):
                return callId, args
        return None

    def askEdit(self, proposal: EditProposal) -> Deferred[str]:
        found = self._openCall(proposal.toolName, lambda args: self.renderer.absolute(args.get("path")) == proposal.path)
        callId, args = found or (f"{self.turnId}-edit-{next(_ids)}", {"path": proposal.path})
        detail = {"path": proposal.path, "oldText": proposal.oldText, "newText": proposal.newText}
        return self._ask(self.renderer.permissionToolCall(callId, proposal.toolName, args, detail), "edit")

    def askCommand(self, command: str, reason: str) -> Deferred[str]:
        found = self._openCall("terminal", lambda args: args.get("command") == command)
        callId, args = found or (f"{self.turnId}-command-{next(_ids)}", {"command": command})
        return self._ask(self.renderer.permissionToolCall(callId, "terminal", args, {"command": command, "reason": reason}), "execute")

    def _ask(self, toolCall: dict[str, Any], kind: str) -> Deferred[str]:
        if self.cancelled:
            d: Deferred[str] = Deferred()
            d.callback("deny")
            return d
        d = self.hub.permissions.requestPermission(self.state.sessionId, toolCall, kind)
        self.calls.add(d)
        d.addBoth(lambda outcome: (self.calls.discard(d), outcome)[1])
        d.addCallback(lambda outcome: ANSWERS.get(outcome, "deny"))
        return d


def _title(text: str) -> str:
    first = text.strip().splitlines()[0].strip()
    return first if len(first) <= TITLE_LENGTH else first[: TITLE_LENGTH - 1] + "…"


class Turns:
    """The prompt-turn methods of one connection."""

    def __init__(self, hub: ACPAgent) -> None:
        self.hub = hub

    def handlers(self) -> dict[str, Any]:
        return {"session/prompt": self.prompt}

    def notifications(self) -> dict[str, Any]:
        return {"session/cancel": self.cancel}

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self.hub.sessions.get(field(params, "sessionId", str))
        blocks = checkPrompt(params.get("prompt"), image=True, embedded=True)
        turn = PromptTurn(self.hub, state, blocks, Renderer(state.cwd))
        turn.start()
        while True:
            try:
                return await turn.whenDone()
            except CancelledError:  # $/cancel_request for this prompt
                turn.cancel()

    async def cancel(self, params: dict[str, Any]) -> None:
        sessionId = params.get("sessionId")
        state = self.hub.sessions.sessions.get(sessionId) if isinstance(sessionId, str) else None
        if state is None:
            log.info("session/cancel for unknown or idle session {id!r}", id=sessionId)
            return
        self.cancelTurns(state)

    def cancelTurns(self, state: SessionState) -> list[PromptTurn]:
        turns = [t for t in (state.running, *state.queued) if t is not None]
        for turn in reversed(turns):  # queued ones first, so none starts in between
            turn.cancel()
        return turns

    async def cancelAll(self, state: SessionState) -> None:
        """Cancel everything in the session and wait until every turn has answered
        (however it answered)."""
        for turn in self.cancelTurns(state):
            try:
                await turn.whenDone()
            except Exception:
                pass  # that turn's own request reported it
