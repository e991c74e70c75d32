"""The schema of this project's tables in ``state.db`` and its forward migrations.

Every table, index and trigger is named ``acp_*``: other tools keep their own tables in the same
file, and nothing here touches theirs.

A fresh file is built by running the whole chain (``MIGRATIONS[0:]``), so the current schema is
always exactly "v1 plus every step". A released step is never edited: a change is a new step
appended to ``MIGRATIONS`` and a bump of ``SCHEMA_VERSION``.

Pure Python and sqlite3 only; ``migrate`` is called by ``hermes_acp.store.SessionDB`` on whatever
thread opens the file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator

# v1 — sessions, model-facing messages (with FTS5 over their text) and the update journal.
_V1 = (
    """CREATE TABLE acp_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE acp_sessions (
        session_id TEXT PRIMARY KEY,
        cwd TEXT NOT NULL,
        additional_directories TEXT NOT NULL DEFAULT '[]',
        title TEXT,
        model TEXT,
        mode TEXT,
        config TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        turn_state TEXT NOT NULL DEFAULT 'idle'
            CHECK (turn_state IN ('idle', 'running', 'interrupted')),
        turn INTEGER NOT NULL DEFAULT 0,
        message_count INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX acp_sessions_updated ON acp_sessions (updated_at DESC, session_id DESC)",
    # One row per OpenAI chat message, stored as-is; `text` is its flattened searchable text
    # (NULL for messages that are not indexed, e.g. system prompts).
    """CREATE TABLE acp_messages (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        message TEXT NOT NULL,
        text TEXT,
        UNIQUE (session_id, seq)
    )""",
    """CREATE VIRTUAL TABLE acp_messages_fts USING fts5 (
        text, content='acp_messages', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2'
    )""",
    # Message rows are never updated in place (replace = delete + insert), so two triggers keep
    # the external-content index exact. Every row is indexed (a NULL text has no terms), as
    # FTS5's 'rebuild' and 'integrity-check' expect of an external-content table.
    """CREATE TRIGGER acp_messages_fts_insert AFTER INSERT ON acp_messages BEGIN
        INSERT INTO acp_messages_fts (rowid, text) VALUES (new.id, new.text);
    END""",
    """CREATE TRIGGER acp_messages_fts_delete AFTER DELETE ON acp_messages BEGIN
        INSERT INTO acp_messages_fts (acp_messages_fts, rowid, text)
            VALUES ('delete', old.id, old.text);
    END""",
    # Every `session/update` `update` object sent, verbatim, in send order.
    """CREATE TABLE acp_journal (
        session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID""",
)


def _createV1(cursor: sqlite3.Cursor) -> None:
    for statement in _V1:
        cursor.execute(statement)


def _v1ToV2(cursor: sqlite3.Cursor) -> None:
    """Byte sizes on journal rows and a normalised cwd on sessions.

    - ``acp_journal.nbytes`` (UTF-8 size of ``payload``) and an index holding it let a replay
      pick its tail under a byte cap in SQL, without reading the updates it leaves out.
    - ``acp_sessions.cwd_key`` (``os.path.realpath`` of ``cwd``) plus an index make the
      ``session/list`` cwd filter a range scan that agrees about symlinks (``/tmp`` vs
      ``/private/tmp``).
    """
    cursor.execute("ALTER TABLE acp_journal ADD COLUMN nbytes INTEGER NOT NULL DEFAULT 0")
    cursor.execute("UPDATE acp_journal SET nbytes = length(CAST(payload AS BLOB))")
    cursor.execute("ALTER TABLE acp_sessions ADD COLUMN cwd_key TEXT NOT NULL DEFAULT ''")
    rows = cursor.execute("SELECT session_id, cwd FROM acp_sessions").fetchall()
    cursor.executemany(
        "UPDATE acp_sessions SET cwd_key = ? WHERE session_id = ?",
        [(cwdKey(cwd), sessionId) for sessionId, cwd in rows],
    )
    cursor.execute(
        "CREATE INDEX acp_sessions_cwd "
        "ON acp_sessions (cwd_key, updated_at DESC, session_id DESC)"
    )
    # Covering index: sizing the tail reads (seq, nbytes) without touching large payloads.
    cursor.execute("CREATE INDEX acp_journal_sizes ON acp_journal (session_id, seq, nbytes)")


def _v2ToV3(cursor: sqlite3.Cursor) -> None:
    """``acp_sessions.turn_owner``: the process running the turn (``hermes_acp.lease``), so
    another process sharing the file leaves a live turn alone and recovers a dead one."""
    cursor.execute("ALTER TABLE acp_sessions ADD COLUMN turn_owner TEXT")


def _v3ToV4(cursor: sqlite3.Cursor) -> None:
    """``acp_messages.archived``: messages a compaction took out of the model's history. They
    stay (and stay in the full-text index) for ``session_search``; their ``seq`` is negative,
    so the live history keeps numbering from 0."""
    cursor.execute("ALTER TABLE acp_messages ADD COLUMN archived INTEGER NOT NULL DEFAULT 0")


def _v4ToV5(cursor: sqlite3.Cursor) -> None:
    """Rewinds (``/rewind``, ``/undo``): ``acp_turns`` marks where each prompt's turn began in
    the model's history (``message_seq``; NULL once a compaction or ``/reset`` replaced that
    history: the conversation cannot be cut there any more), with its prompt's first line;
    ``acp_journal_cut`` keeps the journal rows a rewind took out of the replay."""
    cursor.execute(
        """CREATE TABLE acp_turns (
            session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
            turn INTEGER NOT NULL,
            message_seq INTEGER,
            prompt TEXT NOT NULL,
            started_at TEXT NOT NULL,
            PRIMARY KEY (session_id, turn)
        ) WITHOUT ROWID"""
    )
    cursor.execute(
        """CREATE TABLE acp_journal_cut (
            session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            payload TEXT NOT NULL,
            nbytes INTEGER NOT NULL,
            cut_at TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID"""
    )


#: The control character that marks, in a journal row's stored text, where the referenced
#: text goes. JSON text never holds it raw (inside strings it is escaped as ``\u0001``).
HOLE = "\x01"
#: A stored text shorter than this is not worth a reference (``linkedPayload``).
MIN_SHARED = 256
#: The migration to v6 converts this many rows per statement, so its memory stays bounded.
MIGRATION_BATCH = 500


def linkedPayload(payload: str, shared: str) -> str | None:
    """``payload`` with each occurrence of ``shared`` replaced by ``HOLE``, or None when
    ``shared`` is too short to be worth it, does not occur, or ``payload`` already holds a
    ``HOLE`` (it could not be told apart)."""
    if len(shared) < MIN_SHARED or HOLE in payload or shared not in payload:
        return None
    return payload.replace(shared, HOLE)


def sharedText(message: str) -> tuple[int, int] | None:
    """Where a stored tool message's output is in its JSON text: (first character counted
    from 1, as SQLite's ``substr``, length), or None when it has no string ``content`` worth
    sharing. The output as it is stored *inside* the JSON (escaped) is what another JSON
    text holds when it carries the same string (one encoder: ``safejson``)."""
    try:
        content = json.loads(message).get("content")
    except (ValueError, AttributeError):
        return None
    if not isinstance(content, str) or len(content) < MIN_SHARED:
        return None
    escaped = json.dumps(content, ensure_ascii=False)[1:-1]
    start = message.find('"content":"' + escaped + '"')
    return None if start < 0 else (start + len('"content":"') + 1, len(escaped))


# The journal row's whole text: its stored text with each HOLE filled by the referenced
# part of a message. Every reader of the journal reads through this expression.
JOURNAL_TEXT = (
    "CASE WHEN j.ref IS NULL THEN j.payload ELSE "
    "replace(j.payload, char(1), (SELECT substr(m.message, j.ref_start, j.ref_length) "
    "FROM acp_messages AS m WHERE m.id = j.ref)) END"
)


def _v5ToV6(cursor: sqlite3.Cursor) -> None:
    """Tool output stored once (issue 27): it used to be in the history message, again in
    the message's full-text search text, and twice more in the journal's tool card (its
    content and ``rawOutput``).

    - ``acp_messages.text`` becomes a generated (virtual, not stored) column: the stored
      ``stored_text`` when there is one, else the message's ``content`` read from its JSON
      when ``text_is_content`` says the search text is exactly that (most messages). The
      FTS5 index is external-content over ``text`` and does not change.
    - A journal row may refer to the message holding the text it repeats: ``ref`` (the
      message's id), ``ref_start``/``ref_length`` (characters of the message's JSON text),
      and ``HOLE`` characters in ``payload`` where that text goes (``JOURNAL_TEXT``). The
      journal is rebuilt with ``nbytes`` before ``payload`` and without its sizes index.

    Existing rows are converted here, in the migration's one transaction, ``MIGRATION_BATCH``
    rows at a time: messages whose search text equals their content (compared in SQL, so
    nothing changes that could differ) drop the copy; tool cards are linked to the tool
    message whose output they hold (``_linkExisting``).
    """
    cursor.execute("DROP TRIGGER acp_messages_fts_insert")
    cursor.execute("DROP TRIGGER acp_messages_fts_delete")
    cursor.execute("ALTER TABLE acp_messages RENAME COLUMN text TO stored_text")
    cursor.execute("ALTER TABLE acp_messages ADD COLUMN text_is_content INTEGER NOT NULL DEFAULT 0")
    cursor.execute(
        "ALTER TABLE acp_messages ADD COLUMN text TEXT GENERATED ALWAYS AS (CASE WHEN text_is_content "
        "THEN json_extract(message, '$.content') ELSE stored_text END) VIRTUAL"
    )
    cursor.execute(
        """CREATE TRIGGER acp_messages_fts_insert AFTER INSERT ON acp_messages BEGIN
            INSERT INTO acp_messages_fts (rowid, text) VALUES (new.id, new.text);
        END"""
    )
    cursor.execute(
        """CREATE TRIGGER acp_messages_fts_delete AFTER DELETE ON acp_messages BEGIN
            INSERT INTO acp_messages_fts (acp_messages_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
        END"""
    )
    # The journal again, its sizes before its text: summing them reads no text, so the index
    # that held them beside the table (``acp_journal_sizes``, a tenth of the table's size once
    # cards refer to their output) goes. One statement copies the rows (SQLite streams them).
    cursor.execute(
        """CREATE TABLE acp_journal_v6 (
            session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            nbytes INTEGER NOT NULL,
            ref INTEGER,
            ref_start INTEGER,
            ref_length INTEGER,
            payload TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID"""
    )
    cursor.execute("INSERT INTO acp_journal_v6 (session_id, seq, turn, nbytes, payload) "
                   "SELECT session_id, seq, turn, nbytes, payload FROM acp_journal")
    cursor.execute("DROP TABLE acp_journal")
    cursor.execute("ALTER TABLE acp_journal_v6 RENAME TO acp_journal")
    cursor.execute("ALTER TABLE acp_journal_cut ADD COLUMN ref INTEGER")
    cursor.execute("ALTER TABLE acp_journal_cut ADD COLUMN ref_start INTEGER")
    cursor.execute("ALTER TABLE acp_journal_cut ADD COLUMN ref_length INTEGER")
    last = -(2**63)
    while True:  # the search text that is the content: not kept twice
        row = cursor.execute(
            "SELECT max(id) FROM (SELECT id FROM acp_messages WHERE id > ? ORDER BY id LIMIT ?)",
            (last, MIGRATION_BATCH),
        ).fetchone()
        if row[0] is None:
            break
        cursor.execute(
            "UPDATE acp_messages SET stored_text = NULL, text_is_content = 1 WHERE id > ? AND id <= ? "
            "AND stored_text IS NOT NULL AND json_valid(message) AND json_type(message, '$.content') = 'text' "
            "AND stored_text = json_extract(message, '$.content')",
            (last, row[0]),
        )
        last = row[0]
    _healJournal(cursor)
    _linkExisting(cursor)


def _healJournal(cursor: sqlite3.Cursor) -> None:
    """Rows written before ``safejson``'s rule may hold a ``NaN`` (not JSON at all) or an
    escaped lone surrogate: they are written again as the rule writes them, so that every
    row is sound and a ``session/load`` can send rows as they are. A row that is not JSON
    at all gets ``nbytes`` -1: never sound, so a replay decodes it, and leaves it out."""
    from hermes_acp import safejson

    after: tuple[str, int] = ("", -(2**63))
    while True:
        rows = cursor.execute(
            "SELECT session_id, seq, payload FROM acp_journal WHERE (session_id, seq) > (?, ?) "
            "AND (NOT json_valid(payload) OR instr(payload, '\\ud') > 0 OR instr(payload, '\\uD') > 0) "
            "ORDER BY session_id, seq LIMIT ?",
            (*after, MIGRATION_BATCH),
        ).fetchall()
        if not rows:
            return
        fixes = []
        for sessionId, seq, payload in rows:
            try:
                text = safejson.utf8(safejson.dumps(safejson.healed(json.loads(payload))))
            except (ValueError, RecursionError):
                fixes.append((payload, -1, sessionId, seq))
                continue
            fixes.append((text.decode("utf-8"), len(text), sessionId, seq))
        cursor.executemany("UPDATE acp_journal SET payload = ?, nbytes = ? WHERE session_id = ? AND seq = ?", fixes)
        after = rows[-1][:2]


def _linkExisting(cursor: sqlite3.Cursor) -> None:
    """Link the journal's tool cards to the tool messages holding their output, session by
    session. Both are in time order (messages by id, the journal by seq) and a card comes
    before its message is written, so each card is matched against the next few tool
    messages not yet matched; one never found (its card was cut, say) is skipped once a
    later one matches. Memory: one batch of each at a time."""
    for sessionId in _sessionIds(cursor):
        messages: list[tuple[int, int, int, str]] = []  # (id, start, length, shared text), in id order
        lastMessage = -(2**63)
        lastSeq = -(2**63)
        while True:
            cards = cursor.execute(
                "SELECT seq, payload FROM acp_journal WHERE session_id = ? AND seq > ? AND nbytes >= ? "
                "AND ref IS NULL ORDER BY seq LIMIT ?",
                (sessionId, lastSeq, MIN_SHARED, MIGRATION_BATCH),
            ).fetchall()
            if not cards:
                break
            links = []
            for seq, payload in cards:
                if len(messages) < 8:
                    rows = cursor.execute(
                        "SELECT id, message FROM acp_messages WHERE session_id = ? AND id > ? AND role = 'tool' "
                        "AND length(message) >= ? ORDER BY id LIMIT ?",
                        (sessionId, lastMessage, MIN_SHARED, MIGRATION_BATCH),
                    ).fetchall()
                    for messageId, message in rows:
                        lastMessage = messageId
                        where = sharedText(message)
                        if where is not None:
                            messages.append((messageId, *where, message[where[0] - 1:sum(where) - 1]))
                for n, (messageId, start, length, shared) in enumerate(messages[:8]):
                    linked = linkedPayload(payload, shared)
                    if linked is not None:
                        links.append((linked, messageId, start, length, sessionId, seq))
                        del messages[:n + 1]
                        break
            cursor.executemany(
                "UPDATE acp_journal SET payload = ?, ref = ?, ref_start = ?, ref_length = ? "
                "WHERE session_id = ? AND seq = ?",
                links,
            )
            lastSeq = cards[-1][0]


def _sessionIds(cursor: sqlite3.Cursor) -> Iterator[str]:
    """Every session's id, read ``MIGRATION_BATCH`` at a time."""
    last = ""
    while True:
        batch = [row[0] for row in cursor.execute(
            "SELECT session_id FROM acp_sessions WHERE session_id > ? ORDER BY session_id LIMIT ?",
            (last, MIGRATION_BATCH)).fetchall()]
        if not batch:
            return
        yield from batch
        last = batch[-1]


# MIGRATIONS[n] takes a file at schema version n to version n + 1.
MIGRATIONS: tuple[Callable[[sqlite3.Cursor], None], ...] = (
    _createV1, _v1ToV2, _v2ToV3, _v3ToV4, _v4ToV5, _v5ToV6,
)
SCHEMA_VERSION = len(MIGRATIONS)


#: The oldest SQLite the schema works with: version 6 keeps search text as a generated column.
MIN_SQLITE = (3, 31, 0)


class NewerSchemaError(Exception):
    """The file was written by a newer hermes-acp than this one."""

    def __init__(self, found: int) -> None:
        super().__init__(found)
        self.found = found


def cwdKey(cwd: str) -> str:
    """The form of a working directory that filters compare: absolute, symlinks resolved."""
    return os.path.realpath(cwd)


def schemaVersion(cursor: sqlite3.Cursor) -> int:
    """The version recorded in ``acp_meta``; 0 when this project has no tables in the file."""
    if not cursor.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'acp_meta'"
    ).fetchone():
        return 0
    row = cursor.execute("SELECT value FROM acp_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(cursor: sqlite3.Cursor) -> int:
    """Bring the file up to ``SCHEMA_VERSION``; return the version found.

    Call it inside one write transaction (``BEGIN IMMEDIATE``), so that a failed step leaves the
    file as it was and two processes opening a fresh file at once run the chain only once.
    Raises ``NewerSchemaError`` for a version newer than this code knows; lets ``sqlite3.Error``
    through for the caller to explain.
    """
    found = schemaVersion(cursor)
    if found > SCHEMA_VERSION:
        raise NewerSchemaError(found)
    for step in MIGRATIONS[found:]:
        step(cursor)
    if found < SCHEMA_VERSION:
        cursor.execute(
            "INSERT INTO acp_meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
    return found
