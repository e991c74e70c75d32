"""What the editor sees of background processes: the card of the ``terminal`` call
that started one stays ``in_progress`` with the output's tail, and completes (or
fails) with the exit code when the process ends, in a turn or between turns (a
``session/update`` outside a turn is valid ACP).

The engine's ``BackgroundProcesses`` reports from its reader thread; each report
crosses to the reactor here (``callFromThread``), where the card's updates go out
through the update channel. The start and the end are journaled, tagged in
``_meta`` (``hermesAcp.background``), so a replay shows the card as it ended; the
live tail is not (like a foreground command's). After a restart, ``loaded`` finds
the cards a previous agent process left running (``ReplayedCards`` notes them as a
load's replay goes by): their processes ended with it, so the cards fail, that is
journaled, and the model is told at the next prompt (a fork's copy of a card whose
process runs in the session it came from fails too, saying so: the process is not
the fork's).
Wired once per connection; the state is per session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorFromThreads

from .engine.background import BackgroundError, BackgroundProcesses
from .interfaces import ISessionStore, IUpdateChannel
from .render import shownOutput, textContent
from .session_state import SessionState
from .subagents import tagOf, tagged

#: Ends heard before their card was shown (the process ended as its call was answered), kept at most.
MAX_EARLY = 64
LOST = "Ended when the agent's previous process stopped (the agent was restarted)."
FORKED = "It belongs to the session this one was forked from, where it runs on."


def backgroundMeta(snapshot: dict[str, Any], status: str) -> dict[str, Any]:
    """The tag of a background card's update (a snapshot, or a tag read back from the journal)."""
    return {"hermesAcp": {"background": {"processId": snapshot["processId"], "number": snapshot.get("number"),
                                         "command": snapshot.get("command"), "status": status}}}


def _tagged(update: dict[str, Any]) -> dict[str, Any] | None:
    meta = update.get("_meta")
    tagged = meta.get("hermesAcp") if isinstance(meta, dict) else None
    found = tagged.get("background") if isinstance(tagged, dict) else None
    return found if isinstance(found, dict) and isinstance(found.get("processId"), str) else None


@attrs.define(eq=False)
class ReplayedCards:
    """The background cards a load's replay leaves open, noted as the replay goes by
    (``see``): one entry per card started and not yet ended. Every other update is let go
    at once: a subagent's updates all have a ``_meta`` and are decoded too, and keeping
    them would hold a child's whole journal until the load's end. ``BackgroundCards.loaded``
    then says what became of the open cards."""

    #: process id -> the card's toolCallId, its background tag, its subagent tag (None: the
    #: parent's own card); in the order the cards started, the order ``loaded`` fails them in.
    open: dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]] = attrs.field(factory=dict)

    def see(self, updates: Iterable[dict[str, Any]]) -> None:
        """Replayed updates, in the journal's order: a card's start opens it, any other
        update of it (its end, or its failure at an earlier load) closes it."""
        for update in updates:
            found = _tagged(update) if isinstance(update, dict) else None
            if found is None:
                continue
            if found.get("status") == "running" and isinstance(update.get("toolCallId"), str):
                self.open[found["processId"]] = (update["toolCallId"], found, tagOf(update))
            else:
                self.open.pop(found["processId"], None)


@attrs.define(eq=False)
class BackgroundCards:
    """The cards of every session's background processes, on the reactor."""

    reactor: IReactorFromThreads
    store: ISessionStore
    updates: IUpdateChannel
    processes: BackgroundProcesses
    #: (session id, process id) -> the card's toolCallId, and its subagent tag when a child
    #: started it (its updates go where the child's card is: ``subagents``).
    _cards: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = attrs.field(factory=dict)
    _early: dict[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.processes.listener = self._heard

    def _heard(self, sessionId: str, kind: str, snapshot: dict[str, Any]) -> None:
        """In the reader's thread."""
        self.reactor.callFromThread(self._event, sessionId, kind, snapshot)

    def adopt(self, session: SessionState, toolCallId: str, extras: dict[str, Any],
              child: dict[str, Any] | None = None) -> None:
        """The ``terminal`` call that started a process answered: its card stays in progress
        (or ends at once, when the process already ended). ``child``: the subagent tag of the
        card, when a child made the call (the process is the session's, the card the child's)."""
        owner = self.processes.find(session.sessionId)
        key = (session.sessionId, str(extras["background"]))
        try:
            proc = owner.find(key[1]) if owner is not None else None
        except BackgroundError:  # already forgotten: it ended, and many more after it
            proc = None
        ended = self._early.pop(key, None)
        snapshot = proc.snapshot() if proc is not None else ended
        if snapshot is None:  # nothing is known of it any more
            self._send(session, child, {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                                        "status": "completed", "content": [textContent("It has ended.")]})
            return
        self._cards[key] = (toolCallId, child)
        self._send(session, child, {
            "sessionUpdate": "tool_call_update", "toolCallId": toolCallId, "status": "in_progress",
            "content": self._running(snapshot), "rawOutput": {"processId": key[1], "pid": snapshot["pid"]},
            "_meta": backgroundMeta(snapshot, "running"),
        })  # fmt: skip
        if ended is not None:
            self._event(session.sessionId, "ended", ended)

    def _send(self, session: SessionState, child: dict[str, Any] | None, update: dict[str, Any],
              journal: bool = True) -> None:
        self.updates.send(session, update if child is None else tagged(update, child), journal)

    def _running(self, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
        header = (f"Running in the background as #{snapshot['number']} ({snapshot['processId']}, pid "
                  f"{snapshot['pid']}); `/kill {snapshot['number']}` ends it.")
        return [textContent(header), textContent(shownOutput(snapshot["tail"], "(no output yet)"))]

    def _event(self, sessionId: str, kind: str, snapshot: dict[str, Any]) -> None:
        key = (sessionId, snapshot["processId"])
        session = self.store.sessions.get(sessionId)
        toolCallId, child = self._cards.get(key) or (None, None)
        if session is None:
            self._cards.pop(key, None)
            return
        if toolCallId is None:
            if kind == "ended":
                self._early[key] = snapshot
                while len(self._early) > MAX_EARLY:
                    self._early.pop(next(iter(self._early)))
            return
        if kind == "output":
            self._send(session, child, {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                                        "content": self._running(snapshot),
                                        "_meta": backgroundMeta(snapshot, "running")}, journal=False)
            return
        del self._cards[key]
        code = snapshot["exitCode"]
        how = "killed" if snapshot["reason"] == "killed" else (
            "ended with the session" if snapshot["reason"] == "session_closed" else "exited")
        self._send(session, child, {
            "sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
            "status": "completed" if code == 0 else "failed",
            "content": [textContent(f"{shownOutput(snapshot['tail'])}\n{how}, exit code {code}")],
            "rawOutput": {"output": snapshot["tail"], "exitCode": code, "processId": snapshot["processId"]},
            "_meta": backgroundMeta(snapshot, "exited"),
        })  # fmt: skip

    def loaded(self, session: SessionState, replayed: ReplayedCards) -> None:
        """A load replayed the journal: cards it left open whose processes do not run in
        this agent ended with the agent's previous process. They fail (journaled), and the
        model hears of them at the next prompt."""
        lost = []
        for processId, (toolCallId, found, child) in replayed.open.items():
            owner = self.processes.ownerOf(processId)
            if owner == session.sessionId:
                continue  # it runs here: its card goes on
            if owner is None:
                lost.append(found)
            self._send(session, child, {
                "sessionUpdate": "tool_call_update", "toolCallId": toolCallId, "status": "failed",
                "content": [textContent(LOST if owner is None else FORKED)],
                "_meta": backgroundMeta(found, "lost" if owner is None else "elsewhere"),
            })  # fmt: skip
        if lost:
            self.processes.forSession(session.sessionId).lost(lost)

    def forget(self, session: SessionState) -> None:
        """The session is closed or deleted: its processes end (their cards are the editor's no more)."""
        self.processes.drop(session.sessionId)
        for key in [key for key in (*self._cards, *self._early) if key[0] == session.sessionId]:
            self._cards.pop(key, None)
            self._early.pop(key, None)
