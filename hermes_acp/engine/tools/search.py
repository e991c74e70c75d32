"""``search_files``: regex search in file contents, or file names by glob.

ripgrep does the work when it is installed; otherwise a pure-Python walk
gives the same result shape (it skips hidden and binary files as rg does, but
does not read ``.gitignore``).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import re
import shutil
import subprocess
from collections.abc import Generator, Iterator
from contextlib import closing
from typing import Any

from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters
from hermes_acp.engine.workspace import looksBinary

COLLECT_LIMIT = 5000
MAX_TEXT = 500


def _cut(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " ..."


def _nameGlob(pattern: str) -> str:
    return pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"


def _globMatches(glob: str, path: str, root: str) -> bool:
    subject = os.path.relpath(path, root) if "/" in glob else os.path.basename(path)
    return fnmatch.fnmatch(subject, glob)


def _walk(root: str, ctx: ToolContext) -> Iterator[str]:
    if os.path.isfile(root):
        yield root
        return
    for folder, dirs, files in os.walk(root):
        if ctx.cancelEvent.is_set():
            return
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                yield os.path.join(folder, name)


def _pythonContent(ctx: ToolContext, root: str, pattern: str, fileGlob: str | None) -> Iterator[tuple[str, int, str]]:
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ToolError(f"invalid regular expression {pattern!r}: {e}") from e
    for path in _walk(root, ctx):
        if fileGlob and not _globMatches(fileGlob, path, root):
            continue
        try:
            with open(path, "rb") as f:
                if looksBinary(f.read(8192)):
                    continue
                f.seek(0)
                for number, raw in enumerate(f, 1):
                    line = raw.decode("utf-8", "replace")
                    if regex.search(line):
                        yield path, number, line
        except OSError:
            continue


def _pythonFiles(ctx: ToolContext, root: str, glob: str) -> Iterator[str]:
    return (path for path in _walk(root, ctx) if _globMatches(glob, path, root))


def _rg(ctx: ToolContext, arguments: list[str]) -> Iterator[str]:
    """Lines of rg's output; an rg error becomes a L{ToolError}."""
    rg = shutil.which("rg")
    assert rg is not None
    process = subprocess.Popen(
        [rg, "--no-config", *arguments], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        for line in process.stdout:
            if ctx.cancelEvent.is_set():
                break
            yield line
    finally:
        process.kill()
        error = process.stderr.read().strip()
        process.stdout.close()
        process.stderr.close()
        if process.wait() == 2 and error:
            raise ToolError(f"search failed: {error}")


def _rgContent(ctx: ToolContext, root: str, pattern: str, fileGlob: str | None) -> Iterator[tuple[str, int, str]]:
    arguments = ["--json", "-e", pattern, *(["--glob", fileGlob] if fileGlob else []), "--", root]
    for line in _rg(ctx, arguments):
        event = json.loads(line)
        if event.get("type") != "match":
            continue
        data = event["data"]
        lines = data["lines"]
        text = lines.get("text")
        if text is None:
            text = base64.b64decode(lines.get("bytes", "")).decode("utf-8", "replace")
        path = data["path"].get("text") or base64.b64decode(data["path"]["bytes"]).decode("utf-8", "replace")
        yield path, data["line_number"], text


def _rgFiles(ctx: ToolContext, root: str, glob: str) -> Iterator[str]:
    for line in _rg(ctx, ["--files", "--", root]):
        path = line.rstrip("\n")
        if _globMatches(glob, path, root):
            yield path


def _collect(found: Generator[Any, None, None]) -> tuple[list[Any], bool]:
    items: list[Any] = []
    with closing(found):  # stops rg at once when the limit is reached
        for item in found:
            if len(items) == COLLECT_LIMIT:
                return items, True
            items.append(item)
    return items, False


def _context(path: str, line: int, count: int) -> dict[str, list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return {"before": [], "after": []}
    return {
        "before": [_cut(text) for text in lines[max(0, line - 1 - count) : line - 1]],
        "after": [_cut(text) for text in lines[line : line + count]],
    }


def searchFiles(
    ctx: ToolContext, pattern: str, target: str, path: str, limit: int, offset: int, context: int,
    file_glob: str | None = None,
) -> ToolOutcome:
    root = ctx.resolve(path)
    if not os.path.exists(root):
        raise ToolError(f"path not found: {root}")
    useRg = shutil.which("rg") is not None
    if target == "files":
        glob = _nameGlob(pattern)
        found = _rgFiles(ctx, root, glob) if useRg else _pythonFiles(ctx, root, glob)
        paths, capped = _collect(found)
        paths.sort(key=lambda p: (-_mtime(p), p))
        page: list[Any] = [ctx.display(p) for p in paths[offset : offset + limit]]
        result: dict[str, Any] = {"files": page}
    else:
        found = _rgContent(ctx, root, pattern, file_glob) if useRg else _pythonContent(ctx, root, pattern, file_glob)
        hits, capped = _collect(found)
        hits.sort(key=lambda hit: (hit[0], hit[1]))
        page = []
        for hitPath, line, text in hits[offset : offset + limit]:
            entry: dict[str, Any] = {"path": ctx.display(hitPath), "line": line, "text": _cut(text)}
            if context:
                entry.update(_context(hitPath, line, context))
            page.append(entry)
        result = {"matches": page}
        paths = hits
    result["total"] = len(paths)
    if capped:
        result["note"] = f"stopped counting at {COLLECT_LIMIT} results; narrow the search"
    if offset + limit < len(paths):
        result["hint"] = f"Results truncated. Use offset={offset + limit} to see more."
    return ToolOutcome(jsonText(result), {"path": root, "result": result})


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


SEARCH_FILES = Tool(
    "search_files",
    "Search file contents with a regular expression (target='content'), or find files whose "
    "names match a glob such as '*.py' (target='files', newest first). Hidden files are skipped.",
    parameters(
        ["pattern"],
        pattern={"type": "string", "description": "Regex for content, glob for file names"},
        target={"type": "string", "enum": ["content", "files"], "default": "content"},
        path={"type": "string", "default": ".", "description": "Folder or file to search"},
        file_glob={"type": "string", "description": "Only search files matching this glob (content)"},
        limit={"type": "integer", "minimum": 1, "default": 50},
        offset={"type": "integer", "minimum": 0, "default": 0},
        context={"type": "integer", "minimum": 0, "default": 0, "description": "Lines around each match"},
    ),
    searchFiles,
    pathArgument="path",
)
