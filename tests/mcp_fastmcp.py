"""A real MCP server built with the PyPI ``mcp`` package (2.x), for interop tests.

  python tests/mcp_fastmcp.py stdio        newline-delimited JSON-RPC on stdin/stdout
                                           (nothing else is ever printed on stdout)
  python tests/mcp_fastmcp.py http PORT    streamable HTTP on http://127.0.0.1:PORT/mcp;
                                           the first stdout line is that URL (PORT 0: a free port)
  python tests/mcp_fastmcp.py sse PORT     the 2024-11-05 HTTP+SSE transport (the SDK's
                                           ``SseServerTransport``): the event stream at
                                           http://127.0.0.1:PORT/sse, printed as above

In mcp 2.x FastMCP is ``mcp.server.mcpserver.MCPServer`` (``mcp.server.fastmcp`` only
raises a ModuleNotFoundError pointing at the migration guide). The server is
dual-era: a connection (stdio) or request (HTTP) opening with ``initialize`` is
served the legacy protocol (sessions with Mcp-Session-Id over HTTP); one whose
first request carries the 2026-07-28 ``_meta`` envelope is served the modern one,
and a stdio process that served a modern request refuses ``initialize`` (-32022).

Tools: add(a, b) -> int, shout(text) -> str (upper-cased), pixel() -> a 1x1 PNG image,
stats(text) -> structured output (a model: length, words, upper), count(steps) ->
progress notifications then "counted N", nap(seconds) -> waits (for cancellation),
linked() -> a resource_link to note://greeting, teach(word) -> adds a prompt WORD and
sends notifications/prompts/list_changed, publish(word) -> adds a resource note://WORD and
sends notifications/resources/list_changed.
Resources: note://greeting (text), note://big (``MCP_BIG_BYTES`` bytes of text, default
1 MiB), note://slow (answers after 60 s), template note://echo/{word}. Prompts: review(code, style="brief"), slow(seconds).
``MCP_PID_FILE`` in the environment: the process writes its pid there at start.
"""

from __future__ import annotations

import os
import socket
import sys

import anyio
from pydantic import BaseModel

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.resources import TextResource
from mcp.types import ResourceLink

try:
    from .mcp_scripted import TINY_PNG
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mcp_scripted import TINY_PNG  # type: ignore[import-not-found, no-redef]


class TextStats(BaseModel):
    """Facts about a text (returned as structuredContent, plus its JSON as text)."""

    length: int
    words: int
    upper: str


def build() -> MCPServer:
    server = MCPServer("fastmcp-test", version="1.0", instructions="A test server built with the mcp package.",
                       log_level="WARNING")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Upper-case a text.")
    def shout(text: str) -> str:
        return text.upper()

    @server.tool(description="A 1x1 PNG image.")
    def pixel() -> Image:
        return Image(data=TINY_PNG, format="png")

    @server.tool(description="Length, word count and upper-case form of a text (structured output).")
    def stats(text: str) -> TextStats:
        return TextStats(length=len(text), words=len(text.split()), upper=text.upper())

    @server.tool(description="Report progress steps times, then answer.")
    async def count(steps: int, ctx: Context) -> str:
        for n in range(1, steps + 1):
            await ctx.report_progress(n, steps, f"step {n}")
            await anyio.sleep(0.02)
        return f"counted {steps}"

    @server.tool(description="Wait this many seconds, then answer.")
    async def nap(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"napped {seconds:g}s"

    @server.tool(description="A link to the greeting resource.")
    def linked() -> list[ResourceLink]:
        return [ResourceLink(type="resource_link", uri="note://greeting", name="greeting", mime_type="text/plain")]

    @server.tool(description="Add a prompt named WORD (and tell the client its prompts changed).")
    async def teach(word: str, ctx: Context) -> str:
        server.add_prompt(Prompt.from_function(lambda: f"You were taught {word}.", name=word,
                                               description=f"Taught at run time: {word}"))
        await ctx.session.send_prompt_list_changed()
        return f"taught {word}"

    @server.tool(description="Add a resource note://WORD (and tell the client its resources changed).")
    async def publish(word: str, ctx: Context) -> str:
        server.add_resource(TextResource(uri=f"note://{word}", name=word, text=f"published {word}",
                                         mime_type="text/plain"))
        await ctx.session.send_resource_list_changed()
        return f"published {word}"

    @server.resource("note://greeting", name="greeting", mime_type="text/plain", description="A greeting.")
    def greeting() -> str:
        return "hello from a resource"

    @server.resource("note://big", name="big", mime_type="text/plain", description="A large text.")
    def big() -> str:
        return "b" * int(os.environ.get("MCP_BIG_BYTES", str(1024 * 1024)))

    @server.resource("note://slow", name="slow", mime_type="text/plain", description="Takes a minute.")
    async def slowly() -> str:
        await anyio.sleep(60)
        return "late"

    @server.resource("note://echo/{word}", name="echo", mime_type="text/plain")
    def echo(word: str) -> str:
        return f"echo: {word}"

    @server.prompt(description="Answer after this many seconds (for cancellation).")
    async def slow(seconds: str) -> str:
        await anyio.sleep(float(seconds))
        return "slept"

    @server.prompt(description="Review a piece of code.")
    def review(code: str, style: str = "brief") -> str:
        return f"Please review this code ({style}):\n{code}"

    return server


async def _serve(server: MCPServer, port: int, transport: str) -> None:
    """Streamable HTTP at /mcp, or HTTP+SSE with its event stream at /sse; the URL goes to stdout first."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    path = "/mcp" if transport == "http" else "/sse"
    sys.stdout.write(f"http://127.0.0.1:{sock.getsockname()[1]}{path}\n")
    sys.stdout.flush()
    if transport == "http":
        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    else:
        app = server.sse_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("stdio", "http", "sse") or (args[0] != "stdio" and len(args) != 2):
        sys.stderr.write("usage: mcp_fastmcp.py stdio | http PORT | sse PORT\n")
        raise SystemExit(2)
    if os.environ.get("MCP_PID_FILE"):
        with open(os.environ["MCP_PID_FILE"], "w") as f:
            f.write(str(os.getpid()))
    server = build()
    if args[0] == "stdio":
        server.run("stdio")
    else:
        anyio.run(_serve, server, int(args[1]), args[0])


if __name__ == "__main__":
    main()
