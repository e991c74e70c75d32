"""One session's record, live in memory: ``SessionState``."""

from __future__ import annotations

import json
from typing import Any

import attrs
from twisted.internet.interfaces import IDelayedCall

from .engine.access import EDIT_MODES
from .store import SessionRecord, timestamp


@attrs.define(eq=False)
class SessionState:
    """One session's record, live in memory: its settings, history and journal
    buffer. Touched only in the reactor thread. Its turns are scheduled by the
    turn queue, its engine agent is owned by its options (``SessionOptions``)."""

    sessionId: str
    cwd: str
    additionalDirectories: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    model: str | None = None
    mode: str = "default"
    #: The config options' values, and the memory snapshot of its system prompt
    #: (``engine_factory.MEMORY_SNAPSHOT``): saved with the session's settings.
    config: dict[str, Any] = attrs.field(factory=dict)
    title: str | None = None
    #: The title is the first prompt line's stand-in, which the model's title may replace
    #: (``hermes_acp.naming``); ``/title`` clears it. Not saved: only a first turn asks.
    autoTitle: bool = False
    createdAt: str = attrs.field(factory=timestamp)
    updatedAt: str = attrs.field(default=attrs.Factory(lambda self: self.createdAt, takes_self=True))
    history: list[dict[str, Any]] = attrs.field(factory=list)
    #: False after a load or resume until a turn (or a fork) needs the history: reading
    #: and decoding a long one is most of a load's work, and an editor may only look.
    historyLoaded: bool = True
    turnNumber: int = 0  # the number of the last turn begun (the store's count)
    contextUsed: int = 0
    #: A cancelled turn was answered before its worker said how much context it used: every
    #: update of a turn comes before its answer (ACP), so the next turn's first one says it.
    usageOwed: bool = False
    usageTotals: dict[str, int] = attrs.field(factory=dict)
    #: What the endpoint says the session's requests cost in all (USD; None: it never said).
    cost: float | None = None
    journal: list[dict[str, Any]] = attrs.field(factory=list)
    flushCall: IDelayedCall | None = None
    announced: bool = False  # its new/load/resume/fork response has been written
    #: ``settings()`` as last given to the store to write (None: not yet by this process).
    savedSettings: tuple[Any, ...] | None = None

    @classmethod
    def fromRecord(cls, record: SessionRecord, history: list[dict[str, Any]]) -> SessionState:
        return cls(
            sessionId=record.sessionId,
            cwd=record.cwd,
            additionalDirectories=record.additionalDirectories,
            model=record.model,
            mode=record.mode if record.mode in EDIT_MODES else "default",
            config=dict(record.config),
            title=record.title,
            createdAt=record.createdAt,
            updatedAt=record.updatedAt,
            history=history,
            turnNumber=record.turn,
        )

    def record(self) -> SessionRecord:
        return SessionRecord(
            sessionId=self.sessionId,
            cwd=self.cwd,
            additionalDirectories=self.additionalDirectories,
            title=self.title,
            model=self.model,
            mode=self.mode,
            config=self.config,
            createdAt=self.createdAt,
            updatedAt=self.updatedAt,
        )

    def settings(self) -> tuple[Any, ...]:
        """What the store keeps of the session's settings, to compare (``updatedAt`` aside)."""
        return (self.title, self.model, self.mode, json.dumps(self.config, sort_keys=True, default=repr), self.cwd,
                self.additionalDirectories)

    @property
    def roots(self) -> tuple[str, ...]:
        return (self.cwd, *self.additionalDirectories)
