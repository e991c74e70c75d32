"""The ACP methods an editor calls on us (client → agent).

Each handler takes the request's params and returns the result (or a Deferred
or coroutine of it); errors are :mod:`hermes_acp.jsonrpc` exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from . import __version__
from .config import Endpoint, Settings, loadDotenv, resolveEndpoint
from .jsonrpc import AuthRequired, InvalidParams, JSONRPCConnection
from .params import field, lenientObject

log = Logger()

PROTOCOL_VERSION = 1
SETUP_METHOD_ID = "hermes-setup"
AGENT_INFO = {"name": "hermes-acp", "title": "Hermes ACP", "version": __version__}


@attrs.define
class ClientInfo:
    """What the editor told us in ``initialize``."""

    capabilities: dict[str, Any] = attrs.field(factory=dict)
    info: dict[str, Any] = attrs.field(factory=dict)

    def supportsTerminalAuth(self) -> bool:
        auth = self.capabilities.get("auth")
        meta = self.capabilities.get("_meta")
        return bool(
            (isinstance(auth, dict) and auth.get("terminal") is True)
            or (isinstance(meta, dict) and meta.get("terminal-auth") is True)
        )


@attrs.define(eq=False)
class ACPAgent:
    """The agent side of one ACP connection."""

    clock: IReactorTime
    settings: Settings
    endpointSource: Callable[[], Endpoint] = resolveEndpoint
    client: ClientInfo = attrs.field(factory=ClientInfo)
    loggedOut: bool = False
    connection: JSONRPCConnection | None = None

    def buildProtocol(self) -> JSONRPCConnection:
        self.connection = JSONRPCConnection(
            self.requestHandlers(), self.notificationHandlers(), self.clock, self.settings.maxLine
        )
        return self.connection

    def requestHandlers(self) -> Mapping[str, Callable[[dict[str, Any]], Any]]:
        return {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "logout": self.logout,
        }

    def notificationHandlers(self) -> Mapping[str, Callable[[dict[str, Any]], Any]]:
        return {}

    # -- initialize and auth ---------------------------------------------

    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        requested = field(params, "protocolVersion", int)
        if requested != PROTOCOL_VERSION:
            log.info("client asked for protocol {v}; answering {ours}", v=requested, ours=PROTOCOL_VERSION)
        self.client = ClientInfo(
            capabilities=lenientObject(params, "clientCapabilities"),
            info=lenientObject(params, "clientInfo"),
        )
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": self.agentCapabilities(),
            "authMethods": self.authMethods(),
            "agentInfo": dict(AGENT_INFO),
        }

    def agentCapabilities(self) -> dict[str, Any]:
        """Only what works end to end at this version."""
        return {"loadSession": False, "promptCapabilities": {}, "mcpCapabilities": {}}

    def authMethods(self) -> list[dict[str, Any]]:
        methods: list[dict[str, Any]] = []
        endpoint = self.endpointSource()
        if not endpoint.problems():
            methods.append(
                {
                    "id": endpoint.provider,
                    "name": f"Use the configured {endpoint.provider} endpoint",
                    "description": f"Model {endpoint.model} at {endpoint.baseURL}, "
                    "configured in $HERMES_HOME/.env or the environment.",
                }
            )
        if self.client.supportsTerminalAuth():
            methods.append(
                {
                    "type": "terminal",
                    "id": SETUP_METHOD_ID,
                    "name": "Set up hermes-acp",
                    "description": "Choose a model provider (OpenRouter, OpenAI, Nous Portal or "
                    "any OpenAI-compatible URL), its key and a default model.",
                    "args": ["--setup"],
                }
            )
        return methods

    def authenticate(self, params: dict[str, Any]) -> dict[str, Any]:
        methodId = field(params, "methodId", str)
        if methodId == SETUP_METHOD_ID:
            loadDotenv()  # the terminal setup may just have written it
        endpoint = self.endpointSource()
        if methodId not in (SETUP_METHOD_ID, endpoint.provider):
            known = [m["id"] for m in self.authMethods()] or [SETUP_METHOD_ID]
            raise InvalidParams(
                f"Invalid params: unknown methodId {methodId!r}; expected one of {known}",
                {"field": "methodId"},
            )
        problems = endpoint.problems()
        if problems:
            raise AuthRequired("Authentication required: " + "; ".join(problems))
        self.loggedOut = False
        return {}

    def logout(self, params: dict[str, Any]) -> dict[str, Any]:
        self.loggedOut = True
        return {}

    def requireAuthenticated(self) -> Endpoint:
        """The endpoint for new work, or -32000 saying what to do."""
        endpoint = self.endpointSource()
        if self.loggedOut:
            raise AuthRequired("Authentication required: logged out; call authenticate again")
        problems = endpoint.problems()
        if problems:
            raise AuthRequired("Authentication required: " + "; ".join(problems))
        return endpoint
