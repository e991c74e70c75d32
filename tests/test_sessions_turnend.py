"""What a turn's end writes of the session's settings (issue 27): only what changed since they
were last written, yet every change reaches the store, and the session's time moves on."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor

from hermes_acp.sessions import SessionManager
from hermes_acp.store import SessionDB


@pytest_twisted.ensureDeferred
async def test_aTurnsEndWritesTheSettingsOnlyWhenTheyChanged(monkeypatch) -> None:
    written: list[dict] = []
    original = SessionDB.updateSession
    monkeypatch.setattr(SessionDB, "updateSession",
                        lambda self, sessionId, **fields: written.append(fields) or original(self, sessionId, **fields))
    manager = SessionManager(reactor, Path(tempfile.mkdtemp()) / "state.db")
    manager.dbThread.startService()
    try:
        state = await manager.create("/tmp", [])
        db = manager._database()

        async def turn(n: int, messages: bool = True) -> tuple[int, str]:
            await manager.beginTurn(state, f"prompt {n}")
            before = len(written)
            await manager.endTurn(state, [{"role": "user", "content": f"prompt {n}"},
                                          {"role": "assistant", "content": f"answer {n}"}] if messages else [])
            return len(written) - before, db.getSession(state.sessionId).updatedAt

        assert (await turn(1))[0] == 1  # not yet written by this process
        last = db.getSession(state.sessionId).updatedAt
        count, updated = await turn(2)
        assert count == 0 and updated > last  # nothing changed: the messages' insert moved the time
        state.title, state.mode = "Parser work", "accept_edits"
        assert (await turn(3))[0] == 1
        state.config.setdefault("memory", "")
        state.config["memory"] += " remembered"  # changed in place
        assert (await turn(4))[0] == 1
        last = db.getSession(state.sessionId).updatedAt
        count, updated = await turn(5, messages=False)  # (a slash command's turn): the settings move the time
        assert count == 1 and updated > last
        stored = db.getSession(state.sessionId)
        assert (stored.title, stored.mode, stored.config["memory"]) == ("Parser work", "accept_edits", " remembered")
        assert (await turn(6))[0] == 0
    finally:
        await manager.close()
        await manager.dbThread.stopService()
