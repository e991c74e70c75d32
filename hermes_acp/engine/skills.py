"""Agent Skills: ``SKILL.md`` folders in the user's ``$HERMES_HOME/skills`` and the project's.

A skill is a folder holding a ``SKILL.md``: YAML front matter (``name``, ``description``,
optional ``license``, ``compatibility``, ``metadata``, ``allowed-tools``, ``argument-hint``)
between ``---`` lines, then Markdown instructions; its other files (``references/``,
``templates/``, ``scripts/``, ``assets/``) are read when the instructions point to them.

Where they are found, first found wins (``skillRoots``):

1. the user's folder, ``$HERMES_HOME/skills`` (Hermes' layout, ``[category/]name/SKILL.md``),
   the only one ``skill_manage`` writes;
2. the project's, read-only: ``.hermes/skills``, ``.agents/skills`` and ``.claude/skills`` in
   the session's folder and each folder above it up to the repository's root (nearest first).

The user's own skills win over a project's of the same name: a repository must not replace
what the user wrote. A ``SKILL.md`` that cannot be used is skipped with the reason
(``Catalog.problems``): not UTF-8 text, over ``SKILL_MD_CHARS``, a link that leads out of its
folder, front matter missing or unparseable, a bad ``name`` or ``description``. A name that
differs from its folder's, or a bad optional field, is a warning: the skill still loads.

Scanning is cheap to repeat (every turn does): a file is parsed again only when its size, time
or inode changed. No Twisted here: the engine and the reactor's worker threads call it.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from hermes_acp.config import DEFAULT_SKILL_COMMANDS, DEFAULT_SKILLS_PROMPT_CHARS, DEFAULT_SKILLS_SCAN_DIRS
from hermes_acp.engine.instructions import repositoryRoot
from hermes_acp.engine.secrets import redact, secretValues
from hermes_acp.engine.sensitive import inside, secretKind

USER, PROJECT = "user", "project"
#: The project's skill folders, in each folder from the session's up to the repository root.
PROJECT_FOLDERS = (".hermes/skills", ".agents/skills", ".claude/skills")
#: The format's limits (agentskills.io), and Hermes' for what ``skill_manage`` writes.
NAME_CHARS, DESCRIPTION_CHARS, COMPATIBILITY_CHARS = 64, 1024, 500
SKILL_MD_CHARS = 100_000
SUPPORT_FILE_BYTES = 1024 * 1024
#: Hermes' rule for names (it also takes dots and underscores, which the spec does not).
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: The folders of a skill that ``skill_manage`` writes files in, and ``skill_view`` lists.
SUPPORT_FOLDERS = ("references", "templates", "scripts", "assets")
#: How deep below a root a ``SKILL.md`` may be (``category/name`` is 2), and folders never entered.
MAX_DEPTH = 4
SKIPPED_FOLDERS = {"node_modules", "__pycache__"}
#: The files ``skill_view`` lists under each support folder.
LISTED_FILES = 100


class InvalidSkill(ValueError):
    """A ``SKILL.md`` (or what ``skill_manage`` would write) that cannot be used; the message says why."""


@attrs.frozen
class Skill:
    """One usable skill: what the catalog and the slash command show, and where it is."""

    name: str
    description: str
    folder: str
    source: str
    category: str | None = None
    argumentHint: str | None = None
    #: Loaded all the same, but not as it should be (name and folder differ, a bad optional field).
    warnings: tuple[str, ...] = ()
    #: The folder it was found in (``skillRoots``): its ``SKILL.md`` may not lead out of it.
    root: str = ""

    @property
    def path(self) -> str:
        return os.path.join(self.folder, "SKILL.md")

    @property
    def writable(self) -> bool:
        return self.source == USER


@attrs.frozen
class Problem:
    """A skill that was skipped (or shadowed, or loaded with a warning), and why."""

    path: str
    reason: str


@attrs.frozen
class Document:
    """A parsed ``SKILL.md``: its whole text, front matter and body."""

    text: str
    front: dict[str, Any]
    body: str


def splitFrontMatter(text: str) -> tuple[str, str]:
    """(front matter, body) of a ``SKILL.md``; InvalidSkill without ``---`` lines around it."""
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise InvalidSkill("it does not start with front matter (a '---' line, then name: and description:)")
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1:])
    raise InvalidSkill("its front matter is not closed by a '---' line")


_KEY_VALUE = re.compile(r"^([A-Za-z0-9_-]+):\s+(.*:.*)$")


def _loadYAML(block: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(block)
    except RecursionError:  # PyYAML builds nested lists and maps by recursion
        raise InvalidSkill("its front matter is nested too deeply to be read") from None
    except (yaml.YAMLError, ValueError) as first:  # ValueError: a value it cannot build (2024-02-30)
        # Lenient, as the client guide asks: ``description: Use when: x`` is common and invalid
        # YAML; quote such top-level values and try once more.
        def quoted(line: str) -> str:
            match = _KEY_VALUE.match(line)
            if not match or match.group(2)[:1] in "\"'[{|>":
                return line
            return f"{match.group(1)}: " + '"' + match.group(2).replace("\\", "\\\\").replace('"', '\\"') + '"'

        try:
            return yaml.safe_load("\n".join(map(quoted, block.split("\n"))))
        except RecursionError:
            raise InvalidSkill("its front matter is nested too deeply to be read") from None
        except (yaml.YAMLError, ValueError):
            problem = str(first).split("\n")[0]
            raise InvalidSkill(f"its front matter is not valid YAML ({problem})") from None


def checkName(name: Any) -> str:
    """``name`` when it is a valid skill name; InvalidSkill saying why not."""
    if not isinstance(name, str) or not name:
        raise InvalidSkill("its front matter has no name")
    if len(name) > NAME_CHARS:
        raise InvalidSkill(f"its name is {len(name)} characters long (at most {NAME_CHARS})")
    if not NAME_PATTERN.match(name):
        raise InvalidSkill(f"its name {name[:80]!r} is not lowercase letters, digits, '-', '.' and '_' "
                           "starting with a letter or digit")
    return name


def parseDocument(text: str) -> Document:
    """A ``SKILL.md``'s text checked against the format: InvalidSkill names the first problem."""
    if "\0" in text:
        raise InvalidSkill("it is a binary file, not text")
    if len(text) > SKILL_MD_CHARS:
        raise InvalidSkill(f"it is {len(text):,} characters long (at most {SKILL_MD_CHARS:,})")
    block, body = splitFrontMatter(text)
    front = _loadYAML(block)
    if not isinstance(front, dict):
        raise InvalidSkill("its front matter is not a mapping of fields (name: ..., description: ...)")
    checkName(front.get("name"))
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise InvalidSkill("its front matter has no description (what the skill does and when to use it)")
    if len(description) > DESCRIPTION_CHARS:
        raise InvalidSkill(f"its description is {len(description):,} characters long (at most {DESCRIPTION_CHARS})")
    return Document(text, front, body)


def _optionalWarnings(front: dict[str, Any]) -> list[str]:
    """What is wrong with the optional fields (the skill loads; the field is ignored)."""
    found = []
    compatibility = front.get("compatibility")
    if compatibility is not None and (not isinstance(compatibility, str) or len(compatibility) > COMPATIBILITY_CHARS):
        found.append(f"compatibility must be text of at most {COMPATIBILITY_CHARS} characters")
    metadata = front.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, (str, dict)) for k, v in metadata.items())):
        found.append("metadata must map names to text")
    for field in ("allowed-tools", "argument-hint", "license"):
        if front.get(field) is not None and not isinstance(front[field], str):
            found.append(f"{field} must be text")
    return found


def readText(path: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` (links already resolved: one swapped in
    meanwhile fails), at most ``limit`` bytes; InvalidSkill for what is not such a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InvalidSkill(f"it cannot be read ({e.strerror or e})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which refuses a folder with an OSError
        os.close(fd)
        raise InvalidSkill("it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            raise InvalidSkill(f"it is {info.st_size:,} bytes (at most {limit:,})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InvalidSkill(f"it is over {limit:,} bytes")
    if b"\0" in data:
        raise InvalidSkill(f"it is a binary file ({len(data):,} bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidSkill("it is not UTF-8 text") from None


def skillRoots(userRoot: str, cwd: str) -> list[tuple[str, str]]:
    """(folder, source) in the order they are searched: the user's, then the project's, nearest first."""
    roots = [(userRoot, USER)]
    folder, top = os.path.abspath(cwd), repositoryRoot(cwd)
    while True:
        roots += [(os.path.join(folder, name), PROJECT) for name in PROJECT_FOLDERS]
        if folder == top or os.path.dirname(folder) == folder:
            return roots
        folder = os.path.dirname(folder)


@attrs.frozen
class Catalog:
    """The skills of one folder's sessions, in the order they win, and what was skipped."""

    skills: tuple[Skill, ...] = ()
    problems: tuple[Problem, ...] = ()
    roots: tuple[tuple[str, str], ...] = ()

    def find(self, name: str) -> Skill | None:
        return next((skill for skill in self.skills if skill.name == name), None)

    def categories(self) -> list[str]:
        return sorted({skill.category for skill in self.skills if skill.category})

    def promptSection(self, limit: int) -> str:
        """The system prompt's list of skills, within ``limit`` characters: descriptions are
        shortened first, then the last skills are left out with a note (``skills_list`` has
        them all). Empty when there are none (or the limit is 0)."""
        if not self.skills or limit <= 0:
            return ""
        head = ("## Skills\n"
                "Skills are instructions for particular kinds of task. Before a task that matches a "
                "skill's description, load it with skill_view(name) and follow it; skill_view(name, "
                "file_path) reads a file it refers to. skills_list lists every skill; skill_manage "
                "creates and changes the user's own (only when the user asks for it or agrees).\n"
                "<available_skills>\n")
        tail = "</available_skills>"
        for width in (DESCRIPTION_CHARS, 200, 100, 60):
            lines = [f"- {skill.name}: {shortened(skill.description, width)}\n" for skill in self.skills]
            if len(head) + len(tail) + sum(map(len, lines)) <= limit:
                return head + "".join(lines) + tail
        room, kept = limit - len(head) - len(tail) - 80, []
        for line in lines:
            if len(line) > room:
                break
            kept.append(line)
            room -= len(line)
        left = len(self.skills) - len(kept)
        note = f"- … and {left} more skill(s): skills_list lists them all\n"
        return head + "".join(kept) + note + tail


def shortened(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


_Signature = tuple[int, int, int, int]


@attrs.define(eq=False)
class SkillLibrary:
    """Finds and reads skills; one for the process, shared by every session (thread-safe).

    ``reserved`` are names ``skill_manage`` will not create (the agent's own slash commands).
    """

    userRoot: str = attrs.field(converter=os.path.abspath)
    scanDirs: int = DEFAULT_SKILLS_SCAN_DIRS
    promptChars: int = DEFAULT_SKILLS_PROMPT_CHARS
    commandCount: int = DEFAULT_SKILL_COMMANDS
    reserved: frozenset[str] = frozenset()
    _parsed: dict[str, tuple[_Signature, Skill | Problem]] = attrs.field(factory=dict, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def catalog(self, cwd: str) -> Catalog:
        """The skills a session in ``cwd`` has, read anew (cheaply: see the module's docstring)."""
        roots = skillRoots(self.userRoot, cwd)
        skills: list[Skill] = []
        problems: list[Problem] = []
        byName: dict[str, Skill] = {}
        seenFolders: set[str] = set()
        budget = [self.scanDirs]
        for root, source in roots:
            realRoot = ""  # (taken once a skill is found: most roots do not exist)
            for path, real in self._found(root, budget, problems):
                if os.path.dirname(real) in seenFolders:
                    continue
                seenFolders.add(os.path.dirname(real))
                realRoot = realRoot or os.path.realpath(root)
                found = self._load(path, real, root, realRoot, source)
                if isinstance(found, Problem):
                    problems.append(found)
                    continue
                if found.name in byName:
                    problems.append(Problem(path, f"not used: the skill {found.name!r} of {byName[found.name].path} "
                                                  "has the same name and comes first"))
                    continue
                byName[found.name] = found
                skills.append(found)
                problems += [Problem(path, warning) for warning in found.warnings]
        if budget[0] < 0:
            problems.append(Problem(roots[0][0], f"the search stopped after {self.scanDirs} folders "
                                                 "(HERMES_ACP_SKILLS_SCAN_DIRS); skills past them are not loaded"))
        with self._lock:
            if len(self._parsed) > 4 * self.scanDirs:
                self._parsed.clear()
        return Catalog(tuple(skills), tuple(problems), tuple(roots))

    def _found(self, root: str, budget: list[int], problems: list[Problem]) -> Iterator[tuple[str, str]]:
        """(path, where it leads) of each ``SKILL.md`` under ``root``, breadth first, within the
        folder budget. A folder holding one is a skill: its own subfolders are not searched.
        Linked folders are not entered (so a folder's real path is its path from the root's
        real one, without a ``realpath`` each); one that leads out of the root and holds a
        ``SKILL.md`` is reported."""
        if not os.path.isdir(root):
            return
        realRoot = os.path.realpath(root)
        level = [(root, realRoot, 0)]
        while level:
            following = []
            for folder, realFolder, depth in level:
                budget[0] -= 1
                if budget[0] < 0:
                    return
                try:  # a folder's entries count too: 64 of them cost as much as a folder
                    with os.scandir(folder) as entries:
                        children = sorted(itertools.islice(entries, 64 * max(budget[0], 1)), key=lambda e: e.name)
                except OSError:
                    continue
                budget[0] -= len(children) // 64
                skillMd = next((e for e in children if e.name == "SKILL.md"), None)
                if depth > 0 and skillMd is not None:
                    path = os.path.join(folder, "SKILL.md")
                    yield path, os.path.realpath(path) if skillMd.is_symlink() else os.path.join(realFolder, "SKILL.md")
                    continue
                if depth >= MAX_DEPTH:
                    continue
                for entry in children:
                    if entry.name.startswith(".") or entry.name in SKIPPED_FOLDERS:
                        continue
                    try:
                        if entry.is_symlink():
                            target = os.path.realpath(entry.path)
                            if (os.path.isdir(target) and not inside(target, realRoot)
                                    and os.path.exists(os.path.join(target, "SKILL.md"))):
                                problems.append(Problem(os.path.join(entry.path, "SKILL.md"),
                                                        f"skipped: it is a link to {target}, outside {root}"))
                        elif entry.is_dir():
                            following.append((entry.path, os.path.join(realFolder, entry.name), depth + 1))
                    except OSError:
                        continue
            level = following

    def _load(self, path: str, real: str, root: str, realRoot: str, source: str) -> Skill | Problem:
        """The skill of ``path``, which leads to ``real`` (parsed again only when the file
        changed), or why it is skipped."""
        if not inside(real, realRoot):
            return Problem(path, f"skipped: it is a link to {real}, outside {root}")
        try:
            info = os.stat(real)
        except OSError as e:
            return Problem(path, f"skipped: it cannot be read ({e.strerror or e})")
        signature = (info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns)
        key = f"{source}\0{root}\0{path}"
        with self._lock:
            cached = self._parsed.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        result = self._parse(path, real, root, source)
        with self._lock:
            self._parsed[key] = (signature, result)
        return result

    def _parse(self, path: str, real: str, root: str, source: str) -> Skill | Problem:
        folder = os.path.dirname(path)
        try:
            if secretKind(real) is not None and source == PROJECT:
                raise InvalidSkill(f"it leads to {secretKind(real)}")
            document = parseDocument(readText(real, 4 * SKILL_MD_CHARS))
        except InvalidSkill as e:
            return Problem(path, f"skipped: {e}")
        front = document.front
        warnings = _optionalWarnings(front)
        name = front["name"]
        if name != os.path.basename(folder):
            warnings.append(f"its name {name!r} differs from its folder's {os.path.basename(folder)!r}")
        hint = front.get("argument-hint")
        parts = os.path.relpath(folder, root).split(os.sep)
        return Skill(name, " ".join(front["description"].split()), folder, source,
                     parts[0] if len(parts) > 1 else None, hint if isinstance(hint, str) else None,
                     tuple(f"loaded, but {warning}" for warning in warnings), root)

    def read(self, skill: Skill) -> Document:
        """The skill's ``SKILL.md`` as it is now; InvalidSkill when it is no longer usable."""
        real = os.path.realpath(skill.path)
        if not inside(real, os.path.realpath(skill.root or skill.folder)):
            raise InvalidSkill(f"its SKILL.md now leads to {real}, outside {skill.root}")
        return parseDocument(readText(real, 4 * SKILL_MD_CHARS))

    def activation(self, skill: Skill, request: str) -> str:
        """The user message of ``/NAME request``: the skill's instructions, where its files
        are, and the user's words (known secret values redacted, as from a tool). Said
        plainly when the skill cannot be read any more."""
        try:
            body = self.read(skill).body.strip()
        except InvalidSkill as e:
            return (f"The user typed /{skill.name}{' ' + request if request else ''}, but the skill "
                    f"{skill.name!r} ({skill.path}) could not be loaded: {e}. Tell the user.")
        files = linkedFiles(skill.folder)
        listed = "".join(f"\n- {path}" for group in files.values() for path in group)
        return redact(f"The user invoked the skill {skill.name!r} with /{skill.name}. Follow its instructions "
                f"for this request.\n\n<skill_content name=\"{skill.name}\">\n{body}\n</skill_content>\n\n"
                f"The skill's folder is {skill.folder}: relative paths in it start there, and "
                f"skill_view({skill.name!r}, file_path) reads its files" + (f":{listed}" if listed else ".")
                + f"\n\nThe user's request: {request or '(nothing more: apply the skill as it says)'}",
                      secretValues())


def linkedFiles(folder: str) -> dict[str, list[str]]:
    """The files under the skill's support folders (relative paths), at most ``LISTED_FILES``."""
    found: dict[str, list[str]] = {}
    count = 0
    for group in SUPPORT_FOLDERS:
        base = os.path.join(folder, group)
        if os.path.islink(base) or not os.path.isdir(base):
            continue
        for current, folders, files in os.walk(base):
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            for name in sorted(f for f in files if not f.startswith(".")):
                if count >= LISTED_FILES:
                    return found
                count += 1
                found.setdefault(group, []).append(os.path.relpath(os.path.join(current, name), folder))
    return found
