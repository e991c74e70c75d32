"""OAuth 2.1 for HTTP MCP servers through the real process (issue 29 §1).

The server is ``tests/mcp_oauth_server.py``: the ``mcp`` package's MCPServer with its
auth pieces, fastmcp's in-memory authorization server behind them (it approves every
authorization at once). The test's "browser" follows the link the agent gave: the
authorization server redirects it to the agent's loopback listener.
"""

from __future__ import annotations

import asyncio
from http.client import HTTPConnection
import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_twisted
from acp.schema import AllowedOutcome, RequestPermissionResponse

from .e2e import agentText, modelEnv, text, updates
from .mcp_e2e import call, http, offered, toolMessages
from .sdkclient import RecordingClient, connect, onLoop, raw, until

SERVER = os.path.join(os.path.dirname(__file__), "mcp_oauth_server.py")
URL = re.compile(r"https?://\S+/authorize\?\S+")


def allowAll(request: Any) -> RequestPermissionResponse:
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))


class Browser:
    """Follows a sign-in link as a browser would: the authorization server answers with a
    redirect to the agent's loopback listener, whose page is read. Every code it carried
    is kept (the test looks for them where they must never be)."""

    def __init__(self) -> None:
        self.codes: list[str] = []
        self.pages: list[tuple[int, str]] = []

    def _get(self, url: str) -> tuple[int, dict[str, str], str]:
        parts = urlsplit(url)
        connection = HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read().decode("utf-8", "replace")
        finally:
            connection.close()

    def follow(self, url: str) -> tuple[int, str]:
        status, headers, _ = self._get(url)
        assert status in (302, 303, 307), f"the authorization server answered {status}"
        location = headers.get("location") or headers["Location"]
        query = parse_qs(urlsplit(location).query)
        self.codes += query.get("code", [])
        status, _, page = self._get(location)
        self.pages.append((status, page))
        return status, page

    async def open(self, url: str) -> tuple[int, str]:
        return await asyncio.wait_for(asyncio.to_thread(self.follow, url), 60)


class OAuthServer:
    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process, self.url = process, url
        self.base = url.removesuffix("/mcp")

    def control(self, path: str, method: str = "POST") -> Any:
        parts = urlsplit(self.base)
        connection = HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            connection.request(method, path)
            return json.loads(connection.getresponse().read())
        finally:
            connection.close()

    async def do(self, path: str, method: str = "POST") -> Any:
        return await asyncio.wait_for(asyncio.to_thread(self.control, path, method), 30)


@pytest.fixture
def oauthServer(request: Any) -> Any:
    """The server; ``indirect`` parametrization gives its tokens' lifetime in seconds."""
    env = {**os.environ, "OAUTH_TOKEN_SECONDS": str(getattr(request, "param", ""))}
    process = subprocess.Popen([sys.executable, SERVER, "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        import select

        ready = select.select([process.stdout], [], [], 60)[0]
        assert ready, "the OAuth MCP server did not start within 60 s"
        url = process.stdout.readline().decode().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield OAuthServer(process, url)
    finally:
        process.kill()
        process.wait(10)


class SigningClient(RecordingClient):
    """An editor stand-in that also records ``elicitation/complete``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completed: list[str] = []

    async def complete_elicitation(self, elicitation_id: str, **kw: Any) -> None:
        self.completed.append(elicitation_id)


async def noticed(wire: Any, title: str) -> dict[str, Any]:
    """The first ``notice`` whose title holds ``title`` (read off the wire: the SDK's
    schema predates notices)."""
    def found() -> list[dict[str, Any]]:
        return [u for u in updates(wire) if u["sessionUpdate"] == "notice" and title in u["title"]]

    await until(lambda: found(), 60, f"a notice {title!r}")
    return found()[0]


def tokenFiles(home: str) -> list[Path]:
    folder = Path(home) / "mcp-tokens"
    return sorted(folder.glob("*.json")) if folder.exists() else []


def storedSecrets(home: str) -> set[str]:
    """Every token and client secret the agent stored so far."""
    found = set()
    for path in [*tokenFiles(home), *(Path(home) / "mcp-tokens" / "clients").glob("*.json")]:
        record = json.loads(path.read_text())
        found |= {record[k] for k in ("access_token", "refresh_token", "client_secret") if record.get(k)}
    return found


def leaks(home: str, wire: Any, secrets: set[str], stderr: Path, sessionId: str) -> list[str]:
    """Where any of ``secrets`` shows: a frame either way, the log, the journal."""
    frames = json.dumps(wire.received) + json.dumps(wire.sent)
    log = stderr.read_text(errors="replace")
    with sqlite3.connect(Path(home) / "state.db", timeout=5) as db:
        journal = json.dumps(db.execute("SELECT payload FROM acp_journal").fetchall())
    return [f"{where} holds {secret[:12]}..." for secret in secrets
            for where, body in (("a frame", frames), ("the log", log), ("the journal", journal)) if secret in body]


@pytest_twisted.ensureDeferred
async def test_signInThroughAURLElicitationRefreshAndSignOut(scriptedServer, oauthServer, tmp_path) -> None:
    """The first request gets 401; the agent takes the editor to the sign-in page by a
    URL elicitation; the browser's redirect ends it; the tools appear. An access token the
    server lets expire is refreshed without a word; a revoked refresh token asks for a
    sign-in again; /mcp logout removes the token. No token, code or secret reaches a frame,
    the journal or the log."""
    model, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    browser = Browser()
    opened: list[asyncio.Task[Any]] = []

    def elicit(request: dict[str, Any]) -> dict[str, Any]:
        assert "elicitationId" in request["mode"], request
        opened.append(asyncio.ensure_future(browser.open(str(request["mode"]["url"]))))
        return {"action": "accept"}

    model.default.responses += [
        call("a", "mcp__oa__add", a=2, b=3), [{"text": "five"}],
        call("b", "mcp__oa__add", a=4, b=4), [{"text": "eight"}],
        call("c", "mcp__oa__add", a=1, b=1), [{"text": "two"}],
    ]
    stderr = tmp_path / "agent.log"
    client = SigningClient(permission=allowAll, elicitation=elicit)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with open(stderr, "wb") as log:
            env = modelEnv(url, home, HERMES_ACP_MCP_LOGIN_TIMEOUT="60")
            async with connect(client, env=env, stderr=log) as (conn, _, wire, process):
                await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}})
                sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
                await until(lambda: client.completed, 60, "the sign-in to complete")
                seen["page"] = await opened[0]
                seen["files"] = tokenFiles(home)
                seen["mode"] = stat.S_IMODE(os.stat(seen["files"][0]).st_mode)
                first = storedSecrets(home)
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add")]), 60)
                await oauthServer.do("/test/expire")
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add again")]), 60)
                refreshed = storedSecrets(home)
                seen["rotated"] = bool(first - refreshed)
                seen["log"] = await oauthServer.do("/test/log", "GET")
                # A revoked refresh token, then an expired access token: sign in again.
                await oauthServer.do("/test/revoke")
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add a third time")]), 60)
                await until(lambda: len(client.completed) == 2, 60, "the second sign-in to complete")
                seen["third"] = await opened[1]
                seen["final log"] = await oauthServer.do("/test/log", "GET")
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp logout oa")]), 30)
                seen["after logout"] = tokenFiles(home)
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
                seen["updates"] = updates(wire, sid)
                seen["problems"] = wire.problems()
                seen["secrets"] = first | refreshed | storedSecrets(home) | set(browser.codes)
                seen["leaks"] = leaks(home, wire, seen["secrets"], stderr, sid)
        return seen

    seen = await onLoop(scenario())
    assert seen["problems"] == []
    assert seen["page"][0] == 200 and "Signed in" in seen["page"][1]
    assert len(seen["files"]) == 1 and seen["mode"] == 0o600
    assert "url" in client.elicitations[0][1] and "Sign in to MCP server oa" in client.elicitations[0][0]
    assert "mcp__oa__add" in offered(model.chatRequests[0])
    assert toolMessages(model.chatRequests[1])[0].strip() == "5"
    assert toolMessages(model.chatRequests[3])[-1].strip() == "8"  # refreshed after the 401, unseen
    grants = [entry["grant"] for entry in seen["log"] if entry["what"] == "token"]
    assert grants == ["authorization_code", "refresh_token"]
    authorize = [entry for entry in seen["log"] if entry["what"] == "authorize"][0]
    assert authorize["resource"] == oauthServer.url and authorize["scopes"] == ["mcp"]
    again = [entry for entry in seen["final log"] if entry["what"] == "authorize"]
    assert len(again) == 2 and (again[0]["client_id"], again[0]["redirect_uri"]) == (
        again[1]["client_id"], again[1]["redirect_uri"])  # the registration and its port are reused
    assert seen["rotated"]
    third = toolMessages(model.chatRequests[5])[-1]
    assert "sign in" in third  # the model is told why the call failed
    assert seen["after logout"] == []
    shown = agentText(seen["updates"])
    assert "Signed out of MCP server `oa`" in shown and "| `oa` | needs login |" in shown
    assert len(seen["secrets"]) >= 5
    assert seen["leaks"] == []


@pytest_twisted.ensureDeferred
async def test_signInLinkAsANoticeAndAsText(scriptedServer, oauthServer, tmp_path) -> None:
    """An editor without URL elicitation gets the link in a notice; one without notices
    either gets it from /mcp login. Until then the server's tools are absent and /mcp
    says why."""
    model, url = scriptedServer
    browser = Browser()
    model.default.responses += [[{"text": "no tools yet"}], call("a", "mcp__oa__add", a=20, b=22), [{"text": "ok"}]]
    client = SigningClient(permission=allowAll)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        env = modelEnv(url, HERMES_ACP_MCP_LOGIN_TIMEOUT="60")
        async with connect(client, env=env) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            notice = await noticed(wire, "needs you to sign in")
            seen["notice"] = notice
            link = URL.search(notice["description"]).group(0)
            callback = parse_qs(urlsplit(link).query)["redirect_uri"][0]
            seen["stranger"] = await asyncio.to_thread(browser._get, f"{callback}?code=forged&state=forged")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 30)
            seen["before"] = agentText(updates(wire, sid))
            await browser.open(link)
            await noticed(wire, "Signed in")
            seen["problems"] = wire.problems()

        # An editor with neither: /mcp login NAME answers with the link.
        async with connect(SigningClient(permission=allowAll), env=modelEnv(url)) as (conn, other, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hello")]), 60)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp login oa")]), 60)
            reply = agentText(updates(wire, sid))
            seen["held"] = reply
            link = URL.findall(reply)[-1]
            await browser.open(link)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add")]), 60)
            seen["problems"] += wire.problems()
        return seen

    seen = await onLoop(scenario())
    assert seen["problems"] == []
    assert seen["notice"]["severity"] == "info" and "Open this link" in seen["notice"]["description"]
    assert seen["stranger"][0] == 400  # an answer with another state is refused, the sign-in goes on
    assert "| `oa` | needs login |" in seen["before"] and "/mcp login oa" in seen["before"]
    assert "Open this link to sign in to MCP server `oa`" in seen["held"]
    assert "mcp__oa__add" not in offered(model.chatRequests[0])
    assert toolMessages(model.chatRequests[2])[0].strip() == "42"
    assert all(status == 200 for status, _ in browser.pages)


@pytest_twisted.ensureDeferred
async def test_editorsAuthorizationHeaderIsNeverReplacedByOAuth(scriptedServer, oauthServer, tmp_path) -> None:
    """With the editor's own Authorization header, a 401 is reported; no sign-in starts."""
    model, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    client = SigningClient(permission=allowAll, elicitation=lambda request: {"action": "accept"})
    model.default.responses += [[{"text": "hi"}]]

    async def scenario() -> Any:
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}})
            server = http("oa", oauthServer.url, Authorization="Bearer not-a-real-token")
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 60)  # (waits for the server)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 60)
            return agentText(updates(wire, sid)), wire.problems()

    shown, problems = await onLoop(scenario())
    assert problems == []
    assert "HTTP 401" in shown and "| `oa` | failed |" in shown
    assert client.elicitations == [] and tokenFiles(home) == []


@pytest_twisted.ensureDeferred
async def test_terminalLoginThenTheEditorUsesTheToken(scriptedServer, oauthServer, tmp_path) -> None:
    """``hermes-acp mcp login NAME`` prints the link on stderr, waits for the redirect and
    stores the token; an editor session with the same HERMES_HOME has the tools at once."""
    model, url = scriptedServer
    home = tempfile.mkdtemp(prefix="hermes-home-")
    Path(home, "config.yaml").write_text(f"mcp_servers:\n  oa:\n    url: {oauthServer.url}\n")
    browser = Browser()
    model.default.responses += [call("a", "mcp__oa__add", a=1, b=2), [{"text": "ok"}]]

    async def terminal() -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hermes_acp", "mcp", "login", "oa", env=modelEnv(url, home),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        lines = []
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, f"the command ended without a link: {''.join(lines)}"
            lines.append(line)
            found = URL.search(line)
            if found:
                break
        await browser.open(found.group(0))
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode, out.decode(), "".join(lines) + err.decode()

    code, out, err = await onLoop(terminal())
    assert code == 0, err
    assert "Signed in" in out + err and len(tokenFiles(home)) == 1
    assert not any(secret in out + err for secret in storedSecrets(home) | set(browser.codes))

    async def editor() -> Any:
        async with connect(SigningClient(permission=allowAll), env=modelEnv(url, home)) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add")]), 60)
            return wire.problems()

    assert await onLoop(editor()) == []
    assert toolMessages(model.chatRequests[1])[0].strip() == "3"


@pytest_twisted.ensureDeferred
async def test_insufficientScopeStepsUp(scriptedServer, oauthServer, tmp_path) -> None:
    """A 403 ``insufficient_scope`` asks for a new sign-in with the wider scope (a fresh
    registration that may ask it); after it, the call works with both scopes."""
    model, url = scriptedServer
    browser = Browser()
    opened: list[asyncio.Task[Any]] = []

    def elicit(request: dict[str, Any]) -> dict[str, Any]:
        opened.append(asyncio.ensure_future(browser.open(str(request["mode"]["url"]))))
        return {"action": "accept"}

    model.default.responses += [
        call("a", "mcp__oa__whoami"), [{"text": "one"}],
        call("b", "mcp__oa__whoami"), [{"text": "two"}],
        call("c", "mcp__oa__whoami"), [{"text": "three"}],
    ]
    client = SigningClient(permission=allowAll, elicitation=elicit)

    async def scenario() -> Any:
        async with connect(client, env=modelEnv(url, HERMES_ACP_MCP_LOGIN_TIMEOUT="60")) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await until(lambda: client.completed, 60, "the sign-in to complete")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("who")]), 60)
            await oauthServer.do("/test/require?scope=admin")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("who now")]), 60)
            await until(lambda: len(client.completed) == 2, 60, "the step-up sign-in to complete")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("and now")]), 60)
            return wire.problems(), await oauthServer.do("/test/log", "GET")

    problems, asked = await onLoop(scenario())
    assert problems == []
    assert toolMessages(model.chatRequests[1])[-1].strip() == "mcp"
    assert "more permissions" in toolMessages(model.chatRequests[3])[-1]
    assert toolMessages(model.chatRequests[5])[-1].strip() == "admin mcp"
    authorizations = [entry["scopes"] for entry in asked if entry["what"] == "authorize"]
    assert authorizations == [["mcp"], ["mcp", "admin"]]


@pytest.mark.parametrize("oauthServer", [6], indirect=True)
@pytest_twisted.ensureDeferred
async def test_aTokenIsRefreshedBeforeItExpires(scriptedServer, oauthServer, tmp_path) -> None:
    """A token that lives 6 s is refreshed before it runs out, unasked; calls go on working."""
    model, url = scriptedServer
    browser = Browser()
    home = tempfile.mkdtemp(prefix="hermes-home-")
    model.default.responses += [call("a", "mcp__oa__add", a=3, b=4), [{"text": "seven"}]]

    def elicit(request: dict[str, Any]) -> dict[str, Any]:
        asyncio.ensure_future(browser.open(str(request["mode"]["url"])))
        return {"action": "accept"}

    client = SigningClient(permission=allowAll, elicitation=elicit)

    async def refreshes() -> int:
        return sum(entry.get("grant") == "refresh_token" for entry in await oauthServer.do("/test/log", "GET"))

    async def scenario() -> Any:
        async with connect(client, env=modelEnv(url, home)) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await until(lambda: client.completed, 60, "the sign-in to complete")
            first = json.loads(tokenFiles(home)[0].read_text())["access_token"]
            deadline = asyncio.get_running_loop().time() + 30
            while await refreshes() == 0:
                assert asyncio.get_running_loop().time() < deadline, "no refresh within 30 s"
                await asyncio.sleep(0.5)
            second = json.loads(tokenFiles(home)[0].read_text())["access_token"]
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("add")]), 60)
            return first != second, wire.problems()

    changed, problems = await onLoop(scenario())
    assert problems == [] and changed
    assert toolMessages(model.chatRequests[1])[-1].strip() == "7"
    assert len(client.elicitations) == 1  # no sign-in asked again


@pytest_twisted.ensureDeferred
async def test_aDeclinedSignInIsNotAskedAgain(scriptedServer, oauthServer, tmp_path) -> None:
    """Declining the editor's sign-in page stops the sign-in: the server stays without tools,
    /mcp says what to do, and the agent does not ask again by itself."""
    model, url = scriptedServer
    model.default.responses += [[{"text": "fine"}]]
    client = SigningClient(permission=allowAll, elicitation=lambda request: {"action": "decline"})

    async def scenario() -> Any:
        async with connect(client, env=modelEnv(url)) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}})
            sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await until(lambda: client.elicitations, 60, "the sign-in page")
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hello")]), 60)
            await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("/mcp")]), 60)
            return agentText(updates(wire, sid)), wire.problems()

    shown, problems = await onLoop(scenario())
    assert problems == []
    assert len(client.elicitations) == 1 and client.completed == []
    assert "mcp__oa__add" not in offered(model.chatRequests[0])
    assert "| `oa` | needs login |" in shown and "declined" in shown and "/mcp login oa" in shown


@pytest_twisted.ensureDeferred
async def test_twoSessionsShareOneSignInAndAnUnansweredOneEnds(scriptedServer, oauthServer, tmp_path) -> None:
    """Two sessions listing one server: one sign-in page, and both get the tools. A sign-in
    nobody finishes ends after HERMES_ACP_MCP_LOGIN_TIMEOUT, its listener closed, and says so."""
    model, url = scriptedServer
    browser = Browser()
    pages: list[str] = []

    def elicit(request: dict[str, Any]) -> dict[str, Any]:
        pages.append(str(request["mode"]["url"]))
        return {"action": "accept"}

    model.default.responses += [[{"text": "a"}], [{"text": "b"}]]
    client = SigningClient(permission=allowAll, elicitation=elicit)

    async def scenario() -> Any:
        env = modelEnv(url, HERMES_ACP_MCP_LOGIN_TIMEOUT="3")
        async with connect(client, env=env) as (conn, _, wire, process):
            await raw(conn, "initialize", {"protocolVersion": 1, "clientCapabilities": {
                "elicitation": {"url": {}}, "session": {"notices": {}}}})
            first = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await until(lambda: pages, 60, "the first sign-in page")
            ended = await noticed(wire, "did not finish")  # nobody opened it
            callback = parse_qs(urlsplit(pages[0]).query)["redirect_uri"][0]
            try:
                await asyncio.to_thread(browser._get, callback)
                closed = False
            except OSError:
                closed = True
            await asyncio.wait_for(conn.prompt(session_id=first, prompt=[text("/mcp login oa")]), 60)
            second = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[http("oa", oauthServer.url)])).session_id
            await browser.open(pages[-1])
            await until(lambda: client.completed, 60, "the sign-in to complete")
            for sid in (first, second):
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text("hi")]), 60)
            return ended, closed, wire.problems()

    ended, closed, problems = await onLoop(scenario())
    assert problems == []
    assert "nobody signed in within 3 s" in ended["description"] and closed
    assert len(pages) == 2  # the timed-out one and /mcp login's; the second session joined it
    assert "mcp__oa__add" in offered(model.chatRequests[0]) and "mcp__oa__add" in offered(model.chatRequests[1])
