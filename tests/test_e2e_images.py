"""Images end to end: the real process, the SDK client, a scripted model (and MCP server)."""

from __future__ import annotations

import asyncio
import base64
import json
import tempfile
import time
from typing import Any

import acp
import pytest_twisted

from .e2e import agentText, answers, modelEnv, text, toolCalls, updates
from .imagedata import jpeg, png
from .mcp_e2e import call, scripted
from .sdkclient import RecordingClient, connect, initialized, onLoop, settled, until


def imageParts(request: dict[str, Any]) -> list[str]:
    """The data URLs of a model request's image parts."""
    return [part["image_url"]["url"] for message in request["messages"] if isinstance(message["content"], list)
            for part in message["content"] if part.get("type") == "image_url"]


def texts(request: dict[str, Any]) -> str:
    return json.dumps([m["content"] for m in request["messages"]], ensure_ascii=False)


def dataURL(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def oneTurn(env: dict[str, str], cwd: Any, prompt: str, client: RecordingClient | None = None,
                  servers: list[Any] = ()) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    """One session in ``cwd`` and one prompt: the answer, the session's updates, the frames'
    problems."""
    async with connect(client, env=env) as (conn, _, wire, process):
        await initialized(conn)
        sid = (await conn.new_session(cwd=str(cwd), mcp_servers=list(servers))).session_id
        response = await conn.prompt(session_id=sid, prompt=[text(prompt)])
        return response, updates(wire, sid), wire.problems()


@pytest_twisted.ensureDeferred
async def test_imageReadReachesTheModelAndTheCard(scriptedServer, tmp_path) -> None:
    """read_file on a PNG, and on a JPEG without a suffix (found by its content): the next
    request carries both as image_url parts after the tool results; each card previews its
    image (ACP image content); a later load (another process) replays the cards, the model
    still sees the images in the next turn, and every frame validates."""
    server, url = scriptedServer
    (tmp_path / "red.png").write_bytes(png(4, 3))
    (tmp_path / "photo").write_bytes(jpeg(640, 480))
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "read_file", "arguments": {"path": "red.png"}},
                         {"id": "b", "name": "read_file", "arguments": {"path": "photo"}}]}],
        [{"text": "A red square and a photo."}],
        [{"text": "Still the same two."}],
    ]
    home = tempfile.mkdtemp(prefix="hermes-home-")

    async def firstLife():
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            response = await conn.prompt(session_id=sid, prompt=[text("look at them")])
            return sid, response, updates(wire, sid), wire.problems()

    async def secondLife(sid):
        async with connect(env=modelEnv(url, home)) as (conn, client, wire, process):
            await initialized(conn)
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            replayed = updates(wire, sid)
            await conn.prompt(session_id=sid, prompt=[text("and now?")])
            return replayed, wire.problems()

    sid, response, found, problems = await onLoop(firstLife())
    assert (response.stop_reason, problems) == ("end_turn", [])
    request = server.chatRequests[-1]
    assert imageParts(request) == [dataURL("image/png", png(4, 3)), dataURL("image/jpeg", jpeg(640, 480))]
    roles = [m["role"] for m in request["messages"]]
    assert roles[-3:] == ["tool", "tool", "user"]  # the images follow the results, in a user message
    results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    assert "PNG, 4×3 pixels" in results[0] and "JPEG, 640×480 pixels" in results[1]
    cards = list(toolCalls(found).values())
    previews = [[c["content"] for c in card["content"] if c["content"]["type"] == "image"] for card in cards]
    assert previews == [[{"type": "image", "data": base64.b64encode(png(4, 3)).decode(), "mimeType": "image/png"}],
                        [{"type": "image", "data": base64.b64encode(jpeg(640, 480)).decode(), "mimeType": "image/jpeg"}]]
    assert [card["status"] for card in cards] == ["completed", "completed"]
    replayed, problems = await onLoop(secondLife(sid))
    assert problems == []
    again = list(toolCalls(replayed).values())
    assert [[c["content"] for c in card["content"] if c["content"]["type"] == "image"] for card in again] == previews
    assert imageParts(server.chatRequests[-1]) == imageParts(request)  # the history kept them


@pytest_twisted.ensureDeferred
async def test_visionAnalyzeAsksTheVisionModel(scriptedServer, tmp_path) -> None:
    """A model that cannot see (HERMES_ACP_MODEL_VISION=off) is offered vision_analyze when a
    vision model is configured: the vision model gets the question and the image, and its
    answer is the tool's result; a read image reaches it as a line naming the file, never as
    an image. Without HERMES_ACP_VISION_MODEL the tool is not offered."""
    server, url = scriptedServer
    (tmp_path / "red.png").write_bytes(png(8, 8))
    server.addRule("What colour", [[{"text": "A plain red square."}]])
    server.default.responses += [
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "red.png"}}]}],
        [{"tool_calls": [{"id": "v", "name": "vision_analyze",
                          "arguments": {"image_url": "red.png", "question": "What colour is it?"}}]}],
        [{"text": "It is red."}],
        [{"text": "plain"}],
    ]

    env = modelEnv(url, HERMES_ACP_MODEL_VISION="off", HERMES_ACP_VISION_MODEL="eye-model")
    response, found, problems = await onLoop(oneTurn(env, tmp_path, "describe red.png"))
    assert (response.stop_reason, problems) == ("end_turn", [])
    main = [r for r in server.chatRequests if r["model"] == "scripted-model"]
    vision = [r for r in server.chatRequests if r["model"] == "eye-model"]
    assert "vision_analyze" in [t["function"]["name"] for t in main[0]["tools"]]
    assert all(imageParts(r) == [] for r in main)
    assert "cannot see images; vision_analyze can describe an image file" in texts(main[1])
    assert len(vision) == 1 and imageParts(vision[0]) == [dataURL("image/png", png(8, 8))]
    assert vision[0]["messages"][0]["content"][0] == {"type": "text", "text": "What colour is it?"}
    assert "tools" not in vision[0]
    result = [m["content"] for m in main[2]["messages"] if m["role"] == "tool"][-1]
    assert json.loads(result) == {"success": True, "analysis": "A plain red square."}
    card = list(toolCalls(found).values())[1]
    assert (card["kind"], card["title"], card["status"]) == ("read", "Analyze image red.png", "completed")

    await onLoop(oneTurn(modelEnv(url, HERMES_ACP_MODEL_VISION="off"), tmp_path, "describe red.png"))
    assert "vision_analyze" not in [t["function"]["name"] for t in server.chatRequests[-1]["tools"]]


@pytest_twisted.ensureDeferred
async def test_aModelThatRefusesImagesIsLearned(scriptedServer, tmp_path) -> None:
    """By default a model nobody said anything about is shown the image; an endpoint that
    refuses it (OpenAI's 400) makes the turn ask again without images, and the next turns
    send none."""
    server, url = scriptedServer
    server.blind.add("scripted-model")
    (tmp_path / "red.png").write_bytes(png())
    server.default.responses += [
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "red.png"}}]}],
        [{"text": "I cannot see it."}],
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "red.png"}}]}],
        [{"text": "Still cannot."}],
    ]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            first = await conn.prompt(session_id=sid, prompt=[text("look")])
            second = await conn.prompt(session_id=sid, prompt=[text("look again")])
            return first, second, wire.problems()

    first, second, problems = await onLoop(scenario())
    assert (first.stop_reason, second.stop_reason, problems) == ("end_turn", "end_turn", [])
    assert server.imageRefusals == 1
    assert "cannot see images" in texts(server.chatRequests[-1])


@pytest_twisted.ensureDeferred
async def test_aModelListThatSaysAModelCannotSeeIsBelieved(scriptedServer, tmp_path) -> None:
    """The endpoint's /models says the model takes text only (OpenRouter's
    architecture.input_modalities): no request of it ever carries an image, and /doctor says so."""
    server, url = scriptedServer
    server.blind.add("scripted-model")
    server.sight["scripted-model"] = False
    (tmp_path / "red.png").write_bytes(png())
    server.default.responses += [
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": "red.png"}}]}],
        [{"text": "I cannot see it."}],
    ]

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text("/model")])  # answered once the model list is in
            response = await conn.prompt(session_id=sid, prompt=[text("look")])
            await conn.prompt(session_id=sid, prompt=[text("/doctor")])
            return response, agentText(updates(wire, sid)), wire.problems()

    response, said, problems = await onLoop(scenario())
    assert (response.stop_reason, problems) == ("end_turn", [])
    assert ("**Images:** the model sees them: no (HERMES_ACP_MODEL_VISION=auto); vision_analyze is not offered "
            "(set HERMES_ACP_VISION_MODEL)") in said
    assert server.imageRefusals == 0
    assert "cannot see images" in texts(server.chatRequests[-1])


@pytest_twisted.ensureDeferred
async def test_imageLimitsAndBadImages(scriptedServer, tmp_path) -> None:
    """Over the byte or pixel limit, damaged, of a format the model cannot be shown, or
    named like an image without being one: the call fails with a message that says why
    (and which setting raises a limit), and no image goes to the model. A sensitive file is
    asked about first, as read_file asks, and a refusal keeps it from the model."""
    server, url = scriptedServer
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.png").write_bytes(png(40, 40) + b"\0" * 3000)
    (work / "wide.png").write_bytes(png(300, 2))
    (work / "cut.png").write_bytes(png()[:-12])
    (work / "old.bmp").write_bytes(b"BM" + b"\0" * 60)
    (work / "fake.jpg").write_bytes(b"just text\n")
    (work / ".ssh").mkdir()
    (work / ".ssh" / "key.png").write_bytes(png())
    names = ["big.png", "wide.png", "cut.png", "old.bmp", "fake.jpg", ".ssh/key.png"]
    server.default.responses += [
        [{"tool_calls": [{"id": str(i), "name": "read_file", "arguments": {"path": name}} for i, name in enumerate(names)]}],
        [{"text": "None of them."}],
    ]
    client = RecordingClient(permission=answers("reject_once"))
    env = modelEnv(url, HERMES_ACP_IMAGE_MAX_BYTES="2048", HERMES_ACP_IMAGE_MAX_SIDE="200")
    response, found, problems = await onLoop(oneTurn(env, work, "read them", client))
    assert (response.stop_reason, problems) == ("end_turn", [])
    results = [m["content"] for m in server.chatRequests[-1]["messages"] if m["role"] == "tool"]
    assert "images up to 2.0 KiB can be shown to the model (HERMES_ACP_IMAGE_MAX_BYTES)" in results[0]
    assert "300×2 pixels" in results[1] and "HERMES_ACP_IMAGE_MAX_SIDE" in results[1]
    assert "the PNG image is cut short" in results[2]
    assert "it is a BMP image; the model can be shown PNG, JPEG, GIF and WebP images only" in results[3]
    assert "named like an image but its content is none of PNG, JPEG, GIF or WebP" in results[4]
    assert results[5].startswith("Error: Read not approved (reads SSH keys") and len(client.permissionRequests) == 1
    assert imageParts(server.chatRequests[-1]) == []
    assert [c["status"] for c in toolCalls(found).values()] == ["failed"] * 6


@pytest_twisted.ensureDeferred
async def test_mcpImageReachesTheModel(scriptedServer, tmp_path) -> None:
    """An MCP tool's image result reaches the model as an image_url part (and the editor as
    ACP image content); a damaged one is named to the model, not sent."""
    server, url = scriptedServer
    shot = base64.b64encode(png(6, 5)).decode()
    tool = {"name": "screenshot", "description": "a picture", "inputSchema": {"type": "object"},
            "behaviour": {"content": [{"type": "text", "text": "here it is"},
                                      {"type": "image", "data": shot, "mimeType": "image/png"},
                                      {"type": "image", "data": base64.b64encode(b"GIF89a").decode(),
                                       "mimeType": "image/gif"}]}}
    srv, _ = scripted(tmp_path, "cam", tools=[tool])
    server.default.responses += [call("s", "mcp__cam__screenshot"), [{"text": "Seen."}]]
    client = RecordingClient(permission=answers("allow_once"))
    response, found, problems = await onLoop(oneTurn(modelEnv(url), tmp_path, "take a screenshot", client, [srv]))
    assert (response.stop_reason, problems) == ("end_turn", [])
    request = server.chatRequests[-1]
    assert imageParts(request) == [f"data:image/png;base64,{shot}"]
    assert "Image 2, from mcp__cam__screenshot: content block 3 — not shown: its GIF header is damaged" in texts(request)
    card = list(toolCalls(found).values())[0]
    assert {"type": "image", "data": shot, "mimeType": "image/png"} in [c["content"] for c in card["content"]]


@pytest_twisted.ensureDeferred
async def test_promptImagesAreChecked(scriptedServer, tmp_path) -> None:
    """A prompt's image goes to the model with the type its content has; one the model cannot
    be shown is replaced by a line saying why. With HERMES_ACP_MODEL_VISION=off the agent does
    not advertise prompt images."""
    server, url = scriptedServer
    server.default.responses += [[{"text": "ok"}]]

    async def scenario(env):
        async with connect(env=env) as (conn, client, wire, process):
            answer = await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            if answer.agent_capabilities.prompt_capabilities.image:
                await conn.prompt(session_id=sid, prompt=[
                    text("what are these?"), acp.image_block(base64.b64encode(png()).decode(), "image/jpeg"),
                    acp.image_block(base64.b64encode(b"BM" + b"\0" * 40).decode(), "image/bmp")])
            return answer.agent_capabilities.prompt_capabilities.image, wire.problems()

    seen, problems = await onLoop(scenario(modelEnv(url)))
    assert (seen, problems) == (True, [])
    request = server.chatRequests[-1]
    assert imageParts(request) == [dataURL("image/png", png())]
    assert "[An attached image is not shown: it is a BMP image" in texts(request)
    seen, problems = await onLoop(scenario(modelEnv(url, HERMES_ACP_MODEL_VISION="off")))
    assert (seen, problems) == (False, [])


@pytest_twisted.ensureDeferred
async def test_visionAnalyzeStopsWithTheTurn(scriptedServer, tmp_path) -> None:
    """A cancel while the vision model is answering ends its request (the server sees the
    connection go) and the turn answers cancelled at once; the card fails. (Measured:
    4-14 ms from the cancel to the answer; the bound is a generous multiple.)"""
    server, url = scriptedServer
    (tmp_path / "red.png").write_bytes(png())
    server.addRule("What colour", [[{"text": "It is"}, {"stall": True}]])
    server.default.responses += [[{"tool_calls": [{"id": "v", "name": "vision_analyze",
                                                   "arguments": {"image_url": "red.png", "question": "What colour?"}}]}]]

    async def scenario():
        async with connect(env=modelEnv(url, HERMES_ACP_VISION_MODEL="eye-model")) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("describe it")]))
            await settled(server.whenStalled())
            began = time.monotonic()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(running, 30)
            took = time.monotonic() - began
            await until(lambda: server.abandoned >= 1, 10, "the vision request to be dropped")
            return response, took, updates(wire, sid), wire.problems()

    response, took, found, problems = await onLoop(scenario())
    assert (response.stop_reason, problems) == ("cancelled", [])
    assert took < 3, took
    assert [c["status"] for c in toolCalls(found).values()] == ["failed"]


@pytest_twisted.ensureDeferred
async def test_imagesPerRequestAndPreviewBounds(scriptedServer, tmp_path) -> None:
    """HERMES_ACP_IMAGES_PER_REQUEST=1: of two images one reply's calls read, the model gets the
    first (the other is named), and a later request carries only the newest image, each older
    one a line. HERMES_ACP_IMAGE_PREVIEW_BYTES under the image's size: the card says what it
    is instead of showing it."""
    server, url = scriptedServer
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(png(3, 3, (ord(name[0]), 0, 0)))
    server.default.responses += [
        [{"tool_calls": [{"id": "a", "name": "read_file", "arguments": {"path": "a.png"}},
                         {"id": "b", "name": "read_file", "arguments": {"path": "b.png"}}]}],
        [{"tool_calls": [{"id": "c", "name": "read_file", "arguments": {"path": "c.png"}}]}],
        [{"text": "Three squares."}],
    ]
    env = modelEnv(url, HERMES_ACP_IMAGES_PER_REQUEST="1", HERMES_ACP_IMAGE_PREVIEW_BYTES="50")
    response, found, problems = await onLoop(oneTurn(env, tmp_path, "look at them"))
    assert (response.stop_reason, problems) == ("end_turn", [])
    second, third = server.chatRequests[1:3]
    assert imageParts(second) == [dataURL("image/png", png(3, 3, (ord("a"), 0, 0)))]
    assert "Image 2, from read_file: " in texts(second) and "only the first 1 images of one reply" in texts(second)
    assert imageParts(third) == [dataURL("image/png", png(3, 3, (ord("c"), 0, 0)))]
    assert "(an earlier image, not shown again: at most 1 images go with one request" in texts(third)
    for card in toolCalls(found).values():
        shown = [c["content"] for c in card["content"]]
        assert [c["type"] for c in shown] == ["text"] and shown[0]["text"].endswith("too big to preview here")


@pytest_twisted.ensureDeferred
async def test_compactionDropsOlderImages(scriptedServer, tmp_path) -> None:
    """On a small window, turns that read big files compact the conversation: the image an
    early turn read leaves the requests (a line says it was there), the newest image stays,
    no two user messages follow each other, and every frame validates."""
    from .test_e2e_compaction import files, reading

    model, url = scriptedServer
    model.window = model.windows["scripted-model"] = 8000
    turns = 5
    reading(model, turns)
    files(tmp_path, turns)
    (tmp_path / "old.png").write_bytes(png(2, 2))
    (tmp_path / "new.png").write_bytes(png(5, 5))
    for name in ("old", "new"):
        model.addRule(f"look {name}", [call(name, "read_file", path=f"{name}.png")])
        model.addRule(f"{name}.png (PNG", [[{"text": f"saw {name}"}]])  # the images message is the latest user one

    async def scenario():
        async with connect(env=modelEnv(url)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            prompts = ["look old", *(f"turn {n} please" for n in range(turns)), "look new"]
            stops = [(await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(p)]), 30)).stop_reason
                     for p in prompts]
            return stops, wire.problems()

    stops, problems = await onLoop(scenario())
    assert (set(stops), problems) == ({"end_turn"}, [])
    assert model.overflows == 0 and (model.summaryRequests or "[An image was here" in texts(model.chatRequests[-1]))
    last = model.chatRequests[-1]
    assert imageParts(last) == [dataURL("image/png", png(5, 5))]
    roles = [m["role"] for m in last["messages"]]
    assert all(not (a == b == "user") for a, b in zip(roles, roles[1:]))


@pytest_twisted.ensureDeferred
async def test_theHistoryKeepsOnlyTheImagesARequestCanCarry(scriptedServer, tmp_path) -> None:
    """A turn whose steps read image after image (HERMES_ACP_IMAGES_PER_REQUEST=2): the stored
    history keeps the bytes of the newest two only, each older one a line, since no request
    would carry it again; so a tool that returns big images step after step cannot grow the
    session's database (and memory) by megabytes a step."""
    import sqlite3
    from pathlib import Path

    server, url = scriptedServer
    colours = [(n * 40, 0, 0) for n in range(1, 5)]
    for n, colour in enumerate(colours):
        (tmp_path / f"{n}.png").write_bytes(png(3, 3, colour))
    server.default.responses += [
        *([{"tool_calls": [{"id": str(n), "name": "read_file", "arguments": {"path": f"{n}.png"}}]}]
          for n in range(4)),
        [{"text": "Four squares."}],
    ]
    home = tempfile.mkdtemp(prefix="hermes-home-")
    env = modelEnv(url, home, HERMES_ACP_IMAGES_PER_REQUEST="2", HERMES_ACP_IMAGE_PREVIEW_BYTES="0")
    response, found, problems = await onLoop(oneTurn(env, tmp_path, "look at them"))
    assert (response.stop_reason, problems) == ("end_turn", [])
    assert imageParts(server.chatRequests[-1]) == [dataURL("image/png", png(3, 3, c)) for c in colours[2:]]
    with sqlite3.connect(Path(home) / "state.db", timeout=5) as db:
        stored = json.dumps(db.execute("SELECT * FROM acp_messages").fetchall(), default=str)
    held = [base64.b64encode(png(3, 3, c)).decode() in stored for c in colours]
    assert held == [False, False, True, True]
    assert "(an earlier image, not shown again: at most 2 images go with one request" in stored
