"""The command guard: what ``terminal`` may run without asking.

A command is read the way ``sh`` reads it (quotes, ``$(...)``, backticks,
``${...}``, ``$((...))``, here-documents) and cut into simple commands; the
command list of every substitution is looked at too. Each simple command is
looked at by the program it runs. A wrapper that runs its argument (``sudo``,
``env``, ``nice``, ``timeout``, ``flock``, ``xargs``, ``find -exec`` ...; see
``WRAPPERS``) is unwrapped, and so is shell code handed to a program
(``sh -c``, ``eval``, ``watch``, ``su -c``, ``env -S``, ``trap``, ``alias``).
An unknown program with a destructive program's name among its words is
looked at from that word on. What cannot be unwrapped asks: a command word
computed at run time (``$X``, ``$(...)``, a brace expansion, a file-name
pattern), a program piped or given in a here-document to a shell or an
interpreter, inline interpreter code (``python -c``, ``perl -e``, an awk
program that starts commands, ``sed`` with ``e`` or ``w``), git made to run a
command.

Some findings are *hard*: the command never runs. Others are *dangerous*: the
user is asked, and may answer for the rest of the session. Inside the sandbox
the guard's job is destructive shapes in the workspace; a command that runs
without one asks unless ``readonly.isReadOnly`` knows it reads only.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Callable, Iterator

import attrs

from hermes_acp.engine import readonly
from hermes_acp.engine.runners import (
    DECODERS, DOWNLOADERS, WRAPPERS, Wrapper, awkPrograms, awkRuns, interpreterSource, isInterpreter, languageOf,
    resolvedName, scriptOption, scriptOrStdin, sedParts, sedRuns, shellSource, wrapped,
)
from hermes_acp.engine.sensitive import protectedKind, secretKind
from hermes_acp.engine.shell import (
    ASSIGNMENT, KEYWORDS, NO_REDIRECTS, SHELLS, Simple, TooNested, Word, lex, simpleCommands,
)
from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOWED, REJECT_ALWAYS, Verdict, ask, refusal

MAX_COMMAND_CHARS = 128_000
_MAX_DEPTH = 8  # commands run by commands (sh -c, find -exec, ...), as analysed

_TRUNCATING = {">", ">|", "&>"}
_DESTRUCTIVE = {"rm", "rmdir", "shred", "unlink", "truncate", "dd"}
_POWER = {"shutdown", "reboot", "halt", "poweroff"}
_AS_ROOT = {"sudo": "runs a command as root (sudo)", "doas": "runs a command as root (doas)",
            "pkexec": "runs a command as root (pkexec)", "su": "switches to another user (su)",
            "runuser": "runs a command as another user (runuser)"}
# Programs known not to run their arguments as a command (``grep rm file``, ``man rm``).
#: Clients of services the user already runs, which run commands for them where
#: the sandbox does not reach (terminal multiplexers, containers, the session bus, schedulers).
_SERVICES = {"tmux", "screen", "zellij", "byobu", "docker", "podman", "nerdctl", "systemd-run", "machinectl",
             "emacsclient", "dbus-send", "busctl", "gdbus", "qdbus", "at", "batch", "crontab", "launchctl"}
_INERT = {"echo", "printf", "grep", "egrep", "fgrep", "rg", "ag", "ack", "man", "info", "whatis", "apropos",
          "whereis", "which", "type", "hash", "help", "cat", "head", "tail", "less", "more", "wc", "ls", "file",
          "stat", "touch", "mkdir", "cd", "test", "[", "[[", "true", "false", ":", "for", "case", "select",
          "function", "read", "unset", "exit", "return", "shift", "set", "sleep", "wait", "apt", "apt-get",
          "apt-cache", "dpkg", "brew", "pip", "pip3"}
# Programs with rules of their own (their arguments are not searched for another command).
_RULED = {"rm", "rmdir", "unlink", "shred", "truncate", "dd", "chmod", "chown", "chgrp", "git", "cp", "mv",
          "tee", "install", "ln", "kill", "pkill", "killall", "systemctl"}
_WRITERS = {"tee", "cp", "mv", "install", "ln", "sed", "perl", "ruby"}
_ROOT_TARGETS = {"/", "/*", "/.", "/..", "~", "~/*", "$HOME", "${HOME}", "$HOME/*", "${HOME}/*"}
_SYSTEM_DIRS = {"/home", "/root", "/etc", "/usr", "/var", "/bin", "/sbin", "/boot", "/lib",
                "/lib64", "/opt", "/dev", "/proc", "/sys", "/srv"}
_KNOWN_VARIABLES = {"HOME": "~", "PWD": "."}
# Variables whose value is a command some program runs (PAGER=cat is fine; PAGER='rm -rf x' is not).
_COMMAND_VARIABLES = {"GIT_SSH_COMMAND", "GIT_SSH", "GIT_PAGER", "PAGER", "MANPAGER", "GIT_EDITOR", "EDITOR",
                      "VISUAL", "GIT_SEQUENCE_EDITOR", "GIT_EXTERNAL_DIFF", "GIT_ASKPASS", "SSH_ASKPASS",
                      "GIT_PROXY_COMMAND"}
_HARMLESS_GIT_PREFIXES = ("user.", "color.", "advice.", "i18n.", "column.", "pull.", "push.")
_HARMLESS_GIT_KEYS = {"core.quotepath", "core.autocrlf", "core.safecrlf", "core.filemode", "core.ignorecase",
                      "core.abbrev", "init.defaultbranch", "safe.directory", "commit.gpgsign", "tag.gpgsign"}
_GIT_VALUED_OPTIONS = {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--config-env"}
_GIT_CONFIG_READS = {"--list", "-l", "--unset", "--unset-all", "--remove-section", "--rename-section",
                     "-e", "--edit", "get", "list", "unset", "edit", "remove-section", "rename-section"}
_FIND_EXEC = {"-exec", "-execdir", "-ok", "-okdir"}
_FIND_WRITES = {"-fprint", "-fprint0", "-fprintf", "-fls"}
_GDB_COMMANDS = {"-ex", "--ex", "-eval-command", "--eval-command", "-x", "--command", "-iex", "-ix",
                 "--init-eval-command", "--init-command"}
_DISK = re.compile(r"^/dev/(sd|nvme|hd|mmcblk|vd|xvd|disk)")
# Every pattern here runs on model-chosen text while holding the GIL, so each one
# is linear in the command's length: no unbounded repeat before a backreference,
# no lookahead that rescans the rest of the command at every match.
_NAME = r"[^\s(){}|&;]{1,64}"
_FUNCTION_NAME = re.compile(rf"({_NAME})\s*$")
_FORK_BODY = re.compile(rf"\(\)\s*\{{\s*({_NAME})\s*\|\s*({_NAME})\s*&\s*\}}\s*;\s*({_NAME})")
_SQL = re.compile(r"\b(drop\s+(table|database|schema)|truncate\s+table)\b", re.I)
_SQL_UNBOUNDED = (re.compile(r"\bdelete\s+from\s+\w+", re.I), re.compile(r"\bupdate\s+\S+\s+set\b", re.I))
_SQL_WHERE = re.compile(r"\bwhere\b", re.I)
_SQLITE_SHELL = re.compile(r"\s*\.(shell|system)\s")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_GIT_CONFIG_VARIABLE = re.compile(r"GIT_CONFIG_(PARAMETERS|COUNT|KEY_[0-9]+)|GIT_EXEC_PATH")
_GLOB = re.compile(r"[*?]|\[[^\[\]]*\]")
_BRACES = re.compile(r"\{[^{}]*\}")
def _forkBomb(command: str) -> bool:
    """``f(){ f|f& };f`` for any name f (the names compared here, not by a backreference)."""
    for body in _FORK_BODY.finditer(command):
        name = _FUNCTION_NAME.search(command, max(0, body.start() - 80), body.start())
        if name is not None and name.group(1) == body.group(1) == body.group(2) == body.group(3):
            return True
    return False


def _unboundedSql(command: str) -> bool:
    """A ``DELETE FROM table`` or ``UPDATE table SET`` with no WHERE before the statement ends."""
    for statement in command.split(";"):
        for pattern in _SQL_UNBOUNDED:
            found = pattern.search(statement)
            if found is not None and not _SQL_WHERE.search(statement, found.end()):
                return True
    return False




@attrs.frozen
class Finding:
    """Why a command needs approval, or (``hard``) never runs; ``key`` names the pattern."""

    key: str
    reason: str
    hard: bool = False


_COMPUTED = Finding("computed-command", "the command to run is computed at run time")
_TOO_NESTED = Finding("too-nested", "command too deeply nested to check")


def _stdinProgram(name: str, mode: str, script: Word | None, simple: Simple) -> Iterator[Finding]:
    """A shell or interpreter reading its program from its input or from a command (``<(...)``)."""
    if mode == "script" and script is not None and script.computed and script.text.startswith(("<(", ">(")):
        yield Finding("stdin-program", f"runs a program produced by a command in {name}")
    if mode != "stdin":
        return
    if simple.pipedFrom is not None and resolvedName(simple.pipedFrom) not in DOWNLOADERS | DECODERS:
        yield Finding("stdin-program", f"runs a program piped into {name}")
    for operator, word in simple.reads:
        if operator in ("<<", "<<-", "<<<"):
            yield Finding("stdin-program", f"runs a program given in a here-document to {name}")
        elif word.computed:
            yield Finding("stdin-program", f"runs a program produced by a command in {name}")




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
    """A human name for a file a command should not write without asking: a
    secret or protected path (``engine.sensitive``), or the agent's database."""
    expanded = os.path.expanduser(path.replace("${HOME}", "~").replace("$HOME", "~"))
    if os.path.basename(expanded) == "state.db":
        return "the agent's database (state.db)"
    return protectedKind(expanded)


def _computedWord(word: Word) -> Finding | None:
    """Why a command word is not known before it runs, if it is not."""
    if word.computed:
        return _COMPUTED
    if any("," in braces.group() or ".." in braces.group() for braces in _BRACES.finditer(word.bare)):
        return Finding("brace-command", "the command to run comes from a brace expansion")
    if _GLOB.search(word.bare):
        return Finding("glob-command", "the command to run comes from a file-name pattern")
    return None


def _rmFindings(args: list[str], prefixes: list[str]) -> Iterator[Finding]:
    flags = _flags(args)
    if not ({"r", "R", "--recursive"} & flags):
        if "xargs" in prefixes:
            yield Finding("xargs-rm", "deletes files listed by xargs")
        elif "find" not in prefixes:
            yield Finding("rm", "deletes files")
        return
    for target in (a for a in args if not a.startswith("-")):
        stripped = target.rstrip("/") or "/"
        if target in _ROOT_TARGETS or stripped in _ROOT_TARGETS or stripped in _SYSTEM_DIRS or (
            stripped.endswith("/*") and stripped[:-2] in _SYSTEM_DIRS
        ):
            yield Finding("rm-root", f"recursive delete of {target}", hard=True)
    yield Finding("rm-recursive", "recursive delete")
    if "xargs" in prefixes:
        yield Finding("xargs-rm", "deletes files listed by xargs")


def _deleteFindings(name: str, args: list[str]) -> Iterator[Finding]:
    """Programs that delete or empty files."""
    if name == "unlink":
        yield Finding("rm", "deletes files")
    elif name == "rmdir":
        yield Finding("rmdir", "deletes directories")
    elif name == "shred":
        yield Finding("shred", "destroys file contents (shred)")
    elif name == "truncate":
        yield Finding("truncate", "truncates files (truncate)")
    elif name == "mv" and args[-1:] == ["/dev/null"]:
        yield Finding("mv-devnull", "moves files to /dev/null (deletes them)")
    elif name == "cp" and "/dev/null" in args[:-1]:
        yield Finding("truncate", f"empties {args[-1]}")


def _programFindings(name: str, args: list[str], prefixes: list[str]) -> Iterator[Finding]:
    """The rules of programs that are dangerous by themselves."""
    flags = _flags(args)
    if name == "rm":
        yield from _rmFindings(args, prefixes)
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
    elif name == "chmod":
        recursive = bool({"R", "--recursive"} & flags)
        if any(re.fullmatch(r"0?777|0?666|[ao]\+w|[ugoa]*\+rwx", a) for a in args):
            yield Finding("chmod-open", "makes files world-writable" + (" recursively" if recursive else ""))
        elif recursive:
            yield Finding("chmod-recursive", "changes permissions recursively (chmod -R)")
    elif name in {"chown", "chgrp"} and ({"R", "--recursive"} & flags):
        yield Finding("chown-recursive", f"recursive {name}")
    elif name == "git":
        yield from _gitFindings(args)
    elif name in _SERVICES:
        yield _serviceFinding(name)
    else:
        yield from _deleteFindings(name, args)


def _serviceFinding(name: str) -> Finding:
    return Finding(f"service:{name}", f"{name} asks a program that is already running (outside the sandbox) "
                                      "to run or change things")


def _harmlessGitSetting(setting: str) -> bool:
    key = setting.split("=", 1)[0].lower()
    return key.startswith(_HARMLESS_GIT_PREFIXES) or key in _HARMLESS_GIT_KEYS


def _gitFindings(args: list[str]) -> Iterator[Finding]:
    """git's options before its subcommand (``-c`` can make git run a command), then the subcommand's."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        option, eq, value = args[i].partition("=")
        setting = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if option in ("-c", "--config-env") and not _harmlessGitSetting(setting):
            yield Finding("git-config-command", f"git {option} {setting} can make git run a command")
        elif option == "--exec-path" and eq:
            yield Finding("git-config-command", "git --exec-path runs git's programs from another folder")
        i += 2 if option in _GIT_VALUED_OPTIONS and not eq else 1
    if i < len(args):
        yield from _gitSubcommand(args[i], args[i + 1:])


def _gitSubcommand(sub: str, args: list[str]) -> Iterator[Finding]:
    flags = _flags(args)
    if sub == "push" and ({"f", "--force", "--force-with-lease"} & flags or any(a.startswith("+") for a in args)):
        yield Finding("git-force-push", "force push (rewrites remote history)")
    elif sub == "reset" and "--hard" in flags:
        yield Finding("git-reset-hard", "git reset --hard discards uncommitted work")
    elif sub == "clean" and ({"f", "--force"} & flags):
        yield Finding("git-clean", "git clean -f deletes untracked files")
    elif sub == "branch" and ({"D"} & flags or {"--delete", "--force"} <= flags):
        yield Finding("git-branch-delete", "force-deletes a git branch")
    elif sub == "checkout" and _gitCheckoutDiscards(args):
        yield Finding("git-checkout-discard", "git checkout discards uncommitted changes to files")
    elif sub == "restore" and _gitRestoreDiscards(args, flags):
        yield Finding("git-restore", "git restore discards uncommitted changes to files")
    elif sub == "switch" and {"f", "--force", "--discard-changes"} & flags:
        yield Finding("git-switch-discard", "git switch --discard-changes discards uncommitted work")
    elif sub == "stash" and args[:1] in (["drop"], ["clear"]):
        yield Finding("git-stash-drop", f"git stash {args[0]} deletes stashed work")
    elif (sub == "submodule" and "foreach" in args) or (sub == "bisect" and args[:1] == ["run"]) or (
        sub == "filter-branch" or (sub == "rebase" and ({"x", "--exec"} & flags))
    ):
        yield Finding("git-runs-command", f"runs a shell command through git (git {sub})")
    elif sub == "config":
        key = _gitConfigSets(args)
        if key is not None and not _harmlessGitSetting(key):
            yield Finding("git-config-command", f"git config {key} can make git run a command")


def _looksLikePath(operand: str) -> bool:
    base = operand.rsplit("/", 1)[-1]
    return operand in (".", "..", ":/", "*") or operand.startswith(("./", "../", ":/")) or "*" in operand or (
        "." in base[1:] and base.rpartition(".")[2].isalpha()
    )


def _gitCheckoutDiscards(args: list[str]) -> bool:
    """``git checkout`` of paths (``-- path``, ``.``, a tree and paths) or ``-f``."""
    if "--" in args:
        return len(args) > args.index("--") + 1
    operands: list[str] = []
    creating = skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-b", "-B", "--orphan"):
            creating = skip = True
        elif arg == "--force" or arg.startswith("--pathspec-from-file") or (
            arg.startswith("-") and not arg.startswith("--") and "f" in arg
        ):
            return True
        elif not arg.startswith("-"):
            operands.append(arg)
    return (not creating and len(operands) > 1) or any(_looksLikePath(o) for o in operands)


def _gitRestoreDiscards(args: list[str], flags: set[str]) -> bool:
    """``git restore`` of working-tree files (not ``--staged`` alone)."""
    if ({"S", "--staged"} & flags) and not ({"W", "--worktree"} & flags):
        return False
    valued = {"-s", "--source"}
    operands = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    return bool(operands) or any(a.startswith("--pathspec-from-file") for a in args)


def _gitConfigSets(args: list[str]) -> str | None:
    """The key a ``git config`` command line sets, if it sets one."""
    if any(a in _GIT_CONFIG_READS or a.startswith("--get") for a in args):
        return None
    valued = {"-f", "--file", "--blob", "--type", "--default", "--comment"}
    operands = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    if operands[:1] in (["set"], ["add"]):
        operands = operands[1:]
    return operands[0] if len(operands) >= 2 or "--add" in args else None


def _emptiesOnly(words: list[Word]) -> bool:
    """A command that only empties the file it redirects to (``> f``, ``: > f``)."""
    return [w.text for w in words] in ([], [":"], ["true"], ["cat", "/dev/null"])


@attrs.define
class _Analysis:
    """The findings of one command, with the variables it assigns (a later ``$F``
    may name the file an earlier ``F=`` chose)."""

    assigned: dict[str, str] = attrs.field(factory=dict)
    operands: set[str] = attrs.field(factory=set)  # already looked at by ``secretOperands``

    def text(self, command: str, depth: int) -> Iterator[Finding]:
        for tokens in lex(command):
            for simple in simpleCommands(tokens):
                yield from self.simple(simple, depth)

    def simple(self, simple: Simple, depth: int) -> Iterator[Finding]:
        for operator, target in simple.writes:
            yield from self.write(target, "")
            if operator in _TRUNCATING and _emptiesOnly(simple.words) and not target.text.startswith("/dev/"):
                yield Finding("truncate", f"empties {target.text}")
        yield from self.command(simple.words, simple, depth, [])

    def secretOperands(self, name: str, args: list[str]) -> Iterator[Finding]:
        """A command that names a secret file: the sandbox hides only the home
        folder's secrets, not a project's ``.env`` or key files."""
        for arg in args:
            operand = arg.partition("=")[2] if arg.startswith("-") else arg
            if operand and not operand.startswith("-") and operand not in self.operands:
                self.operands.add(operand)
                kind = secretKind(os.path.expanduser(operand))
                if kind is not None:
                    yield Finding("uses-secret", f"{name} uses {kind} ({operand})")

    def expand(self, word: Word) -> tuple[str, bool]:
        """A word's text with the variables this command assigned (and HOME, PWD)
        filled in, and whether something computed is left in it."""
        if not word.computed:
            return word.text, False
        text = _VARIABLE.sub(self.variable, word.text)
        return text, "$" in text or "`" in text

    def variable(self, match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return self.assigned.get(name, _KNOWN_VARIABLES.get(name, match.group()))

    def write(self, target: Word, program: str) -> Iterator[Finding]:
        """A file a redirection or a ``program`` writes."""
        path, computed = self.expand(target)
        writes = f"{program} writes" if program else "writes"
        if _DISK.match(path):
            yield Finding("disk-write", f"overwrites the disk device {path}", hard=True)
        kind = _sensitiveTarget(path)
        if kind:
            yield Finding(f"write-sensitive:{kind}", f"{writes} to {kind} ({target.text})")
        elif computed:
            yield Finding("write-computed", f"{writes} to a path computed at run time ({target.text})")

    def payload(self, code: str, computed: bool, depth: int) -> Iterator[Finding]:
        """Shell code a command runs (``sh -c``, ``eval``, ``su -c`` ...): code computed at run time asks."""
        if computed:
            yield _COMPUTED
        yield from self.text(code, depth + 1)

    def assignment(self, word: Word, depth: int) -> Iterator[Finding]:
        found = ASSIGNMENT.match(word.text)
        assert found is not None
        name, value = found.group(1), word.text[found.end():]
        self.assigned[name] = self.expand(Word(value, word.computed))[0]
        if name in _COMMAND_VARIABLES:
            yield from self.payload(value, word.computed, depth)
        elif _GIT_CONFIG_VARIABLE.fullmatch(name):
            yield Finding("git-config-command", f"{name} can make git run a command")

    def command(self, words: list[Word], simple: Simple, depth: int, prefixes: list[str]) -> Iterator[Finding]:
        """``words`` run as a command: assignments and wrappers first, then the program."""
        if depth > _MAX_DEPTH:
            yield _TOO_NESTED
            return
        i = 0
        while i < len(words):
            word = words[i]
            if ASSIGNMENT.match(word.text):
                yield from self.assignment(word, depth)
                i += 1
                continue
            if word.text in KEYWORDS:
                i += 1
                continue
            problem = _computedWord(word)
            if problem is not None:
                yield problem
                return
            name = os.path.basename(word.text)
            wrapper = WRAPPERS.get(name)
            if wrapper is None:
                yield from self.program(name, words[i + 1:], simple, depth, prefixes)
                return
            prefixes.append(name)
            if name in _AS_ROOT:
                yield Finding("sudo", _AS_ROOT[name])
            if name in _SERVICES:
                yield _serviceFinding(name)
            script = scriptOption(wrapper, words, i + 1)
            if script is not None:
                yield from self.script(wrapper, words, script, depth)
                return
            start = wrapped(wrapper, words, i)
            if wrapper.joins:
                yield from self.joined(name, words[start:] if start is not None else [], depth)
                return
            if start is None:
                return
            i = start

    def script(self, wrapper: Wrapper, words: list[Word], script: tuple[Word, int], depth: int
               ) -> Iterator[Finding]:
        """A wrapper's shell-command option (and, for ``env -S``, the words after it)."""
        code, after = script
        rest = words[after:] if wrapper.appends else []
        text = " ".join([code.text, *(shlex.quote(w.text) for w in rest)])
        yield from self.payload(text, code.computed or any(w.computed for w in rest), depth)

    def joined(self, name: str, words: list[Word], depth: int) -> Iterator[Finding]:
        """``watch`` and ``parallel`` join their words (up to ``:::``) into one shell command."""
        end = next((k for k, w in enumerate(words) if w.text.startswith(":::")), len(words))
        if end == 0 and name == "parallel":
            yield Finding("stdin-program", "runs commands parallel reads from its input")
        if end:
            part = words[:end]
            yield from self.payload(" ".join(w.text for w in part), any(w.computed for w in part), depth)

    def program(self, name: str, args: list[Word], simple: Simple, depth: int, prefixes: list[str]
                ) -> Iterator[Finding]:
        """The program ``name`` run with ``args``: its own rules, the files it writes, what it runs."""
        texts = [w.text for w in args]
        yield from _programFindings(name, texts, prefixes)
        yield from self.secretOperands(name, texts)
        yield from self.programWrites(name, args)
        if simple.pipedFrom and isInterpreter(name):
            source = resolvedName(simple.pipedFrom)
            if source in DOWNLOADERS:
                yield Finding("pipe-to-shell", f"pipes a download ({source}) into {name}")
            elif source in DECODERS:
                yield Finding("decode-to-shell", f"pipes decoded data ({source}) into {name}")
        yield from self.runs(name, args, simple, depth)

    def programWrites(self, name: str, args: list[Word]) -> Iterator[Finding]:
        if name not in _WRITERS:
            return
        operands = [w for w in args if not w.text.startswith("-")]
        flags = _flags([w.text for w in args])
        if name == "sed":
            operands = sedParts(args)[1] if "i" in flags or "--in-place" in flags else []
        elif name in {"cp", "mv", "install", "ln"}:
            operands = operands[-1:]
        elif name != "tee" and "i" not in flags:
            return
        for target in operands:
            yield from self.write(target, name)

    def runs(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        """What a program runs in its turn: shell code, inline code, a command in its arguments."""
        language = languageOf(name)
        runner = _RUNNERS.get(name)
        if name in SHELLS:
            yield from self.shell(name, args, simple, depth)
        elif language is not None:
            mode, script = interpreterSource(language, args)
            if mode == "inline":
                yield Finding(f"inline-code:{language.name.lower()}", f"runs inline {language.name} code")
            yield from _stdinProgram(name, mode, script, simple)
        elif runner is not None:
            yield from runner(self, name, args, simple, depth)
        elif name not in _INERT and name not in _RULED and not name.startswith("mkfs"):
            yield from self.anyCommand(args, simple, depth)

    def shell(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        mode, code = shellSource(args)
        if mode != "inline":
            yield from _stdinProgram(name, mode, code, simple)
        elif code is None:
            yield _COMPUTED
        else:
            yield from self.payload(code.text, code.computed, depth)

    def anyCommand(self, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        """An unknown program: a destructive program, shell or interpreter among its
        words is taken as the command it runs (``uv run rm -rf x``)."""
        for k, word in enumerate(args):
            name = os.path.basename(word.text)
            if name in _DESTRUCTIVE or name.startswith("mkfs") or isInterpreter(name):
                yield from self.command(args[k:], simple, depth + 1, [])
                return

    def evaluate(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        yield from self.payload(" ".join(w.text for w in args), any(w.computed for w in args), depth)

    def trap(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        args = args[1:] if args[:1] and args[0].text == "--" else args
        if args and not args[0].text.startswith("-"):
            yield from self.payload(args[0].text, args[0].computed, depth)

    def alias(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        for word in args:
            _, eq, value = word.text.partition("=")
            if eq:
                yield from self.payload(value, word.computed, depth)

    def declare(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        for word in args:
            if ASSIGNMENT.match(word.text):
                yield from self.assignment(word, depth)

    def source(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        mode, script = scriptOrStdin(args, 0)
        yield from _stdinProgram(name, mode, script, simple)

    def find(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        """``find``: ``-delete``, the commands of ``-exec`` and friends, the files
        ``-fprint`` writes, and arguments computed at run time (one may become ``-delete``)."""
        expanded = [self.expand(w) for w in args]
        texts = [text for text, _ in expanded]
        commands = list(_findCommands(args))
        if "-delete" in texts or any(resolvedName(words) == "rm" for words in commands):
            yield Finding("find-delete", "deletes the files find matches")
        if any(computed for _, computed in expanded) or any(_GLOB.search(w.bare) for w in args):
            yield Finding("find-computed", "find has an argument computed at run time (it may become -delete)")
        for k, text in enumerate(texts[:-1]):
            if text in _FIND_WRITES:
                yield from self.write(args[k + 1], "find")
        for words in commands:
            yield from self.command(words, NO_REDIRECTS, depth + 1, ["find"])

    def sqlite(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        """``sqlite3`` on the agent's own database, and its ``.shell`` command."""
        for word in args:
            if os.path.basename(word.text) == "state.db":
                yield Finding("agent-database", "opens the agent's own database (state.db)")
            shell = _SQLITE_SHELL.match(word.text)
            if shell is not None:
                yield from self.payload(word.text[shell.end():], word.computed, depth)

    def debugger(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        texts = [w.text for w in args]
        if any(t.split("=", 1)[0] in _GDB_COMMANDS for t in texts):
            yield Finding("inline-code:gdb", "runs inline gdb code")
        if "--args" in texts:
            yield from self.command(args[texts.index("--args") + 1:], NO_REDIRECTS, depth + 1, [])

    def awk(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        if any(awkRuns(program) for program in awkPrograms([w.text for w in args])):
            yield Finding("inline-code:awk", "runs inline awk code that starts commands")

    def sed(self, name: str, args: list[Word], simple: Simple, depth: int) -> Iterator[Finding]:
        if "--sandbox" not in (w.text for w in args) and any(sedRuns(s) for s in sedParts(args)[0]):
            yield Finding("inline-code:sed", "runs inline sed code that runs commands or writes files")


_Runner = Callable[[_Analysis, str, list[Word], Simple, int], Iterator[Finding]]
_RUNNERS: dict[str, _Runner] = {
    "eval": _Analysis.evaluate, "trap": _Analysis.trap, "alias": _Analysis.alias,
    "export": _Analysis.declare, "declare": _Analysis.declare, "typeset": _Analysis.declare,
    "local": _Analysis.declare, "readonly": _Analysis.declare,
    "source": _Analysis.source, ".": _Analysis.source, "find": _Analysis.find, "sqlite3": _Analysis.sqlite,
    "gdb": _Analysis.debugger, "awk": _Analysis.awk, "gawk": _Analysis.awk, "mawk": _Analysis.awk,
    "nawk": _Analysis.awk, "sed": _Analysis.sed,
}


def _findCommands(args: list[Word]) -> Iterator[list[Word]]:
    """The commands of ``find``'s ``-exec``, ``-execdir``, ``-ok`` and ``-okdir`` (up to ``;`` or ``{} +``)."""
    i = 0
    while i < len(args):
        if args[i].text in _FIND_EXEC:
            end = i + 1
            while end < len(args) and args[end].text != ";" and not (
                args[end].text == "+" and args[end - 1].text == "{}"
            ):
                end += 1
            yield args[i + 1:end]
            i = end
        i += 1


def check(command: str) -> tuple[Finding | None, list[Finding]]:
    """Return (hard block, dangerous findings) for a command."""
    if len(command) > MAX_COMMAND_CHARS:
        return None, [Finding("too-long", "command too long to check")]
    found: list[Finding] = []
    if _forkBomb(command):
        found.append(Finding("fork-bomb", "fork bomb", hard=True))
    if "<(" in command and re.search(r"\b(ba|z|k|da)?sh\s+<\(\s*(curl|wget)\b", command):
        found.append(Finding("pipe-to-shell", "runs a downloaded script"))
    if _SQL.search(command) or _unboundedSql(command):
        found.append(Finding("sql-destructive", "destructive SQL statement"))
    try:
        found += _Analysis().text(command, 0)
    except TooNested:
        found.append(_TOO_NESTED)
    hard = next((finding for finding in found if finding.hard), None)
    if hard is not None:
        return hard, []
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.key, finding)
    return None, list(unique.values())


def _unconfinedFindings(command: str, confined: bool, escalation: str | None, cwd: str | None) -> list[Finding]:
    """What running ``command`` without the OS sandbox adds; the key is this command's own."""
    if confined:
        return []
    key = f"unconfined:{command}"
    if escalation is not None:
        return [Finding(key, f"runs outside the sandbox: {escalation}")]
    if readonly.isReadOnly(command, cwd):
        return []
    return [Finding(key, "runs without a sandbox and is not a known read-only command")]


@attrs.define(eq=False)
class CommandApprovals:
    """One session's memory of command answers (allow_always and reject_always)."""

    allowed: set[str] = attrs.field(factory=set)
    refused: set[str] = attrs.field(factory=set)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def decide(self, command: str, question: Callable[[str, str], str] | None, confined: bool = True,
               escalation: str | None = None, cwd: str | None = None) -> Verdict:
        """Check ``command``; ask the user (``question(command, reason)``) when needed.

        ``confined`` says the command runs in the OS sandbox. One that does not
        asks unless it is a known read-only command (``readonly.isReadOnly``), and
        an answer for always then covers that very command only; ``escalation``,
        the model's reason for leaving the sandbox (read when not ``confined``),
        asks even for a read-only command; ``cwd`` is where it runs (its
        relative operands are judged there). Hard blocks never run.
        """
        hard, findings = check(command)
        if hard is not None:
            return Verdict(
                False, f"BLOCKED: this command is never allowed ({hard.reason}). Do not try to run it another way."
            )
        findings = [*_unconfinedFindings(command, confined, escalation, cwd), *findings]
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
