"""OAuth 2.1 for one HTTP MCP server, as the MCP authorization spec asks of a client.

From a ``401`` challenge (``WWW-Authenticate: Bearer resource_metadata=...``) to
tokens: the protected resource's metadata (RFC 9728: the challenge's URL, else
the well-known URL at the server's path, else at its root), its authorization
server's metadata (RFC 8414, then OpenID discovery, in the spec's order; the
document's ``issuer`` must be the one asked for, and a server that does not
say it supports PKCE S256 is refused), the client (a pre-registered one from
config.yaml, the registration this agent made before with that server, or a
new dynamic registration, RFC 7591), the authorization URL (PKCE S256, ``state``,
``resource``: RFC 8707), the callback's checks (``state``; ``iss``, RFC 9207) and
the code's exchange, then refreshes (rotated refresh tokens stored at once).

The user's part (opening the URL, the loopback listener that takes the
redirect) is ``login``'s. Every request here is bounded in time and size.
Tokens, codes, verifiers and client secrets are never logged; the token store
teaches them to the redaction as it sees them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from .. import __version__
from ..oneshot import OneShot
from .tokens import TokenStore

log = Logger()

#: The most of a metadata document, registration or token answer that is read.
MAX_ANSWER = 64 * 1024
#: A token is refreshed this long before it expires (at most a fifth of its life).
REFRESH_MARGIN = 60.0
CLIENT_NAME = "hermes-acp"
_AUTH_PARAM = re.compile(r'([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


class OAuthError(Exception):
    """The login cannot go on; the message says why, for the user."""


class Refused(OAuthError):
    """The authorization server answered with an error (not: it could not be reached)."""


class LoginNeeded(OAuthError):
    """No token works any more (none stored, or its refresh was refused): the user must sign in."""


def parseChallenge(values: list[str] | None) -> dict[str, str]:
    """The parameters of the ``Bearer`` challenge of ``WWW-Authenticate`` (RFC 6750 §3,
    RFC 9728 §5.1): ``resource_metadata``, ``scope``, ``error``; empty when there is none."""
    for value in values or []:
        scheme, _, rest = value.strip().partition(" ")
        if scheme.lower() == "bearer":
            return {name.lower(): quoted.replace('\\"', '"') if quoted else bare
                    for name, quoted, bare in _AUTH_PARAM.findall(rest)}
    return {}


def canonicalResource(url: str) -> str:
    """The MCP server's URL as the ``resource`` parameter (RFC 8707): scheme and host in
    lower case, no fragment, no trailing slash."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def protectedResourceURLs(resource: str, challenged: str | None) -> list[str]:
    """Where the protected resource's metadata may be, in the order to try."""
    parts = urlsplit(resource)
    root = urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource", "", ""))
    urls = [challenged] if challenged else []
    if parts.path.strip("/"):
        urls.append(root + parts.path.rstrip("/"))
    urls.append(root)
    return urls


def authorizationServerURLs(issuer: str) -> list[str]:
    """Where an authorization server's metadata may be (RFC 8414, then OpenID
    discovery), in the order the MCP spec gives."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(where: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, where, "", ""))

    if path:
        return [at(f"/.well-known/oauth-authorization-server{path}"), at(f"/.well-known/openid-configuration{path}"),
                at(f"{path}/.well-known/openid-configuration")]
    return [at("/.well-known/oauth-authorization-server"), at("/.well-known/openid-configuration")]


def pkcePair() -> tuple[str, str]:
    """A PKCE verifier and its S256 challenge (RFC 7636)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


@attrs.frozen
class Discovered:
    """What the metadata said: the resource, its authorization server, the scopes to ask."""

    resource: str
    issuer: str
    metadata: dict[str, Any]
    scopes: tuple[str, ...]


@attrs.frozen
class Pending:
    """One authorization underway: what the callback is checked against and the code
    exchanged with. Its ``url`` is what the user opens."""

    url: str
    state: str
    verifier: str
    redirectURI: str
    discovered: Discovered
    client: dict[str, Any]
    scope: str


@attrs.define(eq=False)
class OAuthClient:
    """The OAuth side of one MCP server URL: its stored tokens, their refresh, and the
    steps of a login."""

    reactor: Any
    store: TokenStore
    #: The MCP server's URL as configured (its canonical form is the ``resource``).
    url: str
    #: A pre-registered client (config.yaml ``oauth``): client_id, client_secret, scope.
    configured: Mapping[str, str] = attrs.Factory(dict)
    timeout: float = 30.0
    #: The HTTP client (``twisted.web.client.Agent``), made when first needed.
    agent: Any = None
    _refreshing: OneShot[dict[str, Any]] | None = None
    #: The tokens in use (None: not read from the store yet, or none there).
    _current: dict[str, Any] | None = None
    _loaded: bool = False

    @property
    def resource(self) -> str:
        return canonicalResource(self.url)

    # -- the tokens in use ---------------------------------------------------------------

    def record(self) -> dict[str, Any] | None:
        """The tokens in use (read from the store the first time)."""
        if not self._loaded:
            self._current, self._loaded = self.store.tokens(self.resource), True
        return self._current

    def reload(self) -> dict[str, Any] | None:
        """The stored tokens, read again (another process may have signed in or refreshed)."""
        self._loaded = False
        return self.record()

    def bearer(self) -> str | None:
        record = self.record()
        token = record.get("access_token") if record else None
        return token if isinstance(token, str) and token else None

    def refreshDue(self) -> float | None:
        """Seconds from now until the token should be refreshed (None: never, it does not expire)."""
        record = self.record()
        expires = record.get("expires_at") if record else None
        if not isinstance(expires, (int, float)) or not record.get("refresh_token"):
            return None
        life = float(record.get("expires_in") or REFRESH_MARGIN * 5)
        return max(0.0, expires - min(REFRESH_MARGIN, life / 5) - time.time())

    def forget(self) -> bool:
        self._current, self._loaded = None, True
        return self.store.forget(self.resource)

    async def refresh(self, used: str | None = None) -> dict[str, Any]:
        """New tokens from the refresh token (one refresh at a time for this server).
        ``used`` is the access token that was refused: if the store already holds
        another (refreshed meanwhile by someone else), that one is taken; without
        ``used`` (before expiry), a stored token not yet due is kept. LoginNeeded
        when no refresh is possible or the server refused it (revoked, expired)."""
        if self._refreshing is None:
            shot = self._refreshing = OneShot()

            def done(result: Any) -> None:
                self._refreshing = None
                shot.fire(result)

            Deferred.fromCoroutine(self._refresh(used)).addBoth(done)
        return await self._refreshing.when()

    async def _refresh(self, used: str | None) -> dict[str, Any]:
        record = self.reload()
        if record is None:
            raise LoginNeeded("not signed in")
        if used is not None and record.get("access_token") not in (None, used) and not self._expired(record):
            return record  # another process (or session) refreshed it meanwhile
        if used is None and (self.refreshDue() or 0) > 0:
            return record  # (a timer's refresh) the stored one is fresh already
        refreshToken = record.get("refresh_token")
        if not refreshToken:
            raise LoginNeeded("the token expired and the server gave no refresh token")
        fields = {"grant_type": "refresh_token", "refresh_token": refreshToken, "resource": self.resource}
        client = {"client_id": record.get("client_id"), "client_secret": record.get("client_secret"),
                  "token_endpoint_auth_method": record.get("token_endpoint_auth_method")}
        try:
            answer = await self._token(record["token_endpoint"], client, fields)
        except Refused as e:  # (one that could not reach the server may work later: not this)
            log.info("MCP server {url}: refreshing its token was refused: {e}", url=self.resource, e=str(e))
            raise LoginNeeded(f"the server refused to refresh the token ({e})") from None
        saved = self._tokens(answer, record, keepRefresh=refreshToken)
        log.info("MCP server {url}: token refreshed", url=self.resource)
        return saved

    @staticmethod
    def _expired(record: dict[str, Any]) -> bool:
        expires = record.get("expires_at")
        return isinstance(expires, (int, float)) and expires <= time.time()

    # -- a login, step by step -------------------------------------------------------------

    async def discover(self, challenge: Mapping[str, str]) -> Discovered:
        """The protected resource's and its authorization server's metadata."""
        prm = None
        for url in protectedResourceURLs(self.resource, challenge.get("resource_metadata")):
            prm = await self._json(url, required=False)
            if prm is not None:
                break
        if prm is None:
            raise OAuthError(f"{self.resource} asks for authorization but publishes no protected-resource metadata")
        servers = prm.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
            raise OAuthError("its protected-resource metadata names no authorization server")
        named = prm.get("resource")
        if isinstance(named, str) and canonicalResource(named) != self.resource:
            raise OAuthError(f"its protected-resource metadata is for {named}, not {self.resource}")
        issuer = servers[0]
        metadata = None
        for url in authorizationServerURLs(issuer):
            metadata = await self._json(url, required=False)
            if metadata is not None:
                break
        if metadata is None:
            raise OAuthError(f"the authorization server {issuer} publishes no metadata")
        if metadata.get("issuer") != issuer:
            raise OAuthError(f"the authorization server's metadata names issuer {metadata.get('issuer')!r}, "
                             f"not {issuer!r}: refused")
        if "S256" not in (metadata.get("code_challenge_methods_supported") or []):
            raise OAuthError(f"the authorization server {issuer} does not say it supports PKCE (S256), "
                             "which MCP requires: refused")
        for endpoint in ("authorization_endpoint", "token_endpoint"):
            if not isinstance(metadata.get(endpoint), str) or not metadata[endpoint].startswith(("https://", "http://")):
                raise OAuthError(f"the authorization server's metadata has no {endpoint}")
        scope = challenge.get("scope") or self.configured.get("scope")
        scopes = scope.split() if scope else [s for s in prm.get("scopes_supported") or [] if isinstance(s, str)]
        if "offline_access" in (metadata.get("scopes_supported") or []) and "offline_access" not in scopes:
            scopes.append("offline_access")
        return Discovered(self.resource, issuer, metadata, tuple(scopes))

    async def client(self, discovered: Discovered, redirectURI: str, scopes: tuple[str, ...] = ()) -> dict[str, Any]:
        """The client to authorize as, in the MCP spec's order: pre-registered
        (config.yaml ``oauth.client_id``); a client ID metadata document (config.yaml
        ``oauth.client_metadata_url``, the HTTPS URL where the user hosts it) when the
        server takes them; the registration made before with this server for this
        redirect URI (and scopes: a step-up may need a wider one); a new dynamic
        registration (RFC 7591)."""
        if self.configured.get("client_id"):
            return {"client_id": self.configured["client_id"], "client_secret": self.configured.get("client_secret"),
                    "token_endpoint_auth_method": "client_secret_post" if self.configured.get("client_secret") else "none"}
        document = self.configured.get("client_metadata_url")
        if document and discovered.metadata.get("client_id_metadata_document_supported") is True:
            return {"client_id": document, "token_endpoint_auth_method": "none"}
        wanted = list(dict.fromkeys([*discovered.scopes, *scopes]))
        known = self.store.client(discovered.issuer)
        registered = known.get("scope") if known is not None else None
        if known is not None and redirectURI in (known.get("redirect_uris") or []) and (
                not isinstance(registered, str) or set(wanted) <= set(registered.split())):
            return known
        endpoint = discovered.metadata.get("registration_endpoint")
        if not isinstance(endpoint, str):
            raise OAuthError(f"the authorization server {discovered.issuer} offers no client registration; give a "
                             "client_id under oauth for this server in config.yaml")
        methods = discovered.metadata.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        request = {"client_name": CLIENT_NAME, "redirect_uris": [redirectURI], "application_type": "native",
                   "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                   "token_endpoint_auth_method": "none" if "none" in methods else "client_secret_post",
                   "software_id": "hermes-acp", "software_version": __version__}
        if wanted:
            request["scope"] = " ".join(wanted)
        answer = await self._post(endpoint, json.dumps(request).encode(), "application/json")
        if not isinstance(answer.get("client_id"), str):
            raise OAuthError("the authorization server's registration answer has no client_id")
        record = {**answer, "redirect_uris": [redirectURI],
                  "token_endpoint_auth_method": answer.get("token_endpoint_auth_method")
                  or request["token_endpoint_auth_method"]}
        self.store.saveClient(discovered.issuer, record)
        log.info("registered with the authorization server {issuer}", issuer=discovered.issuer)
        return record

    def authorization(self, discovered: Discovered, client: dict[str, Any], redirectURI: str,
                      scopes: tuple[str, ...] = ()) -> Pending:
        """The authorization URL, with PKCE S256, ``state`` and ``resource``."""
        verifier, challenge = pkcePair()
        state = secrets.token_urlsafe(24)
        scope = " ".join(dict.fromkeys([*discovered.scopes, *scopes]))
        query = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": redirectURI,
                 "state": state, "code_challenge": challenge, "code_challenge_method": "S256",
                 "resource": discovered.resource}
        if scope:
            query["scope"] = scope
        endpoint = discovered.metadata["authorization_endpoint"]
        url = endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)
        return Pending(url, state, verifier, redirectURI, discovered, client, scope)

    def checkCallback(self, pending: Pending, query: Mapping[str, str]) -> str:
        """The code of a callback that belongs to ``pending`` (OAuthError otherwise)."""
        if not secrets.compare_digest(query.get("state", ""), pending.state):
            raise OAuthError("the sign-in answer does not belong to this sign-in (state differs)")
        issuer = query.get("iss")
        if issuer is not None and issuer != pending.discovered.issuer:
            raise OAuthError("the sign-in answer came from another authorization server (iss differs)")
        if issuer is None and pending.discovered.metadata.get("authorization_response_iss_parameter_supported") is True:
            raise OAuthError("the sign-in answer lacks the iss its authorization server promised")
        if "error" in query:
            described = query.get("error_description", "")[:200]
            raise OAuthError(f"the authorization server said {query['error'][:60]}" + (f": {described}" if described else ""))
        code = query.get("code")
        if not code:
            raise OAuthError("the sign-in answer holds no code")
        return code

    async def exchange(self, pending: Pending, code: str) -> dict[str, Any]:
        """The code for tokens, which are stored."""
        fields = {"grant_type": "authorization_code", "code": code, "redirect_uri": pending.redirectURI,
                  "code_verifier": pending.verifier, "resource": pending.discovered.resource}
        endpoint = pending.discovered.metadata["token_endpoint"]
        answer = await self._token(endpoint, pending.client, fields)
        base = {"issuer": pending.discovered.issuer, "token_endpoint": endpoint, "scope": pending.scope,
                "client_id": pending.client["client_id"], "client_secret": pending.client.get("client_secret"),
                "token_endpoint_auth_method": pending.client.get("token_endpoint_auth_method"),
                "revocation_endpoint": pending.discovered.metadata.get("revocation_endpoint")}
        return self._tokens(answer, base)

    def _tokens(self, answer: dict[str, Any], base: dict[str, Any], keepRefresh: str | None = None) -> dict[str, Any]:
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise OAuthError("the token answer holds no access_token")
        if str(answer.get("token_type", "bearer")).lower() != "bearer":
            raise OAuthError(f"the token is of type {answer.get('token_type')!r}, not Bearer")
        record = {k: v for k, v in base.items() if k not in ("access_token", "refresh_token", "expires_at", "expires_in")}
        record["access_token"] = token
        refreshToken = answer.get("refresh_token") or keepRefresh
        if isinstance(refreshToken, str) and refreshToken:
            record["refresh_token"] = refreshToken
        expiresIn = answer.get("expires_in")
        if isinstance(expiresIn, (int, float)) and not isinstance(expiresIn, bool) and expiresIn > 0:
            record["expires_in"], record["expires_at"] = expiresIn, time.time() + expiresIn
        if isinstance(answer.get("scope"), str):
            record["scope"] = answer["scope"]
        self.store.saveTokens(self.resource, record)
        self._current, self._loaded = record, True
        return record

    # -- HTTP ------------------------------------------------------------------------------------

    async def _token(self, endpoint: str, client: Mapping[str, Any], fields: dict[str, str]) -> dict[str, Any]:
        fields = {**fields, "client_id": client["client_id"]}
        headers = {}
        secret = client.get("client_secret")
        if secret:
            if client.get("token_endpoint_auth_method") == "client_secret_basic":
                pair = f"{client['client_id']}:{secret}".encode()
                headers["authorization"] = "Basic " + base64.b64encode(pair).decode()
            else:
                fields["client_secret"] = secret
        return await self._post(endpoint, urlencode(fields).encode(), "application/x-www-form-urlencoded", headers)

    async def _json(self, url: str, required: bool = True) -> dict[str, Any] | None:
        """A metadata document; None for a 4xx when not ``required``."""
        status, body = await self._request(b"GET", url, None, {})
        if status >= 400 and not required and status < 500:
            return None
        return self._parsed(url, status, body)

    async def _post(self, url: str, body: bytes, kind: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        status, answer = await self._request(b"POST", url, body, {"content-type": kind, **(headers or {})})
        return self._parsed(url, status, answer)

    def _parsed(self, url: str, status: int, body: bytes) -> dict[str, Any]:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if status >= 400:
            error = document.get("error") if isinstance(document, dict) else None
            detail = document.get("error_description") if isinstance(document, dict) else None
            shown = f"{error}" + (f": {str(detail)[:200]}" if detail else "") if isinstance(error, str) else f"HTTP {status}"
            raise Refused(f"{urlsplit(url).netloc} answered {shown}")
        if not isinstance(document, dict):
            raise OAuthError(f"{url.split('?')[0]} answered something that is not a JSON object")
        return document

    async def _request(self, method: bytes, url: str, body: bytes | None, headers: Mapping[str, str]) -> tuple[int, bytes]:
        from .http import _Body, _Collect, _QuietPool

        if not url.startswith(("https://", "http://")):
            raise OAuthError(f"{url[:100]} is not an http(s) URL")
        sent = Headers({b"accept": [b"application/json"], b"user-agent": [f"hermes-acp/{__version__}".encode()]})
        for name, value in headers.items():
            sent.setRawHeaders(name, [value])
        if self.agent is None:
            self.agent = Agent(self.reactor, connectTimeout=10, pool=_QuietPool(self.reactor, persistent=False))
        d = self.agent.request(method, url.encode("ascii", "ignore"), sent, _Body(body) if body is not None else None)
        d.addTimeout(self.timeout, self.reactor)
        try:
            response = await d
            collector = _Collect(MAX_ANSWER)
            response.deliverBody(collector)
            reading = collector.done
            reading.addTimeout(self.timeout, self.reactor)
            answer = await reading
        except OAuthError:
            raise
        except Exception as e:
            raise OAuthError(f"cannot reach {urlsplit(url).netloc}: {str(e) or type(e).__name__}") from None
        return response.code, answer

