"""The MCP client's parts without processes: names, server lists, results, the
event-stream parser, the connection's MCP rules, and the permission rule."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.config import Settings
from hermes_acp.engine.approval import ALLOW_ALWAYS, REJECT_ALWAYS
from hermes_acp.jsonrpc import InvalidParams
from hermes_acp.mcp import toolset
from hermes_acp.mcp.http import EventStream
from hermes_acp.mcp.registry import ALLOW, ASK, DENY, MCPServers, SessionServers
from hermes_acp.mcp.specs import HTTP, STDIO, ConfiguredServers, ServerSpec, fromRequest, merged, parseConfig
from hermes_acp.mcp import wire
from hermes_acp.mcp.wire import MCPConnection
from hermes_acp.session_state import SessionState


def _scratch() -> Path:
    """A file path in a folder of its own (``mktemp`` would write into the current folder under pytest)."""
    return Path(tempfile.mkdtemp(prefix="hermes-mcp-")) / "config.yaml"


class NameTests(SynchronousTestCase):
    def test_sanitizedAndPrefixed(self) -> None:
        self.assertEqual(toolset.exposedName("my server", "read.file/v2", set()), "mcp__my_server__read_file_v2")

    def test_longNamesKeepWithin64AndStayApart(self) -> None:
        long = "x" * 80
        first = toolset.exposedName("srv", long + "1", set())
        second = toolset.exposedName("srv", long + "2", {first})
        self.assertLessEqual(len(first), 64)
        self.assertLessEqual(len(second), 64)
        self.assertNotEqual(first, second)
        self.assertEqual(first, toolset.exposedName("srv", long + "1", set()))  # stable across sessions

    def test_collisionAfterSanitizingGetsAHash(self) -> None:
        routes = toolset.routes(ServerSpec("srv", STDIO), [{"name": "a.b"}, {"name": "a/b"}], set())
        names = [route.exposed for route in routes]
        self.assertEqual(names[0], "mcp__srv__a_b")
        self.assertNotEqual(names[0], names[1])
        self.assertEqual([route.tool for route in routes], ["a.b", "a/b"])  # the way back


class SpecTests(SynchronousTestCase):
    def test_stdioAndHttpEntries(self) -> None:
        specs = fromRequest([
            {"name": "a", "command": "npx", "args": ["-y", "srv"], "env": [{"name": "K", "value": "v"}]},
            {"type": "stdio", "name": "b", "command": "/bin/b", "args": None, "env": None},
            {"type": "http", "name": "c", "url": "https://x/mcp", "headers": [{"name": "Authorization", "value": "t"}]},
            {"type": "sse", "name": "d", "url": "https://x/sse", "headers": []},
        ])
        self.assertEqual([(s.name, s.transport) for s in specs], [("a", STDIO), ("b", STDIO), ("c", HTTP), ("d", "sse")])
        self.assertEqual(specs[0].env, (("K", "v"),))
        self.assertEqual(specs[2].headers, (("Authorization", "t"),))

    def test_badEntriesNameTheirField(self) -> None:
        for servers, field in [
            ("x", "mcpServers"),
            ([{"command": "x"}], "mcpServers[0].name"),
            ([{"name": "a", "command": "x", "args": [1]}], "mcpServers[0].args"),
            ([{"name": "a", "command": "x", "env": [{"name": "A=B", "value": "1"}]}], "mcpServers[0].env[0]"),
            ([{"type": "http", "name": "h", "url": "https://x", "headers": [{"name": "H", "value": "a\r\nb"}]}],
             "mcpServers[0].headers[0]"),
            ([{"type": "ws", "name": "w"}], "mcpServers[0].type"),
            ([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}], "mcpServers[1].name"),
        ]:
            with self.assertRaises(InvalidParams) as caught:
                fromRequest(servers)
            self.assertEqual(caught.exception.data["field"], field)

    def test_configFile(self) -> None:
        path = _scratch()
        path.write_text(
            "mcp_servers:\n"
            "  local:\n    command: npx\n    args: [-y, thing]\n    env: {TOKEN: abc}\n    trusted: true\n"
            "  remote:\n    url: https://example.invalid/mcp\n    headers: {Authorization: Bearer x}\n    timeout: 5\n"
            "  off:\n    command: x\n    enabled: false\n"
            "  bad:\n    url: ftp://x\n")
        specs, problems = parseConfig(path)
        self.assertEqual([(s.name, s.transport, s.trusted, s.origin) for s in specs],
                         [("local", STDIO, True, "config"), ("remote", HTTP, False, "config")])
        self.assertEqual(specs[0].env, (("TOKEN", "abc"),))
        self.assertEqual(specs[1].callTimeout, 5.0)
        self.assertEqual(len(problems), 1)
        self.assertIn("mcp_servers.bad", problems[0])

    def test_unreadableConfigIsAProblemNotACrash(self) -> None:
        path = _scratch()
        path.write_text("mcp_servers: [unclosed\n")
        specs, problems = parseConfig(path)
        self.assertEqual(specs, [])
        self.assertIn("could not be read", problems[0])

    def test_unbuildableOrDeepConfigIsAProblemNotACrash(self) -> None:
        """A value PyYAML cannot build (a date that does not exist) or nesting past Python's
        recursion limit is said, like a syntax error, instead of failing every session."""
        for text in ("mcp_servers:\n  a:\n    command: x\n    updated: 2024-02-30\n",
                     "mcp_servers: " + "[" * 5000 + "]" * 5000 + "\n"):
            path = _scratch()
            path.write_text(text)
            specs, problems = parseConfig(path)
            self.assertEqual(specs, [])
            self.assertIn("could not be read", problems[0])

    def test_readAgainOnlyWhenTheFileChanges(self) -> None:
        path = _scratch()
        configured = ConfiguredServers(path)
        self.assertEqual(configured.read(), ([], []))
        path.write_text("mcp_servers:\n  a:\n    command: x\n")
        self.assertEqual([s.name for s in configured.read()[0]], ["a"])

    def test_editorWinsOnAClash(self) -> None:
        editor = [ServerSpec("a", STDIO, command="editor")]
        configured = [ServerSpec("a", STDIO, command="config", origin="config"),
                      ServerSpec("b", STDIO, command="config", origin="config")]
        self.assertEqual([s.command for s in merged(editor, configured)], ["editor", "config"])


def result(**fields: Any) -> dict[str, Any]:
    return dict(fields)


class ResultTests(SynchronousTestCase):
    def test_textForTheModelContentForTheEditor(self) -> None:
        text, failed, extras = toolset.outcome(secrets=[], result=result(content=[
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a", "name": "a"},
        ]))
        self.assertFalse(failed)
        self.assertIn("hello", text)
        self.assertIn("[image: image/png", text)
        self.assertIn("[resource link: a <file:///a>]", text)
        self.assertEqual([b["content"]["type"] for b in extras["content"]], ["text", "image", "resource_link"])

    def test_errorsAndStructuredContent(self) -> None:
        text, failed, _ = toolset.outcome(secrets=[], result=result(isError=True, content=[{"type": "text", "text": "no"}]))
        self.assertEqual((text, failed), ("Error: no", True))
        text, failed, extras = toolset.outcome(secrets=[], result=result(content=[], structuredContent={"n": 1}))
        self.assertEqual(json.loads(text), {"n": 1})
        self.assertIn('"n": 1', extras["content"][0]["content"]["text"])
        self.assertTrue(toolset.outcome("not a result", [])[1])

    def test_bigResultsAreCut(self) -> None:
        text, _, extras = toolset.outcome(secrets=[], result=result(content=[
            {"type": "text", "text": "x" * (toolset.MODEL_TEXT_LIMIT * 2)},
            {"type": "image", "data": "A" * (toolset.MEDIA_LIMIT + 1), "mimeType": "image/png"}]))
        self.assertLess(len(text.encode()), toolset.MODEL_TEXT_LIMIT + 100)
        self.assertIn("too big to show", extras["content"][1]["content"]["text"])

    def test_unknownBlocksAreNamedNotForwarded(self) -> None:
        text, _, extras = toolset.outcome(secrets=[], result=result(content=[{"type": "hologram"}, "junk"]))
        self.assertEqual(text, "[hologram content]")
        self.assertEqual(extras["content"][0]["content"]["text"], "(the tool returned nothing)")


class EventStreamTests(SynchronousTestCase):
    def test_eventsPrimingAndLineEnds(self) -> None:
        got: list[bytes] = []
        stream = EventStream(got.append, 1024)
        stream.makeConnection(StringTransport())
        stream.dataReceived(b"id: 1\ndata: \n\n: comment\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n")
        stream.dataReceived(b"data: {\"b\": 2}")
        stream.dataReceived(b"\n\n")
        self.assertEqual(got, [b'{"a":\n1}', b'{"b": 2}'])


class ConnectionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.transport = StringTransport()
        self.connection = MCPConnection("srv", {"ping": lambda params: {}}, {}, self.clock, maxLength=100)
        self.connection.makeConnection(self.transport)

    def frames(self) -> list[dict[str, Any]]:
        data, _ = self.transport.value(), self.transport.clear()
        return [json.loads(line) for line in data.splitlines()]

    def test_cancelIsNotificationsCancelled(self) -> None:
        d = self.connection.callRemote("tools/call", {"name": "x"})
        d.addErrback(lambda f: None)
        request = self.frames()[0]
        d.cancel()
        self.assertEqual(self.frames(), [{"jsonrpc": "2.0", "method": "notifications/cancelled",
                                          "params": {"requestId": request["id"], "reason": "cancelled by the user"}}])

    def test_pingAnsweredJunkAndLongLinesDropped(self) -> None:
        self.connection.dataReceived(b'{"jsonrpc":"2.0","id":"p","method":"ping"}\n')
        self.assertEqual(self.frames(), [{"jsonrpc": "2.0", "id": "p", "result": {}}])
        self.connection.dataReceived(b"Server starting on port 8080\n" + b"x" * 200 + b"\n")
        self.assertEqual(self.frames(), [])  # nothing said back to a server's stray output

    def test_theServersCancelOfItsRequest(self) -> None:
        from twisted.internet.defer import Deferred

        pending: Deferred[Any] = Deferred()
        connection = MCPConnection("srv", {"slow": lambda params: pending}, {}, self.clock)
        transport = StringTransport()
        connection.makeConnection(transport)
        connection.dataReceived(b'{"jsonrpc":"2.0","id":7,"method":"slow"}\n')
        connection.dataReceived(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}\n')
        self.assertEqual(json.loads(transport.value())["error"]["code"], -32800)


    def test_aServerThatDoesNotReadIsCutOffPastTheBacklog(self) -> None:
        """Answers written while the server's stdin is full count; past ``MAX_BACKLOG``
        the link is told once and nothing more is written. Catching up starts over."""
        overruns: list[int] = []
        self.connection.onOverrun = overruns.append
        ping = b'{"jsonrpc":"2.0","id":"p","method":"ping"}\n'
        answer = len(b'{"jsonrpc":"2.0","id":"p","result":{}}\n')
        self.transport.producer.pauseProducing()  # what a full pipe does
        self.connection.dataReceived(ping * (wire.MAX_BACKLOG // answer - 1))
        self.transport.producer.resumeProducing()
        self.transport.producer.pauseProducing()
        self.connection.dataReceived(ping * (wire.MAX_BACKLOG // answer - 1))
        self.assertEqual(overruns, [])
        self.connection.dataReceived(ping * 2)
        self.assertEqual(len(overruns), 1)
        self.assertGreater(overruns[0], wire.MAX_BACKLOG)
        self.transport.clear()
        self.connection.dataReceived(ping * 10)
        self.connection.callRemote("tools/list", {}).addErrback(lambda f: None)
        self.assertEqual(self.transport.value(), b"")
        self.assertEqual(len(overruns), 1)

    def test_aFloodOfBadNotificationsIsLoggedAFewTimes(self) -> None:
        from twisted.logger import LogLevel, capturedLogs

        with capturedLogs() as events:
            self.connection.dataReceived(b'{"jsonrpc":"2.0","method":"x","params":1}\n' * 1000)
            self.connection.dataReceived(b'{"jsonrpc":"2.0","method":"y","params":{"n":1e999}}\n' * 1000)
        warnings = [e for e in events if e["log_level"] >= LogLevel.warn]
        self.assertEqual(len(warnings), wire.STRAYS_LOGGED)
        self.assertEqual(self.transport.value(), b"")

    def test_ourOwnRequestsDoNotCountAsBacklog(self) -> None:
        overruns: list[int] = []
        self.connection.onOverrun = overruns.append
        self.transport.producer.pauseProducing()
        for _ in range(3):
            self.connection.callRemote("tools/call", {"arguments": {"text": "x" * wire.MAX_BACKLOG}}).addErrback(
                lambda f: None)
        self.assertEqual(overruns, [])


class DecisionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.servers = MCPServers(None, Settings(), None, None, ConfiguredServers(Path("/nonexistent")))
        self.state = SessionState("s", "/tmp")
        self.servers.sessions["s"] = SessionServers([], ("/tmp",), {})

    def route(self, trusted: bool, **hints: Any) -> toolset.Route:
        return toolset.Route("mcp__a__t", "a", "t", {"name": "t", "annotations": hints}, trusted)

    def test_asksUnlessTheUserSaidOrTheServerIsTrusted(self) -> None:
        self.assertEqual(self.servers.decision(self.state, self.route(False, readOnlyHint=True)), ASK)
        self.assertEqual(self.servers.decision(self.state, self.route(True, readOnlyHint=True)), ALLOW)
        self.assertEqual(self.servers.decision(self.state, self.route(True)), ASK)
        self.state.mode = "dont_ask"
        self.assertEqual(self.servers.decision(self.state, self.route(True)), ALLOW)
        self.assertEqual(self.servers.decision(self.state, self.route(False)), ASK)

    def test_alwaysIsRememberedPerServerAndTool(self) -> None:
        route = self.route(False)
        self.servers.remember(self.state, route, REJECT_ALWAYS)
        self.assertEqual(self.servers.decision(self.state, route), DENY)
        self.servers.remember(self.state, route, ALLOW_ALWAYS)
        self.assertEqual(self.servers.decision(self.state, route), ALLOW)
        other = toolset.Route("mcp__a__u", "a", "u", {"name": "u"}, False)
        self.assertEqual(self.servers.decision(self.state, other), ASK)

    def test_kindsFromTrustedAnnotationsOnly(self) -> None:
        self.assertEqual(self.route(False, readOnlyHint=True).kind, "other")
        self.assertEqual(self.route(True, readOnlyHint=True).kind, "read")
        self.assertEqual(self.route(True, readOnlyHint=True, openWorldHint=True).kind, "fetch")
        self.assertEqual(self.route(True, readOnlyHint=False, destructiveHint=True).kind, "delete")


class HostileServerTests(SynchronousTestCase):
    """What a server says is untrusted: names, schemas, results."""

    def test_crowdedNamesStayWithin64(self) -> None:
        long = "t" * 90
        base = f"mcp__srv__{long}"
        digest = toolset.exposedName("srv", long, set())[-8:]
        crowd = {base[: 64 - n - 1] + "_" + digest[:n] for n in (8, 12, 16)} | {toolset.exposedName("srv", long, set())}
        name = toolset.exposedName("srv", long, crowd)
        self.assertLessEqual(len(name), 64)
        self.assertNotIn(name, crowd)

    def test_onlyObjectSchemasAndBoundedLists(self) -> None:
        kept, left = toolset.accepted([{"name": "ok"}, {"name": "bad", "inputSchema": {"type": "string"}},
                                       {"inputSchema": {}}, "junk"])
        self.assertEqual([t["name"] for t in kept], ["ok"])
        self.assertEqual(len(left), 3)
        kept, left = toolset.accepted([{"name": f"t{n}"} for n in range(toolset.MAX_TOOLS + 10)])
        self.assertEqual(len(kept), toolset.MAX_TOOLS)
        self.assertIn("10 more", left[0])

    def test_gatheredPageByPageUntilFull(self) -> None:
        gathered = toolset.Accepted()
        gathered.add([{"name": "a", "description": "x" * (toolset.MAX_TOOL_BYTES // 2)}])
        self.assertFalse(gathered.full)
        gathered.add([{"name": "b", "description": "x" * (toolset.MAX_TOOL_BYTES // 2)}, {"name": "c"}])
        self.assertTrue(gathered.full)
        self.assertEqual([t["name"] for t in gathered.kept], ["a"])
        self.assertEqual(gathered.leftOut(unread=True),
                         ["2 more (and its further pages, not read): over 128 tools or 256 KB of definitions"])

    def test_anArgumentNamedCtx(self) -> None:
        route = toolset.Route("mcp__s__t", "s", "t", {"name": "t"})
        seen: list[Any] = []

        class Context:
            def delegate(self, name: str, arguments: dict[str, Any]) -> Any:
                seen.append((name, arguments))

        toolset.engineTool(route).handler(Context(), ctx=1, other=2)
        self.assertEqual(seen, [("mcp__s__t", {"ctx": 1, "other": 2})])

    def test_oddFieldsNeverBreakTheSchema(self) -> None:
        from .acpschema import checkAgentFrame

        content = toolset.editorContent({"content": [
            {"type": "resource_link", "uri": "file:///a", "name": 5, "size": "12", "title": 5, "mimeType": 7},
            {"type": "resource", "resource": {"uri": "file:///b", "text": "t", "mimeType": 3}},
            {"type": "image", "data": 5, "mimeType": "image/png"},
            {"type": "text", "text": ["not", "text"]},
        ]})
        frame = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
            "sessionUpdate": "tool_call_update", "toolCallId": "t", "content": content}}}
        self.assertEqual(checkAgentFrame(frame, {}), [])
        self.assertEqual(toolset.outcome({"content": 5}, [])[0], "(the tool returned nothing)")

    def test_manyBlocksAreBoundedForTheEditor(self) -> None:
        content = toolset.editorContent({"content": [{"type": "text", "text": "x" * 20_000}] * 200})
        self.assertLess(len(json.dumps(content)), toolset.EDITOR_TEXT_LIMIT * 2)
        self.assertIn("more blocks not shown", content[-1]["content"]["text"])

    def test_theServersSecretsAreTakenOut(self) -> None:
        text, _, extras = toolset.outcome({"content": [{"type": "text", "text": "token is s3cr3t-t0ken!"}]},
                                          ["s3cr3t-t0ken!"])
        self.assertNotIn("s3cr3t", text + json.dumps(extras))
        self.assertNotIn("s3cr3t", toolset.failure("said s3cr3t-t0ken!", ["s3cr3t-t0ken!"])[0])

    def test_eventStreamLineEndsAndBounds(self) -> None:
        got: list[bytes] = []
        stream = EventStream(got.append, 64)
        transport = StringTransport()
        stream.makeConnection(transport)
        stream.dataReceived(b"data: a\r")
        stream.dataReceived(b"\ndata: b\r\r")  # CRLF split across chunks, then a lone CR ends the event
        self.assertEqual(got, [b"a\nb"])
        for _ in range(10):
            stream.dataReceived(b"data: " + b"y" * 20 + b"\n")  # an event that never ends
        self.assertEqual(transport.producerState, "stopped")
        self.assertEqual(got, [b"a\nb"])


class _Requests:
    """A stand-in for ``twisted.web.client.Agent``: each POST waits until the test
    answers it; cancelling one is recorded (as a real Agent closes its connection)."""

    def __init__(self) -> None:
        self.open: list[tuple[dict[str, Any], Any]] = []
        self.cancelled: list[dict[str, Any]] = []

    def request(self, method: bytes, url: bytes, headers: Any, body: Any = None) -> Any:
        from twisted.internet.defer import Deferred

        message = json.loads(body.data) if body is not None else {}
        d: Deferred[Any] = Deferred(lambda _: self.cancelled.append(message))
        self.open.append((message, d))
        return d


class HTTPChannelTests(SynchronousTestCase):
    """The bounds of one HTTP server's POSTs: at most ``maxPosts`` open, a bounded queue,
    answers that time out, close cancelling every one."""

    def setUp(self) -> None:
        from hermes_acp.mcp.http import HTTPChannel

        self.clock = Clock()
        self.connection = MCPConnection("web", {"ping": lambda params: {}}, {}, self.clock)
        self.channel = HTTPChannel(ServerSpec("web", HTTP, url="http://127.0.0.1:9/mcp"), self.clock,
                                   self.connection, 1 << 20, maxPosts=2)
        self.requests = _Requests()
        self.channel._agent = self.requests
        self.connection.makeConnection(self.channel)

    def test_atMostMaxPostsOpenTheRestWaitAndTimeOut(self) -> None:
        from hermes_acp.mcp import http

        self.channel._received(json.dumps([{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in range(5)]).encode())
        self.assertEqual(len(self.requests.open), 2)  # the other three answers wait
        self.clock.advance(http.POST_TIMEOUT)
        self.assertEqual([m["id"] for m in self.requests.cancelled], [0, 1])
        self.assertEqual([m["id"] for m, _ in self.requests.open[2:]], [2, 3])
        self.channel.close()
        self.assertEqual(sorted(m["id"] for m in self.requests.cancelled), [0, 1, 2, 3])
        self.assertEqual(len(self.requests.open), 4)  # the last one waiting was never sent

    def test_batchesAreCut(self) -> None:
        from hermes_acp.mcp import http

        self.channel._received(json.dumps([{"jsonrpc": "2.0", "id": n, "method": "ping"}
                                           for n in range(3000)]).encode())
        self.assertEqual(len(self.channel._waiting), http.MAX_BATCH - 2)

    def test_aRequestWaitingIsCancelledWithoutAWordAndTheQueueIsBounded(self) -> None:
        from hermes_acp.mcp import http

        failures: list[Any] = []
        for _ in range(2):
            self.connection.callRemote("tools/call", {}).addErrback(failures.append)
        waiting = self.connection.callRemote("tools/call", {})
        waiting.addErrback(lambda f: None)
        waiting.cancel()
        self.assertEqual(len(self.requests.open), 2)
        self.assertEqual(list(self.channel._waiting), [])  # taken out; the server never heard of it
        for _ in range(http.MAX_WAITING):
            self.connection.callRemote("tools/call", {}).addErrback(failures.append)
        self.assertEqual(failures, [])
        refused: list[Any] = []
        self.connection.callRemote("tools/call", {}).addErrback(refused.append)
        self.assertIn("waiting; tools/call was not sent", str(refused[0].value))


class LogMessageTests(SynchronousTestCase):
    def test_aServersLogMessagesAreRateLimitedAndTheRestCounted(self) -> None:
        from twisted.logger import capturedLogs

        from hermes_acp.mcp import link

        clock = Clock()
        server = link.ServerLink(ServerSpec("web", HTTP, url="http://127.0.0.1:9/mcp"), clock, Settings(), ("/tmp",),
                                 lambda changed: None)
        note = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hi"}}'
        with capturedLogs() as events:
            for _ in range(1000):
                server.connection.lineReceived(note)
            clock.advance(10)
            server.connection.lineReceived(note)
        said = [e for e in events if "says" in e.get("log_format", "")]
        self.assertEqual(len(said), link.LOG_BURST + 1)
        self.assertEqual(said[-1]["dropped"], f" ({1000 - link.LOG_BURST} earlier messages of it were not logged)")
        self.assertEqual(said[0]["severity"], "info")


class ElicitationTests(SynchronousTestCase):
    """A server's ``elicitation/create`` reaches the running call's asker, only where the
    editor can be asked; the call's idle timer waits for the user's answer."""

    def link(self, elicitation: tuple[str, ...]) -> tuple[Any, Clock, StringTransport]:
        from hermes_acp.mcp import link

        clock, transport = Clock(), StringTransport()
        server = link.ServerLink(ServerSpec("srv", STDIO, command="true", callTimeout=10), clock, Settings(),
                                 ("/tmp",), lambda changed: None, elicitation=elicitation)
        server.connection.makeConnection(transport)
        return server, clock, transport

    def frames(self, transport: StringTransport) -> list[dict[str, Any]]:
        return [json.loads(line) for line in transport.value().splitlines() if line.strip()]

    def test_advertisedOnlyWhereTheEditorAsks(self) -> None:
        self.assertNotIn("elicitation", self.link(())[0].capabilities())
        self.assertEqual(self.link(("form",))[0].capabilities()["elicitation"], {"form": {}})

    def test_theIdleTimerWaitsForTheAnswer(self) -> None:
        from twisted.internet.defer import Deferred

        server, clock, transport = self.link(("form",))
        asked: list[tuple[dict[str, Any], Deferred[Any]]] = []

        def onElicit(params: dict[str, Any]) -> Deferred[Any]:
            asked.append((params, Deferred()))
            return asked[-1][1]

        failures: list[Any] = []
        server.call("t", {}, lambda params: None, onElicit).addErrback(failures.append)
        request = {"jsonrpc": "2.0", "id": "srv-1", "method": "elicitation/create",
                   "params": {"message": "Region?", "requestedSchema": {"type": "object", "properties": {}}}}
        server.connection.lineReceived(json.dumps(request).encode())
        self.assertEqual(asked[0][0]["message"], "Region?")
        clock.advance(30)  # longer than the call's idle timeout: the user is still answering
        self.assertEqual(failures, [])
        asked[0][1].callback({"action": "accept", "content": {"region": "eu"}})
        answer = next(f for f in self.frames(transport) if f.get("id") == "srv-1")
        self.assertEqual(answer["result"], {"action": "accept", "content": {"region": "eu"}})
        clock.advance(10)  # then the timer runs again
        self.assertIn("gave no answer or progress", str(failures[0].value))

    def test_noCallRunningIsADecline(self) -> None:
        server, clock, transport = self.link(("form",))
        request = {"jsonrpc": "2.0", "id": 7, "method": "elicitation/create", "params": {"message": "?"}}
        server.connection.lineReceived(json.dumps(request).encode())
        self.assertEqual(self.frames(transport)[-1]["result"], {"action": "decline"})

    def test_aQuestionOpenWhenTheCallEndsIsWithdrawn(self) -> None:
        """The call ends (here: cancelled) while the user still has the server's question:
        the question is withdrawn, not left open in the editor, and the server hears "cancel"."""
        from twisted.internet.defer import Deferred

        server, clock, transport = self.link(("form",))
        asked: list[Deferred[Any]] = []

        def onElicit(params: dict[str, Any]) -> Deferred[Any]:
            asked.append(Deferred())
            return asked[-1]

        call = server.call("t", {}, lambda params: None, onElicit)
        call.addErrback(lambda failure: None)
        request = {"jsonrpc": "2.0", "id": "srv-1", "method": "elicitation/create",
                   "params": {"message": "Region?", "requestedSchema": {"type": "object", "properties": {}}}}
        server.connection.lineReceived(json.dumps(request).encode())
        call.cancel()
        self.assertTrue(asked[0].called)
        answer = next(f for f in self.frames(transport) if f.get("id") == "srv-1")
        self.assertEqual(answer["result"], {"action": "cancel"})

    def test_oneOpenQuestionPerCall(self) -> None:
        """A server cannot flood the editor with forms: while one of its questions of a call
        is open, another is refused to it (the user sees one at a time)."""
        from twisted.internet.defer import Deferred

        server, clock, transport = self.link(("form",))
        asked: list[Deferred[Any]] = []

        def onElicit(params: dict[str, Any]) -> Deferred[Any]:
            asked.append(Deferred())
            return asked[-1]

        server.call("t", {}, lambda params: None, onElicit).addErrback(lambda failure: None)
        for n in range(1, 4):
            request = {"jsonrpc": "2.0", "id": f"srv-{n}", "method": "elicitation/create",
                       "params": {"message": f"Q{n}?", "requestedSchema": {"type": "object", "properties": {}}}}
            server.connection.lineReceived(json.dumps(request).encode())
        self.assertEqual(len(asked), 1)
        refused = [f for f in self.frames(transport) if f.get("id") in ("srv-2", "srv-3")]
        self.assertEqual([f["error"]["code"] for f in refused], [-32602, -32602])
        asked[0].callback({"action": "decline"})
        request = {"jsonrpc": "2.0", "id": "srv-4", "method": "elicitation/create",
                   "params": {"message": "Q4?", "requestedSchema": {"type": "object", "properties": {}}}}
        server.connection.lineReceived(json.dumps(request).encode())
        self.assertEqual(len(asked), 2)  # answered: the next question goes to the user
