"""The renderer: agent tool events → ACP ``session/update`` payloads, checked
against the official schema."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.render import (
    CONTENT_LIMIT,
    RAW_OUTPUT_LIMIT,
    TITLE_LIMIT,
    Renderer,
    fenced,
    planEntries,
    truncateMiddle,
)

from .acpschema import problems, unknownKeys

CWD = "/work/proj"
OMITTED = re.compile(r"\n… (\d+) bytes omitted …\n")


class SchemaMixin:
    """Every payload the renderer makes must be one the official schema accepts."""

    def assertValid(self, instance: dict[str, Any], typeName: str = "SessionUpdate") -> None:
        self.assertEqual(problems(instance, typeName), [])  # type: ignore[attr-defined]
        self.assertEqual(unknownKeys(instance), [])  # type: ignore[attr-defined]


def texts(update: dict[str, Any]) -> list[str]:
    return [c["content"]["text"] for c in update.get("content", []) if c["type"] == "content"]


class TitleAndKindTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.r = Renderer(CWD)

    def test_kinds(self) -> None:
        """Each built-in tool has its ACP kind; anything else is "other"."""
        expected = [("read", ["read_file"]), ("edit", ["write_file", "patch"]), ("search", ["search_files", "session_search"]),
                    ("execute", ["terminal"]), ("think", ["todo"]), ("other", ["mcp_thing", "browser_click"])]
        for kind, name in [(kind, name) for kind, names in expected for name in names]:
            self.assertEqual(self.r.toolStarted("c", name, {})["kind"], kind, name)
            self.assertEqual(self.r.permissionToolCall("c", name, {}, {"command": "x"})["kind"], kind, name)

    def test_titles(self) -> None:
        """Titles say what happens, with paths relative to the session's folder."""
        cases = [
            ("read_file", {"path": "src/app.py", "offset": 10, "limit": 31}, "Read src/app.py:10-40"),
            ("read_file", {"path": "src/app.py"}, "Read src/app.py"),
            ("read_file", {"path": "src/app.py", "offset": 1, "limit": 500}, "Read src/app.py"),
            ("read_file", {"path": "src/app.py", "offset": 20}, "Read src/app.py from line 20"),
            ("read_file", {"path": "src/app.py", "limit": 40}, "Read src/app.py:1-40"),
            ("read_file", {"path": f"{CWD}/src/./app.py"}, "Read src/app.py"),
            ("read_file", {"path": "/etc/hosts"}, "Read /etc/hosts"),
            ("read_file", {"path": "../other/x.py"}, "Read /work/other/x.py"),
            ("write_file", {"path": "a.py", "content": "x"}, "Write a.py"),
            ("patch", {"path": "a.py", "old_string": "x", "new_string": "y"}, "Edit a.py"),
            ("patch", {"path": "a.py", "replace_all": True}, "Edit a.py (all occurrences)"),
            ("terminal", {"command": "pytest -q"}, "Run pytest -q"),
            ("terminal", {"command": "npm run dev", "background": True}, "Run in the background: npm run dev"),
            ("terminal", {"command": "  cd src\nmake all\n"}, "Run cd src…"),
            ("search_files", {"pattern": "TODO", "path": "src"}, "Search for 'TODO' in src"),
            ("search_files", {"pattern": "*.py", "target": "files"}, "Search files named '*.py' in ."),
            ("search_files", {"pattern": "x", "file_glob": "*.md"}, "Search for 'x' in . (*.md)"),
            ("todo", {"todos": [{}, {}]}, "Update plan (2 items)"),
            ("todo", {"todos": [{}]}, "Update plan (1 item)"),
            ("todo", {}, "Update plan (0 items)"),
            ("session_search", {"query": "flaky test"}, 'Search past sessions: "flaky test"'),
            ("session_search", {"query": "flaky test", "all_projects": False}, 'Search past sessions: "flaky test"'),
            ("session_search", {"query": "flaky test", "all_projects": True},
             'Search past sessions in all projects: "flaky test"'),
            ("browser_click", {"selector": "#go"}, "browser_click"),
            ("process", {"action": "list"}, "List background processes"),
            ("process", {"action": "poll", "session_id": 2}, "Background process #2: poll"),
            ("process", {"action": "kill", "session_id": "proc_0123456789ab"}, "Background process proc_0123456789ab: kill"),
        ]
        for name, args, title in cases:
            self.assertEqual(self.r.title(name, args), title, (name, args))
            self.assertEqual(self.r.toolStarted("c", name, args)["title"], title)

    def test_longTitleCut(self) -> None:
        """A long command is cut to TITLE_LIMIT characters, ending with an ellipsis."""
        title = self.r.title("terminal", {"command": "echo " + "x" * 500})
        self.assertEqual(len(title), len("Run ") + TITLE_LIMIT)
        self.assertTrue(title.endswith("x…"))

    def test_locations(self) -> None:
        """Locations are absolute and carry a line where one is known."""
        r = self.r
        self.assertEqual(r.locations("read_file", {"path": "src/a.py", "offset": 10}, {}), [{"path": f"{CWD}/src/a.py", "line": 10}])
        self.assertEqual(r.locations("read_file", {"path": "src/a.py"}, {}), [{"path": f"{CWD}/src/a.py"}])
        self.assertEqual(r.locations("write_file", {"path": "a.py", "offset": 3}, {}), [{"path": f"{CWD}/a.py"}])
        self.assertEqual(r.locations("patch", {"path": "a.py"}, {"path": "/elsewhere/b.py", "line": 7}), [{"path": "/elsewhere/b.py", "line": 7}])
        self.assertEqual(r.locations("read_file", {"path": "a.py", "offset": 0}, {}), [{"path": f"{CWD}/a.py"}])
        self.assertEqual(r.locations("search_files", {"pattern": "x"}, {}), [])
        self.assertEqual(r.locations("terminal", {"command": "ls", "path": "x"}, {"path": "/x"}), [])
        self.assertEqual(r.locations("todo", {"path": "x"}, {}), [])


class StartedTests(SchemaMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.r = Renderer(CWD)

    def test_readStarted(self) -> None:
        """A read starts pending with its input, an absolute location and no content."""
        args = {"path": "src/app.py", "offset": 10, "limit": 31}
        update = self.r.toolStarted("call-1", "read_file", args, {"path": f"{CWD}/src/app.py"})
        self.assertEqual(
            update,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "call-1",
                "name": "read_file",
                "title": "Read src/app.py:10-40",
                "kind": "read",
                "status": "pending",
                "rawInput": args,
                "locations": [{"path": f"{CWD}/src/app.py", "line": 10}],
            },
        )
        self.assertValid(update)

    def test_terminalStartedShowsTheCommand(self) -> None:
        """A command starts with the exact command in an sh fence, longer than any backticks in it."""
        update = self.r.toolStarted("c", "terminal", {"command": "pytest -q"})
        self.assertEqual(texts(update), ["```sh\npytest -q\n```"])
        self.assertEqual(update["locations"], [])
        self.assertValid(update)
        tricky = self.r.toolStarted("c", "terminal", {"command": "echo '```' `date`"})
        self.assertEqual(texts(tricky), ["````sh\necho '```' `date`\n````"])
        self.assertValid(tricky)

    def test_everyToolStartValidates(self) -> None:
        """Starts for all tools, with odd arguments too, are valid ToolCalls."""
        for name, args in [
            ("write_file", {"path": "a.py", "content": "x"}),
            ("patch", {"path": "a.py"}),
            ("search_files", {"pattern": "x"}),
            ("todo", {"todos": []}),
            ("session_search", {"query": "q"}),
            ("mystery", {"arguments": "not json"}),
        ]:
            self.assertValid(self.r.toolStarted("c", name, args))


class FinishedTests(SchemaMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.r = Renderer(CWD)

    def test_newFileDiff(self) -> None:
        """A created file finishes with a diff (absolute path, oldText None) and the summary line."""
        extras = {"path": f"{CWD}/a.py", "oldText": None, "newText": "print(1)\n"}
        update = self.r.toolFinished("c", "write_file", {"path": "a.py", "content": "print(1)\n"}, "Created a.py (1 lines, 9 bytes).", False, extras)
        self.assertEqual(update["status"], "completed")
        self.assertEqual(update["content"][0], {"type": "diff", "path": f"{CWD}/a.py", "oldText": None, "newText": "print(1)\n"})
        self.assertEqual(texts(update), ["```\nCreated a.py (1 lines, 9 bytes).\n```"])
        self.assertEqual(update["locations"], [{"path": f"{CWD}/a.py"}])
        self.assertValid(update)

    def test_patchDiffKeepsOnlyTheSummaryLine(self) -> None:
        """An edit shows the whole-file diff; the unified diff text stays in rawOutput only."""
        extras = {"path": "a.py", "oldText": "x = 1\n", "newText": "x = 2\n"}
        result = "Patched a.py (1 replacement(s)).\n--- a/a.py\n+++ b/a.py\n-x = 1\n+x = 2"
        update = self.r.toolFinished("c", "patch", {"path": "a.py"}, result, False, extras)
        self.assertEqual(update["content"][0], {"type": "diff", "path": f"{CWD}/a.py", "oldText": "x = 1\n", "newText": "x = 2\n"})
        self.assertEqual(texts(update), ["```\nPatched a.py (1 replacement(s)).\n```"])
        self.assertEqual(update["rawOutput"], {"output": result})
        self.assertValid(update)

    def test_failedEditHasNoDiff(self) -> None:
        """A denied or failed edit shows the error, never a diff."""
        update = self.r.toolFinished("c", "write_file", {"path": "a.py"}, "Error: denied", True, {"path": "a.py", "newText": "x"})
        self.assertEqual(update["status"], "failed")
        self.assertEqual([c["type"] for c in update["content"]], ["content"])
        self.assertEqual(texts(update), ["```\nError: denied\n```"])
        self.assertValid(update)

    def test_terminalOutputFencedWithExitCode(self) -> None:
        """Command output is fenced (so Markdown in it stays text), then the exit code;
        with a client terminal id the terminal is embedded too."""
        extras = {"command": "make", "exitCode": 2, "output": "| a | b |\n# not a heading\n", "terminalId": "term-7"}
        update = self.r.toolFinished("c", "terminal", {"command": "make"}, '{"output": "...", "exit_code": 2}', False, extras)
        self.assertEqual(update["content"][0], {"type": "terminal", "terminalId": "term-7"})
        self.assertEqual(texts(update), ["```\n| a | b |\n# not a heading\n```\nexit code 2"])
        self.assertNotIn("locations", update)
        self.assertValid(update)

    def test_terminalWithoutClientTerminal(self) -> None:
        """Local commands have no terminal content; empty output says so."""
        update = self.r.toolFinished("c", "terminal", {"command": "true"}, "{}", False, {"exitCode": 0, "output": ""})
        self.assertEqual([c["type"] for c in update["content"]], ["content"])
        self.assertEqual(texts(update), ["(no output)\nexit code 0"])
        self.assertValid(update)

    def test_terminalEndStatus(self) -> None:
        """A signal or a missing code is said in words, never "exit code None"."""
        signalled = self.r.toolFinished("c", "terminal", {}, "{}", False, {"exitCode": None, "signal": "SIGKILL", "output": "x"})
        self.assertEqual(texts(signalled), ["```\nx\n```\nended by signal SIGKILL"])
        unknown = self.r.toolFinished("c", "terminal", {}, "{}", False, {"exitCode": None, "output": "x"})
        self.assertEqual(texts(unknown), ["```\nx\n```\nexit status unknown"])

    def test_timedOutCommandShowsOutputAndError(self) -> None:
        """A timed-out command shows its output as text (not a JSON string) and why it failed."""
        report = json.dumps({"output": "line 1\nline 2\n", "exit_code": None, "error": "timed out after 5 s; killed"})
        extras = {"exitCode": None, "output": "line 1\nline 2\n", "terminalId": "t1"}
        update = self.r.toolFinished("c", "terminal", {"command": "sleep 9"}, report, True, extras)
        self.assertEqual(update["status"], "failed")
        self.assertEqual(texts(update), ["```\nline 1\nline 2\n```\ntimed out after 5 s; killed"])
        self.assertValid(update)
        interrupted = self.r.toolFinished(
            "c", "terminal", {}, "Error: the command was interrupted by the user; output so far:\nabc", True, {"output": "abc"}
        )
        self.assertEqual(texts(interrupted), ["```\nabc\n```\nError: the command was interrupted by the user; output so far"])

    def test_deniedCommandShowsTheReason(self) -> None:
        """A command the guard refused (no output) shows the error text."""
        update = self.r.toolFinished("c", "terminal", {"command": "rm -rf /"}, "Error: denied by the user", True, {"denied": True})
        self.assertEqual(texts(update), ["```\nError: denied by the user\n```"])
        self.assertValid(update)

    def test_largeOutputIsCut(self) -> None:
        """Big output keeps its head and tail, says how many bytes were left out, and stays
        within the limits (content CONTENT_LIMIT, rawOutput RAW_OUTPUT_LIMIT)."""
        output = "\n".join(f"line {i}" for i in range(30_000))
        update = self.r.toolFinished("c", "terminal", {}, output, False, {"exitCode": 0, "output": output})
        [shown] = texts(update)
        body = shown.removeprefix("```\n").removesuffix("\n```\nexit code 0")
        self.assertLessEqual(len(body.encode()), CONTENT_LIMIT)
        omitted = int(OMITTED.search(body).group(1))
        head, tail = OMITTED.split(body)[::2]
        self.assertTrue(output.startswith(head) and output.endswith(tail))
        self.assertEqual(len(head.encode()) + omitted + len(tail.encode()), len(output.encode()))
        raw = update["rawOutput"]["output"]
        self.assertLessEqual(len(raw.encode()), RAW_OUTPUT_LIMIT)
        self.assertGreater(len(raw.encode()), CONTENT_LIMIT)
        self.assertRegex(raw, OMITTED)
        self.assertValid(update)

    def test_readResultFencedAgainstBackticks(self) -> None:
        """A file holding ``` runs is shown in a longer fence."""
        text = "1|```python\n2|x = 1\n3|````\n"
        update = self.r.toolFinished("c", "read_file", {"path": "README.md"}, text, False, {"path": f"{CWD}/README.md", "startLine": 1})
        self.assertEqual(texts(update), ["`````\n1|```python\n2|x = 1\n3|````\n`````"])
        self.assertEqual(update["locations"], [{"path": f"{CWD}/README.md"}])
        self.assertValid(update)

    def test_nonTextResult(self) -> None:
        """A structured result is shown as JSON."""
        update = self.r.toolFinished("c", "mystery", {}, {"ok": True, "n": "é"}, False)
        self.assertEqual(texts(update), ['```\n{"ok": true, "n": "é"}\n```'])
        self.assertEqual(update["rawOutput"], {"output": '{"ok": true, "n": "é"}'})
        self.assertValid(update)

    def test_todoFinishedHasNoText(self) -> None:
        """The plan update shows a todo's result; the tool call itself has no text."""
        update = self.r.toolFinished("c", "todo", {"todos": []}, '{"todos": []}', False, {"todos": []})
        self.assertEqual(update["content"], [])
        self.assertValid(update)
        failed = self.r.toolFinished("c", "todo", {}, "Error: bad", True)
        self.assertEqual(texts(failed), ["```\nError: bad\n```"])


class PermissionTests(SchemaMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.r = Renderer(CWD)

    def test_editShowsTheDiff(self) -> None:
        """An edit's permission request shows the diff of the whole file at its absolute path."""
        call = self.r.permissionToolCall("c9", "patch", {"path": "src/a.py"}, {"path": f"{CWD}/src/a.py", "oldText": "a\n", "newText": "b\n"})
        self.assertEqual(
            call,
            {
                "toolCallId": "c9",
                "title": "Edit src/a.py",
                "kind": "edit",
                "status": "pending",
                "rawInput": {"path": "src/a.py"},
                "content": [{"type": "diff", "path": f"{CWD}/src/a.py", "oldText": "a\n", "newText": "b\n"}],
                "locations": [{"path": f"{CWD}/src/a.py"}],
            },
        )
        self.assertValid(call, "ToolCallUpdate")

    def test_newFileDiff(self) -> None:
        """Creating a file: oldText is None (relative paths become absolute)."""
        call = self.r.permissionToolCall("c", "write_file", {"path": "n.py"}, {"path": "n.py", "oldText": None, "newText": "x"})
        self.assertEqual(call["content"], [{"type": "diff", "path": f"{CWD}/n.py", "oldText": None, "newText": "x"}])
        self.assertValid(call, "ToolCallUpdate")

    def test_commandShowsExactCommandAndReason(self) -> None:
        """A command's request shows why it needs approval and the exact command."""
        command = "git push --force origin main && echo '```'"
        call = self.r.permissionToolCall("c", "terminal", {"command": command}, {"command": command, "reason": "force push"})
        self.assertEqual(call["title"], f"Run {command}")
        self.assertEqual(call["kind"], "execute")
        self.assertEqual(texts(call), [f"force push\n````sh\n{command}\n````"])
        self.assertNotIn("locations", call)
        self.assertValid(call, "ToolCallUpdate")
        default = self.r.permissionToolCall("c", "terminal", {"command": "ls"}, {"command": "ls"})
        self.assertEqual(texts(default), ["This command needs approval\n```sh\nls\n```"])


class WebTests(SchemaMixin, SynchronousTestCase):
    """``web_search`` and ``web_extract``: their kinds, titles, and a fetch's permission card (the URL, no location)."""

    def setUp(self) -> None:
        self.r = Renderer(CWD)

    def test_kindsAndTitles(self) -> None:
        search = self.r.toolStarted("c", "web_search", {"query": "twisted reactor"})
        self.assertEqual((search["kind"], search["title"], search["locations"]),
                         ("search", 'Search the web: "twisted reactor"', []))
        one = self.r.toolStarted("c", "web_extract", {"urls": ["https://example.org/a"]})
        self.assertEqual((one["kind"], one["title"]), ("fetch", "Fetch https://example.org/a"))
        self.assertEqual(self.r.title("web_extract", {"urls": ["https://a.example/", "https://b.example/"]}),
                         "Fetch 2 pages")
        self.assertEqual(self.r.title("web_extract", {"urls": "not a list"}), "Fetch 0 pages")
        self.assertValid(search)
        self.assertValid(one)

    def test_aFetchQuestionShowsTheURL(self) -> None:
        call = self.r.permissionToolCall("c", "web_extract", {"urls": ["https://example.org/a"]},
                                         {"path": "https://example.org/a", "reason": "fetches a web page from example.org"})
        self.assertEqual(call["kind"], "fetch")
        self.assertNotIn("locations", call)
        self.assertEqual(texts(call), ["This fetches a web page from example.org:\n```\nhttps://example.org/a\n```"])
        self.assertValid(call, "ToolCallUpdate")


class PlanTests(SchemaMixin, SynchronousTestCase):
    def test_entries(self) -> None:
        """Statuses map to the plan's; cancelled shows completed with a "[cancelled] " prefix."""
        todos = [
            {"id": "1", "content": "Write tests", "status": "completed"},
            {"id": "2", "content": "Fix bug", "status": "in_progress"},
            {"id": "3", "content": "Ship", "status": "pending"},
            {"id": "4", "content": "Rewrite in Rust", "status": "cancelled"},
            {"id": "5", "content": "Odd", "status": "blocked"},
            {"id": "6", "content": "No status"},
        ]
        entries = planEntries(todos)
        self.assertEqual(
            entries,
            [
                {"content": "Write tests", "priority": "medium", "status": "completed"},
                {"content": "Fix bug", "priority": "medium", "status": "in_progress"},
                {"content": "Ship", "priority": "medium", "status": "pending"},
                {"content": "[cancelled] Rewrite in Rust", "priority": "medium", "status": "completed"},
                {"content": "Odd", "priority": "medium", "status": "pending"},
                {"content": "No status", "priority": "medium", "status": "pending"},
            ],
        )
        self.assertValid({"sessionUpdate": "plan", "entries": entries})
        self.assertEqual(planEntries([]), [])
        self.assertValid({"sessionUpdate": "plan", "entries": []})


class TruncateAndFenceTests(SynchronousTestCase):
    def test_shortTextUntouched(self) -> None:
        """Text within the limit comes back as it was."""
        self.assertEqual(truncateMiddle("é" * 50, 100), "é" * 50)
        self.assertEqual(truncateMiddle("", 0), "")

    def test_cutsOnCharacterBoundaries(self) -> None:
        """Multi-byte characters are never split; the count of omitted bytes is exact."""
        for text in ("é" * 10_000, "😀" * 5_000, "a" + "€" * 7_000, "x" * 10_000):
            for limit in (64, 100, 1001, 4096):
                cut = truncateMiddle(text, limit)
                self.assertNotIn("\ufffd", cut)
                self.assertLessEqual(len(cut.encode()), limit)
                head, tail = OMITTED.split(cut)[::2]
                omitted = int(OMITTED.search(cut).group(1))
                self.assertTrue(text.startswith(head) and text.endswith(tail))
                self.assertEqual(len(head.encode()) + omitted + len(tail.encode()), len(text.encode()))

    @settings(max_examples=200, deadline=None)
    @given(st.text(min_size=0, max_size=3000), st.integers(min_value=64, max_value=4000))
    def test_truncateProperty(self, text: str, limit: int) -> None:
        """For any text and limit: within the limit, head and tail are the text's own, nothing lost unaccounted."""
        cut = truncateMiddle(text, limit)
        self.assertLessEqual(len(cut.encode()), limit)
        if cut != text:
            head, tail = OMITTED.split(cut)[::2]
            omitted = int(OMITTED.search(cut).group(1))
            self.assertTrue(text.startswith(head) and text.endswith(tail))
            self.assertEqual(len(head.encode()) + omitted + len(tail.encode()), len(text.encode()))

    def test_fences(self) -> None:
        """The fence is longer than the longest backtick run, at least three."""
        self.assertEqual(fenced("plain\n\n"), "```\nplain\n```")
        self.assertEqual(fenced("a `b` c", "sh"), "```sh\na `b` c\n```")
        self.assertEqual(fenced("```\ncode\n```"), "````\n```\ncode\n```\n````")
        self.assertEqual(fenced("x ````` y"), "``````\nx ````` y\n``````")
