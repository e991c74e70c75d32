"""``clarify`` in the engine (the real AIAgent, the scripted model, a recording observer)
and the ACP forms of a question (``hermes_acp.questions``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted

from hermes_acp.engine.asking import ACCEPTED, CANCELLED, DECLINED, DEFERRED, MAX_ANSWER_CHARS, NO_ANSWER
from hermes_acp.questions import choiceOptions, formRequest, readChoice, readForm

from .test_engine_agent import OBSERVERS, call, makeAgent, run, toolResults, tools, workspace  # noqa: F401


@pytest_twisted.ensureDeferred
async def test_theAnswerReachesTheModel(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("q", "clarify", question=" Which colour? ", choices=["red", "blue"])),
                                     [{"text": "blue it is"}]])
    agent, seen = makeAgent(url, workspace)
    seen.userAnswer = (ACCEPTED, "blue")
    result = await run(agent, "paint it")
    assert result.stop_reason == "end_turn" and result.final_text == "blue it is"
    assert seen.questions == [("1.0", "Which colour?", ["red", "blue"])]
    assert json.loads(toolResults(server.chatRequests[1])["q"]) == {
        "question": "Which colour?", "choices_offered": ["red", "blue"], "user_response": "blue"}


@pytest_twisted.ensureDeferred
async def test_noAnswerIsSaidInPlainWords(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([tools(call("q", "clarify", question="Go on?")), [{"text": "ok"}]])
    agent, seen = makeAgent(url, workspace)
    seen.userAnswer = (NO_ANSWER, "nobody answered within 60 seconds")
    await run(agent, "hi")
    told = json.loads(toolResults(server.chatRequests[1])["q"])
    assert told["user_response"] == "[no answer: nobody answered within 60 seconds]"


@pytest_twisted.ensureDeferred
async def test_aDeferredQuestionEndsTheTurn(scriptedServer, workspace: Path) -> None:
    """Free text with nobody to fill a form: the turn ends without asking the model again."""
    server, url = scriptedServer
    server.default.responses.extend([tools(call("q", "clarify", question="What name?"))])
    agent, seen = makeAgent(url, workspace)
    seen.userAnswer = (DEFERRED, "")
    result = await run(agent, "name it")
    assert result.stop_reason == "end_turn" and len(server.chatRequests) == 1
    told = json.loads(result.messages[-1]["content"])
    assert told["user_response"] is None and "next message is the answer" in told["note"]


@pytest_twisted.ensureDeferred
async def test_badQuestionsNeverReachTheUser(scriptedServer, workspace: Path) -> None:
    server, url = scriptedServer
    server.default.responses.extend([
        tools(call("a", "clarify", question="   "), call("b", "clarify", question="x", choices=["1", "2", "3", "4", "5"]),
              call("c", "clarify", question="x", choices=["same", "same"]), call("d", "clarify", question="x", choices=[3])),
        [{"text": "ok"}]])
    agent, seen = makeAgent(url, workspace)
    await run(agent, "hi")
    results = toolResults(server.chatRequests[1])
    assert all(text.startswith("Error:") for text in results.values()), results
    assert seen.questions == []


def test_theFormOffersChoicesAndFreeText() -> None:
    params = formRequest("s", "t", "Which?", ["a", "b"])
    assert params["mode"] == "form" and params["toolCallId"] == "t" and params["message"] == "Which?"
    properties = params["requestedSchema"]["properties"]
    assert properties["choice"]["enum"] == ["a", "b"] and properties["text"]["type"] == "string"
    free = formRequest("s", "t", "Name?", [])["requestedSchema"]
    assert free["required"] == ["text"] and free["properties"]["text"]["minLength"] == 1


@pytest.mark.parametrize(("result", "expected"), [
    ({"action": "accept", "content": {"choice": "a"}}, (ACCEPTED, "a")),
    ({"action": "accept", "content": {"text": "  my own  "}}, (ACCEPTED, "my own")),
    ({"action": "accept", "content": {"choice": "b", "text": "but later"}}, (ACCEPTED, "b; but later")),
    ({"action": "decline"}, (DECLINED, "")),
    ({"action": "cancel", "content": {"choice": "a"}}, (CANCELLED, "")),
    ({"action": "accept", "content": {"choice": "z"}}, (NO_ANSWER, "the editor answered with a choice that was not offered")),
    ({"action": "accept", "content": {"text": 5}}, (NO_ANSWER, "the editor's answer was not text")),
    ({"action": "accept", "content": []}, (NO_ANSWER, "the editor's answer to the question was not understood")),
    ({"action": "accept"}, (NO_ANSWER, "the user submitted the question without an answer")),
    ({"action": "maybe"}, (NO_ANSWER, "the editor's answer to the question was not understood")),
    ("accept", (NO_ANSWER, "the editor's answer to the question was not understood")),
])
def test_theEditorsAnswerIsChecked(result: object, expected: tuple[str, str]) -> None:
    assert readForm(result, ["a", "b"]) == expected


def test_aHugeAnswerIsCut() -> None:
    action, text = readForm({"action": "accept", "content": {"text": "x" * 100_000}}, [])
    assert action == ACCEPTED and len(text) < MAX_ANSWER_CHARS + 100 and "cut" in text


def test_thePermissionFallbackOffersTheChoices() -> None:
    options = choiceOptions(["a", "b"])
    assert [o["name"] for o in options] == ["a", "b", "Don't answer"]
    assert readChoice(options[1]["optionId"], ["a", "b"], 60) == (ACCEPTED, "b")
    assert readChoice("decline", ["a", "b"], 60) == (DECLINED, "")
    assert readChoice("timeout", ["a", "b"], 60) == (NO_ANSWER, "nobody answered within 60 seconds")
    assert readChoice("cancelled", ["a", "b"], 60)[0] == NO_ANSWER


@pytest.mark.parametrize("field", [
    {"type": "string", "format": "password"},
    {"type": "string", "default": 5},
    {"type": "string", "minLength": -1},
    {"type": "string", "enum": ["a", 1]},
    {"type": "string", "oneOf": [{"const": "a"}]},
    {"type": "number", "minimum": "x"},
    {"type": "integer", "default": 1.5},
    {"type": "boolean", "default": "yes"},
    {"type": "array"},
    {"type": "array", "items": {"type": "string"}},
    {"type": "string", "title": 5},
])
def test_aServersFieldTheSchemaRefusesIsRefused(field: dict) -> None:
    """An MCP server's form field that ACP's ``ElicitationPropertySchema`` does not take is
    refused to the server, never forwarded as a frame the editor cannot read."""
    from hermes_acp.jsonrpc import InvalidParams
    from hermes_acp.questions import serverQuestion

    from . import acpschema

    params = {"message": "m", "requestedSchema": {"type": "object", "properties": {"x": field}}}
    with pytest.raises(InvalidParams, match="'x'"):
        request = serverQuestion("s", "t", "srv", params, ("form",), 100_000)
        pytest.fail(f"forwarded: {[e.message for e in acpschema.validator('CreateElicitationRequest').iter_errors(request)]}")


@pytest.mark.parametrize("field", [
    {"type": "string", "title": "Name", "description": "d", "minLength": 1, "maxLength": 9, "pattern": "^a",
     "format": "email", "default": "a", "enum": ["a", "b"], "enumNames": ["A", "B"]},
    {"type": "string", "oneOf": [{"const": "a", "title": "A"}]},
    {"type": "number", "minimum": 0, "maximum": 1.5, "default": 1},
    {"type": "integer", "minimum": 0, "default": 3},
    {"type": "boolean", "default": False},
    {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1, "default": ["a"]},
    {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}]}},
])
def test_aServersGoodFieldIsForwarded(field: dict) -> None:
    from hermes_acp.questions import serverQuestion

    from . import acpschema

    params = {"message": "m", "requestedSchema": {"type": "object", "properties": {"x": field}, "required": ["x"]}}
    request = serverQuestion("s", "t", "srv", params, ("form",), 100_000)
    assert request["requestedSchema"]["properties"]["x"] == field
    assert not list(acpschema.validator("CreateElicitationRequest").iter_errors(request))
