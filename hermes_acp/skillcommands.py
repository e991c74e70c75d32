"""Skills as slash commands: each usable skill is ``/NAME`` in ``available_commands_update``.

The catalog (``engine.skills``) is read on a thread of its own (``hermes-skills``, one per
folder being read, kept a while for the next read; never the agent's workers, which a turn
may wait for, and never for more than ``SCAN_WAIT``): when a session is set up, at the start
of every turn (a skill added or changed on disk between turns counts from that turn; the
model's system prompt lists what that read found) and after every turn of the model that
called a tool (``skill_manage``, or a command, may have changed them). The editor hears a new
list only when it differs from the last it heard.

``/NAME request`` runs a turn of the model whose user message is the skill's instructions and
the request (``SkillLibrary.activation``): in the history, so the skill stays in force for the
turns that follow, as anything the user said does. A skill whose name is one of the agent's
own commands stays usable by the model, but is no command; ``/doctor`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import attrs
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from .config import Settings, hermesHome
from .engine.skills import PROJECT, USER, Catalog, Problem, Skill, SkillLibrary, shortened
from .interfaces import IUpdateChannel
from .oneshot import OneShot
from .session_state import SessionState
from .threads import SpareThreads

log = Logger()

#: The most problems ``/doctor`` and ``--check`` list (the rest are counted); a command's description.
SHOWN_PROBLEMS, DESCRIPTION_CHARS = 20, 200
#: The longest a turn waits for its skills (a stuck file system): then it goes on with the last ones.
SCAN_WAIT = 10.0
_INVOKED = re.compile(r"/(\S+)(?:\s+(.*))?\Z", re.S)


def skillLibrary(settings: Settings, reserved: frozenset[str], env: Any = None) -> SkillLibrary:
    """The process's skills: ``$HERMES_HOME/skills`` and the project's, bounded by ``settings``;
    ``reserved``, the agent's own command names, are not for skills."""
    return SkillLibrary(str(hermesHome(env) / "skills"), settings.skillsScanDirs, settings.skillsPromptChars,
                        settings.skillCommands, reserved)


def skillCommand(skill: Skill) -> dict[str, Any]:
    """The skill as an ``AvailableCommand``."""
    return {"name": skill.name, "description": f"Skill: {shortened(skill.description, DESCRIPTION_CHARS)}",
            "input": {"hint": shortened(skill.argumentHint or "what to apply the skill to (optional)",
                                        DESCRIPTION_CHARS)}}


def describe(library: SkillLibrary, catalog: Catalog | None) -> str:
    """What was found and where, and each skill skipped (or loaded with a warning) and why."""
    if catalog is None:
        return f"not read yet (your folder: {library.userRoot})"
    counts = {source: sum(1 for s in catalog.skills if s.source == source) for source in (USER, PROJECT)}
    folders = sorted({skill.root for skill in catalog.skills if skill.source == PROJECT})
    lines = [f"{counts[USER]} in {library.userRoot}, {counts[PROJECT]} from the project"
             + (f" ({', '.join(folders)})" if folders else "")]
    commands = sum(1 for skill in catalog.skills if skill.name not in library.reserved)
    if commands > library.commandCount:
        lines.append(f"{commands - library.commandCount} skill(s) past the first {library.commandCount} are not "
                     "slash commands (HERMES_ACP_SKILL_COMMANDS); the model still sees them")
    problems = list(catalog.problems)
    problems += [Problem(skill.path, f"loaded, but not the command /{skill.name}: that is the agent's own command")
                 for skill in catalog.skills if skill.name in library.reserved]
    lines += [f"{problem.path}: {problem.reason}" for problem in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"… and {len(problems) - SHOWN_PROBLEMS} more")
    return "\n".join(lines)


@attrs.define(eq=False)
class SkillCommands:
    """The skills of a connection's sessions, as the editor's commands."""

    library: SkillLibrary
    reactor: Any  # IReactorFromThreads and IReactorTime
    updates: IUpdateChannel
    #: The agent's own commands, which come first (``commands.availableCommands``).
    builtins: list[dict[str, Any]]
    #: Commands that follow the skills in the editor's list (the MCP servers' prompts).
    extra: Callable[[SessionState], list[dict[str, Any]]] = lambda state: []
    #: Each session's latest catalog, and the command list the editor last heard.
    _catalogs: WeakKeyDictionary[SessionState, Catalog] = attrs.field(factory=WeakKeyDictionary)
    _listed: WeakKeyDictionary[SessionState, list[dict[str, Any]]] = attrs.field(factory=WeakKeyDictionary)
    #: The reads in progress, by folder: sessions of one folder wait for the same one.
    _reading: dict[str, OneShot[Catalog]] = attrs.field(factory=dict)
    #: A thread for each read in progress, kept for the next (a turn reads at its start and end).
    readers: SpareThreads = attrs.field(factory=lambda: SpareThreads("hermes-skills"))

    def _read(self, cwd: str) -> Deferred[Catalog]:
        shot = self._reading.get(cwd)
        if shot is None:
            shot = self._reading[cwd] = OneShot()

            def read() -> None:
                try:
                    result: Catalog | Failure = self.library.catalog(cwd)
                except Exception:
                    result = Failure()
                self.reactor.callFromThread(done, result)

            def done(result: Catalog | Failure) -> None:
                del self._reading[cwd]
                shot.fire(result)

            try:
                self.readers.run(read)
            except Exception:  # no thread to be had: the next read tries again
                del self._reading[cwd]
                raise
        return shot.when().addTimeout(SCAN_WAIT, self.reactor)

    async def refresh(self, state: SessionState, announce: bool = True) -> Catalog | None:
        """Read the session's skills again; the editor hears the commands when they changed
        (with ``announce``, once the session is known to it). A failure keeps the last ones."""
        try:
            catalog = await self._read(state.cwd)
        except defer.TimeoutError:
            log.warn("reading the skills in {cwd} took over {s} s; the last ones found are used", cwd=state.cwd,
                     s=SCAN_WAIT)
            return self._catalogs.get(state)
        except Exception:
            log.failure("reading the skills of session {id} failed", id=state.sessionId)
            return self._catalogs.get(state)
        self._catalogs[state] = catalog
        listed = self.builtins + [skillCommand(skill) for skill in self.commandSkills(catalog)]
        if listed != self._listed.get(state):
            self._listed[state] = listed
            if announce and state.announced:
                self.updates.send(state, {"sessionUpdate": "available_commands_update",
                                          "availableCommands": listed + self.extra(state)}, journal=False)
        return catalog

    def current(self, state: SessionState) -> Catalog | None:
        return self._catalogs.get(state)

    def listed(self, state: SessionState) -> list[dict[str, Any]]:
        """The commands to announce for the session: the agent's own, then its skills."""
        return self._listed.get(state) or self.builtins

    def commandSkills(self, catalog: Catalog | None) -> list[Skill]:
        if catalog is None:
            return []
        skills = [skill for skill in catalog.skills if skill.name not in self.library.reserved]
        return skills[:self.library.commandCount]

    def invoked(self, catalog: Catalog | None, text: str, blocks: list[dict[str, Any]]) -> tuple[Skill, str] | None:
        """(skill, request) when the prompt is only text and starts with ``/NAME`` of a skill."""
        match = _INVOKED.match(text)
        if match is None or any(b.get("type") != "text" for b in blocks):
            return None
        skill = next((s for s in self.commandSkills(catalog) if s.name == match.group(1).lower()), None)
        return None if skill is None else (skill, (match.group(2) or "").strip())

    def describe(self, state: SessionState) -> str:
        return describe(self.library, self.current(state))
