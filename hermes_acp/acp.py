"""The agent side of one ACP connection: ``initialize``, ``authenticate``,
``logout``, and the wiring of everything else.

``ACPServer.buildProtocol`` is the one place where the connection's parts are
built and handed to each other: the update channel, each session's options, the
permission broker, the slash commands, the prompt turns and the session
lifecycle. Each part gets only the collaborators it uses.

Each handler takes the request's params and returns the result (or a Deferred
or coroutine of it); errors are ``hermes_acp.jsonrpc`` exceptions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from . import __version__
from .backgroundcards import BackgroundCards
from .catalog import ModelCatalog
from .client import ClientInfo
from .clientio import ClientWorkspace
from .collector import loadingForGood
from .commands import Commands, availableCommands, commandNames
from .config import Endpoint, Settings, hermesHome, loadDotenv, resolveEndpoint
from .engine.background import BackgroundLimits, BackgroundProcesses
from .engine_factory import EngineAgentFactory
from .interfaces import IAgentFactory, ISessionStore
from .jsonrpc import AuthRequired, InvalidParams, JSONRPCConnection, Reply
from .lifecycle import Lifecycle
from .mcp.registry import MCPServers
from .mcp.signin import SignIns
from .mcp.tokens import TokenStore
from .mcp.specs import ConfiguredServers, configFile
from .naming import SessionNamer
from .options import SessionOptions
from .params import field, lenientObject
from .permissions import PermissionBroker
from .render import Renderer
from .rewind import Rewinds
from .session_state import SessionState
from .sight import Sight
from .skillcommands import SkillCommands, skillLibrary
from .threads import WorkerPool
from .turns import ANSWERED, Prompts, TurnServices
from .updates import UpdateChannel

if TYPE_CHECKING:
    from .engine.checkpoints import CheckpointStore

log = Logger()

PROTOCOL_VERSION = 1
SETUP_METHOD_ID = "hermes-setup"
AGENT_INFO = {"name": "hermes-acp", "title": "Hermes ACP", "version": __version__}
#: On shutdown, how long running turns get to answer "cancelled".
SHUTDOWN_GRACE = 1.0
#: On shutdown, how long MCP servers get to exit after their stdin closes.
MCP_STOP_GRACE = 1.5


class ACPServer:
    """What one editor connection talks to."""

    def __init__(
        self,
        reactor: Any,
        settings: Settings,
        store: ISessionStore,
        workers: WorkerPool,
        endpointSource: Callable[[], Endpoint] = resolveEndpoint,
        agentFactory: IAgentFactory | None = None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.store = store
        self.workers = workers
        self.endpointSource = endpointSource
        #: Every session's background processes (the engine's side); their cards are wired per connection.
        self.background = BackgroundProcesses(BackgroundLimits(
            settings.backgroundProcesses, settings.backgroundOutput, settings.backgroundTotal))
        self.skills = skillLibrary(settings, commandNames())
        self.agentFactory = agentFactory or EngineAgentFactory(endpointSource, store.searchNow, settings,
                                                               background=self.background, skills=self.skills)
        self.client = ClientInfo()
        self._checkpoints: CheckpointStore | None = None
        self.loggedOut = False
        self._warm = False
        self._prompts: Prompts | None = None
        self._mcp: MCPServers | None = None

    def buildProtocol(self) -> JSONRPCConnection:
        """The connection, with every part wired to the parts it uses."""
        requests: dict[str, Any] = {"initialize": self.initialize, "authenticate": self.authenticate, "logout": self.logout}
        notifications: dict[str, Any] = {}
        connection = JSONRPCConnection(requests, notifications, self.reactor, self.settings.maxLine)
        store, reactor, client = self.store, self.reactor, self.client
        updates = UpdateChannel(connection, store, client)
        catalog = ModelCatalog(self.endpointSource, self.workers.run, fetchModels, clock=reactor,
                               defaultWindow=self.settings.contextWindow, sight=Sight.parse(self.settings.modelVision))
        options = SessionOptions(store, updates, catalog, self.agentFactory)
        catalog.onChange = options.modelsChanged
        permissions = PermissionBroker(connection.callRemote, reactor, self.settings.permissionTimeout)
        mcp = MCPServers(reactor, self.settings, updates, client, ConfiguredServers(configFile(hermesHome())))
        mcp.signIns = SignIns(reactor, self.settings, client, TokenStore.default(), connection, mcp.signedIn)
        skills = SkillCommands(self.skills, reactor, updates, availableCommands(), extra=mcp.promptCommands)
        mcp.baseCommands = skills.listed  # one list for the editor: the agent's, the skills', the prompts'
        rewinds = Rewinds(store, updates, permissions, catalog, self.workers.run, self.checkpointStore)
        commands = Commands(options, store, updates, catalog, client, self.endpointSource, self.settings, mcp,
                            background=self.background, skills=skills, rewinds=rewinds)
        background = BackgroundCards(reactor, store, updates, self.background)

        def workspaceFor(state: SessionState, request: Callable[..., Deferred[Any]]) -> ClientWorkspace:
            return ClientWorkspace(reactor, state.sessionId, request, readFiles=client.fs("readTextFile"),
                                   writeFiles=client.fs("writeTextFile"), terminals=client.terminal)

        prompts = Prompts(TurnServices(
            reactor, store, options, updates, permissions, self.workers.run, commands, workspaceFor,
            lambda state: Renderer(state.cwd), self.requireAuthenticated, catalog,
            connection.callRemote, mcp, SessionNamer(self.workers.run, updates, store, self.settings.titleSeconds),
            client, self.settings.permissionTimeout, background=background, skills=skills,
            checkpoints=self.checkpointStore,
        ))  # fmt: skip
        lifecycle = Lifecycle(store, options, updates, catalog, prompts.cancelAll, self.requireAuthenticated, mcp,
                              background=background, skills=skills, forgetFiles=rewinds.forgetSession,
                              turnsSaved=prompts.saved)

        def forgotten(state: SessionState) -> None:
            options.forget(state)
            permissions.forget(state.sessionId)
            prompts.forget(state)
            mcp.detach(state)
            background.forget(state)

        def storage(state: SessionState, severity: str, title: str, description: str) -> None:
            """Whether the session's work is saved: a notice, for an editor that knows the
            session; as text only in a turn (outside one, a prompt's answer tells it), and not
            after its answer (a cancelled one is saved after it)."""
            queue = prompts.queues.get(state.sessionId)
            inTurn = queue is not None and queue.running is not None and queue.running.phase != ANSWERED
            if (client.notices and state.announced) or inTurn:
                updates.notice(state, severity, title, description, journal=False)

        store.onForget = forgotten
        store.onStorage = storage
        requests.update(lifecycle.handlers())
        requests.update(prompts.handlers())
        notifications.update(prompts.notifications())
        connection.onInputEnded = prompts.cancelEverything
        self._prompts, self._mcp = prompts, mcp
        return connection

    def checkpointStore(self) -> CheckpointStore | None:
        """The process's checkpoints of session folders (``/rewind``), made when a turn or a
        rewind first needs them (their module is not on the start-up path); None when
        ``HERMES_ACP_CHECKPOINTS=off``. Called on the reactor thread."""
        if self._checkpoints is None and self.settings.checkpoints:
            from .engine.checkpoints import CheckpointStore, Limits

            settings = self.settings
            self._checkpoints = CheckpointStore(hermesHome() / "checkpoints", Limits(
                settings.checkpointStoreMax, settings.checkpointFileMax, settings.checkpointMaxFiles))
        return self._checkpoints

    # -- initialize and auth ---------------------------------------------

    def initialize(self, params: dict[str, Any]) -> Reply:
        """The handshake, answered once the engine is imported (``warmUp``)."""
        requested = field(params, "protocolVersion", int)
        if requested != PROTOCOL_VERSION:
            log.debug("client asked for protocol {v}; answering {ours}", v=requested, ours=PROTOCOL_VERSION)
        self.client.update(lenientObject(params, "clientCapabilities"), lenientObject(params, "clientInfo"))
        self.warmUp()
        return Reply({
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": self.agentCapabilities(),
            "authMethods": self.authMethods(),
            "agentInfo": dict(AGENT_INFO),
        }, self._warmStore)

    @property
    def imagesSeen(self) -> bool:
        """Whether a prompt's images can reach the model: not with ``HERMES_ACP_MODEL_VISION=off``
        (``vision_analyze`` reads files and data URLs, not a prompt's attachments)."""
        return Sight.parse(self.settings.modelVision).maybe

    def agentCapabilities(self) -> dict[str, Any]:
        """Only what works end to end at this version."""
        return {
            "loadSession": True,
            "promptCapabilities": {"image": self.imagesSeen, "audio": False, "embeddedContext": True},
            "mcpCapabilities": {"http": True, "sse": True},
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
                    "description": f"Model {endpoint.model} at {endpoint.shownURL}, "
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

    def warmUp(self) -> None:
        """Import the engine (what the first prompt would otherwise wait for) before
        ``initialize`` is answered, on the reactor: the editor waits for that answer before
        it sends anything else. Imported after the answer, on a worker, its 40-60 ms of
        Python holding the GIL ran beside the first ``session/new`` and prompt, whose every
        step on the reactor (and every statement of the database's first opening) then waited
        up to the interpreter's switch interval (5 ms) for it: the first ``session/new`` took
        four to six times as long, and the first prompt waited for the rest of the import
        (docs/performance.md). A failure is logged and left for the first prompt to report."""
        if self._warm:
            return
        self._warm = True
        try:
            _importEngine()
        except Exception:
            log.failure("preloading the engine failed")

    def _warmStore(self) -> None:
        """Once ``initialize`` is answered: state.db opens on its thread (the first
        ``session/new`` need not wait for it) and, for an HTTPS endpoint, a worker loads the
        certificate store (about 50 ms; the first prompt need not wait for it)."""
        self.store.warm()
        if (self.endpointSource().baseURL or "").startswith("https:"):
            self.workers.run(_tlsContext).addErrback(lambda f: log.failure("loading the certificates failed", f))

    # -- shutdown ----------------------------------------------------------

    def shutdown(self) -> Deferred[Any]:
        """Cancel every turn, give them a moment to answer, then stop the MCP
        servers and flush state."""
        d = self._prompts.cancelEverything() if self._prompts is not None else succeed(None)
        d.addTimeout(SHUTDOWN_GRACE, self.reactor)
        d.addErrback(lambda f: log.warn("turns still running at shutdown"))
        d.addCallback(lambda _: self._stopServers())
        d.addCallback(lambda _: self.store.close())
        return d

    def _stopServers(self) -> Deferred[Any]:
        """Every MCP server, within MCP_STOP_GRACE (the rest are killed with the commands)."""
        if self._mcp is None:
            return succeed(None)
        d = self._mcp.stopAll()
        d.addTimeout(MCP_STOP_GRACE, self.reactor)
        return d.addErrback(lambda f: log.warn("MCP servers still stopping at shutdown; they are killed"))


def fetchModels(endpoint: Endpoint) -> list[tuple[str, int | None]]:
    """The endpoint's model list with their windows (in a worker thread; imports the model client then)."""
    from .engine.model import listModels

    return listModels(endpoint)


def _importEngine() -> None:
    """What the first prompt would otherwise wait for: the engine's modules, loaded for good
    (``collector``). Once a process: a later warm-up (another connection's) would freeze that
    connection's sessions, which can end."""
    if "hermes_acp.engine.agent" in sys.modules:
        return
    with loadingForGood():
        from .engine import agent  # noqa: F401


def _tlsContext() -> None:
    """The model client's certificate store, loaded ahead of the first request."""
    from .engine.chat_http import tlsContext

    tlsContext()
