"""The command guard: what ``terminal`` may run without asking.

A command is cut into simple commands (shell operators, ``$(...)``, backticks,
``sh -c`` and ``eval`` payloads all open new ones) and each is looked at by
its command word. Some findings are *hard*: the command never runs. Others are
*dangerous*: the user is asked, and may answer for the rest of the session.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Callable, Iterator

import attrs

from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOWED, REJECT_ALWAYS, Verdict, ask, refusal

MAX_COMMAND_CHARS = 128_000

_SEPARATORS = {";", ";;", "&&", "||", "|", "|&", "&", "$", "(", ")", "<(", ">(", "{", "}"}
_PIPES = {"|", "|&"}
_WRITE_REDIRECTS = {">", ">>", ">|", "&>", "&>>", ">&"}
_READ_REDIRECTS = {"<", "<<", "<<<", "<<-"}
_PREFIXES = {"sudo", "doas", "env", "exec", "nohup", "time", "command", "builtin", "nice",
             "ionice", "timeout", "stdbuf", "xargs", "setsid", "chroot"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish"}
_INTERPRETERS = _SHELLS | {"python", "python3", "perl", "ruby", "node", "php"}
_DOWNLOADERS = {"curl", "wget", "fetch"}
_DECODERS = {"base64", "base32", "xxd", "openssl"}
_POWER = {"shutdown", "reboot", "halt", "poweroff"}
_ROOT_TARGETS = {"/", "/*", "/.", "/..", "~", "~/*", "$HOME", "${HOME}", "$HOME/*", "${HOME}/*"}
_SYSTEM_DIRS = {"/home", "/root", "/etc", "/usr", "/var", "/bin", "/sbin", "/boot", "/lib",
                "/lib64", "/opt", "/dev", "/proc", "/sys", "/srv"}
_DISK = re.compile(r"^/dev/(sd|nvme|hd|mmcblk|vd|xvd|disk)")
# Every pattern here runs on model-chosen text while holding the GIL, so each one
# is linear in the command's length: no unbounded repeat before a backreference,
# no lookahead that rescans the rest of the command at every match.
_NAME = r"[^\s(){}|&;]{1,64}"
_FUNCTION_NAME = re.compile(rf"({_NAME})\s*$")
_FORK_BODY = re.compile(rf"\(\)\s*\{{\s*({_NAME})\s*\|\s*({_NAME})\s*&\s*\}}\s*;\s*({_NAME})")
_SQL = re.compile(r"\b(drop\s+(table|database|schema)|truncate\s+table)\b", re.I)
_SQL_DELETE = re.compile(r"\bdelete\s+from\s+\w+", re.I)
_SQL_WHERE = re.compile(r"\bwhere\b", re.I)


def _forkBomb(command: str) -> bool:
    """``f(){ f|f& };f`` for any name f (the names compared here, not by a backreference)."""
    for body in _FORK_BODY.finditer(command):
        name = _FUNCTION_NAME.search(command, max(0, body.start() - 80), body.start())
        if name is not None and name.group(1) == body.group(1) == body.group(2) == body.group(3):
            return True
    return False


def _unboundedDelete(command: str) -> bool:
    """A ``DELETE FROM table`` with no WHERE before the statement ends."""
    for statement in command.split(";"):
        found = _SQL_DELETE.search(statement)
        if found is not None and not _SQL_WHERE.search(statement, found.end()):
            return True
    return False
_RC_FILES = {".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile",
             ".zshenv", ".zlogin", ".kshrc", ".cshrc", ".tcshrc", ".inputrc"}
_SECRET_FILES = {".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials"}


@attrs.frozen
class Finding:
    """Why a command needs approval, or (``hard``) never runs; ``key`` names the pattern."""

    key: str
    reason: str
    hard: bool = False


def _tokens(command: str) -> list[str]:
    text = command.replace("`", " ; ").replace("\n", " ; ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to words without quotes
        return [word.strip("'\"") for word in re.split(r"\s+|([;&|()])", text) if word]


@attrs.frozen
class _Simple:
    """One simple command: its words, where it writes, and what feeds it."""

    words: list[str]
    writes: list[str]
    pipedFrom: list[str] | None
    prefixes: list[str]


def _simpleCommands(command: str, depth: int = 0) -> Iterator[_Simple]:
    tokens = _tokens(command)
    segment: list[str] = []
    previous: list[str] | None = None
    piped = False
    for token in [*tokens, ";"]:
        if token not in _SEPARATORS:
            segment.append(token)
            continue
        if segment:
            simple = _parseSimple(segment, previous if piped else None)
            yield simple
            words = simple.words
            if words and depth < 3:
                yield from _payloadCommands(words, depth + 1)
            previous = words
        segment = []
        piped = token in _PIPES


def _payloadCommands(words: list[str], depth: int) -> Iterator[_Simple]:
    """The commands inside ``sh -c '...'`` (or ``-lc``, ...) and ``eval ...``."""
    name = os.path.basename(words[0])
    if name == "eval":
        yield from _simpleCommands(" ".join(words[1:]), depth)
    elif name in _SHELLS:
        for i, word in enumerate(words[1:-1], 1):
            if re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", word):
                yield from _simpleCommands(words[i + 1], depth)
                return


def _parseSimple(tokens: list[str], pipedFrom: list[str] | None) -> _Simple:
    words: list[str] = []
    writes: list[str] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
        elif token in _WRITE_REDIRECTS or token in _READ_REDIRECTS:
            if token in _WRITE_REDIRECTS and i + 1 < len(tokens):
                writes.append(tokens[i + 1])
            skip = True
        elif token.isdigit() and i + 1 < len(tokens) and tokens[i + 1] in _WRITE_REDIRECTS:
            continue
        else:
            words.append(token)
    prefixes: list[str] = []
    while words:
        name = os.path.basename(words[0])
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        elif name in _PREFIXES:
            prefixes.append(name)
            words = words[1:]
            while words and (words[0].startswith("-") or "=" in words[0] or words[0] == "{}"
                             or re.match(r"^\d+[smhd]?$", words[0])):
                words = words[1:]
        else:
            break
    return _Simple(words, writes, pipedFrom, prefixes)


def _flags(words: list[str]) -> set[str]:
    """Single-letter flags (from ``-rf``) and long flags (``--force``)."""
    found: set[str] = set()
    for word in words:
        if word.startswith("--"):
            found.add(word.split("=", 1)[0])
        elif word.startswith("-") and len(word) > 1:
            found.update(word[1:])
    return found


def _sensitiveTarget(path: str) -> str | None:
    """A human name for a file a command should not write without asking."""
    expanded = os.path.expanduser(path.replace("${HOME}", "~").replace("$HOME", "~"))
    parts = expanded.replace("\\", "/").split("/")
    base = parts[-1]
    if ".ssh" in parts:
        return "SSH configuration"
    if base in _RC_FILES:
        return "a shell startup file"
    if base in _SECRET_FILES:
        return "a credentials file"
    if base == ".env" or base.startswith(".env."):
        return "an environment (.env) file"
    if ".hermes" in parts:
        return "Hermes configuration"
    if expanded.startswith("/etc/"):
        return "system configuration under /etc"
    return None


def _rmFindings(words: list[str]) -> Iterator[Finding]:
    flags = _flags(words[1:])
    if not ({"r", "R", "--recursive"} & flags):
        return
    for target in (w for w in words[1:] if not w.startswith("-")):
        stripped = target.rstrip("/") or "/"
        if target in _ROOT_TARGETS or stripped in _ROOT_TARGETS or stripped in _SYSTEM_DIRS or (
            stripped.endswith("/*") and stripped[:-2] in _SYSTEM_DIRS
        ):
            yield Finding("rm-root", f"recursive delete of {target}", hard=True)
    yield Finding("rm-recursive", "recursive delete")


def _commandFindings(simple: _Simple) -> Iterator[Finding]:
    for target in simple.writes:
        if _DISK.match(target):
            yield Finding("disk-write", f"overwrites the disk device {target}", hard=True)
        kind = _sensitiveTarget(target)
        if kind:
            yield Finding(f"write-sensitive:{kind}", f"writes to {kind} ({target})")
    if {"sudo", "doas"} & set(simple.prefixes):
        yield Finding("sudo", "runs a command as root (sudo)")
    words = simple.words
    if not words:
        return
    name = os.path.basename(words[0])
    args = words[1:]
    flags = _flags(args)
    if name == "su":
        yield Finding("sudo", "switches to another user (su)")
    elif name == "rm":
        yield from _rmFindings(words)
        if "xargs" in simple.prefixes:
            yield Finding("xargs-rm", "deletes files listed by xargs")
    elif name.startswith("mkfs"):
        yield Finding("mkfs", "formats a file system (mkfs)", hard=True)
    elif name == "dd":
        for arg in args:
            if arg.startswith("of=") and _DISK.match(arg[3:]):
                yield Finding("disk-write", f"dd onto the disk device {arg[3:]}", hard=True)
        yield Finding("dd", "raw copy with dd")
    elif name in _POWER or (name in {"init", "telinit"} and args[:1] in (["0"], ["6"])) or (
        name == "systemctl" and args[:1] and args[0] in {"poweroff", "reboot", "halt", "kexec"}
    ):
        yield Finding("power", "shuts down or reboots the machine", hard=True)
    elif name == "kill" and "-1" in args:
        yield Finding("kill-all", "kills every process (kill -1)", hard=True)
    elif name in {"pkill", "killall"} and ({"9", "KILL", "r"} & flags or "-KILL" in args):
        yield Finding("kill-force", f"force-kills processes by name ({name})")
    elif name == "systemctl" and args[:1] and args[0] in {"stop", "disable", "mask", "restart"}:
        yield Finding("systemctl", f"systemctl {args[0]} changes system services")
    elif name == "chmod" and any(re.fullmatch(r"0?777|0?666|[ao]\+w|[ugoa]*\+rwx", a) for a in args):
        recursive = "R" in flags or "--recursive" in flags
        yield Finding("chmod-open", "makes files world-writable" + (" recursively" if recursive else ""))
    elif name == "chown" and ({"R", "--recursive"} & flags):
        yield Finding("chown-recursive", "recursive chown")
    elif name == "find" and ("-delete" in args or any(
        a in {"-exec", "-execdir", "-ok"} and i + 1 < len(args) and os.path.basename(args[i + 1]) == "rm"
        for i, a in enumerate(args)
    )):
        yield Finding("find-delete", "deletes the files find matches")
    elif name == "git":
        yield from _gitFindings(args)
    elif name in {"tee", "cp", "mv", "install", "ln"} or (name in {"sed", "perl", "ruby"} and "i" in flags):
        targets = [a for a in args if not a.startswith("-")]
        if name in {"cp", "mv", "install", "ln"}:
            targets = targets[-1:]
        for target in targets:
            kind = _sensitiveTarget(target)
            if kind:
                yield Finding(f"write-sensitive:{kind}", f"{name} writes to {kind} ({target})")
    if simple.pipedFrom and name in _INTERPRETERS:
        source = os.path.basename(simple.pipedFrom[0]) if simple.pipedFrom else ""
        if source in _DOWNLOADERS:
            yield Finding("pipe-to-shell", f"pipes a download ({source}) into {name}")
        elif source in _DECODERS:
            yield Finding("decode-to-shell", f"pipes decoded data ({source}) into {name}")


def _gitFindings(args: list[str]) -> Iterator[Finding]:
    sub = args[0] if args else ""
    flags = _flags(args[1:])
    if sub == "push" and ({"f", "--force", "--force-with-lease"} & flags or any(a.startswith("+") for a in args[1:])):
        yield Finding("git-force-push", "force push (rewrites remote history)")
    elif sub == "reset" and "--hard" in flags:
        yield Finding("git-reset-hard", "git reset --hard discards uncommitted work")
    elif sub == "clean" and ({"f", "--force"} & flags):
        yield Finding("git-clean", "git clean -f deletes untracked files")
    elif sub == "branch" and ({"D"} & flags or {"--delete", "--force"} <= flags):
        yield Finding("git-branch-delete", "force-deletes a git branch")


def check(command: str) -> tuple[Finding | None, list[Finding]]:
    """Return (hard block, dangerous findings) for a command."""
    if len(command) > MAX_COMMAND_CHARS:
        return None, [Finding("too-long", "command too long to check")]
    found = [finding for simple in _simpleCommands(command) for finding in _commandFindings(simple)]
    if _forkBomb(command):
        found.append(Finding("fork-bomb", "fork bomb", hard=True))
    if "<(" in command and re.search(r"\b(ba|z|k|da)?sh\s+<\(\s*(curl|wget)\b", command):
        found.append(Finding("pipe-to-shell", "runs a downloaded script"))
    if _SQL.search(command) or _unboundedDelete(command):
        found.append(Finding("sql-destructive", "destructive SQL statement"))
    hard = next((finding for finding in found if finding.hard), None)
    if hard is not None:
        return hard, []
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.key, finding)
    return None, list(unique.values())


@attrs.define(eq=False)
class CommandApprovals:
    """One session's memory of command answers (allow_always and reject_always)."""

    allowed: set[str] = attrs.field(factory=set)
    refused: set[str] = attrs.field(factory=set)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def decide(self, command: str, question: Callable[[str, str], str] | None) -> Verdict:
        """Check ``command``; ask the user (``question(command, reason)``) when needed."""
        hard, findings = check(command)
        if hard is not None:
            return Verdict(
                False, f"BLOCKED: this command is never allowed ({hard.reason}). Do not try to run it another way."
            )
        if not findings:
            return Verdict(True)
        keys = {f.key for f in findings}
        reason = "; ".join(f.reason for f in findings)
        with self._lock:
            if keys & self.refused:
                return Verdict(
                    False,
                    f"BLOCKED: the user refused commands like this for the rest of the session ({reason}). "
                    "Do not retry it.",
                )
            if keys <= self.allowed:
                return Verdict(True)
        answer = ask(question, command, reason)
        with self._lock:
            if answer == ALLOW_ALWAYS:
                self.allowed |= keys
            elif answer == REJECT_ALWAYS:
                self.refused |= keys
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(
            False,
            f"BLOCKED: this command needs approval ({reason}) and {refusal(answer)}. "
            "Do not retry it; ask the user or take another approach.",
        )

