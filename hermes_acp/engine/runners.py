"""Programs that run other programs: wrappers that run their argument (``sudo``,
``nice``, ``timeout``, ``flock``, ``xargs`` ...: ``WRAPPERS``, with how each
skips its own options), and interpreters and their inline code (``python -c``,
``perl -e``, awk programs that start commands, ``sed`` with ``e`` or ``w``).
Used by the command guard (``engine.guard``) to find the command a command runs.
"""

from __future__ import annotations

import os
import re

import attrs

from hermes_acp.engine.shell import ASSIGNMENT, KEYWORDS, SHELLS, Word

DECODERS = {"base64", "base32", "xxd", "openssl"}
DOWNLOADERS = {"curl", "wget", "fetch"}
STDIN_PATHS = {"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"}
_VERSIONED = re.compile(r"(python|pypy|perl|ruby|php|lua|node)[0-9.]*")
_AWK_COMMAND = re.compile(r"\bsystem\s*\(|\|\s*getline|\|&|\|\s*\"")
_AWK_STATEMENT = re.compile(r"[^;{}\n]+")
_AWK_VALUED = set("fvFeEilW")
_AWK_LONG = {"--source": "e", "--file": "f", "--exec": "f", "--assign": "v", "--field-separator": "F",
             "--include": "i", "--load": "l"}
_SED_FLAGS = re.compile(r"[0-9gpiImMew]*")




@attrs.frozen
class Wrapper:
    """How a command that runs another finds it: the short options (``valued``
    letters) and long options that take a value in the next word, how many
    ``operands`` come before the command, the options that mean no command runs
    (``stops``), and the options whose value is a whole shell command (``script``
    letters and ``scriptLong``; ``permutes``: they may follow the operands;
    ``appends``: the remaining words follow that command, as for ``env -S``).
    After a ``direct`` option the command follows with no operand (``runuser -u``);
    ``joins``: the command's words are joined into one shell command (``watch``)."""

    valued: str = ""
    valuedLong: frozenset[str] = frozenset()
    operands: int = 0
    stops: str = ""
    script: str = ""
    scriptLong: frozenset[str] = frozenset()
    permutes: bool = False
    appends: bool = False
    direct: str = ""
    joins: bool = False


def _long(*names: str) -> frozenset[str]:
    return frozenset(names)


WRAPPERS = {
    "sudo": Wrapper(valued="ugCDhprtURT", stops="elvVK", valuedLong=_long(
        "--user", "--group", "--chdir", "--host", "--prompt", "--role", "--type", "--close-from", "--other-user",
        "--chroot", "--command-timeout")),
    "doas": Wrapper(valued="uC"),
    "pkexec": Wrapper(valuedLong=_long("--user")),
    "su": Wrapper(valued="gGsw", operands=1, script="c", scriptLong=_long("--command", "--session-command"),
                   permutes=True, valuedLong=_long("--group", "--supp-group", "--shell", "--whitelist-environment")),
    "runuser": Wrapper(valued="gGswu", operands=1, direct="u", script="c", permutes=True,
                        scriptLong=_long("--command", "--session-command"),
                        valuedLong=_long("--user", "--group", "--supp-group", "--shell")),
    "env": Wrapper(valued="uC", valuedLong=_long("--unset", "--chdir"), script="S",
                    scriptLong=_long("--split-string"), appends=True),
    "exec": Wrapper(valued="a"),
    "command": Wrapper(stops="vV"),
    "builtin": Wrapper(), "nohup": Wrapper(), "setsid": Wrapper(), "unbuffer": Wrapper(),
    "catchsegv": Wrapper(), "valgrind": Wrapper(), "firejail": Wrapper(), "busybox": Wrapper(),
    "toybox": Wrapper(),
    "time": Wrapper(valued="fo", valuedLong=_long("--format", "--output")),
    "nice": Wrapper(valued="n", valuedLong=_long("--adjustment")),
    "ionice": Wrapper(valued="cn", stops="pPu", valuedLong=_long("--class", "--classdata")),
    "timeout": Wrapper(valued="sk", operands=1, valuedLong=_long("--signal", "--kill-after")),
    "stdbuf": Wrapper(valued="ioe", valuedLong=_long("--input", "--output", "--error")),
    "chroot": Wrapper(operands=1, valuedLong=_long("--userspec", "--groups")),
    "taskset": Wrapper(operands=1, stops="p"),
    "flock": Wrapper(valued="wE", operands=1, script="c", scriptLong=_long("--command"), permutes=True,
                      valuedLong=_long("--timeout", "--wait", "--conflict-exit-code")),
    "chrt": Wrapper(valued="TPD", operands=1, stops="pm",
                     valuedLong=_long("--sched-runtime", "--sched-period", "--sched-deadline")),
    "strace": Wrapper(valued="abeEIoOpPsSuUX", valuedLong=_long("--output", "--attach", "--user", "--env")),
    "ltrace": Wrapper(valued="aAeEDFIlnopsuwx", valuedLong=_long("--output")),
    "watch": Wrapper(valued="nq", joins=True, valuedLong=_long("--interval", "--equexit")),
    "script": Wrapper(valued="EIOTBm", operands=1, script="c", scriptLong=_long("--command"), permutes=True,
                       valuedLong=_long("--echo", "--log-in", "--log-out", "--log-io", "--log-timing",
                                        "--logging-format")),
    "unshare": Wrapper(valued="SGRw", valuedLong=_long("--setuid", "--setgid", "--root", "--wd")),
    "nsenter": Wrapper(valued="tSG", valuedLong=_long("--target", "--setuid", "--setgid")),
    "prlimit": Wrapper(valued="p", valuedLong=_long("--pid")),
    "numactl": Wrapper(valued="CNmpiP", valuedLong=_long("--physcpubind", "--cpunodebind", "--membind",
                                                           "--preferred", "--interleave")),
    "cgexec": Wrapper(valued="g"),
    "faketime": Wrapper(operands=1),
    "parallel": Wrapper(valued="jSdEIaNnPLs", joins=True, valuedLong=_long(
        "--jobs", "--sshlogin", "--delimiter", "--arg-file", "--joblog", "--results", "--tmpdir", "--timeout",
        "--delay", "--max-args", "--max-replace-args", "--max-lines")),
    "systemd-run": Wrapper(valued="pEuMH", valuedLong=_long(
        "--property", "--setenv", "--unit", "--machine", "--host", "--description", "--slice", "--uid", "--gid",
        "--nice", "--working-directory")),
    "xargs": Wrapper(valued="adEILnPs", valuedLong=_long(
        "--arg-file", "--delimiter", "--eof", "--replace", "--max-lines", "--max-args", "--max-procs",
        "--max-chars", "--process-slot-var")),
}


def _optionWords(wrapper: Wrapper, text: str) -> int | None:
    """How many words a wrapper's option takes (1 or 2), or None when it means no command runs."""
    if text.startswith("--"):
        name, eq, _ = text.partition("=")
        return 2 if name in wrapper.valuedLong and not eq else 1
    for k, letter in enumerate(text[1:]):
        if letter in wrapper.stops:
            return None
        if letter in wrapper.valued:
            return 2 if k == len(text) - 2 else 1
    return 1


def wordAt(words: list[Word], i: int) -> tuple[Word, int]:
    """An option's value in the next word (none there: an empty, computed one)."""
    return (words[i], i + 1) if i < len(words) else (Word("", computed=True), i)


def scriptOption(wrapper: Wrapper, words: list[Word], start: int) -> tuple[Word, int] | None:
    """The value of a wrapper's option that is a whole shell command (``su -c``,
    ``env -S``), and where its words end."""
    if not (wrapper.script or wrapper.scriptLong):
        return None
    i, operands = start, wrapper.operands if wrapper.permutes else 0
    while i < len(words):
        text = words[i].text
        name, eq, value = text.partition("=")
        if text == "--" or not text.startswith("-") and not operands:
            return None
        if not text.startswith("-"):
            operands -= 1
        elif text.startswith("--"):
            if name in wrapper.scriptLong:
                return (Word(value, words[i].computed), i + 1) if eq else wordAt(words, i + 1)
            i += name in wrapper.valuedLong and not eq
        else:
            for k, letter in enumerate(text[1:]):
                if letter in wrapper.script:
                    rest = text[k + 2:]
                    return (Word(rest, words[i].computed), i + 1) if rest else wordAt(words, i + 1)
                if letter in wrapper.valued:
                    i += k == len(text) - 2
                    break
        i += 1
    return None


def wrapped(wrapper: Wrapper, words: list[Word], at: int) -> int | None:
    """Where the command that the wrapper ``words[at]`` runs starts (None: it runs none)."""
    i, operands = at + 1, wrapper.operands
    while i < len(words):
        text = words[i].text
        if text == "--":
            i += 1 + operands
            break
        if text.startswith("-"):
            taken = _optionWords(wrapper, text)
            if taken is None:
                return None
            if not text.startswith("--") and any(letter in wrapper.direct for letter in text[1:]):
                operands = 0
            i += taken
        elif operands:
            operands -= 1
            i += 1
        else:
            break
    return i if i < len(words) else None


def resolvedName(words: list[Word]) -> str:
    """The program a simple command runs, past assignments and wrappers ("" if none is known)."""
    i = 0
    while i < len(words):
        text = words[i].text
        if ASSIGNMENT.match(text) or text in KEYWORDS:
            i += 1
            continue
        name = os.path.basename(text)
        wrapper = WRAPPERS.get(name)
        if wrapper is None:
            return name
        start = None if scriptOption(wrapper, words, i + 1) else wrapped(wrapper, words, i)
        if start is None:
            return ""
        i = start
    return ""


@attrs.frozen
class _Language:
    """An interpreter's options: the letters whose value is code (``inline``), those
    that take the next word (``valued``) or only an attached value (``attached``),
    those after which the rest belongs to a module (``ends``, ``python -m``), long
    options whose value is code, and subcommands that run code (``deno eval``)."""

    name: str
    inline: str = ""
    valued: str = ""
    attached: str = ""
    ends: str = ""
    inlineLong: frozenset[str] = frozenset()
    inlineCommands: frozenset[str] = frozenset()


_PYTHON = _Language("Python", inline="c", valued="WXQ", ends="m")
_JAVASCRIPT = _Language("JavaScript", inline="ep", valued="r", inlineLong=_long("--eval", "--print"))
_LANGUAGES = {
    "python": _PYTHON, "pypy": _PYTHON,
    "perl": _Language("Perl", inline="eE", attached="MmIdDxil0C"),
    "ruby": _Language("Ruby", inline="e", valued="ICrE", attached="iFx0KTW"),
    "node": _JAVASCRIPT, "nodejs": _JAVASCRIPT, "bun": _JAVASCRIPT,
    "deno": _Language("JavaScript", inlineCommands=_long("eval")),
    "php": _Language("PHP", inline="rBRE", valued="cdz"),
    "lua": _Language("Lua", inline="e", valued="l"),
    "Rscript": _Language("R", inline="e"),
    "julia": _Language("Julia", inline="eE", inlineLong=_long("--eval", "--print")),
    "osascript": _Language("AppleScript", inline="e"),
}


def languageOf(name: str) -> _Language | None:
    versioned = _VERSIONED.fullmatch(name)
    return _LANGUAGES.get(versioned.group(1) if versioned else name)


def isInterpreter(name: str) -> bool:
    return name in SHELLS or languageOf(name) is not None


def shellSource(args: list[Word]) -> tuple[str, Word | None]:
    """How a shell run with ``args`` gets its program: ("inline", the code word, or
    None when it has none), ("stdin", None) or ("script", the script's word)."""
    inline = stdin = False
    i = 0
    while i < len(args):
        text = args[i].text
        name, eq, value = text.partition("=")
        if text in ("-", "--"):
            i += 1
            break
        if name == "--command":
            return "inline", Word(value, args[i].computed) if eq else wordAt(args, i + 1)[0]
        if text[:1] not in ("-", "+") or len(text) < 2:
            break
        if not text.startswith("--"):
            inline = inline or "c" in text
            stdin = stdin or "s" in text
        valued = name in ("--rcfile", "--init-file") and not eq or text[-1] in "oO" and not text.startswith("--")
        i += 2 if valued else 1
    if inline:
        return "inline", args[i] if i < len(args) else None
    return scriptOrStdin(args, i, stdin)


def scriptOrStdin(args: list[Word], i: int, stdin: bool = False) -> tuple[str, Word | None]:
    if stdin or i >= len(args) or args[i].text == "-" or args[i].text in STDIN_PATHS:
        return "stdin", None
    return "script", args[i]


def interpreterSource(language: _Language, args: list[Word]) -> tuple[str, Word | None]:
    """How an interpreter run with ``args`` gets its program: "inline", "module",
    "stdin" or "script" (with the script's word)."""
    i = 0
    while i < len(args):
        text = args[i].text
        if text == "--":
            i += 1
            break
        if not text.startswith("-") or text == "-":
            break
        if text.partition("=")[0] in language.inlineLong:
            return "inline", None
        for k, letter in enumerate("" if text.startswith("--") else text[1:]):
            if letter in language.inline:
                return "inline", None
            if letter in language.ends:
                return "module", None
            if letter in language.valued or letter in language.attached:
                i += letter in language.valued and k == len(text) - 2
                break
        i += 1
    if i < len(args) and args[i].text in language.inlineCommands:
        return "inline", None
    return scriptOrStdin(args, i)


def awkPrograms(texts: list[str]) -> list[str]:
    """The program texts of an awk command line (none when it reads its program from a file)."""
    programs: list[str] = []
    fromFile, i = False, 0
    while i < len(texts) and texts[i].startswith("-") and texts[i] != "-":
        text = texts[i]
        i += 1
        if text == "--":
            break
        name, eq, value = text.partition("=")
        letter, value = (_AWK_LONG.get(name, ""), value) if text.startswith("--") else (text[1:2], text[2:])
        if letter in _AWK_VALUED and not (value or eq):
            value = texts[i] if i < len(texts) else ""
            i += 1
        if letter == "e":
            programs.append(value)
        fromFile = fromFile or letter in ("f", "E")
    if not programs and not fromFile and i < len(texts):
        programs.append(texts[i])
    return programs


def awkRuns(program: str) -> bool:
    """Whether an awk program starts commands: ``system()``, ``| getline`` or a ``print`` into a pipe."""
    if _AWK_COMMAND.search(program):
        return True
    return any("print" in s and "|" in s.replace("||", "") for s in _AWK_STATEMENT.findall(program))


def sedParts(args: list[Word]) -> tuple[list[str], list[Word]]:
    """A sed command line's scripts and its file operands."""
    scripts: list[str] = []
    operands: list[Word] = []
    explicit, i = False, 0
    while i < len(args):
        text = args[i].text
        name, eq, value = text.partition("=")
        if text == "--":
            operands += args[i + 1:]
            break
        if name in ("--expression", "--file"):
            explicit = True
            script = value if eq else (args[i + 1].text if i + 1 < len(args) else "")
            i += not eq
            if name == "--expression":
                scripts.append(script)
        elif text.startswith("-") and not text.startswith("--") and len(text) > 1:
            for k, letter in enumerate(text[1:]):
                if letter in "efl":
                    script = text[k + 2:] or (args[i + 1].text if i + 1 < len(args) else "")
                    i += not text[k + 2:]
                    explicit = explicit or letter != "l"
                    if letter == "e":
                        scripts.append(script)
                    break
                if letter == "i":
                    break
        elif not text.startswith("-"):
            operands.append(args[i])
        i += 1
    if not explicit and operands:
        scripts.append(operands.pop(0).text)
    return scripts, operands


def _sedDelimited(script: str, i: int, delimiter: str) -> int:
    """The position after the ``delimiter`` that ends a sed regex or replacement starting at ``i``."""
    while i < len(script):
        if script[i] == "\\":
            i += 2
        elif script[i] == delimiter or script[i] == "\n":
            return i + 1
        else:
            i += 1
    return i


def _sedAddress(script: str, i: int) -> int:
    """The position after the addresses (and separators) before a sed command."""
    while i < len(script):
        char = script[i]
        if char in " \t\n;{}!,~+$0123456789":
            i += 1
        elif char == "/":
            i = _sedDelimited(script, i + 1, "/")
        elif char == "\\" and i + 1 < len(script):
            i = _sedDelimited(script, i + 2, script[i + 1])
        else:
            break
    return i


def sedRuns(script: str) -> bool:
    """Whether a sed script runs a command (``e``, ``s///e``) or writes a file (``w``, ``s///w``)."""
    i = 0
    while True:
        i = _sedAddress(script, i)
        if i >= len(script):
            return False
        command = script[i]
        if command in "ewW":
            return True
        if command in "sy" and i + 1 < len(script):
            delimiter = script[i + 1]
            i = _sedDelimited(script, _sedDelimited(script, i + 2, delimiter), delimiter)
            flags = _SED_FLAGS.match(script, i)
            assert flags is not None
            if command == "s" and ("e" in flags.group() or "w" in flags.group()):
                return True
            i = flags.end()
        elif command in "aicrR#:btTvqQlL":
            ends = "\n" if command in "aicrR#" else ";\n"
            i = min((found for found in (script.find(end, i) for end in ends) if found >= 0), default=len(script))
        else:
            i += 1
