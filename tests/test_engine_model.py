"""The model client against the scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from hermes_acp.config import Endpoint
from hermes_acp.engine.cancel import Cancellation
from hermes_acp.engine.model import ModelClient, ModelError, ToolCallRequest, listModels

MESSAGES = [{"role": "user", "content": "hello"}]


def client(url: str, key: str | None = "test-key", **options) -> ModelClient:
    return ModelClient(Endpoint("custom", url, key, "scripted-model"), backoff=0.01, **options)


class Deltas:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.arrived = threading.Event()  # set by the first text delta

    def onText(self, delta: str) -> None:
        self.text.append(delta)
        self.arrived.set()


def complete(modelClient: ModelClient, deltas: Deltas, cancellation: Cancellation | None = None, **kw):
    return deferToThread(
        modelClient.complete, "scripted-model", MESSAGES, [], cancellation or Cancellation(),
        deltas.onText, deltas.reasoning.append, **kw,
    )


async def failure(d) -> ModelError:
    try:
        await d
    except ModelError as e:
        return e
    raise AssertionError("no ModelError")


@pytest_twisted.ensureDeferred
async def test_textReasoningAndUsage(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.append([
        {"reasoning": "think "}, {"reasoning": "more", "field": "reasoning"},
        {"text": "Hel"}, {"text": "lo"}, {"text": "!", "times": 3},
        {"usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}},
    ])
    deltas = Deltas()
    reply = await complete(client(url), deltas)
    assert deltas.text == ["Hel", "lo", "!", "!", "!"]
    assert deltas.reasoning == ["think ", "more"]
    assert (reply.text, reply.reasoning, reply.finishReason) == ("Hello!!!", "think more", "stop")
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    [request] = server.chatRequests
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert request["messages"] == MESSAGES
    assert server.requests[0].headers["authorization"] == "Bearer test-key"


@pytest_twisted.ensureDeferred
async def test_toolCallsAccumulateByIndex(scriptedServer) -> None:
    """Arguments split over many deltas are joined; parallel calls stay apart."""
    server, url = scriptedServer
    server.default.responses.append([
        {"text": "Let me look."},
        {"tool_calls": [
            {"id": "call_a", "name": "read_file", "arguments": {"path": "a.py", "limit": 20}},
            {"id": "call_b", "name": "search_files", "arguments": {"pattern": "def \\w+"}},
        ], "split": 4},
    ])
    reply = await complete(client(url), Deltas())
    assert reply.finishReason == "tool_calls"
    assert reply.toolCalls == (
        ToolCallRequest("call_a", "read_file", '{"path": "a.py", "limit": 20}'),
        ToolCallRequest("call_b", "search_files", '{"pattern": "def \\\\w+"}'),
    )


def sse(delta: dict) -> str:
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n"


@pytest_twisted.ensureDeferred
async def test_toolCallsAllAtIndexZero(scriptedServer) -> None:
    """Some servers send each call whole at index 0; a new id starts a new call."""
    server, url = scriptedServer
    server.default.responses.append([
        {"raw": sse({"tool_calls": [{"index": 0, "id": "one", "function": {"name": "todo", "arguments": "{}"}}]})},
        {"raw": sse({"tool_calls": [{"index": 0, "id": "two", "function": {"name": "read_file", "arguments": ""}}]})},
        {"raw": sse({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a"}'}}]})},
        {"finish": "tool_calls"},
    ])
    reply = await complete(client(url), Deltas())
    assert reply.toolCalls == (
        ToolCallRequest("one", "todo", "{}"), ToolCallRequest("two", "read_file", '{"path": "a"}'),
    )


@pytest_twisted.ensureDeferred
async def test_serverErrorThenSuccessIsRetried(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.extend([[{"status": 500, "error": "overloaded"}],
                                     [{"status": 429, "error": "slow down"}],
                                     [{"text": "fine"}]])
    deltas = Deltas()
    reply = await complete(client(url), deltas)
    assert reply.text == "fine" and deltas.text == ["fine"]
    assert len(server.chatRequests) == 3


@pytest_twisted.ensureDeferred
async def test_retriesGiveUp(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.extend([[{"status": 503, "error": "down"}]] * 3)
    error = await failure(complete(client(url, maxRetries=2), Deltas()))
    assert error.retryable
    assert "server error (HTTP 503): down" in str(error)
    assert len(server.chatRequests) == 3


@pytest_twisted.ensureDeferred
async def test_badKey(scriptedServer) -> None:
    server, url = scriptedServer
    server.apiKey = "right"
    error = await failure(complete(client(url, key="wrong"), Deltas()))
    assert "rejected the API key (HTTP 401)" in str(error) and "HERMES_API_KEY" in str(error)
    assert "wrong" not in str(error)
    assert len(server.chatRequests) == 1


@pytest_twisted.ensureDeferred
async def test_unknownModel(scriptedServer) -> None:
    server, url = scriptedServer
    server.strictModels = True
    modelClient = client(url)
    error = await failure(deferToThread(modelClient.complete, "no-such-model", MESSAGES, [], Cancellation(),
                                        lambda t: None, lambda t: None))
    assert "Model 'no-such-model' is not available" in str(error) and "HERMES_MODEL" in str(error)


@pytest_twisted.ensureDeferred
async def test_unreachableEndpoint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    error = await failure(complete(client(f"http://127.0.0.1:{port}/v1", maxRetries=1), Deltas()))
    assert f"Cannot reach the model endpoint http://127.0.0.1:{port}/v1" in str(error)


def test_noEndpointConfigured() -> None:
    modelClient = ModelClient(Endpoint("none", None, None, None))
    with pytest.raises(ModelError, match="no model endpoint"):
        modelClient.complete("m", MESSAGES, [], Cancellation(), print, print)


@pytest_twisted.ensureDeferred
async def test_malformedStream(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"text": "a"}, {"raw": "data: {not json\n\n"}])
    error = await failure(complete(client(url), Deltas()))
    assert "malformed response" in str(error)
    assert len(server.chatRequests) == 1


@pytest_twisted.ensureDeferred
async def test_closedMidStreamAfterTextIsNotRetried(scriptedServer) -> None:
    """Retrying after text reached the user would repeat it."""
    server, url = scriptedServer
    server.default.responses.extend([[{"text": "partial"}, {"close": True}], [{"text": "again"}]])
    deltas = Deltas()
    error = await failure(complete(client(url), deltas))
    assert error.retryable and deltas.text == ["partial"]
    assert len(server.chatRequests) == 1


@pytest_twisted.ensureDeferred
async def test_closedBeforeAnyTextIsRetried(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.extend([[{"close": True}], [{"text": "again"}]])
    reply = await complete(client(url), Deltas())
    assert reply.text == "again"


@pytest_twisted.ensureDeferred
async def test_cancelAStalledStream(scriptedServer) -> None:
    """A stream stalled mid-answer gives up once cancelled (within 10 s: the stall is forever)."""
    server, url = scriptedServer
    server.default.responses.append([{"text": "Thinking"}, {"stall": True}])
    cancellation = Cancellation()
    deltas = Deltas()
    d = complete(client(url), deltas, cancellation)
    await server.whenStalled().addTimeout(10, reactor)
    assert await deferToThread(deltas.arrived.wait, 10)
    cancellation.cancel()
    reply = await d.addTimeout(10, reactor)
    assert (reply.text, reply.finishReason) == ("Thinking", "cancelled")


@pytest_twisted.ensureDeferred
async def test_cancelDuringRetryBackoff(scriptedServer) -> None:
    """A cancel during the wait before a retry ends it (within 10 s: the wait is 30 s)."""
    server, url = scriptedServer
    server.default.responses.append([{"status": 500}])
    cancellation = Cancellation()
    modelClient = ModelClient(Endpoint("custom", url, "k", "m"), backoff=30)
    d = deferToThread(modelClient.complete, "m", MESSAGES, [], cancellation, print, print)
    await server.whenChatRequests(1).addTimeout(10, reactor)
    cancellation.cancel()
    reply = await d.addTimeout(10, reactor)
    assert reply.finishReason == "cancelled"


@pytest_twisted.ensureDeferred
async def test_listModelsFromTheEndpoint(scriptedServer) -> None:
    server, url = scriptedServer
    server.models = ["model-a", "model-b"]
    server.windows = {"model-b": 65536}
    server.apiKey = "k"
    models = await deferToThread(listModels, Endpoint("custom", url, "k", "model-a"), 5)
    assert models == [("model-a", None), ("model-b", 65536)]
    error = await failure(deferToThread(listModels, Endpoint("custom", url, "bad", None), 5))
    assert "HTTP 401" in str(error)


def test_listModelsFromTheEnvironment() -> None:
    endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", None, "x", models=("x", "y"))
    assert listModels(endpoint, 1) == [("x", None), ("y", None)]


def test_engineImportsNeitherTwistedNorOpenAI() -> None:
    """The engine runs in worker threads without Twisted, and the SDK loads on first use."""
    code = (
        "import sys, pkgutil, importlib, hermes_acp.engine as e, hermes_acp.engine.tools as t\n"
        "for pkg in (e, t):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(pkg.__name__ + '.' + m.name)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('twisted', 'openai', 'httpx2')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_noModelChosen(scriptedServer) -> None:
    _, url = scriptedServer
    with pytest.raises(ModelError, match="no model chosen"):
        client(url).complete("", MESSAGES, [], Cancellation(), print, print)


def test_overflowErrorsAreRecognisedWithTheirWindow() -> None:
    from hermes_acp.engine.model import _statusMessage, modelWindow

    endpoint = Endpoint("custom", "http://127.0.0.1:9/v1", "k", "m")
    for detail, window in [
        ("This model's maximum context length is 128,000 tokens. However, you requested 130000 tokens", 128000),
        ("prompt is too long: 210000 tokens > 200000 maximum", None),
        ("the request exceeds the available context size (n_ctx 4096)", 4096),
        ("Input is too long for requested model.", None),
    ]:
        error = _statusMessage(400, detail, endpoint, "m")
        assert error.overflow and error.window == window, detail
    assert not _statusMessage(400, "temperature must be at most 2", endpoint, "m").overflow
    assert modelWindow({"id": "a", "context_length": 8192}) == 8192
    assert modelWindow({"id": "a", "top_provider": {"context_length": 4096}}) == 4096
    assert modelWindow({"id": "a", "context_length": "big"}) is None
