"""Session lifecycle methods: new, load, resume, fork, list, close, delete,
and the mode / config-option / model setters.

Updates about a session (commands, modes) go out only after the response
that made the session known to the editor has been written.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from .jsonrpc import InvalidParams, Reply
from .options import checkMode, checkOption, configOptions, modeState
from .params import field
from .sessions import SessionState

if TYPE_CHECKING:
    from .acp import ACPAgent

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


def mcpServers(params: dict[str, Any]) -> list[Any]:
    """Accepted and ignored: connecting MCP servers is not supported yet (and not advertised)."""
    servers = field(params, "mcpServers", list, default=[])
    if servers:
        log.info("ignoring {n} MCP server(s): not supported yet", n=len(servers))
    return servers


class Lifecycle:
    """The session methods, bound to one ACP agent (``hub``)."""

    def __init__(self, hub: ACPAgent) -> None:
        self.hub = hub
        self.sessions = hub.sessions

    def handlers(self) -> dict[str, Any]:
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

    def setupResult(self, state: SessionState, sessionId: bool = False) -> Reply:
        result: dict[str, Any] = {"modes": modeState(state), "configOptions": self.configOptions(state)}
        if sessionId:
            result = {"sessionId": state.sessionId, **result}
        return Reply(result, lambda: self.hub.sessionAnnounced(state))

    def configOptions(self, state: SessionState) -> list[dict[str, Any]]:
        return configOptions(state, self.hub.catalog.models())

    async def new(self, params: dict[str, Any]) -> Reply:
        cwd = existingFolder(absolutePath(params, "cwd"))
        extra = directories(params)
        mcpServers(params)
        endpoint = self.hub.requireAuthenticated()
        state = await self.sessions.create(cwd, extra, model=endpoint.model)
        log.debug("session {id} created in {cwd} (model {model})", id=state.sessionId, cwd=cwd, model=state.model)
        self.hub.catalog.refresh()
        self.hub.warmUp()
        return self.setupResult(state, sessionId=True)

    async def restored(self, params: dict[str, Any]) -> SessionState:
        sessionId = field(params, "sessionId", str)
        cwd = absolutePath(params, "cwd")
        extra = directories(params) if "additionalDirectories" in params else None
        mcpServers(params)
        state = await self.sessions.get(sessionId)
        if cwd != state.cwd or (extra is not None and tuple(extra) != state.additionalDirectories):
            state.cwd = existingFolder(cwd)
            if extra is not None:
                state.additionalDirectories = tuple(extra)
            self.hub.agentSettingsChanged(state, rebuild=True)
            await self.sessions.save(state, touch=False)
        return state

    async def load(self, params: dict[str, Any]) -> Reply:
        state = await self.restored(params)
        replay = await self.sessions.replay(state)
        if replay.truncated:
            self.hub.sendNotice(
                state,
                "info",
                "Earlier history not shown",
                f"This session is long: the first {replay.omittedCount} updates "
                f"({replay.omittedBytes} bytes) are not replayed.",
                journal=False,
            )
        for update in replay.updates:
            self.hub.sendUpdate(state, update, journal=False)
        log.debug("session {id} loaded: {n} updates replayed, {m} left out", id=state.sessionId,
                  n=len(replay.updates), m=replay.omittedCount)
        return self.setupResult(state)

    async def resume(self, params: dict[str, Any]) -> Reply:
        state = await self.restored(params)
        log.debug("session {id} resumed", id=state.sessionId)
        return self.setupResult(state)

    async def fork(self, params: dict[str, Any]) -> Reply:
        sessionId = field(params, "sessionId", str)
        cwd = existingFolder(absolutePath(params, "cwd"))
        extra = directories(params)
        mcpServers(params)
        state = await self.sessions.fork(sessionId, cwd, extra)
        log.debug("session {id} forked from {source} into {cwd}", id=state.sessionId, source=sessionId, cwd=cwd)
        return self.setupResult(state, sessionId=True)

    async def list(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = absolutePath(params, "cwd", required=False)
        cursor = field(params, "cursor", str, default=None)
        try:
            records, nextCursor = await self.sessions.list(cwd, cursor)
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
        state = await self.sessions.get(field(params, "sessionId", str))
        await self.hub.turns.cancelAll(state)
        self.sessions.forget(state)
        log.debug("session {id} closed", id=state.sessionId)
        return {}

    async def delete(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self.sessions.get(field(params, "sessionId", str))
        await self.hub.turns.cancelAll(state)
        await self.sessions.remove(state.sessionId)
        log.debug("session {id} deleted", id=state.sessionId)
        return {}

    async def setMode(self, params: dict[str, Any]) -> Reply:
        state = await self.sessions.get(field(params, "sessionId", str))
        mode = checkMode(field(params, "modeId", str))
        return Reply({}, lambda: self.applyMode(state, mode))

    def changeMode(self, state: SessionState, mode: str) -> None:
        state.mode = mode
        self.hub.agentSettingsChanged(state)
        self.sessions.save(state, touch=False)

    # Mode and option announcements are not journaled: a load answers with the
    # current modes and options, so replaying old ones would only repeat stale state.

    def announceMode(self, state: SessionState) -> None:
        self.hub.sendUpdate(state, {"sessionUpdate": "current_mode_update", "currentModeId": state.mode}, journal=False)

    def applyMode(self, state: SessionState, mode: str) -> None:
        """Switch and tell the editor (modes and the mode config option stay in sync)."""
        self.changeMode(state, mode)
        self.announceMode(state)
        self.announceOptions(state)

    def announceOptions(self, state: SessionState) -> None:
        self.hub.sendUpdate(state, {"sessionUpdate": "config_option_update", "configOptions": self.configOptions(state)}, journal=False)

    async def setConfigOption(self, params: dict[str, Any]) -> dict[str, Any] | Reply:
        state = await self.sessions.get(field(params, "sessionId", str))
        configId = field(params, "configId", str)
        if params.get("type") not in (None, "select"):
            raise InvalidParams("Invalid params: only select options exist here", {"field": "type"})
        value = params.get("value")
        checkOption(configId, value, self.hub.catalog.models())
        modeChanged = configId == "mode" and value != state.mode
        if configId == "mode":
            self.changeMode(state, value)
        elif configId == "model":
            self.switchModel(state, value)
        else:
            state.config[configId] = value
            self.hub.agentSettingsChanged(state)
            self.sessions.save(state, touch=False)
        result = {"configOptions": self.configOptions(state)}
        return Reply(result, lambda: self.announceMode(state)) if modeChanged else result

    def switchModel(self, state: SessionState, model: str) -> None:
        """Same history, same tools, new model from the next request on."""
        state.model = model
        self.hub.agentSettingsChanged(state)
        self.sessions.save(state, touch=False)

    async def setModel(self, params: dict[str, Any]) -> Reply:
        """The legacy unstable ``session/set_model``."""
        state = await self.sessions.get(field(params, "sessionId", str))
        model = field(params, "modelId", str)
        checkOption("model", model, self.hub.catalog.models())
        self.switchModel(state, model)
        return Reply({}, lambda: self.announceOptions(state))
