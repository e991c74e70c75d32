"""Edit approval: who decides before ``write_file`` or ``patch`` touches disk."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterable

import attrs

from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOWED, REJECT_ALWAYS, Verdict, ask, refusal

# default: ask for every edit; accept_edits: edits inside the workspace go
# through; dont_ask: every edit goes through. Sensitive paths always ask.
EDIT_MODES = ("default", "accept_edits", "dont_ask")


def modeAfter(mode: str, answer: str) -> str:
    """The session's mode once the user answered an edit question with ``answer``
    in ``mode``: "allow edits for this session" in the default mode accepts edits.

    The session's owner applies it when the answer arrives (the engine never
    changes its own mode: a mode the user set in the meantime would be lost)."""
    return "accept_edits" if answer == ALLOW_ALWAYS and mode == "default" else mode

_SENSITIVE_DIRS = {".git", ".ssh", ".gnupg", ".aws", ".hermes"}
_SENSITIVE_NAMES = {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "authorized_keys", "known_hosts",
                    ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials"}
_KEY_SUFFIXES = (".pem", ".key", ".p12", ".pfx")


@attrs.frozen
class EditProposal:
    """An edit about to be written: ``oldText`` is None for a new file."""

    toolName: str
    path: str
    oldText: str | None
    newText: str


def _sensitive(path: str) -> bool:
    parts = path.split(os.sep)
    name = parts[-1]
    return (
        bool(_SENSITIVE_DIRS.intersection(parts[:-1]))
        or name in _SENSITIVE_NAMES
        or name == ".env"
        or name.startswith(".env.")
        or name.endswith(_KEY_SUFFIXES)
    )


def isSensitive(path: str) -> bool:
    """Whether ``path``, or the file it really names after symlinks, needs a human."""
    return _sensitive(os.path.abspath(path)) or _sensitive(os.path.realpath(path))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@attrs.define(eq=False)
class EditApprovals:
    """One session's edit policy and its memory of "reject always" answers."""

    roots: tuple[str, ...]
    mode: str = attrs.field(default="default", validator=attrs.validators.in_(EDIT_MODES))
    refusedPaths: set[str] = attrs.field(factory=set)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    @classmethod
    def forWorkspace(cls, cwd: str, extra: Iterable[str] = (), mode: str = "default") -> EditApprovals:
        """Edits under ``cwd``, the ``extra`` folders or the temp folder count as inside."""
        roots = (cwd, *extra, tempfile.gettempdir())
        return cls(tuple(os.path.realpath(root) for root in roots), mode)

    def insideWorkspace(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(_inside(real, root) for root in self.roots)

    def decide(self, proposal: EditProposal, question: Callable[[EditProposal], str] | None) -> Verdict:
        """Allow the edit, or ask ``question(proposal)`` when the policy says so."""
        path = os.path.realpath(proposal.path)
        with self._lock:
            if path in self.refusedPaths:
                return Verdict(False, f"Edit refused: the user refused edits to {proposal.path} "
                                      "for the rest of the session; the file was not modified.")
            if not isSensitive(proposal.path) and (
                self.mode == "dont_ask" or (self.mode == "accept_edits" and self.insideWorkspace(path))
            ):
                return Verdict(True)
        answer = ask(question, proposal)
        if answer == REJECT_ALWAYS:
            with self._lock:
                self.refusedPaths.add(path)
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(False, f"Edit not approved ({refusal(answer)}); {proposal.path} was not modified.")
