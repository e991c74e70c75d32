"""``rewind.Rewinds``: the order of a rewind's steps, on the real checkpoint store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, maybeDeferred

from hermes_acp.engine import restore
from hermes_acp.engine.checkpoints import CheckpointStore, TurnCheckpoint
from hermes_acp.rewind import Rewinds
from hermes_acp.session_state import SessionState


class Crashed(Exception):
    """The process died here."""


class Updates:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, state: SessionState, update: dict[str, Any]) -> None:
        self.sent.append(update)


class Window:
    def window(self, model: str | None) -> int:
        return 128_000


class Turns:
    """The session store's side of a rewind: its prompt turns, and the cuts asked for."""

    def __init__(self) -> None:
        self.cuts: list[int] = []

    def turns(self, state: SessionState) -> Deferred[list[tuple[int, int | None, str, str]]]:
        return maybeDeferred(lambda: [(1, 0, "write it", "")][len(self.cuts):])

    def rewind(self, state: SessionState, turn: int) -> Deferred[list[int]]:
        self.cuts.append(turn)
        return maybeDeferred(lambda: [turn])


def test_aCrashWhileFilesComeBackLeavesTheTurnToRewindAgain(tmp_path: Path) -> None:
    """The files are put back before the conversation is cut: a crash in between leaves the
    turn listed, and the same /undo after the restart finishes the job."""
    folder = tmp_path / "project"
    folder.mkdir()
    checkpoints = CheckpointStore(tmp_path / "checkpoints")
    checkpoint = TurnCheckpoint(checkpoints, "s1", 1, (str(folder),))
    checkpoint.beforeChange()
    (folder / "a.txt").write_text("the agent's\n")
    checkpoint.finish()
    state = SessionState(sessionId="s1", cwd=str(folder))
    turns = Turns()

    def crashing(f: Any, *args: Any) -> Deferred[Any]:
        return fail(Crashed()) if f is restore.apply else maybeDeferred(f, *args)

    def rewinds(run: Any) -> Rewinds:
        return Rewinds(turns, Updates(), None, Window(), run, lambda: checkpoints)  # type: ignore[arg-type]

    failure = Deferred.fromCoroutine(rewinds(crashing).undo(state, "", lambda d: None))
    with pytest.raises(Crashed):
        failure.result.raiseException()
    failure.addErrback(lambda _: None)
    assert turns.cuts == [] and checkpoints.turns("s1") == [1]

    reply = Deferred.fromCoroutine(rewinds(maybeDeferred).undo(state, "", lambda d: None)).result
    assert "Rewound to before turn 1" in reply and "remove (created since): `a.txt`" in reply
    assert not (folder / "a.txt").exists()
    assert turns.cuts == [1] and checkpoints.turns("s1") == []
