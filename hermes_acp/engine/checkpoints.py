"""Checkpoints: what a session's folders held before a turn changed them, kept under
``$HERMES_HOME/checkpoints`` so ``/rewind`` can put it back.

No git: the store is content-addressed files of its own, so it works where git is not
installed, never touches a repository's index, refs or hooks, and costs one ``lstat`` per
unchanged file per checkpoint.

- ``objects/ab/cdef…``: each distinct content once (its SHA-256), zlib-compressed, written
  to a temporary name and renamed into place (atomic; shared by every session and project).
- ``sessions/SESSION/TURN.before``: the manifest of the session's folders as they were just
  before the turn's first change: for every path (relative to its folder) its kind, mode,
  size, mtime and ctime in ns, inode and content hash. ``TURN.after``: what the turn changed,
  as a delta of the same entries (and the paths it removed), taken when the turn ends.
  Both compressed JSON, written atomically.
- A file whose size, mtime, ctime and inode are those of the last checkpoint of its folder
  (in this process) keeps its hash without being read, so a 10,000-file project costs a
  walk of its folders per checkpoint (docs/performance.md has the figures).

Left out, and said so in the manifest's notes: what ``engine.ignore`` ignores (``.gitignore``
rules and big tool folders, recorded only as "present"), files over
``HERMES_ACP_CHECKPOINT_FILE_MAX`` (recorded by size and time, content not kept), folders
with more than ``HERMES_ACP_CHECKPOINT_MAX_FILES`` entries, and ``/`` or the home folder as
a session folder. The store stays under ``HERMES_ACP_CHECKPOINT_STORE_MAX`` bytes: past it,
the oldest turns' checkpoints go (``prune``), across sessions. Several processes may share
the store: a ``flock`` keeps a prune from removing objects a checkpoint is writing.

Runs on engine threads (tool threads, the turn's worker); never imports Twisted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from hermes_acp.config import DEFAULT_CHECKPOINT_FILE_MAX, DEFAULT_CHECKPOINT_MAX_FILES, DEFAULT_CHECKPOINT_STORE_MAX
from hermes_acp.engine.atomic import replaceFile
from hermes_acp.engine.ignore import IgnoreRules

log = logging.getLogger(__name__)

#: A prune brings the store down to this share of its bound, so it does not run every turn.
PRUNE_TO = 0.8
VERSION = 1

#: Entry kinds. An entry is a list: [kind, mode, size, mtime_ns, ctime_ns, inode, hash] for
#: files and links (a link's "content" is its target), [FOLDER, mode], [IGNORED] (present,
#: left out), [HUGE, mode, size, mtime_ns] (over the file bound: content not kept).
FILE, LINK, FOLDER, IGNORED, HUGE = "f", "l", "d", "i", "h"
Entry = list[Any]


class CheckpointError(Exception):
    """A checkpoint could not be taken or read; the message says why, for the user."""


def same(a: Entry | None, b: Entry | None) -> bool:
    """Whether two states of a path are the same as far as a rewind can tell: content and
    mode for files and links, mode for folders, size and time for huge files; two ignored
    entries always match (nothing of their content is known)."""
    if a is None or b is None:
        return a is b
    if a[0] != b[0]:
        return False
    if a[0] in (FILE, LINK):
        return a[6] == b[6] and a[1] == b[1]
    if a[0] == FOLDER:
        return a[1] == b[1]
    if a[0] == HUGE:
        return a[2:4] == b[2:4]
    return True


def delta(before: dict[str, Entry], after: dict[str, Entry]) -> tuple[dict[str, Entry], list[str]]:
    """What changed from one walk of a folder to another: changed entries, removed paths."""
    return ({path: entry for path, entry in after.items() if not same(before.get(path), entry)},
            [path for path in before if path not in after])


def sessionRoots(roots: Iterable[str]) -> tuple[tuple[str, ...], list[str]]:
    """The folders to checkpoint (absolute, none inside another) and notes on those left out:
    ``/`` and the home folder (a checkpoint of either would copy a whole disk or home)."""
    kept: list[str] = []
    notes = []
    home = os.path.realpath(os.path.expanduser("~"))
    for root in sorted({os.path.realpath(r) for r in roots}):
        if root in ("/", home):
            notes.append(f"{root} is not checkpointed (the whole {'disk' if root == '/' else 'home folder'})")
        elif not any(root.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(root)
    return tuple(kept), notes


@attrs.frozen
class Limits:
    """The store's bounds (``HERMES_ACP_CHECKPOINT_*``)."""

    storeMax: int = DEFAULT_CHECKPOINT_STORE_MAX
    fileMax: int = DEFAULT_CHECKPOINT_FILE_MAX
    maxFiles: int = DEFAULT_CHECKPOINT_MAX_FILES


@attrs.define(eq=False)
class Scan:
    """One walk of one folder: its entries (None when the folder could not be covered) and
    what was left out."""

    entries: dict[str, Entry] | None
    notes: list[str] = attrs.field(factory=list)


class CheckpointStore:
    """The checkpoints of every session, in ``folder``. Safe to share between threads."""

    def __init__(self, folder: str | os.PathLike[str], limits: Limits = Limits()) -> None:
        self.folder = Path(folder)
        self.limits = limits
        self._lock = threading.Lock()
        #: The last walk of each folder, whose hashes unchanged files reuse, and the store's
        #: prune generation they were made in (another process's prune may remove objects).
        self._cache: dict[str, dict[str, Entry]] = {}
        self._generation = ""
        self._used: int | None = None
        self._folders: set[Path] = set()  # made already: no mkdir per object
        #: Turns whose checkpoint failed, and why (also noted on disk when the store lets us).
        self._failures: dict[tuple[str, int], str] = {}

    # -- objects ---------------------------------------------------------------------------

    def _ready(self) -> None:
        for part in ("objects", "sessions", "roots"):
            (self.folder / part).mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            os.chmod(self.folder, 0o700)

    def _objectPath(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise CheckpointError(f"not an object name: {digest!r}")
        return self.folder / "objects" / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        """Keep ``data``; its name (SHA-256 in hex). Written once, atomically."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._objectPath(digest)
        if not path.exists():
            self._write(path, zlib.compress(data, 1))
        return digest

    def get(self, digest: str) -> bytes:
        """The content named ``digest``; CheckpointError when it is gone or damaged."""
        try:
            data = zlib.decompress(self._objectPath(digest).read_bytes())
        except (OSError, zlib.error) as e:
            raise CheckpointError(f"the checkpoint's copy {digest[:12]} is missing or damaged ({e})") from e
        if hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(f"the checkpoint's copy {digest[:12]} is damaged")
        return data

    def _write(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` atomically (a temporary name, then a rename)."""
        if path.parent not in self._folders:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._folders.add(path.parent)
        try:
            replaceFile(path, data)
        except FileNotFoundError:  # its folder was removed since (a deleted session)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            replaceFile(path, data)
        with self._lock:
            if self._used is not None:
                self._used += len(data)

    # -- walking a folder ---------------------------------------------------------------

    def scan(self, root: str) -> Scan:
        """Walk ``root`` (without following links), keeping the content of new or changed
        files; unchanged ones keep the hash of the last walk."""
        self._checkGeneration()
        with self._lock:
            cache = self._cache.get(root)
        if cache is None:
            cache = self._savedWalk(root)
        if not os.path.isdir(root):
            return Scan(None, [f"{root} is not a folder any more"])
        entries: dict[str, Entry] = {}
        notes: list[str] = []
        huge = ignored = 0
        pending: list[tuple[str, str, IgnoreRules]] = [(root, "", IgnoreRules())]
        while pending:
            folder, prefix, rules = pending.pop()
            try:
                with os.scandir(folder) as listing:
                    children = list(listing)
            except OSError as e:
                if not prefix:  # nothing known of it: never to be taken for an empty folder
                    return Scan(None, [f"{root} is not readable ({e.strerror or e}): it is not checkpointed"])
                notes.append(f"{prefix}: not readable ({e.strerror or e}), not checkpointed")
                entries[prefix] = [IGNORED]
                continue
            for child in children:
                if child.name == ".gitignore" and child.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError, UnicodeDecodeError):
                        rules = rules.below(Path(child.path).read_text("utf-8"), prefix)
            for child in children:
                relative = f"{prefix}/{child.name}" if prefix else child.name
                if len(entries) >= self.limits.maxFiles:
                    return Scan(None, [f"{root} has more than {self.limits.maxFiles:,} files and folders "
                                       "(HERMES_ACP_CHECKPOINT_MAX_FILES): it is not checkpointed"])
                try:
                    info = child.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                folder_ = stat.S_ISDIR(info.st_mode)
                if rules.ignored(relative, child.name, folder_):
                    entries[relative] = [IGNORED]
                    ignored += 1
                elif folder_:
                    entries[relative] = [FOLDER, stat.S_IMODE(info.st_mode)]
                    pending.append((child.path, relative, rules))
                elif stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
                    entry = self._entry(child.path, info, cache.get(relative))
                    if entry[0] == HUGE:
                        huge += 1
                    entries[relative] = entry
                else:
                    entries[relative] = [IGNORED]  # a socket, a FIFO, a device
        if ignored:
            notes.append(f"{ignored} ignored path(s) in {root} are not copied (.gitignore, tool folders)")
        if huge:
            notes.append(f"{huge} file(s) in {root} over {self.limits.fileMax:,} bytes are not copied "
                         "(HERMES_ACP_CHECKPOINT_FILE_MAX)")
        with self._lock:
            self._cache[root] = entries
        return Scan(entries, notes)

    def _entry(self, path: str, info: os.stat_result, cached: Entry | None) -> Entry:
        kind = LINK if stat.S_ISLNK(info.st_mode) else FILE
        mode = stat.S_IMODE(info.st_mode)
        key = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        if kind == FILE and info.st_size > self.limits.fileMax:
            return [HUGE, mode, info.st_size, info.st_mtime_ns]
        if cached is not None and cached[0] == kind and cached[2:6] == key and cached[1] == mode:
            return cached
        try:
            data = os.fsencode(os.readlink(path)) if kind == LINK else readFile(path, self.limits.fileMax)
        except OSError:
            return [IGNORED]  # unreadable: left alone by a rewind
        return [kind, mode, *key, self.put(data)]

    def current(self, path: str) -> Entry | None:
        """The state of one path on disk now (no copy kept), as a walk would record it;
        None when nothing is there."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):  # absent, or a file is where its folder was
            return None
        except OSError:
            return [IGNORED]
        if stat.S_ISDIR(info.st_mode):
            return [FOLDER, stat.S_IMODE(info.st_mode)]
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            return [IGNORED]
        if stat.S_ISREG(info.st_mode) and info.st_size > self.limits.fileMax:
            return [HUGE, stat.S_IMODE(info.st_mode), info.st_size, info.st_mtime_ns]
        try:
            data = os.fsencode(os.readlink(path)) if stat.S_ISLNK(info.st_mode) else readFile(path, self.limits.fileMax)
        except OSError:
            return [IGNORED]
        return [LINK if stat.S_ISLNK(info.st_mode) else FILE, stat.S_IMODE(info.st_mode), info.st_size,
                info.st_mtime_ns, info.st_ctime_ns, info.st_ino, hashlib.sha256(data).hexdigest()]

    def _walkPath(self, root: str) -> Path:
        return self.folder / "roots" / hashlib.sha256(os.fsencode(root)).hexdigest()[:32]

    def _savedWalk(self, root: str) -> dict[str, Entry]:
        """The last walk of ``root`` any process recorded (``_pointTo``: the newest checkpoint
        that walked it, and what its turn changed), if no prune came since: a new process or
        session then reads only the files that changed, not the whole folder again."""
        try:
            pointer = json.loads(self._walkPath(root).read_bytes())
            with self._lock:
                generation = self._generation
            if pointer.get("root") != root or pointer.get("generation") != generation:
                return {}
            sessionId = pointer["session"]
            # That turn may have been rewound since: then the session's newest one left.
            for turn in [pointer["turn"], *reversed(self.turns(sessionId))]:
                with contextlib.suppress(KeyError, TypeError, CheckpointError):
                    before = self.manifest(sessionId, turn, "before")
                    after = self.manifest(sessionId, turn, "after")
                    entries = dict(before["roots"][root])  # type: ignore[index]
                    entries.update(after["changed"][root])  # type: ignore[index]
                    for path in after["removed"][root]:  # type: ignore[index]
                        entries.pop(path, None)
                    return entries
        except (OSError, ValueError, KeyError, TypeError, AttributeError, CheckpointError):
            pass
        return {}

    def _pointTo(self, root: str, sessionId: str, turn: int) -> None:
        """Note that the checkpoint of ``turn`` has the newest walk of ``root`` (a few bytes:
        the walk itself is in its manifests)."""
        with self._lock:
            generation = self._generation
        self._write(self._walkPath(root), json.dumps(
            {"root": root, "generation": generation, "session": sessionId, "turn": turn}).encode())

    def forget(self, root: str) -> None:
        """Drop the walk cache of ``root`` (a rewind wrote there: hash it all again)."""
        with self._lock:
            self._cache.pop(root, None)

    # -- manifests -----------------------------------------------------------------------

    def _sessionFolder(self, sessionId: str) -> Path:
        if not sessionId or "/" in sessionId or sessionId in (".", "..") or "\0" in sessionId:
            raise CheckpointError(f"not a session id: {sessionId!r}")
        return self.folder / "sessions" / sessionId

    def _manifestPath(self, sessionId: str, turn: int, kind: str) -> Path:
        return self._sessionFolder(sessionId) / f"{int(turn)}.{kind}"

    def record(self, sessionId: str, turn: int, roots: Iterable[str]) -> dict[str, Any]:
        """Take the checkpoint before turn ``turn``: walk the folders, keep what changed,
        write the manifest; the manifest."""
        kept, notes = sessionRoots(roots)
        began = time.time()
        with self._shared():
            scans = {root: self.scan(root) for root in kept}
            manifest = {"v": VERSION, "turn": turn, "began": began, "taken": time.time(),
                        "roots": {root: scan.entries for root, scan in scans.items()},
                        "notes": notes + [note for scan in scans.values() for note in scan.notes]}
            self._writeManifest(self._manifestPath(sessionId, turn, "before"), manifest)
        self._bounded(sessionId, turn)
        return manifest

    def recordAfter(self, sessionId: str, turn: int, before: dict[str, Any]) -> dict[str, Any]:
        """What turn ``turn`` changed since ``before`` (its checkpoint), written as its
        ``after`` manifest; the manifest."""
        changed: dict[str, dict[str, Entry]] = {}
        removed: dict[str, list[str]] = {}
        notes: list[str] = []
        with self._shared():
            for root, old in before["roots"].items():
                scan = self.scan(root)
                notes += scan.notes
                if old is None or scan.entries is None:
                    continue
                changed[root], removed[root] = delta(old, scan.entries)
            manifest = {"v": VERSION, "turn": turn, "taken": time.time(), "changed": changed, "removed": removed,
                        "notes": notes}
            self._writeManifest(self._manifestPath(sessionId, turn, "after"), manifest)
            for root in changed:
                self._pointTo(root, sessionId, turn)
        self._bounded(sessionId, turn)
        return manifest

    def _writeManifest(self, path: Path, manifest: dict[str, Any]) -> None:
        self._ready()
        self._write(path, zlib.compress(json.dumps(manifest, separators=(",", ":")).encode(), 1))

    def manifest(self, sessionId: str, turn: int, kind: str) -> dict[str, Any] | None:
        """A turn's ``before`` or ``after`` manifest; None when there is none (the turn
        changed nothing, or it was pruned); CheckpointError when it is damaged."""
        path = self._manifestPath(sessionId, turn, kind)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise CheckpointError(f"cannot read the checkpoint {path}: {e}") from e
        try:
            manifest = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError) as e:
            raise CheckpointError(f"the checkpoint {path} is damaged ({e})") from e
        if not isinstance(manifest, dict) or manifest.get("v") != VERSION:
            raise CheckpointError(f"the checkpoint {path} was written by another version of hermes-acp")
        return manifest

    def turns(self, sessionId: str) -> list[int]:
        """The session's turns that have a checkpoint, in order."""
        try:
            names = os.listdir(self._sessionFolder(sessionId))
        except (FileNotFoundError, NotADirectoryError):  # none, or no store (a file in its place)
            return []
        return sorted(int(name.split(".")[0]) for name in names
                      if name.endswith(".before") and name.split(".")[0].isdigit())

    def sessions(self) -> list[str]:
        """The sessions that have checkpoints."""
        try:
            return os.listdir(self.folder / "sessions")
        except OSError:
            return []

    def span(self, sessionId: str, turn: int) -> tuple[float, float] | None:
        """When the turn's checkpoint was written and when its end was (infinity: not yet,
        or never, the agent stopped mid-turn); None when it has no checkpoint."""
        try:
            began = self._manifestPath(sessionId, turn, "before").stat().st_mtime
        except OSError:
            return None
        try:
            return began, self._manifestPath(sessionId, turn, "after").stat().st_mtime
        except OSError:
            return began, float("inf")

    def fail(self, sessionId: str, turn: int, problem: str) -> None:
        """Note that the turn's checkpoint could not be taken, and why: ``/rewind`` must not
        take such a turn for one that changed nothing."""
        with self._lock:
            self._failures[(sessionId, turn)] = problem
        with contextlib.suppress(OSError, CheckpointError):  # the store may be what failed
            self._write(self._manifestPath(sessionId, turn, "failed"), problem.encode("utf-8", "replace"))

    def failure(self, sessionId: str, turn: int) -> str | None:
        """Why the turn's checkpoint could not be taken; None when nothing failed."""
        with self._lock:
            problem = self._failures.get((sessionId, turn))
        if problem is None:
            with contextlib.suppress(OSError):
                problem = self._manifestPath(sessionId, turn, "failed").read_bytes()[:1000].decode("utf-8", "replace")
        return problem

    def pruned(self, sessionId: str, turn: int) -> bool:
        """Whether the turn's checkpoint was pruned to keep the store in its bound."""
        return self._manifestPath(sessionId, turn, "pruned").exists()

    def removeTurns(self, sessionId: str, turns: Iterable[int]) -> None:
        """Drop these turns' checkpoints (a rewind cut the turns); their objects go at the next prune."""
        for turn in turns:
            with self._lock:
                self._failures.pop((sessionId, turn), None)
            for kind in ("before", "after", "pruned", "failed"):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    self._manifestPath(sessionId, turn, kind).unlink()

    def removeSession(self, sessionId: str) -> None:
        """Every checkpoint of the session, and the copies nothing else uses (``session/delete``)."""
        folder = self._sessionFolder(sessionId)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            self.prune()

    # -- bounds --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        self._ready()
        fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _shared(self) -> contextlib.AbstractContextManager[None]:
        """Held while a checkpoint writes objects and its manifest: no prune meanwhile."""
        return self._locked(fcntl.LOCK_SH)

    def _checkGeneration(self) -> None:
        """A prune (here or in another process) may have removed objects the walk cache
        names: the cache goes when the store's generation changed."""
        try:
            generation = (self.folder / "generation").read_text()
        except OSError:
            generation = ""
        with self._lock:
            if generation != self._generation:
                self._cache.clear()
                self._generation = generation

    def used(self) -> int:
        """The store's size in bytes (counted once, then kept up to date by this process)."""
        with self._lock:
            if self._used is not None:
                return self._used
        total = sum(size for _, size in _files(self.folder))
        with self._lock:
            self._used = total
        return total

    def _bounded(self, sessionId: str, turn: int) -> None:
        if self.used() > self.limits.storeMax:
            self.prune(keep=(sessionId, turn))

    def prune(self, keep: tuple[str, int] | None = None) -> int:
        """Remove copies no checkpoint names, then the oldest turns' checkpoints (of any
        session, never ``keep``) until the store is under ``PRUNE_TO`` of its bound;
        the number of turns whose checkpoints went."""
        with self._locked(fcntl.LOCK_EX):
            units: list[tuple[float, str, int, list[Path], set[str]]] = []
            manifestBytes = 0
            for folder in (self.folder / "sessions").iterdir():
                for path in folder.glob("*.before"):
                    try:
                        turn = int(path.name.split(".")[0])
                        manifests = [p for p in (path, path.with_suffix(".after")) if p.exists()]
                        hashes: set[str] = set()
                        for p in manifests:
                            manifestBytes += p.stat().st_size
                            hashes |= _hashes(json.loads(zlib.decompress(p.read_bytes())))
                        units.append((path.stat().st_mtime, folder.name, turn, manifests, hashes))
                    except (OSError, ValueError, zlib.error) as e:
                        log.warning("checkpoint %s is unreadable (%s); removing it", path, e)
                        with contextlib.suppress(OSError):
                            path.unlink()
            refs = Counter(h for unit in units for h in unit[4])
            sizes = {}
            for path, size in _files(self.folder / "objects"):
                digest = path.parent.name + path.name
                if digest in refs:
                    sizes[digest] = size
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()  # named by no checkpoint (or a temporary left by a crash)
            total = manifestBytes + sum(sizes.values())
            units.sort()
            dropped = 0
            for when, sessionId, turn, manifests, hashes in units[:-1]:
                if total <= self.limits.storeMax * PRUNE_TO:
                    break
                if (sessionId, turn) == keep:
                    continue
                for path in manifests:
                    with contextlib.suppress(OSError):
                        total -= path.stat().st_size
                        path.unlink()
                with contextlib.suppress(OSError):  # so /rewind can say why the turn has none
                    self._manifestPath(sessionId, turn, "pruned").touch()
                for digest in hashes:
                    refs[digest] -= 1
                    if refs[digest] == 0 and digest in sizes:
                        with contextlib.suppress(OSError):
                            self._objectPath(digest).unlink()
                        total -= sizes.pop(digest)
                dropped += 1
            if dropped:
                log.info("checkpoints: pruned the %d oldest turn(s) to stay under %d bytes", dropped,
                         self.limits.storeMax)
            self._write(self.folder / "generation", uuid.uuid4().hex.encode())
            with self._lock:
                self._cache.clear()
                self._used = total
            return dropped


def readFile(path: str, limit: int) -> bytes:
    """A regular file's bytes (at most ``limit``), opened without following a link or
    blocking on a FIFO swapped in since it was listed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def _files(folder: Path) -> Iterator[tuple[Path, int]]:
    for directory, _, names in os.walk(folder):
        for name in names:
            path = Path(directory) / name
            with contextlib.suppress(OSError):
                yield path, path.stat().st_size


def _hashes(manifest: dict[str, Any]) -> set[str]:
    """The objects a manifest names."""
    found = set()
    for entries in [*manifest.get("roots", {}).values(), *manifest.get("changed", {}).values()]:
        for entry in (entries or {}).values():
            if entry[0] in (FILE, LINK):
                found.add(entry[6])
    return found


@attrs.define(eq=False)
class TurnCheckpoint:
    """The checkpoint of one turn: taken once, just before the first tool call that may change
    something (``Tool.mayWrite``), and closed with what the turn changed when it ends.

    A checkpoint that fails never stops the turn: the tool runs, and ``/rewind`` says the turn
    has no checkpoint and why (``problem``, kept by ``CheckpointStore.fail``)."""

    store: CheckpointStore
    sessionId: str
    turn: int
    roots: tuple[str, ...]
    problem: str | None = None
    _before: dict[str, Any] | None = None
    _begun: bool = False
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def beforeChange(self) -> None:
        """Take the checkpoint unless this turn has one (thread-safe: parallel calls wait for it)."""
        with self._lock:
            if self._begun:
                return
            self._begun = True
            began = time.monotonic()
            try:
                self._before = self.store.record(self.sessionId, self.turn, self.roots)
            except Exception as e:
                self.problem = f"{type(e).__name__}: {e}"
                log.warning("checkpoint before turn %d of %s failed: %s", self.turn, self.sessionId, self.problem)
                self.store.fail(self.sessionId, self.turn, self.problem)
            else:
                log.debug("checkpoint before turn %d of %s in %.3f s", self.turn, self.sessionId,
                          time.monotonic() - began)

    def finish(self) -> None:
        """Record what the turn changed (nothing to do when it took no checkpoint)."""
        with self._lock:
            if self._before is None:
                return
            try:
                self.store.recordAfter(self.sessionId, self.turn, self._before)
            except Exception as e:
                log.warning("recording what turn %d of %s changed failed: %s", self.turn, self.sessionId, e)
            self._before = None
