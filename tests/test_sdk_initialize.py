"""The official SDK client talks to the real process."""

from __future__ import annotations

import tempfile
from pathlib import Path

import acp
import pytest_twisted

from .agentproc import agentEnv
from .sdkclient import connect, initialized, onLoop


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
