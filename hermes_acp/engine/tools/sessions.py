"""``session_search``: full-text search over past sessions, through the session layer."""

from __future__ import annotations

from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters


def searchSessions(ctx: ToolContext, query: str, limit: int, all_projects: bool) -> ToolOutcome:
    """Search the sessions of this project (this folder and those below it), or of
    every project when ``all_projects`` is true."""
    if ctx.searchSessions is None:
        raise ToolError("past sessions are not available here")
    if not query.strip():
        raise ToolError("query is empty")
    try:
        results = ctx.searchSessions(query, limit, all_projects)
    except Exception as e:
        raise ToolError(f"session search failed: {e}") from e
    scope = "all projects" if all_projects else "this project"
    return ToolOutcome(jsonText({"query": query, "scope": scope, "results": results}), {"results": results})


SESSION_SEARCH = Tool(
    "session_search",
    "Full-text search over past conversations with this agent (titles, messages, tool calls) "
    "in this project: sessions in this folder or below it. Returns matching sessions with snippets.",
    parameters(
        ["query"],
        query={"type": "string", "description": "Words to look for"},
        limit={"type": "integer", "minimum": 1, "default": 10},
        all_projects={
            "type": "boolean",
            "default": False,
            "description": "Search the sessions of every project, not only this one "
            "(only when the user asks for it: other projects may hold what this one should not see)",
        },
    ),
    searchSessions,
)
