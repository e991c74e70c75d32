"""Permission requests to the editor, with timeout-to-deny (``IPermissionBroker``).

The answers are the engine's vocabulary (``engine.approval``): the option kinds the
editor is offered, plus cancelled, timeout and failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, DeferredLock
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from .engine.approval import ALLOW_ALWAYS, ALLOW_ONCE, CANCELLED, FAILED, REJECT_ALWAYS, REJECT_ONCE, TIMEOUT
from .interfaces import IPermissionBroker

log = Logger()


_NAMES = {
    "edit": {
        ALLOW_ONCE: "Allow this edit",
        ALLOW_ALWAYS: "Allow edits in the workspace for this session",
        REJECT_ONCE: "Reject",
        REJECT_ALWAYS: "Reject edits to this file for this session",
    },
    "read": {
        ALLOW_ONCE: "Allow this read",
        ALLOW_ALWAYS: "Allow reads in this folder for this session (secrets still ask)",
        REJECT_ONCE: "Reject",
        REJECT_ALWAYS: "Reject reads of this path for this session",
    },
    "tool": {
        ALLOW_ONCE: "Allow this call",
        ALLOW_ALWAYS: "Always allow this tool in this session",
        REJECT_ONCE: "Reject",
        REJECT_ALWAYS: "Always reject this tool in this session",
    },
    "plan": {  # plan mode's end (``engine.planning``): no "always" answers
        ALLOW_ONCE: "Yes, implement it (ask before each edit)",
        ALLOW_ALWAYS: "Yes, implement it and accept edits",
        REJECT_ONCE: "No, keep planning",
    },
    "execute": {
        ALLOW_ONCE: "Run once",
        ALLOW_ALWAYS: "Always allow this command in this session",
        REJECT_ONCE: "Reject",
        REJECT_ALWAYS: "Always reject this command in this session",
    },
}


def permissionOptions(kind: str) -> list[dict[str, str]]:
    """The option kinds the question offers (all four but for a plan); the option id is the kind."""
    names = _NAMES.get(kind, _NAMES["execute"])
    return [{"optionId": k, "name": names[k], "kind": k}
            for k in (ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS) if k in names]


#: A question's answer from a client that has nobody to ask (``unanswerable``).
UNANSWERABLE = "unanswerable"


def unanswerable(result: Any) -> bool:
    """Whether a client answered a question (``choose``) saying nobody can answer it: our own
    ``hermes-acp prompt`` without a terminal marks its answer so (``_meta``), as ACP has no
    outcome for it; the model is told so instead of "declined"."""
    meta = result.get("_meta") if isinstance(result, dict) else None
    mark = meta.get("hermes-acp") if isinstance(meta, dict) else None
    return isinstance(mark, dict) and mark.get("unanswerable") is True


def readOutcome(result: Any, offered: list[dict[str, Any]], key: str = "kind") -> str:
    """The client's answer as one of our outcomes (the chosen option's ``key``);
    anything unexpected denies."""
    outcome = result.get("outcome") if isinstance(result, dict) else None
    if not isinstance(outcome, dict):
        return FAILED
    if outcome.get("outcome") == "cancelled":
        return CANCELLED
    if outcome.get("outcome") == "selected":
        chosen = outcome.get("optionId")
        for option in offered:
            if option["optionId"] == chosen:
                return option[key]
    return FAILED


@implementer(IPermissionBroker)
@attrs.define(eq=False)
class PermissionBroker:
    """Sends ``session/request_permission``; serialized per session.

    ``callRemote`` is the connection's; ``timeout`` counts from the moment the
    request is sent. Cancelling the returned Deferred withdraws the request
    (the client is sent ``$/cancel_request``) and answers "cancelled".
    """

    callRemote: Callable[..., Deferred[Any]]
    clock: IReactorTime
    timeout: float
    _locks: dict[str, DeferredLock] = attrs.field(factory=dict, init=False)

    def requestPermission(self, sessionId: str, toolCall: dict[str, Any], kind: str) -> Deferred[str]:
        lock = self._locks.setdefault(sessionId, DeferredLock())
        d = lock.run(self._ask, sessionId, toolCall, kind)
        d.addErrback(lambda f: (f.trap(CancelledError), CANCELLED)[1])
        return d

    def choose(self, sessionId: str, toolCall: dict[str, Any], options: list[dict[str, Any]]) -> Deferred[str]:
        lock = self._locks.setdefault(sessionId, DeferredLock())
        d = lock.run(self._send, sessionId, toolCall, options, "optionId", True)
        d.addErrback(lambda f: (f.trap(CancelledError), CANCELLED)[1])
        return d

    def forget(self, sessionId: str) -> None:
        """Drop the session's queue of questions once it is idle (a question still
        out keeps it, so a session loaded again meanwhile still asks one at a time)."""
        lock = self._locks.get(sessionId)
        if lock is not None and not lock.locked:
            del self._locks[sessionId]

    def _ask(self, sessionId: str, toolCall: dict[str, Any], kind: str) -> Deferred[str]:
        return self._send(sessionId, toolCall, permissionOptions(kind), "kind")

    def _send(self, sessionId: str, toolCall: dict[str, Any], offered: list[dict[str, Any]], key: str,
              question: bool = False) -> Deferred[str]:
        d = self.callRemote(
            "session/request_permission", {"sessionId": sessionId, "toolCall": toolCall, "options": offered}
        )
        d.addCallback(lambda result: UNANSWERABLE if question and unanswerable(result) else readOutcome(result, offered, key))
        d.addTimeout(self.timeout, self.clock, onTimeoutCancel=lambda result, timeout: TIMEOUT)
        d.addErrback(self._failed, sessionId)
        d.addCallback(self._logged, sessionId, toolCall.get("toolCallId"))
        return d

    def _failed(self, failure: Failure, sessionId: str) -> str:
        if failure.check(CancelledError):
            return CANCELLED
        log.warn(
            "permission request for session {sessionId} failed ({error}); denying",
            sessionId=sessionId,
            error=failure.getErrorMessage(),
        )
        return FAILED

    def _logged(self, outcome: str, sessionId: str, callId: Any) -> str:
        log.debug("permission for {callId} in {sessionId}: {outcome}", callId=callId, sessionId=sessionId, outcome=outcome)
        return outcome
