"""The form of an ``elicitation/create`` request, read for ``hermes-acp prompt``.

The question comes from the agent, but it may carry an MCP server's question,
so the request is checked against the schema's shapes before anything is shown,
every text shown is stripped of terminal control characters and cut to a
bound, and every answer is checked against its field before it is sent back.
This module holds no I/O: ``headless`` asks the user and writes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .config import envInt

#: The most lines of a question shown (its characters are bounded by ``Limits.chars``).
MAX_MESSAGE_LINES = 20
#: The longest title, description or choice label shown.
MAX_LABEL = 200

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_YES = {"y", "yes", "true", "1"}
_NO = {"n", "no", "false", "0"}


@attrs.frozen
class Limits:
    """How big a form this client shows; a bigger one is refused (``-32602``)."""

    fields: int = 20
    choices: int = 50
    chars: int = 2000  # of the question; a longer one is cut

    @classmethod
    def fromEnv(cls, env: Mapping[str, str]) -> Limits:
        """From ``HERMES_ACP_PROMPT_QUESTION_*`` (``ConfigError`` names a bad one)."""
        default = cls()
        return cls(envInt(env, "HERMES_ACP_PROMPT_QUESTION_FIELDS", default.fields),
                   envInt(env, "HERMES_ACP_PROMPT_QUESTION_CHOICES", default.choices),
                   envInt(env, "HERMES_ACP_PROMPT_QUESTION_CHARS", default.chars, minimum=20))


class FormError(ValueError):
    """The request is not a form this client can show (answered ``-32602``)."""


def plain(text: Any) -> str:
    """``text`` safe to print: no escape sequences or other control characters
    (tabs and newlines stay)."""
    return _CONTROL.sub("", str(text).replace("\t", "    "))


def clean(text: Any, limit: int = MAX_LABEL) -> str:
    """``plain(text)``, at most ``limit`` characters."""
    text = plain(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bound(spec: dict[str, Any], key: str, kind: type | tuple[type, ...] = int) -> Any:
    value = spec.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


@attrs.frozen
class Field:
    """One property of the requested schema."""

    name: str
    kind: str  # string, number, integer, boolean, array, or what the agent sent
    title: str
    description: str
    required: bool
    choices: tuple[tuple[str, str], ...] = ()  # (value sent back, label shown)
    low: float | None = None  # minLength, minimum or minItems
    high: float | None = None  # maxLength, maximum or maxItems

    @property
    def freeText(self) -> bool:
        return self.kind == "string" and not self.choices

    def parse(self, text: str) -> Any:
        """The value for what was typed, or ``ValueError`` saying what fits."""
        text = text.strip()
        if self.kind == "boolean":
            if text.lower() in _YES | _NO:
                return text.lower() in _YES
            raise ValueError("answer y or n")
        if self.kind in ("number", "integer"):
            try:
                value: float = int(text) if self.kind == "integer" else float(text)
            except ValueError:
                raise ValueError(f"answer {'a whole number' if self.kind == 'integer' else 'a number'}") from None
            if not math.isfinite(value) or not self._within(value):
                raise ValueError(f"answer a number{self._range()}")
            return value
        if self.kind == "array" and self.choices:
            picked: list[str] = []
            for part in text.split(","):
                value = self._choice(part.strip())
                if value not in picked:
                    picked.append(value)
            if not self._within(len(picked)):
                raise ValueError(f"choose{self._range()} of them")
            return picked
        if self.kind == "string" and self.choices:
            return self._choice(text)
        if self.freeText:
            if not self._within(len(text)):
                raise ValueError(f"answer with{self._range()} characters")
            return text
        raise ValueError(f"a {clean(self.kind, 40)} answer cannot be given here")

    def _within(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def _range(self) -> str:
        if self.low is not None and self.high is not None:
            return f" from {self.low:g} to {self.high:g}"
        return f" of at least {self.low:g}" if self.low is not None else f" of at most {self.high:g}"

    def _choice(self, text: str) -> str:
        if text.isdigit() and 1 <= int(text) <= len(self.choices):
            return self.choices[int(text) - 1][0]
        for value, label in self.choices:
            if text.casefold() in (value.casefold(), label.casefold()):
                return value
        raise ValueError(f"choose 1-{len(self.choices)}")


@attrs.frozen
class Form:
    """A checked form-mode request."""

    message: str  # cleaned and cut to ``Limits.chars``
    fields: tuple[Field, ...]
    toolCallId: str | None
    #: The model's own question (``clarify``), as the agent marks it; else an MCP server's.
    fromModel: bool = False

    @property
    def freeField(self) -> Field | None:
        """Where an answer that is none of the choices goes, if anywhere."""
        return next((f for f in self.fields if f.freeText), None)

    def answerWith(self, text: str) -> dict[str, Any] | None:
        """``--answer TEXT``: the content that answers this form with ``text`` (the
        matching choice, else free text where the form allows it), or None when
        ``text`` fits nowhere or a required field stays empty."""
        content: dict[str, Any] = {}
        for field in self.fields:
            if not field.freeText:
                try:
                    content[field.name] = field.parse(text)
                except ValueError:
                    pass
        free = self.freeField
        if not content and free is not None:
            try:
                content[free.name] = free.parse(text)
            except ValueError:
                pass
        if not content or any(f.required and f.name not in content for f in self.fields):
            return None
        return content


def parseForm(params: dict[str, Any], sessionId: str | None, limits: Limits = Limits()) -> Form:
    """The form in ``elicitation/create`` params, or ``FormError``."""
    if params.get("mode") != "form":
        raise FormError(f"Invalid params: only form elicitation is supported here, not {clean(params.get('mode'), 40)!r}")
    if params.get("sessionId") != sessionId:
        raise FormError("Invalid params: not this client's session")
    message = params.get("message")
    schema = params.get("requestedSchema")
    if not isinstance(message, str):
        raise FormError("Invalid params: message must be a string")
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise FormError("Invalid params: requestedSchema must be an object schema")
    properties = schema.get("properties", {})
    required = schema.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise FormError("Invalid params: requestedSchema.properties must be an object, required a list")
    if len(properties) > limits.fields:
        raise FormError(f"Invalid params: more than {limits.fields} fields")
    toolCallId = params.get("toolCallId")
    fields = tuple(_field(name, spec, name in required, limits) for name, spec in properties.items())
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    mark = meta.get("hermes-acp") if isinstance(meta.get("hermes-acp"), dict) else {}
    return Form(clean(message, limits.chars), fields, toolCallId if isinstance(toolCallId, str) else None,
                mark.get("clarify") is True)


def _field(name: str, spec: Any, required: bool, limits: Limits) -> Field:
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise FormError(f"Invalid params: field {clean(name, 40)!r} has no type")
    kind = spec["type"]
    options = spec
    if kind == "array":
        options = spec.get("items") if isinstance(spec.get("items"), dict) else {}
        low, high = _bound(spec, "minItems"), _bound(spec, "maxItems")
    elif kind == "string":
        low, high = _bound(spec, "minLength"), _bound(spec, "maxLength")
    else:
        low, high = _bound(spec, "minimum", (int, float)), _bound(spec, "maximum", (int, float))
    listed = options.get("enum") or options.get("oneOf") or options.get("anyOf") or []
    if not isinstance(listed, list) or len(listed) > limits.choices:
        raise FormError(f"Invalid params: field {clean(name, 40)!r} offers more than {limits.choices} choices")
    choices = []
    for item in listed:
        if isinstance(item, str):
            choices.append((item, clean(item)))
        elif isinstance(item, dict) and isinstance(item.get("const"), str):
            choices.append((item["const"], clean(item.get("title") or item["const"])))
        else:
            raise FormError(f"Invalid params: field {clean(name, 40)!r} has a choice that is not a string")
    if kind == "array" and not choices:
        raise FormError(f"Invalid params: field {clean(name, 40)!r} has no items to choose from")
    return Field(name, kind, clean(spec.get("title") or name), clean(spec.get("description") or "", limits.chars),
                 required, tuple(choices), low, high)
