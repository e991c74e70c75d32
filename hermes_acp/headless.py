"""``hermes-acp prompt``: a headless ACP client for scripts, CI and smoke tests.

It spawns the agent (this installation's own ``python -m hermes_acp``) over
stdio and talks to it with the project's ``JSONRPCConnection``: it opens a
session in the current directory (or loads ``--session ID``), sends one prompt,
shows what streams back, answers permission requests and the model's questions
(``elicitation/create``, form mode: on the terminal, or with ``--answer``), and
exits with a code that says how the turn ended (``STOP_CODES``).

This process is not the agent, so its stdout is for people: the answer goes to
stdout, tool calls, plans, permission questions and notes go to stderr (so
``answer=$(hermes-acp prompt ...)`` captures just the answer). ``--json``
prints the agent's frames exactly as received instead.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.error import ConnectionDone, ConnectionLost, ProcessExitedAlready
from twisted.python import usage

from .child import RPCChild
from .elicitform import MAX_MESSAGE_LINES, Field, Form, FormError, Limits, clean, parseForm, plain
from .engine.approval import ALLOW_ALWAYS, ALLOW_ONCE, REJECT_ALWAYS, REJECT_ONCE

EXIT_OK = 0
EXIT_ERROR = 1  # the agent answered with an error, died, or the model endpoint failed
EXIT_AUTH = 3  # -32000: not configured (run `hermes-acp --setup`) or logged out
EXIT_REFUSAL = 4
EXIT_MAX_TOKENS = 5
EXIT_MAX_TURN_REQUESTS = 6
EXIT_USAGE = 64  # bad command line (the CLI's own code)
EXIT_CANCELLED = 130  # Ctrl-C (session/cancel), or the agent cancelled the turn
EXIT_TERMINATED = 143  # SIGTERM: the agent was stopped without a turn answer

STOP_CODES = {
    "end_turn": EXIT_OK,
    "refusal": EXIT_REFUSAL,
    "max_tokens": EXIT_MAX_TOKENS,
    "max_turn_requests": EXIT_MAX_TURN_REQUESTS,
    "cancelled": EXIT_CANCELLED,
}
#: After session/cancel, how long the agent gets to answer "cancelled".
CANCEL_GRACE = 10.0
#: After its stdin closes, how long the agent gets to exit before it is killed.
EXIT_GRACE = 5.0
#: The most lines of a diff or command shown in a permission question.
PREVIEW_LINES = 40
#: How many of its last lines a failed command shows.
OUTPUT_TAIL = 10
#: How many of its last lines a successful command shows.
SUCCESS_TAIL = 3
#: How often the spinner turns, and how long output must be quiet before it shows.
SPIN_INTERVAL = 0.1
SPIN_QUIET = 0.3
SPIN_FRAMES = "|/-\\"

# The agent runs ``-m hermes_acp`` in a session of its own, so Ctrl-C at the
# terminal reaches only this client, which then cancels the turn properly.
_BOOT = (
    "import os, runpy, sys\n"
    "os.setsid()\n"
    "sys.argv[0] = 'hermes-acp'\n"
    "runpy.run_module('hermes_acp', run_name='__main__')\n"
)


class PromptOptions(usage.Options):
    synopsis = "[--session ID] [--model NAME] [--yes | --deny] [--answer TEXT] [--json] [PROMPT ... | -]"
    longdesc = (
        "Start the agent, run one prompt in the current directory and print the answer, tool calls "
        "and plans. The prompt is the arguments, or stdin when it is `-` or absent and stdin is "
        "not a terminal. Agent options (--trace FILE, --log-level) go before `prompt`. "
        "Exit codes: 0 end_turn, 1 error, 3 not configured, 4 refusal, 5 max_tokens, "
        "6 max_turn_requests, 130 cancelled (Ctrl-C), 143 terminated, 64 bad command line."
    )
    optFlags = [
        ["yes", "y", "Allow each permission request once (allow_once)."],
        ["deny", None, "Reject each permission request (reject_once)."],
        ["json", None, "Print the agent's frames as received (one JSON object a line) instead of the readable view."],
    ]
    optParameters = [
        ["session", "s", None, "Continue this session (session/load) instead of starting one."],
        ["model", "m", None, "Use this model in the session (its model config option)."],
        ["answer", None, None, "Answer the model's questions (elicitation/create) with this text: the matching "
                               "choice, or free text where allowed. Without it and without a terminal, nobody "
                               "answers them."],
    ]

    def getSynopsis(self) -> str:
        return f"Usage: hermes-acp [--trace FILE] [--log-level LEVEL] prompt {self.synopsis}"

    def opt_version(self) -> None:
        """Print the version and exit."""
        print(f"hermes-acp {_version()}")
        sys.exit(0)

    def parseArgs(self, *words: str) -> None:
        self["words"] = list(words)

    def postOptions(self) -> None:
        if self["yes"] and self["deny"]:
            raise usage.UsageError("--yes and --deny exclude each other")
        for name in ("model", "answer"):
            if self[name] is not None and not self[name].strip():
                raise usage.UsageError(f"--{name} needs a value")
        words = self["words"]
        self["fromStdin"] = words in ([], ["-"])
        if not words and sys.stdin.isatty():
            raise usage.UsageError("give the prompt as arguments, or pipe it on stdin")


def promptText(options: PromptOptions, stdin: Any) -> str:
    """The prompt: the arguments joined, or all of stdin."""
    if options["fromStdin"]:
        return stdin.buffer.read().decode("utf-8", "replace").rstrip()
    return " ".join(options["words"]).strip()


def isAnswer(option: Any) -> bool:
    """An option the agent marked as an answer to a question, not a permission."""
    meta = option.get("_meta") if isinstance(option, dict) else None
    mark = meta.get("hermes-acp") if isinstance(meta, dict) else None
    return isinstance(mark, dict) and mark.get("answer") is True and "optionId" in option


def pickOption(options: list[Any], wanted: str) -> dict[str, Any] | None:
    """The offered option of kind ``wanted`` (or its nearest kind), if any."""
    nearest = {
        ALLOW_ONCE: (ALLOW_ONCE, ALLOW_ALWAYS),
        ALLOW_ALWAYS: (ALLOW_ALWAYS, ALLOW_ONCE),
        REJECT_ONCE: (REJECT_ONCE, REJECT_ALWAYS),
    }[wanted]
    for kind in nearest:
        for option in options:
            if isinstance(option, dict) and option.get("kind") == kind and "optionId" in option:
                return option
    return None


def contentText(block: dict[str, Any]) -> str:
    """The text of a tool-call content block, without Markdown fences."""
    if block.get("type") == "content" and isinstance(block.get("content"), dict):
        text = str(block["content"].get("text", ""))
        return "\n".join(line for line in text.splitlines() if not line.startswith("```"))
    if block.get("type") == "diff":
        old = (block.get("oldText") or "").splitlines()
        new = str(block.get("newText", "")).splitlines()
        path = str(block.get("path", ""))
        import difflib  # only when a diff is shown

        return "\n".join(difflib.unified_diff(old, new, path if old else "/dev/null", path, lineterm=""))
    return f"({block.get('type', 'unknown')} content)"


def _firstLine(blocks: Any) -> str:
    for block in blocks if isinstance(blocks, list) else []:
        for line in contentText(block).splitlines() if isinstance(block, dict) else []:
            if line.strip():
                return line.strip()[:200]
    return ""


def _outputTail(blocks: Any, count: int = OUTPUT_TAIL) -> list[str]:
    """The last lines of the command output in a tool call's content (the fenced
    part, without the status line the agent writes after it)."""
    lines: list[str] = []
    for block in blocks if isinstance(blocks, list) else []:
        content = block.get("content") if isinstance(block, dict) and block.get("type") == "content" else None
        text = str(content.get("text", "")) if isinstance(content, dict) else ""
        fenced = re.search(r"^(`{3,})[^\n]*\n(.*?)^\1$", text, re.M | re.S)
        lines += (fenced.group(2) if fenced else text).splitlines()
    return lines[-count:]


def colourWanted(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colours only on a terminal, and not when ``NO_COLOR`` is set (https://no-color.org)
    or the terminal is ``TERM=dumb``."""
    return _isTTY(stream) and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


def _isTTY(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Terminal:
    """The readable view: the answer on ``out``, everything else on ``err``,
    a line at a time so the two never share a line on a terminal.

    On a terminal (``err`` is a TTY) it also shows the model's reasoning (dimmed
    with ``colour``, as statuses are coloured), and with a ``clock`` a spinner
    while the model works. Elsewhere (a pipe, a log file) the lines stay plain
    and nothing is redrawn, so scripts read what they always read."""

    PLAN_MARKS = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]"}
    STYLES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
    STATUS_STYLES = {"completed": "green", "failed": "red"}

    def __init__(self, out: TextIO, err: TextIO, raw: bool = False, colour: bool = False,
                 clock: Any = None) -> None:
        self.out = out
        self.err = err
        self.raw = raw
        self.colour = colour
        self.midLine = False
        self.asking = False
        self.tools: dict[str, dict[str, Any]] = {}
        self.onTTY = _isTTY(err) and not raw
        self.thinkingLine = False  # reasoning text is mid-line on err
        self.waiting = False  # the model is working; the spinner may show
        self.spinning = False  # a spinner frame is on screen
        self.frameNo = 0
        self.clock = clock
        self.lastWrite = 0.0
        self._spinner: Any = None
        if self.onTTY and clock is not None:
            from twisted.internet.task import LoopingCall

            self._spinner = LoopingCall(self.spin)
            self._spinner.clock = clock

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{self.STYLES[style]}m{text}\x1b[0m" if self.colour and text else text

    # -- the spinner ------------------------------------------------------------

    def startWaiting(self) -> None:
        self.waiting = True
        if self._spinner is not None and not self._spinner.running:
            self._spinner.start(SPIN_INTERVAL, now=False)

    def stopWaiting(self) -> None:
        self.waiting = False
        self.unspin()
        if self._spinner is not None and self._spinner.running:
            self._spinner.stop()

    def spin(self) -> None:
        """One turn of the spinner, when nothing else is on its line and output was quiet."""
        busy = self.asking or self.thinkingLine or (self.midLine and _isTTY(self.out))
        if not self.waiting or busy or self.clock.seconds() - self.lastWrite < SPIN_QUIET:
            return
        self.frameNo += 1
        self.err.write("\r" + self.paint(f"{SPIN_FRAMES[self.frameNo % len(SPIN_FRAMES)]} working", "dim") + "\x1b[K")
        self.err.flush()
        self.spinning = True

    def unspin(self) -> None:
        """Take the spinner (or the reasoning line) off the screen before other output."""
        if self.clock is not None:
            self.lastWrite = self.clock.seconds()
        if self.spinning:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self.spinning = False
        if self.thinkingLine:
            self.err.write("\n")
            self.err.flush()
            self.thinkingLine = False

    # -- writing ----------------------------------------------------------------

    def answer(self, text: str) -> None:
        self.unspin()
        self.out.write(text)
        self.out.flush()
        self.midLine = not text.endswith("\n")

    def thought(self, text: str) -> None:
        """The model's reasoning: dimmed on a terminal, not shown elsewhere."""
        if not self.onTTY or not text:
            return
        self.unspin()
        self.endLine()
        text = plain(text)
        self.err.write(self.paint(text, "dim"))
        self.err.flush()
        self.thinkingLine = not text.endswith("\n")

    def endLine(self) -> None:
        if self.midLine:
            self.out.write("\n")
            self.out.flush()
            self.midLine = False

    def note(self, text: str, style: str | None = None) -> None:
        self.unspin()
        self.endLine()
        if self.asking:  # a question still waits for its answer on this line
            self.err.write("\n")
            self.asking = False
        text = plain(text).rstrip("\n")  # much of it is the model's (a plan, a title, a command)
        self.err.write((self.paint(text, style) if style else text) + "\n")
        self.err.flush()

    def ask(self, question: str) -> None:
        """A question on stderr, its answer typed on the same line."""
        self.unspin()
        self.endLine()
        self.err.write(self.paint(question, "bold"))
        self.err.flush()
        self.asking = True

    def answered(self) -> None:
        self.asking = False
        if self.clock is not None:
            self.lastWrite = self.clock.seconds()

    def stderrBytes(self, data: bytes) -> None:
        """The agent's own log output, passed through."""
        self.unspin()
        self.endLine()
        self.err.buffer.write(data)
        self.err.flush()

    def frame(self, line: bytes) -> None:
        """``--json``: one frame exactly as the agent sent it."""
        self.out.buffer.write(line + b"\n")
        self.out.flush()

    def update(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content") or {}
            if content.get("type") == "text":
                self.answer(str(content.get("text", "")))
            else:
                self.note(f"[agent sent {content.get('type', 'unknown')} content]")
        elif kind == "agent_thought_chunk":
            content = update.get("content") or {}
            if content.get("type") == "text":
                self.thought(str(content.get("text", "")))
        elif kind in ("tool_call", "tool_call_update"):
            self.toolCall(update)
        elif kind == "plan":
            self.note("[plan]", "cyan")
            for entry in update.get("entries") or []:
                mark = self.PLAN_MARKS.get(entry.get("status"), "[ ]")
                self.note(f"  {mark} {entry.get('content', '')}")

    def toolCall(self, update: dict[str, Any]) -> None:
        callId = str(update.get("toolCallId"))
        known = self.tools.get(callId)
        call = self.tools[callId] = {**(known or {}), **update}
        title = call.get("title") or callId
        status = update.get("status")
        if known is None:
            self.note(f"[tool] {title} ({call.get('kind', 'other')}): {status or 'pending'}")
        elif status and status != known.get("status"):
            raw = update.get("rawOutput") if isinstance(update.get("rawOutput"), dict) else {}
            exitCode = raw.get("exitCode")
            style = self.STATUS_STYLES.get(status)
            if call.get("kind") == "execute" and status in ("completed", "failed"):
                ended = f"exit code {exitCode}" if exitCode is not None else (
                    f"signal {raw['signal']}" if raw.get("signal") else "")
                failed = status == "failed" or exitCode not in (None, 0)
                self.note(f"[tool] {title}: {status}" + (f" ({ended})" if ended else ""), "red" if failed else style)
                for line in _outputTail(update.get("content"), OUTPUT_TAIL if failed else SUCCESS_TAIL):
                    self.note(f"  | {line}", None if failed else "dim")
                return
            reason = _firstLine(update.get("content")) if status == "failed" else ""
            self.note(f"[tool] {title}: {status}" + (f" - {reason}" if reason else ""), style)

    def permission(self, toolCall: dict[str, Any]) -> None:
        self.note(f"[permission] {toolCall.get('title', 'a tool call')} ({toolCall.get('kind', 'other')})", "yellow")
        for block in toolCall.get("content") or []:
            if isinstance(block, dict):
                lines = contentText(block).splitlines()
                for line in lines[:PREVIEW_LINES]:
                    self.note(f"  {line}")
                if len(lines) > PREVIEW_LINES:
                    self.note(f"  ... {len(lines) - PREVIEW_LINES} more lines")

    def question(self, form: Form) -> None:
        """Who asks, and what: the agent's question, or a tool's (an MCP server's)."""
        call = self.tools.get(form.toolCallId or "") or {}
        asker = f"the tool call {clean(call.get('title') or form.toolCallId)}" if form.toolCallId else "the agent"
        self.note(f"[question] from {asker}", "yellow")
        lines = form.message.splitlines()
        for line in lines[:MAX_MESSAGE_LINES]:
            self.note(f"  {line}", "bold")
        if len(lines) > MAX_MESSAGE_LINES:
            self.note(f"  ... {len(lines) - MAX_MESSAGE_LINES} more lines")

    def field(self, field: Field, free: bool) -> str:
        """Show one field of a form; the prompt to type its answer after."""
        if field.title != field.name or len(field.choices) or field.description:
            self.note(f"  {field.title}" + (f" - {field.description}" if field.description else ""))
        for number, (_, label) in enumerate(field.choices, 1):
            self.note(f"    {number}. {label}")
        skip = "empty line declines" if field.required else "empty line skips"
        if field.choices:
            many = ", several separated by commas" if field.kind == "array" else ""
            typed = " or type an answer" if free else ""
            return f"  Choose 1-{len(field.choices)}{many}{typed} ({skip}): "
        if field.kind == "boolean":
            return f"  [y] yes, [n] no ({skip}): "
        return f"  Answer ({skip}): "


class PromptClient:
    """One headless run: spawn, handshake, one prompt, clean exit."""

    def __init__(
        self,
        reactor: Any,
        text: str,
        ui: Terminal,
        policy: str | None,
        agentArgs: list[str],
        sessionId: str | None = None,
        cwd: str | None = None,
        interactive: bool = False,
        stdinFd: int = 0,
        model: str | None = None,
        answer: str | None = None,
        limits: Limits = Limits(),
    ) -> None:
        from .jsonrpc import JSONRPCConnection

        self.reactor = reactor
        self.text = text
        self.ui = ui
        self.policy = policy  # "yes", "deny" or None (ask on a terminal, else deny)
        self.agentArgs = agentArgs
        self.sessionId = sessionId
        self.cwd = cwd or os.getcwd()
        self.interactive = interactive
        self.stdinFd = stdinFd
        self.model = model
        self.answerText = answer  # --answer: the answer to every question the model asks
        self.limits = limits
        self.prompting = False
        self.cancelling = False
        self.abortCode: int | None = None
        self.connection = JSONRPCConnection(
            {"session/request_permission": self.requestPermission, "elicitation/create": self.elicit},
            {"session/update": self.sessionUpdate},
            reactor,
            trace=(lambda direction, line, message: direction == "in" and ui.frame(line)) if ui.raw else None,
        )
        self.process = RPCChild(self.connection, ui.stderrBytes)
        self._questions: list[Deferred[str | None]] = []
        self._line: Deferred[bytes] | None = None

    # -- running ------------------------------------------------------------

    def spawn(self) -> None:
        argv = [sys.executable, "-c", _BOOT, *self.agentArgs]
        self.reactor.spawnProcess(self.process, sys.executable, argv, env=dict(os.environ), path=None)

    async def run(self) -> int:
        self.spawn()
        try:
            code = await self.converse()
        finally:
            await self.stopAgent()
        return self.abortCode if self.abortCode is not None else code

    async def converse(self) -> int:
        from .jsonrpc import RemoteError

        call = self.connection.callRemote
        try:
            init = await call("initialize", {
                "protocolVersion": 1,
                "clientCapabilities": self.capabilities(),
                "clientInfo": {"name": "hermes-acp-prompt", "title": "hermes-acp prompt", "version": _version()},
            })
            if not isinstance(init, dict) or init.get("protocolVersion") != 1:
                return self.fail(f"the agent speaks protocol {init.get('protocolVersion') if isinstance(init, dict) else init!r}, not 1")
            where = {"cwd": self.cwd, "mcpServers": []}
            if self.sessionId is not None:
                if not (init.get("agentCapabilities") or {}).get("loadSession"):
                    return self.fail("this agent cannot load sessions")
                opened = await call("session/load", {"sessionId": self.sessionId, **where})
            else:
                opened = await call("session/new", where)
                self.sessionId = str(opened["sessionId"])
            if self.model is not None and not await self.chooseModel(opened):
                return self.fail("this agent offers no model choice (--model)")
            self.prompting = True
            self.ui.startWaiting()
            response = await call("session/prompt", {"sessionId": self.sessionId, "prompt": [{"type": "text", "text": self.text}]})
        except RemoteError as e:
            if self.abortCode is not None:
                return self.abortCode
            if e.code == -32000:
                return self.fail(f"{e.message}\nRun `hermes-acp --setup` (then `hermes-acp --check`).", EXIT_AUTH)
            if self.prompting:  # the turn itself failed (a model error, a crash): the agent says why
                self.ui.note(f"[failed] session {self.sessionId}")
                return self.fail(f"the turn failed: {e.message}")
            return self.fail(f"the agent answered error {e.code}: {e.message}")
        except (ConnectionDone, ConnectionLost):
            if self.abortCode is not None:
                return self.abortCode
            await self.process.whenEnded()
            return self.fail(f"the agent stopped before it answered ({self.process.describeEnd()}); its messages are above")
        except (KeyError, TypeError) as e:
            return self.fail(f"unexpected answer from the agent: {e!r}")
        finally:
            self.prompting = False
            self.ui.stopWaiting()
        stop = response.get("stopReason") if isinstance(response, dict) else None
        if stop not in STOP_CODES:
            return self.fail(f"unknown stop reason {stop!r}")
        self.ui.note(f"[{stop}] session {self.sessionId}")
        return STOP_CODES[stop]

    def fail(self, message: str, code: int = EXIT_ERROR) -> int:
        self.ui.note(f"hermes-acp prompt: {message}", "red")
        return code

    def capabilities(self) -> dict[str, Any]:
        """No fs/*, no terminal/*: the agent uses the local disk. Form elicitation
        only when someone can answer: a terminal to ask on, or ``--answer``."""
        if self.interactive or self.answerText is not None:
            return {"elicitation": {"form": {}}}
        return {}

    async def chooseModel(self, opened: Any) -> bool:
        """``--model``: set the session's model through its ``model`` config option
        (or the older ``session/set_model`` when that is all the agent offers)."""
        opened = opened if isinstance(opened, dict) else {}
        options = opened.get("configOptions") if isinstance(opened.get("configOptions"), list) else []
        if any(isinstance(o, dict) and o.get("id") == "model" for o in options):
            await self.connection.callRemote("session/set_config_option", {
                "sessionId": self.sessionId, "configId": "model", "value": self.model})
        elif isinstance(opened.get("models"), dict):
            await self.connection.callRemote("session/set_model", {"sessionId": self.sessionId, "modelId": self.model})
        else:
            return False
        self.ui.note(f"[model] {self.model}")
        return True

    async def stopAgent(self) -> None:
        """Close the agent's stdin (it exits at EOF); kill it if it lingers."""
        if self.process.status is None:
            transport = self.process.transport
            if transport is not None:
                transport.closeStdin()
            ended = self.process.whenEnded()
            ended.addTimeout(EXIT_GRACE, self.reactor)
            try:
                await ended
            except TimeoutError:
                self.kill()
                await self.process.whenEnded()
        self.ui.endLine()

    def kill(self) -> None:
        try:
            self.process.transport.signalProcess("KILL")
        except ProcessExitedAlready:
            pass

    # -- interruption -------------------------------------------------------

    def interrupt(self) -> None:
        """Ctrl-C: cancel the turn; a second one (or no turn yet) stops at once."""
        if self.cancelling or not self.prompting:
            self.abort(EXIT_CANCELLED)
            return
        self.cancelling = True
        self.ui.note("[cancelling; press Ctrl-C again to stop at once]")
        for question in list(self._questions):
            question.callback(None)
        self.connection.notify("session/cancel", {"sessionId": self.sessionId})
        self.reactor.callLater(CANCEL_GRACE, lambda: self.prompting and self.abort(EXIT_CANCELLED))

    def abort(self, code: int) -> None:
        """Stop the agent without waiting for an answer; the run exits with ``code``."""
        if self.abortCode is None:
            self.abortCode = code
        if self.process.status is None:
            self.kill()

    def shutdown(self) -> Deferred[None] | None:
        """The reactor is stopping (SIGTERM): take the agent down with us."""
        if self.process.status is not None:
            return None
        self.abort(EXIT_TERMINATED)
        return self.process.whenEnded()

    # -- requests and notifications from the agent ---------------------------

    def sessionUpdate(self, params: dict[str, Any]) -> None:
        update = params.get("update")
        if not (self.prompting and params.get("sessionId") == self.sessionId and isinstance(update, dict)):
            return  # another session, or the history session/load replays
        if not self.ui.raw:
            self.ui.update(update)

    async def requestPermission(self, params: dict[str, Any]) -> dict[str, Any]:
        toolCall = params.get("toolCall") if isinstance(params.get("toolCall"), dict) else {}
        options = params.get("options") if isinstance(params.get("options"), list) else []
        self.ui.permission(toolCall)
        if any(isAnswer(option) for option in options):
            return await self.chooseAnswer(options)
        wanted: str | None
        if self.cancelling:
            wanted, why = None, "cancelled"
        elif self.policy == "yes":
            wanted, why = ALLOW_ONCE, "allowed once (--yes)"
        elif self.policy == "deny":
            wanted, why = REJECT_ONCE, "rejected (--deny)"
        elif self.interactive:
            wanted, why = await self.ask(options)
        else:
            wanted, why = REJECT_ONCE, "rejected: no terminal to ask on (pass --yes or --deny)"
        option = pickOption(options, wanted) if wanted else None
        if option is None:
            self.ui.note("[permission] cancelled")
            return {"outcome": {"outcome": "cancelled"}}
        self.ui.note(f"[permission] {why}")
        return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}

    async def chooseAnswer(self, options: list[Any]) -> dict[str, Any]:
        """A question the agent asks as a permission request (an editor without forms): its
        options marked as answers are the choices. ``--yes`` never picks one (the model would
        take it for the user's); ``--answer`` picks the one it names, a terminal asks, else
        the question goes unanswered."""
        choices = [o for o in options if isAnswer(o)]
        chosen: dict[str, Any] | None = None
        if self.cancelling:
            pass
        elif self.answerText is not None:
            wanted = self.answerText.strip().casefold()
            chosen = next((o for o in choices if str(o.get("name", "")).strip().casefold() == wanted), None)
        elif self.interactive:
            for number, option in enumerate(choices, 1):
                self.ui.note(f"  [{number}] {clean(option.get('name', ''))}")
            while chosen is None:
                line = await self.typed(f"  Answer [1-{len(choices)}] (empty line: no answer): ", "question")
                if not line or not line.strip():
                    break
                if line.strip().isdigit() and 1 <= int(line.strip()) <= len(choices):
                    chosen = choices[int(line.strip()) - 1]
        if chosen is None:
            declined = pickOption([o for o in options if not isAnswer(o)], REJECT_ONCE)
            nobody = not self.interactive and self.answerText is None and not self.cancelling
            self.ui.note("[question] not answered" + (": no terminal to ask on" if nobody else ""))
            if declined is None:
                return {"outcome": {"outcome": "cancelled"}}
            answer: dict[str, Any] = {"outcome": {"outcome": "selected", "optionId": declined["optionId"]}}
            if nobody:  # ACP has no outcome for it; the agent tells the model nobody can answer
                answer["_meta"] = {"hermes-acp": {"unanswerable": True}}
            return answer
        self.ui.note(f"[question] answered: {clean(chosen.get('name', ''))}")
        return {"outcome": {"outcome": "selected", "optionId": chosen["optionId"]}}

    async def ask(self, options: list[Any]) -> tuple[str | None, str]:
        """Ask on the terminal until the answer is y, a or n (or Ctrl-C), after what each key
        picks: the offered options' own names (a plan's "implement and accept edits" is no
        plain "always")."""
        answers = {"y": (ALLOW_ONCE, "allowed once"), "a": (ALLOW_ALWAYS, "allowed for this session"),
                   "n": (REJECT_ONCE, "rejected")}
        for key, (kind, _) in answers.items():
            option = pickOption(options, kind)
            if option is not None:
                self.ui.note(f"  [{key}] {clean(option.get('name', kind))}")
        while True:
            answer = await self.typed("  Allow? [y] once, [a] always, [n] no: ", "permission")
            if answer is None:
                return None, "cancelled"
            if answer == "":
                return REJECT_ONCE, "rejected (no answer: input closed)"
            choice = answers.get(answer.strip().lower()[:1])
            if choice is not None:
                return choice

    async def typed(self, prompt: str, what: str) -> str | None:
        """One line typed after ``prompt``: None for Ctrl-C, "" when input closed."""
        self.ui.ask(prompt)
        question: Deferred[str | None] = Deferred(lambda d: self._questions.remove(d))
        self._questions.append(question)
        self.readLine().addCallback(lambda line, q=question: q.called or q.callback(line))
        try:
            answer = await question
        except CancelledError:  # the agent withdrew the question (no answer in time)
            self.ui.note(f"[{what}] withdrawn by the agent: no answer in time")
            raise
        if answer:  # a typed line ends with its newline; Ctrl-C or Ctrl-D leave the line open
            self.ui.answered()
        if question in self._questions:
            self._questions.remove(question)
        if answer and not self.ui.err.isatty():  # a log file: keep what was typed
            self.ui.note(answer.strip())
        return answer

    async def elicit(self, params: dict[str, Any]) -> dict[str, Any]:
        """``elicitation/create``: a question from the model (or a tool) for the user,
        answered on the terminal, by ``--answer``, or cancelled."""
        from .jsonrpc import InvalidParams

        if self.capabilities() == {}:
            raise InvalidParams("Invalid params: this client did not advertise elicitation")
        try:
            form = parseForm(params, self.sessionId, self.limits)
        except FormError as e:
            raise InvalidParams(str(e)) from None
        self.ui.question(form)
        if self.cancelling:
            return self.elicited("cancel", "cancelled")
        if self.answerText is not None and not form.fromModel and not self.interactive:
            return self.elicited("decline", "declined: --answer answers the model's own questions, not a tool's")
        if self.answerText is not None and form.fromModel:
            content = form.answerWith(self.answerText)
            if content is None:
                return self.elicited("decline", "declined: --answer fits none of the choices")
            return self.elicited("accept", "answered (--answer)", content)
        if not form.fields:  # nothing to fill in: the question is whether to go on
            line = await self.typed("  Accept? [y] yes, [n] no (empty line declines): ", "question")
            if not line:
                return self.elicited("cancel", "cancelled" if line is None else "cancelled (input closed)")
            accepted = line.strip().lower() in ("y", "yes")
            return self.elicited("accept", "accepted", {}) if accepted else self.elicited("decline", "declined")
        content: dict[str, Any] = {}
        free = form.freeField
        otherAnswered = False  # a choice was picked where the free text was offered as "other"
        for field in form.fields:
            if field.name in content or (field is free and otherAnswered):
                continue
            offered = bool(field.choices) and free is not None and free is not field and free.name not in content
            prompt = self.ui.field(field, offered)
            while True:
                line = await self.typed(prompt, "question")
                if line is None:
                    return self.elicited("cancel", "cancelled")
                if line == "":
                    return self.elicited("cancel", "cancelled (input closed)")
                if not line.strip():
                    if field.required:
                        return self.elicited("decline", "declined")
                    break
                try:
                    content[field.name] = field.parse(line)
                    otherAnswered = otherAnswered or offered
                    break
                except ValueError as e:
                    if offered:
                        try:
                            content[free.name] = free.parse(line)
                            break
                        except ValueError:
                            pass
                    self.ui.note(f"  ({e})", "red")
        if not content:
            return self.elicited("decline", "declined")
        return self.elicited("accept", "answered", content)

    def elicited(self, action: str, why: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
        self.ui.note(f"[question] {why}")
        return {"action": action, "content": content} if content is not None else {"action": action}

    def readLine(self) -> Deferred[str]:
        """The next line typed on the terminal (one reader thread at a time)."""
        if self._line is None:
            self._line = Deferred()

            def read() -> None:
                try:
                    data = os.read(self.stdinFd, 4096)
                except OSError:
                    data = b""
                self.reactor.callFromThread(self._lineRead, data)

            threading.Thread(target=read, name="hermes-prompt-tty", daemon=True).start()
        d: Deferred[str] = Deferred()
        self._line.addCallback(lambda data: (d.callback(data.decode("utf-8", "replace")), data)[1])
        return d

    def _lineRead(self, data: bytes) -> None:
        line, self._line = self._line, None
        if line is not None:
            line.callback(data)


def _version() -> str:
    from . import __version__

    return __version__


def runPrompt(options: Any, sub: PromptOptions) -> int:
    """``hermes-acp [agent options] prompt [options] TEXT``: run it; the exit code."""
    from twisted.internet import reactor, task

    from .config import ConfigError, loadDotenv
    from .logs import parseLevel, startLogging

    try:
        text = promptText(sub, sys.stdin)
    except OSError as e:
        sys.stderr.write(f"hermes-acp prompt: cannot read the prompt from stdin: {e}\n")
        return EXIT_USAGE
    if not text:
        sys.stderr.write("hermes-acp prompt: the prompt is empty\n")
        return EXIT_USAGE
    level = options["log-level"] or "warn"
    agentArgs = ["--log-level", level]
    if options["trace"]:
        agentArgs += ["--trace", os.path.abspath(options["trace"])]
    loadDotenv()  # the agent loads it too; here it names the secrets our own log redacts
    try:
        limits = Limits.fromEnv(os.environ)
    except ConfigError as e:
        sys.stderr.write(f"hermes-acp prompt: {e}\n")
        return EXIT_USAGE
    startLogging(parseLevel(level))
    ui = Terminal(sys.stdout, sys.stderr, raw=sub["json"], colour=colourWanted(sys.stderr, os.environ),
                  clock=None if os.environ.get("TERM") == "dumb" else reactor)  # no spinner on a dumb terminal
    policy = "yes" if sub["yes"] else "deny" if sub["deny"] else None
    client = PromptClient(reactor, text, ui, policy, agentArgs, sub["session"],
                          interactive=os.isatty(0), model=sub["model"], answer=sub["answer"], limits=limits)
    signal.signal(signal.SIGINT, lambda *_: reactor.callFromThread(client.interrupt))
    reactor.addSystemEventTrigger("before", "shutdown", client.shutdown)

    async def main(reactor: Any) -> None:
        raise SystemExit(await client.run())

    try:
        task.react(main)
    except SystemExit as e:
        return int(e.code or 0)
    return EXIT_OK
