"""``--log-level debug`` says what a user chasing an editor problem needs (issue 11):
each request and answer (method, id, size, time), session lifecycle events, model
requests (model, messages, tokens, latency, retries), tool calls (name, duration,
exit code) and permission outcomes; never a secret or a file's contents."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest_twisted

from .e2e import modelEnv, text
from .sdkclient import RecordingClient, connect, initialized, onLoop
from .test_e2e_turns import choose

SECRET_KEY = "sk-debug-log-secret-0123456789"
FILE_SECRET = "contents-that-must-not-be-logged-4242"


@pytest_twisted.ensureDeferred
async def test_debugLogTellsTheStoryWithoutSecrets(scriptedServer, tmp_path) -> None:
    """One turn with a read, an edit (asked and allowed) and a command, at debug."""
    server, url = scriptedServer
    (tmp_path / "private.txt").write_text(FILE_SECRET + "\n")
    server.default.responses += [
        [{"status": 503, "error": "busy, try again"}],
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "private.txt"}}]},
         {"usage": {"prompt_tokens": 120, "completion_tokens": 7}}],
        [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "new.txt", "content": FILE_SECRET}}]}],
        [{"tool_calls": [{"id": "t", "name": "terminal", "arguments": {"command": "exit 3"}}]}],
        [{"text": "done"}],
    ]  # fmt: skip
    log = Path(tempfile.mkdtemp()) / "agent.log"
    env = {**modelEnv(url), "HERMES_API_KEY": SECRET_KEY}

    async def scenario():
        with open(log, "wb") as stderr:
            argv = [sys.executable, "-m", "hermes_acp", "--log-level", "debug"]
            client = RecordingClient(permission=choose("allow_once"))
            async with connect(client, env=env, argv=argv, stderr=stderr) as (conn, _, wire, process):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                await conn.prompt(session_id=sid, prompt=[text("look, write and run")])
                await conn.close_session(session_id=sid)
                return sid, wire.problems()

    sid, problems = await onLoop(scenario())
    assert problems == []
    said = log.read_text()
    for line in [
        "request initialize id 0 (", "answer to initialize id 0: ok (",
        "request session/prompt id ", "answer to session/prompt id ",
        f"session {sid} created in {tmp_path}", f"session {sid} closed",
        "model request: scripted-model, 2 messages, 9 tools", "retry 1 in",
        "120 prompt + 7 completion tokens", "1 retries",
        "tool read_file finished in", "tool write_file finished in", "tool terminal finished in",
        "exit code 3", "allow_once",
        "sent request session/request_permission (", "answer to our session/request_permission id ",
    ]:
        assert line in said, line
    assert " ms)" in said
    assert SECRET_KEY not in said and FILE_SECRET not in said
