"""The compactor (``hermes_acp.engine.compaction``) on its own: units, the cheap pass, the
summary, the budgets, and a property test over random histories with parallel batches."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.engine.compaction import (
    FRAME, LEFT_OUT_KEY, SYNTHETIC_KEY, Budget, Cancelled, Compactor, Estimator, charCount, isRequest, isSummary,
    setAsideMessage, shorten, summaryMessage, units,
)


def call(callId: str, name: str = "read_file", arguments: str = '{"path": "a.py"}') -> dict[str, Any]:
    return {"id": callId, "type": "function", "function": {"name": name, "arguments": arguments}}


def batch(prefix: str, results: list[str], name: str = "read_file") -> list[dict[str, Any]]:
    """An assistant message calling ``len(results)`` tools at once, and their results."""
    calls = [call(f"{prefix}-{i}", name) for i in range(len(results))]
    return [{"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": c["id"], "name": name, "content": r} for c, r in zip(calls, results))]


def wellFormed(messages: list[dict[str, Any]]) -> None:
    """What endpoints insist on: every tool result answers a call of the assistant message
    just before its run of results, and every call of that message has its result."""
    open_: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_, f"orphan tool result {message['tool_call_id']}"
            open_.discard(message["tool_call_id"])
            continue
        assert not open_, f"calls without results: {open_}"
        open_ = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_, f"calls without results: {open_}"


class Summariser:
    def __init__(self, answer: str = "## Goal\nKeep going.", fail: BaseException | None = None) -> None:
        self.answer, self.fail, self.requests = answer, fail, []

    def __call__(self, request: list[dict[str, Any]], maxTokens: int) -> str:
        self.requests.append((request, maxTokens))
        if self.fail is not None:
            raise self.fail
        return self.answer


def history(turns: int, size: int = 4000, answer: int = 0) -> list[dict[str, Any]]:
    """Turns of a prompt, a read of ``size`` characters and an answer of ``answer`` more
    (answers are not shortened by the cheap pass)."""
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"request {n}"})
        messages += batch(f"t{n}", [f"file {n} " + "x" * size])
        messages.append({"role": "assistant", "content": f"answer {n} " + "y" * answer})
    return messages


class UnitsTests(SynchronousTestCase):
    def test_tool_results_stay_with_their_call(self) -> None:
        messages = [{"role": "user", "content": "hi"}, *batch("a", ["1", "2", "3"]), {"role": "assistant", "content": "ok"}]
        self.assertEqual([len(u) for u in units(messages)], [1, 4, 1])

    def test_budget_figures(self) -> None:
        budget = Budget.of(8000)
        self.assertEqual(budget.replyRoom, 1000)
        self.assertEqual(budget.limit, 7000)
        self.assertEqual(budget.threshold, 6300)
        self.assertLess(budget.target, budget.threshold)
        self.assertEqual(Budget.of(8000, maxTokens=50_000).replyRoom, 4000)  # never more than half the window

    def test_estimator_calibrates_within_bounds(self) -> None:
        estimator = Estimator()
        estimator.calibrate(40_000, 20_000)
        self.assertEqual(estimator.tokens(4000), 2000)
        estimator.calibrate(40_000, 1)
        self.assertEqual(estimator.ratio, 0.25)


class CheapPassTests(SynchronousTestCase):
    def test_old_results_become_one_line_and_repeats_point_to_the_last(self) -> None:
        messages = [*batch("a", ["same " * 100]), *batch("b", ["other\n" * 100]), *batch("c", ["same " * 100])]
        older, changed = shorten(units(messages)[:2], messages)
        self.assertEqual(changed, 2)
        self.assertEqual(older[0][1]["content"], "[Same output as a later read_file call below.]")
        self.assertIn("Earlier output of read_file: 600 characters", older[1][1]["content"])
        self.assertIn("It began: 'other'", older[1][1]["content"])
        self.assertEqual(messages[1]["content"], "same " * 100, "the input is not changed in place")

    def test_huge_arguments_keep_valid_json(self) -> None:
        messages = [{"role": "assistant", "content": None,
                     "tool_calls": [call("w", "write_file", json.dumps({"path": "big.txt", "content": "y" * 5000}))]},
                    {"role": "tool", "tool_call_id": "w", "name": "write_file", "content": "wrote"}]
        older, changed = shorten(units(messages), messages)
        arguments = json.loads(older[0][0]["tool_calls"][0]["function"]["arguments"])
        self.assertEqual(arguments["path"], "big.txt")
        self.assertEqual(arguments["content"], "[5,000 characters removed to save context]")

    def test_nothing_grows(self) -> None:
        """A result barely over the threshold stays (its one line, quoting its start, would be
        longer), and so do arguments whose shortened JSON would be no shorter."""
        messages = [{"role": "assistant", "content": None,
                     "tool_calls": [call("s", "write_file", json.dumps({f"k{i}": i for i in range(200)}, separators=(",", ":")))]},
                    {"role": "tool", "tool_call_id": "s", "name": "write_file", "content": "r" * 230}]
        older, changed = shorten(units(messages), messages)
        self.assertEqual((changed, older), (0, units(messages)))


class CompactTests(SynchronousTestCase):
    def compactor(self, window: int = 8000, summariser: Summariser | None = None) -> tuple[Compactor, Summariser]:
        summariser = summariser or Summariser()
        return Compactor(Budget.of(window), Estimator(), summariser), summariser

    def test_cheap_pass_alone_when_it_is_enough(self) -> None:
        compactor, summariser = self.compactor(window=40_000)
        live = history(40, size=3000)
        outcome = compactor.compact("c1", live, 100)
        self.assertEqual(outcome.status, "completed")
        self.assertEqual(summariser.requests, [])
        self.assertIn("Shortened", outcome.summary)
        self.assertLessEqual(outcome.after, compactor.budget.target)
        assert outcome.messages is not None
        wellFormed(outcome.messages)
        self.assertEqual(outcome.messages[-1], live[-1])

    def test_summary_replaces_the_older_part(self) -> None:
        compactor, summariser = self.compactor()
        live = history(12, answer=2000)
        outcome = compactor.compact("c1", live, 100)
        self.assertEqual(outcome.status, "completed")
        assert outcome.messages is not None
        first = outcome.messages[0]
        self.assertTrue(isSummary(first))
        self.assertEqual(first["content"], FRAME + "## Goal\nKeep going.")
        self.assertLess(outcome.after, outcome.before)
        self.assertLessEqual(outcome.after, compactor.budget.threshold)
        wellFormed(outcome.messages)
        request, maxTokens = summariser.requests[0]
        self.assertEqual(maxTokens, compactor.budget.summaryTokens)
        self.assertLessEqual(compactor.size(request) + maxTokens, compactor.budget.window, "the summary request fits")
        self.assertIn("USER: request 5", request[1]["content"])

    def test_the_latest_request_stays_verbatim(self) -> None:
        compactor, _ = self.compactor()
        live = [{"role": "user", "content": "the one request"}]
        for n in range(10):
            live += batch(f"s{n}", [f"{n} " + "z" * 3000])
        outcome = compactor.compact("c1", live, 100, force=True)
        assert outcome.messages is not None
        self.assertEqual(outcome.messages[1], {"role": "user", "content": "the one request"})
        wellFormed(outcome.messages)

    def test_a_second_compaction_updates_the_first_summary(self) -> None:
        compactor, summariser = self.compactor()
        first = compactor.compact("c1", history(12), 100, force=True).messages
        assert first is not None
        second = compactor.compact("c2", first + history(12, answer=2000), 100)
        self.assertEqual(second.status, "completed")
        self.assertIn("The previous summary (update it; keep what still holds):\n\n## Goal\nKeep going.",
                      summariser.requests[-1][0][1]["content"])
        assert second.messages is not None
        self.assertEqual(sum(isSummary(m) for m in second.messages), 1)

    def test_a_cancel_leaves_the_history(self) -> None:
        compactor, _ = self.compactor(summariser=Summariser(fail=Cancelled()))
        outcome = compactor.compact("c1", history(12, answer=2000), 100)
        self.assertEqual((outcome.status, outcome.messages, outcome.error), ("cancelled", None, "cancelled"))

    def test_a_failed_summary_sets_the_oldest_aside(self) -> None:
        """A summary that fails (an error, an empty answer) or is not asked for: the oldest
        units are set aside, as few as it takes, and a note names the requests left out."""
        live = history(12, answer=2000)
        for summariser, ask, failure in [
            (Summariser(fail=RuntimeError("boom")), True, "the summary request failed: boom"),
            (Summariser(answer="  "), True, "the model wrote an empty summary"),
            (Summariser(), False, ""),
        ]:
            compactor, _ = self.compactor(summariser=summariser)
            outcome = compactor.compact("c1", live, 100, ask=ask)
            self.assertEqual((outcome.status, outcome.kind, outcome.summaryFailure), ("completed", "dropped", failure))
            self.assertEqual(len(summariser.requests), int(ask))
            assert outcome.messages is not None
            wellFormed(outcome.messages)
            self.assertLessEqual(outcome.after, compactor.budget.target)
            note, kept = outcome.messages[0], outcome.messages[1:]
            self.assertTrue(isSummary(note) and note["content"].startswith("[Left out to fit the context window"))
            same = live[len(live) - len(kept):]  # the newest, in order (the older of them shortened)
            self.assertEqual([(m["role"], m.get("tool_call_id")) for m in kept], [(m["role"], m.get("tool_call_id")) for m in same])
            self.assertEqual((kept[-1], [m for m in kept if m["role"] == "user"]), (same[-1], [m for m in same if m["role"] == "user"]))
            gone = [m["content"] for m in live[:len(live) - len(kept)] if isRequest(m)]
            self.assertEqual(note[LEFT_OUT_KEY], {"requests": gone[-5:], "earlier": len(gone) - 5})
            self.assertIn(f"{gone[-1]!r} (and {len(gone) - 5} earlier ones).", note["content"])
            self.assertIn(f"Set aside the {len(live) - len(kept)} oldest messages", outcome.summary)
            self.assertIn("session_search", note["content"])

    def test_a_second_note_keeps_the_summary_and_what_it_named(self) -> None:
        compactor, _ = self.compactor()
        first = compactor.compact("c1", history(12), 100, force=True).messages
        assert first is not None and first[0]["content"] == FRAME + "## Goal\nKeep going."
        failing, _ = self.compactor(summariser=Summariser(answer=""))
        second = failing.compact("c2", first + history(12, answer=2000), 100).messages
        assert second is not None
        self.assertTrue(second[0]["content"].startswith(FRAME + "## Goal\nKeep going.\n\n[Left out"))
        third = failing.compact("c3", second + history(12, answer=2000), 100, ask=False).messages
        assert third is not None
        self.assertEqual(sum(isSummary(m) for m in third), 1)
        self.assertEqual(third[0]["content"].count("Keep going."), 1)
        self.assertEqual(third[0]["content"].count("[Left out"), 1, "one note, not a note in a note")
        self.assertEqual(len(third[0][LEFT_OUT_KEY]["requests"]), 5)
        self.assertGreater(third[0][LEFT_OUT_KEY]["earlier"], second[0][LEFT_OUT_KEY]["earlier"])

    def test_setting_aside_keeps_the_latest_request_and_continuations_with_their_answer(self) -> None:
        live = [{"role": "user", "content": "the one request"}, {"role": "assistant", "content": "cut " + "c" * 20_000},
                {"role": "user", "content": "[continue]", SYNTHETIC_KEY: "continuation"}]
        for n in range(8):  # answers: the cheap pass cannot shorten them
            live += [*batch(f"s{n}", [f"{n}"]), {"role": "assistant", "content": f"{n} " + "z" * 500}]
        outcome = Compactor(Budget.of(8000), Estimator(), Summariser(answer="")).compact("c1", live, 100)
        assert outcome.messages is not None
        self.assertEqual(outcome.kind, "dropped")
        self.assertEqual(outcome.messages[1], {"role": "user", "content": "the one request"})
        self.assertNotIn(SYNTHETIC_KEY, json.dumps(outcome.messages))
        self.assertEqual(outcome.messages[2]["role"], "assistant")
        wellFormed(outcome.messages)

    def test_no_summary_is_asked_for_when_none_could_help(self) -> None:
        """The latest exchange alone fills the window: the compaction fails without a request
        (each would cost the model's time, and it would be tried again at every step)."""
        compactor, summariser = self.compactor(summariser=Summariser(fail=RuntimeError("boom")))
        live = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "v" * 30_000}]
        outcome = compactor.compact("c1", live, 100)
        self.assertEqual((outcome.status, outcome.messages, summariser.requests), ("failed", None, []))
        self.assertIn("no progress: without the older messages the conversation is still", outcome.error)

    def test_no_progress_is_a_failure(self) -> None:
        compactor, _ = self.compactor(summariser=Summariser(answer="w" * 1000))
        live = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "v" * 30_000}]
        outcome = compactor.compact("c1", live, 100)
        self.assertEqual(outcome.status, "failed")
        self.assertIn("no progress", outcome.error)

    def test_nothing_to_compact(self) -> None:
        compactor, _ = self.compactor()
        outcome = compactor.compact("c1", [{"role": "user", "content": "x" * 40_000}], 100)
        self.assertEqual(outcome.status, "failed")
        self.assertIn("nothing old enough", outcome.error)

    def test_newest_too_big_have_their_results_cut(self) -> None:
        compactor, _ = self.compactor()
        live = [*history(3), {"role": "user", "content": "now"}, *batch("big", ["q" * 20_000, "r" * 20_000])]
        outcome = compactor.compact("c1", live, 100)
        self.assertEqual(outcome.status, "completed")
        assert outcome.messages is not None
        self.assertLessEqual(outcome.after, compactor.budget.threshold)
        wellFormed(outcome.messages)

    def test_summary_request_fits_a_huge_history(self) -> None:
        compactor, summariser = self.compactor()
        outcome = compactor.compact("c1", history(400, size=500), 100)
        self.assertEqual(outcome.status, "completed")
        request, maxTokens = summariser.requests[0]
        self.assertLessEqual(compactor.size(request) + maxTokens, compactor.budget.window)
        self.assertIn("earlier entries left out", request[1]["content"])


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    """Random well-formed histories: prompts, answers (some cut off by the output limit and
    continued), single calls and parallel batches of results of any size, and now and then
    an earlier summary (or note) at the start."""
    messages: list[dict[str, Any]] = []
    start = draw(st.sampled_from(["", "summary", "note"]))
    if start == "summary":
        messages.append(summaryMessage("old", "## Goal\nearlier work"))
    elif start == "note":
        messages.append(setAsideMessage("old", draw(st.sampled_from(["", "## Goal\nearlier work"])), ["u1", "u2"]))
    for n in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["user", "answer", "cut", "batch", "batch"]))
        if kind == "user":
            messages.append({"role": "user", "content": "u" * draw(st.integers(1, 3000))})
        elif kind == "answer":
            messages.append({"role": "assistant", "content": "a" * draw(st.integers(0, 2000))})
        elif kind == "cut":
            messages += [{"role": "assistant", "content": "c" * draw(st.integers(1, 6000))},
                         {"role": "user", "content": "[continue]", SYNTHETIC_KEY: "continuation"},
                         {"role": "assistant", "content": "d" * draw(st.integers(1, 2000))}]
        else:
            sizes = draw(st.lists(st.integers(0, 9000), min_size=1, max_size=5))
            messages += batch(f"b{n}", ["r" * size for size in sizes], draw(st.sampled_from(["read_file", "terminal"])))
    return messages


def userTurnsInARow(messages: list[dict[str, Any]]) -> int:
    """How many times two user turns follow each other in the request the endpoint gets."""
    from hermes_acp.engine.agent import _request

    roles = [m["role"] for m in _request({"role": "system", "content": "s"}, messages)]
    return sum(a == b == "user" for a, b in zip(roles, roles[1:]))


class PropertyTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None)
    @given(histories(), st.booleans(), st.sampled_from([4096, 8000, 32_000]),
           st.sampled_from(["written", "error", "empty", "not asked"]))
    @example([*batch("b0", ["r" * 230]), {"role": "user", "content": "u"}], False, 4096, "written")  # a shortening that grew
    @example([summaryMessage("old", "## Goal\nearlier work"), {"role": "user", "content": "u"},
              {"role": "assistant", "content": "a" * 100}], True, 4096, "written")  # the request twice, the summary lost
    def test_compaction_never_orphans_a_tool_result(self, live: list[dict[str, Any]], force: bool, window: int,
                                                    summary: str) -> None:
        """Whatever the summary does (written, failed, empty, not asked for), a compaction
        keeps the history valid: no tool result without its call, the user's latest request
        verbatim, one summary at most, no two user turns in a row that were not there
        before, and smaller than it was; a failed summary never fails it while something
        older than the latest exchange can be set aside."""
        summariser = Summariser(answer="" if summary == "empty" else "## Goal\nKeep going.",
                                fail=RuntimeError("boom") if summary == "error" else None)
        compactor = Compactor(Budget.of(window), Estimator(), summariser)
        outcome = compactor.compact("c1", live, 200, force=force, ask=summary != "not asked")
        for request, maxTokens in summariser.requests:
            self.assertLessEqual(compactor.size(request) + maxTokens, window)
        if outcome.messages is None:
            self.assertEqual(outcome.after, outcome.before)
            if summary != "written":
                self.assertRegex(outcome.error, "^(nothing old enough|no progress|the conversation is empty)")
            return
        if summary != "written":
            self.assertIn(outcome.kind, ("shortened", "dropped"))
        wellFormed(outcome.messages)
        self.assertLess(outcome.after, outcome.before)
        self.assertEqual(outcome.after, 200 + compactor.size(outcome.messages))
        self.assertLessEqual(sum(isSummary(m) for m in outcome.messages), 1)
        self.assertLessEqual(userTurnsInARow(outcome.messages), userTurnsInARow(live))
        users = [m for m in live if isRequest(m)]
        if users:  # the latest request is never summarised away
            self.assertIn(users[-1], outcome.messages)
        self.assertLessEqual(charCount(outcome.messages), charCount(live))

    @settings(max_examples=100, deadline=None)
    @given(st.integers(1, 30), st.integers(0, 9000), st.booleans(), st.sampled_from([4096, 8000, 32_000]))
    def test_a_failing_summary_always_makes_room(self, turns: int, size: int, force: bool, window: int) -> None:
        """Turns of a request, reads and an answer, over the threshold, and no summary to be
        had: the compaction completes under the threshold."""
        compactor = Compactor(Budget.of(window), Estimator(), Summariser(answer=""))
        live = history(turns, size=size, answer=size // 4)
        if compactor.size(live) + 200 <= compactor.budget.threshold:
            return
        outcome = compactor.compact("c1", live, 200, force=force)
        self.assertEqual(outcome.status, "completed", outcome.error)
        self.assertLessEqual(outcome.after, compactor.budget.threshold)


class ShownTests(SynchronousTestCase):
    """How a compaction reaches the editor: the journal's card, and its other form."""

    def test_card_and_update_forms(self) -> None:
        from hermes_acp.store import INTERRUPTED_CALL
        from hermes_acp.updates import compactionCard, compactionUpdate, isCompactionCard

        start, done = compactionCard("c1", "in_progress"), compactionCard("c1", "completed", "## Goal\nx")
        self.assertEqual((start["title"], start["kind"], start["status"]), ("Compact conversation", "think", "in_progress"))
        self.assertTrue(isCompactionCard(start) and isCompactionCard(done))
        self.assertFalse(isCompactionCard({"sessionUpdate": "tool_call", "toolCallId": "t1-1.0"}))
        self.assertEqual(compactionUpdate(start), {"sessionUpdate": "compaction_update", "compactionId": "c1",
                                                   "status": "in_progress"})
        self.assertEqual(compactionUpdate(done)["summary"], [{"type": "text", "text": "## Goal\nx"}])
        cancelled = compactionUpdate(compactionCard("c1", "cancelled", "Cancelled."))
        self.assertEqual((cancelled["status"], "error" in cancelled, cancelled["summary"]), ("cancelled", False, None))
        failed = compactionUpdate(compactionCard("c1", "failed", "Compaction failed: boom."))
        self.assertEqual((failed["status"], failed["error"], failed["summary"]), ("failed", "Compaction failed: boom.", None))
        recovered = {"sessionUpdate": "tool_call_update", "toolCallId": "compaction-c1", "status": "failed",
                     "content": [{"type": "content", "content": {"type": "text", "text": INTERRUPTED_CALL}}]}
        self.assertEqual(compactionUpdate(recovered), {"sessionUpdate": "compaction_update", "compactionId": "c1",
                                                       "status": "failed", "summary": None, "error": INTERRUPTED_CALL})


class ReviewedTests(SynchronousTestCase):
    """Cases an independent review found."""

    def test_cheap_pass_keeps_the_order(self) -> None:
        """The latest request stays where it was when nothing is summarised."""
        live = [{"role": "user", "content": "u0"}, *batch("a", ["x" * 4000]), {"role": "assistant", "content": "answer 0"},
                {"role": "user", "content": "fix the bug"}, *batch("b", ["y" * 4000]), *batch("c", ["z" * 4000]),
                *batch("d", ["w" * 4000])]
        outcome = Compactor(Budget.of(8000), Estimator(), Summariser()).compact("c1", live, 100)
        self.assertEqual(outcome.kind, "shortened")
        assert outcome.messages is not None
        self.assertEqual([m["role"] for m in outcome.messages], [m["role"] for m in live])
        self.assertEqual([m.get("content") for m in outcome.messages if m["role"] == "user"], ["u0", "fix the bug"])

    def test_small_windows_compact_toward_the_target(self) -> None:
        """After a summary the request is under the target, not just under the threshold, so the
        next request does not need another one."""
        for window in (3072, 4096):
            compactor = Compactor(Budget.of(window), Estimator(), Summariser())
            live = [{"role": "user", "content": "read them"}]
            for n in range(6):
                live += batch(f"r{n}", [f"{n} " + "q" * 2000])
            outcome = compactor.compact("c1", live, 600)
            self.assertEqual(outcome.status, "completed", window)
            self.assertLessEqual(outcome.after, compactor.budget.target, window)

    def test_only_the_newest_left_is_cut_to_fit(self) -> None:
        compactor = Compactor(Budget.of(4096), Estimator(), Summariser())
        outcome = compactor.compact("c1", [{"role": "user", "content": "read"}, *batch("r", ["v" * 9000])], 1250)
        self.assertEqual((outcome.status, outcome.kind), ("completed", "shortened"))
        assert outcome.messages is not None
        wellFormed(outcome.messages)
        self.assertLessEqual(outcome.after, compactor.budget.threshold)

    def test_summary_request_fits_tiny_windows_and_is_retried_smaller(self) -> None:
        class Overflow(Exception):
            overflow = True

        for window, ratio in ((1024, 4.0), (2048, 4.0), (2048, 1.0)):
            summariser = Summariser()
            compactor = Compactor(Budget.of(window), Estimator(ratio), summariser)
            old = [summaryMessage("old", "p" * 20_000), *history(6, size=1000, answer=500)]
            outcome = compactor.compact("c1", old, 100, force=True)
            for request, maxTokens in summariser.requests:
                self.assertLessEqual(compactor.size(request) + maxTokens, window, (window, ratio, outcome.error))
        calls = []

        def refuseFirst(request: list[dict[str, Any]], maxTokens: int) -> str:
            calls.append(len(request[1]["content"]))
            if len(calls) == 1:
                raise Overflow("too long")
            return "## Goal\nsmaller"

        outcome = Compactor(Budget.of(8000), Estimator(), refuseFirst).compact("c1", history(30, answer=2000), 100)
        self.assertEqual(outcome.status, "completed")
        self.assertLess(calls[1], calls[0])

    def test_a_summary_before_a_request_joins_the_system_prompt(self) -> None:
        from hermes_acp.engine.agent import _request

        system = {"role": "system", "content": "You are Hermes."}
        summary = summaryMessage("c1", "## Goal\nx")
        sent = _request(system, [summary, {"role": "user", "content": "go on"}])
        self.assertEqual([m["role"] for m in sent], ["system", "user"])
        self.assertEqual(sent[0]["content"], "You are Hermes.\n\n" + FRAME + "## Goal\nx")
        before = _request(system, [summary, {"role": "assistant", "content": "ok"}])  # it stays a user turn
        self.assertEqual([m["role"] for m in before], ["system", "user", "assistant"])
        self.assertNotIn("compaction", before[1])

    def test_sizes_are_measured_once_and_add_up(self) -> None:
        """The agent's per-entry sizes add up to one ``charCount`` of the history as sent, and
        an entry is measured once however many requests carry it."""
        from hermes_acp.engine import agent as agentModule
        from hermes_acp.engine.agent import _forAPI, _Sizes

        history = [{"role": "user", "content": "read a.txt ü"},
                   {"role": "assistant", "content": "", "reasoning": "hm", "tool_calls": [
                       {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c", "name": "read_file", "content": "x" * 500},
                   {"role": "assistant", "content": "done"}]
        sizes, measured = _Sizes(), []
        real = agentModule._messageChars
        self.patch(agentModule, "_messageChars", lambda m: measured.append(m) or real(m))
        for _ in range(3):
            self.assertEqual(sizes.total(history), charCount([_forAPI(m) for m in history]))
        self.assertEqual(measured, history)
        self.assertEqual(sizes.total([]), charCount([]))

    def test_the_joined_body_is_a_fresh_encoding_across_changes(self) -> None:
        """The body a request joins from the entries' kept bytes (``_Sizes.view``, ``model._body``)
        is byte for byte ``safejson.encode`` of the same request built afresh, as the history
        grows, is compacted, has an image replaced by a line, is cut by a rewind, and is loaded
        again as equal entries whose keys come in another order (only the same objects may
        share bytes); lone surrogates repaired, a non-finite number healed to null."""
        import copy

        from hermes_acp import safejson
        from hermes_acp.engine.agent import _request, _Sizes
        from hermes_acp.engine.model import Schemas, _body

        system = {"role": "system", "content": "You are Hermes."}
        tools = [{"type": "function", "function": {"name": "t"}}]
        fields = {"stream": True, "stream_options": {"include_usage": True}, "tools": tools, "max_tokens": 9}
        sizes = _Sizes()

        def check(live: list[dict[str, Any]]) -> None:
            view = sizes.view(live)
            self.assertEqual(sizes.view(live), view)  # asked again: the same view
            fresh = copy.deepcopy({"model": "m", "messages": _request(system, live), **fields})
            self.assertEqual(_body("m", _request(system, live, view.sent), Schemas.of(tools), {"max_tokens": 9}),
                             safejson.encode(safejson.healed(fresh)))
            self.assertEqual(view.chars, sizes.scan(live)[0])

        def exchange(n: int) -> list[dict[str, Any]]:
            return [{"role": "user", "content": f"read {n} \ud800é"},
                    {"role": "assistant", "content": "", "reasoning": "hm", "reasoning_field": "reasoning",
                     "tool_calls": [{"id": f"c{n}", "type": "function",
                                     "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
                    {"role": "tool", "tool_call_id": f"c{n}", "name": "read_file", "content": f"line {n}\n" * 50},
                    {"role": "assistant", "content": f"done {n} ✓"}]

        live: list[dict[str, Any]] = []
        for n in range(4):  # the history grows, a turn at a time and a message at a time
            for message in exchange(n):
                live.append(message)
                check(live)
        live.append({"role": "tool", "tool_call_id": "x", "name": "t", "content": float("nan")})
        check(live)
        # A compaction: a summary, shortened copies of older entries, the newest ones as they were.
        live = [summaryMessage("c1", "## Goal\nread"), {**live[2], "content": "[removed]"}, *live[4:]]
        check(live)
        live.append({"role": "user", "content": "next"})
        check(live)
        # An image replaced by a line, in place (``_keepNewestImages``).
        image = {"role": "user", "content": [{"type": "text", "text": "see"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
        live.append(image)
        check(live)
        live[-1] = {"role": "user", "content": "(an older image)"}
        sizes.forget(image)
        check(live)
        live[:] = live[:5]  # a rewind cuts the newest turns
        check(live)
        # Loaded again: equal entries, new objects, the tool call's keys in another order.
        loaded = json.loads(json.dumps(live))
        for message in loaded:
            for call in message.get("tool_calls") or ():
                call["function"] = dict(reversed(call["function"].items()))
        check(loaded)
        check(loaded + exchange(9))

    def test_tool_schemas_are_encoded_once_per_tool(self) -> None:
        """A request's tools (``_toolSchemas``): their schemas' bytes are ``bodyJSON`` of the
        list and their size ``charCount`` of it, for none, one and many tools and a non-ASCII
        description; each tool's schema is made once however many requests, sessions and
        subagents send it (``Tool.requestForm``); a body with them and without them is the
        fresh encoding of the same request."""
        import attrs

        from hermes_acp import safejson
        from hermes_acp.config import Endpoint
        from hermes_acp.engine.agent import AIAgent, _fixedChars, _toolSchemas
        from hermes_acp.engine.model import _body, bodyJSON
        from hermes_acp.engine.tools.builtin import selectTools
        from hermes_acp.engine.tools.registry import Tool

        made: list[str] = []
        schema = Tool.schema
        self.patch(Tool, "schema", lambda tool: made.append(tool.name) or schema(tool))
        tools = [attrs.evolve(tool, description=tool.description + " ✓") for tool in selectTools().values()]
        system = {"role": "system", "content": "You are Hermes ✓."}
        for given, new in (([], 0), (tools[:1], 1), (tools, len(tools) - 1), (tools, 0)):
            schemas, chars = _toolSchemas(given)
            self.assertEqual(len(made), new)  # each tool's schema made once, however often it is sent
            listed = [schema(tool) for tool in given]
            self.assertEqual((schemas.body, schemas.count, chars), (bodyJSON(listed), len(given), charCount(listed)))
            self.assertEqual(_fixedChars(system, chars), charCount([system, listed]))
            fresh = {"model": "m", "messages": [system], "stream": True, "stream_options": {"include_usage": True},
                     **({"tools": listed} if listed else {}), "reasoning_effort": "low"}
            self.assertEqual(_body("m", [system], schemas, {"reasoning_effort": "low"}), safejson.encode(fresh))
            made.clear()
        endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", None, "m")
        first, second = AIAgent(endpoint, "/tmp"), AIAgent(endpoint, "/tmp")
        _toolSchemas(first.activeTools().values())
        made.clear()
        for agent in (second, first.child("You are a subagent.")):
            _toolSchemas(agent.activeTools().values())
        self.assertEqual(made, [])  # another session, a subagent: the built-in tools' bytes are made already

    def test_an_image_replaced_by_a_line_is_not_held_by_the_sizes(self) -> None:
        """``_keepNewestImages`` swaps an older image for a line so that memory need not hold its
        bytes: the sizes' cache lets go of the entry and of its request form too."""
        import gc
        import weakref

        from hermes_acp.engine.agent import _Sizes

        class Entry(dict):  # a dict that takes weak references
            pass

        old = Entry(role="user", content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
        sizes, live = _Sizes(), [Entry(role="user", content="hi"), old]
        sizes.view(live)  # its request form and bytes are kept with the list seen last
        held = weakref.ref(old)
        live[1] = Entry(role="user", content="(an older image)")
        sizes.forget(old)
        del old
        gc.collect()
        self.assertIsNone(held())
        self.assertEqual(sizes.total(live), sizes.total(list(live)))

    def test_entries_compacted_away_are_let_go(self) -> None:
        """After a compaction the entries it replaced, and their bytes, are not held by the sizes'
        cache once the next request's ``keep`` and ``view`` ran (64 such entries at most wait)."""
        import gc
        import weakref

        from hermes_acp.engine.agent import _Sizes

        class Entry(dict):  # a dict that takes weak references
            pass

        sizes = _Sizes()
        old = [Entry(role="user", content=f"message {n} " + "x" * 1000) for n in range(80)]
        sizes.view(old)
        held = weakref.ref(old[0])
        live = [Entry(role="user", content=f"kept {n}") for n in range(10)]
        sizes.keep(live)
        sizes.view(live)
        del old
        gc.collect()
        self.assertIsNone(held())

    def test_images_count_as_a_fixed_size(self) -> None:
        from hermes_acp.engine.agent import IMAGE_CHARS, _hasImages, _sentChars

        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 600_000}}
        message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}
        self.assertTrue(_hasImages([message]))
        self.assertLess(_sentChars([message]), IMAGE_CHARS + 200)
        self.assertFalse(_hasImages([{"role": "user", "content": "plain"}]))
