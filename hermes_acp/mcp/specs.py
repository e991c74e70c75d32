"""Which MCP servers a session gets: the list in its ACP request, plus the
user's ``$HERMES_HOME/config.yaml`` ``mcp_servers`` (the editor's list wins on
a name clash). A malformed entry in the request is a -32602 naming it; a
malformed entry in config.yaml is skipped with a problem the user is told of.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..engine.secrets import redactURL
from ..jsonrpc import InvalidParams

STDIO, HTTP, SSE = "stdio", "http", "sse"
#: What config.yaml's ``oauth`` of an HTTP server may say.
OAUTH_KEYS = {"client_id", "client_secret", "client_metadata_url", "scope", "redirect_port"}


@attrs.frozen
class ServerSpec:
    """One MCP server as listed: how to reach it, and how far to believe it."""

    name: str
    transport: str  # STDIO, HTTP or SSE (the 2024-11-05 HTTP+SSE transport)
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    #: The user marked it trusted: its tool annotations are believed.
    trusted: bool = False
    #: "editor" (the ACP request) or "config" (config.yaml).
    origin: str = "editor"
    #: Seconds a call may go without an answer or progress (None: the setting).
    callTimeout: float | None = None
    #: config.yaml's ``oauth`` for it: a pre-registered client (client_id, client_secret) or
    #: the URL of a client ID metadata document, the scope to ask, the redirect port.
    oauth: tuple[tuple[str, str], ...] = ()

    @property
    def secrets(self) -> list[str]:
        """The values it was given that may be credentials: every header value, and the
        env values whose names say so (``trace.secretKey``), to keep out of logs and notices."""
        from ..trace import secretKey

        values = [value for _, value in self.headers] + [value for name, value in (*self.env, *self.oauth)
                                                         if secretKey(name)]
        return [value for value in values if len(value) >= 8]

    @property
    def where(self) -> str:
        """How it is reached, for people and logs: the command without its arguments,
        or the URL without its query and credentials (either may carry a token)."""
        if self.transport == STDIO:
            return self.command
        return redactURL(self.url.split("?", 1)[0].split("#", 1)[0])


def _bad(index: int, key: str, problem: str, name: str | None = None) -> InvalidParams:
    data: dict[str, Any] = {"field": f"mcpServers[{index}]{'.' + key if key else ''}"}
    if name is not None:
        data["serverName"] = name
    return InvalidParams(f"Invalid params: mcpServers[{index}]{'.' + key if key else ''} {problem}", data)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _carried(key: str, name: str, value: str) -> bool:
    """Whether an environment variable (``env``) or a header (``headers``) can hold this."""
    if key == "headers":
        return bool(_HEADER_NAME.fullmatch(name)) and not any(c in value for c in "\r\n\0")
    return bool(name) and "=" not in name and "\0" not in name + value


def _pairs(entry: Mapping[str, Any], key: str, index: int) -> tuple[tuple[str, str], ...]:
    values = entry.get(key)
    if values is None:
        return ()
    if not isinstance(values, list):
        raise _bad(index, key, "must be a list of {name, value} objects")
    pairs = []
    for position, item in enumerate(values):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("value"), str)):
            raise _bad(index, f"{key}[{position}]", "must be an object with string name and value")
        if not _carried(key, item["name"], item["value"]):
            raise _bad(index, f"{key}[{position}]", "has a name or value no process or header can carry")
        pairs.append((item["name"], item["value"]))
    return tuple(pairs)


def fromRequest(servers: Any) -> list[ServerSpec]:
    """The ``mcpServers`` of a session/new, load, resume or fork request."""
    if servers is None:
        return []
    if not isinstance(servers, list):
        raise InvalidParams("Invalid params: mcpServers must be a list", {"field": "mcpServers"})
    specs: list[ServerSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(servers):
        if not isinstance(entry, dict):
            raise _bad(index, "", "must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _bad(index, "name", "must be a non-empty string")
        if name in seen:
            raise _bad(index, "name", f"{name!r} is listed twice; server names must be unique", name)
        seen.add(name)
        kind = entry.get("type", STDIO)
        if kind == STDIO:
            command, args = entry.get("command"), entry.get("args", [])
            if not isinstance(command, str) or not command.strip() or "\0" in command:
                raise _bad(index, "command", "must be the server's executable", name)
            if args is None:
                args = []
            if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
                raise _bad(index, "args", "must be a list of strings", name)
            specs.append(ServerSpec(name, STDIO, command=command, args=tuple(args), env=_pairs(entry, "env", index)))
        elif kind in (HTTP, SSE):
            url = entry.get("url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise _bad(index, "url", "must be an http:// or https:// URL", name)
            specs.append(ServerSpec(name, kind, url=url, headers=_pairs(entry, "headers", index)))
        else:
            raise _bad(index, "type", f"{kind!r} is not a transport this agent offers (stdio, http and sse)", name)
    return specs


def configFile(home: Path) -> Path:
    return home / "config.yaml"


def _configured(name: str, entry: Any, folder: str) -> ServerSpec:
    """One ``mcp_servers`` entry of config.yaml (the Hermes layout); ValueError says what
    is wrong. A relative command path (``./server``) starts at ``folder``, config.yaml's."""
    if not isinstance(entry, dict):
        raise ValueError("must be a mapping with command or url")

    def mapping(key: str) -> tuple[tuple[str, str], ...]:
        value = entry.get(key) or {}
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping of names to values")
        pairs = tuple((str(k), str(v)) for k, v in value.items())
        bad = [k for k, v in pairs if not _carried(key, k, v)]
        if bad:
            raise ValueError(f"{key}: {bad[0]!r} has a name or value no process or header can carry")
        return pairs

    timeout = entry.get("timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0):
        raise ValueError("timeout must be a number of seconds above 0")
    common = {"trusted": entry.get("trusted") is True, "origin": "config",
              "callTimeout": None if timeout is None else float(timeout)}
    if entry.get("url"):
        url = str(entry["url"])
        if not url.startswith(("http://", "https://")):
            raise ValueError("url must be an http:// or https:// URL")
        transport = entry.get("transport", HTTP)
        if transport not in (HTTP, SSE):
            raise ValueError("transport must be http (streamable HTTP, the default) or sse (HTTP+SSE)")
        oauth = entry.get("oauth") or {}
        if not isinstance(oauth, dict) or not set(oauth) <= OAUTH_KEYS:
            raise ValueError(f"oauth must be a mapping of {', '.join(sorted(OAUTH_KEYS))}")
        port = oauth.get("redirect_port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise ValueError("oauth.redirect_port must be a port number (1-65535)")
        return ServerSpec(name, transport, url=url, headers=mapping("headers"),
                          oauth=tuple((str(k), str(v)) for k, v in oauth.items() if v is not None), **common)
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValueError("needs a command (stdio) or a url (http)")
    args = entry.get("args") or []
    if not isinstance(args, list):
        raise ValueError("args must be a list")
    command = os.path.expanduser(command)
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(folder, command)  # not the project's folder, where the server runs
    return ServerSpec(name, STDIO, command=command, args=tuple(str(a) for a in args), env=mapping("env"), **common)


@attrs.define
class ConfiguredServers:
    """config.yaml's servers, read again whenever the file changes."""

    path: Path
    _seen: tuple[float, int] | None = None
    _servers: list[ServerSpec] = attrs.Factory(list)
    _problems: list[str] = attrs.Factory(list)

    def read(self) -> tuple[list[ServerSpec], list[str]]:
        """The servers, and a line for each entry that could not be used."""
        try:
            info = self.path.stat()
        except OSError:
            self._seen, self._servers, self._problems = None, [], []
            return [], []
        if self._seen != (info.st_mtime, info.st_size):
            self._seen = (info.st_mtime, info.st_size)
            self._servers, self._problems = parseConfig(self.path)
        return list(self._servers), list(self._problems)


def parseConfig(path: Path) -> tuple[list[ServerSpec], list[str]]:
    """``mcp_servers`` of one config.yaml; entries with ``enabled: false`` are left out."""
    import yaml  # PyYAML: only when the user has a config.yaml

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, RecursionError) as e:
        # ValueError: a value PyYAML cannot build (a date like 2024-02-30); RecursionError: nesting
        return [], [f"{path} could not be read: {e or type(e).__name__}"]
    servers = document.get("mcp_servers") if isinstance(document, dict) else None
    if servers is None:
        return [], []
    if not isinstance(servers, dict):
        return [], [f"{path}: mcp_servers must be a mapping of server names to settings"]
    specs, problems = [], []
    for name, entry in servers.items():
        if isinstance(entry, dict) and entry.get("enabled") is False:
            continue
        try:
            specs.append(_configured(str(name), entry, str(path.parent)))
        except ValueError as e:
            problems.append(f"{path}: mcp_servers.{name} {e}")
    return specs, problems


def merged(editor: list[ServerSpec], configured: list[ServerSpec]) -> list[ServerSpec]:
    """The editor's servers, then config.yaml's whose names the editor did not use."""
    names = {spec.name for spec in editor}
    return editor + [spec for spec in configured if spec.name not in names]
