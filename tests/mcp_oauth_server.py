"""An OAuth-protected MCP server and its authorization server, from well-kept packages.

  python tests/mcp_oauth_server.py PORT    the first stdout line is the MCP URL,
                                           http://127.0.0.1:PORT/mcp (PORT 0: a free port)

The MCP server is the ``mcp`` package's ``MCPServer`` with its auth pieces: the
bearer middleware (401 with ``WWW-Authenticate: Bearer ... resource_metadata=``,
403 ``insufficient_scope``), RFC 9728 protected-resource metadata, and the
authorization server's routes (RFC 8414 metadata with S256, ``/authorize``,
``/token``, ``/register`` for dynamic registration, ``/revoke``). The provider
behind them is fastmcp's ``InMemoryOAuthProvider``, a test authorization server
that approves every ``/authorize`` at once (redirecting to the client's
``redirect_uri`` with the code and state): the test's "browser" only has to follow
that redirect.

What tests need and the packages do not do, under ``/test/`` (no auth):
``POST /test/expire`` ends every access token now (the next request gets 401; the
refresh tokens stay good),
``POST /test/revoke`` revokes every token (a refresh fails with ``invalid_grant``),
``POST /test/require?scope=S`` makes the server demand scope S too (403
``insufficient_scope``, its challenge naming the scopes: ``namingScopes``), ``GET /test/log`` tells what the authorization server
was asked (each authorize's ``resource`` and scopes, each token grant).
Tools: add(a, b), whoami() -> the scopes of the caller's token. ``OAUTH_TOKEN_SECONDS`` in
the environment: the access tokens' lifetime (an hour by default).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import anyio
from fastmcp.server.auth.providers import in_memory
from fastmcp.server.auth.providers.in_memory import InMemoryOAuthProvider
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse

SCOPES = ["mcp", "admin"]


class RecordingProvider(InMemoryOAuthProvider):
    """The package's provider; what it is asked is also written down for ``/test/log``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked: list[dict[str, Any]] = []

    async def authorize(self, client, params):  # type: ignore[no-untyped-def]
        self.asked.append({"what": "authorize", "resource": params.resource, "scopes": params.scopes,
                           "redirect_uri": str(params.redirect_uri), "client_id": client.client_id})
        return await super().authorize(client, params)

    async def exchange_authorization_code(self, client, authorization_code):  # type: ignore[no-untyped-def]
        self.asked.append({"what": "token", "grant": "authorization_code", "client_id": client.client_id})
        return await super().exchange_authorization_code(client, authorization_code)

    async def exchange_refresh_token(self, client, refresh_token, scopes):  # type: ignore[no-untyped-def]
        self.asked.append({"what": "token", "grant": "refresh_token", "client_id": client.client_id})
        return await super().exchange_refresh_token(client, refresh_token, scopes)


def build(base: str) -> tuple[MCPServer, RecordingProvider, AuthSettings]:
    if os.environ.get("OAUTH_TOKEN_SECONDS"):  # the provider's access-token lifetime (default an hour)
        in_memory.DEFAULT_ACCESS_TOKEN_EXPIRY_SECONDS = int(os.environ["OAUTH_TOKEN_SECONDS"])
    provider = RecordingProvider(base_url=base, issuer_url=base)
    settings = AuthSettings(
        issuer_url=base, resource_server_url=f"{base}/mcp", required_scopes=["mcp"],
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES,
                                                              default_scopes=["mcp"]),
        revocation_options=RevocationOptions(enabled=True), validate_token_resource=False)
    server = MCPServer("oauth-test", version="1.0", auth=settings, auth_server_provider=provider,
                       log_level="WARNING")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="The scopes of the caller's token.")
    def whoami() -> str:
        token = get_access_token()
        return " ".join(sorted(token.scopes)) if token else "nobody"

    @server.custom_route("/test/expire", methods=["POST"])
    async def expire(request: Request) -> JSONResponse:
        # As if they had run out (the provider's own expiry check would revoke their
        # refresh tokens with them, which a real server does not).
        count = len(provider.access_tokens)
        provider.access_tokens.clear()
        return JSONResponse({"expired": count})

    @server.custom_route("/test/revoke", methods=["POST"])
    async def revoke(request: Request) -> JSONResponse:
        count = len(provider.refresh_tokens)
        for token in list(provider.refresh_tokens):
            provider._revoke_internal(refresh_token_str=token)
        return JSONResponse({"revoked": count})

    @server.custom_route("/test/require", methods=["POST"])
    async def require(request: Request) -> JSONResponse:
        scope = request.query_params["scope"]
        if scope not in settings.required_scopes:  # the middleware holds this very list
            settings.required_scopes.append(scope)
        return JSONResponse({"required": settings.required_scopes})

    @server.custom_route("/test/log", methods=["GET"])
    async def asked(request: Request) -> JSONResponse:
        return JSONResponse(provider.asked)

    return server, provider, settings


def namingScopes(app: Any, settings: AuthSettings) -> Any:
    """The package's 403 ``insufficient_scope`` names no ``scope``, which the MCP spec says
    a server should (RFC 6750 §3): it is added here, the scopes the server requires."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and message.get("status") == 403:
                headers = []
                for name, value in message.get("headers", []):
                    if name.lower() == b"www-authenticate" and b"insufficient_scope" in value:
                        value += f', scope="{" ".join(settings.required_scopes)}"'.encode()
                    headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, sending)

    return wrapped


async def serve(sock: socket.socket, base: str) -> None:
    import uvicorn

    server, _, settings = build(base)
    app = namingScopes(server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1"), settings)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: mcp_oauth_server.py PORT\n")
        raise SystemExit(2)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(args[0])))
    sock.listen(128)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sys.stdout.write(f"{base}/mcp\n")
    sys.stdout.flush()
    anyio.run(serve, sock, base)


if __name__ == "__main__":
    main()


