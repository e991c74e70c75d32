"""Validate what the agent writes against the official ACP v1 schema.

The schema lets unknown keys through, so :func:`unknownKeys` adds the strict
check: every key we send must be a name the schema knows (``messageId``, not
``message_id``), except inside free-form values.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMA_PATH = Path(__file__).parent / "data" / "acp-schema-v1.json"
ENVELOPE_KEYS = {"jsonrpc", "id", "method", "params", "result", "error"}
# Values the schema leaves free-form: anything may sit below these keys.
FREE_FORM = {"_meta", "rawInput", "rawOutput", "data"}


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


@cache
def _registry() -> Registry:
    return Registry().with_resource("urn:acp", Resource.from_contents(schema()))


@cache
def validator(typeName: str) -> Draft202012Validator:
    if typeName not in schema()["$defs"]:
        raise KeyError(typeName)
    return Draft202012Validator({"$ref": f"urn:acp#/$defs/{typeName}"}, registry=_registry())


@cache
def typeFor(method: str, side: str, suffix: str) -> str:
    """The ``$defs`` name annotated with ``x-method`` = method, ``x-side`` = side."""
    for name, definition in schema()["$defs"].items():
        if definition.get("x-method") == method and definition.get("x-side") == side and name.endswith(suffix):
            return name
    raise KeyError(f"no {suffix} type for {method} ({side})")


@cache
def knownKeys() -> frozenset[str]:
    names: set[str] = set(ENVELOPE_KEYS)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema())
    return frozenset(names)


def unknownKeys(value: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in knownKeys():
                found.append(f"{path}.{key}")
            if key not in FREE_FORM:
                found += unknownKeys(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += unknownKeys(item, f"{path}[{index}]")
    return found


def problems(instance: Any, typeName: str) -> list[str]:
    return [f"{typeName}: {e.message} at {list(e.absolute_path)}" for e in validator(typeName).iter_errors(instance)]


def checkAgentFrame(frame: dict[str, Any], requestMethods: dict[str, str]) -> list[str]:
    """Everything wrong with one frame the agent wrote.

    ``requestMethods`` maps ``json.dumps(id)`` of each client request to its method,
    so a response's result is checked against that method's response type.
    """
    found = unknownKeys(frame)
    if frame.get("jsonrpc") != "2.0":
        found.append("jsonrpc is not 2.0")
    if "method" in frame:
        method = frame["method"]
        params = frame.get("params", {})
        if "id" in frame:
            found += problems(params, typeFor(method, "client", "Request"))
        elif method == "$/cancel_request":
            found += problems(params, "CancelRequestNotification")
        else:
            found += problems(params, typeFor(method, "client", "Notification"))
    elif "error" in frame:
        found += problems(frame["error"], "Error")
    else:
        method = requestMethods.get(json.dumps(frame.get("id")))
        if method is None:
            found.append(f"response to unknown request id {frame.get('id')!r}")
        else:
            found += problems(frame["result"], typeFor(method, "agent", "Response"))
    return found
