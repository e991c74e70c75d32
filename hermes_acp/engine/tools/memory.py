"""``memory``: Hermes' tool for the two memory files (``engine.memory``), under Hermes' name,
actions and arguments.

The model adds, replaces or removes one entry (``action``, ``content``, ``old_text``), or sends
a batch of them (``operations``) that is applied whole or not at all, the limit checked on the
result. Its answer is Hermes' result object. Writing asks like an edit in the ``default`` mode
(the card shows the file's change), goes through in ``accept_edits`` and ``dont_ask``, and is
refused in ``plan`` (``access.PathApprovals.decideMemory``).
"""

from __future__ import annotations

from typing import Any

from hermes_acp.engine.access import EditProposal
from hermes_acp.engine.memory import ACTIONS, Operation
from hermes_acp.engine.memoryfiles import DELIMITER, TARGETS
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, batchItems, jsonText

#: The most operations one call may carry (Hermes sets none; the files hold a few dozen entries).
MAX_OPERATIONS = 50


def _operation(action: Any, content: Any, oldText: Any, position: str) -> Operation:
    """One operation, its strings stripped (as Hermes does), or a ``ToolError`` saying what is missing."""
    if action not in ACTIONS:
        raise ToolError(f"{position}action must be one of {', '.join(ACTIONS)}")
    for name, value in (("content", content), ("old_text", oldText)):
        if value is not None and not isinstance(value, str):
            raise ToolError(f"{position}{name} must be a string")
    content, oldText = (content or "").strip(), (oldText or "").strip()
    if action in ("add", "replace") and not content:
        raise ToolError(f"{position}content is required for '{action}'"
                        + (" (use 'remove' to delete an entry)" if action == "replace" else ""))
    lines = "\n" + content.replace("\r\n", "\n") + "\n"
    if DELIMITER in lines:  # written, the file would read as several entries
        raise ToolError(f"{position}content holds a line with only §, but a line holding only § separates entries: "
                        "send each entry as its own operation")
    if action in ("replace", "remove") and not oldText:
        raise ToolError(f"{position}old_text is required for '{action}': a short unique part of the entry "
                        f"to {action} (the entries are in your system prompt)")
    return Operation(action, content, oldText)


def parseOperations(action: str | None, content: str | None, oldText: str | None,
                    batch: list[Any] | None) -> list[Operation]:
    """The call's operations: the batch when given, else the single one."""
    if not batch:
        if action is None:
            raise ToolError("give an action (add, replace or remove) or a list of operations")
        return [_operation(action, content, oldText, "")]
    if len(batch) > MAX_OPERATIONS:
        raise ToolError(f"operations holds {len(batch)} items; at most {MAX_OPERATIONS} in one call")
    return [_operation(item.get("action"), item.get("content"), item.get("old_text"), f"operations[{index}]: ")
            for index, item in batchItems(batch, "operations", ("action", "content", "old_text"),
                                          "{action, content?, old_text?}")]


def remember(ctx: ToolContext, target: str, action: str | None = None, content: str | None = None,
             old_text: str | None = None, operations: list[Any] | None = None) -> ToolOutcome:
    store = ctx.memory
    if store is None:
        raise ToolError("memory is not available in this session (turned off in config.yaml)")
    ops = parseOperations(action, content, old_text, operations)

    def approve(path: Any, oldText: str, newText: str) -> str | None:
        verdict = ctx.approveMemory(EditProposal("memory", str(path), oldText, newText))
        return None if verdict.allowed else verdict.message

    change = store.change(target, ops, approve, ctx.cancelEvent.is_set)
    extras = {} if change.failed else {"path": str(change.path), "oldText": change.oldText,
                                       "newText": change.newText}
    return ToolOutcome(jsonText(change.reply), extras, failed=change.failed)


MEMORY = Tool(
    "memory",
    "Save durable facts for later sessions: memory goes into the system prompt of every new session "
    "(this one keeps the memory it started with). Targets: 'user' = who the user is (name, role, "
    "preferences, style); 'memory' = your notes (environment, conventions, tool quirks, lessons). One "
    "change: action add (content), replace (old_text -> content) or remove (old_text: a short unique part "
    "of the entry). Several: 'operations', applied together with the char limit checked on the result; "
    "when full, remove or shorten stale entries and add in one batch. Save preferences, corrections and "
    "stable facts; never secrets (refused), trivia or task progress. A saved write is done: do not repeat it.",
    {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS), "description": "One change (omit with operations)"},
            "target": {"type": "string", "enum": list(TARGETS), "description": "memory: your notes; user: the user"},
            "content": {"type": "string", "description": "The entry, for add and replace"},
            "old_text": {"type": "string", "description": "A unique part of the entry, for replace and remove"},
            "operations": {
                "type": "array",
                "description": "Several changes, all or none",
                "items": {
                    "type": "object",
                    "properties": {
                        "action": {"type": "string", "enum": list(ACTIONS)},
                        "content": {"type": "string"},
                        "old_text": {"type": "string"},
                    },
                    "required": ["action"],
                },
            },
        },
        "required": ["target"],
    },
    remember,
)
