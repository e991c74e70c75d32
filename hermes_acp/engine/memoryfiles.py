"""Hermes' memory files on disk: their format, reading one as the user may have left it, the
lock around a change, and the atomic write (``engine.memory`` is what uses them).

Entries are joined by a line holding only ``§`` (Hermes' ``\n§\n``), and the length of that text
is what counts against a file's limit. A change is read-modify-write under an exclusive ``flock``
on ``MEMORY.md.lock`` (the lock file Hermes takes too: the memory file itself is replaced by
rename, so the lock must be another file); the new text is written to a private temporary file
beside the old one, flushed to disk and renamed over it, so a reader (which takes no lock) sees
the old file or the new one, never half of one.

Pure Python (no Twisted).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

from hermes_acp.engine.atomic import replaceFile
from hermes_acp.engine.sensitive import secretKind

DELIMITER = "\n§\n"
#: A file is read up to this many bytes per character of its limit (64 × 2,200: 140 KB), far past
#: anything the tool writes; a longer one was not written as memory and is cut, never rewritten.
READ_FACTOR = 64


@attrs.frozen
class Target:
    """One of the two files: the tool's ``target`` name, its file, and its heading in the prompt."""

    name: str
    fileName: str
    heading: str
    label: str


TARGETS = {
    "memory": Target("memory", "MEMORY.md", "MEMORY (your personal notes)", "Your notes"),
    "user": Target("user", "USER.md", "USER PROFILE (who the user is)", "User profile"),
}


def parseEntries(text: str) -> list[str]:
    """The entries of a memory file, as Hermes reads them (and leniently: CRLF line ends, blank
    and repeated entries are no harm)."""
    entries = (entry.strip() for entry in text.replace("\r\n", "\n").split(DELIMITER))
    return list(dict.fromkeys(entry for entry in entries if entry))


def joined(entries: Sequence[str]) -> str:
    """The file's text for ``entries`` (Hermes writes no final newline); its length is what
    counts against the limit."""
    return DELIMITER.join(entries)


@attrs.frozen
class MemoryFile:
    """One file as read: its entries, and why it cannot be written (None: it can)."""

    target: Target
    path: Path
    entries: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def chars(self) -> int:
        return len(joined(self.entries))


def readMemory(target: Target, path: Path, limit: int) -> MemoryFile:
    """``path`` read as memory. Reads do not lock: writes replace the file whole, by rename."""
    kind = secretKind(os.path.realpath(path)) if os.path.islink(path) else None
    if kind is not None:  # a link to the user's own file elsewhere is fine; to a secret, not
        return MemoryFile(target, path, problem=f"it is a link to {kind}, which is not memory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return MemoryFile(target, path)
    except OSError as e:
        return MemoryFile(target, path, problem=f"it cannot be read ({e.strerror})")
    cap = READ_FACTOR * limit
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder with an OSError
        os.close(fd)
        return MemoryFile(target, path, problem="it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(cap + 1)
        except OSError as e:
            return MemoryFile(target, path, problem=f"it cannot be read ({e.strerror})")
    problem = None
    if len(data) > cap:
        data, problem = data[:cap], f"it is over {cap:,} bytes, far more than memory holds: only its start is read"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        problem = problem or "it is not UTF-8 text"
    return MemoryFile(target, path, tuple(parseEntries(text)), problem)


@contextmanager
def fileLock(path: Path, seconds: float, cancelled: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold the exclusive ``flock`` on ``path``'s lock file (``MEMORY.md.lock``, as Hermes does:
    the lock must be another file, since the memory file itself is replaced by rename). Waits
    at most ``seconds`` for another holder, then raises ``MemoryBusy``."""
    lockPath = path.with_name(path.name + ".lock")
    fd = os.open(lockPath, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
            if cancelled():
                raise MemoryBusy("the call was cancelled while it waited for the memory file")
            if time.monotonic() >= deadline:
                raise MemoryBusy(f"{path.name} stayed locked by another process (another agent, or Hermes) "
                                 f"for {seconds:g} s; nothing was changed, try again")
            time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def writeAtomically(path: Path, text: str) -> None:
    """Replace the file with ``text``: a private temporary file beside it, flushed to disk, then
    renamed over it (a link to the user's own file stays a link: its target is replaced)."""
    replaceFile(os.path.realpath(path), text, durable=True)


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


class MemoryBusy(Exception):
    """The file stayed locked; the message says so."""
