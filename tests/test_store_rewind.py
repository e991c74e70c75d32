"""The store's side of rewinds: prompt turns, the conversation cut, what a compaction voids."""

from __future__ import annotations

import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.store import SessionDB, SessionRecord


def said(text: str) -> list[dict]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": f"answer to {text}"}]


def chunk(text: str) -> dict:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


class RewindStoreTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.db = SessionDB(Path(tempfile.mkdtemp()) / "state.db")
        self.addCleanup(self.db.close)
        self.db.createSession(SessionRecord("s1", "/project"))

    def turn(self, text: str, prompt: bool = True) -> int:
        """One turn: its journal and its messages (a slash command's has no prompt, no messages)."""
        number = self.db.beginTurn("s1", prompt=text if prompt else None)
        self.db.appendUpdates("s1", number, [chunk(f"shown for {text}")])
        self.db.endTurn("s1", number, said(text) if prompt else [])
        return number

    def test_rewindCutsHistoryAndJournalAndKeepsThemSearchable(self) -> None:
        for text in ("alpha one", "bravo two", "charlie three"):
            self.turn(text)
        self.turn("/title x", prompt=False)
        self.assertEqual([(t, seq, prompt) for t, seq, prompt, _ in self.db.listTurns("s1")],
                         [(1, 0, "alpha one"), (2, 2, "bravo two"), (3, 4, "charlie three")])
        current = self.db.beginTurn("s1")  # the /rewind's own turn
        self.db.appendUpdates("s1", current, [chunk("the rewind's answer")])
        self.assertEqual(self.db.rewindTo("s1", 2, current), [2, 3])
        self.db.endTurn("s1", current, [])
        self.assertEqual(self.db.loadMessages("s1"), said("alpha one"))
        shown = [u["content"]["text"] for u in self.db.loadJournal("s1").updates]
        self.assertEqual(shown, ["shown for alpha one", "the rewind's answer"])
        self.assertEqual([t for t, *_ in self.db.listTurns("s1")], [1])
        hits = self.db.searchMessages("charlie")
        self.assertTrue(hits and all(hit["seq"] < 0 for hit in hits))
        self.assertEqual(self.db.getSession("s1").messageCount, 2)
        # The next turn goes on from there, and can itself be rewound to.
        number = self.turn("delta four")
        self.assertEqual(self.db.listTurns("s1")[-1][:2], (number, 2))

    def test_aCompactionVoidsTheTurnsBeforeIt(self) -> None:
        self.turn("alpha one")
        number = self.db.beginTurn("s1", prompt="bravo two")
        self.db.endTurn("s1", number, said("bravo two"), [{"role": "user", "content": "[summary]"}])
        self.assertEqual([seq for _, seq, _, _ in self.db.listTurns("s1")], [None, None])
        self.assertRaises(ValueError, self.db.rewindTo, "s1", 1, number + 1)
        later = self.turn("charlie three")
        self.assertEqual(self.db.listTurns("s1")[-1][:2], (later, 1))
        self.assertRaises(ValueError, self.db.rewindTo, "s1", 99, later + 1)

    def test_deleteRemovesTheTurnsAndTheCutJournal(self) -> None:
        self.turn("alpha one")
        self.turn("bravo two")
        self.db.rewindTo("s1", 2, 3)
        self.db.deleteSession("s1")
        with self.db._read() as cursor:  # noqa: SLF001
            for table in ("acp_turns", "acp_journal_cut"):
                self.assertEqual(cursor.execute(f"SELECT count(*) FROM {table}").fetchone(), (0,))
