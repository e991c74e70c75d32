"""Validate what the agent writes against the official ACP v1 schema.

The schema lets unknown keys through, so ``unknownKeys`` adds the strict
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
# Unstable additions we use (session/fork, PromptResponse.usage) are checked against this one.
UNSTABLE_PATH = Path(__file__).parent / "data" / "acp-schema-v1-unstable.json"
ENVELOPE_KEYS = {"jsonrpc", "id", "method", "params", "result", "error"}
# Session updates only the unstable schema has (an editor with ``subagents`` gets them).
UNSTABLE_UPDATES = {"subagent_update", "session_message", "session_message_chunk"}
# Methods no current schema has, kept for older clients.
LEGACY_METHODS = {"session/set_model"}
# Values the schema leaves free-form: anything may sit below these keys (a form's
# "properties" are the names of its fields).
FREE_FORM = {"_meta", "rawInput", "rawOutput", "data", "properties"}


@cache
def schema(unstable: bool = False) -> dict[str, Any]:
    return json.loads((UNSTABLE_PATH if unstable else SCHEMA_PATH).read_text())


@cache
def validator(typeName: str, unstable: bool = False) -> Draft202012Validator:
    if typeName not in schema(unstable)["$defs"]:
        raise KeyError(typeName)
    registry = Registry().with_resource("urn:acp", Resource.from_contents(schema(unstable)))
    return Draft202012Validator({"$ref": f"urn:acp#/$defs/{typeName}"}, registry=registry)


@cache
def typeFor(method: str, side: str, suffix: str) -> tuple[str, bool]:
    """The ``$defs`` name annotated with ``x-method`` = method and ``x-side`` = side,
    from the stable schema if it has one, and whether it came from the unstable one."""
    for unstable in (False, True):
        for name, definition in schema(unstable)["$defs"].items():
            if definition.get("x-method") == method and definition.get("x-side") == side and name.endswith(suffix):
                return name, unstable
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
    walk(schema(unstable=True))
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


def problems(instance: Any, typeName: str | tuple[str, bool]) -> list[str]:
    name, unstable = typeName if isinstance(typeName, tuple) else (typeName, False)
    return [f"{name}: {e.message} at {list(e.absolute_path)}" for e in validator(name, unstable).iter_errors(instance)]


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
        elif method == "session/update" and (params.get("update") or {}).get("sessionUpdate") in UNSTABLE_UPDATES:
            found += problems(params, ("SessionNotification", True))
        else:
            found += problems(params, typeFor(method, "client", "Notification"))
    elif "error" in frame:
        found += problems(frame["error"], "Error")
    else:
        method = requestMethods.get(json.dumps(frame.get("id")))
        if method is None:
            found.append(f"response to unknown request id {frame.get('id')!r}")
        elif method in LEGACY_METHODS:
            found += [] if frame["result"] == {} else [f"{method} answered {frame['result']!r}"]
        else:
            stable = problems(frame["result"], typeFor(method, "agent", "Response"))
            # A stable type that lacks an unstable field (PromptResponse.usage) is still checked
            # by the unstable schema, which has it.
            found += stable
            if method == "session/prompt" and "usage" in frame["result"]:
                found += problems(frame["result"], ("PromptResponse", True))
    return found
