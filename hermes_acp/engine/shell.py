"""Reading shell text the way ``sh`` does: words (quotes removed, expansions kept
as written, computed words marked) and operators, the command lists of every
substitution, and simple commands with their redirections. The command guard
(``engine.guard``) analyses what this reads; it never runs anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

READ_REDIRECTS = {"<", "<<", "<<-", "<<<", "<&"}
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
SHELLS = {"sh", "bash", "rbash", "zsh", "dash", "ash", "ksh", "mksh", "fish", "csh", "tcsh"}
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac"}
MAX_NESTING = 40  # substitutions and quotes inside each other, as read
PIPES = {"|", "|&"}
WRITE_REDIRECTS = {">", ">>", ">|", "&>", "&>>", ">&", "<>"}
_BLANKS = re.compile(r"[ \t]+")
_PLAIN = re.compile(r"[^ \t\n'\"\\$`;&|()<>]+")
_OPERATOR_START = set("\n;&|()<>")
_WORD_END = {"", " ", "\t", *_OPERATOR_START}
_OPERATOR = re.compile(r"&>>|&>|&&|\|\||\|&|;;&|;;|;&|<<<|<<-|<<|<>|<&|>>|>\||>&|[\n;&|()<>]")
_QUOTED_PLAIN = {'"': re.compile(r'[^"\\$`]+'), "}": re.compile(r"[^}\\$`]+"), "": re.compile(r"[^\\$`]+")}
_ARITHMETIC_PLAIN = re.compile(r"[^()\\$`]+")
_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
_ANSI_C = re.compile(r"(?:[^'\\]|\\.)*", re.S)
_BACKTICK = re.compile(r"(?:[^`\\]|\\.)*", re.S)
_UNESCAPE = re.compile(r"\\([$`\\])")
_FD = re.compile(r"[0-9]+|\{[A-Za-z_][A-Za-z0-9_]*\}")
REDIRECTS = WRITE_REDIRECTS | READ_REDIRECTS


@attrs.frozen
class Word:
    """A word as ``sh`` reads it: ``text`` without its quotes (expansions kept as
    written), whether an expansion or a substitution makes it ``computed``, and
    its unquoted characters (``bare``), where file-name patterns and braces count."""

    text: str
    computed: bool = False
    bare: str = ""


Token = Word | str


class TooNested(Exception):
    """The text nests substitutions and quotes deeper than the guard reads."""


class _Lexer:
    """Reads shell text in one pass. ``lists`` collects the command lists it finds
    (words and operators; a newline is ``;``): each substitution's, then the text's."""

    def __init__(self, text: str, lists: list[list[Token]], nesting: int = 0) -> None:
        self.text = text
        self.pos = 0
        self.lists = lists
        self.nesting = nesting
        self.heredocs: list[tuple[str, bool, bool]] = []  # delimiter, strips tabs, expands
        self.notArithmetic: set[int] = set()

    def nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise TooNested()

    def commandList(self, closing: bool) -> list[Token]:
        """Tokens to the end of the text, or (``closing``) to the ``)`` that closes a ``$(``."""
        self.nest()
        text, tokens, parens = self.text, [], 0
        while True:
            blanks = _BLANKS.match(text, self.pos)
            if blanks:
                self.pos = blanks.end()
            if self.pos >= len(text):
                break
            char = text[self.pos]
            if char == ")" and closing and not parens:
                self.pos += 1
                break
            if char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif char == "\\" and text.startswith("\\\n", self.pos):
                self.pos += 2
            elif char == "(" and text.startswith("((", self.pos) and self.arithmetic(self.pos + 2):
                continue
            elif char not in _OPERATOR_START or text.startswith(("<(", ">("), self.pos):
                self.addWord(tokens)
            else:
                parens += self.operator(tokens)
        self.nesting -= 1
        return tokens

    def addWord(self, tokens: list[Token]) -> None:
        """The word at the position, unless it is a redirection's file descriptor (``2>``)."""
        start = self.pos
        word = self.word()
        if not (self.text[self.pos:self.pos + 1] in ("<", ">") and _FD.fullmatch(self.text, start, self.pos)):
            tokens.append(word)

    def operator(self, tokens: list[Token]) -> int:
        """The operator at the position; returns how it changes the depth of parentheses."""
        operator = _OPERATOR.match(self.text, self.pos)
        assert operator is not None
        self.pos = operator.end()
        op = operator.group()
        tokens.append(";" if op == "\n" else op)
        if op == "\n":
            self.readHeredocs()
        elif op in ("<<", "<<-"):
            self.heredoc(op == "<<-", tokens)
        return {"(": 1, ")": -1}.get(op, 0)

    def heredoc(self, stripsTabs: bool, tokens: list[Token]) -> None:
        """A here-document's delimiter; its body starts after the line ends."""
        blanks = _BLANKS.match(self.text, self.pos)
        if blanks:
            self.pos = blanks.end()
        if self.pos >= len(self.text) or _OPERATOR.match(self.text, self.pos):
            return
        start = self.pos
        word = self.word()
        quoted = any(char in self.text[start:self.pos] for char in "'\"\\")
        self.heredocs.append((word.text, stripsTabs, not quoted))
        tokens.append(word)

    def readHeredocs(self) -> None:
        """The bodies of the line's here-documents: data, but an unquoted delimiter's
        body has its substitutions run, so they are read."""
        pending, self.heredocs = self.heredocs, []
        text = self.text
        for delimiter, stripsTabs, expands in pending:
            start = end = self.pos
            self.pos = len(text)
            while end < len(text):
                newline = text.find("\n", end)
                stop = len(text) if newline < 0 else newline
                line = text[end:stop]
                if (line.lstrip("\t") if stripsTabs else line) == delimiter:
                    self.pos = min(stop + 1, len(text))
                    break
                end = stop + 1
            if expands:
                _Lexer(text[start:end], self.lists, self.nesting).quoted("", [])

    def word(self) -> Word:
        """The word at the position."""
        text, start = self.text, self.pos
        run = _PLAIN.match(text, start)
        if run is not None and text[run.end():run.end() + 1] in _WORD_END:
            self.pos = run.end()
            return Word(run.group(), False, run.group())
        if text.startswith(("<(", ">("), start):
            self.pos += 2
            self.lists.append(self.commandList(closing=True))
            return Word(text[start:self.pos], computed=True)
        parts: list[str] = []
        bare: list[str] = []
        computed = False
        while self.pos < len(text):
            run = _PLAIN.match(text, self.pos)
            char = text[self.pos]
            if run:
                parts.append(run.group())
                bare.append(run.group())
                self.pos = run.end()
            elif char == "'":
                end = text.find("'", self.pos + 1)
                end = len(text) if end < 0 else end
                parts.append(text[self.pos + 1:end])
                self.pos = end + 1
            elif char == '"':
                self.pos += 1
                computed = self.quoted('"', parts) or computed
            elif char == "\\":
                parts.append(text[self.pos + 1:self.pos + 2].replace("\n", ""))
                self.pos += 2
            elif char == "`":
                self.backtick(parts)
                computed = True
            elif char == "$":
                computed = self.dollar(parts, inQuotes=False) or computed
            else:
                break
        return Word("".join(parts), computed, "".join(bare))

    def quoted(self, end: str, parts: list[str]) -> bool:
        """Double-quoted text (``end`` is ``"``), a ``${...}`` (``}``) or a here-document
        body (``""``: to the end) from the position on; appends its characters to
        ``parts`` and says whether it expands anything."""
        self.nest()
        text, plain, computed = self.text, _QUOTED_PLAIN[end], False
        while self.pos < len(text):
            run = plain.match(text, self.pos)
            char = text[self.pos]
            if run:
                parts.append(run.group())
                self.pos = run.end()
            elif char == end:
                self.pos += 1
                break
            elif char == "\\":
                escaped = text[self.pos + 1:self.pos + 2]
                parts.append(escaped.strip("\n") if escaped in '$`"\\\n' else "\\" + escaped)
                self.pos += 2
            elif char == "`":
                self.backtick(parts)
                computed = True
            else:
                computed = self.dollar(parts, inQuotes=True) or computed
        self.nesting -= 1
        return computed

    def dollar(self, parts: list[str], inQuotes: bool) -> bool:
        """The expansion at a ``$``, appended as written; False for a ``$`` that expands nothing."""
        text, start = self.text, self.pos
        follow = text[start + 1:start + 2]
        if follow == "(":
            if not (text.startswith("$((", start) and self.arithmetic(start + 3)):
                self.pos = start + 2
                self.lists.append(self.commandList(closing=True))
        elif follow == "{":
            self.pos = start + 2
            self.quoted("}", [])
        elif follow == "'" and not inQuotes:
            content = _ANSI_C.match(text, start + 2)
            assert content is not None
            self.pos = content.end() + 1
            parts.append(content.group())
            return "\\" in content.group()
        elif follow == '"' and not inQuotes:
            self.pos = start + 2
            return self.quoted('"', parts)
        else:
            name = _PARAMETER.match(text, start + 1)
            if name is None:
                parts.append("$")
                self.pos = start + 1
                return False
            self.pos = name.end()
        parts.append(text[start:self.pos])
        return True

    def arithmetic(self, start: int) -> bool:
        """``$((...))`` or ``((...))`` from ``start``, inside it: True, with the position
        after it, when it closes as arithmetic; False, with the position kept, when
        it turns out to be a command substitution or a subshell (as ``sh`` decides)."""
        if start in self.notArithmetic:
            return False
        self.nest()
        text, saved, found, depth = self.text, self.pos, len(self.lists), 0
        self.pos = start
        while self.pos < len(text):
            run = _ARITHMETIC_PLAIN.match(text, self.pos)
            char = text[self.pos]
            if run:
                self.pos = run.end()
            elif char == "(":
                depth += 1
                self.pos += 1
            elif char == ")" and depth:
                depth -= 1
                self.pos += 1
            elif char == ")":
                if text.startswith("))", self.pos):
                    self.pos += 2
                    break
                self.notArithmetic.add(start)
                del self.lists[found:]
                self.pos = saved
                self.nesting -= 1
                return False
            elif char == "\\":
                self.pos += 2
            elif char == "`":
                self.backtick([])
            else:
                self.dollar([], inQuotes=True)
        self.nesting -= 1
        return True

    def backtick(self, parts: list[str]) -> None:
        """A backtick substitution, read by a lexer of its own (inside it a backslash
        quotes ``$``, a backtick and a backslash)."""
        start = self.pos
        body = _BACKTICK.match(self.text, start + 1)
        assert body is not None
        self.pos = min(body.end() + 1, len(self.text))
        inner = _Lexer(_UNESCAPE.sub(r"\1", body.group()), self.lists, self.nesting)
        self.lists.append(inner.commandList(closing=False))
        parts.append(self.text[start:self.pos])


def lex(text: str) -> list[list[Token]]:
    """The command lists of ``text``: its substitutions' first, its own last."""
    lists: list[list[Token]] = []
    lists.append(_Lexer(text, lists).commandList(closing=False))
    return lists


@attrs.frozen
class Simple:
    """One simple command: its words, its redirections, and the words of the command piped into it."""

    words: list[Word]
    writes: list[tuple[str, Word]] = attrs.Factory(list)
    reads: list[tuple[str, Word]] = attrs.Factory(list)
    pipedFrom: list[Word] | None = None


NO_REDIRECTS = Simple([])


def simpleCommands(tokens: list[Token]) -> Iterator[Simple]:
    segment: list[Token] = []
    previous: list[Word] | None = None
    piped = False
    for token in [*tokens, ";"]:
        if isinstance(token, Word) or token in REDIRECTS:
            segment.append(token)
        elif segment:
            simple = _parseSimple(segment, previous if piped else None)
            yield simple
            previous, segment, piped = simple.words, [], token in PIPES
        elif token != "(":
            piped = token in PIPES


def _parseSimple(tokens: list[Token], pipedFrom: list[Word] | None) -> Simple:
    simple = Simple([], pipedFrom=pipedFrom)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        target = tokens[i + 1] if i + 1 < len(tokens) else None
        i += 1
        if isinstance(token, Word):
            simple.words.append(token)
        elif isinstance(target, Word):
            i += 1
            if token in (">&", "<&") and (target.text.isdigit() or target.text == "-"):
                continue
            (simple.writes if token in WRITE_REDIRECTS else simple.reads).append((token, target))
    return simple
