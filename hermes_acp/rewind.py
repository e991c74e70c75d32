"""``/rewind`` and ``/undo``: take back what the agent did, its file changes and the
conversation, to before an earlier turn.

ACP v1 has no rewind method, so these are slash commands; like every slash command they
run as a turn of the session, so a rewind sent while a turn runs waits behind it in the
session's queue and sees that turn finished. The files come back from the turns'
checkpoints (``engine.checkpoints``, ``engine.restore``, imported with the first rewind: not
on the start-up path; the disk work runs on a worker thread), the conversation is cut in the
store (``ISessionStore.rewind``: the model's history, and the journal a ``session/load``
replays, both lose the turns; what was cut stays archived and searchable). Files someone
else changed since the agent last did are not overwritten silently: the user is asked, with
the files listed, through a permission request; "keep" keeps them (and rewinds the rest),
"cancel" or no answer changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred

from .catalog import ModelCatalog
from .interfaces import IPermissionBroker, ISessionStore, IUpdateChannel
from .render import textContent
from .session_state import SessionState
from .updates import usageUpdate

if TYPE_CHECKING:
    from .engine.checkpoints import CheckpointStore
    from .engine.restore import Change

#: The answers to "these files changed since: overwrite them?".
OVERWRITE, KEEP, CANCEL = "overwrite", "keep", "cancel"
CONFLICT_OPTIONS = [
    {"optionId": OVERWRITE, "name": "Rewind, and overwrite my changes to these files", "kind": "allow_once"},
    {"optionId": KEEP, "name": "Rewind the rest, keep my changes to these files", "kind": "reject_once"},
    {"optionId": CANCEL, "name": "Cancel the rewind", "kind": "reject_once"},
]
#: Turns listed by ``/rewind`` (the latest), and files named in the question, at most.
LISTED = 50


def _firstLine(prompt: str) -> str:
    line = next((line.strip() for line in prompt.splitlines() if line.strip()), "")
    return (line[:77] + "…" if len(line) > 80 else line) or "(no text)"


@attrs.frozen
class Rewinds:
    """The rewinds of one connection."""

    store: ISessionStore
    updates: IUpdateChannel
    permissions: IPermissionBroker
    catalog: ModelCatalog
    #: Run disk work on a worker thread (``WorkerPool.run``).
    runInWorker: Callable[..., Deferred[Any]]
    #: The checkpoints (None: off, ``HERMES_ACP_CHECKPOINTS=off``: rewinds cut the conversation only).
    checkpoints: Callable[[], CheckpointStore | None]

    async def list(self, state: SessionState) -> str:
        """The turns, numbered as ``/rewind N`` takes them, with what each changed."""
        rows = await self.store.turns(state)
        if not rows:
            return "No turn to rewind to yet: rewinds take back the turns the model ran in this session."
        hidden = max(0, len(rows) - LISTED)
        changes, notes = await self.runInWorker(self._summaries, state.sessionId, [row[0] for row in rows[hidden:]])
        lines = ["**Turns** (`/rewind N` puts back the files the agent changed from turn N on and cuts the "
                 "conversation to before it; `/undo` takes back the last turn)", ""]
        if hidden:
            lines.append(f"Turns 1 to {hidden} are not listed (only the last {LISTED} are); `/rewind N` takes them too.")
        for number, ((_, start, prompt, _), changed) in enumerate(zip(rows[hidden:], changes), hidden + 1):
            cut = "" if start is not None else " — _before a compaction or /reset: cannot be rewound to_"
            lines.append(f"{number}. “{_firstLine(prompt)}” — {changed}{cut}")
        if self.checkpoints() is None:
            lines += ["", "File checkpoints are off (`HERMES_ACP_CHECKPOINTS=off`): a rewind cuts the conversation only."]
        elif notes:
            lines += ["", "Not in the checkpoints (a rewind leaves them as they are, and removes those a turn created):"]
            lines += [f"- {note}" for note in notes]
        return "\n".join(lines)

    def _summaries(self, sessionId: str, turns: list[int]) -> tuple[list[str], list[str]]:
        """What each turn changed, and what the newest walk left out (a worker thread)."""
        store = self.checkpoints()
        if store is None:
            return ["files not tracked"] * len(turns), []
        from .engine import restore

        return [restore.summary(store, sessionId, turn) for turn in turns], restore.leftOut(store, sessionId)

    async def rewind(self, state: SessionState, argument: str, track: Callable[[Deferred[Any]], None]) -> str:
        if not argument:
            return await self.list(state)
        rows = await self.store.turns(state)
        if not (argument.isascii() and argument.isdigit()) or not 1 <= int(argument) <= len(rows):
            known = f"a turn number from 1 to {len(rows)}" if rows else "a turn number, once there are turns"
            return f"/rewind takes {known} (`/rewind` lists them); `{argument}` is not one. Nothing changed."
        return await self._rewindTo(state, rows, int(argument), track)

    async def undo(self, state: SessionState, argument: str, track: Callable[[Deferred[Any]], None]) -> str:
        if argument:
            return (f"/undo takes back the last turn and takes no argument (`{argument}`); nothing changed. "
                    "`/rewind N` goes back further.")
        rows = await self.store.turns(state)
        if not rows:
            return "Nothing to undo: no turn of the model in this session's conversation."
        return await self._rewindTo(state, rows, len(rows), track)

    async def _rewindTo(self, state: SessionState, rows: list[tuple[int, int | None, str, str]], number: int,
                        track: Callable[[Deferred[Any]], None]) -> str:
        from .engine import restore

        turn, start, prompt, _ = rows[number - 1]
        if start is None:
            return (f"Turn {number} cannot be rewound to: the conversation was compacted (or reset) after it "
                    "began, so the model's history no longer has that point. Nothing changed. `/rewind` lists "
                    "the turns that can be.")
        undone = [row[0] for row in rows[number - 1:]]
        lines = [f"Rewound to before turn {number} (“{_firstLine(prompt)}”)."]
        store, plan, overwrite = self.checkpoints(), None, False
        if store is None:
            lines.append("File checkpoints are off (`HERMES_ACP_CHECKPOINTS=off`): no file was put back.")
        else:
            try:
                plan = await self.runInWorker(restore.plan, store, state.sessionId, undone, state.roots)
            except restore.CheckpointError as e:
                return f"Rewind cancelled, nothing changed: {e}"
            if plan.conflicts:
                answer = await self._ask(state, number, plan.conflicts, track)
                if answer not in (OVERWRITE, KEEP):
                    why = "you chose to cancel it" if answer == CANCEL else f"no answer ({answer})"
                    return f"Rewind cancelled ({why}): nothing changed, files and conversation are as they were."
                overwrite = answer == OVERWRITE
        # Files first: a crash while they are put back leaves the turns in the conversation, and
        # the same /rewind again finishes the job (what is back already is skipped).
        if store is not None and plan is not None:
            problems = await self.runInWorker(restore.apply, store, plan, overwrite)
            lines += restore.report(plan, overwrite, problems)
        cut = await self.store.rewind(state, turn)
        if store is not None:
            await self.runInWorker(store.removeTurns, state.sessionId, undone)
        from .engine.agent import contextTokens  # (not at the top: the engine loads after start-up)

        state.contextUsed = contextTokens(state.history)  # as a turn without usage reports it
        self.updates.send(state, usageUpdate(state, self.catalog))
        lines.append(f"The conversation is back to before turn {number}: the model no longer sees "
                     f"{'that turn' if len(cut) == 1 else f'those {len(cut)} turns'}. They stay archived and "
                     "searchable (session_search); your editor still shows them until the session is loaded again.")
        return "\n\n".join(lines)

    async def _ask(self, state: SessionState, number: int, conflicts: list[Change],
                   track: Callable[[Deferred[Any]], None]) -> str:
        """Ask about the files changed since the agent last did, under a card of their own."""
        toolCallId = f"rewind-{uuid.uuid4().hex[:12]}"
        listed = "\n".join(f"- `{c.path}`: {c.conflict()}" for c in conflicts[:LISTED])
        more = f"\n- … and {len(conflicts) - LISTED} more" if len(conflicts) > LISTED else ""
        text = (f"These files changed since the agent last changed them; rewinding to before turn {number} "
                f"would overwrite those changes:\n{listed}{more}")
        card = {"toolCallId": toolCallId, "title": f"Rewind to before turn {number}: overwrite your changes?",
                "kind": "edit", "status": "pending", "content": [textContent(text)],
                "locations": [{"path": c.absolute} for c in conflicts[:LISTED]]}
        self.updates.send(state, {"sessionUpdate": "tool_call", **card})
        d = self.permissions.choose(state.sessionId, card, CONFLICT_OPTIONS)
        track(d)
        answer = await d
        self.updates.send(state, {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                                  "status": "completed" if answer in (OVERWRITE, KEEP) else "failed"})
        return answer

    async def forgetSession(self, sessionId: str) -> None:
        """``session/delete``: the session's checkpoints go, with the copies only they used."""
        store = self.checkpoints()
        if store is not None:
            await self.runInWorker(store.removeSession, sessionId)
