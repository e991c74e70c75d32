"""The agent side of one ACP connection: initialize, auth, and the hub the
session and turn methods share (sending updates, building agents).

Each handler takes the request's params and returns the result (or a Deferred
or coroutine of it); errors are :mod:`hermes_acp.jsonrpc` exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, gatherResults
from twisted.logger import Logger

from . import __version__
from .agents import EngineAgentFactory
from .clientio import ClientWorkspace
from .commands import availableCommands
from .config import Endpoint, Settings, loadDotenv, resolveEndpoint
from .interfaces import IAgentFactory
from .jsonrpc import AuthRequired, InvalidParams, JSONRPCConnection
from .lifecycle import Lifecycle
from .options import ModelCatalog
from .params import field, lenientObject
from .permissions import PermissionBroker
from .sessions import SessionManager, SessionState
from .threads import WorkerPool
from .turns import Turns

log = Logger()

PROTOCOL_VERSION = 1
SETUP_METHOD_ID = "hermes-setup"
AGENT_INFO = {"name": "hermes-acp", "title": "Hermes ACP", "version": __version__}
#: On shutdown, how long running turns get to answer "cancelled".
SHUTDOWN_GRACE = 1.0


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

    def fs(self, name: str) -> bool:
        fs = self.capabilities.get("fs")
        return isinstance(fs, dict) and fs.get(name) is True

    @property
    def terminal(self) -> bool:
        return self.capabilities.get("terminal") is True

    @property
    def notices(self) -> bool:
        session = self.capabilities.get("session")
        return isinstance(session, dict) and isinstance(session.get("notices"), dict)


class ACPAgent:
    """Everything one editor connection talks to."""

    def __init__(
        self,
        reactor: Any,
        settings: Settings,
        sessions: SessionManager,
        workers: WorkerPool,
        endpointSource: Callable[[], Endpoint] = resolveEndpoint,
        agentFactory: IAgentFactory | None = None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.sessions = sessions
        self.workers = workers
        self.endpointSource = endpointSource
        self.agentFactory = agentFactory or EngineAgentFactory(endpointSource, self._searchSessions)
        self.client = ClientInfo()
        self.loggedOut = False
        self._warm = False
        self.connection: JSONRPCConnection | None = None
        self.permissions: PermissionBroker | None = None
        self.catalog = ModelCatalog(endpointSource, workers.run, fetchModels, self._modelsChanged, reactor)
        self.lifecycle = Lifecycle(self)
        self.turns = Turns(self)
        sessions.onForget = self._forgotten

    def buildProtocol(self) -> JSONRPCConnection:
        requests = {"initialize": self.initialize, "authenticate": self.authenticate, "logout": self.logout}
        requests.update(self.lifecycle.handlers())
        requests.update(self.turns.handlers())
        self.connection = JSONRPCConnection(requests, self.turns.notifications(), self.reactor, self.settings.maxLine)
        self.connection.onInputEnded = self.cancelAllTurns
        self.permissions = PermissionBroker(self.connection.callRemote, self.reactor, self.settings.permissionTimeout)
        return self.connection

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
        return {
            "loadSession": True,
            "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
            "mcpCapabilities": {"http": False, "sse": False},
            "sessionCapabilities": {
                "list": {},
                "delete": {},
                "additionalDirectories": {},
                "resume": {},
                "close": {},
                "fork": {},
            },
            "auth": {"logout": {}},
        }

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
        """Later sessions and prompts need ``authenticate`` again."""
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

    # -- the hub -----------------------------------------------------------

    def sendUpdate(self, state: SessionState, update: dict[str, Any], journal: bool = True) -> None:
        """Tell the editor; remember it for ``session/load`` unless replaying."""
        if self.connection is not None:
            self.connection.notify("session/update", {"sessionId": state.sessionId, "update": update})
        if journal:
            self.sessions.journalUpdate(state, update)

    def sendNotice(self, state: SessionState, severity: str, title: str, description: str, journal: bool = True) -> None:
        """A ``notice`` where the client takes them, else a line of agent text."""
        if self.client.notices:
            update = {"sessionUpdate": "notice", "severity": severity, "title": title, "description": description}
        else:
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"_{title}: {description}_\n\n"}}
        self.sendUpdate(state, update, journal=journal)

    def sessionAnnounced(self, state: SessionState) -> None:
        """The editor knows the session now (its response is written)."""
        state.announced = True
        self.sendUpdate(state, {"sessionUpdate": "available_commands_update", "availableCommands": availableCommands()}, journal=False)

    def warmUp(self) -> None:
        """Import the engine and the model SDK on a worker while the user types."""
        if not self._warm:
            self._warm = True
            d = self.workers.run(_importEngine)
            d.addErrback(lambda f: log.failure("preloading the engine failed", f))

    def agentFor(self, state: SessionState) -> Any:
        if state.rebuildAgent:
            state.agent, state.rebuildAgent = None, False
        if state.agent is None:
            state.agent = self.agentFactory.buildAgent(state)
        return state.agent

    def agentSettingsChanged(self, state: SessionState, rebuild: bool = False) -> None:
        """Apply new settings; a new folder needs a new agent, built once no turn runs."""
        if state.agent is None:
            return
        if rebuild and state.running is None:
            state.agent = None
        else:
            state.rebuildAgent = state.rebuildAgent or rebuild
            self.agentFactory.configure(state.agent, state)

    def workspaceFor(
        self, state: SessionState, request: Callable[..., Deferred[Any]], onTerminal: Callable[[str, str], Any]
    ) -> ClientWorkspace:
        return ClientWorkspace(
            self.reactor,
            state.sessionId,
            request,
            readFiles=self.client.fs("readTextFile"),
            writeFiles=self.client.fs("writeTextFile"),
            terminals=self.client.terminal,
            onTerminal=onTerminal,
        )

    def _forgotten(self, state: SessionState) -> None:
        state.agent = None
        if self.permissions is not None:
            self.permissions.forget(state.sessionId)

    def _searchSessions(self, query: str, limit: int) -> list[dict[str, Any]]:
        return self.sessions.searchNow(query, limit)

    def _modelsChanged(self) -> None:
        for state in list(self.sessions.sessions.values()):
            if state.running is None and state.announced:
                self.lifecycle.announceOptions(state)

    # -- shutdown ----------------------------------------------------------

    def cancelAllTurns(self) -> list[Deferred[Any]]:
        """Cancel every turn of every session; Deferreds for their answers."""
        waits = []
        for state in list(self.sessions.sessions.values()):
            waits += [turn.whenDone() for turn in self.turns.cancelTurns(state)]
        return waits

    def shutdown(self) -> Deferred[Any]:
        """Cancel every turn, give them a moment to answer, then flush state."""
        d = gatherResults(self.cancelAllTurns(), consumeErrors=True)
        d.addTimeout(SHUTDOWN_GRACE, self.reactor)
        d.addErrback(lambda f: log.warn("turns still running at shutdown"))
        d.addCallback(lambda _: self.sessions.close())
        return d


def fetchModels(endpoint: Endpoint) -> list[str]:
    """The endpoint's model list (in a worker thread; imports the model client then)."""
    from .engine.model import listModels

    return listModels(endpoint)


def _importEngine() -> None:
    import openai  # noqa: F401  (about 0.7 s; better now than in the first turn)

    from .engine import agent  # noqa: F401
