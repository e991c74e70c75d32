"""Session modes, config options and the model catalog behind the model picker."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.config import Endpoint
from hermes_acp.jsonrpc import InvalidParams
from hermes_acp.options import (
    MODE_INFO,
    THOUGHT_LEVELS,
    checkMode,
    checkOption,
    configOptions,
    modeState,
)
from hermes_acp.catalog import ModelCatalog
from hermes_acp.engine.access import EDIT_MODES as MODES
from hermes_acp.session_state import SessionState

from .acpschema import problems, unknownKeys


def state(**kwargs: Any) -> SessionState:
    return SessionState(sessionId="s1", cwd="/w", **kwargs)


class ConfigOptionTests(SynchronousTestCase):
    def assertValidOptions(self, options: list[dict[str, Any]]) -> None:
        """Each option is a schema-valid SessionConfigOption whose current value is offered."""
        for option in options:
            self.assertEqual(problems(option, "SessionConfigOption"), [])
            self.assertIn(option["currentValue"], [o["value"] for o in option["options"]], option["id"])
        update = {"sessionUpdate": "config_option_update", "configOptions": options}
        self.assertEqual(problems(update, "SessionUpdate"), [])
        self.assertEqual(unknownKeys(update), [])

    def byId(self, options: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {o["id"]: o for o in options}

    def test_fullSetInPriorityOrder(self) -> None:
        """Model, mode and thinking level, each with its current value and choices."""
        options = configOptions(state(model="m2", mode="accept_edits", config={"thought_level": "high"}), ["m1", "m2"])
        self.assertEqual([o["id"] for o in options], ["model", "mode", "thought_level"])
        self.assertEqual([o["category"] for o in options], ["model", "mode", "thought_level"])
        found = self.byId(options)
        self.assertEqual(found["model"]["currentValue"], "m2")
        self.assertEqual([o["value"] for o in found["model"]["options"]], ["m1", "m2"])
        self.assertEqual(found["mode"]["currentValue"], "accept_edits")
        self.assertEqual([o["value"] for o in found["mode"]["options"]], list(MODES))
        self.assertEqual(found["thought_level"]["currentValue"], "high")
        self.assertEqual([o["value"] for o in found["thought_level"]["options"]], list(THOUGHT_LEVELS))
        self.assertValidOptions(options)

    def test_currentValueAlwaysOffered(self) -> None:
        """A model outside the list is offered first; no model picks the first; a stored
        thinking level this version does not know shows the default."""
        outside = self.byId(configOptions(state(model="custom/x"), ["m1"]))["model"]
        self.assertEqual((outside["currentValue"], [o["value"] for o in outside["options"]]), ("custom/x", ["custom/x", "m1"]))
        first = self.byId(configOptions(state(), ["m1", "m2"]))["model"]
        self.assertEqual(first["currentValue"], "m1")
        stale = self.byId(configOptions(state(config={"thought_level": "extreme"}), ["m1"]))["thought_level"]
        self.assertEqual(stale["currentValue"], "default")
        for options in (
            configOptions(state(model="custom/x"), ["m1"]),
            configOptions(state(), ["m1", "m2"]),
            configOptions(state(config={"thought_level": "extreme"}), ["m1"]),
            configOptions(state(model="only"), []),
        ):
            self.assertValidOptions(options)

    def test_noModelAtAll(self) -> None:
        """With no model anywhere, there is no model selector to show an empty value in."""
        options = configOptions(state(), [])
        self.assertEqual([o["id"] for o in options], ["mode", "thought_level"])
        self.assertValidOptions(options)

    def test_modeState(self) -> None:
        """The legacy modes block: current mode and every mode with its name."""
        modes = modeState(state(mode="dont_ask"))
        self.assertEqual(modes["currentModeId"], "dont_ask")
        self.assertEqual(
            modes["availableModes"], [{"id": m, "name": MODE_INFO[m][0], "description": MODE_INFO[m][1]} for m in MODES]
        )
        self.assertEqual(problems(modes, "SessionModeState"), [])


class CheckTests(SynchronousTestCase):
    def assertRejected(self, configId: str, value: Any, field: str, words: str, models: list[str] | None = None) -> None:
        with self.assertRaises(InvalidParams) as caught:
            checkOption(configId, value, models or ["m1"])
        self.assertEqual((caught.exception.code, caught.exception.data), (-32602, {"field": field}))
        self.assertIn(words, caught.exception.message)

    def test_rejects(self) -> None:
        """Unknown ids and values are -32602 naming the field."""
        self.assertRejected("temperature", "1", "configId", "unknown configId 'temperature'")
        self.assertRejected("mode", "yolo", "value", "mode must be one of default, accept_edits, dont_ask")
        self.assertRejected("thought_level", "max", "value", "thought_level must be one of default, low, medium, high")
        self.assertRejected("mode", True, "value", "value must be a string")
        self.assertRejected("model", 3, "value", "value must be a string")
        self.assertRejected("model", "  ", "value", "model must not be empty")

    def test_accepts(self) -> None:
        """Every offered value passes; a model name the list lacks passes too (the
        endpoint may serve more models than it lists)."""
        for mode in MODES:
            checkOption("mode", mode, [])
        for level in THOUGHT_LEVELS:
            checkOption("thought_level", level, [])
        checkOption("model", "m1", ["m1"])
        checkOption("model", "vendor/unlisted", ["m1"])

    def test_checkMode(self) -> None:
        """set_mode takes only known modes; the error names modeId."""
        self.assertEqual(checkMode("accept_edits"), "accept_edits")
        self.assertEqual(checkMode("plan"), "plan")
        with self.assertRaises(InvalidParams) as caught:
            checkMode("yolo")
        self.assertEqual(caught.exception.data, {"field": "modeId"})


class CatalogTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", None, "default-model")
        self.runs: list[tuple[Any, tuple[Any, ...], Deferred[Any]]] = []
        self.changes = 0

        def runInThread(f: Any, *args: Any) -> Deferred[Any]:
            d: Deferred[Any] = Deferred()
            self.runs.append((f, args, d))
            return d

        def onChange() -> None:
            self.changes += 1

        self.fetch = lambda endpoint: ["never called here"]
        self.catalog = ModelCatalog(lambda: self.endpoint, runInThread, self.fetch, onChange)

    def test_configuredListWins(self) -> None:
        """HERMES_MODELS is the list (the default model first if missing); nothing is fetched."""
        self.endpoint = Endpoint("custom", "http://h/v1", None, "default-model", models=("a", "b"))
        self.catalog.refresh()
        self.assertEqual(self.runs, [])
        self.assertEqual(self.catalog.models(), ["default-model", "a", "b"])
        self.endpoint = Endpoint("custom", "http://h/v1", None, "b", models=("a", "b"))
        self.assertEqual(self.catalog.models(), ["a", "b"])

    def test_fetchedOnceInTheBackground(self) -> None:
        """The first refresh runs the fetch through the runner (never inline); later refreshes
        wait for it, and once it has answered nothing is fetched again."""
        self.assertEqual(self.catalog.models(), ["default-model"])
        self.catalog.refresh()
        self.catalog.refresh()
        [(f, args, d)] = self.runs
        self.assertIs(f, self.fetch)
        self.assertEqual(args, (self.endpoint,))
        self.assertEqual(self.changes, 0)
        d.callback(["m1", "default-model", "m2"])
        self.assertEqual(self.changes, 1)
        self.assertEqual(self.catalog.models(), ["m1", "default-model", "m2"])
        self.catalog.refresh()
        self.assertEqual(len(self.runs), 1)
        self.endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", None, "default-model", models=("pinned",))
        self.assertEqual(self.catalog.models(), ["default-model", "pinned"])

    def test_failureAllowsARetry(self) -> None:
        """A failed fetch is logged and the next refresh tries again."""
        self.catalog.refresh()
        self.runs[0][2].errback(ConnectionRefusedError("down"))
        self.assertEqual((self.changes, self.catalog.models()), (0, ["default-model"]))
        self.catalog.refresh()
        self.assertEqual(len(self.runs), 2)
        self.runs[1][2].callback(["m1"])
        self.assertEqual((self.changes, self.catalog.models()), (1, ["default-model", "m1"]))

    def test_anotherEndpointIsAskedAgain(self) -> None:
        """After the endpoint changes (setup wrote a new one), the old list is not offered
        and the new endpoint is asked; a late answer from the old one is dropped."""
        self.catalog.refresh()
        self.runs[0][2].callback(["old-1", "old-2"])
        self.endpoint = Endpoint("custom", "http://other/v1", None, "new-default")
        self.assertEqual(self.catalog.models(), ["new-default"])
        self.catalog.refresh()
        self.assertEqual(self.runs[1][1], (self.endpoint,))
        self.endpoint = Endpoint("custom", "http://third/v1", None, "third-default")
        self.catalog.refresh()
        self.runs[1][2].callback(["late"])
        self.runs[2][2].callback(["t1"])
        self.assertEqual(self.catalog.models(), ["third-default", "t1"])
        self.assertEqual(self.changes, 2)

    def test_emptyAnswerIsNoChange(self) -> None:
        """An endpoint that lists nothing changes nothing and is not asked again."""
        self.catalog.refresh()
        self.runs[0][2].callback(None)
        self.catalog.refresh()
        self.assertEqual((len(self.runs), self.changes, self.catalog.models()), (1, 0, ["default-model"]))

    def test_noEndpointNoFetch(self) -> None:
        """Without a base URL there is nothing to ask."""
        self.endpoint = Endpoint("custom", None)
        self.catalog.refresh()
        self.assertEqual((self.runs, self.catalog.models()), ([], []))
