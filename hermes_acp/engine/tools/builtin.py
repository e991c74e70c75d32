"""The built-in tool set, under Hermes' names."""

from __future__ import annotations

from collections.abc import Iterable

from hermes_acp.engine.tools.clarify import CLARIFY
from hermes_acp.engine.tools.delegate import DELEGATE_TASK
from hermes_acp.engine.tools.files import READ_FILE, WRITE_FILE
from hermes_acp.engine.tools.memory import MEMORY
from hermes_acp.engine.tools.patching import PATCH
from hermes_acp.engine.tools.process import PROCESS
from hermes_acp.engine.tools.registry import Tool
from hermes_acp.engine.tools.search import SEARCH_FILES
from hermes_acp.engine.tools.sessions import SESSION_SEARCH
from hermes_acp.engine.tools.skills import SKILL_MANAGE, SKILL_VIEW, SKILLS_LIST
from hermes_acp.engine.tools.terminal import TERMINAL
from hermes_acp.engine.tools.todo import TODO
from hermes_acp.engine.tools.webextract import WEB_EXTRACT
from hermes_acp.engine.tools.websearch import WEB_SEARCH

BUILTIN_TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (READ_FILE, WRITE_FILE, PATCH, SEARCH_FILES, TERMINAL, TODO, SESSION_SEARCH, CLARIFY, DELEGATE_TASK,
                 PROCESS, WEB_SEARCH, WEB_EXTRACT, MEMORY)
}
BUILTIN_TOOLS.update((tool.name, tool) for tool in (SKILLS_LIST, SKILL_VIEW, SKILL_MANAGE))
#: The tools that need the session's skills (``AIAgent.skills``).
SKILL_TOOLS = (SKILLS_LIST.name, SKILL_VIEW.name, SKILL_MANAGE.name)


def selectTools(names: Iterable[str] | None = None) -> dict[str, Tool]:
    """The named built-in tools (all of them when ``names`` is None)."""
    if names is None:
        return dict(BUILTIN_TOOLS)
    unknown = sorted(set(names) - set(BUILTIN_TOOLS))
    if unknown:
        raise ValueError(f"unknown tool(s): {', '.join(unknown)}")
    return {name: BUILTIN_TOOLS[name] for name in names}
