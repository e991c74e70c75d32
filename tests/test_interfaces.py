"""Each seam's implementation provides its interface, and each interface declares
the methods its callers use with the signatures the implementation really has."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.interface import InterfaceClass
from zope.interface.verify import verifyObject

from hermes_acp import acp, turns
from hermes_acp.agents import EngineAgentFactory
from hermes_acp.config import Endpoint
from hermes_acp.interfaces import (
    IAgentFactory,
    IPermissionBroker,
    IRenderer,
    ISessionStore,
)
from hermes_acp.permissions import PermissionBroker
from hermes_acp.render import Renderer
from hermes_acp.sessions import SessionManager


def implementations() -> list[tuple[InterfaceClass, Any]]:
    return [
        (IRenderer, Renderer("/tmp")),
        (IPermissionBroker, PermissionBroker(lambda *args: None, Clock(), 60.0)),
        (ISessionStore, SessionManager(Clock(), Path("/nonexistent/state.db"))),
        (IAgentFactory, EngineAgentFactory(lambda: Endpoint("custom", None))),
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
        """Renderer, PermissionBroker, SessionManager and EngineAgentFactory provide their interfaces."""
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
        """The turn calls only IRenderer methods on its renderer; the hub only IAgentFactory
        methods on its factory."""
        for module, variable, interface in ((turns, "renderer", IRenderer), (acp, "agentFactory", IAgentFactory)):
            used = set(re.findall(rf"\b{variable}\.(\w+)\(", inspect.getsource(module)))
            self.assertTrue(used, variable)
            self.assertEqual(used - set(interface.names()), set(), f"{module.__name__} uses undeclared {interface.__name__} methods")
