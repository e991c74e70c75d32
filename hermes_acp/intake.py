"""ACP prompt content blocks → what the model reads.

Text stays text; images become multimodal parts; ``resource_link`` to a local
file and embedded ``resource`` text are inlined (512 KiB at most, binary files
noted, not inlined). The result goes into the history, so attachments stay
visible to later turns. Runs in a worker thread (it may read files).

Reading a linked file never blocks the turn: only regular files are read (a
FIFO, a device or a socket is named, not opened for good), the open does not
wait for a writer, at most ``MAX_INLINE`` bytes are read, and the read gives up
when the turn is cancelled or after ``READ_TIMEOUT`` seconds (a hung network
file system).
"""

from __future__ import annotations

import base64
import codecs
import os
import stat
import threading
import time
from typing import Any
from urllib.parse import unquote, urlparse

from .jsonrpc import InvalidParams

MAX_INLINE = 512 * 1024
READ_TIMEOUT = 10.0
IMAGE_SUFFIXES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}

# What each accepted block may hold, after the ACP schema: required fields (a
# wrong one is -32602), and optional ones, which the schema marks
# "x-deserialize-default-on-error": a malformed optional value counts as absent.
# Keys the schema does not know are left out too, so what the agent stores and
# echoes of a prompt is always a valid block.
_REQUIRED: dict[str, dict[str, type]] = {
    "text": {"text": str},
    "image": {"data": str, "mimeType": str},
    "resource_link": {"uri": str, "name": str},
    "resource": {"resource": dict},
}
_OPTIONAL: dict[str, dict[str, type | tuple[type, ...]]] = {
    "text": {},
    "image": {"uri": str},
    "resource_link": {"title": str, "description": str, "mimeType": str, "size": int},
    "resource": {},
}
_RESOURCE_OPTIONAL: dict[str, type] = {"mimeType": str, "_meta": dict}
_ROLES = ("user", "assistant")


def _optional(source: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    return {
        name: source[name] for name, kind in fields.items()
        if isinstance(source.get(name), kind) and not isinstance(source.get(name), bool)
    }  # fmt: skip


def _annotations(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    found = _optional(value, {"lastModified": str, "priority": (int, float), "_meta": dict})
    if isinstance(value.get("audience"), list):
        found["audience"] = [role for role in value["audience"] if role in _ROLES]
    return found


def _normalized(block: dict[str, Any], kind: str) -> dict[str, Any]:
    """The block with only the fields the schema gives it, well-typed."""
    clean: dict[str, Any] = {"type": kind, **{name: block[name] for name in _REQUIRED[kind]}}
    clean.update(_optional(block, {**_OPTIONAL[kind], "_meta": dict}))
    annotations = _annotations(block.get("annotations"))
    if annotations is not None:
        clean["annotations"] = annotations
    if kind == "resource":
        resource = block["resource"]
        payload = "text" if isinstance(resource.get("text"), str) else "blob"
        clean["resource"] = {"uri": resource.get("uri") if isinstance(resource.get("uri"), str) else "",
                             payload: resource[payload], **_optional(resource, _RESOURCE_OPTIONAL)}
    return clean


def checkPrompt(blocks: Any, image: bool, embedded: bool) -> list[dict[str, Any]]:
    """The prompt's blocks, normalized (see ``_normalized``), or -32602 naming the
    first bad one."""
    if not isinstance(blocks, list):
        raise InvalidParams("Invalid params: prompt must be an array of content blocks", {"field": "prompt"})
    allowed = {"text", "resource_link"} | ({"image"} if image else set()) | ({"resource"} if embedded else set())
    checked = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str) or kind not in allowed:
            raise InvalidParams(
                f"Invalid params: prompt[{index}] has type {kind!r:.100}; this agent accepts {', '.join(sorted(allowed))}",
                {"field": f"prompt[{index}]"},
            )
        for name, expected in _REQUIRED[kind].items():
            if not isinstance(block.get(name), expected):
                raise InvalidParams(f"Invalid params: prompt[{index}].{name} is required", {"field": f"prompt[{index}].{name}"})
        if kind == "image":
            _base64(block["data"], f"prompt[{index}].data")
        elif kind == "resource" and not isinstance(block["resource"].get("text"), str):
            if not isinstance(block["resource"].get("blob"), str):
                field = f"prompt[{index}].resource"
                raise InvalidParams(f"Invalid params: {field} needs a text or a blob", {"field": field})
            _base64(block["resource"]["blob"], f"prompt[{index}].resource.blob")
        checked.append(_normalized(block, kind))
    return checked


def _base64(data: str, field: str = "prompt") -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:  # binascii.Error, or characters outside ASCII
        raise InvalidParams(f"Invalid params: {field} is not base64", {"field": field}) from None


def promptText(blocks: list[dict[str, Any]]) -> str:
    """Just the typed text (for titles and slash commands)."""
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text").strip()


def _parsed(uri: str) -> Any:
    """``urlparse(uri)``, or None for what it cannot parse (``file://[::1``)."""
    try:
        return urlparse(uri)
    except ValueError:
        return None


def _localPath(uri: str) -> str | None:
    """The local file a URI names; None for anything else (other schemes, other
    hosts, malformed URIs, paths with a NUL)."""
    parsed = _parsed(uri)
    path: str | None = None
    if parsed is not None and parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        path = unquote(parsed.path)
    elif parsed is not None and not parsed.scheme:
        path = uri
    return path if path and os.path.isabs(path) and "\0" not in path else None


def _decode(data: bytes, cut: bool) -> str | None:
    """The text of a file's first bytes, or None for a binary file.

    When the file was ``cut`` (read only in part), a character split at the cut
    is left out rather than making the whole file look binary."""
    if b"\0" in data[:8192]:
        return None
    try:
        return codecs.getincrementaldecoder("utf-8-sig")().decode(data, final=not cut)
    except UnicodeDecodeError:
        return None


def _attached(label: str, uri: str, body: str | None, size: int, note: str = "") -> str:
    header = f"[Attached file: {label}]\nURI: {uri}"
    if body is None:
        return f"{header}\n(binary file of {size} bytes; not inlined{note})"
    if size > MAX_INLINE:
        header += f"\n(truncated to the first {MAX_INLINE} of {size} bytes)"
    return f"{header}\n\n{body}"


def _image(mime: str, data: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


class _NotRegular(OSError):
    """A path that is not a regular file; ``strerror`` says what it is."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def _readHead(path: str) -> tuple[int, bytes]:
    """The size of a regular file and its first ``MAX_INLINE + 1`` bytes. The type is
    checked before the open (opening a FIFO or a device can do things) and again on
    the open file (the path may have changed in between)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise _NotRegular(0, f"{_kind(info.st_mode)}, so not read")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotRegular(0, f"{_kind(info.st_mode)}, so not read")
        parts, size = [], 0
        while size <= MAX_INLINE and (chunk := os.read(fd, MAX_INLINE + 1 - size)):
            parts.append(chunk)
            size += len(chunk)
        return info.st_size, b"".join(parts)
    finally:
        os.close(fd)


def _boundedRead(path: str, cancelEvent: threading.Event) -> tuple[int, bytes]:
    """``_readHead`` on a helper thread, abandoned on cancel or after READ_TIMEOUT."""
    done = threading.Event()
    outcome: list[Any] = []

    def read() -> None:
        try:
            outcome.append(_readHead(path))
        except OSError as e:
            outcome.append(e)
        except Exception as e:  # noqa: BLE001 - whatever it is, the turn gets an answer
            outcome.append(OSError(0, f"{type(e).__name__}: {e}"))
        finally:
            done.set()

    threading.Thread(target=read, name="hermes-attachment", daemon=True).start()
    deadline = time.monotonic() + READ_TIMEOUT
    while not done.wait(0.05):
        if cancelEvent.is_set():
            raise OSError(0, "not read: the turn was cancelled")
        if time.monotonic() > deadline:
            raise OSError(0, f"not read: no data after {READ_TIMEOUT:.0f} s")
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return outcome[0]


def _link(block: dict[str, Any], cancelEvent: threading.Event) -> list[dict[str, Any]]:
    uri, name = block["uri"], block.get("title") or block["name"]
    path = _localPath(uri)
    if path is None:
        return [{"type": "text", "text": f"[Linked resource: {name}]\nURI: {uri}\n(not a local file, so not read)"}]
    try:
        size, data = _boundedRead(path, cancelEvent)
    except OSError as e:
        return [{"type": "text", "text": f"[Attached file: {name}]\nURI: {uri}\n(could not be read: {e.strerror or e})"}]
    mime = block.get("mimeType") or IMAGE_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if mime and mime.startswith("image/") and size <= MAX_INLINE:
        return [{"type": "text", "text": f"[Attached image: {name}]\nURI: {uri}"}, _image(mime, base64.b64encode(data).decode())]
    return [{"type": "text", "text": _attached(name, uri, _decode(data[:MAX_INLINE], size > MAX_INLINE), size)}]


def _resource(block: dict[str, Any]) -> list[dict[str, Any]]:
    resource = block["resource"]
    uri = str(resource.get("uri", ""))
    parsed = _parsed(uri)
    label = (os.path.basename(parsed.path) if parsed is not None else "") or uri or "resource"
    if isinstance(resource.get("text"), str):
        text = resource["text"]
        size = len(text.encode("utf-8"))
        body = text.encode("utf-8")[:MAX_INLINE].decode("utf-8", "ignore") if size > MAX_INLINE else text
        return [{"type": "text", "text": _attached(label, uri, body, size)}]
    blob = resource.get("blob")
    if not isinstance(blob, str):
        raise InvalidParams("Invalid params: an embedded resource needs a text or a blob", {"field": "prompt"})
    data = _base64(blob)
    mime = str(resource.get("mimeType") or "")
    if mime.startswith("image/") and len(data) <= MAX_INLINE:
        return [{"type": "text", "text": f"[Attached image: {label}]\nURI: {uri}"}, _image(mime, blob)]
    return [{"type": "text", "text": _attached(label, uri, _decode(data[:MAX_INLINE], len(data) > MAX_INLINE), len(data))}]


def toModelContent(
    blocks: list[dict[str, Any]], cancelEvent: threading.Event | None = None
) -> str | list[dict[str, Any]]:
    """One user message: a string when everything is text, else multimodal parts."""
    cancelEvent = cancelEvent or threading.Event()
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image(block["mimeType"], block["data"]))
        elif kind == "resource_link":
            parts += _link(block, cancelEvent)
        elif kind == "resource":
            parts += _resource(block)
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts
