"""Running out of file descriptors or memory, named as such.

When the agent (or the machine) is out of descriptors or memory, many calls fail
with errors that read as something else: a sandbox rule that could not be made
denies the command ("Permission denied"), ``tempfile`` finds "no usable temporary
directory". These helpers tell the real cause, so the user reads it.
"""

from __future__ import annotations

import errno
import os

#: The errors that say the agent (or the machine) is out of descriptors or memory.
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def describe(error: BaseException) -> str | None:
    """What ran out, in words, when ``error`` says something did; else None."""
    if isinstance(error, MemoryError) or (isinstance(error, OSError) and error.errno == errno.ENOMEM):
        return "the agent has run out of memory (Cannot allocate memory)"
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        return f"the agent has run out of file descriptors ({os.strerror(error.errno)})"
    return None


def check() -> None:
    """Raise the ``OSError`` of opening a file when the agent is out of descriptors
    now (call it when an error may hide that, before passing the error on)."""
    try:
        fd = os.open("/", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in EXHAUSTED:
            raise
        return
    os.close(fd)


def orShown(shown: str) -> str:
    """``shown``, unless the agent is out of descriptors now: then that, which an
    error such as "DNS lookup failed" (the resolver could not open a socket) hides."""
    try:
        check()
    except OSError as e:
        return describe(e) or shown
    return shown
