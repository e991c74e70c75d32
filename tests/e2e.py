"""End-to-end helpers: the real agent process, the SDK client and a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import acp
from acp.schema import AllowedOutcome, RequestPermissionResponse

from .agentproc import agentEnv
from .scripted_model import ScriptedModel


def modelEnv(url: str, home: str | None = None, **extra: str) -> dict[str, str]:
    """An agent environment pointed at the scripted model server."""
    return agentEnv(home or tempfile.mkdtemp(prefix="hermes-home-"), HERMES_BASE_URL=url,
                    HERMES_API_KEY="test-key-not-secret", HERMES_MODEL="scripted-model", **extra)


async def journaled(home: str, sessionId: str, needle: str, timeout: float = 10) -> None:
    """Wait (at most ``timeout`` s) until the agent's journal on disk holds ``needle``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with sqlite3.connect(Path(home) / "state.db", timeout=5) as db:
            rows = db.execute("SELECT payload FROM acp_journal WHERE session_id = ?", (sessionId,)).fetchall()
        if any(needle in payload for (payload,) in rows):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{needle!r} never reached the journal")
        await asyncio.sleep(0.05)


def updates(wire: Any, sessionId: str | None = None) -> list[dict[str, Any]]:
    """The session/update payloads the agent sent, in order."""
    return [
        f["params"]["update"]
        for f in wire.received
        if f.get("method") == "session/update" and (sessionId is None or f["params"]["sessionId"] == sessionId)
    ]


def agentText(found: list[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in found if u["sessionUpdate"] == kind)


def toolCalls(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool call merged from its tool_call and tool_call_update frames, with the status history."""
    calls: dict[str, dict[str, Any]] = {}
    for u in found:
        if u["sessionUpdate"] == "tool_call":
            calls[u["toolCallId"]] = {**u, "statuses": [u.get("status", "pending")]}
        elif u["sessionUpdate"] == "tool_call_update":
            call = calls.setdefault(u["toolCallId"], {"statuses": []})
            call.update({k: v for k, v in u.items() if k != "status"})
            if "status" in u:
                call["statuses"].append(u["status"])
                call["status"] = u["status"]
    return calls


def uniqueSleep(seconds: int) -> str:
    """A ``sleep`` command no other test run on this machine starts (CI jobs share hosts)."""
    return f"sleep {seconds}.{os.getpid() % 10_000:04d}"


def commandRunning(command: str) -> bool:
    """Whether a process with ``command`` in its command line runs on this machine."""
    return subprocess.run(["pgrep", "-f", command], capture_output=True).stdout != b""


def text(value: str) -> Any:
    return acp.text_block(value)


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)[:2000]


__all__ = ["ScriptedModel", "modelEnv", "updates", "agentText", "toolCalls", "text"]


def answers(*optionIds: str):
    """A permission policy: answer the requests with these options, in order."""
    queue = list(optionIds)

    def answer(request: Any) -> RequestPermissionResponse:
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=queue.pop(0)))

    return answer
