"""MCP resources, prompts and the HTTP+SSE transport, without processes: prompt
arguments, prompt messages, resource pages and reads, the endpoint's origin, named events."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.engine.sse import EventDecoder, EventTooBig
from hermes_acp.mcp import prompts, resources, toolset
from hermes_acp.mcp.sse import endpointURL
from hermes_acp.mcp.wire import TransportError

ARGS = {"name": "args-prompt", "description": "A prompt",
        "arguments": [{"name": "city", "description": "Name of the city", "required": True}, {"name": "state"}]}


def route(definition=ARGS) -> prompts.PromptRoute:
    return prompts.routes("ev", [definition], set())[0]


class PromptTests(SynchronousTestCase):
    def test_commandNameAndEntry(self) -> None:
        entry = route().available()
        self.assertEqual(entry, {"name": "mcp__ev__args-prompt", "description": "[ev MCP prompt] A prompt",
                                 "input": {"hint": "city [state]"}})
        self.assertEqual(prompts.split("/mcp__ev__args-prompt  Paris TX"), ("mcp__ev__args-prompt", "Paris TX"))
        self.assertIsNone(prompts.split("/model x"))

    def test_argumentsByPositionAndName(self) -> None:
        self.assertEqual(prompts.parseArguments(route(), "Paris"), {"city": "Paris"})
        self.assertEqual(prompts.parseArguments(route(), 'state=TX "New York"'), {"state": "TX", "city": "New York"})
        self.assertEqual(prompts.parseArguments(route(), "Paris Ile de France"),
                         {"city": "Paris", "state": "Ile de France"})  # the rest joins the last argument

    def test_missingOrBadArgumentsAreExplained(self) -> None:
        with self.assertRaisesRegex(ValueError, r"needs city \(Name of the city\)\. Usage: `/mcp__ev__args-prompt city \[state\]`"):
            prompts.parseArguments(route(), "state=TX")
        with self.assertRaisesRegex(ValueError, "could not be read"):
            prompts.parseArguments(route(), '"unclosed')
        with self.assertRaisesRegex(ValueError, "takes no arguments"):
            prompts.parseArguments(route({"name": "plain"}), "extra")

    def test_messagesBecomeBoundedBlocks(self) -> None:
        result = {"messages": [
            {"role": "user", "content": {"type": "text", "text": "a" * 50}},
            {"role": "assistant", "content": {"type": "text", "text": "noted"}},
            {"role": "user", "content": {"type": "resource", "resource": {"uri": "x://1", "text": "b" * 5000}}},
        ]}
        found = prompts.blocks(result, route(), 2000)
        self.assertEqual(found[0], {"type": "text", "text": "a" * 50})
        self.assertEqual(found[1]["text"], "[assistant] noted")
        self.assertIn("cut at 2,000 characters", found[2]["text"])
        self.assertLess(sum(len(b["text"]) for b in found), 2200)
        with self.assertRaisesRegex(ValueError, "sent no messages"):
            prompts.blocks({"messages": []}, route(), 100)


class ResourceTests(SynchronousTestCase):
    def test_pageIsBoundedAndNamesTheNextCursor(self) -> None:
        many = [{"uri": f"x://{n}", "name": f"n{n}", "description": "d" * 1000} for n in range(250)]
        shown = resources.page("ev", {"resources": many + [{"no": "uri"}], "nextCursor": "c2"}, "resources")
        self.assertEqual(len(shown["resources"]), resources.MAX_LISTED)
        self.assertEqual(shown["notShown"], 50)
        self.assertEqual(len(shown["resources"][0]["description"]), resources.DESCRIPTION_CUT)
        self.assertEqual(shown["nextCursor"], "c2")
        self.assertIn("error", resources.page("ev", {"resources": "no"}, "resources"))

    def test_readKeepsTheHeadAndDescribesBlobs(self) -> None:
        text = resources.contentText("ev", [{"uri": "x://t", "text": "é" * 3000},
                                            {"uri": "x://b", "mimeType": "image/png", "blob": "AAAA" * 10}], 1024)
        self.assertIn("6,000 bytes in all, the first 1,024 shown", text)
        self.assertIn("[resource x://b: image/png, 30 bytes of binary data; not shown to the model, shown to the user]",
                      text)
        self.assertNotIn("AAAA", text)

    def test_resultsSayHowToReadWhatTheyName(self) -> None:
        line = toolset.modelLine({"type": "resource_link", "uri": "x://1", "name": "one"}, "ev")
        self.assertEqual(line, '[resource link: one <x://1>; read it with read_mcp_resource(server="ev", uri="x://1")]')
        self.assertNotIn("read_mcp_resource", toolset.modelLine({"type": "resource_link", "uri": "x://1"}))


class EndpointTests(SynchronousTestCase):
    def test_sameOriginOnly(self) -> None:
        base = "http://127.0.0.1:8000/sse"
        self.assertEqual(endpointURL(base, "/messages/?session_id=a"), "http://127.0.0.1:8000/messages/?session_id=a")
        self.assertEqual(endpointURL(base, "http://127.0.0.1:8000/m"), "http://127.0.0.1:8000/m")
        self.assertEqual(endpointURL("https://h/sse", "https://H:443/m"), "https://H:443/m")
        for bad in ("http://127.0.0.1:8001/m", "https://127.0.0.1:8000/m", "//evil.example/m", "", "a b"):
            with self.assertRaises(TransportError, msg=bad):
                endpointURL(base, bad)


class NamedEventTests(SynchronousTestCase):
    def test_namesComeWithTheData(self) -> None:
        decoder = EventDecoder(1024, named=True)
        events = decoder.feed(b"event: endpoint\ndata: /m\n\ndata: {}\n\nevent: message\r\ndata: x")
        self.assertEqual(events, [(b"endpoint", b"/m"), (b"message", b"{}")])
        self.assertEqual(decoder.end(), (b"message", b"x"))
        self.assertEqual(EventDecoder(1024).feed(b"event: endpoint\ndata: /m\n\n"), [b"/m"])
        with self.assertRaises(EventTooBig):
            EventDecoder(16, named=True).feed(b"data: " + b"x" * 40 + b"\n")


class SSESpecTests(SynchronousTestCase):
    def test_sseFromTheEditorAndFromConfig(self) -> None:
        from pathlib import Path
        from tempfile import TemporaryDirectory

        from hermes_acp.jsonrpc import InvalidParams
        from hermes_acp.mcp.specs import SSE, fromRequest, parseConfig

        spec, = fromRequest([{"type": "sse", "name": "old", "url": "https://x/sse",
                              "headers": [{"name": "Authorization", "value": "Bearer t0k3n-value"}]}])
        self.assertEqual((spec.transport, spec.url, spec.headers), (SSE, "https://x/sse", (("Authorization", "Bearer t0k3n-value"),)))
        with self.assertRaisesRegex(InvalidParams, r"mcpServers\[0\]\.url must be an http"):
            fromRequest([{"type": "sse", "name": "old", "url": "ftp://x"}])
        with TemporaryDirectory() as folder:
            path = Path(folder) / "config.yaml"
            path.write_text("mcp_servers:\n  old: {url: 'http://h/sse', transport: sse}\n"
                            "  bad: {url: 'http://h/x', transport: websocket}\n")
            specs, problems = parseConfig(path)
        self.assertEqual([(s.name, s.transport) for s in specs], [("old", SSE)])
        self.assertIn("transport must be http", problems[0])
