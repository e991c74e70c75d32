"""The persistent session store: ``$HERMES_HOME/state.db``.

It keeps, per ACP session: its settings, the model-facing message history (OpenAI chat message
dicts, stored as-is), and a journal of every ``session/update`` ``update`` object sent, numbered
in send order, which ``session/load`` replays. FTS5 indexes the message text for
``session_search``. The schema and its migrations live in ``hermes_acp.migrations``.

Threads: this module never imports Twisted. Every ``SessionDB`` method blocks on disk, so the
reactor thread must not call them; call them from worker threads (the ACP layer wraps them with
``deferToThreadPool`` or a single writer thread). Any number of threads may share one
``SessionDB``.

Durability: each write method is one SQLite transaction and has committed when it returns
(inside ``SessionDB.batch``, a savepoint that commits with the batch). A
turn is durable once ``endTurn`` has returned, so the ACP layer waits for it before sending the
``session/prompt`` response.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import contextlib
import json
import os
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import attrs

from hermes_acp import migrations, safejson
from hermes_acp.config import privateFile, privateFolder, tightenIfShared
from hermes_acp.migrations import HOLE, JOURNAL_TEXT, cwdKey, linkedPayload, sharedText

__all__ = [
    "JournalTail",
    "Replay",
    "SessionDB",
    "SessionRecord",
    "StoreError",
    "UnknownSession",
    "searchableText",
    "timestamp",
]

BUSY_TIMEOUT_MS = 10_000
#: How much lower than the agent's the search thread's CPU priority is (``nice``).
SEARCH_NICENESS = 10
INTERRUPTED_TURN = "This turn was interrupted: hermes-acp stopped before it finished."
INTERRUPTED_CALL = "Not completed: hermes-acp stopped before this call finished."
LIST_PAGE_SIZE = 50
FINAL_TOOL_STATUSES = frozenset({"completed", "failed"})
INDEXED_ROLES = frozenset({"user", "assistant", "tool"})
_FTS_OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})
_NO_CAP = 2**63 - 1  # SQLite's largest integer: "no limit" in a LIMIT-style comparison
_HOLE = HOLE.encode("ascii")
#: An escaped lone surrogate (``\\ud800``) in a journal row: written before ``safejson``'s
#: rule (or by someone else); a valid pair or an escaped backslash only costs a decode.
_SURROGATE_MARKS = (b"\\ud", b"\\uD")

_SESSION_COLUMNS = (
    "session_id, cwd, additional_directories, title, model, mode, config, "
    "created_at, updated_at, turn_state, turn, message_count, turn_owner"
)
# updateSession's keyword -> column.
_UPDATABLE = {
    "title": "title",
    "model": "model",
    "mode": "mode",
    "config": "config",
    "cwd": "cwd",
    "additionalDirectories": "additional_directories",
    "updatedAt": "updated_at",
}


class StoreError(Exception):
    """``state.db`` cannot be used. The message names the file and what to do about it."""


class UnknownSession(KeyError):
    """No session with this id is stored."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}"


def timestamp(when: datetime | str | None = None) -> str:
    """ISO 8601 in UTC with microseconds and ``Z`` (now, by default).

    Every stored time has this one form, so text order is time order. A naive ``datetime`` or
    string is taken as UTC.
    """
    if when is None:
        when = datetime.now(timezone.utc)
    elif isinstance(when, str):
        when = datetime.fromisoformat(when)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.frozen
class SessionRecord:
    """One stored session.

    As input to ``createSession`` only the settings count (``sessionId`` to ``updatedAt``);
    ``turnState``, ``turn``, ``messageCount`` and ``turnOwner`` are outputs.
    """

    sessionId: str
    cwd: str
    additionalDirectories: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    title: str | None = None
    model: str | None = None
    mode: str | None = None
    config: dict[str, Any] = attrs.field(factory=dict)
    createdAt: str = attrs.field(factory=timestamp)
    updatedAt: str = attrs.field(
        default=attrs.Factory(lambda self: self.createdAt, takes_self=True)
    )
    turnState: str = "idle"  # 'idle' | 'running' | 'interrupted' (the last turn died mid-way)
    turn: int = 0  # the number of the last turn begun; turns count from 1
    messageCount: int = 0
    turnOwner: str | None = None  # the process running the turn (hermes_acp.lease)


@attrs.frozen
class Replay:
    """The journal tail to replay: whole updates in send order, and what the caps left out."""

    updates: list[dict[str, Any]]
    omittedCount: int = 0
    omittedBytes: int = 0

    @property
    def truncated(self) -> bool:
        return self.omittedCount > 0


@attrs.frozen
class JournalTail:
    """The rows of a journal to replay (``first <= seq <= last``), and what the caps left out."""

    first: int
    last: int
    omittedCount: int = 0
    omittedBytes: int = 0


def searchableText(message: Mapping[str, Any]) -> str | None:
    """The text FTS indexes for one chat message, or None for roles that are not searched.

    User, assistant and tool messages count: their string content, the ``text`` of list
    (multimodal) content parts, and an assistant's tool call names and arguments.
    """
    if message.get("role") not in INDEXED_ROLES:
        return None
    content = message.get("content")
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict)]
    else:
        parts = [content]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts += [function.get("name"), function.get("arguments")]
    text = "\n".join(part for part in parts if isinstance(part, str) and part)
    # SQLite takes valid UTF-8 only; a lone surrogate becomes "?" in the index (not the message).
    return text.encode("utf-8", "replace").decode("utf-8") if text else None


def _encode(value: Any) -> tuple[str, int]:
    """Compact JSON for ``value`` and its size in UTF-8 bytes, under the rule of
    ``hermes_acp.safejson``: lone surrogates (undecodable tool output, say) become
    U+FFFD and non-finite numbers null, so nothing stored can fail to load or send."""
    if isinstance(value, safejson.Encoded):  # a sent update: the text it was sent as
        return value.data.decode("utf-8"), len(value.data)
    data = safejson.encodeHealed(value)
    return data.decode("utf-8"), len(data)


def _encodeCursor(record: SessionRecord) -> str:
    raw = json.dumps([record.updatedAt, record.sessionId], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")


def _decodeCursor(cursor: str) -> tuple[str, str]:
    """The (updated_at, session_id) position in a cursor; ValueError when it is not ours."""
    try:
        position = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (ValueError, AttributeError) as e:  # binascii, Unicode and JSON errors are ValueErrors
        raise ValueError(f"invalid session list cursor: {cursor!r}") from e
    if not (
        isinstance(position, list)
        and len(position) == 2
        and all(isinstance(part, str) for part in position)
    ):
        raise ValueError(f"invalid session list cursor: {cursor!r}")
    return position[0], position[1]


def _record(row: tuple[Any, ...]) -> SessionRecord:
    (sessionId, cwd, directories, title, model, mode, config,
     createdAt, updatedAt, turnState, turn, messageCount, turnOwner) = row  # fmt: skip
    return SessionRecord(
        sessionId=sessionId,
        cwd=cwd,
        additionalDirectories=safejson.loads(directories),
        title=title,
        model=model,
        mode=mode,
        config=safejson.loads(config),
        createdAt=createdAt,
        updatedAt=updatedAt,
        turnState=turnState,
        turn=turn,
        messageCount=messageCount,
        turnOwner=turnOwner,
    )


def _projectFilter(cwd: str | None) -> tuple[str, tuple[str, ...]]:
    """The SQL condition (on ``s.cwd_key``) and its parameters that keep sessions in
    ``cwd`` or below it; nothing for None. "Below" is a range of keys, not ``LIKE``, so
    no character of a folder's name is a wildcard: keys under ``/a/b`` start with
    ``/a/b/``, and ``0`` is the character after ``/``."""
    if cwd is None:
        return "", ()
    key = cwdKey(cwd)
    below = key.rstrip("/") + "/"
    return " AND (s.cwd_key = ? OR (s.cwd_key >= ? AND s.cwd_key < ?))", (key, below, below[:-1] + "0")


def _searchLoop(searches: queue.SimpleQueue[Any]) -> None:
    """The search thread: run each ``(f, future)`` until None arrives."""
    with contextlib.suppress(OSError, AttributeError):  # lower this thread's priority only (Linux)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SEARCH_NICENESS)
    while (job := searches.get()) is not None:
        f, done = job
        try:
            done.set_result(f())
        except BaseException as e:
            done.set_exception(e)


def _checkUpdates(updates: Iterable[Any]) -> list[dict[str, Any]]:
    updates = list(updates)
    for update in updates:
        if not (isinstance(update, dict) and isinstance(update.get("sessionUpdate"), str)):
            raise ValueError(f"not a session/update object: {update!r:.200}")
    return updates


#: The updates whose consecutive pieces of one message the journal keeps as one row: streamed
#: text. (A prompt's text blocks, each a ``user_message_chunk``, are blocks the user wrote apart.)
_TEXT_CHUNKS = frozenset({"agent_message_chunk", "agent_thought_chunk"})
_CHUNK_KEYS, _TEXT_KEYS = frozenset({"sessionUpdate", "content", "messageId"}), frozenset({"type", "text"})
#: The most characters of text one merged row holds.
MERGED_TEXT = 64 * 1024


def _plainText(update: dict[str, Any]) -> str | None:
    """The text of a chunk of text and nothing else (no ``_meta``, no annotations), else None."""
    if update["sessionUpdate"] not in _TEXT_CHUNKS or not update.keys() <= _CHUNK_KEYS:
        return None
    content = update.get("content")
    if type(content) is not dict or content.keys() != _TEXT_KEYS or content["type"] != "text":
        return None
    text = content["text"]
    return text if type(text) is str else None


def _merged(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``updates`` with each run of consecutive text chunks of one message (same kind, same
    ``messageId``) as one chunk of their joined text, up to ``MERGED_TEXT`` characters.

    A streamed answer reaches the editor as a frame every few milliseconds, often of a token
    or two; journaled as sent, it took a row of about a hundred bytes of JSON per frame, and a
    ``session/load`` sent every one of them back. A replay shows the same text, in fewer frames."""
    out: list[dict[str, Any]] = []
    run: list[str] = []  # the texts of the run out[-1] starts
    size = 0

    def close() -> None:
        if len(run) > 1:
            first = out[-1]
            out[-1] = {**first, "content": {"type": "text", "text": "".join(run)}}

    for update in updates:
        text = _plainText(update)
        if text is not None and run and size + len(text) <= MERGED_TEXT:
            last = out[-1]
            if last["sessionUpdate"] == update["sessionUpdate"] and last.get("messageId") == update.get("messageId"):
                run.append(text)
                size += len(text)
                continue
        close()
        out.append(update)
        run, size = ([text], len(text)) if text is not None else ([], 0)
    close()
    return out


#: A chunk of the answer or the prompt shorter than this keeps its text (a reference costs
#: about ten bytes, and some work at the turn's end).
MIN_CHUNK = 20
#: At most this many ended turns wait for ``linkChunks`` (the oldest are left as they are).
UNLINKED_TURNS = 4096
#: The updates whose text is a piece of a chat message's content, by the message's role.
_CHUNKS = {'{"sessionUpdate":"agent_message_chunk",': "assistant", '{"sessionUpdate":"user_message_chunk",': "user"}


#: Where a finished tool card's output starts (``Renderer.toolFinished``), and how much of an
#: output's start ``_linkJournal`` looks it up by.
_RAW_OUTPUT, _START = '"rawOutput":{"output":"', 64


def _toolLink(payload: str, tools: list[tuple[int, int, int, str]]) -> tuple[str, int, int, int] | None:
    """(stored text, message id, start, length) for a journal row that repeats a tool result."""
    for messageId, start, length, text in tools:
        linked = linkedPayload(payload, text)
        if linked is not None:
            return linked, messageId, start, length
    return None


def _chatLink(payload: str, chats: list[tuple[int, str, str]]) -> tuple[str, int, int, int] | None:
    """(stored text, message id, start, length) for a chunk of an answer or a prompt whose
    text is in the turn's message of that role: escaped alike (one encoder), so the chunk's
    text as the row holds it is part of the message's text as it is stored."""
    role = next((role for head, role in _CHUNKS.items() if payload.startswith(head)), None)
    if role is None:
        return None
    try:
        content = json.loads(payload).get("content")
    except ValueError:
        return None
    text = content.get("text") if isinstance(content, dict) else None
    if not isinstance(text, str) or len(text) < MIN_CHUNK:
        return None
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    if f'"text":"{escaped}"' not in payload or HOLE in payload:
        return None
    for messageId, messageRole, message in chats:
        at = message.find(escaped) if messageRole == role else -1
        if at >= 0:
            return payload.replace(f'"text":"{escaped}"', f'"text":"{HOLE}"'), messageId, at + 1, len(escaped)
    return None


@attrs.define
class _TurnAccount:
    """What an interrupted turn's journal says happened, for the model's history."""

    user: list[str] = attrs.field(factory=list)
    answer: list[str] = attrs.field(factory=list)
    calls: dict[str, list[str]] = attrs.field(factory=dict)  # id -> [title, status]

    def add(self, update: Any) -> None:
        if not isinstance(update, dict):
            return
        kind, content = update.get("sessionUpdate"), update.get("content")
        if kind == "user_message_chunk" and isinstance(content, dict):
            self.user.append(_blockText(content))
        elif kind == "agent_message_chunk" and isinstance(content, dict) and isinstance(content.get("text"), str):
            self.answer.append(content["text"])
        elif kind in ("tool_call", "tool_call_update") and isinstance(update.get("toolCallId"), str):
            if kind == "tool_call_update" and update["toolCallId"] not in self.calls:
                return  # an update for a call this turn never began
            call = self.calls.setdefault(update["toolCallId"], ["a tool call", "pending"])
            if isinstance(update.get("title"), str):
                call[0] = update["title"]
            if isinstance(update.get("status"), str):
                call[1] = update["status"]

    def openCalls(self) -> list[str]:
        return [callId for callId, (_, status) in self.calls.items() if status not in FINAL_TOOL_STATUSES]

    def messages(self) -> list[dict[str, Any]]:
        if not self.user:
            return []
        calls = "".join(
            f"\n- {title}: {status if status in FINAL_TOOL_STATUSES else 'not completed'}"
            for title, status in self.calls.values()
        )
        note = f"[{INTERRUPTED_TURN}" + (f" Tool calls in this turn:{calls}" if calls else "") + "]"
        answer = "".join(self.answer).strip()
        return [
            {"role": "user", "content": "\n".join(self.user)},
            {"role": "assistant", "content": f"{answer}\n\n{note}" if answer else note},
        ]


def _blockText(block: dict[str, Any]) -> str:
    """A prompt content block as the model reads it in an account of a turn."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return block["text"]
    if block.get("type") == "resource_link":
        return f"[Attached: {block.get('name') or block.get('uri')}]"
    if block.get("type") == "resource" and isinstance(block.get("resource"), dict):
        return f"[Attached: {block['resource'].get('uri', 'a resource')}]"
    return f"[{block.get('type', 'content')}]"


class SessionDB:
    """Sessions, messages and the update journal in one SQLite file.

    Every method may be called from any thread except the reactor's (they block on disk).

    Threads share ONE connection, guarded by a lock, rather than one connection per thread:
    each call is a few milliseconds of work and SQLite admits one writer at a time anyway; a
    single connection makes every method atomic with respect to the others and lets ``close``
    really close everything (per-thread connections would outlive pool threads). WAL mode still
    lets other processes read while we write.

    ``searchMessages`` is the exception: a full-text search over thousands of sessions can take
    a second, and holding the one connection that long would stall every session's writes
    (issue 27). Searches run on a thread of their own (``hermes-search``, started at the first
    search, at a lower CPU priority: a search is worth less than a turn's reply) with a second,
    read-only connection: WAL lets it read a consistent snapshot while the main connection
    writes. Searches from several threads wait for each other there, not for the writes.

    ``path`` is the file; ``journalMode`` is ``"wal"`` unless the file system refused WAL.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open or create the file (and its folders) and migrate it to the current schema.

        The file holds every conversation, so it is private to the user: its folder 0700,
        the file and its ``-wal``/``-shm`` companions 0600 (made so whatever the umask, and
        tightened when an older one was not).

        Raises ``StoreError`` when the file cannot be used: damaged, not SQLite, written by a
        newer hermes-acp, or in a place we cannot write.
        """
        self.path = Path(path)
        self._lock = threading.RLock()
        #: The searches' own connection (see the class docstring) and its lock.
        self._searchLock = threading.Lock()
        self._searchConnection: sqlite3.Connection | None = None
        self._searches: queue.SimpleQueue[Any] | None = None
        self._closed = False
        self._batching = False  # inside ``batch`` (read and written under ``_lock``)
        #: Turns whose chunks ``linkChunks`` has yet to link (session, turn, first and end seq).
        self._unlinked: collections.deque[tuple[str, int, int, int]] = collections.deque(maxlen=UNLINKED_TURNS)
        self._pendingLock = threading.Lock()
        try:
            privateFolder(self.path.parent)
        except OSError as e:
            raise StoreError(
                f"cannot create the folder for {self.path} ({e.strerror or e}). "
                "Make it writable, or set HERMES_HOME to a writable folder."
            ) from e
        with contextlib.suppress(OSError):  # not a file, say: SQLite explains below
            privateFile(self.path)  # SQLite gives -wal and -shm the mode of the database
        with self._translated():
            self._connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
        try:
            self._open()
        except BaseException:
            self._connection.close()
            raise
        for companion in ("-wal", "-shm"):  # left by an older process, perhaps (privateFile did the file)
            tightenIfShared(self.path.with_name(self.path.name + companion))

    def _open(self) -> None:
        if sqlite3.sqlite_version_info < migrations.MIN_SQLITE:
            raise StoreError(
                f"state.db needs SQLite {'.'.join(map(str, migrations.MIN_SQLITE))} or newer (its generated "
                f"columns); this Python uses SQLite {sqlite3.sqlite_version}. Use a Python built with a newer "
                "SQLite (python.org's builds, uv's and pyenv's bundle one)."
            )
        with self._translated():
            cursor = self._connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Where WAL is impossible (some network file systems) SQLite keeps its rollback
            # journal; everything below still holds, with less read concurrency.
            self.journalMode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            # In WAL mode, NORMAL syncs the WAL at checkpoints rather than at every commit. A
            # committed transaction is in the WAL file when COMMIT returns, so it survives the
            # process being killed (kill -9); only an OS crash or power loss can lose the last
            # few commits, and never corrupts the file. FULL would add an fsync per turn.
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        try:
            with self._write() as cursor:
                migrations.migrate(cursor)
        except migrations.NewerSchemaError as e:
            raise StoreError(
                f"{self.path} was written by a newer hermes-acp (schema version {e.found}; "
                f"this one knows up to {migrations.SCHEMA_VERSION}). Upgrade hermes-acp, or "
                "set HERMES_HOME to another folder."
            ) from e

    # -- plumbing -------------------------------------------------------------------------

    def _explain(self, error: sqlite3.Error) -> str:
        name = getattr(error, "sqlite_errorname", "") or ""
        primary = "_".join(name.split("_")[:2])  # SQLITE_CANTOPEN_ISDIR -> SQLITE_CANTOPEN
        if primary in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
            return (
                f"{self.path} is damaged or not an SQLite database ({error}). Move it aside "
                f"(for example rename it to {self.path.name}.broken) and hermes-acp will start "
                "a new one, or set HERMES_HOME to another folder."
            )
        if primary in ("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_IOERR"):
            return (
                f"cannot open {self.path} for writing ({error}). Check that its folder exists "
                "and is writable, or set HERMES_HOME to a writable folder."
            )
        if primary in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            return (
                f"{self.path} stayed locked by another process for {BUSY_TIMEOUT_MS // 1000} s "
                f"({error}). Try again, or stop the other program using it."
            )
        if primary == "SQLITE_FULL":
            return f"the disk holding {self.path} is full ({error}). Free some space."
        if isinstance(error, sqlite3.ProgrammingError):
            return f"the session store {self.path} is not usable: {error}"
        return f"the session store {self.path} failed: {error}"

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """Turn sqlite3 errors into one ``StoreError`` that says what to do."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(self._explain(e)) from e

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Cursor]:
        with self._lock, self._translated():
            cursor = self._connection.cursor()
            if self._batching:
                yield from self._savepoint(cursor)
                return
            cursor.execute(begin)
            try:
                yield cursor
            except BaseException:
                if self._connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")

    def _savepoint(self, cursor: sqlite3.Cursor) -> Iterator[sqlite3.Cursor]:
        """Inside ``batch``: one method's writes as a savepoint of the batch's transaction,
        so a method that fails undoes only its own."""
        if not self._connection.in_transaction:
            # SQLite rolled the whole batch back (a full disk, say): nothing more may commit
            # on its own, the caller redoes the batch one write at a time.
            raise sqlite3.OperationalError("the batch's transaction was rolled back")
        cursor.execute("SAVEPOINT write")
        try:
            yield cursor
        except BaseException:
            if self._connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    cursor.execute("ROLLBACK TO write")
                    cursor.execute("RELEASE write")
            raise
        cursor.execute("RELEASE write")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Many write methods in ONE transaction (a group commit), from one thread: each
        method inside is a savepoint, so one that fails (raises) leaves the others. When
        the commit itself fails none of it is on disk, and StoreError is raised. Other
        threads wait for the whole batch (it holds the lock)."""
        with self._lock, self._translated():
            cursor = self._connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            self._batching = True
            try:
                yield
                self._batching = False
                cursor.execute("COMMIT")
            except BaseException:
                self._batching = False
                if self._connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cursor.execute("ROLLBACK")
                raise

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Cursor]:
        """One consistent snapshot (a read transaction), under the lock."""
        return self._transaction("BEGIN")

    def _searchThread(self, f: Callable[[], Any]) -> Any:
        """``f()`` on the search thread, waiting for its result (or its exception)."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._searchLock:
            queued = not self._closed
            if queued:
                if self._searches is None:
                    self._searches = queue.SimpleQueue()
                    threading.Thread(target=_searchLoop, args=(self._searches,), name="hermes-search",
                                     daemon=True).start()
                self._searches.put((f, done))
        return done.result() if queued else f()  # closed: f raises StoreError, as any method would

    @contextlib.contextmanager
    def _searching(self) -> Iterator[sqlite3.Cursor]:
        """One read transaction on the searches' own connection (opened on first use), so a
        long search never holds the lock every other method needs."""
        with self._searchLock, self._translated():
            if self._closed:  # (closed while this search waited)
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
            if self._searchConnection is None:
                connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                connection.execute("PRAGMA query_only = ON")
                self._searchConnection = connection
            cursor = self._searchConnection.cursor()
            cursor.execute("BEGIN")
            try:
                yield cursor
            finally:
                if self._searchConnection.in_transaction:
                    cursor.execute("COMMIT")

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Cursor]:
        """One write transaction, under the lock; it takes SQLite's write lock at once, so it
        waits (busy_timeout) instead of failing when another process is writing."""
        return self._transaction("BEGIN IMMEDIATE")

    @staticmethod
    def _find(cursor: sqlite3.Cursor, sessionId: str) -> SessionRecord | None:
        row = cursor.execute(
            f"SELECT {_SESSION_COLUMNS} FROM acp_sessions WHERE session_id = ?", (sessionId,)
        ).fetchone()
        return None if row is None else _record(row)

    @classmethod
    def _require(cls, cursor: sqlite3.Cursor, sessionId: str) -> SessionRecord:
        record = cls._find(cursor, sessionId)
        if record is None:
            raise UnknownSession(sessionId)
        return record

    @staticmethod
    def _insertMessages(
        cursor: sqlite3.Cursor, sessionId: str, first: int, messages: list[dict[str, Any]],
        indexed: bool = True, archived: bool = False,
    ) -> int:
        """Insert messages numbered from ``first`` (in the full-text index unless not
        ``indexed``); return the session's new message count. Archived rows (``_compact``)
        leave the count alone."""
        rows = []
        for seq, message in enumerate(messages, first):
            payload, _ = _encode(message)
            text = searchableText(message) if indexed else None
            # The search text is most often the content itself: then the index reads it from the
            # message (the ``text`` column computes it) instead of a second copy.
            isContent = text is not None and text == message.get("content") and "\x00" not in text
            rows.append((sessionId, seq, str(message.get("role", "")), payload,
                         None if isContent else text, int(isContent), int(archived)))  # fmt: skip
        cursor.executemany(
            "INSERT INTO acp_messages (session_id, seq, role, message, stored_text, text_is_content, archived) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        count = first + len(rows)
        if not archived:
            cursor.execute(
                "UPDATE acp_sessions SET message_count = ?, updated_at = ? WHERE session_id = ?",
                (count, timestamp(), sessionId),
            )
        return count

    @classmethod
    def _compact(
        cls, cursor: sqlite3.Cursor, record: SessionRecord, messages: list[dict[str, Any]],
        history: list[dict[str, Any]], indexed: bool = False,
    ) -> int:
        """After a compaction: the live history and the turn's own ``messages`` are archived
        (still indexed for search, below the lowest archived seq), and ``history`` becomes the
        live history. Its rows are not indexed (unless ``indexed``): each is a copy of an
        archived message, or the summary of some. Returns the new message count."""
        sessionId = record.sessionId
        base = cls._archive(cursor, record, 0)
        # The turns begun so far no longer start at a place in this history: no rewind cuts there.
        cursor.execute("UPDATE acp_turns SET message_seq = NULL WHERE session_id = ?", (sessionId,))
        cls._insertMessages(cursor, sessionId, base - len(messages), messages, archived=True)
        return cls._insertMessages(cursor, sessionId, 0, history, indexed=indexed)

    @staticmethod
    def _archive(cursor: sqlite3.Cursor, record: SessionRecord, first: int) -> int:
        """Archive the live history from ``first`` on (negative seqs, below those archived
        before, still in the full-text index); the seq offset they got."""
        (low,) = cursor.execute(
            "SELECT coalesce(min(seq), 0) FROM acp_messages WHERE session_id = ? AND seq < 0", (record.sessionId,)
        ).fetchone()
        base = min(low, 0) - record.messageCount
        cursor.execute(
            "UPDATE acp_messages SET seq = seq + ?, archived = 1 WHERE session_id = ? AND archived = 0 AND seq >= ?",
            (base, record.sessionId, first),
        )
        return base

    @staticmethod
    def _insertUpdates(
        cursor: sqlite3.Cursor, sessionId: str, turn: int, updates: list[dict[str, Any]]
    ) -> int:
        """Append updates to the journal (a run of text chunks of one message as one row,
        ``_merged``); return the last seq (0 for an empty journal)."""
        updates = _merged(updates)
        (last,) = cursor.execute(
            "SELECT coalesce(max(seq), 0) FROM acp_journal WHERE session_id = ?", (sessionId,)
        ).fetchone()
        rows = [
            (sessionId, seq, turn, *_encode(update))
            for seq, update in enumerate(updates, last + 1)
        ]
        cursor.executemany(
            "INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        return last + len(rows)

    @classmethod
    def _interrupt(cls, cursor: sqlite3.Cursor, sessionId: str, turn: int) -> list[dict[str, Any]]:
        """Close a turn nothing will finish: journal a ``failed`` update for each of its tool
        calls that never reached a final status and a line saying the turn was interrupted,
        give the model's history the same account (the user's words, the answer so far, the
        calls and how they ended), and mark it interrupted. Returns the journaled updates."""
        rows = cursor.execute(
            f"SELECT {JOURNAL_TEXT} FROM acp_journal AS j WHERE j.session_id = ? AND j.turn = ? ORDER BY j.seq",
            (sessionId, turn),
        ).fetchall()
        account = _TurnAccount()
        for (payload,) in rows:
            account.add(safejson.loads(payload))
        updates = [
            {"sessionUpdate": "tool_call_update", "toolCallId": callId, "status": "failed",
             "content": [{"type": "content", "content": {"type": "text", "text": INTERRUPTED_CALL}}]}
            for callId in account.openCalls()
        ]  # fmt: skip
        updates.append({"sessionUpdate": "agent_message_chunk", "messageId": f"interrupted-{turn}",
                        "content": {"type": "text", "text": f"\n\n_{INTERRUPTED_TURN}_\n"}})  # fmt: skip
        cls._insertUpdates(cursor, sessionId, turn, updates)
        record = cls._require(cursor, sessionId)
        cls._insertMessages(cursor, sessionId, record.messageCount, account.messages())
        cursor.execute(
            "UPDATE acp_sessions SET turn_state = 'interrupted', turn_owner = NULL "
            "WHERE session_id = ?",
            (sessionId,),
        )
        return updates

    # -- sessions ---------------------------------------------------------------------------

    def createSession(self, record: SessionRecord) -> SessionRecord:
        """Store a new, empty, idle session; return it as stored.

        ValueError if the id is taken.
        """
        createdAt, updatedAt = timestamp(record.createdAt), timestamp(record.updatedAt)
        with self._write() as cursor:
            if self._find(cursor, record.sessionId) is not None:
                raise ValueError(f"session {record.sessionId!r} already exists")
            cursor.execute(
                "INSERT INTO acp_sessions (session_id, cwd, cwd_key, additional_directories, "
                "title, model, mode, config, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.sessionId, record.cwd, cwdKey(record.cwd),
                 _encode(list(record.additionalDirectories))[0], record.title, record.model,
                 record.mode, _encode(record.config)[0], createdAt, updatedAt),
            )  # fmt: skip
            return self._require(cursor, record.sessionId)

    def getSession(self, sessionId: str) -> SessionRecord | None:
        with self._read() as cursor:
            return self._find(cursor, sessionId)

    def updateSession(self, sessionId: str, **fields: Any) -> SessionRecord:
        """Change some settings; return the session as stored.

        Keywords: ``title``, ``model``, ``mode``, ``config``, ``cwd``, ``additionalDirectories``
        and ``updatedAt``, which defaults to now (pass the old value to keep the list order).
        UnknownSession for an unknown id, TypeError for another keyword.
        """
        unknown = set(fields) - set(_UPDATABLE)
        if unknown:
            raise TypeError(f"updateSession() got unexpected fields: {sorted(unknown)}")
        values = {_UPDATABLE[name]: value for name, value in fields.items()}
        if "config" in values:
            values["config"] = _encode(values["config"])[0]
        if "additional_directories" in values:
            values["additional_directories"] = _encode(list(values["additional_directories"]))[0]
        if "cwd" in values:
            values["cwd_key"] = cwdKey(values["cwd"])
        values["updated_at"] = timestamp(values.get("updated_at"))
        assignments = ", ".join(f"{column} = ?" for column in values)  # fixed column names
        with self._write() as cursor:
            self._require(cursor, sessionId)
            cursor.execute(
                f"UPDATE acp_sessions SET {assignments} WHERE session_id = ?",
                (*values.values(), sessionId),
            )
            return self._require(cursor, sessionId)

    def deleteSession(self, sessionId: str) -> None:
        """Remove the session, its messages (and their index entries) and its journal.

        An unknown id is not an error.
        """
        with self._write() as cursor:
            for table in ("acp_journal", "acp_journal_cut", "acp_turns", "acp_messages", "acp_sessions"):
                cursor.execute(f"DELETE FROM {table} WHERE session_id = ?", (sessionId,))

    def listSessions(
        self, cwd: str | None = None, cursor: str | None = None, limit: int = LIST_PAGE_SIZE,
        started: bool = False,
    ) -> tuple[list[SessionRecord], str | None]:
        """One page of sessions, newest ``updatedAt`` first (ties: higher id first).

        ``cwd`` keeps sessions whose working directory is the same folder (compared after
        ``os.path.realpath``). ``started`` keeps sessions with a conversation: a title (the
        first prompt for the model gives one, as ``/title`` does) or messages in the model's
        history; not those that never got a prompt, or got only slash commands. ``cursor``
        is the ``nextCursor`` of the previous page; the second element of the result is the
        next page's cursor, or None after the last page. ValueError for a cursor this store
        did not make.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        clauses: list[str] = ["(title IS NOT NULL OR message_count > 0)"] if started else []
        params: list[Any] = []
        if cwd is not None:
            clauses.append("cwd_key = ?")
            params.append(cwdKey(cwd))
        if cursor is not None:
            clauses.append("(updated_at, session_id) < (?, ?)")
            params.extend(_decodeCursor(cursor))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM acp_sessions {where} "
                "ORDER BY updated_at DESC, session_id DESC LIMIT ?",
                (*params, limit + 1),
            ).fetchall()
        records = [_record(row) for row in rows[:limit]]
        more = len(rows) > limit
        return records, _encodeCursor(records[-1]) if more else None

    def forkSession(
        self,
        sourceId: str,
        newId: str,
        cwd: str,
        additionalDirectories: Iterable[str] = (),
    ) -> SessionRecord:
        """Copy a session's settings, messages and journal under ``newId`` with its own cwd.

        One transaction; the source is not changed. If the source is mid-turn, the copy gets
        that turn as interrupted (its open tool calls failed), since nothing will finish it.
        UnknownSession for an unknown source, ValueError if ``newId`` is taken.
        """
        now = timestamp()
        with self._write() as cursor:
            source = self._require(cursor, sourceId)
            if self._find(cursor, newId) is not None:
                raise ValueError(f"session {newId!r} already exists")
            cursor.execute(
                "INSERT INTO acp_sessions (session_id, cwd, cwd_key, additional_directories, "
                "title, model, mode, config, created_at, updated_at, turn, message_count, "
                "turn_state) "
                "SELECT ?, ?, ?, ?, title, model, mode, config, ?, ?, turn, message_count, "
                "CASE turn_state WHEN 'running' THEN 'running' ELSE 'idle' END "
                "FROM acp_sessions WHERE session_id = ?",
                (newId, cwd, cwdKey(cwd), _encode(list(additionalDirectories))[0], now, now,
                 sourceId),
            )  # fmt: skip
            cursor.execute(
                "INSERT INTO acp_messages (session_id, seq, role, message, stored_text, text_is_content, archived) "
                "SELECT ?, seq, role, message, stored_text, text_is_content, archived FROM acp_messages "
                "WHERE session_id = ? ORDER BY seq",
                (newId, sourceId),
            )
            # A row that refers to a message of the source refers to the copy's (same seq).
            cursor.execute(
                "INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes, ref, ref_start, ref_length) "
                "SELECT ?, j.seq, j.turn, j.payload, j.nbytes, (SELECT copy.id FROM acp_messages AS m "
                "JOIN acp_messages AS copy ON copy.session_id = ? AND copy.seq = m.seq WHERE m.id = j.ref), "
                "j.ref_start, j.ref_length FROM acp_journal AS j WHERE j.session_id = ?",
                (newId, newId, sourceId),
            )
            if source.turnState == "running":
                self._interrupt(cursor, newId, source.turn)
            return self._require(cursor, newId)

    # -- messages ---------------------------------------------------------------------------

    def appendMessages(self, sessionId: str, messages: Iterable[dict[str, Any]]) -> int:
        """Append chat messages to the history; return the new message count."""
        messages = list(messages)
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            return self._insertMessages(cursor, sessionId, record.messageCount, messages)

    def loadMessages(self, sessionId: str) -> list[dict[str, Any]]:
        """The model's whole history, each message exactly as it was given (archived ones left out)."""
        with self._read() as cursor:
            self._require(cursor, sessionId)
            rows = cursor.execute(
                "SELECT message FROM acp_messages WHERE session_id = ? AND archived = 0 ORDER BY seq",
                (sessionId,),
            ).fetchall()
        return [safejson.loads(message) for (message,) in rows]

    def archiveMessages(self, sessionId: str, messages: Iterable[dict[str, Any]]) -> None:
        """Keep ``messages`` searchable beside the history, never in it (a subagent's): archived
        rows below the lowest ``seq``, in the full-text index like those a compaction archived."""
        messages = list(messages)
        with self._write() as cursor:
            self._require(cursor, sessionId)
            (low,) = cursor.execute(
                "SELECT coalesce(min(seq), 0) FROM acp_messages WHERE session_id = ?", (sessionId,)
            ).fetchone()
            self._insertMessages(cursor, sessionId, min(low, 0) - len(messages), messages, archived=True)

    def replaceMessages(self, sessionId: str, messages: Iterable[dict[str, Any]]) -> int:
        """Replace the model's history in one transaction (``/reset``); the old messages are
        archived, still found by ``searchMessages``."""
        messages = list(messages)
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            return self._compact(cursor, record, [], messages, indexed=True)

    def searchMessages(self, query: str, limit: int = 10, cwd: str | None = None) -> list[dict[str, Any]]:
        """Messages whose text has every word of ``query``, best match (bm25) first.

        Only the words count: punctuation is ignored and FTS5's operator words (AND, OR, NOT,
        NEAR) are dropped, so any text is a valid query. ``cwd`` keeps the sessions of one
        project: those whose working directory is that folder or one below it (compared after
        ``os.path.realpath``); None searches them all. Each hit: sessionId, title, cwd, role,
        seq (its index in the history), snippet (matches in ``**``) and the session's
        updatedAt. ValueError for a limit below 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        words = [word for word in re.findall(r"\w+", query) if word not in _FTS_OPERATORS]
        if not words:
            return []
        match = " ".join(f'"{word}"' for word in words)  # \w has no quote to escape
        where, params = _projectFilter(cwd)
        return self._searchThread(lambda: self._search(match, where, params, limit))

    def _search(self, match: str, where: str, params: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
        with self._searching() as cursor:
            rows = cursor.execute(
                "SELECT m.session_id, s.title, s.cwd, m.role, m.seq, "
                "snippet(acp_messages_fts, 0, '**', '**', '…', 16), s.updated_at "
                "FROM acp_messages_fts "
                "JOIN acp_messages AS m ON m.id = acp_messages_fts.rowid "
                "JOIN acp_sessions AS s ON s.session_id = m.session_id "
                f"WHERE acp_messages_fts MATCH ?{where} ORDER BY rank LIMIT ?",
                (match, *params, limit),
            ).fetchall()
        keys = ("sessionId", "title", "cwd", "role", "seq", "snippet", "updatedAt")
        return [dict(zip(keys, row)) for row in rows]

    # -- journal ----------------------------------------------------------------------------

    def appendUpdates(self, sessionId: str, turn: int, updates: Iterable[dict[str, Any]]) -> int:
        """Journal a batch of sent ``session/update`` ``update`` objects, in order, in one
        transaction (consecutive text chunks of one message as one row); return the seq of the
        last row (the current last seq for an empty batch).

        ``turn`` tags the batch (0 for updates outside any turn).
        """
        updates = _checkUpdates(updates)
        with self._write() as cursor:
            self._require(cursor, sessionId)
            return self._insertUpdates(cursor, sessionId, turn, updates)

    def loadJournal(
        self, sessionId: str, maxCount: int | None = None, maxBytes: int | None = None
    ) -> Replay:
        """The journal to replay: the longest tail within ``maxCount`` updates and
        ``maxBytes`` bytes of JSON (None: no cap), oldest first.

        Whole updates are left out, oldest first; an update is never cut.
        """
        with self._read() as cursor:
            tail = self._tail(cursor, sessionId, maxCount, maxBytes)
            rows = cursor.execute(
                f"SELECT {JOURNAL_TEXT} FROM acp_journal AS j WHERE j.session_id = ? AND j.seq >= ? ORDER BY j.seq",
                (sessionId, tail.first),
            ).fetchall()
        return Replay(updates=[safejson.loads(payload) for (payload,) in rows],
                      omittedCount=tail.omittedCount, omittedBytes=tail.omittedBytes)

    def journalTail(self, sessionId: str, maxCount: int | None = None, maxBytes: int | None = None) -> JournalTail:
        """Which rows ``loadJournal`` would return, without reading them: a ``session/load``
        then reads them a batch at a time (``journalTexts``)."""
        with self._read() as cursor:
            return self._tail(cursor, sessionId, maxCount, maxBytes)

    def journalTexts(
        self, sessionId: str, after: int, last: int, maxCount: int, maxBytes: int, marks: Iterable[str] = ()
    ) -> list[tuple[int, bytes, bool, bool]]:
        """The next journal rows to replay (``after < seq <= last``, in order): as many as
        fit ``maxCount`` rows and ``maxBytes`` bytes (at least one), each as (seq, the
        update's JSON text as UTF-8 bytes, whether it is sound, whether it holds one of
        ``marks``). Read from the cursor as they come: rows past the caps are never read.

        A sound row can go to the editor as it is; one that is not must be decoded and
        healed (``safejson.loads``) first, or dropped. Sound means: the stored text is valid
        JSON (``json_valid``, in C, on the text less what it shares with a message, a tenth of
        the bytes for a tool card: the shared part is the inside of a string, taken from the
        message as it was when the row was linked), the whole text has the size it was written
        with (``nbytes``), and no escaped lone surrogate is in it. That is what a row not
        written through ``_encode`` could break (one an older version wrote with a ``NaN``, a
        torn or edited one), at a fraction of a decode's cost.

        ``marks`` are looked for in the stored text too: every key and structure of the
        update is there. (A mark such as ``"_meta"``, with both its quotes, cannot be inside a
        string: its quotes would be escaped there.)"""
        wanted = [mark.encode("utf-8") for mark in marks]
        rows: list[tuple[int, bytes, bool, bool]] = []
        size = 0
        with self._read() as cursor:
            cursor.execute(
                "SELECT j.seq, CAST(j.payload AS BLOB), CAST(substr(m.message, j.ref_start, j.ref_length) AS BLOB), "
                "j.nbytes, json_valid(CASE WHEN j.ref IS NULL THEN j.payload ELSE replace(j.payload, char(1), '') END) "
                "FROM acp_journal AS j LEFT JOIN acp_messages AS m ON m.id = j.ref "
                "WHERE j.session_id = ? AND j.seq > ? AND j.seq <= ? ORDER BY j.seq",
                (sessionId, after, last),
            )
            while len(rows) < maxCount and size < maxBytes:
                # Up to 64 rows, read one at a time (SQLite steps one anyway) so the batch stops
                # at the row that reaches ``maxBytes`` whatever the rows' sizes (64 large tool
                # cards were 8 times as much).
                more = []
                for seq, stored, shared, nbytes, valid in cursor:
                    text = stored if shared is None else stored.replace(_HOLE, shared)
                    more.append((seq, stored, text, nbytes, valid))
                    size += len(text)
                    if len(more) == 64 or len(rows) + len(more) >= maxCount or size >= maxBytes:
                        break
                if not more:
                    break
                # One scan of the stored texts together: most batches hold no mark at all.
                together = b"\x00".join(stored for _, stored, *_ in more)
                suspect = any(mark in together for mark in _SURROGATE_MARKS)
                marked = any(mark in together for mark in wanted)
                for seq, stored, text, nbytes, valid in more:
                    sound = bool(valid) and len(text) == nbytes and not (
                        suspect and any(mark in text for mark in _SURROGATE_MARKS))
                    rows.append((seq, text, sound, marked and any(mark in stored for mark in wanted)))
        return rows

    @classmethod
    def _tail(cls, cursor: sqlite3.Cursor, sessionId: str, maxCount: int | None, maxBytes: int | None) -> JournalTail:
        cls._require(cursor, sessionId)
        maxCount = _NO_CAP if maxCount is None else maxCount
        maxBytes = _NO_CAP if maxBytes is None else maxBytes
        totalCount, totalBytes, first, last = cursor.execute(
            "SELECT count(*), coalesce(sum(nbytes), 0), coalesce(min(seq), 0), coalesce(max(seq), 0) "
            "FROM acp_journal WHERE session_id = ?",
            (sessionId,),
        ).fetchone()
        if totalCount <= maxCount and totalBytes <= maxBytes:  # all of it (most sessions): no window to sum
            return JournalTail(first=first, last=last)
        first, kept, size = cursor.execute(
            "SELECT min(seq), count(*), coalesce(max(size), 0) FROM ("
            " SELECT seq, row_number() OVER tail AS n, sum(nbytes) OVER tail AS size"
            " FROM acp_journal WHERE session_id = ?"
            " WINDOW tail AS (ORDER BY seq DESC ROWS UNBOUNDED PRECEDING)"
            ") WHERE n <= ? AND size <= ?",
            (sessionId, maxCount, maxBytes),
        ).fetchone()  # fmt: skip
        return JournalTail(first=_NO_CAP if first is None else first, last=last,
                           omittedCount=totalCount - kept, omittedBytes=totalBytes - size)

    def lastUsage(self, sessionId: str) -> tuple[int, float | None]:
        """``used`` and ``cost.amount`` of the newest ``usage_update`` journaled (0 and None
        when there is none, or it has no cost)."""
        with self._read() as cursor:
            row = cursor.execute(
                f"SELECT {JOURNAL_TEXT} FROM acp_journal AS j WHERE j.session_id = ? "
                "AND instr(j.payload, '\"sessionUpdate\":\"usage_update\"') > 0 ORDER BY j.seq DESC LIMIT 1",
                (sessionId,),
            ).fetchone()
        update = safejson.loads(row[0]) if row else {}
        used, cost = update.get("used"), update.get("cost")
        amount = cost.get("amount") if isinstance(cost, dict) else None
        return (used if isinstance(used, int) and not isinstance(used, bool) else 0,
                float(amount) if isinstance(amount, (int, float)) and not isinstance(amount, bool) else None)

    # -- turns ------------------------------------------------------------------------------

    def beginTurn(self, sessionId: str, owner: str | None = None, prompt: str | None = None) -> int:
        """Mark a new turn running in process ``owner`` (``hermes_acp.lease``); return
        its number (1, 2, …). A turn with a ``prompt`` for the model is one a rewind can
        cut back to: where it begins in the history is kept with the prompt (``listTurns``).

        ValueError if a turn is already running (end or recover it first).
        """
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            if record.turnState == "running":
                raise ValueError(
                    f"session {sessionId!r} is still running turn {record.turn}: "
                    "end it (endTurn) or recover it (recoverInterrupted) first"
                )
            cursor.execute(
                "UPDATE acp_sessions SET turn = ?, turn_state = 'running', turn_owner = ?, "
                "updated_at = ? WHERE session_id = ?",
                (record.turn + 1, owner, timestamp(), sessionId),
            )
            if prompt is not None:
                cursor.execute(
                    "INSERT OR REPLACE INTO acp_turns (session_id, turn, message_seq, prompt, started_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (sessionId, record.turn + 1, record.messageCount,
                     prompt[:2000].encode("utf-8", "replace").decode("utf-8"), timestamp()),
                )
            return record.turn + 1

    def listTurns(self, sessionId: str) -> list[tuple[int, int | None, str, str]]:
        """The session's prompt turns still in its conversation, in order: (turn, where it
        began in the history or None when a compaction replaced that history since, the
        prompt's text, when it began)."""
        with self._read() as cursor:
            self._require(cursor, sessionId)
            return cursor.execute(
                "SELECT turn, message_seq, prompt, started_at FROM acp_turns WHERE session_id = ? ORDER BY turn",
                (sessionId,),
            ).fetchall()

    def rewindTo(self, sessionId: str, turn: int, current: int) -> list[int]:
        """Cut the conversation back to before prompt turn ``turn``, in one transaction: the
        model's history from there on is archived (still found by ``searchMessages``), and
        the journal rows of turns ``turn`` to ``current - 1`` move to ``acp_journal_cut``, so
        a replay shows what the model has. Returns the turns cut. ValueError for a turn that
        is not a prompt turn of the session, or whose history a compaction replaced."""
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            row = cursor.execute(
                "SELECT message_seq FROM acp_turns WHERE session_id = ? AND turn = ?", (sessionId, turn)
            ).fetchone()
            if row is None:
                raise ValueError(f"turn {turn} is not a prompt turn of session {sessionId!r}")
            if row[0] is None:
                raise ValueError(f"the history was compacted or reset after turn {turn} began")
            first = min(row[0], record.messageCount)
            self._archive(cursor, record, first)
            cursor.execute("UPDATE acp_sessions SET message_count = ?, updated_at = ? WHERE session_id = ?",
                           (first, timestamp(), sessionId))
            cursor.execute(
                "INSERT INTO acp_journal_cut (session_id, seq, turn, payload, nbytes, ref, ref_start, ref_length, cut_at) "
                "SELECT session_id, seq, turn, payload, nbytes, ref, ref_start, ref_length, ? FROM acp_journal "
                "WHERE session_id = ? AND turn >= ? AND turn < ?",
                (timestamp(), sessionId, turn, current),
            )
            cursor.execute("DELETE FROM acp_journal WHERE session_id = ? AND turn >= ? AND turn < ?",
                           (sessionId, turn, current))
            cut = [t for (t,) in cursor.execute(
                "SELECT turn FROM acp_turns WHERE session_id = ? AND turn >= ? AND turn < ? ORDER BY turn",
                (sessionId, turn, current))]
            cursor.execute("DELETE FROM acp_turns WHERE session_id = ? AND turn >= ? AND turn < ?",
                           (sessionId, turn, current))
            return cut

    def endTurn(
        self, sessionId: str, turn: int, messages: Iterable[dict[str, Any]] = (),
        history: list[dict[str, Any]] | None = None,
    ) -> int:
        """Append the turn's new messages and mark the session idle, in one transaction;
        return the new message count. Once this returns, the turn is durable. With
        ``history`` (a compaction's result) that becomes the model's history instead, and the
        old one with ``messages`` is archived (see ``_compact``).

        ValueError unless ``turn`` is the running turn.
        """
        messages = list(messages)
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            if record.turnState != "running" or record.turn != turn:
                raise ValueError(
                    f"turn {turn} of session {sessionId!r} is not running "
                    f"(last turn {record.turn} is {record.turnState})"
                )
            cursor.execute(
                "UPDATE acp_sessions SET turn_state = 'idle', turn_owner = NULL "
                "WHERE session_id = ?",
                (sessionId,),
            )
            if history is not None:
                return self._compact(cursor, record, messages, history)
            count = self._insertMessages(cursor, sessionId, record.messageCount, messages)
            if any(message.get("role") == "tool" for message in messages):
                self._linkJournal(cursor, sessionId, turn, record.messageCount, count, chats=False)
            with self._pendingLock:
                self._unlinked.append((sessionId, turn, record.messageCount, count))
            return count

    def linkChunks(self) -> bool:
        """Link the answer and prompt chunks of one turn ended since (``_linkJournal``), in a
        transaction of its own; whether turns are left. It is work no answer waits for: the
        ACP layer calls it when the database thread has nothing else to do (a turn's end
        only queues it), so 200 turns ending at once are not slower for it."""
        with self._pendingLock:
            if not self._unlinked:
                return False
            sessionId, turn, first, end = self._unlinked.popleft()
        with self._write() as cursor:
            if self._find(cursor, sessionId) is not None:
                self._linkJournal(cursor, sessionId, turn, first, end, tools=False)
        with self._pendingLock:
            return bool(self._unlinked)

    @staticmethod
    def _linkJournal(
        cursor: sqlite3.Cursor, sessionId: str, turn: int, first: int, end: int, tools: bool = True, chats: bool = True
    ) -> None:
        """The turn's journal rows that repeat text of its messages (seqs ``first`` to
        ``end - 1``) keep a reference to the message in its place (``migrations.JOURNAL_TEXT``
        puts it back), so that text is on disk once: a tool card that shows a tool's result
        (and its ``rawOutput`` again; ``tools``), a chunk of the answer or of the prompt at
        least ``MIN_CHUNK`` characters long (``chats``). Any message holding the text will
        do (rows are matched by the text itself, and a message's text never changes), so a
        rewind or compaction since the turn ended changes nothing here."""
        shared, said = [], []  # (message id, start, length, text); (message id, role, JSON text)
        for messageId, role, message in cursor.execute(
            "SELECT id, role, message FROM acp_messages WHERE session_id = ? AND seq >= ? AND seq < ?",
            (sessionId, first, end),
        ).fetchall():
            if role == "tool" and tools:
                where = sharedText(message)
                if where is not None:
                    shared.append((messageId, *where, message[where[0] - 1:where[0] - 1 + where[1]]))
            elif role in ("user", "assistant") and chats:
                said.append((messageId, role, message))
        if not (shared or said):
            return
        rows = []
        for seq, rowTurn, nbytes, ref in cursor.execute(
            "SELECT seq, turn, nbytes, ref FROM acp_journal WHERE session_id = ? ORDER BY seq DESC", (sessionId,)
        ):
            if 0 < rowTurn < turn:
                break  # the turn's rows are among the last ones (rows of no turn, 0, may follow them)
            if rowTurn == turn and ref is None and nbytes >= MIN_CHUNK:
                rows.append(seq)
        # A finished card's ``rawOutput`` starts with its output: the outputs are looked up by
        # their start (a card searched for every output of a turn of 200 calls took seconds).
        byStart: dict[str, list[tuple[int, int, int, str]]] = {}
        for entry in shared:
            byStart.setdefault(entry[3][:_START], []).append(entry)
        links = []
        for seq in rows:
            (payload,) = cursor.execute(
                "SELECT payload FROM acp_journal WHERE session_id = ? AND seq = ?", (sessionId, seq)
            ).fetchone()
            at = payload.find(_RAW_OUTPUT) + len(_RAW_OUTPUT)
            if at >= len(_RAW_OUTPUT):
                outputs = byStart.get(payload[at:at + _START], [])
            else:  # (a row shorter than any output worth sharing holds none)
                outputs = shared if len(payload) >= migrations.MIN_SHARED else []
            link = _toolLink(payload, outputs) or (_chatLink(payload, said) if said else None)
            if link is not None:
                links.append((*link, sessionId, seq))
        cursor.executemany(
            "UPDATE acp_journal SET payload = ?, ref = ?, ref_start = ?, ref_length = ? WHERE session_id = ? AND seq = ?",
            links,
        )

    def recoverInterrupted(
        self, sessionId: str, ownerAlive: Callable[[str | None], bool] = lambda owner: False
    ) -> list[dict[str, Any]] | None:
        """After a crash: if the session was left mid-turn by a process that is gone
        (``ownerAlive(owner)`` is false), close that turn (see ``_interrupt``) and return
        the updates journaled; [] when nothing was running; None when the turn's owner is
        still alive, which leaves the turn alone (another process is running it).
        """
        with self._write() as cursor:
            record = self._require(cursor, sessionId)
            if record.turnState != "running":
                return []
            if ownerAlive(record.turnOwner):
                return None
            return self._interrupt(cursor, sessionId, record.turn)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections; later calls raise StoreError. Closing twice is harmless."""
        with self._lock:
            self._connection.close()
        with self._searchLock:
            self._closed = True
            if self._searches is not None:
                self._searches.put(None)  # the thread ends once its search in hand is done
                self._searches = None
            if self._searchConnection is not None:
                self._searchConnection.close()
                self._searchConnection = None

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
