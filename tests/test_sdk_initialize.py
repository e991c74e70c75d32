"""The official SDK client talks to the real process."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import acp
import pytest_twisted

from .agentproc import agentEnv
from .e2e import updates
from .sdkclient import connect, initialized, onLoop, raw


async def _initialize(env: dict[str, str], **caps: object) -> tuple[object, list[str]]:
    async with connect(env=env) as (connection, client, wire, process):
        result = await initialized(connection, **caps)
    return result, wire.problems()


@pytest_twisted.ensureDeferred
async def test_sdkInitializeUnconfigured() -> None:
    """An unconfigured agent advertises no agent auth method; the terminal setup
    method appears only for clients that support terminal auth."""
    result, problems = await onLoop(_initialize(agentEnv()))
    assert problems == []
    assert result.protocol_version == 1
    assert result.agent_info.name == "hermes-acp"
    assert result.auth_methods == []
    result, problems = await onLoop(_initialize(agentEnv(), auth={"terminal": True}))
    assert problems == []
    [method] = result.auth_methods
    dumped = method.model_dump(by_alias=True, exclude_none=True)
    assert dumped["id"] == "hermes-setup"
    assert dumped["type"] == "terminal"
    assert dumped["args"] == ["--setup"]


@pytest_twisted.ensureDeferred
async def test_sdkAuthenticateConfigured() -> None:
    """With a configured provider, its agent method authenticates; logout then
    authenticate again works; an unknown method id is a real error."""
    home = tempfile.mkdtemp()
    Path(home, ".env").write_text("HERMES_BASE_URL=http://127.0.0.1:9/v1\nHERMES_MODEL=m\n")

    async def scenario() -> list[str]:
        async with connect(env=agentEnv(home)) as (connection, client, wire, process):
            result = await initialized(connection)
            assert [m.id for m in result.auth_methods] == ["custom"]
            await connection.authenticate(method_id="custom")
            try:
                await connection.authenticate(method_id="nope")
            except acp.RequestError as e:
                assert e.code == -32602
            else:
                raise AssertionError("unknown methodId accepted")
        return wire.problems()

    assert await onLoop(scenario()) == []


@pytest_twisted.ensureDeferred
async def test_urlPasswordStaysIn(scriptedServer, tmp_path) -> None:
    """With a password in HERMES_BASE_URL, neither the initialize answer, a /doctor
    reply, a model error, the --trace file nor the debug log on stderr holds it:
    each shows the URL with [REDACTED] in its place."""
    server, url = scriptedServer
    server.default.responses.append([{"status": 400, "error": "no such thing"}])
    password = "s3cretpass"
    secretURL = url.replace("http://", f"http://user:{password}@")
    shown = url.replace("http://", "http://user:[REDACTED]@")
    env = agentEnv(tempfile.mkdtemp(), HERMES_BASE_URL=secretURL, HERMES_MODEL="m")
    log, trace = tmp_path / "agent.log", tmp_path / "trace.jsonl"
    argv = [sys.executable, "-m", "hermes_acp", "--log-level", "debug", "--trace", str(trace)]

    async def scenario():
        with open(log, "wb") as stderr:
            async with connect(env=env, argv=argv, stderr=stderr) as (conn, client, wire, process):
                result = await initialized(conn)
                # A password the editor sends is a known secret for the trace too.
                created = await raw(conn, "session/new", {"cwd": str(tmp_path), "mcpServers": [],
                                                          "_meta": {"note": f"pw {password}"}})
                sid = created["sessionId"]
                await conn.prompt(session_id=sid, prompt=[acp.text_block("/doctor")])
                try:
                    await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
                except acp.RequestError as e:
                    failure = e
                else:
                    raise AssertionError("the model's HTTP 400 did not fail the turn")
                return result, updates(wire, sid), failure, wire

    result, found, failure, wire = await onLoop(scenario())
    assert wire.problems() == []
    [method] = result.auth_methods
    assert f"at {shown}," in method.description
    doctor = "".join(u["content"]["text"] for u in found if u["sessionUpdate"] == "agent_message_chunk")
    assert f"**Endpoint:** {shown} (provider custom" in doctor
    assert f"The model endpoint {shown} rejected the request (HTTP 400)" in str(failure) + json.dumps(failure.data)
    said = log.read_text()
    assert "request session/prompt" in said  # the debug log was written
    for where, content in (("answers", json.dumps(wire.received)), ("log", said), ("trace", trace.read_text())):
        assert password not in content, where
    assert "pw [REDACTED]" in trace.read_text()

