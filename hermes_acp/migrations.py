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

import os
import sqlite3
from collections.abc import Callable

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


# MIGRATIONS[n] takes a file at schema version n to version n + 1.
MIGRATIONS: tuple[Callable[[sqlite3.Cursor], None], ...] = (_createV1, _v1ToV2, _v2ToV3, _v3ToV4, _v4ToV5)
SCHEMA_VERSION = len(MIGRATIONS)


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
