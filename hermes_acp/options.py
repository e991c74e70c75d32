"""Session modes and config options (model, mode, thought level), and the
model list behind the model picker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from .config import Endpoint
from .jsonrpc import InvalidParams
from .sessions import MODES, SessionState

log = Logger()

MODE_INFO = {
    "default": ("Default", "Ask before every file edit and every dangerous command."),
    "accept_edits": ("Accept Edits", "Edit files inside the workspace without asking; sensitive paths still ask."),
    "dont_ask": ("Don't Ask", "Edit files without asking; sensitive paths and dangerous commands still ask."),
}
THOUGHT_LEVELS = {
    "default": "The model's default reasoning",
    "low": "Low reasoning effort",
    "medium": "Medium reasoning effort",
    "high": "High reasoning effort",
}


@attrs.define(eq=False)
class ModelCatalog:
    """The models offered: ``HERMES_MODELS``, else the endpoint's ``/models``
    (fetched once per endpoint URL, in the background, never blocking a request;
    a list fetched from another URL, before the endpoint changed, is not offered)."""

    endpointSource: Callable[[], Endpoint]
    runInThread: Callable[..., Deferred[Any]]
    fetchModels: Callable[[Endpoint], list[str]]
    onChange: Callable[[], None] = lambda: None
    clock: Any = None
    fetched: tuple[str, ...] = ()
    #: The URL ``fetched`` came from, and the URL asked (or being asked) last.
    fetchedFrom: str | None = None
    _asked: str | None = None
    _waiting: list[Deferred[None]] = attrs.field(factory=list)
    _inFlight: bool = False

    def _known(self, endpoint: Endpoint) -> tuple[str, ...]:
        return self.fetched if self.fetchedFrom == endpoint.baseURL else ()

    def models(self) -> list[str]:
        endpoint = self.endpointSource()
        found = list(endpoint.models or self._known(endpoint))
        if endpoint.model and endpoint.model not in found:
            found.insert(0, endpoint.model)
        return found

    def refresh(self) -> None:
        endpoint = self.endpointSource()
        url = endpoint.baseURL
        if endpoint.models or not url or self._asked == url:
            return
        self._asked = url
        self._inFlight = True
        d = self.runInThread(self.fetchModels, endpoint)

        def fetched(models: list[str]) -> None:
            if self._asked != url:
                return  # the endpoint changed meanwhile
            self.fetched, self.fetchedFrom = tuple(str(m) for m in models or ()), url
            if self.fetched:
                self.onChange()

        def failed(failure: Any) -> None:
            if self._asked == url:
                self._asked = None  # try again with the next session
            log.warn("could not list models at {url}: {error}", url=url, error=failure.getErrorMessage())

        def settled(_: Any) -> None:
            self._inFlight = False
            waiting, self._waiting = self._waiting, []
            for waiter in waiting:
                waiter.called or waiter.callback(None)

        d.addCallbacks(fetched, failed)
        d.addBoth(settled)

    def settled(self, timeout: float) -> Deferred[None]:
        """Fires once no model list is on its way, or after ``timeout`` seconds."""
        if not self._inFlight:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiting.append(waiter)
        if self.clock is not None:
            waiter.addTimeout(timeout, self.clock, onTimeoutCancel=lambda result, timeout: None)
        return waiter


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
