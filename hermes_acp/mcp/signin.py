"""Signing in to OAuth MCP servers from the editor: one connection's sign-ins.

A server that answers 401 (or a 403 ``insufficient_scope``) makes its link wait
for a sign-in, its tools absent; the registry then ``offer``s one, and
``/mcp login NAME`` ``start``s one. Either way the user is taken to the
authorization page the best way the editor allows: a URL elicitation
(``elicitation/create``, mode ``url``) where the editor advertised that mode,
else the link in a notice (held for the next prompt's text where the editor
takes no notices), or in the reply of ``/mcp login``. A declined or cancelled
elicitation ends the sign-in, and it is not offered again until the user asks;
nothing is ever asked in a form. Once the redirect came and the code was
exchanged, ``elicitation/complete`` closes the editor's page and every link
waiting for that server connects again.

Tokens stay on this side: the link in the URL carries only the client id, the
PKCE challenge and the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from uuid import uuid4

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from ..client import ClientInfo
from ..config import Settings
from ..jsonrpc import RemoteError
from ..oneshot import OneShot
from ..session_state import SessionState
from .link import NEEDS_LOGIN, ServerLink
from .specs import HTTP, ServerSpec
from .tokens import TokenStore

if TYPE_CHECKING:  # imported with the first HTTP server (twisted.web is not needed before)
    from .oauth import OAuthClient

log = Logger()

Report = Callable[..., None]


def oauthWanted(spec: ServerSpec) -> bool:
    """An HTTP server whose Authorization header the editor did not give (with one,
    a 401 is reported as it is: OAuth is never started over the editor's credentials)."""
    return spec.transport == HTTP and not any(name.lower() == "authorization" for name, _ in spec.headers)


@attrs.define(eq=False)
class _Running:
    """A sign-in underway: what the user is told of its link (``/mcp login`` joining it
    gets the same)."""

    shown: OneShot[str] = attrs.Factory(OneShot)


@attrs.define(eq=False)
class SignIns:
    """The OAuth clients of one connection's HTTP servers, and the sign-ins underway."""

    reactor: Any
    settings: Settings
    client: ClientInfo
    store: TokenStore
    #: The editor's connection (``callRemote``, ``notify``), for URL elicitations.
    remote: Any = None
    #: Called with the OAuth client once a sign-in finished (the links connect again).
    onSignedIn: Callable[[OAuthClient], None] = lambda oauth: None
    _clients: dict[tuple[str, tuple[tuple[str, str], ...]], OAuthClient] = attrs.Factory(dict)
    _running: dict[int, _Running] = attrs.Factory(dict)

    def clientFor(self, spec: ServerSpec) -> OAuthClient | None:
        """The server's OAuth client, shared by every session listing the same URL (so a
        refresh, a sign-in or a sign-out holds for all of them); None if it gets none."""
        if not oauthWanted(spec):
            return None
        from .oauth import OAuthClient, canonicalResource

        key = (canonicalResource(spec.url), spec.oauth)
        if key not in self._clients:
            self._clients[key] = OAuthClient(self.reactor, self.store, spec.url, dict(spec.oauth),
                                             timeout=self.settings.mcpStartupTimeout)
        return self._clients[key]

    def offer(self, state: SessionState, link: ServerLink, report: Report) -> None:
        """The link needs a sign-in it did not have before: take the user there (once;
        after a refusal, only ``/mcp login`` starts another)."""
        if link.offerSignIn:
            link.offerSignIn = False
            self.start(state, link, report, asked=False)

    def start(self, state: SessionState, link: ServerLink, report: Report, asked: bool) -> Deferred[str]:
        """Begin signing in to the link's server (or join the sign-in underway); fires
        with what the user is told of it, once the link is shown."""
        assert link.oauth is not None
        running = self._running.get(id(link.oauth))
        if running is None:
            running = _Running()
            self._running[id(link.oauth)] = running
            done = Deferred.fromCoroutine(self._signIn(state, link, report, asked, running))
            done.addErrback(lambda f: log.failure("signing in to MCP server {name} failed", f, name=link.spec.name))
            done.addBoth(lambda _: self._running.pop(id(link.oauth), None))
        return running.shown.when()

    async def _signIn(self, state: SessionState, link: ServerLink, report: Report, asked: bool,
                      running: _Running) -> None:
        from .login import LoginStopped, signIn
        from .oauth import OAuthError

        name, timeout = link.spec.name, self.settings.mcpLoginTimeout
        asking: list[Deferred[Any]] = []
        elicited: list[str] = []

        def show(url: str) -> Deferred[None] | None:
            host = urlsplit(url).netloc
            if self.client.elicitation("url") and self.remote is not None:
                elicitationId = str(uuid4())
                elicited.append(elicitationId)
                running.shown.fire(f"Sign in to MCP server `{name}` on the page the editor opens ({host}).")
                d = self.remote.callRemote("elicitation/create", {
                    "sessionId": state.sessionId, "mode": "url", "elicitationId": elicitationId, "url": url,
                    "message": f"Sign in to MCP server {name} ({host})"}, timeout)
                asking.append(d)

                def failed(failure: Any) -> None:
                    if failure.check(RemoteError):  # the editor could not show it: the link as text
                        log.info("the editor refused the sign-in page of {name}: {e}", name=name,
                                 e=failure.getErrorMessage())
                        report(state, f"MCP server {name} needs you to sign in", _linkText(name, host, url, timeout),
                               severity="info")
                        return None
                    return failure

                return d.addCallbacks(_accepted, failed)
            text = _linkText(name, host, url, timeout)
            running.shown.fire(text)
            if not asked:
                report(state, f"MCP server {name} needs you to sign in", text, severity="info")
            return None

        oauth = link.oauth
        assert oauth is not None
        port = int(oauth.configured.get("redirect_port") or 0)
        try:
            await signIn(oauth, self.reactor, link.challenge, show, timeout, link.stepUp, port)
        except OAuthError as e:
            running.shown.fire(f"Signing in to MCP server `{name}` did not work: {e}")
            log.info("MCP server {name}: sign-in did not finish: {e}", name=name, e=str(e))
            if link.state == NEEDS_LOGIN:
                link.reason = f"the sign-in did not finish ({e}); `/mcp login {name}` tries again"
            if not (isinstance(e, LoginStopped) and e.byUser):
                report(state, f"MCP server {name}: the sign-in did not finish", str(e))
            return
        finally:
            for d in asking:
                if not d.called:
                    d.cancel()  # the editor closes its page ($/cancel_request)
        log.info("MCP server {name}: signed in", name=name)
        self.onSignedIn(oauth)  # the links connect again (a prompt from now on waits for them)
        for elicitationId in elicited:
            self.remote.notify("elicitation/complete", {"elicitationId": elicitationId})
        report(state, f"Signed in to MCP server {name}", "Its tools are available now.", severity="info")


def _linkText(name: str, host: str, url: str, timeout: float) -> str:
    return f"Open this link to sign in to MCP server `{name}` ({host}); it works for {timeout / 60:g} minutes: {url}"


def _accepted(answer: Any) -> None:
    """A URL elicitation's answer: ``accept`` only means the page is opened; anything
    else ends the sign-in."""
    action = answer.get("action") if isinstance(answer, dict) else None
    if action != "accept":
        from .login import LoginStopped

        raise LoginStopped(f"the sign-in was {'declined' if action == 'decline' else 'cancelled'} in the editor",
                           byUser=True)
