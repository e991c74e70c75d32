"""The tools' workspace through the editor, when it offers ``fs/*`` and ``terminal/*``.

Reading through ``fs/read_text_file`` sees unsaved buffers; writing through
``fs/write_text_file`` lets the editor track the edit. A command the agent's
sandbox confines runs here, in the sandbox (its output reaches the editor in the
tool card): the editor's terminal would run it unconfined. One without a sandbox
runs in the editor's terminal, judged by the guard as unconfined, as it would be
here. Whatever the editor does not offer runs locally.
Called in worker threads; every request crosses to the reactor and back.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.error import ConnectionClosed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from .engine.workspace import (
    _CHILD_ENV,
    DEFAULT_OUTPUT_LIMIT,
    CommandResult,
    LocalWorkspace,
    Workspace,
    WorkspaceError,
)
from .jsonrpc import RemoteError
from .threads import callInReactor

if TYPE_CHECKING:
    from .engine.processes import Limits
    from .engine.sandbox import Policy

log = Logger()

#: How long a client file request may take before the tool gives up.
FILE_TIMEOUT = 30.0
#: How often a command in an editor terminal checks its tool's cancel event.
CANCEL_POLL = 0.1
#: Every way a request to the editor can fail (an error answer, a timeout, a cancel, a lost connection).
FAILURES = (RemoteError, CancelledError, TimeoutError, ConnectionClosed)


class EditorRefused(WorkspaceError):
    """The editor answered a request with an error."""


def _detail(data: Any) -> str:
    """What the editor put in an error's ``data`` (``details``, or all of it), shortly."""
    if data is None:
        return ""
    detail = data.get("details", data) if isinstance(data, dict) else data
    text = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False, default=str)
    return f" ({text[:500]})" if text else ""


@attrs.define(eq=False)
class ClientWorkspace:
    """A ``Workspace`` that uses the editor's capabilities where advertised.

    ``call(method, params, timeout, track=True)`` sends a request on the
    reactor thread and returns a Deferred; the turn tracks it (a cancelled turn
    cancels it) unless ``track`` is false, as for ``terminal/create`` and the
    clean-up requests, which must run to their end. One per turn.
    """

    reactor: Any
    sessionId: str
    call: Callable[..., Deferred[Any]]
    readFiles: bool = False
    writeFiles: bool = False
    terminals: bool = False
    local: Workspace = attrs.field(factory=LocalWorkspace)

    def _request(self, method: str, params: dict[str, Any], timeout: float | None = FILE_TIMEOUT) -> Any:
        try:
            return callInReactor(self.reactor, self.call, method, {"sessionId": self.sessionId, **params}, timeout)
        except RemoteError as e:
            if e.code == -32002:
                raise FileNotFoundError(params.get("path", "")) from e
            raise EditorRefused(f"the editor refused {method}: {e.message}{_detail(e.data)}") from e
        except FAILURES as e:
            raise WorkspaceError(f"{method} did not complete ({type(e).__name__})") from e

    def readText(self, path: str) -> str:
        if not self.readFiles:
            return self.local.readText(path)
        try:
            result = self._request("fs/read_text_file", {"path": path})
        except EditorRefused:
            # Editors answer a missing file differently (the TypeScript SDK with
            # -32603 and "ENOENT" in data); the agent shares their disk, so a
            # path that is not there locally is a new file, whatever the error.
            # (A read that timed out or was cancelled is no answer at all.)
            if not os.path.lexists(path):
                raise FileNotFoundError(path) from None
            raise
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            raise WorkspaceError("the editor answered fs/read_text_file without content")
        return content

    def writeText(self, path: str, content: str) -> None:
        if not self.writeFiles:
            return self.local.writeText(path, content)
        self._request("fs/write_text_file", {"path": path, "content": content})

    def runCommand(
        self, command: str, cwd: str, timeout: float, cancelEvent: threading.Event,
        outputLimit: int = DEFAULT_OUTPUT_LIMIT, onStarted: Callable[[str], object] | None = None,
        policy: Policy | None = None, limits: Limits | None = None, env: Mapping[str, str] | None = None,
        onOutput: Callable[[str], object] | None = None,
    ) -> CommandResult:
        if not self.terminals or policy is not None:  # the editor's terminal shows its own output
            return self.local.runCommand(command, cwd, timeout, cancelEvent, outputLimit, None, policy, limits, env,
                                         onOutput)
        if cancelEvent.is_set():
            return CommandResult(output="", exitCode=None, cancelled=True)
        terminalId = callInReactor(
            self.reactor, lambda: Deferred.fromCoroutine(self._create(command, cwd, outputLimit, env)))
        if onStarted is not None:  # ACP wants the terminal shown before terminal/release
            try:
                onStarted(terminalId)
            except Exception:  # noqa: BLE001 - the terminal must still be waited for and released
                log.failure("showing terminal {terminalId} failed", terminalId=terminalId)
        return callInReactor(
            self.reactor, lambda: Deferred.fromCoroutine(self._finish(terminalId, timeout, cancelEvent))
        )

    async def _create(self, command: str, cwd: str, outputLimit: int, extra: Mapping[str, str] | None = None) -> str:
        """``terminal/create``; not cancelled with the turn: a terminal the editor made
        must be released, so the agent waits for its id (a cancel that came meanwhile
        is noticed right after)."""
        env = [{"name": name, "value": value} for name, value in {**_CHILD_ENV, **(extra or {})}.items()]
        try:
            created = await self.call(
                "terminal/create",
                {"sessionId": self.sessionId, "command": "/bin/sh", "args": ["-c", command], "env": env, "cwd": cwd,
                 "outputByteLimit": outputLimit},
                FILE_TIMEOUT,
                False,
            )
        except FAILURES as e:
            raise WorkspaceError(f"the editor could not start the command: {e}") from e
        terminalId = created.get("terminalId") if isinstance(created, dict) else None
        if not isinstance(terminalId, str):
            raise WorkspaceError("the editor answered terminal/create without a terminalId")
        return terminalId

    async def _finish(self, terminalId: str, timeout: float, cancelEvent: threading.Event) -> CommandResult:
        """wait_for_exit (raced with the timeout and the cancel) → [kill] → output → release."""
        ids = {"sessionId": self.sessionId, "terminalId": terminalId}
        exited: Any = None
        timedOut, cancelled = False, cancelEvent.is_set()
        lost: Exception | None = None
        try:
            try:
                if not cancelled:
                    exited = await self._watched(self.call("terminal/wait_for_exit", ids, timeout), cancelEvent)
            except TimeoutError:
                timedOut = True
            except CancelledError:
                cancelled = True
            except FAILURES as e:
                lost = e
            if timedOut or cancelled or lost:  # it may still be running
                await self._quietly("terminal/kill", ids)
            output = await self._quietly("terminal/output", ids)
        finally:
            await self._quietly("terminal/release", ids)
        if lost is not None:
            raise WorkspaceError(f"terminal/wait_for_exit failed: {lost}") from lost
        output = output if isinstance(output, dict) else {}
        status = output.get("exitStatus") if isinstance(output.get("exitStatus"), dict) else {}
        if isinstance(exited, dict):
            status = {**status, **{k: v for k, v in exited.items() if v is not None}}
        exitCode, signal = status.get("exitCode"), status.get("signal")
        return CommandResult(
            output=output["output"] if isinstance(output.get("output"), str) else "",
            exitCode=exitCode if isinstance(exitCode, int) and not isinstance(exitCode, bool) and not (timedOut or cancelled) else None,
            timedOut=timedOut,
            truncated=output.get("truncated") is True,
            cancelled=cancelled,
            meta={"terminalId": terminalId, "signal": signal if isinstance(signal, str) else None},
        )

    def _watched(self, d: Deferred[Any], cancelEvent: threading.Event) -> Deferred[Any]:
        """``d``, cancelled within CANCEL_POLL seconds of ``cancelEvent`` being set."""
        poll = LoopingCall(lambda: cancelEvent.is_set() and d.cancel())
        poll.clock = self.reactor
        poll.start(CANCEL_POLL, now=False)
        return d.addBoth(lambda result: (poll.stop(), result)[1])

    async def _quietly(self, method: str, params: dict[str, Any]) -> Any:
        """Clean-up requests: answered or not, the turn goes on."""
        try:
            return await self.call(method, params, FILE_TIMEOUT, False)
        except Exception as e:
            log.warn("{method} failed: {error}", method=method, error=e)
            return None
