"""Commands known to only read: what may run without a sandbox and without asking.

:func:`isReadOnly` is true only for a command built from known read-only
programs joined by ``|``, ``&&``, ``||``, ``;`` and newlines. The command is
parsed, not pattern-matched: a small quote-aware scanner cuts it into words,
and anything that could make it run or write something else disqualifies it —
outside quotes any of ``$ ` ( ) { } < > * ? [ ] ~ ! # \\``, a single ``&``,
a redirection; inside double quotes ``$``, a backtick or ``\\`` (single
quotes are literal). So a substitution, a variable, a redirection, a glob (it
can expand to ``-delete``), a brace, a subshell or a background job is never
read-only. The command word must be a bare name on the list (no ``/``; a
``NAME=value`` before it is not one). The programs, and what disqualifies them:

- any arguments: ``ls cat head tail wc pwd echo printf true false grep egrep
  fgrep stat du df diff cmp basename dirname realpath readlink which whoami id
  uname nproc uptime ps cut tr seq``;
- ``rg``: not ``--pre``, ``--pre-glob``, ``-z``/``--search-zip`` (they run
  programs), ``--hostname-bin``;
- ``find``: not ``-exec -execdir -ok -okdir -delete -fprint -fprint0 -fprintf -fls``;
- ``file``: not ``-C``/``--compile``; ``tree``: not ``-o``, ``-R``;
- ``sort``: not ``-o``/``--output``, ``--compress-program``;
- ``date``: not ``-s``/``--set``, and no operand but a ``+FORMAT``;
- ``uniq``: at most one file operand (a second one is written);
- ``hostname``: no arguments; ``printenv``: variable names only;
- ``ps``: no BSD-style word with ``e`` (``ps eww`` prints other processes' environments);
- ``git`` with no global option but ``--no-pager``, ``--no-optional-locks``,
  ``--no-replace-objects``, ``--literal-pathspecs`` (so no ``-C``, ``--git-dir``,
  ``--work-tree``, ``-c``, ``--config-env``, ``--exec-path``, ``--namespace``, ``-p``:
  git is never pointed at another repository or configuration), and one of ``status log
  diff show blame rev-parse ls-files describe`` (not ``--output``, ``--ext-diff``,
  ``--textconv``), ``branch`` listing (``-a -r -v -vv --list --all --remotes
  --verbose --show-current``), ``remote`` or ``remote -v``, ``tag`` or ``tag
  -l PATTERN...``, ``config`` with ``--get``, ``--get-all``, ``--get-regexp``,
  ``--list``/``-l``; and only where the repository's own configuration (``.git/config``,
  ``config.worktree`` and what they include; the model can write them) sets no key
  that makes git run a program or read elsewhere (:data:`GIT_COMMAND_KEYS`: fsmonitor,
  pagers, external diffs, textconv, filters, hooks, aliases, credential helpers, ssh and
  gpg programs, editors, ``core.worktree``). Such a command then runs with
  :data:`GIT_SAFE_ENV`, which turns the fsmonitor, hooks and pagers off whatever the
  configuration says by the time it runs.

An operand (or an option's ``=value``, or a value joined to a short option:
``file -m/home/u/.ssh/id_rsa`` prints the key line by line in its warnings) that
names a secret (``~/.ssh/id_rsa``, a ``.env`` file, ...) disqualifies too. A long option counts by any abbreviation
getopt would take (``--out`` is ``--output``). A ``NAME=value`` prefix (``GIT_DIR=x
git status``, ``LESSOPEN=... cat``, ``PAGER=...``) is not a command word on the list,
so such a command is never read-only. Left out on purpose, each because it can run
or write something: ``less more man`` (``LESSOPEN``, ``!cmd``, ``MANPAGER``, ``-P``),
``env xargs`` (they run their argument), ``tee xxd tar sed awk``, ``git grep`` (``-O``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping

import attrs

from hermes_acp.engine.sensitive import hiddenPaths, inside, secretKind

# A blank, a quoted string with nothing that expands, an operator, or plain characters.
_TOKEN = re.compile(r"""(?P<blank>[ \t]+)|'(?P<single>[^']*)'|"(?P<double>[^"$`\\]*)"|(?P<op>&&|\|\||[|;\n])"""
                    r"""|(?P<plain>[^ \t\n'"|;&$`\\(){}<>*?\[\]~!#]+)""")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _commands(command: str) -> list[list[str]] | None:
    """The words of each simple command, or None when the text is not plain words and operators."""
    commands: list[list[str]] = []
    words: list[str] = []
    word: list[str] | None = None
    pending = False  # an operator (| && ||) waits for its command
    pos = 0
    while pos < len(command):
        token = _TOKEN.match(command, pos)
        if token is None:
            return None
        pos = token.end()
        kind = token.lastgroup
        if kind in ("single", "double", "plain"):
            word = [] if word is None else word
            word.append(token.group(kind))
            continue
        if word is not None:
            words.append("".join(word))
            word = None
        if kind == "op":
            operator = token.group()
            if words:
                commands.append(words)
                words, pending = [], operator not in (";", "\n")
            elif operator != "\n":
                return None
    if word is not None:
        words.append("".join(word))
    if words:
        commands.append(words)
    elif pending:
        return None
    return commands


@attrs.frozen
class _Rules:
    """What makes a program's command line more than a read: short option
    ``letters``, ``long`` options (by any abbreviation) and exact ``words``."""

    letters: str = ""
    long: tuple[str, ...] = ()
    words: frozenset[str] = frozenset()

    def allows(self, args: list[str]) -> bool:
        options = True
        for arg in args:
            if arg in self.words:
                return False
            if arg == "--":
                options = False
            elif options and arg.startswith("--"):
                name = arg.partition("=")[0]
                if any(option.startswith(name) for option in self.long):
                    return False
            elif options and arg.startswith("-") and any(letter in self.letters for letter in arg[1:]):
                return False
        return True


_ANY = _Rules()
_GIT_READ = _Rules(long=("--output", "--ext-diff", "--textconv"))
_DATE = _Rules(letters="s", long=("--set",))
_Check = Callable[[list[str]], bool]


def _date(args: list[str]) -> bool:
    valued = {"-d", "-f", "-r", "--date", "--file", "--reference"}
    operands = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    return _DATE.allows(args) and all(a.startswith("+") for a in operands)


def _uniq(args: list[str]) -> bool:
    valued = {"-f", "-s", "-w", "--skip-fields", "--skip-chars", "--check-chars"}
    if "--" in args:
        return False
    operands = [a for i, a in enumerate(args)
                if (not a.startswith("-") or a == "-") and (i == 0 or args[i - 1] not in valued)]
    return len(operands) <= 1


def _ps(args: list[str]) -> bool:
    """No BSD-style word with ``e`` (a value of a dashed option such as ``-o user`` is not one)."""
    valued = {"-o", "-O", "-p", "-q", "-u", "-U", "-g", "-G", "-t", "-C", "-s", "-k", "--format", "--sort",
              "--pid", "--ppid", "--quick-pid", "--user", "--User", "--group", "--Group", "--tty", "--sid"}
    return not any("e" in a and not a.startswith("-") and (i == 0 or args[i - 1] not in valued)
                   for i, a in enumerate(args))


def _printenv(args: list[str]) -> bool:
    return all(a in ("-0", "--null") or _VARIABLE_NAME.fullmatch(a) for a in args)


def _gitBranch(args: list[str]) -> bool:
    return set(args) <= {"-a", "-r", "-v", "-vv", "--list", "--all", "--remotes", "--verbose", "--show-current"}


def _gitTag(args: list[str]) -> bool:
    return not args or (args[0] in ("-l", "--list") and not any(a.startswith("-") for a in args[1:]))


def _gitConfig(args: list[str]) -> bool:
    reads = {"--get", "--get-all", "--get-regexp", "--list", "-l"}
    scopes = {"--global", "--local", "--system", "--show-origin", "--show-scope", "--name-only", "-z", "--null"}
    options = [a for a in args if a.startswith("-")]
    operands = len(args) - len(options)
    if not (reads & set(options)) or not set(options) <= reads | scopes:
        return False
    return operands == 0 if {"--list", "-l"} & set(options) else operands <= 2


_GIT: dict[str, _Check] = {
    **{sub: _GIT_READ.allows for sub in ("status", "log", "diff", "show", "blame", "rev-parse", "ls-files",
                                         "describe")},
    "branch": _gitBranch, "tag": _gitTag, "config": _gitConfig,
    "remote": lambda args: args in ([], ["-v"], ["--verbose"]),
}
_GIT_GLOBALS = {"--no-pager", "--no-replace-objects", "--literal-pathspecs", "--no-optional-locks"}
#: Keys (as ``git config --list`` names them: lower-case section and name) that make
#: git run a program, or look at files elsewhere, when the repository's own
#: configuration sets them.
GIT_COMMAND_KEYS = re.compile(
    r"core\.(fsmonitor|pager|hookspath|editor|askpass|sshcommand|gitproxy|worktree|alternaterefscommand)"
    r"|pager\..+|alias\..+|diff\.external|diff\..+\.(command|textconv)|filter\..+\.(clean|smudge|process)"
    r"|credential\..*helper|gpg\..*program|sequence\.editor")
#: The configuration scopes git reports that the user, not the workspace, wrote.
_USER_SCOPES = {"system", "global", "command"}
_GIT_OVERRIDES = (("core.fsmonitor", ""), ("core.hooksPath", os.devnull), ("core.pager", "cat"),
                  ("log.showSignature", "false"))
#: The environment a read-only git runs with: no fsmonitor, no hooks, no pager, no
#: index refresh written back, whatever the configuration says when it runs.
GIT_SAFE_ENV: Mapping[str, str] = {
    "GIT_CONFIG_COUNT": str(len(_GIT_OVERRIDES)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, (key, _) in enumerate(_GIT_OVERRIDES)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, (_, value) in enumerate(_GIT_OVERRIDES)},
    "GIT_PAGER": "cat", "PAGER": "cat", "GIT_OPTIONAL_LOCKS": "0",
}
#: How long reading a repository's configuration may take before the command asks instead.
_GIT_CONFIG_TIMEOUT = 5.0
#: ``core.fsmonitor`` as a boolean: off, or git's own daemon (a path or command is a program).
_BOOLEANS = {"", "false", "no", "off", "0", "true", "yes", "on", "1"}


def _git(args: list[str]) -> bool:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in _GIT_GLOBALS:
            return False
        i += 1
    check = _GIT.get(args[i]) if i < len(args) else None
    return check is not None and check(args[i + 1:])


def gitRunsPrograms(cwd: str) -> str | None:
    """The first key of the repository at ``cwd``'s own configuration that makes
    git run a program or look elsewhere (``GIT_COMMAND_KEYS``), or why the
    configuration could not be read; None when git would run nothing there.

    git itself reads the configuration (``git config --list --show-scope``, which
    runs no program), so includes, ``config.worktree`` and a ``.git`` file that
    points elsewhere count exactly as git counts them. It is started as the
    agent's own (``processes.spawn``): no other thread reaps its exit status."""
    from hermes_acp.engine import processes
    from hermes_acp.engine.secrets import childEnvironment

    try:
        git, mark = processes.spawn(
            ["git", "--no-pager", "config", "--list", "--show-scope", "-z"], cwd,
            {**childEnvironment(), **GIT_SAFE_ENV}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
    except OSError as e:
        return f"git's configuration could not be read ({type(e).__name__})"
    try:
        stdout, _ = git.communicate(timeout=_GIT_CONFIG_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        processes.end(git, mark)
        git.communicate()
        return f"git's configuration could not be read ({type(e).__name__})"
    finally:
        git.wait()
        processes.release(git)
    if git.returncode != 0:
        return "git's configuration could not be read"
    fields = stdout.decode("utf-8", "replace").split("\0")
    for scope, entry in zip(fields[0::2], fields[1::2]):
        key, _, value = entry.partition("\n")
        if scope in _USER_SCOPES or not GIT_COMMAND_KEYS.fullmatch(key.lower()):
            continue
        if key.lower() == "core.fsmonitor" and value.strip().lower() in _BOOLEANS:
            continue
        return key
    return None


_PROGRAMS: dict[str, _Check] = {
    **{name: _ANY.allows for name in (
        "ls", "cat", "head", "tail", "wc", "pwd", "echo", "printf", "true", "false", "grep", "egrep", "fgrep",
        "stat", "du", "df", "diff", "cmp", "basename", "dirname", "realpath", "readlink", "which", "whoami", "id",
        "uname", "nproc", "uptime", "cut", "tr", "seq")},
    "ps": _ps,
    "rg": _Rules(letters="z", long=("--pre", "--pre-glob", "--search-zip", "--hostname-bin")).allows,
    "find": _Rules(words=frozenset({"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0",
                                    "-fprintf", "-fls"})).allows,
    "file": _Rules(letters="C", long=("--compile",)).allows,
    "tree": _Rules(letters="oR").allows,
    "sort": _Rules(letters="o", long=("--output", "--compress-program")).allows,
    "date": _date, "uniq": _uniq, "printenv": _printenv, "git": _git,
    "hostname": lambda args: not args,
}


def isReadOnly(command: str, cwd: str | None = None) -> bool:
    """Whether ``command`` (run in ``cwd``) runs only known read-only programs,
    each in a read-only way, and names none of the user's secrets nor a folder
    that holds one (``engine.sensitive``: reading one always asks); a git only
    where the repository's configuration makes it run no program."""
    where = cwd or os.getcwd()
    commands = _readOnlyCommands(command, where)
    return commands is not None and (not any(words[0] == "git" for words in commands)
                                     or gitRunsPrograms(where) is None)


def safeEnvironment(command: str, cwd: str) -> Mapping[str, str] | None:
    """What a command that runs without the sandbox adds to its environment:
    :data:`GIT_SAFE_ENV` when it is read-only as written (whatever the repository's
    configuration says by now: one planted since the guard read it must not turn
    the safe settings off), else nothing (a git the user let run keeps its hooks)."""
    return GIT_SAFE_ENV if _readOnlyCommands(command, cwd) is not None else None


def _readOnlyCommands(command: str, where: str) -> list[list[str]] | None:
    """The words of ``command``'s simple commands when, as written, it runs only
    read-only programs in a read-only way and names no secret; else None."""
    commands = _commands(command)
    if not commands:
        return None
    if not all(words[0] in _PROGRAMS and _PROGRAMS[words[0]](words[1:]) for words in commands):
        return None
    operands = {os.path.join(where, path) for words in commands for word in words[1:] for path in _named(word)}
    hidden = hiddenPaths()
    if any(secretKind(path) or any(inside(secret, os.path.realpath(path)) for secret in hidden)
           for path in operands):
        return None
    return commands


#: How many letters of a cluster of short options may come before a value joined to it.
_CLUSTER = 16


def _named(word: str) -> list[str]:
    """The paths a word may name: an operand (and, after a colon, the path of
    git's ``REV:PATH``: ``git show HEAD:.env`` prints a committed secret), the
    value of ``--option=value``, or a value joined to short options (``-rf/path``:
    any letter of the cluster may take the rest; the value starts at the latest
    after the first non-letter)."""
    if not word.startswith("-"):
        return [word, path] if (path := word.partition(":")[2]) else [word]  # git's REV:PATH
    if word.startswith("--"):
        return [value] if (value := word.partition("=")[2]) else []
    named = []
    for i in range(2, min(len(word), _CLUSTER + 2)):
        named.append(word[i:])
        if not word[i].isalnum():
            break
    return named
