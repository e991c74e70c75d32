"""``terminal``: run a shell command after the command guard lets it through."""

from __future__ import annotations

import os

from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.workspace import WorkspaceError

DEFAULT_TIMEOUT = 180
MAX_TIMEOUT = 600


def runTerminal(ctx: ToolContext, command: str, timeout: int, workdir: str | None = None) -> ToolOutcome:
    if not command.strip():
        raise ToolError("command is empty")
    cwd = ctx.resolve(workdir) if workdir else ctx.cwd
    if not os.path.isdir(cwd):
        raise ToolError(f"workdir {cwd} is not a directory")
    verdict = ctx.approveCommand(command)
    if not verdict.allowed:
        raise ToolError(verdict.message, {"command": command, "denied": True})
    timeout = min(timeout, MAX_TIMEOUT)
    try:
        result = ctx.workspace.runCommand(command, cwd, float(timeout), ctx.cancelEvent, onStarted=ctx.terminalStarted)
    except (WorkspaceError, OSError) as e:
        raise ToolError(f"cannot run the command: {e}") from e
    extras = {"command": command, "cwd": cwd, "exitCode": result.exitCode,
              "output": result.output, "truncated": result.truncated, **result.meta}
    report = {"output": result.output, "exit_code": result.exitCode}
    if result.cancelled:
        raise ToolError(f"the command was interrupted by the user; output so far:\n{result.output}", extras)
    if result.timedOut:
        report["error"] = f"timed out after {timeout} s; the command and its children were killed"
    return ToolOutcome(jsonText(report), extras, failed=result.timedOut)


TERMINAL = Tool(
    "terminal",
    "Run a shell command (sh -c) in the session's working directory, or in workdir, with no "
    "input. Output is capped (the start and the end are kept). Dangerous commands need the "
    f"user's approval. Default timeout {DEFAULT_TIMEOUT} s, at most {MAX_TIMEOUT} s. For a "
    "long-running server, background it with its output sent to a file (cmd > log 2>&1 &).",
    parameters(
        ["command"],
        command={"type": "string", "description": "The shell command"},
        timeout={"type": "integer", "minimum": 1, "default": DEFAULT_TIMEOUT, "description": "Seconds"},
        workdir={"type": "string", "description": "Folder to run in (default: the working directory)"},
    ),
    runTerminal,
)
