"""Project instructions: ``AGENTS.md`` (and ``HERMES.md``, ``CLAUDE.md``) from the
repository's root down to the session's folder, for the system prompt.

A file counts only when it is a regular file whose real path stays inside the
folder it was found in (a link to somewhere else, or to a secret, is left out),
and each is read up to ``FILE_LIMIT`` bytes, all of them up to ``TOTAL_LIMIT``:
what does not fit is cut with a note. Read anew for every run (they change).
"""

from __future__ import annotations

import os
import stat

import attrs

from hermes_acp.engine.sensitive import inside, secretKind

NAMES = ("AGENTS.md", "HERMES.md", "CLAUDE.md")
FILE_LIMIT = 32 * 1024
TOTAL_LIMIT = 64 * 1024


@attrs.frozen
class Instructions:
    """The files used (absolute paths, outermost first) and the text for the prompt."""

    files: tuple[str, ...] = ()
    text: str = ""


def repositoryRoot(folder: str) -> str:
    """The nearest folder at or above ``folder`` that holds ``.git``; ``folder`` when none does."""
    current = os.path.abspath(folder)
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return os.path.abspath(folder)
        current = parent


def _folders(folder: str) -> list[str]:
    """From the repository root down to ``folder``."""
    root, folder = repositoryRoot(folder), os.path.abspath(folder)
    chain = [folder]
    while chain[-1] != root:
        chain.append(os.path.dirname(chain[-1]))
    return chain[::-1]


def _read(path: str, folder: str, limit: int) -> str | None:
    """The file's text (at most ``limit`` bytes), or None when it does not count."""
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(folder)) or secretKind(real) is not None:
        return None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[… cut: the file is longer]" if len(data) > limit else "")


def projectInstructions(folder: str) -> Instructions:
    """The instructions that apply in ``folder``."""
    files, parts, room = [], [], TOTAL_LIMIT
    for each in _folders(folder):
        for name in NAMES:
            path = os.path.join(each, name)
            if room <= 0 or not os.path.isfile(path):
                continue
            text = _read(path, each, min(FILE_LIMIT, room))
            if text is None or not text.strip():
                continue
            files.append(path)
            room -= len(text.encode())
            parts.append(f"<instructions file=\"{path}\">\n{text.strip()}\n</instructions>")
    if not parts:
        return Instructions()
    text = ("Project instructions found in the repository (the files nearer the working directory "
            "win where they disagree):\n\n" + "\n\n".join(parts))
    return Instructions(tuple(files), text)
