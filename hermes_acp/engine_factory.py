"""Builds each session's engine agent (``IAgentFactory``), importing the engine
only when the first agent is built, so it costs nothing at startup."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from zope.interface import implementer

from .config import Endpoint, Settings, hermesHome
from .engine.toolslots import ToolSlots
from .interfaces import IAgentFactory
from .options import reasoningEffort
from .session_state import SessionState

if TYPE_CHECKING:  # the engine is imported with the first agent, not with this module
    from .engine.agent import AIAgent
    from .engine.background import BackgroundProcesses
    from .engine.memory import MemoryStore
    from .engine.skills import SkillLibrary

#: The key of ``SessionState.config`` that keeps the session's memory snapshot (``engine.memory``),
#: saved with its other settings, so a load after a restart builds the same system prompt.
MEMORY_SNAPSHOT = "memory"


@implementer(IAgentFactory)
@attrs.frozen
class EngineAgentFactory:
    """The built-in engine, bound to the configured endpoint.

    ``sessionSearch(query, limit, cwd)`` (``ISessionStore.searchNow``) backs the
    ``session_search`` tool; it is called from the agent's tool threads. Each agent
    gets it bound to its session's folder (``projectSearch``), so a search stays in
    the session's project unless the model asks for all projects.
    """

    endpointSource: Callable[[], Endpoint]
    sessionSearch: Callable[[str, int, str | None], list[dict[str, Any]]] | None = None
    settings: Settings = Settings()
    #: The process's tool slots: every session's agent shares them (``HERMES_ACP_TOOL_THREADS``).
    toolSlots: ToolSlots = attrs.field(
        default=attrs.Factory(lambda self: ToolSlots(self.settings.toolThreads), takes_self=True))
    #: Every session's background processes (None: the agents start none); a session's
    #: outlive its agent, which is rebuilt when the session moves folders.
    background: BackgroundProcesses | None = None
    #: The skills every session's agent lists and its skill tools use (None: no skills).
    skills: SkillLibrary | None = None
    #: The process's child slots: children of every session's ``delegate_task`` share them
    #: (``HERMES_ACP_SUBAGENT_THREADS``).
    childSlots: ToolSlots = attrs.field(
        default=attrs.Factory(lambda self: ToolSlots(self.settings.subagentThreads), takes_self=True))

    def buildAgent(self, session: SessionState) -> AIAgent:
        from .engine.agent import AIAgent
        from .engine.images import ImageLimits, visionModel
        from .engine.model import ReplyLimits
        from .engine.processes import Limits
        from .engine.sandbox import policyFor
        from .engine.subagents import SubagentSettings

        settings = self.settings
        folders = (session.cwd, *session.additionalDirectories)
        memory = memoryStore(settings)

        agent = AIAgent(
            endpoint=self.endpointSource(),
            cwd=session.cwd,
            model=session.model,
            additionalDirectories=session.additionalDirectories,
            sessionSearch=projectSearch(self.sessionSearch, session.cwd),
            reasoningEffort=reasoningEffort(session),
            sandbox=None if settings.sandbox == "off" else policyFor(
                folders, settings.sandboxNetwork, settings.sandboxWritable),
            limits=Limits(settings.commandProcesses, settings.commandCpuSeconds),
            compactAt=settings.compactAt,
            maxToolCalls=settings.maxToolCalls,
            toolParallel=settings.toolParallel,
            toolSlots=self.toolSlots,
            subagents=SubagentSettings(settings.subagentParallel, settings.subagentTasks, settings.subagentSummary,
                                       settings.subagentModel, self.childSlots),
            replyLimits=ReplyLimits(settings.modelMaxEvent, settings.modelMaxReply, settings.modelReplySeconds),
            background=None if self.background is None else self.background.forSession(session.sessionId),
            memory=memory,
            memorySnapshot=frozenMemory(session, memory),
            imageLimits=ImageLimits(settings.imageMaxBytes, settings.imageMaxSide, settings.imagesPerRequest,
                                    settings.imagePreviewBytes),
            visionModel=visionModel(settings, self.endpointSource()),
            skills=self.skills,
        )
        agent.setEditMode(session.mode)
        return agent

    def configure(self, agent: AIAgent, session: SessionState) -> None:
        """Apply a changed model, mode or thought level; history and tools stay. Another model
        or thought level may write the summaries the last failed to: they are asked for again."""
        model, effort = session.model or agent.model, reasoningEffort(session)
        if (model, effort) != (agent.model, agent.reasoningEffort):
            agent.summaryFailures = 0
        agent.model, agent.reasoningEffort = model, effort
        agent.setEditMode(session.mode)


def memoryStore(settings: Settings) -> MemoryStore | None:
    """The user's memory files with the configured limits (config.yaml read now: a new session
    follows its changes); None when config.yaml turns both off."""
    from .engine.memory import MemoryStore

    store = MemoryStore.forHome(hermesHome(), memoryChars=settings.memoryChars, userChars=settings.userChars,
                                lockSeconds=settings.memoryLockSeconds)
    return store if store.settings.targets else None


def frozenMemory(session: SessionState, memory: MemoryStore | None) -> str:
    """The session's memory snapshot: the one it keeps (a rebuilt agent, a load after a restart),
    else one taken now, from its first turn on, and kept in its settings, which the turn's end
    saves."""
    snapshot = session.config.get(MEMORY_SNAPSHOT)
    if not isinstance(snapshot, str):
        snapshot = session.config[MEMORY_SNAPSHOT] = memory.snapshot() if memory is not None else ""
    return snapshot


def projectSearch(
    search: Callable[[str, int, str | None], list[dict[str, Any]]] | None, cwd: str
) -> Callable[[str, int, bool], list[dict[str, Any]]] | None:
    """``search`` as the ``session_search`` tool calls it, ``(query, limit, allProjects)``:
    in the sessions under ``cwd`` (the session's project), or in all of them."""
    if search is None:
        return None
    return lambda query, limit, allProjects: search(query, limit, None if allProjects else cwd)
