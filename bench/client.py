"""A minimal raw NDJSON ACP client and the two processes the benchmark runs.

No SDK and no pydantic: the client writes compact JSON lines and parses what
comes back with ``json.loads``, so the time measured is the agent's (plus the
pipe), not a client library's. Times are taken when a line is read, not when
an awaiting coroutine happens to resume.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from hermes_acp.engine.lifeline import children
from tests.agentproc import agentEnv as withoutModel

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
#: The installed agent; BENCH_AGENT_ARGS adds arguments (e.g. ``--log-level debug`` with ``--keep``).
AGENT = [sys.executable, "-m", "hermes_acp", *os.environ.get("BENCH_AGENT_ARGS", "").split()]
LIMIT = 128 * 1024 * 1024  # the agent allows 64 MiB lines; never be the smaller side
#: No single request of the benchmark may take longer than this.
REQUEST_TIMEOUT = 60.0
#: How long the children an agent stops (a closed session's MCP servers) get to be gone.
CHILDREN_TIMEOUT = 10.0
#: How long an agent gets to exit after stdin closes before it is killed.
EXIT_TIMEOUT = 5.0
#: No fs or terminal capabilities: tools work on the local disk, as with a bare client.
INITIALIZE = {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "hermes-acp-bench", "version": "0"}}


class BenchError(Exception):
    """Something the benchmark needed did not happen."""


def agentEnv(url: str, home: str, **extra: str) -> dict[str, str]:
    """The tests' agent environment (no model settings of ours), pointed at the scripted server."""
    return withoutModel(
        home, HERMES_BASE_URL=url, HERMES_API_KEY="bench-key-not-secret", HERMES_MODEL="scripted-model",
        NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", **extra,
    )


class ModelServer:
    """``bench/model_server.py`` in its own process; knows when requests arrive."""

    def __init__(self, process: asyncio.subprocess.Process, url: str, scriptPath: str) -> None:
        self.process = process
        self.url = url
        self.scriptPath = scriptPath
        self.arrived: list[tuple[float, str]] = []
        self._waiters: list[tuple[str, asyncio.Future[float]]] = []
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, script: dict[str, Any]) -> ModelServer:
        fd, path = tempfile.mkstemp(prefix="hermes-bench-script-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(script, f)
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(BENCH / "model_server.py"), "--script", path,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, limit=LIMIT,
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if not line.startswith(b"http"):
            process.kill()
            raise BenchError(f"the scripted model server did not start: {line[:200]!r}")
        return cls(process, line.decode().strip(), path)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            now = time.perf_counter()
            text = json.loads(line)["request"]
            self.arrived.append((now, text))
            for waiter in [w for w in self._waiters if w[0] in text]:
                self._waiters.remove(waiter)
                if not waiter[1].done():
                    waiter[1].set_result(now)

    def nextRequest(self, match: str) -> asyncio.Future[float]:
        """A future for when the next chat request whose prompt contains ``match`` arrives."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((match, future))
        return future

    async def stop(self) -> None:
        self._reader.cancel()
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        os.unlink(self.scriptPath)


class AgentProcess:
    """One ``python -m hermes_acp`` driven over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, spawnedAt: float) -> None:
        self.process = process
        self.spawnedAt = spawnedAt
        self.pid = process.pid
        self._nextId = 0
        self._pending: dict[int, tuple[str, asyncio.Future[tuple[float, Any]]]] = {}
        #: session/update payloads per session, in arrival order.
        self.updates: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.agentRequests: list[dict[str, Any]] = []
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def spawn(cls, env: dict[str, str], stderr: Any = None, args: tuple[str, ...] = (),
                    command: list[str] = AGENT) -> AgentProcess:
        """``command`` (the agent by default) with ``args``."""
        spawnedAt = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *command, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=stderr if stderr is not None else asyncio.subprocess.DEVNULL,
            env=env, cwd=tempfile.gettempdir(), limit=LIMIT,
        )
        return cls(process, spawnedAt)

    # -- the wire ------------------------------------------------------------

    def _write(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            now = time.perf_counter()
            message = json.loads(line)
            if "method" not in message:
                pending = self._pending.pop(message.get("id"), None)
                if pending is not None and not pending[1].done():
                    pending[1].set_result((now, message))
            elif message["method"] == "session/update":
                params = message["params"]
                self.updates[params["sessionId"]].append(params["update"])
            elif "id" in message:  # the agent asks us something; the benchmark never needs it
                self.agentRequests.append(message)
                self._write({"jsonrpc": "2.0", "id": message["id"],
                             "error": {"code": -32601, "message": "not supported by the benchmark client"}})
        for method, future in self._pending.values():
            if not future.done():
                future.set_exception(BenchError(f"the agent closed stdout while {method} was pending"))

    def send(self, method: str, params: dict[str, Any]) -> tuple[float, asyncio.Future[tuple[float, Any]]]:
        """Write a request now; (time written, future of (time answered, message))."""
        requestId = self._nextId
        self._nextId += 1
        future: asyncio.Future[tuple[float, Any]] = asyncio.get_running_loop().create_future()
        self._pending[requestId] = (method, future)
        self._write({"jsonrpc": "2.0", "id": requestId, "method": method, "params": params})
        return time.perf_counter(), future

    async def request(self, method: str, params: dict[str, Any], timeout: float = REQUEST_TIMEOUT) -> tuple[float, Any]:
        """Send a request and wait: (seconds from write to answer, result)."""
        sent, future = self.send(method, params)
        answered, result = await self.answer(method, future, timeout)
        return answered - sent, result

    @staticmethod
    async def answer(method: str, future: asyncio.Future[tuple[float, Any]], timeout: float = REQUEST_TIMEOUT) -> tuple[float, Any]:
        """(time answered, result) of a sent request; an error answer raises."""
        try:
            answered, message = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise BenchError(f"{method}: no answer within {timeout:g} s") from None
        if "error" in message:
            raise BenchError(f"{method} failed: {message['error']}")
        return answered, message["result"]

    def notify(self, method: str, params: dict[str, Any]) -> float:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})
        return time.perf_counter()

    # -- ACP in a few words -----------------------------------------------------

    async def initialize(self) -> tuple[float, Any]:
        return await self.request("initialize", INITIALIZE)

    async def newSession(self, cwd: str) -> tuple[float, str]:
        elapsed, result = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        return elapsed, result["sessionId"]

    def sendPrompt(self, sessionId: str, text: str) -> tuple[float, asyncio.Future[tuple[float, Any]]]:
        return self.send("session/prompt", {"sessionId": sessionId, "prompt": [{"type": "text", "text": text}]})

    async def prompt(self, sessionId: str, text: str, timeout: float = REQUEST_TIMEOUT) -> tuple[float, Any]:
        """One turn: (seconds from write to the prompt's response, its result)."""
        sent, future = self.sendPrompt(sessionId, text)
        answered, result = await self.answer("session/prompt", future, timeout)
        if result.get("stopReason") != "end_turn":
            raise BenchError(f"turn {text!r} ended with {result.get('stopReason')!r}, not end_turn")
        return answered - sent, result

    def childrenWith(self, text: str) -> set[int]:
        """The agent's child processes whose command line holds ``text``."""
        found = set()
        for pid in children(self.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.add(pid)
            except OSError:  # it has just ended
                pass
        return found

    async def collected(self, pids: set[int], timeout: float = CHILDREN_TIMEOUT) -> None:
        """Until the agent has collected the exit status of each of ``pids`` (an ended child
        it has not is still listed among its children)."""
        deadline = time.perf_counter() + timeout
        while pids & set(children(self.pid)):
            if time.perf_counter() > deadline:
                raise BenchError(f"the agent's children {sorted(pids)} still ran {timeout:g} s later")
            await asyncio.sleep(0.005)

    def rssBytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise BenchError(f"no VmRSS for process {self.pid}")

    async def close(self, timeout: float = EXIT_TIMEOUT) -> bool:
        """Close stdin (the editor's way to say goodbye); True if the agent
        exited by itself, False if it lingered and was killed."""
        assert self.process.stdin is not None
        if not self.process.stdin.is_closing():
            self.process.stdin.close()
        exited = True
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            exited = False
            self.process.kill()
            await self.process.wait()
        await asyncio.wait_for(self._reader, 5)
        return exited
