"""Plan mode in the engine (``engine.planning``, ``engine.access``): what it refuses without
asking, what it lets through, and what each answer to the plan tells the model."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_acp.engine.access import EditProposal, PathApprovals, modeAfterPlan
from hermes_acp.engine.planning import EXIT_PLAN
from hermes_acp.engine.tools.registry import checkArguments, runTool
from hermes_acp.permissions import permissionOptions
from hermes_acp.render import MAX_PLAN_STEPS, planSteps


def planCall(bench: Any, plan: str) -> Any:
    context = bench.agent.toolContext(bench.cancelEvent, bench.observer, bench.workspace, "p.0")
    return runTool(EXIT_PLAN, context, checkArguments(EXIT_PLAN, {"plan": plan}))


def test_planRefusesEveryEditWithoutAsking(tmp_path) -> None:
    approvals = PathApprovals.forWorkspace(str(tmp_path), mode="plan")
    asked: list[Any] = []
    verdict = approvals.decide(EditProposal("write_file", str(tmp_path / "a.py"), None, "x"), asked.append)
    assert not verdict.allowed and "Blocked in plan mode" in verdict.message and asked == []
    assert approvals.decideRead(str(tmp_path / "a.py"), None).allowed
    assert not approvals.decideRead("/etc/hostname", None).allowed  # outside asks, as in the default mode


def test_planCommandsOnlyReadOnes(bench, tmp_path) -> None:
    bench.agent.setEditMode("plan")
    (tmp_path / "notes.txt").write_text("x")
    assert "notes.txt" in bench.call("terminal", command="ls").text
    refused = bench.call("terminal", command="touch made.txt")
    assert refused.failed and "Blocked in plan mode" in refused.text and not (tmp_path / "made.txt").exists()
    outside = bench.call("terminal", command="ls", outside_sandbox=True, justification="why not")
    assert outside.failed and "Blocked in plan mode" in outside.text
    assert bench.observer.commands == []  # nothing asked


def test_exitPlanModeOnlyInPlanMode(bench) -> None:
    assert EXIT_PLAN.name not in bench.agent.activeTools()
    outcome = planCall(bench, "1. do it")
    assert outcome.failed and "only for plan mode" in outcome.text and bench.observer.plans == []
    bench.agent.setEditMode("plan")
    assert EXIT_PLAN.name in bench.agent.activeTools()
    assert "empty" in planCall(bench, "   ").text


def test_aSecondPlanAfterApprovalDoesNotAsk(bench) -> None:
    """Two plans in one reply: once the first is approved (the mode switched, as the turn
    does before the answer returns), the second finds plan mode over."""
    bench.agent.setEditMode("plan")
    bench.observer.planAnswer = lambda plan: (bench.agent.setEditMode("default"), "allow_once")[1]
    assert not planCall(bench, "1. first").failed
    second = planCall(bench, "1. second")
    assert second.failed and "not in plan mode" in second.text and len(bench.observer.plans) == 1


@pytest.mark.parametrize(("answer", "told", "ends", "mode"), [
    ("allow_once", "default mode", False, "default"),
    ("allow_always", "accepts edits", False, "accept_edits"),
    ("reject_once", "keep planning", True, "plan"),
    ("timeout", "no approval arrived in time", True, "plan"),
    ("cancelled", "cancelled", True, "plan"),
])
def test_eachAnswerToThePlan(bench, answer, told, ends, mode) -> None:
    bench.agent.setEditMode("plan")
    bench.observer.planAnswer = answer
    outcome = planCall(bench, "  1. do it  ")
    assert bench.observer.plans == [("p.0", "1. do it")]
    assert told in outcome.text and outcome.endsTurn is ends
    assert outcome.failed is ends and outcome.extras["plan"] == "1. do it"
    assert modeAfterPlan(answer) == mode


def test_planSteps() -> None:
    plan = "Intro\n\n1. First\n   - detail\n2) Second\n- [ ] Third\n* Fourth"
    assert [e["content"] for e in planSteps(plan)] == ["First", "Second", "Third", "Fourth"]
    assert planSteps("Just do it.") == [{"content": "Just do it.", "priority": "medium", "status": "pending"}]
    many = planSteps("\n".join(f"- step {i}" for i in range(200)))
    assert len(many) == MAX_PLAN_STEPS and many[-1]["content"].endswith("more steps")


def test_thePlanQuestionHasThreeOptions() -> None:
    assert [o["kind"] for o in permissionOptions("plan")] == ["allow_once", "allow_always", "reject_once"]
    assert len(permissionOptions("edit")) == 4
