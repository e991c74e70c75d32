"""A scripted OpenAI-compatible Chat Completions server (twisted.web), for tests and benchmarks.

It serves ``POST /v1/chat/completions`` (SSE streaming or plain JSON) and
``GET /v1/models``, and records every request. What it answers comes from
scripts: a script is a list of responses, one per request, and a response is
a list of steps (JSON-friendly dicts):

  {"text": "Hi"}                      one content delta ({"times": N}: N deltas in one burst)
  {"reasoning": "..."}                a reasoning_content delta ({"field": "reasoning"} to use that name)
  {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {...} or "raw text"}], "split": 3}
                                      tool calls (several = parallel), arguments sent in ``split`` pieces
  {"refusal": "..."}                  a refusal delta
  {"usage": {"prompt_tokens": 10, "completion_tokens": 2}}
  {"finish": "length"}                the finish_reason (default: "tool_calls" after tool calls, else "stop")
  {"stall": true} / {"stall": 1.5}    stop sending, forever or for that many seconds
  {"barrier": 8}                      wait until this many chat requests have arrived in all
                                      (proves requests run at the same time, without a clock)
  {"status": 500, "error": "boom"}    answer with an HTTP error instead (must come first; "headers": {...}
                                      adds headers, "body": "..." sends that text instead of a JSON error)
  {"raw": "data: {oops\\n\\n"}        bytes sent as they are (malformed SSE)
  {"close": true}                     drop the connection mid-stream
  {"flood": "text", "bytes": N}       content deltas as fast as the client reads them, N bytes of
                                      events (without "bytes": forever); {"flood": "line"} sends one
                                      endless ``data:`` line instead (``flooded`` counts what was sent);
                                      "every": S sends one event (or 1 KB of the line) each S seconds

The answer's framing (``setFraming``) is chunked on a kept-alive connection ("chunked", the
default), or HTTP/1.0 whose body ends when the server closes the connection ("close"); with
"+open" ("chunked+open", "close+open") the server leaves the body unfinished and the
connection open after ``[DONE]``, as a misbehaving proxy would. ``FRAMINGS`` are the two a
client's stream and cancel tests run against.

Rules pick a script by a substring of the latest user message, so concurrent
sessions each get their own (a rule whose match starts with ``system:`` looks in the
system prompt instead: a subagent's says it is one, and names its task); requests that match no rule use the default
script. A script that runs out answers HTTP 500, unless it repeats. The agent's
compaction requests (their system prompt is ``compaction.SUMMARY_PROMPT``) have a
script of their own, ``summaries`` (by default each answers a short numbered
summary); ``chatRequests`` leaves them out and ``summaryRequests`` has them.
So do its title requests (system prompt ``titles.TITLE_PROMPT``): ``titles`` is their
script, and without one they are refused (HTTP 500: the session keeps its first prompt
line as its title); ``titleRequests`` has them.

With ``window`` set, the server counts a request's tokens (``tokensOf``: 4
characters a token) like a provider with that context window: a request over it
gets OpenAI's 400 ``context_length_exceeded`` naming the window (counted in
``overflows``), and a reply without scripted usage reports ``prompt_tokens``.

Run ``python tests/scripted_model.py --port 0 --script FILE.json`` to host one
in its own process; the first line on stdout is its base URL. FILE.json holds
``{"default": [...], "rules": [{"match": "...", "responses": [...]}],
"models": [...], "repeat": false, "apiKey": null, "window": null, "windows": {},
"framing": "chunked"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import attrs
from hermes_acp.engine.compaction import SUMMARY_PROMPT
from hermes_acp.engine.titles import TITLE_PROMPT
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IListeningPort, IReactorTCP, IReactorTime
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

Response = list[dict[str, Any]]
#: The two ways an answer's body can end: chunked (the connection kept), or with the connection.
FRAMINGS = ("chunked", "close")


@attrs.frozen
class Recorded:
    """One request the server received."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]
    #: The body as it arrived (the agent's bytes).
    raw: bytes = b""


@attrs.define
class Script:
    """Responses handed out in order, one per request."""

    responses: list[Response]
    repeat: bool = False
    position: int = 0

    def next(self) -> Response | None:
        if self.position >= len(self.responses):
            if not (self.repeat and self.responses):
                return None
            self.position = 0
        self.position += 1
        return self.responses[self.position - 1]


def latestUserText(body: Any) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content or "")
    return ""


def isSummaryRequest(body: Any) -> bool:
    return _systemPrompt(body) == SUMMARY_PROMPT


def isTitleRequest(body: Any) -> bool:
    return _systemPrompt(body) == TITLE_PROMPT


def _systemPrompt(body: Any) -> Any:
    messages = body.get("messages") or []
    return messages[0].get("content") if messages and messages[0].get("role") == "system" else None


def tokensOf(body: Any) -> int:
    """What the scripted provider counts for a request: its messages and tools, 4 characters a token."""
    return len(json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False)) // 4


def _errorBody(message: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()


class _Playback:
    """Plays one response's steps onto a request, honouring stalls and disconnects."""

    def __init__(self, request: Request, steps: Response, model: str, streaming: bool, clock: IReactorTime,
                 server: ScriptedModel, promptTokens: int | None = None) -> None:
        self.server = server
        self.request = request
        self.steps = list(steps)
        self.model = model
        self.streaming = streaming
        self.clock = clock
        self.delayed: IDelayedCall | None = None
        self.gone = False
        self.sawTools = False
        self.finished = False
        self.closeDelimited = server.framing == "close"
        self.callIndex = 0
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None if promptTokens is None else {
            "prompt_tokens": promptTokens, "completion_tokens": 1, "total_tokens": promptTokens + 1}
        request.notifyFinish().addBoth(self._gone)

    def _gone(self, result: object) -> None:
        self.gone = True
        if isinstance(result, Failure):  # the connection was lost before the end
            self.server.abandoned += 1
        if self.delayed is not None and self.delayed.active():
            self.delayed.cancel()

    def start(self) -> None:
        first = self.steps[0] if self.steps else {}
        if self.closeDelimited:  # an HTTP/1.0 answer without a length: its end is the connection's
            self.request.clientproto = b"HTTP/1.0"
        if "status" in first:
            self.request.setResponseCode(first["status"])
            for name, value in first.get("headers", {}).items():
                self.request.setHeader(name, value)
            if "body" in first:
                self.request.setHeader("content-type", "text/html")
                self.request.write(first["body"].encode())
            else:
                self.request.setHeader("content-type", "application/json")
                self.request.write(_errorBody(first.get("error", "scripted error"), first.get("code")))
            self._finish()
            return
        if self.streaming:
            self.request.setHeader("content-type", "text/event-stream")
            self.request.setHeader("cache-control", "no-cache")
            self._chunk({"role": "assistant", "content": ""})
        self._play()

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, Any] | None = None,
               times: int = 1) -> None:
        chunk: dict[str, Any] = {
            "id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": self.model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage is not None:
            chunk["usage"] = usage
        self.request.write((b"data: " + json.dumps(chunk).encode() + b"\n\n") * times)

    def _play(self) -> None:
        self.delayed = None
        while self.steps and not self.gone:
            step = self.steps.pop(0)
            if "barrier" in step:
                self.server.whenChatRequests(int(step["barrier"])).addCallback(lambda _: self._play())
                return
            if "stall" in step:
                self.server._stalled()
                if step["stall"] is True:
                    return
                self.delayed = self.clock.callLater(float(step["stall"]), self._play)
                return
            if "close" in step:  # what was written is flushed first, then the connection drops
                self.request.channel.transport.loseConnection()
                return
            if "flood" in step:
                flood = _Flood(self, step["flood"], step.get("bytes"), step.get("every"))
                if flood.every is None:
                    self.request.registerProducer(flood, False)
                else:
                    flood.resumeProducing()
                return
            self._step(step)
        if not self.gone:
            self._end()

    def _step(self, step: dict[str, Any]) -> None:
        if "text" in step:
            times = int(step.get("times", 1))
            self._add("content", step["text"] * times)
            if self.streaming:
                self._chunk({"content": step["text"]}, times=times)
        elif "reasoning" in step:
            field = step.get("field", "reasoning_content")
            self._add(field, step["reasoning"])
            if self.streaming:
                self._chunk({field: step["reasoning"]})
        elif "refusal" in step:
            self._add("refusal", step["refusal"])
            if self.streaming:
                self._chunk({"refusal": step["refusal"]})
        elif "tool_calls" in step:
            self._toolCalls(step["tool_calls"], int(step.get("split", 1)))
        elif "usage" in step:
            self.usage = step["usage"]
        elif "finish" in step:
            self.finish = step["finish"]
        elif "raw" in step:
            self.request.write(step["raw"].encode())
        else:
            raise ValueError(f"unknown script step {step!r}")

    def _add(self, field: str, text: str) -> None:
        self.message[field] = (self.message.get(field) or "") + text

    def _toolCalls(self, calls: list[dict[str, Any]], split: int) -> None:
        self.sawTools = True
        for call in calls:
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            ident = call.get("id", f"call_{self.callIndex}")
            self.message.setdefault("tool_calls", []).append(
                {"id": ident, "type": "function", "function": {"name": call["name"], "arguments": arguments}}
            )
            if self.streaming:
                size = max(1, -(-len(arguments) // split))
                pieces = [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
                for n, piece in enumerate(pieces):
                    delta: dict[str, Any] = {"index": self.callIndex, "function": {"arguments": piece}}
                    if n == 0:
                        delta.update(id=ident, type="function")
                        delta["function"]["name"] = call["name"]
                    self._chunk({"tool_calls": [delta]})
            self.callIndex += 1

    def _end(self) -> None:
        finish = self.finish or ("tool_calls" if self.sawTools else "stop")
        if self.streaming:
            self._chunk({}, finish)
            if self.usage is not None:
                self._chunk(None, usage=self.usage)
            self.request.write(b"data: [DONE]\n\n")
            if self.server.holdOpen:
                return  # the body never ends, the connection stays
        else:
            self.request.setHeader("content-type", "application/json")
            body = {
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": self.model,
                "choices": [{"index": 0, "message": self.message, "finish_reason": finish}],
                "usage": self.usage,
            }
            self.request.write(json.dumps(body).encode())
        self._finish()

    def _finish(self) -> None:
        transport = self.request.channel.transport
        self.request.finish()
        if self.closeDelimited:
            transport.loseConnection()


class _Flood:
    """The ``flood`` step: a pull producer that writes a block each time the client has read
    the last one (the server never holds more than a block), until ``limit`` bytes, then the
    script goes on. With ``every``, a timer writes one event (or 1 KB of the line) each
    ``every`` seconds instead: a model that streams at a steady pace."""

    BLOCK = 64 * 1024

    def __init__(self, playback: _Playback, kind: str, limit: int | None, every: float | None) -> None:
        self.playback, self.limit, self.sent, self.every = playback, limit, 0, every
        if kind == "line":
            playback.request.write(b"data: ")
            unit = b"x" * 1000
        elif kind == "text":
            unit = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]}).encode() + b"\n\n"
        else:
            raise ValueError(f"unknown flood {kind!r}")
        self.block = unit if every is not None else unit * (self.BLOCK // len(unit))

    def resumeProducing(self) -> None:
        playback = self.playback
        if playback.gone:
            return
        block = self.block if self.limit is None else self.block[: self.limit - self.sent]
        playback.request.write(block)
        self.sent += len(block)
        playback.server.flooded += len(block)
        if self.limit is not None and self.sent >= self.limit:
            if self.every is None:
                playback.request.unregisterProducer()
            playback.delayed = playback.clock.callLater(0, playback._play)
        elif self.every is not None:
            playback.delayed = playback.clock.callLater(self.every, self.resumeProducing)

    def stopProducing(self) -> None:
        self.playback.gone = True


class ScriptedModel(Resource):
    """The server resource. Mount it at the root: it answers under ``/v1`` and without."""

    isLeaf = True

    def __init__(
        self,
        default: list[Response] | None = None,
        rules: list[tuple[str, list[Response]]] = (),  # type: ignore[assignment]
        models: list[str] | tuple[str, ...] = ("scripted-model",),
        apiKey: str | None = None,
        strictModels: bool = False,
        repeat: bool = False,
        clock: IReactorTime | None = None,
        window: int | None = None,
        summaries: list[Response] | None = None,
        titles: list[Response] | None = None,
    ) -> None:
        super().__init__()
        if clock is None:
            from twisted.internet import reactor as clock  # type: ignore[assignment]
        self.clock = clock
        self.repeat = repeat
        self.default = Script(list(default or []), repeat)
        self.rules: list[tuple[str, Script]] = []
        for match, responses in rules:
            self.addRule(match, responses)
        self.models = list(models)
        #: Context windows the model list reports (OpenRouter's ``context_length``), by model.
        self.windows: dict[str, int] = {}
        self.apiKey = apiKey
        self.strictModels = strictModels
        self.requests: list[Recorded] = []
        self.stalls = 0  # how many times a response reached a ``stall`` step
        self.abandoned = 0  # responses whose client went away before their end
        self.window = window
        self.overflows = 0  # requests refused for being over the window
        self.summaries = Script(list(summaries or []), True) if summaries is not None else None
        self.summaryCount = 0
        self.titles = Script(list(titles or []), repeat)
        #: False: answer one JSON document even when the request asks for a stream.
        self.streaming = True
        #: "chunked" or "close" (HTTP/1.0, the body ends with the connection); ``holdOpen``:
        #: after ``[DONE]`` the body is left unfinished and the connection open (``setFraming``).
        self.framing = "chunked"
        self.holdOpen = False
        #: Bytes the ``flood`` steps sent.
        self.flooded = 0
        #: The client ports requests came from (one per TCP connection).
        self.peers: set[int] = set()
        #: Models that cannot see: a request of theirs with an image gets OpenAI's 400 (counted in
        #: ``imageRefusals``); and what the model list says of each model's sight (OpenRouter's
        #: ``architecture.input_modalities``).
        self.blind: set[str] = set()
        self.imageRefusals = 0
        self.sight: dict[str, bool] = {}
        self._waiting: list[tuple[Callable[[], bool], Deferred[None]]] = []

    @classmethod
    def fromJSON(cls, spec: dict[str, Any], clock: IReactorTime | None = None) -> ScriptedModel:
        model = cls(
            spec.get("default"),
            [(rule["match"], rule["responses"]) for rule in spec.get("rules", [])],
            spec.get("models", ["scripted-model"]),
            spec.get("apiKey"),
            spec.get("strictModels", False),
            spec.get("repeat", False),
            clock,
            spec.get("window"),
            titles=spec.get("titles"),
        )
        model.windows.update(spec.get("windows", {}))
        model.setFraming(spec.get("framing", "chunked"))
        return model

    def setFraming(self, mode: str) -> None:
        """"chunked" or "close", and "+open" to leave the connection open after ``[DONE]``."""
        framing, _, hold = mode.partition("+")
        if framing not in FRAMINGS or hold not in ("", "open"):
            raise ValueError(f"unknown framing {mode!r}")
        self.framing, self.holdOpen = framing, hold == "open"

    def addRule(self, match: str, responses: list[Response]) -> None:
        """Answer requests whose latest user message contains ``match`` with ``responses``."""
        self.rules.append((match, Script(list(responses), self.repeat)))

    def whenChatRequests(self, count: int) -> Deferred[None]:
        """Fires once ``count`` chat requests have arrived (at once if they have)."""
        return self._when(lambda: len(self.chatRequests) >= count)

    def whenStalled(self, count: int = 1) -> Deferred[None]:
        """Fires once responses have reached a ``stall`` step ``count`` times in all."""
        return self._when(lambda: self.stalls >= count)

    def _when(self, reached: Callable[[], bool]) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if reached():
            d.callback(None)
        else:
            self._waiting.append((reached, d))
        return d

    def _wake(self) -> None:
        for entry in [w for w in self._waiting if w[0]()]:
            self._waiting.remove(entry)
            entry[1].callback(None)

    def _stalled(self) -> None:
        self.stalls += 1
        self._wake()

    @property
    def chatRecords(self) -> list[Recorded]:
        """The chat completion requests, oldest first (compaction and title requests left out)."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")
                and not isSummaryRequest(r.body) and not isTitleRequest(r.body)]

    @property
    def chatRequests(self) -> list[Any]:
        """The bodies of the chat completion requests (``chatRecords``)."""
        return [r.body for r in self.chatRecords]

    @property
    def summaryRequests(self) -> list[Any]:
        """The bodies of the agent's compaction (summary) requests, oldest first."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions") and isSummaryRequest(r.body)]

    @property
    def titleRequests(self) -> list[Any]:
        """The bodies of the agent's title requests, oldest first."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions") and isTitleRequest(r.body)]

    def _record(self, request: Request, body: Any, raw: bytes = b"") -> None:
        headers = {k.decode().lower(): v[-1].decode() for k, v in request.requestHeaders.getAllRawHeaders()}
        self.requests.append(Recorded(request.method.decode(), request.path.decode(), body, headers, raw))
        address = request.getClientAddress()
        self.peers.add(getattr(address, "port", 0))
        self._wake()

    def _refuse(self, request: Request, status: int, message: str, code: str | None = None) -> bytes:
        request.setResponseCode(status)
        request.setHeader("content-type", "application/json")
        return _errorBody(message, code)

    def _authorized(self, request: Request) -> bool:
        return self.apiKey is None or request.getHeader("authorization") == f"Bearer {self.apiKey}"

    def render_GET(self, request: Request) -> bytes:
        self._record(request, None)
        if not request.path.rstrip(b"/").endswith(b"/models"):
            return self._refuse(request, http.NOT_FOUND, "not found")
        if not self._authorized(request):
            return self._refuse(request, http.UNAUTHORIZED, "Incorrect API key provided", "invalid_api_key")
        request.setHeader("content-type", "application/json")
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted",
                 **({"context_length": self.windows[m]} if m in self.windows else {}),
                 **({"architecture": {"input_modalities": ["text", "image"] if self.sight[m] else ["text"]}}
                    if m in self.sight else {})} for m in self.models]
        return json.dumps({"object": "list", "data": data}).encode()

    def render_POST(self, request: Request) -> bytes | int:
        raw = request.content.read()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._refuse(request, http.BAD_REQUEST, "request body is not JSON")
        self._record(request, body, raw)
        if not request.path.rstrip(b"/").endswith(b"/chat/completions"):
            return self._refuse(request, http.NOT_FOUND, "not found")
        if not self._authorized(request):
            return self._refuse(request, http.UNAUTHORIZED, "Incorrect API key provided", "invalid_api_key")
        model = body.get("model", "")
        if self.strictModels and model not in self.models:
            return self._refuse(request, http.NOT_FOUND, f"The model `{model}` does not exist", "model_not_found")
        tokens = tokensOf(body)
        if self.window is not None and tokens > self.window:
            self.overflows += 1
            return self._refuse(request, http.BAD_REQUEST, (
                f"This model's maximum context length is {self.window} tokens. However, your messages resulted in "
                f"{tokens} tokens. Please reduce the length of the messages."), "context_length_exceeded")
        if model in self.blind and "image_url" in json.dumps(body.get("messages")):
            self.imageRefusals += 1
            return self._refuse(request, http.BAD_REQUEST, "Invalid content type. image_url is only supported by "
                                "certain models.", "invalid_request_error")
        text = latestUserText(body)
        if isSummaryRequest(body):
            self.summaryCount += 1
            steps = self.summaries.next() if self.summaries is not None else [
                {"text": f"## Goal\nScripted summary {self.summaryCount}."}]
        elif isTitleRequest(body):
            steps = self.titles.next()
        else:
            system = str(_systemPrompt(body) or "")
            script = next((s for match, s in self.rules if (match[7:] in system if match.startswith("system:")
                                                            else match in text)), self.default)
            steps = script.next()
        if steps is None:
            message = f"script exhausted (latest user message: {text[:80]!r})"
            return self._refuse(request, http.INTERNAL_SERVER_ERROR, message)
        _Playback(request, steps, model, bool(body.get("stream")) and self.streaming, self.clock, self,
                  tokens if self.window is not None else None).start()
        return NOT_DONE_YET


def listen(model: ScriptedModel, reactor: IReactorTCP | None = None, port: int = 0) -> tuple[IListeningPort, str]:
    """Serve ``model`` on 127.0.0.1; return the listening port and the base URL (ending in /v1)."""
    if reactor is None:
        from twisted.internet import reactor  # type: ignore[assignment]
    site = Site(model)
    site.noisy = False
    # A backlog as a real endpoint's: Twisted's 50 drops the connections of 200 sessions asking
    # at once, whose clients then try again a second later (the bench's scale case).
    listening = reactor.listenTCP(port, site, backlog=1024, interface="127.0.0.1")
    return listening, f"http://127.0.0.1:{listening.getHost().port}/v1"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file with default/rules/models/repeat/apiKey")
    parser.add_argument("--api-key", help="require this bearer key")
    options = parser.parse_args(argv)
    spec: dict[str, Any] = {}
    if options.script:
        with open(options.script) as f:
            spec = json.load(f)
    if options.api_key:
        spec["apiKey"] = options.api_key
    from twisted.internet import reactor

    _, url = listen(ScriptedModel.fromJSON(spec), reactor, options.port)
    sys.stdout.write(url + "\n")
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
