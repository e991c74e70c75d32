"""Drive the real agent process with the official ACP Python SDK client.

The test suite runs on Twisted's asyncio reactor (``--reactor asyncio``), so a
scripted model server on the reactor and this asyncio client share one loop.
Every line either side writes is recorded, so tests can validate each frame
the agent wrote against the official schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import acp
from acp.schema import ClientCapabilities, Implementation
from twisted.internet.defer import Deferred

from . import acpschema
from .agentproc import agentEnv, processGone

T = TypeVar("T")
LIMIT = 128 * 1024 * 1024
#: What only a prompt turn sends (``usage_update`` also follows new, load, resume and fork).
TURN_CONTENT = {"agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan"}


def onLoop(coroutine: Awaitable[T]) -> Deferred[T]:
    """Await an asyncio coroutine from a pytest-twisted test."""
    return Deferred.fromFuture(asyncio.ensure_future(coroutine))


async def until(condition: Callable[[], bool], timeout: float = 30, what: str = "the condition") -> None:
    """Poll ``condition`` for at most ``timeout`` seconds: only for what no event
    tells (another process's state); anything an event tells is awaited instead."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        await asyncio.sleep(0.02)


async def leavingNoProcess(scenario: Awaitable[None], pids: Callable[[], list[int]]) -> None:
    """Run ``scenario``, then wait (at most 30 s) for every process ``pids()`` names to end;
    whatever way it went, kill those still running, so a failed test leaves none behind."""
    try:
        await onLoop(scenario)
        await onLoop(until(lambda: all(processGone(pid) for pid in pids()), 30, "every process to end"))
    finally:
        for pid in pids():
            if not processGone(pid):
                os.kill(pid, signal.SIGKILL)


async def settled(d: Deferred[T], timeout: float = 30) -> T:
    """Await a Twisted Deferred (a scripted server's event, say) from asyncio code,
    for at most ``timeout`` seconds."""
    return await asyncio.wait_for(d.asFuture(asyncio.get_running_loop()), timeout)


class Wire:
    """Both directions of the stdio stream, line by line, in order."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []  # client → agent
        self.received: list[dict[str, Any]] = []  # agent → client
        self.order: list[tuple[str, dict[str, Any]]] = []
        self.nonJSON: list[bytes] = []

    def clientRequestMethods(self) -> dict[str, str]:
        return {json.dumps(m["id"]): m["method"] for m in self.sent if "id" in m and "method" in m}

    def problems(self) -> list[str]:
        """Schema, key-name and lifecycle problems in everything the agent wrote."""
        methods = self.clientRequestMethods()
        found = [f"non-JSON stdout line {line[:120]!r}" for line in self.nonJSON]
        for frame in self.received:
            found += [f"{p} in {json.dumps(frame)[:300]}" for p in acpschema.checkAgentFrame(frame, methods)]
        return found + self.lifecycleProblems() + self.capabilityProblems() + self.pathProblems()

    def capabilityProblems(self) -> list[str]:
        """The agent calls fs/* and terminal/* only when the client offered them."""
        offered: dict[str, Any] = {}
        for message in self.sent:
            if message.get("method") == "initialize":
                offered = (message.get("params") or {}).get("clientCapabilities") or {}
        fs = offered.get("fs") or {}
        allowed = {
            "fs/read_text_file": fs.get("readTextFile") is True,
            "fs/write_text_file": fs.get("writeTextFile") is True,
        }
        found = []
        for message in self.received:
            method = message.get("method", "")
            if method.startswith("terminal/") and offered.get("terminal") is not True:
                found.append(f"{method} without the terminal capability")
            elif method in allowed and not allowed[method]:
                found.append(f"{method} without the fs capability")
            elif method == "elicitation/create":
                mode = (message.get("params") or {}).get("mode")
                if not isinstance((offered.get("elicitation") or {}).get(mode), dict):
                    found.append(f"elicitation/create in mode {mode!r}, which the client did not advertise")
        return found

    def pathProblems(self) -> list[str]:
        """Every path the agent sends (locations, diffs, fs requests) is absolute."""
        found = []

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                for key, item in value.items():
                    if key == "path" and isinstance(item, str) and not os.path.isabs(item):
                        found.append(f"relative path {item!r}")
                    if key not in ("rawInput", "rawOutput", "_meta"):
                        walk(item)
            elif isinstance(value, list):
                for item in value:
                    walk(item)

        walk(self.received)
        return found

    def lifecycleProblems(self) -> list[str]:
        """No update for a session the editor does not know yet (before its
        new/fork response, or outside a load/resume of it), and no turn content
        for a session between a prompt's response and the next prompt."""
        known: set[str] = set()
        restoring: dict[Any, str] = {}  # load/resume request id -> session id
        prompting: dict[str, int] = {}  # session id -> prompts in flight
        promptIds: dict[Any, str] = {}
        parentOf: dict[str, str] = {}  # announced child session -> its parent
        found = []
        for direction, message in self.order:
            if direction == "sent" and "method" in message and "id" in message:
                sessionId = (message.get("params") or {}).get("sessionId")
                if message["method"] in ("session/load", "session/resume"):
                    restoring[message["id"]] = sessionId
                elif message["method"] == "session/prompt":
                    promptIds[message["id"]] = sessionId
                    prompting[sessionId] = prompting.get(sessionId, 0) + 1
            elif direction == "received" and "method" not in message:
                result = message.get("result") or {}
                if isinstance(result, dict) and "sessionId" in result:
                    known.add(result["sessionId"])
                if message.get("id") in restoring:
                    known.add(restoring.pop(message["id"]))
                if message.get("id") in promptIds:
                    sessionId = promptIds.pop(message["id"])
                    prompting[sessionId] -= 1
            elif direction == "received" and message.get("method") == "session/update":
                sessionId = message["params"]["sessionId"]
                kind = message["params"]["update"]["sessionUpdate"]
                if kind == "subagent_update" and sessionId in known | set(restoring.values()):
                    parentOf[message["params"]["update"]["sessionId"]] = sessionId  # announces a child
                sessionId = parentOf.get(sessionId, sessionId)  # a child's traffic counts as its parent's
                if sessionId not in known and sessionId not in restoring.values():
                    found.append(f"{kind} for {sessionId} before the editor knew the session")
                elif (kind in TURN_CONTENT and not prompting.get(sessionId) and sessionId not in restoring.values()
                      and not _background(message["params"]["update"])):
                    found.append(f"{kind} for {sessionId} outside any prompt turn")
        return found


def _background(update: dict[str, Any]) -> bool:
    """A background process's card, which changes between turns too (tagged in ``_meta``)."""
    meta = update.get("_meta")
    return (update.get("sessionUpdate") == "tool_call_update" and isinstance(meta, dict)
            and isinstance(meta.get("hermesAcp"), dict) and "background" in meta["hermesAcp"])


def _tapWriter(writer: asyncio.StreamWriter, wire: Wire) -> asyncio.StreamWriter:
    """Record what the client writes (the SDK insists on a real StreamWriter)."""
    write = writer.write
    partial = b""

    def tappedWrite(data: bytes) -> None:
        nonlocal partial
        *lines, partial = (partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                message = json.loads(line)
                wire.sent.append(message)
                wire.order.append(("sent", message))
        write(data)

    writer.write = tappedWrite  # type: ignore[method-assign]
    return writer


def _tapReader(reader: asyncio.StreamReader, wire: Wire) -> tuple[asyncio.StreamReader, asyncio.Task[None]]:
    tapped = asyncio.StreamReader(limit=LIMIT)

    async def pump() -> None:
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                wire.nonJSON.append(line)
            else:
                wire.received.append(message)
                wire.order.append(("received", message))
            tapped.feed_data(line)
        tapped.feed_eof()

    return tapped, asyncio.ensure_future(pump())


class RecordingClient:
    """An editor stand-in: records updates; answers permission requests by policy."""

    def __init__(self, permission: Callable[[dict[str, Any]], Awaitable[Any] | Any] | None = None,
                 elicitation: Callable[[dict[str, Any]], Awaitable[Any] | Any] | None = None) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permissionRequests: list[Any] = []
        #: Each ``elicitation/create`` as (message, mode as wire JSON); ``elicitation`` answers them.
        self.elicitations: list[tuple[str, dict[str, Any]]] = []
        self._permission = permission
        self._elicitation = elicitation
        self._arrived: asyncio.Event | None = None

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.updates.append((session_id, update))
        if self._arrived is not None:
            self._arrived.set()

    async def waitForUpdate(self, matches: Callable[[str, dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        """The first update so far or to come for which ``matches(sessionId, update)``
        holds (the update as wire JSON); fails after ``timeout`` seconds."""
        self._arrived = self._arrived or asyncio.Event()
        deadline = asyncio.get_running_loop().time() + timeout
        seen = 0
        while True:
            for sessionId, update in self.updates[seen:]:
                payload = update.model_dump(by_alias=True, exclude_none=True)
                if matches(sessionId, payload):
                    return payload
            seen = len(self.updates)
            self._arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"no matching update within {timeout} s")
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        self.permissionRequests.append((session_id, tool_call, options))
        if self._permission is None:
            raise acp.RequestError.method_not_found("session/request_permission")
        answer = self._permission({"sessionId": session_id, "toolCall": tool_call, "options": options})
        return await answer if asyncio.iscoroutine(answer) else answer

    async def create_elicitation(self, message: str, mode: Any, **kw: Any) -> Any:
        request = (message, mode.model_dump(by_alias=True, exclude_none=True))
        self.elicitations.append(request)
        if self._elicitation is None:
            raise acp.RequestError.method_not_found("elicitation/create")
        answer = self._elicitation({"message": message, "mode": request[1]})
        return await answer if asyncio.iscoroutine(answer) else answer  # wire JSON (even a malformed one)


@asynccontextmanager
async def connect(
    client: RecordingClient | None = None,
    env: Mapping[str, str] | None = None,
    argv: list[str] | None = None,
    cwd: str | None = None,
    stderr: Any = None,
) -> AsyncIterator[tuple[acp.ClientSideConnection, RecordingClient, Wire, asyncio.subprocess.Process]]:
    """Spawn the agent (``python -m hermes_acp`` by default) and connect the SDK client;
    its stderr goes to ``stderr`` (a file), else to the test's."""
    client = client or RecordingClient()
    wire = Wire()
    command = argv or [sys.executable, "-m", "hermes_acp"]
    async with acp.transports.spawn_stdio_transport(
        command[0], *command[1:], env=dict(env) if env is not None else agentEnv(), cwd=cwd,
        stderr=stderr, limit=LIMIT,
    ) as (reader, writer, process):
        tapped, pump = _tapReader(reader, wire)
        connection = acp.connect_to_agent(client, _tapWriter(writer, wire), tapped, use_unstable_protocol=True)
        try:
            yield connection, client, wire, process
        finally:
            await connection.close()
            pump.cancel()


async def initialized(connection: acp.ClientSideConnection, **capabilities: Any) -> Any:
    return await connection.initialize(
        protocol_version=acp.PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(**capabilities),
        client_info=Implementation(name="hermes-acp-tests", version="0"),
    )


async def raw(connection: acp.ClientSideConnection, method: str, params: dict[str, Any]) -> Any:
    """A request the SDK has no method for (session/delete, logout, legacy calls)."""
    return await connection._conn.send_request(method, params)  # noqa: SLF001


async def rawNotify(connection: acp.ClientSideConnection, method: str, params: dict[str, Any]) -> None:
    await connection._conn.send_notification(method, params)  # noqa: SLF001
