"""Live sessions and their persistence (``ISessionStore``).

The reactor thread owns every ``SessionState``. Disk work runs on one
dedicated database thread (so writes keep their order) and comes back as
Deferreds; what every session asked for while that thread was busy runs in
its next batch, one transaction for all (``_inBatch``). Updates sent to the editor are journaled in batches: buffered in
memory and flushed within ``JOURNAL_FLUSH`` seconds, and always before a
prompt's response, so a finished turn is durable when the editor hears of it (but
for a cancelled one that answers before its worker is done, ``turns``: it is saved
after its answer, and before the session's next turn).

A write the store refuses (a full disk, a lock held too long) is not dropped:
it is kept in memory with every later write of that session, in order, and
each later write (the next flush or turn) tries them again, first. The user
is told once when a session's work could not be saved, and again when it is.
A session with writes kept takes no new turn (its prompts are answered with
the store's error), which also bounds what is kept to about one turn.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import attrs
from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.logger import Logger
from zope.interface import implementer

from .interfaces import ISessionStore
from .jsonrpc import InternalError, ResourceNotFound
from .lease import describeOwner, ownerAlive, ownerToken
from .oneshot import OneShot
from .session_state import SessionState
from .store import JournalTail, SessionDB, SessionRecord, StoreError, UnknownSession, timestamp
from .threads import WorkerPool

log = Logger()
P = ParamSpec("P")
T = TypeVar("T")

JOURNAL_FLUSH = 0.2
#: Replay at most this much of a session's journal on session/load.
REPLAY_MAX_UPDATES = 20_000
REPLAY_MAX_BYTES = 32 * 1024 * 1024
#: How long the database thread must have been idle before it links ended turns' chunks.
LINK_DELAY = 1.0
#: A session/load reads the journal this many rows, or about this many bytes, at a time.
REPLAY_BATCH_ROWS, REPLAY_BATCH_BYTES = 500, 512 * 1024
#: The titles of the notices about writes the store refused.
NOT_SAVED, SAVED = "Not saved yet", "Saved"


def storeFailure(error: StoreError | str) -> InternalError:
    return InternalError(f"Internal error: session storage unavailable: {error}")


@attrs.frozen
class _Write:
    """One write of a session's: ``SessionDB.<method>(sessionId, *args, **kwargs)``."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = attrs.field(factory=dict)


class Unsaved(StoreError):
    """The store refused a session's write; it and those after it are kept."""


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
        #: ``onStorage(state, severity, title, description)``: tells the user when a session's
        #: work could not be saved, and when it is.
        self.onStorage: Callable[[SessionState, str, str, str], None] | None = None
        #: The writes the store refused, per session, in order (touched on the database thread only).
        self._unsaved: dict[str, list[_Write]] = {}
        #: The reactor's view of it: the sessions with writes kept.
        self._refused: set[str] = set()
        self._closed = False
        #: Jobs asked for and not yet taken by the database thread, in order, with the
        #: Deferred each fires; the thread takes them all at once (``_runBatch``).
        self._batch: list[tuple[Callable[[SessionDB], Any], Deferred[Any]]] = []
        self._batchLock = threading.Lock()
        self._linkCall: Any = None  # ``_whenIdle``

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
        return self._run(lambda db: getattr(db, method)(*args, **kwargs))

    def _run(self, f: Callable[[SessionDB], T]) -> Deferred[T]:
        """Run ``f(db)`` on the database thread (``_inBatch``); refused (-32603) once the
        store is closed."""
        if self._closed:
            return fail(storeFailure(f"{self.dbPath} is closed: hermes-acp is stopping"))

        def translate(failure: Any) -> None:
            failure.trap(StoreError)
            raise storeFailure(failure.value)

        return self._inBatch(f).addErrback(translate)

    def close(self) -> Deferred[None]:
        """On shutdown: flush every journal, try once more what the store refused (what
        it still refuses is lost, and logged), and close the database. The database
        thread takes work in order, so every write asked for before this is done before
        it; one asked for after it (a turn that did not stop in time) is refused with a
        line in the log."""
        d = self.flushAll()
        self._closed = True
        if self._linkCall is not None and self._linkCall.active():
            self._linkCall.cancel()

        def lost(problems: dict[str, str]) -> None:
            for sessionId, problem in problems.items():
                log.error("session {id}: what could not be saved is lost: {problem}", id=sessionId, problem=problem)

        d.addCallback(lambda _: self.dbThread.run(self._closeNow)).addCallback(lost)
        d.addErrback(lambda f: log.failure("closing state.db", f))
        return d

    def _closeNow(self) -> dict[str, str]:
        """On the database thread: the last try of every session's kept writes, then close."""
        problems = {}
        for sessionId in list(self._unsaved):
            try:
                self._writeNow(sessionId, [])
            except Unsaved as e:
                problems[sessionId] = str(e)
            except Exception as e:
                problems[sessionId] = repr(e)
        if self._db is not None:
            self._db.close()
        return problems

    # -- writes, kept in order when the store refuses them ---------------

    def _writeNow(self, sessionId: str, writes: list[_Write]) -> None:
        """On the database thread: the session's writes the store refused before, then
        ``writes``, in order, each in its own transaction. At the first the store
        refuses, Unsaved: that one and the rest are kept for the next try (a journal
        batch joins the kept one before it of the same turn; settings replace kept
        settings just before them)."""
        queue = self._unsaved.setdefault(sessionId, [])
        for write in writes:
            last = queue[-1] if queue else None
            if last is not None and last.method == write.method == "updateSession":
                queue[-1] = write
            elif last is not None and last.method == write.method == "appendUpdates" and last.args[0] == write.args[0]:
                queue[-1] = _Write("appendUpdates", (write.args[0], last.args[1] + write.args[1]))
            else:
                queue.append(write)
        try:
            db = self._database()
            while queue:
                self._apply(db, sessionId, queue[0])
                queue.pop(0)
        except StoreError as e:
            raise Unsaved(str(e)) from e
        except UnknownSession:
            queue.clear()  # deleted (by another process): nothing left to save
            raise
        except Exception:
            if queue:
                queue.pop(0)  # a write that can never succeed is not tried again
            raise
        finally:
            if not queue:
                del self._unsaved[sessionId]

    def _inBatch(self, f: Callable[[SessionDB], T]) -> Deferred[T]:
        """``f(db)`` in the database thread's next batch: the jobs of every session asked
        for meanwhile share one transaction (one commit), so many sessions flushing their
        journals, starting or ending their turns at once (200 cancelled together, say) cost
        one commit, not one each, and a turn's end does not wait behind one commit per
        other session (issue 27). Jobs still run one after another, in the order asked."""
        d: Deferred[T] = Deferred()
        with self._batchLock:
            self._batch.append((f, d))
            first = len(self._batch) == 1
        if first:  # else the batch already scheduled, and not yet taken, has it
            self.dbThread.run(self._runBatch).addCallbacks(self._deliver, self._notTaken).addCallback(self._whenIdle)
        return d

    def _whenIdle(self, _: object = None) -> None:
        """Once the database thread has had nothing to do for ``LINK_DELAY`` seconds, link
        the chunks of the turns ended meanwhile, a turn per job (``SessionDB.linkChunks``):
        disk space no answer waits for."""
        if self._linkCall is not None and self._linkCall.active():
            self._linkCall.reset(LINK_DELAY)
        elif not self._closed:
            self._linkCall = self.reactor.callLater(LINK_DELAY, self._linkChunks)

    def _linkChunks(self) -> None:
        self._linkCall = None
        if self._closed or self._db is None:
            return
        if self._batch:  # busy again: the batch's end asks again
            return
        self.dbThread.run(self._db.linkChunks).addCallbacks(
            lambda more: self._whenIdle() if more else None,
            lambda f: log.failure("linking journal rows to their messages failed", f))

    def _notTaken(self, failure: Any) -> None:
        """The database thread is gone (stopped): the queued jobs fail as they come."""
        with self._batchLock:
            jobs, self._batch = self._batch, []
        for _, d in jobs:
            d.errback(failure)

    def _runBatch(self) -> list[tuple[Deferred[Any], bool, Any]]:
        """On the database thread: every queued job, in one transaction (each job a
        savepoint of it, ``SessionDB.batch``); each job's outcome. When the commit fails,
        nothing of the batch is on disk: the kept writes are put back as they were, and
        each job runs again on its own, as without a batch."""
        with self._batchLock:
            jobs, self._batch = self._batch, []
        if not jobs:
            return []
        kept = {sessionId: list(writes) for sessionId, writes in self._unsaved.items()}
        try:
            with self._database().batch():
                outcomes = [self._attempt(f) for f, _ in jobs]
        except Exception:
            self._unsaved = kept
            outcomes = [self._attempt(f) for f, _ in jobs]
        return [(d, *outcome) for (_, d), outcome in zip(jobs, outcomes)]

    def _attempt(self, f: Callable[[SessionDB], Any]) -> tuple[bool, Any]:
        try:
            return True, f(self._database())
        except Exception as e:
            return False, e

    @staticmethod
    def _deliver(outcomes: list[tuple[Deferred[Any], bool, Any]]) -> None:
        for d, succeeded, value in outcomes:
            if succeeded:
                d.callback(value)
            else:
                d.errback(value)

    @staticmethod
    def _apply(db: SessionDB, sessionId: str, write: _Write) -> None:
        if write.method != "endTurn":
            getattr(db, write.method)(sessionId, *write.args, **write.kwargs)
            return
        turn, messages, history = write.args
        try:
            db.endTurn(sessionId, turn, messages, history)
        except ValueError as e:  # not running any more: another process closed it meanwhile
            log.warn("ending turn {turn} of {id} failed ({error}); appending its messages",
                     turn=turn, id=sessionId, error=e)
            db.appendMessages(sessionId, messages)

    async def _write(self, state: SessionState, *writes: _Write) -> str | None:
        """``writes``, after the session's writes the store refused before. None once they
        are all on disk; else why not: they stay in memory, in order, for the next try,
        and the user is told (once, and again when they are saved)."""
        sessionId = state.sessionId
        if self._closed:
            log.warn("session {id}: not saved, hermes-acp is stopping (a turn still running "
                     "is closed as interrupted when the session is next loaded)", id=sessionId)
            return "hermes-acp is stopping"
        try:
            await self._inBatch(lambda db: self._writeNow(sessionId, list(writes)))
        except Unsaved as e:
            problem = str(e)
            if sessionId not in self._refused:
                log.warn("session {id}: not saved yet, kept in memory: {problem}", id=sessionId, problem=problem)
                self._tell(state, problem)
            self._refused.add(sessionId)
            return problem
        except UnknownSession as e:
            log.warn("session {id} was deleted; not saved", id=sessionId)
            return str(e)
        except Exception as e:
            log.failure("saving session {id} failed", id=sessionId)
            return str(e)
        if sessionId in self._refused:
            self._refused.discard(sessionId)
            log.info("session {id}: saved what could not be saved before", id=sessionId)
            self._tell(state, None)
        return None

    def _tell(self, state: SessionState, problem: str | None) -> None:
        if self.onStorage is None:
            return
        if problem is None:
            self.onStorage(state, "info", SAVED, "What this session could not save before is saved now.")
        else:
            self.onStorage(state, "warning", NOT_SAVED, f"{problem} This session's latest work is kept in memory, "
                           "and your next prompt here saves it first (while the disk still refuses it, "
                           "prompts here are refused too).")

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
        # Writes kept from before it was closed go first: the turn they end is not "interrupted".
        with contextlib.suppress(UnknownSession):
            await self._run(lambda db: self._writeNow(sessionId, []))
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
        # The history is read when a turn (or a fork) first needs it (``history``).
        state = SessionState.fromRecord(record, [])
        state.historyLoaded = False
        # What the editor last heard of the context and the cost (the journal's usage_update),
        # so /context agrees with it in a new process too, and the cost goes on adding up.
        state.contextUsed, state.cost = await self.call("lastUsage", sessionId)
        self.sessions[sessionId] = state
        return state

    async def replay(self, state: SessionState) -> tuple[JournalTail, list[dict[str, Any]]]:
        """What ``session/load`` replays: the rows of the journal on disk (read with
        ``replayRows``, a batch at a time), and after them the updates still kept in memory."""
        await self.flush(state)

        def load(db: SessionDB) -> tuple[JournalTail, list[dict[str, Any]]]:
            tail = db.journalTail(state.sessionId, REPLAY_MAX_UPDATES, REPLAY_MAX_BYTES)
            kept = [update for write in self._unsaved.get(state.sessionId, ()) if write.method == "appendUpdates"
                    for update in write.args[1]]
            return tail, kept

        return await self._run(load)

    def replayRows(
        self, state: SessionState, after: int, last: int, marks: tuple[str, ...] = ()
    ) -> Deferred[list[tuple[int, bytes, bool, bool]]]:
        """The journal's next rows after seq ``after`` up to ``last``: at most
        ``REPLAY_BATCH_ROWS`` rows and about ``REPLAY_BATCH_BYTES`` (``SessionDB.journalTexts``)."""
        return self.call("journalTexts", state.sessionId, after, last, REPLAY_BATCH_ROWS, REPLAY_BATCH_BYTES, marks)

    async def remove(self, sessionId: str) -> None:
        state = self.sessions.get(sessionId)
        if state is not None:
            self.forget(state)

        def delete(db: SessionDB) -> None:
            self._unsaved.pop(sessionId, None)
            db.deleteSession(sessionId)

        await self._run(delete)
        self._refused.discard(sessionId)

    async def fork(self, sessionId: str, cwd: str, additionalDirectories: list[str]) -> SessionState:
        source = await self.get(sessionId)
        await self.history(source)
        problem = await self.flush(source)
        if problem is not None:  # the copy would lack what is kept in memory
            raise storeFailure(problem)
        newId = str(uuid.uuid4())
        record = await self.call("forkSession", sessionId, newId, cwd, tuple(additionalDirectories))
        state = SessionState.fromRecord(record, [dict(m) for m in source.history])
        state.turnNumber, state.contextUsed, state.cost = source.turnNumber, source.contextUsed, source.cost
        self.sessions[newId] = state
        return state

    async def list(self, cwd: str | None, cursor: str | None) -> tuple[list[SessionRecord], str | None]:
        await self.flushAll()
        return await self.call("listSessions", cwd, cursor, started=True)

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
        return Deferred.fromCoroutine(self._write(state, self._settings(state)))

    @staticmethod
    def _settings(state: SessionState) -> _Write:
        """The write of the session's settings; the state remembers what it wrote."""
        state.savedSettings = state.settings()
        return _Write("updateSession", kwargs=dict(
            title=state.title, model=state.model, mode=state.mode, config=state.config, cwd=state.cwd,
            additionalDirectories=state.additionalDirectories, updatedAt=state.updatedAt,
        ))

    def journalUpdate(self, state: SessionState, update: dict[str, Any]) -> None:
        """Remember an update for replay; written within JOURNAL_FLUSH seconds."""
        state.journal.append(update)
        if state.flushCall is None:
            state.flushCall = self.reactor.callLater(JOURNAL_FLUSH, self.flush, state)

    def flush(self, state: SessionState) -> Deferred[str | None]:
        """Write the journal buffer (and try again what the store refused before); fires
        with None once it is all on disk, else with why not."""
        writes = self._journal(state)
        if not writes and state.sessionId not in self._refused:
            return succeed(None)
        return Deferred.fromCoroutine(self._write(state, *writes))

    @staticmethod
    def _journal(state: SessionState) -> list[_Write]:
        """The journal buffer as a write (none when it is empty); its timer stopped."""
        if state.flushCall is not None:
            if state.flushCall.active():
                state.flushCall.cancel()
            state.flushCall = None
        if not state.journal:
            return []
        updates, state.journal = state.journal, []
        return [_Write("appendUpdates", (state.turnNumber, updates))]

    def flushAll(self) -> Deferred[Any]:
        return gatherResults([self.flush(s) for s in list(self.sessions.values())])

    async def endTurn(self, state: SessionState, messages: list[dict[str, Any]],
                      history: list[dict[str, Any]] | None = None, asides: list[dict[str, Any]] = ()) -> None:
        """Make the finished turn durable: journal, new messages (or, after a compaction,
        the new ``history``, the old one archived), idle state, settings (only when they
        changed since last written: the messages' insert marks the session updated); one job
        of the database thread, so a shutdown's close comes after all of it.

        When another process marked the turn interrupted meanwhile, the messages are
        appended all the same. When the store refuses (a full disk), all of it is kept
        in memory and written first thing the next time the session writes; the user
        is told. The editor's answer never waits for more than this one try. ``asides`` (the
        turn's subagents' messages) are archived: found by ``session_search``, never loaded.
        """
        state.updatedAt = timestamp()
        archived = [_Write("archiveMessages", (list(asides),))] if asides else []
        settings = [self._settings(state)] if not messages or state.savedSettings != state.settings() else []
        await self._write(state, *self._journal(state), _Write("endTurn", (state.turnNumber, messages, history)),
                          *archived, *settings)

    async def beginTurn(self, state: SessionState, prompt: str | None = None) -> None:
        """Mark a turn running in this process (with its ``prompt`` when it goes to the model:
        a turn ``/rewind`` can cut back to). A turn left running by a process that
        is gone (or by this one, when its end failed to save) is closed first instead
        of wedging the session; one that another live process is running refuses. So
        does a session whose earlier work the store still refuses (it is tried first)."""
        problem = await self.flush(state)
        if problem is not None:
            raise InternalError(
                f"Internal error: session storage unavailable: {problem} This session's unsaved "
                "work is kept in memory and saved first thing once the store takes it: "
                "send the prompt again then.",
                {"sessionId": state.sessionId},
            )
        owner, sessionId = ownerToken(), state.sessionId
        try:  # one job of the database thread: a turn's start waits for one hop, not two
            state.turnNumber, record = await self._run(
                lambda db: (db.beginTurn(sessionId, owner, prompt), db.getSession(sessionId)))
        except ValueError:
            recovered = await self.call("recoverInterrupted", state.sessionId, ownerAlive)
        else:
            if not state.historyLoaded or (record is not None and record.messageCount != len(state.history)):
                # Not read since the load, or another process (another editor window) ran
                # turns since this one read it.
                await self._readHistory(state)
            return
        if recovered is None:
            record = await self.call("getSession", state.sessionId)
            raise InternalError(
                f"Internal error: session {state.sessionId} is running a turn in "
                f"{describeOwner(record.turnOwner if record else None)}, another hermes-acp using "
                "the same state.db; wait for that turn to end, or cancel it there",
                {"sessionId": state.sessionId},
            )
        await self._readHistory(state)  # with the closed turn
        state.turnNumber = await self.call("beginTurn", state.sessionId, ownerToken(), prompt)

    async def turns(self, state: SessionState) -> list[tuple[int, int | None, str, str]]:
        """The session's prompt turns a rewind can name (``SessionDB.listTurns``)."""
        return await self.call("listTurns", state.sessionId)

    async def rewind(self, state: SessionState, turn: int) -> list[int]:
        """Cut the conversation back to before prompt turn ``turn`` (``SessionDB.rewindTo``),
        during a later turn of the session; the turns cut. The journal is written first, so
        the cut takes all of those turns' updates."""
        problem = await self.flush(state)
        if problem is not None:
            raise storeFailure(problem)
        cut = await self.call("rewindTo", state.sessionId, turn, state.turnNumber)
        await self._readHistory(state)
        return cut

    async def history(self, state: SessionState) -> list[dict[str, Any]]:
        """The model's history of ``state``, read from the store if a load left it unread."""
        if not state.historyLoaded:
            await self._readHistory(state)
        return state.history

    async def _readHistory(self, state: SessionState) -> None:
        state.history = await self.call("loadMessages", state.sessionId)
        state.historyLoaded = True

    async def replaceHistory(self, state: SessionState, messages: list[dict[str, Any]]) -> None:
        state.history = list(messages)
        state.historyLoaded = True
        await self._write(state, _Write("replaceMessages", (list(messages),)))

    def searchNow(self, query: str, limit: int, cwd: str | None = None) -> list[dict[str, Any]]:
        """Full-text search over stored messages, from a worker thread (blocks); ``cwd``
        keeps the sessions in that folder or below it (one project), None keeps all."""
        return self._database().searchMessages(query, limit, cwd)

