"""Subagents: the children ``delegate_task`` runs.

A child is the same engine (``AIAgent.child``) with a fresh history and a system prompt of its
own that says it is a subagent and what its goal is; it has the parent's tools but
``delegate_task`` and ``clarify`` (depth 1), the run's MCP tools, the parent's folders, sandbox,
mode and permission rules, and the parent's bounds. Its events reach the parent run's observer
through a ``ChildObserver``, which gives every call of the child an id of its own under the
parent's call (``PARENTCALL/CHILD/CALL``) and tags its cards with the child; how they look is the
ACP layer's choice.

Scheduling: the ``delegate_task`` call's own thread coordinates and holds no tool slot (its
children's calls need those), and a run's delegate calls take turns; each child runs in a
``hermes-subagent`` thread of its own once it holds one of the process's child slots
(``SubagentSettings.slots``, a ``ToolSlots`` shared by every session's agent), at most
``parallel`` of the run at once; the other tasks wait their turn.
Children never wait for anything but leaf work (they cannot delegate), so no wait can close a
circle. A cancel of the parent's run interrupts every child at once; a child that fails (model
error, exception, exhausted requests) is a failed task in the result, never the parent's crash.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from zope.interface import implementer

from hermes_acp.engine.cancel import CANCELLED as _WOKEN
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.toolslots import GRANTED, ToolSlots
from hermes_acp.engine.workspace import Workspace
from hermes_acp.interfaces import ITurnObserver

if TYPE_CHECKING:
    from hermes_acp.engine.access import EditProposal
    from hermes_acp.engine.result import TurnResult
    from hermes_acp.engine.tools.registry import Tool


class Parent(Protocol):
    """What a delegation uses of the agent that delegates (``engine.agent.AIAgent``)."""

    subagents: SubagentSettings
    maxIterations: int

    def child(self, systemPrompt: str, model: str | None = None) -> Any: ...

log = logging.getLogger(__name__)

#: Tools a child does not get: it cannot delegate (depth 1) nor ask the user a question.
CHILD_EXCLUDED = frozenset({"delegate_task", "clarify"})
#: After a cancel, how long the coordinator waits for its children's runs to end (each has
#: been interrupted: its stream's socket is shut, its tools get their own short grace).
CANCEL_WAIT = 5.0
#: The most entries of a child's ``tool_trace`` in the result.
MAX_TRACE = 32
#: Task statuses and exit reasons, under Hermes' names.
COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"


@attrs.frozen
class SubagentSettings:
    """How ``delegate_task`` runs children (``HERMES_ACP_SUBAGENT_*``)."""

    parallel: int = 3
    maxTasks: int = 12
    summaryChars: int = 24_000
    #: The children's model; None: the parent's.
    model: str | None = None
    #: Children running in the whole process (the agent factory gives every agent the same).
    slots: ToolSlots = attrs.field(factory=lambda: ToolSlots(48))


@attrs.frozen
class Task:
    """One child's work: Hermes' ``goal``, ``context`` and ``role``."""

    index: int
    goal: str
    context: str = ""
    role: str = "leaf"

    @property
    def name(self) -> str:
        """What the user sees the child called: a fixed vocabulary, never the model's words."""
        return f"Subagent {self.index + 1}"

    def message(self) -> str:
        return self.goal if not self.context else f"{self.goal}\n\nContext:\n{self.context}"


def childPrompt(parentPrompt: str, task: Task) -> str:
    """A child's system prompt: the parent's (where it works, the project's instructions), then
    that it is a subagent, its name and its goal, and that its final answer is all the parent
    reads."""
    return (
        f"{parentPrompt}\n\n"
        f"You are a Hermes subagent ({task.name}): another agent delegated one task to you and "
        "waits for your result. You have a fresh context: the task and its context below are all "
        "you know of the conversation. You cannot ask the user questions or delegate further.\n"
        f"Your task: {task.goal}\n"
        "Work on it with your tools, then finish with a concise summary of what you found or did "
        "(facts, paths, results): that final answer is the only thing the other agent reads."
    )


def bounded(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: the head kept, the cut said."""
    if len(text) <= limit:
        return text
    note = f"\n[… {len(text) - limit:,} characters of the summary cut]"
    return text[:max(0, limit - len(note))] + note


@implementer(ITurnObserver)
@attrs.frozen
class ChildObserver:
    """A child run's observer: wraps the parent run's, gives each call an id under the parent's
    call and the child, and tags the call's card with the child (``extras["subagent"]``).
    Its answer's text goes to ``subagentText``, never into the parent's message; its compactions
    are its own business (logged)."""

    parent: ITurnObserver
    parentCallId: str
    task: Task

    def tagged(self, callId: str) -> str:
        return f"{self.parentCallId}/{self.task.index}/{callId}"

    def text(self, delta: str) -> None:
        self.parent.subagentText(self.parentCallId, self.task.index, delta)

    def thought(self, delta: str) -> None:
        pass  # the child's reasoning stays with it

    def toolStarted(self, callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None:
        tag = {"parentCallId": self.parentCallId, "child": self.task.index, "name": self.task.name}
        self.parent.toolStarted(self.tagged(callId), name, arguments, {**extras, "subagent": tag})

    def toolRunning(self, callId: str) -> None:
        self.parent.toolRunning(self.tagged(callId))

    def toolEnded(self, callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None:
        self.parent.toolEnded(self.tagged(callId), name, result, failed, extras)

    def approveCommand(self, callId: str, command: str, reason: str) -> str:
        return self.parent.approveCommand(self.tagged(callId), command, reason)

    def approveEdit(self, callId: str, proposal: EditProposal) -> str:
        return self.parent.approveEdit(self.tagged(callId), proposal)

    def approveRead(self, callId: str, path: str, reason: str) -> str:
        return self.parent.approveRead(self.tagged(callId), path, reason)

    def approvePlan(self, callId: str, plan: str) -> str:
        return self.parent.approvePlan(self.tagged(callId), plan)

    def askUser(self, callId: str, question: str, choices: list[str]) -> tuple[str, str]:
        return self.parent.askUser(self.tagged(callId), question, choices)

    def terminalStarted(self, callId: str, terminalId: str) -> None:
        self.parent.terminalStarted(self.tagged(callId), terminalId)

    def commandOutput(self, callId: str, output: str) -> None:
        self.parent.commandOutput(self.tagged(callId), output)

    def callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        return self.parent.callTool(self.tagged(callId), name, arguments)

    def compactionStarted(self, compactionId: str, reason: str) -> None:
        log.info("%s compacts its context (%s)", self.task.name, reason)

    def compactionText(self, compactionId: str, delta: str) -> None:
        pass

    def compactionEnded(self, compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None:
        log.info("%s compaction %s: %d -> %d tokens", self.task.name, status, before, after)

    def subagentStarted(self, callId: str, child: int, name: str, goal: str) -> None:
        raise RuntimeError("a subagent cannot delegate")

    def subagentText(self, callId: str, child: int, delta: str) -> None:
        raise RuntimeError("a subagent cannot delegate")

    def subagentEnded(self, callId: str, child: int, status: str, summary: str) -> None:
        raise RuntimeError("a subagent cannot delegate")


@attrs.define(eq=False)
class _Child:
    task: Task
    agent: Any  # an AIAgent
    cancelEvent: threading.Event = attrs.field(factory=threading.Event)


@attrs.define(eq=False)
class Delegation:
    """One ``delegate_task`` call's children, run from the call's own thread."""

    agent: Parent
    cancellation: Cancellation
    observer: ITurnObserver
    workspace: Workspace
    extraTools: Mapping[str, Tool]
    callId: str
    #: The parent's system prompt (where it works, the project's instructions), which the
    #: children's begin with.
    parentPrompt: str
    #: Held while the delegation runs: the run's delegate calls take turns (as in Hermes), so a
    #: reply of many of them still runs at most ``parallel`` children at once.
    turnLock: threading.Lock = attrs.field(factory=threading.Lock)

    @property
    def maxTasks(self) -> int:
        return self.agent.subagents.maxTasks

    def run(self, tasks: list[Task]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Run the tasks, ``parallel`` at once; each task's result (Hermes' shape) and the
        child's messages, in task order. A cancel interrupts every running child at once and
        starts no other."""
        while not self.turnLock.acquire(timeout=0.1):  # another delegate call of the run goes first
            if self.cancellation.cancelled:
                return [(self._failed(task, "interrupted by the user before it started", INTERRUPTED), [])
                        for task in tasks]
        try:
            return self._run(tasks)
        finally:
            self.turnLock.release()

    def _run(self, tasks: list[Task]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        settings = self.agent.subagents
        slots = settings.slots
        inbox: queue.Queue[Any] = queue.Queue()
        waiting: deque[Task] = deque(tasks)
        running: dict[int, _Child] = {}
        results: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        asked = 0
        deadline: float | None = None
        with self.cancellation.watching(inbox):
            try:
                while running or (waiting and deadline is None):
                    while deadline is None and asked < len(waiting) and asked + len(running) < settings.parallel:
                        slots.ask(inbox)
                        asked += 1
                    try:
                        item = inbox.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if item is _WOKEN:
                        deadline = time.monotonic() + CANCEL_WAIT
                        asked -= slots.withdraw(inbox)
                        for child in running.values():
                            child.cancelEvent.set()
                            child.agent.interrupt()
                    elif item is GRANTED:
                        asked -= 1
                        if deadline is not None:
                            slots.release()
                            continue
                        task = waiting.popleft()
                        try:
                            child = self._child(task)
                            threading.Thread(target=self._runChild, args=(inbox, slots, child), daemon=True,
                                             name="hermes-subagent").start()
                        except Exception as e:  # no thread to be had (the process's limit), say
                            log.exception("%s could not start", task.name)
                            slots.release()
                            results[task.index] = (self._failed(task, f"it could not start: {e}"), [])
                        else:
                            running[task.index] = child
                    else:
                        index, result = item
                        running.pop(index, None)
                        results[index] = result
            finally:
                slots.withdraw(inbox)
                for late in slots.releaseGrants(inbox):  # results that came with the cancel count
                    if late is not _WOKEN:
                        results.setdefault(late[0], late[1])
        for task in tasks:
            if task.index not in results:
                why = "interrupted by the user before it started" if task.index not in running else \
                    "interrupted by the user; it did not stop in time"
                results[task.index] = (self._failed(task, why, INTERRUPTED), [])
        return [results[task.index] for task in tasks]

    def _child(self, task: Task) -> _Child:
        return _Child(task, self.agent.child(childPrompt(self.parentPrompt, task), self.agent.subagents.model))

    def _runChild(self, inbox: queue.Queue[Any], slots: ToolSlots, child: _Child) -> None:
        """A child's thread: its whole run, reported as started and ended to the parent's
        observer; whatever happens, its slot goes back and its result to the coordinator."""
        task = child.task
        result: tuple[dict[str, Any], list[dict[str, Any]]] = (self._failed(task, "it failed unexpectedly"), [])
        began = time.monotonic()
        try:
            _tell(self.observer.subagentStarted, self.callId, task.index, task.name, task.goal)
            run = child.agent.run_conversation(task.message(), [], ChildObserver(self.observer, self.callId, task),
                                               self.workspace, child.cancelEvent, dict(self.extraTools))
            result = (self._report(task, child.agent, run, time.monotonic() - began), run.messages)
        except Exception as e:
            log.exception("%s failed", task.name)
            result = (self._failed(task, f"{type(e).__name__}: {e}"), [])
        finally:
            report = result[0]
            _tell(self.observer.subagentEnded, self.callId, task.index, report["status"],
                  report.get("summary") or report.get("error") or "")
            slots.release()
            inbox.put((task.index, result))

    def _report(self, task: Task, agent: Any, run: TurnResult, seconds: float) -> dict[str, Any]:
        """A finished child as the parent reads it (Hermes' result fields)."""
        settings = self.agent.subagents
        exitReason = {"end_turn": COMPLETED, "max_tokens": COMPLETED, "cancelled": INTERRUPTED,
                      "max_turn_requests": "max_iterations"}.get(run.stop_reason, run.stop_reason)
        if run.failure is not None:
            status, error = FAILED, f"model error: {run.failure}"
        elif run.stop_reason == "cancelled":
            status, error = INTERRUPTED, "interrupted by the user"
        elif run.stop_reason == "max_turn_requests":
            status, error = FAILED, f"it made {agent.maxIterations} model requests without finishing"
        elif run.stop_reason == "refusal":
            status, error = FAILED, "the model refused"
        else:
            status, error = COMPLETED, None
        report: dict[str, Any] = {
            "task_index": task.index, "status": status,
            "summary": bounded(run.final_text.strip(), settings.summaryChars),
            "api_calls": sum(1 for m in run.messages if m.get("role") == "assistant"),
            "duration_seconds": round(seconds, 2), "model": agent.model, "exit_reason": exitReason,
            "tokens": {"input": run.usage.inputTokens, "output": run.usage.outputTokens},
            "tool_trace": toolTrace(run.messages),
        }
        if error:
            report["error"] = error
        return report

    @staticmethod
    def _failed(task: Task, error: str, status: str = FAILED) -> dict[str, Any]:
        return {"task_index": task.index, "status": status, "summary": "", "error": error,
                "exit_reason": INTERRUPTED if status == INTERRUPTED else "error"}


def toolTrace(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The child's tool calls (Hermes' ``tool_trace``): name, sizes, whether each failed."""
    arguments: dict[str, tuple[str, int]] = {}
    trace: list[dict[str, Any]] = []
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments[call.get("id", "")] = (function.get("name", ""), len(str(function.get("arguments", ""))))
        if message.get("role") == "tool" and len(trace) < MAX_TRACE:
            name, size = arguments.get(message.get("tool_call_id", ""), (message.get("name", ""), 0))
            content = str(message.get("content", ""))
            trace.append({"tool": name, "args_bytes": size, "result_bytes": len(content.encode("utf-8", "replace")),
                          "status": "error" if content.startswith("Error:") else "ok"})
    return trace


def _tell(event: Any, *args: Any) -> None:
    try:
        event(*args)
    except Exception:
        log.exception("observer %r failed", event)
