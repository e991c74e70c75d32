"""Reading request params: a bad field is a -32602 that names it."""

from __future__ import annotations

from typing import Any

from .jsonrpc import InvalidParams

_MISSING = object()


def field(params: dict[str, Any], name: str, kind: type | tuple[type, ...], *, default: Any = _MISSING) -> Any:
    """``params[name]`` checked against ``kind``; optional when a default is given."""
    value = params.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidParams(f"Invalid params: {name} is required", {"field": name})
        return default
    if isinstance(value, bool) and bool not in _kinds(kind):
        raise _wrongType(name, kind)
    if not isinstance(value, kind):
        raise _wrongType(name, kind)
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _wrongType(name: str, kind: type | tuple[type, ...]) -> InvalidParams:
    names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in _kinds(kind))
    return InvalidParams(f"Invalid params: {name} must be {names}", {"field": name})


_JSON_NAMES = {str: "a string", int: "an integer", bool: "a boolean", list: "an array", dict: "an object"}


def lenientObject(params: dict[str, Any], name: str) -> dict[str, Any]:
    """An optional object where a malformed value means 'absent' (the schema's
    ``x-deserialize-default-on-error``)."""
    value = params.get(name)
    return value if isinstance(value, dict) else {}
