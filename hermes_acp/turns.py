"""``session/prompt`` and ``session/cancel``: one turn at a time per session.

A turn is one prompt and its answer. Each session has a ``TurnQueue``, and each
turn moves through explicit phases, in this order only::

    queued ──▶ waiting ──▶ running ──▶ finishing ──▶ answered
      │           └────────────────────▲
      └───────────────────────────────────────────────▲

- *queued*: behind the session's running turn (a cancel answers it at once);
- *waiting*: begun in the store, waiting for a worker thread (a cancel answers it
  without ever running the engine) or about to run its slash command;
- *running*: the engine on a worker thread, or the command on the reactor (a
  cancel interrupts the engine and every request the turn has out);
- *finishing*: every tool card gets a final status, the turn is saved;
- *answered*: the prompt has its answer; anything that still arrives is dropped.

A cancelled engine turn with no tool call or compaction under way answers as soon as
the text that came before the cancel is shown (waiting or running ──▶ answered): the worker's
unwinding and the turn's save come after the answer (with 200 sessions cancelled at
once, they took most of the time to the last answer). The turn is *finished* only
once it is saved, and the session's next turn, a ``session/close`` and the shutdown
wait for that, so the history and the store see the turns in order.

Engine events come back through an ``EventBridge`` and become
``session/update``s; each tool call's card is keyed by the engine's own call id.
A model failure, or a turn that crashed, answers the prompt with a JSON-RPC error
once everything else is done and saved.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger
from twisted.python.failure import Failure

from .bridge import SUBAGENT_CHUNK, SUMMARY_CHUNK, BridgedObserver, EventBridge
from .catalog import ModelCatalog
from .commands import Commands, slashCommand
from .client import ClientInfo
from .config import DEFAULT_PERMISSION_TIMEOUT, Endpoint
from .engine import exhausted
from .engine.approval import ALLOWED, CANCELLED, FAILED, TIMEOUT, refusal
from .engine.access import PLAN, EditProposal, modeAfter, modeAfterPlan, planRefusal
from .engine import asking
from .engine.titles import capped
from .interfaces import IEngineAgent, IPermissionBroker, IRenderer, ISessionOptions, ISessionStore, IUpdateChannel
from .intake import checkPrompt, promptText, toModelContent
from .jsonrpc import AuthRequired, InternalError, JSONRPCError
from .mcp import prompts, resources, toolset
from .mcp.registry import ASK, DENY, MCPServers
from .mcp.toolset import Route
from .mcp.wire import CallFailed
from .naming import SessionNamer
from .oneshot import OneShot
from .params import field
from .questions import choiceOptions, formRequest, noAnswer, readChoice, readForm, serverAnswer, serverQuestion
from .render import planEntries, planSteps, shownOutput, textContent
from .session_state import SessionState
from .skillcommands import SkillCommands
from .store import timestamp
from . import subagents
from .updates import usageUpdate

if TYPE_CHECKING:
    from .backgroundcards import BackgroundCards
    from .engine.checkpoints import CheckpointStore
    from .engine.model import ModelError
    from .engine.skills import Catalog, Skill
    from .engine.result import TurnResult
    from .engine.workspace import Workspace

log = Logger()

#: An MCP call's progress is shown at most this often (seconds).
PROGRESS_EVERY = 0.1
CRASHED = "Internal error: the turn stopped unexpectedly; the agent's log has the details"
QUEUED, WAITING, RUNNING, FINISHING, ANSWERED = "queued", "waiting", "running", "finishing", "answered"
_MOVES = {
    QUEUED: {WAITING, ANSWERED},
    WAITING: {RUNNING, FINISHING, ANSWERED},
    RUNNING: {FINISHING, ANSWERED},
    FINISHING: {ANSWERED},
    ANSWERED: set(),
}


class ModelFailed(InternalError):
    """The model endpoint failed in a way retrying did not fix; ``data`` says so
    (``{"reason": "model"}``), so clients need not read the message."""


def modelFailure(error: ModelError) -> JSONRPCError:
    """The prompt's error for a model failure: a rejected key asks the editor to set
    up authentication again; anything else is a model error."""
    if error.auth:
        return AuthRequired(f"Authentication required: {error}", {"reason": "model", "auth": True})
    return ModelFailed(f"Model error: {error}", {"reason": "model", "retryable": error.retryable})


@attrs.frozen
class TurnServices:
    """What a turn works with, wired once per connection."""

    reactor: IReactorFromThreads
    store: ISessionStore
    options: ISessionOptions
    updates: IUpdateChannel
    permissions: IPermissionBroker
    runInWorker: Callable[..., Deferred[Any]]
    commands: Commands
    #: ``workspaceFor(state, request)``: the editor's files and terminals for one turn.
    workspaceFor: Callable[[SessionState, Callable[..., Deferred[Any]]], Workspace]
    #: How a turn of the session shows its tool calls.
    rendererFor: Callable[[SessionState], IRenderer]
    #: The endpoint for a turn that needs the model, or -32000 saying what to do.
    requireEndpoint: Callable[[], Endpoint]
    #: The models and their context windows (``usage_update.size``; an overflow error teaches it).
    catalog: ModelCatalog
    #: Send a request to the editor (the connection's ``callRemote``).
    callRemote: Callable[..., Deferred[Any]]
    #: The sessions' MCP servers: their tools, and the calls of them.
    mcp: MCPServers
    #: Asks the model for a session's title after its first exchange (None: never).
    namer: SessionNamer | None = None
    #: What the editor offers (how a question to the user is asked).
    client: ClientInfo = attrs.field(factory=ClientInfo)
    #: How long a question to the user waits for its answer (HERMES_ACP_PERMISSION_TIMEOUT).
    askTimeout: float = DEFAULT_PERMISSION_TIMEOUT
    #: The cards of background processes, which outlive the turn (None: none are started).
    background: BackgroundCards | None = None
    #: The sessions' skills: read again at each turn's start and end, ``/NAME`` runs one (None: none).
    skills: SkillCommands | None = None
    #: Where each turn's checkpoint of the session's folders goes (None: checkpoints are off).
    checkpoints: Callable[[], CheckpointStore | None] = lambda: None


@attrs.define(eq=False)
class Turn:
    """One prompt: queued, run, and answered exactly once."""

    services: TurnServices
    queue: TurnQueue
    session: SessionState
    blocks: list[dict[str, Any]]
    renderer: IRenderer
    turnId: str = attrs.field(factory=lambda: uuid.uuid4().hex[:12])
    phase: str = QUEUED
    #: Queued behind another turn: its prompt is shown when it starts.
    echo: bool = False
    cancelEvent: threading.Event = attrs.field(factory=threading.Event)
    agent: IEngineAgent | None = None
    #: The editor requests and permission questions the turn has out.
    requests: set[Deferred[Any]] = attrs.field(factory=set)
    #: Open tool cards: the engine's call id -> (toolCallId, tool name, arguments).
    cards: dict[str, tuple[str, str, dict[str, Any]]] = attrs.field(factory=dict)
    messageSeq: int = 0
    #: Compactions begun and not yet ended (a crash's sweep fails them).
    compactions: set[str] = attrs.field(factory=set)
    #: The MCP tools the model was offered in this turn, by name, and when each call's progress was last shown.
    routes: dict[str, Route] = attrs.field(factory=dict)
    progressShown: dict[str, float] = attrs.field(factory=dict)
    #: ``delegate_task``'s children as cards, and their transcripts (``subagents.ChildCards``).
    #: (Its ``send`` holds the session, not the turn: a finished turn is freed at once, not left
    #: in a cycle for the garbage collector, whose full passes stall every session.)
    children: subagents.ChildCards = attrs.field(default=attrs.Factory(lambda self: subagents.ChildCards(
        self.session.sessionId, functools.partial(self.services.updates.send, self.session),
        self.cards, self.services.client.subagents), takes_self=True))
    #: What the model gets as the user's message when it is not the prompt (an MCP prompt's messages).
    modelBlocks: list[dict[str, Any]] | None = None
    _answer: OneShot[dict[str, Any]] = attrs.field(factory=OneShot)
    #: Fires once the turn is over and saved (after its answer, or long after a cancel's).
    _done: OneShot[None] = attrs.field(factory=OneShot)
    #: The engine run's bridge, while the engine may be running (a cancel answers through it).
    _bridge: EventBridge | None = None
    #: The prompt's text when the turn may title the session (not a command's, not a compaction's).
    _titleText: str | None = None
    _claimLock: threading.Lock = attrs.field(factory=threading.Lock)
    _claimed: bool = False  # a worker thread has started the engine
    _engineDone: Deferred[TurnResult | None] | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancelEvent.is_set()

    def _move(self, phase: str) -> None:
        if phase not in _MOVES[self.phase]:
            raise RuntimeError(f"turn {self.turnId} cannot go from {self.phase} to {phase}")
        self.phase = phase

    def whenAnswered(self) -> Deferred[dict[str, Any]]:
        """A fresh Deferred with the turn's answer; cancelling it leaves the turn alone."""
        return self._answer.when()

    def whenFinished(self) -> Deferred[None]:
        """A fresh Deferred that fires once the turn is over and saved, however it answered."""
        return self._done.when()

    @property
    def finished(self) -> bool:
        return self._done.fired

    def cancel(self) -> None:
        """What a cancel does depends on the phase (see the module docstring)."""
        if self.phase == ANSWERED or self.cancelled:
            return
        with self._claimLock:
            self.cancelEvent.set()  # the engine sees it, if it is just starting
            claimed = self._claimed
        if self.phase == QUEUED:
            self.queue.withdraw(self)
            self._move(ANSWERED)
            self._answer.fire({"stopReason": "cancelled"})
            self._done.fire(None)  # it never ran
        elif self.phase == WAITING and not claimed:
            if self._engineDone is not None and not self._engineDone.called:
                self._engineDone.callback(None)  # answer now; the worker will not run the engine
            for d in list(self.requests):  # (an MCP prompt being fetched)
                d.cancel()
        elif self.phase in (WAITING, RUNNING):
            if self.agent is not None:
                self.agent.interrupt()
            for d in list(self.requests):
                d.cancel()
            if self._bridge is not None:  # the engine's worker unwinds, and the turn is saved, after the answer
                self._bridge.settle(self._answerCancelled)

    def _answerCancelled(self) -> None:
        """Answer the cancelled engine turn now, once its text so far is shown
        (``EventBridge.settle``); what its worker still sends is dropped. The rest of the turn
        (its messages, its save) follows when the worker is done; it sends nothing more. A turn
        with a tool call or a compaction under way answers when its worker is done, as any
        turn does: their cards end with what the engine says of them (a command's output so far)."""
        if self.phase not in (WAITING, RUNNING) or self.cards or self.compactions:
            return
        self.sweep()
        self._showTitle()
        self._move(ANSWERED)
        self._answer.fire({"stopReason": "cancelled"})

    # -- running ------------------------------------------------------------------

    async def run(self) -> None:
        """From waiting to answered; the answer (or the error) goes to every waiter."""
        self._move(WAITING)
        try:
            response = await self._execute()
        except CancelledError:  # from the store, say: never to be taken for the editor's cancel
            log.failure("turn {turn} in session {id} was cut short", turn=self.turnId, id=self.session.sessionId)
            self._settle()
            self._answer.fire(Failure(InternalError(CRASHED)))
        except Exception:
            if self._answer.fired:  # answered at its cancel: the editor has its answer, the log the rest
                log.failure("finishing cancelled turn {turn} in session {id} failed", turn=self.turnId,
                            id=self.session.sessionId)
            self._settle()
            self._answer.fire(Failure())
        else:
            self._answer.fire(response)
        finally:
            self._done.fire(None)

    def _settle(self) -> None:
        """Whatever happened, the turn ends answered."""
        if self.phase in (WAITING, RUNNING):
            self._move(FINISHING)
        if self.phase == FINISHING:
            self._move(ANSWERED)

    async def _execute(self) -> dict[str, Any]:
        session, services = self.session, self.services
        text = promptText(self.blocks)
        catalog = None if services.skills is None else await services.skills.refresh(session)
        command = slashCommand(text, self.blocks)
        skill = None if command is not None or services.skills is None else services.skills.invoked(
            catalog, text, self.blocks)
        compact = command[1] if command is not None and command[0] == "compact" else None
        if compact is not None:
            command = None  # a turn of the engine, with its own kind of run
        endpoint = services.requireEndpoint() if command is None else None
        model = session.model  # (the user may pick another before a cancelled turn, answered, is saved)
        textOnly = all(block.get("type") == "text" for block in self.blocks)
        prompted = prompts.split(text) if command is None and compact is None and textOnly else None
        if prompted is not None:  # /mcp__SERVER__PROMPT, once the servers are up (else text for the model)
            await services.mcp.ready(session)
            found = services.mcp.promptFor(session, prompted[0])
            prompted = None if found is None else (*found, prompted[1])
        await services.store.beginTurn(session, text if command is None and compact is None else None)
        if command is None and compact is None:
            self._titleText = text
        for block in self.blocks:
            update = {"sessionUpdate": "user_message_chunk", "content": block, "messageId": f"{self.turnId}-user"}
            if self.echo:
                services.updates.send(session, update)
            else:  # the editor shows the prompt it sent; the replay needs it
                services.store.journalUpdate(session, update)
        if session.usageOwed:  # (the last turn, cancelled, was answered before it knew its context)
            session.usageOwed = False
            services.updates.send(session, usageUpdate(session, services.catalog))
        messages: list[dict[str, Any]] = []
        result: TurnResult | None = None
        response: dict[str, Any] = {"stopReason": "end_turn"}
        failure: JSONRPCError | None = None
        try:
            if command is not None:
                self._move(RUNNING)
                self.sendText("agent_message_chunk", await services.commands.run(session, *command, track=self._track))
            elif prompted is not None and (problem := await self._fetchPrompt(*prompted)) is not None:
                self._move(RUNNING)
                self.sendText("agent_message_chunk", problem)
            elif not self.cancelled and (result := await self._runEngine(compact, skill, catalog)) is not None:
                messages = result.messages
                response = {"stopReason": result.stop_reason, "usage": attrs.asdict(result.usage)}
                for name, count in response["usage"].items():
                    session.usageTotals[name] = session.usageTotals.get(name, 0) + count
                if result.cost is not None:
                    session.cost = (session.cost or 0.0) + result.cost
                if result.failure is not None:
                    failure = modelFailure(result.failure)
                session.contextUsed = result.last_prompt_tokens
        except Exception as e:
            log.failure("turn {turn} in session {id} crashed", turn=self.turnId, id=session.sessionId)
            ranOut = exhausted.describe(e)
            failure = InternalError(CRASHED if ranOut is None else f"Internal error: {ranOut}; the turn stopped")
        finally:
            if self.phase in (WAITING, RUNNING):
                self._move(FINISHING)
            self.sweep()
        if services.skills is not None and not self.cancelled and result is not None and _calledTools(result):
            await services.skills.refresh(session)  # skill_manage (or a command) may have changed them
        if self.cancelled:
            response["stopReason"], failure = "cancelled", None
        if command is None:
            if result is not None and result.window:
                services.catalog.learnWindow(model, result.window)
            if self.agent is not None and self.agent.vision is False:
                services.catalog.learnBlind(model)  # the endpoint refused its images
            if self.phase != ANSWERED:
                services.updates.send(session, usageUpdate(session, services.catalog))
            else:  # answered at its cancel: it sends nothing more, and the next turn tells the editor
                session.usageOwed = True
        if self._showTitle():
            # A better title in the background, never delaying the answer; not for a failed or cancelled turn.
            if services.namer is not None and endpoint is not None and failure is None and not self.cancelled:
                answer = "\n".join(m["content"] for m in messages if m.get("role") == "assistant"
                                 and isinstance(m.get("content"), str))
                services.namer.ask(session, endpoint, text, answer)
        if failure is not None:  # the editor shows the error; a later replay shows this line
            services.store.journalUpdate(session, {"sessionUpdate": "agent_message_chunk", "messageId": f"{self.turnId}-failed",
                                                   "content": {"type": "text", "text": f"\n\n_{failure.message}_\n"}})
        replaced = result.history if result is not None else None
        if replaced is not None:
            session.history = list(replaced)
        else:
            session.history.extend(messages)
        await services.store.endTurn(session, messages, replaced, self.children.asides)
        if self.phase != ANSWERED:
            self._move(ANSWERED)
        if failure is not None:
            raise failure
        return response

    def _showTitle(self) -> bool:
        """The session's first prompt titles it (for now): True when this turn's did."""
        session, text = self.session, self._titleText
        if session.title is not None or not text:
            return False
        session.title, session.autoTitle = _title(text), True
        self.services.updates.send(session, {"sessionUpdate": "session_info_update", "title": session.title,
                                             "updatedAt": timestamp()})
        return True

    async def _runEngine(self, compact: str | None = None, skill: tuple[Skill, str] | None = None,
                         catalog: Catalog | None = None) -> TurnResult | None:
        """The engine on a worker thread; None when the turn was cancelled before one
        was free. The engine's events cross back through the bridge, in order. With
        ``compact`` (``/compact``'s focus, maybe "") the run is one compaction; with
        ``skill`` (``/NAME request``) the user's message is the skill's instructions;
        ``catalog``: the skills read for the turn, which its system prompt lists."""
        services = self.services
        self.agent = agent = services.options.agentFor(self.session)
        agent.contextWindow = services.catalog.window(self.session.model)
        agent.vision = services.catalog.sees(self.session.model)
        bridge = self._bridge = EventBridge(services.reactor, self.deliver, paused=lambda: services.updates.paused)
        observer = BridgedObserver(bridge, self)
        workspace = services.workspaceFor(self.session, self.request)
        history = list(self.session.history)
        tools: dict[str, Any] = {}
        checkpoint = None
        if compact is None and (checkpoints := services.checkpoints()) is not None:
            from .engine.checkpoints import TurnCheckpoint  # imported with the engine, after start-up

            checkpoint = TurnCheckpoint(checkpoints, self.session.sessionId, self.session.turnNumber,
                                        self.session.roots)

        def work() -> TurnResult | None:
            with self._claimLock:
                if self.cancelEvent.is_set():
                    return None  # cancelled while waiting for a worker; already answered
                self._claimed = True
            services.reactor.callFromThread(self._workerStarted)
            try:
                if compact is not None:
                    result = agent.compact(history, observer, compact, self.cancelEvent, tools)
                else:
                    if skill is not None and services.skills is not None:
                        content: Any = services.skills.library.activation(*skill)
                    else:
                        content = toModelContent(self.modelBlocks or self.blocks, self.cancelEvent)
                    result = agent.run_conversation(content, history, observer, workspace, self.cancelEvent, tools,
                                                    checkpoint, catalog)
            finally:
                bridge.flush()
            return result

        def serversSettled(_: object) -> Deferred[TurnResult | None] | None:
            """The session's MCP handshakes are over (or out of time): run with the tools there are."""
            if done.called:
                return None  # cancelled while waiting for them
            services.mcp.tellHeld(self.session)
            offered, self.routes = services.mcp.toolsFor(self.session)
            tools.update(offered)
            return services.runInWorker(work)

        def finished(result: Any) -> None:
            self._bridge = None
            if done.called:
                return
            if isinstance(result, Failure):
                done.errback(result)  # the turn reports it as crashed; it never waits on
            else:
                done.callback(result)

        done: Deferred[TurnResult | None] = Deferred()
        self._engineDone = done
        ready = succeed(None) if compact is not None else services.mcp.ready(self.session)
        ready.addCallback(serversSettled).addBoth(finished)
        return await done

    async def _fetchPrompt(self, route: prompts.PromptRoute, link: Any, text: str) -> str | None:
        """An MCP prompt's messages become what the model gets (None), or the reason they
        cannot (a required argument missing, the server's error), told to the user instead."""
        if self.cancelled:
            return ""  # (no reply: the turn answers "cancelled")
        try:
            arguments = prompts.parseArguments(route, text)
        except ValueError as e:
            return str(e)
        d = link.ask("prompts/get", {"name": route.prompt, "arguments": arguments})
        self._track(d)
        try:
            result = await d
            self.modelBlocks = prompts.blocks(result, route, self.services.mcp.settings.mcpResourceBytes)
        except CancelledError:
            return ""
        except (CallFailed, ValueError) as e:
            return f"/{route.command}: {e}"
        return None

    def _workerStarted(self) -> None:
        if self.phase == WAITING:
            self._move(RUNNING)

    # -- the engine's events, on the reactor thread ----------------------------------

    def deliver(self, events: list[tuple[str, Any]]) -> Any:
        if self.phase == ANSWERED:
            if not self.cancelled:  # (a cancelled turn's worker goes on for a moment after its answer)
                log.warn("dropping {n} late event(s) for turn {turn}", n=len(events), turn=self.turnId)
            return None
        for kind, payload in events:
            if kind == "event":
                handler, args = payload
                handler(*args)
            elif kind == SUMMARY_CHUNK:
                for compactionId in self.compactions:  # one at a time
                    self.services.updates.compactionChunk(self.session, compactionId, payload)
            elif kind.startswith(SUBAGENT_CHUNK):
                _, callId, child = kind.split("\t")
                self.subagentText(callId, int(child), payload)
            else:
                self.sendText(kind, payload)
        updates = self.services.updates
        return updates.whenWritable() if updates.paused else None  # (no Deferred per frame while it keeps up)

    def sendText(self, kind: str, text: str) -> None:
        """Chunks of one message share its id; thoughts are a message of their own."""
        if text:
            messageId = f"{self.turnId}-{self.messageSeq}" + ("-thought" if kind == "agent_thought_chunk" else "")
            update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}, "messageId": messageId}
            self.services.updates.send(self.session, update)

    def toolStarted(self, callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None:
        self.messageSeq += 1  # text after a tool call is a new message
        toolCallId = f"{self.turnId}-{callId}"
        self.cards[callId] = (toolCallId, name, arguments)
        self.children.callStarted(toolCallId, extras)
        self.sendCard(self.renderer.toolStarted(toolCallId, name, arguments, extras), title=True)

    def sendCard(self, update: dict[str, Any], journal: bool = True, title: bool = False) -> None:
        """A card's update; a child's carries its tag (how the editor sees it is ``subagents``')."""
        self.services.updates.send(self.session, self.children.tagged(update, title), journal)

    def subagentStarted(self, callId: str, child: int, name: str, goal: str) -> None:
        self.children.started(callId, child, name, goal)

    def subagentText(self, callId: str, child: int, delta: str) -> None:
        self.children.text(callId, child, delta)

    def subagentEnded(self, callId: str, child: int, status: str, summary: str) -> None:
        self.children.ended(callId, child, status, summary)

    def toolRunning(self, callId: str) -> None:
        """The call left the reply's queue: its card goes from pending to in progress."""
        card = self.cards.get(callId)
        if card is not None:
            self.sendCard({"sessionUpdate": "tool_call_update", "toolCallId": card[0], "status": "in_progress"})

    def toolEnded(self, callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None:
        self.messageSeq += 1
        card = self.cards.pop(callId, None)
        if card is None:
            log.warn("end of unknown tool call {id} ({name})", id=callId, name=name)
            return
        toolCallId, _, arguments = card
        extras = self.children.callEnded(toolCallId, name, extras)  # a delegate call's transcripts kept aside
        if name == "terminal" and not failed and extras.get("background") and self.services.background is not None:
            # The card lives on with the process; a child's stays the child's (its tag goes with it).
            self.services.background.adopt(self.session, toolCallId, extras, self.children.tags.get(toolCallId))
            self.children.forget(toolCallId)
            return
        self.sendCard(self.renderer.toolFinished(toolCallId, name, arguments, result, failed, extras))
        child = self.children.forget(toolCallId)
        if name == "todo" and not child and not failed and isinstance(extras.get("todos"), list):
            self.services.updates.send(self.session, {"sessionUpdate": "plan", "entries": planEntries(extras["todos"])})

    def compactionStarted(self, compactionId: str, reason: str) -> None:
        self.messageSeq += 1
        self.compactions.add(compactionId)
        self.services.updates.compaction(self.session, compactionId, "in_progress")

    def compactionEnded(self, compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None:
        """The editor sees the summary (or why it failed) and, after a compaction, the
        smaller context at once."""
        self.messageSeq += 1
        self.compactions.discard(compactionId)
        if status == "completed":
            text = f"{summary}\n\n_About {before:,} → {after:,} tokens._"
        else:
            text = "Cancelled." if status == "cancelled" else f"Compaction failed: {error}."
        updates = self.services.updates
        updates.compaction(self.session, compactionId, status, text)
        if status == "completed":
            self.session.contextUsed = after
            updates.send(self.session, usageUpdate(self.session, self.services.catalog))

    def terminalStarted(self, callId: str, terminalId: str) -> None:
        """The editor made a terminal for the call's command: show it in its card."""
        card = self.cards.get(callId)
        if card is not None:
            self.sendCard({"sessionUpdate": "tool_call_update", "toolCallId": card[0],
                           "content": [{"type": "terminal", "terminalId": terminalId}]})

    def commandOutput(self, callId: str, output: str) -> None:
        """The output so far of a command that runs here: shown in its card as the editor's
        terminal would show it. Not journaled: the card's final update carries the output."""
        card = self.cards.get(callId)
        if card is not None and self.phase != ANSWERED and not self.cancelled:
            self.sendCard({"sessionUpdate": "tool_call_update", "toolCallId": card[0],
                           "content": [textContent(shownOutput(output, "(no output yet)"))]}, journal=False)

    def sweep(self) -> None:
        """Give every tool card still open a final status."""
        reason = "cancelled" if self.cancelled else "the turn ended before it finished"
        for toolCallId, _, _ in self.cards.values():
            self.sendCard({
                "sessionUpdate": "tool_call_update", "toolCallId": toolCallId, "status": "failed",
                "content": [textContent(f"Not completed: {reason}.")],
            })  # fmt: skip
        self.cards.clear()
        self.children.clear()
        for compactionId in sorted(self.compactions):
            self.services.updates.compaction(self.session, compactionId, "failed", f"Not completed: {reason}.")
        self.compactions.clear()

    # -- requests to the editor for this turn ----------------------------------------

    def request(self, method: str, params: dict[str, Any], timeout: float | None = None, track: bool = True) -> Deferred[Any]:
        """A request the turn owns: cancelling the turn cancels it (unless ``track`` is false)."""
        if track and self.cancelled:
            return fail(CancelledError(f"{method}: the turn was cancelled"))
        d = self.services.callRemote(method, params, timeout)
        if track:
            self._track(d)
        return d

    def _track(self, d: Deferred[Any]) -> None:
        self.requests.add(d)
        d.addBoth(lambda result: (self.requests.discard(d), result)[1])

    def askEdit(self, callId: str, proposal: EditProposal) -> Deferred[str]:
        """Ask under the call's own card (its start always crosses first); an answer
        that changes the mode does so here, on the reactor, before the engine hears
        it and in order with the editor's own mode changes."""
        if self._over():
            return succeed(CANCELLED)
        toolCallId, name, arguments = self.cards[callId]
        detail = {"path": proposal.path, "oldText": proposal.oldText, "newText": proposal.newText}
        d = self._ask(self.renderer.permissionToolCall(toolCallId, name, arguments, detail), "edit")
        return d.addCallback(self._editAnswered)

    def _editAnswered(self, answer: str) -> str:
        mode = modeAfter(self.session.mode, answer)
        if mode != self.session.mode:
            self.services.options.setMode(self.session, mode)
        return answer

    def askCommand(self, callId: str, command: str, reason: str) -> Deferred[str]:
        if self._over():
            return succeed(CANCELLED)
        toolCallId, _, arguments = self.cards[callId]
        detail = {"command": command, "reason": reason}
        return self._ask(self.renderer.permissionToolCall(toolCallId, "terminal", arguments, detail), "execute")

    def askRead(self, callId: str, path: str, reason: str) -> Deferred[str]:
        if self._over():
            return succeed(CANCELLED)
        toolCallId, name, arguments = self.cards[callId]
        detail = {"path": path, "reason": reason}
        return self._ask(self.renderer.permissionToolCall(toolCallId, name, arguments, detail), "read")

    def askPlan(self, callId: str, plan: str) -> Deferred[str]:
        """The plan of plan mode: shown as the editor's plan and in the call's card, then
        asked about; an answer that leaves plan mode switches the mode here, at once
        (like ``_editAnswered``), before the engine hears it."""
        if self._over():
            return succeed(CANCELLED)
        toolCallId, name, arguments = self.cards[callId]
        send = self.services.updates.send
        send(self.session, {"sessionUpdate": "plan", "entries": planSteps(plan)})
        send(self.session, {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                            "content": [textContent(plan)]})
        detail = {"text": plan, "title": "Ready to implement this plan?", "kind": "switch_mode"}
        d = self._ask(self.renderer.permissionToolCall(toolCallId, name, arguments, detail), "plan")
        return d.addCallback(self._planAnswered)

    def _planAnswered(self, answer: str) -> str:
        mode = modeAfterPlan(answer)
        if mode != PLAN and self.session.mode == PLAN:
            self.services.options.setMode(self.session, mode)
        return answer

    def askUser(self, callId: str, question: str, choices: list[str]) -> Deferred[tuple[str, str]]:
        """A ``clarify`` question, in the form the editor takes: a form (``elicitation/create``)
        under the call's card; else a permission request with the choices as options; else
        (free text wanted) the question ends the turn as the agent's message, so the user's
        next prompt answers it. A cancel of the turn or the timeout ends the wait at once."""
        return Deferred.fromCoroutine(self._askUser(callId, question, choices))

    async def _askUser(self, callId: str, question: str, choices: list[str]) -> tuple[str, str]:
        services, sessionId, timeout = self.services, self.session.sessionId, self.services.askTimeout
        if self._over():
            return asking.NO_ANSWER, noAnswer(CANCELLED, timeout)
        toolCallId, name, arguments = self.cards[callId]
        if services.client.elicitation("form"):
            d = self.request("elicitation/create", formRequest(sessionId, toolCallId, question, choices), timeout)
            try:
                return readForm(await d, choices)
            except CancelledError:  # the turn's cancel; the timeout fails with TimeoutError
                return asking.NO_ANSWER, noAnswer(CANCELLED, timeout)
            except defer.TimeoutError:
                return asking.NO_ANSWER, noAnswer(TIMEOUT, timeout)
            except Exception as e:
                log.warn("elicitation/create in session {id} failed: {e}", id=sessionId, e=e)
                return asking.NO_ANSWER, noAnswer(FAILED, timeout)
        if choices:
            toolCall = self.renderer.permissionToolCall(toolCallId, name, arguments,
                                                       {"text": question, "title": "Ask the user"})
            d = services.permissions.choose(sessionId, toolCall, choiceOptions(choices))
            self._track(d)
            return readChoice(await d, choices, timeout)
        self.sendText("agent_message_chunk", question)
        return asking.DEFERRED, ""

    def callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> Deferred[tuple[str, bool, dict[str, Any]]]:
        """An MCP tool's call: asked about where that is the rule, then run; its
        progress shows in its card; a cancel of the turn cancels it."""
        return Deferred.fromCoroutine(self._callTool(callId, name, arguments))

    async def _callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        mcp, session = self.services.mcp, self.session
        if self.cancelled:  # (its card may be gone: a cancelled turn answers before its worker is done)
            return toolset.failure("interrupted by the user before it ran")
        if name in resources.NAMES:
            return await resources.run(
                mcp.resourceLinks(session), name, arguments, mcp.settings.mcpResourceBytes, self._track,
                lambda server, uri: self._permitted(callId, name, mcp.readRoute(session, server), arguments,
                                                    resources.permissionText(server, uri)))
        route = self.routes.get(name)
        if route is None:
            return toolset.failure(f"{name} is not a tool of this turn")
        if session.mode == PLAN and not route.readOnly:
            return toolset.failure(planRefusal(route.title))
        refused = await self._permitted(callId, name, route, arguments, toolset.permissionText(route, arguments))
        if refused is not None:
            return toolset.failure(refused)
        d = None if self.cancelled else mcp.call(session, route, arguments, lambda params: self.progress(callId, params),
                                                 lambda params: self.serverAsks(callId, route.server, params))
        if d is None:
            return toolset.failure("interrupted by the user before it ran" if self.cancelled
                                   else f"{route.title} is not available any more: its server stopped or dropped it")
        self._track(d)
        try:
            return toolset.outcome(await d, route.secrets, mcp.readableFrom(session, route.server))
        except CancelledError:
            return toolset.failure("interrupted by the user before it finished")
        except CallFailed as e:
            return toolset.failure(str(e), route.secrets)

    async def _permitted(self, callId: str, name: str, route: Route, arguments: dict[str, Any], text: str) -> str | None:
        """The server's permission rule for one request (a tool call, a resource read):
        None when it may run, else why not."""
        mcp, session = self.services.mcp, self.session
        verdict = mcp.decision(session, route)
        if verdict == ASK:
            toolCallId, _, shown = self.cards[callId]
            detail = {"title": route.title, "kind": route.kind, "text": text}
            answer = await self._ask(self.renderer.permissionToolCall(toolCallId, name, shown, detail), "tool")
            mcp.remember(session, route, answer)
            if answer not in ALLOWED:
                return f"{route.title} was not run: {refusal(answer)}"
        elif verdict == DENY:
            return f"{route.title} was not run: the user rejected this tool for the session"
        return None

    def serverAsks(self, callId: str, server: str, params: Any) -> Deferred[dict[str, Any]]:
        """An MCP server's ``elicitation/create`` during the call: checked, marked as the
        server's, sent under the call's card; the editor's answer (checked) goes back. A
        cancel of the turn or the timeout answers the server "cancel"."""
        card = self.cards.get(callId)
        if card is None or self.cancelled or self.phase == ANSWERED:
            return succeed({"action": "cancel"})
        client, session = self.services.client, self.session
        modes = tuple(mode for mode in ("form", "url") if client.elicitation(mode))
        request = serverQuestion(session.sessionId, card[0], server, params, modes,
                                 self.services.mcp.settings.mcpElicitationBytes)
        d = self.request("elicitation/create", request, self.services.askTimeout)
        d.addCallback(serverAnswer)
        return d.addErrback(lambda failure: {"action": "cancel"})

    def progress(self, callId: str, params: dict[str, Any]) -> None:
        """A ``notifications/progress`` of the call: shown in its card."""
        card = self.cards.get(callId)
        now = self.services.reactor.seconds()
        if card is None or self.phase == ANSWERED or now - self.progressShown.get(callId, -PROGRESS_EVERY) < PROGRESS_EVERY:
            return  # a server that reports progress a thousand times a second is shown ten of them
        self.progressShown[callId] = now
        done, total, message = params.get("progress"), params.get("total"), params.get("message")
        parts = [f"{done:g}" + (f" of {total:g}" if isinstance(total, (int, float)) else "")
                 if isinstance(done, (int, float)) else "", str(message)[:300] if message else ""]
        text = " — ".join(part for part in parts if part) or "working"
        self.sendCard({"sessionUpdate": "tool_call_update", "toolCallId": card[0],
                       "content": [textContent(f"Progress: {text}")]})

    def _over(self) -> bool:
        """No question any more: the turn was cancelled (its cards may be gone: it answers
        before its worker is done) or has answered."""
        return self.cancelled or self.phase == ANSWERED

    def _ask(self, toolCall: dict[str, Any], kind: str) -> Deferred[str]:
        if self._over():
            return succeed(CANCELLED)  # no question after a cancel
        toolCall = self.children.tagged(toolCall, title=True)  # a child's question names it
        d = self.services.permissions.requestPermission(self.session.sessionId, toolCall, kind)
        self._track(d)
        return d


def _calledTools(result: TurnResult) -> bool:
    """Whether the run called a tool: only a tool (``skill_manage``, a command, a write) can
    change the skills on disk during a turn. A change made by anything else counts from the
    next turn, whose start reads them again."""
    return any(message.get("role") == "tool" for message in result.messages)


def _title(text: str) -> str:
    return capped(text.strip().splitlines()[0].strip())


@attrs.define(eq=False)
class TurnQueue:
    """One session's turns: the running one, and those waiting behind it in order."""

    running: Turn | None = None
    waiting: deque[Turn] = attrs.field(factory=deque)

    def submit(self, turn: Turn) -> None:
        if self.running is None and not self.waiting:
            self._start(turn)
        else:  # its prompt is shown when it starts, unless every turn before it has answered
            turn.echo = any(t.phase != ANSWERED for t in self.turns())
            self.waiting.append(turn)

    def withdraw(self, turn: Turn) -> None:
        self.waiting.remove(turn)

    def _start(self, turn: Turn) -> None:
        self.running = turn
        Deferred.fromCoroutine(turn.run()).addBoth(lambda _: self._finished(turn))

    def _finished(self, turn: Turn) -> None:
        if self.running is turn:
            self.running = None
        if self.waiting and self.running is None:
            self._start(self.waiting.popleft())

    def turns(self) -> list[Turn]:
        return [t for t in (self.running, *self.waiting) if t is not None]

    def cancel(self) -> list[Turn]:
        """Cancel every turn (the queued ones first, so none starts in between);
        those that have yet to finish."""
        turns = self.turns()
        for turn in reversed(turns):
            turn.cancel()
        return [turn for turn in turns if not turn.finished]


@attrs.define(eq=False)
class Prompts:
    """The prompt methods of one connection, and every session's turn queue."""

    services: TurnServices
    queues: dict[str, TurnQueue] = attrs.field(factory=dict)
    _gathering: bool = attrs.field(default=False, init=False)

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]:
        return {"session/prompt": self.prompt}

    def notifications(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[None]]]:
        return {"session/cancel": self.cancel}

    def queueFor(self, session: SessionState) -> TurnQueue:
        return self.queues.setdefault(session.sessionId, TurnQueue())

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        session = await self.services.store.get(field(params, "sessionId", str))
        blocks = checkPrompt(params.get("prompt"), image=True, embedded=True)
        queue = self.queueFor(session)
        turn = Turn(self.services, queue, session, blocks, self.services.rendererFor(session))
        queue.submit(turn)
        while True:
            try:
                return await turn.whenAnswered()
            except CancelledError:
                if turn.phase == ANSWERED:
                    raise  # the turn's own answer
                turn.cancel()  # $/cancel_request for this prompt

    async def cancel(self, params: dict[str, Any]) -> None:
        sessionId = params.get("sessionId")
        queue = self.queues.get(sessionId) if isinstance(sessionId, str) else None
        if queue is None:
            log.debug("session/cancel for unknown or idle session {id!r}", id=sessionId)
            return
        if queue.running is not None and queue.running.agent is not None:
            self._gatherAborts()
        queue.cancel()
        if self.services.namer is not None:
            self.services.namer.drop(sessionId)

    def _gatherAborts(self) -> None:
        """The model requests cancelled in this reactor turn (the editor may cancel 200 sessions
        at once) have their sockets shut together, once the reactor has answered them: each
        shutdown wakes the turn's worker, and 200 workers unwinding (and saving their turns)
        while the reactor still had cancels to answer delayed the last answer by 100 ms and
        more. The first ``callLater`` runs before the poll that writes the answers, the second
        after it (docs/performance.md, issue 27)."""
        if self._gathering:
            return
        from .engine.chat_http import DEADLINES  # (loaded with the engine that runs the turn)

        def release() -> None:
            self._gathering = False
            DEADLINES.release()

        self._gathering = True
        DEADLINES.hold()
        reactor = self.services.reactor
        reactor.callLater(0, reactor.callLater, 0, release)  # type: ignore[attr-defined]

    async def cancelAll(self, session: SessionState) -> None:
        """Cancel everything in the session and wait until every turn has finished
        (however it answered), prompts that arrive meanwhile included."""
        while (queue := self.queues.get(session.sessionId)) is not None and (turns := queue.cancel()):
            await _finished(turns)

    def saved(self, session: SessionState | None) -> Deferred[None]:
        """Fires once the session's turns that have answered (every session's, for None) are
        saved too (a cancelled one answers before it is): a copy of the session
        (``session/fork``) has them whole, a ``session/list`` sees them."""
        queues = list(self.queues.values()) if session is None else [self.queues.get(session.sessionId)]
        return _finished([t for queue in queues if queue is not None for t in queue.turns() if t.phase == ANSWERED])

    def cancelEverything(self) -> Deferred[None]:
        """Cancel every turn of every session (stdin closed, shutdown); fires once
        they have all finished (and are saved)."""
        if self.services.namer is not None:
            self.services.namer.dropAll()
        return _finished([turn for queue in list(self.queues.values()) for turn in queue.cancel()])

    def forget(self, session: SessionState) -> None:
        """The session is gone: a turn still in its queue is cancelled, not orphaned."""
        queue = self.queues.pop(session.sessionId, None)
        if queue is not None:
            queue.cancel()
        if self.services.namer is not None:
            self.services.namer.drop(session.sessionId)


def _finished(turns: list[Turn]) -> Deferred[None]:
    """Fires once every turn has finished, however it answered (a failed turn's own
    request reported its failure)."""
    return gatherResults([turn.whenFinished() for turn in turns], consumeErrors=True).addBoth(lambda _: None)
