"""Session lifecycle methods: new, load, resume, fork, list, close, delete,
and the mode / config-option / model setters.

Updates about a session (commands, modes) go out only after the response
that made the session known to the editor has been written.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from twisted.logger import Logger

from .backgroundcards import BackgroundCards, ReplayedCards
from .catalog import ModelCatalog
from .commands import availableCommands
from .config import Endpoint
from .interfaces import ISessionOptions, ISessionStore, IUpdateChannel
from .jsonrpc import InvalidParams, Reply
from .mcp.registry import MCPServers
from .mcp.specs import ServerSpec, fromRequest
from .options import checkMode, modeState
from .params import field
from .session_state import SessionState
from .skillcommands import SkillCommands
from .updates import REPLAY_MARKS, usageUpdate

log = Logger()


def checkedPath(value: Any, name: str) -> str:
    """An absolute path without NUL, normalised; else -32602 naming the field."""
    if not isinstance(value, str) or not os.path.isabs(value):
        raise InvalidParams(f"Invalid params: {name} must be an absolute path, got {value!r:.200}", {"field": name})
    if "\0" in value:
        raise InvalidParams(f"Invalid params: {name} must not contain a NUL character", {"field": name})
    return os.path.normpath(value)


def absolutePath(params: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = field(params, name, str) if required else field(params, name, str, default=None)
    return None if value is None else checkedPath(value, name)


def directories(params: dict[str, Any]) -> list[str]:
    values = field(params, "additionalDirectories", list, default=[])
    return [checkedPath(value, f"additionalDirectories[{index}]") for index, value in enumerate(values)]


def existingFolder(path: str, name: str = "cwd") -> str:
    if not os.path.isdir(path):
        raise InvalidParams(f"Invalid params: {name} {path!r} is not an existing folder", {"field": name})
    return path


@attrs.define(eq=False)
class Lifecycle:
    """The session methods of one connection."""

    store: ISessionStore
    options: ISessionOptions
    updates: IUpdateChannel
    catalog: ModelCatalog
    #: Cancel a session's turns and wait for their answers (close, delete).
    cancelTurns: Callable[[SessionState], Awaitable[None]]
    #: The endpoint for new sessions, or -32000 saying what to do.
    requireEndpoint: Callable[[], Endpoint]
    #: The sessions' MCP servers.
    mcp: MCPServers
    #: The cards of background processes (a load finds those that ended with a previous agent).
    background: BackgroundCards | None = None
    #: The sessions' skills, announced as commands (None: only the agent's own).
    skills: SkillCommands | None = None
    #: What else a deleted session leaves behind (its checkpoints), removed by session id.
    forgetFiles: Callable[[str], Awaitable[None]] | None = None
    #: Wait until the session's turns that have answered (every session's, for None) are saved
    #: (a cancelled one answers first).
    turnsSaved: Callable[[SessionState | None], Awaitable[None]] | None = None

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]:
        return {
            "session/new": self.new,
            "session/load": self.load,
            "session/resume": self.resume,
            "session/fork": self.fork,
            "session/list": self.list,
            "session/close": self.close,
            "session/delete": self.delete,
            "session/set_mode": self.setMode,
            "session/set_config_option": self.setConfigOption,
            "session/set_model": self.setModel,
        }

    def servers(self, params: dict[str, Any]) -> list[ServerSpec] | None:
        """The request's MCP servers (checked: -32602 naming a bad entry); None when
        it lists none at all (a resume may leave them out: the session keeps its own)."""
        if params.get("mcpServers") is None:
            return None
        return fromRequest(params["mcpServers"])

    async def setupResult(self, state: SessionState, servers: list[ServerSpec] | None, sessionId: bool = False) -> Reply:
        """The answer that makes a session known to the editor; updates about it may
        follow only once it is written, and its MCP servers start then. Its skills are
        read first, so the commands it is told of include them."""
        if self.skills is not None:
            await self.skills.refresh(state, announce=False)
        result: dict[str, Any] = {"modes": modeState(state), "configOptions": self.options.configOptions(state)}
        if sessionId:
            result = {"sessionId": state.sessionId, **result}
        return Reply(result, lambda: self.announced(state, servers))

    def announced(self, state: SessionState, servers: list[ServerSpec] | None) -> None:
        state.announced = True
        commands = availableCommands() if self.skills is None else self.skills.listed(state)
        update = {"sessionUpdate": "available_commands_update",
                  "availableCommands": commands + self.mcp.promptCommands(state)}
        self.updates.send(state, update, journal=False)
        self.updates.send(state, usageUpdate(state, self.catalog), journal=False)
        self.mcp.attach(state, servers)

    async def new(self, params: dict[str, Any]) -> Reply:
        cwd = existingFolder(absolutePath(params, "cwd"))
        extra = directories(params)
        servers = self.servers(params)
        endpoint = self.requireEndpoint()
        state = await self.store.create(cwd, extra, model=endpoint.model)
        log.debug("session {id} created in {cwd} (model {model})", id=state.sessionId, cwd=cwd, model=state.model)
        self.catalog.refresh()
        return await self.setupResult(state, servers, sessionId=True)

    async def restored(self, params: dict[str, Any]) -> SessionState:
        """The session of a load or resume, moved to the folders the request names."""
        sessionId = field(params, "sessionId", str)
        cwd = absolutePath(params, "cwd")
        extra = directories(params) if "additionalDirectories" in params else None
        state = await self.store.get(sessionId)
        if cwd != state.cwd or (extra is not None and tuple(extra) != state.additionalDirectories):
            state.cwd = existingFolder(cwd)
            if extra is not None:
                state.additionalDirectories = tuple(extra)
            self.options.foldersChanged(state)
            await self.store.save(state, touch=False)
        return state

    async def load(self, params: dict[str, Any]) -> Reply:
        servers = self.servers(params)
        state = await self.restored(params)
        tail, kept = await self.store.replay(state)
        if tail.omittedCount:
            self.updates.notice(
                state,
                "info",
                "Earlier history not shown",
                f"This session is long: the first {tail.omittedCount} updates "
                f"({tail.omittedBytes} bytes) are not replayed.",
                journal=False,
            )
        # The journal a batch of rows at a time, each row's stored text written as it is where it
        # can be: the next batch is read while the editor takes this one, so neither the rows
        # nor their frames pile up here. The background cards look only at updates with a
        # ``_meta``, which are decoded anyway; each batch's are noted and let go (``ReplayedCards``
        # keeps one entry per open card, not a subagent's every update).
        cards = ReplayedCards()
        count, after = 0, tail.first - 1
        rows = await self.store.replayRows(state, after, tail.last, REPLAY_MARKS)
        while rows:
            following = self.store.replayRows(state, rows[-1][0], tail.last, REPLAY_MARKS)
            cards.see(self.updates.replayRows(state, rows))
            count += len(rows)
            del rows
            await self.updates.whenWritable()
            rows = await following
        for update in kept:
            self.updates.replay(state, update)
        cards.see(kept)
        if self.background is not None:
            self.background.loaded(state, cards)
        log.debug("session {id} loaded: {n} updates replayed, {m} left out", id=state.sessionId,
                  n=count + len(kept), m=tail.omittedCount)
        return await self.setupResult(state, servers)

    async def resume(self, params: dict[str, Any]) -> Reply:
        servers = self.servers(params)
        state = await self.restored(params)
        log.debug("session {id} resumed", id=state.sessionId)
        return await self.setupResult(state, servers)

    async def fork(self, params: dict[str, Any]) -> Reply:
        sessionId = field(params, "sessionId", str)
        cwd = existingFolder(absolutePath(params, "cwd"))
        extra = directories(params)
        servers = self.servers(params)
        if self.turnsSaved is not None:
            await self.turnsSaved(await self.store.get(sessionId))
        state = await self.store.fork(sessionId, cwd, extra)
        log.debug("session {id} forked from {source} into {cwd}", id=state.sessionId, source=sessionId, cwd=cwd)
        return await self.setupResult(state, servers, sessionId=True)

    async def list(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = absolutePath(params, "cwd", required=False)
        cursor = field(params, "cursor", str, default=None)
        if self.turnsSaved is not None:
            await self.turnsSaved(None)
        try:
            records, nextCursor = await self.store.list(cwd, cursor)
        except ValueError:
            raise InvalidParams("Invalid params: cursor is not one this agent gave out", {"field": "cursor"})
        sessions = []
        for record in records:
            info: dict[str, Any] = {"sessionId": record.sessionId, "cwd": record.cwd, "updatedAt": record.updatedAt}
            if record.title:
                info["title"] = record.title
            if record.additionalDirectories:
                info["additionalDirectories"] = list(record.additionalDirectories)
            sessions.append(info)
        result: dict[str, Any] = {"sessions": sessions}
        if nextCursor:
            result["nextCursor"] = nextCursor
        return result

    async def close(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self.store.get(field(params, "sessionId", str))
        await self.cancelTurns(state)
        self.store.forget(state)
        log.debug("session {id} closed", id=state.sessionId)
        return {}

    async def delete(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self.store.get(field(params, "sessionId", str))
        await self.cancelTurns(state)
        await self.store.remove(state.sessionId)
        if self.forgetFiles is not None:
            try:
                await self.forgetFiles(state.sessionId)
            except Exception:
                log.failure("removing the checkpoints of session {id} failed", id=state.sessionId)
        log.debug("session {id} deleted", id=state.sessionId)
        return {}

    async def setMode(self, params: dict[str, Any]) -> Reply:
        state = await self.store.get(field(params, "sessionId", str))
        mode = checkMode(field(params, "modeId", str))
        return Reply({}, lambda: self.options.setMode(state, mode))

    async def setConfigOption(self, params: dict[str, Any]) -> dict[str, Any] | Reply:
        state = await self.store.get(field(params, "sessionId", str))
        configId = field(params, "configId", str)
        if params.get("type") not in (None, "select"):
            raise InvalidParams("Invalid params: only select options exist here", {"field": "type"})
        modeChanged = configId == "mode" and params.get("value") != state.mode
        self.options.setOption(state, configId, params.get("value"))
        result = {"configOptions": self.options.configOptions(state)}
        # The answer carries the options; the mode selector hears of a new mode after it.
        return Reply(result, lambda: self.options.announceMode(state)) if modeChanged else result

    async def setModel(self, params: dict[str, Any]) -> Reply:
        """The legacy unstable ``session/set_model``."""
        state = await self.store.get(field(params, "sessionId", str))
        model = field(params, "modelId", str)
        self.options.setModel(state, model, announce=False)
        return Reply({}, lambda: self.options.announceOptions(state))
