"""The ACP forms of a question to the user (``clarify``): an ``elicitation/create``
form, or a permission request whose options are the choices; and the editor's
answer, read as untrusted input into a ``clarify`` answer. Likewise an MCP server's
question, checked before it reaches the editor and its answer before it goes back.

Pure functions: the turn (``turns.Turn.askUser``) does the sending.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from . import safejson
from .engine.approval import CANCELLED as PERMISSION_CANCELLED
from .engine.approval import FAILED, TIMEOUT
from .engine.asking import ACCEPTED, CANCELLED, DECLINED, MAX_ANSWER_CHARS, NO_ANSWER
from .jsonrpc import InvalidParams
from .permissions import UNANSWERABLE

#: The permission option that answers nothing.
DECLINE_OPTION = "decline"
_CHOICE_PREFIX = "choice-"


def formRequest(sessionId: str, toolCallId: str, question: str, choices: list[str]) -> dict[str, Any]:
    """``elicitation/create`` params: the choices as an enum beside free text, or free
    text alone (then required: an empty form answers nothing). Marked (``_meta``) as the
    model's own question, for clients that answer those alone (``hermes-acp prompt
    --answer``), never an MCP server's."""
    text = {"type": "string", "title": "Your answer" if not choices else "Or answer in your own words",
            "maxLength": MAX_ANSWER_CHARS}
    if choices:
        schema = {"type": "object", "properties": {
            "choice": {"type": "string", "title": "Choose", "enum": list(choices)}, "text": text}}
    else:
        schema = {"type": "object", "properties": {"text": {**text, "minLength": 1}}, "required": ["text"]}
    return {"sessionId": sessionId, "toolCallId": toolCallId, "mode": "form", "message": question,
            "requestedSchema": schema, "_meta": {"hermes-acp": {"clarify": True}}}


def _bounded(text: str) -> str:
    text = text.strip()
    if len(text) > MAX_ANSWER_CHARS:
        cut = len(text) - MAX_ANSWER_CHARS
        text = f"{text[:MAX_ANSWER_CHARS]}\n[… {cut:,} more characters of the answer were cut]"
    return text


def readForm(result: Any, choices: list[str]) -> tuple[str, str]:
    """The editor's ``elicitation/create`` answer as (action, text); anything the form
    did not ask for, or a choice that was not offered, is no answer (and says so)."""
    action = result.get("action") if isinstance(result, dict) else None
    if action == "decline":
        return DECLINED, ""
    if action == "cancel":
        return CANCELLED, ""
    if action != "accept":
        return NO_ANSWER, "the editor's answer to the question was not understood"
    content = result.get("content")
    content = {} if content is None else content  # null is the same as absent
    if not isinstance(content, dict):
        return NO_ANSWER, "the editor's answer to the question was not understood"
    choice, text = content.get("choice"), content.get("text")
    if choice is not None and (not isinstance(choice, str) or choice not in choices):
        return NO_ANSWER, "the editor answered with a choice that was not offered"
    if text is not None and not isinstance(text, str):
        return NO_ANSWER, "the editor's answer was not text"
    parts = [part for part in (choice, _bounded(text or "")) if part]
    if not parts:
        return NO_ANSWER, "the user submitted the question without an answer"
    return ACCEPTED, "; ".join(parts)


def choiceOptions(choices: list[str]) -> list[dict[str, Any]]:
    """Permission options for the choices (free text has no place in a permission request);
    each is marked (``_meta``) as an answer, not a permission, for clients that allow on their own."""
    options = [{"optionId": f"{_CHOICE_PREFIX}{n}", "name": choice, "kind": "allow_once",
                "_meta": {"hermes-acp": {"answer": True}}}
               for n, choice in enumerate(choices)]
    return options + [{"optionId": DECLINE_OPTION, "name": "Don't answer", "kind": "reject_once"}]


def readChoice(optionId: str, choices: list[str], timeout: float) -> tuple[str, str]:
    """A permission answer (an option id the broker checked was offered, or one of its
    failures) as (action, text)."""
    if optionId.startswith(_CHOICE_PREFIX):
        return ACCEPTED, choices[int(optionId[len(_CHOICE_PREFIX):])]
    if optionId == DECLINE_OPTION:
        return DECLINED, ""
    if optionId == UNANSWERABLE:
        return NO_ANSWER, "nobody can answer: the client has no one to ask (no terminal)"
    return NO_ANSWER, noAnswer(optionId, timeout)


def noAnswer(reason: str, timeout: float) -> str:
    """Why there is no answer, in the words the model reads."""
    if reason == TIMEOUT:
        return f"nobody answered within {timeout:g} second{'' if timeout == 1 else 's'}"
    if reason == PERMISSION_CANCELLED:
        return "the question was withdrawn: the turn was cancelled"
    if reason == FAILED:
        return "the editor could not ask the question"
    return reason


# -- an MCP server's question ----------------------------------------------------------------

#: The field types an ACP form takes (``ElicitationSchema``: flat, one of these per field).
_FIELD_TYPES = {"string", "number", "integer", "boolean", "array"}
_VALUE_TYPES = (str, int, float, bool)


def serverQuestion(sessionId: str, toolCallId: str, server: str, params: Any, modes: tuple[str, ...],
                   maxBytes: int) -> dict[str, Any]:
    """An MCP server's ``elicitation/create`` as the editor's: checked and bounded first
    (``InvalidParams`` says what is wrong, to the server), and its message marked as the
    server's, so it never passes for the agent's own question."""
    if not isinstance(params, dict):
        raise InvalidParams("elicitation/create: params must be an object")
    size = len(safejson.encode(params))
    if size > maxBytes:
        raise InvalidParams(f"elicitation/create: the request is {size} bytes; this client forwards at most "
                            f"{maxBytes} (HERMES_ACP_MCP_ELICITATION_BYTES)")
    mode, message = params.get("mode", "form"), params.get("message")
    if mode not in modes:
        raise InvalidParams(f"elicitation/create: mode {mode!r} is not supported here (supported: {', '.join(modes)})")
    if not isinstance(message, str) or not message.strip():
        raise InvalidParams("elicitation/create: message must be a non-empty string")
    request: dict[str, Any] = {"sessionId": sessionId, "toolCallId": toolCallId, "mode": mode,
                               "message": f"The MCP server “{server}” asks (not the agent): {message.strip()}"}
    if mode == "url":
        url, elicitationId = params.get("url"), params.get("elicitationId")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("https", "http") or not urlsplit(url).netloc:
            raise InvalidParams("elicitation/create: url must be an http(s) URL")
        if not isinstance(elicitationId, str) or not elicitationId:
            raise InvalidParams("elicitation/create: elicitationId must be a non-empty string")
        return {**request, "url": url, "elicitationId": elicitationId}
    schema = params.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or schema.get("type", "object") != "object":
        raise InvalidParams("elicitation/create: requestedSchema must be an object schema with properties")
    for name, field in properties.items():
        if not isinstance(field, dict) or field.get("type") not in _FIELD_TYPES:
            raise InvalidParams(f"elicitation/create: field {name!r} must be a flat string, number, integer, "
                                "boolean or array field")
        wrong = _wrongKey(field)
        if wrong is not None:
            raise InvalidParams(f"elicitation/create: field {name!r} has a {wrong!r} that ACP forms do not take")
    wrong = next((key for key in ("title", "description") if not _TEXT(schema.get(key))), None)
    if wrong is not None:
        raise InvalidParams(f"elicitation/create: requestedSchema's {wrong!r} must be a string")
    required = schema.get("required")
    if required is not None and (not isinstance(required, list) or not set(required) <= set(properties)):
        raise InvalidParams("elicitation/create: required must list fields of the schema")
    return {**request, "requestedSchema": schema}


def _isInt(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _isNumber(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _options(value: Any) -> bool:
    """``EnumOption``s: a ``const`` and a ``title``, both strings."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and isinstance(item.get("const"), str) and isinstance(item.get("title"), str)
        for item in value)


def _optional(check: Any) -> Any:
    return lambda value: value is None or check(value)


_TEXT = _optional(lambda value: isinstance(value, str))
_COUNT = _optional(lambda value: _isInt(value) and value >= 0)
#: What ACP's ``ElicitationPropertySchema`` takes of each field type's keys (other keys pass:
#: the schema lets them through, and an editor ignores what it does not know).
_FIELD_KEYS: dict[str, dict[str, Any]] = {
    "string": {"minLength": _COUNT, "maxLength": _COUNT, "pattern": _TEXT, "default": _TEXT,
               "format": _optional(lambda value: value in ("email", "uri", "date", "date-time")),
               "enum": _optional(_strings), "oneOf": _optional(_options)},
    "number": {key: _optional(_isNumber) for key in ("minimum", "maximum", "default")},
    "integer": {key: _optional(_isInt) for key in ("minimum", "maximum", "default")},
    "boolean": {"default": _optional(lambda value: isinstance(value, bool))},
    "array": {"minItems": _COUNT, "maxItems": _COUNT, "default": _optional(_strings),
              "items": lambda value: isinstance(value, dict) and (
                  (value.get("type") == "string" and _strings(value.get("enum")))
                  or (value.get("type") is None and _options(value.get("anyOf"))))},
}


def _wrongKey(field: dict[str, Any]) -> str | None:
    """The first key of a server's form field whose value ACP's schema refuses (a missing
    ``items`` of an array field too), or None."""
    checks = {"title": _TEXT, "description": _TEXT, "_meta": _optional(lambda value: isinstance(value, dict)),
              **_FIELD_KEYS[field["type"]]}
    return next((key for key, check in checks.items()
                 if (key in field or key == "items" and field["type"] == "array") and not check(field.get(key))),
                None)


def serverAnswer(result: Any) -> dict[str, Any]:
    """The editor's answer, checked before it goes to the server: accept (with its
    values: strings, numbers, booleans, lists of strings), decline, or cancel; anything
    else is a cancel."""
    action = result.get("action") if isinstance(result, dict) else None
    if action in ("decline", "cancel"):
        return {"action": action}
    if action != "accept":
        return {"action": "cancel"}
    content = result.get("content")
    if content is None:
        return {"action": "accept"}
    if not isinstance(content, dict) or not all(
            isinstance(value, _VALUE_TYPES) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
            for value in content.values()):
        return {"action": "cancel"}
    return {"action": "accept", "content": content}
