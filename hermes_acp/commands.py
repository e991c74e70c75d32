"""Slash commands: answered by the agent itself, without the model.

They arrive as prompt text (``/model gpt-4o``); an unknown ``/word`` goes to
the model like any other text. Replies are Markdown (lists and tables), which
editors render; single lines would run together into one paragraph.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from . import __version__
from .catalog import ModelCatalog
from .client import ClientInfo
from .config import Endpoint, Settings, stateDatabase
from .engine.access import EDIT_MODES, PLAN
from .engine.background import BackgroundError, BackgroundProcesses
from .engine.secrets import redact, secretValues
from .engine.skills import shortened
from .interfaces import ISessionOptions, ISessionStore, IUpdateChannel
from .jsonrpc import JSONRPCError
from .mcp.registry import MCPServers
from .options import MODE_INFO
from .session_state import SessionState
from .store import timestamp
from .updates import usageUpdate

if TYPE_CHECKING:
    from .skillcommands import SkillCommands
    from twisted.internet.defer import Deferred

    from .rewind import Rewinds

#: How long ``/model`` waits for the endpoint's model list when it is still on its way.
CATALOG_WAIT = 3.0
COMMANDS: dict[str, tuple[str, str | None]] = {
    "help": ("List the slash commands", None),
    "model": ("Show or switch the model", "model name to switch to"),
    "mode": ("Show or switch the edit mode", "default, accept_edits, dont_ask or plan"),
    "plan": ("Enter plan mode: the agent reads and plans, changes nothing, and asks you to approve its plan", None),
    "tools": ("List the tools the agent can use", None),
    "mcp": ("List this session's MCP servers, their state and tools; sign in to or out of one",
            "login NAME or logout NAME (optional)"),
    "context": ("Show how much of the context window the conversation uses", None),
    "compact": ("Summarise the older part of the conversation to free context (alias /compress)",
                "what the summary should keep (optional)"),
    "reset": ("Clear the conversation history (the transcript stays)", None),
    "rewind": ("List the turns, or go back to before turn N: the agent's file changes since and the "
               "conversation from there are taken back", "turn number (optional: without it, the list)"),
    "undo": ("Take back the last turn: the files the agent changed in it, and the turn itself", None),
    "title": ("Show or set this session's title", "new title"),
    "usage": ("Show token usage for this session", None),
    "doctor": ("Versions, endpoint, capabilities and where logs go", None),
    "ps": ("List this session's background processes", None),
    "kill": ("End one of this session's background processes", "its number from /ps"),
    "memory": ("Show the agent's memory: its notes (MEMORY.md) and your profile (USER.md)", None),
}

#: Other names of commands (Hermes' own name for /compact).
ALIASES = {"compress": "compact"}


def availableCommands() -> list[dict[str, Any]]:
    commands = []
    for name, (description, hint) in COMMANDS.items():
        command: dict[str, Any] = {"name": name, "description": description}
        if hint:
            command["input"] = {"hint": hint}
        commands.append(command)
    return commands


def commandNames() -> frozenset[str]:
    """The agent's own command names, aliases included (no skill may take one)."""
    return frozenset(COMMANDS) | frozenset(ALIASES)


def slashCommand(text: str, blocks: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(name, argument) when the prompt is only text and starts with a known /command."""
    if not text.startswith("/") or any(b.get("type") != "text" for b in blocks):
        return None
    name, _, argument = text[1:].partition(" ")
    name = name.strip().lower()
    name = ALIASES.get(name, name)
    return (name, argument.strip()) if name in COMMANDS else None


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@attrs.frozen
class Commands:
    """The slash commands of one connection, and what they work with."""

    options: ISessionOptions
    store: ISessionStore
    updates: IUpdateChannel
    catalog: ModelCatalog
    client: ClientInfo
    endpointSource: Callable[[], Endpoint]
    settings: Settings
    mcp: MCPServers
    #: Every session's background processes (``/ps``, ``/kill``; None: there are none).
    background: BackgroundProcesses | None = None
    #: The sessions' skills, as commands (None: none).
    skills: SkillCommands | None = None
    #: ``/rewind`` and ``/undo`` (None: not offered on this connection).
    rewinds: Rewinds | None = None

    async def run(self, state: SessionState, name: str, argument: str,
                  track: Callable[[Deferred[Any]], None] = lambda d: None) -> str:
        """The command's reply text; a bad argument is explained, not raised. ``track``
        hands the turn a request to the editor the command makes (a cancel withdraws it)."""
        try:
            if name in ("rewind", "undo"):
                if self.rewinds is None:
                    return f"/{name} is not available here."
                return await getattr(self.rewinds, name)(state, argument, track)
            return await getattr(self, f"_{name}")(state, argument)
        except JSONRPCError as e:
            return f"/{name}: {e.message.removeprefix('Invalid params: ')}"

    async def _help(self, state: SessionState, argument: str) -> str:
        lines = ["**Slash commands**", ""]
        for name, (description, hint) in COMMANDS.items():
            usage = f"/{name} <{hint}>" if hint else f"/{name}"
            lines.append(f"- `{usage}`: {description}")
        skills = self.skills.commandSkills(self.skills.current(state)) if self.skills is not None else []
        if skills:
            lines += ["", "**Skills** (each runs a turn with the skill's instructions)", ""]
            lines += [f"- `/{skill.name}`: {shortened(skill.description, 200)}" for skill in skills]
        prompts = self.mcp.promptCommands(state)
        if prompts:  # an MCP server's prompts start a model turn with its messages
            lines += ["", "**MCP prompts**", ""]
            lines += [f"- `/{c['name']}{' ' + c['input']['hint'] if 'input' in c else ''}`: {c['description']}"
                      for c in prompts]
        lines += ["", "Other text starting with `/` goes to the model as a normal message."]
        return "\n".join(lines)

    async def _model(self, state: SessionState, argument: str) -> str:
        await self.catalog.settled(CATALOG_WAIT)  # a one-shot prompt runs before the list arrives
        models = self.catalog.models()
        if argument:
            self.options.setModel(state, argument)
            known = "" if argument in models else " (not in the endpoint's model list; it is used as given)"
            return f"Model switched to `{argument}`{known}."
        lines = [f"Current model: `{state.model}`", ""]
        if state.model and state.model not in models:
            lines.append(f"- `{state.model}` (current; not in the endpoint's model list)")
        lines += [f"- `{m}`" + (" (current)" if m == state.model else "") for m in models]
        lines += ["", "Switch with `/model NAME`, or in the editor's model picker."]
        return "\n".join(lines)

    async def _mode(self, state: SessionState, argument: str) -> str:
        if argument:
            self.options.setMode(state, argument)
            return f"Mode switched to `{argument}`: {MODE_INFO[argument][1]}"
        lines = [f"Current mode: `{state.mode}`", ""]
        lines += [f"- `{m}`{' (current)' if m == state.mode else ''}: {MODE_INFO[m][1]}" for m in EDIT_MODES]
        return "\n".join(lines)

    async def _plan(self, state: SessionState, argument: str) -> str:
        reply = await self._mode(state, PLAN)
        if argument:  # nothing the user typed is dropped without a word
            reply += "\n\nThe text after `/plan` was not sent to the model: send the task as your next prompt."
        return reply

    async def _tools(self, state: SessionState, argument: str) -> str:
        tools = {**self.options.agentFor(state).activeTools(), **self.mcp.toolsFor(state)[0]}
        lines = [f"**Tools** ({len(tools)})", ""]
        lines += [f"- `{tool.name}`: {tool.description.split('. ')[0][:100]}" for tool in tools.values()]
        return "\n".join(lines)

    async def _mcp(self, state: SessionState, argument: str) -> str:
        verb, _, name = argument.partition(" ")
        if verb == "login" and name.strip():
            return await self.mcp.login(state, name.strip())
        if verb == "logout" and name.strip():
            return self.mcp.logout(state, name.strip())
        if argument:
            return "/mcp: use `/mcp`, `/mcp login NAME` or `/mcp logout NAME`."
        return self.mcp.describe(state)

    async def _context(self, state: SessionState, argument: str) -> str:
        from .engine.instructions import projectInstructions

        found = projectInstructions(state.cwd).files
        files = ", ".join(f"`{path}`" for path in found) or "none (AGENTS.md, HERMES.md or CLAUDE.md)"
        if not state.history:
            return f"The conversation is empty (no messages yet).\n\nProject instructions: {files}"
        roles: dict[str, int] = {}
        for message in state.history:
            roles[message.get("role", "?")] = roles.get(message.get("role", "?"), 0) + 1
        size, used = self.catalog.window(state.model), state.contextUsed
        counts = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
        return "\n".join([
            "| | |",
            "|---|---|",
            f"| Messages | {len(state.history)} ({counts}) |",
            f"| Model | `{state.model}` |",
            f"| Context used | {used:,} of {size:,} tokens ({100 * used // max(size, 1)}%) |",
            f"| Project instructions | {files} |",
        ])

    async def _reset(self, state: SessionState, argument: str) -> str:
        await self.store.replaceHistory(state, [])
        state.contextUsed = 0
        self.updates.send(state, usageUpdate(state, self.catalog))
        return "Conversation history cleared. The model starts fresh; the transcript above stays for you."

    async def _title(self, state: SessionState, argument: str) -> str:
        if not argument:
            return f"Title: {state.title or '(none yet)'}"
        state.title, state.autoTitle = argument[:200], False  # the user's title wins over the model's
        self.updates.send(state, {"sessionUpdate": "session_info_update", "title": state.title, "updatedAt": timestamp()})
        await self.store.save(state)
        return f"Title set: {state.title}"

    async def _usage(self, state: SessionState, argument: str) -> str:
        totals = state.usageTotals
        cost = "" if state.cost is None else f"\n\nCost of the session so far, as the endpoint reported it: ${state.cost:.4f}"
        if not totals:
            return "No model requests in this session since the agent started." + cost
        lines = ["Token usage since the agent started:", "", "| tokens | count |", "|---|---|"]
        return "\n".join(lines + [f"| {k} | {v:,} |" for k, v in totals.items()]) + cost

    async def _memory(self, state: SessionState, argument: str) -> str:
        from .engine_factory import MEMORY_SNAPSHOT, memoryStore

        memory = memoryStore(self.settings)
        if memory is None:
            return "Memory is turned off in config.yaml (`memory.memory_enabled`, `memory.user_profile_enabled`)."
        frozen = state.config.get(MEMORY_SNAPSHOT)
        return memory.describe(frozen if isinstance(frozen, str) else None)

    def _protection(self) -> str:
        from .engine.sandbox import describe, probe

        enabled = self.settings.sandbox != "off"
        local = describe(enabled, self.settings.sandboxNetwork)
        if not self.client.terminal:
            return local
        if enabled and probe().available:
            return f"run here, in the sandbox, not in the editor's terminals (they would not confine them): {local}"
        return f"run in the editor's terminals, judged as unconfined: {local}"

    def _images(self, state: SessionState) -> str:
        """Whether the session's model is shown images, and who describes them otherwise."""
        sees = {True: "yes", False: "no", None: "unknown, so it is shown them"}[self.catalog.sees(state.model)]
        vision = (f"`{self.settings.visionModel}` answers vision_analyze" if self.settings.visionModel
                  else "vision_analyze is not offered (set HERMES_ACP_VISION_MODEL)")
        return f"the model sees them: {sees} (HERMES_ACP_MODEL_VISION={self.settings.modelVision}); {vision}"

    async def _doctor(self, state: SessionState, argument: str) -> str:
        from .engine.tools.websearch import searchStatus  # the engine's tools load with the first agent

        endpoint = self.endpointSource()
        key = "present" if endpoint.keyPresent else "not set"
        rows = [
            ("Version", f"hermes-acp {__version__} on Python {platform.python_version()} ({sys.platform})"),
            ("Libraries", f"Twisted {_version('twisted')}, zope.interface {_version('zope.interface')}, "
                          f"attrs {_version('attrs')}"),
            ("Endpoint", f"{endpoint.shownURL} (provider {endpoint.provider}, key {key})"),
            ("Model", f"`{state.model}`"),
            ("Problems", "; ".join(endpoint.problems()) or "none"),
            ("Client", f"{self.client.info.get('name', 'unknown')} {self.client.info.get('version', '')}".rstrip()),
            ("Client offers", ", ".join(self.client.offers()) or "nothing beyond the basics"),
            ("Commands", self._protection()),
            ("MCP servers", self.mcp.summary(state)),
            ("Web search", searchStatus()[1]),
            ("Images", self._images(state)),
            ("Skills", "none" if self.skills is None else self.skills.describe(state).replace("\n", "\n  - ")),
            ("Session state", str(stateDatabase())),
            ("Logs", "stderr of this process (your editor's agent log); `hermes-acp --check` from a terminal"),
        ]
        return "\n".join(f"- **{name}:** {value}" for name, value in rows)

    async def _ps(self, state: SessionState, argument: str) -> str:
        owner = self.background.find(state.sessionId) if self.background is not None else None
        procs = owner.processes() if owner is not None else []
        if not procs:
            return "No background processes in this session."
        lines = ["| # | status | pid | uptime | output | command |", "|---|---|---|---|---|---|"]
        for entry in (proc.describe() for proc in procs):
            status = entry["status"] if entry["status"] == "running" else (
                f"{entry['completion_reason']}, exit code {entry['exit_code']}")
            command = _shownCommand(entry["command"]).replace("|", "\\|").replace("`", "'")
            lines.append(f"| {entry['number']} | {status} | {entry['pid']} | {entry['uptime_seconds']} s | "
                         f"{entry['output_bytes']:,} bytes | `{command}` |")
        return "\n".join(lines + ["", "End one with `/kill N`."])

    async def _kill(self, state: SessionState, argument: str) -> str:
        owner = self.background.find(state.sessionId) if self.background is not None else None
        if not argument:
            return "/kill: which one? Give its number from `/ps`, e.g. `/kill 1`."
        if owner is None:
            return "No background processes in this session."
        try:
            proc = owner.find(argument)
        except BackgroundError as e:
            return f"/kill: {e}".replace("process(action='list') lists them", "`/ps` lists them")
        if not owner.kill(proc, "killed", "user./kill", wait=0):
            return f"#{proc.number} has already ended (exit code {proc.exitCode})."
        return f"Ending #{proc.number} (`{_shownCommand(proc.command)}`) and everything it started."


def _shownCommand(command: str) -> str:
    """A background process's command as ``/ps`` and ``/kill`` show it: its first line, cut, redacted."""
    return redact((command.strip().splitlines() or [""])[0][:80], secretValues())
