"""A hostile client on stdin (issue 10): lines that used to kill the process, wrong
error codes, and a client that floods requests without reading the answers.

Raw lines through the real process: the SDK client cannot send most of these.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from .agentproc import ENTRY_POINTS, agentEnv, frame, initialize, runAgent
from .test_process import assertValidStream


def raw(line: str) -> bytes:
    return line.encode() + b"\n"


def codes(frames: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(f.get("id"), f["error"]["code"] if "error" in f else "ok") for f in frames if "method" not in f]


def unread(fd: int) -> int:
    """Bytes written to a pipe that its reader has not taken (FIONREAD)."""
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def readRSS(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class KillerFrameTests(SynchronousTestCase):
    KILLERS = [
        raw('{"jsonrpc":"2.0","id":NaN,"method":"initialize","params":{"protocolVersion":1}}'),
        raw('{"jsonrpc":"2.0","id":Infinity,"method":"initialize","params":{"protocolVersion":1}}'),
        raw('{"jsonrpc":"2.0","id":-Infinity,"method":"initialize","params":{"protocolVersion":1}}'),
        raw('{"jsonrpc":"2.0","id":1e400,"method":"initialize","params":{"protocolVersion":1}}'),
        raw('{"jsonrpc":"2.0","id":"n","method":"initialize","params":{"protocolVersion":1,"x":NaN}}'),
        raw('{"jsonrpc":"2.0","id":"big","method":"initialize","params":{"protocolVersion":1,"x":[1e400]}}'),
        raw('{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":NaN}}'),
        raw('{"jsonrpc":"2.0","id":"deep","method":"initialize","params":{"x":' + "[" * 300 + "]" * 300 + "}}"),
        raw("[" * 1000 + "]" * 1000),
        raw('{"a":' * 1000 + "1" + "}" * 1000),
        raw('{"jsonrpc":"2.0","id":7,"result":' + "[" * 300 + "]" * 300 + "}"),  # an answer to nothing
        raw('{"jsonrpc":"2.0","id":{"x":1},"method":"initialize"}'),
        raw('{"jsonrpc":"2.0","id":"s","method":"initialize","params":{"protocolVersion":1,"clientInfo":{"name":"\\ud800","version":"\\udfff"}}}'),
    ]
    EXPECTED = [
        (None, -32600), (None, -32600), (None, -32600), (None, -32600),
        ("n", -32602), ("big", -32602), ("deep", -32602), (None, -32600), (None, -32600),
        (None, -32600), ("s", "ok"), ("after", "ok"),
    ]  # fmt: skip

    def check(self, argv: list[str], trace: Path | None = None) -> None:
        requests = [initialize(0), *self.KILLERS, initialize("after")]
        run = runAgent(requests, argv=argv + (["--trace", str(trace)] if trace else []))
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        frames = run.frames()
        assertValidStream(self, requests, frames)
        self.assertEqual(codes(frames)[1:], self.EXPECTED)
        byId = {json.dumps(f.get("id")): f for f in frames}
        self.assertIn("params.x", byId['"n"']["error"]["message"])
        self.assertIn("finite", byId['"n"']["error"]["message"])
        self.assertEqual(byId['"n"']["error"]["data"], {"field": "params.x"})
        self.assertIn("nested", byId['"deep"']["error"]["message"])

    def test_linesThatUsedToKillTheAgent(self) -> None:
        """NaN, Infinity and 1e400 ids, deep nesting, non-finite numbers in params
        and lone surrogates: each line gets its error (id null where the id cannot be
        echoed), and the agent answers the next request and exits 0 at EOF."""
        self.check(ENTRY_POINTS["python -m hermes_acp"])

    def test_theSameUnderTrace(self) -> None:
        """With --trace (whose scrubber used to recurse) the same lines are answered
        the same way, and every line of the trace file is JSON."""
        for name in ("hermes-acp", "twist hermes-acp"):
            path = Path(tempfile.mkdtemp()) / "t.jsonl"
            self.check(ENTRY_POINTS[name], trace=path)
            lines = path.read_bytes().split(b"\n")[:-1]
            records = [json.loads(line) for line in lines]  # every line parses
            self.assertGreaterEqual(len(records), 2 * len(self.KILLERS), name)


class ErrorCodeTests(SynchronousTestCase):
    def test_badParamsAreInvalidParamsAndUnknownSessionsNotFound(self) -> None:
        """A lone surrogate in a sessionId is an unknown session (-32002) on every
        method that takes one; a content block whose type is not a string, and a NUL
        in any path, are -32602 naming the field."""
        home = tempfile.mkdtemp()
        env = agentEnv(home, HERMES_BASE_URL="http://127.0.0.1:9/v1", HERMES_MODEL="m", HERMES_MODELS="m")
        ghost = "\ud800-not-a-session"
        cwd = tempfile.gettempdir()
        requests = [
            initialize(0),
            frame("session/load", {"sessionId": ghost, "cwd": cwd, "mcpServers": []}, 1),
            frame("session/resume", {"sessionId": ghost, "cwd": cwd, "mcpServers": []}, 2),
            frame("session/fork", {"sessionId": ghost, "cwd": cwd, "mcpServers": []}, 3),
            frame("session/close", {"sessionId": ghost}, 4),
            frame("session/delete", {"sessionId": ghost}, 5),
            frame("session/set_mode", {"sessionId": ghost, "modeId": "default"}, 6),
            frame("session/set_config_option", {"sessionId": ghost, "configId": "mode", "value": "default"}, 7),
            frame("session/set_model", {"sessionId": ghost, "modelId": "m"}, 8),
            frame("session/prompt", {"sessionId": ghost, "prompt": [{"type": "text", "text": "hi"}]}, 9),
            frame("session/list", {"cwd": "/tmp/\0x"}, 10),
            frame("session/new", {"cwd": "/tmp/\0x", "mcpServers": []}, 11),
            frame("session/new", {"cwd": cwd, "additionalDirectories": ["/tmp/\0y"], "mcpServers": []}, 12),
            frame("session/new", {"cwd": cwd, "mcpServers": []}, 13),
        ]
        run = runAgent(requests, env=env)
        frames = run.frames()
        sessionId = next(f["result"]["sessionId"] for f in frames if f.get("id") == 13)
        blocks = [{"type": ["text"], "text": "x"}, {"type": {"a": 1}, "text": "x"}, {"type": 3}, "text"]
        more = [frame("session/prompt", {"sessionId": sessionId, "prompt": [block]}, 20 + n) for n, block in enumerate(blocks)]
        load = frame("session/load", {"sessionId": sessionId, "cwd": cwd, "mcpServers": []}, 30)
        run = runAgent([initialize(0), *more, load], env=env)
        frames += run.frames()
        assertValidStream(self, requests + more + [load], frames)
        got = dict(codes(frames))
        self.assertEqual([got[i] for i in range(1, 10)], [-32002] * 9)
        self.assertEqual([got[i] for i in (10, 11, 12)], [-32602] * 3)
        self.assertEqual([got[20 + n] for n in range(len(blocks))], [-32602] * len(blocks))
        self.assertEqual(got[30], "ok")
        messages = {f.get("id"): f.get("error", {}).get("message", "") for f in frames}
        self.assertIn("NUL", messages[10])
        self.assertIn("additionalDirectories[0]", messages[12])
        self.assertIn("prompt[0]", messages[20])


class FloodTests(SynchronousTestCase):
    def test_floodWithoutReadingStaysBounded(self) -> None:
        """A client writing 6 MB of requests without reading a byte: the agent stops
        reading once its answers back up (the writer blocks), its memory stays
        bounded, and once the client reads, every request is answered in order."""
        count = 70_000
        request = b'{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":1}}\n'
        payload = b"".join(request % n for n in range(count))
        self.assertGreater(len(payload), 5_000_000)
        process = subprocess.Popen(
            ENTRY_POINTS["python -m hermes_acp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=agentEnv(), cwd=tempfile.gettempdir(),
        )
        self.addCleanup(lambda: process.poll() is None and process.kill())
        assert process.stdin is not None and process.stdout is not None
        stdin = process.stdin.fileno()
        os.set_blocking(stdin, False)
        written, stalled = 0, False
        while written < len(payload):
            if not select.select([], [stdin], [], 3.0)[1]:
                stalled = True  # nothing taken for 3 s: the agent stopped reading
                break
            try:
                written += os.write(stdin, payload[written : written + 65536])
            except BlockingIOError:
                continue
        rss = readRSS(process.pid)
        self.assertTrue(stalled, "the agent read everything without ever pushing back")
        # Back-pressure, not a slow reader: our end of its stdin pipe is full.
        self.assertGreater(unread(stdin), 32 * 1024)
        self.assertLess(written, len(payload) // 4)
        self.assertLess(rss, 150 * 1024 * 1024)

        answers: list[int] = []

        def reader() -> None:
            for line in process.stdout:  # type: ignore[union-attr]
                answers.append(json.loads(line)["id"])

        def writer() -> None:
            os.set_blocking(stdin, True)
            process.stdin.write(payload[written:])  # type: ignore[union-attr]
            process.stdin.close()  # type: ignore[union-attr]

        threading.Thread(target=reader, daemon=True).start()
        sending = threading.Thread(target=writer, daemon=True)
        sending.start()
        sending.join(120)
        self.assertFalse(sending.is_alive(), "the agent stopped reading for good")
        self.assertEqual(process.wait(120), 0)
        self.assertEqual(len(answers), count)
        self.assertEqual(answers, list(range(count)))
