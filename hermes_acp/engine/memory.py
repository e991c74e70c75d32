"""Hermes' memory: the agent's notes and the user profile, two small files that outlive sessions.

``$HERMES_HOME/memories/MEMORY.md`` (target ``memory``) and ``USER.md`` (target ``user``) are
Hermes' own files, in Hermes' own format (entries joined by a line holding only ``§``) and
bounded by Hermes' limits in characters (2,200 and 1,375, or config.yaml's
``memory.memory_char_limit`` / ``user_char_limit``), so a Hermes user's memory works here and
what this agent writes works in Hermes.

A session's system prompt gets a snapshot of both (``MemoryStore.snapshot``), taken once and
kept with the session: what the ``memory`` tool writes meanwhile reaches the disk at once and
the prompts of later sessions, never the running one (its prompt stays byte-stable, so the
endpoint's prompt cache holds).

A change is checked against the file, approved, then applied again to the file as it is under
the lock Hermes takes too (``engine.memoryfiles``), so two agents (or this one and Hermes) on one
``$HERMES_HOME`` lose nothing. The user may edit the files by hand: CRLF line ends, blank entries,
duplicates are read leniently; a file that cannot be read as memory (not UTF-8 text, a link to a
secret, far too big) is shown to no one and written by no one until the user fixes it.

No entry holding a secret (``secrets.secretLike``: the user's actual key values, or text shaped
like a key) is written, shown in a prompt, or shown on ``/memory``.

Pure Python (no Twisted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from hermes_acp.config import DEFAULT_MEMORY_LOCK_SECONDS, envFile, privateFolder
from hermes_acp.engine.memoryfiles import (
    TARGETS, MemoryBusy, MemoryFile, Target, fileLock, joined, readMemory, writeAtomically,
)
from hermes_acp.engine.secrets import secretLike, secretValues

log = logging.getLogger(__name__)

DEFAULT_MEMORY_CHARS, DEFAULT_USER_CHARS = 2200, 1375
#: Hermes' actions, and its note on success (the model must not repeat a write).
ACTIONS = ("add", "replace", "remove")
SAVED_NOTE = "Write saved. This update is complete — do not repeat it."
_SEPARATOR = "═" * 46


@attrs.frozen
class MemorySettings:
    """Which files are on and their limits in characters: Hermes' config.yaml ``memory`` section
    (``memory_enabled``, ``user_profile_enabled``, ``memory_char_limit``, ``user_char_limit``),
    under the ``HERMES_ACP_*`` overrides."""

    memory: bool = True
    user: bool = True
    memoryChars: int = DEFAULT_MEMORY_CHARS
    userChars: int = DEFAULT_USER_CHARS
    lockSeconds: float = DEFAULT_MEMORY_LOCK_SECONDS

    def enabled(self, target: str) -> bool:
        return self.memory if target == "memory" else self.user

    def limit(self, target: str) -> int:
        return self.memoryChars if target == "memory" else self.userChars

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(name for name in TARGETS if self.enabled(name))


def _configured(home: Path) -> dict[str, Any]:
    """config.yaml's ``memory`` section (empty when there is none, or it cannot be read: logged)."""
    path = home / "config.yaml"
    if not path.is_file():
        return {}
    import yaml  # PyYAML: only when the user has a config.yaml

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as e:  # ValueError: a date like 2024-02-30
        log.warning("%s could not be read for its memory settings: %s", path, e)
        return {}
    section = document.get("memory") if isinstance(document, dict) else None
    return section if isinstance(section, dict) else {}


def memorySettings(home: Path, memoryChars: int | None = None, userChars: int | None = None,
                   lockSeconds: float = DEFAULT_MEMORY_LOCK_SECONDS) -> MemorySettings:
    """The settings for ``home``: the overrides given (``HERMES_ACP_MEMORY_CHARS``,
    ``HERMES_ACP_USER_CHARS``), else config.yaml's, else Hermes' defaults. A value config.yaml
    gets wrong is logged and left at its default."""
    section = _configured(home)

    def flag(key: str) -> bool:
        value = section.get(key, True)
        if isinstance(value, bool):
            return value
        log.warning("config.yaml: memory.%s must be true or false, not %r; memory stays on", key, value)
        return True

    def chars(key: str, given: int | None, default: int) -> int:
        if given is not None:
            return given
        value = section.get(key, default)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        log.warning("config.yaml: memory.%s must be a whole number of at least 1, not %r; using %d",
                    key, value, default)
        return default

    return MemorySettings(flag("memory_enabled"), flag("user_profile_enabled"),
                          chars("memory_char_limit", memoryChars, DEFAULT_MEMORY_CHARS),
                          chars("user_char_limit", userChars, DEFAULT_USER_CHARS), lockSeconds)


@attrs.frozen
class Operation:
    """One of Hermes' operations: ``add`` (``content``), ``replace`` (``old_text`` → ``content``)
    or ``remove`` (``old_text``); ``old_text`` is a substring of one entry."""

    action: str
    content: str = ""
    oldText: str = ""


class Refused(Exception):
    """An operation that cannot be done; the message is for the model. ``entries`` says whether
    the model should see the current entries to choose again."""

    def __init__(self, message: str, entries: bool = True, **extra: Any) -> None:
        super().__init__(message)
        self.entries = entries
        self.extra = extra


def _preview(entry: str, width: int = 80) -> str:
    return entry[:width] + ("..." if len(entry) > width else "")


def _match(entries: list[str], oldText: str, position: str) -> int:
    """The index of the one entry holding ``oldText`` (several identical ones count as one)."""
    found = [i for i, entry in enumerate(entries) if oldText in entry]
    if not found:
        raise Refused(f"{position}No entry matched {oldText!r}. Check current_entries and retry with "
                      "a unique part of the entry's exact text.")
    if len({entries[i] for i in found}) > 1:
        raise Refused(f"{position}Multiple entries matched {oldText!r}. Be more specific.", entries=False,
                      matches=[_preview(entries[i]) for i in found])
    return found[0]


def applied(entries: Sequence[str], operations: Sequence[Operation], limit: int) -> tuple[list[str], str]:
    """The entries after ``operations``, all or none, and what was done; ``Refused`` says why not.
    The limit is checked on the result only (a batch may free room and fill it): a result over
    the limit is refused unless it is smaller than before (a file edited past its limit by hand
    can still be trimmed)."""
    working = list(entries)
    message = ""
    for number, operation in enumerate(operations, 1):
        position = f"Operation {number} ({operation.action}): " if len(operations) > 1 else ""
        if operation.action == "add":
            if operation.content in working:
                message = "Entry already exists (no duplicate added)."
                continue
            working.append(operation.content)
            message = "Entry added."
        elif operation.action == "replace":
            working[_match(working, operation.oldText, position)] = operation.content
            message = "Entry replaced."
        else:
            working.pop(_match(working, operation.oldText, position))
            message = "Entry removed."
    before, after = len(joined(entries)), len(joined(working))
    if after > limit and after >= before:
        if len(operations) == 1 and operations[0].action == "add":
            problem = (f"Memory at {before:,}/{limit:,} chars. Adding this entry ({len(operations[0].content):,} "
                       "chars) would exceed the limit.")
        else:
            problem = f"The change would put memory at {after:,}/{limit:,} chars, over the limit."
        raise Refused(f"{problem} Consolidate now: 'replace' overlapping entries with shorter ones or "
                      "'remove' stale ones (see current_entries), then retry, in one batch of operations.",
                      usage=f"{before:,}/{limit:,}")
    if len(operations) > 1:
        message = f"Applied {len(operations)} operation(s)."
    return working, message


def usage(chars: int, limit: int) -> str:
    """``45% — 990/2,200 chars``, as Hermes says it."""
    return f"{min(100, chars * 100 // limit) if limit > 0 else 0}% — {chars:,}/{limit:,} chars"


@attrs.frozen
class Change:
    """What a ``MemoryStore.change`` did: the model's answer (Hermes' result object), whether it
    failed, and the file's shown text before and after (for the editor's diff)."""

    reply: dict[str, Any]
    failed: bool
    path: Path | None = None
    oldText: str = ""
    newText: str = ""


def knownSecrets(env: Mapping[str, str] | None = None) -> list[str]:
    """The user's actual secret values: the environment's and those of ``$HERMES_HOME/.env``
    as it is now (``--setup`` in another process may have changed it)."""
    from dotenv import dotenv_values

    found = set(secretValues(env))
    try:
        values = dotenv_values(envFile(env))
    except (OSError, UnicodeDecodeError):
        values = {}
    found |= set(secretValues({k: v for k, v in values.items() if v}))
    return sorted(found, key=len, reverse=True)


#: ``approve(path, oldText, newText)``: None to go on, else why the change was not approved.
Approve = Callable[[Path, str, str], str | None]


@attrs.frozen
class MemoryStore:
    """The two files of one ``$HERMES_HOME`` and their settings."""

    folder: Path
    settings: MemorySettings = MemorySettings()
    #: The user's actual secret values (``secretValues`` of the environment and of ``.env``).
    secrets: Callable[[], list[str]] = knownSecrets

    @classmethod
    def forHome(cls, home: Path, **overrides: Any) -> MemoryStore:
        return cls(home / "memories", memorySettings(home, **overrides))

    def path(self, target: str) -> Path:
        return self.folder / TARGETS[target].fileName

    def read(self, target: str) -> MemoryFile:
        return readMemory(TARGETS[target], self.path(target), self.settings.limit(target))

    def shown(self, file: MemoryFile, secrets: Sequence[str] | None = None) -> list[str]:
        """The entries as anyone may see them: one that holds a secret is replaced by a note."""
        secrets = self.secrets() if secrets is None else secrets
        return [_screened(entry, file.target, secrets) for entry in file.entries]

    # -- the prompt --------------------------------------------------------------------------

    def snapshot(self) -> str:
        """The text the session's system prompt carries: a block per file with entries (Hermes'
        heading and usage), empty when there are none."""
        secrets = self.secrets()
        blocks = [self._block(self.read(target), secrets) for target in self.settings.targets]
        return "\n\n".join(block for block in blocks if block)

    def _block(self, file: MemoryFile, secrets: Sequence[str]) -> str:
        limit = self.settings.limit(file.target.name)
        trouble = (f"[{file.target.fileName} needs the user's attention: {file.problem}. The memory tool "
                   "cannot change it until it is fixed by hand.]") if file.problem else ""
        if not file.entries:
            return f"{_SEPARATOR}\n{file.target.heading}\n{_SEPARATOR}\n{trouble}" if trouble else ""
        content, chars = joined(self.shown(file, secrets)), file.chars
        cap = max(limit * 2, 4000)  # a file edited far past its limit does not flood every prompt
        if len(content) > cap:
            head, tail = int(cap * 0.7), int(cap * 0.2)
            content = (f"{content[:head]}\n\n[... {len(content) - head - tail:,} chars cut: memory is over its "
                       f"limit ({chars:,}/{limit:,}); consolidate with memory(action=remove/replace) ...]\n\n"
                       f"{content[-tail:]}")
        over = " ⚠ OVER BUDGET" if chars > limit else ""
        header = f"{file.target.heading} [{usage(chars, limit)}{over}]"
        return f"{_SEPARATOR}\n{header}\n{_SEPARATOR}\n{content}" + (f"\n{trouble}" if trouble else "")

    def describe(self, frozen: str | None) -> str:
        """Both files for the user (``/memory``), Markdown; ``frozen`` is the snapshot the session's
        prompt carries (None: the session has none yet)."""
        lines = [f"**Memory** in `{self.folder}`: shared by every session (and by Hermes); the model "
                 "changes it with the `memory` tool, and you can edit the files (entries are separated "
                 "by a line holding only `§`).", ""]
        secrets = self.secrets()
        for target in self.settings.targets:
            file, limit = self.read(target), self.settings.limit(target)
            over = " (over its limit)" if file.chars > limit else ""
            count = f"{len(file.entries)} entr{'y' if len(file.entries) == 1 else 'ies'}"
            lines.append(f"**{file.target.label}** (`{file.target.fileName}`, target `{target}`): "
                         f"{usage(file.chars, limit)}{over}, {count}")
            if file.problem:
                lines.append(f"- ⚠ {file.problem}: the memory tool will not change it until you fix it.")
            for number, entry in enumerate(self.shown(file, secrets), 1):
                lines.append(f"{number}. " + entry.replace("\n", "\n   "))
            lines.append("")
        if frozen is not None and frozen != self.snapshot():
            lines.append("_Changed since this session started: its prompt keeps the memory as it was then "
                         "(so the model's prompt cache holds); new sessions get it as it is now._")
        return "\n".join(lines).rstrip()

    # -- the tool ----------------------------------------------------------------------------

    def change(self, target: str, operations: Sequence[Operation], approve: Approve,
               cancelled: Callable[[], bool] = lambda: False) -> Change:
        """Apply ``operations`` to ``target``'s file: checked against the file as it is, approved
        (``approve`` sees the change as a diff of the file), then applied again under the lock to
        the file as it is then (another agent may have written meanwhile: its entries stay)."""
        limit = self.settings.limit(target)
        if not self.settings.enabled(target):
            key = "memory_enabled" if target == "memory" else "user_profile_enabled"
            return self._failure(f"The {target} store is turned off in config.yaml (memory.{key}).")
        secrets = self.secrets()
        for number, operation in enumerate(operations, 1):
            kind = secretLike(operation.content, secrets) if operation.action != "remove" else None
            if kind is not None:
                position = f"Operation {number}: " if len(operations) > 1 else ""
                return self._failure((
                    f"{position}Refused: the content holds what looks like a secret ({kind}). Secrets never go "
                    "into memory, which every later session shows the model. Save the fact without the value "
                    "(say where the secret is kept, e.g. 'the key is OPENAI_API_KEY in $HERMES_HOME/.env'). "
                    "Nothing was written."))
        before = self.read(target)
        planned = self._applied(before, operations, secrets)
        if isinstance(planned, Change):
            return planned
        after = planned[0]
        oldText, newText = joined(self.shown(before, secrets)), joined(self.shown(_with(before, after), secrets))
        denied = approve(self.path(target), oldText, newText) if after != list(before.entries) else None
        if denied is not None:
            return self._failure(f"{denied} Memory was not changed.")
        try:
            privateFolder(self.folder)
            with fileLock(self.path(target), self.settings.lockSeconds, cancelled):
                current = self.read(target)  # what another process wrote since stays
                done = self._applied(current, operations, secrets)
                if isinstance(done, Change):
                    return done
                entries, message = done
                if entries != list(current.entries):
                    writeAtomically(self.path(target), joined(entries))
        except MemoryBusy as e:
            return self._failure(f"{e}.")
        except OSError as e:
            return self._failure(f"{TARGETS[target].fileName} could not be written ({e.strerror or e}); "
                                 "nothing was changed.")
        chars = len(joined(entries))
        reply = {"success": True, "done": True, "target": target, "usage": usage(chars, limit),
                 "entry_count": len(entries), "message": message, "note": SAVED_NOTE}
        return Change(reply, False, self.path(target), joined(self.shown(current, secrets)),
                      joined(self.shown(_with(current, entries), secrets)))

    def _applied(self, file: MemoryFile, operations: Sequence[Operation],
                 secrets: Sequence[str]) -> tuple[list[str], str] | Change:
        """``file``'s entries after ``operations`` and what was done, or the failure to answer."""
        if file.problem:
            return self._failure(f"{file.target.fileName} cannot be changed: {file.problem}. Tell the user to fix "
                                 f"{file.path} by hand (entries separated by a line holding only §); nothing was "
                                 "written.")
        try:
            return applied(file.entries, operations, self.settings.limit(file.target.name))
        except Refused as e:
            return self._refused(file, e, secrets)

    @staticmethod
    def _failure(message: str) -> Change:
        return Change({"success": False, "error": message}, True)

    def _refused(self, file: MemoryFile, refused: Refused, secrets: Sequence[str]) -> Change:
        reply: dict[str, Any] = {"success": False, "error": str(refused)}
        if refused.entries:
            reply["current_entries"] = self.shown(file, secrets)
        reply.update(refused.extra)
        reply.setdefault("usage", f"{file.chars:,}/{self.settings.limit(file.target.name):,}")
        return Change(reply, True)


def _with(file: MemoryFile, entries: Sequence[str]) -> MemoryFile:
    return attrs.evolve(file, entries=tuple(entries))


def _screened(entry: str, target: Target, secrets: Sequence[str]) -> str:
    kind = secretLike(entry, secrets)
    if kind is None:
        return entry
    return (f"[An entry of {target.fileName} was left out: it holds what looks like a secret ({kind}). "
            "The user should remove it from the file.]")
