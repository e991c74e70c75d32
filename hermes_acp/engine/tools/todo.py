"""``todo``: the session's plan, which the editor shows as a checklist."""

from __future__ import annotations

from typing import Any

from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters

STATUSES = ("pending", "in_progress", "completed", "cancelled")


def _item(raw: Any, position: int) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ToolError(f"todos[{position}] must be an object with id, content and status")
    content = raw.get("content")
    status = raw.get("status", "pending")
    ident = raw.get("id", str(position + 1))
    if not isinstance(content, str) or not content.strip():
        raise ToolError(f"todos[{position}].content must be a non-empty string")
    if status not in STATUSES:
        raise ToolError(f"todos[{position}].status must be one of {', '.join(STATUSES)}")
    if not isinstance(ident, (str, int)) or isinstance(ident, bool):
        raise ToolError(f"todos[{position}].id must be a string")
    return {"id": str(ident), "content": content.strip(), "status": status}


def updateTodos(ctx: ToolContext, merge: bool, todos: list[Any] | None = None) -> ToolOutcome:
    """Replace the plan (or update items by id when merging); no todos reads it."""
    if todos is not None:
        items = [_item(raw, i) for i, raw in enumerate(todos)]
        if len({item["id"] for item in items}) != len(items):
            raise ToolError("todo ids must be unique")
        if merge:
            byId = {item["id"]: item for item in items}
            merged = [byId.pop(old["id"], old) for old in ctx.todos]
            items = merged + [item for item in items if item["id"] in byId]
        ctx.todos[:] = items
    plan = [dict(item) for item in ctx.todos]
    summary = {status: sum(1 for item in plan if item["status"] == status) for status in STATUSES}
    return ToolOutcome(jsonText({"todos": plan, "summary": {"total": len(plan), **summary}}), {"todos": plan})


TODO = Tool(
    "todo",
    "Keep a plan for multi-step work. Send the whole list (or merge=true to update items by "
    "id); call with no todos to read it. Status: pending, in_progress, completed, cancelled. "
    "Keep one item in_progress at a time.",
    parameters(
        [],
        todos={
            "type": "array",
            "description": "The plan",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "content": {"type": "string"},
                    "status": {"type": "string", "enum": list(STATUSES)},
                },
                "required": ["id", "content", "status"],
            },
        },
        merge={"type": "boolean", "default": False, "description": "Update items by id"},
    ),
    updateTodos,
)
