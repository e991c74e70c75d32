"""Plan mode: the model reads and thinks, changes nothing, and ends with a plan the user approves.

In the ``plan`` session mode the model may read files, search, keep its ``todo`` list, search
past sessions and run commands the guard knows only read (``engine.readonly``). Every edit,
every other command and every MCP tool not known to only read is refused with a message to
the model (the user is not asked, nothing is written). Hermes' own plan mode has no tool to
leave it; here the model ends planning with ``exit_plan_mode``, carrying the plan: the user
sees it and answers, and the answer (``access.modeAfterPlan``) picks the mode the turn goes on in —
or keeps planning, which ends the turn so the user can say what to change.
"""

from __future__ import annotations

from hermes_acp.engine import readonly
from hermes_acp.engine.access import planRefusal
from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOW_ONCE, CANCELLED, REJECT_ONCE, Verdict, refusal
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, parameters

EXIT_PLAN_MODE = "exit_plan_mode"
#: The longest plan the tool takes (characters): the user reads it in one card.
MAX_PLAN_CHARS = 20_000

NOTE = (
    "You are in PLAN MODE. Explore and think, do not change anything: you may read files, search, "
    "keep a todo list and run commands that only read (ls, cat, grep, find, git status/log/diff...). "
    "Writing or patching files, other commands and tools that could change something are refused. "
    f"When you know what to do, call {EXIT_PLAN_MODE} with your complete plan (Markdown, one step "
    "per list item): the user reviews it and decides whether you implement it."
)


def commandRefused(command: str, escalation: str | None, cwd: str) -> Verdict | None:
    """A command in plan mode: refused unless the guard knows it only reads and it stays in the
    sandbox (None: it goes on to the guard as in any mode, so a read of a secret still asks)."""
    if escalation is not None or not readonly.isReadOnly(command, cwd):
        return Verdict(False, planRefusal("this command"))
    return None


def _told(answer: str) -> tuple[str, bool]:
    """What the model hears after the user's answer, and whether the turn ends there."""
    if answer == ALLOW_ONCE:
        return ("The user approved the plan. Plan mode is over: the session is in the default mode "
                "(each edit is asked). Implement the plan now, step by step.", False)
    if answer == ALLOW_ALWAYS:
        return ("The user approved the plan. Plan mode is over: the session accepts edits inside the "
                "workspace without asking. Implement the plan now, step by step.", False)
    if answer == REJECT_ONCE:
        return ("The user chose to keep planning: you are still in plan mode and the turn ends here. "
                "Wait for the user's feedback, then revise the plan.", True)
    if answer == CANCELLED:
        return "The turn was cancelled before the user answered: you are still in plan mode.", True
    return (f"The plan was not approved ({refusal(answer)}): you are still in plan mode and the turn "
            "ends here.", True)


def exitPlanMode(ctx: ToolContext, plan: str) -> ToolOutcome:
    plan = plan.strip()
    if not plan:
        raise ToolError("plan is empty: send the complete plan as Markdown")
    if len(plan) > MAX_PLAN_CHARS:
        raise ToolError(f"plan is {len(plan):,} characters; the most is {MAX_PLAN_CHARS:,}: shorten it")
    answer = ctx.approvePlan(plan)
    if answer is None:
        raise ToolError(f"{EXIT_PLAN_MODE} is only for plan mode, and the session is not in plan mode (the user "
                        "approved a plan or switched modes): go on with the task as the current mode allows")
    text, ends = _told(answer)
    return ToolOutcome(text, {"plan": plan, "answer": answer}, failed=answer not in (ALLOW_ONCE, ALLOW_ALWAYS),
                       endsTurn=ends)


EXIT_PLAN = Tool(
    EXIT_PLAN_MODE,
    "Present your plan to the user and ask to leave plan mode. Call it once your plan is complete: "
    "the user sees it and chooses to have you implement it (asking before edits, or accepting them), "
    "or to keep planning. The result tells you which; implement only when it says so.",
    parameters(["plan"], plan={"type": "string", "description": "The complete plan, in Markdown (a list of steps)"}),
    exitPlanMode,
    title="Ready to implement this plan?",
    kind="switch_mode",
)
