"""The measurements. Each case drives real agent processes and returns rows.

Every loop is bounded by a run count and every wait by a timeout, so a case
either finishes or fails; it never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

from .client import BENCH, INITIALIZE, AgentProcess, BenchError, ModelServer, agentEnv

MiB = 1024 * 1024
#: 400 KB in 4,000 deltas of 100 characters.
STREAM_DELTA = ("The quick brown fox jumps over the lazy dog. " * 3)[:99] + "\n"
STREAM_DELTAS = 4000
STREAM_CHARS = len(STREAM_DELTA) * STREAM_DELTAS
TOOL_CALLS = 5
COMMANDS = 10
HISTORY_TURNS = 100
LATE_TURNS = 10
RSS_SESSIONS = 50
MCP_SERVERS = 3
#: The long session of the compaction case: a small-window model, a 12 KB file read every turn.
COMPACTION_WINDOW, COMPACTION_FILE = 16_000, 12_000
_COMPACTED = re.compile(r"compaction \w+ \((\w+)\): completed \((\w+)\), (\d+) -> (\d+) tokens in ([\d.]+) s")
#: The frames case: a model that streams deltas of 1,000 characters at a steady pace, a little
#: slower than the agent's batching window (``bridge.COALESCE_SECONDS``), so each is a frame of
#: its own; and the size of each such event of ``scripted_model``'s flood.
PACED_DELTAS, PACE = 400, 0.006
#: The paced floor's reads held this far apart (``pacedFrameFloor``'s ``readEvery``).
BATCHED_READS = 0.05
#: One event of the flood and of the paced stream (``tests/scripted_model.py`` sends these).
PACED_EVENT = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]}).encode() + b"\n\n"
FLOOD_EVENT = len(PACED_EVENT)
#: One event of the ``[stream]`` answer, as ``scripted_model`` writes it (``_chunk``).
STREAM_EVENT = b"data: " + json.dumps({
    "id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": "scripted-model",
    "choices": [{"index": 0, "delta": {"content": STREAM_DELTA}, "finish_reason": None}]}).encode() + b"\n\n"
#: The history sizes of the request case: 4 messages a turn (a request, a read, its result, an answer).
HISTORY_SIZES = (1000, 4000)
MCP_SETTLE = 0.3  # between a session/new with servers and its close
MCP_SCRIPT = "mcp-server.json"  # in the run's root: the scripted servers' script (on their command line)
#: The scale case (issue 27): this many sessions stream at once in one process.
SCALE_SESSIONS = 200
TRICKLE_EVERY = 0.25
#: The store case (issue 27): a state.db of this many other sessions, searched this many times
#: in one turn; and one session of this many turns, each with a tool result of TOOL_RESULT bytes.
STORE_SESSIONS, SEARCHES = 10_000, 30
LONG_TURNS, TOOL_RESULT = 1000, 4096  # a streaming session's pace in the scale case: 4 deltas a second each
CANCEL_SETTLE = 0.1  # after the model request arrives, let the stream open and stall

# One script for the whole run; each prompt carries the tag of the rule it wants.
SCRIPT: dict[str, Any] = {
    "repeat": True,
    "default": [[{"text": "untagged prompt"}]],
    "rules": [
        {"match": "[notool]", "responses": [[{"text": "Hello from the scripted model."}]]},
        {"match": "[short]", "responses": [[{"text": "A short answer, "}, {"text": "in two deltas."}]]},
        {"match": "[tools]", "responses": [
            *([{"tool_calls": [{"id": f"read{n}", "name": "read_file", "arguments": {"path": "notes.txt"}}]}]
              for n in range(TOOL_CALLS)),
            [{"text": f"Read notes.txt {TOOL_CALLS} times."}],
        ]},
        {"match": "[mcptools]", "responses": [
            *([{"tool_calls": [{"id": f"mcp{n}", "name": "mcp__bench0__echo", "arguments": {"text": "echoed"}}]}]
              for n in range(TOOL_CALLS)),
            [{"text": f"Called echo {TOOL_CALLS} times."}],
        ]},
        {"match": "[commands]", "responses": [
            *([{"tool_calls": [{"id": f"run{n}", "name": "terminal", "arguments": {"command": "true"}}]}]
              for n in range(COMMANDS)),
            [{"text": f"Ran true {COMMANDS} times."}],
        ]},
        {"match": "[background]", "responses": [
            [{"tool_calls": [{"id": "bg", "name": "terminal", "arguments": {"command": "sleep 60", "background": True}}]}],
            [{"text": "Started sleep 60 in the background."}],
        ]},
        {"match": "[write]", "responses": [
            [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "out.txt", "content": "x\n"}}]}],
            [{"text": "Wrote out.txt."}],
        ]},
        # A delegated task: the parent's request asks for it, the child (its goal says [child]) answers
        # in one request, the parent answers; and the same three model requests with two reads.
        {"match": "[delegate]", "responses": [
            [{"tool_calls": [{"id": "d", "name": "delegate_task", "arguments": {"goal": "[child] say ok"}}]}],
            [{"text": "The subagent said ok."}],
        ]},
        {"match": "[delegate3]", "responses": [
            [{"tool_calls": [{"id": "d", "name": "delegate_task", "arguments": {"tasks": [
                {"goal": f"[child] say ok {n}"} for n in range(3)]}}]}],
            [{"text": "The subagents said ok."}],
        ]},
        {"match": "[child]", "responses": [[{"text": "ok"}]]},
        {"match": "[tworeads]", "responses": [
            *([{"tool_calls": [{"id": f"read{n}", "name": "read_file", "arguments": {"path": "notes.txt"}}]}]
              for n in range(2)),
            [{"text": "Read notes.txt twice."}],
        ]},
        {"match": "[stream]", "responses": [[{"text": STREAM_DELTA, "times": STREAM_DELTAS}]]},
        {"match": "[second]", "responses": [[{"stall": 1.0}, {"text": "One second later."}]]},
        {"match": "[stall]", "responses": [[{"stall": True}]]},
        {"match": "[endless]", "responses": [[{"text": "Endless: "}, {"flood": "text", "every": 0.005}]]},
        {"match": "[flood]", "responses": [[{"text": "Flood: "}, {"flood": "text"}]]},
        {"match": "[paced]", "responses": [[{"flood": "text", "every": PACE, "bytes": PACED_DELTAS * FLOOD_EVENT}]]},
        {"match": "[searching]", "responses": [
            *([{"tool_calls": [{"id": f"search{n}", "name": "session_search",
                                "arguments": {"query": "parser tokens", "all_projects": True}}]}]
              for n in range(SEARCHES)),
            [{"text": "Searched."}],
        ]},
        {"match": "[trickle]", "responses": [[{"text": "Trickle: "}, {"flood": "text", "every": TRICKLE_EVERY}]]},
    ],
}


@attrs.frozen
class Runs:
    """How many samples each case takes."""

    spawns: int
    sessions: int
    turns: int
    toolTurns: int
    streams: int
    concurrent: int
    cancels: int
    loads: int
    rss: int
    longTurns: int
    diagnostics: bool  # rows that explain a miss rather than measure a target

    @classmethod
    def forMode(cls, quick: bool) -> Runs:
        if quick:
            return cls(spawns=3, sessions=5, turns=5, toolTurns=3, streams=2, concurrent=1, cancels=3, loads=2, rss=1,
                       longTurns=40, diagnostics=False)
        return cls(spawns=10, sessions=20, turns=20, toolTurns=10, streams=5, concurrent=5, cancels=10, loads=5, rss=3,
                   longTurns=300, diagnostics=True)


@attrs.frozen
class Result:
    """One table row: samples in seconds (or bytes for memory) and an optional target."""

    label: str
    samples: list[float]
    unit: str  # "µs", "ms", "s", "MiB" or "ratio"
    target: float | None = None
    targetText: str = "—"
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def within(self) -> bool | None:
        return None if self.target is None else self.median <= self.target


@attrs.define
class Bench:
    """What every case shares: the model server, the runs, temp folders, live agents."""

    server: ModelServer
    runs: Runs
    root: Path
    agents: list[AgentProcess] = attrs.field(factory=list)
    killed: int = 0  # agents that did not exit after stdin EOF
    _homes: int = 0

    @property
    def workspace(self) -> str:
        path = self.root / "workspace"
        if not path.exists():
            path.mkdir()
            (path / "notes.txt").write_text("".join(f"line {n}: some notes to read\n" for n in range(1, 41)))
        return str(path)

    def home(self) -> str:
        self._homes += 1
        path = self.root / f"home-{self._homes}"
        path.mkdir()
        return str(path)

    async def spawn(self, home: str | None = None, server: ModelServer | None = None, args: tuple[str, ...] = (),
                    **extra: str) -> AgentProcess:
        """A fresh agent with its own (or the given) HERMES_HOME, on the run's model server
        (or ``server``), with ``args`` on its command line; stderr to a log file."""
        home = home or self.home()
        log = _stderrLog(home)
        try:
            agent = await AgentProcess.spawn(agentEnv((server or self.server).url, home, **extra), stderr=log, args=args)
        finally:
            log.close()
        self.agents.append(agent)
        return agent

    async def ready(self, home: str | None = None, **extra: str) -> AgentProcess:
        agent = await self.spawn(home, **extra)
        await agent.initialize()
        return agent

    async def warmSession(self, agent: AgentProcess) -> str:
        """A session that has run one short turn (its engine is built)."""
        _, sessionId = await agent.newSession(self.workspace)
        await agent.prompt(sessionId, "[short] warm up")
        return sessionId

    async def close(self, agent: AgentProcess) -> None:
        if not await agent.close():
            self.killed += 1
        self.agents.remove(agent)

    async def cleanup(self) -> None:
        for agent in list(self.agents):
            if agent.process.returncode is None:
                agent.process.kill()
                await agent.process.wait()
        self.agents.clear()


def _stderrLog(home: str) -> Any:
    """The agent's stderr goes to a file in its home (``--keep`` keeps it)."""
    return open(Path(home) / "agent-stderr.log", "ab")  # the child holds it; we close our copy


#: The floor: the same interpreter, only importing the reactor, then saying so on stdout.
FLOOR = "import sys, twisted.internet.reactor; sys.stdout.write('ready\\n'); sys.stdout.flush()"


async def importFloor() -> float:
    """Seconds from spawning Python until it has imported the Twisted reactor
    (timed to its line on stdout, like the agent to its answer; its exit is not timed)."""
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOR, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    elapsed = time.perf_counter() - started
    if line != b"ready\n" or await asyncio.wait_for(process.wait(), 30) != 0:
        raise BenchError("python -c 'import twisted.internet.reactor' failed")
    return elapsed


async def caseInitialize(b: Bench) -> list[Result]:
    """Fresh processes: spawn → initialize answered, then the process's first
    session/new and first turn (the engine's lazy imports land there)."""
    floor, init, firstNew, firstTurn, firstAnswer = [], [], [], [], []
    for n in range(b.runs.spawns):
        floor.append(await importFloor())  # interleaved, so drift hits both alike
        agent = await b.spawn()
        _, future = agent.send("initialize", INITIALIZE)
        answered, _ = await agent.answer("initialize", future)
        init.append(answered - agent.spawnedAt)
        elapsed, sessionId = await agent.newSession(b.workspace)
        firstNew.append(elapsed)
        sent, future = agent.sendPrompt(sessionId, f"[notool] first turn {n}")
        answered, _ = await agent.answer("session/prompt", future)
        firstTurn.append(answered - sent)
        firstAnswer.append(answered - agent.spawnedAt)
        await b.close(agent)
    limit, startup = statistics.median(floor) + 0.1, statistics.median(init)
    return [
        Result("bare `python -c \"import twisted.internet.reactor\"`", floor, "s",
               note="the import floor: spawn until the reactor is imported (exit not timed)"),
        Result("spawn → `initialize` answered", init, "s", limit, f"≤ floor + 0.1 s = {limit:.3f} s",
               _ratio(init, floor, "floor")),
        Result("first `session/new` of a process", firstNew, "ms", note="state.db opens from `initialize`'s answer on"),
        Result("first no-tool turn of a process", firstTurn, "ms",
               note="builds the session's engine (its modules imported before `initialize` was answered)"),
        Result("spawn → first answer of a turn", firstAnswer, "s", startup + 0.1,
               f"≤ startup + 0.1 s = {startup + 0.1:.3f} s", _ratio(firstAnswer, init, "startup") +
               "; initialize, session/new and the prompt one after another, as an editor sends them"),
    ]


def _ratio(samples: list[float], floor: list[float], name: str) -> str:
    return f"{statistics.median(samples) / statistics.median(floor):.2f} × the {name}"


#: Two processes, each importing the reactor: the floor of a client that spawns an agent.
FLOOR2 = ("import subprocess, sys, twisted.internet.reactor; "
          "subprocess.run([sys.executable, '-c', 'import twisted.internet.reactor'], check=True)")


async def timedExit(*argv: str, env: dict[str, str] | None = None) -> float:
    """Seconds from spawning ``argv`` until it exits (successfully)."""
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    code = await asyncio.wait_for(process.wait(), 60)
    if code != 0:
        raise BenchError(f"{' '.join(argv[:4])} … exited with {code}")
    return time.perf_counter() - started


async def caseCold(b: Bench) -> list[Result]:
    """``hermes-acp prompt "…"`` from nothing to its exit (it spawns the agent), against two
    processes that only import the reactor, one spawning the other."""
    floor, cold = [], []
    for n in range(b.runs.spawns):
        floor.append(await timedExit(sys.executable, "-c", FLOOR2))
        env = agentEnv(b.server.url, b.home())
        cold.append(await timedExit(sys.executable, "-m", "hermes_acp", "prompt", f"[notool] say hi {n}", env=env))
    limit = statistics.median(floor) + 0.3
    return [
        Result("two processes importing the reactor", floor, "s",
               note="the floor of a client spawning an agent: `python -c` spawning `python -c`, both to their exit"),
        Result("cold `hermes-acp prompt \"say hi\"`", cold, "s", limit, f"≤ floor + 0.3 s = {limit:.3f} s",
               _ratio(cold, floor, "floor") + "; a fresh HERMES_HOME each run, to its exit"),
    ]


async def caseSessionNew(b: Bench) -> list[Result]:
    agent = await b.ready()
    await agent.newSession(b.workspace)  # the first one opens the database; measured above
    samples = [(await agent.newSession(b.workspace))[0] for _ in range(b.runs.sessions)]
    await b.close(agent)
    return [Result("`session/new`", samples, "ms", 0.050, "≤ 50 ms", "warm process (not its first session)")]


async def caseTurn(b: Bench) -> list[Result]:
    agent = await b.ready()
    samples = []
    for n in range(b.runs.turns):  # a fresh session each run: the history stays one turn long
        sessionId = await b.warmSession(agent)
        samples.append((await agent.prompt(sessionId, f"[notool] turn {n}"))[0])
    await b.close(agent)
    return [Result("no-tool turn (`session/prompt` → response)", samples, "ms", 0.020, "≤ 20 ms",
                   "one model request answering 1 delta; the session's second turn")]


SKILLS = 50


async def caseSkills(b: Bench) -> list[Result]:
    """The no-tool turn again, with ``SKILLS`` skills in ``$HERMES_HOME/skills`` (each turn reads
    them at its start, for its commands and its system prompt; a no-tool turn not at its end);
    and one read of them in this process, as a turn does it (files parsed once, then only
    looked at)."""
    from hermes_acp.engine.skills import SkillLibrary

    home = b.home()
    for n in range(SKILLS):
        folder = Path(home) / "skills" / f"group-{n % 5}" / f"skill-{n}"
        (folder / "references").mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: skill-{n}\ndescription: Skill number {n}. Use when the "
                                         f"task is number {n}.\n---\n" + "A step of the skill.\n" * 100)
    agent = await b.ready(home)
    samples = []
    for n in range(b.runs.turns):
        sessionId = await b.warmSession(agent)
        samples.append((await agent.prompt(sessionId, f"[notool] turn {n}"))[0])
    await b.close(agent)
    library = SkillLibrary(str(Path(home) / "skills"))
    library.catalog(b.workspace)
    reads = []
    for _ in range(b.runs.turns * 10):
        started = time.perf_counter()
        library.catalog(b.workspace)
        reads.append(time.perf_counter() - started)
    return [Result(f"no-tool turn with {SKILLS} skills", samples, "ms", 0.020, "≤ 20 ms",
                   "as the no-tool turn, with the skills listed in the system prompt and as commands"),
            Result(f"reading {SKILLS} unchanged skills", reads, "ms",
                   note="one `SkillLibrary.catalog`, in-process: what a turn does at its start (and at its end after a tool call)")]


async def caseTools(b: Bench) -> list[Result]:
    agent = await b.ready()
    samples = []
    for n in range(b.runs.toolTurns):
        sessionId = await b.warmSession(agent)
        before = len(agent.updates[sessionId])
        samples.append((await agent.prompt(sessionId, f"[tools] turn {n}"))[0])
        calls = [u for u in agent.updates[sessionId][before:] if u["sessionUpdate"] == "tool_call"]
        if len(calls) != TOOL_CALLS:
            raise BenchError(f"a tool turn showed {len(calls)} tool calls, not {TOOL_CALLS}")
    await b.close(agent)
    return [Result(f"{TOOL_CALLS}-tool turn", samples, "ms",
                   note=f"{TOOL_CALLS} sequential `read_file` calls, {TOOL_CALLS + 1} model requests; the session's second turn")]


async def caseBackground(b: Bench) -> list[Result]:
    """Turns that each start a background process (a fresh session each: at most 8 run in one).
    The agent's exit ends them."""
    agent = await b.ready()
    samples = []
    for n in range(b.runs.toolTurns):
        sessionId = await b.warmSession(agent)
        before = len(agent.updates[sessionId])
        samples.append((await agent.prompt(sessionId, f"[background] turn {n}"))[0])
        cards = [u for u in agent.updates[sessionId][before:] if u.get("status") == "in_progress"
                 and "background" in json.dumps(u.get("_meta", {}))]
        if not cards:
            raise BenchError("a background turn showed no background card")
    await b.close(agent)
    return [Result("turn starting a background process", samples, "ms",
                   note="`terminal(background=true)` `sleep 60`, 2 model requests; its card stays in progress")]


async def caseDelegate(b: Bench) -> list[Result]:
    """A turn that delegates one task (three model requests: the parent's, the child's, the
    parent's answer) against a turn of three model requests with two reads between them, in
    alternating pairs: what a delegated task costs beyond its model time (a child agent, its
    thread and slot, its events, its card and its journal). And three tasks in parallel."""
    agent = await b.ready()
    delegated, reads, three = [], [], []
    for n in range(b.runs.toolTurns):
        sessionId = await b.warmSession(agent)
        delegated.append((await agent.prompt(sessionId, f"[delegate] turn {n}"))[0])
        sessionId = await b.warmSession(agent)
        reads.append((await agent.prompt(sessionId, f"[tworeads] turn {n}"))[0])
        sessionId = await b.warmSession(agent)
        before = len(agent.updates[sessionId])
        three.append((await agent.prompt(sessionId, f"[delegate3] turn {n}"))[0])
        ended = [u for u in agent.updates[sessionId][before:] if u.get("status") == "completed"]
        if len(ended) != 4:  # three children's cards and the delegate_task card
            raise BenchError(f"a turn delegating three tasks completed {len(ended)} cards, not 4")
    await b.close(agent)
    return [
        Result("turn delegating 1 task", delegated, "ms",
               note="3 model requests: the parent's, the child's (one delta), the parent's answer"),
        Result("turn of 3 model requests, 2 `read_file` calls", reads, "ms", note="the same requests without a child"),
        Result("cost of a delegated task beyond its model time", [d - r for d, r in zip(delegated, reads)], "ms",
               note="per pair: delegated turn − the turn of reads"),
        Result("turn delegating 3 tasks", three, "ms", note="3 children in parallel, one request each"),
    ]


async def caseSandbox(b: Bench) -> list[Result]:
    """Turns of ten `true` commands, with the sandbox and with it off (where `true`,
    a known read-only command, runs unasked too), in alternating agents; the
    difference per command is what the sandbox costs."""
    from hermes_acp.engine.sandbox import probe

    support = probe()
    if not support.available:
        return [Result("command in the sandbox", [0.0], "ms", note=f"skipped: {support.reason}")]
    perCommand: dict[str, list[float]] = {"auto": [], "off": []}
    for n in range(b.runs.toolTurns):
        for setting in ("auto", "off"):
            agent = await b.ready(HERMES_ACP_SANDBOX=setting)
            sessionId = await b.warmSession(agent)
            await agent.prompt(sessionId, "[commands] warm the sandbox")
            elapsed, _ = await agent.prompt(sessionId, f"[commands] turn {n}")
            perCommand[setting].append(elapsed / COMMANDS)
            await b.close(agent)
    added = [on - off for on, off in zip(perCommand["auto"], perCommand["off"], strict=True)]
    plain, confined = spawnPairs(Path(b.workspace), 20 * b.runs.toolTurns)
    return [
        Result("start and wait for `/bin/true`, no sandbox", plain, "ms",
               note="`engine.processes.spawn` in the bench process (the floor)"),
        Result("start and wait for `/bin/true` in the sandbox", confined, "ms",
               note="the same, through the policy's spawner thread"),
        Result("what the sandbox adds to starting a process", [c - p for c, p in zip(confined, plain, strict=True)],
               "ms", 0.005, "≤ 5 ms", "per alternating pair"),
        Result("`terminal` call, sandbox off", perCommand["off"], "ms",
               note=f"turn of {COMMANDS} `true` commands ÷ {COMMANDS} (a model request each)"),
        Result("`terminal` call in the Landlock sandbox", perCommand["auto"], "ms",
               note=f"the same turn with HERMES_ACP_SANDBOX=auto (ABI {support.abi})"),
        Result("what the sandbox adds to a command", added, "ms", 0.005, "≤ 5 ms",
               "per alternating pair of agents: sandboxed − off"),
    ]


def spawnPairs(workspace: Path, runs: int) -> tuple[list[float], list[float]]:
    """Seconds to start and reap `/bin/true`, without and with the session's sandbox, alternating."""
    import os
    import subprocess

    from hermes_acp.engine import processes
    from hermes_acp.engine.sandbox import policyFor

    policy = policyFor([str(workspace)])

    def once(policy: Any) -> float:
        started = time.perf_counter()
        process, _ = processes.spawn(["/bin/true"], str(workspace), dict(os.environ), policy,
                                     stdout=subprocess.DEVNULL)
        process.wait(30)
        processes.release(process)
        return time.perf_counter() - started

    once(policy)  # the spawner thread confines itself once
    plain, confined = [], []
    for _ in range(runs):
        plain.append(once(None))
        confined.append(once(policy))
    return plain, confined


#: The pages ``web_extract`` is measured on: the fixtures of its tests (``tests/data/web``).
WEB_PAGES = Path(__file__).resolve().parent.parent / "tests" / "data" / "web"


def extractTimes(runs: int) -> list[tuple[str, list[float]]]:
    """Seconds to turn each fixture page into what the model reads (``webextract.extract``:
    trafilatura for HTML, pypdf for the PDF), in this process, after a first warm-up run."""
    from hermes_acp.engine.tools.webextract import extract
    from hermes_acp.engine.webfetch import Page
    from tests.web_server import bigPage

    pages = [(path.name, path.read_bytes(), "application/pdf" if path.suffix == ".pdf" else "text/html")
             for path in sorted(WEB_PAGES.iterdir()) if path.suffix in (".html", ".pdf")]
    pages.append(("the 5 MB page of the tests", bigPage(), "text/html"))
    timed = []
    for name, body, kind in pages:
        page = Page("https://example.org/page", kind, "utf-8" if kind == "text/html" else None, body, False)
        extract(page)
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            extract(page)
            samples.append(time.perf_counter() - started)
        timed.append((f"{name} ({len(body) // 1024} KB)", samples))
    return timed


async def caseExtract(b: Bench) -> list[Result]:
    """``web_extract``'s work on each fixture page, and what its libraries cost to import (in a
    fresh process: the first web_extract of a session pays it, nothing else does)."""
    rows = []
    for module in ("trafilatura", "pypdf"):
        samples = []
        for _ in range(max(3, b.runs.spawns // 2)):
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", f"import {module}")
            if await asyncio.wait_for(process.wait(), 60) != 0:
                raise BenchError(f"python -c 'import {module}' failed")
            samples.append(time.perf_counter() - started)
        floor = []
        for _ in range(len(samples)):
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
            await asyncio.wait_for(process.wait(), 60)
            floor.append(time.perf_counter() - started)
        extra = [max(0.0, sample - statistics.median(floor)) for sample in samples]
        rows.append(Result(f"web_extract: import {module} (a fresh process, less `python -c pass`)", extra, "ms"))
    for name, samples in await asyncio.to_thread(extractTimes, max(3, b.runs.toolTurns)):
        rows.append(Result(f"web_extract: extract {name}", samples, "ms"))
    return rows


async def caseStream(b: Bench) -> list[Result]:
    agent = await b.ready()
    samples, chunks = [], []
    for n in range(b.runs.streams):
        sessionId = await b.warmSession(agent)
        before = len(agent.updates[sessionId])
        samples.append((await agent.prompt(sessionId, f"[stream] run {n}"))[0])
        texts = [u["content"]["text"] for u in agent.updates[sessionId][before:] if u["sessionUpdate"] == "agent_message_chunk"]
        if sum(map(len, texts)) != STREAM_CHARS:
            raise BenchError(f"the stream delivered {sum(map(len, texts))} characters, not {STREAM_CHARS}")
        chunks.append(len(texts))
    await b.close(agent)
    return [Result(f"{STREAM_CHARS // 1000} KB answer in {STREAM_DELTAS:,} deltas", samples, "s", 0.3, "≤ 0.3 s",
                   f"arrived as {min(chunks)}–{max(chunks)} `agent_message_chunk` updates; warm session")]


def _cpuSeconds(pid: int) -> float:
    """CPU time of a process so far, all its threads (ended ones too), to the nanosecond: the
    kernel's CPU clock of that process, whose id (``clock_getcpuclockid``, which Python does
    not offer) is the pid's complement shifted left by three, with 2 (the scheduler's clock).
    Where that clock cannot be read, ``/proc/<pid>/stat``'s user + system time, in ticks."""
    import os

    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _frame(text: str, n: int) -> dict[str, Any]:
    """The ``session/update`` a streamed text becomes (the floors' frame)."""
    return {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "0" * 32, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}, "messageId": f"turn-{n}-1"}}}


def frameFloor(runs: int = 2000, receive: Callable[[], bytes] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of the floor of one streamed frame, in this process: parse one SSE event of
    the paced stream, encode the ``session/update`` it becomes, and write it (to /dev/null).
    With ``receive``, each event is what it returns, and its wait counts (``pacedFrameFloor``)."""
    from hermes_acp import safejson

    warm = PACED_EVENT.rstrip()
    fd = os.open(os.devnull, os.O_WRONLY)
    samples = []
    try:
        for n in range(runs):
            started = clock()
            event = warm if receive is None else receive()
            text = json.loads(event[6:])["choices"][0]["delta"]["content"]
            os.write(fd, safejson.encode(_frame(text, n)) + b"\n")
            samples.append(clock() - started)
    finally:
        os.close(fd)
    return samples


def deltaFloor(frames: int, runs: int = 5) -> list[float]:
    """CPU seconds per delta of the floor of the ``[stream]`` answer: parse each of its
    ``STREAM_DELTAS`` events and write their text as ``frames`` frames (encoded, to
    /dev/null), as the agent showed it; one sample per run of the whole answer."""
    from hermes_acp import safejson

    data = STREAM_EVENT * STREAM_DELTAS
    every = -(-STREAM_DELTAS // max(1, frames))
    fd = os.open(os.devnull, os.O_WRONLY)
    samples = []
    try:
        for _ in range(runs):
            started = time.thread_time()
            texts: list[str] = []
            for n, event in enumerate(data.split(b"\n\n")[:-1], 1):
                texts.append(json.loads(event[6:])["choices"][0]["delta"]["content"])
                if n % every == 0 or n == STREAM_DELTAS:
                    os.write(fd, safejson.encode(_frame("".join(texts), n)) + b"\n")
                    texts = []
            samples.append((time.thread_time() - started) / STREAM_DELTAS)
    finally:
        os.close(fd)
    return samples


def pacedFrameFloor(count: int = PACED_DELTAS, pace: float = PACE, readEvery: float | None = None,
                    work: bool = True) -> list[float]:
    """CPU seconds of ``frameFloor``'s work for each event of a stream paced as the row's is
    (one every ``pace`` seconds), in one thread that waits for each with a blocking ``recv``
    (``time.thread_time``: that thread's CPU). ``frameFloor`` runs its work back to back,
    warm; a paced stream pays a thread's wake-up and cold caches for every event, whatever
    the design, and this says how much that costs on the machine at hand. With ``readEvery``,
    the thread sleeps that long before each read and takes every event that came meanwhile:
    a wake-up per batch, what holding a stream's reads back would buy. Without ``work``, the
    thread only waits for each event: the wake-up's own cost."""
    import socket
    import threading

    ours, theirs = socket.socketpair()

    def send() -> None:
        for _ in range(count):
            theirs.sendall(PACED_EVENT)
            time.sleep(pace)

    sender = threading.Thread(target=send, daemon=True)
    pending: list[bytes] = []

    def receive() -> bytes:
        """The next event: a late thread may find two in one ``recv`` (the second then waits
        for no wake-up, as in a stream read behind its pace)."""
        while not pending or not pending[-1].endswith(b"\n\n"):
            if readEvery is not None:
                time.sleep(readEvery)
            data = ours.recv(1 << 20)
            if not data:
                raise BenchError("the paced floor's sender stopped early")
            pending.append(data)
        events = b"".join(pending).split(b"\n\n")
        pending[:] = [event + b"\n\n" for event in events[1:-1]]
        return events[0]

    def waits() -> list[float]:
        samples = []
        for _ in range(count):
            started = time.thread_time()
            receive()
            samples.append(time.thread_time() - started)
        return samples

    try:
        ours.settimeout(10)
        sender.start()
        return frameFloor(count, receive, time.thread_time) if work else waits()
    finally:
        sender.join(10)
        ours.close()
        theirs.close()


async def caseFrames(b: Bench) -> list[Result]:
    """What one streamed ``session/update`` frame costs the agent in CPU: a turn whose model
    streams ``PACED_DELTAS`` deltas at a steady pace (each its own frame), less a no-tool turn,
    per frame; against the floor of the same frame (``frameFloor``). And what a delta costs
    when they come faster than the agent's batching window (the ``[stream]`` answer: frames
    are batches), against the floor of the same deltas and frames (``deltaFloor``)."""
    agent = await b.ready()
    sessionId = await b.warmSession(agent)
    perFrame, frames, perDelta, batches = [], [], [], []

    async def cpuOf(prompt: str) -> tuple[float, list[dict[str, Any]]]:
        before, cpu = len(agent.updates[sessionId]), _cpuSeconds(agent.pid)
        await agent.prompt(sessionId, prompt)
        chunks = [u for u in agent.updates[sessionId][before:] if u["sessionUpdate"] == "agent_message_chunk"]
        return _cpuSeconds(agent.pid) - cpu, chunks

    paced: list[float] = []  # the paced floor's median per event, measured beside each paced turn
    for n in range(b.runs.streams + 1):
        plain, _ = await cpuOf(f"[notool] baseline {n}")
        pacedTurn, chunks = await cpuOf(f"[paced] run {n}")
        if sum(len(u["content"]["text"]) for u in chunks) != PACED_DELTAS * 1000:
            raise BenchError("the paced stream did not arrive whole")
        fast, fastChunks = await cpuOf(f"[stream] run {n}")
        if sum(len(u["content"]["text"]) for u in fastChunks) != STREAM_CHARS:
            raise BenchError("the fast stream did not arrive whole")
        if n:  # the first is a warm-up
            perFrame.append(max(0.0, pacedTurn - plain) / len(chunks))
            frames.append(len(chunks))
            perDelta.append(max(0.0, fast - plain) / STREAM_DELTAS)
            batches.append(len(fastChunks))
            # The floor of the same work, paced alike, right after the turn: each ratio compares
            # a turn with the machine as it was then (a paced floor swings from run to run).
            paced.append(statistics.median(await asyncio.to_thread(pacedFrameFloor)))
    await b.close(agent)
    floor = await asyncio.to_thread(frameFloor)
    ratio = [sample / statistics.median(floor) for sample in perFrame]
    wakes = await asyncio.to_thread(pacedFrameFloor, work=False)
    batched = await asyncio.to_thread(pacedFrameFloor, readEvery=BATCHED_READS)
    shown = round(statistics.median(batches))  # the frames a fast stream's answer came in
    deltas = await asyncio.to_thread(deltaFloor, shown)
    return [
        Result("floor of a frame: parse an SSE event, encode its update, write it", floor, "µs",
               note="in the bench process; the 1,000-character delta of the row below"),
        Result("agent CPU per streamed `session/update` frame", perFrame, "µs",
               note=f"{PACED_DELTAS:,} deltas of 1,000 characters, one every {PACE * 1000:g} ms, arrived as "
                    f"{min(frames)}–{max(frames)} frames; process CPU of the turn less a no-tool turn's, per frame"),
        Result("agent CPU per frame ÷ the floor", ratio, "ratio",
               note="the warm floor, its work done back to back: a paced stream pays a wake-up and cold caches "
                    "for each frame, which no design that shows a delta as it comes avoids (docs/performance.md)"),
        Result("the floor's work paced as the stream: one thread waits for each event", paced, "µs",
               note=f"in the bench process, after each paced turn; one event every {PACE * 1000:g} ms, CPU of the "
                    "thread per event (the wake-ups and cold caches any design pays): the floor of the same work as it "
                    "comes"),
        Result("agent CPU per frame ÷ the paced floor", [turn / floorThen for turn, floorThen in zip(perFrame, paced)],
               "ratio", 5.0, "≤ 5", "issue 27 §2: a frame against the floor of the same work, paced as the stream"),
        Result("a paced wake-up alone: the same thread, without the floor's work", wakes, "µs",
               note="CPU of the thread per event; the paced floor less this is the floor's work run cold, "
                    f"{_ratio(paced, floor, 'floor')} with its wake-up"),
        Result(f"the same paced floor, its reads {BATCHED_READS * 1000:g} ms apart", [statistics.fmean(batched)], "µs",
               note=f"{_ratio([statistics.fmean(batched)], floor, 'floor')}: CPU per event with a wake-up per "
                    f"{BATCHED_READS / PACE:.0f} or so events: what holding a stream's reads back buys, even in one "
                    "thread with no hop"),
        Result("floor of a delta of a fast stream: parse its event, write the frames", deltas, "µs",
               note=f"the {STREAM_DELTAS:,} events of the row below parsed, their text written as "
                    f"{shown} frames (to /dev/null), per delta; in the bench process"),
        Result("agent CPU per delta of a fast stream", perDelta, "µs",
               note=f"{STREAM_DELTAS:,} deltas of {len(STREAM_DELTA)} characters sent at once, arrived as "
                    f"{min(batches)}–{max(batches)} frames; process CPU of the turn less a no-tool turn's, per delta"),
        Result("agent CPU per delta of a fast stream ÷ its floor", [sample / statistics.median(deltas) for sample in perDelta],
               "ratio", 5.0, "≤ 5", "issue 27 §2 where deltas come faster than a frame a window"),
    ]


def requestCosts(url: str, workspace: str, size: int, runs: int) -> tuple[list[float], list[float], list[float]]:
    """In this process, an engine session with ``size`` messages of history (``size // 4`` turns
    of a request, a ``read_file`` call, its 1.5 KB result and an answer) and no compaction: the
    CPU of the agent's thread for each of ``runs`` one-request turns (each continuing the
    session), their wall time, and the time of one ``json.dumps`` of each request's body."""
    from hermes_acp.config import Endpoint
    from hermes_acp.engine.agent import AIAgent
    from hermes_acp.engine.model import ModelClient
    from tests.observers import RecordingObserver

    bodies: list[bytes] = []

    class Recording(ModelClient):
        def _stream(self, request: bytes, *args: Any) -> Any:
            bodies.append(request)
            return super()._stream(request, *args)

    result = "".join(f"{n:4d}  a line of the file that was read, as the model sees it\n" for n in range(25))
    history: list[dict[str, Any]] = []
    for n in range(size // 4):
        history += [
            {"role": "user", "content": f"turn {n}: please read notes.txt and tell me what line {n} says"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": "notes.txt", "offset": n})}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "read_file", "content": result},
            {"role": "assistant", "content": f"Line {n} says: a line of the file that was read, as the model sees it."},
        ]
    endpoint = Endpoint("custom", url, "bench-key", "scripted-model")
    agent = AIAgent(endpoint, workspace, client=Recording(endpoint))
    cpu, wall, floor = [], [], []
    for n in range(runs + 1):
        bodies.clear()
        started, startedCPU = time.perf_counter(), time.thread_time()
        outcome = agent.run_conversation(f"[notool] request {n}", history, RecordingObserver())
        elapsedCPU, elapsed = time.thread_time() - startedCPU, time.perf_counter() - started
        if outcome.failure is not None or len(bodies) != 1:
            raise BenchError(f"the {size}-message turn failed: {outcome.failure}")
        history = history + list(outcome.messages)
        body = json.loads(bodies[0]) if isinstance(bodies[0], bytes) else bodies[0]  # (a dict before issue 27)
        dumped = float("inf")
        for _ in range(3):  # on the same clock as the agent's, the best of three
            started = time.thread_time()
            json.dumps(body, ensure_ascii=False, separators=(",", ":"))
            dumped = min(dumped, time.thread_time() - started)
        if n:  # the first turn measures the loaded history once
            cpu.append(elapsedCPU)
            wall.append(elapsed)
            floor.append(dumped)
    return cpu, wall, floor


async def caseRequest(b: Bench) -> list[Result]:
    """What a model request costs the agent as the history grows (issue 27 §1): the agent's
    CPU for a one-request turn against one ``json.dumps`` of that request's body."""
    rows = []
    for size in HISTORY_SIZES:
        cpu, wall, floor = await asyncio.to_thread(requestCosts, b.server.url, b.workspace, size, max(3, b.runs.turns))
        ratio = [c / f for c, f in zip(cpu, floor)]
        rows += [
            Result(f"one `json.dumps` of a request with {size:,} messages", floor, "ms",
                   note="the floor: the request's body, compact"),
            Result(f"agent CPU of a turn with {size:,} messages of history", cpu, "ms",
                   note=f"{size // 4:,} earlier turns, no compaction; one model request; the engine's thread, in "
                        f"the bench process (wall {statistics.median(wall) * 1000:.1f} ms)"),
            Result(f"agent CPU ÷ one `json.dumps`, {size:,} messages", ratio, "ratio", 1.5, "≤ 1.5", "issue 27 §1"),
        ]
    return rows


async def concurrentTurns(b: Bench, width: int, **extra: str) -> list[float]:
    """``width`` sessions of one process prompt at once; seconds until the last answer."""
    agent = await b.ready(**extra)
    sessions = list(await asyncio.gather(*(b.warmSession(agent) for _ in range(width))))
    samples = []
    for n in range(b.runs.concurrent):
        sent = [agent.sendPrompt(sessionId, f"[second] session {k} run {n}") for k, sessionId in enumerate(sessions)]
        answers = await asyncio.gather(*(agent.answer("session/prompt", future) for _, future in sent))
        if any(result.get("stopReason") != "end_turn" for _, result in answers):
            raise BenchError(f"a {width}-way turn did not end with end_turn")
        samples.append(max(answered for answered, _ in answers) - sent[0][0])
    await b.close(agent)
    return samples


async def caseConcurrent(b: Bench) -> list[Result]:
    results = [
        Result("8 concurrent one-second turns", await concurrentTurns(b, 8), "s", 1.3, "≤ 1.3 s",
               "8 sessions, one process; until the last answer"),
        Result("32 concurrent one-second turns", await concurrentTurns(b, 32), "s", 1.5, "≤ 1.5 s",
               "32 sessions, one process, default worker pool (HERMES_ACP_THREADS)"),
    ]
    if b.runs.diagnostics:
        results.append(Result("32 concurrent one-second turns, HERMES_ACP_THREADS=32",
                              await concurrentTurns(b, 32, HERMES_ACP_THREADS="32"), "s", 1.5, "≤ 1.5 s",
                              "diagnostic (not in --quick): the same with a 32-thread pool"))
    return results


@contextlib.contextmanager
def collectorHeldOff() -> Any:
    """The bench process's own garbage collector held off for a timed window, and run after
    it: with 200 sessions' client state (and the scripted model's), one of its full passes took
    60–190 ms, and one inside a window was timed as the agent's."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


async def caseScale(b: Bench) -> list[Result]:
    """Issue 27: ``SCALE_SESSIONS`` sessions of one process at once, against one session alone.

    One one-second turn alone is the floor of the same turns all at once. Then every session
    streams without end (``[trickle]``) and one is cancelled, then all the others at once."""
    agent = await b.ready()
    sessions = []
    for _ in range(SCALE_SESSIONS):
        sessions.append(await b.warmSession(agent))
    alone, together, one, every = [], [], [], []
    rssBefore = await settledRSS(agent)
    for n in range(b.runs.concurrent):
        alone.append((await agent.prompt(sessions[0], f"[second] alone {n}"))[0])
        with collectorHeldOff():
            sent = [agent.sendPrompt(sessionId, f"[second] session {k} run {n}") for k, sessionId in enumerate(sessions)]
            answers = await asyncio.gather(*(agent.answer("session/prompt", future, 60) for _, future in sent))
        if any(result.get("stopReason") != "end_turn" for _, result in answers):
            raise BenchError(f"a {SCALE_SESSIONS}-way turn did not end with end_turn")
        together.append(max(answered for answered, _ in answers) - sent[0][0])
    threads = len(os.listdir(f"/proc/{agent.pid}/task"))
    grown = (await settledRSS(agent) - rssBefore) / MiB
    for n in range(b.runs.concurrent):
        arrived = [b.server.nextRequest(f"[trickle] session {k} run {n}") for k in range(SCALE_SESSIONS)]
        sent = [agent.sendPrompt(sessionId, f"[trickle] session {k} run {n}") for k, sessionId in enumerate(sessions)]
        await asyncio.wait_for(asyncio.gather(*arrived), 60)
        await asyncio.sleep(0.5)  # every session is streaming
        with collectorHeldOff():
            cancelled = agent.notify("session/cancel", {"sessionId": sessions[0]})
            answered, result = await agent.answer("session/prompt", sent[0][1], 30)
        if result.get("stopReason") != "cancelled":
            raise BenchError(f"a cancelled turn ended with {result.get('stopReason')!r}")
        one.append(answered - cancelled)
        with collectorHeldOff():
            first = time.perf_counter()
            for sessionId in sessions[1:]:
                agent.notify("session/cancel", {"sessionId": sessionId})
            answers = await asyncio.gather(*(agent.answer("session/prompt", future, 60) for _, future in sent[1:]))
        if any(result.get("stopReason") != "cancelled" for _, result in answers):
            raise BenchError("a cancelled turn did not end with cancelled")
        every.append(max(answered for answered, _ in answers) - first)
    await b.close(agent)
    width = SCALE_SESSIONS
    return [
        Result("one one-second turn alone", alone, "s", note=f"the floor of the next row: one of its {width} sessions"),
        Result(f"{width} concurrent one-second turns", together, "s", 2 * statistics.median(alone), "≤ 2 × alone",
               _ratio(together, alone, "alone") + f"; {width} sessions, one process, default settings; "
               f"then {threads} threads, RSS {grown:+.1f} MiB"),
        Result(f"cancel latency with {width} sessions streaming", one, "ms", 0.1, "≤ 100 ms",
               f"each session's model streams 1 KB every {TRICKLE_EVERY:g} s; one is cancelled"),
        Result(f"cancel of the other {width - 1} streaming sessions", every, "ms", 0.1, "≤ 100 ms",
               "all cancels written at once; until the last `cancelled`"),
    ]


def fillStore(home: str, workspace: str) -> tuple[str, int]:
    """In the bench process: ``STORE_SESSIONS`` short sessions, and one of ``LONG_TURNS``
    turns written as the agent writes them, through the store's and the renderer's own code:
    a prompt, a ``read_file`` call whose result (TOOL_RESULT bytes of numbered lines, as the
    tool gives them) goes to the model and into the card (its content and ``rawOutput``), an
    answer; their six updates, each journaled as the text it was sent as. The long session's
    id and the bytes of its text."""
    from hermes_acp import safejson
    from hermes_acp.render import Renderer
    from hermes_acp.store import SessionDB, SessionRecord

    words = "the parser reads tokens and the lexer splits lines into words for the grammar"
    result = "\n".join(f"{n:6d}|line {n}: {words}" for n in range(1, 200))[:TOOL_RESULT]
    renderer = Renderer(workspace)
    longId, text = "long-session", 0
    with SessionDB(Path(home) / "state.db") as db:
        with db.batch():
            for n in range(STORE_SESSIONS):
                sessionId = f"other-{n}"
                db.createSession(SessionRecord(sessionId=sessionId, cwd=f"{workspace}/p{n % 50}"))
                db.appendMessages(sessionId, [{"role": "user", "content": f"question {n}: {words}"},
                                              {"role": "assistant", "content": f"answer {n}: parser tokens {words}"}])
        db.createSession(SessionRecord(sessionId=longId, cwd=workspace))
        for turn in range(1, LONG_TURNS + 1):
            call, args = f"call{turn}", {"path": "notes.txt", "offset": 1, "limit": 500}
            messages = [
                {"role": "user", "content": f"turn {turn}: read the notes again"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function", "function": {
                    "name": "read_file", "arguments": json.dumps({"path": "notes.txt"})}}]},
                {"role": "tool", "tool_call_id": call, "name": "read_file", "content": result},
                {"role": "assistant", "content": f"The notes say the same as before, turn {turn}."},
            ]
            extras = {"path": f"{workspace}/notes.txt", "totalLines": 199, "startLine": 1, "endLine": 199}
            updates = [
                {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": messages[0]["content"]}},
                renderer.toolStarted(f"card{turn}", "read_file", args),
                {"sessionUpdate": "tool_call_update", "toolCallId": f"card{turn}", "status": "in_progress"},
                renderer.toolFinished(f"card{turn}", "read_file", args, result, False, extras),
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": messages[3]["content"]}},
                {"sessionUpdate": "usage_update", "used": 1000 + turn, "size": 128000},
            ]
            text += sum(len(m["content"] or "") for m in messages) + len(json.dumps(messages[1]["tool_calls"]))
            db.beginTurn(longId)
            db.appendUpdates(longId, turn, [safejson.Encoded(u, safejson.encode(u)) for u in updates])
            db.endTurn(longId, turn, messages)
            while getattr(db, "linkChunks", lambda: False)():  # what the agent does once idle
                pass
    return longId, text


#: What an agent sends after a ``session/load``'s answer (the store bench compares the replays without them).
LIVE_AFTER_LOAD = frozenset({"available_commands_update", "usage_update"})


def replayFloor(path: Path, sessionId: str) -> tuple[float, float]:
    """Select a session's journal and write each row's text in a frame, to /dev/null: the
    least a ``session/load`` can do. The rows' text as the schema gives it: a row that
    refers to the message holding the tool output it shows gets it back in SQL. Returns its
    seconds and the CPU seconds of the thread that did it."""
    import sqlite3

    try:
        from hermes_acp.migrations import JOURNAL_TEXT
    except ImportError:  # a store from before the references (to compare with)
        JOURNAL_TEXT = "j.payload"

    started, cpu = time.perf_counter(), time.thread_time()
    connection = sqlite3.connect(path)
    with open("/dev/null", "w") as out:
        for (payload,) in connection.execute(
                f"SELECT {JOURNAL_TEXT} FROM acp_journal AS j WHERE j.session_id = ? ORDER BY j.seq", (sessionId,)):
            out.write(f'{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{sessionId}",'
                      f'"update":{payload}}}}}\n')
    connection.close()
    return time.perf_counter() - started, time.thread_time() - cpu


async def caseStore(b: Bench) -> list[Result]:
    """Issue 27: a turn while another session searches a big store; loading a long session;
    what that session takes on disk."""
    home = b.home()
    longId, text = await asyncio.to_thread(fillStore, home, b.workspace)
    agent = await b.ready(home)
    quiet = await b.warmSession(agent)
    searcher = await b.warmSession(agent)
    # Idle before and after the searches: each turn adds to the session's history, and a
    # turn costs more the longer it is, so the idle turns bracket the history of the busy ones.
    idle = [(await agent.prompt(quiet, f"[notool] idle {n}"))[0] for n in range(b.runs.turns)]
    busy = []
    for n in range(b.runs.concurrent):
        _, searching = agent.sendPrompt(searcher, f"[searching] run {n}")
        await asyncio.sleep(0.2)
        while not searching.done() and len(busy) < 400:
            busy.append((await agent.prompt(quiet, f"[notool] beside the searches {n}"))[0])
        await agent.answer("session/prompt", searching, 120)
    idle += [(await agent.prompt(quiet, f"[notool] idle after {n}"))[0] for n in range(b.runs.turns)]
    await b.close(agent)
    db = Path(home) / "state.db"
    loads, floors, piped, grown, loadCPU, floorCPU = [], [], [], [], [], []
    load = {"sessionId": longId, "cwd": b.workspace, "mcpServers": []}
    for _ in range(b.runs.loads):
        seconds, cpu = await asyncio.to_thread(replayFloor, db, longId)
        floors.append(seconds)
        floorCPU.append(cpu)
        floor = await AgentProcess.spawn(dict(os.environ), args=(str(BENCH / "replay_floor.py"), str(db), longId),
                                         command=[sys.executable])
        piped.append((await floor.request("session/load", load))[0])
        await floor.close()
        agent = await b.ready(home)
        before, cpu = await settledRSS(agent), _cpuSeconds(agent.pid)
        elapsed, _ = await agent.request("session/load", load)
        loadCPU.append(_cpuSeconds(agent.pid) - cpu)
        loads.append(elapsed)
        grown.append(await settledRSS(agent) - before)
        # The agent's commands and usage after the load's answer are live, not replayed (the floor sends neither).
        replayed, journal = (len([u for u in process.updates[longId] if u["sessionUpdate"] not in LIVE_AFTER_LOAD])
                             for process in (agent, floor))
        if replayed != journal:
            raise BenchError(f"the load replayed {replayed} updates, the journal holds {journal}")
        await b.close(agent)
    import sqlite3

    connection = sqlite3.connect(db)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    # What the long session takes: the file less what the other sessions take (measured on
    # their own: the same file with the long session deleted, vacuumed).
    copy = Path(home) / "without-long.db"
    shutil.copy(db, copy)
    connection = sqlite3.connect(copy)
    connection.execute("PRAGMA foreign_keys = ON")
    for table in ("acp_journal", "acp_messages", "acp_turns", "acp_sessions"):
        connection.execute(f"DELETE FROM {table} WHERE session_id = ?", (longId,))
    connection.commit()
    connection.execute("VACUUM")
    connection.close()
    connection = sqlite3.connect(db)
    connection.execute("VACUUM")
    connection.close()
    used = db.stat().st_size - copy.stat().st_size
    return [
        Result("no-tool turn, store idle", idle, "ms", note=f"state.db holds {STORE_SESSIONS:,} other sessions"),
        Result(f"no-tool turn while another session searches {STORE_SESSIONS:,} sessions", busy, "ms",
               1.5 * statistics.median(idle), "≤ 1.5 × idle",
               _ratio(busy, idle, "idle") + f"; the other session's turn calls `session_search` {SEARCHES} times"),
        Result(f"floor: select a {LONG_TURNS:,}-turn journal and write its text", floors, "s",
               note="in the bench process, to /dev/null"),
        Result("floor: the same, through the editor's pipe", piped, "s",
               note="a process selecting the rows and writing their frames to stdout, read by the bench's client "
                    "(`bench/replay_floor.py`), from the request to its answer"),
        Result(f"`session/load` of a {LONG_TURNS:,}-turn session", loads, "s", 2 * statistics.median(piped),
               "≤ 2 × floor", _ratio(loads, piped, "floor through the pipe") + "; " + _ratio(loads, floors, "floor to /dev/null")
               + f"; each turn a {TOOL_RESULT // 1024} KB tool result; fresh process"),
        Result("agent CPU of that `session/load`", loadCPU, "s",
               note=_ratio(loadCPU, floorCPU, "/dev/null floor's CPU") + "; the agent's own work, without "
                    "the pipe and the client that reads it (process CPU from the request to its answer)"),
        Result(f"RSS growth of a `session/load` of {LONG_TURNS:,} turns", grown, "MiB", 8 * MiB, "≤ 8 MiB",
               "VmRSS after the load less before it"),
        Result(f"state.db of a {LONG_TURNS:,}-turn session / its text", [used / text], "ratio", 1.5, "≤ 1.5",
               f"{used / MiB:.1f} MiB on disk (vacuumed, less the other sessions) for {text / MiB:.1f} MiB of text"),
    ]


async def caseCancel(b: Bench) -> list[Result]:
    """Cancel latency against a stream that stalls and one that never ends, on an endpoint
    that frames its answers chunked (the run's server) and one whose answers end with the
    connection (HTTP/1.0; issue 22: the cancel used to wait for the whole answer)."""
    closing = await ModelServer.start({**SCRIPT, "framing": "close"})
    results = []
    try:
        for server, framing in ((b.server, "chunked"), (closing, "close-delimited")):
            agent = await b.spawn(server=server)
            await agent.initialize()
            _, sessionId = await agent.newSession(b.workspace)
            await agent.prompt(sessionId, "[short] warm up")
            for tag, stream in (("[stall]", "stalled mid-stream"),
                                ("[endless]", "streaming without end (1 KB deltas, 200 a second)"),
                                ("[flood]", "flooding without end (as fast as the agent reads)")):
                samples = []
                for n in range(b.runs.cancels):
                    text = f"{tag} run {n}"
                    arrived = server.nextRequest(text)
                    _, future = agent.sendPrompt(sessionId, text)
                    await asyncio.wait_for(arrived, 30)
                    await asyncio.sleep(CANCEL_SETTLE)
                    cancelled = agent.notify("session/cancel", {"sessionId": sessionId})
                    answered, result = await agent.answer("session/prompt", future, 30)
                    if result.get("stopReason") != "cancelled":
                        raise BenchError(f"a cancelled turn ended with {result.get('stopReason')!r}")
                    samples.append(answered - cancelled)
                results.append(Result(f"cancel latency (`session/cancel` → `cancelled`), {framing}, {stream}",
                                      samples, "ms", 0.5, "≤ 0.5 s",
                                      f"cancel sent {CANCEL_SETTLE:g} s after the model request arrived"))
            await b.close(agent)
    finally:
        await closing.stop()
    return results


async def caseLoad(b: Bench) -> list[Result]:
    home = b.home()
    agent = await b.ready(home)
    _, sessionId = await agent.newSession(b.workspace)
    started = time.perf_counter()
    building = [(await agent.prompt(sessionId, f"[short] turn {n}"))[0] for n in range(HISTORY_TURNS)]
    built = time.perf_counter() - started
    await b.close(agent)
    samples, replayed = [], []
    for _ in range(b.runs.loads):
        agent = await b.ready(home)
        elapsed, _ = await agent.request("session/load", {"sessionId": sessionId, "cwd": b.workspace, "mcpServers": []})
        samples.append(elapsed)
        replayed.append(len(agent.updates[sessionId]))
        await b.close(agent)
    if min(replayed) < 2 * HISTORY_TURNS:
        raise BenchError(f"session/load replayed only {min(replayed)} updates for {HISTORY_TURNS} turns")
    late = HISTORY_TURNS - LATE_TURNS
    return [
        Result(f"short turn with {late}–{HISTORY_TURNS - 1} turns of history", building[late:], "ms",
               note=f"the last {LATE_TURNS} of the turns that build the session below; compare the no-tool turn"),
        Result(f"`session/load` of a {HISTORY_TURNS}-turn session", samples, "s", 0.5, "≤ 0.5 s",
               f"fresh process; {max(replayed)} replayed updates before the answer; "
               f"built by {HISTORY_TURNS} real turns in {built:.1f} s"),
    ]


async def settledRSS(agent: AgentProcess, limit: float = 3.0) -> int:
    """VmRSS once it stops growing (background imports, journal writes), within ``limit`` seconds."""
    last, deadline = agent.rssBytes(), time.perf_counter() + limit
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.25)
        now = agent.rssBytes()
        if now == last:
            break
        last = now
    return last


async def caseRSS(b: Bench) -> list[Result]:
    idle, sessions, loaded = [], [], []
    for _ in range(b.runs.rss):
        agent = await b.ready()
        idle.append(await settledRSS(agent))
        created = [(await agent.newSession(b.workspace))[1] for _ in range(RSS_SESSIONS)]
        sessions.append(await settledRSS(agent))
        for n, sessionId in enumerate(created):
            await agent.prompt(sessionId, f"[short] session {n}")
        loaded.append(await settledRSS(agent))
        await b.close(agent)
    return [
        Result("RSS after `initialize`", idle, "MiB", note="VmRSS of the agent process"),
        Result(f"RSS with {RSS_SESSIONS} sessions before their first turn", sessions, "MiB",
               note=f"after {RSS_SESSIONS} × `session/new`"),
        Result(f"RSS with {RSS_SESSIONS} sessions", loaded, "MiB", 49 * MiB, "≤ 49 MiB",
               f"{RSS_SESSIONS} × `session/new`, then one short turn in each; VmRSS"),
    ]


def mcpServers(root: Path) -> list[dict[str, Any]]:
    """``MCP_SERVERS`` scripted stdio servers (the tests' own), each with a read-only echo."""
    from tests import mcp_scripted

    script = root / MCP_SCRIPT
    if not script.exists():
        script.write_text(json.dumps({"tools": [mcp_scripted.tool("echo", annotations={"readOnlyHint": True})]}))
    argv = mcp_scripted.stdioCommand(script)
    return [{"name": f"bench{n}", "command": argv[0], "args": argv[1:], "env": []} for n in range(MCP_SERVERS)]


async def caseMCP(b: Bench) -> list[Result]:
    """``session/new`` listing three stdio servers (they connect after the answer),
    and a turn of MCP calls against the same turn of built-in calls."""
    servers = mcpServers(b.root)
    trusted = ",".join(server["name"] for server in servers)  # read-only tools of trusted servers do not ask
    agent = await b.ready(HERMES_ACP_MCP_TRUSTED=trusted)
    await agent.newSession(b.workspace)  # the first one opens the database
    created = []
    for _ in range(b.runs.sessions):
        elapsed, result = await agent.request("session/new", {"cwd": b.workspace, "mcpServers": servers})
        created.append(elapsed)
        await asyncio.sleep(MCP_SETTLE)  # as a user would: the servers start meanwhile
        started = agent.childrenWith(str(b.root / MCP_SCRIPT))
        await agent.request("session/close", {"sessionId": result["sessionId"]})
        # The next session/new is timed once these servers are gone: their exits (the agent's
        # close answers before they end) would otherwise take the 2 cores from its answer.
        await agent.collected(started)
    builtin, mcp = [], []
    for n in range(b.runs.toolTurns):
        sessionId = await b.warmSession(agent)
        builtin.append((await agent.prompt(sessionId, f"[tools] turn {n}"))[0])
        _, result = await agent.request("session/new", {"cwd": b.workspace, "mcpServers": servers[:1]})
        mcpSession = result["sessionId"]
        await agent.prompt(mcpSession, "[short] warm up")  # waits for the handshake, builds the engine
        before = len(agent.updates[mcpSession])
        mcp.append((await agent.prompt(mcpSession, f"[mcptools] turn {n}"))[0])
        calls = [u for u in agent.updates[mcpSession][before:] if u["sessionUpdate"] == "tool_call"]
        if len(calls) != TOOL_CALLS or any(u.get("status") == "failed" for u in agent.updates[mcpSession][before:]):
            raise BenchError(f"an MCP turn showed {len(calls)} tool calls (or a failure), not {TOOL_CALLS} successes")
        await agent.request("session/close", {"sessionId": mcpSession})
    await b.close(agent)
    overhead = [(m - t) / TOOL_CALLS for m, t in zip(mcp, builtin)]
    return [
        Result(f"`session/new` with {MCP_SERVERS} stdio MCP servers", created, "ms", 0.050, "≤ 50 ms",
               f"servers start after the answer (closed {MCP_SETTLE:g} s later, gone before the next); warm process"),
        Result(f"{TOOL_CALLS}-call turn, MCP `echo`", mcp, "ms",
               note=f"{TOOL_CALLS} sequential calls of a scripted stdio server's tool"),
        Result(f"{TOOL_CALLS}-call turn, built-in `read_file`", builtin, "ms", note="the same turn with a built-in tool"),
        Result("MCP call overhead over a built-in call", overhead, "ms",
               note=f"(MCP turn − built-in turn) / {TOOL_CALLS}, per pair of runs"),
    ]


async def caseCompaction(b: Bench) -> list[Result]:
    """A long session on a small-window model: every turn reads a 12 KB file. The engine's
    own log gives each compaction's kind, tokens before and after, and its time; the client
    times the turns with a compaction against those without."""
    script = {"repeat": True, "window": COMPACTION_WINDOW, "windows": {"scripted-model": COMPACTION_WINDOW},
              "default": [[{"tool_calls": [{"id": "big", "name": "read_file", "arguments": {"path": "big.txt"}}]}],
                          [{"text": "Read big.txt."}]]}
    server = await ModelServer.start(script)
    big = Path(b.workspace) / "big.txt"
    big.write_text("".join(f"{n:05d} " + "v" * 73 + "\n" for n in range(COMPACTION_FILE // 80)))
    home = b.home()
    try:
        agent = await b.spawn(home, server, args=("--log-level", "debug"))  # a routine compaction's line is at debug
        await agent.initialize()
        _, sessionId = await agent.newSession(b.workspace)
        plain, compacting = [], []
        for n in range(b.runs.longTurns):
            before = len(agent.updates[sessionId])
            elapsed = (await agent.prompt(sessionId, f"turn {n}: read big.txt"))[0]
            shown = [u for u in agent.updates[sessionId][before:] if u.get("title") == "Compact conversation"]
            (compacting if shown else plain).append(elapsed)
        await b.close(agent)
    finally:
        await server.stop()
    found = _COMPACTED.findall((Path(home) / "agent-stderr.log").read_text(errors="replace"))
    if not found or not compacting:
        raise BenchError(f"{b.runs.longTurns} turns on a {COMPACTION_WINDOW:,}-token window showed no compaction")
    kinds = {kind: [(int(a), int(z), float(t)) for _, k, a, z, t in found if k == kind] for kind in ("shortened", "summarised")}
    rows = [
        Result(f"turn reading 12 KB, no compaction ({len(plain)} of {b.runs.longTurns})", plain, "ms",
               note=f"a {COMPACTION_WINDOW:,}-token window; two model requests and a read"),
        Result(f"turn reading 12 KB, with a compaction ({len(compacting)})", compacting, "ms",
               note="the compaction runs before the request that would pass the threshold"),
    ]
    for kind, entries in kinds.items():
        if entries:
            rows += [
                Result(f"compaction, {kind} ({len(entries)})", [t for _, _, t in entries], "ms",
                       note="engine time: " + ("the cheap pass alone" if kind == "shortened"
                                               else "cheap pass, then a summary request to the local scripted model")),
                Result(f"tokens after / before, {kind}", [z / a for a, z, _ in entries], "ratio",
                       note=f"median before {statistics.median(a for a, _, _ in entries):,.0f} tokens, "
                            f"after {statistics.median(z for _, z, _ in entries):,.0f}"),
            ]
    return rows


#: The checkpoint case's project: folders × files of about 1 KB each.
PROJECT_FOLDERS, PROJECT_FILES = 100, 100


def bigProject(root: Path) -> Path:
    """A 10,000-file project (with a .gitignore and an ignored folder), made once per run."""
    project = root / "project-10k"
    if not project.exists():
        for d in range(PROJECT_FOLDERS):
            folder = project / f"pkg{d:03d}"
            folder.mkdir(parents=True)
            for f in range(PROJECT_FILES):
                (folder / f"mod{f:03d}.py").write_text(f"# module {d}.{f}\n" + "x = 1\n" * 150)
        (project / ".gitignore").write_text("build/\n*.log\n")
        (project / "node_modules" / "dep").mkdir(parents=True)
    return project


async def caseCheckpoint(b: Bench) -> list[Result]:
    """What checkpoints cost a turn on a 10,000-file project: turns that write one file, with
    checkpoints on and off (the difference is the checkpoint before the write and the record
    of what changed after it), the first turn of a session (every file read and hashed), and
    the store's own time for one checkpoint, measured in this process."""
    from hermes_acp.engine.checkpoints import CheckpointStore, TurnCheckpoint

    project = str(bigProject(b.root))
    turns: dict[str, list[float]] = {"on": [], "off": []}
    first: dict[str, list[float]] = {"on": [], "off": [], "again": []}
    undo: list[float] = []
    home = b.home()
    for setting in ("off", "on", "again"):
        agent = await b.ready(home, HERMES_ACP_CHECKPOINTS="off" if setting == "off" else "on")
        _, sessionId = await agent.newSession(project)
        await agent.request("session/set_mode", {"sessionId": sessionId, "modeId": "accept_edits"})
        first[setting].append((await agent.prompt(sessionId, "[write] first"))[0])
        for n in range(b.runs.toolTurns if setting != "again" else 0):
            turns[setting].append((await agent.prompt(sessionId, f"[write] turn {n}"))[0])
        if setting == "on":
            undo.append((await agent.prompt(sessionId, "/undo"))[0])
        await b.close(agent)
    store = CheckpointStore(Path(b.home()) / "checkpoints")
    cold, warm = [], []
    for n in range(b.runs.toolTurns + 1):
        checkpoint = TurnCheckpoint(store, "bench", n + 1, (project,))
        began = time.perf_counter()
        checkpoint.beforeChange()
        checkpoint.finish()
        (cold if n == 0 else warm).append(time.perf_counter() - began)
    note = f"{PROJECT_FOLDERS * PROJECT_FILES:,} files of 1 KB; write_file of one file, 2 model requests"
    return [
        Result("turn writing 1 file, 10k-file project, checkpoints off", turns["off"], "ms", note=note),
        Result("turn writing 1 file, 10k-file project, checkpoints on", turns["on"], "ms", note=note),
        Result("checkpoint cost per turn (on − off, medians)",
               [statistics.median(turns["on"]) - statistics.median(turns["off"])], "ms",
               note="walk before the first write + record of what changed at the end"),
        Result("first turn of a session, a project new to the store", first["on"], "ms",
               note="every file read, hashed and copied into the store, once"),
        Result("first turn of a session in a new process, project seen before", first["again"], "ms",
               note="the last walk found through the newest checkpoint: only changed files read"),
        Result("`/undo` of a turn that wrote 1 file, 10k-file project", undo, "ms",
               note="the plan (two manifests read, the file compared), the restore, the conversation cut"),
        Result("checkpoint, in process: first of a folder", cold, "ms", note="walk, hash, copy, two manifests"),
        Result("checkpoint, in process: later turns", warm, "ms",
               note="walk (an lstat per file), unchanged hashes reused, two manifests"),
    ]


#: Name (for --only) → case, in table order.
CASES: dict[str, Callable[[Bench], Awaitable[list[Result]]]] = {
    "initialize": caseInitialize,
    "cold": caseCold,
    "session": caseSessionNew,
    "turn": caseTurn,
    "skills": caseSkills,
    "tools": caseTools,
    "delegate": caseDelegate,
    "sandbox": caseSandbox,
    "background": caseBackground,
    "mcp": caseMCP,
    "compaction": caseCompaction,
    "extract": caseExtract,
    "checkpoint": caseCheckpoint,
    "stream": caseStream,
    "frames": caseFrames,
    "request": caseRequest,
    "concurrent": caseConcurrent,
    "cancel": caseCancel,
    "scale": caseScale,
    "store": caseStore,
    "load": caseLoad,
    "rss": caseRSS,
}


def makeRoot() -> Path:
    return Path(tempfile.mkdtemp(prefix="hermes-bench-"))


def removeRoot(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
