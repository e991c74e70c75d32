"""``read_file`` and ``write_file``, and the approved write that ``patch`` shares."""

from __future__ import annotations

import base64
import difflib
import os
import re
import stat
from typing import Any

from hermes_acp.engine import images
from hermes_acp.engine.access import EditProposal
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, parameters
from hermes_acp.engine.workspace import WorkspaceError, readBytes

DEFAULT_LIMIT = 500
MAX_LIMIT = 2000
MAX_CHARS = 100_000
MAX_LINE_CHARS = 2000
MAX_FILE_BYTES = 64 * 1024 * 1024
_BINARY_SUFFIXES = frozenset(
    ".png .jpg .jpeg .gif .bmp .ico .webp .tif .tiff .pdf .zip .gz .tgz .bz2 .xz .7z .rar .tar "
    ".jar .war .class .so .dll .dylib .exe .bin .o .a .pyc .pyo .whl .mp3 .mp4 .mov .avi .wav "
    ".flac .ogg .woff .woff2 .ttf .otf .eot .sqlite .db .parquet .npy .npz .pkl".split()
)
_NUMBERED_LINE = re.compile(r"^\s*\d+\|")


def checkTextPath(path: str) -> os.stat_result | None:
    """The file's stat, None when it is missing, or a ``ToolError`` for what cannot be text."""
    if path.startswith(("/dev/", "/proc/", "/sys/")):
        raise ToolError(f"{path} is a device or system file; refusing to use it")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ToolError(f"cannot access {path}: {e.strerror}") from e
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{path} is a directory; use search_files with target='files' to list it")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{path} is not a regular file (device, pipe or socket); refusing to use it")
    return info


def _notFound(path: str) -> ToolError:
    folder, name = os.path.split(path)
    try:
        close = difflib.get_close_matches(name, os.listdir(folder), n=3)
    except OSError:
        close = []
    hint = f" Similar names there: {', '.join(close)}." if close else ""
    return ToolError(f"file not found: {path}.{hint}")


def readText(ctx: ToolContext, path: str) -> str | None:
    """The file's text through the workspace; None when it does not exist."""
    try:
        return ctx.workspace.readText(path)
    except FileNotFoundError:
        return None
    except (WorkspaceError, OSError) as e:
        raise ToolError(f"cannot read {path}: {e}") from e


def approvedRead(ctx: ToolContext, path: str) -> None:
    """Go on only if the session's policy, or the user, lets the model see ``path``."""
    verdict = ctx.approveRead(path)
    if not verdict.allowed:
        raise ToolError(verdict.message, {"path": path, "denied": True})


def _sniffed(path: str) -> bytes:
    """The first bytes of a local file ("" when it cannot be read: the text read says why)."""
    try:
        return readBytes(path, 16)
    except (WorkspaceError, OSError):
        return b""


def loadImage(ctx: ToolContext, absPath: str, size: int, purpose: str) -> tuple[bytes, images.Picture]:
    """The bytes of the image file ``absPath`` (``size`` bytes on disk) and what its header
    says, within the session's image limits; a ``ToolError`` that says why it cannot be
    ``purpose`` ("shown to the model")."""
    limits = ctx.imageLimits
    try:
        images.checkBytes(size, limits)
        data = readBytes(absPath, limits.maxBytes + 1)
        return data, images.checked(data, limits)
    except images.ImageError as e:
        raise ToolError(f"{absPath} cannot be {purpose}: {e}", {"path": absPath}) from None
    except (WorkspaceError, OSError) as e:
        raise ToolError(f"cannot read {absPath}: {e}") from e


def readImage(ctx: ToolContext, absPath: str, size: int) -> ToolOutcome:
    """An image file: checked (format, bytes, pixels) and attached for the model to look at
    and for the card's preview (``engine.images``)."""
    data, picture = loadImage(ctx, absPath, size, "shown to the model")
    encoded = base64.b64encode(data).decode("ascii")
    attached = images.attachment(absPath, picture.mime, encoded, picture, len(data), ctx.imageLimits)
    return ToolOutcome(f"Image file {absPath} ({picture.describe(len(data))}). The image itself follows the tool "
                       "results.", {"path": absPath, "images": [attached]})


def readFile(ctx: ToolContext, path: str, offset: int, limit: int) -> ToolOutcome:
    absPath = ctx.resolveReal(path)
    approvedRead(ctx, absPath)
    info = checkTextPath(absPath)  # None: not on disk, though the editor may hold it in a buffer
    suffix = os.path.splitext(absPath)[1].lower()
    if info is not None and images.looksLikeImage(_sniffed(absPath)):
        return readImage(ctx, absPath, info.st_size)
    if suffix in images.SUFFIXES and info is not None:
        raise ToolError(f"{absPath} is named like an image but its content is none of PNG, JPEG, GIF or WebP "
                        "(damaged, or another kind of file)")
    if suffix in _BINARY_SUFFIXES:
        raise ToolError(f"{absPath} looks like a binary file; read_file reads text and PNG, JPEG, GIF and WebP images")
    if info is not None and info.st_size > MAX_FILE_BYTES:
        raise ToolError(f"{absPath} is too large to read ({info.st_size // 2**20} MiB); "
                        "use search_files, or terminal with head, tail or sed -n")
    text = readText(ctx, absPath)
    if text is None:
        raise _notFound(absPath)
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()  # the final line break does not start another line
    total = len(lines)
    limit = min(limit, MAX_LIMIT)
    extras: dict[str, Any] = {"path": absPath, "totalLines": total}
    if total == 0:
        return ToolOutcome("(empty file)", {**extras, "startLine": 1, "endLine": 0, "truncated": False})
    if offset > total:
        raise ToolError(f"offset {offset} is past the end of {path} ({total} lines)")
    shown: list[str] = []
    size = 0
    for number in range(offset, min(total, offset + limit - 1) + 1):
        line = lines[number - 1]
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" ... [line cut, {len(line)} chars]"
        entry = f"{number:6d}|{line}"
        if shown and size + len(entry) + 1 > MAX_CHARS:
            break
        shown.append(entry)
        size += len(entry) + 1
    end = offset + len(shown) - 1
    truncated = end < total
    if truncated:
        shown.append(f"[Showing lines {offset}-{end} of {total}. Use offset={end + 1} to read more.]")
    extras.update(startLine=offset, endLine=end, truncated=truncated)
    return ToolOutcome("\n".join(shown), extras)


def unifiedDiff(old: str, new: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        )
    )


def diffCounts(diff: str) -> tuple[int, int]:
    lines = diff.splitlines()[2:]
    added = sum(1 for line in lines if line.startswith("+"))
    removed = sum(1 for line in lines if line.startswith("-"))
    return added, removed


def writeApproved(ctx: ToolContext, toolName: str, path: str, old: str | None, new: str) -> dict[str, Any]:
    """Ask for approval as the session's policy says, then write; return the editor's extras."""
    verdict = ctx.approveEdit(EditProposal(toolName, path, old, new))
    if not verdict.allowed:
        raise ToolError(verdict.message, {"path": path, "denied": True})
    try:
        ctx.workspace.writeText(path, new)
    except (WorkspaceError, OSError) as e:
        raise ToolError(f"cannot write {path}: {e}") from e
    return {"path": path, "oldText": old, "newText": new}


def writeFile(ctx: ToolContext, path: str, content: str) -> ToolOutcome:
    absPath = ctx.resolveReal(path)
    checkTextPath(absPath)
    lines = content.splitlines()
    if len(lines) >= 3 and all(_NUMBERED_LINE.match(line) for line in lines):
        raise ToolError("content looks like read_file output (line-number prefixes); write the bare text")
    name = ctx.display(absPath)
    with ctx.locks.held(absPath):
        old = readText(ctx, absPath)
        if old == content:
            return ToolOutcome(f"{name} already has this content; nothing changed.", {"path": absPath})
        extras = writeApproved(ctx, "write_file", absPath, old, content)
    size = len(content.encode("utf-8"))
    if old is None:
        return ToolOutcome(f"Created {name} ({len(lines)} lines, {size} bytes).", extras)
    added, removed = diffCounts(unifiedDiff(old, content, name))
    return ToolOutcome(f"Updated {name}: +{added} -{removed} lines ({size} bytes).", extras)


READ_FILE = Tool(
    "read_file",
    "Read a text file with line numbers (format 'N|line'). Use offset and limit to page "
    "through long files. An image (PNG, JPEG, GIF, WebP) is attached for you to look at instead. "
    "Relative paths start at the session's working directory.",
    parameters(
        ["path"],
        path={"type": "string", "description": "File to read"},
        offset={"type": "integer", "minimum": 1, "default": 1, "description": "First line (1-based)"},
        limit={"type": "integer", "minimum": 1, "default": DEFAULT_LIMIT,
               "description": f"Lines to read (max {MAX_LIMIT})"},
    ),
    readFile,
    pathArgument="path",
)

WRITE_FILE = Tool(
    "write_file",
    "Create or overwrite a text file with the given content (parent folders are created). "
    "Use patch for small changes to an existing file.",
    parameters(
        ["path", "content"],
        path={"type": "string", "description": "File to write"},
        content={"type": "string", "description": "The complete new content"},
    ),
    writeFile,
    pathArgument="path",
    mayWrite=True,
)
