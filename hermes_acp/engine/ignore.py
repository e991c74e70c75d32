"""Which paths a checkpoint leaves out: ``.gitignore`` rules and the usual big folders.

Checkpoints (``engine.checkpoints``) copy a session's folders; what a project tells git to
ignore (build output, caches, logs) is what it does not want kept either, and copying
``node_modules`` or ``.git`` every turn would cost more than the whole rest. The rules read
are those of every ``.gitignore`` met on the way down (each applies below its own folder,
later and deeper rules winning, ``!`` re-including), with the common syntax: ``#``
comments, a trailing ``/`` for folders only, a leading or inner ``/`` anchoring the pattern
to its folder, ``*``, ``?``, ``[...]`` and ``**``. Not read: ``.git/info/exclude`` and the
user's global excludes file (a checkpoint of a little more is harmless).
"""

from __future__ import annotations

import re
import attrs

#: Folders never copied, whatever ``.gitignore`` says: version control data, dependency
#: trees and tool caches, big and rebuilt by their own tools.
ALWAYS_IGNORED = frozenset({
    ".git", ".hg", ".svn", ".jj", "node_modules", "__pycache__", ".venv", ".tox", ".nox",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".gradle", ".next", ".nuxt", ".turbo",
    ".parcel-cache", ".cache", ".worktrees", ".direnv", ".terraform",
})


def _translate(pattern: str) -> str:
    """A gitignore glob as a regular expression over a relative path."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@attrs.frozen
class _Rule:
    base: str  # the folder of its .gitignore, relative to the root ("" for the root)
    regex: re.Pattern[str]
    negated: bool
    folderOnly: bool
    basename: bool  # no slash in the pattern: it matches a name at any depth


def parseRules(text: str, base: str) -> list[_Rule]:
    """The rules of one ``.gitignore`` whose folder is ``base`` (relative to the root)."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith("\\"):
            line = line[1:]
        folderOnly = line.endswith("/")
        line = line.strip("/") if folderOnly else line
        anchored = line.startswith("/") or "/" in line.rstrip("/")
        line = line.lstrip("/")
        if not line:
            continue
        try:
            regex = re.compile(_translate(line) + "$", re.DOTALL)
        except re.error:
            continue  # a malformed pattern ignores nothing (git skips it too)
        rules.append(_Rule(base, regex, negated, folderOnly, not anchored))
    return rules


@attrs.frozen
class IgnoreRules:
    """The rules in force in one folder: its parents' and its own ``.gitignore``."""

    rules: tuple[_Rule, ...] = ()

    def below(self, text: str, base: str) -> IgnoreRules:
        """These rules and those of a ``.gitignore`` in the folder ``base``."""
        added = parseRules(text, base)
        return IgnoreRules((*self.rules, *added)) if added else self

    def ignored(self, relative: str, name: str, folder: bool) -> bool:
        """Whether the path ``relative`` (to the root; its last part ``name``) is left out."""
        if folder and name in ALWAYS_IGNORED:
            return True
        verdict = False
        for rule in self.rules:
            if rule.folderOnly and not folder:
                continue
            if rule.base:
                if not relative.startswith(rule.base + "/"):
                    continue
                path = relative[len(rule.base) + 1:]
            else:
                path = relative
            subject = name if rule.basename else path
            if rule.regex.match(subject):
                verdict = not rule.negated
        return verdict

