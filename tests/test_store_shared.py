"""Tool output stored once (issue 27): the search text read from the message, tool cards
that refer to the message holding their output, and the migration that converts a v5 file
(as the released code wrote it) in place, with search, resume and load unchanged."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hermes_acp import migrations, safejson
from hermes_acp.render import Renderer
from hermes_acp.store import SessionDB, searchableText

from .test_store import StoreTestCase, storedVersion

OUTPUT = "\n".join(f"{n:6d}|def parse_{n}(tokens): return \"quoted\" \\ tab\there é 🙂" for n in range(1, 60))
TRICKY = ["plain words for the parser", "tab\there\nnew line \"quoted\" back\\slash é 🙂 \u001b[0m",
          "x" * 300 + " ünïcödé", "a\u2028b"]
# main's search, exactly: the migration must not change what it finds or says.
SEARCH = ("SELECT m.session_id, s.title, s.cwd, m.role, m.seq, "
          "snippet(acp_messages_fts, 0, '**', '**', '…', 16), s.updated_at "
          "FROM acp_messages_fts JOIN acp_messages AS m ON m.id = acp_messages_fts.rowid "
          "JOIN acp_sessions AS s ON s.session_id = m.session_id "
          "WHERE acp_messages_fts MATCH ? ORDER BY rank LIMIT 10")
QUERIES = ['"parse_7"', '"quoted"', '"parser"', '"ünïcödé"', '"notes"', '"read_file"', '"tab"']


def toolTurn(renderer: Renderer, turn: int, output: str = OUTPUT) -> tuple[list[dict], list[dict]]:
    """One turn as the agent writes it: its messages and its updates (the card built by the
    agent's renderer, so its content and ``rawOutput`` both carry the output)."""
    call, args = f"call{turn}", {"path": "notes.txt"}
    messages = [
        {"role": "user", "content": f"turn {turn}: read the notes"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "read_file", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call, "name": "read_file", "content": output},
        {"role": "assistant", "content": f"The notes, turn {turn}."},
    ]
    updates = [
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": messages[0]["content"]}},
        renderer.toolStarted(f"card{turn}", "read_file", args),
        renderer.toolFinished(f"card{turn}", "read_file", args, output, False, {"path": "/work/notes.txt"}),
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": messages[3]["content"]}},
    ]
    return messages, updates


def encoded(updates: list[dict]) -> list[safejson.Encoded]:
    """Updates as the agent journals them: with the text they were sent as."""
    return [safejson.Encoded(u, safejson.encode(u)) for u in updates]


class SharedTextTests(StoreTestCase):
    def writeTurns(self, db: SessionDB, sessionId: str = "s1", turns: int = 3) -> tuple[list[dict], list[dict]]:
        self.newSession(db, sessionId)
        history, journal = [], []
        for turn in range(1, turns + 1):
            messages, updates = toolTurn(Renderer("/work"), turn)
            db.beginTurn(sessionId, prompt=messages[0]["content"])
            db.appendUpdates(sessionId, turn, encoded(updates))
            db.endTurn(sessionId, turn, messages)
            history += messages
            journal += updates
        return history, journal

    def raw(self, db: SessionDB) -> sqlite3.Connection:
        connection = sqlite3.connect(db.path, isolation_level=None)
        self.addCleanup(connection.close)
        return connection

    def test_toolCardRefersToTheMessage(self) -> None:
        """A card that repeats a tool result keeps a reference in its place; load, resume and
        search give what was written, and the output is on disk once in the journal."""
        db = self.openStore()
        history, journal = self.writeTurns(db)
        self.assertEqual(db.loadJournal("s1").updates, journal)
        self.assertEqual(db.loadMessages("s1"), history)
        raw = self.raw(db)
        cards = raw.execute("SELECT payload, nbytes FROM acp_journal WHERE ref IS NOT NULL "
                            "AND payload LIKE '%tool_call_update%' ORDER BY seq").fetchall()
        self.assertEqual(len(cards), 3)
        for payload, nbytes in cards:
            self.assertEqual(payload.count(migrations.HOLE), 2)  # the card's content and its rawOutput
            self.assertLess(len(payload), 600)
            self.assertGreater(nbytes, 2 * len(OUTPUT))
        tail = db.journalTail("s1")
        rows = db.journalTexts("s1", tail.first - 1, tail.last, 100, 1 << 20)
        self.assertEqual([r[1] for r in rows], [safejson.encode(u) for u in journal])
        self.assertTrue(all(sound for _, _, sound, _ in rows))
        self.assertEqual([h["seq"] for h in db.searchMessages("parse_7")], [2, 6, 10])

    def test_answerChunksReferToTheAnswer(self) -> None:
        """Chunks of the answer (and the prompt) as long as ``MIN_CHUNK`` refer to the message
        that holds their text; shorter ones, and a chunk the message does not hold, keep it."""
        db = self.openStore()
        self.newSession(db)
        prompt = "Please explain the parser, \"quoted\", in detail: é 🙂"
        parts = ["The parser reads tokens,\nthen the lexer ", "splits lines into words for the grammar é 🙂. ", "Done."]
        updates = [{"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": prompt}},
                   *({"sessionUpdate": "agent_message_chunk", "messageId": "m1",
                      "content": {"type": "text", "text": part}} for part in parts),
                   {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * 40}}]
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "".join(parts)}]
        db.beginTurn("s1")
        for batch in (updates[:2], updates[2:3], updates[3:]):  # three flushes (one would make the answer one row)
            db.appendUpdates("s1", 1, encoded(batch))
        db.endTurn("s1", 1, messages)
        raw = self.raw(db)
        refs = lambda: [ref is not None for (ref,) in raw.execute("SELECT ref FROM acp_journal ORDER BY seq")]
        self.assertEqual(refs(), [False] * 5)  # a turn's end only queues them: no answer waits
        self.assertFalse(db.linkChunks())
        self.assertFalse(db.linkChunks())
        self.assertEqual(db.loadJournal("s1").updates, updates)
        self.assertEqual(refs(), [True, True, True, False, False])
        tail = db.journalTail("s1")
        rows = db.journalTexts("s1", 0, tail.last, 100, 1 << 20)
        self.assertEqual([text for _, text, _, _ in rows], [safejson.encode(u) for u in updates])
        self.assertTrue(all(sound for _, _, sound, _ in rows))

    def test_aMergedRunOfChunksRefersToTheAnswer(self) -> None:
        """The chunks of a flush, joined into one row (``store._merged``), are one piece of the
        answer: the row refers to it like any long chunk, and loads as the joined text."""
        db = self.openStore()
        self.newSession(db)
        parts = ["The parser ", "reads ", "tokens, é 🙂, ", "then words."]
        chunks = [{"sessionUpdate": "agent_message_chunk", "messageId": "m1", "content": {"type": "text", "text": part}}
                  for part in parts]
        db.beginTurn("s1")
        db.appendUpdates("s1", 1, encoded(chunks[:3]))
        db.appendUpdates("s1", 1, encoded(chunks[3:]))
        db.endTurn("s1", 1, [{"role": "user", "content": "explain"}, {"role": "assistant", "content": "".join(parts)}])
        self.assertFalse(db.linkChunks())
        self.assertFalse(db.linkChunks())
        raw = self.raw(db)
        self.assertEqual([ref is not None for (ref,) in raw.execute("SELECT ref FROM acp_journal ORDER BY seq")],
                         [True, False])  # (the last flush's chunk is under MIN_CHUNK)
        self.assertEqual(db.loadJournal("s1").updates,
                         [{**chunks[0], "content": {"type": "text", "text": "".join(parts[:3])}}, chunks[3]])

    def test_searchTextFromTheContent(self) -> None:
        """A message whose search text is its content stores it once; the index reads the
        same text back from the message, whatever the content's characters."""
        db = self.openStore()
        self.newSession(db)
        messages = [{"role": "user", "content": text} for text in TRICKY]
        messages.append({"role": "user", "content": "lone \ud800 surrogate words"})  # the index gets "?"
        db.appendMessages("s1", messages)
        raw = self.raw(db)
        rows = raw.execute("SELECT stored_text, text_is_content, text FROM acp_messages ORDER BY seq").fetchall()
        self.assertEqual([r[1] for r in rows], [1, 1, 1, 1, 0])
        self.assertEqual([r[0] for r in rows[:4]], [None] * 4)
        self.assertEqual([r[2] for r in rows], [searchableText(m) for m in messages])
        raw.execute("INSERT INTO acp_messages_fts (acp_messages_fts, rank) VALUES ('integrity-check', 1)")
        self.assertEqual([h["seq"] for h in db.searchMessages("ünïcödé")], [2])
        self.assertEqual([h["seq"] for h in db.searchMessages("surrogate")], [4])

    def test_forkOutlivesItsSource(self) -> None:
        """A fork's cards refer to the fork's own messages: deleting the source loses nothing."""
        db = self.openStore()
        _, journal = self.writeTurns(db)
        db.forkSession("s1", "s2", "/work")
        db.deleteSession("s1")
        self.assertEqual(db.loadJournal("s2").updates, journal)
        self.raw(db).execute("INSERT INTO acp_messages_fts (acp_messages_fts, rank) VALUES ('integrity-check', 1)")

    def test_rewindKeepsTheCutRowsWhole(self) -> None:
        """Rows a rewind cuts keep their reference (the messages they refer to stay, archived),
        and so do those a /reset leaves in the replay."""
        db = self.openStore()
        _, journal = self.writeTurns(db)
        db.beginTurn("s1", prompt="the fourth")
        self.assertEqual(db.rewindTo("s1", 2, 4), [2, 3])
        self.assertEqual(db.loadJournal("s1").updates, journal[:4])
        cut = self.raw(db).execute(
            f"SELECT {migrations.JOURNAL_TEXT} FROM acp_journal_cut AS j ORDER BY j.seq").fetchall()
        self.assertEqual([json.loads(text) for (text,) in cut], journal[4:])
        db.replaceMessages("s1", [])  # the history archived, as a /reset does
        self.assertEqual(db.loadJournal("s1").updates, journal[:4])


def buildV5(path: Path) -> dict[str, Any]:
    """A v5 file written as the released code wrote it: main's schema (the migrations up to
    v5, which are never edited) and rows as its ``_insertMessages``/``_insertUpdates`` wrote
    them: the search text stored beside each message, every update's whole text. Two
    sessions of tool turns, an archived (compacted) history, a row with a NaN and one with an
    escaped lone surrogate (written before the rule), and a rewind's cut rows."""
    connection = sqlite3.connect(path, isolation_level=None)
    cursor = connection.cursor()
    cursor.execute("BEGIN IMMEDIATE")
    for step in migrations.MIGRATIONS[:5]:
        step(cursor)
    cursor.execute("INSERT INTO acp_meta VALUES ('schema_version', '5')")
    written: dict[str, Any] = {}
    for sessionId in ("a", "b"):
        cursor.execute(
            "INSERT INTO acp_sessions (session_id, cwd, cwd_key, title, created_at, updated_at, turn, message_count) "
            "VALUES (?, '/work', '/work', ?, '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z', 3, 0)",
            (sessionId, f"Session {sessionId}"),
        )
        history, journal, seq = [], [], 0
        for turn in range(1, 4):
            messages, updates = toolTurn(Renderer("/work"), turn, OUTPUT + f"\n{sessionId} {turn}")
            if turn == 2:
                updates.append({"sessionUpdate": "agent_message_chunk",
                                "content": {"type": "text", "text": "bad \ud800 text"}})
            for update in updates:
                seq += 1
                payload = json.dumps(update, separators=(",", ":"), ensure_ascii=False)
                if "\ud800" in payload:  # the old encoder escaped what UTF-8 cannot carry
                    payload = json.dumps(update, separators=(",", ":"))
                cursor.execute("INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) VALUES (?, ?, ?, ?, ?)",
                               (sessionId, seq, turn, payload, len(payload.encode())))
            history += messages
            journal += updates
        for n, message in enumerate(history):
            cursor.execute(
                "INSERT INTO acp_messages (session_id, seq, role, message, text, archived) VALUES (?, ?, ?, ?, ?, ?)",
                (sessionId, n - (4 if sessionId == "b" else 0), message["role"],
                 safejson.dumps(message), searchableText(message), int(sessionId == "b" and n < 4)),
            )
        live = [m for n, m in enumerate(history) if not (sessionId == "b" and n < 4)]
        cursor.execute("UPDATE acp_sessions SET message_count = ? WHERE session_id = ?", (len(live), sessionId))
        written[sessionId] = (live, journal)
    seq += 1
    cursor.execute("INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) VALUES "
                   "('b', ?, 3, '{\"sessionUpdate\":\"usage_update\",\"used\":NaN,\"size\":1}', 55)", (seq,))
    cursor.execute("INSERT INTO acp_journal_cut (session_id, seq, turn, payload, nbytes, cut_at) "
                   "SELECT session_id, seq + 1000, turn, payload, nbytes, 'then' FROM acp_journal WHERE session_id = 'a'")
    cursor.execute("COMMIT")
    written["search"] = {query: cursor.execute(SEARCH, (query,)).fetchall() for query in QUERIES}
    written["size"] = cursor.execute(
        "SELECT sum(length(payload)) FROM acp_journal").fetchone()[0] + cursor.execute(
        "SELECT sum(length(coalesce(text, ''))) FROM acp_messages").fetchone()[0]
    connection.close()
    return written


class V5MigrationTests(StoreTestCase):
    def test_convertsAV5FileInPlace(self) -> None:
        """A v5 file opens as v6 with search, resume and load giving what they gave: the
        search text is read from the messages, the cards refer to the tool messages, the
        rows written before the rule are healed; the index stays consistent."""
        path = self.tempDir() / "state.db"
        written = buildV5(path)
        self.patch(migrations, "MIGRATION_BATCH", 7)  # several batches of each kind
        db = self.openStore(path)
        self.assertEqual(storedVersion(path), str(migrations.SCHEMA_VERSION))
        for sessionId in ("a", "b"):
            history, journal = written[sessionId]
            self.assertEqual(db.loadMessages(sessionId), history)
            loaded = db.loadJournal(sessionId).updates
            healed = [json.loads(json.dumps(u).replace("\\ud800", "\\ufffd")) for u in journal]
            self.assertEqual(loaded[:len(healed)], healed)
            tail = db.journalTail(sessionId)
            rows = db.journalTexts(sessionId, tail.first - 1, tail.last, 100, 1 << 20)
            self.assertEqual([json.loads(text) for _, text, _, _ in rows], loaded)
            self.assertTrue(all(sound for _, _, sound, _ in rows))
        self.assertEqual(db.loadJournal("b").updates[-1], {"sessionUpdate": "usage_update", "used": None, "size": 1})
        raw = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(raw.close)
        self.assertEqual({query: raw.execute(SEARCH, (query,)).fetchall() for query in QUERIES}, written["search"])
        self.assertEqual([h["seq"] for h in db.searchMessages("parse_7", cwd="/work")],
                         [r[4] for r in written["search"]['"parse_7"']])
        raw.execute("INSERT INTO acp_messages_fts (acp_messages_fts, rank) VALUES ('integrity-check', 1)")
        self.assertEqual(raw.execute("SELECT count(*) FROM acp_journal WHERE ref IS NOT NULL").fetchone(), (6,))
        self.assertEqual(raw.execute("SELECT count(*) FROM acp_messages WHERE stored_text IS NULL "
                                     "AND text_is_content = 1").fetchone(), (18,))
        size = raw.execute("SELECT sum(length(payload)) FROM acp_journal").fetchone()[0] + raw.execute(
            "SELECT sum(length(coalesce(stored_text, ''))) FROM acp_messages").fetchone()[0]
        self.assertLess(size, written["size"] / 4)
        # New turns go on as in a new file.
        messages, updates = toolTurn(Renderer("/work"), 4)
        db.beginTurn("a")
        db.appendUpdates("a", 4, encoded(updates))
        db.endTurn("a", 4, messages)
        self.assertEqual(db.loadJournal("a").updates[-4:], updates)

    def test_interruptedMigrationChangesNothing(self) -> None:
        """The conversion is part of the one upgrade transaction: a failure in it leaves the
        file v5, as it was."""
        path = self.tempDir() / "state.db"
        written = buildV5(path)

        def broken(cursor: sqlite3.Cursor) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        self.patch(migrations, "_linkExisting", broken)
        self.assertRaises(Exception, SessionDB, path)
        self.assertEqual(storedVersion(path), "5")
        raw = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(raw.close)
        self.assertEqual({query: raw.execute(SEARCH, (query,)).fetchall() for query in QUERIES}, written["search"])
        self.assertIn("text", [row[1] for row in raw.execute("PRAGMA table_info(acp_messages)")])
        self.assertNotIn("ref", [row[1] for row in raw.execute("PRAGMA table_info(acp_journal)")])


class SoundRowTests(StoreTestCase):
    def test_rowsNotWrittenByUsAreNotSound(self) -> None:
        """A row the encoder did not write (a NaN, an escaped lone surrogate, a torn or edited
        text) is not sound, so a load decodes it (healing or dropping it) instead of sending it
        as it is; the encoder's rows, linked or not, are sound."""
        SharedTextTests.writeTurns(self, self.db, turns=1)
        raw = sqlite3.connect(self.db.path, isolation_level=None)
        self.addCleanup(raw.close)
        bad = ['{"sessionUpdate":"usage_update","used":NaN,"size":1}',
               '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"bad \\ud800"}}',
               '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"torn',
               '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"edited"}}']
        for n, payload in enumerate(bad, 100):
            raw.execute("INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) VALUES ('s1', ?, 2, ?, ?)",
                        (n, payload, len(payload) + (n == 103)))
        tail = self.db.journalTail("s1")
        rows = self.db.journalTexts("s1", 0, tail.last, 100, 1 << 20, ('"_meta"',))
        self.assertEqual([sound for _, _, sound, _ in rows], [True] * 4 + [False] * 4)
        self.assertEqual([marked for *_, marked in rows], [False] * 8)

    def setUp(self) -> None:
        self.db = self.openStore()

    def test_aBatchOfLargeRowsKeepsToItsBytes(self) -> None:
        """A load's batch holds about ``maxBytes`` even when every row is a large tool card:
        at most one row more than fits, not a fixed number of rows whatever their size."""
        self.newSession(self.db, "big")
        renderer = Renderer("/work")
        for turn in range(1, 41):
            output = (f"line {turn} " * 6000)[:50_000]
            self.db.beginTurn("big")
            self.db.appendUpdates("big", turn, encoded([renderer.toolFinished(f"k{turn}", "read_file", {}, output,
                                                                              False, {"path": "/work/notes.txt"})]))
            self.db.endTurn("big", turn, [{"role": "tool", "tool_call_id": f"k{turn}", "content": output}])
        tail = self.db.journalTail("big")
        rows = self.db.journalTexts("big", tail.first - 1, tail.last, 500, 256 * 1024)
        largest = max(len(text) for _, text, _, _ in rows)
        self.assertLess(sum(len(text) for _, text, _, _ in rows), 256 * 1024 + largest)
        after, seen = tail.first - 1, []
        while batch := self.db.journalTexts("big", after, tail.last, 500, 256 * 1024):
            seen += batch
            after = batch[-1][0]
        self.assertEqual([json.loads(text) for _, text, _, _ in seen], self.db.loadJournal("big").updates)
        self.assertTrue(all(sound for _, _, sound, _ in seen))

    def test_aTurnOfManyToolCallsEndsInLinearTime(self) -> None:
        """Linking a turn's tool cards to their messages looks at each card once, not once
        for every tool message of the turn: a turn of 200 calls of 50 KB each took seconds
        of the database thread at its end (every card searched for every output)."""
        from hermes_acp import store

        calls = []
        self.patch(store, "linkedPayload", lambda payload, shared: calls.append(1) or migrations.linkedPayload(
            payload, shared))
        self.newSession(self.db, "many")
        renderer, messages, updates = Renderer("/work"), [{"role": "user", "content": "read them all"}], []
        for n in range(200):
            output = (f"file {n} line " * 400)[:4000]
            messages += [{"role": "assistant", "content": None, "tool_calls": [
                             {"id": f"c{n}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": f"c{n}", "name": "read_file", "content": output}]
            updates += [renderer.toolStarted(f"t-c{n}", "read_file", {}),
                        renderer.toolFinished(f"t-c{n}", "read_file", {}, output, False, {"path": "/work/f"})]
        self.db.beginTurn("many")
        self.db.appendUpdates("many", 1, encoded(updates))
        self.db.endTurn("many", 1, messages)
        self.assertLessEqual(len(calls), 2 * len(updates))
        self.assertEqual(self.db.loadJournal("many").updates, updates)
        raw = sqlite3.connect(self.db.path, isolation_level=None)
        self.addCleanup(raw.close)
        self.assertEqual(raw.execute("SELECT count(*) FROM acp_journal WHERE ref IS NOT NULL").fetchone(), (200,))
