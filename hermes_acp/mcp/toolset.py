"""An MCP server's tools as the model and the editor see them.

Names: ``mcp__<server>__<tool>``, sanitized to ``[A-Za-z0-9_-]`` and at most 64
characters (what model APIs accept); a name that is too long, or that another
tool of the session already has, ends in a short hash of the real names
instead. Each exposed name routes back to its server and real tool name.

Results: the model reads the text blocks (``structuredContent`` as JSON when
there is no text; other blocks as a short line saying what they were), and
sees the images (``modelImages``: the engine checks them and shows them to a
model that can see, ``engine.images``); the editor gets every block as ACP
content. ``isError`` fails the call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..engine.secrets import redact, redactAll
from ..render import CONTENT_LIMIT, fenced, textContent, truncateMiddle

if TYPE_CHECKING:
    from ..engine.tools.registry import Tool
    from .specs import ServerSpec

NAME_LIMIT = 64
#: What the model reads of one result, at most (as other tools' outputs, it is cut in the middle).
MODEL_TEXT_LIMIT = 100 * 1024
#: Media bigger than this (base64 bytes) is described to the editor instead of shown.
MEDIA_LIMIT = 4 * 1024 * 1024
DESCRIPTION_LIMIT = 4096
#: The most tools, and bytes of their definitions, one server may offer the model.
MAX_TOOLS = 128
MAX_TOOL_BYTES = 256 * 1024
#: The most the editor is shown of one result: text (UTF-8 bytes) and media (base64 bytes) in all.
EDITOR_TEXT_LIMIT = 64 * 1024
EDITOR_MEDIA_LIMIT = 8 * 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@attrs.frozen
class Route:
    """One exposed tool: where it goes, and what its server said of it."""

    exposed: str
    server: str
    tool: str
    definition: dict[str, Any] = attrs.field(eq=False, repr=False)
    trusted: bool = False
    #: What the editor gave its server that may be a credential (kept out of what the model reads).
    secrets: tuple[str, ...] = attrs.field(default=(), eq=False, repr=False)

    @property
    def annotations(self) -> dict[str, Any]:
        value = self.definition.get("annotations")
        return value if isinstance(value, dict) else {}

    @property
    def title(self) -> str:
        return f"{self.server}: {self.tool}"

    @property
    def readOnly(self) -> bool:
        """Only a trusted server's word counts."""
        return self.trusted and self.annotations.get("readOnlyHint") is True

    @property
    def kind(self) -> str:
        """The ACP tool kind: from the annotations of a trusted server, else ``other``."""
        if not self.trusted:
            return "other"
        hints = self.annotations
        if hints.get("readOnlyHint") is True:
            return "fetch" if hints.get("openWorldHint") is True else "read"
        if hints.get("destructiveHint") is True:
            return "delete"
        return "edit" if hints.get("readOnlyHint") is False else "other"


def exposedName(server: str, tool: str, taken: set[str]) -> str:
    """The model's name for ``tool`` of ``server``, unique among ``taken``, and never
    over ``NAME_LIMIT`` (whatever names a server chose to crowd it with)."""
    name = f"mcp__{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= NAME_LIMIT and name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
    for count in itertools.count():
        suffix = f"_{digest}" + (f"{count}" if count else "")
        candidate = f"{name[: NAME_LIMIT - len(suffix)]}{suffix}"
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable")


@attrs.define
class Accepted:
    """The tool definitions the model can be offered, gathered page by page: each
    with a name and an object schema (a model API refuses any other), within the
    bounds of count and size (a server cannot fill the context with its tools).
    Once ``full``, the rest are only counted, and its caller reads no more pages."""

    kept: list[dict[str, Any]] = attrs.Factory(list)
    left: list[str] = attrs.Factory(list)
    size: int = 0
    #: Tools past the bounds.
    over: int = 0

    @property
    def full(self) -> bool:
        return self.over > 0

    def add(self, tools: list[Any]) -> None:
        for tool in tools:
            if self.full:
                self.over += 1
                continue
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
                self.left.append("a tool without a name")
                continue
            schema = tool.get("inputSchema", {})
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                self.left.append(f"{tool['name'][:80]!r}: its input schema is not an object")
                continue
            self.size += len(json.dumps(tool, ensure_ascii=False, default=str))
            if len(self.kept) >= MAX_TOOLS or self.size > MAX_TOOL_BYTES:
                self.over += 1
                continue
            self.kept.append(tool)

    def leftOut(self, unread: bool = False) -> list[str]:
        """A line for each tool left out; ``unread`` when pages were left unread."""
        if not self.over:
            return list(self.left)
        rest = " (and its further pages, not read)" if unread else ""
        return [*self.left, f"{self.over} more{rest}: over {MAX_TOOLS} tools or {MAX_TOOL_BYTES // 1024} KB of "
                            "definitions"]


def accepted(tools: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """``Accepted`` for one list: the tools kept, and a line for each left out."""
    gathered = Accepted()
    gathered.add(tools)
    return gathered.kept, gathered.leftOut()


def routes(spec: ServerSpec, tools: list[dict[str, Any]], taken: set[str]) -> list[Route]:
    """Routes for one server's tools; ``taken`` grows with their names."""
    found = []
    for definition in tools:
        exposed = exposedName(spec.name, definition["name"], taken)
        taken.add(exposed)
        found.append(Route(exposed, spec.name, definition["name"], definition, spec.trusted, tuple(spec.secrets)))
    return found


def parameters(definition: dict[str, Any]) -> dict[str, Any]:
    """The tool's input schema, as given, as a function's parameters."""
    schema = definition.get("inputSchema")
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema.setdefault("type", "object")
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


def engineTool(route: Route) -> Tool:
    """The engine's tool for ``route``: its call goes back through the turn (``ToolContext.delegate``)."""
    from ..engine.tools.registry import Tool

    description = str(route.definition.get("description") or route.definition.get("title") or route.tool)
    return Tool(
        name=route.exposed,
        description=f"[{route.server} MCP server] {description[:DESCRIPTION_LIMIT]}",
        parameters=parameters(route.definition),
        handler=lambda ctx, /, **arguments: ctx.delegate(route.exposed, arguments),
        passthrough=True, title=route.title, kind=route.kind,
        mayWrite=not route.readOnly,  # a server's tool may change the session's folders too
    )


def permissionText(route: Route, arguments: dict[str, Any]) -> str:
    """What the user reads before allowing a call."""
    lines = [f"The MCP server **{route.server}** would run its tool **{route.tool}**."]
    description = str(route.definition.get("description") or "").strip()
    if description:
        lines.append(description.splitlines()[0][:300])
    hints = [f"{name.removesuffix('Hint')}: {value}" for name, value in route.annotations.items()
             if name.endswith("Hint") and isinstance(value, bool)]
    if hints:
        whose = "" if route.trusted else " (the server's own claims; it is not marked trusted)"
        lines.append(f"Annotations{whose}: {', '.join(hints)}")
    shown = json.dumps(arguments, ensure_ascii=False, indent=2)
    lines.append(fenced(truncateMiddle(shown, CONTENT_LIMIT), "json"))
    return "\n\n".join(lines)


def _size(data: Any) -> str:
    return f"{len(data) * 3 // 4:,} bytes" if isinstance(data, str) else "unknown size"


def _readHint(server: str | None, uri: Any) -> str:
    """How the model reads a resource a result names (``resources.READ``)."""
    if server is None or not isinstance(uri, str):
        return ""
    return f"; read it with read_mcp_resource(server={json.dumps(server)}, uri={json.dumps(uri)})"


def modelLine(block: dict[str, Any], server: str | None = None) -> str | None:
    """One content block as the model reads it; a resource's line says how to read it
    from ``server``."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "image":
        return (f"[image: {block.get('mimeType', 'unknown type')}, {_size(block.get('data'))}; shown to the user, "
                "and to you after the tool results]")
    if kind == "audio":
        return f"[{kind}: {block.get('mimeType', 'unknown type')}, {_size(block.get('data'))}; shown to the user]"
    if kind == "resource_link":
        return f"[resource link: {block.get('name') or block.get('uri')} <{block.get('uri')}>{_readHint(server, block.get('uri'))}]"
    if kind == "resource":
        resource = block.get("resource") if isinstance(block.get("resource"), dict) else {}
        if isinstance(resource.get("text"), str):
            return f"[resource {resource.get('uri')}]\n{resource['text']}"
        return (f"[resource {resource.get('uri')}: {resource.get('mimeType', 'binary')}, {_size(resource.get('blob'))}"
                f"{_readHint(server, resource.get('uri'))}]")
    return f"[{kind} content]" if isinstance(kind, str) else None


def modelText(result: dict[str, Any], server: str | None = None) -> str:
    blocks = _blocks(result)
    lines = [line for line in (modelLine(block, server) for block in blocks) if line is not None]
    hasText = any(b.get("type") in ("text", "resource") for b in blocks)
    structured = result.get("structuredContent")
    if structured is not None and not hasText:
        lines.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(lines).strip() or "(the tool returned nothing)"
    return truncateMiddle(text, MODEL_TEXT_LIMIT)


def _optional(block: dict[str, Any], *names: str) -> dict[str, Any]:
    """The optional fields of a block that have the type ACP gives them."""
    found: dict[str, Any] = {}
    for name in names:
        value = block.get(name)
        if name == "size":
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
                found[name] = value
        elif isinstance(value, str):
            found[name] = value
    return found


def _blocks(result: dict[str, Any]) -> list[dict[str, Any]]:
    content = result.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _editorBlock(block: dict[str, Any]) -> dict[str, Any] | None:
    """One MCP content block as an ACP content block (fields ACP knows, bounded)."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": truncateMiddle(str(block.get("text", "")), CONTENT_LIMIT)}
    if kind in ("image", "audio") and isinstance(block.get("data"), str) and isinstance(block.get("mimeType"), str):
        if len(block["data"]) > MEDIA_LIMIT:
            return {"type": "text", "text": f"({kind} of {_size(block['data'])}, too big to show)"}
        return {"type": kind, "data": block["data"], "mimeType": block["mimeType"]}
    if kind == "resource_link" and isinstance(block.get("uri"), str):
        return {"type": "resource_link", "uri": block["uri"], "name": str(block.get("name") or block["uri"]),
                **_optional(block, "mimeType", "title", "description", "size")}
    if kind == "resource" and isinstance(block.get("resource"), dict) and isinstance(block["resource"].get("uri"), str):
        resource = block["resource"]
        shown = {"uri": resource["uri"], **_optional(resource, "mimeType")}
        if isinstance(resource.get("text"), str):
            return {"type": "resource", "resource": {**shown, "text": truncateMiddle(resource["text"], CONTENT_LIMIT)}}
        if isinstance(resource.get("blob"), str) and len(resource["blob"]) <= MEDIA_LIMIT:
            return {"type": "resource", "resource": {**shown, "blob": resource["blob"]}}
        return {"type": "resource_link", "uri": resource["uri"], "name": resource["uri"], **_optional(resource, "mimeType")}
    return None


def _bounded(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As many blocks as fit the editor's budget, then a line saying how many more there were."""
    shown: list[dict[str, Any]] = []
    text = media = 0
    for index, block in enumerate(blocks):
        text += len(json.dumps(block.get("text") or block.get("resource", {}).get("text") or "", ensure_ascii=False))
        media += len(block.get("data") or block.get("resource", {}).get("blob") or "")
        if shown and (text > EDITOR_TEXT_LIMIT or media > EDITOR_MEDIA_LIMIT):
            shown.append({"type": "text", "text": f"({len(blocks) - index} more blocks not shown)"})
            break
        shown.append(block)
    return shown


def editorContent(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The result as ACP tool-call content."""
    blocks = _bounded([b for b in map(_editorBlock, _blocks(result)) if b])
    structured = result.get("structuredContent")
    if structured is not None and not any(b["type"] in ("text", "resource") for b in blocks):
        shown = json.dumps(structured, ensure_ascii=False, indent=2)
        blocks.append({"type": "text", "text": fenced(truncateMiddle(shown, CONTENT_LIMIT), "json")})
    if not blocks:
        blocks.append({"type": "text", "text": "(the tool returned nothing)"})
    return [{"type": "content", "content": block} for block in blocks]


def modelImages(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The result's images as the engine's tool images (``engine.images.attachment``'s keys;
    it checks each before the model sees it): inline ``image`` blocks, and image ``blob``s."""
    found = []
    for number, block in enumerate(_blocks(result), 1):
        if block.get("type") == "image":
            source, data = block, block.get("data")
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            source = block["resource"]
            data = source.get("blob")
        else:
            continue
        mime, uri = source.get("mimeType"), source.get("uri")
        if isinstance(data, str) and isinstance(mime, str) and mime.startswith("image/"):
            label = uri if isinstance(uri, str) else f"content block {number}"
            found.append({"label": label[:200], "mimeType": mime, "data": data})
    return found


def outcome(result: Any, secrets: Sequence[str], server: str | None = None) -> tuple[str, bool, dict[str, Any]]:
    """(what the model reads, failed, extras for the editor) of a ``tools/call`` result;
    ``secrets`` (what the editor gave the server: tokens) are taken out of both; the
    resources it names are readable from ``server``."""
    if not isinstance(result, dict):
        return failure("the server's answer is not a tool result")
    failed = result.get("isError") is True
    text = modelText(result, server)
    if failed and not text.startswith("Error"):
        text = f"Error: {text}"
    extras = redactAll({"content": editorContent(result)}, secrets)
    return redact(text, secrets), failed, {**extras, "images": modelImages(result)}


def failure(message: str, secrets: Sequence[str] = ()) -> tuple[str, bool, dict[str, Any]]:
    message = redact(message, secrets)
    return f"Error: {message}", True, {"content": [textContent(message)]}
