"""Property tests for the framer and the JSON-RPC layer."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from .test_framing import connected
from .test_jsonrpc import Harness

lines = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12)
cuts = st.lists(st.integers(min_value=0, max_value=600), max_size=20)
jsonScalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
jsonValues = st.recursive(jsonScalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
validIds = st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30)


def chunked(data: bytes, positions: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in positions})
    pieces, start = [], 0
    for point in points + [len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


class FramerProperties(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(lines, cuts)
    def test_anySplitGivesTheSameLines(self, messages: list[bytes], positions: list[int]) -> None:
        """However the stream is cut, the same non-blank lines come out, in order."""
        protocol = connected()
        protocol.maxLength = 10_000
        data = b"".join(m + b"\n" for m in messages)
        for piece in chunked(data, positions):
            protocol.dataReceived(piece)
        expected = [m[:-1] if m.endswith(b"\r") else m for m in messages]
        self.assertEqual(protocol.lines, [m for m in expected if m.strip()])

    @settings(max_examples=100, deadline=None)
    @given(st.integers(min_value=1, max_value=200), lines, cuts)
    def test_overlongLinesNeverLeakIntoTheNext(self, size: int, messages: list[bytes], positions: list[int]) -> None:
        """An over-long line anywhere is dropped whole; the other lines survive."""
        protocol = connected()
        protocol.maxLength = 50
        long = b"L" * (51 + size)
        data = long + b"\n" + b"".join(m[:40] + b"\n" for m in messages)
        for piece in chunked(data, positions):
            protocol.dataReceived(piece)
        expected = [m[:40] for m in messages]
        expected = [m[:-1] if m.endswith(b"\r") else m for m in expected]
        self.assertEqual(protocol.lines, [m for m in expected if m.strip()])
        self.assertEqual(len(protocol.overflows), 1)


class JSONRPCProperties(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(validIds, jsonValues)
    def test_idsAndParamsEchoUnchanged(self, requestId: Any, value: Any) -> None:
        """Any valid id comes back unchanged (type included), with the result intact."""
        h = Harness({"echo": lambda p: p})
        h.send({"jsonrpc": "2.0", "id": requestId, "method": "echo", "params": {"v": value}})
        [frame] = h.frames()
        self.assertEqual(json.dumps(frame["id"]), json.dumps(requestId))
        self.assertEqual(json.dumps(frame["result"]["v"], sort_keys=True), json.dumps(value, sort_keys=True))

    @settings(max_examples=300, deadline=None)
    @given(jsonValues)
    def test_anyJSONGetsAtMostOneAnswerAndNoCrash(self, message: Any) -> None:
        """Whatever JSON arrives, the connection answers at most once, never crashes,
        and still serves the next request."""
        h = Harness({"ping": lambda p: {}})
        h.send(message)
        frames = h.frames()
        self.assertLessEqual(len(frames), 1)
        for frame in frames:
            self.assertEqual(frame["jsonrpc"], "2.0")
        h.send({"jsonrpc": "2.0", "id": "next", "method": "ping"})
        self.assertEqual(h.frames(), [{"jsonrpc": "2.0", "id": "next", "result": {}}])

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=200))
    def test_garbageBytes(self, data: bytes) -> None:
        """Arbitrary bytes (invalid UTF-8 included) produce only well-formed errors."""
        h = Harness({"ping": lambda p: {}})
        h.connection.dataReceived(data.replace(b"\n", b" ") + b"\n")
        for frame in h.frames():
            self.assertIn(frame.get("error", {}).get("code"), (-32700, -32600, -32601, -32602, None))
        h.send({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        self.assertEqual(h.frames()[-1]["id"], 1)
