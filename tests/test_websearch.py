"""``web_search``'s backends without the process (the process is in test_e2e_web.py): which one is
chosen, what each is sent (its key in its header, nowhere else) and how each answer maps to
Hermes' result shape, against a loopback server that answers like each."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hermes_acp.engine.tools.registry import ToolError
from hermes_acp.engine.tools.websearch import Backend, search, searchStatus

KEY = "search-key-0123456789"
ANSWERS = {
    "tavily": {"results": [{"title": "T", "url": "https://t.example/", "content": "tavily snippet"}]},
    "exa": {"results": [{"title": "E", "url": "https://e.example/", "highlights": ["one", "two"]}]},
    "firecrawl": {"success": True, "data": [{"title": "F", "url": "https://f.example/", "description": "fc"}]},
    "firecrawl2": {"success": True, "data": {"web": [{"title": "F2", "url": "https://f2.example/",
                                                      "description": "fc2"}]}},
}


class _Backend(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []
    answer: Any = None
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Backend.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        data = json.dumps(_Backend.answer).encode()
        self.send_response(_Backend.status)
        if _Backend.status == 302:
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - SearXNG's /search?q=...&format=json
        _Backend.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        data = json.dumps({"results": [{"title": "S", "url": "https://s.example/", "content": "searx"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def backend() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    server.daemon_threads = True
    _Backend.seen, _Backend.status = [], 200
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_theBackendIsChosenByConfigurationInHermesOrder() -> None:
    assert searchStatus({})[0] is None and "SEARXNG_URL" in searchStatus({})[1]
    both = {"BRAVE_SEARCH_API_KEY": KEY, "SEARXNG_URL": "http://localhost:8888"}
    assert searchStatus(both)[0] == Backend("searxng", "http://localhost:8888")
    assert searchStatus({**both, "TAVILY_API_KEY": KEY})[0].name == "tavily"
    assert searchStatus({**both, "HERMES_ACP_WEB_SEARCH_BACKEND": "brave"})[0].name == "brave"
    backend, line = searchStatus({"HERMES_ACP_WEB_SEARCH_BACKEND": "exa"})
    assert backend is None and "EXA_API_KEY is not set" in line
    backend, line = searchStatus({"HERMES_ACP_WEB_SEARCH_BACKEND": "bing"})
    assert backend is None and "not one of" in line
    shown = searchStatus({"SEARXNG_URL": "https://me:hunter2-password@searx.example"})[1]
    assert "hunter2" not in shown and "[REDACTED]" in shown
    assert KEY not in repr(searchStatus({"TAVILY_API_KEY": KEY})[0])


@pytest.mark.parametrize("name, header, value", [
    ("tavily", "authorization", f"Bearer {KEY}"), ("exa", "x-api-key", KEY),
    ("firecrawl", "authorization", f"Bearer {KEY}"), ("firecrawl2", "authorization", f"Bearer {KEY}")])
def test_eachKeyedBackendsAnswerMapsToHermesShape(backend: str, name: str, header: str, value: str) -> None:
    _Backend.answer = ANSWERS[name]
    results = search(Backend(name.rstrip("2"), backend, KEY), "what", 3)
    [request] = _Backend.seen
    assert request["headers"][header] == value
    assert KEY not in json.dumps(request["body"]) and KEY not in request["path"]  # only in the header
    assert request["body"]["query"] == "what"
    [hit] = results
    assert hit["position"] == 1 and hit["url"].startswith("https://") and hit["title"]
    assert hit["description"] == {"tavily": "tavily snippet", "exa": "one … two", "firecrawl": "fc",
                                  "firecrawl2": "fc2"}[name]


def test_aRedirectIsNotFollowed(backend: str) -> None:
    """Following it would carry the key to wherever the backend points."""
    _Backend.status, _Backend.answer = 302, {}
    with pytest.raises(ToolError, match="HTTP 302"):
        search(Backend("tavily", backend, KEY), "what", 3)
    assert len(_Backend.seen) == 1


def test_resultsThatAreNotWebLinksAreDropped(backend: str) -> None:
    _Backend.answer = {"results": [{"title": "x", "url": "javascript:alert(1)", "content": ""},
                                   {"title": "y", "url": "https://ok.example/", "content": None}, "junk"]}
    assert [hit["url"] for hit in search(Backend("tavily", backend, KEY), "q", 5)] == ["https://ok.example/"]


def test_aSearxngBehindBasicAuthGetsItsCredentialsInAHeader(backend: str) -> None:
    """``SEARXNG_URL=https://user:password@host``: the credentials go in an Authorization
    header, not in the host name (which urllib would look up in DNS, password and all)."""
    with_auth = backend.replace("http://", "http://searx-user:pass%40word-0123@")
    [hit] = search(Backend("searxng", with_auth), "what", 3)
    assert hit["url"] == "https://s.example/"
    [seen] = _Backend.seen
    assert seen["path"].startswith("/search?q=what&format=json")
    assert seen["headers"]["authorization"] == "Basic " + base64.b64encode(b"searx-user:pass@word-0123").decode()
