"""A turn observer for engine tests: records everything a run reports, from any thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from zope.interface import implementer

from hermes_acp.engine.approval import ALLOW_ONCE, REJECT_ONCE
from hermes_acp.interfaces import ITurnObserver


@implementer(ITurnObserver)
class RecordingObserver:
    """Records the run; answers approval questions with ``commandAnswer`` and
    ``editAnswer``, and reads with ``readAnswer`` (a word of ``engine.approval``, or a
    function of the question)."""

    def __init__(self, commandAnswer: Any = REJECT_ONCE, editAnswer: Any = REJECT_ONCE,
                 readAnswer: Any = ALLOW_ONCE, toolAnswer: Any = None, planAnswer: Any = REJECT_ONCE,
                 userAnswer: tuple[str, str] = ("no_answer", "nobody is here")) -> None:
        self.lock = threading.Lock()
        self.texts: list[str] = []
        self.thoughts: list[str] = []
        self.events: list[tuple[str, str, str, Any, dict[str, Any]]] = []
        self.commands: list[tuple[str, str, str]] = []
        self.edits: list[tuple[str, Any]] = []
        self.reads: list[tuple[str, str, str]] = []
        self.plans: list[tuple[str, str]] = []
        self.terminals: list[tuple[str, str]] = []
        self.outputs: list[tuple[str, str]] = []
        #: (call id, how many events came before it started running)
        self.running: list[tuple[str, int]] = []
        self.delegated: list[tuple[str, str, dict[str, Any]]] = []
        #: (call id, question, choices) of each ``clarify``; ``userAnswer`` answers them.
        self.questions: list[tuple[str, str, list[str]]] = []
        self.userAnswer = userAnswer
        #: ("started", id, reason), ("text", id, delta), ("ended", id, status, summary, error, before, after)
        self.compactions: list[tuple[Any, ...]] = []
        #: ("started", call id, child, name, goal), ("text", call id, child, delta),
        #: ("ended", call id, child, status, summary) of ``delegate_task``'s children
        self.children: list[tuple[Any, ...]] = []
        #: ``toolAnswer(name, arguments)`` answers a delegated (MCP) call.
        self.toolAnswer = toolAnswer or (lambda name, arguments: (f"ran {name}", False, {}))
        self.commandAnswer = commandAnswer
        self.editAnswer = editAnswer
        self.planAnswer = planAnswer
        self.readAnswer = readAnswer
        self.gotText = threading.Event()
        self.startedTool = threading.Event()

    def text(self, delta: str) -> None:
        self.texts.append(delta)
        self.gotText.set()

    def thought(self, delta: str) -> None:
        self.thoughts.append(delta)

    def toolStarted(self, callId: str, name: str, arguments: dict[str, Any], extras: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(("started", name, callId, arguments, extras))
        self.startedTool.set()

    def toolRunning(self, callId: str) -> None:
        with self.lock:
            self.running.append((callId, len(self.events)))

    def toolEnded(self, callId: str, name: str, result: str, failed: bool, extras: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(("failed" if failed else "finished", name, callId, result, extras))

    def approveCommand(self, callId: str, command: str, reason: str) -> str:
        with self.lock:
            self.commands.append((callId, command, reason))
        return _answer(self.commandAnswer, command)

    def approveEdit(self, callId: str, proposal: Any) -> str:
        with self.lock:
            self.edits.append((callId, proposal))
        return _answer(self.editAnswer, proposal)

    def approveRead(self, callId: str, path: str, reason: str) -> str:
        with self.lock:
            self.reads.append((callId, path, reason))
        return _answer(self.readAnswer, path)

    def approvePlan(self, callId: str, plan: str) -> str:
        with self.lock:
            self.plans.append((callId, plan))
        return _answer(self.planAnswer, plan)

    def terminalStarted(self, callId: str, terminalId: str) -> None:
        self.terminals.append((callId, terminalId))

    def commandOutput(self, callId: str, output: str) -> None:
        self.outputs.append((callId, output))

    def callTool(self, callId: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        with self.lock:
            self.delegated.append((callId, name, arguments))
        answer: tuple[str, bool, dict[str, Any]] = self.toolAnswer(name, arguments)
        return answer

    def askUser(self, callId: str, question: str, choices: list[str]) -> tuple[str, str]:
        with self.lock:
            self.questions.append((callId, question, choices))
        return self.userAnswer

    def compactionStarted(self, compactionId: str, reason: str) -> None:
        self.compactions.append(("started", compactionId, reason))

    def compactionText(self, compactionId: str, delta: str) -> None:
        self.compactions.append(("text", compactionId, delta))

    def compactionEnded(self, compactionId: str, status: str, summary: str, error: str, before: int, after: int) -> None:
        self.compactions.append(("ended", compactionId, status, summary, error, before, after))

    def subagentStarted(self, callId: str, child: int, name: str, goal: str) -> None:
        with self.lock:
            self.children.append(("started", callId, child, name, goal))

    def subagentText(self, callId: str, child: int, delta: str) -> None:
        with self.lock:
            self.children.append(("text", callId, child, delta))

    def subagentEnded(self, callId: str, child: int, status: str, summary: str) -> None:
        with self.lock:
            self.children.append(("ended", callId, child, status, summary))

    def ends(self) -> dict[str, str]:
        """call id -> how it ended; fails if a call ended twice or never started."""
        started = {e[2] for e in self.events if e[0] == "started"}
        ended: dict[str, str] = {}
        for event, _, callId, _, _ in self.events:
            if event != "started":
                assert callId in started and callId not in ended
                ended[callId] = event
        assert set(ended) == started
        return ended


def _answer(answer: Any, question: Any) -> str:
    result: str = answer(question) if isinstance(answer, Callable) else answer  # type: ignore[arg-type]
    return result
