"""OAuth's parts against metadata served on loopback: the discovery order, the issuer and
PKCE checks, the callback's checks, the token store, and the redaction of learned tokens.
The whole flow against a real authorization server is in test_e2e_mcp_oauth.py."""

from __future__ import annotations

import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.web.resource import Resource
from twisted.web.server import Site

from hermes_acp.engine.secrets import learnSecret
from hermes_acp.logs import RedactingTextObserver
from hermes_acp.mcp.oauth import (
    Discovered,
    OAuthClient,
    OAuthError,
    authorizationServerURLs,
    canonicalResource,
    parseChallenge,
    protectedResourceURLs,
)
from hermes_acp.mcp.tokens import TokenStore
from hermes_acp.trace import FrameTrace


class Documents(Resource):
    """JSON documents by path; every request is recorded."""

    isLeaf = True

    def __init__(self, documents: dict[str, Any]) -> None:
        super().__init__()
        self.documents = documents
        self.asked: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        path = request.path.decode()
        self.asked.append(path)
        if path not in self.documents:
            request.setResponseCode(404)
            return b"{}"
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self.documents[path]).encode()


@pytest.fixture
def served() -> Any:
    from twisted.internet import reactor

    ports = []

    def serve(documents: dict[str, Any]) -> tuple[Documents, str]:
        resource = Documents(documents)
        site = Site(resource)
        site.noisy = False
        port = reactor.listenTCP(0, site, interface="127.0.0.1")
        ports.append(port)
        return resource, f"http://127.0.0.1:{port.getHost().port}"

    yield serve
    for port in ports:
        pytest_twisted.blockon(port.stopListening())


def client(url: str, **kwargs: Any) -> OAuthClient:
    from twisted.internet import reactor

    return OAuthClient(reactor, TokenStore(Path(tempfile.mkdtemp(prefix="hermes-tokens-"))), url, timeout=10, **kwargs)


def metadata(issuer: str, **extra: Any) -> dict[str, Any]:
    return {"issuer": issuer, "authorization_endpoint": f"{issuer}/authorize", "token_endpoint": f"{issuer}/token",
            "code_challenge_methods_supported": ["S256"], **extra}


def test_challengeAndWhereToLook() -> None:
    header = 'Bearer error="insufficient_scope", scope="a b", resource_metadata="https://x.ex/.well-known/p"'
    assert parseChallenge(["Basic realm=x", header]) == {
        "error": "insufficient_scope", "scope": "a b", "resource_metadata": "https://x.ex/.well-known/p"}
    assert parseChallenge(["Bearer realm=example"]) == {"realm": "example"}
    assert parseChallenge(None) == {} and parseChallenge(["Basic realm=x"]) == {}
    assert canonicalResource("HTTPS://MCP.Example.com/mcp/#frag") == "https://mcp.example.com/mcp"
    assert protectedResourceURLs("https://h.ex/v1/mcp", None) == [
        "https://h.ex/.well-known/oauth-protected-resource/v1/mcp", "https://h.ex/.well-known/oauth-protected-resource"]
    assert authorizationServerURLs("https://a.ex/t1") == [
        "https://a.ex/.well-known/oauth-authorization-server/t1", "https://a.ex/.well-known/openid-configuration/t1",
        "https://a.ex/t1/.well-known/openid-configuration"]
    assert authorizationServerURLs("https://a.ex") == [
        "https://a.ex/.well-known/oauth-authorization-server", "https://a.ex/.well-known/openid-configuration"]


@pytest_twisted.ensureDeferred
async def test_discoveryFallsBackToTheRootAndOpenIDDiscoveryOfAPathIssuer(served) -> None:
    """No challenge URL: the path's well-known URL, then the root's; an issuer with a
    path: RFC 8414 at the path, then OpenID discovery at the path, then inside it."""
    documents: dict[str, Any] = {}
    resource, base = served(documents)
    issuer = f"{base}/tenant"
    documents["/.well-known/oauth-protected-resource"] = {"resource": f"{base}/mcp", "authorization_servers": [issuer],
                                                          "scopes_supported": ["read"]}
    documents["/tenant/.well-known/openid-configuration"] = metadata(issuer, scopes_supported=["read", "offline_access"])
    found = await client(f"{base}/mcp").discover({})
    assert found.issuer == issuer and found.scopes == ("read", "offline_access")
    assert resource.asked == [
        "/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-authorization-server/tenant", "/.well-known/openid-configuration/tenant",
        "/tenant/.well-known/openid-configuration"]


@pytest.mark.parametrize("wrong, refusal", [
    ({"code_challenge_methods_supported": None}, "PKCE"),
    ({"code_challenge_methods_supported": ["plain"]}, "PKCE"),
    ({"issuer": "http://elsewhere.example"}, "issuer"),
])
@pytest_twisted.ensureDeferred
async def test_anAuthorizationServerWithoutPKCEOrWithAnotherIssuerIsRefused(served, wrong, refusal) -> None:
    documents: dict[str, Any] = {}
    _, base = served(documents)
    documents["/.well-known/oauth-protected-resource/mcp"] = {"resource": f"{base}/mcp", "authorization_servers": [base]}
    documents["/.well-known/oauth-authorization-server"] = {
        k: v for k, v in {**metadata(base), **wrong}.items() if v is not None}
    with pytest.raises(OAuthError, match=refusal):
        await client(f"{base}/mcp").discover({})


@pytest_twisted.ensureDeferred
async def test_challengeURLAndScopeWin(served) -> None:
    documents: dict[str, Any] = {}
    resource, base = served(documents)
    documents["/prm"] = {"resource": f"{base}/mcp", "authorization_servers": [base], "scopes_supported": ["x"]}
    documents["/.well-known/oauth-authorization-server"] = metadata(base)
    found = await client(f"{base}/mcp").discover({"resource_metadata": f"{base}/prm", "scope": "files:read"})
    assert resource.asked[0] == "/prm" and found.scopes == ("files:read",)


def pending(oauth: OAuthClient, **meta: Any) -> Any:
    found = Discovered(oauth.resource, "https://as.example", metadata("https://as.example", **meta), ("mcp",))
    return oauth.authorization(found, {"client_id": "c1"}, "http://127.0.0.1:5/callback")


def test_authorizationURLAndCallbackChecks() -> None:
    oauth = client("https://mcp.example/mcp")
    sent = pending(oauth)
    for part in ("response_type=code", "client_id=c1", "code_challenge_method=S256", "resource=https%3A%2F%2Fmcp",
                 f"state={sent.state}", "scope=mcp"):
        assert part in sent.url
    assert sent.verifier not in sent.url
    assert oauth.checkCallback(sent, {"state": sent.state, "code": "k"}) == "k"
    assert oauth.checkCallback(sent, {"state": sent.state, "code": "k", "iss": "https://as.example"}) == "k"
    for query, why in [({"state": "other", "code": "k"}, "state"),
                       ({"state": sent.state, "code": "k", "iss": "https://as.example/"}, "iss"),
                       ({"state": sent.state, "error": "access_denied"}, "access_denied"),
                       ({"state": sent.state}, "no code")]:
        with pytest.raises(OAuthError, match=why):
            oauth.checkCallback(sent, query)
    promised = pending(oauth, authorization_response_iss_parameter_supported=True)
    with pytest.raises(OAuthError, match="iss"):
        oauth.checkCallback(promised, {"state": promised.state, "code": "k"})


def test_storeIsPrivateAtomicAndKeyedByURL(tmp_path) -> None:
    store = TokenStore(tmp_path / "mcp-tokens")
    store.saveTokens("https://a.example/mcp", {"access_token": "acc-0123456789", "refresh_token": "ref-0123456789"})
    store.saveClient("https://as.example", {"client_id": "c", "client_secret": "sec-0123456789"})
    for path in (store.tokenPath("https://a.example/mcp"), store.clientPath("https://as.example")):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700
    assert store.tokens("https://a.example/mcp")["access_token"] == "acc-0123456789"
    assert store.tokens("https://b.example/mcp") is None
    assert [p.name for p in store.folder.iterdir() if p.name.endswith(".tmp")] == []
    assert store.forget("https://a.example/mcp") and not store.forget("https://a.example/mcp")


def test_learnedTokensAreRedactedFromLogsAndTraces(tmp_path) -> None:
    learnSecret("tok-learned-0123456789")
    stream = io.StringIO()
    RedactingTextObserver(stream, [])({"log_format": "sent {t}", "t": "Bearer tok-learned-0123456789",
                                       "log_time": 0, "log_level": None, "log_namespace": "x"})
    assert "tok-learned" not in stream.getvalue() and "[REDACTED]" in stream.getvalue()
    fd = os.open(tmp_path / "trace", os.O_WRONLY | os.O_CREAT, 0o600)
    trace = FrameTrace(fd, [])
    trace("out", b"", {"params": {"text": "x tok-learned-0123456789 y"}})
    trace.close()
    assert "tok-learned" not in (tmp_path / "trace").read_text()


@pytest_twisted.ensureDeferred
async def test_theClientIsPreRegisteredThenAMetadataDocumentThenRegistered(served) -> None:
    """config.yaml's client_id wins; a client ID metadata document is used where the server
    takes them; otherwise the registration made before, for this redirect URI, is reused."""
    _, base = served({})
    found = Discovered(f"{base}/mcp", base, metadata(base, client_id_metadata_document_supported=True), ("mcp",))
    redirect = "http://127.0.0.1:5/callback"
    assert (await client(f"{base}/mcp", configured={"client_id": "mine"}).client(found, redirect))["client_id"] == "mine"
    document = "https://me.example/hermes.json"
    chosen = await client(f"{base}/mcp", configured={"client_metadata_url": document}).client(found, redirect)
    assert chosen == {"client_id": document, "token_endpoint_auth_method": "none"}
    oauth = client(f"{base}/mcp", configured={"client_metadata_url": document})
    oauth.store.saveClient(base, {"client_id": "earlier", "redirect_uris": [redirect], "scope": "mcp"})
    plain = Discovered(f"{base}/mcp", base, metadata(base), ("mcp",))
    assert (await oauth.client(plain, redirect))["client_id"] == "earlier"
    with pytest.raises(OAuthError, match="no client registration"):  # a wider scope needs a new one
        await oauth.client(plain, redirect, ("admin",))


def test_configYamlOAuthEntries(tmp_path) -> None:
    from hermes_acp.mcp.specs import parseConfig

    path = tmp_path / "config.yaml"
    path.write_text("mcp_servers:\n  a:\n    url: https://a.example/mcp\n    oauth: {client_id: c, client_secret: s3cr3t-value,"
                    " redirect_port: 8765}\n  b:\n    url: https://b.example/mcp\n    oauth: {redirect_port: x}\n"
                    "  c:\n    url: https://c.example/mcp\n    oauth: {password: p}\n")
    specs, problems = parseConfig(path)
    assert [s.name for s in specs] == ["a"] and dict(specs[0].oauth)["redirect_port"] == "8765"
    assert "s3cr3t-value" in specs[0].secrets
    assert len(problems) == 2 and "redirect_port" in problems[0] and "oauth must be" in problems[1]
