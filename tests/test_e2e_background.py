"""Background processes through the real agent process (issue 24 §1): a dev server started
with ``terminal(background=true)`` answers on its port while the next prompts run; the
``process`` tool polls, logs, waits for, writes to and kills it; an exit between turns
completes its card and is told to the model at the next prompt; close, delete, stdin EOF
and kill -9 leave no process; a load after a restart tells the model what ended with the
agent; the limits say so clearly; ``/ps`` and ``/kill``. Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from hermes_acp.backgroundcards import LOST

from .agentproc import processGone
from .e2e import agentText, commandRunning, modelEnv, text, toolCalls, uniqueSleep, updates
from .sdkclient import RecordingClient, connect, initialized, leavingNoProcess, onLoop, raw, until
from .test_e2e_safety import approve


def background(command: str, callId: str = "b") -> list[dict[str, Any]]:
    return [{"tool_calls": [{"id": callId, "name": "terminal", "arguments": {"command": command, "background": True}}]}]


def process(callId: str = "p", **arguments: Any) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"id": callId, "name": "process", "arguments": arguments}]}]


def toolResult(body: Any) -> dict[str, Any]:
    """The last tool result a model request carried, decoded."""
    return json.loads([m["content"] for m in body["messages"] if m["role"] == "tool"][-1])


def lastUser(body: Any) -> str:
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def backgroundCard(wire: Any, sessionId: str) -> tuple[str, dict[str, Any]]:
    """The id and merged state of the session's (one) background card."""
    for callId, call in toolCalls(updates(wire, sessionId)).items():
        if "background" in json.dumps(call.get("_meta", {})):
            return callId, call
    raise AssertionError("no background card")


def tagged(update: dict[str, Any]) -> dict[str, Any]:
    return ((update.get("_meta") or {}).get("hermesAcp") or {}).get("background") or {}


def get(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
        return answer.status


async def agentSession(conn: Any, cwd: Path) -> str:
    await initialized(conn)
    return (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id


@pytest_twisted.ensureDeferred
async def test_aDevServerAnswersWhileTheNextTwoPromptsRun(scriptedServer, tmp_path: Path) -> None:
    server, url = scriptedServer
    server.default.responses += [
        background(f"{sys.executable} -m http.server 0 --bind 127.0.0.1"), [{"text": "started"}],
        process(action="poll", session_id=1), [{"stall": 1.0}, {"text": "polled"}],
        process(action="log", session_id="1"), [{"stall": 1.0}, {"text": "logged"}],
        process(action="kill", session_id="#1"), [{"text": "killed"}],
    ]

    async def scenario() -> None:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("serve")]), 30)
            assert answer.stop_reason == "end_turn"
            started = toolResult(server.chatRequests[1])
            assert started["output"] == "Background process started" and started["session_id"].startswith("proc_")
            cardId, card = backgroundCard(wire, sid)
            assert card["status"] == "in_progress" and card["rawOutput"]["pid"] == started["pid"]
            live = await client.waitForUpdate(
                lambda s, u: u.get("toolCallId") == cardId and "port" in json.dumps(u.get("content")), 30)
            port = int(re.search(r"port (\d+)", json.dumps(live["content"])).group(1))
            for n, word in ((2, "poll"), (3, "log")):
                turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text(word)]))
                await until(lambda: len(server.chatRequests) >= 2 * n, 30, f"the {word} result to reach the model")
                assert not turn.done()
                assert await asyncio.to_thread(get, port) == 200  # while the prompt runs
                assert (await asyncio.wait_for(turn, 30)).stop_reason == "end_turn"
            polled, logged = toolResult(server.chatRequests[3]), toolResult(server.chatRequests[5])
            assert polled["status"] == "running" and f"port {port}" in polled["output_preview"]
            assert logged["status"] == "running" and "GET / HTTP" in logged["output"]
            assert backgroundCard(wire, sid)[1]["status"] == "in_progress"
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("stop")]), 30)
            assert toolResult(server.chatRequests[7])["status"] == "killed"
            await until(lambda: processGone(started["pid"]), 10, "the server to end")
            ended = await client.waitForUpdate(
                lambda s, u: u.get("toolCallId") == cardId and u.get("status") in ("completed", "failed"), 10)
            assert ended["status"] == "failed" and "killed, exit code" in json.dumps(ended["content"])
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_writeSubmitWaitClose(scriptedServer, tmp_path: Path) -> None:
    server, url = scriptedServer
    server.default.responses += [
        background("cat"), process(action="submit", session_id=1, data="hello"),
        process(action="write", session_id=1, data="world\n"), process(action="wait", session_id=1, timeout=1),
        process(action="close", session_id=1), process(action="wait", session_id=1, timeout=30),
        [{"text": "done"}],
    ]

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=modelEnv(url)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("cat")]), 60)
            results = [toolResult(body) for body in server.chatRequests[1:]]
            assert results[1] == {"status": "ok", "bytes_written": 6}
            assert results[2] == {"status": "ok", "bytes_written": 6}
            assert results[3]["status"] == "timeout" and "hello\nworld" in results[3]["output"]
            assert results[4]["status"] == "ok"
            assert results[5]["status"] == "exited" and results[5]["exit_code"] == 0
            _, card = backgroundCard(wire, sid)
            assert card["status"] == "completed" and "exit code 0" in json.dumps(card["content"])
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_anExitBetweenTurnsShowsOnItsCardIsToldAndReplays(scriptedServer, tmp_path: Path) -> None:
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    server.default.responses += [background("sleep 1.5; echo finished-here; exit 5"), [{"text": "started"}],
                                 [{"text": "noted"}]]

    async def scenario() -> str:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("build")]), 30)
            answered = len(wire.order)
            cardId, _ = backgroundCard(wire, sid)
            ended = await client.waitForUpdate(
                lambda s, u: u.get("toolCallId") == cardId and u.get("status") in ("completed", "failed"), 30)
            assert ended["status"] == "failed" and "exit code 5" in json.dumps(ended["content"])
            assert "finished-here" in json.dumps(ended["content"]) and tagged(ended)["status"] == "exited"
            between = [m for direction, m in wire.order[answered:] if direction == "received"
                       and m.get("method") == "session/update" and m["params"]["update"].get("status") == "failed"]
            assert between, "the card completed between the turns"
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("next")]), 30)
            told = lastUser(server.chatRequests[-1])
            assert "exit code 5" in told and "finished-here" in told and told.endswith("next")
            assert wire.problems() == []
            return sid

    sid = await onLoop(scenario())

    async def reload() -> None:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, agent):
            await initialized(conn)
            await conn.load_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])
            _, card = backgroundCard(wire, sid)
            assert card["status"] == "failed" and "exit code 5" in json.dumps(card["content"])
            assert LOST not in json.dumps(updates(wire, sid))  # it ended before: nothing lost
            assert wire.problems() == []

    await onLoop(reload())


@pytest.mark.parametrize("ending", ["session/close", "session/delete", "stdin EOF", "SIGKILL"])
@pytest_twisted.ensureDeferred
async def test_nothingBackgroundOutlivesItsSessionOrTheAgent(scriptedServer, tmp_path: Path, ending: str) -> None:
    server, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    sleep = uniqueSleep(331 + ["session/close", "session/delete", "stdin EOF", "SIGKILL"].index(ending))
    server.default.responses += [background(sleep), [{"text": "started"}], [{"text": "after"}]]
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=modelEnv(url, home)) as (conn, _, wire, agent):
            sid = found["sid"] = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("start")]), 30)
            pid = found["pid"] = toolResult(server.chatRequests[1])["pid"]
            assert not processGone(pid)
            if ending.startswith("session/"):
                await raw(conn, ending, {"sessionId": sid})
                await until(lambda: processGone(pid), 10, "the background process to end")
                assert not processGone(agent.pid)
            else:
                agent.kill() if ending == "SIGKILL" else agent.stdin.close()
                await asyncio.wait_for(agent.wait(), 60)

    try:
        await onLoop(scenario())
        await onLoop(until(lambda: processGone(found["pid"]), 30, "the background process to end"))
        await onLoop(until(lambda: not commandRunning(sleep), 30, f"every {sleep!r} to end"))
    finally:
        if "pid" in found and not processGone(found["pid"]):
            os.kill(found["pid"], signal.SIGKILL)
    if ending != "SIGKILL":
        return

    async def reload() -> None:
        """The restarted agent's load fails the card and tells the model at the next prompt."""
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, agent):
            await initialized(conn)
            await conn.load_session(session_id=found["sid"], cwd=str(tmp_path), mcp_servers=[])
            _, card = backgroundCard(wire, found["sid"])
            assert card["status"] == "failed" and LOST in json.dumps(card["content"])
            await asyncio.wait_for(conn.prompt(session_id=found["sid"], prompt=[text("again")]), 30)
            told = lastUser(server.chatRequests[-1])
            assert "previous process" in told and sleep in told
            assert wire.problems() == []

    await onLoop(reload())


@pytest_twisted.ensureDeferred
async def test_limitsPsAndKill(scriptedServer, tmp_path: Path) -> None:
    server, url = scriptedServer
    sleep = uniqueSleep(341)
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "terminal", "arguments": {"command": sleep, "background": True}},
                         {"id": "b", "name": "terminal", "arguments": {"command": sleep, "background": True}}]}],
        [{"text": "one of two"}],
    ]

    async def scenario() -> None:
        client = RecordingClient(permission=approve)
        env = modelEnv(url, HERMES_ACP_BACKGROUND_PROCESSES="1")
        async with connect(client, env=env) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            commands = await client.waitForUpdate(lambda s, u: u.get("sessionUpdate") == "available_commands_update")
            assert {"ps", "kill"} <= {c["name"] for c in commands["availableCommands"]}
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("two")]), 30)
            results = [m["content"] for m in server.chatRequests[1]["messages"] if m["role"] == "tool"]
            started = [json.loads(r) for r in results if r.startswith("{")]
            refused = [r for r in results if not r.startswith("{")]
            assert len(started) == 1 and len(refused) == 1
            assert "already runs 1 background processes" in refused[0]
            assert "HERMES_ACP_BACKGROUND_PROCESSES" in refused[0]
            before = len(updates(wire, sid))
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/ps")]), 30)
            listed = agentText(updates(wire, sid)[before:])
            assert f"| 1 | running | {started[0]['pid']} |" in listed and sleep in listed
            before = len(updates(wire, sid))
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/kill 1")]), 30)
            assert "Ending #1" in agentText(updates(wire, sid)[before:])
            await until(lambda: processGone(started[0]["pid"]), 10, "the process to end")
            cardId, _ = backgroundCard(wire, sid)
            await client.waitForUpdate(lambda s, u: u.get("toolCallId") == cardId and u.get("status") == "failed", 10)
            before = len(updates(wire, sid))
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/kill 1")]), 30)
            assert "has already ended" in agentText(updates(wire, sid)[before:])
            before = len(updates(wire, sid))
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/kill 9")]), 30)
            assert "no background process '9'" in agentText(updates(wire, sid)[before:])
            assert wire.problems() == []

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_backgroundProcessesDoNotStarveTurns(scriptedServer, tmp_path: Path) -> None:
    """16 sessions each start 2 background processes; then a prompt in every session
    runs at once (a barrier answers none until all 16 have asked the model): every turn
    gets a worker while 32 background processes run and print. The agent's threads grow
    by the one reader, not by one per process."""
    server, url = scriptedServer
    sleep = uniqueSleep(351)
    chatty = f"while true; do echo tick; sleep 0.2; done & {sleep}"
    found: dict[str, Any] = {}

    def threads(pid: int) -> int:
        return len(os.listdir(f"/proc/{pid}/task"))

    async def scenario() -> None:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, agent):
            await initialized(conn)
            sids = [(await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id for _ in range(16)]
            for index, sid in enumerate(sids):
                server.addRule(f"start-{index}.", [background(chatty, "a"), background(chatty, "b"),
                                                   [{"text": "started"}]])
            for index, sid in enumerate(sids):
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(f"start-{index}.")]), 60)
            pids = found["pids"] = [call["rawOutput"]["pid"] for sid in sids
                                    for call in toolCalls(updates(wire, sid)).values() if call.get("_meta")]
            assert len(set(pids)) == 32 and not any(processGone(pid) for pid in pids)
            before = threads(agent.pid)
            requests = len(server.chatRequests)
            for index in range(16):
                server.addRule(f"ping-{index}.", [[{"barrier": requests + 16}, {"text": f"pong-{index}"}]])
            answers = await asyncio.wait_for(asyncio.gather(*(
                conn.prompt(session_id=sid, prompt=[text(f"ping-{index}.")]) for index, sid in enumerate(sids))), 120)
            assert [a.stop_reason for a in answers] == ["end_turn"] * 16
            found["threads"] = (before, threads(agent.pid))
            assert wire.problems() == []
            agent.stdin.close()
            await asyncio.wait_for(agent.wait(), 60)

    await leavingNoProcess(scenario(), lambda: found.get("pids", []))


@pytest_twisted.ensureDeferred
async def test_aForkLoadedDoesNotClaimItsSourcesProcess(scriptedServer, tmp_path: Path) -> None:
    """A fork copies the journal, the running card with it; loaded, the fork's copy fails
    saying the process is its source's, which runs on, and the model is not told it ended."""
    from hermes_acp.backgroundcards import FORKED

    server, url = scriptedServer
    sleep = uniqueSleep(361)
    server.default.responses += [background(sleep), [{"text": "started"}], [{"text": "in the fork"}]]

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=modelEnv(url)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("start")]), 30)
            pid = toolResult(server.chatRequests[1])["pid"]
            fork = (await conn.fork_session(session_id=sid, cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.load_session(session_id=fork, cwd=str(tmp_path), mcp_servers=[])
            _, card = backgroundCard(wire, fork)
            assert card["status"] == "failed" and FORKED in json.dumps(card["content"])
            assert not processGone(pid) and backgroundCard(wire, sid)[1]["status"] == "in_progress"
            await asyncio.wait_for(conn.prompt(session_id=fork, prompt=[text("forked")]), 30)
            assert lastUser(server.chatRequests[-1]) == "forked"
            assert wire.problems() == []
            await raw(conn, "session/close", {"sessionId": sid})
            await until(lambda: processGone(pid), 10, "the process to end with its session")

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_withEditorTerminalsBackgroundStillRunsHere(scriptedServer, tmp_path: Path) -> None:
    """Without the sandbox a foreground command would run in the editor's terminal; a
    background one runs here all the same (asked about as unconfined), so the agent reads
    its output and ends it with the session: no ``terminal/*`` request reaches the editor."""
    server, url = scriptedServer
    sleep = uniqueSleep(371)
    server.default.responses += [background(sleep), [{"text": "started"}]]

    async def scenario() -> None:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url, HERMES_ACP_SANDBOX="off")) as (conn, _, wire, agent):
            await initialized(conn, terminal=True)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("start")]), 30)
            assert len(client.permissionRequests) == 1  # unconfined and not read-only: asked
            pid = toolResult(server.chatRequests[1])["pid"]
            assert not processGone(pid)
            assert not [m for m in wire.received if str(m.get("method", "")).startswith("terminal/")]
            assert wire.problems() == []
            await raw(conn, "session/delete", {"sessionId": sid})
            await until(lambda: processGone(pid), 10, "the process to end with its session")

    await onLoop(scenario())


@pytest_twisted.ensureDeferred
async def test_aProcessThatEndsAtOnceStillCompletesItsCard(scriptedServer, tmp_path: Path) -> None:
    """Its end may reach the reactor before the call's answer does: the card still completes."""
    server, url = scriptedServer
    server.default.responses += [background("echo quick", "q1"), background("exit 3", "q2"), [{"text": "done"}]]

    async def scenario() -> None:
        client = RecordingClient(permission=approve)
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("quick")]), 30)
            for status, said in (("completed", "quick"), ("failed", "exit code 3")):
                await client.waitForUpdate(lambda s, u: tagged(u).get("status") == "exited" and u["status"] == status
                                           and said in json.dumps(u["content"]), 10)
            assert wire.problems() == []

    await onLoop(scenario())


@pytest.mark.parametrize("ending", ["session/close", "session/delete"])
@pytest_twisted.ensureDeferred
async def test_aDaemonItLeftEndsWithTheSession(scriptedServer, tmp_path: Path, ending: str) -> None:
    """A background command that daemonizes (``setsid … &``, its own session and process
    group) and exits at once: what it left runs on while the session lives, and ends when the
    session is closed or deleted, not only when the agent exits."""
    server, url = scriptedServer
    sleep = uniqueSleep(381 + ["session/close", "session/delete"].index(ending))
    server.default.responses += [background(f"setsid {sleep} >/dev/null 2>&1 </dev/null &"), [{"text": "started"}]]

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=modelEnv(url)) as (conn, _, wire, agent):
            sid = await agentSession(conn, tmp_path)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("start")]), 30)
            await until(lambda: backgroundCard(wire, sid)[1].get("status") == "completed", 10, "the command to exit")
            assert commandRunning(sleep)  # the daemon it left
            await raw(conn, ending, {"sessionId": sid})
            await until(lambda: not commandRunning(sleep), 10, "the daemon to end with the session")
            assert not processGone(agent.pid)

    await onLoop(scenario())  # the agent's exit ends the daemon too: nothing is left to clean up
