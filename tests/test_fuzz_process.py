"""Property test through the real process (issue 10): random JSON values, with
non-finite numbers, lone surrogates and deep nesting, in the params of every
method. Whatever arrives: every request is answered, the process stays alive,
every frame it writes is valid against the ACP schema, and afterwards every
session it made still loads, also after a restart.

The agent runs with ``--trace`` (its scrubber sees every frame too) against the
scripted model in a process of its own; the fuzzed requests go in as raw lines,
since the SDK client cannot send most of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import acpschema
from .agentproc import ENTRY_POINTS, agentEnv

ANSWER_TIMEOUT = 20.0
HUGE = "__HUGE_NUMBER__"  # written as 1e400, which no Python float prints as

letters = st.characters(exclude_categories=()) | st.characters(categories=["Cs"])
texts = st.text(letters, max_size=12) | st.sampled_from(["", "/help", "/reset", "/title x", "/model m", "/mode dont_ask", "\0"])
numbers = (st.integers(-(2**70), 2**70) | st.floats() | st.just(HUGE)).map(lambda n: n)
scalars = st.none() | st.booleans() | numbers | texts
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8)


class Deep:
    """A value inside ``depth`` arrays; written out as text, so that neither this
    process's json nor hypothesis's printer has to recurse through it."""

    def __init__(self, value: Any, depth: int) -> None:
        self.value, self.depth = value, depth

    def __repr__(self) -> str:
        return f"Deep({self.value!r}, {self.depth})"


deepValues = st.builds(Deep, values, st.sampled_from([150, 600, 1100]))
anyValue = values | deepValues


def wire(value: Any) -> str:
    """JSON text with NaN/Infinity as Python writes them, 1e400 where HUGE stood,
    lone surrogates as escapes, and Deep values spelled out."""
    deeps: dict[str, Deep] = {}

    def placeholder(item: Any) -> str:
        if not isinstance(item, Deep):
            raise TypeError(repr(item))
        deeps[f"__DEEP_{len(deeps)}__"] = item
        return f"__DEEP_{len(deeps) - 1}__"

    text = json.dumps(value, allow_nan=True, default=placeholder).replace(f'"{HUGE}"', "1e400")
    for name, item in deeps.items():
        text = text.replace(f'"{name}"', "[" * item.depth + wire(item.value) + "]" * item.depth)
    return text


class Agent:
    """The agent process, read on a thread; answers are waited for with a bound."""

    def __init__(self, env: dict[str, str], trace: Path) -> None:
        self.process = subprocess.Popen(
            ENTRY_POINTS["python -m hermes_acp"] + ["--trace", str(trace)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir(),
        )
        self.frames: list[dict[str, Any]] = []
        self.answers: dict[int, dict[str, Any]] = {}
        self.unreadable: list[dict[str, Any]] = []  # errors with id null, in order
        self.unreadableTaken = 0
        self.checked = 0
        self.arrived = threading.Condition()
        self.methods: dict[str, str] = {}
        self.sent: dict[int, str] = {}
        self.nextId = 1
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            frame = json.loads(line)  # a line that is not JSON fails here, and so the test
            with self.arrived:
                self.frames.append(frame)
                if "method" not in frame and isinstance(frame.get("id"), int):
                    self.answers[frame["id"]] = frame
                elif "method" not in frame and frame.get("id") is None:
                    self.unreadable.append(frame)
                self.arrived.notify_all()

    def send(self, method: str, params: Any, notify: bool = False) -> int | None:
        requestId = None if notify else self.nextId
        text = f'{{"jsonrpc":"2.0","method":{json.dumps(method)},"params":{wire(params)}'
        if requestId is not None:
            self.nextId += 1
            self.methods[json.dumps(requestId)] = method
            text += f',"id":{requestId}'
            self.sent[requestId] = text[:2000]
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode() + b"}\n")
        self.process.stdin.flush()
        return requestId

    def answer(self, requestId: int, unreadable: bool = False) -> dict[str, Any]:
        """The answer to a request. One nested too deeply for this Python's json to
        read at all (``unreadable``) may instead be answered with id null, as
        JSON-RPC says when the id cannot be known."""
        def ready() -> bool:
            return requestId in self.answers or (unreadable and len(self.unreadable) > self.unreadableTaken)

        with self.arrived:
            if not self.arrived.wait_for(ready, ANSWER_TIMEOUT):
                raise AssertionError(f"no answer to request {requestId}: {self.sent[requestId]}; "
                                     f"alive: {self.process.poll() is None}")
            if requestId in self.answers:
                return self.answers[requestId]
            frame = self.unreadable[self.unreadableTaken]
            self.unreadableTaken += 1
        assert frame["error"]["code"] == -32600 and "too deeply" in frame["error"]["message"], frame
        return frame

    def call(self, method: str, params: Any) -> dict[str, Any]:
        requestId = self.send(method, params)
        assert requestId is not None
        return self.answer(requestId)

    def problems(self) -> list[str]:
        """What is wrong with the frames that arrived since the last call."""
        with self.arrived:
            frames, self.checked = self.frames[self.checked :], len(self.frames)
        found = []
        for frame in frames:
            found += [f"{p} in {json.dumps(frame)[:300]}" for p in acpschema.checkAgentFrame(frame, self.methods)]
        return found

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(15)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def scriptedModelProcess(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    script = tmp / "script.json"
    script.write_text(json.dumps({"default": [[{"text": "ok"}]], "repeat": True, "models": ["m1", "m2"]}))
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("scripted_model.py")), "--script", str(script)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert server.stdout is not None
    return server, server.stdout.readline().decode().strip()


def test_randomParamsNeverBreakTheAgent(tmp_path: Path) -> None:
    """See the module docstring."""
    server, url = scriptedModelProcess(tmp_path)
    try:
        fuzz(tmp_path, url)
    finally:
        server.kill()
        server.wait()


def fuzz(tmp_path: Path, url: str) -> None:
    home = tmp_path / "home"
    env = agentEnv(home, HERMES_BASE_URL=url, HERMES_MODEL="m1", HERMES_MODELS="m1,m2", PATH=os.environ["PATH"])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    agent = Agent(env, tmp_path / "trace.jsonl")
    sessions: list[str] = []
    deleted: set[str] = set()
    try:
        assert "result" in agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        for _ in range(2):
            sessions.append(agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})["result"]["sessionId"])
        folders = [str(tmp_path), "/", "/tmp/x\ud800", "relative", "/nonexistent/x", str(fifo)]
        uris = [f"file://{fifo}", "file:///dev/zero", f"file://{tmp_path}", "https://example.com/x", "file:///etc/hostname",
                "file://[::1", "http://[x", "file:///tmp/a%00b", "file://other-host/etc/hostname", "relative/path", ""]
        blocks = st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": texts}, optional={"annotations": anyValue}),
            st.fixed_dictionaries({"type": st.just("resource_link"), "uri": st.sampled_from(uris), "name": texts},
                                  optional={"annotations": anyValue, "mimeType": texts}),
            st.fixed_dictionaries({"type": st.just("resource"), "resource": st.fixed_dictionaries(
                {"uri": st.sampled_from(uris), "text": texts})}),
            st.fixed_dictionaries({"type": st.just("image"), "data": st.sampled_from(["aGk=", "!!"]), "mimeType": texts}),
            anyValue,
        )

        def templates(sessionId: str) -> dict[str, dict[str, Any]]:
            return {
                "initialize": {"protocolVersion": 1, "clientCapabilities": {}},
                "authenticate": {"methodId": "custom"},
                "session/new": {"cwd": str(tmp_path), "mcpServers": []},
                "session/load": {"sessionId": sessionId, "cwd": str(tmp_path), "mcpServers": []},
                "session/resume": {"sessionId": sessionId, "cwd": str(tmp_path)},
                "session/fork": {"sessionId": sessionId, "cwd": str(tmp_path), "mcpServers": []},
                "session/list": {"cwd": str(tmp_path)},
                "session/close": {"sessionId": sessionId},
                "session/delete": {"sessionId": sessionId},
                "session/set_mode": {"sessionId": sessionId, "modeId": "accept_edits"},
                "session/set_config_option": {"sessionId": sessionId, "configId": "model", "value": "m2"},
                "session/set_model": {"sessionId": sessionId, "modelId": "m1"},
                "session/prompt": {"sessionId": sessionId, "prompt": [{"type": "text", "text": "hello"}]},
                "session/cancel": {"sessionId": sessionId},
                "$/cancel_request": {"requestId": 1},
                "_vendor/unknown": {},
            }

        @st.composite
        def requests(draw: Any) -> tuple[str, Any]:
            # An index, not the list itself: the list grows as sessions are made, and
            # hypothesis needs the same draws to mean the same choices.
            pick = draw(st.integers(0, 15) | texts)
            sessionId = sessions[pick % len(sessions)] if isinstance(pick, int) else pick
            method, params = draw(st.sampled_from(sorted(templates(sessionId).items())))
            how = draw(st.sampled_from(["field", "field", "prompt", "folders", "extra", "whole", "valid"]))
            params = dict(params)
            if how == "field":
                params[draw(st.sampled_from(sorted(params) or ["x"]))] = draw(anyValue)
            elif how == "prompt":
                method, params = "session/prompt", {"sessionId": sessionId, "prompt": draw(st.lists(blocks, max_size=3))}
            elif how == "folders":
                params["cwd"] = draw(st.sampled_from(folders))
                params["additionalDirectories"] = draw(st.lists(st.sampled_from(folders) | anyValue, max_size=2))
            elif how == "extra":
                params[draw(texts)] = draw(anyValue)
            elif how == "whole":
                params = draw(anyValue)
            return method, params

        @settings(max_examples=int(os.environ.get("HERMES_FUZZ_EXAMPLES", "400")), deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.lists(requests(), min_size=1, max_size=3))
        def examples(batch: list[tuple[str, Any]]) -> None:
            sent = []
            for method, params in batch:
                notify = method in ("session/cancel", "$/cancel_request")
                sent.append((method, params, agent.send(method, params, notify=notify)))
            for method, params, requestId in sent:
                if requestId is None:
                    continue
                frame = agent.answer(requestId, unreadable="[" * 1000 in wire(params))
                result = frame.get("result")
                if isinstance(result, dict) and isinstance(result.get("sessionId"), str):
                    sessions.append(result["sessionId"])
                if method == "session/delete" and "result" in frame and isinstance(params, dict):
                    deleted.add(params.get("sessionId"))
            assert agent.process.poll() is None, "the agent died"
            assert agent.problems() == []

        examples()
        for sessionId in dict.fromkeys(sessions):
            if sessionId not in deleted:
                frame = agent.call("session/load", {"sessionId": sessionId, "cwd": str(tmp_path), "mcpServers": []})
                assert "result" in frame, frame
        assert agent.problems() == []
    finally:
        agent.close()
    assert agent.process.returncode == 0
    for line in (tmp_path / "trace.jsonl").read_bytes().split(b"\n")[:-1]:  # not splitlines: U+2028 is no newline
        json.loads(line)

    again = Agent(env, tmp_path / "trace2.jsonl")
    try:
        again.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        for sessionId in dict.fromkeys(sessions):
            if sessionId not in deleted:
                frame = again.call("session/load", {"sessionId": sessionId, "cwd": str(tmp_path), "mcpServers": []})
                assert "result" in frame, frame
                prompt = {"sessionId": sessionId, "prompt": [{"type": "text", "text": "still fine?"}]}
                assert again.call("session/prompt", prompt)["result"]["stopReason"] in ("end_turn", "cancelled")
        assert again.problems() == []
    finally:
        again.close()
