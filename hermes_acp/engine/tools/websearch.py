"""``web_search``: a query to the search backend the user configured, under Hermes' name,
arguments and result shape (``{success, data: {web: [{title, url, description, position}]}}``, with a
``note`` that frames the results as data).

Backends and their settings are Hermes' where it has them: SearXNG (``SEARXNG_URL``, no key:
the one a self-hosting user runs), Brave (``BRAVE_SEARCH_API_KEY``), Tavily
(``TAVILY_API_KEY``), Exa (``EXA_API_KEY``) and Firecrawl (``FIRECRAWL_API_KEY``,
``FIRECRAWL_API_URL``). ``HERMES_ACP_WEB_SEARCH_BACKEND`` picks one; else the first configured
in Hermes' order (Tavily, Exa, Firecrawl, SearXNG, Brave). None configured: the tool is not
offered. The backend is the user's choice, so its address is not held to the fetch guard's
rule (a SearXNG on localhost is the usual case); what goes to it is: a query that carries one
of the user's secrets is refused. Keys travel in headers only, and no error repeats a key, a
URL with a key, or the backend's own words (which could quote one).
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import attrs

from hermes_acp.config import envInt, envSeconds
from hermes_acp.engine.chat_http import USER_AGENT, tlsContext
from hermes_acp.engine.secrets import redactURL, secretValues
from hermes_acp.engine.webfetch import DEFAULT_SECONDS, NOTE
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters

MAX_LIMIT = 100
MAX_TITLE, MAX_URL, MAX_DESCRIPTION = 300, 2048, 1000
DEFAULT_SEARCH_BYTES = 2 * 1024 * 1024
ENABLE_HINT = ("set SEARXNG_URL (a SearXNG you run, no key) or one of BRAVE_SEARCH_API_KEY, TAVILY_API_KEY, "
               "EXA_API_KEY, FIRECRAWL_API_KEY in $HERMES_HOME/.env")


@attrs.frozen
class Spec:
    """One kind of backend: its label, the variable that holds its key (None: none), the
    variable of its URL and the URL by default (None: the user must give one)."""

    label: str
    keyName: str | None
    urlName: str
    defaultURL: str | None


SPECS: dict[str, Spec] = {
    "tavily": Spec("Tavily", "TAVILY_API_KEY", "HERMES_ACP_WEB_TAVILY_URL", "https://api.tavily.com"),
    "exa": Spec("Exa", "EXA_API_KEY", "HERMES_ACP_WEB_EXA_URL", "https://api.exa.ai"),
    "firecrawl": Spec("Firecrawl", "FIRECRAWL_API_KEY", "FIRECRAWL_API_URL", "https://api.firecrawl.dev"),
    "searxng": Spec("SearXNG", None, "SEARXNG_URL", None),
    "brave": Spec("Brave Search", "BRAVE_SEARCH_API_KEY", "HERMES_ACP_WEB_BRAVE_URL", "https://api.search.brave.com"),
}


@attrs.frozen
class Backend:
    """The configured backend: its kind, base URL and key (kept out of ``repr``)."""

    name: str
    url: str
    key: str | None = attrs.field(default=None, repr=False)

    @property
    def label(self) -> str:
        return SPECS[self.name].label

    def describe(self) -> str:
        return f"{self.label} at {redactURL(self.url)}"


def _configured(name: str, env: Mapping[str, str]) -> Backend | None:
    spec = SPECS[name]
    key = env.get(spec.keyName, "").strip() if spec.keyName else None
    url = env.get(spec.urlName, "").strip() or spec.defaultURL
    if (spec.keyName and not key) or not url:
        return None
    return Backend(name, url.rstrip("/"), key)


def searchStatus(env: Mapping[str, str] | None = None) -> tuple[Backend | None, str]:
    """The backend ``web_search`` uses (None: none, and the tool is not offered), and a line
    that says which, or how to enable one."""
    env = os.environ if env is None else env
    chosen = env.get("HERMES_ACP_WEB_SEARCH_BACKEND", "").strip().lower()
    if chosen:
        if chosen not in SPECS:
            return None, (f"off: HERMES_ACP_WEB_SEARCH_BACKEND is {chosen!r}, not one of {', '.join(SPECS)}")
        backend = _configured(chosen, env)
        if backend is None:
            spec = SPECS[chosen]
            return None, f"off: HERMES_ACP_WEB_SEARCH_BACKEND is {chosen} but {spec.keyName or spec.urlName} is not set"
        return backend, backend.describe()
    for name in SPECS:
        backend = _configured(name, env)
        if backend is not None:
            return backend, backend.describe()
    return None, f"off (no backend configured): {ENABLE_HINT}"


def searchBackend(env: Mapping[str, str] | None = None) -> Backend | None:
    return searchStatus(env)[0]


def _request(backend: Backend, query: str, limit: int) -> urllib.request.Request:
    """The backend's search request; keys go in headers (Tavily's and Firecrawl's as a
    bearer token, Brave's and Exa's in their own headers), and so do a URL's user name and
    password (basic auth, for a SearXNG behind a login)."""
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    base, parts = backend.url, urllib.parse.urlsplit(backend.url)
    if "@" in parts.netloc:  # https://user:password@searx.example: basic auth, never part of the host name
        base = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        login = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode("ascii")
    if backend.name == "searxng":
        query_ = urllib.parse.urlencode({"q": query, "format": "json"})
        return urllib.request.Request(f"{base}/search?{query_}", headers=headers)
    if backend.name == "brave":
        query_ = urllib.parse.urlencode({"q": query, "count": min(limit, 20)})
        headers["X-Subscription-Token"] = backend.key or ""
        return urllib.request.Request(f"{base}/res/v1/web/search?{query_}", headers=headers)
    headers["Content-Type"] = "application/json"
    if backend.name == "tavily":
        path, body = "/search", {"query": query, "max_results": min(limit, 20)}
        headers["Authorization"] = f"Bearer {backend.key}"
    elif backend.name == "exa":
        path, body = "/search", {"query": query, "numResults": limit, "contents": {"highlights": True}}
        headers["x-api-key"] = backend.key or ""
    else:
        path, body = "/v1/search", {"query": query, "limit": limit}
        headers["Authorization"] = f"Bearer {backend.key}"
    return urllib.request.Request(f"{base}{path}", json.dumps(body).encode(), headers, method="POST")


def _items(backend: Backend, data: Any) -> list[dict[str, Any]]:
    """The raw result objects of an answer, as (title, url, snippet) dicts; ``ValueError``
    when the answer is not shaped like the backend's results."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if backend.name == "brave":
        found = (data.get("web") or {}).get("results", []) if isinstance(data.get("web") or {}, dict) else None
        field = "description"
    elif backend.name == "firecrawl":
        found = data.get("data")
        if isinstance(found, dict):  # API v2: {"data": {"web": [...]}}
            found = found.get("web")
        field = "description"
    else:
        found = data.get("results")
        field = {"searxng": "content", "tavily": "content", "exa": "text"}[backend.name]
    if not isinstance(found, list):
        raise ValueError("no list of results")
    items = []
    for item in found:
        if not isinstance(item, dict):
            continue
        snippet = item.get(field)
        if backend.name == "exa" and not snippet:
            highlights = item.get("highlights")
            snippet = " … ".join(h for h in highlights if isinstance(h, str)) if isinstance(highlights, list) else ""
        items.append({"title": item.get("title"), "url": item.get("url"), "description": snippet})
    return items


def _clean(value: Any, limit: int) -> str:
    """A result's field as plain text within ``limit`` characters (Brave marks matches in HTML)."""
    text = " ".join(html.unescape(re.sub(r"<[^>]{0,200}>", "", value if isinstance(value, str) else "")).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _failure(backend: Backend, error: urllib.error.HTTPError) -> str:
    """What the model reads about an error status: what it means and what to do, never the
    backend's own words (they could quote the key)."""
    spec = SPECS[backend.name]
    if error.code in (401, 403):
        if spec.keyName:
            return (f"{backend.label} refused the request (HTTP {error.code}): the key in {spec.keyName} is "
                    "missing, wrong or not allowed this; the user must fix it in $HERMES_HOME/.env")
        return (f"{backend.label} refused the request (HTTP {error.code}); for SearXNG, allow the JSON format "
                "(search: formats: [html, json] in its settings.yml)")
    if error.code == 429:
        after = (error.headers.get("Retry-After") or "").strip() if error.headers else ""
        wait = f"retry after {after} seconds" if after.isdigit() else (
            f"retry after {after}" if after else "wait before retrying")
        return f"{backend.label} is rate limiting searches (HTTP 429 Too Many Requests): {wait}"
    return f"{backend.label} answered HTTP {error.code} {error.reason}; the search did not run".rstrip()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A search answer is never a redirect: following one would carry the key elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def searchLimits(env: Mapping[str, str] | None = None) -> tuple[float, int]:
    """How long a search may take and how big its answer may be (``ConfigError`` for a bad setting)."""
    env = os.environ if env is None else env
    return (envSeconds(env, "HERMES_ACP_WEB_SECONDS", DEFAULT_SECONDS),
            envInt(env, "HERMES_ACP_WEB_SEARCH_BYTES", DEFAULT_SEARCH_BYTES, minimum=1024))


def search(backend: Backend, query: str, limit: int, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Ask the backend; the results in Hermes' shape, or ``ToolError`` in plain words."""
    seconds, maxBytes = searchLimits(env)
    opener = urllib.request.build_opener(_NoRedirects, urllib.request.HTTPSHandler(context=tlsContext()))
    deadline = time.monotonic() + seconds
    try:
        with opener.open(_request(backend, query, limit), timeout=seconds) as response:
            chunks, size = [], 0
            while size <= maxBytes:  # a total bound: a backend that drips bytes cannot hold the call
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = response.read1(64 * 1024)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            body = b"".join(chunks)
    except urllib.error.HTTPError as e:
        raise ToolError(_failure(backend, e)) from None
    except (TimeoutError, OSError) as e:  # URLError is an OSError
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise ToolError(f"{backend.label} did not answer within {seconds:g} s (HERMES_ACP_WEB_SECONDS); "
                            "try again later") from None
        raise ToolError(f"{backend.describe()} could not be reached ({type(reason).__name__}: "
                        f"{redactURL(str(reason))})") from None
    if len(body) > maxBytes:
        raise ToolError(f"{backend.label} answered more than {maxBytes} bytes (HERMES_ACP_WEB_SEARCH_BYTES); "
                        "the answer was not read")
    try:
        items = _items(backend, json.loads(body))
    except (ValueError, RecursionError) as e:
        raise ToolError(f"{backend.label} answered something that is not search results ({e}); "
                        "the backend may be misconfigured or down") from None
    results = []
    for item in items:
        url = _clean(item["url"], MAX_URL)
        if not url.startswith(("http://", "https://")):
            continue
        results.append({"title": _clean(item["title"], MAX_TITLE), "url": url,
                        "description": _clean(item["description"], MAX_DESCRIPTION), "position": len(results) + 1})
        if len(results) == limit:
            break
    return results


def webSearch(ctx: ToolContext, query: str, limit: int = 5) -> ToolOutcome:
    query = query.strip()
    if not query:
        raise ToolError("query is empty: say what to search for")
    if len(query) > 2000:
        raise ToolError("query is longer than 2000 characters")
    if any(secret in query for secret in secretValues()):
        raise ToolError("the query carries one of the user's secrets (an API key or password), so it was not sent")
    try:
        backend, status = searchStatus()
    except ValueError as e:
        raise ToolError(str(e)) from None
    if backend is None:
        raise ToolError(f"web search is {status}")
    try:
        results = search(backend, query, limit)
    except ValueError as e:  # a bad HERMES_ACP_WEB_* setting
        raise ToolError(str(e)) from None
    return ToolOutcome(jsonText({"success": True, "note": NOTE, "data": {"web": results}}),
                       {"backend": backend.label})


WEB_SEARCH = Tool(
    name="web_search",
    description=("Search the web. Returns up to `limit` results, each a title, URL and short description; "
                 "read a result in full with web_extract."),
    parameters=parameters(
        ["query"],
        query={"type": "string", "description": "what to search for"},
        limit={"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 5,
               "description": f"how many results (1-{MAX_LIMIT}, default 5)"},
    ),
    handler=webSearch,
)
