"""``/rewind`` and ``/undo``: take back what the agent did, its file changes and the
conversation, to before an earlier turn.

ACP v1 has no rewind method, so these are slash commands; like every slash command they
run as a turn of the session, so a rewind sent while a turn runs waits behind it in the
session's queue and sees that turn finished. The files come back from the turns'
checkpoints (``engine.checkpoints``, ``engine.restore``; the disk work runs on a worker
thread), the conversation is cut in the store (``ISessionStore.rewind``: the model's
history, and the journal a ``session/load`` replays, both lose the turns; what was cut stays
archived and searchable). Files someone else changed since the agent last did are not
overwritten silently: the user is asked, with the files listed, through a permission
request; "keep" keeps them (and rewinds the rest), "cancel" or no answer changes nothing.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred

from .catalog import ModelCatalog
from .engine import restore
from .engine.checkpoints import FOLDER, CheckpointError, CheckpointStore
from .interfaces import IPermissionBroker, ISessionStore, IUpdateChannel
from .render import textContent
from .session_state import SessionState
from .updates import usageUpdate

#: The answers to "these files changed since: overwrite them?".
OVERWRITE, KEEP, CANCEL = "overwrite", "keep", "cancel"
CONFLICT_OPTIONS = [
    {"optionId": OVERWRITE, "name": "Rewind, and overwrite my changes to these files", "kind": "allow_once"},
    {"optionId": KEEP, "name": "Rewind the rest, keep my changes to these files", "kind": "reject_once"},
    {"optionId": CANCEL, "name": "Cancel the rewind", "kind": "reject_once"},
]
#: Paths named in one message at most (the rest are counted), and turns listed by ``/rewind``.
SHOWN = 20
LISTED = 50


def _firstLine(prompt: str) -> str:
    line = next((line.strip() for line in prompt.splitlines() if line.strip()), "")
    return (line[:77] + "…" if len(line) > 80 else line) or "(no text)"


def _paths(paths: list[str]) -> str:
    shown = ", ".join(f"`{path}`" for path in paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


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
    checkpoints: CheckpointStore | None

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
        if self.checkpoints is None:
            lines += ["", "File checkpoints are off (`HERMES_ACP_CHECKPOINTS=off`): a rewind cuts the conversation only."]
        elif notes:
            lines += ["", "Not in the checkpoints (a rewind leaves them as they are, and removes those a turn created):"]
            lines += [f"- {note}" for note in notes]
        return "\n".join(lines)

    def _summaries(self, sessionId: str, turns: list[int]) -> tuple[list[str], list[str]]:
        """What each turn changed in the session's folders, in a few words, and what the newest
        checkpoint left out (a worker thread)."""
        return [self._summary(sessionId, turn) for turn in turns], self._leftOut(sessionId)

    def _leftOut(self, sessionId: str) -> list[str]:
        """The notes of the newest walk: ignored paths, huge files, folders not covered."""
        if self.checkpoints is None:
            return []
        for turn in reversed(self.checkpoints.turns(sessionId)):
            with contextlib.suppress(CheckpointError):
                manifest = (self.checkpoints.manifest(sessionId, turn, "after")
                            or self.checkpoints.manifest(sessionId, turn, "before"))
                if manifest is not None:
                    return list(manifest.get("notes", ()))
        return []

    def _summary(self, sessionId: str, turn: int) -> str:
        if self.checkpoints is None:
            return "files not tracked"
        try:
            before = self.checkpoints.manifest(sessionId, turn, "before")
            after = self.checkpoints.manifest(sessionId, turn, "after")
        except CheckpointError as e:
            return f"its checkpoint is unreadable ({e})"
        if before is None:
            if self.checkpoints.pruned(sessionId, turn):
                return "its checkpoint was pruned (HERMES_ACP_CHECKPOINT_STORE_MAX): its changes stay"
            return "no file changes"
        if after is None:
            return "changes not recorded (the turn did not finish)"
        kinds: dict[str, list[str]] = {"changed": [], "created": [], "deleted": []}
        for _, path, old, new in restore.turnChanges(before, after):
            if FOLDER not in ((old or [None])[0], (new or [None])[0]):
                kinds["created" if old is None else "deleted" if new is None else "changed"].append(path)
        parts = [f"{len(paths)} {kind} ({', '.join(f'`{p}`' for p in paths[:3])}{', …' if len(paths) > 3 else ''})"
                 for kind, paths in kinds.items() if paths]
        return ", ".join(parts) or "no file changes"

    async def rewind(self, state: SessionState, argument: str, track: Callable[[Deferred[Any]], None]) -> str:
        rows = await self.store.turns(state)
        if not argument:
            return await self.list(state)
        if not argument.isdigit() or not 1 <= int(argument) <= len(rows):
            known = f"a turn number from 1 to {len(rows)}" if rows else "a turn number, once there are turns"
            return f"/rewind takes {known} (`/rewind` lists them); `{argument}` is not one. Nothing changed."
        return await self._rewindTo(state, rows, int(argument), track)

    async def undo(self, state: SessionState, argument: str, track: Callable[[Deferred[Any]], None]) -> str:
        if argument:
            return f"/undo takes back the last turn and takes no argument (`{argument}`); nothing changed. " \
                   "`/rewind N` goes back further."
        rows = await self.store.turns(state)
        if not rows:
            return "Nothing to undo: no turn of the model in this session's conversation."
        return await self._rewindTo(state, rows, len(rows), track)

    async def _rewindTo(self, state: SessionState, rows: list[tuple[int, int | None, str, str]], number: int,
                        track: Callable[[Deferred[Any]], None]) -> str:
        turn, start, prompt, _ = rows[number - 1]
        if start is None:
            return (f"Turn {number} cannot be rewound to: the conversation was compacted (or reset) after it "
                    "began, so the model's history no longer has that point. Nothing changed. `/rewind` lists "
                    "the turns that can be.")
        undone = [row[0] for row in rows[number - 1:]]
        lines = [f"Rewound to before turn {number} (“{_firstLine(prompt)}”)."]
        plan, overwrite = None, False
        if self.checkpoints is None:
            lines.append("File checkpoints are off (`HERMES_ACP_CHECKPOINTS=off`): no file was put back.")
        else:
            try:
                plan = await self.runInWorker(restore.plan, self.checkpoints, state.sessionId, undone)
            except CheckpointError as e:
                return f"Rewind cancelled, nothing changed: {e}"
            if plan.conflicts:
                answer = await self._ask(state, number, plan.conflicts, track)
                if answer not in (OVERWRITE, KEEP):
                    why = "you chose to cancel it" if answer == CANCEL else f"no answer ({answer})"
                    return f"Rewind cancelled ({why}): nothing changed, files and conversation are as they were."
                overwrite = answer == OVERWRITE
        cut = await self.store.rewind(state, turn)
        if plan is not None and self.checkpoints is not None:
            problems = await self.runInWorker(restore.apply, self.checkpoints, plan, overwrite)
            await self.runInWorker(self.checkpoints.removeTurns, state.sessionId, undone)
            lines += self._filesReport(plan, overwrite, problems)
        from .engine.compaction import CHARS_PER_TOKEN, charCount  # as turns.estimateTokens (not imported: a cycle)

        state.contextUsed = sum(charCount(m) for m in state.history) // CHARS_PER_TOKEN
        self.updates.send(state, usageUpdate(state, self.catalog))
        lines.append(f"The conversation is back to before turn {number}: the model no longer sees "
                     f"{'that turn' if len(cut) == 1 else f'those {len(cut)} turns'}. They stay archived and "
                     "searchable (session_search); your editor still shows them until the session is loaded again.")
        return "\n\n".join(lines)

    @staticmethod
    def _filesReport(plan: restore.RewindPlan, overwrite: bool, problems: list[str]) -> list[str]:
        done = plan.restore + (plan.conflicts if overwrite else [])
        files = [c for c in done if FOLDER not in ((c.target or [None])[0], (c.left or [None])[0])]
        lines = []
        if files:
            groups: dict[str, list[str]] = {}
            for change in files:
                groups.setdefault(change.describe(), []).append(change.path)
            lines.append("Files put back: " + "; ".join(f"{what}: {_paths(paths)}" for what, paths in groups.items()) + ".")
        else:
            lines.append("No file needed putting back.")
        if plan.conflicts:
            verb = "Overwrote" if overwrite else "Kept"
            lines.append(f"{verb} your changes to {_paths([c.path for c in plan.conflicts])}.")
        if problems:
            lines.append("Could not put back: " + "; ".join(problems[:SHOWN]) + ".")
        lines += plan.notes[:SHOWN]
        lines.append(restore.OUTSIDE)
        return lines

    async def _ask(self, state: SessionState, number: int, conflicts: list[restore.Change],
                   track: Callable[[Deferred[Any]], None]) -> str:
        """Ask about the files changed since the agent last did, under a card of their own."""
        toolCallId = f"rewind-{uuid.uuid4().hex[:12]}"
        listed = "\n".join(f"- `{c.path}`: {_conflict(c)}" for c in conflicts[:50])
        more = f"\n- … and {len(conflicts) - 50} more" if len(conflicts) > 50 else ""
        text = (f"These files changed since the agent last changed them; rewinding to before turn {number} "
                f"would overwrite those changes:\n{listed}{more}")
        card = {"toolCallId": toolCallId, "title": f"Rewind to before turn {number}: overwrite your changes?",
                "kind": "edit", "status": "pending", "content": [textContent(text)],
                "locations": [{"path": c.absolute} for c in conflicts[:50]]}
        self.updates.send(state, {"sessionUpdate": "tool_call", **card})
        d = self.permissions.choose(state.sessionId, card, CONFLICT_OPTIONS)
        track(d)
        answer = await d
        self.updates.send(state, {"sessionUpdate": "tool_call_update", "toolCallId": toolCallId,
                                  "status": "completed" if answer in (OVERWRITE, KEEP) else "failed"})
        return answer

    async def forgetSession(self, sessionId: str) -> None:
        """``session/delete``: the session's checkpoints go, with the copies only they used."""
        if self.checkpoints is not None:
            await self.runInWorker(self.checkpoints.removeSession, sessionId)


def _conflict(change: restore.Change) -> str:
    if change.now is None:
        return "deleted since"
    if change.left is None:
        return "created again since the agent deleted it"
    return "changed since"

