"""Agent events → ACP ``session/update`` payloads (``IRenderer``). Pure: no I/O.

Titles say what happens (``Read src/app.py:10-40``, ``Run pytest -q``), paths are
absolute, edits carry ``diff`` content, command output is fenced so it is not
read as Markdown, and large outputs are cut with a note of what was omitted.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import attrs
from zope.interface import implementer

from .interfaces import IRenderer

KINDS = {
    "read_file": "read",
    "write_file": "edit",
    "patch": "edit",
    "search_files": "search",
    "session_search": "search",
    "terminal": "execute",
    "todo": "think",
    "clarify": "think",
    "web_search": "search",
    "web_extract": "fetch",
    "process": "execute",
    "memory": "edit",
    "vision_analyze": "read",
    "skills_list": "read",
    "skill_view": "read",
    "skill_manage": "edit",
    "delegate_task": "think",
}
#: Cap on text shown in a tool call's content and on rawOutput.
CONTENT_LIMIT = 16 * 1024
RAW_OUTPUT_LIMIT = 64 * 1024
TITLE_LIMIT = 120
#: Cap on the line saying how a command ended.
STATUS_LIMIT = 500


def _skillTitle(name: str, args: dict[str, Any]) -> str:
    skill = _oneLine(str(args.get("name", "")), 60)
    if name == "skills_list":
        return "List skills" + (f" in {_oneLine(str(args['category']), 40)}" if args.get("category") else "")
    if name == "skill_view":
        return f"Read skill {skill}" + (f": {_oneLine(str(args['file_path']), 60)}" if args.get("file_path") else "")
    action = str(args.get("action", "change")).replace("_", " ")
    what = f" {_oneLine(str(args['file_path']), 60)}" if args.get("file_path") else ""
    return f"Skill {skill}: {action}{what}"


def truncateMiddle(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` within ``limit`` bytes (UTF-8). A lone surrogate (a
    file name that is not UTF-8) counts as its 3 bytes; the frame's writer repairs it."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    keep = max(limit - 64, 0)
    head = data[: keep * 2 // 5].decode("utf-8", "ignore")
    tail = data[len(data) - (keep - keep * 2 // 5) :].decode("utf-8", "ignore")
    omitted = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return f"{head}\n… {omitted} bytes omitted …\n{tail}"


def fenced(text: str, language: str = "") -> str:
    """A code fence longer than any backtick run inside ``text``."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip(chr(10))}\n{fence}"


def _oneLine(text: str, limit: int = TITLE_LIMIT) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    more = first != text.strip()
    if len(first) > limit:
        first, more = first[: limit - 1], True
    return first + ("…" if more else "")


def _questionAndAnswer(extras: dict[str, Any]) -> str:
    """A ``clarify`` card: the question and what became of it (kept for the replay)."""
    answers = {"accepted": f"**Answer:** {extras.get('answer', '')}", "declined": "_The user declined to answer._",
               "cancelled": "_The user dismissed the question._",
               "deferred": "_Asked in the conversation: the next prompt answers it._"}
    said = answers.get(str(extras.get("action")), f"_No answer: {extras.get('answer') or 'nobody answered'}._")
    return f"**Question:** {extras['question']}\n\n{said}"


def _delegated(results: list[Any]) -> str:
    """A ``delegate_task`` card at its end: each child's status and summary (or why it failed)."""
    parts = []
    for result in results:
        if isinstance(result, dict):
            said = str(result.get("summary") or result.get("error") or "")
            parts.append(f"**Subagent {int(result.get('task_index', 0)) + 1}** ({result.get('status')}): "
                         f"{truncateMiddle(said, CONTENT_LIMIT // max(1, len(results)))}")
    return "\n\n".join(parts)


def _commandStatus(text: str, failed: bool, extras: dict[str, Any]) -> str:
    """How a command ended: its exit code, the signal that ended it, or the error."""
    if failed:
        try:
            report = json.loads(text)
        except ValueError:
            report = None
        error = report.get("error") if isinstance(report, dict) else None
        first = str(error or text).strip().split("\n", 1)[0]
        return first.removesuffix(":")[:STATUS_LIMIT]
    if extras.get("exitCode") is not None:
        return f"exit code {extras['exitCode']}"
    if extras.get("signal"):
        return f"ended by signal {extras['signal']}"
    return "exit status unknown"


def _isWebURL(value: Any) -> bool:
    """Whether a tool's "path" is an http(s) URL (``vision_analyze``'s ``image_url``), shown as it is."""
    return isinstance(value, str) and value.lower().startswith(("http://", "https://"))


def shownOutput(body: str, empty: str = "(no output)") -> str:
    """A command's output as a card shows it: fenced, the middle cut past ``CONTENT_LIMIT``."""
    return fenced(truncateMiddle(body, CONTENT_LIMIT)) if body.strip() else empty


def imagePreview(images: list[Any]) -> list[dict[str, Any]]:
    """A read image's card: the image itself where it is small enough to preview (the journal
    keeps what the card shows), and a line saying what it is."""
    content = []
    for image in images:
        if not (isinstance(image, dict) and isinstance(image.get("data"), str) and isinstance(image.get("mimeType"), str)):
            continue
        if image.get("preview") is True:
            content.append({"type": "content", "content": {"type": "image", "data": image["data"],
                                                           "mimeType": image["mimeType"]}})
        size = f"{image.get('width')}×{image.get('height')} pixels, {image.get('bytes')} bytes"
        shown = "" if image.get("preview") is True else "; too big to preview here"
        content.append(textContent(f"{image['mimeType']}, {size}{shown}"))
    return content


def textContent(text: str) -> dict[str, Any]:
    return {"type": "content", "content": {"type": "text", "text": text}}


def planEntries(todos: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The ``todo`` list as ACP plan entries (cancelled items are shown completed)."""
    entries = []
    for item in todos:
        status = item.get("status", "pending")
        content = str(item.get("content", ""))
        if status == "cancelled":
            status, content = "completed", f"[cancelled] {content}"
        if status not in ("pending", "in_progress", "completed"):
            status = "pending"
        entries.append({"content": content, "priority": "medium", "status": status})
    return entries


#: A plan's steps as the editor's plan shows them: its list items (numbered, bulleted or
#: checkboxes) of the outermost level, not those nested under them; at most this many,
#: this long each.
_STEP = re.compile(r"^( *)(?:[-*+]|\d{1,3}[.)])\s+(?:\[[ xX]\]\s+)?(\S.*)$")
MAX_PLAN_STEPS, MAX_STEP_CHARS = 50, 500


def planSteps(plan: str) -> list[dict[str, str]]:
    """The plan of plan mode (Markdown) as ACP plan entries, all pending: one per step,
    or the whole plan as one entry when it has no list."""
    items = [(len(m.group(1)), m.group(2).strip()) for m in map(_STEP.match, plan.splitlines()) if m]
    outer = min((indent for indent, _ in items), default=0)
    steps = [step for indent, step in items if indent == outer]
    if len(steps) > MAX_PLAN_STEPS:
        steps = steps[:MAX_PLAN_STEPS - 1] + [f"… and {len(steps) - MAX_PLAN_STEPS + 1} more steps"]
    steps = steps or [plan.strip()]
    return [{"content": truncateMiddle(step, MAX_STEP_CHARS), "priority": "medium", "status": "pending"}
            for step in steps]


@implementer(IRenderer)
@attrs.frozen
class Renderer:
    """Renders one session's tool calls; ``cwd`` makes titles short and paths absolute."""

    cwd: str

    def absolute(self, path: Any) -> str:
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(str(path or "."))))

    def shown(self, path: Any) -> str:
        absolute = self.absolute(path)
        relative = os.path.relpath(absolute, self.cwd)
        return absolute if relative.startswith("..") else relative

    def title(self, name: str, args: dict[str, Any]) -> str:
        path = self.shown(args.get("path"))
        if name == "read_file":
            offset, limit = args.get("offset"), args.get("limit")
            if offset is None and isinstance(limit, int):
                offset = 1  # the tool's default first line
            if isinstance(offset, int) and isinstance(limit, int) and (offset, limit) != (1, 500):
                return f"Read {path}:{offset}-{offset + limit - 1}"
            if isinstance(offset, int) and offset > 1:
                return f"Read {path} from line {offset}"
            return f"Read {path}"
        if name == "write_file":
            return f"Write {path}"
        if name == "patch":
            return f"Edit {path}" + (" (all occurrences)" if args.get("replace_all") else "")
        if name == "search_files":
            what = "files named" if args.get("target") == "files" else "for"
            glob = f" ({args['file_glob']})" if args.get("file_glob") else ""
            return f"Search {what} {_oneLine(str(args.get('pattern', '')), 60)!r} in {path}{glob}"
        if name == "terminal":
            outside = " outside the sandbox" if args.get("outside_sandbox") is True else ""
            background = " in the background:" if args.get("background") is True else ""
            return f"Run{outside}{background} {_oneLine(str(args.get('command', '')))}"
        if name == "todo":
            count = len(args.get("todos") or [])
            return f"Update plan ({count} item{'s' if count != 1 else ''})"
        if name == "web_search":
            return f'Search the web: "{_oneLine(str(args.get("query", "")), 60)}"'
        if name == "web_extract":
            urls = [str(url) for url in args.get("urls") or []] if isinstance(args.get("urls"), list) else []
            return f"Fetch {_oneLine(urls[0])}" if len(urls) == 1 else f"Fetch {len(urls)} pages"
        if name == "process":
            target = args.get("session_id")
            if args.get("action") == "list" or target is None:
                return "List background processes"
            which = f"#{target}" if str(target).isdigit() else _oneLine(str(target), 40)
            return f"Background process {which}: {_oneLine(str(args.get('action', '')), 20)}"
        if name == "vision_analyze":
            source = str(args.get("image_url", ""))
            if source.startswith("data:"):
                return "Analyze image (data URL)"
            return f"Analyze image {_oneLine(source) if _isWebURL(source) else self.shown(source)}"
        if name in ("skills_list", "skill_view", "skill_manage"):
            return _skillTitle(name, args)
        if name == "delegate_task":
            tasks = args.get("tasks")
            count = len(tasks) if isinstance(tasks, list) and tasks else 1
            return f"Delegate {count} task{'s' if count != 1 else ''} to subagents"
        if name == "session_search":
            where = " in all projects" if args.get("all_projects") is True else ""
            return f'Search past sessions{where}: "{_oneLine(str(args.get("query", "")), 60)}"'
        if name == "memory":
            store = "user profile" if args.get("target") == "user" else "notes"
            operations = args.get("operations")
            if isinstance(operations, list) and operations:
                what = f"{len(operations)} change{'s' if len(operations) != 1 else ''}"
            else:
                what = _oneLine(str(args.get("action") or "change"), 20)
            return f"Update memory ({store}): {what}"
        return name

    def locations(self, name: str, args: dict[str, Any], extras: dict[str, Any]) -> list[dict[str, Any]]:
        path = extras.get("path") or (args.get("path") if "path" in args else None)
        if name not in KINDS or name in ("terminal", "todo", "session_search", "process", "delegate_task") or path is None:
            return []
        location: dict[str, Any] = {"path": self.absolute(path)}
        line = extras.get("line") or (args.get("offset") if name == "read_file" else None)
        if isinstance(line, int) and line >= 1:
            location["line"] = line
        return [location]

    def toolStarted(self, callId: str, name: str, args: dict[str, Any], extras: dict[str, Any] | None = None) -> dict[str, Any]:
        extras = extras or {}
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call",
            "toolCallId": callId,
            "name": name,
            "title": extras.get("title") or self.title(name, args),
            "kind": extras.get("kind") or KINDS.get(name, "other"),
            "status": "pending",
            "rawInput": args,
            "locations": self.locations(name, args, extras),
        }
        if name == "terminal" and args.get("command"):
            update["content"] = [textContent(fenced(str(args["command"]), "sh"))]
        return update

    def toolFinished(
        self, callId: str, name: str, args: dict[str, Any], result: Any, failed: bool, extras: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        extras = extras or {}
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": callId,
            "status": "failed" if failed else "completed",
            "content": self.finishedContent(name, text, failed, extras),
            "rawOutput": {"output": truncateMiddle(text, RAW_OUTPUT_LIMIT)},
        }
        if name == "terminal":  # how the command ended, for clients that show it
            update["rawOutput"].update({k: extras[k] for k in ("exitCode", "signal") if extras.get(k) is not None})
        locations = self.locations(name, args, extras)
        if locations:
            update["locations"] = locations
        return update

    def diff(self, edit: dict[str, Any]) -> dict[str, Any]:
        """``diff`` content for an edit's ``path``, ``oldText`` (None: a new file) and ``newText``."""
        return {"type": "diff", "path": self.absolute(edit["path"]), "oldText": edit.get("oldText"), "newText": edit["newText"]}

    def finishedContent(self, name: str, text: str, failed: bool, extras: dict[str, Any]) -> list[dict[str, Any]]:
        if isinstance(extras.get("content"), list):  # already ACP content (an MCP tool's result)
            return extras["content"]
        content: list[dict[str, Any]] = []
        if name == "exit_plan_mode" and isinstance(extras.get("plan"), str):  # the plan stays in its card
            return [textContent(extras["plan"]), textContent(f"_{text.removeprefix('Error: ')}_")]
        if "newText" in extras and "path" in extras and not failed:
            content.append(self.diff(extras))
        if extras.get("terminalId"):
            content.append({"type": "terminal", "terminalId": extras["terminalId"]})
        if name == "delegate_task" and isinstance(extras.get("results"), list):
            content.append(textContent(_delegated(extras["results"])))
        elif name == "clarify" and "question" in extras and not failed:
            content.append(textContent(_questionAndAnswer(extras)))
        elif name == "terminal" and "output" in extras:
            body = str(extras["output"])
            shown = shownOutput(body)
            content.append(textContent(f"{shown}\n{_commandStatus(text, failed, extras)}"))
            if extras.get("sandboxNote"):
                content.append(textContent(str(extras["sandboxNote"])))
        elif name == "read_file" and isinstance(extras.get("images"), list) and not failed:
            content += imagePreview(extras["images"])
        elif failed or name != "todo":
            summary = text if failed or name not in ("write_file", "patch") else text.split("\n", 1)[0]
            content.append(textContent(fenced(truncateMiddle(summary, CONTENT_LIMIT))))
        return content

    def permissionToolCall(self, callId: str, name: str, args: dict[str, Any], detail: dict[str, Any]) -> dict[str, Any]:
        """The tool call a permission request shows: the diff of an edit, or the
        exact command and why it needs approval."""
        call: dict[str, Any] = {
            "toolCallId": callId,
            "title": detail.get("title") or self.title(name, args),
            "kind": detail.get("kind") or KINDS.get(name, "other"),
            "status": "pending",
            "rawInput": args,
        }
        if "text" in detail:  # said in full by the caller (an MCP tool's call)
            call["content"] = [textContent(detail["text"])]
        elif "newText" in detail:
            call["content"] = [self.diff(detail)]
            call["locations"] = [{"path": self.absolute(detail["path"])}]
        elif KINDS.get(name) == "fetch" or _isWebURL(detail.get("path")):  # a fetch (vision_analyze's too): the URL
            call["kind"] = "fetch"
            call["content"] = [textContent(f"This {detail['reason']}:\n{fenced(str(detail['path']))}")]
        elif "command" not in detail:  # a read: which path, and why it asks
            path = self.absolute(detail["path"])
            call["content"] = [textContent(f"This {detail['reason']}:\n{fenced(path)}")]
            call["locations"] = [{"path": path}]
        else:
            command = str(detail.get("command", ""))
            call["content"] = [textContent(f"{detail.get('reason', 'This command needs approval')}\n{fenced(command, 'sh')}")]
        return call
