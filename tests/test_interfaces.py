"""Each seam's implementation provides its interface, and each interface declares
the methods its callers use with the signatures the implementation really has."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.interface import InterfaceClass
from zope.interface.verify import verifyObject

from hermes_acp import commands, lifecycle, options, turns
from hermes_acp.bridge import BridgedObserver, EventBridge
from hermes_acp.catalog import ModelCatalog
from hermes_acp.client import ClientInfo
from hermes_acp.config import Endpoint
from hermes_acp.engine.agent import AIAgent
from hermes_acp.engine_factory import EngineAgentFactory
from hermes_acp.interfaces import (
    IAgentFactory,
    IEngineAgent,
    IPermissionBroker,
    IRenderer,
    ISessionOptions,
    ISessionStore,
    ITurnObserver,
    IUpdateChannel,
)
from hermes_acp.jsonrpc import JSONRPCConnection
from hermes_acp.options import SessionOptions
from hermes_acp.permissions import PermissionBroker
from hermes_acp.render import Renderer
from hermes_acp.sessions import SessionManager
from hermes_acp.updates import UpdateChannel

from .observers import RecordingObserver
from .test_turn_paths import ScriptedAgent


def implementations() -> list[tuple[InterfaceClass, Any]]:
    clock = Clock()
    store = SessionManager(clock, Path("/nonexistent/state.db"))
    factory = EngineAgentFactory(lambda: Endpoint("custom", None))
    updates = UpdateChannel(JSONRPCConnection({}, {}, clock), store, ClientInfo())
    catalog = ModelCatalog(lambda: Endpoint("custom", None), lambda *a: None, lambda e: [])
    return [
        (IRenderer, Renderer("/tmp")),
        (IPermissionBroker, PermissionBroker(lambda *args: None, clock, 60.0)),
        (ISessionStore, store),
        (IAgentFactory, factory),
        (IUpdateChannel, updates),
        (ISessionOptions, SessionOptions(store, updates, catalog, factory)),
        (IEngineAgent, AIAgent(Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), "/tmp")),
        (IEngineAgent, ScriptedAgent(lambda *a: None)),  # the test double keeps to the same contract
        (ITurnObserver, BridgedObserver(EventBridge(clock, lambda events: None), object())),  # type: ignore[arg-type]
        (ITurnObserver, RecordingObserver()),
    ]


def declared(interface: InterfaceClass, name: str) -> tuple[Any, ...]:
    info = interface[name].getSignatureInfo()
    return tuple(info["positional"]), tuple(info["required"]), bool(info["varargs"]), bool(info["kwargs"])


def implemented(method: Any) -> tuple[Any, ...]:
    parameters = inspect.signature(method).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    required = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters)
    return positional, required, varargs, kwargs


class InterfaceTests(SynchronousTestCase):
    def test_verifyObject(self) -> None:
        """Every seam's implementations (and the test doubles of the engine and of its
        observer) provide their interfaces."""
        for interface, provider in implementations():
            self.assertTrue(verifyObject(interface, provider), interface.__name__)

    def test_signaturesMatchExactly(self) -> None:
        """Every declared method takes exactly the arguments the implementation takes
        (verifyObject alone lets an implementation take more than the interface says)."""
        for interface, provider in implementations():
            for name in interface.names():
                if callable(getattr(provider, name)) and hasattr(interface[name], "getSignatureInfo"):
                    self.assertEqual(
                        declared(interface, name), implemented(getattr(provider, name)), f"{interface.__name__}.{name}"
                    )

    def test_interfacesCoverWhatCallersUse(self) -> None:
        """Callers call only what the interfaces of their collaborators declare."""
        uses = [
            (turns, "renderer", IRenderer), (turns, "options", ISessionOptions), (turns, "updates", IUpdateChannel),
            (turns, "permissions", IPermissionBroker), (turns, "store", ISessionStore), (turns, "agent", IEngineAgent),
            (lifecycle, "store", ISessionStore), (lifecycle, "options", ISessionOptions), (lifecycle, "updates", IUpdateChannel),
            (commands, "options", ISessionOptions), (commands, "store", ISessionStore), (commands, "updates", IUpdateChannel),
            (options, "store", ISessionStore), (options, "updates", IUpdateChannel), (options, "factory", IAgentFactory),
        ]  # fmt: skip
        for module, variable, interface in uses:
            used = set(re.findall(rf"\b{variable}\.(\w+)\b", inspect.getsource(module)))
            self.assertTrue(used, (module.__name__, variable))
            self.assertEqual(used - set(interface.names()), set(), f"{module.__name__} uses undeclared {interface.__name__} members")

    def test_noImportCycle(self) -> None:
        """No module of the package imports, even for type checking only, a module that
        imports it back (directly or through others)."""
        graph = importGraph(Path(turns.__file__).parent)
        self.assertIn("hermes_acp.turns", graph["hermes_acp.acp"])  # the graph sees relative imports
        self.assertIn("hermes_acp.safejson", graph["hermes_acp.jsonrpc"])  # and `from . import x`
        self.assertEqual(sorted(name for name in graph if reaches(graph, name, name)), [])


def importGraph(package: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (every import statement, wherever it is)."""
    modules = {
        ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        current = todo.pop()
        if current == goal:
            return True
        if current not in seen:
            seen.add(current)
            todo.extend(graph.get(current, ()))
    return False
