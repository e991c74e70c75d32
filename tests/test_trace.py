"""``--trace FILE``: every frame in and out, as JSON lines, with secrets redacted."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.engine.secrets import REDACTED
from hermes_acp.jsonrpc import JSONRPCConnection
from hermes_acp.trace import FrameTrace, TraceError, openTrace, scrub, secretKey

from .agentproc import ENTRY_POINTS, agentEnv, frame, initialize, runAgent

SECRET = "sk-trace-secret-0123456789"
MCP_TOKEN = "ghp-mcp-token-abcdef0123"


def records(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


class HookTests(SynchronousTestCase):
    def test_everyLineInAndOut(self) -> None:
        """The connection hands the trace each line it reads and writes, in order,
        including lines that are not JSON and the errors they cause."""
        seen: list[tuple[str, bytes]] = []
        messages: list[Any] = []

        def trace(direction: str, line: bytes, message: Any) -> None:
            seen.append((direction, line))
            messages.append(message)

        connection = JSONRPCConnection({"echo": lambda p: p}, {}, Clock(), trace=trace)
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.dataReceived(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":1}}\nnot json\n')
        connection.notify("note", {"b": 2})
        written = transport.value().splitlines()
        self.assertEqual([d for d, _ in seen], ["in", "out", "in", "out", "out"])
        self.assertEqual(seen[0][1], b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":1}}')
        self.assertEqual(seen[2][1], b"not json")
        self.assertEqual([line for d, line in seen if d == "out"], written)
        self.assertEqual(json.loads(written[1])["error"]["code"], -32700)
        self.assertEqual(messages[0]["params"], {"a": 1})
        self.assertIsNone(messages[2])  # not JSON: the raw line is recorded
        self.assertEqual(messages[4]["method"], "note")

    def test_noTraceByDefault(self) -> None:
        connection = JSONRPCConnection({}, {}, Clock())
        self.assertIsNone(connection.trace)


class RedactionTests(SynchronousTestCase):
    def test_secretKeys(self) -> None:
        """Credential-looking names are caught; token counts are not."""
        for name in ("apiKey", "api_key", "HERMES_API_KEY", "x-api-key", "token", "accessToken",
                     "GITHUB_TOKEN", "clientSecret", "password", "Authorization"):
            self.assertTrue(secretKey(name), name)
        for name in ("inputTokens", "totalTokens", "maxTokens", "key", "keyPresent", "tokenizer", "name"):
            self.assertFalse(secretKey(name), name)

    def test_scrub(self) -> None:
        """Known secret values go wherever they are; strings under secret keys and
        secret name/value pairs (MCP env, headers) go too; the rest stays."""
        frame = {
            "params": {
                "apiKey": "whatever-it-is",
                "text": f"my key is {SECRET}, ok",
                "usage": {"inputTokens": 12, "totalTokens": 40},
                "mcpServers": [{
                    "name": "gh", "command": "gh-mcp", "args": [],
                    "env": [{"name": "GITHUB_TOKEN", "value": MCP_TOKEN}, {"name": "LANG", "value": "C"}],
                    "headers": [{"name": "Authorization", "value": "Bearer abc"}],
                }],
                "emptyToken": "",
            }
        }
        clean = scrub(frame, [SECRET])
        params = clean["params"]
        self.assertEqual(params["apiKey"], REDACTED)
        self.assertEqual(params["text"], f"my key is {REDACTED}, ok")
        self.assertEqual(params["usage"], {"inputTokens": 12, "totalTokens": 40})
        server = params["mcpServers"][0]
        self.assertEqual(server["env"], [{"name": "GITHUB_TOKEN", "value": REDACTED}, {"name": "LANG", "value": "C"}])
        self.assertEqual(server["headers"], [{"name": "Authorization", "value": REDACTED}])
        self.assertEqual((server["name"], server["command"]), ("gh", "gh-mcp"))
        self.assertEqual(params["emptyToken"], "")
        self.assertNotIn(SECRET, json.dumps(clean))

    def test_records(self) -> None:
        """One JSON line per frame: time, direction, the decoded frame or the raw
        text; a NaN the peer sent is recorded as null, a lone surrogate as U+FFFD,
        and a frame too deep to scrub as a note: every line of the file is JSON."""
        path = Path(tempfile.mkdtemp()) / "t.jsonl"
        trace = FrameTrace(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), [SECRET], clock=lambda: 1234.5)
        message = {"jsonrpc": "2.0", "method": "m", "params": {"s": SECRET}}
        trace("in", json.dumps(message).encode(), message)
        trace("out", f"garbage {SECRET}".encode())
        trace("in", b'{"x": NaN, "u": "\\ud800"}', {"x": float("nan"), "u": "\ud800"})
        deep: Any = []
        for _ in range(5000):
            deep = [deep]
        trace("in", b"[[[...]]]", deep)
        trace.close()
        trace("out", b"{}", {})  # after close: ignored
        found = records(path)
        self.assertEqual(found[0], {"t": 1234.5, "dir": "in", "frame": {"jsonrpc": "2.0", "method": "m", "params": {"s": REDACTED}}})
        self.assertEqual(found[1], {"t": 1234.5, "dir": "out", "frame": f"garbage {REDACTED}"})
        self.assertEqual(found[2]["frame"], {"x": None, "u": "\ufffd"})
        self.assertIn("nested too deeply", found[3]["frame"])
        self.assertEqual(len(found), 4)


class OpenTests(SynchronousTestCase):
    def test_refusesTheProtocolStdout(self) -> None:
        """The file the protocol writes to is refused, by any name."""
        path = Path(tempfile.mkdtemp()) / "stdout"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self.addCleanup(os.close, fd)
        with self.assertRaises(TraceError):
            openTrace(str(path), fd)
        read, write = os.pipe()
        self.addCleanup(os.close, read)
        self.addCleanup(os.close, write)
        with self.assertRaises(TraceError):
            openTrace(f"/dev/fd/{write}", write)

    def test_createdPrivateAndAppended(self) -> None:
        path = Path(tempfile.mkdtemp()) / "t.jsonl"
        path.write_text('{"earlier": true}\n')
        read, write = os.pipe()
        self.addCleanup(os.close, read)
        self.addCleanup(os.close, write)
        trace = openTrace(str(path), write)
        trace("in", b"{}")
        trace.close()
        self.assertEqual(len(path.read_text().splitlines()), 2)
        fresh = path.with_name("fresh.jsonl")
        openTrace(str(fresh), write).close()
        self.assertEqual(fresh.stat().st_mode & 0o777, 0o600)

    def test_unopenable(self) -> None:
        with self.assertRaises(TraceError) as caught:
            openTrace("/nonexistent-dir/t.jsonl", 1)
        self.assertIn("cannot open trace file", str(caught.exception))


class ProcessTests(SynchronousTestCase):
    def test_traceThroughEveryEntryPoint(self) -> None:
        """Under each entry point the trace holds every frame: what the editor sent
        ("in", secrets redacted) and exactly what the agent wrote to stdout ("out")."""
        for name, argv in ENTRY_POINTS.items():
            folder = tempfile.mkdtemp()
            path = Path(folder) / "trace.jsonl"
            env = agentEnv(HERMES_BASE_URL="http://127.0.0.1:9/v1", HERMES_MODEL="m", HERMES_MODELS="m",
                           HERMES_API_KEY=SECRET)
            mcp = {"name": "gh", "command": "gh-mcp", "args": [], "env": [{"name": "GITHUB_TOKEN", "value": MCP_TOKEN}]}
            requests = [
                initialize(0, clientInfo={"name": "test", "version": "1"}),
                frame("session/new", {"cwd": folder, "mcpServers": [mcp]}, 1),
                b"this is not json\n",
            ]
            run = runAgent(requests, argv=argv + ["--trace", str(path)], env=env)
            self.assertEqual(run.returncode, 0, (name, run.stderr[-2000:]))
            found = records(path)
            incoming = [r["frame"] for r in found if r["dir"] == "in"]
            outgoing = [r["frame"] for r in found if r["dir"] == "out"]
            self.assertEqual(outgoing, run.frames(), name)
            self.assertEqual(incoming[0], json.loads(requests[0]), name)
            self.assertEqual(incoming[1]["params"]["mcpServers"][0]["env"], [{"name": "GITHUB_TOKEN", "value": REDACTED}])
            self.assertEqual(incoming[2], "this is not json", name)
            self.assertTrue(all(isinstance(r["t"], float) for r in found))
            self.assertNotIn(MCP_TOKEN, path.read_text(), name)
            self.assertNotIn(SECRET, path.read_text(), name)
            self.assertEqual(path.stat().st_mode & 0o777, 0o600)

    def test_keysFromDotenvAreRedacted(self) -> None:
        """A key that only $HERMES_HOME/.env holds is known as a secret too."""
        home = tempfile.mkdtemp()
        Path(home, ".env").write_text(f"HERMES_BASE_URL=http://127.0.0.1:9/v1\nHERMES_MODELS=m\nHERMES_API_KEY={SECRET}\n")
        path = Path(home) / "trace.jsonl"
        echo = frame("session/new", {"cwd": home, "mcpServers": [], "_meta": {"note": f"key {SECRET}"}}, 1)
        run = runAgent([initialize(0), echo], argv=ENTRY_POINTS["hermes-acp"] + ["--trace", str(path)], env=agentEnv(home))
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        text = path.read_text()
        self.assertIn(f"key {REDACTED}", text)
        self.assertNotIn(SECRET, text)

    def test_stdoutIsRefused(self) -> None:
        """--trace - and --trace /dev/stdout exit 64 and write nothing on stdout."""
        for target in ("-", "/dev/stdout"):
            out = subprocess.run(ENTRY_POINTS["hermes-acp"] + ["--trace", target], input=initialize(0),
                                 capture_output=True, env=agentEnv(), timeout=60)
            self.assertEqual(out.returncode, 64, target)
            self.assertEqual(out.stdout, b"", target)
            self.assertIn(b"stdout", out.stderr, target)


class URLPasswordTests(SynchronousTestCase):
    def test_urlPasswordIsRedacted(self) -> None:
        """The password in HERMES_BASE_URL is a known secret value to the trace."""
        from hermes_acp.engine.secrets import secretValues

        secrets = secretValues({"HERMES_BASE_URL": "http://user:s3cretpass@127.0.0.1:1/v1"})
        self.assertEqual(scrub({"text": "url http://user:s3cretpass@127.0.0.1:1/v1"}, secrets),
                         {"text": f"url http://user:{REDACTED}@127.0.0.1:1/v1"})
