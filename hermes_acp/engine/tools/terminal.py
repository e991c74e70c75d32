"""``terminal``: run a shell command after the command guard lets it through.

A command runs in the session's sandbox when the machine has one (here, even
when the editor offers terminals: the editor's terminal would not confine it);
the model may ask to run one outside it (``outside_sandbox`` with a
``justification``), which is always a question to the user. A command without
the sandbox, here or in the editor's terminal, asks unless it is known to only
read, and such a git then runs with its configured programs turned off.

With ``background`` (Hermes' argument) the command is judged the same way, then
starts through the session's ``engine.background.SessionProcesses`` and the call
answers at once with its process id; the ``process`` tool manages it from then on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from hermes_acp.engine import readonly
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.sandbox import Policy
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
                outside_sandbox: bool = False, justification: str | None = None,
                background: bool = False) -> ToolOutcome:
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
    if background:
        return startBackground(ctx, command, cwd, policy, env)
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


def startBackground(ctx: ToolContext, command: str, cwd: str, policy: Policy | None,
                    env: Mapping[str, str] | None) -> ToolOutcome:
    """The command, approved, starts in the background and the call answers at once.
    It always runs here (in the sandbox when there is one), never in the editor's
    terminal: the agent must read its output between turns, and end it with the
    session and with the agent."""
    from hermes_acp.engine.background import BackgroundError

    if ctx.background is None:
        raise ToolError("background processes are not available here; run the command in the foreground",
                        {"command": command})
    try:
        proc = ctx.background.start(command, cwd, policy, ctx.limits, env)
    except BackgroundError as e:
        raise ToolError(str(e), {"command": command}) from e
    except OSError as e:
        raise ToolError(f"cannot start the command in {cwd}: {e.strerror or e}", {"command": command}) from e
    report = {"output": "Background process started", "session_id": proc.processId, "pid": proc.pid,
              "exit_code": 0, "error": None,
              "hint": f"It runs on after this turn. Use process(action='poll'|'log'|'wait'|'kill'|'write'|'submit'|"
                      f"'close', session_id='{proc.processId}') to check on it; you will be told when it ends."}
    extras = {"command": command, "cwd": cwd, "background": proc.processId, "number": proc.number, "pid": proc.pid}
    return ToolOutcome(jsonText(report), extras)


def commandMayWrite(ctx: ToolContext, arguments: dict[str, object]) -> bool:
    """A command may change files unless it is read-only as written (``engine.readonly``)."""
    command, workdir = arguments.get("command"), arguments.get("workdir")
    cwd = ctx.resolve(workdir) if isinstance(workdir, str) and workdir else ctx.cwd
    return not isinstance(command, str) or readonly.safeEnvironment(command, cwd) is None


TERMINAL = Tool(
    "terminal",
    "Run a shell command (sh -c) in the session's working directory, or in workdir, with no "
    "input (a background one's input is what the process tool writes). Output is capped (the start and the end are kept). Dangerous commands need the "
    f"user's approval. Default timeout {DEFAULT_TIMEOUT} s, at most {MAX_TIMEOUT} s. For a "
    "long-running server or watcher, set background=true (no timeout; the process tool checks on it). "
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
        background={"type": "boolean", "default": False,
                    "description": "Start it in the background and answer at once with its process id (for "
                                   "servers and watchers); it runs on after the turn. Check on it with the "
                                   "process tool"},
    ),
    runTerminal,
    mayWrite=commandMayWrite,
)
