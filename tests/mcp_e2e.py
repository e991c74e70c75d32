"""Helpers for the MCP tests: scripted servers as the editor lists them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from acp.schema import EnvVariable, HttpHeader, HttpMcpServer, McpServerStdio

from . import mcp_scripted

FASTMCP = os.path.join(os.path.dirname(__file__), "mcp_fastmcp.py")


def scripted(tmp: Path, name: str, **script: Any) -> tuple[McpServerStdio, Path]:
    """A stdio scripted server named ``name``, and the log it keeps."""
    log = tmp / f"{name}.log"
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"log": str(log), **script}))
    argv = mcp_scripted.stdioCommand(path)
    return McpServerStdio(name=name, command=argv[0], args=argv[1:], env=[]), log


def withEnv(server: McpServerStdio, **env: str) -> McpServerStdio:
    return server.model_copy(update={"env": [EnvVariable(name=k, value=v) for k, v in env.items()]})


def http(name: str, url: str, **headers: str) -> HttpMcpServer:
    return HttpMcpServer(type="http", name=name, url=url,
                         headers=[HttpHeader(name=k, value=v) for k, v in headers.items()])


def fastmcp(name: str = "real") -> McpServerStdio:
    return McpServerStdio(name=name, command=sys.executable, args=[FASTMCP, "stdio"], env=[])


def call(callId: str, name: str, **arguments: Any) -> list[dict[str, Any]]:
    """A model reply that calls one tool."""
    return [{"tool_calls": [{"id": callId, "name": name, "arguments": arguments}]}]


def offered(request: dict[str, Any]) -> list[str]:
    """The tool names a model request offered."""
    return [tool["function"]["name"] for tool in request.get("tools") or []]


def toolMessages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def log(path: Path) -> list[dict[str, Any]]:
    return mcp_scripted.readLog(path)
