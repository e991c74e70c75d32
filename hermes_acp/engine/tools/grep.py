"""The pure-Python search behind ``search_files`` when ripgrep is not installed.

It runs as a child process, ``python -I -S grep.py MODE ROOT PATTERN [GLOB]``,
so a pattern that makes ``re`` backtrack for ever (``(a+)+$``) costs a process
the agent kills, never the agent's own interpreter: ``re`` holds the GIL for a
whole match, which would starve every other thread, the reactor's included.

Standard library only (``-S``: no site-packages). It walks ``ROOT`` skipping
hidden and binary files, as ripgrep does (``.gitignore`` is not read), and
prints one JSON array per line: ``[path, line, text]`` for MODE ``content``,
``[path]`` for ``files``. A bad pattern exits 2 with the reason on stderr, as
ripgrep does. The parent imports ``globMatches`` and ``nameGlob`` from
here too, so both searches match names the same way.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
from collections.abc import Iterator


def nameGlob(pattern: str) -> str:
    """A file-name pattern: a glob as given, a bare word as ``*word*``."""
    return pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"


def globMatches(glob: str, path: str, root: str) -> bool:
    """A glob with a ``/`` matches the path below ``root``; without, the base name."""
    subject = os.path.relpath(path, root) if "/" in glob else os.path.basename(path)
    return fnmatch.fnmatch(subject, glob)


def walk(root: str) -> Iterator[str]:
    """The files below ``root`` (or ``root`` itself), hidden ones left out, sorted."""
    if os.path.isfile(root):
        yield root
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                yield os.path.join(folder, name)


def content(root: str, pattern: str, fileGlob: str | None) -> Iterator[list[object]]:
    regex = re.compile(pattern)
    for path in walk(root):
        if fileGlob and not globMatches(fileGlob, path, root):
            continue
        try:
            with open(path, "rb") as f:
                if b"\0" in f.read(8192):  # binary
                    continue
                f.seek(0)
                for number, raw in enumerate(f, 1):
                    line = raw.decode("utf-8", "replace")
                    if regex.search(line):
                        yield [path, number, line]
        except OSError:
            continue


def files(root: str, glob: str) -> Iterator[list[object]]:
    return ([path] for path in walk(root) if globMatches(glob, path, root))


def main(argv: list[str]) -> int:
    mode, root, pattern, *rest = argv
    try:
        found = content(root, pattern, rest[0] if rest else None) if mode == "content" else files(root, pattern)
        for item in found:
            # ASCII JSON: names that are not UTF-8 travel as escapes, whatever the locale.
            sys.stdout.write(json.dumps(item) + "\n")
    except re.error as e:
        sys.stderr.write(f"invalid regular expression {pattern!r}: {e}\n")
        return 2
    except BrokenPipeError:  # the parent has what it needs
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
