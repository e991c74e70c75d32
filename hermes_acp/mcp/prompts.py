"""An MCP server's prompts as slash commands: ``/mcp__SERVER__PROMPT args``.

Each prompt a ready server lists (``prompts/list``, at most ``mcpMaxPrompts`` a
server) is a command in the editor's ``available_commands_update``, named as its
tools are (``toolset.exposedName``: ``[A-Za-z0-9_-]``, at most 64 characters,
unique). The text after the name gives the prompt's arguments: ``name=value``
pairs, or values in the order the prompt declares them (quotes group words; the
words past the last argument join it). A required argument missing is a message
saying which, and how to give it; nothing is asked of the server then.

The server's answer (``prompts/get``) becomes the user's message of a model turn:
text as text, images as images, embedded resources' text as text, at most
``mcpResourceBytes`` of text in all (what was cut is said); a message of the
assistant role is marked as such.
"""

from __future__ import annotations

import shlex
from typing import Any

import attrs

from . import toolset

PREFIX = "/mcp__"
DESCRIPTION_CUT = 300
#: The most arguments of one prompt that are read (and their names' length): a server cannot
#: make a command's usage, or the parsing of its text, as big as it likes.
MAX_ARGUMENTS = 32
ARGUMENT_NAME_LIMIT = 100


@attrs.frozen
class PromptRoute:
    """One prompt command: its name, and the server prompt it asks for."""

    command: str
    server: str
    prompt: str
    definition: dict[str, Any] = attrs.field(eq=False, repr=False)

    @property
    def arguments(self) -> list[dict[str, Any]]:
        declared = self.definition.get("arguments")
        return [a for a in declared[:MAX_ARGUMENTS] if isinstance(a, dict) and isinstance(a.get("name"), str)
                and 0 < len(a["name"]) <= ARGUMENT_NAME_LIMIT] if isinstance(declared, list) else []

    @property
    def usage(self) -> str:
        return " ".join(a["name"] if a.get("required") is True else f"[{a['name']}]" for a in self.arguments)

    def available(self) -> dict[str, Any]:
        """The ACP ``AvailableCommand``."""
        description = str(self.definition.get("description") or self.definition.get("title") or self.prompt)
        command: dict[str, Any] = {"name": self.command,
                                   "description": f"[{self.server} MCP prompt] {description[:DESCRIPTION_CUT]}"}
        if self.arguments:
            command["input"] = {"hint": self.usage[:DESCRIPTION_CUT]}
        return command


def routes(server: str, prompts: list[dict[str, Any]], taken: set[str]) -> list[PromptRoute]:
    """Commands for one server's prompts; ``taken`` grows with their names."""
    found = []
    for definition in prompts:
        command = toolset.exposedName(server, definition["name"], taken)
        taken.add(command)
        found.append(PromptRoute(command, server, definition["name"], definition))
    return found


def split(text: str) -> tuple[str, str] | None:
    """(command name, the text after it) of a prompt that starts with ``/mcp__``."""
    if not text.startswith(PREFIX):
        return None
    name, _, rest = text[1:].partition(" ")
    name, _, more = name.partition("\n")
    return name.strip(), (more + " " + rest).strip() if more else rest.strip()


def parseArguments(route: PromptRoute, text: str) -> dict[str, str]:
    """The prompt's arguments from the command's text; ValueError says what is wrong."""
    declared = [a["name"] for a in route.arguments]
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"/{route.command}: the arguments could not be read ({e}); quote a value with spaces "
                         "in \"double quotes\"") from None
    given: dict[str, str] = {}
    positional: list[str] = []
    for word in words:
        name, equals, value = word.partition("=")
        if equals and name in declared:
            given[name] = value
        else:
            positional.append(word)
    open_ = [name for name in declared if name not in given]
    if positional and not open_:
        raise ValueError(f"/{route.command} takes {'no arguments' if not declared else 'only ' + route.usage}; "
                         f"{' '.join(positional)[:200]!r} is more than that")
    for index, name in enumerate(open_):
        if index >= len(positional):
            break
        given[name] = " ".join(positional[index:]) if index == len(open_) - 1 else positional[index]
    missing = [a for a in route.arguments if a.get("required") is True and a["name"] not in given]
    if missing:
        what = "; ".join(f"{a['name']}" + (f" ({str(a['description'])[:100]})" if a.get("description") else "")
                         for a in missing)
        raise ValueError(f"/{route.command} needs {what}. Usage: `/{route.command} {route.usage}` "
                         f"(values in that order, or name=value)")
    return given


def blocks(result: Any, route: PromptRoute, limit: int) -> list[dict[str, Any]]:
    """The user message of the turn (ACP content blocks) from a ``prompts/get`` result;
    ValueError when it holds no message."""
    messages = result.get("messages") if isinstance(result, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"/{route.command}: the server {route.server} sent no messages for it")
    found: list[dict[str, Any]] = []
    budget = limit
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), dict):
            continue
        content, role = message["content"], message.get("role")
        mark = "[assistant] " if role == "assistant" else ""
        kind = content.get("type")
        if kind == "image" and isinstance(content.get("data"), str) and str(content.get("mimeType", "")).startswith(
                "image/") and len(content["data"]) <= toolset.MEDIA_LIMIT:
            found.append({"type": "image", "data": content["data"], "mimeType": content["mimeType"]})
            continue
        line = toolset.modelLine(content, route.server) if kind != "text" else str(content.get("text", ""))
        if line is None:
            continue
        text = mark + line
        if len(text) > budget:
            text = text[:max(budget, 0)] + f"\n[… the prompt's messages were cut at {limit:,} characters " \
                                           "(HERMES_ACP_MCP_RESOURCE_BYTES)]"
        budget -= len(text)
        found.append({"type": "text", "text": text})
        if budget <= 0:
            break
    if not found:
        raise ValueError(f"/{route.command}: the server {route.server} sent no message content this agent can use")
    return found
