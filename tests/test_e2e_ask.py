"""The model asks the user (``clarify``, issue 23) through the real process and the SDK
client: a form where the editor takes one, the choices as a permission request where it
does not, and the question as the turn's last message when free text is wanted."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from typing import Any

import pytest_twisted
from acp.schema import ClientCapabilities, ElicitationCapabilities, ElicitationFormCapabilities

from .e2e import answers, modelEnv, text, toolCalls, updates
from .sdkclient import RecordingClient, connect, initialized, onLoop, rawNotify

FORM = ElicitationCapabilities(form=ElicitationFormCapabilities())


def asking(question: str, choices: list[str] | None = None, ident: str = "q") -> list[list[dict[str, Any]]]:
    arguments: dict[str, Any] = {"question": question, **({"choices": choices} if choices else {})}
    return [[{"tool_calls": [{"id": ident, "name": "clarify", "arguments": arguments}]}]]


def toldModel(server: Any, request: int = 1, ident: str = "q") -> dict[str, Any]:
    """What the model read as the clarify call's result in its ``request``-th request."""
    messages = server.chatRequests[request]["messages"]
    return json.loads(next(m["content"] for m in messages if m["role"] == "tool" and m["tool_call_id"] == ident))


async def oneTurn(client: RecordingClient, url: str, cwd: str, prompt: str, form: bool = True,
                  **env: str) -> tuple[Any, list[dict[str, Any]], Any]:
    async with connect(client, env=modelEnv(url, **env)) as (conn, _, wire, process):
        await initialized(conn, **({"elicitation": FORM} if form else {}))
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
        response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(prompt)]), 30)
        return response, updates(wire, sid), wire


async def loaded(url: str, home: str, cwd: str, sessionId: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A new process loads the session: what it replayed, and the problems of its frames."""
    async with connect(RecordingClient(), env=modelEnv(url, home)) as (conn, _, wire, process):
        await initialized(conn)
        await conn.load_session(cwd=cwd, session_id=sessionId, mcp_servers=[])
        return updates(wire, sessionId), wire.problems()


@pytest_twisted.ensureDeferred
async def test_aFormChoiceReachesTheModel(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [*asking("Which colour?", ["red", "blue"]), [{"text": "Blue it is."}]]
    client = RecordingClient(elicitation=lambda request: {"action": "accept", "content": {"choice": "blue"}})
    response, found, wire = await onLoop(oneTurn(client, url, str(tmp_path), "paint the shed"))
    assert wire.problems() == []
    assert response.stop_reason == "end_turn"
    [(message, mode)] = client.elicitations
    [card] = toolCalls(found)
    assert message == "Which colour?" and mode["toolCallId"] == card and mode["sessionId"]
    assert mode["requestedSchema"]["properties"]["choice"]["enum"] == ["red", "blue"]
    assert "text" in mode["requestedSchema"]["properties"]  # free text beside the choices
    assert toldModel(server) == {"question": "Which colour?", "choices_offered": ["red", "blue"], "user_response": "blue"}
    shown = toolCalls(found)[card]
    assert shown["status"] == "completed" and "**Answer:** blue" in json.dumps(shown["content"])


@pytest_twisted.ensureDeferred
async def test_aFormsFreeTextAndADecline(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [*asking("Name the project?"), [{"text": "ok"}],
                                 *asking("Deploy now?", ["yes", "no"], "d"), [{"text": "ok"}]]
    replies = [{"action": "accept", "content": {"text": "Ada"}}, {"action": "decline"}]
    client = RecordingClient(elicitation=lambda request: replies.pop(0))

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn, elicitation=FORM)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("name it")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("deploy")]), 30)
            return wire.problems()

    assert await onLoop(scenario()) == []
    free = client.elicitations[0][1]["requestedSchema"]
    assert free["required"] == ["text"] and "choice" not in free["properties"]  # never an empty form
    assert toldModel(server, 1)["user_response"] == "Ada"
    assert toldModel(server, 3, "d")["user_response"] == "[the user declined to answer]"


@pytest_twisted.ensureDeferred
async def test_aCancelEndsTheQuestionAtOnce(scriptedServer, tmp_path) -> None:
    """The user cancels the turn while the form is open: the request is withdrawn, the
    prompt answers cancelled at once, and the model's history says nobody answered."""
    server, url = scriptedServer
    server.default.responses += [*asking("Which colour?", ["red", "blue"]), [{"text": "never"}]]
    asked = asyncio.Event()

    async def never(request: dict[str, Any]) -> Any:
        asked.set()
        await asyncio.sleep(600)

    client = RecordingClient(elicitation=never)

    async def scenario():
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn, elicitation=FORM)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("paint")]))
            await asyncio.wait_for(asked.wait(), 30)
            began = time.monotonic()
            await rawNotify(conn, "session/cancel", {"sessionId": sid})
            response = await asyncio.wait_for(prompt, 30)
            return response, time.monotonic() - began, wire

    response, took, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert response.stop_reason == "cancelled" and took < 3  # measured: 5-7 ms
    assert any(f.get("method") == "$/cancel_request" for f in wire.received)
    assert len(server.chatRequests) == 1  # the model is not asked again in a cancelled turn


@pytest_twisted.ensureDeferred
async def test_closingTheSessionEndsTheQuestion(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [*asking("Which colour?"), [{"text": "never"}]]
    asked = asyncio.Event()

    async def never(request: dict[str, Any]) -> Any:
        asked.set()
        await asyncio.sleep(600)

    async def scenario():
        async with connect(RecordingClient(elicitation=never), env=modelEnv(url)) as (conn, _, wire, process):
            await initialized(conn, elicitation=FORM)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("paint")]))
            await asyncio.wait_for(asked.wait(), 30)
            await asyncio.wait_for(conn.close_session(session_id=sid), 30)
            return await asyncio.wait_for(prompt, 30), wire

    response, wire = await onLoop(scenario())
    assert wire.problems() == []
    assert response.stop_reason == "cancelled"
    assert any(f.get("method") == "$/cancel_request" for f in wire.received)


@pytest_twisted.ensureDeferred
async def test_theTimeoutIsNoAnswer(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [*asking("Which colour?"), [{"text": "I will pick myself."}]]

    async def never(request: dict[str, Any]) -> Any:
        await asyncio.sleep(600)

    client = RecordingClient(elicitation=never)
    response, found, wire = await onLoop(oneTurn(client, url, str(tmp_path), "paint",
                                                 HERMES_ACP_PERMISSION_TIMEOUT="1"))
    assert wire.problems() == []
    assert response.stop_reason == "end_turn"
    assert toldModel(server)["user_response"] == "[no answer: nobody answered within 1 second]"


@pytest_twisted.ensureDeferred
async def test_withoutFormsTheChoicesArePermissionOptions(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [*asking("Which colour?", ["red", "blue"]), [{"text": "Blue."}]]
    client = RecordingClient(permission=answers("choice-1"))
    response, found, wire = await onLoop(oneTurn(client, url, str(tmp_path), "paint", form=False))
    assert wire.problems() == []
    assert client.elicitations == []
    [(_, toolCall, options)] = client.permissionRequests
    assert [o.name for o in options] == ["red", "blue", "Don't answer"]
    assert toolCall.tool_call_id in toolCalls(found) and "Which colour?" in json.dumps(toolCall.model_dump(mode="json"))
    assert toldModel(server)["user_response"] == "blue"


@pytest_twisted.ensureDeferred
async def test_withoutFormsFreeTextEndsTheTurnAndTheNextPromptAnswers(scriptedServer, tmp_path) -> None:
    """The question becomes the agent's message and the turn ends; the user's next
    prompt is the answer the model reads; then a restart replays question and answer."""
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.default.responses += [*asking("What should the project be called?"), [{"text": "Called it Ada."}]]
    client = RecordingClient()

    async def firstLife():
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            first = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("name it")]), 30)
            asked = len(server.chatRequests)
            second = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("Ada")]), 30)
            return sid, first, asked, second, updates(wire, sid), wire.problems()

    sid, first, asked, second, found, problems = await onLoop(firstLife())
    assert problems == []
    assert first.stop_reason == "end_turn" and asked == 1  # the model was not asked again
    said = "".join(u["content"]["text"] for u in found if u["sessionUpdate"] == "agent_message_chunk")
    assert said.startswith("What should the project be called?")
    assert client.permissionRequests == []
    assert second.stop_reason == "end_turn"
    messages = server.chatRequests[1]["messages"]
    told = json.loads(next(m["content"] for m in messages if m["role"] == "tool"))
    assert told["user_response"] is None and "next message is the answer" in told["note"]
    assert messages[-1] == {"role": "user", "content": "Ada"}

    replayed, problems = await onLoop(loaded(url, home, str(tmp_path), sid))
    assert problems == []
    shown = json.dumps(replayed)
    assert "What should the project be called?" in shown and "Ada" in shown and "Called it Ada." in shown


@pytest_twisted.ensureDeferred
async def test_aFormsQuestionAndAnswerAreReplayed(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    home = tempfile.mkdtemp()
    server.default.responses += [*asking("Which colour?", ["red", "blue"]), [{"text": "Blue it is."}]]
    client = RecordingClient(elicitation=lambda request: {"action": "accept", "content": {"choice": "blue"}})

    async def lives():
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await initialized(conn, elicitation=FORM)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("paint")]), 30)
        return await loaded(url, home, str(tmp_path), sid)

    replayed, problems = await onLoop(lives())
    assert problems == []
    [card] = toolCalls(replayed).values()
    assert "**Question:** Which colour?" in json.dumps(card["content"]) and "**Answer:** blue" in json.dumps(card["content"])
