"""``web_search`` and ``web_extract`` (issue 26 §1-2) through the real process and the SDK client,
against a web the tests own on loopback (``tests/web_server.py``): a SearXNG and a keyed Brave
answer searches, errors reach the model as plain words, keys reach no frame, journal or log; fixture
pages come back as the docs promise; the fetch guard refuses a redirect to 127.0.0.1; and the
permission rule holds per mode."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from .e2e import answers, modelEnv, text
from .sdkclient import RecordingClient, connect, initialized, onLoop, rawNotify, until
from .web_server import BIG_HEAD, BIG_TAIL, listenWeb

BRAVE_KEY = "brave-key-0123456789-do-not-leak"
NO_SEARCH = {"SEARXNG_URL": "", "BRAVE_SEARCH_API_KEY": "", "TAVILY_API_KEY": "", "EXA_API_KEY": "",
             "FIRECRAWL_API_KEY": ""}


@pytest.fixture
def fakeWeb():
    web, port = listenWeb(BRAVE_KEY)
    yield web
    web.stop()
    pytest_twisted.blockon(port.stopListening())


def calls(*batches: list[tuple[str, str, dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """One model reply per batch of (id, tool, arguments), then a closing text."""
    replies = [[{"tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in batch]}] for batch in batches]
    return [*replies, [{"text": "done"}]]


def toolResult(server: Any, ident: str) -> str:
    """What the model read as the result of call ``ident`` (from the last request that has it)."""
    for request in reversed(server.chatRequests):
        for message in request["messages"]:
            if message["role"] == "tool" and message["tool_call_id"] == ident:
                return message["content"]
    raise AssertionError(f"no result for {ident}")


async def turn(url: str, cwd: str, env: dict[str, str], prompt: str = "go", mode: str | None = None,
               client: RecordingClient | None = None, home: str | None = None, stderr: Any = None,
               argv: list[str] | None = None):
    home = home or tempfile.mkdtemp(prefix="hermes-home-")
    async with connect(client or RecordingClient(), env=modelEnv(url, home, **env), stderr=stderr, argv=argv) as (
            conn, client, wire, process):
        await initialized(conn)
        sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
        if mode:
            await conn.set_session_mode(session_id=sid, mode_id=mode)
        began = time.monotonic()
        response = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text(prompt)]), 60)
        return response, wire, client, home, sid, time.monotonic() - began


def journal(home: str) -> str:
    with sqlite3.connect(Path(home) / "state.db", timeout=5) as db:
        rows = db.execute("SELECT payload FROM acp_journal").fetchall()
        messages = db.execute("SELECT * FROM acp_messages").fetchall() if _hasTable(db, "acp_messages") else []
    return json.dumps([rows, messages], default=str)


def _hasTable(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


@pytest_twisted.ensureDeferred
async def test_aSearxngAnswersWebSearch(scriptedServer, fakeWeb, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += calls([("s", "web_search", {"query": "twisted reactor", "limit": 3})])
    env = {**NO_SEARCH, "SEARXNG_URL": f"http://127.0.0.1:{fakeWeb.port}"}
    response, wire, *_ = await onLoop(turn(url, str(tmp_path), env))
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    offered = {tool["function"]["name"] for tool in server.chatRequests[0]["tools"]}
    assert {"web_search", "web_extract"} <= offered
    result = json.loads(toolResult(server, "s"))
    assert result["success"] is True and "not instructions" in result["note"]
    web = result["data"]["web"]
    assert [hit["position"] for hit in web] == [1, 2, 3]  # bounded by limit
    assert web[0]["title"] == "Result 1 for twisted reactor"  # the backend's HTML marks are gone
    assert web[0]["url"] == "https://example.org/1"
    assert web[0]["description"].startswith("Snippet 1 about twisted reactor") and len(web[0]["description"]) <= 1000
    searched = [path for path, _ in fakeWeb.requests if path.startswith("/search")]
    assert searched and "format=json" in searched[0] and "q=twisted+reactor" in searched[0]


@pytest_twisted.ensureDeferred
async def test_braveErrorsReachTheModelAsTextAndTheKeyNowhere(scriptedServer, fakeWeb, tmp_path) -> None:
    """Brave with a key: a good answer, 401, 429 with Retry-After, garbage that quotes the key,
    and a backend that never answers; the model reads each in plain words, and the key is in
    no frame, no journal row and no log line."""
    server, url = scriptedServer
    queries = {"ok": "plain words", "r": "ratelimit please", "g": "garbage please", "t": "stall please"}
    server.default.responses += calls([(i, "web_search", {"query": q}) for i, q in queries.items()])
    env = {**NO_SEARCH, "BRAVE_SEARCH_API_KEY": BRAVE_KEY, "HERMES_ACP_WEB_BRAVE_URL": f"http://127.0.0.1:{fakeWeb.port}",
           "HERMES_ACP_WEB_SECONDS": "2"}
    debug = [sys.executable, "-m", "hermes_acp", "--log-level", "debug"]
    with tempfile.TemporaryFile() as log:
        response, wire, _, home, sid, took = await onLoop(turn(url, str(tmp_path), env, stderr=log, argv=debug))
        log.seek(0)
        logged = log.read().decode(errors="replace")
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    assert json.loads(toolResult(server, "ok"))["data"]["web"][0]["url"] == "https://example.org/1"
    assert "rate limiting" in toolResult(server, "r") and "retry after 7 seconds" in toolResult(server, "r")
    assert "not search results" in toolResult(server, "g")
    assert "did not answer within 2 s" in toolResult(server, "t")
    assert took < 30  # the stalled backend is bounded (measured: 2.2-2.3 s)
    braveHeaders = [headers for path, headers in fakeWeb.requests if path.startswith("/res/v1/web/search")]
    assert braveHeaders and all(h.get("x-subscription-token") == BRAVE_KEY for h in braveHeaders)
    frames = json.dumps(wire.received) + json.dumps(server.chatRequests)
    assert BRAVE_KEY not in frames and BRAVE_KEY not in journal(home) and BRAVE_KEY not in logged


@pytest_twisted.ensureDeferred
async def test_aRefusedKeyIsNamedNotShown(scriptedServer, fakeWeb, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += calls([("k", "web_search", {"query": "anything"})])
    wrong = "wrong-brave-key-9876543210"
    env = {**NO_SEARCH, "BRAVE_SEARCH_API_KEY": wrong, "HERMES_ACP_WEB_BRAVE_URL": f"http://127.0.0.1:{fakeWeb.port}"}
    response, wire, *_ = await onLoop(turn(url, str(tmp_path), env))
    said = toolResult(server, "k")
    assert "HTTP 401" in said and "BRAVE_SEARCH_API_KEY" in said and wrong not in said
    assert wrong not in json.dumps(wire.received)


@pytest_twisted.ensureDeferred
async def test_withoutABackendTheToolIsNotOfferedAndDoctorSaysHow(scriptedServer, tmp_path) -> None:
    server, url = scriptedServer
    server.default.responses += [[{"text": "hello"}]]

    async def scenario():
        async with connect(RecordingClient(), env=modelEnv(url, **NO_SEARCH)) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 30)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/doctor")]), 30)
            return wire

    wire = await onLoop(scenario())
    offered = {tool["function"]["name"] for tool in server.chatRequests[0]["tools"]}
    assert "web_search" not in offered and "web_extract" in offered
    doctor = json.dumps([f for f in wire.received if f.get("method") == "session/update"])
    assert "Web search" in doctor and "SEARXNG_URL" in doctor
    checked = subprocess.run([sys.executable, "-m", "hermes_acp", "--check"], capture_output=True, text=True,
                             env=modelEnv(url, **NO_SEARCH), timeout=60)
    assert "web search:" in checked.stdout and "SEARXNG_URL" in checked.stdout


def extractEnv(web: Any, seconds: str = "3") -> dict[str, str]:
    return {**NO_SEARCH, "HERMES_ACP_WEB_ALLOW_HOSTS": "localhost", "HERMES_ACP_WEB_SECONDS": seconds}


@pytest_twisted.ensureDeferred
async def test_webExtractTurnsFixturePagesIntoWhatTheDocsPromise(scriptedServer, fakeWeb, tmp_path) -> None:
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.default.responses += calls(
        [("a", "web_extract", {"urls": [f"{base}/article", f"{base}/doc.pdf", f"{base}/missing",
                                        f"{base}/to-loopback", f"{base}/r1"]})],
        [("b", "web_extract", {"urls": [f"{base}/big"]}), ("c", "web_extract", {"urls": [f"{base}/slow"]})],
    )
    response, wire, client, home, sid, took = await onLoop(turn(url, str(tmp_path), extractEnv(fakeWeb),
                                                                mode="dont_ask"))
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    assert client.permissionRequests == []  # dont_ask does not ask
    first = json.loads(toolResult(server, "a"))
    assert "not instructions" in first["note"]
    article, pdf, missing, loopback, chain = first["results"]
    assert article["title"] == "Tutorial — Webstruct 0.6 documentation" and article["error"] is None
    assert "This tutorial assumes you are familiar with machine learning" in article["content"]
    assert "# Tutorial" in article["content"]  # Markdown headings
    for boilerplate in ("Free document hosting provided by Read the Docs", "Edit on GitHub", "Project Home"):
        assert boilerplate not in article["content"]
    assert "crazy ones" in pdf["content"] and pdf["error"] is None
    assert missing["error"] == "HTTP 404 Not Found"
    assert "127.0.0.1" in loopback["error"] and "loopback" in loopback["error"] and not loopback["content"]
    assert chain["url"] == f"{base}/article" and chain["content"] == article["content"]
    assert sum(path == "/article" for path, _ in fakeWeb.requests) == 2  # the loopback redirect was not followed
    assert all("cookie" not in headers for _, headers in fakeWeb.requests)  # no cookie kept or sent
    [big] = json.loads(toolResult(server, "b"))["results"]
    assert BIG_HEAD in big["content"] and BIG_TAIL in big["content"]
    assert len(big["content"]) < 15_000 + 600
    saved = big["content"].rsplit(" is saved in ", 1)[1].split(" (", 1)[0]
    assert Path(saved).is_file() and Path(saved).parent.name == f"hermes-acp-web-{os.getuid()}"
    whole = Path(saved).read_text()
    assert whole.startswith("# A very long report") and "Paragraph 5000 of a long report" in whole
    [slow] = json.loads(toolResult(server, "c"))["results"]
    assert slow["error"] == "timed out after 3 s (HERMES_ACP_WEB_SECONDS)"
    assert took < 60  # measured: 8-9 s on the loaded machine (trafilatura's import, the 5 MB page, the 3 s bound)


@pytest_twisted.ensureDeferred
async def test_theSavedPageIsReadableWithReadFileWithoutAQuestion(scriptedServer, fakeWeb, tmp_path) -> None:
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    from hermes_acp.engine.tools.webextract import savedFolder

    path = os.path.join(savedFolder(), f"localhost-{hashlib.sha256(f'{base}/big'.encode()).hexdigest()[:10]}.md")
    server.default.responses += [
        [{"tool_calls": [{"id": "b", "name": "web_extract", "arguments": {"urls": [f"{base}/big"]}}]}],
        [{"tool_calls": [{"id": "r", "name": "read_file", "arguments": {"path": path, "offset": 1, "limit": 3}}]}]]
    server.default.responses.append([{"text": "read"}])
    client = RecordingClient(permission=answers("allow_once"))
    response, wire, client, *_ = await onLoop(turn(url, str(tmp_path), extractEnv(fakeWeb), client=client))
    assert f"is saved in {path}" in toolResult(server, "b")
    assert len(client.permissionRequests) == 1  # the fetch; the read of the saved page asks nothing
    assert BIG_HEAD in toolResult(server, "r")


@pytest.mark.parametrize("mode", ["default", "accept_edits", "plan", "dont_ask"])
@pytest_twisted.ensureDeferred
async def test_thePermissionRulePerMode(scriptedServer, fakeWeb, tmp_path, mode) -> None:
    """``default``, ``accept_edits`` and ``plan`` ask once per host; "always" is remembered for
    the host (the second fetch asks nothing); ``dont_ask`` never asks."""
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.default.responses += calls([("1", "web_extract", {"urls": [f"{base}/article"]})],
                                      [("2", "web_extract", {"urls": [f"{base}/doc.pdf", f"{base}/r1"]})])
    client = RecordingClient(permission=answers("allow_always"))
    response, wire, client, *_ = await onLoop(turn(url, str(tmp_path), extractEnv(fakeWeb), mode=mode,
                                                   client=client))
    assert wire.problems() == []
    asked = client.permissionRequests
    assert len(asked) == (0 if mode == "dont_ask" else 1)
    if asked:
        card = asked[0][1].model_dump(by_alias=True, exclude_none=True)
        assert card["kind"] == "fetch" and "fetches a web page from localhost" in json.dumps(card["content"])
        assert f"{base}/article" in json.dumps(card["content"]) and "locations" not in card
    assert json.loads(toolResult(server, "2"))["results"][0]["error"] is None


@pytest_twisted.ensureDeferred
async def test_aRefusedFetchFetchesNothing(scriptedServer, fakeWeb, tmp_path) -> None:
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.default.responses += calls([("1", "web_extract", {"urls": [f"{base}/article"]})],
                                      [("2", "web_extract", {"urls": [f"{base}/article"]})])
    client = RecordingClient(permission=answers("reject_always"))
    await onLoop(turn(url, str(tmp_path), extractEnv(fakeWeb), client=client))
    assert "Fetch not approved (the user denied it)" in toolResult(server, "1")
    assert "refused fetching from localhost for the rest of the session" in toolResult(server, "2")
    assert len(client.permissionRequests) == 1 and fakeWeb.requests == []


@pytest_twisted.ensureDeferred
async def test_theUsersSecretsLeaveInNoURLAndNoQuery(scriptedServer, fakeWeb, tmp_path) -> None:
    """The model puts the agent's own key (``HERMES_API_KEY``) in a URL and in a search query:
    neither is sent anywhere, nothing is asked, and the model reads why."""
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    key = modelEnv(url)["HERMES_API_KEY"]
    server.default.responses += calls([("u", "web_extract", {"urls": [f"{base}/article?k={key}"]}),
                                       ("q", "web_search", {"query": f"who owns {key}"})])
    env = {**extractEnv(fakeWeb), "SEARXNG_URL": f"http://127.0.0.1:{fakeWeb.port}"}
    client = RecordingClient(permission=answers("allow_once"))
    response, wire, client, *_ = await onLoop(turn(url, str(tmp_path), env, client=client))
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    assert "carries one of the user's secrets" in toolResult(server, "u")
    assert "carries one of the user's secrets" in toolResult(server, "q")
    assert fakeWeb.requests == [] and client.permissionRequests == []


@pytest_twisted.ensureDeferred
async def test_aCancelEndsAStalledFetchAtOnce(scriptedServer, fakeWeb, tmp_path) -> None:
    """The page drips a byte a second and its bound is far off (60 s): a cancel ends the turn at
    once, and the agent closes the page's connection."""
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.default.responses += calls([("s", "web_extract", {"urls": [f"{base}/slow"]})])

    async def scenario():
        env = modelEnv(url, **extractEnv(fakeWeb, seconds="60"))
        async with connect(RecordingClient(), env=env) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="dont_ask")
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("read it")]))
            await until(lambda: any(path == "/slow" for path, _ in fakeWeb.requests), 30, "the slow page's request")
            await asyncio.sleep(0.5)
            began = time.monotonic()
            await rawNotify(conn, "session/cancel", {"sessionId": sid})
            response = await asyncio.wait_for(prompt, 30)
            took = time.monotonic() - began
            await until(lambda: not fakeWeb.openSlow(), 10, "the slow page's connection to close")
            return response, took, wire

    response, took, wire = await onLoop(scenario())
    assert wire.problems() == [] and response.stop_reason == "cancelled"
    assert took < 3  # measured: 0.09-0.10 s (the page's own bound is 60 s)


@pytest_twisted.ensureDeferred
async def test_visionAnalyzeFetchesAnImageURLThroughTheGuard(scriptedServer, fakeWeb, tmp_path) -> None:
    """``vision_analyze`` with an http(s) URL (Hermes takes one): the fetch asks about the host
    once, as ``web_extract`` does, and the vision model gets the image; a loopback address not on
    the allow list is refused before anything is fetched or asked, and a page that is not an image
    is named as such."""
    from .imagedata import png

    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.addRule("What colour", [[{"text": "A plain red square."}]])
    server.default.responses += calls(
        [("v", "vision_analyze", {"image_url": f"{base}/red.png", "question": "What colour is it?"})],
        [("f", "vision_analyze", {"image_url": f"{base}/fake.png", "question": "What is it?"}),
         ("l", "vision_analyze", {"image_url": f"http://127.0.0.1:{fakeWeb.port}/red.png", "question": "What?"})])
    env = {**extractEnv(fakeWeb), "HERMES_ACP_MODEL_VISION": "off", "HERMES_ACP_VISION_MODEL": "eye-model"}
    client = RecordingClient(permission=answers("allow_always"))
    response, wire, client, *_ = await onLoop(turn(url, str(tmp_path), env, client=client))
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    assert json.loads(toolResult(server, "v")) == {"success": True, "analysis": "A plain red square."}
    vision = [r for r in server.chatRequests if r["model"] == "eye-model"]
    encoded = base64.b64encode(png(8, 8)).decode()
    assert len(vision) == 1 and vision[0]["messages"][0]["content"][1]["image_url"]["url"] == (
        f"data:image/png;base64,{encoded}")
    assert len(client.permissionRequests) == 1  # the host, once ("always")
    card = client.permissionRequests[0][1].model_dump(by_alias=True, exclude_none=True)
    assert "fetches a web page from localhost" in json.dumps(card["content"])
    assert f"{base}/red.png" in json.dumps(card["content"]) and "locations" not in card  # the URL, not a path
    assert "not an image" in toolResult(server, "f")
    assert "127.0.0.1" in toolResult(server, "l") and "loopback" in toolResult(server, "l")
    assert [path for path, _ in fakeWeb.requests] == ["/red.png", "/fake.png"]
    titles = [f["params"]["update"].get("title") for f in wire.received if f.get("method") == "session/update"
              and f["params"]["update"].get("sessionUpdate") == "tool_call"]
    assert f"Analyze image {base}/red.png" in titles  # the URL as it is, not as a path


@pytest_twisted.ensureDeferred
async def test_allowOnceCoversTheWholeCallNotEachPage(scriptedServer, fakeWeb, tmp_path) -> None:
    """"Allow once" allows this call's requests to the host: three pages of one host in one call
    ask once; the next call asks again."""
    server, url = scriptedServer
    base = f"http://localhost:{fakeWeb.port}"
    server.default.responses += calls([("1", "web_extract", {"urls": [f"{base}/article", f"{base}/doc.pdf",
                                                                      f"{base}/r1"]})],
                                      [("2", "web_extract", {"urls": [f"{base}/article"]})])
    client = RecordingClient(permission=answers("allow_once", "allow_once"))
    response, wire, client, *_ = await onLoop(turn(url, str(tmp_path), extractEnv(fakeWeb), client=client))
    assert wire.problems() == [] and response.stop_reason == "end_turn"
    assert [r["error"] for r in json.loads(toolResult(server, "1"))["results"]] == [None, None, None]
    assert json.loads(toolResult(server, "2"))["results"][0]["error"] is None
    assert len(client.permissionRequests) == 2


@pytest_twisted.ensureDeferred
async def test_aCancelEndsAStalledSearchAtOnce(scriptedServer, fakeWeb, tmp_path) -> None:
    """The search backend never answers and its bound is far off (60 s): a cancel ends the
    turn at once."""
    server, url = scriptedServer
    server.default.responses += calls([("s", "web_search", {"query": "stall please"})])

    async def scenario():
        env = modelEnv(url, **{**NO_SEARCH, "SEARXNG_URL": f"http://127.0.0.1:{fakeWeb.port}",
                               "HERMES_ACP_WEB_SECONDS": "60"})
        async with connect(RecordingClient(), env=env) as (conn, client, wire, process):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text("search")]))
            await until(lambda: any(path.startswith("/search") for path, _ in fakeWeb.requests), 30, "the search")
            await asyncio.sleep(0.5)
            began = time.monotonic()
            await rawNotify(conn, "session/cancel", {"sessionId": sid})
            response = await asyncio.wait_for(prompt, 90)
            return response, time.monotonic() - began, wire

    response, took, wire = await onLoop(scenario())
    assert wire.problems() == [] and response.stop_reason == "cancelled"
    assert took < 3  # measured: 0.40 s (the backend's own bound is 60 s)
