"""The scripted model server itself: rules, plain JSON answers, timed stalls, its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest_twisted
from twisted.internet.threads import deferToThread

SERVER = Path(__file__).with_name("scripted_model.py")


def post(url: str, body: dict, key: str = "k") -> dict:
    request = urllib.request.Request(
        url + "/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def ask(text: str, stream: bool = False) -> dict:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}


@pytest_twisted.ensureDeferred
async def test_rulesAndPlainJSON(scriptedServer) -> None:
    """Each rule keeps its own place in its script; plain requests get a whole completion."""
    server, url = scriptedServer
    server.addRule("alpha", [[{"text": "a1"}], [{"text": "a2"}]])
    server.addRule("beta", [[{"reasoning": "hm"}, {"text": "b1"},
                             {"tool_calls": [{"id": "t", "name": "todo", "arguments": {}}]},
                             {"usage": {"prompt_tokens": 3, "completion_tokens": 1}}]])
    server.default.responses.append([{"text": "fallback"}])
    first = await deferToThread(post, url, ask("alpha one"))
    beta = await deferToThread(post, url, ask("the beta"))
    second = await deferToThread(post, url, ask("alpha two"))
    other = await deferToThread(post, url, ask("anything"))
    assert first["choices"][0]["message"]["content"] == "a1"
    assert second["choices"][0]["message"]["content"] == "a2"
    assert other["choices"][0]["message"]["content"] == "fallback"
    choice = beta["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "hm"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "todo", "arguments": "{}"}
    assert beta["usage"] == {"prompt_tokens": 3, "completion_tokens": 1}
    seen = [r.body["messages"][0]["content"] for r in server.requests]
    assert seen == ["alpha one", "the beta", "alpha two", "anything"]


@pytest_twisted.ensureDeferred
async def test_exhaustedScriptAnswers500(scriptedServer) -> None:
    _, url = scriptedServer
    try:
        await deferToThread(post, url, ask("x"))
    except urllib.error.HTTPError as e:
        assert e.code == 500 and "script exhausted" in json.load(e)["error"]["message"]
    else:
        raise AssertionError("no error")


@pytest_twisted.ensureDeferred
async def test_timedStall(scriptedServer) -> None:
    server, url = scriptedServer
    server.default.responses.append([{"stall": 0.3}, {"text": "late"}])
    started = time.monotonic()
    answer = await deferToThread(post, url, ask("x"))
    assert time.monotonic() - started >= 0.3
    assert answer["choices"][0]["message"]["content"] == "late"


def test_ownProcess(tmp_path: Path) -> None:
    """Another process can host it: the first stdout line is the base URL."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": [[{"text": "from a file"}]], "models": ["x", "y"], "apiKey": "k"}))
    process = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", "--script", str(script)],
                               stdout=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        models = urllib.request.Request(url + "/models", headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(models, timeout=10) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["x", "y"]
        assert post(url, ask("hi"))["choices"][0]["message"]["content"] == "from a file"
    finally:
        process.kill()
        process.wait()
