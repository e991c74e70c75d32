"""Keeping a conversation inside the model's context window (no Twisted).

Before a model request that would pass the threshold, ``Compactor.compact`` makes the history
smaller in steps, stopping as soon as it is under the target:

1. the cheap way: tool results of the older part shortened to one line, identical results
   collapsed into the last one, and huge tool-call arguments (a whole file written) shortened;
2. a summary of the older part, written by the model, that updates the previous summary;
3. when no summary can be had (the request failed, the answer was empty, or the agent stopped
   asking after failures), the oldest units are set aside instead, as few as it takes, and a
   note says what was left out. A long session never dies at its window for want of a summary.

The history is cut into *units* that are never separated: a user message, or an assistant
message with all the results of its tool calls (a parallel batch stays whole). The newest units,
within a token budget, stay verbatim, and so does the user's latest request. The system prompt
and the project instructions are rebuilt for every request, so they are never summarised. The
summary (or the note) joins the history as a user message framed as reference, not as
instructions; the summary request itself is bounded to fit the window. What a compaction
replaces stays in the session's store, archived and found by ``session_search``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hermes_acp.engine.images import IMAGES, withoutImages

Message = dict[str, Any]
Unit = list[Message]

CHARS_PER_TOKEN = 4
#: The keys that mark the summary message, and other user messages the agent wrote (a request
#: to continue a cut-off answer), in the history; the API never sees them (``agent._forAPI``).
SUMMARY_KEY, SYNTHETIC_KEY = "compaction", "synthetic"
FRAME = ("[Context summary: reference only] The earlier part of this conversation was compacted into the "
         "summary below so that it fits the model's context window. It is background, not new instructions: "
         "answer the user's latest message, which comes after it.\n\n")
#: The note that stands for the units set aside (``setAsideMessage``), and the key of the
#: user's requests it names (the newest ``NAMED`` of them, ``NAMED_CHARS`` of each).
SET_ASIDE = ("[Left out to fit the context window: the earlier messages of this conversation could not be "
             "summarised and are not shown.{asked} They are archived: the session_search tool finds them. Answer "
             "the user's latest message, which comes after this note.]")
LEFT_OUT_KEY, NAMED, NAMED_CHARS = "leftOut", 5, 100
#: A tool result of the older part longer than this becomes one line; arguments longer than
#: ``LONG_ARGUMENTS`` have their long strings cut.
LONG_RESULT, LONG_ARGUMENTS, LONG_STRING = 200, 1000, 200
#: A compaction that leaves more than this share of the tokens made no progress.
PROGRESS = 0.95
#: How much of each message the summary request shows, by role (characters).
SHOWN = {"user": 3000, "assistant": 1500, "tool": 600, "arguments": 300}
SUMMARY_PROMPT = """You maintain the working memory of a coding agent whose conversation no longer fits its \
context window. Write the summary that replaces the older part of the conversation: the agent must be able \
to continue the work from it alone. Be concrete (paths, names, commands, numbers, error messages) and brief. \
Use these Markdown sections, leaving out any that would be empty:

## Latest request
The user's most recent request that is not finished yet, quoted verbatim.
## Goal
## Constraints and preferences
Every instruction of the user's that still applies, in their words.
## Done
What was completed, with the files changed.
## Current state
What is in progress; errors being worked on.
## Decisions
## Relevant files
## Remaining work

Write only the summary. Do not answer the user, and do not add anything the conversation does not say."""


def charCount(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


@attrs.frozen
class Budget:
    """Token figures of one model: ``limit`` is what a request may hold (the window less the
    room of the reply); compaction starts over ``threshold`` and aims under ``target``."""

    window: int
    replyRoom: int
    share: float = 0.9

    @classmethod
    def of(cls, window: int, maxTokens: int | None = None, share: float = 0.9) -> Budget:
        room = maxTokens or min(8192, window // 8)
        return cls(window, min(room, window // 2), share)

    @property
    def limit(self) -> int:
        return self.window - self.replyRoom

    @property
    def threshold(self) -> int:
        return int(self.limit * self.share)

    @property
    def target(self) -> int:
        return int(self.limit * min(0.5, self.share * 0.6))

    @property
    def tail(self) -> int:
        """The newest units kept verbatim."""
        return int(self.limit * 0.3)

    @property
    def summaryTokens(self) -> int:
        return min(self.limit // 3, max(512, min(4096, self.limit // 8)))


@attrs.define
class Estimator:
    """Tokens from characters, calibrated by what the endpoint reports for a request."""

    ratio: float = 1.0

    def tokens(self, chars: int) -> int:
        return int(chars / CHARS_PER_TOKEN * self.ratio)

    def chars(self, tokens: int) -> int:
        return int(tokens * CHARS_PER_TOKEN / self.ratio)

    def calibrate(self, sentChars: int, promptTokens: int | None) -> None:
        if promptTokens and sentChars > 4000:
            self.ratio = min(4.0, max(0.25, promptTokens * CHARS_PER_TOKEN / sentChars))


@attrs.frozen
class Outcome:
    """How one compaction ended. ``messages`` is the new history (None: keep the old one);
    ``summary`` what the user is shown; ``before``/``after`` in estimated tokens."""

    status: str  # "completed", "failed" or "cancelled"
    messages: list[Message] | None = None
    #: Of a completed one: "shortened" (the cheap pass was enough), "summarised", or "dropped"
    #: (the oldest units set aside, for want of a summary).
    kind: str = ""
    summary: str = ""
    error: str = ""
    before: int = 0
    after: int = 0
    #: Why the summary request failed, when one was made and failed (the outcome may still
    #: have completed, the oldest units set aside instead).
    summaryFailure: str = ""


class Cancelled(Exception):
    """The summary request was cancelled."""


def units(messages: Sequence[Message]) -> list[Unit]:
    """The history in units: a tool message stays with what precedes it (its call), and so
    does the agent's message of the images those calls returned (``images.imagesMessage``)."""
    found: list[Unit] = []
    for message in messages:
        if (message.get("role") == "tool" or message.get(SYNTHETIC_KEY) == IMAGES) and found:
            found[-1].append(message)
        else:
            found.append([message])
    return found


def flatten(parts: Sequence[Unit]) -> list[Message]:
    return [message for unit in parts for message in unit]


def isSummary(message: Message) -> bool:
    return SUMMARY_KEY in message


def isRequest(message: Message) -> bool:
    """A message of the user's own (not a summary, not one the agent wrote)."""
    return message.get("role") == "user" and SUMMARY_KEY not in message and SYNTHETIC_KEY not in message


def summaryMessage(compactionId: str, summary: str) -> Message:
    return {"role": "user", "content": FRAME + summary, SUMMARY_KEY: compactionId}


def setAsideMessage(compactionId: str, previous: str, requests: Sequence[str], earlier: int = 0) -> Message:
    """The note that stands for units set aside: the previous summary (if any) and what was
    left out, naming the user's newest requests among it (``earlier``: how many more there
    were). It is the history's one summary message (it joins the system prompt before a
    user message, as a summary does); it keeps what it names, for the next note."""
    named = [_cut(r, NAMED_CHARS) for r in requests[-NAMED:]]
    earlier += len(requests) - len(named)
    asked = (f" Among them were the user's requests {', '.join(map(repr, named))}"
             + (f" (and {earlier} earlier ones)." if earlier else ".") if named else "")
    note = SET_ASIDE.format(asked=asked)
    return {"role": "user", "content": f"{FRAME}{previous}\n\n{note}" if previous else note,
            SUMMARY_KEY: compactionId, LEFT_OUT_KEY: {"requests": named, "earlier": earlier}}


def previousSummary(message: Message) -> str:
    """The summary a summary message (or a note) carries, without its framing and note."""
    text = contentText(message.get("content"))
    if LEFT_OUT_KEY in message:
        text = text.partition(SET_ASIDE[:30])[0] if text.startswith(FRAME) else ""
    return text.removeprefix(FRAME).strip()


def contentText(content: Any) -> str:
    """A message's content as text (images and other parts named, not shown)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") if part.get("type") == "text" else f"[{part.get('type', 'part')}]"
                        for part in content if isinstance(part, dict))
    return ""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    if limit < 100:
        return f"[…{len(text):,} characters left out…]"
    head = limit * 2 // 3
    return f"{text[:head]} […{len(text) - limit:,} characters left out…] {text[len(text) - (limit - head):]}"


def _shortArguments(arguments: str) -> str:
    """Valid JSON with the long strings cut, or ``arguments`` as they were when that is
    no shorter (many small values)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return json.dumps({"note": f"{len(arguments):,} characters of arguments removed to save context"})
    if isinstance(value, dict):
        value = {k: f"[{len(v):,} characters removed to save context]" if isinstance(v, str) and len(v) > LONG_STRING
                 else v for k, v in value.items()}
    shortened = json.dumps(value, ensure_ascii=False)
    return shortened if len(shortened) < len(arguments) else arguments


def shorten(older: Sequence[Unit], everything: Sequence[Message]) -> tuple[list[Unit], int]:
    """The cheap pass over the older units: returns them (changed messages copied, never
    edited in place) and how many messages changed. A result identical to a later one of
    ``everything`` becomes a pointer to it."""
    seen: dict[str, int] = {}
    for index, message in enumerate(everything):
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            seen[message["content"]] = index
    position = {id(m): i for i, m in enumerate(everything)}
    changed, result = 0, []
    for unit in older:
        kept: Unit = []
        for message in unit:
            content = message.get("content")
            if message.get("role") == "tool" and isinstance(content, str) and len(content) > LONG_RESULT:
                name = message.get("name") or "the tool"
                if seen.get(content, -1) > position.get(id(message), -1):
                    line = f"[Same output as a later {name} call below.]"
                else:
                    first = next((ln.strip() for ln in content.splitlines() if ln.strip()), "")[:120]
                    line = (f"[Earlier output of {name}: {len(content):,} characters, removed to save context. "
                            f"It began: {first!r}. Run the tool again if you need it.]")
                if len(line) < len(content):  # a short result would grow (the line quotes its start)
                    message = {**message, "content": line}
                    changed += 1
            elif message.get(SYNTHETIC_KEY) == IMAGES or (isRequest(message) and isinstance(content, list)):
                shown = withoutImages(message, "[An image was here; removed to save context. Read it again if you "
                                               "need it.]")
                changed += shown is not message
                message = shown
            elif message.get("tool_calls") and any(len(c["function"]["arguments"]) > LONG_ARGUMENTS
                                                   for c in message["tool_calls"]):
                calls = [{**c, "function": {**c["function"], "arguments": _shortArguments(c["function"]["arguments"])}}
                         if len(c["function"]["arguments"]) > LONG_ARGUMENTS else c for c in message["tool_calls"]]
                if calls != message["tool_calls"]:
                    message = {**message, "tool_calls": calls}
                    changed += 1
            kept.append(message)
        result.append(kept)
    return result, changed


def squeeze(parts: Sequence[Unit], limit: int) -> list[Unit]:
    """The newest units when even they do not fit: their tool results cut to ``limit``
    characters each (head and tail kept)."""
    return [[{**m, "content": _cut(m["content"], limit)}
             if m.get("role") == "tool" and isinstance(m.get("content"), str) and len(m["content"]) > limit else m
             for m in unit] for unit in parts]


def transcript(older: Sequence[Unit], budget: int) -> str:
    """The older units as the summary request shows them, within ``budget`` characters:
    long messages cut, and if that is not enough, the oldest left out (said so)."""
    lines: list[str] = []
    for message in flatten(older):
        role, text = message.get("role"), contentText(message.get("content"))
        if isSummary(message) or SYNTHETIC_KEY in message:
            continue
        if role == "user":
            lines.append(f"USER: {_cut(text, SHOWN['user'])}")
        elif role == "assistant":
            said = [f"ASSISTANT: {_cut(text, SHOWN['assistant'])}"] if text.strip() else []
            said += [f"ASSISTANT called {c['function']['name']}({_cut(c['function']['arguments'], SHOWN['arguments'])})"
                     for c in message.get("tool_calls") or ()]
            lines.extend(said)
        elif role == "tool":
            lines.append(f"RESULT of {message.get('name') or 'a tool'}: {_cut(text, SHOWN['tool'])}")
    size, first = sum(len(line) + 1 for line in lines), 0
    while size > budget and first < len(lines):
        size -= len(lines[first]) + 1
        first += 1
    left = f"[{first} earlier entries left out: they do not fit the summary request]\n" if first else ""
    return left + _cut("\n".join(lines[first:]), budget)


Summarise = Callable[[list[Message], int], str]


@attrs.define
class Compactor:
    """One compaction of the history ``live`` (the messages after the system prompt).

    ``fixed`` is the token size of what is not compacted (system prompt, tool schemas);
    ``summarise(messages, maxTokens)`` asks the model for the summary (raises ``Cancelled``
    or any error, which fails the compaction); ``measure`` gives the characters of
    messages as the endpoint receives them."""

    budget: Budget
    estimator: Estimator
    summarise: Summarise
    measure: Callable[[Sequence[Message]], int] = lambda messages: charCount(list(messages))

    def size(self, messages: Sequence[Message]) -> int:
        return self.estimator.tokens(self.measure(messages))

    def compact(self, compactionId: str, live: Sequence[Message], fixed: int, focus: str = "",
                force: bool = False, ask: bool = True) -> Outcome:
        """Compact ``live``; ``force`` (``/compact``, an overflow) writes a summary even when
        the cheap pass got under the target. Without ``ask`` (the agent stopped asking after
        failed summaries), or when the summary fails, the oldest units are set aside instead."""
        before = fixed + self.size(live)
        if not live:
            return Outcome("failed", error="the conversation is empty", before=before, after=before)
        parts = units(live)
        tail = min(self.budget.tail, (before - fixed) // 3) if force else self.budget.tail
        keep, used = len(parts), 0
        while keep > 1 and used + self.size(parts[keep - 1]) <= tail:
            keep -= 1
            used += self.size(parts[keep])
        keep = min(keep, len(parts) - 1)  # the newest unit always stays
        while keep < len(parts) - 1 and SYNTHETIC_KEY in parts[keep][0]:
            keep += 1  # a request to continue stays with the answer it continues (no two user turns)
        if SYNTHETIC_KEY in parts[keep][0]:
            keep = max(0, keep - 1)  # it is the newest: that answer stays too
        older, newest = parts[:keep], parts[keep:]
        cheap, changed = shorten(older, live)
        candidate = flatten(cheap + newest)  # in order: nothing moves in the cheap pass
        after = fixed + self.size(candidate)
        if changed and after < before and after <= self.budget.target and not force:
            return Outcome("completed", candidate, "shortened", f"Shortened {changed} earlier tool results and "
                           f"arguments (about {before:,} → {after:,} tokens).", before=before, after=after)
        latest = next((i for i in range(len(older) - 1, -1, -1) if isRequest(older[i][0])), None)
        pinned: list[Unit] = []
        if latest is not None and not any(isRequest(u[0]) for u in newest):
            pinned = [older[latest]]  # the user's latest request stays verbatim, right after the summary
            older = older[:latest] + older[latest + 1:]
        else:
            latest = None
        if not any(not isSummary(m) for m in flatten(older)):
            squeezed = self._squeezed(flatten(older + pinned), newest, fixed)  # the summary stays, and the request once
            after = fixed + self.size(squeezed)
            if after > (before - fixed) * PROGRESS + fixed:
                return Outcome("failed", error=f"nothing old enough to compact: all {before - fixed:,} tokens of the "
                               "conversation are its latest exchange (the system prompt and tools are "
                               f"{fixed:,} more)", before=before, after=before)
            return Outcome("completed", squeezed, "shortened", "Cut the newest tool results to fit "
                           f"(about {before:,} → {after:,} tokens).", before=before, after=after)
        floor = fixed + self.size(self._squeezed(flatten(pinned), newest, fixed))  # with nothing older at all
        if not ask or floor - fixed > (before - fixed) * PROGRESS:  # (then no summary can help: none is asked for)
            return self._setAside(compactionId, cheap, latest, newest, fixed, before, force)
        previous = next((contentText(m.get("content")).removeprefix(FRAME) for m in flatten(older) if isSummary(m)), "")
        try:
            summary = self._summary(older, previous, focus).strip()
        except Cancelled:
            return Outcome("cancelled", error="cancelled", before=before, after=before)
        except Exception as e:
            return self._setAside(compactionId, cheap, latest, newest, fixed, before, force, f"the summary request failed: {e}")
        if not summary:
            return self._setAside(compactionId, cheap, latest, newest, fixed, before, force, "the model wrote an empty summary")
        summary = _cut(summary, self.estimator.chars(self.budget.summaryTokens * 3 // 2))  # it ignored max_tokens
        head = [summaryMessage(compactionId, summary), *flatten(pinned)]
        messages = head + flatten(newest)
        after = fixed + self.size(messages)
        if after > self.budget.target:  # the newest alone are too big: cut their tool results
            messages = self._squeezed(head, newest, fixed)
            after = fixed + self.size(messages)
        if after - fixed > (before - fixed) * PROGRESS:  # a summary too long: setting aside may do better
            return self._setAside(compactionId, cheap, latest, newest, fixed, before, force)
        return Outcome("completed", messages, "summarised", summary, before=before, after=after)

    def _setAside(self, compactionId: str, cheap: list[Unit], latest: int | None, newest: list[Unit], fixed: int,
                  before: int, force: bool, failure: str = "") -> Outcome:
        """For want of a summary (``failure``: why the request failed): the oldest of the
        ``cheap`` units set aside, as few as it takes to get under the target (with ``force``,
        all of them: what the summary would have replaced), and a note in their place. The
        user's latest request (at ``latest``) stays; a request to continue a cut-off answer
        goes with that answer (no two user turns in a row); the newest tool results are cut
        when even setting everything aside is not enough."""
        old = next((u[0] for u in cheap if isSummary(u[0])), None)
        previous = _cut(previousSummary(old), self.estimator.chars(min(self.budget.summaryTokens,
                                                                       self.budget.target // 3))) if old else ""
        left = (old or {}).get(LEFT_OUT_KEY) or {}
        requests: list[str] = list(left.get("requests", ()))
        sizes = [0 if isSummary(u[0]) else self.size(u) for u in cheap]
        kept, rest = sum(sizes), self.size(flatten(newest))
        noteSize = self.size([setAsideMessage(compactionId, previous, ["n" * NAMED_CHARS] * NAMED, 1)])  # at most
        after, gone = fixed + self.size(flatten(cheap)) + rest, set[int]()
        for i in (i for i, u in enumerate(cheap) if i != latest and not isSummary(u[0])):
            if after <= self.budget.target and not force:
                break
            follows = i + 1 < len(cheap) and SYNTHETIC_KEY in cheap[i + 1][0]  # "continue" goes with its answer
            for j in (i, i + 1) if follows else (i,):
                if j not in gone:
                    gone.add(j)
                    kept -= sizes[j]
                    if isRequest(cheap[j][0]):
                        requests.append(contentText(cheap[j][0].get("content")))
            after = fixed + noteSize + kept + rest
        if not gone:
            messages = flatten(cheap + newest)
        else:
            note = setAsideMessage(compactionId, previous, requests, left.get("earlier", 0))
            head = [note, *flatten([u for i, u in enumerate(cheap) if i not in gone and not isSummary(u[0])])]
            messages = head + flatten(newest)
            if fixed + self.size(messages) > self.budget.target:
                messages = self._squeezed(head, newest, fixed)
        after = fixed + self.size(messages)
        if after - fixed > (before - fixed) * PROGRESS:
            why = f"{failure}; " if failure else ""
            return Outcome("failed", error=f"no progress: {why}without the older messages the conversation is still "
                           f"{after:,} tokens, it was {before:,}", before=before, after=before, summaryFailure=failure)
        if not gone:
            return Outcome("completed", messages, "shortened", f"Shortened earlier tool results and arguments "
                           f"(about {before:,} → {after:,} tokens).", before=before, after=after,
                           summaryFailure=failure)
        count = sum(len(cheap[i]) for i in gone)
        return Outcome("completed", messages, "dropped", f"Set aside the {count} oldest messages: they are archived, "
                       "and session_search still finds them.", before=before, after=after, summaryFailure=failure)

    def _squeezed(self, head: list[Message], newest: Sequence[Unit], fixed: int) -> list[Message]:
        """``head`` and the ``newest`` units with their tool results cut toward the target."""
        room = self.estimator.chars(self.budget.target - fixed - self.size(head))
        results = sum(m.get("role") == "tool" for m in flatten(newest))
        if not results:
            return head + flatten(newest)
        return head + flatten(squeeze(newest, max(500, room // results)))

    def _summary(self, older: Sequence[Unit], previous: str, focus: str) -> str:
        """Ask for the summary, in a request that fits: the previous summary, then as much
        of the transcript as there is room for (half of it again after an overflow)."""
        room = self.budget.limit - self.budget.summaryTokens - self.estimator.tokens(len(SUMMARY_PROMPT)) - 200
        if room < 200:
            raise ValueError(f"the window ({self.budget.window:,} tokens) is too small for a summary request")
        previous = _cut(previous, self.estimator.chars(room) // 3)
        budget = self.estimator.chars(room) - len(previous) - 200
        for attempt in (0, 1):
            parts = [f"The previous summary (update it; keep what still holds):\n\n{previous}\n\n" if previous else "",
                     f"The conversation since {'then' if previous else 'the start'}:\n\n{transcript(older, budget)}\n\n",
                     f"Focus on: {focus}\n\n" if focus else "",
                     "Write the new summary now."]
            request = [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": "".join(parts)}]
            try:
                return self.summarise(request, self.budget.summaryTokens)
            except Exception as e:
                if attempt or not getattr(e, "overflow", False):
                    raise
                budget //= 2  # the estimate was short of the endpoint's count
        raise AssertionError("unreachable")
