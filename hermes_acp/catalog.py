"""The models offered in the model picker and ``/model``: ``HERMES_MODELS``, else the
endpoint's ``GET /models``, fetched in the background."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from .config import Endpoint
from .oneshot import OneShot
from .sight import Sight

log = Logger()


@attrs.define(eq=False)
class ModelCatalog:
    """The models offered: ``HERMES_MODELS``, else the endpoint's ``/models``
    (fetched once per endpoint URL, in the background, never blocking a request;
    a list fetched from another URL, before the endpoint changed, is not offered)."""

    endpointSource: Callable[[], Endpoint]
    runInThread: Callable[..., Deferred[Any]]
    #: ``fetchModels(endpoint)``: model names, or (name, context window or None) pairs.
    fetchModels: Callable[[Endpoint], list[Any]]
    onChange: Callable[[], None] = lambda: None
    clock: Any = None
    fetched: tuple[str, ...] = ()
    #: The URL ``fetched`` came from, and the URL asked (or being asked) last.
    fetchedFrom: str | None = None
    _asked: str | None = None
    _fetching: OneShot[None] | None = None  # while a model list is on its way
    #: Context windows by model: what the endpoint's list said, then what its errors said.
    windows: dict[str, int] = attrs.Factory(dict)
    #: The window of a model nobody said anything about (``HERMES_CONTEXT_WINDOW``).
    defaultWindow: int = 128_000
    #: Whether models see images: ``HERMES_ACP_MODEL_VISION`` (``sight.Sight``) when it says;
    #: with ``auto``, what the endpoint's refusals taught, else what its list said.
    sight: Sight = attrs.Factory(Sight)
    seeing: dict[str, bool] = attrs.Factory(dict)
    blind: set[str] = attrs.Factory(set)

    def sees(self, model: str | None) -> bool | None:
        """Whether ``model`` can see images (None: nobody said; it is shown them to find out)."""
        model = model or ""
        if self.sight.word == "auto" and model in self.blind:
            return False
        return self.sight.sees(model, self.seeing.get(model))

    def learnBlind(self, model: str | None) -> None:
        """A run found ``model`` cannot see (the endpoint refused its images): with ``auto``, it
        is sent none from now on (a setting that says it sees is the user's word, and wins)."""
        if model and self.sight.word == "auto" and self.sees(model) is not False:
            log.info("model {model} does not take images (the endpoint refused them); they are left out", model=model)
            self.blind.add(model)

    def window(self, model: str | None) -> int:
        """The context window of ``model``, as far as anyone said."""
        return self.windows.get(model or "", self.defaultWindow)

    def learnWindow(self, model: str | None, window: int) -> None:
        """An error said how big ``model``'s window is: believe it from now on."""
        if model and window >= 1024 and self.windows.get(model) != window:
            log.debug("model {model} has a context window of {n} tokens (learned from the endpoint)", model=model, n=window)
            self.windows[model] = window

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
        self._fetching = fetching = OneShot()
        d = self.runInThread(self.fetchModels, endpoint)

        def fetched(models: list[str]) -> None:
            if self._asked != url:
                return  # the endpoint changed meanwhile
            pairs = [(m, None) if isinstance(m, str) else (str(m[0]), m[1]) for m in models or ()]
            self.fetched, self.fetchedFrom = tuple(name for name, _ in pairs), url
            self.windows.update((name, window) for name, window in pairs if window)
            self.seeing.update((str(m[0]), m[2]) for m in models or () if not isinstance(m, str) and len(m) > 2)
            if self.fetched:
                self.onChange()

        def failed(failure: Any) -> None:
            if self._asked == url:
                self._asked = None  # try again with the next session
            log.warn("could not list models at {url}: {error}", url=endpoint.shownURL, error=failure.getErrorMessage())

        def settled(_: Any) -> None:
            if self._fetching is fetching:
                self._fetching = None
            fetching.fire(None)

        d.addCallbacks(fetched, failed)
        d.addBoth(settled)

    def settled(self, timeout: float) -> Deferred[None]:
        """Fires once no model list is on its way, or after ``timeout`` seconds."""
        if self._fetching is None:
            return succeed(None)
        waiter = self._fetching.when()
        if self.clock is not None:
            waiter.addTimeout(timeout, self.clock, onTimeoutCancel=lambda result, timeout: None)
        return waiter
