"""``search_files``: regex search in file contents, or file names by glob.

ripgrep does the work when it is installed; otherwise the pure-Python search in
``grep`` gives the same result shape (it skips hidden and binary files as rg
does, but does not read ``.gitignore``). Either way the matching runs in a
child process that is killed when the turn is cancelled, when the search has
found enough, or after ``SEARCH_TIMEOUT`` seconds: no pattern can hold the
agent's interpreter.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from functools import partial
from typing import Any

import attrs

from hermes_acp.engine import processes
from hermes_acp.engine.secrets import childEnvironment
from hermes_acp.engine.sensitive import secretKind
from hermes_acp.engine.tools import grep
from hermes_acp.engine.tools.files import approvedRead
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters

COLLECT_LIMIT = 5000
MAX_TEXT = 500
SEARCH_TIMEOUT = 30.0
#: Files larger than this are not searched by ripgrep (read_file's limit too).
MAX_FILE_BYTES = 64 * 1024 * 1024
_POLL = 0.05
_STDERR_KEEP = 4096


def _cut(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " ..."


@attrs.define
class _Child:
    """One search process, read line by line with select: the cancel event and
    the deadline are checked every ``_POLL`` seconds, however quiet the child is."""

    argv: list[str]
    ctx: ToolContext
    deadline: float
    timedOut: bool = False

    def lines(self) -> Iterator[str]:
        """Its output lines; it is killed when the consumer stops, the turn is
        cancelled or the deadline passes. Exit status 2 with a message is a
        ``ToolError`` (a bad pattern) when it printed nothing; with results, its
        complaints about single files (permissions) do not spoil them."""
        try:
            process, _ = processes.spawn(
                self.argv, None, childEnvironment(), self.ctx.sandbox, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        except OSError as e:
            raise ToolError(f"cannot start the search: {e.strerror or e}") from e
        assert process.stdout is not None and process.stderr is not None
        out, err = process.stdout.fileno(), process.stderr.fileno()
        pending, error = bytearray(), bytearray()
        streams = [out, err]
        printed = False
        try:
            while out in streams:
                if self.ctx.cancelEvent.is_set():
                    return
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self.timedOut = True
                    return
                for fd in select.select(streams, [], [], min(_POLL, remaining))[0]:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        streams.remove(fd)
                    elif fd == err:
                        error = (error + chunk)[-_STDERR_KEEP:]
                    else:
                        pending += chunk
                        if b"\n" in chunk:
                            cut = pending.rfind(b"\n")
                            complete = bytes(pending[:cut])
                            del pending[: cut + 1]
                            printed = True
                            for line in complete.split(b"\n"):
                                yield line.decode("utf-8", "replace")
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            code = process.wait()
            processes.release(process)
            if err in streams:  # the child is gone: what it wrote is all there is
                while chunk := os.read(err, 65536):
                    error = (error + chunk)[-_STDERR_KEEP:]
            process.stdout.close()
            process.stderr.close()
        message = error.decode("utf-8", "replace").strip()
        if code == 2 and message and not printed:
            raise ToolError(f"search failed: {message}")


def _rg(arguments: list[str]) -> list[str]:
    rg = shutil.which("rg")
    assert rg is not None
    return [rg, "--no-config", *arguments]


def _python(arguments: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", grep.__file__, *arguments]


def _rgContent(lines: Iterator[str]) -> Iterator[tuple[str, int, str]]:
    for line in lines:
        event = json.loads(line)
        if event.get("type") != "match":
            continue
        data = event["data"]
        text = data["lines"].get("text")
        if text is None:
            text = base64.b64decode(data["lines"].get("bytes", "")).decode("utf-8", "replace")
        path = data["path"].get("text") or base64.b64decode(data["path"]["bytes"]).decode("utf-8", "replace")
        yield path, data["line_number"], text


def _pythonContent(lines: Iterator[str]) -> Iterator[tuple[str, int, str]]:
    for line in lines:
        path, number, text = json.loads(line)
        yield path, number, text


def _files(lines: Iterator[str], root: str, glob: str | None) -> Iterator[str]:
    for line in lines:
        path = json.loads(line)[0] if glob is None else line
        if glob is None or grep.globMatches(glob, path, root):
            yield path


def _collect(found: Iterator[Any]) -> tuple[list[Any], bool]:
    items: list[Any] = []
    for item in found:
        if len(items) == COLLECT_LIMIT:
            return items, True
        items.append(item)
    return items, False


def _contexts(ctx: ToolContext, hits: list[tuple[str, int, str]], count: int) -> dict[tuple[str, int], dict[str, list[str]]]:
    """The lines around each hit, reading each file once, line by line, only as far
    as the last line needed (so the GIL is never held for a whole big file), and
    stopping on cancel."""
    wanted: dict[str, list[int]] = {}
    for path, line, _ in hits:
        wanted.setdefault(path, []).append(line)
    found: dict[tuple[str, int], dict[str, list[str]]] = {}
    for path, lines in wanted.items():
        needed = {n for line in lines for n in range(max(1, line - count), line + count + 1)}
        text: dict[int, str] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, raw in enumerate(f, 1):
                    if number in needed:
                        text[number] = _cut(raw)
                    if number >= max(needed) or ctx.cancelEvent.is_set():
                        break
        except OSError:
            pass
        for line in lines:
            found[(path, line)] = {
                "before": [text[n] for n in range(max(1, line - count), line) if n in text],
                "after": [text[n] for n in range(line + 1, line + count + 1) if n in text],
            }
    return found


def searchFiles(
    ctx: ToolContext, pattern: str, target: str, path: str, limit: int, offset: int, context: int,
    file_glob: str | None = None,
) -> ToolOutcome:
    root = ctx.resolve(path)
    if not os.path.exists(root):
        raise ToolError(f"path not found: {root}")
    approvedRead(ctx, root)
    useRg = shutil.which("rg") is not None
    if target == "files":
        glob = grep.nameGlob(pattern)
        # rg lists every file and the names are matched here; the Python child matches them itself.
        argv = _rg(["--files", "--", root]) if useRg else _python(["files", root, glob])
        parse: Any = partial(_files, root=root, glob=glob if useRg else None)
    else:
        if useRg:
            # rg holds a file's whole output until the file is done: bound it per file.
            bounds = [f"--max-count={COLLECT_LIMIT + 1}", f"--max-filesize={MAX_FILE_BYTES}"]
            argv = _rg(["--json", *bounds, "-e", pattern, *(["--glob", file_glob] if file_glob else []), "--", root])
        else:
            argv = _python(["content", root, pattern, *([file_glob] if file_glob else [])])
        parse = _rgContent if useRg else _pythonContent
    child = _Child(argv, ctx, time.monotonic() + SEARCH_TIMEOUT)
    with closing(child.lines()) as lines:  # the child is killed as soon as we have enough
        found, capped = _collect(parse(lines))
    hidden = 0
    if target == "files":
        found.sort(key=lambda p: (-_mtime(p), p))
        result: dict[str, Any] = {"files": [ctx.display(p) for p in found[offset : offset + limit]]}
    else:
        secret = {path for path in {hit[0] for hit in found} if secretKind(path)}
        hidden = sum(1 for hit in found if hit[0] in secret)
        found = [hit for hit in found if hit[0] not in secret]
        found.sort(key=lambda hit: (hit[0], hit[1]))
        shown = found[offset : offset + limit]
        around = _contexts(ctx, shown, context) if context else {}
        page = []
        for hitPath, line, text in shown:
            entry: dict[str, Any] = {"path": ctx.display(hitPath), "line": line, "text": _cut(text)}
            entry.update(around.get((hitPath, line), {}))
            page.append(entry)
        result = {"matches": page}
    if ctx.cancelEvent.is_set():
        raise ToolError("the search was cancelled")
    result["total"] = len(found)
    if capped:
        result["note"] = f"stopped counting at {COLLECT_LIMIT} results; narrow the search"
    elif child.timedOut:
        result["note"] = f"the search stopped after {SEARCH_TIMEOUT:.0f} s; these are the results so far. Narrow the path or the pattern"
    if hidden:
        result["secrets"] = (f"{hidden} match(es) in {len(secret)} secret file(s) (keys, credentials, .env) "
                             "are not shown; read_file asks the user for them")
    if offset + limit < len(found):
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
        limit={"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
        offset={"type": "integer", "minimum": 0, "default": 0},
        context={"type": "integer", "minimum": 0, "maximum": 20, "default": 0, "description": "Lines around each match"},
    ),
    searchFiles,
    pathArgument="path",
)
