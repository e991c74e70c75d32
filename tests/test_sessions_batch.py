"""The database thread's group commit (issue 27): the writes of many sessions asked for
together share one transaction; when its commit fails, each is done again on its own,
once."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults

from hermes_acp.sessions import SessionManager
from hermes_acp.store import SessionDB, StoreError

SESSIONS = 40


async def _manager() -> SessionManager:
    manager = SessionManager(reactor, Path(tempfile.mkdtemp()) / "state.db")
    manager.dbThread.startService()
    return manager


async def _journalEverySession(manager: SessionManager, created=lambda: None) -> list:
    states = [await manager.create("/tmp", []) for _ in range(SESSIONS)]
    created()
    for n, state in enumerate(states):
        manager.journalUpdate(state, {"sessionUpdate": "agent_message_chunk",
                                      "content": {"type": "text", "text": f"update {n}"}})
    problems = await gatherResults([manager.flush(state) for state in states])
    return states, problems


def _eachJournaledOnce(manager: SessionManager, states: list) -> None:
    db = manager._database()
    for n, state in enumerate(states):
        assert [u["content"]["text"] for u in db.loadJournal(state.sessionId).updates] == [f"update {n}"]


@pytest_twisted.ensureDeferred
async def test_manySessionsShareACommit(monkeypatch) -> None:
    batches: list[int] = []
    original = SessionDB.batch

    @contextlib.contextmanager
    def counted(self: SessionDB) -> Iterator[None]:
        batches.append(1)
        with original(self):
            yield

    monkeypatch.setattr(SessionDB, "batch", counted)
    manager = await _manager()
    try:
        states, problems = await _journalEverySession(manager, batches.clear)
        assert problems == [None] * SESSIONS
        assert 1 <= len(batches) <= 3  # one per session before
        _eachJournaledOnce(manager, states)
    finally:
        await manager.close()
        await manager.dbThread.stopService()


@pytest_twisted.ensureDeferred
async def test_aFailedCommitIsDoneAgainOnceEach(monkeypatch) -> None:
    original = SessionDB.batch
    failures = [1]

    @contextlib.contextmanager
    def failing(self: SessionDB) -> Iterator[None]:
        with original(self):
            yield
            if failures:
                failures.pop()
                raise StoreError("the disk is full (a test)")  # the batch's transaction rolls back

    monkeypatch.setattr(SessionDB, "batch", failing)
    manager = await _manager()
    try:
        states, problems = await _journalEverySession(manager)
        assert failures == []
        assert problems == [None] * SESSIONS
        _eachJournaledOnce(manager, states)
    finally:
        await manager.close()
        await manager.dbThread.stopService()


@pytest_twisted.ensureDeferred
async def test_chunksAreLinkedOnceIdle(monkeypatch) -> None:
    """A turn's end only queues the linking of its answer's chunks to the answer; the
    database thread does it once it has been idle for ``LINK_DELAY``, and a replay is the
    same before and after."""
    from twisted.internet import task

    import hermes_acp.sessions as sessions

    monkeypatch.setattr(sessions, "LINK_DELAY", 0.05)
    manager = await _manager()
    try:
        state = await manager.create("/tmp", [])
        await manager.beginTurn(state, "explain the parser")
        answer = "The parser reads tokens, then the lexer splits lines into words."
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": answer}}
        manager.journalUpdate(state, update)
        await manager.endTurn(state, [{"role": "user", "content": "explain the parser"},
                                      {"role": "assistant", "content": answer}])
        db = manager._database()

        def refs() -> list:
            with db._read() as cursor:
                return [ref for (ref,) in cursor.execute(
                    "SELECT ref FROM acp_journal WHERE session_id = ?", (state.sessionId,))]

        assert refs() == [None]
        for _ in range(100):  # bounded: 5 s at most
            if refs() != [None]:
                break
            await task.deferLater(reactor, 0.05, lambda: None)
        assert refs() != [None]
        assert db.loadJournal(state.sessionId).updates == [update]
    finally:
        await manager.close()
        await manager.dbThread.stopService()
