"""``delegate_task``: hand work to subagents with a fresh context, under Hermes' name,
arguments (one ``goal`` with ``context``, or a batch of ``tasks``) and result
(``{results: [{task_index, status, summary, ...}], total_duration_seconds}``).

The tool checks the arguments; the children are ``engine.subagents``' 
(``ToolContext.subagents``, bound to the call by the run). The parent reads each child's final summary, never its transcript;
the transcripts go to the editor's side in the outcome's extras (``transcripts``), where they are
kept searchable beside the session's history, not in it.
"""

from __future__ import annotations

import time

from hermes_acp.engine.subagents import Task
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, batchItems, jsonText, parameters

MAX_GOAL_CHARS = 8_000
MAX_CONTEXT_CHARS = 64_000
ROLES = ("leaf", "orchestrator")


def _task(index: int, goal: object, context: object, role: object) -> Task:
    where = "goal" if index < 0 else f"tasks[{index}].goal"
    if not isinstance(goal, str) or not goal.strip():
        raise ToolError(f"{where} must be a non-empty string")
    if len(goal) > MAX_GOAL_CHARS:
        raise ToolError(f"{where} is longer than {MAX_GOAL_CHARS:,} characters; put the details in context")
    if context is not None and not isinstance(context, str):
        raise ToolError(f"{where.removesuffix('goal')}context must be a string")
    if context and len(context) > MAX_CONTEXT_CHARS:
        raise ToolError(f"{where.removesuffix('goal')}context is longer than {MAX_CONTEXT_CHARS:,} characters")
    if role is not None and role not in ROLES:
        raise ToolError(f"{where.removesuffix('goal')}role must be one of {', '.join(ROLES)}")
    return Task(max(index, 0), goal.strip(), (context or "").strip(), str(role or "leaf"))


def tasksOf(goal: str | None, context: str | None, role: str | None, tasks: list[object] | None,
            limit: int) -> list[Task]:
    """The checked tasks of a call: the batch, or the one goal."""
    if tasks:
        if goal:
            raise ToolError("give either goal (one task) or tasks (a batch), not both")
        if len(tasks) > limit:
            raise ToolError(f"at most {limit} tasks in one call (HERMES_ACP_SUBAGENT_TASKS); split the work")
        return [_task(index, task.get("goal"), task.get("context"), task.get("role"))
                for index, task in batchItems(tasks, "tasks", ("goal", "context", "role"), "{goal, context?, role?}")]
    if not goal:
        raise ToolError("give a goal (one task) or tasks (a batch of {goal, context})")
    return [_task(-1, goal, context, role)]


def delegateTask(ctx: ToolContext, goal: str | None = None, context: str | None = None,
                 tasks: list[object] | None = None, role: str | None = None,
                 background: bool | None = None) -> ToolOutcome:
    if ctx.subagents is None:
        raise ToolError("subagents cannot delegate further")
    checked = tasksOf(goal, context, role, tasks, ctx.subagents.maxTasks)
    began = time.monotonic()
    ran = ctx.subagents.run(checked)
    results = [report for report, _ in ran]
    result = {"results": results, "total_duration_seconds": round(time.monotonic() - began, 2)}
    transcripts = [{"task_index": report["task_index"], "messages": messages} for report, messages in ran]
    failed = all(report["status"] != "completed" for report in results)
    return ToolOutcome(jsonText(result), {"results": results, "transcripts": transcripts}, failed=failed)


DELEGATE_TASK = Tool(
    "delegate_task",
    "Hand work to subagents with a fresh context (only the goal and context you give) and your "
    "tools but this one and clarify; you get each one's summary. goal (+ context) for one task, "
    "or tasks for a parallel batch.",
    parameters(
        [],
        goal={"type": "string"},
        context={"type": "string"},
        tasks={"type": "array", "items": {"type": "object", "properties": {
            "goal": {"type": "string"}, "context": {"type": "string"},
            "role": {"type": "string", "enum": list(ROLES)}}, "required": ["goal"]}},
        role={"type": "string", "enum": list(ROLES)},
        background={"type": "boolean"},
    ),
    delegateTask,
    holdsSlot=False,
    mayWrite=True,  # a child may change files: the turn's checkpoint comes first
)
