"""Putting back what turns changed, from their checkpoints (``engine.checkpoints``).

A rewind undoes the agent's changes, not the user's: for every path that some turn from
the rewind's target on changed (its ``before`` and ``after`` manifests differ there), the
path goes back to what it was before the first of those turns changed it, and only when
it still is what the last of them left. A path that is something else by now was changed
since by someone else (the user, another program): it is a *conflict*, put back only when
the user says so (``apply(..., overwrite=True)``). Paths no turn changed are never touched,
so nothing like ``git clean`` can remove the user's own new files. A walk cannot tell who
changed a path, so two more cases are conflicts: what another session's turn changed while
one of these turns ran (``_concurrent``), and an ignored path the turns created in which
something changed after them (no copy of it was kept to compare).

What cannot be put back is said (``RewindPlan.notes``): ignored paths and files over the
size bound that existed before (no copy was kept; ignored or huge paths the agent created
are removed), folders that were not checkpointed, and everything outside the session's
folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from hermes_acp.engine.atomic import replaceFile
from hermes_acp.engine.checkpoints import (
    FILE, FOLDER, HUGE, IGNORED, LINK, CheckpointError, CheckpointStore, Entry, delta, same, sessionRoots,
)

OUTSIDE = ("Changes outside the session's folders (other folders, the network, processes, services) "
           "cannot be undone.")
#: Paths named in one message at most (the rest are counted).
SHOWN = 20

#: Seconds before a checkpoint's manifest was written that its walk is taken to have begun,
#: for manifests that do not say (``began``).
SLACK = 10.0


@attrs.frozen
class Change:
    """One path a rewind puts back: ``target`` (before the turns; None: absent), what the
    agent ``left`` there, and what is there ``now``."""

    root: str
    path: str
    target: Entry | None
    left: Entry | None
    now: Entry | None
    #: Another session's turn ran at the same time and may have made this change, not ours.
    shared: bool = False

    @property
    def absolute(self) -> str:
        return os.path.join(self.root, self.path)

    @property
    def isFolder(self) -> bool:
        return FOLDER in ((self.target or [None])[0], (self.left or [None])[0])

    def describe(self) -> str:
        """What the rewind does to it, in a few words."""
        if self.target is None:
            return "remove (created since)"
        if self.now is None:
            return "recreate (deleted since)"
        return "restore"

    def conflict(self) -> str:
        """How it changed since the agent left it, in a few words."""
        if self.shared:
            return "another session's turn in this folder ran at the same time and may have changed it"
        if self.now is None:
            return "deleted since"
        if self.left is not None and self.left[0] == IGNORED:
            return "ignored since the turn changed the ignore rules: whether it changed after is not known"
        if self.left is None:
            return "created again since the agent deleted it"
        return "changed since"


@attrs.frozen
class RewindPlan:
    """What a rewind would do; ``conflicts`` were changed since by someone else."""

    restore: list[Change]
    conflicts: list[Change]
    notes: list[str]


def turnChanges(before: dict[str, Any], after: dict[str, Any],
                unknown: bool = False) -> Iterator[tuple[str, str, Entry | None, Entry | None]]:
    """(root, path, before, after) for each path one turn changed. A path under an ignored
    folder in either state is left out: nothing is known of it there (a ``.gitignore`` the
    turn changed must not make its files look created or deleted); with ``unknown``, a path
    the turn's new rules hid is given as ignored after it (its copy from before is kept)."""
    for root, entries in before["roots"].items():
        if entries is None:
            continue
        changed = after.get("changed", {}).get(root, {})
        removed = after.get("removed", {}).get(root, [])
        hidden = {p for p, e in entries.items() if e[0] == IGNORED} | {p for p, e in changed.items() if e[0] == IGNORED}

        def covered(path: str) -> bool:
            while "/" in path:
                path = path.rsplit("/", 1)[0]
                if path in hidden:
                    return True
            return False

        for path, entry in changed.items():
            if not covered(path):
                yield root, path, entries.get(path), entry
        for path in removed:
            if not covered(path):
                yield root, path, entries[path], None
            elif unknown:
                yield root, path, entries[path], [IGNORED]


def plan(store: CheckpointStore, sessionId: str, turns: list[int], roots: Iterable[str] | None = None) -> RewindPlan:
    """What undoing ``turns`` (the store's turn numbers, in order) would do. Turns without a
    checkpoint changed nothing the engine knew of; a turn without an ``after`` manifest (the
    agent stopped mid-turn) is taken to have left what the next checkpoint, or the disk now, shows.
    With ``roots`` (the session's folders now), a folder the turns ran in that is not one of
    them (the session was loaded elsewhere since) is left as it is, and said.
    CheckpointError when a manifest is damaged."""
    allowed = None if roots is None else sessionRoots(roots)[0]
    first: dict[tuple[str, str], Entry | None] = {}
    last: dict[tuple[str, str], Entry | None] = {}
    notes: list[str] = []
    taken = [turn for turn in store.turns(sessionId) if turn in set(turns)]
    if any(store.pruned(sessionId, turn) for turn in turns):
        notes.append("Some of these turns' checkpoints were pruned to keep the store under "
                     "HERMES_ACP_CHECKPOINT_STORE_MAX: what those turns changed stays.")
    for turn in turns:
        if (problem := store.failure(sessionId, turn)) is not None:
            notes.append(f"A checkpoint of these turns failed ({problem}): what that turn changed stays.")
    windows = []
    for index, turn in enumerate(taken):
        before = store.manifest(sessionId, turn, "before")
        span = store.span(sessionId, turn)
        if before is None or span is None:
            continue
        windows.append((before.get("began", span[0] - SLACK), span[1]))
        after = store.manifest(sessionId, turn, "after") or _afterwards(store, sessionId, taken[index + 1:], before)
        for root, entries in before["roots"].items():
            if entries is None:
                notes.append(f"{root} was not checkpointed before one of these turns: its changes there stay.")
        notes += [note for note in before.get("notes", ()) if "not checkpointed" in note]
        for root, path, old, new in turnChanges(before, after, unknown=True):
            if allowed is not None and not any(_within(root, k) for k in allowed):
                notes.append(f"{root} is not one of this session's folders now: what the turns changed there stays.")
                continue
            first.setdefault((root, path), old)
            last[(root, path)] = new
    others = _concurrent(store, sessionId, windows, {root for root, _ in first})
    restore, conflicts = [], []
    for (root, path), target in sorted(first.items()):
        change = Change(root, path, target, last[(root, path)], store.current(os.path.join(root, path)),
                        shared=os.path.join(root, path) in others)
        if same(change.now, target):
            continue
        targetKind, leftKind = (target or [None])[0], (change.left or [None])[0]
        if targetKind in (IGNORED, HUGE):
            why = "was ignored" if targetKind == IGNORED else "was over the size bound"
            notes.append(f"{path} cannot be put back: it {why}, so no copy was kept.")
        elif leftKind == IGNORED and target is not None:
            conflicts.append(change)  # ignored since (new rules): its copy is kept, what the turn left is not
        elif leftKind == IGNORED:  # created since, and ignored (a build folder): removed,
            # unless something in it changed after the turns (nothing of its content is kept)
            ended = max((end for _, end in windows), default=float("inf"))
            (conflicts if _changedAfter(change.absolute, ended, store.limits.maxFiles) else restore).append(change)
        elif change.shared and FOLDER not in (targetKind, leftKind):
            conflicts.append(change)  # a walk cannot tell whose change it was: the user says
        elif same(change.now, change.left) or (FOLDER in (targetKind, leftKind)
                                                and (change.now is None or change.now[0] == FOLDER)):
            restore.append(change)
        else:
            conflicts.append(change)
    return RewindPlan(restore, conflicts, list(dict.fromkeys(notes)))


def _concurrent(store: CheckpointStore, sessionId: str, windows: list[tuple[float, float]],
                roots: set[str]) -> set[str]:
    """The paths (absolute) that turns of *other* sessions changed in ``roots`` while one of
    ours was between its checkpoint's walk and the record of its end (``windows``). A walk records what a folder
    holds, not who changed it: two sessions working in one folder at once each see the
    other's changes as their own, and a rewind must not take back the other session's work
    without asking. The other turn's changes come after its ``before`` manifest and before
    its ``after`` one."""
    found: set[str] = set()
    if not windows:
        return found
    for other in store.sessions():
        if other == sessionId:
            continue
        with contextlib.suppress(CheckpointError, OSError):
            later = store.turns(other)
            for index, turn in enumerate(later):
                span = store.span(other, turn)
                if span is None or not any(span[0] < end and began < span[1] for began, end in windows):
                    continue
                before = store.manifest(other, turn, "before")
                shared = {root: entries for root, entries in (before or {}).get("roots", {}).items()
                          if any(_within(root, ours) or _within(ours, root) for ours in roots)}
                if not shared:
                    continue  # other folders: nothing of ours
                before = {**before, "roots": shared}  # type: ignore[dict-item]
                after = store.manifest(other, turn, "after") or _afterwards(store, other, later[index + 1:], before)
                found |= {os.path.join(root, path) for root, path, _, _ in turnChanges(before, after)}
    return found


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _changedAfter(path: str, when: float, limit: int) -> bool:
    """Whether anything at or under ``path`` changed (its ctime: content, mode or name) after
    ``when``; a folder too big to look through (over ``limit`` entries) counts as changed."""
    if when == float("inf"):
        return False
    threshold = int(when * 1e9)
    seen = 0
    pending = [path]
    while pending:
        current = pending.pop()
        try:
            info = os.lstat(current)
        except OSError:
            continue
        seen += 1
        if info.st_ctime_ns > threshold or seen > limit:
            return True
        if stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError):
                pending += [os.path.join(current, name) for name in os.listdir(current)]
    return False


def _afterwards(store: CheckpointStore, sessionId: str, later: list[int], before: dict[str, Any]) -> dict[str, Any]:
    """The ``after`` of a turn that never wrote one: the next checkpoint's state, else the disk's."""
    nextOne = store.manifest(sessionId, later[0], "before") if later else None
    changed: dict[str, dict[str, Entry]] = {}
    removed: dict[str, list[str]] = {}
    for root, entries in before["roots"].items():
        if entries is None:
            continue
        now = nextOne["roots"].get(root) if nextOne else store.scan(root).entries
        if now is not None:
            changed[root], removed[root] = delta(entries, now)
    return {"changed": changed, "removed": removed}


def apply(store: CheckpointStore, rewind: RewindPlan, overwrite: bool) -> list[str]:
    """Put the plan's paths back (and its conflicts too with ``overwrite``); the problems met,
    one line each (the rest is done regardless). A path that changed since the plan looked at
    it is left alone. Removals go first, deepest first; then what comes back, parents first;
    last, folders the turns created, when they are empty."""
    problems: list[str] = []
    changes = []
    for change in rewind.restore + (rewind.conflicts if overwrite else []):
        if same(store.current(change.absolute), change.now):
            changes.append(change)
        else:  # while the user was asked, say: what they answered about is not what is there now
            problems.append(f"{change.path}: changed again since the rewind looked at it, left as it is")
    for change in sorted((c for c in changes if c.target is None), key=lambda c: -c.path.count("/")):
        if change.left is not None and change.left[0] == FOLDER:
            continue  # at the end, when emptied
        try:
            _remove(change)
        except OSError as e:
            problems.append(f"{change.path}: not removed ({e.strerror or e})")
    for change in sorted((c for c in changes if c.target is not None), key=lambda c: c.path.count("/")):
        try:
            _put(store, change)
        except (OSError, CheckpointError) as e:
            problems.append(f"{change.path}: not restored ({getattr(e, 'strerror', None) or e})")
    for change in sorted((c for c in changes if c.target is None and c.left and c.left[0] == FOLDER),
                         key=lambda c: -c.path.count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(_inside(change))  # not empty: something not the agent's is in it
    for root in {change.root for change in changes}:
        store.forget(root)
    return problems


def _inside(change: Change) -> str:
    """The path, after checking that its folder (the part of it that exists) still lies
    inside the session folder: a link swapped in for a parent folder must not lead a
    restore elsewhere."""
    existing = os.path.dirname(change.absolute)
    while not os.path.lexists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    parent, root = os.path.realpath(existing), os.path.realpath(change.root)
    if parent != root and not parent.startswith(root.rstrip("/") + "/"):
        raise OSError(f"its folder now leads outside {change.root}")
    return change.absolute


def _remove(change: Change) -> None:
    path = _inside(change)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _put(store: CheckpointStore, change: Change) -> None:
    target = change.target
    assert target is not None
    path = _inside(change)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kind = target[0]
    if kind == FOLDER:
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
            os.unlink(path)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, target[1])
        return
    data = store.get(target[6])
    if os.path.isdir(path) and not os.path.islink(path):
        # The turns made a folder of it; their files in it are gone by now (removals come
        # first): anything else in it is someone else's, and stays.
        if any(names for _, _, names in os.walk(path)):
            raise OSError("a folder is there now, with files in it no turn made: left as it is")
        shutil.rmtree(path)
    if kind == LINK:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.symlink(os.fsdecode(data), path)
        return
    assert kind == FILE
    # A temporary name made new (O_EXCL): whatever lies at a name chosen in advance (a FIFO
    # that would block the rewind, a link) is never opened.
    replaceFile(path, data, mode=target[1])


# -- what the user reads ---------------------------------------------------------------------


def paths(names: list[str]) -> str:
    shown = ", ".join(f"`{name}`" for name in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def summary(store: CheckpointStore, sessionId: str, turn: int) -> str:
    """What a turn changed in the session's folders, in a few words (``/rewind``'s list)."""
    try:
        before = store.manifest(sessionId, turn, "before")
        after = store.manifest(sessionId, turn, "after")
    except CheckpointError as e:
        return f"its checkpoint is unreadable ({e})"
    if before is None:
        if (problem := store.failure(sessionId, turn)) is not None:
            return f"its checkpoint failed ({problem}): its file changes cannot be undone"
        if store.pruned(sessionId, turn):
            return "its checkpoint was pruned (HERMES_ACP_CHECKPOINT_STORE_MAX): its changes stay"
        return "no file changes"
    if after is None:
        return "changes not recorded (the turn did not finish)"
    kinds: dict[str, list[str]] = {"changed": [], "created": [], "deleted": []}
    for _, path, old, new in turnChanges(before, after):
        if FOLDER not in ((old or [None])[0], (new or [None])[0]):
            kinds["created" if old is None else "deleted" if new is None else "changed"].append(path)
    parts = [f"{len(names)} {kind} ({', '.join(f'`{n}`' for n in names[:3])}{', …' if len(names) > 3 else ''})"
             for kind, names in kinds.items() if names]
    return ", ".join(parts) or "no file changes"


def leftOut(store: CheckpointStore, sessionId: str) -> list[str]:
    """The notes of the session's newest walk: ignored paths, huge files, folders not covered."""
    for turn in reversed(store.turns(sessionId)):
        with contextlib.suppress(CheckpointError):
            manifest = store.manifest(sessionId, turn, "after") or store.manifest(sessionId, turn, "before")
            if manifest is not None:
                return list(manifest.get("notes", ()))
    return []


def report(rewind: RewindPlan, overwrite: bool, problems: list[str]) -> list[str]:
    """What a rewind did to the files, paragraph by paragraph."""
    done = [c for c in rewind.restore + (rewind.conflicts if overwrite else []) if not c.isFolder]
    lines = []
    if done:
        groups: dict[str, list[str]] = {}
        for change in done:
            groups.setdefault(change.describe(), []).append(change.path)
        lines.append("Files put back: " + "; ".join(f"{what}: {paths(names)}" for what, names in groups.items()) + ".")
    else:
        lines.append("No file needed putting back.")
    if rewind.conflicts:
        verb = "Overwrote" if overwrite else "Kept"
        lines.append(f"{verb} your changes to {paths([c.path for c in rewind.conflicts])}.")
    if problems:
        lines.append("Could not put back: " + "; ".join(problems[:SHOWN]) + ".")
    return lines + rewind.notes[:SHOWN] + [OUTSIDE]
