"""A session's settings: its mode and config options (model, mode, thought level),
and their one owner, ``SessionOptions``, which also owns the session's engine agent
(it applies every change to it)."""

from __future__ import annotations

from typing import Any

import attrs
from twisted.logger import Logger
from zope.interface import implementer

from .catalog import ModelCatalog
from .engine.access import EDIT_MODES as MODES
from .interfaces import IAgentFactory, IEngineAgent, ISessionOptions, ISessionStore, IUpdateChannel
from .jsonrpc import InvalidParams
from .session_state import SessionState

log = Logger()

MODE_INFO = {
    "default": ("Default", "Ask before every file edit, every read outside the workspace and every dangerous command."),
    "accept_edits": ("Accept Edits", "Edit files inside the workspace without asking; secrets and protected files still ask."),
    "dont_ask": ("Don't Ask", "Edit and read files without asking; secrets, protected files and dangerous commands still ask."),
    "plan": ("Plan", "Read, search and run read-only commands, change nothing; end with a plan to approve."),
}
THOUGHT_LEVELS = {
    "default": "The model's default reasoning",
    "low": "Low reasoning effort",
    "medium": "Medium reasoning effort",
    "high": "High reasoning effort",
}


def modeState(state: SessionState) -> dict[str, Any]:
    return {
        "currentModeId": state.mode,
        "availableModes": [{"id": m, "name": MODE_INFO[m][0], "description": MODE_INFO[m][1]} for m in MODES],
    }


def configOptions(state: SessionState, models: list[str]) -> list[dict[str, Any]]:
    """The full set, in priority order; every option's current value is one of
    its options (the model selector is left out while there is no model at all)."""
    current = state.model or (models[0] if models else "")
    modelValues = list(models)
    if current and current not in modelValues:
        modelValues.insert(0, current)
    thoughtLevel = state.config.get("thought_level", "default")
    options: list[dict[str, Any]] = []
    if current:
        options.append(
            {
                "id": "model",
                "name": "Model",
                "category": "model",
                "type": "select",
                "currentValue": current,
                "options": [{"value": m, "name": m} for m in modelValues],
            }
        )
    return options + [
        {
            "id": "mode",
            "name": "Mode",
            "category": "mode",
            "type": "select",
            "currentValue": state.mode,
            "options": [{"value": m, "name": MODE_INFO[m][0], "description": MODE_INFO[m][1]} for m in MODES],
        },
        {
            "id": "thought_level",
            "name": "Thinking",
            "category": "thought_level",
            "type": "select",
            "currentValue": thoughtLevel if thoughtLevel in THOUGHT_LEVELS else "default",
            "options": [{"value": k, "name": k.title(), "description": v} for k, v in THOUGHT_LEVELS.items()],
        },
    ]


def checkMode(modeId: str) -> str:
    if modeId not in MODES:
        raise InvalidParams(f"Invalid params: modeId must be one of {', '.join(MODES)}", {"field": "modeId"})
    return modeId


def checkOption(configId: str, value: Any, models: list[str]) -> None:
    """A -32602 naming the problem unless ``value`` is allowed for ``configId``."""
    allowed = {"model": models, "mode": list(MODES), "thought_level": list(THOUGHT_LEVELS)}.get(configId)
    if allowed is None:
        raise InvalidParams(f"Invalid params: unknown configId {configId!r}", {"field": "configId"})
    if not isinstance(value, str):
        raise InvalidParams("Invalid params: value must be a string", {"field": "value"})
    if configId != "model" and value not in allowed:
        raise InvalidParams(f"Invalid params: {configId} must be one of {', '.join(allowed)}", {"field": "value"})
    if configId == "model" and not value.strip():
        raise InvalidParams("Invalid params: model must not be empty", {"field": "value"})


def reasoningEffort(state: SessionState) -> str | None:
    """The thought level as the model request's ``reasoning_effort`` (None: the model's own)."""
    level = state.config.get("thought_level", "default")
    return None if level == "default" else level


@implementer(ISessionOptions)
@attrs.define(eq=False)
class SessionOptions:
    """Mode, model and config options of every session, and its engine agent.

    Every change goes through here: it is checked, applied to the agent, saved,
    and (unless the caller answers with the new values itself) announced.
    Mode and option announcements are not journaled: a load answers with the
    current ones, so replaying old ones would only repeat stale state.
    """

    store: ISessionStore
    updates: IUpdateChannel
    catalog: ModelCatalog
    factory: IAgentFactory
    _agents: dict[str, IEngineAgent] = attrs.field(factory=dict)
    _stale: set[str] = attrs.field(factory=set)  # sessions whose folders changed

    def agentFor(self, state: SessionState) -> IEngineAgent:
        if state.sessionId in self._stale:
            self._stale.discard(state.sessionId)
            self._agents.pop(state.sessionId, None)
        agent = self._agents.get(state.sessionId)
        if agent is None:
            agent = self._agents[state.sessionId] = self.factory.buildAgent(state)
        return agent

    def foldersChanged(self, state: SessionState) -> None:
        self._stale.add(state.sessionId)

    def setMode(self, state: SessionState, mode: str, announce: bool = True) -> None:
        state.mode = checkMode(mode)
        self._changed(state)
        if announce:
            self.announceMode(state)
            self.announceOptions(state)

    def setModel(self, state: SessionState, model: str, announce: bool = True) -> None:
        checkOption("model", model, self.catalog.models())
        state.model = model
        self._changed(state)
        if announce:
            self.announceOptions(state)

    def setOption(self, state: SessionState, configId: str, value: Any) -> None:
        checkOption(configId, value, self.catalog.models())
        if configId == "mode":
            self.setMode(state, value, announce=False)
        elif configId == "model":
            self.setModel(state, value, announce=False)
        else:
            state.config[configId] = value
            self._changed(state)

    def _changed(self, state: SessionState) -> None:
        agent = self._agents.get(state.sessionId)
        if agent is not None:
            self.factory.configure(agent, state)
        self.store.save(state, touch=False)

    def configOptions(self, state: SessionState) -> list[dict[str, Any]]:
        return configOptions(state, self.catalog.models())

    def announceMode(self, state: SessionState) -> None:
        self.updates.send(state, {"sessionUpdate": "current_mode_update", "currentModeId": state.mode}, journal=False)

    def announceOptions(self, state: SessionState) -> None:
        update = {"sessionUpdate": "config_option_update", "configOptions": self.configOptions(state)}
        self.updates.send(state, update, journal=False)

    def modelsChanged(self) -> None:
        """The endpoint's model list arrived: every session the editor knows hears it."""
        for state in list(self.store.sessions.values()):
            if state.announced:
                self.announceOptions(state)

    def forget(self, state: SessionState) -> None:
        self._agents.pop(state.sessionId, None)
        self._stale.discard(state.sessionId)
