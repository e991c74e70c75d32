"""A scripted MCP server (stdlib only), for tests: the protocol core plus a stdio entry point.

``python tests/mcp_scripted.py SCRIPT.json`` speaks newline-delimited JSON-RPC 2.0
on stdin/stdout (stderr is for logs); without an argument it runs the default
script (one ``echo`` tool). The protocol logic lives in ``ScriptedMCP``, which
takes one incoming message at a time and emits outgoing ones through a callback,
so ``tests/mcp_http.py`` serves the same scripts over streamable HTTP.

A script is a JSON object; every key is optional:

  "era"             "legacy" (default): the ``initialize`` handshake; ``server/discover`` → -32601.
                    "modern": 2026-07-28, stateless: ``initialize`` → -32022 with data
                    {"supported": ["2026-07-28"], "requested": ...}; ``server/discover`` answers
                    {supportedVersions, capabilities, serverInfo, cacheScope, ttlMs}; every
                    request needs params._meta with the protocol version and client
                    capabilities (missing → -32602, another version → -32022); every result has
                    "resultType": "complete" and _meta["io.modelcontextprotocol/serverInfo"]
                    (as the mcp SDK stamps it); ``ping`` → -32601; no server-to-client requests.
                    "silent": reads (and logs) everything, never answers: a handshake that hangs.
  "protocolVersion" what the legacy ``initialize`` result says (default "2025-11-25").
  "serverInfo"      default {"name": "scripted", "version": "1"}; "instructions": a string.
  "capabilities"    merged over the capabilities the server declares.
  "tools"           tool definitions; the "behaviour" key (below) is not sent on the wire.
                    Default: [ECHO_TOOL].
  "pageSize"        tools/list pages of this many tools (opaque cursor / nextCursor).
  "manyTools"       {"count": N, "descriptionBytes": B}: N more echo tools ``many-1``... whose
                    descriptions are B bytes long (made at start: a script file stays small).
  "listChangedAfterInitialized"  {"addTools": [...], "delay": 0}: after
                    ``notifications/initialized`` emit ``notifications/tools/list_changed`` and
                    list the added tools from then on (tools.listChanged is then declared true).
  "pingClient"      after initialized, send ``ping`` to the client (its answer is logged).
  "rootsList"       after initialized, send ``roots/list`` (the answer is logged).
  "ignoreUnknownMethods"  never answer unknown methods (legacy: ``server/discover`` too),
                    instead of -32601: a modern probe that gets no answer.
  "validateArguments"  default true: missing required / wrongly typed top-level arguments
                    give an isError result (as the TS SDK does).
  "log"             a file: one JSON object per line, appended: {"event": "recv", "message": ...}
                    for every message received (as received), and events such as "start" (pid,
                    pgid, cwd, argv, env), "initialized", "cancelled" (requestId, reason,
                    pending), "response" (the client's answer to our ping/roots/list: method,
                    message), "badLine", "stdinEOF", "sigterm", "crash". Use ``readLog(path)``.
  stdio only:
  "stderrAtStart"   write this many bytes to stderr (in chunks, blocking) before reading stdin.
  "exitAtStart"     {"code": 3, "stderr": "boom"}: write that to stderr, exit at once.
  "pidFile"         write os.getpid() there at start.
  "childPidFile"    start a long-lived child (``sleep 600``) in the same process group and write
                    its pid there. "childKeepsPipes": true lets it inherit stdin/stdout/stderr
                    (as npx's node does); by default they are /dev/null.
  "ignoreStdinEOF"  keep running after stdin closes (until killed).
  "ignoreSIGTERM"   ignore SIGTERM (logged as "sigterm"); only SIGKILL ends the process.
  "flood"           {"after": METHOD, "message": {...}, "count": 0, "readStdin": false}: once the
                    first message of METHOD is answered, write ``message`` ``count`` times (0: until
                    killed) as fast as stdout takes them, each with a fresh "id" when it has one;
                    stdin is read no more unless "readStdin" (logged as "flooding").

A tool's "behaviour" is a name, or a one-key object {name: options}:

  "echo"                        text content: arguments["text"].
  {"content": [blocks]}         {"content": blocks} as given (see EVERY_CONTENT_TYPE).
  {"result": {...}}             the whole result as given.
  "structured"                  {"content": [], "structuredContent": {"echo": arguments}}.
  "error" / {"error": {"message": m}}   isError result, text "it went wrong: ...".
  "jsonrpcError" / {"jsonrpcError": {"code": c, "message": m}}   a JSON-RPC error (-32603).
  {"progress": {"steps": N, "delay": s}}  N ``notifications/progress`` (when the request had
                                _meta.progressToken) spaced by s, then text "done in N steps"
                                (or arguments["text"]).
  {"slow": {"seconds": S, "answerAfterCancel": false}}  answers after S seconds unless cancelled
                                first (answerAfterCancel: answers anyway, a late answer).
  "crash"                       stderr "crashing", exit 1 mid-call (HTTP: the connection drops).
  {"hugeLine": {"bytes": N}}    one line of N bytes of 'x' on stdout, then the echo answer.
  {"notify": [{"method": m, "params": p}]}  send these notifications (related to the call),
                                then the echo answer (e.g. notifications/message).
  "env"                         text: JSON of {name: os.environ.get(name) for arguments["names"]}
                                plus "cwd": os.getcwd().
  "sleepForever"                never answers (until cancelled or killed).
  {"elicit": params}            sends ``elicitation/create`` with these params to the client (related
                                to the call); once answered, the call's text is the JSON of the
                                client's result (or {"error": ...}), keys sorted.

Unknown tools give an isError result "unknown tool NAME"; ``ping`` is answered {} (legacy).
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-11-25"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022

# Send(message, relatedRequestId): relatedRequestId is the id of the client request the message
# belongs to (its answer, its progress), or None for messages of their own (list_changed, ping).
Send = Callable[[dict[str, Any], Any], None]
# Later(seconds, function) -> a callable that cancels it.
Later = Callable[[float, Callable[[], None]], Callable[[], None]]


def _png1x1() -> bytes:
    """A valid 1x1 red RGBA PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", binascii.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00\xff")  # filter byte 0, then one RGBA pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _wav(samples: int = 80, rate: int = 8000) -> bytes:
    """A valid 10 ms mono 8-bit PCM WAV of silence."""
    data = b"\x80" * samples
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)


TINY_PNG = _png1x1()
TINY_PNG_BASE64 = base64.b64encode(TINY_PNG).decode()
TINY_WAV = _wav()
TINY_WAV_BASE64 = base64.b64encode(TINY_WAV).decode()
BLOB_BYTES = bytes(range(16))

EVERY_CONTENT_TYPE: list[dict[str, Any]] = [
    {"type": "text", "text": "plain text"},
    {"type": "image", "data": TINY_PNG_BASE64, "mimeType": "image/png"},
    {"type": "audio", "data": TINY_WAV_BASE64, "mimeType": "audio/wav"},
    {"type": "resource_link", "uri": "file:///tmp/linked.txt", "name": "linked.txt", "mimeType": "text/plain"},
    {"type": "resource", "resource": {"uri": "file:///tmp/embedded.txt", "mimeType": "text/plain",
                                      "text": "embedded text"}},
    {"type": "resource", "resource": {"uri": "file:///tmp/embedded.bin", "mimeType": "application/octet-stream",
                                      "blob": base64.b64encode(BLOB_BYTES).decode()}},
]

TEXT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}

ECHO_TOOL: dict[str, Any] = {
    "name": "echo",
    "description": "Returns its text argument.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "behaviour": "echo",
}

DEFAULT_SERVER_INFO = {"name": "scripted", "version": "1"}


def tool(name: str, behaviour: Any = "echo", *, description: str | None = None,
         inputSchema: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A tool definition for a script; ``fields`` adds e.g. annotations or outputSchema."""
    if inputSchema is None:
        kind = behaviour if isinstance(behaviour, str) else next(iter(behaviour), "")
        if kind == "echo":
            inputSchema = copy.deepcopy(ECHO_TOOL["inputSchema"])
        elif kind == "env":
            inputSchema = {"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}}},
                           "required": ["names"]}
        else:
            inputSchema = copy.deepcopy(TEXT_SCHEMA)
    return {"name": name, "description": description or f"A scripted tool ({name}).", "inputSchema": inputSchema,
            "behaviour": behaviour, **fields}


def readLog(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a script's "log" file (an empty list if there is none yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def received(entries: list[dict[str, Any]], method: str | None = None) -> list[dict[str, Any]]:
    """The messages received, from log entries (only those of ``method`` if given)."""
    messages = [e["message"] for e in entries if e.get("event") == "recv"]
    return [m for m in messages if method is None or (isinstance(m, dict) and m.get("method") == method)]


def stdioCommand(scriptPath: str | os.PathLike[str] | None = None) -> list[str]:
    """The argv that runs this server on ``scriptPath`` with the current interpreter."""
    argv = [sys.executable, os.path.abspath(__file__)]
    return argv + ([os.fspath(scriptPath)] if scriptPath is not None else [])


def _threadLater(seconds: float, function: Callable[[], None]) -> Callable[[], None]:
    timer = threading.Timer(seconds, function)
    timer.daemon = True
    timer.start()
    return timer.cancel


def _key(requestId: Any) -> str:
    return json.dumps(requestId, sort_keys=True)


def _error(code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def _behaviour(spec: Any) -> tuple[str, Any]:
    if isinstance(spec, str):
        return spec, None
    if isinstance(spec, dict) and len(spec) == 1:
        ((kind, options),) = spec.items()
        return kind, options
    raise ValueError(f"a behaviour is a name or a one-key object, not {spec!r}")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _argumentProblem(schema: Any, arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return "arguments must be an object"
    if not isinstance(schema, dict):
        return None
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for name, value in arguments.items():
        wanted = (schema.get("properties") or {}).get(name, {}).get("type")
        kinds = [wanted] if isinstance(wanted, str) else wanted or []
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, ()))
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"argument {name!r} must be of type {wanted}"
    return None


class _Call:
    """A tools/call still in progress."""

    def __init__(self, requestId: Any) -> None:
        self.requestId = requestId
        self.cancelTimer: Callable[[], None] | None = None
        self.cancelled = False
        self.answerAfterCancel = False


class ScriptedMCP:
    """The transport-neutral scripted server: ``receive`` one message, answers go to ``send``.

    ``later`` schedules delayed work (threads by default; a reactor's callLater in
    HTTP), ``rawWrite(data, related)`` writes a non-JSON line (hugeLine),
    ``crash(related)`` ends the transport mid-call, ``onEvent(entry)`` sees every
    log entry (also kept in ``events``). Safe to call from several threads.
    """

    def __init__(self, script: dict[str, Any] | None, send: Send, *, later: Later | None = None,
                 rawWrite: Callable[[bytes, Any], None] | None = None,
                 crash: Callable[[Any], None] | None = None,
                 onEvent: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.script = dict(script or {})
        self.era = self.script.get("era", "legacy")
        if self.era not in ("legacy", "modern", "silent"):
            raise ValueError(f"unknown era {self.era!r}")
        self._send = send
        self._later = later or _threadLater
        self._rawWrite = rawWrite
        self._crash = crash or self._exitCrash
        self._onEvent = onEvent
        self.serverInfo = self.script.get("serverInfo", DEFAULT_SERVER_INFO)
        self.protocolVersion = self.script.get("protocolVersion", LEGACY_VERSION)
        self.tools: list[dict[str, Any]] = copy.deepcopy(self.script.get("tools", [ECHO_TOOL]))
        many = self.script.get("manyTools")
        if many:
            filler = "x" * int(many.get("descriptionBytes", 1000))
            self.tools += [tool(f"many-{n}", description=filler) for n in range(1, int(many["count"]) + 1)]
        self.listChanged = self.script.get("listChangedAfterInitialized")
        self.events: list[dict[str, Any]] = []
        self.initialized = False
        self.clientInfo: Any = None
        self.clientCapabilities: Any = None
        self._calls: dict[str, _Call] = {}
        self._outgoing: dict[str, str] = {}  # our request id -> its method
        self._onAnswer: dict[str, Callable[[dict[str, Any]], None]] = {}  # our request id -> what its answer does
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # --- entry points ---

    def receiveLine(self, line: bytes | str) -> None:
        """One line of the wire (JSON text)."""
        try:
            message = json.loads(line)
        except ValueError:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            self.event("badLine", line=text[:200], length=len(line))
            if self.era != "silent":
                self._emit({"jsonrpc": "2.0", "id": None, "error": _error(PARSE_ERROR, "Parse error")}, None)
            return
        self.receive(message)

    def receive(self, message: Any) -> None:
        """One decoded JSON-RPC message from the client."""
        with self._lock:
            self.event("recv", message=message)
            if self.era == "silent":
                return
            if not isinstance(message, dict):
                self._emit({"jsonrpc": "2.0", "id": None, "error": _error(INVALID_REQUEST, "Invalid Request")}, None)
            elif isinstance(message.get("method"), str):
                if "id" in message:
                    self._request(message)
                else:
                    self._notification(message)
            elif "id" in message and ("result" in message or "error" in message):
                method = self._outgoing.pop(_key(message["id"]), None)
                self.event("response", method=method, message=message)
                answered = self._onAnswer.pop(_key(message["id"]), None)
                if answered is not None:
                    answered(message)
            else:
                self._emit({"jsonrpc": "2.0", "id": message.get("id"),
                            "error": _error(INVALID_REQUEST, "Invalid Request")}, message.get("id"))

    def cancel(self, requestId: Any, reason: Any = None) -> bool:
        """Cancel a call in progress, as ``notifications/cancelled`` does; whether one was pending."""
        with self._lock:
            call = self._calls.get(_key(requestId))
            self.event("cancelled", requestId=requestId, reason=reason, pending=call is not None)
            if call is None:
                return False
            call.cancelled = True
            if not call.answerAfterCancel:
                del self._calls[_key(requestId)]
                if call.cancelTimer is not None:
                    call.cancelTimer()
            return True

    def isPending(self, requestId: Any) -> bool:
        """Whether a tools/call with this id is still unanswered (and not cancelled)."""
        with self._lock:
            return _key(requestId) in self._calls

    @property
    def pendingCalls(self) -> list[Any]:
        """The ids of the tools/call requests not answered yet."""
        with self._lock:
            return [c.requestId for c in self._calls.values()]

    def event(self, kind: str, **fields: Any) -> None:
        entry = {"event": kind, "time": time.time(), **fields}
        self.events.append(entry)
        if self._onEvent is not None:
            self._onEvent(entry)

    # --- sending ---

    def _emit(self, message: dict[str, Any], related: Any) -> None:
        self._send(message, related)

    def _result(self, requestId: Any, result: dict[str, Any]) -> None:
        if self.era == "modern":  # as the mcp SDK does: resultType, and serverInfo stamped in _meta
            meta = {**(result.get("_meta") or {}), SERVER_INFO_META: self.serverInfo}
            result = {**result, "resultType": "complete", "_meta": meta}
        self._emit({"jsonrpc": "2.0", "id": requestId, "result": result}, requestId)

    def _fail(self, requestId: Any, code: int, message: str, data: Any = None) -> None:
        self._emit({"jsonrpc": "2.0", "id": requestId, "error": _error(code, message, data)}, requestId)

    def _notify(self, method: str, params: dict[str, Any] | None, related: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._emit(message, related)

    def _ask(self, method: str, params: dict[str, Any] | None = None, related: Any = None) -> str:
        requestId = f"srv-{next(self._ids)}"
        self._outgoing[_key(requestId)] = method
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": requestId, "method": method}
        if params is not None:
            message["params"] = params
        self._emit(message, related)
        return requestId

    # --- requests ---

    def _request(self, message: dict[str, Any]) -> None:
        requestId, method = message["id"], message["method"]
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return self._fail(requestId, INVALID_PARAMS, "params must be an object")
        if self.era == "modern":
            if method == "initialize":
                data = {"supported": [MODERN_VERSION], "requested": params.get("protocolVersion")}
                return self._fail(requestId, UNSUPPORTED_PROTOCOL_VERSION,
                                  "this server speaks 2026-07-28 only; the initialize handshake is not accepted",
                                  data)
            meta = params.get("_meta")
            if not isinstance(meta, dict):
                return self._fail(requestId, INVALID_PARAMS, "params._meta must carry the protocol version "
                                  "and client capabilities")
            missing = [k for k in (PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META) if k not in meta]
            if missing:
                return self._fail(requestId, INVALID_PARAMS,
                                  f"params._meta is missing the required key(s): {', '.join(missing)}")
            if meta[PROTOCOL_VERSION_META] != MODERN_VERSION:
                return self._fail(requestId, UNSUPPORTED_PROTOCOL_VERSION, "unsupported protocol version",
                                  {"supported": [MODERN_VERSION], "requested": meta[PROTOCOL_VERSION_META]})
        handler = {
            "initialize": self._initialize,
            "ping": self._ping,
            "server/discover": self._discover,
            "tools/list": self._toolsList,
            "tools/call": self._toolsCall,
        }.get(method)
        if (handler is None or (method == "server/discover" and self.era != "modern")
                or (method == "ping" and self.era == "modern")):
            if self.script.get("ignoreUnknownMethods"):
                self.event("ignored", method=method, requestId=requestId)
                return None
            return self._fail(requestId, METHOD_NOT_FOUND, f"Method not found: {method}")
        return handler(requestId, params)

    def _capabilities(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        if self.era == "legacy":
            tools["listChanged"] = bool(self.listChanged)
        capabilities: dict[str, Any] = {"tools": tools}
        capabilities.update(self.script.get("capabilities", {}))
        return capabilities

    def _initialize(self, requestId: Any, params: dict[str, Any]) -> None:
        self.clientInfo = params.get("clientInfo")
        self.clientCapabilities = params.get("capabilities")
        self.event("initialize", requested=params.get("protocolVersion"), clientInfo=self.clientInfo)
        result: dict[str, Any] = {"protocolVersion": self.protocolVersion, "capabilities": self._capabilities(),
                                  "serverInfo": self.serverInfo}
        if "instructions" in self.script:
            result["instructions"] = self.script["instructions"]
        self._result(requestId, result)

    def _ping(self, requestId: Any, params: dict[str, Any]) -> None:
        self._result(requestId, {})

    def _discover(self, requestId: Any, params: dict[str, Any]) -> None:
        result: dict[str, Any] = {"supportedVersions": [MODERN_VERSION], "capabilities": self._capabilities(),
                                  "serverInfo": self.serverInfo, "cacheScope": "private", "ttlMs": 0}
        if "instructions" in self.script:
            result["instructions"] = self.script["instructions"]
        self._result(requestId, result)

    def _toolsList(self, requestId: Any, params: dict[str, Any]) -> None:
        wire = [{k: v for k, v in t.items() if k != "behaviour"} for t in self.tools]
        start = 0
        cursor = params.get("cursor")
        if cursor is not None:
            try:
                prefix, _, offset = base64.urlsafe_b64decode(str(cursor).encode()).decode().partition(":")
                start = int(offset)
                if prefix != "page" or not 0 <= start <= len(wire):
                    raise ValueError(cursor)
            except (ValueError, binascii.Error, UnicodeDecodeError):
                return self._fail(requestId, INVALID_PARAMS, f"invalid cursor {cursor!r}")
        size = self.script.get("pageSize") or len(wire) or 1
        result: dict[str, Any] = {"tools": wire[start:start + size]}
        if start + size < len(wire):
            result["nextCursor"] = base64.urlsafe_b64encode(f"page:{start + size}".encode()).decode()
        self._result(requestId, result)

    def _toolsCall(self, requestId: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        definition = next((t for t in self.tools if t.get("name") == name), None)
        if definition is None:
            return self._result(requestId, {"isError": True, "content": [{"type": "text", "text": f"unknown tool {name}"}]})
        if self.script.get("validateArguments", True):
            problem = _argumentProblem(definition.get("inputSchema"), arguments)
            if problem is not None:
                text = f"invalid arguments for tool {name}: {problem}"
                return self._result(requestId, {"isError": True, "content": [{"type": "text", "text": text}]})
        kind, options = _behaviour(definition.get("behaviour", "echo"))
        options = options if options is not None else {}
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        progressToken = meta.get("progressToken")
        text = arguments.get("text") if isinstance(arguments.get("text"), str) else None
        self.event("call", requestId=requestId, tool=name, behaviour=kind)
        if kind == "echo":
            self._textResult(requestId, text if text is not None else "")
        elif kind == "content":
            blocks = options.get("content", []) if isinstance(options, dict) else options
            self._result(requestId, {"content": copy.deepcopy(blocks)})
        elif kind == "result":
            self._result(requestId, copy.deepcopy(options))
        elif kind == "structured":
            self._result(requestId, {"content": [], "structuredContent": {"echo": arguments}})
        elif kind == "error":
            detail = options.get("message") if isinstance(options, dict) and "message" in options else (
                text if text is not None else json.dumps(arguments, sort_keys=True))
            self._result(requestId, {"isError": True, "content": [{"type": "text", "text": f"it went wrong: {detail}"}]})
        elif kind == "jsonrpcError":
            self._fail(requestId, int(options.get("code", INTERNAL_ERROR)), options.get("message", "scripted failure"),
                       options.get("data"))
        elif kind == "progress":
            self._progress(requestId, progressToken, int(options.get("steps", 3)), float(options.get("delay", 0.05)),
                           text)
        elif kind == "slow":
            seconds = float(options.get("seconds", 5))
            call = self._begin(requestId)
            call.answerAfterCancel = bool(options.get("answerAfterCancel"))
            call.cancelTimer = self._later(seconds, lambda: self._finishText(call, text or f"slept {seconds:g}s"))
        elif kind == "sleepForever":
            self._begin(requestId)
        elif kind == "elicit":
            call = self._begin(requestId)
            asked = self._ask("elicitation/create", copy.deepcopy(options), requestId)
            self._onAnswer[_key(asked)] = lambda answer: self._finishText(
                call, json.dumps(answer["result"] if "result" in answer else {"error": answer.get("error")},
                                 sort_keys=True))
        elif kind == "crash":
            self.event("crash", requestId=requestId)
            self._crash(requestId)
        elif kind == "hugeLine":
            size = int(options.get("bytes", 1 << 20))
            if self._rawWrite is not None:
                self._rawWrite(b"x" * size, requestId)
            self._textResult(requestId, text if text is not None else f"after a line of {size} bytes")
        elif kind == "notify":
            for note in options or []:
                self._notify(note["method"], note.get("params"), requestId)
            self._textResult(requestId, text if text is not None else "")
        elif kind == "env":
            names = arguments.get("names") or []
            values: dict[str, Any] = {n: os.environ.get(n) for n in names}
            values["cwd"] = os.getcwd()
            self._textResult(requestId, json.dumps(values, sort_keys=True))
        else:
            self._fail(requestId, INTERNAL_ERROR, f"unknown scripted behaviour {kind!r}")
        return None

    def _textResult(self, requestId: Any, text: str) -> None:
        self._result(requestId, {"content": [{"type": "text", "text": text}]})

    def _begin(self, requestId: Any) -> _Call:
        call = _Call(requestId)
        self._calls[_key(requestId)] = call
        return call

    def _finishText(self, call: _Call, text: str) -> None:
        with self._lock:
            if call.cancelled and not call.answerAfterCancel:
                return
            self._calls.pop(_key(call.requestId), None)
            self._textResult(call.requestId, text)

    def _progress(self, requestId: Any, token: Any, steps: int, delay: float, text: str | None) -> None:
        call = self._begin(requestId)

        def step(n: int) -> None:
            with self._lock:
                if call.cancelled:
                    return
                if token is not None:
                    self._notify("notifications/progress", {"progressToken": token, "progress": n, "total": steps,
                                                            "message": f"step {n}"}, requestId)
                if n < steps:
                    call.cancelTimer = self._later(delay, lambda: step(n + 1))
                else:
                    self._finishText(call, text if text is not None else f"done in {steps} steps")

        if steps <= 0:
            self._finishText(call, text if text is not None else "done in 0 steps")
        else:
            call.cancelTimer = self._later(delay, lambda: step(1))

    # --- notifications ---

    def _notification(self, message: dict[str, Any]) -> None:
        method = message["method"]
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        if method == "notifications/cancelled":
            self.cancel(params.get("requestId"), params.get("reason"))
        elif method == "notifications/initialized" and self.era == "legacy":
            self.initialized = True
            self.event("initialized")
            self._afterInitialized()

    def _afterInitialized(self) -> None:
        if self.listChanged:
            delay = float(self.listChanged.get("delay", 0))
            if delay > 0:
                self._later(delay, self._changeList)
            else:
                self._changeList()
        if self.script.get("pingClient"):
            self._ask("ping")
        if self.script.get("rootsList"):
            self._ask("roots/list")

    def _changeList(self) -> None:
        with self._lock:
            self.tools.extend(copy.deepcopy(self.listChanged.get("addTools", [])))
            self.event("listChanged", tools=[t.get("name") for t in self.tools])
            self._notify("notifications/tools/list_changed", None)

    @staticmethod
    def _exitCrash(related: Any) -> None:
        sys.stderr.write("crashing\n")
        sys.stderr.flush()
        os._exit(1)


# --- the stdio entry point ---


class _StdioServer:
    def __init__(self, script: dict[str, Any]) -> None:
        self.script = script
        self.out = sys.stdout.buffer
        self.outLock = threading.Lock()
        self.logLock = threading.RLock()  # a SIGTERM handler may log while the main thread does
        self.logPath = script.get("log")
        self.core = ScriptedMCP(script, self.send, rawWrite=self.raw, onEvent=self.logEvent)

    def logEvent(self, entry: dict[str, Any]) -> None:
        if self.logPath is None:
            return
        line = json.dumps(entry, default=repr) + "\n"
        with self.logLock, open(self.logPath, "a", encoding="utf-8") as f:
            f.write(line)

    def write(self, data: bytes) -> None:
        with self.outLock:
            try:
                self.out.write(data)
                self.out.flush()
            except (BrokenPipeError, ValueError, OSError) as e:
                self.core.event("writeFailed", error=str(e))

    def send(self, message: dict[str, Any], related: Any) -> None:
        self.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def raw(self, data: bytes, related: Any) -> None:
        self.write(data + b"\n")

    def start(self) -> None:
        script = self.script
        if script.get("pidFile"):
            with open(script["pidFile"], "w") as f:
                f.write(str(os.getpid()))
        self.core.event("start", pid=os.getpid(), ppid=os.getppid(), pgid=os.getpgrp(), cwd=os.getcwd(),
                        argv=sys.argv, env=dict(os.environ))
        if "exitAtStart" in script:
            spec = script["exitAtStart"] or {}
            sys.stderr.write(str(spec.get("stderr", "")) + "\n")
            sys.stderr.flush()
            os._exit(int(spec.get("code", 1)))
        if script.get("ignoreSIGTERM"):
            signal.signal(signal.SIGTERM, lambda signum, frame: self.core.event("sigterm"))
        if script.get("childPidFile"):
            sleep = shutil.which("sleep")
            argv = [sleep, "600"] if sleep else [sys.executable, "-c", "import time; time.sleep(600)"]
            pipes = {} if script.get("childKeepsPipes") else {
                "stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            child = subprocess.Popen(argv, **pipes)  # noqa: S603 - a fixed command
            with open(script["childPidFile"], "w") as f:
                f.write(str(child.pid))
            self.core.event("child", pid=child.pid)
        flood = int(script.get("stderrAtStart", 0))
        if flood > 0:
            line = b"stderr flood: the quick brown fox jumps over the lazy dog\n"
            chunk = (line * (65536 // len(line) + 1))[:65536]
            written = 0
            while written < flood:
                piece = chunk[: min(len(chunk), flood - written)]
                sys.stderr.buffer.write(piece)
                sys.stderr.buffer.flush()
                written += len(piece)
            self.core.event("stderrFlooded", bytes=written)

    def flood(self) -> None:
        spec = self.script["flood"]
        template = spec.get("message") or {"jsonrpc": "2.0", "id": 0, "method": "ping"}
        count = int(spec.get("count", 0))
        self.core.event("flooding", message=template, count=count)
        for n in itertools.count(1):
            if count and n > count:
                break
            message = {**template, "id": f"flood-{n}"} if "id" in template else template
            self.send(message, None)

    def run(self) -> int:
        self.start()
        stdin = sys.stdin.buffer
        flood = self.script.get("flood")
        while True:
            line = stdin.readline()
            if not line:
                break
            if line.strip():
                self.core.receiveLine(line)
                if flood and b'"method"' in line and json.loads(line).get("method") == flood.get("after"):
                    threading.Thread(target=self.flood, daemon=True).start()
                    if not flood.get("readStdin"):
                        while True:
                            time.sleep(3600)
                    flood = None
        self.core.event("stdinEOF")
        if self.script.get("ignoreStdinEOF"):
            while True:
                time.sleep(3600)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    script: dict[str, Any] = {}
    if args:
        with open(args[0], encoding="utf-8") as f:
            script = json.load(f)
    return _StdioServer(script).run()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon timers and a pending sleep need no joining
