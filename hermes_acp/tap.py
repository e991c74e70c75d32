"""One ``Options`` and one ``makeService`` for every entry point.

``twist hermes-acp``, the ``hermes-acp`` script and ``python -m hermes_acp``
all build the service here.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred
from twisted.python import usage

from . import __version__
from .collector import loadingForGood
from .headless import PromptOptions
from .mcp.terminal import MCPOptions

#: Exit statuses (sysexits.h): a setting hermes-acp cannot use; a shutdown that hung.
EX_CONFIG, EX_SOFTWARE = 78, 70
#: Once shutdown begins, the most it may take before the process exits anyway:
#: longer than state.db's busy timeout (10 s), so a last journal write that waits
#: for another process's lock is not cut off.
SHUTDOWN_DEADLINE = 15.0


class Options(usage.Options):
    synopsis = (
        "[--check | --setup [--provider P] [--api-key KEY] [--model M] [--base-url URL]] "
        "[--trace FILE] [--log-level LEVEL] [--version] [--help] [prompt ... | mcp login|logout NAME]"
    )
    longdesc = (
        "Serve the Agent Client Protocol on stdin/stdout for a code editor. "
        "Configuration comes from $HERMES_HOME/.env (default ~/.hermes/.env) and the environment. "
        "`hermes-acp prompt TEXT` runs one prompt headless (see `hermes-acp prompt --help`); "
        "`hermes-acp mcp login NAME` signs in to an OAuth MCP server."
    )
    subCommands = [["prompt", None, PromptOptions, "Run one prompt against a fresh agent and print the answer."],
                   ["mcp", None, MCPOptions, "Sign in to (login NAME) or out of (logout NAME) an OAuth MCP server."]]
    optFlags = [
        ["check", None, "Print the resolved configuration and exit (1 when something is missing)."],
        ["setup", None, "Choose a model provider, key and default model; write $HERMES_HOME/.env."],
    ]
    optParameters = [
        ["provider", None, None, "With --setup: openrouter, openai, nous or custom."],
        ["base-url", None, None, "With --setup: the OpenAI-compatible base URL (custom providers)."],
        ["api-key", None, None, "With --setup: the API key."],
        ["model", None, None, "With --setup: the default model."],
        ["log-level", None, None, "Log level on stderr: debug, info (the default), warn, error or critical."],
        ["trace", None, None, "Append every JSON-RPC frame in and out to FILE as JSON lines (secrets redacted)."],
    ]

    def opt_version(self) -> None:
        """Print the version and exit."""
        print(f"hermes-acp {__version__}")
        sys.exit(0)

    def getSynopsis(self) -> str:
        return f"Usage: hermes-acp {self.synopsis}"

    def postOptions(self) -> None:
        from .logs import parseLevel

        try:
            self["logLevel"] = parseLevel(self["log-level"] or "info")
        except ValueError as e:
            raise usage.UsageError(str(e))
        setupOnly = [name for name in ("provider", "base-url", "api-key", "model") if self[name]]
        if setupOnly and not self["setup"]:
            raise usage.UsageError(f"--{setupOnly[0]} only goes with --setup")
        if self["trace"] in ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
            raise usage.UsageError("--trace needs a file: stdout carries the protocol")
        if self.subCommand and (self["check"] or self["setup"]):
            raise usage.UsageError(f"--{'check' if self['check'] else 'setup'} does not go with {self.subCommand}")


def runTerminalCommand(options: Options) -> int | None:
    """Run ``--check`` or ``--setup`` if asked; their exit code, else None."""
    from .config import loadDotenv

    if options["setup"]:
        from .setup_wizard import runSetup

        code = runSetup(options, sys.stdout, sys.stderr, interactive=sys.stdin.isatty())
        if code != 0 or not options["check"]:
            return code
    if options["check"]:
        from .check import runCheck

        loadDotenv()
        return runCheck(sys.stdout)
    return None


def makeService(options: Options, onDone: Callable[[], None] | None = None) -> IService:
    """The agent service; ``onDone`` runs when the editor closes the connection."""
    from twisted.internet import reactor
    from twisted.internet.error import ReactorNotRunning

    with loadingForGood():
        from .acp import ACPServer
        from .config import ConfigError, Settings, loadDotenv, stateDatabase
        from .logs import bridgeStdlibLogging, prepareEvents
        from .sessions import SessionManager
        from .stdio import StdioService, claimStdio
        from .threads import WorkerPool
        from .trace import TraceError, openTrace

    if options.subCommand:
        sys.stderr.write(f"hermes-acp: run `hermes-acp {options.subCommand} ...` from a terminal, not as a service\n")
        sys.exit(64)
    code = runTerminalCommand(options)
    if code is not None:
        sys.exit(code)
    loadDotenv()
    prepareEvents()
    bridgeStdlibLogging()
    try:
        settings = Settings.fromEnv()
    except ConfigError as e:
        sys.stderr.write(f"hermes-acp: {e}\n")
        sys.exit(EX_CONFIG)
    trace = None
    if options["trace"]:
        try:
            trace = openTrace(options["trace"], claimStdio().stdout)
        except TraceError as e:
            sys.stderr.write(f"hermes-acp: {e}\n")
            sys.exit(64)

    def stopReactor() -> None:
        try:
            reactor.stop()
        except ReactorNotRunning:
            pass  # already stopping (SIGTERM, or twist's own shutdown)

    reactor.callWhenRunning(installSignalHandlers, reactor)
    reactor.addSystemEventTrigger("before", "shutdown", armWatchdog)
    sessions = SessionManager(reactor, stateDatabase())
    workers = WorkerPool(reactor, settings.threads)
    server = ACPServer(reactor, settings, sessions, workers)

    def buildProtocol() -> Any:
        connection = server.buildProtocol()
        connection.trace = trace
        return connection

    top = OrderedService()
    # Services stop in reverse order, each after the one before has finished: the
    # connection, then running turns and the journal, then the worker threads,
    # and the database thread last.
    sessions.dbThread.setServiceParent(top)
    workers.setServiceParent(top)
    ShutdownHook(endCommands).setServiceParent(top)  # after the turns were cancelled
    ShutdownHook(server.shutdown).setServiceParent(top)
    if trace is not None:
        ShutdownHook(trace.close).setServiceParent(top)  # stops after the connection
    StdioService(buildProtocol, onDone or stopReactor, reactor).setServiceParent(top)
    return top


def endCommands(wait: bool = True) -> None:
    """End every process the agent's commands left behind (none were started
    when the engine never loaded its process module). Another thread may be
    importing it right now: ``import_module`` waits for that import to finish
    instead of finding the module half made; the watchdog, which may run while the
    reactor imports the engine for ``initialize``, never waits (``wait=False``: a
    half-made module has started nothing)."""
    name = "hermes_acp.engine.processes"
    if name in sys.modules:
        endAll = getattr(importlib.import_module(name) if wait else sys.modules[name], "endAll", None)
        if endAll is not None:
            endAll()


def installSignalHandlers(reactor: Any) -> None:
    """SIGINT and SIGTERM stop the agent, also when they arrived ignored (a
    background job of a script, ``nohup``): Twisted leaves an ignored SIGINT
    ignored, and an agent nobody can interrupt is an orphan waiting to happen."""
    signal.signal(signal.SIGINT, reactor.sigInt)
    signal.signal(signal.SIGTERM, reactor.sigTerm)


def armWatchdog(seconds: float = SHUTDOWN_DEADLINE) -> None:
    """Once shutdown begins, the process is gone within ``seconds`` whatever
    hangs (a stuck thread, an unflushable pipe)."""

    def expired() -> None:
        os.write(2, f"hermes-acp: shutdown did not finish within {seconds:g} s; exiting now\n".encode())
        try:
            endCommands(wait=False)
        finally:
            os._exit(EX_SOFTWARE)

    timer = threading.Timer(seconds, expired)
    timer.daemon = True
    timer.start()


class OrderedService(MultiService):
    """Stops its children one after another in reverse order, each waiting for the
    one before (``MultiService`` stops them all at once)."""

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        return Deferred.fromCoroutine(self._stopInOrder())

    async def _stopInOrder(self) -> None:
        from twisted.internet.defer import maybeDeferred
        from twisted.logger import Logger

        for service in reversed(list(self)):
            try:
                await maybeDeferred(service.stopService)
            except Exception:
                Logger().failure("stopping {service} failed", service=service)


class ShutdownHook(Service):
    """Runs a clean-up (returning a Deferred) when the service stops."""

    def __init__(self, hook: Callable[[], object]) -> None:
        self.hook = hook

    def stopService(self) -> object:
        Service.stopService(self)
        return self.hook()
