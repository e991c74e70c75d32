"""One rule for every value that crosses a boundary: the wire, the journal, the
model's history and a model request.

- A lone surrogate (``"\\ud800"``: JSON allows the escape, UTF-8 cannot carry it)
  is **repaired**: replaced by U+FFFD, as a UTF-8 decoder would.
- A non-finite number (``NaN``, ``Infinity``, or ``1e400``, which Python reads
  as infinity) is **refused**: JSON has no such number.
- Nesting deeper than ``MAX_DEPTH`` levels is **refused** (no ACP message
  comes close, and deep values make recursive code fail later).

Pure Python, no Twisted: the JSON-RPC layer, the engine and the store share it.
Every walk here is iterative, so no input can exhaust the stack.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

MAX_DEPTH = 128
_ERRORS = "hermes-acp.fffd"
_FFFD = "\ufffd".encode()
# What a lone surrogate looks like in JSON text: an escape, or bytes that
# json.loads decodes with "surrogatepass". Valid pairs match too (a false alarm
# only costs a walk).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SUSPECT_TEXT = re.compile(r"NaN|Infinity|\\u[dD][89a-fA-F]")


def _replaceSurrogates(error: UnicodeError) -> tuple[bytes, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return _FFFD * (error.end - error.start), error.end


codecs.register_error(_ERRORS, _replaceSurrogates)


class Refused(ValueError):
    """A value that breaks the rule; ``path`` says where (``params.prompt[0].x``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, lone surrogates replaced by U+FFFD."""
    return text.encode("utf-8", _ERRORS)


def repairText(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (the same object when it has none)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return utf8(text).decode("utf-8")
    return text


#: ``json.dumps`` with these options builds this encoder anew at each call (a streamed frame
#: is one call); its ``encode`` keeps no state between calls, so one serves every thread.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON text; ValueError for non-finite numbers."""
    return _ENCODER.encode(value)


def encode(value: Any) -> bytes:
    """Compact UTF-8 JSON with lone surrogates repaired; ValueError for non-finite
    numbers, TypeError for values JSON has no form for."""
    return utf8(dumps(value))


def encodeHealed(value: Any) -> bytes:
    """``encode``, a non-finite number written as null (``value`` healed in place first, only
    when it holds one): for what leaves whatever it holds (a model request, the journal, a
    trace). TypeError for values JSON has no form for."""
    try:
        return encode(value)
    except ValueError:
        return encode(healed(value))


class Encoded(dict):  # type: ignore[type-arg]
    """A JSON object together with its ``encode`` bytes, made once: a ``session/update``
    the wire carries as these bytes and the journal keeps as the same text (encoding it
    again, later, would cost as much as sending it, and could differ)."""

    __slots__ = ("data",)

    def __init__(self, value: dict[str, Any], data: bytes) -> None:
        super().__init__(value)
        self.data = data


Trail = tuple[Any, Any] | None  # (parent trail, key): a path, built only when needed


def _path(prefix: str, trail: Trail) -> str:
    keys = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    path = prefix
    for key in reversed(keys):
        path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
    path = path or "the value"
    return path if len(path) <= 120 else path[:100] + "…" + path[-19:]


def _walk(value: Any, refuse: bool, prefix: str, maxDepth: int) -> Any:
    """Repair strings (keys too) in place; non-finite numbers are refused or nulled."""
    root = [value]
    stack: list[tuple[Any, int, Trail]] = [(root, 0, None)]
    while stack:
        container, depth, trail = stack.pop()
        if depth > maxDepth:
            raise Refused(_path(prefix, trail), f"is nested deeper than {maxDepth} levels")
        if isinstance(container, dict):
            for old in [k for k in container if isinstance(k, str) and repairText(k) is not k]:
                container[repairText(old)] = container.pop(old)
            items: Any = list(container.items())
        else:
            items = enumerate(container)
        for key, item in items:
            if isinstance(item, str):
                fixed = repairText(item)
                if fixed is not item:
                    container[key] = fixed
            elif isinstance(item, float):
                if math.isfinite(item):
                    continue
                if refuse:
                    where = (trail, key) if container is not root else None
                    raise Refused(_path(prefix, where), "is not a finite number (JSON has no NaN or Infinity)")
                container[key] = None
            elif isinstance(item, (dict, list, tuple)):
                if isinstance(item, tuple):  # JSON has only arrays: make it one that can be repaired
                    item = container[key] = list(item)
                stack.append((item, depth + 1, (trail, key) if container is not root else None))
    return root[0]


def checked(value: Any, path: str = "", maxDepth: int = MAX_DEPTH) -> Any:
    """``value`` (changed in place) with lone surrogates repaired; ``Refused``
    for a non-finite number or nesting deeper than ``maxDepth``."""
    return _walk(value, True, path, maxDepth)


def healed(value: Any) -> Any:
    """``value`` (changed in place) with lone surrogates repaired and non-finite
    numbers replaced by null: for what was stored before the rule existed."""
    return _walk(value, False, "", 2**31)


def repaired(value: Any) -> Any:
    """A JSON-like value that is safe to send: the same object when it already is
    (checked at C speed), else healed in place."""
    try:
        encoded = dumps(value)
        encoded.encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return healed(value)
    except TypeError:
        pass  # not JSON at all: not this rule's business
    return value


def loads(text: str) -> Any:
    """Stored JSON, healed: rows written before this rule may hold ``NaN`` or
    escaped lone surrogates. Only a row whose text could hold one is walked."""
    value = json.loads(text)
    # ``in`` is a memchr-fast scan; the regex (slower than json.loads itself on a 4 KB row)
    # only when one of them is there.
    if ("NaN" in text or "Infinity" in text or "\\u" in text) and _SUSPECT_TEXT.search(text):
        return healed(value)
    return value


def parse(data: bytes, maxDepth: int = MAX_DEPTH) -> tuple[Any, Refused | None]:
    """Read one JSON text; returns the value (lone surrogates repaired) and what is
    wrong with it under the rule, if anything, so the caller can still answer the
    request's id. Raises ValueError for text that is not JSON, and Refused when it
    is nested too deeply to read at all.

    Most messages need no walk: a cheap scan of the bytes tells whether one could
    find anything."""
    suspicious = False

    def number(text: str) -> float:
        nonlocal suspicious
        value = float(text)
        suspicious = suspicious or not math.isfinite(value)
        return value

    def constant(name: str) -> float:
        nonlocal suspicious
        suspicious = True
        return float(name)

    try:
        value = json.loads(data, parse_float=number, parse_constant=constant)
    except RecursionError:
        raise Refused("the message", "is nested too deeply to read") from None
    if suspicious or _SURROGATE.search(data) or data.count(b"[") + data.count(b"{") > maxDepth:
        try:
            checked(value, "", maxDepth)
        except Refused as e:
            return value, e
    return value, None
