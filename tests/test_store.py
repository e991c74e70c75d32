"""The SQLite session store: round trips, replay caps, listing, fork, delete, migrations,
errors, threads and recovery after kill -9."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp import migrations, store
from hermes_acp.store import (
    INTERRUPTED_CALL,
    INTERRUPTED_TURN,
    Replay,
    SessionDB,
    SessionRecord,
    StoreError,
    UnknownSession,
    searchableText,
    timestamp,
)

ASSISTANT_WITH_TOOLS = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "Let me look at the file first.",
    "reasoning_details": [{"type": "reasoning.text", "text": "look", "signature": None}],
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'},
        }
    ],
}
HISTORY = [
    {"role": "system", "content": "You are hermes."},
    {"role": "user", "content": "Fix the parser, s'il vous plaît 🙂"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this screenshot?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    },
    ASSISTANT_WITH_TOOLS,
    {"role": "tool", "tool_call_id": "call_1", "content": "def parse(): ...\n"},
    {"role": "assistant", "content": "Done: 1.5e-3 margin, 42 lines.", "finish_reason": "stop"},
]


def chunk(text: str, messageId: str | None = None) -> dict:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return update if messageId is None else {**update, "messageId": messageId}


def toolCall(callId: str, status: str = "pending") -> dict:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": callId,
        "title": f"Read {callId}.py",
        "kind": "read",
        "status": status,
    }


def toolUpdate(callId: str, status: str) -> dict:
    return {"sessionUpdate": "tool_call_update", "toolCallId": callId, "status": status}


def size(update: dict) -> int:
    """The bytes one update takes in the journal (compact JSON, UTF-8)."""
    return len(json.dumps(update, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def storedVersion(path: Path) -> str:
    """The schema version recorded in the file, read with a connection of our own."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        (version,) = raw.execute(
            "SELECT value FROM acp_meta WHERE key = 'schema_version'"
        ).fetchone()
    return version


def failed(callId: str) -> dict:
    """What recovery journals for a call an interrupted turn left open."""
    content = [{"type": "content", "content": {"type": "text", "text": INTERRUPTED_CALL}}]
    return {**toolUpdate(callId, "failed"), "content": content}


def interrupted(turn: int) -> dict:
    """The line recovery journals after an interrupted turn's calls."""
    return {"sessionUpdate": "agent_message_chunk", "messageId": f"interrupted-{turn}",
            "content": {"type": "text", "text": f"\n\n_{INTERRUPTED_TURN}_\n"}}


def unprivileged(function):
    """Run ``function`` in a forked child, as user nobody when we are root; return its
    JSON-able result. (Forking, not exec: the interpreter may live where nobody cannot read.)"""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the test runner
        status = 1
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            with os.fdopen(write, "w") as out:
                json.dump(function(), out)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as results:
        text = results.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed"
    return json.loads(text)


def modes(home: Path) -> dict[str, int]:
    """The permission bits of ``home`` and of everything in it."""
    found = {"home": stat.S_IMODE(home.stat().st_mode)}
    found.update((path.name, stat.S_IMODE(path.stat().st_mode)) for path in home.iterdir())
    return found


class StoreTestCase(SynchronousTestCase):
    def tempDir(self) -> Path:
        """A fresh folder removed after the test (mktemp would write below the cwd)."""
        path = Path(tempfile.mkdtemp(prefix="hermes-store-"))
        self.addCleanup(shutil.rmtree, path, ignore_errors=True)
        return path

    def openStore(self, path: Path | None = None) -> SessionDB:
        db = SessionDB(path or self.tempDir() / "home" / "state.db")
        self.addCleanup(db.close)
        return db

    def newSession(self, db: SessionDB, sessionId: str = "s1", cwd: str = "/work", **kw):
        return db.createSession(SessionRecord(sessionId=sessionId, cwd=cwd, **kw))


class OpenTests(StoreTestCase):
    def test_createsFileInWALMode(self) -> None:
        """The file and its folders are created, in WAL mode, at the current schema version,
        with nothing outside the acp_ prefix."""
        path = self.tempDir() / "a" / "b" / "state.db"
        db = self.openStore(path)
        self.assertTrue(path.is_file())
        self.assertEqual(db.journalMode, "wal")
        raw = sqlite3.connect(path)
        self.addCleanup(raw.close)
        self.assertEqual(raw.execute("PRAGMA journal_mode").fetchone(), ("wal",))
        self.assertEqual(storedVersion(path), str(migrations.SCHEMA_VERSION))
        names = [name for (name,) in raw.execute("SELECT name FROM sqlite_master")]
        self.assertTrue(all(name.startswith(("acp_", "sqlite_")) for name in names), names)

    def test_reopenKeepsData(self) -> None:
        """Closing and opening again finds the same sessions; migrations do not run twice."""
        path = self.tempDir() / "state.db"
        with SessionDB(path) as db:
            self.newSession(db, title="kept")
            db.appendMessages("s1", HISTORY)
        db = self.openStore(path)
        self.assertEqual(db.getSession("s1").title, "kept")
        self.assertEqual(db.loadMessages("s1"), HISTORY)

    def test_corruptFile(self) -> None:
        """A file of garbage gives a StoreError naming the file and the remedy."""
        path = self.tempDir() / "state.db"
        path.write_bytes(os.urandom(8192))
        with self.assertRaises(StoreError) as caught:
            SessionDB(path)
        message = str(caught.exception)
        self.assertIn(str(path), message)
        self.assertIn("Move it aside", message)
        self.assertIsInstance(caught.exception.__cause__, sqlite3.DatabaseError)

    def test_parentIsAFile(self) -> None:
        """A HERMES_HOME that is a file, not a folder, gives a StoreError."""
        blocker = self.tempDir() / "home"
        blocker.write_text("not a folder")
        with self.assertRaises(StoreError) as caught:
            SessionDB(blocker / "state.db")
        self.assertIn(str(blocker / "state.db"), str(caught.exception))
        self.assertIn("HERMES_HOME", str(caught.exception))

    def test_readOnlyFolder(self) -> None:
        """A folder we may not write gives a StoreError, whether the file or its folder is
        missing. Root ignores permissions, so as root the check runs in a forked child that
        has become user nobody."""
        top = self.tempDir()
        top.chmod(0o755)
        readOnly = top / "ro"
        readOnly.mkdir()
        readOnly.chmod(0o555)
        self.addCleanup(readOnly.chmod, 0o755)
        paths = [readOnly / "state.db", readOnly / "sub" / "state.db"]

        def tryOpening() -> list[str]:
            results = []
            for path in paths:
                try:
                    SessionDB(path).close()
                    results.append("opened")
                except StoreError as e:
                    results.append(str(e))
            return results

        for path, result in zip(paths, unprivileged(tryOpening)):
            self.assertIn(str(path), result)
            self.assertIn("writable", result)

    def test_privateWhateverTheUmask(self) -> None:
        """A new home is 0700, state.db and its -wal and -shm 0600, under a permissive
        umask or none at all; folders above the home are left to the umask."""
        for umask in (0o022, 0o000, 0o277):
            home = self.tempDir() / "above" / "home"
            old = os.umask(umask)
            try:
                db = self.openStore(home / "state.db")
                self.newSession(db)
            finally:
                os.umask(old)
            self.assertEqual(modes(home), {"home": 0o700, "state.db": 0o600, "state.db-wal": 0o600,
                                           "state.db-shm": 0o600}, oct(umask))
            self.assertEqual(stat.S_IMODE(home.parent.stat().st_mode), 0o777 & ~umask)

    def test_sharedStateIsTightened(self) -> None:
        """An older home, state.db, -wal and -shm that others could read are made
        private on open, and the log says so once for each."""
        home = self.tempDir() / "home"
        with SessionDB(home / "state.db") as db:
            self.newSession(db)
            for path in home.iterdir():  # while it is open, the -wal and -shm exist
                path.chmod(0o664)
            home.chmod(0o755)
            with self.assertLogs("hermes_acp.config", logging.INFO) as logged:
                self.assertEqual(self.openStore(home / "state.db").getSession("s1").sessionId, "s1")
            self.assertEqual(modes(home), {"home": 0o700, "state.db": 0o600, "state.db-wal": 0o600,
                                           "state.db-shm": 0o600})
        said = [record.getMessage() for record in logged.records]
        self.assertEqual(len(said), 4, said)
        self.assertTrue(all("it is now private" in line for line in said), said)
        self.assertIn(f"{home / 'state.db-wal'} could be read by others (mode 0664)", said[2])
        with self.assertNoLogs("hermes_acp.config", logging.INFO):
            self.openStore(home / "state.db")

    def test_closedStore(self) -> None:
        """Using a closed store raises StoreError, not a raw sqlite3 error."""
        db = SessionDB(self.tempDir() / "state.db")
        db.close()
        db.close()
        self.assertRaises(StoreError, db.getSession, "s1")

    def test_timestampForm(self) -> None:
        """Stored times are UTC with microseconds and Z, whatever form they came in."""
        self.assertEqual(timestamp("2026-01-02T03:04:05+02:00"), "2026-01-02T01:04:05.000000Z")
        self.assertEqual(timestamp("2026-01-02T03:04:05Z"), "2026-01-02T03:04:05.000000Z")
        self.assertEqual(timestamp("2026-01-02 03:04:05.5"), "2026-01-02T03:04:05.500000Z")


class MessageTests(StoreTestCase):
    def test_roundTrip(self) -> None:
        """Messages come back exactly: multimodal lists, tool calls, reasoning fields, numbers
        and non-ASCII text; an unpaired surrogate and a NaN come back as U+FFFD and null,
        which every later request can carry."""
        db = self.openStore()
        self.newSession(db)
        odd = {"role": "tool", "tool_call_id": "call_2", "content": "bad byte: \udcff", "n": float("nan")}
        self.assertEqual(db.appendMessages("s1", HISTORY[:3]), 3)
        self.assertEqual(db.appendMessages("s1", [*HISTORY[3:], odd]), len(HISTORY) + 1)
        loaded = db.loadMessages("s1")
        self.assertEqual(loaded, [*HISTORY, {"role": "tool", "tool_call_id": "call_2", "content": "bad byte: \ufffd", "n": None}])
        self.assertEqual(list(loaded[3]), list(ASSISTANT_WITH_TOOLS))  # key order too
        self.assertEqual(db.getSession("s1").messageCount, len(HISTORY) + 1)

    def test_replace(self) -> None:
        """replaceMessages swaps the model's history (/reset); the old messages stay found."""
        db = self.openStore()
        self.newSession(db)
        db.appendMessages("s1", HISTORY)
        summary = [{"role": "user", "content": "Summary of the conversation so far: kumquat"}]
        self.assertEqual(db.replaceMessages("s1", summary), 1)
        self.assertEqual(db.loadMessages("s1"), summary)
        self.assertEqual(db.getSession("s1").messageCount, 1)
        self.assertEqual(len(db.searchMessages("screenshot")), 1)
        self.assertEqual([hit["seq"] for hit in db.searchMessages("kumquat")], [0])
        self.assertEqual(db.replaceMessages("s1", []), 0)
        self.assertEqual((db.loadMessages("s1"), len(db.searchMessages("kumquat"))), ([], 1))

    def test_unknownSession(self) -> None:
        """Writes and loads name the unknown session; getSession just says None."""
        db = self.openStore()
        self.assertIsNone(db.getSession("nope"))
        self.assertRaises(UnknownSession, db.appendMessages, "nope", HISTORY)
        self.assertRaises(UnknownSession, db.loadMessages, "nope")
        self.assertRaises(UnknownSession, db.appendUpdates, "nope", 0, [chunk("x")])
        self.assertRaises(UnknownSession, db.loadJournal, "nope")
        self.assertRaises(UnknownSession, db.beginTurn, "nope")
        self.assertRaises(UnknownSession, db.updateSession, "nope", title="x")
        self.assertEqual(str(UnknownSession("nope")), "unknown session 'nope'")

    def test_searchableText(self) -> None:
        """Text of user, assistant and tool messages counts, with list parts and tool calls."""
        self.assertIsNone(searchableText(HISTORY[0]))
        self.assertEqual(searchableText(HISTORY[2]), "What is in this screenshot?")
        self.assertEqual(
            searchableText(ASSISTANT_WITH_TOOLS), 'read_file\n{"path": "src/app.py"}'
        )
        self.assertIsNone(searchableText({"role": "assistant", "content": ""}))


class SearchTests(StoreTestCase):
    def setUp(self) -> None:
        self.db = self.openStore()
        self.newSession(self.db, "s1", title="Parser work")
        self.db.appendMessages("s1", HISTORY)
        self.newSession(self.db, "s2", title="Café notes")
        self.db.appendMessages(
            "s2",
            [
                {"role": "user", "content": "Where is the café with the foo bar?"},
                {"role": "assistant", "content": "foo foo foo bar, near the station"},
            ],
        )

    def test_findsWords(self) -> None:
        """Hits carry the session, its title, role, message index and a marked snippet."""
        hits = self.db.searchMessages("screenshot")
        self.assertEqual(len(hits), 1)
        hit = hits[0]
        self.assertEqual(
            (hit["sessionId"], hit["title"], hit["role"], hit["seq"]),
            ("s1", "Parser work", "user", 2),
        )
        self.assertIn("**screenshot**", hit["snippet"])
        self.assertEqual(hit["updatedAt"], self.db.getSession("s1").updatedAt)
        # Tool call arguments and tool output are searched; system prompts are not.
        self.assertEqual([h["role"] for h in self.db.searchMessages("src app")], ["assistant"])
        self.assertEqual([h["role"] for h in self.db.searchMessages("parse")], ["tool"])
        self.assertEqual(self.db.searchMessages("hermes"), [])
        # Diacritics are folded.
        self.assertEqual([h["sessionId"] for h in self.db.searchMessages("cafe")], ["s2"])

    def test_rankAndLimit(self) -> None:
        """bm25 puts the denser match first; limit caps the hits."""
        hits = self.db.searchMessages("foo")
        self.assertEqual([h["role"] for h in hits], ["assistant", "user"])
        self.assertEqual(len(self.db.searchMessages("foo", limit=1)), 1)
        self.assertRaises(ValueError, self.db.searchMessages, "foo", limit=0)

    def test_oddSyntax(self) -> None:
        """Quotes, brackets and operator words are not FTS5 syntax errors."""
        hits = self.db.searchMessages('foo"bar AND (')
        self.assertEqual({h["seq"] for h in hits}, {0, 1})
        self.assertEqual(self.db.searchMessages('"* ( ) : ^ -'), [])
        self.assertEqual(self.db.searchMessages(""), [])
        self.assertEqual(len(self.db.searchMessages("NEAR(foo station)")), 1)


    def test_projectScope(self) -> None:
        """With a cwd, only sessions in that folder or below it are searched (after
        realpath); a sibling whose name merely starts the same is another project, and
        LIKE wildcards in a folder name are plain characters. Hits name their cwd."""
        top = self.tempDir()
        folders = {name: top / name for name in ("a", "a/sub", "ab", "a-b", "a_", "a%")}
        for folder in folders.values():
            folder.mkdir(parents=True)
        (top / "link").symlink_to(folders["a"])
        for name, folder in folders.items():
            self.newSession(self.db, f"in {name}", cwd=str(folder))
            self.db.appendMessages(f"in {name}", [{"role": "user", "content": "the aardvark"}])

        def found(cwd: object) -> set[str]:
            hits = self.db.searchMessages("aardvark", 50, None if cwd is None else str(cwd))
            return {hit["sessionId"] for hit in hits}

        self.assertEqual(found(folders["a"]), {"in a", "in a/sub"})
        self.assertEqual(found(top / "link"), {"in a", "in a/sub"})
        self.assertEqual(found(folders["a/sub"]), {"in a/sub"})
        self.assertEqual(found(folders["a_"]), {"in a_"})
        self.assertEqual(found(folders["a%"]), {"in a%"})
        self.assertEqual(found(top), {f"in {name}" for name in folders})
        self.assertEqual(found("/"), found(None))
        self.assertEqual(found(top / "elsewhere"), set())
        [hit] = self.db.searchMessages("aardvark", 50, str(folders["ab"]))
        self.assertEqual(hit["cwd"], str(folders["ab"]))


class JournalTests(StoreTestCase):
    def test_appendAndLoad(self) -> None:
        """Updates keep their order and exact shape; seq numbers continue across batches."""
        db = self.openStore()
        self.newSession(db)
        first = [chunk("héllo"), toolCall("t1"), toolUpdate("t1", "completed")]
        self.assertEqual(db.appendUpdates("s1", 1, first), 3)
        self.assertEqual(db.appendUpdates("s1", 1, []), 3)
        plan = {
            "sessionUpdate": "plan",
            "entries": [{"content": "a", "priority": "high", "status": "pending"}],
        }
        self.assertEqual(db.appendUpdates("s1", 2, [plan]), 4)
        self.assertEqual(db.loadJournal("s1"), Replay([*first, plan], 0, 0))
        self.assertFalse(db.loadJournal("s1").truncated)

    def test_sentUpdatesKeepTheirText(self) -> None:
        """An update already encoded for the wire (``safejson.Encoded``) is journaled as that
        text, not encoded again; it loads as the same update (a lone surrogate as U+FFFD)."""
        from hermes_acp import safejson

        db = self.openStore()
        self.newSession(db)
        update = chunk("h\ud800llo")
        sent = safejson.Encoded(update, safejson.encode(update))
        db.appendUpdates("s1", 1, [sent])
        self.assertEqual(db.loadJournal("s1").updates, [chunk("h\ufffdllo")])

    def test_aStreamedMessageIsOneRowPerBatch(self) -> None:
        """Consecutive text chunks of one message (same kind, same ``messageId``) are journaled
        as one chunk of their text, up to ``MERGED_TEXT`` characters; anything else between
        them, another message or kind, a chunk with more than its text, keeps them apart. The
        replay shows the same text in the same order."""
        from hermes_acp import safejson
        from hermes_acp.store import MERGED_TEXT

        def sent(update: dict) -> dict:
            return safejson.Encoded(update, safejson.encode(update))

        thought = {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}, "messageId": "a"}
        prompt = [{"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": t}, "messageId": "u"}
                  for t in ("Look at", "this")]  # (two blocks the user wrote: kept apart)
        tagged = {**chunk("child", "a"), "_meta": {"x": 1}}
        image = {"sessionUpdate": "agent_message_chunk", "messageId": "a",
                 "content": {"type": "text", "text": "lo", "annotations": {"priority": 1}}}
        big = "z" * (MERGED_TEXT - 10)
        updates = (prompt + [sent(chunk(t, "a")) for t in ("He", "l", "lo", " wo\ud800")] + [thought, chunk("rld", "a")]
                   + [toolCall("t1"), chunk("after ", "b"), chunk("the call", "b"), chunk("other", "c"),
                      tagged, chunk("x", "c"), image, chunk(big, "d"), chunk("0123456789", "d"), chunk("!", "d")])
        db = self.openStore()
        self.newSession(db)
        self.assertEqual(db.appendUpdates("s1", 1, updates), 13)
        self.assertEqual(db.loadJournal("s1").updates, [
            *prompt, chunk("Hello wo\ufffd", "a"), thought, chunk("rld", "a"), toolCall("t1"), chunk("after the call", "b"),
            chunk("other", "c"), tagged, chunk("x", "c"), image, chunk(big + "0123456789", "d"), chunk("!", "d")])

    def test_rejectsNonUpdates(self) -> None:
        """Only session/update objects are journaled; a bad batch writes nothing."""
        db = self.openStore()
        self.newSession(db)
        self.assertRaises(ValueError, db.appendUpdates, "s1", 1, [chunk("a"), {"text": "x"}])
        self.assertRaises(ValueError, db.appendUpdates, "s1", 1, ["agent_message_chunk"])
        self.assertEqual(db.loadJournal("s1").updates, [])

    def test_countCap(self) -> None:
        """Over maxCount, the newest updates are kept and the rest counted as omitted."""
        db = self.openStore()
        self.newSession(db)
        updates = [chunk(f"part {n}", f"m{n}") for n in range(10)]  # (one row each)
        db.appendUpdates("s1", 1, updates)
        replay = db.loadJournal("s1", maxCount=4)
        self.assertEqual(replay.updates, updates[6:])
        self.assertEqual(replay.omittedCount, 6)
        self.assertEqual(replay.omittedBytes, sum(size(u) for u in updates[:6]))
        self.assertTrue(replay.truncated)

    def test_byteCap(self) -> None:
        """Over maxBytes, whole older updates go first; the kept tail fits the cap."""
        db = self.openStore()
        self.newSession(db)
        updates = [chunk("x" * (n * 37 % 300) + "é", f"m{n}") for n in range(40)]
        db.appendUpdates("s1", 1, updates)
        cap = 2500
        replay = db.loadJournal("s1", maxBytes=cap)
        kept = len(replay.updates)
        self.assertEqual(replay.updates, updates[-kept:])
        self.assertLessEqual(sum(size(u) for u in replay.updates), cap)
        self.assertGreater(sum(size(u) for u in updates[-kept - 1 :]), cap)
        self.assertEqual(replay.omittedCount, 40 - kept)
        self.assertEqual(replay.omittedBytes, sum(size(u) for u in updates[: 40 - kept]))
        # Both caps: the tighter wins.
        self.assertEqual(db.loadJournal("s1", maxCount=2, maxBytes=cap).updates, updates[-2:])

    def test_newestTooBig(self) -> None:
        """A newest update larger than maxBytes leaves nothing to replay (never half of it)."""
        db = self.openStore()
        self.newSession(db)
        updates = [chunk("small", "m1"), chunk("y" * 5000, "m2")]
        db.appendUpdates("s1", 1, updates)
        replay = db.loadJournal("s1", maxBytes=1000)
        self.assertEqual(replay, Replay([], 2, sum(size(u) for u in updates)))

    def test_longSession(self) -> None:
        """A 100-turn session with 20 updates a turn loads whole and in order, and its tail
        under caps. (Timing is for bench/, not asserted here.)"""
        db = self.openStore()
        self.newSession(db)
        for turn in range(1, 101):
            self.assertEqual(db.beginTurn("s1"), turn)
            updates = [{"sessionUpdate": "user_message_chunk",
                        "content": {"type": "text", "text": f"prompt {turn}"}}]  # fmt: skip
            for n in range(4):
                callId = f"t{turn}.{n}"
                updates += [
                    chunk(f"turn {turn} step {n} " + "lorem ipsum " * 20),
                    toolCall(callId),
                    toolUpdate(callId, "in_progress"),
                    {**toolUpdate(callId, "completed"),
                     "content": [{"type": "content", "content": {"type": "text",
                                                                 "text": "ok " * 100}}]},
                ]  # fmt: skip
            updates += [chunk(f"answer {turn}"), {"sessionUpdate": "usage_update",
                                                  "used": turn * 1000, "size": 200000},
                        {"sessionUpdate": "session_info_update", "title": f"T{turn}"}]  # fmt: skip
            self.assertEqual(len(updates), 20)
            db.appendUpdates("s1", turn, updates[:10])
            db.appendUpdates("s1", turn, updates[10:])
            messages = [
                {"role": "user", "content": f"prompt {turn}"},
                {**ASSISTANT_WITH_TOOLS, "content": f"step {turn}"},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok " * 100},
                {"role": "assistant", "content": f"answer {turn}"},
            ]
            db.endTurn("s1", turn, messages)
        record = db.getSession("s1")
        self.assertEqual((record.turn, record.turnState, record.messageCount), (100, "idle", 400))
        messages = db.loadMessages("s1")
        self.assertEqual(len(messages), 400)
        self.assertEqual(messages[-1], {"role": "assistant", "content": "answer 100"})
        replay = db.loadJournal("s1")
        self.assertEqual(len(replay.updates), 2000)
        texts = [u["content"]["text"] for u in replay.updates
                 if u["sessionUpdate"] == "user_message_chunk"]  # fmt: skip
        self.assertEqual(texts, [f"prompt {turn}" for turn in range(1, 101)])
        tail = db.loadJournal("s1", maxCount=500, maxBytes=10**9)
        self.assertEqual(tail.updates, replay.updates[-500:])
        self.assertEqual(tail.omittedCount, 1500)


class ReplayCapProperties(StoreTestCase):
    def setUp(self) -> None:
        self.db = self.openStore()

    @settings(max_examples=60, deadline=None)
    @given(
        lengths=st.lists(st.integers(0, 400), max_size=30),
        maxCount=st.none() | st.integers(0, 35),
        maxBytes=st.none() | st.integers(0, 6000),
    )
    def test_tailIsLongestWithinCaps(self, lengths, maxCount, maxBytes) -> None:
        """For any sizes and caps, the replay is the longest suffix within both caps, and
        kept + omitted add up to the whole journal."""
        db, sessionId = self.db, uuid.uuid4().hex  # one store for all examples
        self.newSession(db, sessionId)
        updates = [chunk("ü" * length, f"m{n}") for n, length in enumerate(lengths)]
        db.appendUpdates(sessionId, 1, updates)
        replay = db.loadJournal(sessionId, maxCount=maxCount, maxBytes=maxBytes)

        def fits(tail: list[dict]) -> bool:
            return (maxCount is None or len(tail) <= maxCount) and (
                maxBytes is None or sum(size(u) for u in tail) <= maxBytes
            )

        kept = max(n for n in range(len(updates) + 1) if fits(updates[len(updates) - n :]))
        self.assertEqual(replay.updates, updates[len(updates) - kept :])
        self.assertEqual(replay.omittedCount, len(updates) - kept)
        self.assertEqual(replay.omittedBytes, sum(size(u) for u in updates[: len(updates) - kept]))


class ListTests(StoreTestCase):
    def setUp(self) -> None:
        self.db = self.openStore()
        top = self.tempDir()
        self.projectA, self.projectB = top / "a", top / "b"
        self.projectA.mkdir()
        self.projectB.mkdir()
        self.linkToA = top / "link"
        self.linkToA.symlink_to(self.projectA)
        # Seven sessions; s3 and s4 share a time, so the id breaks the tie.
        times = ["01", "02", "03", "03", "05", "06", "07"]
        for n, minute in enumerate(times):
            cwd = self.projectA if n % 2 == 0 else self.projectB
            self.newSession(
                self.db, f"s{n}", str(cwd), title=f"title {n}",
                createdAt=f"2026-01-01T00:{minute}:00Z",
            )  # fmt: skip
        self.newestFirst = ["s6", "s5", "s4", "s3", "s2", "s1", "s0"]

    def pages(self, **kw) -> list[list[str]]:
        found, cursor = [], None
        while True:
            records, cursor = self.db.listSessions(cursor=cursor, **kw)
            found.append([r.sessionId for r in records])
            if cursor is None:
                return found

    def test_paginates(self) -> None:
        """Pages follow one another newest first, with the id breaking ties, then stop."""
        self.assertEqual(
            self.pages(limit=3), [["s6", "s5", "s4"], ["s3", "s2", "s1"], ["s0"]]
        )
        self.assertEqual(self.pages(limit=7), [self.newestFirst])
        self.assertEqual(self.pages(), [self.newestFirst])
        record = self.db.listSessions(limit=1)[0][0]
        self.assertEqual((record.title, record.cwd), ("title 6", str(self.projectA)))
        self.assertEqual(record.updatedAt, "2026-01-01T00:07:00.000000Z")

    def test_cwdFilter(self) -> None:
        """The cwd filter matches the same folder through symlinks and trailing slashes."""
        inA = ["s6", "s4", "s2", "s0"]
        self.assertEqual(self.pages(cwd=str(self.projectA), limit=3), [inA[:3], inA[3:]])
        self.assertEqual(self.pages(cwd=str(self.linkToA) + "/"), [inA])
        self.assertEqual(self.pages(cwd=str(self.projectB)), [["s5", "s3", "s1"]])
        self.assertEqual(self.pages(cwd=str(self.projectB / "sub")), [[]])

    def test_activityMovesToTop(self) -> None:
        """New messages or a new title bring a session to the top; an explicit updatedAt does
        not."""
        self.db.appendMessages("s0", [{"role": "user", "content": "again"}])
        self.assertEqual(self.pages()[0][:2], ["s0", "s6"])
        old = self.db.getSession("s5").updatedAt
        self.db.updateSession("s5", title="renamed", updatedAt=old)
        self.assertEqual(self.pages()[0][:3], ["s0", "s6", "s5"])
        self.db.updateSession("s5", title="renamed again")
        self.assertEqual(self.pages()[0][0], "s5")

    def test_startedOnly(self) -> None:
        """``started`` keeps the sessions with a title or messages, with their pages and
        filters; the others are still there by id."""
        self.newSession(self.db, "bare", str(self.projectA), createdAt="2026-01-01T00:08:00Z")
        self.newSession(self.db, "talked", str(self.projectA), createdAt="2026-01-01T00:09:00Z")
        self.db.appendMessages("talked", [{"role": "user", "content": "hi"}])
        self.assertEqual(self.pages()[0][:2], ["talked", "bare"])
        self.assertEqual(self.pages(started=True, limit=4), [["talked", "s6", "s5", "s4"], ["s3", "s2", "s1", "s0"]])
        self.assertEqual(self.pages(started=True, cwd=str(self.projectA)), [["talked", "s6", "s4", "s2", "s0"]])
        self.assertIsNotNone(self.db.getSession("bare"))

    def test_invalidCursor(self) -> None:
        """A cursor the store did not make is a ValueError; so is a page size below 1."""
        bad = [
            "not base64!",
            "%%%",
            base64.urlsafe_b64encode(b"\xff\xfe").decode(),
            base64.urlsafe_b64encode(b'{"a": 1}').decode(),
            base64.urlsafe_b64encode(b'["x", 2]').decode(),
        ]
        for cursor in bad:
            self.assertRaises(ValueError, self.db.listSessions, cursor=cursor)
        self.assertRaises(ValueError, self.db.listSessions, limit=0)


class UpdateTests(StoreTestCase):
    def test_fields(self) -> None:
        """updateSession changes the named settings and only those."""
        db = self.openStore()
        created = self.newSession(db, config={"a": 1}, additionalDirectories=["/x"])
        updated = db.updateSession(
            "s1", title="T", model="m", mode="plan", config={"b": [1, 2]},
            cwd="/elsewhere", additionalDirectories=("/y", "/z"),
        )  # fmt: skip
        self.assertEqual(updated, db.getSession("s1"))
        self.assertEqual(
            (updated.title, updated.model, updated.mode, updated.config, updated.cwd,
             updated.additionalDirectories),
            ("T", "m", "plan", {"b": [1, 2]}, "/elsewhere", ("/y", "/z")),
        )  # fmt: skip
        self.assertGreater(updated.updatedAt, created.updatedAt)
        self.assertEqual(updated.createdAt, created.createdAt)
        self.assertEqual(db.listSessions(cwd="/elsewhere")[0], [updated])
        self.assertRaises(TypeError, db.updateSession, "s1", turnState="idle")

    def test_duplicateId(self) -> None:
        db = self.openStore()
        self.newSession(db)
        self.assertRaises(ValueError, self.newSession, db)


class TurnTests(StoreTestCase):
    def test_turnLifecycle(self) -> None:
        """beginTurn numbers turns and marks them running; endTurn saves and idles."""
        db = self.openStore()
        self.newSession(db)
        turn = db.beginTurn("s1")
        self.assertEqual((turn, db.getSession("s1").turnState), (1, "running"))
        self.assertRaises(ValueError, db.beginTurn, "s1")
        self.assertRaises(ValueError, db.endTurn, "s1", 2, HISTORY)
        self.assertEqual(db.endTurn("s1", turn, HISTORY), len(HISTORY))
        self.assertEqual(db.getSession("s1").turnState, "idle")
        self.assertRaises(ValueError, db.endTurn, "s1", turn, HISTORY)
        self.assertEqual(db.loadMessages("s1"), HISTORY)
        self.assertEqual(db.beginTurn("s1"), 2)

    def test_compactionArchivesAndStaysSearchable(self) -> None:
        """endTurn with a compaction's history: that is the model's history from now on; the
        old one and the turn's own messages stay findable, each once; a second compaction and
        a fork keep working; the journal's last usage gives the context used and the cost."""
        db = self.openStore()
        self.newSession(db)
        first = [{"role": "user", "content": "find the kumquat"}, {"role": "assistant", "content": "in the crate"}]
        db.endTurn("s1", db.beginTurn("s1"), first)
        turn = [{"role": "user", "content": "and the persimmon"}, {"role": "assistant", "content": "on the shelf"}]
        compacted = [{"role": "user", "content": "[summary] fruit", "compaction": "c1"}, *turn]
        self.assertEqual(db.endTurn("s1", db.beginTurn("s1"), turn, compacted), 3)
        self.assertEqual(db.loadMessages("s1"), compacted)
        self.assertEqual(db.getSession("s1").messageCount, 3)
        for word in ("kumquat", "persimmon", "shelf"):
            self.assertEqual(len(db.searchMessages(word)), 1, word)
        self.assertEqual(db.searchMessages("summary"), [])
        later = [{"role": "user", "content": "now the quince"}]
        again = [{"role": "user", "content": "[summary] more fruit", "compaction": "c2"}, *later]
        self.assertEqual(db.endTurn("s1", db.beginTurn("s1"), later, again), 2)
        self.assertEqual(db.loadMessages("s1"), again)
        for word in ("kumquat", "persimmon", "quince"):
            self.assertEqual(len(db.searchMessages(word)), 1, word)
        db.appendMessages("s1", [{"role": "assistant", "content": "quince found"}])
        self.assertEqual([m["content"] for m in db.loadMessages("s1")][-1], "quince found")
        db.forkSession("s1", "s2", "/work")
        self.assertEqual(db.loadMessages("s2"), db.loadMessages("s1"))
        self.assertEqual(sorted(h["sessionId"] for h in db.searchMessages("kumquat")), ["s1", "s2"])
        self.assertEqual(db.lastUsage("s1"), (0, None))
        db.appendUpdates("s1", 3, [{"sessionUpdate": "usage_update", "used": 900, "size": 8000,
                                    "cost": {"amount": 0.0125, "currency": "USD"}}])
        self.assertEqual(db.lastUsage("s1"), (900, 0.0125))

    def test_endTurnIsDurable(self) -> None:
        """What endTurn saved is there for the next process."""
        path = self.tempDir() / "state.db"
        db = SessionDB(path)
        self.newSession(db)
        db.endTurn("s1", db.beginTurn("s1"), HISTORY)
        other = self.openStore(path)  # a second connection, as another process would have
        self.assertEqual(other.loadMessages("s1"), HISTORY)
        db.close()

    def test_recoverNothingRunning(self) -> None:
        """An idle session needs no recovery."""
        db = self.openStore()
        self.newSession(db)
        db.appendUpdates("s1", 0, [toolCall("t1")])
        self.assertEqual(db.recoverInterrupted("s1"), [])
        self.assertEqual(db.getSession("s1").turnState, "idle")

    def test_recoverFinalStatuses(self) -> None:
        """Only calls without a completed/failed status are failed, in the order they began;
        a tool_call born final needs nothing, an update for an unknown call is ignored."""
        db = self.openStore()
        self.newSession(db)
        turn = db.beginTurn("s1")
        db.appendUpdates(
            "s1",
            turn,
            [toolCall("b"), toolCall("a"), toolCall("done", "completed"),
             toolUpdate("ghost", "in_progress"), toolCall("c"), toolUpdate("c", "failed"),
             toolUpdate("a", "in_progress"), chunk('"sessionUpdate":"tool_call" in text')],
        )  # fmt: skip
        recovered = [failed("b"), failed("a"), interrupted(turn)]
        self.assertEqual(db.recoverInterrupted("s1"), recovered)
        self.assertEqual(db.loadJournal("s1").updates[-3:], recovered)
        self.assertEqual(db.getSession("s1").turnState, "interrupted")
        self.assertEqual(db.beginTurn("s1"), 2)

    def test_liveOwnerIsLeftAlone(self) -> None:
        """A turn whose owner is alive (another process running it) is not recovered:
        nothing is journaled, it stays running, and None says so."""
        db = self.openStore()
        self.newSession(db)
        turn = db.beginTurn("s1", owner="elsewhere")
        db.appendUpdates("s1", turn, [toolCall("t1")])
        self.assertEqual(db.getSession("s1").turnOwner, "elsewhere")
        self.assertIsNone(db.recoverInterrupted("s1", ownerAlive=lambda owner: owner == "elsewhere"))
        self.assertEqual(db.getSession("s1").turnState, "running")
        self.assertEqual(db.loadJournal("s1").updates, [toolCall("t1")])
        self.assertEqual(db.recoverInterrupted("s1"), [failed("t1"), interrupted(turn)])
        self.assertEqual(db.getSession("s1").turnOwner, None)

    def test_interruptedTurnJoinsTheHistory(self) -> None:
        """The model's history gets the interrupted turn as the editor shows it: the
        user's words, the answer so far, and each call with how it ended."""
        db = self.openStore()
        self.newSession(db)
        turn = db.beginTurn("s1")
        db.appendUpdates("s1", turn, [
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "fix the build"}},
            {"sessionUpdate": "user_message_chunk", "content": {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"}},
            chunk("Looking at it."), toolCall("t1"), toolUpdate("t1", "completed"), toolCall("t2"),
        ])  # fmt: skip
        db.recoverInterrupted("s1")
        user, assistant = db.loadMessages("s1")
        self.assertEqual(user, {"role": "user", "content": "fix the build\n[Attached: a.py]"})
        self.assertEqual(assistant["role"], "assistant")
        self.assertTrue(assistant["content"].startswith("Looking at it."), assistant)
        self.assertIn(INTERRUPTED_TURN, assistant["content"])
        self.assertIn(": completed", assistant["content"])
        self.assertIn(": not completed", assistant["content"])


CRASHING_CHILD = """
import sqlite3, sys, time
from hermes_acp.store import SessionDB, SessionRecord

path = sys.argv[1]
db = SessionDB(path)
db.createSession(SessionRecord("s1", "/work"))
db.appendMessages("s1", [{"role": "user", "content": "earlier"}])
turn = db.beginTurn("s1")
db.appendUpdates("s1", turn, [
    {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "go"}},
    {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read a.py", "status": "pending"},
    {"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "Read b.py", "status": "pending"},
    {"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "completed"},
    {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"},
])
# A write transaction left open when the process dies must vanish and release its lock.
raw = sqlite3.connect(path, isolation_level=None)
raw.execute("BEGIN IMMEDIATE")
raw.execute(
    "INSERT INTO acp_journal (session_id, seq, turn, payload, nbytes) VALUES (?, ?, ?, ?, ?)",
    ("s1", 99, turn, '{"sessionUpdate":"tool_call","toolCallId":"t3","title":"x"}', 60),
)
sys.stdout.write("ready\\n")
sys.stdout.flush()
time.sleep(120)
"""


class CrashTests(StoreTestCase):
    def test_killedMidTurn(self) -> None:
        """kill -9 during a turn: the next open finds it running; recovery fails exactly the
        open tool call, marks the turn interrupted, and the uncommitted write is gone."""
        path = self.tempDir() / "state.db"
        child = subprocess.Popen(
            [sys.executable, "-c", CRASHING_CHILD, str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(child.stdout.close)
        self.assertEqual(child.stdout.readline(), "ready\n")
        os.kill(child.pid, signal.SIGKILL)
        self.assertEqual(child.wait(timeout=30), -signal.SIGKILL)

        db = self.openStore(path)
        record = db.getSession("s1")
        self.assertEqual((record.turnState, record.turn), ("running", 1))
        self.assertEqual(len(db.loadJournal("s1").updates), 5)
        self.assertEqual(db.recoverInterrupted("s1"), [failed("t1"), interrupted(1)])
        record = db.getSession("s1")
        self.assertEqual(record.turnState, "interrupted")
        replay = db.loadJournal("s1")
        self.assertEqual(len(replay.updates), 7)
        self.assertEqual(replay.updates[-2:], [failed("t1"), interrupted(1)])
        earlier, user, answer = db.loadMessages("s1")
        self.assertEqual((earlier, user), ({"role": "user", "content": "earlier"}, {"role": "user", "content": "go"}))
        self.assertIn("Read a.py: not completed", answer["content"])
        self.assertEqual(db.recoverInterrupted("s1"), [])
        self.assertEqual(db.beginTurn("s1"), 2)


class ForkTests(StoreTestCase):
    def setUp(self) -> None:
        self.db = self.openStore()
        self.newSession(self.db, "src", "/work", title="Original", model="m1", config={"k": 1})
        turn = self.db.beginTurn("src")
        self.db.appendUpdates("src", turn, [chunk("one"), toolCall("t1"),
                                            toolUpdate("t1", "completed")])  # fmt: skip
        self.db.endTurn("src", turn, HISTORY)

    def test_copies(self) -> None:
        """The fork has the source's history, journal and settings, under its own cwd."""
        fork = self.db.forkSession("src", "dst", "/elsewhere", ["/extra"])
        source = self.db.getSession("src")
        self.assertEqual(
            (fork.sessionId, fork.cwd, fork.additionalDirectories, fork.title, fork.model,
             fork.config, fork.messageCount, fork.turn, fork.turnState),
            ("dst", "/elsewhere", ("/extra",), "Original", "m1", {"k": 1}, len(HISTORY), 1,
             "idle"),
        )  # fmt: skip
        self.assertEqual(self.db.loadMessages("dst"), HISTORY)
        self.assertEqual(self.db.loadJournal("dst"), self.db.loadJournal("src"))
        self.assertEqual(source.cwd, "/work")
        self.assertEqual({h["sessionId"] for h in self.db.searchMessages("screenshot")},
                         {"src", "dst"})  # fmt: skip

    def test_independent(self) -> None:
        """Appending to either side after the fork leaves the other side as it was."""
        before = (self.db.loadMessages("src"), self.db.loadJournal("src"))
        self.db.forkSession("src", "dst", "/elsewhere")
        turn = self.db.beginTurn("dst")
        self.db.appendUpdates("dst", turn, [chunk("fork only")])
        self.db.endTurn("dst", turn, [{"role": "user", "content": "fork only"}])
        self.db.updateSession("dst", title="Forked")
        self.assertEqual((self.db.loadMessages("src"), self.db.loadJournal("src")), before)
        self.assertEqual(self.db.getSession("src").title, "Original")

        self.db.appendMessages("src", [{"role": "user", "content": "source only"}])
        self.db.appendUpdates("src", 1, [chunk("source only")])
        self.assertEqual(self.db.loadMessages("dst")[-1]["content"], "fork only")
        self.assertEqual(self.db.loadJournal("dst").updates[-1], chunk("fork only"))
        self.db.deleteSession("src")
        self.assertEqual(len(self.db.loadMessages("dst")), len(HISTORY) + 1)

    def test_forkWhileRunning(self) -> None:
        """Forking mid-turn: the copy's open calls are failed; the source keeps running."""
        turn = self.db.beginTurn("src")
        self.db.appendUpdates("src", turn, [toolCall("t2")])
        fork = self.db.forkSession("src", "dst", "/elsewhere")
        self.assertEqual(fork.turnState, "interrupted")
        self.assertEqual(self.db.loadJournal("dst").updates[-2:], [failed("t2"), interrupted(turn)])
        self.assertEqual(self.db.getSession("src").turnState, "running")
        self.assertEqual(self.db.loadJournal("src").updates[-1], toolCall("t2"))

    def test_errors(self) -> None:
        self.assertRaises(UnknownSession, self.db.forkSession, "nope", "dst", "/x")
        self.assertRaises(ValueError, self.db.forkSession, "src", "src", "/x")


class DeleteTests(StoreTestCase):
    def test_delete(self) -> None:
        """Deleting removes the session, its messages, index entries and journal."""
        path = self.tempDir() / "state.db"
        db = self.openStore(path)
        for sessionId in ("keep", "gone"):
            self.newSession(db, sessionId)
            db.appendMessages(sessionId, HISTORY)
            db.appendUpdates(sessionId, 1, [chunk("x"), toolCall("t1")])
        db.deleteSession("gone")
        self.assertIsNone(db.getSession("gone"))
        self.assertEqual([r.sessionId for r in db.listSessions()[0]], ["keep"])
        self.assertRaises(UnknownSession, db.loadJournal, "gone")
        self.assertEqual({h["sessionId"] for h in db.searchMessages("screenshot")}, {"keep"})
        raw = sqlite3.connect(path, isolation_level=None)
        self.addCleanup(raw.close)
        for table in ("acp_sessions", "acp_messages", "acp_journal"):
            (left,) = raw.execute(
                f"SELECT count(*) FROM {table} WHERE session_id = 'gone'"
            ).fetchone()
            self.assertEqual(left, 0, table)
        # The index agrees with the remaining rows (FTS5 checks it against acp_messages).
        raw.execute("INSERT INTO acp_messages_fts (acp_messages_fts, rank) "
                    "VALUES ('integrity-check', 1)")  # fmt: skip
        # The same id can start again, empty.
        db.deleteSession("gone")
        db.deleteSession("never-was")
        self.assertEqual(self.newSession(db, "gone").messageCount, 0)
        self.assertEqual(db.loadJournal("gone").updates, [])


# The v1 schema exactly as released, frozen here so that the migration test keeps proving that
# a real v1 file upgrades, whatever later edits do to hermes_acp.migrations.
V1_DDL = """
CREATE TABLE acp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE acp_sessions (session_id TEXT PRIMARY KEY, cwd TEXT NOT NULL,
  additional_directories TEXT NOT NULL DEFAULT '[]', title TEXT, model TEXT, mode TEXT,
  config TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
  turn_state TEXT NOT NULL DEFAULT 'idle'
    CHECK (turn_state IN ('idle', 'running', 'interrupted')),
  turn INTEGER NOT NULL DEFAULT 0, message_count INTEGER NOT NULL DEFAULT 0);
CREATE INDEX acp_sessions_updated ON acp_sessions (updated_at DESC, session_id DESC);
CREATE TABLE acp_messages (id INTEGER PRIMARY KEY,
  session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
  seq INTEGER NOT NULL, role TEXT NOT NULL, message TEXT NOT NULL, text TEXT,
  UNIQUE (session_id, seq));
CREATE VIRTUAL TABLE acp_messages_fts USING fts5 (text, content='acp_messages',
  content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER acp_messages_fts_insert AFTER INSERT ON acp_messages BEGIN
  INSERT INTO acp_messages_fts (rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER acp_messages_fts_delete AFTER DELETE ON acp_messages BEGIN
  INSERT INTO acp_messages_fts (acp_messages_fts, rowid, text)
    VALUES ('delete', old.id, old.text); END;
CREATE TABLE acp_journal (
  session_id TEXT NOT NULL REFERENCES acp_sessions (session_id) ON DELETE CASCADE,
  seq INTEGER NOT NULL, turn INTEGER NOT NULL, payload TEXT NOT NULL,
  PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
INSERT INTO acp_meta VALUES ('schema_version', '1');
"""


class MigrationTests(StoreTestCase):
    def buildV1(self, path: Path, cwd: Path) -> list[dict]:
        """A v1 file with one session, two messages, a journal, and another tool's table."""
        updates = [chunk("é" * 100), toolCall("t1"), toolUpdate("t1", "completed")]
        raw = sqlite3.connect(path)
        raw.executescript(V1_DDL)
        raw.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT)")
        raw.execute("INSERT INTO sessions VALUES ('other', 'cli')")
        raw.execute(
            "INSERT INTO acp_sessions (session_id, cwd, title, created_at, updated_at, turn, "
            "message_count) VALUES ('old', ?, 'Old one', '2025-01-01T00:00:00.000000Z', "
            "'2025-01-01T00:00:00.000000Z', 1, 2)",
            (str(cwd),),
        )
        for seq, message in enumerate(HISTORY[1:3]):
            raw.execute(
                "INSERT INTO acp_messages (session_id, seq, role, message, text) "
                "VALUES ('old', ?, 'user', ?, ?)",
                (seq, json.dumps(message), searchableText(message)),
            )
        raw.executemany(
            "INSERT INTO acp_journal VALUES ('old', ?, 1, ?)",
            [(seq, json.dumps(u, separators=(",", ":"), ensure_ascii=False))
             for seq, u in enumerate(updates, 1)],
        )  # fmt: skip
        raw.commit()
        raw.close()
        return updates

    def test_upgradesV1(self) -> None:
        """A v1 file opens as the current version with every row kept and usable: journal
        byte caps (backfilled sizes), the symlink-aware cwd filter (backfilled keys), search,
        new writes; the other tool's table is untouched."""
        top = self.tempDir()
        (top / "project").mkdir()
        (top / "alias").symlink_to(top / "project")
        path = top / "state.db"
        updates = self.buildV1(path, top / "alias")

        db = self.openStore(path)
        self.assertEqual(db.loadMessages("old"), HISTORY[1:3])
        self.assertEqual(db.getSession("old").title, "Old one")
        self.assertEqual(db.loadJournal("old").updates, updates)
        replay = db.loadJournal("old", maxBytes=sum(size(u) for u in updates[1:]))
        self.assertEqual(replay, Replay(updates[1:], 1, size(updates[0])))
        self.assertEqual(
            [r.sessionId for r in db.listSessions(cwd=str(top / "project"))[0]], ["old"]
        )
        self.assertEqual([h["sessionId"] for h in db.searchMessages("screenshot")], ["old"])
        self.assertEqual(db.appendUpdates("old", 2, [chunk("new")]), 4)
        db.close()

        raw = sqlite3.connect(path)
        self.addCleanup(raw.close)
        self.assertEqual(storedVersion(path), str(migrations.SCHEMA_VERSION))
        self.assertEqual(raw.execute("SELECT * FROM sessions").fetchall(), [("other", "cli")])

    def test_failedMigrationChangesNothing(self) -> None:
        """A step that fails rolls the whole upgrade back: the file stays v1."""
        top = self.tempDir()
        path = top / "state.db"
        self.buildV1(path, top)
        raw = sqlite3.connect(path)
        raw.execute("CREATE TABLE acp_blocker (x)")
        raw.execute("CREATE INDEX acp_journal_sizes ON acp_blocker (x)")  # v2 needs the name
        raw.commit()
        raw.close()
        self.assertRaises(StoreError, SessionDB, path)
        raw = sqlite3.connect(path)
        self.addCleanup(raw.close)
        self.assertEqual(storedVersion(path), "1")
        columns = [row[1] for row in raw.execute("PRAGMA table_info(acp_journal)")]
        self.assertNotIn("nbytes", columns)

    def test_newerVersion(self) -> None:
        """A file from a newer hermes-acp is refused with a clear error and left as it was."""
        path = self.tempDir() / "state.db"
        SessionDB(path).close()
        raw = sqlite3.connect(path)
        raw.execute("UPDATE acp_meta SET value = '99' WHERE key = 'schema_version'")
        raw.commit()
        raw.close()
        with self.assertRaises(StoreError) as caught:
            SessionDB(path)
        message = str(caught.exception)
        self.assertIn("newer hermes-acp", message)
        self.assertIn("99", message)
        self.assertIn(str(path), message)
        self.assertEqual(storedVersion(path), "99")


    def test_anSQLiteTooOldIsSaidPlainly(self) -> None:
        """A Python whose SQLite cannot keep the schema's generated columns is refused with
        the versions in words, before any table is made."""
        path = self.tempDir() / "state.db"
        self.patch(store.sqlite3, "sqlite_version_info", (3, 22, 0))
        self.patch(store.sqlite3, "sqlite_version", "3.22.0")
        with self.assertRaises(StoreError) as caught:
            SessionDB(path)
        self.assertIn("SQLite 3.31.0 or newer", str(caught.exception))
        self.assertIn("3.22.0", str(caught.exception))
        raw = sqlite3.connect(path)
        self.addCleanup(raw.close)
        self.assertEqual(raw.execute("SELECT count(*) FROM sqlite_master").fetchone(), (0,))


class ThreadTests(StoreTestCase):
    def test_concurrentWriters(self) -> None:
        """Eight threads write their own sessions (two through a second connection, as another
        process would) while another lists and searches: no errors, every row present."""
        path = self.tempDir() / "state.db"
        shared = self.openStore(path)
        second = self.openStore(path)
        errors: list[BaseException] = []
        writersDone = threading.Event()
        turns = 25

        def write(n: int) -> None:
            db = second if n < 2 else shared
            sessionId = f"w{n}"
            try:
                self.newSession(db, sessionId, f"/work/{n % 3}")
                for _ in range(turns):
                    turn = db.beginTurn(sessionId)
                    db.appendUpdates(sessionId, turn, [chunk(f"{n}"), toolCall(f"{turn}")])
                    db.appendUpdates(sessionId, turn, [toolUpdate(f"{turn}", "completed")])
                    messages = [{"role": "user", "content": f"word{n}"},
                                {"role": "assistant", "content": "ok"}]  # fmt: skip
                    db.endTurn(sessionId, turn, messages)
            except BaseException as e:
                errors.append(e)

        def read() -> None:
            try:
                while not writersDone.is_set():
                    shared.listSessions(limit=3)
                    shared.listSessions(cwd="/work/1")
                    shared.searchMessages("ok")
            except BaseException as e:
                errors.append(e)

        reader = threading.Thread(target=read)
        reader.start()
        writers = [threading.Thread(target=write, args=(n,)) for n in range(8)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(timeout=120)
        writersDone.set()
        reader.join(timeout=120)
        self.assertEqual(errors, [])
        sessions, cursor = shared.listSessions()
        self.assertEqual(len(sessions), 8)
        self.assertIsNone(cursor)
        for n in range(8):
            record = shared.getSession(f"w{n}")
            self.assertEqual((record.turn, record.turnState, record.messageCount),
                             (turns, "idle", 2 * turns))  # fmt: skip
            self.assertEqual(len(shared.loadJournal(f"w{n}").updates), 3 * turns)
            self.assertEqual(len(shared.searchMessages(f"word{n}", limit=100)), turns)


class SearchConnectionTests(StoreTestCase):
    def test_writesGoOnDuringASearch(self) -> None:
        """A search runs on a connection of its own: while one is in the middle of its query,
        another thread's writes and reads of the store finish (issue 27: a search over
        10,000 sessions held the one connection, and every turn waited for it)."""
        db = self.openStore()
        self.newSession(db, "s1")
        db.appendMessages("s1", [{"role": "user", "content": "needle in a haystack"}])
        self.assertEqual(len(db.searchMessages("needle")), 1)  # opens the search connection
        inQuery, written = threading.Event(), threading.Event()

        def pause() -> int:
            inQuery.set()
            written.wait(10)  # bounded: a regression fails below, it does not hang
            return 0

        assert db._searchConnection is not None
        db._searchConnection.set_progress_handler(pause, 1)
        found: list[list[dict]] = []
        searcher = threading.Thread(target=lambda: found.append(db.searchMessages("needle")))
        searcher.start()
        self.assertTrue(inQuery.wait(10))

        def write() -> None:
            db.appendMessages("s1", [{"role": "assistant", "content": "another needle"}])
            db.getSession("s1")
            written.set()

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(5)
        finishedDuringSearch = written.is_set()
        written.set()
        searcher.join(10)
        self.assertTrue(finishedDuringSearch)
        self.assertEqual(len(found), 1)
        db._searchConnection.set_progress_handler(None, 1)
        self.assertEqual(len(db.searchMessages("needle")), 2)

    def test_closeClosesTheSearchConnection(self) -> None:
        db = self.openStore()
        self.newSession(db, "s1")
        db.searchMessages("anything")
        db.close()
        with self.assertRaises(StoreError):
            db.searchMessages("anything")


class BatchTests(StoreTestCase):
    def test_oneCommitForMany(self) -> None:
        """Every write method inside ``batch`` shares its transaction; one that fails undoes
        only its own writes."""
        db = self.openStore()
        for n in range(3):
            self.newSession(db, f"s{n}")
        with db.batch():
            db.appendMessages("s0", [{"role": "user", "content": "one"}])
            with self.assertRaises(UnknownSession):
                db.appendMessages("missing", [{"role": "user", "content": "lost"}])
            with self.assertRaises(ValueError):
                db.endTurn("s1", 1, [{"role": "user", "content": "not running"}])
            db.appendMessages("s2", [{"role": "user", "content": "two"}])
            self.assertTrue(db._connection.in_transaction)
        self.assertFalse(db._connection.in_transaction)
        self.assertEqual([len(db.loadMessages(f"s{n}")) for n in range(3)], [1, 0, 1])

    def test_anExceptionUndoesTheBatch(self) -> None:
        db = self.openStore()
        self.newSession(db, "s0")
        with self.assertRaises(RuntimeError), db.batch():
            db.appendMessages("s0", [{"role": "user", "content": "one"}])
            raise RuntimeError("the caller failed")
        self.assertEqual(db.loadMessages("s0"), [])
        db.appendMessages("s0", [{"role": "user", "content": "after"}])
        self.assertEqual(len(db.loadMessages("s0")), 1)
