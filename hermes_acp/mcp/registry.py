"""Every session's MCP servers: started with the session, stopped with it.

A session gets the servers its new/load/resume/fork request lists, plus the
user's config.yaml servers. They start once the answer that made the session
known has been written (so they never delay it), each in the background;
``ready`` lets a prompt wait for the handshakes still pending, within the
startup bound. A session that lists the same servers again (a load of a live
session) keeps them; another list replaces them. Failures are told to the
user: a ``notice`` where the editor takes them, else a line of text at the
start of the next prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from ..client import ClientInfo
from ..config import Settings
from ..engine.approval import ALLOW_ALWAYS, REJECT_ALWAYS
from ..interfaces import IUpdateChannel
from ..session_state import SessionState
from . import prompts, resources
from .link import FAILED, NEEDS_LOGIN, READY, STARTING, ServerLink
from .specs import HTTP, ConfiguredServers, ServerSpec, merged
from .toolset import Route, engineTool, routes

if TYPE_CHECKING:
    from ..engine.tools.registry import Tool
    from .signin import SignIns

log = Logger()

ALLOW, DENY, ASK = "allow", "deny", "ask"
#: Servers start this long after the answer that made their session known (see ``attach``).
START_DELAY = 0.001


@attrs.define(eq=False)
class SessionServers:
    """One session's servers, its exposed tools, and what the user said of them."""

    specs: list[ServerSpec]
    #: The session's folders when they started (stdio servers start in the first; all are roots).
    folders: tuple[str, ...]
    links: dict[str, ServerLink]
    #: Exposed name -> route, and the engine's tools for them; rebuilt whole on every change.
    routes: dict[str, Route] = attrs.Factory(dict)
    tools: dict[str, Tool] = attrs.Factory(dict)
    #: (server, tool) -> ALLOW_ALWAYS or REJECT_ALWAYS, for the session.
    remembered: dict[tuple[str, str], str] = attrs.Factory(dict)
    #: Problems to tell at the start of the next prompt (editors without notices).
    held: list[tuple[str, str]] = attrs.Factory(list)
    #: Tools left out that the user was told of, by server.
    told: set[tuple[str, tuple[str, ...]]] = attrs.Factory(set)
    #: The servers' prompts as slash commands, by command name; rebuilt whole on every change.
    prompts: dict[str, prompts.PromptRoute] = attrs.Factory(dict)


@attrs.define(eq=False)
class MCPServers:
    """The MCP servers of one connection's sessions."""

    reactor: Any
    settings: Settings
    updates: IUpdateChannel
    client: ClientInfo
    configured: ConfiguredServers
    sessions: dict[str, SessionServers] = attrs.Factory(dict)
    #: OAuth sign-ins of HTTP servers (their tokens, the links shown to the user);
    #: given the editor's connection once it exists (``acp``), for URL elicitations.
    signIns: SignIns | None = None
    #: The commands before the prompts' in the editor's list: the agent's own and the skills'
    #: (``skillcommands.SkillCommands.listed``, wired by ``acp``).
    baseCommands: Callable[[SessionState], list[dict[str, Any]]] = lambda state: []

    # -- ownership ----------------------------------------------------------------------

    def attach(self, state: SessionState, listed: list[ServerSpec] | None) -> None:
        """Give the session these servers (and config.yaml's), starting them a moment
        later; ``listed`` None keeps the editor's servers it has."""
        current = self.sessions.get(state.sessionId)
        if listed is None:
            listed = [spec for spec in current.specs if spec.origin == "editor"] if current is not None else []
        configured, problems = self.configured.read()
        specs = [attrs.evolve(spec, trusted=True) if spec.name in self.settings.mcpTrusted else spec
                 for spec in merged(listed, configured)]
        if current is not None and (current.specs, current.folders) == (specs, state.roots) and all(
                link.state in (STARTING, READY) for link in current.links.values()):
            return  # the same servers in the same folders, still up
        if current is not None:
            self._stopLinks(current)
        # What the user said of a tool holds while its server is the same one.
        before = {spec.name: spec for spec in current.specs} if current is not None else {}
        same = {spec.name for spec in specs if before.get(spec.name) == spec}
        remembered = {key: answer for key, answer in (current.remembered if current else {}).items() if key[0] in same}
        servers = SessionServers(specs, state.roots, {}, remembered=remembered)
        self.sessions[state.sessionId] = servers
        for problem in problems:
            self.report(state, "MCP configuration problem", problem)
        for spec in specs:
            link = ServerLink(spec, self.reactor, self.settings, state.roots,
                              lambda link, state=state, servers=servers: self._changed(state, servers, link),
                              elicitation=tuple(mode for mode in ("form", "url") if self.client.elicitation(mode)),
                              oauth=self.signIns.clientFor(spec) if self.signIns is not None else None)
            servers.links[spec.name] = link
            log.debug("session {id}: starting MCP server {name} ({transport})", id=state.sessionId,
                      name=spec.name, transport=spec.transport)
        if servers.links:
            # Started a moment later, so the answer before this is written out first (it
            # would wait for the spawns); a prompt meanwhile already waits for them.
            self.reactor.callLater(START_DELAY, self._start, servers)

    def _start(self, servers: SessionServers) -> None:
        for link in servers.links.values():
            if link.state == STARTING:
                link.start()

    def detach(self, state: SessionState) -> Deferred[Any]:
        """The session is gone: stop its servers (fires once they are)."""
        servers = self.sessions.pop(state.sessionId, None)
        return succeed(None) if servers is None else self._stopLinks(servers)

    def _stopLinks(self, servers: SessionServers) -> Deferred[Any]:
        links, servers.links = list(servers.links.values()), {}
        servers.routes, servers.tools, servers.prompts = {}, {}, {}
        return gatherResults([link.stop() for link in links], consumeErrors=True).addErrback(
            lambda f: log.failure("stopping MCP servers failed", f))

    def stopAll(self) -> Deferred[Any]:
        """At exit: every server of every session."""
        sessions, self.sessions = list(self.sessions.values()), {}
        return gatherResults([self._stopLinks(servers) for servers in sessions], consumeErrors=True)

    # -- readiness, tools and calls ----------------------------------------------------

    def ready(self, state: SessionState) -> Deferred[None]:
        """Fires once no server of the session is still shaking hands (each start is
        bounded by the startup setting); never fails."""
        servers = self.sessions.get(state.sessionId)
        pending = [] if servers is None else [
            link.whenSettled() for link in servers.links.values() if link.state == STARTING]
        if not pending:
            return succeed(None)
        d = gatherResults(pending, consumeErrors=True)
        return d.addBoth(lambda _: None)

    def toolsFor(self, state: SessionState) -> tuple[dict[str, Tool], dict[str, Route]]:
        """The session's MCP tools for the engine, and where each goes: a turn keeps
        both, so a call goes to the tool the model was offered, whatever changes meanwhile."""
        servers = self.sessions.get(state.sessionId)
        return ({}, {}) if servers is None else (dict(servers.tools), dict(servers.routes))

    def call(self, state: SessionState, route: Route, arguments: dict[str, Any],
             onProgress: Callable[[dict[str, Any]], None],
             onElicit: Callable[[dict[str, Any]], Deferred[dict[str, Any]]] | None = None) -> Deferred[Any] | None:
        """The call's result (a Deferred), or None when its server is not up or no
        longer offers the tool."""
        servers = self.sessions.get(state.sessionId)
        link = None if servers is None else servers.links.get(route.server)
        if link is None or link.state != READY or not any(tool["name"] == route.tool for tool in link.tools):
            return None
        log.debug("session {id}: calling {tool} of MCP server {name}", id=state.sessionId, tool=route.tool,
                  name=route.server)
        return link.call(route.tool, arguments, onProgress, onElicit)

    def _changed(self, state: SessionState, servers: SessionServers, link: ServerLink) -> None:
        if self.sessions.get(state.sessionId) is not servers or servers.links.get(link.spec.name) is not link:
            return  # a link of servers that were replaced or stopped
        taken: set[str] = set()
        found: dict[str, Route] = {}
        for each in servers.links.values():
            if each.state == READY:
                found.update((route.exposed, route) for route in routes(each.spec, each.tools, taken))
        servers.routes = found
        servers.tools = {} if not found else _engineTools(found)
        if any(each.state == READY and each.hasResources for each in servers.links.values()):
            servers.tools.update(resources.engineTools())
        self._promptsChanged(state, servers)
        if link.state == FAILED:
            self.report(state, f"MCP server {link.spec.name} is not available", link.reason)
        elif link.state == NEEDS_LOGIN and self.signIns is not None:
            self.signIns.offer(state, link, self.report)
        elif link.state == READY and link.leftOut and (link.spec.name, tuple(link.leftOut)) not in servers.told:
            servers.told.add((link.spec.name, tuple(link.leftOut)))
            self.report(state, f"Some tools of MCP server {link.spec.name} are not offered",
                        "; ".join(link.leftOut))

    # -- resources and prompts -------------------------------------------------------------

    def resourceLinks(self, state: SessionState) -> dict[str, ServerLink]:
        """The session's ready servers that offer resources, by name."""
        servers = self.sessions.get(state.sessionId)
        return {} if servers is None else {
            name: link for name, link in servers.links.items() if link.state == READY and link.hasResources}

    def readableFrom(self, state: SessionState, server: str) -> str | None:
        """``server`` when the model can read the resources it names (it offers resources)."""
        return server if server in self.resourceLinks(state) else None

    def readRoute(self, state: SessionState, server: str) -> Route:
        """A read of ``server``'s resources, for the permission rule (``resources`` says why)."""
        spec = self.resourceLinks(state)[server].spec
        return Route(resources.READ, server, resources.READ_KEY, {"annotations": {"readOnlyHint": True}},
                     spec.trusted, tuple(spec.secrets))

    def promptCommands(self, state: SessionState) -> list[dict[str, Any]]:
        """The session's prompt commands, as ACP ``AvailableCommand`` entries."""
        servers = self.sessions.get(state.sessionId)
        return [] if servers is None else [route.available() for route in servers.prompts.values()]

    def promptFor(self, state: SessionState, name: str) -> tuple[prompts.PromptRoute, ServerLink] | None:
        """The prompt command ``name`` (exactly, else ignoring case) and its ready server."""
        servers = self.sessions.get(state.sessionId)
        if servers is None:
            return None
        route = servers.prompts.get(name) or next(
            (r for command, r in servers.prompts.items() if command.lower() == name.lower()), None)
        link = None if route is None else servers.links.get(route.server)
        return None if route is None or link is None or link.state != READY else (route, link)

    def _promptsChanged(self, state: SessionState, servers: SessionServers) -> None:
        """Rebuild the prompt commands; when they changed, the editor gets the new list."""
        taken: set[str] = set()
        found: dict[str, prompts.PromptRoute] = {}
        for each in servers.links.values():
            if each.state == READY:
                found.update((route.command, route) for route in prompts.routes(each.spec.name, each.prompts, taken))
        before = [route.available() for route in servers.prompts.values()]
        servers.prompts = found
        if before != [route.available() for route in found.values()] and state.announced:
            self.updates.send(state, {"sessionUpdate": "available_commands_update",
                                      "availableCommands": self.baseCommands(state) + self.promptCommands(state)},
                              journal=False)

    # -- permission ------------------------------------------------------------------------

    def decision(self, state: SessionState, route: Route) -> str:
        """ALLOW, DENY or ASK for a call of ``route``: what the user said for the
        session first; a trusted server's read-only tools, and every tool of a
        trusted server in the don't-ask mode, run without asking."""
        servers = self.sessions.get(state.sessionId)
        said = None if servers is None else servers.remembered.get((route.server, route.tool))
        if said == ALLOW_ALWAYS:
            return ALLOW
        if said == REJECT_ALWAYS:
            return DENY
        if route.readOnly or (route.trusted and state.mode == "dont_ask"):
            return ALLOW
        return ASK

    def remember(self, state: SessionState, route: Route, answer: str) -> None:
        servers = self.sessions.get(state.sessionId)
        if servers is not None and answer in (ALLOW_ALWAYS, REJECT_ALWAYS):
            servers.remembered[(route.server, route.tool)] = answer

    # -- telling the user ------------------------------------------------------------------

    def report(self, state: SessionState, title: str, description: str, severity: str = "warning") -> None:
        if state.sessionId not in self.sessions:
            return  # (a sign-in that ended after its session did: nobody to tell)
        if self.client.notices:
            self.updates.notice(state, severity, title, description, journal=False)
            return
        servers = self.sessions.get(state.sessionId)
        if servers is not None:
            servers.held.append((title, description))

    def tellHeld(self, state: SessionState) -> None:
        """In a prompt turn: the problems held back for an editor without notices."""
        servers = self.sessions.get(state.sessionId)
        if servers is not None:
            held, servers.held = servers.held, []
            for title, description in held:
                self.updates.notice(state, "warning", title, description)

    def summary(self, state: SessionState) -> str:
        """One line: how many servers the session has, and how many are up."""
        servers = self.sessions.get(state.sessionId)
        links = [] if servers is None else list(servers.links.values())
        if not links:
            return "none in this session"
        ready = sum(link.state == READY for link in links)
        return f"{len(links)} in this session, {ready} ready, {len(servers.routes)} tools (`/mcp` lists them)"

    def describe(self, state: SessionState) -> str:
        """``/mcp``: each server, its state, transport and tools."""
        servers = self.sessions.get(state.sessionId)
        if servers is None or not servers.links:
            return ("No MCP servers in this session. Add them in the editor's MCP settings, or under "
                    "`mcp_servers` in `$HERMES_HOME/config.yaml`.")
        lines = ["**MCP servers**", "", "| server | state | transport | tools | from |", "|---|---|---|---|---|"]
        problems = []
        for name, link in servers.links.items():
            era = f", {link.era} era" if link.era else ""
            count = len(link.tools) if link.state == READY else "–"
            lines.append(f"| `{name}` | {link.state} | {link.spec.transport}{era} | {count} | {link.spec.origin} |")
            if link.state in (FAILED, NEEDS_LOGIN):
                problems.append(f"- `{name}`: {link.reason.splitlines()[0]}")
        if problems:
            lines += ["", "**Problems**", "", *problems]
        tools = sorted(servers.routes)
        if tools:
            lines += ["", "Tools: " + ", ".join(f"`{name}`" for name in tools)]
        offering = sorted(name for name, link in servers.links.items() if link.state == READY and link.hasResources)
        if offering:
            lines += ["", "Resources (the model lists and reads them): " + ", ".join(f"`{n}`" for n in offering)]
        if servers.prompts:
            lines += ["", "Prompts: " + ", ".join(f"`/{name}`" for name in sorted(servers.prompts))]
        return "\n".join(lines)

    # -- signing in and out (``/mcp login NAME``, ``/mcp logout NAME``) -------------------------

    def _oauthLink(self, state: SessionState, name: str) -> ServerLink | str:
        servers = self.sessions.get(state.sessionId)
        link = None if servers is None else servers.links.get(name)
        if link is None:
            known = ", ".join(f"`{n}`" for n in (servers.links if servers else {})) or "none"
            return f"No MCP server `{name}` in this session (its servers: {known})."
        if link.oauth is None or self.signIns is None:
            why = "it is not an HTTP server" if link.spec.transport != HTTP else "the editor gives its Authorization header"
            return f"MCP server `{name}` does not sign in with OAuth here: {why}."
        return link

    def login(self, state: SessionState, name: str) -> Deferred[str]:
        """``/mcp login NAME``: the sign-in's link (shown the best way the editor allows)."""
        link = self._oauthLink(state, name)
        if isinstance(link, str):
            return succeed(link)
        return self.signIns.start(state, link, self.report, asked=True)

    def logout(self, state: SessionState, name: str) -> str:
        """``/mcp logout NAME``: the token is removed; every session's link to that server loses its tools."""
        link = self._oauthLink(state, name)
        if isinstance(link, str):
            return link
        had = link.oauth.forget()
        for servers in self.sessions.values():
            for each in servers.links.values():
                if each.oauth is link.oauth:
                    each.signedOut()
        return (f"Signed out of MCP server `{name}`: its token is removed and its tools are gone."
                if had else f"MCP server `{name}` had no stored sign-in; its tools are gone until you sign in.")

    def signedIn(self, oauth: Any) -> None:
        """A sign-in finished: every link waiting for that server's token connects again."""
        for servers in self.sessions.values():
            for link in servers.links.values():
                if link.oauth is oauth and link.state == NEEDS_LOGIN:
                    link.signedIn()


def _engineTools(found: dict[str, Route]) -> dict[str, Tool]:
    return {exposed: engineTool(route) for exposed, route in found.items()}
