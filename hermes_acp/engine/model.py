"""The model client: streaming Chat Completions from any OpenAI-compatible endpoint.

The wire format is spoken directly (``engine.chat_http``: ``http.client``, no SDK). The run's
thread reads the stream itself; a cancel shuts the socket from the cancelling thread, which
wakes a read blocked on a stalled server at once. 429, 5xx and broken connections are retried
with backoff (``Retry-After`` when the endpoint gives one), until something was delivered.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hermes_acp import safejson
from hermes_acp.config import DEFAULT_MODEL_MAX_EVENT, DEFAULT_MODEL_MAX_REPLY, DEFAULT_MODEL_REPLY_SECONDS, Endpoint
from hermes_acp.engine import chat_http, sse
from hermes_acp.engine.cancel import Cancellation

log = logging.getLogger(__name__)

CANCELLED_FINISH = "cancelled"
_NO_KEY = "no-key"  # keyless local servers still get a well-formed Authorization header


class ModelError(Exception):
    """A model request failed; the message is written for the user. ``auth`` is set
    when the endpoint refused the key (the user has to set up another)."""

    def __init__(self, message: str, retryable: bool = False, retryAfter: float | None = None,
                 auth: bool = False, overflow: bool = False, window: int | None = None, images: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retryAfter = retryAfter
        self.auth = auth
        #: The request did not fit the model's context; ``window`` when the error said how big it is.
        self.overflow = overflow
        self.window = window
        #: The endpoint refused the request's images: the model cannot see.
        self.images = images


@attrs.frozen
class ToolCallRequest:
    """One tool call the model asked for; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ModelReply:
    """One streamed answer (possibly cut short: ``finishReason`` "cancelled")."""

    text: str
    reasoning: str
    toolCalls: tuple[ToolCallRequest, ...]
    finishReason: str | None
    usage: dict[str, Any] | None
    refusal: str = ""
    #: The delta field the reasoning came in (``reasoning_content`` or ``reasoning``):
    #: it goes back to the endpoint under the same name.
    reasoningField: str = "reasoning_content"


#: What one tool call of a reply counts against ``ReplyLimits.maxReply`` besides its name and
#: arguments: each becomes a card and a result, whatever its size (a reply of calls of no bytes
#: would otherwise be unbounded).
CALL_BYTES = 1024


@attrs.frozen
class ReplyLimits:
    """How big and how long one reply may be: bytes of one server-sent event (or line, or a
    whole JSON answer), bytes of its text, reasoning and tool calls together (``CALL_BYTES``
    a call besides its name and arguments), and seconds from the request to its end (retries
    included). Over any, the reply ends with a ``ModelError`` that names the bound and the
    variable that raises it."""

    maxEvent: int = DEFAULT_MODEL_MAX_EVENT
    maxReply: int = DEFAULT_MODEL_MAX_REPLY
    seconds: float = DEFAULT_MODEL_REPLY_SECONDS

    def eventError(self, endpoint: Endpoint) -> ModelError:
        return ModelError(f"The model endpoint {endpoint.shownURL} sent an event (or a line) over "
                          f"{_size(self.maxEvent)}, the limit of HERMES_ACP_MODEL_MAX_EVENT; the reply was stopped. "
                          "Raise HERMES_ACP_MODEL_MAX_EVENT if the endpoint really sends such events.")

    def replyError(self) -> ModelError:
        return ModelError(f"The model's reply passed {_size(self.maxReply)} of text, reasoning and tool calls, "
                          "the limit of HERMES_ACP_MODEL_MAX_REPLY; it was stopped. "
                          "Raise HERMES_ACP_MODEL_MAX_REPLY to allow longer replies.")

    def timeError(self) -> ModelError:
        return ModelError(f"The model's reply took longer than {self.seconds:g} s, the limit of "
                          "HERMES_ACP_MODEL_REPLY_SECONDS; it was stopped. "
                          "Raise HERMES_ACP_MODEL_REPLY_SECONDS to allow slower replies.")


def _size(count: int) -> str:
    return f"{count / 1048576:g} MiB ({count} bytes)" if count >= 1048576 else f"{count} bytes"


class _Pieces:
    """Text that arrives in fragments (a token or two each), kept joined a thousand at a time:
    a string grown by each fragment would be copied each time (quadratic), and a list of
    millions of small strings weighs some 60 bytes each, thirty times what they hold."""

    JOIN = 1024

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._fragments: list[str] = []

    def add(self, text: str) -> None:
        self._fragments.append(text)
        if len(self._fragments) >= self.JOIN:
            self._chunks.append("".join(self._fragments))
            self._fragments.clear()

    def __str__(self) -> str:
        return "".join(self._chunks) + "".join(self._fragments)


@attrs.define
class _Accumulator:
    """Builds a ``ModelReply`` from stream chunks; what it keeps is bounded (``ReplyLimits.maxReply``)."""

    onText: Callable[[str], None]
    onReasoning: Callable[[str], None]
    limits: ReplyLimits = ReplyLimits()
    size: int = 0
    text: _Pieces = attrs.field(factory=_Pieces)
    reasoning: _Pieces = attrs.field(factory=_Pieces)
    refusal: _Pieces = attrs.field(factory=_Pieces)
    calls: list[dict[str, Any]] = attrs.field(factory=list)
    #: The latest call of each index (the one its next fragments extend).
    latest: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    delivered: bool = False
    reasoningField: str = "reasoning_content"

    def absorb(self, chunk: Any) -> None:
        """One event of the stream (or a whole answer, whose ``message`` stands for the delta)."""
        if not isinstance(chunk, dict):
            raise ValueError(f"an event that is not an object: {str(chunk)[:100]}")
        if chunk.get("error"):
            detail = _detail(chunk, str(chunk["error"]))
            code = chunk["error"].get("code") if isinstance(chunk["error"], dict) else None
            if _OVERFLOW.search(f"{detail} {code or ''}"):
                window = _WINDOW.search(detail)
                raise ModelError(f"The conversation no longer fits the model's context window: {detail}", overflow=True,
                                 window=int(window.group(1).replace(",", "")) if window else None)
            raise ModelError(f"The model endpoint reported an error mid-answer: {detail}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = {k: v for k, v in chunk["usage"].items() if v is not None}
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index") not in (0, None):
                continue
            delta = choice.get("delta") or choice.get("message")
            if isinstance(delta, dict):
                field = "reasoning_content" if delta.get("reasoning_content") else "reasoning"
                reasoning = delta.get(field)
                if isinstance(reasoning, str) and reasoning:
                    self.reasoningField = field
                    self._emit(self.reasoning, self.onReasoning, reasoning)
                if isinstance(delta.get("content"), str) and delta["content"]:
                    self._emit(self.text, self.onText, delta["content"])
                if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                    self._emit(self.refusal, self.onText, delta["refusal"])
                for call in delta.get("tool_calls") or ():
                    if isinstance(call, dict):
                        self._absorbCall(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]

    def _grow(self, text: str) -> None:
        """Count ``text`` into the reply before it is kept or shown: the delta that would
        pass the bound is neither."""
        self._count(len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")))

    def _count(self, size: int) -> None:
        self.size += size
        if self.size > self.limits.maxReply:
            raise self.limits.replyError()

    def _emit(self, parts: _Pieces, callback: Callable[[str], None], text: str) -> None:
        self._grow(text)
        parts.add(text)
        self.delivered = True
        callback(text)

    def _absorbCall(self, call: dict[str, Any]) -> None:
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        name = function.get("name") or ""
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):  # a whole answer may give them as an object
            arguments = json.dumps(arguments)
        self._grow(name)
        self._grow(arguments)
        callId = call.get("id") or ""
        index = call.get("index")
        if not isinstance(index, int):
            index = len(self.calls) - (0 if callId else 1)
        slot = self.latest.get(index)
        # Some servers send every complete call at index 0; a new id means a new call.
        if slot is None or (callId and slot["id"] and callId != slot["id"]):
            self._count(CALL_BYTES)  # a call costs its card and its result, even one of no bytes
            slot = self.latest[index] = {"index": index, "id": "", "name": _Pieces(), "arguments": _Pieces()}
            self.calls.append(slot)
        slot["id"] = callId or slot["id"]
        slot["name"].add(name)
        slot["arguments"].add(arguments)

    def reply(self, finish: str | None = None) -> ModelReply:
        named = ((i, c, str(c["name"])) for i, c in enumerate(self.calls))
        calls = tuple(ToolCallRequest(c["id"] or f"call_{i}_{id(self):x}", name, str(c["arguments"]))
                      for i, c, name in named if name)
        return ModelReply(
            str(self.text), str(self.reasoning), calls, finish or self.finish,
            self.usage, str(self.refusal), self.reasoningField,
        )


#: How providers say a request is over the context window (OpenAI's ``context_length_exceeded``
#: message, Anthropic-style, vLLM, llama.cpp, Ollama), and where they say how big it is.
_OVERFLOW = re.compile(r"context[_ ]length|context window|maximum context|too many tokens|prompt is too long|exceed_context|"
                       r"exceeds? the (?:available )?context|input is too long|n_ctx", re.IGNORECASE)
_WINDOW = re.compile(r"(?:maximum context length|context (?:window|length|size)|n_ctx)[^0-9]{0,20}(\d[\d,]{2,})",
                     re.IGNORECASE)
#: How endpoints refuse images for a model that cannot see (OpenAI's "image_url is only supported
#: by certain models", vLLM's "not a multimodal model", llama.cpp's "image input is not supported",
#: OpenRouter's "support image input", DeepSeek's "unknown variant `image_url`").
_IMAGES = re.compile(r"image|vision|multi-?modal|mmproj", re.IGNORECASE)
#: What llama.cpp says with its HTTP 500 (a 500 is otherwise retried).
_NO_IMAGES = re.compile(r"image input is not supported", re.IGNORECASE)
#: The fields of a ``/models`` entry that give the context window, by provider.
_WINDOW_FIELDS = ("context_length", "context_window", "max_context_length", "max_model_len")


def modelWindow(entry: Any) -> int | None:
    """The context window a ``/models`` entry states (OpenRouter, vLLM and others), if any."""
    if not isinstance(entry, dict):
        return None
    values = [entry.get(name) for name in _WINDOW_FIELDS]
    top = entry.get("top_provider")
    if isinstance(top, dict):
        values.append(top.get("context_length"))
    return next((int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1024), None)


def modelVision(entry: Any) -> bool | None:
    """Whether a ``/models`` entry says the model takes images (OpenRouter's
    ``architecture.input_modalities`` or ``modality``, ``input_modalities``, LiteLLM's
    ``supports_vision``, a ``capabilities`` object or list); None when it says nothing."""
    if not isinstance(entry, dict):
        return None
    architecture = entry.get("architecture") if isinstance(entry.get("architecture"), dict) else {}
    for modalities in (architecture.get("input_modalities"), entry.get("input_modalities")):
        if isinstance(modalities, list):
            return "image" in modalities
    modality = architecture.get("modality")
    if isinstance(modality, str) and "->" in modality:
        return "image" in modality.split("->")[0]
    capabilities = entry.get("capabilities")
    for said in (entry.get("supports_vision"), capabilities.get("vision") if isinstance(capabilities, dict) else None):
        if isinstance(said, bool):
            return said
    if isinstance(capabilities, list) and all(isinstance(c, str) for c in capabilities) and capabilities:
        return "vision" in capabilities
    return None


def _statusMessage(status: int, detail: str, endpoint: Endpoint, model: str) -> ModelError:
    where = endpoint.shownURL
    if status == 401:
        return ModelError(f"The model endpoint {where} rejected the API key (HTTP 401): {detail}. "
                          "Check HERMES_API_KEY (or your provider's key) or run `hermes-acp --setup`.", auth=True)
    if status == 403:
        return ModelError(f"The model endpoint {where} refused access (HTTP 403): {detail}")
    lowered = detail.lower()
    if ((status in (400, 404, 415, 422) and _IMAGES.search(detail) or status == 500 and _NO_IMAGES.search(detail))
            and not _OVERFLOW.search(detail)):
        return ModelError(f"Model {model!r} at {where} does not take images (HTTP {status}): {detail}", images=True)
    if status == 404 or (status in (400, 422) and "model" in lowered and any(
        word in lowered for word in ("not found", "does not exist", "unknown", "invalid model", "not a valid")
    )):
        return ModelError(f"Model {model!r} is not available at {where} (HTTP {status}): {detail}. "
                          "Check HERMES_MODEL and the endpoint URL.")
    if status in (400, 413, 422) and _OVERFLOW.search(detail):
        window = _WINDOW.search(detail)
        return ModelError(f"The conversation no longer fits model {model!r}'s context window (HTTP {status}): "
                          f"{detail}", overflow=True,
                          window=int(window.group(1).replace(",", "")) if window else None)
    if status in (408, 409, 429) or status >= 500:
        kind = "is rate limiting requests" if status == 429 else "had a server error"
        return ModelError(f"The model endpoint {where} {kind} (HTTP {status}): {detail}", retryable=True)
    return ModelError(f"The model endpoint {where} rejected the request (HTTP {status}): {detail}")


def _detail(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return fallback


def _retryAfter(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI), ``retry-after`` in seconds or as an
    HTTP date; at most 30; None when absent or unusable."""
    try:
        if headers.get("retry-after-ms") is not None:
            seconds = float(headers["retry-after-ms"]) / 1000
        else:
            value = str(headers.get("retry-after") or "").strip()
            try:
                seconds = float(value)
            except ValueError:
                seconds = (email.utils.parsedate_to_datetime(value) - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(30.0, seconds) if seconds >= 0 else None


def classify(error: BaseException, endpoint: Endpoint, model: str) -> ModelError:
    """Turn a transport or protocol failure into a ``ModelError`` a user can act on."""
    if isinstance(error, ModelError):
        return error
    if isinstance(error, chat_http.HTTPStatus):
        fallback = " ".join(str(error.body or "").split())[:300] or f"HTTP {error.status}"  # an HTML page, say
        result = _statusMessage(error.status, _detail(error.body, fallback), endpoint, model)
        result.retryAfter = _retryAfter(error.headers)
        return result
    if isinstance(error, chat_http.Unreachable):
        if error.timedOut:
            return ModelError(f"The model endpoint {endpoint.shownURL} timed out.", retryable=True)
        return ModelError(f"Cannot reach the model endpoint {endpoint.shownURL}: {error}", retryable=not error.permanent)
    if isinstance(error, chat_http.NotAStream):
        return ModelError(f"The model endpoint {endpoint.shownURL} answered with something other than a "
                          f"stream: {error}. Is the base URL right (it usually ends in /v1)?")
    if isinstance(error, (OSError, http.client.HTTPException)):  # the connection broke mid-answer
        return ModelError(f"The connection to the model endpoint {endpoint.shownURL} broke: "
                          f"{error or type(error).__name__}", retryable=True)
    if isinstance(error, (ValueError, KeyError, TypeError, AttributeError)):
        return ModelError(f"The model endpoint {endpoint.shownURL} sent a malformed response: {error}")
    return ModelError(f"Model request failed: {type(error).__name__}: {error}")


@attrs.define(eq=False)
class ModelClient:
    """Streams chat completions from one endpoint (used from one thread at a time;
    kept-alive connections are shared by all, ``chat_http.POOL``)."""

    endpoint: Endpoint
    connectTimeout: float = 15.0
    readTimeout: float = 600.0
    maxRetries: int = 4
    backoff: float = 0.5
    limits: ReplyLimits = ReplyLimits()
    _target: chat_http.Target | None = attrs.field(default=None, init=False, repr=False)

    def target(self) -> chat_http.Target:
        if self._target is None:
            self._target = _target(self.endpoint)
        return self._target

    def complete(
        self,
        model: str,
        messages: Sequence[bytes | dict[str, Any]],
        tools: Sequence[dict[str, Any]] | Schemas,
        cancellation: Cancellation,
        onText: Callable[[str], None],
        onReasoning: Callable[[str], None],
        **options: Any,
    ) -> ModelReply:
        """Stream one answer; retry 429, 5xx and broken connections with backoff. A message
        of ``messages`` may be given as its bytes in the body (``bodyJSON`` of it), and the
        tools' schemas as theirs (``Schemas``).

        Raises ``ModelError``. A cancelled request returns what arrived so far
        with ``finishReason`` "cancelled".
        """
        if not model:
            raise ModelError("no model chosen: set HERMES_MODEL or pick a model for the session")
        # Under the rule of hermes_acp.safejson: what UTF-8 cannot carry never reaches the
        # endpoint (where it would fail every later request). The history is the one thing
        # that grows with the session: a message given as bytes (the agent's, made once for
        # every request that carries it, ``_Sizes``) is not encoded again.
        schemas = tools if isinstance(tools, Schemas) else Schemas.of(tools)
        request = _body(model, messages, schemas, options)
        attempt = 0
        began = time.monotonic()
        deadline = began + self.limits.seconds
        log.debug("model request: %s, %d messages, %d tools", model, len(messages), schemas.count)
        while True:
            accumulator = _Accumulator(onText, onReasoning, self.limits)
            try:
                reply = self._stream(request, accumulator, cancellation, deadline)
            except Exception as e:
                error = classify(e, self.endpoint, model)
            else:
                usage = reply.usage or {}
                log.debug("model reply: %s, finish %s, %s prompt + %s completion tokens, %.2f s, %d retries",
                          model, reply.finishReason, usage.get("prompt_tokens", "?"),
                          usage.get("completion_tokens", "?"), time.monotonic() - began, attempt)
                return reply
            delay = error.retryAfter or min(20.0, self.backoff * 2**attempt)
            if (not error.retryable or accumulator.delivered or attempt >= self.maxRetries
                    or delay >= deadline - time.monotonic()):  # no time left for another try
                log.debug("model request failed after %.2f s and %d retries", time.monotonic() - began, attempt)
                raise error
            attempt += 1
            log.warning("model request failed (%s); retry %d in %.1f s", error, attempt, delay)
            if cancellation.sleep(delay):
                return accumulator.reply(CANCELLED_FINISH)

    def _stream(self, request: bytes, accumulator: _Accumulator, cancellation: Cancellation,
                deadline: float) -> ModelReply:
        """One attempt. Once cancelled, nothing more of the answer is absorbed (nor shown):
        what is already read past the cancel is dropped with the connection."""
        exchange = chat_http.Exchange(self.target(), deadline - time.monotonic())
        headers = _authorization(self.endpoint, exchange.target)
        try:
            with cancellation.calling(exchange.abort):
                try:
                    exchange.post("/chat/completions", request, headers, self.connectTimeout, self.readTimeout)
                    for event in exchange.events(self.limits.maxEvent):
                        if cancellation.cancelled:
                            break
                        accumulator.absorb(event)
                except Exception as e:
                    if cancellation.cancelled:
                        return accumulator.reply(CANCELLED_FINISH)
                    if exchange.expired:
                        raise self.limits.timeError() from None
                    if isinstance(e, sse.EventTooBig):
                        raise self.limits.eventError(self.endpoint) from None
                    raise
            if cancellation.cancelled and accumulator.finish is None:
                return accumulator.reply(CANCELLED_FINISH)
            if not exchange.completed and accumulator.finish is None:
                if exchange.expired:  # the deadline shut the socket: the read saw an end, not an error
                    raise self.limits.timeError()
                raise ModelError(f"The connection to the model endpoint {self.endpoint.shownURL} broke before "
                                 "the answer ended", retryable=True)
            return accumulator.reply()
        finally:
            exchange.close()


@attrs.frozen
class Schemas:
    """Tools' schemas as a request body carries them: ``body`` is ``bodyJSON`` of their list.
    The agent joins it from each tool's bytes, made once (13 KB of built-in schemas cost more
    to encode than the rest of a short request)."""

    body: bytes
    count: int

    @classmethod
    def of(cls, schemas: Sequence[dict[str, Any]]) -> Schemas:
        return cls(bodyJSON(list(schemas)), len(schemas))

    @classmethod
    def joined(cls, bodies: Sequence[bytes]) -> Schemas:
        """The list of schemas each given as its ``bodyJSON``."""
        return cls(b"[" + b",".join(bodies) + b"]", len(bodies))


#: What every request asks: a stream, ending with the usage of the request.
_STREAMED = b'"stream":true,"stream_options":{"include_usage":true}'


def _body(model: str, messages: Sequence[bytes | dict[str, Any]], tools: Schemas, options: dict[str, Any]) -> bytes:
    """``{"model": model, "messages": messages, "stream": true, "stream_options": …, "tools":
    tools, **options}`` (no ``tools`` when there are none) as ``bodyJSON`` makes it, byte for
    byte, each message on its own (one given as bytes is its JSON already, made once by the
    agent for every request that carries it). One join makes the body: a second copy of
    megabytes would cost as much as the rest of it."""
    parts = [m if type(m) is bytes else bodyJSON(m) for m in messages] or [b""]
    parts[0] = b'{"model":' + bodyJSON(model) + b',"messages":[' + parts[0]
    fields = [_STREAMED]
    if tools.count:
        fields.append(b'"tools":' + tools.body)
    if options:
        fields.append(bodyJSON(options)[1:-1])
    parts[-1] += b"]," + b",".join(fields) + b"}"
    return b",".join(parts)


def bodyJSON(value: Any) -> bytes:
    """A value as a request body carries it: compact UTF-8 JSON, lone surrogates as U+FFFD; a
    non-finite number (JSON has none) is healed to null first, in place, as
    ``safejson.repaired`` would. TypeError for a value JSON has no form for."""
    return safejson.encodeHealed(value)


def _target(endpoint: Endpoint) -> chat_http.Target:
    """Where the endpoint's requests go (ModelError when its URL or proxy cannot be used)."""
    if not endpoint.baseURL:
        raise ModelError("; ".join(endpoint.problems()))
    try:
        return chat_http.Target.of(endpoint.baseURL)
    except ValueError as e:
        raise ModelError(f"The model endpoint URL cannot be used: {e}") from None


def _authorization(endpoint: Endpoint, target: chat_http.Target) -> dict[str, str]:
    """The credential: the base URL's own (Basic), else the key (Bearer; a dummy for keyless servers)."""
    return {"Authorization": target.originAuth or f"Bearer {endpoint.apiKey or _NO_KEY}"}


def listModels(endpoint: Endpoint, timeout: float = 10.0) -> list[tuple[Any, ...]]:
    """The models to offer, each with its context window where the endpoint says (and, third,
    whether it takes images, where the endpoint says): ``HERMES_MODELS`` if set (no windows),
    else the endpoint's ``/models``.

    Raises ``ModelError`` when the list cannot be fetched.
    """
    if endpoint.models:
        return [(model, None) for model in endpoint.models]
    exchange = chat_http.Exchange(_target(endpoint))
    limits = ReplyLimits()  # the list is one JSON answer: it gets an event's bound
    try:
        body = exchange.json("/models", _authorization(endpoint, exchange.target), timeout, limits.maxEvent)
    except sse.EventTooBig:
        raise limits.eventError(endpoint) from None
    except ValueError as e:
        raise ModelError(f"The model endpoint {endpoint.shownURL} sent a malformed model list: {e}") from e
    except Exception as e:
        raise classify(e, endpoint, endpoint.model or "") from e
    finally:
        exchange.close()
    data = body.get("data") if isinstance(body, dict) else body
    if not isinstance(data, list):
        raise ModelError(f"The model endpoint {endpoint.shownURL} sent a malformed model list")
    return [_listed(item) if isinstance(item, dict) else (str(item), None) for item in data
            if not isinstance(item, dict) or isinstance(item.get("id"), str)]


def _listed(item: dict[str, Any]) -> tuple[Any, ...]:
    sees = modelVision(item)
    return (item["id"], modelWindow(item)) + (() if sees is None else (sees,))
