"""The synchronous agent: model -> tools -> model ... until the model is done.

L{AIAgent.run_conversation} runs in a worker thread and reports through plain
callbacks; L{AIAgent.interrupt} may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hermes_acp import safejson
from hermes_acp.config import Endpoint
from hermes_acp.engine.cancel import CANCELLED as _WOKEN
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.edits import EditApprovals, EditProposal
from hermes_acp.engine.guard import CommandApprovals
from hermes_acp.engine.model import CANCELLED_FINISH, ModelClient, ModelError, ModelReply, ToolCallRequest
from hermes_acp.engine.tools.builtin import selectTools
from hermes_acp.engine.tools.registry import (
    PathLocks, SessionSearch, Tool, ToolContext, ToolError, ToolOutcome, checkArguments, parseArguments, runTool,
)
from hermes_acp.engine.workspace import LocalWorkspace, Workspace

log = logging.getLogger(__name__)

END_TURN = "end_turn"
MAX_TOKENS = "max_tokens"
MAX_TURN_REQUESTS = "max_turn_requests"
REFUSAL = "refusal"
CANCELLED = "cancelled"
DEFAULT_MAX_ITERATIONS = 90
# After a cancel, tools get this long to stop; the turn then ends without them (a
# late tool's events and approval requests go to the ended turn, which drops them).
TOOL_CANCEL_GRACE = 0.4
_API_KEYS = {
    "system": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


@attrs.frozen
class TurnUsage:
    """Tokens used by one turn (all its model requests), not the session."""

    inputTokens: int = 0
    outputTokens: int = 0
    totalTokens: int = 0
    thoughtTokens: int = 0
    cachedReadTokens: int = 0

    def plus(self, usage: dict[str, Any] | None) -> TurnUsage:
        if not usage:
            return self
        prompt = usage.get("prompt_tokens") or 0
        completion = usage.get("completion_tokens") or 0
        details = usage.get("completion_tokens_details") or {}
        cached = usage.get("prompt_tokens_details") or {}
        return TurnUsage(
            self.inputTokens + prompt,
            self.outputTokens + completion,
            self.totalTokens + (usage.get("total_tokens") or prompt + completion),
            self.thoughtTokens + (details.get("reasoning_tokens") or 0),
            self.cachedReadTokens + (cached.get("cached_tokens") or 0),
        )


@attrs.frozen
class TurnResult:
    """How a turn ended.

    C{messages} are the new history entries (the user message first);
    C{last_prompt_tokens} is the context size of the last model request.
    C{error} is set, with C{stop_reason} "end_turn", when the model endpoint
    failed in a way retrying did not fix.
    """

    final_text: str
    messages: list[dict[str, Any]]
    usage: TurnUsage
    stop_reason: str
    error: str | None = None
    last_prompt_tokens: int = 0


def _notify(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("agent callback %r failed", callback)


def _forAPI(message: dict[str, Any]) -> dict[str, Any]:
    keys = _API_KEYS.get(message.get("role", ""))
    return message if keys is None else {k: message[k] for k in keys if k in message}


def _assistantMessage(reply: ModelReply, calls: Sequence[ToolCallRequest]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or reply.refusal or None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    if reply.reasoning:
        message["reasoning"] = reply.reasoning
    return message


def defaultSystemPrompt(cwd: str, extra: Sequence[str] = ()) -> str:
    folders = f"\nOther folders you may work in: {', '.join(extra)}" if extra else ""
    return (
        "You are Hermes, a coding agent working in the user's editor. Your tools read, search, "
        "write and patch files and run shell commands in the user's workspace.\n"
        f"Working directory: {cwd}{folders}\n"
        "Relative paths start at the working directory. Read a file before changing it, prefer "
        "patch for small edits, keep a todo plan for multi-step work, and finish with a short "
        "summary of what you did."
    )


@attrs.define(eq=False)
class AIAgent:
    """One session's agent: model settings, workspace, tools, callbacks and approvals.

    Callbacks are plain attributes, swappable between turns, called from the
    agent's worker thread (approval callbacks from tool threads, possibly at
    the same time when the model runs tools in parallel):

      - C{stream_delta_callback(text)}, C{thinking_callback(text)}
      - C{tool_progress_callback(event, name, call_id, payload, extras)}: event
        "started" (payload: the arguments), "finished" (payload: the result
        text) or "failed" (payload: the error text); every started call gets
        exactly one of the other two.
      - C{step_callback(step, tools)}: before each model request; C{tools} are
        the names of the tools the previous step ran.
      - C{command_approval_callback(command, reason)} and
        C{edit_approval_callback(proposal)} answer "once", "always", "deny",
        "never" or "timeout"; anything else, an error, or no callback denies.
    """

    endpoint: Endpoint
    cwd: str = attrs.field(converter=os.path.abspath)
    model: str | None = None
    additionalDirectories: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    tools: Sequence[str] | None = None
    workspace: Workspace = attrs.field(factory=LocalWorkspace)
    sessionSearch: SessionSearch | None = None
    maxIterations: int = DEFAULT_MAX_ITERATIONS
    systemPrompt: str | None = None
    maxTokens: int | None = None
    reasoningEffort: str | None = None
    client: ModelClient | None = None

    stream_delta_callback: Callable[[str], Any] | None = None
    thinking_callback: Callable[[str], Any] | None = None
    tool_progress_callback: Callable[..., Any] | None = None
    step_callback: Callable[[int, list[str]], Any] | None = None
    command_approval_callback: Callable[[str, str], str] | None = None
    edit_approval_callback: Callable[[EditProposal], str] | None = None

    todos: list[dict[str, str]] = attrs.field(factory=list)
    commandApprovals: CommandApprovals = attrs.field(factory=CommandApprovals)
    editApprovals: EditApprovals = attrs.field(init=False)
    _locks: PathLocks = attrs.field(factory=PathLocks, init=False)
    _turnLock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _turn: Cancellation | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.editApprovals = EditApprovals.forWorkspace(self.cwd, self.additionalDirectories)
        if self.model is None:
            self.model = self.endpoint.model

    @property
    def editMode(self) -> str:
        return self.editApprovals.mode

    def setEditMode(self, mode: str) -> None:
        """"default", "accept_edits" or "dont_ask" (see L{hermes_acp.engine.edits})."""
        self.editApprovals.mode = mode

    def interrupt(self) -> None:
        """Cancel the running turn, if any (thread-safe; a no-op when idle)."""
        with self._turnLock:
            if self._turn is not None:
                self._turn.cancel()

    @property
    def running(self) -> bool:
        return self._turn is not None

    def run_conversation(
        self,
        user_message: str | list[dict[str, Any]],
        conversation_history: Sequence[dict[str, Any]] | None = None,
        cancelEvent: threading.Event | None = None,
    ) -> TurnResult:
        """Run one turn to its end; never raises for model or tool failures.

        ``cancelEvent``, set before the turn starts, cancels it at once: a caller
        that sets it and then calls L{interrupt} cannot miss the turn.
        """
        with self._turnLock:
            if self._turn is not None:
                raise RuntimeError("this agent is already running a turn")
            cancellation = self._turn = Cancellation()
            if cancelEvent is not None and cancelEvent.is_set():
                cancellation.cancel()
        try:
            return _Turn(self, cancellation, list(conversation_history or []), user_message).run()
        finally:
            with self._turnLock:
                self._turn = None

    def activeTools(self) -> dict[str, Tool]:
        tools = selectTools(self.tools)
        if self.sessionSearch is None and self.tools is None:
            tools.pop("session_search")
        return tools

    def modelClient(self) -> ModelClient:
        if self.client is None or self.client.endpoint != self.endpoint:
            self.client = ModelClient(self.endpoint)
        return self.client

    def toolContext(self, cancelEvent: threading.Event) -> ToolContext:
        """The tools' view of this turn. The approval callbacks are the ones installed
        now: a tool thread that outlives a cancelled turn asks that turn, never the next."""
        askCommand, askEdit = self.command_approval_callback, self.edit_approval_callback
        return ToolContext(
            cwd=self.cwd, workspace=self.workspace, cancelEvent=cancelEvent,
            approveCommand=lambda command: self.commandApprovals.decide(command, askCommand),
            approveEdit=lambda proposal: self.editApprovals.decide(proposal, askEdit),
            todos=self.todos, locks=self._locks, searchSessions=self.sessionSearch,
        )


def _runCall(inbox: queue.Queue[Any], index: int, tool: Tool, context: ToolContext, arguments: dict[str, Any]) -> None:
    """A tool thread: run the call unless the turn was cancelled first."""
    if context.cancelEvent.is_set():
        outcome = ToolOutcome("Error: interrupted by the user before it ran.", failed=True)
    else:
        began = time.monotonic()
        outcome = runTool(tool, context, arguments)
        code = outcome.extras.get("exitCode")
        log.debug("tool %s %s in %.2f s%s", tool.name, "failed" if outcome.failed else "finished",
                  time.monotonic() - began, "" if code is None else f", exit code {code}")
    inbox.put((index, outcome))


@attrs.define
class _Turn:
    """The state of one L{AIAgent.run_conversation} call."""

    agent: AIAgent
    cancellation: Cancellation
    history: list[dict[str, Any]]
    userMessage: str | list[dict[str, Any]]
    new: list[dict[str, Any]] = attrs.field(factory=list)
    usage: TurnUsage = attrs.field(factory=TurnUsage)
    lastPromptTokens: int = 0
    finalText: str = ""

    def result(self, stopReason: str, error: str | None = None) -> TurnResult:
        return TurnResult(self.finalText, self.new, self.usage, stopReason, error, self.lastPromptTokens)

    def remember(self, message: dict[str, Any]) -> None:
        """A new history entry, under the rule of L{hermes_acp.safejson}: a lone
        surrogate from a file name or a model delta must not poison the session."""
        self.new.append(safejson.repaired(message))

    def run(self) -> TurnResult:
        agent = self.agent
        self.remember({"role": "user", "content": self.userMessage})
        system = {"role": "system", "content": agent.systemPrompt
                  or defaultSystemPrompt(agent.cwd, agent.additionalDirectories)}
        tools = agent.activeTools()
        schemas = [tool.schema() for tool in tools.values()]
        options = {k: v for k, v in (("max_tokens", agent.maxTokens), ("reasoning_effort", agent.reasoningEffort)) if v}
        context = agent.toolContext(self.cancellation.event)
        previous: list[str] = []
        for step in range(1, agent.maxIterations + 1):
            if self.cancellation.cancelled:
                return self.result(CANCELLED)
            _notify(agent.step_callback, step, previous)
            messages = [system, *map(_forAPI, self.history), *map(_forAPI, self.new)]
            try:
                reply = agent.modelClient().complete(
                    agent.model or "", messages, schemas, self.cancellation,
                    lambda text: _notify(agent.stream_delta_callback, text),
                    lambda text: _notify(agent.thinking_callback, text),
                    **options,
                )
            except ModelError as e:
                return self.result(END_TURN, str(e))
            self.usage = self.usage.plus(reply.usage)
            if reply.usage and reply.usage.get("prompt_tokens"):
                self.lastPromptTokens = reply.usage["prompt_tokens"]
            self.finalText = reply.text or reply.refusal or self.finalText
            stop = self._stopReason(reply)
            calls = reply.toolCalls if stop is None else ()
            if reply.text or reply.refusal or reply.reasoning or calls:
                self.remember(_assistantMessage(reply, calls))
            if stop is not None:
                return self.result(stop)
            for message in self._runTools(calls, tools, context):
                self.remember(message)
            previous = [call.name for call in calls]
        return self.result(MAX_TURN_REQUESTS)

    def _stopReason(self, reply: ModelReply) -> str | None:
        """Why the turn ends after this reply, or None to run its tools."""
        if reply.finishReason == CANCELLED_FINISH or self.cancellation.cancelled:
            return CANCELLED
        if reply.finishReason == "length":
            return MAX_TOKENS
        if reply.finishReason == "content_filter" or reply.refusal:
            return REFUSAL
        return None if reply.toolCalls else END_TURN

    def _runTools(
        self, calls: Sequence[ToolCallRequest], tools: dict[str, Tool], context: ToolContext
    ) -> list[dict[str, Any]]:
        """Run a batch of tool calls in parallel; one tool message per call, in order."""
        outcomes: dict[int, ToolOutcome] = {}
        started: dict[int, ToolCallRequest] = {}
        inbox: queue.Queue[Any] = queue.Queue()
        for index, call in enumerate(calls):
            arguments: Any = {}
            try:
                arguments = parseArguments(call.arguments)
                tool = tools.get(call.name)
                if tool is None:
                    raise ToolError(f"unknown tool {call.name!r}; available: {', '.join(tools)}")
                checked = checkArguments(tool, arguments)
            except ToolError as e:
                self._started(call, arguments, tools.get(call.name), context)
                outcomes[index] = ToolOutcome(f"Error: {e}", failed=True)
                self._ended(call, outcomes[index])
                continue
            self._started(call, checked, tool, context)
            started[index] = call
            threading.Thread(
                target=_runCall, args=(inbox, index, tool, context, checked),
                name=f"hermes-tool-{call.name}", daemon=True,
            ).start()
        self._collect(inbox, started, outcomes)
        return [
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcomes[index].text}
            for index, call in enumerate(calls)
        ]

    def _collect(
        self, inbox: queue.Queue[Any], started: dict[int, ToolCallRequest], outcomes: dict[int, ToolOutcome]
    ) -> None:
        """Report each running call as it ends; after a cancel, wait only a grace period."""
        deadline: float | None = None
        with self.cancellation.watching(inbox):
            while any(index not in outcomes for index in started):
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = inbox.get(timeout=timeout)
                except queue.Empty:
                    break
                if item is _WOKEN:
                    deadline = deadline or time.monotonic() + TOOL_CANCEL_GRACE
                    continue
                index, outcome = item
                outcomes[index] = outcome
                self._ended(started[index], outcome)
        for index, call in started.items():
            if index not in outcomes:
                outcomes[index] = ToolOutcome("Error: interrupted by the user before it finished.", failed=True)
                self._ended(call, outcomes[index])

    def _started(self, call: ToolCallRequest, arguments: Any, tool: Tool | None, context: ToolContext) -> None:
        extras: dict[str, Any] = {}
        where = arguments.get(tool.pathArgument) if tool and tool.pathArgument and isinstance(arguments, dict) else None
        if isinstance(where, str):
            extras["path"] = context.resolve(where)
        shown = arguments if isinstance(arguments, dict) else {"arguments": arguments}
        _notify(self.agent.tool_progress_callback, "started", call.name, call.id, shown, extras)

    def _ended(self, call: ToolCallRequest, outcome: ToolOutcome) -> None:
        event = "failed" if outcome.failed else "finished"
        _notify(self.agent.tool_progress_callback, event, call.name, call.id, outcome.text, outcome.extras)
