"""One MCP server of one session: started, shaken hands with, listed, called, stopped.

The handshake is the legacy era's ``initialize`` first (what nearly every
server speaks); a server that refuses it is asked ``server/discover``, and
one that answers that speaks the modern era (2026-07-28) from then on: every
request carries the ``_meta`` envelope, results carry ``resultType``. A server
that ends, or whose handshake fails or times out, is ``failed`` with a reason
the user can act on (with the tail of its stderr); the link reports every
change of state or tools to ``onChange``.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, TimeoutError, fail, maybeDeferred
from twisted.internet.error import ConnectionDone, ConnectionLost, ProcessDone, ProcessTerminated
from twisted.logger import Logger
from twisted.python.failure import Failure

from .. import __version__
from ..config import Settings
from ..engine.secrets import redact
from ..jsonrpc import InvalidParams, RemoteError
from ..oneshot import OneShot
from . import toolset
from .specs import HTTP, SSE, STDIO, ServerSpec
from .wire import CallFailed, MCPConnection, TransportError

if TYPE_CHECKING:  # imported with the first server of their kind
    from .http import HTTPChannel
    from .oauth import OAuthClient
    from .sse import SSEChannel
    from .stdio import StdioServer

log = Logger()

LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MODERN_VERSION = "2026-07-28"
CLIENT_INFO = {"name": "hermes-acp", "version": __version__}
CAPABILITIES: dict[str, Any] = {"roots": {"listChanged": False}}
STARTING, READY, FAILED, STOPPED = "starting", "ready", "failed", "stopped"
#: An OAuth server that wants the user to sign in (its tools are absent until then).
NEEDS_LOGIN = "needs login"
#: The most sign-ins a server's 403 ``insufficient_scope`` starts (per link).
MAX_STEP_UPS = 2
#: A refresh that could not reach the authorization server is tried again this much later.
REFRESH_RETRY = 30.0
#: The most ``tools/list`` pages read from one server.
MAX_PAGES = 100
#: A stdio server that closed its output gets this long to exit (its exit status is the better reason).
END_WAIT = 1.0
#: Progress can keep a call alive this many call timeouts at most.
HARD_CAP_FACTOR = 10
#: A server's log messages (``notifications/message``): this many are logged at once, then this
#: many a second; the rest are counted, and the count is logged with the next one (or at its stop).
LOG_BURST = 20
LOG_RATE = 2.0

_tokens = itertools.count(1)
_ENDED = (ConnectionDone, ConnectionLost, ProcessDone, ProcessTerminated)


def _logged(d: Deferred[Any], doing: str) -> Deferred[Any]:
    """A Deferred nobody waits for: its failure is logged, never left unhandled."""
    return d.addErrback(lambda f: log.failure("{doing} failed", f, doing=doing))


@attrs.define(eq=False)
class ServerLink:
    """One server, owned by one session."""

    spec: ServerSpec
    reactor: Any
    settings: Settings
    #: The session's folders (its roots, for ``roots/list``), the first is where stdio servers start.
    folders: tuple[str, ...]
    onChange: Callable[[ServerLink], None]
    state: str = STARTING
    reason: str = ""
    era: str | None = None
    version: str | None = None
    tools: list[dict[str, Any]] = attrs.Factory(list)
    instructions: str | None = None
    connection: MCPConnection = attrs.field(init=False)
    channel: StdioServer | HTTPChannel | SSEChannel = attrs.field(init=False)
    #: Its prompts (``prompts/list``, bounded by the setting), and whether it offers resources.
    prompts: list[dict[str, Any]] = attrs.Factory(list)
    hasResources: bool = False
    _progress: dict[str, Callable[[dict[str, Any]], None]] = attrs.Factory(dict)
    _settled: OneShot[None] = attrs.Factory(OneShot)
    #: Why some of its tools are not offered (``toolset.accepted``).
    leftOut: list[str] = attrs.Factory(list)
    _hasTools: bool = False
    _reconnecting: OneShot[None] | None = None
    #: The lists (tools, prompts) being read again after a list_changed: whether it changed again meanwhile.
    _relisting: dict[str, bool] = attrs.Factory(dict)
    _hasPrompts: bool = False
    _logAllowance: float = LOG_BURST
    _loggedAt: float = 0.0
    _logDropped: int = 0
    #: The ``elicitation/create`` modes the server is told it may use: those the editor
    #: takes (none: the server is not told it may ask, and its questions are refused).
    elicitation: tuple[str, ...] = ()
    #: The running calls that can put a server's question to the user, latest last.
    _askers: list[Callable[[dict[str, Any]], Deferred[dict[str, Any]]]] = attrs.Factory(list)
    #: OAuth for an HTTP server the editor gave no Authorization header for (``oauth``);
    #: the last challenge it sent, and the scopes a step-up asks on top.
    oauth: OAuthClient | None = None
    challenge: dict[str, str] = attrs.Factory(dict)
    stepUp: tuple[str, ...] = ()
    #: Whether the user is to be taken to a sign-in unasked (not after signing out).
    offerSignIn: bool = False
    _stepUps: int = 0
    _refreshTimer: Any = None

    def __attrs_post_init__(self) -> None:
        requests: dict[str, Any] = {"ping": lambda params: {}, "roots/list": self._roots}
        if self.elicitation:
            requests["elicitation/create"] = self._elicit
        self.connection = MCPConnection(
            self.spec.name,
            requests,
            {"notifications/progress": self._progressed,
             "notifications/tools/list_changed": lambda params: self.toolsChanged(),
             "notifications/prompts/list_changed": lambda params: self.promptsChanged(),
             "notifications/resources/list_changed": lambda params: self._resourcesChanged(),
             "notifications/message": self._logMessage},
            self.reactor, self.settings.maxLine)
        self.connection.onInputEnded = self._outputClosed
        self.connection.onOverrun = self._notReading
        if self.spec.transport == SSE:
            from .sse import SSEChannel

            self.channel = SSEChannel(self.spec, self.reactor, self.connection, self.settings.maxLine,
                                      self.settings.mcpHTTPConnections)
            self.channel.onEnded = lambda reason: self.fail(reason) if self.state in (STARTING, READY) else None
            self.connection.makeConnection(self.channel)
        elif self.spec.transport != STDIO:
            from .http import HTTPChannel

            self.channel = HTTPChannel(self.spec, self.reactor, self.connection, self.settings.maxLine,
                                       self.settings.mcpHTTPConnections)
            if self.oauth is not None:
                self.channel.bearer = self.oauth.bearer
            self.connection.makeConnection(self.channel)
        else:
            from .stdio import StdioServer

            self.channel = StdioServer(self.spec, self.reactor, self.connection, self.folders[0])

    # -- starting ------------------------------------------------------------------

    def whenSettled(self) -> Deferred[None]:
        """Fires once the start is over (ready or failed)."""
        return self._settled.when()

    def start(self) -> Deferred[None]:
        """Connect in the background, within the startup bound; never fails."""
        d = Deferred.fromCoroutine(self._start())
        d.addTimeout(self.settings.mcpStartupTimeout, self.reactor)
        d.addErrback(self._startFailed)
        d.addBoth(lambda _: self._settled.fire(None))
        return d

    async def _start(self) -> None:
        if self.spec.transport == STDIO:
            self.channel.start()
            self.channel.process.whenEnded().addCallback(lambda _: self._ended())
        elif self.spec.transport == SSE:
            await self.channel.connect()
        await self._authorized(self._handshake)
        await self._listTools()
        try:
            await self._listPrompts()
        except (RemoteError, CallFailed) as e:  # its tools still work
            log.warn("MCP server {name}: its prompts could not be listed: {e}", name=self.spec.name,
                     e=self.describe(e))
        if self.spec.transport != STDIO:
            self.channel.listen()
        if self.state == STARTING:
            self.state = READY
            self._armRefresh()
            log.debug("MCP server {name} ready: {era} era ({version}), {n} tool(s)", name=self.spec.name,
                     era=self.era, version=self.version, n=len(self.tools))
            self.onChange(self)

    def _startFailed(self, failure: Failure) -> Deferred[None] | None:
        if self.state != STARTING or self._signInWanted(failure.value):
            return None
        if failure.check(TimeoutError, CancelledError):
            reason = f"no answer to the handshake within {self.settings.mcpStartupTimeout:g} s"
        elif failure.check(*_ENDED) and self.spec.transport == STDIO and not self.channel.process.ended:
            # Its output closed: the process is ending, and its exit status says more.
            ended = self.channel.process.whenEnded()
            ended.addTimeout(END_WAIT, self.reactor)
            return ended.addBoth(lambda _: self.fail(self._endReason()))
        else:
            reason = self.describe(failure.value)
        self.fail(reason)
        return None

    def fail(self, reason: str) -> None:
        """Mark the server failed (once), tell the owner, and stop what is left of it."""
        if self.state in (FAILED, STOPPED):
            return
        self._cancelRefresh()
        tail = self.channel.stderrTail if self.spec.transport == STDIO else ""
        reason += f"\n\nIts last words on stderr:\n{tail}" if tail else ""
        self.state, self.reason = FAILED, redact(reason, self.spec.secrets)
        log.warn("MCP server {name} ({where}) failed: {reason}", name=self.spec.name, where=self.spec.where,
                 reason=self.reason)
        self.onChange(self)
        _logged(Deferred.fromCoroutine(self._shutDown()), f"stopping MCP server {self.spec.name}")

    def describe(self, error: BaseException) -> str:
        if isinstance(error, RemoteError):
            return f"it answered with an error: {error.message} ({error.code})"
        if isinstance(error, _ENDED):
            return self._endReason()
        if isinstance(error, OSError):
            return f"it could not be started: {error}"
        return str(error) or type(error).__name__

    def _endReason(self) -> str:
        if self.spec.transport == STDIO:
            ended = self.channel.describeEnd() if self.channel.process.ended else "closed its output"
            return f"the process ended ({ended})"
        return "the connection closed"

    def _ended(self) -> None:
        """The stdio process is gone: whatever it was doing failed."""
        if self.state in (STARTING, READY):
            self.fail(self._endReason())

    def _notReading(self, waiting: int) -> None:
        """It asks and asks, and reads none of our answers: it is stopped before they fill memory."""
        self.fail(f"it does not read what the agent writes to it ({waiting // 1024} KB of answers to its own "
                  "requests were waiting), so it was stopped")

    def _outputClosed(self) -> None:
        """A stdio server closed its output: nothing it says can reach us any more. It
        fails when its process ends (with that status), or soon anyway."""
        if self.spec.transport != STDIO or self.channel.process.ended:
            return
        ended = self.channel.process.whenEnded()
        ended.addTimeout(END_WAIT, self.reactor)
        ended.addBoth(lambda _: self._ended())

    async def _handshake(self) -> None:
        try:
            result = await self.connection.callRemote("initialize", {
                "protocolVersion": LEGACY_VERSIONS[0], "capabilities": self.capabilities(), "clientInfo": CLIENT_INFO},
                self.settings.mcpStartupTimeout, tellCancel=False)
        except RemoteError as refused:
            await self._discover(refused)
            return
        if not isinstance(result, dict) or result.get("protocolVersion") not in LEGACY_VERSIONS:
            version = result.get("protocolVersion") if isinstance(result, dict) else None
            raise CallFailed(f"it speaks MCP protocol version {version!r}, which this agent does not "
                             f"(it speaks {', '.join(LEGACY_VERSIONS)} and {MODERN_VERSION})")
        self.era, self.version = "legacy", result["protocolVersion"]
        self._adopt(result)
        if self.spec.transport != STDIO:
            self.channel.protocolVersion = self.version
        self.connection.notify("notifications/initialized", {})

    async def _discover(self, refused: RemoteError) -> None:
        self._speakModern(True)  # the probe carries the envelope (and, over HTTP, the headers)
        try:
            result = await self._request("server/discover", {}, self.settings.mcpStartupTimeout)
        except (RemoteError, TransportError, TimeoutError):  # (no answer in time: not modern either)
            self._speakModern(False)
            raise refused from None
        supported = result.get("supportedVersions") if isinstance(result, dict) else None
        if not isinstance(supported, list) or MODERN_VERSION not in supported:
            self._speakModern(False)
            raise CallFailed(f"it refused the handshake ({refused.message}) and offers none of our versions "
                             f"(it offers {supported!r})")
        self.version = MODERN_VERSION
        self._adopt(result)

    def _speakModern(self, modern: bool) -> None:
        self.era = "modern" if modern else None
        if self.spec.transport != STDIO:
            self.channel.protocolVersion, self.channel.modern = (MODERN_VERSION, True) if modern else (None, False)

    def _adopt(self, result: dict[str, Any]) -> None:
        capabilities = result.get("capabilities")
        offers = capabilities if isinstance(capabilities, dict) else {}
        self._hasTools = isinstance(offers.get("tools"), dict)
        self._hasPrompts = isinstance(offers.get("prompts"), dict)
        self.hasResources = isinstance(offers.get("resources"), dict)
        instructions = result.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None

    # -- OAuth -------------------------------------------------------------------------

    async def _authorized(self, step: Callable[[], Any]) -> Any:
        """``step()``; when the server refuses the token (401), it is refreshed and
        ``step`` runs once more (the 401 stands when no refresh is possible: the user is
        asked to sign in)."""
        try:
            return await step()
        except TransportError as e:
            used = self.oauth.bearer() if self.oauth is not None else None
            if e.status != 401 or used is None:
                raise
            refused = e
        from .oauth import OAuthError

        try:
            await self.oauth.refresh(used)
        except OAuthError as e:  # refused, or the authorization server cannot be reached
            log.info("MCP server {name}: no fresh token ({e})", name=self.spec.name, e=str(e))
            raise refused from None
        self._armRefresh()
        return await step()

    def _signInWanted(self, error: BaseException) -> bool:
        """A 401 (no token works) or a 403 ``insufficient_scope`` (a step-up) from a
        server this agent signs in to: the link waits for the user to sign in, its
        tools absent meanwhile. Whether that is what happened."""
        if self.oauth is None or not isinstance(error, TransportError) or error.status not in (401, 403):
            return False
        from .oauth import parseChallenge

        challenge = parseChallenge(error.challenge)
        if error.status == 403:
            if challenge.get("error") != "insufficient_scope" or self._stepUps >= MAX_STEP_UPS:
                return False  # (a step-up that did not help is not tried for ever)
            self._stepUps += 1
            granted = ((self.oauth.record() or {}).get("scope") or "").split()
            # The union of what was granted and what is asked (without a scope in the
            # challenge, the sign-in asks what the server's metadata names now).
            self.stepUp = tuple(dict.fromkeys([*granted, *self.stepUp, *(challenge.get("scope") or "").split()]))
            why = f"it needs more permissions ({challenge.get('scope') or 'a wider scope'}): sign in again"
        else:
            why = "it needs you to sign in" if self.oauth.bearer() is None else "its sign-in expired: sign in again"
        self.challenge = challenge
        self.needsLogin(f"{why} (`/mcp login {self.spec.name}`)")
        return True

    def needsLogin(self, reason: str, offer: bool = True) -> None:
        """No token works: the tools go until the user signs in (to which the user is
        taken, with ``offer``)."""
        self._cancelRefresh()
        self.state, self.reason, self.tools, self.offerSignIn = NEEDS_LOGIN, reason, [], offer
        log.info("MCP server {name} ({where}) needs a sign-in", name=self.spec.name, where=self.spec.where)
        self.onChange(self)

    def signedIn(self) -> Deferred[None]:
        """The user signed in (here or elsewhere): connect again with the new token."""
        if self.state != NEEDS_LOGIN:
            return self.whenSettled()
        self.state, self.reason, self.stepUp = STARTING, "", ()
        self._settled = OneShot()  # a prompt now waits for this start, as for the first
        if self.spec.transport == HTTP:  # a new sign-in may be another principal: a new MCP session
            self.channel.sessionId = None
        self.onChange(self)
        return self.start()

    def signedOut(self) -> None:
        """The user signed out: the token is gone, and so are the tools."""
        if self.oauth is not None:
            self.oauth.forget()
        if self.state in (STARTING, READY, NEEDS_LOGIN):
            self.needsLogin(f"signed out (`/mcp login {self.spec.name}` signs in again)", offer=False)

    def _armRefresh(self) -> None:
        """Refresh the token before it expires (and again after each refresh)."""
        self._cancelRefresh()
        due = self.oauth.refreshDue() if self.oauth is not None else None
        if due is not None and self.state in (STARTING, READY):
            self._refreshTimer = self.reactor.callLater(due, self._refreshNow)

    def _cancelRefresh(self) -> None:
        if self._refreshTimer is not None and self._refreshTimer.active():
            self._refreshTimer.cancel()
        self._refreshTimer = None

    def _refreshNow(self) -> None:
        from .oauth import LoginNeeded

        def refused(failure: Failure) -> None:
            if self.state != READY:
                return
            if failure.check(LoginNeeded):
                self.needsLogin(f"{failure.value}: sign in again (`/mcp login {self.spec.name}`)")
                return
            log.warn("MCP server {name}: its token could not be refreshed ({e}); trying again in {s:g} s",
                     name=self.spec.name, e=failure.getErrorMessage(), s=REFRESH_RETRY)
            self._refreshTimer = self.reactor.callLater(REFRESH_RETRY, self._refreshNow)

        d = Deferred.fromCoroutine(self.oauth.refresh())
        d.addCallbacks(lambda _: self._armRefresh(), refused)

    # -- requests ----------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        """What the server is told this client does: roots, and elicitation only in the
        modes that really reach the user."""
        if not self.elicitation:
            return CAPABILITIES
        return {**CAPABILITIES, "elicitation": {mode: {} for mode in self.elicitation}}

    def _request(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Deferred[Any]:
        """A request, with the modern era's envelope when that is what the server speaks."""
        if self.era == "modern":
            meta = dict(params.get("_meta") or {})
            meta.update({"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                         "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
                         "io.modelcontextprotocol/clientCapabilities": self.capabilities()})
            params = {**params, "_meta": meta}
        d = self.connection.callRemote(method, params, timeout)
        return d.addCallback(self._complete, method) if self.era == "modern" else d

    def _complete(self, result: Any, method: str) -> Any:
        kind = result.get("resultType", "complete") if isinstance(result, dict) else "complete"
        if kind != "complete":
            raise CallFailed(f"{method}: the server wants more ({kind!r}), which this agent does not support")
        return result

    async def _withSession(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        """``_request``; when an HTTP server lost our session, shake hands again and retry once
        (a request made while that happens waits for it)."""
        if self._reconnecting is not None:
            await self._reconnecting.when()
        try:
            return await self._authorized(lambda: self._request(method, params, timeout))
        except TransportError as e:
            if not e.sessionLost:
                if self.state == READY and self._signInWanted(e):
                    raise CallFailed(f"{self.spec.name}: {self.reason}") from None
                raise
        if self._reconnecting is not None or getattr(self.channel, "sessionId", None) is None:
            await self._reconnect()
        # else a handshake since this request was sent gave a new session (another request
        # found out first, and its handshake is over): this one only needs sending again
        return await self._request(method, params, timeout)

    async def _reconnect(self) -> None:
        """Shake hands again after an HTTP server forgot our session: once for all the
        requests that found out at the same time."""
        if self._reconnecting is None:
            log.info("MCP server {name} lost our session; connecting again", name=self.spec.name)
            shot = self._reconnecting = OneShot()

            def done(result: Any) -> None:
                self._reconnecting = None
                shot.fire(result)
                if self.spec.transport != STDIO:
                    self.channel.listen()

            Deferred.fromCoroutine(self._handshake()).addBoth(done)
        await self._reconnecting.when()

    async def _listTools(self, timeout: float | None = None) -> None:
        if not self._hasTools:
            self.tools = []
            return
        gathered = toolset.Accepted()
        cursor: Any = None
        unread = False
        for _ in range(MAX_PAGES):
            page = await self._withSession("tools/list", {} if cursor is None else {"cursor": cursor}, timeout)
            if not isinstance(page, dict) or not isinstance(page.get("tools"), list):
                raise CallFailed("its tools/list answer holds no list of tools")
            gathered.add(page["tools"])
            cursor, page = page.get("nextCursor"), None
            if not isinstance(cursor, str) or not cursor:
                break
            if gathered.full:  # more would only be counted: they are not read (nor held)
                unread = True
                break
        self.leftOut = gathered.leftOut(unread)
        self.tools = list({tool["name"]: tool for tool in gathered.kept}.values())
        if self.leftOut:
            log.warn("MCP server {name}: tools left out: {left}", name=self.spec.name, left="; ".join(self.leftOut))

    async def _listPrompts(self, timeout: float | None = None) -> None:
        """``prompts/list``, page by page, at most ``mcpMaxPrompts`` kept (the rest are
        counted and logged): each becomes a slash command."""
        if not self._hasPrompts or not self.settings.mcpMaxPrompts:
            self.prompts = []
            return
        kept: dict[str, dict[str, Any]] = {}
        over, cursor = 0, None
        for _ in range(MAX_PAGES):
            page = await self._withSession("prompts/list", {} if cursor is None else {"cursor": cursor}, timeout)
            if not isinstance(page, dict) or not isinstance(page.get("prompts"), list):
                raise CallFailed("its prompts/list answer holds no list of prompts")
            for prompt in page["prompts"]:
                if not isinstance(prompt, dict) or not isinstance(prompt.get("name"), str) or not prompt["name"]:
                    continue
                if len(kept) >= self.settings.mcpMaxPrompts:
                    over += 1
                    continue
                kept[prompt["name"]] = prompt
            cursor = page.get("nextCursor")
            if over or not isinstance(cursor, str) or not cursor:
                break
        self.prompts = list(kept.values())
        if over:
            log.warn("MCP server {name} offers more than {limit} prompts; {over} (and any further pages) are "
                     "not slash commands (HERMES_ACP_MCP_MAX_PROMPTS)", name=self.spec.name,
                     limit=self.settings.mcpMaxPrompts, over=over)

    def toolsChanged(self) -> None:
        """``notifications/tools/list_changed``."""
        self._listChanged("tools", self._listTools)

    def promptsChanged(self) -> None:
        """``notifications/prompts/list_changed``."""
        if self._hasPrompts:
            self._listChanged("prompts", self._listPrompts)

    def _listChanged(self, kind: str, lister: Callable[[float], Awaitable[None]]) -> None:
        """List ``kind`` again (once more if it changes while listing)."""
        if self.state not in (STARTING, READY):
            return
        if kind in self._relisting:
            self._relisting[kind] = True
            return
        self._relisting[kind] = False
        _logged(Deferred.fromCoroutine(self._listAgain(kind, lister)), f"listing the {kind} of {self.spec.name}")

    async def _listAgain(self, kind: str, lister: Callable[[float], Awaitable[None]]) -> None:
        try:
            while True:
                self._relisting[kind] = False
                try:
                    await lister(self.settings.mcpStartupTimeout)
                except Exception as e:
                    log.warn("MCP server {name}: listing its {kind} again failed: {e}", name=self.spec.name,
                             kind=kind, e=str(e))
                    return
                if not self._relisting[kind]:
                    break
            if self.state == READY:
                log.info("MCP server {name} changed its {kind}: now {n}", name=self.spec.name, kind=kind,
                         n=len(self.tools if kind == "tools" else self.prompts))
                self.onChange(self)
        finally:
            self._relisting.pop(kind, None)

    def _resourcesChanged(self) -> None:
        """Its resources are never held here (each ``list_mcp_resources`` asks the server),
        so the next listing shows the change: nothing to do but note it."""
        log.debug("MCP server {name} changed its resources", name=self.spec.name)

    def ask(self, method: str, params: dict[str, Any]) -> Deferred[Any]:
        """One request on the model's or the user's behalf (``resources/list``,
        ``resources/read``, ``prompts/get``), within the server's call timeout; fails with
        ``CallFailed`` saying why when no result comes. Cancelling it tells the server."""
        timeout = self.spec.callTimeout or self.settings.mcpCallTimeout
        d = Deferred.fromCoroutine(self._withSession(method, params, timeout))

        def failed(failure: Failure) -> Any:
            if failure.check(TimeoutError):
                raise CallFailed(f"{self.spec.name} gave no answer to {method} within {timeout:g} s")
            if failure.check(RemoteError):
                raise CallFailed(f"{self.spec.name} answered {method} with an error: {failure.value.message}")
            if failure.check(TransportError, *_ENDED):
                raise CallFailed(f"{self.spec.name}: {self.describe(failure.value)}")
            return failure

        return d.addErrback(failed)

    def call(self, tool: str, arguments: dict[str, Any], onProgress: Callable[[dict[str, Any]], None],
             onElicit: Callable[[dict[str, Any]], Deferred[dict[str, Any]]] | None = None) -> Deferred[Any]:
        """``tools/call``; fails with ``CallFailed`` when no result comes (an idle
        timeout, reset by progress, up to a hard cap). Cancelling it tells the server.
        ``onElicit`` puts the server's questions during the call to the user (the idle
        timeout waits for the user's answer)."""
        token = f"hermes-{next(_tokens)}"
        timeout = self.spec.callTimeout or self.settings.mcpCallTimeout
        d = Deferred.fromCoroutine(self._withSession(
            "tools/call", {"name": tool, "arguments": arguments, "_meta": {"progressToken": token}}))
        state = {"timer": None, "timedOut": False}

        def expire() -> None:
            state["timedOut"] = True
            d.cancel()

        def arm() -> None:
            timer = state["timer"]
            if timer is not None and timer.active():
                timer.cancel()
            state["timer"] = self.reactor.callLater(timeout, expire)

        def progressed(params: dict[str, Any]) -> None:
            if not hardCap.called:
                arm()
            onProgress(params)

        asking: set[Deferred[dict[str, Any]]] = set()

        def elicited(params: dict[str, Any]) -> Deferred[dict[str, Any]]:
            """The server asks the user (only registered with ``onElicit``): the idle timer
            waits for the answers, then starts afresh if the call still runs. A question
            still open when the call ends is withdrawn (the server answered "cancel"). One at a
            time: the editor is never flooded with a server's forms."""
            if asking:
                return fail(InvalidParams("elicitation/create: a question of this tool call is still open; "
                                          "ask again once it is answered"))
            timer = state["timer"]
            if timer is not None and timer.active():
                timer.cancel()
            question = maybeDeferred(onElicit, params)
            asking.add(question)

            def answered(result: Any) -> Any:
                asking.discard(question)
                if token in self._progress and not asking:
                    arm()
                if isinstance(result, Failure) and result.check(CancelledError):
                    return {"action": "cancel"}
                return result

            return question.addBoth(answered)

        hardCap = self.reactor.callLater(timeout * HARD_CAP_FACTOR, expire)
        arm()
        self._progress[token] = progressed
        if onElicit is not None:
            self._askers.append(elicited)

        def finished(result: Any) -> Any:
            self._progress.pop(token, None)
            if onElicit is not None:
                self._askers.remove(elicited)
            for question in list(asking):
                question.cancel()
            for timer in (state["timer"], hardCap):
                if timer is not None and timer.active():
                    timer.cancel()
            if state["timedOut"]:
                raise CallFailed(f"{self.spec.name} gave no answer or progress for {timeout:g} s")
            if isinstance(result, Failure) and result.check(RemoteError):
                raise CallFailed(f"{self.spec.name} answered with an error: {result.value.message}")
            if isinstance(result, Failure) and result.check(TransportError, *_ENDED):
                raise CallFailed(f"{self.spec.name}: {self.describe(result.value)}")
            return result

        return d.addBoth(finished)

    # -- what the server sends -----------------------------------------------------------

    def _elicit(self, params: dict[str, Any]) -> Deferred[dict[str, Any]] | dict[str, Any]:
        """The server asks the user something: put to the user in the turn of its latest
        running call; with no call running, nobody is there to see it, so it is declined."""
        if not self._askers:
            log.info("MCP server {name} asked the user something outside a tool call; declined", name=self.spec.name)
            return {"action": "decline"}
        return self._askers[-1](params)

    def _roots(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"roots": [{"uri": Path(folder).as_uri(), "name": Path(folder).name or folder} for folder in self.folders]}

    def _progressed(self, params: dict[str, Any]) -> None:
        handler = self._progress.get(params.get("progressToken"))  # type: ignore[arg-type]
        if handler is not None:
            handler(params)

    def _logMessage(self, params: dict[str, Any]) -> None:
        """Logged, at most ``LOG_RATE`` a second after a burst: a chatty server cannot flood stderr."""
        now = self.reactor.seconds()
        self._logAllowance = min(LOG_BURST, self._logAllowance + (now - self._loggedAt) * LOG_RATE)
        self._loggedAt = now
        if self._logAllowance < 1:
            self._logDropped += 1
            return
        self._logAllowance -= 1
        log.info("MCP server {name} says ({severity}): {data}{dropped}", name=self.spec.name,
                 severity=params.get("level"), data=redact(str(params.get("data"))[:2000], self.spec.secrets),
                 dropped=self._droppedLogs())

    def _droppedLogs(self) -> str:
        dropped, self._logDropped = self._logDropped, 0
        return f" ({dropped} earlier messages of it were not logged)" if dropped else ""

    # -- stopping --------------------------------------------------------------------------

    def stop(self) -> Deferred[None]:
        """End it (bounded); its calls fail, and nobody waits for its start any more."""
        self.state = STOPPED
        self._cancelRefresh()
        self._settled.fire(None)
        return Deferred.fromCoroutine(self._shutDown())

    async def _shutDown(self) -> None:
        if self._logDropped:
            log.info("MCP server {name}: {n} more of its log messages were not logged", name=self.spec.name,
                     n=self._logDropped)
            self._logDropped = 0
        if self.spec.transport == STDIO:
            if self.channel.pid is not None:
                await self.channel.stop()
        else:
            await self.channel.close()
