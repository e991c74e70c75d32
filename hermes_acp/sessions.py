"""Live sessions and their persistence (``ISessionStore``).

The reactor thread owns every ``SessionState``. Disk work runs on one
dedicated database thread (so writes keep their order) and comes back as
Deferreds. Updates sent to the editor are journaled in batches: buffered in
memory and flushed within ``JOURNAL_FLUSH`` seconds, and always before a
prompt's response, so a finished turn is durable when the editor hears of it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger
from zope.interface import implementer

from .interfaces import ISessionStore
from .jsonrpc import InternalError, ResourceNotFound
from .lease import describeOwner, ownerAlive, ownerToken
from .oneshot import OneShot
from .session_state import SessionState
from .store import Replay, SessionDB, SessionRecord, StoreError, timestamp
from .threads import WorkerPool

log = Logger()
P = ParamSpec("P")
T = TypeVar("T")

JOURNAL_FLUSH = 0.2
#: Replay at most this much of a session's journal on session/load.
REPLAY_MAX_UPDATES = 20_000
REPLAY_MAX_BYTES = 32 * 1024 * 1024


def storeFailure(error: StoreError) -> InternalError:
    return InternalError(f"Internal error: session storage unavailable: {error}")


@implementer(ISessionStore)
class SessionManager:
    """Sessions in memory, backed by ``state.db``.

    ``services`` lists the database thread for the application to start and stop.
    """

    def __init__(self, reactor: Any, dbPath: Path, onForget: Callable[[SessionState], None] | None = None) -> None:
        self.reactor = reactor
        self.dbPath = dbPath
        self.dbThread = WorkerPool(reactor, 1, name="hermes-db")
        self.sessions: dict[str, SessionState] = {}
        self.onForget = onForget
        self._db: SessionDB | None = None
        self._dbLock = threading.Lock()
        self._loading: dict[str, OneShot[SessionState]] = {}

    # -- the database thread ---------------------------------------------

    def _database(self) -> SessionDB:
        with self._dbLock:
            if self._db is None:
                self._db = SessionDB(self.dbPath)
            return self._db

    def warm(self) -> None:
        """Open the database now, on its thread (the first session need not wait for it);
        a failure is left for the first real call to report."""
        self.dbThread.run(self._database).addErrback(lambda f: None)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Deferred[Any]:
        """Run ``SessionDB.<method>`` on the database thread."""

        def run() -> Any:
            return getattr(self._database(), method)(*args, **kwargs)

        def translate(failure: Any) -> None:
            failure.trap(StoreError)
            raise storeFailure(failure.value)

        return self.dbThread.run(run).addErrback(translate)

    def close(self) -> Deferred[None]:
        """Flush every journal and close the database (on shutdown)."""
        d = self.flushAll()

        def closeDB(_: Any) -> Deferred[None] | None:
            if self._db is None:
                return None
            return self.dbThread.run(self._db.close)

        d.addCallback(closeDB)
        d.addErrback(lambda f: log.failure("closing state.db", f))
        return d

    # -- ISessionStore -----------------------------------------------------

    async def create(self, cwd: str, additionalDirectories: list[str], **settings: Any) -> SessionState:
        state = SessionState(sessionId=str(uuid.uuid4()), cwd=cwd, additionalDirectories=tuple(additionalDirectories), **settings)
        await self.call("createSession", state.record())
        self.sessions[state.sessionId] = state
        return state

    async def get(self, sessionId: str) -> SessionState:
        """The live session, restoring it from disk (with crash recovery) if needed."""
        state = self.sessions.get(sessionId)
        if state is not None:
            return state
        loading = self._loading.get(sessionId)
        if loading is None:  # the first caller loads it; later ones wait for the same load
            loading = self._loading[sessionId] = OneShot()

            def loaded(result: Any) -> None:
                del self._loading[sessionId]
                loading.fire(result)  # a Failure here fails every waiter

            Deferred.fromCoroutine(self._restore(sessionId)).addBoth(loaded)
        return await loading.when()

    async def _restore(self, sessionId: str) -> SessionState:
        record = await self.call("getSession", sessionId)
        if record is None:
            raise ResourceNotFound(f"Resource not found: session {sessionId}", {"sessionId": sessionId})
        if record.turnState == "running":
            recovered = await self.call("recoverInterrupted", sessionId, ownerAlive)
            if recovered is None:
                log.info("session {id} is running a turn in {owner}; leaving it alone",
                         id=sessionId, owner=describeOwner(record.turnOwner))
            else:
                log.info("session {id} was interrupted mid-turn; closed it ({n} updates)", id=sessionId, n=len(recovered))
        history = await self.call("loadMessages", sessionId)
        state = SessionState.fromRecord(record, history)
        # What the editor last heard of the context and the cost (the journal's usage_update),
        # so /context agrees with it in a new process too, and the cost goes on adding up.
        state.contextUsed, state.cost = await self.call("lastUsage", sessionId)
        self.sessions[sessionId] = state
        return state

    async def replay(self, state: SessionState) -> Replay:
        await self.flush(state)
        return await self.call("loadJournal", state.sessionId, REPLAY_MAX_UPDATES, REPLAY_MAX_BYTES)

    async def remove(self, sessionId: str) -> None:
        state = self.sessions.get(sessionId)
        if state is not None:
            self.forget(state)
        await self.call("deleteSession", sessionId)

    async def fork(self, sessionId: str, cwd: str, additionalDirectories: list[str]) -> SessionState:
        source = await self.get(sessionId)
        await self.flush(source)
        newId = str(uuid.uuid4())
        record = await self.call("forkSession", sessionId, newId, cwd, tuple(additionalDirectories))
        state = SessionState.fromRecord(record, [dict(m) for m in source.history])
        state.turnNumber, state.contextUsed, state.cost = source.turnNumber, source.contextUsed, source.cost
        self.sessions[newId] = state
        return state

    async def list(self, cwd: str | None, cursor: str | None) -> tuple[list[SessionRecord], str | None]:
        await self.flushAll()
        return await self.call("listSessions", cwd, cursor)

    def forget(self, state: SessionState) -> Deferred[Any]:
        """Drop a session from memory; fires once its journal is written."""
        written = self.flush(state)
        self.sessions.pop(state.sessionId, None)
        if self.onForget is not None:
            self.onForget(state)
        return written

    # -- settings, history and the journal -------------------------------

    def save(self, state: SessionState, touch: bool = True) -> Deferred[Any]:
        """Persist the session's settings (title, model, mode, config, cwd).

        A failure is logged, not raised: the live session keeps its settings.
        """
        if touch:
            state.updatedAt = timestamp()
        d = self.call(
            "updateSession", state.sessionId, title=state.title, model=state.model, mode=state.mode,
            config=state.config, cwd=state.cwd, additionalDirectories=state.additionalDirectories,
            updatedAt=state.updatedAt,
        )
        d.addErrback(lambda f: log.failure("saving session {id} failed", f, id=state.sessionId))
        return d

    def journalUpdate(self, state: SessionState, update: dict[str, Any]) -> None:
        """Remember an update for replay; written within JOURNAL_FLUSH seconds."""
        state.journal.append(update)
        if state.flushCall is None:
            state.flushCall = self.reactor.callLater(JOURNAL_FLUSH, self.flush, state)

    def flush(self, state: SessionState) -> Deferred[Any]:
        if state.flushCall is not None:
            if state.flushCall.active():
                state.flushCall.cancel()
            state.flushCall = None
        if not state.journal:
            return succeed(None)
        updates, state.journal = state.journal, []
        d = self.call("appendUpdates", state.sessionId, state.turnNumber, updates)
        d.addErrback(lambda f: log.failure("journal write for {id} failed", f, id=state.sessionId))
        return d

    def flushAll(self) -> Deferred[Any]:
        return gatherResults([self.flush(s) for s in list(self.sessions.values())])

    async def endTurn(self, state: SessionState, messages: list[dict[str, Any]],
                      history: list[dict[str, Any]] | None = None) -> None:
        """Make the finished turn durable: journal, new messages (or, after a compaction,
        the new ``history``, the old one archived), idle state.

        If the store refuses (another process marked the turn interrupted, or the
        disk failed), the messages are still appended when possible and the failure
        is logged: the editor's answer never depends on it, and the session is not
        left marked running.
        """
        state.updatedAt = timestamp()
        await self.flush(state)
        try:
            await self.call("endTurn", state.sessionId, state.turnNumber, messages, history)
        except Exception as e:
            log.warn("ending turn {turn} of {id} failed ({error}); appending its messages",
                     turn=state.turnNumber, id=state.sessionId, error=e)
            try:
                await self.call("appendMessages", state.sessionId, messages)
            except Exception:
                log.failure("saving turn {turn} of {id} failed", turn=state.turnNumber, id=state.sessionId)
        await self.save(state, touch=False)

    async def beginTurn(self, state: SessionState) -> None:
        """Mark a turn running in this process. A turn left running by a process that
        is gone (or by this one, when its end failed to save) is closed first instead
        of wedging the session; one that another live process is running refuses."""
        await self.flush(state)
        try:
            state.turnNumber = await self.call("beginTurn", state.sessionId, ownerToken())
        except ValueError:
            recovered = await self.call("recoverInterrupted", state.sessionId, ownerAlive)
        else:
            record = await self.call("getSession", state.sessionId)
            if record is not None and record.messageCount != len(state.history):
                # Another process (another editor window) ran turns since this one loaded it.
                state.history = await self.call("loadMessages", state.sessionId)
            return
        if recovered is None:
            record = await self.call("getSession", state.sessionId)
            raise InternalError(
                f"Internal error: session {state.sessionId} is running a turn in "
                f"{describeOwner(record.turnOwner if record else None)}, another hermes-acp using "
                "the same state.db; wait for that turn to end, or cancel it there",
                {"sessionId": state.sessionId},
            )
        state.history = await self.call("loadMessages", state.sessionId)  # with the closed turn
        state.turnNumber = await self.call("beginTurn", state.sessionId, ownerToken())

    async def replaceHistory(self, state: SessionState, messages: list[dict[str, Any]]) -> None:
        state.history = list(messages)
        await self.call("replaceMessages", state.sessionId, messages)

    def searchNow(self, query: str, limit: int, cwd: str | None = None) -> list[dict[str, Any]]:
        """Full-text search over stored messages, from a worker thread (blocks); ``cwd``
        keeps the sessions in that folder or below it (one project), None keeps all."""
        return self._database().searchMessages(query, limit, cwd)

