"""Nothing outlives the agent (issue 22, item 5), through the real process: a turn's
commands escape every way a process can (``setsid``, ``nohup``, a double fork,
``env -i setsid`` that sheds the environment mark), an MCP stdio server starts a
child of its own, and then the agent dies (SIGKILL, SIGTERM, stdin EOF), with and
without the sandbox. Within a generous bound none of them runs any more, nor does
the agent's watchdog."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from hermes_acp.engine import sandbox

from .agentproc import processGone
from .e2e import text
from .mcp_e2e import scripted
from .sdkclient import RecordingClient, connect, initialized, onLoop, until
from .test_e2e_safety import Machine, approve, terminal
from .test_lifeline import sleeping, unique

SUPPORT = sandbox.probe()


def escapes(folder: Path, seconds: str) -> tuple[str, str, list[Path]]:
    """Two commands: the first leaves two double-forked processes behind and ends
    (one of them with an empty environment); the second starts one in a session of
    its own, one under nohup, one double-forked with an empty environment, and runs
    on. Each process writes its pid to a file, then sleeps ``seconds``."""
    pids = [folder / f"{name}.pid" for name in "abcdef"]

    def sleeper(pidFile: Path) -> str:
        return f"sh -c 'echo $$ > {pidFile}; exec sleep {seconds}' > /dev/null 2>&1"

    first = f"({sleeper(pids[0])} &); (env -i setsid {sleeper(pids[1])} &); echo left"
    second = (f"setsid {sleeper(pids[2])} & nohup {sleeper(pids[3])} & (env -i setsid {sleeper(pids[4])} &); "
              f"{sleeper(pids[5])}")
    return first, second, pids


def watchdogOf(agent: int) -> list[int]:
    """The agent's watchdog, among its children."""
    found = []
    for task in os.listdir(f"/proc/{agent}/task"):
        with open(f"/proc/{agent}/task/{task}/children") as f:
            for child in f.read().split():
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as g:
                        if b"lifeline.py" in g.read():
                            found.append(int(child))
                except OSError:
                    pass
    return found


async def pidIn(path: Path) -> int:
    await until(lambda: path.exists() and path.read_text().strip() != "", 30, f"a pid in {path.name}")
    return int(path.read_text())


@pytest.mark.parametrize(("death", "sandboxed"), [
    ("SIGKILL", True), ("SIGKILL", False), ("SIGTERM", True), ("stdin EOF", False)])
@pytest_twisted.ensureDeferred
async def test_nothingOutlivesTheAgent(scriptedServer, tmp_path: Path, death: str, sandboxed: bool) -> None:
    if sandboxed and not SUPPORT.available:
        pytest.skip(f"no Landlock here: {SUPPORT.reason}")
    server, url = scriptedServer
    machine = Machine(tmp_path)
    # A sleep no other test (or test run) on this machine starts.
    seconds = f"{307 + ['SIGKILL', 'SIGTERM', 'stdin EOF'].index(death) * 2 + sandboxed}.{os.getpid() % 10_000:04d}"
    first, second, pidFiles = escapes(machine.work, seconds)
    mcpChild = machine.work / "mcp-child.pid"
    mcp, _ = scripted(tmp_path, "spawner", childPidFile=str(mcpChild))
    server.default.responses += [terminal(first), terminal(second), [{"text": "never"}]]
    extra = {} if sandboxed else {"HERMES_ACP_SANDBOX": "off"}
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve), env=machine.env(url, **extra)) as (
                conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(machine.work), mcp_servers=[mcp])).session_id
            asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("go")]))
            found["pids"] = [await pidIn(path) for path in [*pidFiles, mcpChild]]
            assert all(sleeping(pid, seconds) for pid in found["pids"][:-1])
            found["watchdog"] = watchdogOf(process.pid)
            assert len(found["watchdog"]) == 1
            if death == "SIGKILL":
                process.kill()
            elif death == "SIGTERM":
                process.send_signal(signal.SIGTERM)
            else:
                process.stdin.close()
            await asyncio.wait_for(process.wait(), 60)

    pids: list[int] = []
    try:
        await onLoop(scenario())
        pids = found["pids"]
        await onLoop(until(lambda: not any(sleeping(pid, seconds) for pid in pids[:-1]), 30,
                           "every escaped command process to end"))
        await onLoop(until(lambda: processGone(pids[-1]), 30, "the MCP server's child to end"))
        await onLoop(until(lambda: all(processGone(pid) for pid in found["watchdog"]), 30, "the watchdog to exit"))
    finally:
        for pid, what in zip(found.get("pids", []), [seconds] * 6 + ["600"]):
            if sleeping(pid, what):
                os.kill(pid, signal.SIGKILL)


@pytest_twisted.ensureDeferred
async def test_aProcessThatShedEveryMarkAndWasLeftBehindEnds(scriptedServer, tmp_path: Path) -> None:
    """A finished command left a process that shed every mark: a session of its own, an
    empty environment and a lower ``RLIMIT_RTTIME``. The agent, a subreaper, adopted it
    when the command ended; killed later, between turns, it leaves nothing running."""
    import sys

    server, url = scriptedServer
    machine = Machine(tmp_path)
    seconds = unique(321)
    pidFile = machine.work / "shed.pid"
    shed = (f"import os, resource; resource.setrlimit(resource.RLIMIT_RTTIME, (5, 5)); "
            f"open('{pidFile}', 'w').write(str(os.getpid())); os.execv('/bin/sleep', ['sleep', '{seconds}'])")
    command = f"(env -i setsid {sys.executable} -c \"{shed}\" > /dev/null 2>&1 &); echo left"
    server.default.responses += [terminal(command), [{"text": "done"}]]
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with connect(RecordingClient(permission=approve),
                           env=machine.env(url, HERMES_ACP_SANDBOX="off")) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(machine.work), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("go")]), 30)
            found["pid"] = await pidIn(pidFile)
            await until(lambda: sleeping(found["pid"], seconds), 30, "the process to sleep")
            process.kill()
            await asyncio.wait_for(process.wait(), 60)

    try:
        await onLoop(scenario())
        await onLoop(until(lambda: not sleeping(found["pid"], seconds), 30, "the left process to end"))
    finally:
        if "pid" in found and sleeping(found["pid"], seconds):
            os.kill(found["pid"], signal.SIGKILL)
