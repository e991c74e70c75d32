"""``session_search``: full-text search over past sessions, through the session layer."""

from __future__ import annotations

from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters


def searchSessions(ctx: ToolContext, query: str, limit: int) -> ToolOutcome:
    if ctx.searchSessions is None:
        raise ToolError("past sessions are not available here")
    if not query.strip():
        raise ToolError("query is empty")
    try:
        results = ctx.searchSessions(query, limit)
    except Exception as e:
        raise ToolError(f"session search failed: {e}") from e
    return ToolOutcome(jsonText({"query": query, "results": results}), {"results": results})


SESSION_SEARCH = Tool(
    "session_search",
    "Full-text search over past conversations with this agent (titles, messages, tool calls). "
    "Returns matching sessions with snippets.",
    parameters(
        ["query"],
        query={"type": "string", "description": "Words to look for"},
        limit={"type": "integer", "minimum": 1, "default": 10},
    ),
    searchSessions,
)
