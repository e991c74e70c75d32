"""``patch``: replace a snippet in a file, tolerant of the model's whitespace slips.

Strategies run in order and the first one that finds the snippet wins:
exact, then escape-normalised (a model that wrote ``\\n`` for newlines), then
line by line ignoring trailing blanks, indentation (the replacement is
re-indented to match the file), all surrounding whitespace, runs of
whitespace, typographic quotes and dashes, and finally a block whose first and
last lines match with a similar middle.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import attrs

from hermes_acp.engine.tools.files import approvedRead, checkTextPath, readText, unifiedDiff, writeApproved
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, parameters

_UNICODE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
    "\u00a0": " ", "\u2026": "...", "\u200b": "",
})
_BLOCK_SIMILARITY = 0.7


@attrs.frozen
class Match:
    """A span of the file and the text that replaces it."""

    start: int
    end: int
    replacement: str


def _exact(content: str, old: str, new: str) -> list[Match]:
    matches = []
    start = content.find(old)
    while start >= 0:
        matches.append(Match(start, start + len(old), new))
        start = content.find(old, start + len(old))
    return matches


def _unescaped(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').replace("\\'", "'")


def _escapeNormalized(content: str, old: str, new: str) -> list[Match]:
    if "\\n" not in old or "\\n" in content:
        return []
    return _exact(content, _unescaped(old), _unescaped(new))


def _trimBlankLines(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(newLines: list[str], oldIndent: str, fileIndent: str) -> list[str]:
    if oldIndent == fileIndent:
        return newLines
    return [fileIndent + line[len(oldIndent):] if line.startswith(oldIndent) and line.strip() else line
            for line in newLines]


class _Lines:
    """The file cut into lines, with where each one starts."""

    def __init__(self, content: str) -> None:
        self.content = content
        self.lines = content.split("\n")
        self.starts = []
        offset = 0
        for line in self.lines:
            self.starts.append(offset)
            offset += len(line) + 1

    def span(self, first: int, count: int, deleting: bool) -> tuple[int, int]:
        last = first + count - 1
        end = self.starts[last] + len(self.lines[last])
        if deleting and end < len(self.content):
            end += 1  # take the line break along with the deleted block
        return self.starts[first], end


def _lineMatches(
    content: str, old: str, new: str, same: Callable[[list[str], list[str]], bool]
) -> list[Match]:
    oldLines = _trimBlankLines(old.split("\n"))
    if not oldLines:
        return []
    newLines = _trimBlankLines(new.split("\n"))
    file = _Lines(content)
    count = len(oldLines)
    oldIndent = _indent(next(line for line in oldLines if line.strip()))
    matches: list[Match] = []
    i = 0
    while i <= len(file.lines) - count:
        window = file.lines[i : i + count]
        if same(window, oldLines):
            fileIndent = _indent(next((line for line in window if line.strip()), ""))
            start, end = file.span(i, count, deleting=not newLines)
            matches.append(Match(start, end, "\n".join(_reindent(newLines, oldIndent, fileIndent))))
            i += count
        else:
            i += 1
    return matches


def _byLine(normalize: Callable[[str], str]) -> Callable[[str, str, str], list[Match]]:
    def find(content: str, old: str, new: str) -> list[Match]:
        def same(window: list[str], oldLines: list[str]) -> bool:
            return all(normalize(a) == normalize(b) for a, b in zip(window, oldLines, strict=True))

        return _lineMatches(content, old, new, same)

    return find


def _collapse(line: str) -> str:
    return " ".join(line.split())


def _blockAnchor(content: str, old: str, new: str) -> list[Match]:
    def same(window: list[str], oldLines: list[str]) -> bool:
        if window[0].strip() != oldLines[0].strip() or window[-1].strip() != oldLines[-1].strip():
            return False
        middle = "\n".join(line.strip() for line in window[1:-1])
        wanted = "\n".join(line.strip() for line in oldLines[1:-1])
        return difflib.SequenceMatcher(None, middle, wanted).ratio() >= _BLOCK_SIMILARITY

    if len(_trimBlankLines(old.split("\n"))) < 3:
        return []
    return _lineMatches(content, old, new, same)


STRATEGIES: list[tuple[str, Callable[[str, str, str], list[Match]]]] = [
    ("exact", _exact),
    ("escape_normalized", _escapeNormalized),
    ("trailing_whitespace", _byLine(str.rstrip)),
    ("indentation_flexible", _byLine(str.lstrip)),
    ("line_trimmed", _byLine(str.strip)),
    ("whitespace_normalized", _byLine(_collapse)),
    ("unicode_normalized", _byLine(lambda line: _collapse(line.translate(_UNICODE)))),
    ("block_anchor", _blockAnchor),
]


def findMatches(content: str, old: str, new: str) -> tuple[str | None, list[Match]]:
    """The first strategy that finds ``old`` in ``content``, and its matches."""
    for name, find in STRATEGIES:
        matches = find(content, old, new)
        if matches:
            return name, matches
    return None, []


def replaceMatches(content: str, matches: list[Match]) -> str:
    for match in sorted(matches, key=lambda m: m.start, reverse=True):
        content = content[: match.start] + match.replacement + content[match.end :]
    return content


def closestSections(content: str, old: str, count: int = 3) -> list[str]:
    """The parts of ``content`` most like ``old``, with line numbers, best first."""
    lines = content.split("\n")
    size = max(1, len(_trimBlankLines(old.split("\n"))))
    wanted = old.strip()
    scored = []
    for i in range(max(1, len(lines) - size + 1)):
        window = "\n".join(lines[i : i + size])
        matcher = difflib.SequenceMatcher(None, window.strip(), wanted)
        if matcher.real_quick_ratio() < 0.3 or matcher.quick_ratio() < 0.3:
            continue
        scored.append((matcher.ratio(), i))
    sections: list[str] = []
    taken: list[int] = []
    for score, i in sorted(scored, reverse=True):
        if score < 0.3 or len(sections) == count:
            break
        if any(abs(i - j) < size for j in taken):
            continue
        taken.append(i)
        numbered = "\n".join(f"{i + k + 1:6d}|{line}" for k, line in enumerate(lines[i : i + size]))
        sections.append(f"lines {i + 1}-{i + size} ({score:.0%} similar):\n{numbered}")
    return sections


def _lineOf(content: str, offset: int) -> int:
    return content.count("\n", 0, offset) + 1


def uniqueMatches(content: str, old: str, new: str, replaceAll: bool, name: str) -> tuple[str, list[Match]]:
    """(strategy, matches) of ``old`` in ``content``; a ToolError that helps the model when it
    is not there (the closest sections) or, without ``replaceAll``, more than once."""
    strategy, matches = findMatches(content, old, new)
    if not matches:
        sections = closestSections(content, old)
        hint = ("\nDid you mean one of these sections?\n" + "\n\n".join(sections)) if sections else ""
        raise ToolError(f"old_string not found in {name}. Read the file again and copy the text exactly.{hint}")
    if len(matches) > 1 and not replaceAll:
        where = ", ".join(str(_lineOf(content, m.start)) for m in matches[:10])
        raise ToolError(
            f"old_string matches {len(matches)} places in {name} (lines {where}); add surrounding "
            "lines to make it unique, or set replace_all=true"
        )
    return strategy or "", matches


def patchFile(ctx: ToolContext, path: str, old_string: str, new_string: str, replace_all: bool) -> ToolOutcome:
    absPath = ctx.resolveReal(path)
    if not old_string:
        raise ToolError("old_string is empty; use write_file to create or replace a whole file")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    checkTextPath(absPath)
    approvedRead(ctx, absPath)  # a failed match shows parts of the file to the model
    name = ctx.display(absPath)
    with ctx.locks.held(absPath):
        content = readText(ctx, absPath)
        if content is None:
            raise ToolError(f"file not found: {absPath}; use write_file to create it")
        if "\r\n" in content and "\r\n" not in old_string:
            old_string, new_string = (s.replace("\n", "\r\n") for s in (old_string, new_string))
        strategy, matches = uniqueMatches(content, old_string, new_string, replace_all, name)
        updated = replaceMatches(content, matches)
        if updated == content:
            raise ToolError(f"the replacement leaves {name} unchanged")
        extras = writeApproved(ctx, "patch", absPath, content, updated)
    diff = unifiedDiff(content, updated, name)
    how = "" if strategy == "exact" else f", matched {strategy.replace('_', ' ')}"
    extras["diff"] = diff
    return ToolOutcome(f"Patched {name} ({len(matches)} replacement(s){how}).\n{diff}", extras)


PATCH = Tool(
    "patch",
    "Replace old_string with new_string in a file. old_string must match one place exactly "
    "(small whitespace or indentation differences are tolerated) unless replace_all is true. "
    "Include enough surrounding lines to make it unique. Returns a unified diff.",
    parameters(
        ["path", "old_string", "new_string"],
        path={"type": "string", "description": "File to edit"},
        old_string={"type": "string", "description": "Text to find (copy it from the file)"},
        new_string={"type": "string", "description": "Replacement text"},
        replace_all={"type": "boolean", "default": False, "description": "Replace every match"},
    ),
    patchFile,
    pathArgument="path",
    mayWrite=True,
)
