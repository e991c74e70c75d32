"""``hermes-acp mcp login NAME`` and ``hermes-acp mcp logout NAME``, from a terminal.

For editors that show neither URL elicitations nor notices (or when the agent runs
where the editor's browser cannot reach): the link is printed on stderr, the
command waits (at most ``HERMES_ACP_MCP_LOGIN_TIMEOUT``) for the browser's redirect
on its own loopback listener, and stores the token where the agent finds it
(``$HERMES_HOME/mcp-tokens/``, by the server's URL). The server is config.yaml's
``mcp_servers.NAME``, or the one ``--url`` names (a server the editor lists).
"""

from __future__ import annotations

import sys
from typing import IO, Any

from twisted.python import usage

#: After the sign-in, how long the browser's page gets to go out before the command exits.
PAGE_FLUSH = 0.2


class _ServerOptions(usage.Options):
    optParameters = [["url", None, None, "The server's URL (default: config.yaml's mcp_servers.NAME.url)."]]

    def parseArgs(self, name: str) -> None:
        self["name"] = name

    def getSynopsis(self) -> str:
        return f"Usage: hermes-acp mcp {self.verb} [--url URL] NAME"


class LoginOptions(_ServerOptions):
    verb = "login"
    longdesc = "Sign in to an OAuth MCP server: open the printed link; the token is stored for the agent."


class LogoutOptions(_ServerOptions):
    verb = "logout"
    longdesc = "Remove the stored token of an MCP server."


class MCPOptions(usage.Options):
    synopsis = "login NAME | logout NAME"
    subCommands = [["login", None, LoginOptions, LoginOptions.longdesc],
                   ["logout", None, LogoutOptions, LogoutOptions.longdesc]]

    def getSynopsis(self) -> str:
        return f"Usage: hermes-acp mcp {self.synopsis}"

    def postOptions(self) -> None:
        if not self.subCommand:
            raise usage.UsageError("say login NAME or logout NAME")


def _server(options: _ServerOptions) -> tuple[Any, str | None]:
    """The server's spec, or None and why not."""
    from ..config import hermesHome
    from .specs import HTTP, ServerSpec, configFile, parseConfig

    name = options["name"]
    if options["url"]:
        if not options["url"].startswith(("http://", "https://")):
            return None, f"--url must be an http:// or https:// URL, not {options['url']!r}"
        return ServerSpec(name, HTTP, url=options["url"]), None
    path = configFile(hermesHome())
    specs, _ = parseConfig(path) if path.exists() else ([], [])
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        return None, f"no MCP server {name!r} in {path}; give its URL with --url"
    if spec.transport != HTTP:
        return None, f"MCP server {name!r} is not an HTTP server: it takes its credentials from its environment"
    return spec, None


def runMCPCommand(options: MCPOptions, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    from ..config import ConfigError, Settings, loadDotenv
    from .tokens import TokenStore

    loadDotenv()
    sub = options.subOptions
    spec, problem = _server(sub)
    if spec is None:
        err.write(f"hermes-acp mcp {options.subCommand}: {problem}\n")
        return 64
    store = TokenStore.default()
    from .oauth import OAuthClient

    if options.subCommand == "logout":
        had = OAuthClient(None, store, spec.url).forget()
        out.write(f"Signed out of {spec.name}.\n" if had else f"{spec.name} had no stored sign-in.\n")
        return 0
    try:
        settings = Settings.fromEnv()
    except ConfigError as e:
        err.write(f"hermes-acp: {e}\n")
        return 78
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred

    result: list[int] = []

    async def login() -> None:
        result.append(await _login(reactor, spec, store, settings, out, err))

    def run() -> None:
        d = Deferred.fromCoroutine(login())
        d.addErrback(lambda f: (err.write(f"hermes-acp mcp login: {f.getErrorMessage()}\n"), result.append(1)))
        # A moment for the browser's page to go out: a stopping reactor drops what it has not sent.
        d.addBoth(lambda _: reactor.callLater(PAGE_FLUSH, reactor.stop))

    reactor.callWhenRunning(run)
    reactor.run(installSignalHandlers=True)
    return result[0] if result else 1


async def _login(reactor: Any, spec: Any, store: Any, settings: Any, out: IO[str], err: IO[str]) -> int:
    from .login import signIn
    from .oauth import OAuthClient, OAuthError, parseChallenge

    oauth = OAuthClient(reactor, store, spec.url, dict(spec.oauth), timeout=settings.mcpStartupTimeout)
    status, challenge = await _challenge(oauth)
    if status < 400:
        out.write(f"{spec.name} ({spec.where}) answered without asking for a sign-in; nothing to do.\n")
        return 0
    timeout = settings.mcpLoginTimeout

    def show(url: str) -> None:
        err.write(f"Open this link in your browser to sign in to MCP server {spec.name} ({spec.where}):\n\n"
                  f"  {url}\n\nWaiting for the sign-in (at most {timeout:g} s)...\n")
        err.flush()

    try:
        await signIn(oauth, reactor, parseChallenge(challenge), show, timeout,
                     port=int(oauth.configured.get("redirect_port") or 0))
    except OAuthError as e:
        err.write(f"hermes-acp mcp login: the sign-in did not finish: {e}\n")
        return 1
    out.write(f"Signed in to {spec.name}; the token is stored in {store.folder} for the agent.\n")
    return 0


async def _challenge(oauth: Any) -> tuple[int, list[str]]:
    """What the server says to a request without a token: its status and ``WWW-Authenticate``."""
    from twisted.web.http_headers import Headers

    from .http import ACCEPT, _Body

    body = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",' \
           b'"capabilities":{},"clientInfo":{"name":"hermes-acp","version":"login"}}}'
    headers = Headers({b"accept": [ACCEPT.encode()], b"content-type": [b"application/json"]})
    from twisted.web.client import Agent

    oauth.agent = oauth.agent or Agent(oauth.reactor, connectTimeout=10)
    d = oauth.agent.request(b"POST", oauth.url.encode("ascii", "ignore"), headers, _Body(body))
    d.addTimeout(oauth.timeout, oauth.reactor)
    response = await d
    response.deliverBody(_Discard())
    return response.code, response.headers.getRawHeaders("www-authenticate") or []


class _Discard:
    def makeConnection(self, transport: Any) -> None:
        transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Any) -> None:
        pass
