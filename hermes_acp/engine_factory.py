"""Builds each session's engine agent (``IAgentFactory``), importing the engine
only when the first agent is built, so it costs nothing at startup."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from zope.interface import implementer

from .config import Endpoint
from .interfaces import IAgentFactory
from .options import reasoningEffort
from .session_state import SessionState

if TYPE_CHECKING:  # the engine is imported with the first agent, not with this module
    from .engine.agent import AIAgent


@implementer(IAgentFactory)
@attrs.frozen
class EngineAgentFactory:
    """The built-in engine, bound to the configured endpoint.

    ``sessionSearch(query, limit)`` backs the ``session_search`` tool; it is
    called from the agent's tool threads.
    """

    endpointSource: Callable[[], Endpoint]
    sessionSearch: Callable[[str, int], list[dict[str, Any]]] | None = None

    def buildAgent(self, session: SessionState) -> AIAgent:
        from .engine.agent import AIAgent

        agent = AIAgent(
            endpoint=self.endpointSource(),
            cwd=session.cwd,
            model=session.model,
            additionalDirectories=session.additionalDirectories,
            sessionSearch=self.sessionSearch,
            reasoningEffort=reasoningEffort(session),
        )
        agent.setEditMode(session.mode)
        return agent

    def configure(self, agent: AIAgent, session: SessionState) -> None:
        """Apply a changed model, mode or thought level; history and tools stay."""
        agent.model = session.model or agent.model
        agent.reasoningEffort = reasoningEffort(session)
        agent.setEditMode(session.mode)
