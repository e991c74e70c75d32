"""The tools' workspace through the editor, when it offers ``fs/*`` and ``terminal/*``.

Reading through ``fs/read_text_file`` sees unsaved buffers; writing through
``fs/write_text_file`` lets the editor track the edit; commands run in the
editor's terminals. Whatever the editor does not offer runs locally.
Called in worker threads; every request crosses to the reactor and back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.logger import Logger

from .engine.workspace import DEFAULT_OUTPUT_LIMIT, CommandResult, LocalWorkspace, Workspace, WorkspaceError
from .jsonrpc import RemoteError
from .threads import callInReactor

log = Logger()

#: How long a client file request may take before the tool gives up.
FILE_TIMEOUT = 30.0


@attrs.define(eq=False)
class ClientWorkspace:
    """A ``Workspace`` that uses the editor's capabilities where advertised.

    ``call(method, params, timeout)`` sends a request on the reactor thread and
    returns a Deferred the turn tracks (a cancelled turn cancels it).
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
            raise WorkspaceError(f"the editor refused {method}: {e.message}") from e
        except (CancelledError, TimeoutError) as e:
            raise WorkspaceError(f"{method} did not complete ({type(e).__name__})") from e

    def readText(self, path: str) -> str:
        if not self.readFiles:
            return self.local.readText(path)
        result = self._request("fs/read_text_file", {"path": path})
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            raise WorkspaceError("the editor answered fs/read_text_file without content")
        return content

    def writeText(self, path: str, content: str) -> None:
        if not self.writeFiles:
            return self.local.writeText(path, content)
        self._request("fs/write_text_file", {"path": path, "content": content})

    def runCommand(
        self, command: str, cwd: str, timeout: float, cancelEvent: threading.Event, outputLimit: int = DEFAULT_OUTPUT_LIMIT
    ) -> CommandResult:
        if not self.terminals:
            return self.local.runCommand(command, cwd, timeout, cancelEvent, outputLimit)
        return callInReactor(
            self.reactor, lambda: Deferred.fromCoroutine(self._terminal(command, cwd, timeout, outputLimit))
        )

    async def _terminal(self, command: str, cwd: str, timeout: float, outputLimit: int) -> CommandResult:
        """create → wait_for_exit (raced with the timeout) → [kill] → output → release."""
        base = {"sessionId": self.sessionId}
        try:
            created = await self.call(
                "terminal/create",
                {**base, "command": "/bin/sh", "args": ["-c", command], "cwd": cwd, "outputByteLimit": outputLimit},
                FILE_TIMEOUT,
            )
        except (RemoteError, CancelledError, TimeoutError) as e:
            raise WorkspaceError(f"the editor could not start the command: {e}") from e
        terminalId = created.get("terminalId") if isinstance(created, dict) else None
        if not isinstance(terminalId, str):
            raise WorkspaceError("the editor answered terminal/create without a terminalId")
        ids = {**base, "terminalId": terminalId}
        timedOut = cancelled = False
        try:
            try:
                await self.call("terminal/wait_for_exit", ids, timeout)
            except TimeoutError:
                timedOut = True
            except CancelledError:
                cancelled = True
            if timedOut or cancelled:
                await self._quietly("terminal/kill", ids)
            output = await self._quietly("terminal/output", ids) or {}
        finally:
            await self._quietly("terminal/release", ids)
        status = output.get("exitStatus") or {}
        return CommandResult(
            output=str(output.get("output", "")),
            exitCode=None if (timedOut or cancelled) else status.get("exitCode"),
            timedOut=timedOut,
            truncated=bool(output.get("truncated")),
            cancelled=cancelled,
            meta={"terminalId": terminalId, "signal": status.get("signal")},
        )

    async def _quietly(self, method: str, params: dict[str, Any]) -> Any:
        """Clean-up requests: answered or not, the turn goes on."""
        try:
            return await self.call(method, params, FILE_TIMEOUT, False)
        except Exception as e:
            log.warn("{method} failed: {error}", method=method, error=e)
            return None
