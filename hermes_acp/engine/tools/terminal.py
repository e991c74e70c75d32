"""``terminal``: run a shell command after the command guard lets it through.

A command runs in the session's sandbox when the machine has one (here, even
when the editor offers terminals: the editor's terminal would not confine it);
the model may ask to run one outside it (``outside_sandbox`` with a
``justification``), which is always a question to the user. A command without
the sandbox, here or in the editor's terminal, asks unless it is known to only
read, and such a git then runs with its configured programs turned off.
"""

from __future__ import annotations

import os
import re

from hermes_acp.engine import readonly
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.workspace import WorkspaceError

DEFAULT_TIMEOUT = 180
MAX_TIMEOUT = 600
# What a program prints when the sandbox refused it something (EACCES, EPERM, EROFS, EXDEV).
_DENIED = re.compile(r"permission denied|operation not permitted|read-only file system|invalid cross-device link",
                     re.IGNORECASE)


def sandboxNote(ctx: ToolContext) -> str:
    assert ctx.sandbox is not None
    return ("The command failed and its output suggests the sandbox denied it something: it may write only "
            f"in {', '.join(p for p in ctx.sandbox.writable if os.path.isdir(p))}, cannot read the user's secret files"
            f"{'' if ctx.sandbox.network else ', has no network'} and cannot signal other processes. If the "
            "command really needs more, run it again with outside_sandbox=true and a justification; the user "
            "will be asked.")


def runTerminal(ctx: ToolContext, command: str, timeout: int, workdir: str | None = None,
                outside_sandbox: bool = False, justification: str | None = None) -> ToolOutcome:
    if not command.strip():
        raise ToolError("command is empty")
    cwd = ctx.resolve(workdir) if workdir else ctx.cwd
    if not os.path.isdir(cwd):
        raise ToolError(f"workdir {cwd} is not a directory")
    leaving = ctx.sandbox is not None and outside_sandbox
    policy = None if leaving else ctx.sandbox
    # Wherever it runs (here or in the editor's terminal), only the sandbox confines a command.
    verdict = ctx.approveCommand(command, policy is not None,
                                 (justification or "no reason given").strip() if leaving else None, cwd)
    if not verdict.allowed:
        raise ToolError(verdict.message, {"command": command, "denied": True})
    if ctx.cancelEvent.is_set():  # cancelled while it was being approved: it must not run at all
        raise ToolError("the command was not run: the user cancelled the turn", {"command": command})
    timeout = min(timeout, MAX_TIMEOUT)
    env = readonly.safeEnvironment(command, cwd) if policy is None else None
    try:
        result = ctx.workspace.runCommand(command, cwd, float(timeout), ctx.cancelEvent,
                                          onStarted=ctx.terminalStarted, policy=policy, limits=ctx.limits, env=env,
                                          onOutput=ctx.commandOutput)
    except (WorkspaceError, OSError) as e:
        raise ToolError(f"cannot run the command: {e}") from e
    extras = {"command": command, "cwd": cwd, "exitCode": result.exitCode,
              "output": result.output, "truncated": result.truncated, **result.meta}
    report = {"output": result.output, "exit_code": result.exitCode}
    if policy is not None and result.exitCode not in (0, None) and _DENIED.search(result.output):
        report["sandbox"] = extras["sandboxNote"] = sandboxNote(ctx)
    if result.cancelled:
        raise ToolError(f"the command was interrupted by the user; output so far:\n{result.output}", extras)
    if result.timedOut:
        report["error"] = f"timed out after {timeout} s; the command and its children were killed"
    return ToolOutcome(jsonText(report), extras, failed=result.timedOut)


def commandMayWrite(ctx: ToolContext, arguments: dict[str, object]) -> bool:
    """A command may change files unless it is read-only as written (``engine.readonly``)."""
    command, workdir = arguments.get("command"), arguments.get("workdir")
    cwd = ctx.resolve(workdir) if isinstance(workdir, str) and workdir else ctx.cwd
    return not isinstance(command, str) or readonly.safeEnvironment(command, cwd) is None


TERMINAL = Tool(
    "terminal",
    "Run a shell command (sh -c) in the session's working directory, or in workdir, with no "
    "input. Output is capped (the start and the end are kept). Dangerous commands need the "
    f"user's approval. Default timeout {DEFAULT_TIMEOUT} s, at most {MAX_TIMEOUT} s. For a "
    "long-running server, background it with its output sent to a file (cmd > log 2>&1 &). "
    "Commands run in a sandbox where there is one: they may write only in the session's folders, the "
    "temp folder and build caches, and cannot read the user's secrets; if a command needs more, set "
    "outside_sandbox with a justification and the user will be asked.",
    parameters(
        ["command"],
        command={"type": "string", "description": "The shell command"},
        timeout={"type": "integer", "minimum": 1, "default": DEFAULT_TIMEOUT, "description": "Seconds"},
        workdir={"type": "string", "description": "Folder to run in (default: the working directory)"},
        outside_sandbox={"type": "boolean", "default": False,
                         "description": "Run without the sandbox (the user is asked first)"},
        justification={"type": "string", "description": "Why the command must run outside the sandbox"},
    ),
    runTerminal,
    mayWrite=commandMayWrite,
)
