"""The synchronous agent: model -> tools -> model ... until the model is done.

``AIAgent.run_conversation`` runs in a worker thread and reports to the
run's ``ITurnObserver``; ``AIAgent.interrupt`` may be called from any thread.
"""

from __future__ import annotations

import logging
import operator
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
from zope.interface import implementer

from hermes_acp import safejson
from hermes_acp.config import DEFAULT_MAX_TOOL_CALLS, DEFAULT_TOOL_PARALLEL, DEFAULT_TOOL_THREADS, Endpoint
from hermes_acp.engine import images
from hermes_acp.engine.access import PLAN, PathApprovals
from hermes_acp.engine.webaccess import HostApprovals
from hermes_acp.engine.tools.websearch import searchBackend
from hermes_acp.engine.approval import Verdict, ask
from hermes_acp.engine.cancel import CANCELLED as _WOKEN
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.compaction import (
    CHARS_PER_TOKEN, SYNTHETIC_KEY, Budget, Cancelled, Compactor, Estimator, Outcome, charCount, isSummary,
)
from hermes_acp.engine.instructions import projectInstructions
from hermes_acp.engine.planning import EXIT_PLAN, NOTE, commandRefused
from hermes_acp.engine.model import (
    CANCELLED_FINISH, ModelClient, ModelError, ModelReply, ReplyLimits, Schemas, ToolCallRequest, bodyJSON,
)
from hermes_acp.engine.processes import Limits
from hermes_acp.engine.sandbox import Policy, policyFor
from hermes_acp.engine.secrets import redact, secretValues
from hermes_acp.engine.subagents import CHILD_EXCLUDED, Delegation, SubagentSettings
from hermes_acp.engine.result import TurnResult, TurnUsage
from hermes_acp.engine.tools.builtin import SKILL_TOOLS, selectTools
from hermes_acp.engine.asking import Answer
from hermes_acp.engine.tools.registry import (
    PathLocks, SessionSearch, Tool, ToolContext, ToolError, ToolOutcome, checkArguments, parseArguments, runTool,
)
from hermes_acp.engine.tools.vision import VISION_ANALYZE
from hermes_acp.engine.toolslots import GRANTED, ToolSlots
from hermes_acp.engine.workspace import LocalWorkspace, Workspace
from hermes_acp.interfaces import IEngineAgent, ITurnObserver

if TYPE_CHECKING:
    from hermes_acp.engine.background import SessionProcesses
    from hermes_acp.engine.checkpoints import TurnCheckpoint
    from hermes_acp.engine.guard import CommandApprovals
    from hermes_acp.engine.memory import MemoryStore
    from hermes_acp.engine.skills import Catalog, SkillLibrary

log = logging.getLogger(__name__)

END_TURN = "end_turn"
MAX_TOKENS = "max_tokens"
MAX_TURN_REQUESTS = "max_turn_requests"
REFUSAL = "refusal"
CANCELLED = "cancelled"
DEFAULT_MAX_ITERATIONS = 90
#: What the model reads of tool results, as shares of its context window: one result at most a
#: quarter of it, all the results of a turn at most half (estimated at 4 characters a token);
#: a result over its budget keeps its head and tail, with a note of what was cut.
RESULT_SHARE, TURN_SHARE = 0.25, 0.5
MIN_RESULT_CHARS = 4000
#: Context-length errors a turn recovers from (compact and retry), and failed summaries in a row
#: after which the agent stops asking for one on its own: its compactions set the oldest
#: exchanges aside instead (``/compact`` still asks; a summary that works, another model or
#: thought level, or a new conversation turns them back on).
MAX_OVERFLOW_RETRIES, MAX_SUMMARY_FAILURES = 2, 2
#: The window assumed by ``/compact`` when none is known.
DEFAULT_WINDOW = 128_000
#: A reply cut off by the output limit: an answer goes on (the model is asked to continue), a
#: tool call is asked for again with more room; at most this many times a turn.
MAX_CONTINUATIONS, MAX_OUTPUT_TOKENS = 3, 32_768
CONTINUE = ("[Your reply was cut off by the output limit. Continue exactly where it stopped, "
            "without repeating anything.]")
#: What the compaction's card says first when its summary failed (once in a row of failures, and
#: on every ``/compact``: later cards say only what was set aside).
SUMMARY_FAILED = "The summary could not be written ({failure}). "
# After a cancel, tools get this long to stop; the turn then ends without them (a
# late tool's events and approval requests go to the ended turn, which drops them).
TOOL_CANCEL_GRACE = 0.4
_API_KEYS = {
    "system": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


def _notify(event: Callable[..., Any], *args: Any) -> None:
    """Tell the observer; a failing observer never stops the run."""
    try:
        event(*args)
    except Exception:
        log.exception("observer %r failed", event)


def _forAPI(message: dict[str, Any]) -> dict[str, Any]:
    """A history entry as the endpoint takes it. The reasoning of a reply that called
    tools goes back with it, under the field the endpoint sent it in: thinking models
    (DeepSeek, Kimi) refuse a tool-call continuation without it."""
    keys = _API_KEYS.get(message.get("role", ""))
    if keys is None:
        return message
    sent = {k: message[k] for k in keys if k in message}
    if message.get("tool_calls") and message.get("reasoning"):
        sent[message.get("reasoning_field") or "reasoning_content"] = message["reasoning"]
    return sent


#: What an attached image counts for in a request's estimate (its base64 is not its tokens).
IMAGE_CHARS = 4000


def _messageChars(message: dict[str, Any]) -> tuple[int, bool]:
    """The size of one history entry as the endpoint receives it (an image at ``IMAGE_CHARS``),
    and whether it holds an image."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")]
        if len(parts) < len(content):
            return IMAGE_CHARS * (len(content) - len(parts)) + charCount(_forAPI({**message, "content": parts})), True
    return charCount(_forAPI(message)), False


def _listed(chars: int, image: bool, count: int) -> int:
    """The size of ``count`` entries of ``chars`` in all as one JSON list (``charCount``'s
    measure): its brackets and separators too; with images, the sum alone (as before)."""
    return chars if image else chars + 2 + 2 * max(0, count - 1)


class _View(NamedTuple):
    """History entries as the next request carries them (``_Sizes.view``): their sizes summed,
    whether one holds an image, whether one is a message of tool images, and each entry's
    request form (its bytes in the body: ``_requestForm``)."""

    chars: int
    image: bool
    joinable: bool
    sent: list[bytes | dict[str, Any]]


def _requestForm(message: dict[str, Any]) -> bytes | dict[str, Any]:
    """``message`` as the request body carries it (``model.bodyJSON`` of ``_forAPI`` of it),
    which ``ModelClient.complete`` takes as is. A value JSON has no form for stays a dict, so
    the body's encoding fails on it as it always did."""
    sent = _forAPI(message)
    try:
        return bodyJSON(sent)
    except TypeError:
        return sent


class _Sizes:
    """Each history entry's size as the endpoint receives it (``_forAPI``), made once (when it
    is remembered, or first seen) and known by the entry itself; and its bytes in the request
    body (``_requestForm``), made once when a request first carries it: a request joins the
    history's bytes instead of encoding it (at 4,000 entries an encoding costs several ms). An
    entry is never changed once in the history: a compaction and a load make new ones, and an
    entry replaced in the list (an image by a line) is ``forget``'s. Also whether an entry
    holds an image, or is a message of tool images (``images.joined``), so a history without
    either is not walked again for them.

    The list ``view`` saw last is kept with what it added up to: the next request of a turn,
    and the next turn, carry that list and a few entries more, and cost those entries (and a
    check at C speed that the others are the same objects)."""

    def __init__(self) -> None:
        #: id -> [entry, its size, holds an image, a message of tool images, request form (None: not yet)]
        self._known: dict[int, list[Any]] = {}
        self._last: list[dict[str, Any]] = []
        self._view = _View(0, False, False, [])

    def of(self, message: dict[str, Any]) -> list[Any]:
        entry = self._known.get(id(message))
        if entry is None or entry[0] is not message:
            chars, image = _messageChars(message)
            entry = self._known[id(message)] = [message, chars, image, message.get(SYNTHETIC_KEY) == images.IMAGES,
                                                None]
        return entry

    def total(self, messages: Sequence[dict[str, Any]]) -> int:
        """What ``charCount`` of the entries as sent says (``json.dumps`` of their list): the
        sum of theirs and the list's brackets and separators; with images, the sum alone."""
        chars, image = self.scan(messages)[:2]
        return _listed(chars, image, len(messages))

    def scan(self, messages: Sequence[dict[str, Any]]) -> tuple[int, bool, bool]:
        """The entries' sizes summed, whether one holds an image, whether one is tool images."""
        return self._added(messages, 0, False, False, None)

    def view(self, messages: Sequence[dict[str, Any]]) -> _View:
        """``scan`` of ``messages`` with their request forms; the entries of the list seen last
        that begin ``messages`` (the same objects) are not looked at one by one again."""
        last, before = self._last, self._view
        if len(last) <= len(messages) and all(map(operator.is_, last, messages)):
            if len(last) == len(messages):
                return before
            sent = before.sent[:]
            sums = self._added(messages[len(last):], before.chars, before.image, before.joinable, sent)
        else:
            sent = []
            sums = self._added(messages, 0, False, False, sent)
        self._last, self._view = list(messages), _View(*sums, sent)
        return self._view

    def _added(self, messages: Sequence[dict[str, Any]], chars: int, image: bool, joinable: bool,
               sent: list[bytes | dict[str, Any]] | None) -> tuple[int, bool, bool]:
        """The sums, with ``messages``'; their request forms appended to ``sent``."""
        known = self._known
        for message in messages:
            entry = known.get(id(message))
            if entry is None or entry[0] is not message:
                entry = self.of(message)
            chars += entry[1]
            image = image or entry[2]
            joinable = joinable or entry[3]
            if sent is not None:
                sent.append(self._form(entry))
        return chars, image, joinable

    def sent(self, message: dict[str, Any]) -> bytes | dict[str, Any]:
        return self._form(self.of(message))

    @staticmethod
    def _form(entry: list[Any]) -> bytes | dict[str, Any]:
        """The entry's request form, made once; one that holds an image keeps it as a dict (its
        base64 is not copied into bytes: it is sent a few times before a line replaces it)."""
        if entry[4] is None:
            entry[4] = _forAPI(entry[0]) if entry[2] else _requestForm(entry[0])
        return entry[4]  # type: ignore[no-any-return]

    def forget(self, message: dict[str, Any]) -> None:
        """The entry left the history (an image replaced by a line): its bytes go with it, and
        the list seen last, which holds it."""
        entry = self._known.get(id(message))
        if entry is not None and entry[0] is message:
            del self._known[id(message)]
        self._last, self._view = [], _View(0, False, False, [])

    def keep(self, messages: Sequence[dict[str, Any]]) -> None:
        """Forget entries no longer in ``messages`` (compacted away, or made for one request)
        once there may be 64 of them: their bytes go with them."""
        if len(self._known) > len(messages) + 64:
            known = self._known
            self._known = {id(m): known[id(m)] for m in messages if id(m) in known and known[id(m)][0] is m}


def _sentChars(messages: Sequence[dict[str, Any]], sizes: _Sizes | None = None) -> int:
    """The size of history entries as the endpoint receives them, images at ``IMAGE_CHARS``."""
    return (sizes or _Sizes()).total(messages)


def contextTokens(messages: Sequence[dict[str, Any]], sizes: _Sizes | None = None) -> int:
    """The context a history takes by the engine's measure, in tokens: what a run reports when
    the endpoint reports no usage. With the agent's ``sizes``, as a request measures it: only
    the entries past the list it saw last cost anything (the next request's view, made now)."""
    if sizes is None:
        return _sentChars(messages) // CHARS_PER_TOKEN
    view = sizes.view(messages)
    return _listed(view.chars, view.image, len(messages)) // CHARS_PER_TOKEN


def _hasImages(messages: Sequence[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                          for p in m["content"]) for m in messages)


def _request(system: dict[str, Any], live: Sequence[dict[str, Any]],
             sent: Sequence[bytes | dict[str, Any]] | None = None) -> list[bytes | dict[str, Any]]:
    """The messages of a request (``sent``: ``live``'s request forms, when known). A summary
    followed by a user message joins the system prompt: strict chat templates (Mistral, Gemma,
    Llama 2) refuse two user turns in a row."""
    if sent is None:
        sent = [_forAPI(message) for message in live]
    if len(live) > 1 and isSummary(live[0]) and live[1].get("role") == "user":
        system = {**system, "content": f"{system['content']}\n\n{live[0]['content']}"}
        sent = sent[1:]
    return [system, *sent]


def _toolSchemas(tools: Collection[Tool]) -> tuple[Schemas, int]:
    """The tools' schemas for a request (joined from each tool's ``requestForm``), and
    ``charCount`` of their list."""
    forms = [tool.requestForm() for tool in tools]
    return Schemas.joined([body for body, _ in forms]), sum(chars for _, chars in forms) + 2 * max(len(forms), 1)


def _fixedChars(system: dict[str, Any], toolChars: int) -> int:
    """``charCount([system, schemas])`` given ``charCount(schemas)``: a request's part that
    does not grow with the history."""
    return charCount(system) + toolChars + 4


class _Unrepeated:
    """The text callback of a request that asks again for a cut reply: the part of the new
    text the editor already has from the cut one is not sent again."""

    def __init__(self, shown: str, emit: Callable[[str], None]) -> None:
        self.shown, self.emit, self.seen = shown, emit, 0

    def __call__(self, delta: str) -> None:
        if self.seen < len(self.shown):
            overlap = self.shown[self.seen:self.seen + len(delta)]
            if delta.startswith(overlap) and overlap:
                self.seen += len(overlap)
                delta = delta[len(overlap):]
            else:
                self.seen = len(self.shown)  # it says something else: show it all from here
        if delta:
            self.emit(delta)


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
        message["reasoning_field"] = reply.reasoningField
    return message


def defaultSystemPrompt(cwd: str, extra: Sequence[str] = (), instructions: str = "") -> str:
    """The system prompt: who the model is, where it works, and the project's own
    instructions (``engine.instructions``), rebuilt for every run."""
    folders = f"\nOther folders you may work in: {', '.join(extra)}" if extra else ""
    return (
        "You are Hermes, a coding agent working in the user's editor. Your tools read, search, "
        "write and patch files and run shell commands in the user's workspace.\n"
        f"Working directory: {cwd}{folders}\n"
        "Relative paths start at the working directory. Read a file before changing it, prefer "
        "patch for small edits, keep a todo plan for multi-step work, and finish with a short "
        "summary of what you did."
    ) + (f"\n\n{instructions}" if instructions else "")


@implementer(IEngineAgent)
@attrs.define(eq=False)
class AIAgent:
    """One session's agent: model settings, tools and approval memory.

    Each run reports to its own observer (``ITurnObserver``): text and thought
    deltas from the run's thread; tool starts and ends, approval questions and
    editor terminals from the tool's thread, several at once when the model
    runs tools in parallel. Every event of a tool call carries its call id.
    """

    endpoint: Endpoint
    cwd: str = attrs.field(converter=os.path.abspath)
    model: str | None = None
    additionalDirectories: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    tools: Sequence[str] | None = None
    sessionSearch: SessionSearch | None = None
    maxIterations: int = DEFAULT_MAX_ITERATIONS
    systemPrompt: str | None = None
    maxTokens: int | None = None
    reasoningEffort: str | None = None
    client: ModelClient | None = None
    #: The sandbox of the session's local commands (None: none; by default the
    #: machine's, over the session's folders), and their resource limits.
    sandbox: Policy | None = attrs.field(
        default=attrs.Factory(lambda self: policyFor((self.cwd, *self.additionalDirectories)), takes_self=True))
    limits: Limits = Limits()
    #: The model's context window in tokens (None: unknown): tool results are budgeted by it,
    #: and a request over ``compactAt`` of it (less the reply's room) compacts the history first.
    contextWindow: int | None = None
    compactAt: float = 0.9
    #: How big and how long one model reply may be.
    replyLimits: ReplyLimits = ReplyLimits()
    #: Tokens per character as the endpoint counts them, and summaries that failed in a row.
    estimator: Estimator = attrs.field(factory=Estimator)
    summaryFailures: int = 0
    #: The tool calls of one reply: at most ``maxToolCalls`` run (the rest are refused, with a
    #: message to the model), ``toolParallel`` of them at once, each holding one of
    #: ``toolSlots`` while it runs (the factory gives every agent of the process the same ones).
    maxToolCalls: int = DEFAULT_MAX_TOOL_CALLS
    toolParallel: int = DEFAULT_TOOL_PARALLEL
    toolSlots: ToolSlots = attrs.field(factory=lambda: ToolSlots(DEFAULT_TOOL_THREADS))
    #: The session's background processes (``engine.background.SessionProcesses``: they outlive
    #: the agent, which is rebuilt when the session moves); None: no background processes.
    background: SessionProcesses | None = None
    #: The user's memory files for the ``memory`` tool (None: no memory), and the snapshot of them
    #: the system prompt carries: taken once for the session and kept with it (``engine.memory``).
    memory: MemoryStore | None = None
    memorySnapshot: str = ""
    #: Whether the model can see images (None: nobody said; it is shown them, and an endpoint
    #: that refuses them teaches False), how big they may be, and the model ``vision_analyze``
    #: asks (None: the tool is not offered).
    vision: bool | None = None
    imageLimits: images.ImageLimits = images.ImageLimits()
    visionModel: images.VisionModel | None = None
    #: The skills (``engine.skills``): listed in the system prompt, read and changed by the
    #: skill tools (None: no skills, and no skill tools).
    skills: SkillLibrary | None = None
    #: How ``delegate_task`` runs children (``engine.subagents``), and how deep this agent is:
    #: 0 for a session's, 1 for a child (which cannot delegate nor ask the user).
    subagents: SubagentSettings = attrs.field(factory=SubagentSettings)
    depth: int = 0

    todos: list[dict[str, str]] = attrs.field(factory=list)
    _commandApprovals: CommandApprovals | None = attrs.field(default=None, init=False)
    _approvalsLock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    pathApprovals: PathApprovals = attrs.field(init=False)
    hostApprovals: HostApprovals = attrs.field(init=False)
    _locks: PathLocks = attrs.field(factory=PathLocks, init=False)
    _runLock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _planLock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _run: Cancellation | None = attrs.field(default=None, init=False)
    _sizes: _Sizes = attrs.field(factory=_Sizes, init=False)

    def __attrs_post_init__(self) -> None:
        self.pathApprovals = PathApprovals.forWorkspace(self.cwd, self.additionalDirectories)
        self.hostApprovals = HostApprovals(self.pathApprovals)
        if self.model is None:
            self.model = self.endpoint.model

    @property
    def commandApprovals(self) -> CommandApprovals:
        """The command guard and what the user allowed, made when a command first needs them
        (the guard's import is a fifth of the engine's, and a turn without commands needs none)."""
        with self._approvalsLock:
            if self._commandApprovals is None:
                from hermes_acp.engine.guard import CommandApprovals

                self._commandApprovals = CommandApprovals()
            return self._commandApprovals

    @property
    def editMode(self) -> str:
        return self.pathApprovals.mode

    @property
    def planning(self) -> bool:
        return self.pathApprovals.mode == PLAN

    def setEditMode(self, mode: str) -> None:
        """"default", "accept_edits", "dont_ask" or "plan" (see ``hermes_acp.engine.access``)."""
        self.pathApprovals.mode = mode

    def interrupt(self) -> None:
        """Cancel the run in progress, if any (thread-safe; a no-op when idle)."""
        with self._runLock:
            if self._run is not None:
                self._run.cancel()

    @property
    def running(self) -> bool:
        return self._run is not None

    def run_conversation(
        self,
        user_message: str | list[dict[str, Any]],
        conversation_history: Sequence[dict[str, Any]] | None,
        observer: ITurnObserver,
        workspace: Workspace | None = None,
        cancelEvent: threading.Event | None = None,
        extraTools: Mapping[str, Tool] | None = None,
        checkpoint: TurnCheckpoint | None = None,
        skillsCatalog: Catalog | None = None,
    ) -> TurnResult:
        """Run one turn to its end; never raises for model or tool failures.

        ``cancelEvent``, set before the run starts, cancels it at once: a caller
        that sets it and then calls ``interrupt`` cannot miss the run.
        ``extraTools`` join the agent's own for this run (the session's MCP tools).
        ``checkpoint`` is taken before the first call that may change files, and
        records what the turn changed when it ends (``engine.checkpoints``).
        ``skillsCatalog``, the skills just read for the turn, is what its first system prompt
        lists (instead of reading them again).
        """
        if not conversation_history:
            self.summaryFailures = 0  # a new conversation (or one after /reset) asks for summaries again
        try:
            return self._start(lambda c: _Conversation(self, c, observer, workspace or LocalWorkspace(),
                                                       list(conversation_history or []), user_message,
                                                       dict(extraTools or {}), checkpoint, skillsCatalog).run(),
                               cancelEvent)
        finally:
            if checkpoint is not None:
                checkpoint.finish()

    def compact(
        self,
        conversation_history: Sequence[dict[str, Any]],
        observer: ITurnObserver,
        focus: str = "",
        cancelEvent: threading.Event | None = None,
        extraTools: Mapping[str, Tool] | None = None,
    ) -> TurnResult:
        """Compact the history now (``/compact``); the result's ``history`` is the new one.
        ``extraTools``: those the next turn will send too (their schemas take room)."""
        return self._start(lambda c: _Conversation(self, c, observer, LocalWorkspace(), list(conversation_history),
                                                   None, dict(extraTools or {})).compactNow(focus), cancelEvent)

    def _start(self, run: Callable[[Cancellation], TurnResult], cancelEvent: threading.Event | None) -> TurnResult:
        with self._runLock:
            if self._run is not None:
                raise RuntimeError("this agent is already running a turn")
            cancellation = self._run = Cancellation()
            if cancelEvent is not None and cancelEvent.is_set():
                cancellation.cancel()
        try:
            return run(cancellation)
        finally:
            with self._runLock:
                self._run = None

    def activeTools(self) -> dict[str, Tool]:
        tools = selectTools(self.tools)
        if self.sessionSearch is None and self.tools is None:
            tools.pop("session_search")
        if self.tools is None and searchBackend() is None:
            tools.pop("web_search")  # no backend configured: /doctor and --check say how to add one
        if self.background is None and self.tools is None:
            tools.pop("process")
        if self.memory is None and self.tools is None:
            tools.pop("memory")
        if self.skills is None and self.tools is None:
            for name in SKILL_TOOLS:
                tools.pop(name)
        if self.planning and not self.depth:
            tools[EXIT_PLAN.name] = EXIT_PLAN
        if self.visionModel is not None and self.tools is None:
            tools[VISION_ANALYZE.name] = VISION_ANALYZE
        for name in CHILD_EXCLUDED if self.depth else ():
            tools.pop(name, None)
        return tools

    def child(self, systemPrompt: str, model: str | None = None) -> AIAgent:
        """A subagent of this agent: the same endpoint, folders, sandbox, limits and tools (less
        ``CHILD_EXCLUDED``), the same mode and permission rules (what the user allowed for the
        session holds for it, and its answers hold for the session), a history and a model
        client of its own, and ``systemPrompt``."""
        child = attrs.evolve(
            self, model=model or self.model, systemPrompt=systemPrompt, client=None, depth=self.depth + 1,
            estimator=Estimator(), summaryFailures=0, todos=[])
        child.pathApprovals = self.pathApprovals
        child._commandApprovals = self.commandApprovals
        child._locks = self._locks
        return child

    def modelClient(self) -> ModelClient:
        if self.client is None or self.client.endpoint != self.endpoint:
            self.client = ModelClient(self.endpoint, limits=self.replyLimits)
        return self.client

    def toolContext(self, cancelEvent: threading.Event, observer: ITurnObserver, workspace: Workspace,
                    callId: str, cancellation: Cancellation | None = None,
                    checkpoint: TurnCheckpoint | None = None) -> ToolContext:
        """What the tool call ``callId`` of a run may use: its questions go to that
        run's observer, under that call's id (a tool thread that outlives a
        cancelled run asks that run, never the next)."""
        def approveCommand(command: str, confined: bool, escalation: str | None, cwd: str) -> Verdict:
            refused = commandRefused(command, escalation, cwd) if self.planning else None
            return refused or self.commandApprovals.decide(
                command, lambda c, reason: observer.approveCommand(callId, c, reason), confined, escalation, cwd)

        return ToolContext(
            cwd=self.cwd, workspace=workspace, cancelEvent=cancelEvent,
            approveCommand=approveCommand,
            approveEdit=lambda proposal: self.pathApprovals.decide(proposal, lambda p: observer.approveEdit(callId, p)),
            approveRead=lambda path: self.pathApprovals.decideRead(
                path, lambda p, reason: observer.approveRead(callId, p, reason)),
            todos=self.todos, locks=self._locks, searchSessions=self.sessionSearch,
            sandbox=self.sandbox, limits=self.limits,
            terminalStarted=lambda terminalId: _notify(observer.terminalStarted, callId, terminalId),
            commandOutput=lambda output: _notify(observer.commandOutput, callId, redact(output, secretValues())),
            delegate=lambda name, arguments: _delegated(observer.callTool(callId, name, arguments)),
            approvePlan=lambda plan: self._approvePlan(plan, lambda p: observer.approvePlan(callId, p)),
            askUser=lambda question, choices: Answer(*observer.askUser(callId, question, choices)),
            approveFetch=lambda url, host: self.hostApprovals.decide(
                url, host, lambda u, reason: observer.approveRead(callId, u, reason)),
            background=self.background,
            memory=self.memory,
            approveMemory=lambda proposal: self.pathApprovals.decideMemory(
                proposal, lambda p: observer.approveEdit(callId, p)),
            imageLimits=self.imageLimits, cancellation=cancellation, vision=self.visionModel,
            skills=self.skills,
            approveSkillEdit=lambda proposal: self.pathApprovals.decide(
                proposal, lambda p: observer.approveEdit(callId, p), managed=True),
            beforeChange=checkpoint.beforeChange if checkpoint is not None else lambda: None,
        )

    def _approvePlan(self, plan: str, question: Callable[[str], str]) -> str | None:
        """Ask about the plan while the session is in plan mode (None: it is not). One plan at a
        time: the answer switches the mode before the question returns, so a second plan of the
        same reply finds plan mode over instead of asking again."""
        with self._planLock:
            return ask(question, plan) if self.planning else None


def _delegated(answer: tuple[str, bool, dict[str, Any]]) -> ToolOutcome:
    """The observer's (text, failed, extras) for a delegated call, as an outcome."""
    text, failed, extras = answer
    return ToolOutcome(text, extras, failed)


def withNote(content: str | list[dict[str, Any]], note: str | None) -> str | list[dict[str, Any]]:
    """The user's message with a note of the agent's before it (what background processes
    did since the last turn): one user message, as strict chat templates want."""
    if note is None:
        return content
    if isinstance(content, str):
        return f"{note}\n\n{content}"
    return [{"type": "text", "text": note}, *content]


@attrs.frozen
class _Call:
    """A call of a reply that passed its checks, waiting for its turn to run."""

    index: int
    callId: str
    call: ToolCallRequest
    tool: Tool
    context: ToolContext
    arguments: dict[str, Any]


def _runCall(inbox: queue.Queue[Any], slots: ToolSlots | None, job: _Call) -> None:
    """A tool thread: run the call unless the turn was cancelled first; whatever
    happens, its slot (if it holds one) is given back and an outcome goes to the inbox (the turn waits
    for one per running call)."""
    tool, context = job.tool, job.context
    outcome = ToolOutcome(f"Error: {tool.name} failed unexpectedly", failed=True)
    try:
        if context.cancelEvent.is_set():
            outcome = ToolOutcome("Error: interrupted by the user before it ran.", failed=True)
        else:
            if tool.writes(context, job.arguments):
                context.beforeChange()  # the turn's checkpoint, once, before anything changes
            began = time.monotonic()
            outcome = runTool(tool, context, job.arguments)
            code = outcome.extras.get("exitCode")
            log.debug("tool %s %s in %.2f s%s", tool.name, "failed" if outcome.failed else "finished",
                      time.monotonic() - began, "" if code is None else f", exit code {code}")
    except Exception:
        log.exception("tool thread of %s failed", tool.name)
    finally:
        if slots is not None:
            slots.release()
        inbox.put((job.index, outcome))


@attrs.define
class _Conversation:
    """The state of one ``AIAgent.run_conversation`` call.

    ``live`` is the history the model reads (after the system prompt); ``new`` every entry
    this run added, as it was: a compaction replaces ``live`` but never ``new``."""

    agent: AIAgent
    cancellation: Cancellation
    observer: ITurnObserver
    workspace: Workspace
    live: list[dict[str, Any]]
    userMessage: str | list[dict[str, Any]] | None
    extraTools: dict[str, Tool] = attrs.field(factory=dict)
    checkpoint: TurnCheckpoint | None = None
    #: The skills read for the turn, for its first system prompt; a later one reads them again.
    skillsCatalog: Catalog | None = None
    #: Held by the run's delegate call that runs children (``subagents.Delegation.turnLock``).
    delegating: threading.Lock = attrs.field(factory=threading.Lock)
    new: list[dict[str, Any]] = attrs.field(factory=list)
    usage: TurnUsage = attrs.field(factory=TurnUsage)
    lastPromptTokens: int = 0
    finalText: str = ""
    #: Characters of tool results the model has read in this turn (``_budgeted``).
    resultChars: int = 0
    #: A compaction replaced ``live``; context-length errors recovered from; a window they taught;
    #: the request size under which no compaction is tried again after one failed in this run.
    replaced: bool = False
    overflows: int = 0
    learnedWindow: int | None = None
    compactAgainAt: int = 0
    #: Replies the output limit cut that the turn went on from, and the text so far of a cut answer.
    continuations: int = 0
    cutText: str = ""
    cost: float | None = None
    #: A tool call ended the run (``ToolOutcome.endsTurn``: the user chose to keep planning, or a
    #: question the next prompt answers): it stops after this reply's calls.
    ending: bool = False

    def result(self, stopReason: str, failure: ModelError | None = None) -> TurnResult:
        # The endpoint reported no usage: the context is the history's measure, which costs
        # only the entries no request measured yet (each one's size is known once measured).
        tokens = self.lastPromptTokens or contextTokens(self.live, self.agent._sizes)
        return TurnResult(self.finalText, self.new, self.usage, stopReason, failure, tokens,
                          self.live if self.replaced else None, self.learnedWindow, self.cost)

    def counted(self, usage: dict[str, Any] | None) -> None:
        """A reply's usage joins the run's, its cost too where the endpoint reports one."""
        self.usage = self.usage.plus(usage)
        cost = (usage or {}).get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0:
            self.cost = (self.cost or 0.0) + cost

    def remember(self, message: dict[str, Any]) -> None:
        """A new history entry, under the rule of ``hermes_acp.safejson``: a lone
        surrogate from a file name or a model delta must not poison the session."""
        message = safejson.repaired(message)
        self.agent._sizes.of(message)  # measured once, here, for every request that carries it
        self.new.append(message)
        self.live.append(message)

    def _system(self) -> dict[str, Any]:
        content = self._prompt()
        return {"role": "system", "content": f"{content}\n\n{NOTE}" if self.agent.planning else content}

    def _prompt(self) -> str:
        agent = self.agent
        content = agent.systemPrompt or defaultSystemPrompt(agent.cwd, agent.additionalDirectories,
                                                            projectInstructions(agent.cwd).text)
        if agent.memorySnapshot:  # frozen for the session: the prompt's prefix stays the same
            content = f"{content}\n\n{agent.memorySnapshot}"
        if agent.skills is not None:  # the skills' names and descriptions (``engine.skills``)
            catalog, self.skillsCatalog = self.skillsCatalog or agent.skills.catalog(agent.cwd), None
            skills = catalog.promptSection(agent.skills.promptChars)
            content = f"{content}\n\n{skills}" if skills else content
        return content

    def _tools(self) -> dict[str, Tool]:
        """The agent's tools and the run's extra ones (an extra never shadows a built-in)."""
        tools = self.agent.activeTools()
        tools.update((name, tool) for name, tool in self.extraTools.items() if name not in tools)
        return tools

    def _measured(self, fixed: int) -> tuple[int, _View]:
        """The next request's size in characters (``fixed``: its system prompt and tools), and
        its history as sent (``_Sizes.view``)."""
        view = self.agent._sizes.view(self.live)
        return fixed + _listed(view.chars, view.image, len(self.live)), view

    def _messages(self, system: dict[str, Any], view: _View) -> list[bytes | dict[str, Any]]:
        """The next request's messages: ``live`` (``view``) after ``system``, images only to a
        model that can see, the newest ``ImageLimits.perRequest`` of them (``images.forModel``),
        and a message of tool images joined to a user message that follows it
        (``images.joined``)."""
        agent, shown = self.agent, self.live
        if not (view.image or view.joinable):
            return _request(system, shown, view.sent)
        if view.image:
            note = (f"(an image is not shown here: the model {agent.model} cannot see images"
                    + ("; vision_analyze can describe an image file, given its path" if agent.visionModel else "") + ")")
            shown = images.forModel(shown, agent.vision is not False, agent.imageLimits.perRequest, note)
        shown = images.joined(shown, SYNTHETIC_KEY)
        return _request(system, shown, [agent._sizes.sent(message) for message in shown])

    def run(self) -> TurnResult:
        agent, observer = self.agent, self.observer
        assert self.userMessage is not None
        # The note is the session's model's: a child (which shares the processes) never takes it.
        note = agent.background.endedNote() if agent.background is not None and not agent.depth else None
        prompt = images.checkedPrompt(self.userMessage, agent.imageLimits)
        self.remember({"role": "user", "content": withNote(prompt, note)})
        system = self._system()
        tools = self._tools()
        schemas, toolChars = _toolSchemas(tools.values())
        fixed = _fixedChars(system, toolChars)
        options = {k: v for k, v in (("max_tokens", agent.maxTokens), ("reasoning_effort", agent.reasoningEffort)) if v}
        retry: dict[str, Any] = {}  # options of the one request that asks again for a cut tool call
        shown = ""  # text the editor already has of that cut reply
        planning = agent.planning
        for step in range(1, agent.maxIterations + 1):
            if self.cancellation.cancelled:
                return self.result(CANCELLED)
            if agent.planning != planning:  # the user approved a plan (or switched modes) mid-turn
                planning, system, tools = agent.planning, self._system(), self._tools()
                schemas, toolChars = _toolSchemas(tools.values())
                fixed = _fixedChars(system, toolChars)
            agent._sizes.keep(self.live)
            sent, view = self._measured(fixed)
            tokens = agent.estimator.tokens(sent)
            if agent.contextWindow and tokens > self._budget().threshold and tokens >= self.compactAgainAt:
                status = self._compact("threshold", fixed).status
                if status == "cancelled":
                    return self.result(CANCELLED)
                if status == "failed":  # not again in this run until there is more that could be compacted
                    self.compactAgainAt = tokens + self._budget().limit // 10
                sent, view = self._measured(fixed)
            text = _Unrepeated(shown, lambda delta: _notify(observer.text, delta))
            try:
                reply = agent.modelClient().complete(
                    agent.model or "", self._messages(system, view), schemas, self.cancellation, text,
                    lambda delta: _notify(observer.thought, delta), **{**options, **retry},
                )
            except ModelError as e:
                if e.images and agent.vision is not False and _hasImages(self.live):
                    agent.vision = False  # the endpoint said so: this run and the next ones send none
                    log.info("model %s does not take images; they are left out of its requests", agent.model)
                    continue
                if retry and not e.overflow:  # it refused the larger max_tokens: the turn ends as it was
                    return self.result(MAX_TOKENS)
                if not e.overflow:
                    return self.result(END_TURN, e)
                if self.overflows >= MAX_OVERFLOW_RETRIES or not self._recover(e, sent, fixed):
                    if self.cancellation.cancelled:
                        return self.result(CANCELLED)
                    return self.result(END_TURN, ModelError(
                        f"{str(e).rstrip('.')}. Run /compact to summarise the conversation, or /reset to start fresh.",
                        overflow=True, window=e.window))
                continue
            retry, shown = {}, ""
            self.counted(reply.usage)
            if reply.usage and reply.usage.get("prompt_tokens"):
                self.lastPromptTokens = reply.usage["prompt_tokens"]
                if not view.image:  # an image's tokens are not its characters
                    agent.estimator.calibrate(sent, self.lastPromptTokens)
            self.finalText = (self.cutText + reply.text) or reply.refusal or self.finalText
            stop = self._stopReason(reply)
            if stop == MAX_TOKENS and self.continuations < MAX_CONTINUATIONS:
                self.continuations += 1
                room = self._moreRoom(options.get("max_tokens"), reply.usage, agent.estimator.tokens(sent))
                if reply.toolCalls and room:  # cut inside a tool call: ask again, once, with more room
                    retry, shown = {"max_tokens": room}, reply.text
                    log.info("reply cut off inside a tool call; asking again with max_tokens %d", room)
                    continue
                if not reply.toolCalls:  # an answer: it goes on from where it was cut
                    self.cutText += reply.text
                    self.remember(_assistantMessage(reply, ()))
                    self.remember({"role": "user", "content": CONTINUE, SYNTHETIC_KEY: "continuation"})
                    continue
            self.cutText = ""
            calls = reply.toolCalls if stop is None else ()
            if reply.text or reply.refusal or reply.reasoning or calls:
                self.remember(_assistantMessage(reply, calls))
            if stop is not None:
                return self.result(stop)
            for message in self._runTools(step, calls, tools):
                self.remember(message)
            self._keepNewestImages()
            if self.ending:
                return self.result(END_TURN)
        return self.result(MAX_TURN_REQUESTS)

    def _keepNewestImages(self) -> None:
        """The turn's new history with the bytes of its newest ``ImageLimits.perRequest`` images
        only, each older one a line: no request carries it again (``images.forModel``), so
        neither memory nor the session's database need hold it."""
        if not _hasImages(self.new):
            return
        kept = images.forModel(self.new, True, self.agent.imageLimits.perRequest, "")
        for index, (old, new) in enumerate(zip(self.new, kept)):
            if old is not new:
                self.new[index] = new
                self.live[:] = [new if message is old else message for message in self.live]
                self.agent._sizes.forget(old)

    def compactNow(self, focus: str) -> TurnResult:
        """``/compact``: one compaction of the history as it is, whatever its size."""
        toolChars = _toolSchemas(self._tools().values())[1]
        outcome = self._compact("requested", _fixedChars(self._system(), toolChars), force=True, focus=focus)
        return self.result(CANCELLED if outcome.status == "cancelled" else END_TURN)

    def _moreRoom(self, current: int | None, usage: dict[str, Any] | None, prompt: int) -> int | None:
        """A larger ``max_tokens`` after a reply the output limit cut: twice what it had,
        at least 8,192, at most 32,768 and what the window leaves after the prompt; None
        when that is no more than it had."""
        had = current or (usage or {}).get("completion_tokens") or 4096
        left = (self.agent.contextWindow or DEFAULT_WINDOW) - prompt - 256
        room = min(MAX_OUTPUT_TOKENS, left, max(8192, 2 * had))
        return room if room > had else None

    def _budget(self) -> Budget:
        return Budget.of(self.agent.contextWindow or DEFAULT_WINDOW, self.agent.maxTokens, self.agent.compactAt)

    def _recover(self, error: ModelError, sent: int, fixed: int) -> bool:
        """A context-length error: learn the window (from the error, else below the
        request that failed), compact and retry; False when that did not help."""
        self.overflows += 1
        agent = self.agent
        learned = error.window or int(agent.estimator.tokens(sent) * 0.9)
        if agent.contextWindow is None or learned < agent.contextWindow:
            agent.contextWindow = self.learnedWindow = learned  # the next turns keep it (the catalog learns it)
        return self._compact("overflow", fixed, force=True).status == "completed"

    def _compact(self, reason: str, fixed: int, force: bool = False, focus: str = "") -> Outcome:
        """One compaction of ``live``, reported to the observer; a failure leaves it as it was.
        It asks for a summary unless the last ``MAX_SUMMARY_FAILURES`` failed (``/compact``
        always asks); the user hears once that summaries fail, not at every compaction."""
        agent, observer = self.agent, self.observer
        budget = self._budget()
        compactionId = uuid.uuid4().hex[:12]
        _notify(observer.compactionStarted, compactionId, reason)
        began = time.monotonic()

        def summarise(request: list[dict[str, Any]], maxTokens: int) -> str:
            reply = agent.modelClient().complete(
                agent.model or "", request, [], self.cancellation,
                lambda text: _notify(observer.compactionText, compactionId, text), lambda text: None,
                max_tokens=maxTokens,
            )
            self.counted(reply.usage)
            if reply.finishReason == CANCELLED_FINISH or self.cancellation.cancelled:
                raise Cancelled()
            return reply.text

        requested = reason == "requested"
        outcome = Compactor(budget, agent.estimator, summarise,
                            lambda messages: _sentChars(messages, agent._sizes)).compact(
            compactionId, self.live, agent.estimator.tokens(fixed), focus, force,
            ask=requested or agent.summaryFailures < MAX_SUMMARY_FAILURES)
        shown = outcome.summary
        if outcome.messages is not None:
            self.live, self.replaced = outcome.messages, True
            self.lastPromptTokens = outcome.after
        if outcome.summaryFailure:
            agent.summaryFailures += 1
            if agent.summaryFailures == 1 or requested:
                shown = SUMMARY_FAILED.format(failure=outcome.summaryFailure) + shown
        elif outcome.kind == "summarised":
            agent.summaryFailures = 0
        why = outcome.error or outcome.summaryFailure
        # One that went as planned is routine (the editor shows it): ``debug``.
        level = logging.INFO if outcome.status == "failed" or why else logging.DEBUG
        log.log(level, "compaction %s (%s): %s%s, %d -> %d tokens in %.3f s%s", compactionId, reason, outcome.status,
                 f" ({outcome.kind})" if outcome.kind else "", outcome.before, outcome.after,
                 time.monotonic() - began, f": {why}" if why else "")
        _notify(observer.compactionEnded, compactionId, outcome.status, shown, outcome.error,
                outcome.before, outcome.after)
        return outcome

    def _stopReason(self, reply: ModelReply) -> str | None:
        """Why the run ends after this reply, or None to run its tools."""
        if reply.finishReason == CANCELLED_FINISH or self.cancellation.cancelled:
            return CANCELLED
        if reply.finishReason == "length":
            return MAX_TOKENS
        if reply.finishReason == "content_filter" or reply.refusal:
            return REFUSAL
        return None if reply.toolCalls else END_TURN

    def _runTools(self, step: int, calls: Sequence[ToolCallRequest], tools: dict[str, Tool]) -> list[dict[str, Any]]:
        """Run a reply's tool calls, a few at a time (``_dispatch``); one tool message per call,
        in order. Every call's card shows at once, pending; a call past ``maxToolCalls`` is
        refused, so every call id still gets its result and the history stays valid.

        Each call gets an id of its own for the observer, ``STEP.INDEX``: the model's
        ids may repeat between steps, and are not ours to rely on."""
        outcomes: dict[int, ToolOutcome] = {}
        ready: list[_Call] = []
        cap = self.agent.maxToolCalls
        if len(calls) > cap:
            log.info("a reply asked for %d tool calls: the %d past the first %d are refused (HERMES_ACP_MAX_TOOL_CALLS)",
                     len(calls), len(calls) - cap, cap)
        for index, call in enumerate(calls):
            callId = f"{step}.{index}"
            context = self.agent.toolContext(self.cancellation.event, self.observer, self.workspace, callId,
                                             self.cancellation, self.checkpoint)
            if call.name == "delegate_task" and not self.agent.depth:
                context = attrs.evolve(context, subagents=Delegation(
                    self.agent, self.cancellation, self.observer, self.workspace, self.extraTools, callId,
                    self._prompt(), self.delegating))
            arguments: Any = {}
            try:
                arguments = parseArguments(call.arguments)
                tool = tools.get(call.name)
                if tool is None:
                    raise ToolError(f"unknown tool {call.name!r}; available: {', '.join(tools)}")
                checked = checkArguments(tool, arguments)
                if index >= cap:
                    raise ToolError(f"not run: this reply asked for {len(calls)} tool calls, and the agent runs "
                                    f"at most {cap} of one reply (the first {cap}). Ask for this one again in a "
                                    "later reply if it is still needed")
            except ToolError as e:
                self._started(callId, call, arguments, tools.get(call.name), context)
                outcomes[index] = ToolOutcome(f"Error: {e}", failed=True)
                self._ended(callId, call, outcomes[index])
                continue
            self._started(callId, call, checked, tool, context)
            ready.append(_Call(index, callId, call, tool, context, checked))
        if ready:
            self._dispatch(ready, outcomes)
        results = [
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": self._budgeted(outcomes[index].text)}
            for index, call in enumerate(calls)
        ]
        found = [(call.name, image) for index, call in enumerate(calls)
                 for image in outcomes[index].extras.get("images") or () if isinstance(image, dict)]
        shown = images.imagesMessage(found, self.agent.imageLimits, SYNTHETIC_KEY) if found else None
        return results + ([shown] if shown else [])

    def _budgeted(self, text: str) -> str:
        """``text`` as the model may read it: within the result's and the turn's share of
        the window (no cut when the window is unknown)."""
        window = self.agent.contextWindow
        if not window:
            return text
        perTurn = int(window * CHARS_PER_TOKEN * TURN_SHARE)
        limit = max(MIN_RESULT_CHARS, min(int(window * CHARS_PER_TOKEN * RESULT_SHARE), perTurn - self.resultChars))
        if len(text) > limit:
            cut = len(text) - limit
            head = limit * 3 // 5
            text = (f"{text[:head]}\n[… {cut:,} characters cut here: the whole result does not fit this model's "
                    f"context; ask for less (a line range, a narrower search)]\n{text[len(text) - (limit - head):]}")
        self.resultChars += len(text)
        return text

    def _dispatch(self, ready: list[_Call], outcomes: dict[int, ToolOutcome]) -> None:
        """Run ``ready`` in order, each in a thread of its own once it holds one of the process's
        tool slots, at most ``toolParallel`` at once; report each as it starts and ends.

        A cancel withdraws the asks for slots and ends the calls still waiting without starting
        them; the running ones get a grace period, then end as interrupted (a late one's thread
        still gives its slot back when it ends)."""
        slots, width = self.agent.toolSlots, max(1, self.agent.toolParallel)
        waiting, running = deque(job for job in ready if job.tool.holdsSlot), {}
        inbox: queue.Queue[Any] = queue.Queue()
        asked = 0  # asks for a slot not granted yet
        deadline: float | None = None
        with self.cancellation.watching(inbox):
            try:
                for job in ready:  # a call that holds no slot starts at once (it waits on calls that do)
                    if not job.tool.holdsSlot:
                        self._start(job, inbox, None, running, outcomes)
                while running or (waiting and deadline is None):
                    while deadline is None and asked < len(waiting) and asked + len(running) < width:
                        slots.ask(inbox)
                        asked += 1
                    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                    try:
                        item = inbox.get(timeout=timeout)
                    except queue.Empty:
                        break
                    if item is _WOKEN:
                        if deadline is None:
                            deadline = time.monotonic() + TOOL_CANCEL_GRACE
                            asked -= slots.withdraw(inbox)
                            while waiting:
                                self._finish(waiting.popleft(), outcomes, "Error: interrupted by the user before it ran.")
                    elif item is GRANTED:
                        asked -= 1
                        if deadline is not None:  # cancelled since it asked
                            slots.release()
                            continue
                        self._start(waiting.popleft(), inbox, slots, running, outcomes)
                    else:
                        index, outcome = item
                        job = running.pop(index)
                        outcomes[index] = outcome
                        self._ended(job.callId, job.call, outcome)
            finally:
                slots.withdraw(inbox)
                slots.releaseGrants(inbox)  # outcomes of abandoned calls are dropped
        for job in running.values():
            self._finish(job, outcomes, "Error: interrupted by the user before it finished.")
        for job in waiting:
            self._finish(job, outcomes, "Error: interrupted by the user before it ran.")

    def _start(self, job: _Call, inbox: queue.Queue[Any], slots: ToolSlots | None, running: dict[int, _Call],
               outcomes: dict[int, ToolOutcome]) -> None:
        """Start ``job``'s thread; ``slots``: the tool slots it holds (None: it holds none)."""
        _notify(self.observer.toolRunning, job.callId)
        try:
            threading.Thread(target=_runCall, args=(inbox, slots, job), daemon=True,
                             name=f"hermes-tool-{job.call.name}").start()
        except RuntimeError as e:  # no thread to be had (the process's limit)
            if slots is not None:
                slots.release()
            self._finish(job, outcomes, f"Error: the agent could not start it: {e}")
        else:
            running[job.index] = job

    def _finish(self, job: _Call, outcomes: dict[int, ToolOutcome], text: str) -> None:
        outcomes[job.index] = ToolOutcome(text, failed=True)
        self._ended(job.callId, job.call, outcomes[job.index])

    def _started(self, callId: str, call: ToolCallRequest, arguments: Any, tool: Tool | None, context: ToolContext) -> None:
        extras: dict[str, Any] = {}
        where = arguments.get(tool.pathArgument) if tool and tool.pathArgument and isinstance(arguments, dict) else None
        if isinstance(where, str):
            extras["path"] = context.resolve(where)
        if tool is not None and tool.title:
            extras.update(title=tool.title, kind=tool.kind or "other")
        shown = arguments if isinstance(arguments, dict) else {"arguments": arguments}
        _notify(self.observer.toolStarted, callId, call.name, shown, extras)

    def _ended(self, callId: str, call: ToolCallRequest, outcome: ToolOutcome) -> None:
        self.ending = self.ending or outcome.endsTurn
        _notify(self.observer.toolEnded, callId, call.name, outcome.text, outcome.failed, outcome.extras)
