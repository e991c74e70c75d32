"""An MCP server's resources, for the model: three tools, named and shaped as Codex's.

``list_mcp_resources`` and ``list_mcp_resource_templates`` (``server`` optional,
``cursor`` with a server: one page at a time, the model is told the next cursor)
and ``read_mcp_resource`` (``server``, ``uri``). They are offered while a server
of the session declares resources; each listing asks the server afresh, so a
``notifications/resources/list_changed`` needs nothing held here to be followed.

Bounds: a page shows at most ``MAX_LISTED`` entries (descriptions cut); a read
gives the model at most ``mcpResourceBytes`` of text (the head, then how much
was left out) and never a blob's bytes (what it is, and its size: the editor
shows it); the whole answer is cut as any MCP tool result is.

Permission: a listing sends the server nothing the model chose but a cursor the
server gave, and runs without asking. A read sends the model's URI, and goes
through the server's rule as a tool call does (``MCPServers.decision`` with the
pseudo tool ``resources/read``): asked, unless the user answered "always" for
the server's reads in this session, or the server is trusted (a read changes
nothing, as a trusted read-only tool). Plan mode allows reads (they are reads).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError

from ..engine.secrets import redact, redactAll
from ..render import textContent, truncateMiddle
from . import toolset
from .wire import CallFailed

if TYPE_CHECKING:
    from ..engine.tools.registry import Tool
    from .link import ServerLink

LIST, TEMPLATES, READ = "list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource"
NAMES = (LIST, TEMPLATES, READ)
#: The pseudo tool name a server's reads are remembered under (``remembered`` in the registry).
READ_KEY = "resources/read"
#: The most entries of one page the model is shown, and of each description.
MAX_LISTED = 200
DESCRIPTION_CUT = 300
URI_LIMIT = 8192

_METHODS = {LIST: ("resources/list", "resources"), TEMPLATES: ("resources/templates/list", "resourceTemplates")}
_SERVER = {"type": "string", "description": "The MCP server's name (as in /mcp)."}


def engineTools() -> dict[str, Tool]:
    """The three tools; each call goes back through the turn (``ToolContext.delegate``)."""
    from ..engine.tools.registry import Tool

    cursor = {"type": "string", "description": "The nextCursor a previous page gave (needs server)."}
    listing = {"type": "object", "properties": {"server": {**_SERVER, "description": _SERVER["description"] +
                                                           " Leave out to list every server's first page."},
                                                "cursor": cursor}}
    specs = [
        (LIST, "List the resources (files, documents, records) MCP servers of this session offer, one page at a "
               "time. Read one with read_mcp_resource.", listing, "read"),
        (TEMPLATES, "List the resource templates (URI patterns such as file:///{path}) MCP servers offer; fill one "
                    "in and read it with read_mcp_resource.", listing, "read"),
        (READ, "Read one resource of an MCP server by its URI (from list_mcp_resources, a template, or a resource "
               "link in a tool's result).",
         {"type": "object", "properties": {"server": _SERVER, "uri": {"type": "string", "description": "The URI."}},
          "required": ["server", "uri"]}, "read"),
    ]
    return {name: Tool(name=name, description=description, parameters=schema,
                       handler=lambda ctx, /, _name=name, **arguments: ctx.delegate(_name, arguments),
                       passthrough=True, title=name.replace("_", " "), kind=kind)
            for name, description, schema, kind in specs}


def permissionText(server: str, uri: str) -> str:
    return f"The MCP server **{server}** would be asked for the resource\n\n`{truncateMiddle(uri, 2000)}`"


def _text(value: Any, limit: int = DESCRIPTION_CUT) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _entry(item: Any, key: str) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get(key), str):
        return None
    found = {key: item[key][:URI_LIMIT]}
    for name in ("name", "title", "mimeType", "description"):
        if (value := _text(item.get(name))) is not None:
            found[name] = value
    if isinstance(item.get("size"), int) and not isinstance(item.get("size"), bool):
        found["size"] = item["size"]
    return found


def page(server: str, result: Any, kind: str) -> dict[str, Any]:
    """One page of a listing as the model reads it: bounded entries, and the next cursor."""
    if not isinstance(result, dict) or not isinstance(result.get(kind), list):
        return {"server": server, "error": f"its answer holds no list of {kind}"}
    key = "uriTemplate" if kind == "resourceTemplates" else "uri"
    entries = [e for e in (_entry(item, key) for item in result[kind]) if e is not None]
    shown: dict[str, Any] = {"server": server, kind: entries[:MAX_LISTED]}
    if len(entries) > MAX_LISTED:
        shown["notShown"] = len(entries) - MAX_LISTED
    cursor = result.get("nextCursor")
    if isinstance(cursor, str) and cursor:
        shown["nextCursor"] = cursor[:URI_LIMIT]
        shown["more"] = "call again with this server and cursor for the next page"
    return shown


def contentText(server: str, contents: list[dict[str, Any]], limit: int) -> str:
    """What the model reads of a ``resources/read``: text up to ``limit`` bytes in all, blobs described."""
    parts, budget = [], limit
    for content in contents:
        uri, mime = content.get("uri"), content.get("mimeType") or "unknown type"
        if isinstance(content.get("text"), str):
            data = content["text"].encode("utf-8")
            head = data[:max(budget, 0)].decode("utf-8", "ignore")
            budget -= len(data)
            note = "" if len(head.encode()) == len(data) else (
                f"\n[… cut: {len(data):,} bytes in all, the first {len(head.encode()):,} shown "
                f"(HERMES_ACP_MCP_RESOURCE_BYTES)]")
            parts.append(f"[resource {uri} ({mime})]\n{head}{note}")
        elif isinstance(content.get("blob"), str):
            size = len(content["blob"]) * 3 // 4
            parts.append(f"[resource {uri}: {mime}, {size:,} bytes of binary data; not shown to the model"
                         f"{', shown to the user' if size * 4 // 3 <= toolset.MEDIA_LIMIT else ''}]")
    return "\n\n".join(parts) or f"(the server {server} returned no contents for it)"


async def run(links: Mapping[str, ServerLink], name: str, arguments: dict[str, Any], limit: int,
              track: Callable[[Any], None], permit: Callable[[str, str], Awaitable[str | None]],
              ) -> tuple[str, bool, dict[str, Any]]:
    """One call of the three tools: (what the model reads, failed, extras for the editor).
    ``links``: the session's ready servers that offer resources; ``track`` makes a request
    the turn's (its cancel cancels it); ``permit(server, uri)`` is None, or why a read may not run."""
    if not links:
        return toolset.failure("no MCP server of this session offers resources")
    server, cursor = arguments.get("server"), arguments.get("cursor")
    if server is not None and (not isinstance(server, str) or server not in links):
        return toolset.failure(f"{server!r} is not an MCP server of this session that offers resources; "
                               f"those that do: {', '.join(sorted(links))}")
    link = links.get(server) if server is not None else None
    secrets = tuple(secret for each in ([link] if link is not None else links.values()) for secret in each.spec.secrets)
    if name == READ:
        uri = arguments.get("uri")
        if link is None or not isinstance(uri, str) or not uri or len(uri) > URI_LIMIT:
            return toolset.failure("read_mcp_resource needs server (a server's name) and uri (a resource's URI)")
        refusal = await permit(server, uri)
        if refusal is not None:
            return toolset.failure(refusal, secrets)
        try:
            result = await _asked(link, "resources/read", {"uri": uri}, track)
        except CancelledError:
            return toolset.failure("interrupted by the user before it finished")
        except CallFailed as e:
            return toolset.failure(str(e), secrets)
        contents = result.get("contents") if isinstance(result, dict) else None
        if not isinstance(contents, list):
            return toolset.failure(f"{server} answered resources/read without contents")
        contents = [c for c in contents if isinstance(c, dict)]
        text = truncateMiddle(contentText(server, contents, limit), toolset.MODEL_TEXT_LIMIT)
        shown = toolset.editorContent({"content": [{"type": "resource", "resource": c} for c in contents]})
        return redact(text, secrets), False, redactAll({"content": shown}, secrets)
    method, kind = _METHODS[name]
    if cursor is not None and (link is None or not isinstance(cursor, str)):
        return toolset.failure("a cursor goes with the server whose page gave it")
    pages = []
    for each in ([link] if link is not None else list(links.values())):
        try:
            result = await _asked(each, method, {} if cursor is None else {"cursor": cursor}, track)
            pages.append(page(each.spec.name, result, kind))
        except CancelledError:
            return toolset.failure("interrupted by the user before it finished")
        except CallFailed as e:
            pages.append({"server": each.spec.name, "error": str(e)})
    shown = json.dumps(pages[0] if link is not None else {"servers": pages}, ensure_ascii=False, indent=1)
    text = redact(truncateMiddle(shown, toolset.MODEL_TEXT_LIMIT), secrets)
    return text, False, {"content": [textContent(truncateMiddle(text, toolset.EDITOR_TEXT_LIMIT))]}


async def _asked(link: ServerLink, method: str, params: dict[str, Any], track: Callable[[Any], None]) -> Any:
    d = link.ask(method, params)
    track(d)
    return await d
