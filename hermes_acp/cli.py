"""The ``hermes-acp`` console script (also ``python -m hermes_acp``)."""

from __future__ import annotations

import os
import sys

from twisted.python import usage

from .collector import loadingForGood


def importReactor() -> None:
    """Import the reactor without pyOpenSSL (about 0.1 s and 12 MiB less; docs/performance.md).

    Twisted's reactor imports pyOpenSSL at once wherever it is installed, only to offer
    ``connectSSL``, ``listenSSL`` and ``startTLS``, which the agent never uses. HTTPS still
    works: ``twisted.web``'s Agent (HTTPS MCP servers) wraps its connections in TLS itself
    (``wrapClientTLS``), importing pyOpenSSL when it first needs it; the model client is
    ``http.client`` with ``ssl``."""
    if "twisted.internet.reactor" in sys.modules or "OpenSSL" in sys.modules:
        return
    sys.modules["OpenSSL"] = None  # type: ignore[assignment]  # an import of it fails, for now
    try:
        from twisted.internet import reactor  # noqa: F401
    finally:
        if sys.modules.get("OpenSSL", False) is None:
            del sys.modules["OpenSSL"]


def main(argv: list[str] | None = None) -> None:
    with loadingForGood():
        importReactor()
        from .tap import Options, makeService, runTerminalCommand

    options = Options()
    try:
        options.parseOptions(sys.argv[1:] if argv is None else argv)
    except usage.UsageError as e:
        # A mistake after `prompt` is explained with the prompt command's own usage.
        shown = options.subOptions if options.subCommand else options
        sys.stderr.write(f"hermes-acp: {e}\n{shown}")
        sys.exit(64)
    except BrokenPipeError:  # `hermes-acp --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    if options.subCommand == "prompt":  # a client of the agent: its stdout is for people
        from .headless import runPrompt

        sys.exit(runPrompt(options, options.subOptions))
    if options.subCommand == "mcp":  # a terminal command: the link on stderr, the outcome on stdout
        from .mcp.terminal import runMCPCommand

        sys.exit(runMCPCommand(options.subOptions))
    code = runTerminalCommand(options)
    if code is not None:
        sys.exit(code)

    from twisted.internet import task
    from twisted.internet.defer import Deferred

    from .config import loadDotenv
    from .logs import startLogging
    from .stdio import claimStdio

    claimStdio()
    loadDotenv()  # first: the log observer takes its list of secrets to redact from the environment
    startLogging(options["logLevel"])

    async def run(reactor: object) -> None:
        finished: Deferred[None] = Deferred()
        service = makeService(options, onDone=lambda: finished.called or finished.callback(None))
        service.startService()
        reactor.addSystemEventTrigger("before", "shutdown", service.stopService)  # type: ignore[attr-defined]
        await finished

    task.react(run)
