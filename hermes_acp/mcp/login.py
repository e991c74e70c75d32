"""One sign-in to an MCP server: the loopback listener, the link, the code.

The listener (RFC 8252: ``http://127.0.0.1:PORT/callback``, on the reactor) is
bound before the link is shown and lives only for this sign-in, at most
``timeout`` seconds. Its port is the one the client registration was made with
when that port is free (authorization servers match the redirect URI exactly,
port included), else a new one with a new registration. The first answer whose
``state`` is this sign-in's ends it (others are answered and dropped); the
browser is told how it went once the code was exchanged.

How the link reaches the user is the caller's ``show``: a URL elicitation, a
notice, a line on a terminal. If what ``show`` returns fails (the user declined),
the sign-in stops.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from .oauth import OAuthClient, OAuthError, Pending

log = Logger()

CALLBACK_PATH = "/callback"
#: The most query parameters of a callback that are read.
MAX_PARAMS = 32


class LoginStopped(OAuthError):
    """The user declined or cancelled the sign-in (``byUser``), or it ran out of time."""

    def __init__(self, message: str, byUser: bool = False) -> None:
        super().__init__(message)
        self.byUser = byUser


def _page(title: str, text: str) -> bytes:
    return (f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<body style='font-family:sans-serif;margin:3em'><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(text)}</p></body>").encode()


class _Callback(Resource):
    """The redirect's landing place: hands a matching answer to the sign-in, which
    finishes the browser's request once the code is exchanged."""

    isLeaf = True

    def __init__(self, onAnswer: Callable[[dict[str, str], Any], bool]) -> None:
        super().__init__()
        self.onAnswer = onAnswer

    def render_GET(self, request: Any) -> Any:
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        if request.path.decode("latin-1") != CALLBACK_PATH:
            request.setResponseCode(404)
            return _page("Not found", "This address only takes the answer of a sign-in.")
        query = {key.decode("utf-8", "replace"): values[0].decode("utf-8", "replace")
                 for key, values in list(request.args.items())[:MAX_PARAMS] if values}
        if self.onAnswer(query, request):
            return NOT_DONE_YET
        request.setResponseCode(400)
        return _page("Not this sign-in", "This answer does not belong to a sign-in in progress; nothing was done.")


class _Quiet(Site):
    noisy = False

    def log(self, request: Any) -> None:  # the request line holds the code: never logged
        pass


def _answer(request: Any, page: bytes) -> None:
    """Answer the browser (and close its connection: this listener is about to go)."""
    request.setHeader(b"connection", b"close")
    request.write(page)
    request.finish()


async def signIn(oauth: OAuthClient, reactor: Any, challenge: Mapping[str, str],
                 show: Callable[[str], Any], timeout: float, scopes: tuple[str, ...] = (),
                 port: int = 0) -> dict[str, Any]:
    """Sign in: tokens stored and returned, or OAuthError saying why not. ``scopes``
    are asked on top of those the server names (a step-up); ``port`` is the
    listener's when no registration names one (config.yaml ``oauth.redirect_port``)."""
    discovered = await oauth.discover(challenge)
    known = None if oauth.configured.get("client_id") else oauth.store.client(discovered.issuer)
    wanted = port
    for uri in (known or {}).get("redirect_uris") or []:
        try:
            if isinstance(uri, str) and uri.startswith("http://127.0.0.1:"):
                wanted = urlsplit(uri).port or port
        except ValueError:  # a stored URI that is no URI: a new port, a new registration
            pass
    answer: Deferred[tuple[str, Any]] = Deferred()
    pending: list[Pending] = []

    def onAnswer(query: dict[str, str], request: Any) -> bool:
        if not pending or answer.called:
            return False
        try:
            code = oauth.checkCallback(pending[0], query)
        except OAuthError as e:
            if "state" in str(e):
                return False  # somebody else's answer: dropped
            answer.errback(e)
            request.setResponseCode(400)
            _answer(request, _page("Sign-in failed", str(e)))
            return True
        answer.callback((code, request))
        return True

    site = _Quiet(_Callback(onAnswer))
    try:
        listening = reactor.listenTCP(wanted, site, interface="127.0.0.1")
    except CannotListenError:
        if not wanted:
            raise OAuthError("no loopback port is free for the sign-in's answer") from None
        listening = reactor.listenTCP(port if port != wanted else 0, site, interface="127.0.0.1")
    request = None
    try:
        redirectURI = f"http://127.0.0.1:{listening.getHost().port}{CALLBACK_PATH}"
        client = await oauth.client(discovered, redirectURI, scopes)
        pending.append(oauth.authorization(discovered, client, redirectURI, scopes))
        shown = maybeDeferred(show, pending[0].url)
        shown.addErrback(lambda f: None if answer.called else answer.errback(f))
        answer.addTimeout(timeout, reactor)
        try:
            code, request = await answer
        except (TimeoutError, CancelledError):
            raise LoginStopped(f"nobody signed in within {timeout:g} s") from None
        tokens = await oauth.exchange(pending[0], code)
        _answer(request, _page("Signed in", "hermes-acp is signed in to the MCP server. "
                                                           "You can close this page."))
        request = None
        return tokens
    except OAuthError as e:
        if request is not None:
            request.setResponseCode(502)
            _answer(request, _page("Sign-in failed", str(e)))
        raise
    finally:
        await maybeDeferred(listening.stopListening)
