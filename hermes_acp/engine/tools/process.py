"""``process``: Hermes' tool for the session's background processes (those
``terminal(background=true)`` started): list, poll, log, wait, kill, write,
submit and close, with Hermes' arguments and result fields. A process is named
by its ``session_id`` (``proc_…``) or by its number in the session (``/ps``)."""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from hermes_acp.engine.background import EXITED, PREVIEW_CHARS, BackgroundError, BackgroundProcess, plainText
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.tools.terminal import DEFAULT_TIMEOUT

ACTIONS = ["list", "poll", "log", "wait", "kill", "write", "submit", "close"]
#: ``wait`` waits at most this long (Hermes clamps to its terminal timeout).
MAX_WAIT = DEFAULT_TIMEOUT
LOG_LINES = 200
WAIT_CHARS, INTERRUPTED_CHARS = 2000, 1000


def _status(proc: BackgroundProcess) -> dict[str, Any]:
    report: dict[str, Any] = {"session_id": proc.processId, "command": proc.command, "status": proc.status,
                              "pid": proc.pid,
                              "uptime_seconds": round((proc.exitedAt or time.monotonic()) - proc.startedAt)}
    if not proc.running:
        report.update(exit_code=proc.exitCode, completion_reason=proc.completionReason,
                      termination_source=proc.terminationSource)
    return report


def _log(proc: BackgroundProcess, offset: int, limit: int) -> dict[str, Any]:
    """Lines of the output kept (head, the note of the cut, tail): offset 0 gives the last
    ``limit``; another offset gives ``limit`` lines from that one (0-based)."""
    lines = plainText(proc.output.text()).splitlines()
    chosen = lines[-limit:] if offset == 0 else lines[offset:offset + limit]
    first = max(0, len(lines) - limit) if offset == 0 else min(offset, len(lines))
    return {"session_id": proc.processId, "command": proc.command, "status": proc.status,
            "output": "\n".join(chosen), "total_lines": len(lines),
            "showing": f"{len(chosen)} lines" + (f" from line {first}" if chosen else ""),
            **({"truncated": f"{proc.output.dropped} bytes in the middle of the output were not kept"}
               if proc.output.dropped else {})}


_INLINE_SCRIPT = re.compile(r"-[A-Za-z]*c")


def judgedInput(text: str, command: str) -> str:
    """What the guard judges when ``text`` is written to a process running ``command``: the text
    piped into the command, when the input can reach only its first program (one command, or a
    pipeline). In a list, a group, a substitution or a shell's ``-c`` script any of its programs
    may read it (``cd x && sh``), which piping into the whole would not show the guard: then the
    text is judged as piped into a shell, the command named in a comment."""
    from hermes_acp.engine.shell import PIPES, REDIRECTS, TooNested, lex  # the guard's lexer: off the start-up path

    piped = f"printf '%s' {shlex.quote(text)} | "
    try:
        lists = lex(command)
    except TooNested:
        lists = []
    plain = len(lists) == 1 and all(
        t in PIPES or t in REDIRECTS if isinstance(t, str) else not _INLINE_SCRIPT.fullmatch(t.text) for t in lists[0])
    if plain:
        return piped + command
    return f"{piped}sh  # the input of the background command: {' '.join(command.split())[:300]}"


def runProcess(ctx: ToolContext, action: str, session_id: str | int | None = None, data: str | None = None,
               timeout: int | None = None, offset: int = 0, limit: int = LOG_LINES) -> ToolOutcome:
    owner = ctx.background
    if owner is None:
        raise ToolError("background processes are not available here")
    if action == "list":
        return ToolOutcome(jsonText({"processes": [p.describe() for p in owner.processes()]}))
    if session_id is None or not str(session_id).strip():
        raise ToolError(f"action {action!r} needs session_id (a process id from terminal(background=true))")
    try:
        proc = owner.find(session_id)
        report = _act(ctx, owner, proc, action, data, timeout, offset, limit)
    except BackgroundError as e:
        return ToolOutcome(jsonText({"status": "error", "error": str(e)}), failed=True)
    if report.get("status") == EXITED or report.get("status") == "killed":
        owner.seen(proc)
    return ToolOutcome(jsonText(report), {"processId": proc.processId})


def _act(ctx: ToolContext, owner: Any, proc: BackgroundProcess, action: str, data: str | None,
         timeout: int | None, offset: int, limit: int) -> dict[str, Any]:
    if action == "poll":
        return {**_status(proc), "output_preview": proc.lastLines(PREVIEW_CHARS)}
    if action == "log":
        return _log(proc, offset, limit)
    if action == "wait":
        wanted = timeout or MAX_WAIT
        seconds = min(wanted, MAX_WAIT)
        status = owner.wait(proc, seconds, ctx.cancelEvent)
        report = {**_status(proc), "status": status if status != EXITED else proc.status}
        report["output"] = proc.lastLines(WAIT_CHARS if status == EXITED else INTERRUPTED_CHARS)
        if seconds < wanted:
            report["timeout_note"] = f"the wait was limited to {MAX_WAIT} s; wait again to keep waiting"
        return report
    if action == "kill":
        if not owner.kill(proc):
            return {**_status(proc), "status": "already_exited"}
        return {"status": "killed", "session_id": proc.processId, "completion_reason": "killed",
                "termination_source": "process.kill", "exit_code": proc.exitCode,
                "output": proc.lastLines(PREVIEW_CHARS)}
    if action in ("write", "submit"):
        text = (data or "") + ("\n" if action == "submit" else "")
        if action == "write" and not text:
            raise BackgroundError("write needs data")
        # What a process does with its input the guard never saw: it judges the input piped into
        # the command, as confined as the process is (a shell fed commands asks, ``cat`` does not).
        verdict = ctx.approveCommand(judgedInput(text, proc.command), proc.confined, None, proc.cwd)
        if not verdict.allowed:
            raise BackgroundError(verdict.message)
        return {"status": "ok", "bytes_written": owner.write(proc, text)}
    if action == "close":
        closed = owner.closeInput(proc)
        return {"status": "ok", "message": "input closed: the process reads end-of-file" if closed
                else "its input was already closed"}
    raise ToolError(f"unknown action {action!r}")


PROCESS = Tool(
    "process",
    "Manage the background processes of this session (started with terminal(background=true)): "
    "list them; poll one (status and the end of its output); log (its output by lines: offset 0 gives the "
    f"last `limit` lines); wait for it to exit (at most `timeout` s, {MAX_WAIT} s at most); kill it and what "
    "it started; write data to its input, submit (data and a newline) or close its input. A process is "
    "named by its session_id (proc_...) or its number. Output keeps its start and end when it is long.",
    parameters(
        ["action"],
        action={"type": "string", "enum": ACTIONS, "description": "What to do"},
        # Hermes coerces an integer (the number) to the id's string.
        session_id={"anyOf": [{"type": "string"}, {"type": "integer"}],
                    "description": "The process id from terminal(background=true), or its number"},
        data={"type": "string", "description": "Text for write or submit"},
        timeout={"type": "integer", "minimum": 1, "description": f"Seconds to wait (wait; at most {MAX_WAIT})"},
        offset={"type": "integer", "minimum": 0, "default": 0,
                "description": "First line for log (0: the last `limit` lines)"},
        limit={"type": "integer", "minimum": 1, "default": LOG_LINES, "description": "Lines for log"},
    ),
    runProcess,
    # Input to a process may make it change files; what it does on its own after its turn is the
    # user's to see (a rewind asks about it, it does not undo it).
    mayWrite=lambda ctx, arguments: arguments.get("action") in ("write", "submit", "close"),
)
