"""Tool definitions, their context, argument checking and dispatch."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from hermes_acp import safejson
from hermes_acp.engine.approval import Verdict
from hermes_acp.engine.asking import NOBODY, Answer
from hermes_acp.engine.access import EditProposal
from hermes_acp.engine.compaction import charCount
from hermes_acp.engine.processes import Limits
from hermes_acp.engine.sandbox import Policy
from hermes_acp.engine.secrets import redact, redactAll, secretValues
from hermes_acp.engine.skills import SkillLibrary
from hermes_acp.engine.workspace import Workspace
from hermes_acp.engine.images import ImageLimits, VisionModel

if TYPE_CHECKING:
    from hermes_acp.engine.cancel import Cancellation

if TYPE_CHECKING:
    from hermes_acp.engine.memory import MemoryStore

SessionSearch = Callable[[str, int, bool], list[dict[str, Any]]]  # (query, limit, allProjects)


class Children(Protocol):
    """``delegate_task``'s side of ``engine.subagents.Delegation``: the tasks a call may hold,
    and running them (each task's result and the child's messages)."""

    @property
    def maxTasks(self) -> int: ...

    def run(self, tasks: list[Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]: ...

log = logging.getLogger(__name__)


class ToolError(Exception):
    """A tool could not do what was asked; the message goes to the model."""

    def __init__(self, message: str, extras: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.extras = extras or {}


@attrs.frozen
class ToolOutcome:
    """What a tool call produced: the text the model sees and extras for the editor."""

    text: str
    extras: dict[str, Any] = attrs.field(factory=dict)
    failed: bool = False
    #: The run ends after this reply's calls, without asking the model again (the user chose
    #: to keep planning; a question that the user's next prompt answers).
    endsTurn: bool = False


@attrs.define(eq=False)
class PathLocks:
    """One lock per absolute path, so parallel edits of one file take turns."""

    _locks: dict[str, threading.Lock] = attrs.field(factory=dict)
    _guard: threading.Lock = attrs.field(factory=threading.Lock)

    @contextmanager
    def held(self, path: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:
            yield


@attrs.frozen
class ToolContext:
    """What one tool call may use: the session's folder, I/O, approvals and state.

    ``approveCommand(command, confined, escalation, cwd)``, ``approveEdit``,
    ``approveRead(path)``, ``terminalStarted`` and ``commandOutput`` are bound to the call, so the
    user is asked about this call and no other. ``sandbox`` is the policy that
    confines the session's local commands (None: this machine has no sandbox,
    or the user turned it off); ``limits`` bound each command's resources."""

    cwd: str
    workspace: Workspace
    cancelEvent: threading.Event
    approveCommand: Callable[[str, bool, str | None, str], Verdict]
    approveEdit: Callable[[EditProposal], Verdict]
    approveRead: Callable[[str], Verdict]
    todos: list[dict[str, str]]
    locks: PathLocks
    sandbox: Policy | None = None
    limits: Limits = Limits()
    searchSessions: SessionSearch | None = None
    terminalStarted: Callable[[str], object] = lambda terminalId: None
    commandOutput: Callable[[str], object] = lambda output: None
    #: ``delegate(name, arguments)``: run a tool that lives outside the engine (an
    #: MCP server's) through the turn that owns this call.
    delegate: Callable[[str, dict[str, Any]], ToolOutcome] = lambda name, arguments: ToolOutcome(
        f"Error: {name} cannot run here", failed=True)
    #: ``approvePlan(plan)``: show the plan and ask the user (an answer of ``ANSWERS``);
    #: None when the session is not in plan mode (``engine.planning``).
    approvePlan: Callable[[str], str | None] = lambda plan: None
    #: ``askUser(question, choices)``: ask the user through the turn that owns this
    #: call; an ``engine.asking.Answer`` (nobody to ask: no answer).
    askUser: Callable[[str, list[str]], Answer] = lambda question, choices: NOBODY
    #: ``approveFetch(url, host)``: may the call fetch from ``host`` (``engine.webaccess``)?
    approveFetch: Callable[[str, str], Verdict] = lambda url, host: Verdict(False, "fetching is not available here")
    #: The session's background processes (``engine.background.SessionProcesses``; None: none here).
    background: Any = None
    #: The user's memory files (``engine.memory``; None: memory is off), and the session's
    #: decision on a change to them (``access.PathApprovals.decideMemory``), bound to the call.
    memory: MemoryStore | None = None
    approveMemory: Callable[[EditProposal], Verdict] = lambda proposal: Verdict(
        False, "Memory cannot be written here.")
    #: How big an image may be to reach the model (``read_file``, ``vision_analyze``).
    imageLimits: ImageLimits = ImageLimits()
    #: The run's cancellation (a model request a tool makes stops with it), and the model
    #: ``vision_analyze`` asks (None: not configured).
    cancellation: Cancellation | None = None
    vision: VisionModel | None = None
    #: The skills the skill tools read (``engine.skills``); None: the session has none.
    skills: SkillLibrary | None = None
    #: ``approveSkillEdit(proposal)``: a ``skill_manage`` change of the user's skills, decided
    #: like an edit of the workspace though they live in ``$HERMES_HOME`` (``PathApprovals.decide``).
    approveSkillEdit: Callable[[EditProposal], Verdict] = lambda proposal: Verdict(
        False, "skills cannot be changed here")
    #: ``beforeChange()``: the turn's checkpoint of the session's folders, taken once, before
    #: the first call that may change them (``Tool.mayWrite``; ``engine.checkpoints``).
    beforeChange: Callable[[], None] = lambda: None
    #: ``delegate_task``'s children (``engine.subagents.Delegation``), bound to the call; None
    #: for any other call, and in a subagent.
    subagents: Children | None = None

    def resolve(self, path: str) -> str:
        """An absolute, normalised path; relative paths start at the session's folder."""
        path = os.path.expanduser(path)
        return os.path.normpath(os.path.join(self.cwd, path))

    def resolveReal(self, path: str) -> str:
        """``resolve(path)`` with its symlinks followed: the file a read or an
        edit is judged by, and then touches (the workspace opens it without
        following a link, so a link swapped in meanwhile fails the call)."""
        return os.path.realpath(self.resolve(path))

    def display(self, path: str) -> str:
        """``path`` relative to the session's folder when it is inside it."""
        relative = os.path.relpath(path, self.cwd)
        return path if relative.startswith("..") else relative


@attrs.frozen
class Tool:
    """A tool: its name, what the model reads about it, and its handler."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., ToolOutcome]
    # The argument that names a file or folder, reported as "path" when the call starts.
    pathArgument: str | None = None
    #: Arguments go to the handler as the model gave them (an object), unchecked
    #: here: the tool's own schema is someone else's to enforce (an MCP server's).
    passthrough: bool = False
    #: How the editor shows its calls, when not by the renderer's rules.
    title: str | None = None
    kind: str | None = None
    #: Whether a call may change files: True, or ``mayWrite(ctx, arguments)`` for tools whose
    #: arguments tell (a command known to only read). The engine takes the turn's checkpoint
    #: before the first such call runs (``ToolContext.beforeChange``): a tool that writes, starts
    #: a process or runs another agent says so here, and ``/rewind`` can undo what it did.
    mayWrite: bool | Callable[[ToolContext, dict[str, Any]], bool] = False

    def writes(self, ctx: ToolContext, arguments: dict[str, Any]) -> bool:
        """Whether this call may change files (a failing judgement counts as yes)."""
        if not callable(self.mayWrite):
            return self.mayWrite
        try:
            return bool(self.mayWrite(ctx, arguments))
        except Exception:
            log.exception("mayWrite of %s failed; taking a checkpoint all the same", self.name)
            return True

    #: Its call holds one of the process's tool slots while it runs; not one that only waits for
    #: work that needs slots itself (``delegate_task``: its children's calls).
    holdsSlot: bool = True
    #: ``requestForm``'s answer, made at its first call.
    _form: tuple[bytes, int] | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def requestForm(self) -> tuple[bytes, int]:
        """The schema as a model request's body carries it (``model.bodyJSON``: compact UTF-8
        JSON, healed) and its size as the agent counts a request (``compaction.charCount``),
        made once: the tool is frozen, and a request joins its tools' bytes instead of encoding
        13 KB of schemas again. Kept as long as the tool (the built-in ones, the process; an
        MCP server's, until its list changes), by every session and subagent that sends it."""
        form = self._form
        if form is None:
            schema = self.schema()
            form = (safejson.encodeHealed(schema), charCount(schema))
            object.__setattr__(self, "_form", form)
        return form


def parameters(required: Iterable[str] = (), **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _coerce(name: str, value: Any, spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    if kind == "integer" and isinstance(value, (str, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if number.is_integer():
            value = int(number)
    elif kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    expected = _TYPES.get(kind or "", (object,))
    if not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool)):
        raise ToolError(f"argument {name!r} must be {kind}, not {type(value).__name__}")
    if "enum" in spec and value not in spec["enum"]:
        raise ToolError(f"argument {name!r} must be one of {', '.join(map(str, spec['enum']))}")
    if "minimum" in spec and value < spec["minimum"]:
        raise ToolError(f"argument {name!r} must be at least {spec['minimum']}")
    if "maximum" in spec and value > spec["maximum"]:
        raise ToolError(f"argument {name!r} must be at most {spec['maximum']}")
    if isinstance(value, str) and "\0" in value:
        raise ToolError(f"argument {name!r} contains a NUL character, which no path, pattern or command can hold")
    return value


def checkArguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """The arguments with defaults filled in, or a ``ToolError`` that says what is wrong."""
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments for {tool.name} must be a JSON object")
    if tool.passthrough:
        return arguments
    properties = tool.parameters["properties"]
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise ToolError(
            f"unknown argument(s) for {tool.name}: {', '.join(unknown)}; "
            f"accepted: {', '.join(properties)}"
        )
    missing = [name for name in tool.parameters["required"] if arguments.get(name) is None]
    if missing:
        raise ToolError(f"missing required argument(s) for {tool.name}: {', '.join(missing)}")
    checked = {}
    for name, spec in properties.items():
        value = arguments.get(name)
        if value is None:
            if "default" in spec:
                checked[name] = spec["default"]
            continue
        checked[name] = _coerce(name, value, spec)
    return checked


def parseArguments(raw: str) -> Any:
    """Decode a tool call's JSON arguments (empty means none) under the rule of
    ``hermes_acp.safejson``: lone surrogates repaired, NaN, Infinity and deep
    nesting refused."""
    if not raw.strip():
        return {}
    try:
        return safejson.checked(json.loads(raw), "arguments")
    except safejson.Refused as e:
        raise ToolError(f"{e}; send plain JSON") from e
    except (ValueError, RecursionError) as e:
        raise ToolError(f"the arguments are not valid JSON ({e}); send a JSON object") from e


def batchItems(items: list[Any], name: str, fields: tuple[str, ...], shape: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each item of a tool's batch argument ``name`` with its index, once it is an object
    (``shape`` says which, in the message) with no field but ``fields``."""
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ToolError(f"{name}[{index}] must be an object {shape}")
        unknown = sorted(set(item) - set(fields))
        if unknown:
            raise ToolError(f"{name}[{index}] has unknown field(s): {', '.join(unknown)}; accepted: {', '.join(fields)}")
        yield index, item


def runTool(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutcome:
    """Run one checked call; errors become a failed outcome, never an exception.

    Known secret values (``hermes_acp.engine.secrets``, read anew each call: a
    setup may change them) are redacted from the outcome's text and from every
    string in its extras, so no tool output carries one to the model, the
    editor, the journal or the search index."""
    try:
        outcome = tool.handler(ctx, **arguments)
    except ToolError as e:
        outcome = ToolOutcome(f"Error: {e}", e.extras, failed=True)
    except Exception as e:
        log.exception("tool %s failed", tool.name)
        outcome = ToolOutcome(f"Error: {tool.name} failed unexpectedly: {type(e).__name__}: {e}", failed=True)
    secrets = secretValues()
    if not secrets:
        return outcome
    return attrs.evolve(outcome, text=redact(outcome.text, secrets), extras=redactAll(outcome.extras, secrets))


def jsonText(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
