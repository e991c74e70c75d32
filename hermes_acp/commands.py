"""Slash commands: answered by the agent itself, without the model.

They arrive as prompt text (``/model gpt-4o``); an unknown ``/word`` goes to
the model like any other text.
"""

from __future__ import annotations

import platform
import sys
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import stateDatabase
from .jsonrpc import JSONRPCError
from .options import MODE_INFO, checkMode, checkOption
from .sessions import MODES, SessionState
from .store import timestamp

if TYPE_CHECKING:
    from .acp import ACPAgent

COMMANDS: dict[str, tuple[str, str | None]] = {
    "help": ("List the slash commands", None),
    "model": ("Show or switch the model", "model name to switch to"),
    "mode": ("Show or switch the edit mode", "default, accept_edits or dont_ask"),
    "tools": ("List the tools the agent can use", None),
    "context": ("Show how much of the context window the conversation uses", None),
    "reset": ("Clear the conversation history (the transcript stays)", None),
    "title": ("Show or set this session's title", "new title"),
    "usage": ("Show token usage for this session", None),
    "doctor": ("Versions, endpoint, capabilities and where logs go", None),
}


def availableCommands() -> list[dict[str, Any]]:
    commands = []
    for name, (description, hint) in COMMANDS.items():
        command: dict[str, Any] = {"name": name, "description": description}
        if hint:
            command["input"] = {"hint": hint}
        commands.append(command)
    return commands


def slashCommand(text: str, blocks: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(name, argument) when the prompt is only text and starts with a known /command."""
    if not text.startswith("/") or any(b.get("type") != "text" for b in blocks):
        return None
    name, _, argument = text[1:].partition(" ")
    name = name.strip().lower()
    return (name, argument.strip()) if name in COMMANDS else None


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


async def runCommand(hub: ACPAgent, state: SessionState, name: str, argument: str) -> str:
    """The command's reply text; a bad argument is explained, not raised."""
    try:
        return await _COMMANDS[name](hub, state, argument)
    except JSONRPCError as e:
        return f"/{name}: {e.message.removeprefix('Invalid params: ')}"


async def _help(hub: ACPAgent, state: SessionState, argument: str) -> str:
    lines = ["Available commands:"]
    lines += [f"  /{name:<8} {description}" for name, (description, _) in COMMANDS.items()]
    lines.append("Other text starting with / goes to the model as a normal message.")
    return "\n".join(lines)


async def _model(hub: ACPAgent, state: SessionState, argument: str) -> str:
    models = hub.catalog.models()
    if argument:
        checkOption("model", argument, models)
        hub.lifecycle.switchModel(state, argument)
        hub.lifecycle.announceOptions(state)
        return f"Model switched to: {argument}"
    listed = "\n".join(f"  {'*' if m == state.model else ' '} {m}" for m in models)
    return f"Current model: {state.model}\nAvailable:\n{listed}"


async def _mode(hub: ACPAgent, state: SessionState, argument: str) -> str:
    if argument:
        hub.lifecycle.applyMode(state, checkMode(argument))
        return f"Mode switched to: {argument} ({MODE_INFO[argument][1]})"
    return f"Current mode: {state.mode}\n" + "\n".join(f"  {m}: {MODE_INFO[m][1]}" for m in MODES)


async def _tools(hub: ACPAgent, state: SessionState, argument: str) -> str:
    tools = hub.agentFor(state).activeTools()
    lines = [f"Available tools ({len(tools)}):"]
    for tool in tools.values():
        summary = tool.description.split(". ")[0]
        lines.append(f"  {tool.name}: {summary[:100]}")
    return "\n".join(lines)


async def _context(hub: ACPAgent, state: SessionState, argument: str) -> str:
    if not state.history:
        return "Conversation is empty (no messages yet)."
    roles: dict[str, int] = {}
    for message in state.history:
        roles[message.get("role", "?")] = roles.get(message.get("role", "?"), 0) + 1
    size = hub.settings.contextWindow
    used = state.contextUsed
    counts = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    return (
        f"Conversation: {len(state.history)} messages ({counts})\n"
        f"Model: {state.model}\n"
        f"Context usage: ~{used} / {size} tokens ({100 * used // max(size, 1)}%)"
    )


async def _reset(hub: ACPAgent, state: SessionState, argument: str) -> str:
    await hub.sessions.replaceHistory(state, [])
    state.contextUsed = 0
    return "Conversation history cleared. The model starts fresh; the transcript above stays for you."


async def _title(hub: ACPAgent, state: SessionState, argument: str) -> str:
    if not argument:
        return f"Title: {state.title or '(none yet)'}"
    state.title = argument[:200]
    hub.sendUpdate(state, {"sessionUpdate": "session_info_update", "title": state.title, "updatedAt": timestamp()})
    await hub.sessions.save(state)
    return f"Title set: {state.title}"


async def _usage(hub: ACPAgent, state: SessionState, argument: str) -> str:
    totals = state.usageTotals
    if not totals:
        return "No model requests in this session since the agent started."
    return "Token usage since the agent started:\n" + "\n".join(f"  {k}: {v}" for k, v in totals.items())


async def _doctor(hub: ACPAgent, state: SessionState, argument: str) -> str:
    endpoint = hub.endpointSource()
    client = hub.client
    return "\n".join(
        [
            f"hermes-acp {__version__} on Python {platform.python_version()} ({sys.platform})",
            f"Twisted {_version('twisted')}, openai {_version('openai')}",
            f"Endpoint: {endpoint.baseURL or '(none)'} (provider {endpoint.provider}, key {'present' if endpoint.keyPresent else 'not set'})",
            f"Model: {state.model}",
            f"Problems: {'; '.join(endpoint.problems()) or 'none'}",
            f"Client: {client.info.get('name', 'unknown')} {client.info.get('version', '')}".rstrip(),
            f"Client offers: {', '.join(clientOffers(client)) or 'nothing beyond the basics'}",
            f"Session state: {stateDatabase()}",
            "Logs: stderr of this process (your editor's agent log); `hermes-acp --check` from a terminal.",
        ]
    )


def clientOffers(client: Any) -> list[str]:
    """The client capabilities this agent uses, as the client advertised them."""
    offers = [f"fs.{name}" for name in ("readTextFile", "writeTextFile") if client.fs(name)]
    if client.terminal:
        offers.append("terminal")
    if client.notices:
        offers.append("session.notices")
    if client.supportsTerminalAuth():
        offers.append("terminal auth")
    return offers


_COMMANDS = {
    "help": _help,
    "model": _model,
    "mode": _mode,
    "tools": _tools,
    "context": _context,
    "reset": _reset,
    "title": _title,
    "usage": _usage,
    "doctor": _doctor,
}
