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
- ``git`` with no global option but ``-C DIR``, ``--git-dir=``, ``--work-tree=``,
  ``--no-pager`` (so no ``-c``, ``--exec-path``, ``-p``), and one of ``status log
  diff show blame rev-parse ls-files describe`` (not ``--output``, ``--ext-diff``,
  ``--textconv``), ``branch`` listing (``-a -r -v -vv --list --all --remotes
  --verbose --show-current``), ``remote`` or ``remote -v``, ``tag`` or ``tag
  -l PATTERN...``, ``config`` with ``--get``, ``--get-all``, ``--get-regexp``,
  ``--list``/``-l``.

An operand that names a secret (``~/.ssh/id_rsa``, a ``.env`` file, ...)
disqualifies too. A long option counts by any abbreviation getopt would take (``--out`` is
``--output``). ``env`` is left out on purpose: it runs its argument.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

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


def _git(args: list[str]) -> bool:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "-C":
            i += 1
        elif args[i] not in _GIT_GLOBALS and not args[i].startswith(("--git-dir=", "--work-tree=")):
            return False
        i += 1
    check = _GIT.get(args[i]) if i < len(args) else None
    return check is not None and check(args[i + 1:])


_PROGRAMS: dict[str, _Check] = {
    **{name: _ANY.allows for name in (
        "ls", "cat", "head", "tail", "wc", "pwd", "echo", "printf", "true", "false", "grep", "egrep", "fgrep",
        "stat", "du", "df", "diff", "cmp", "basename", "dirname", "realpath", "readlink", "which", "whoami", "id",
        "uname", "nproc", "uptime", "ps", "cut", "tr", "seq")},
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
    that holds one (``engine.sensitive``: reading one always asks)."""
    commands = _commands(command)
    if not commands:
        return False
    if not all(words[0] in _PROGRAMS and _PROGRAMS[words[0]](words[1:]) for words in commands):
        return False
    operands = {os.path.join(cwd or os.getcwd(), word) for words in commands for word in words[1:]
                if not word.startswith("-")}
    hidden = hiddenPaths()
    return not any(secretKind(path) or any(inside(secret, os.path.realpath(path)) for secret in hidden)
                   for path in operands)
