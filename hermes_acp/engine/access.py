"""Who decides before a tool reads or writes a path: the session's policy, or the user.

Writes (``write_file``, ``patch``): the mode decides inside the workspace; a
secret or protected path (``engine.sensitive``) asks in every mode. Reads
(``read_file``, ``search_files``): inside the workspace they go through;
outside it they ask in the ``default`` and ``accept_edits`` modes; a secret
asks in every mode. The user's memory files (the ``memory`` tool) ask in the
``default`` mode only, and plan mode refuses them (``decideMemory``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterable

import attrs

from hermes_acp.engine.approval import ALLOW_ALWAYS, ALLOW_ONCE, ALLOWED, REJECT_ALWAYS, Verdict, ask, refusal
from hermes_acp.engine.sensitive import inside, protectedKind, secretKind

# default: ask for every edit; accept_edits: edits inside the workspace go
# through; dont_ask: every edit goes through. Protected paths always ask.
# plan: no edit at all, nothing asked (``engine.planning``); reads as in default.
PLAN = "plan"
EDIT_MODES = ("default", "accept_edits", "dont_ask", PLAN)


def planRefusal(what: str) -> str:
    """What the model hears when plan mode refuses ``what`` (an edit, a command, a tool)."""
    return (f"Blocked in plan mode: {what} could change the workspace, so it was not done (nothing was "
            "changed, the user was not asked). Do not retry it: read, search and run read-only commands, "
            "then present your complete plan with exit_plan_mode.")


def modeAfter(mode: str, answer: str) -> str:
    """The session's mode once the user answered an edit question with ``answer``
    in ``mode``: "allow edits for this session" in the default mode accepts edits.

    The session's owner applies it when the answer arrives (the engine never
    changes its own mode: a mode the user set in the meantime would be lost)."""
    return "accept_edits" if answer == ALLOW_ALWAYS and mode == "default" else mode


def modeAfterPlan(answer: str) -> str:
    """The session's mode once the user answered the plan of plan mode
    (``engine.planning``): implement with edits asked, implement and accept edits,
    or (any other answer) go on planning."""
    return {ALLOW_ONCE: "default", ALLOW_ALWAYS: "accept_edits"}.get(answer, PLAN)


@attrs.frozen
class EditProposal:
    """An edit about to be written: ``oldText`` is None for a new file."""

    toolName: str
    path: str
    oldText: str | None
    newText: str


@attrs.define(eq=False)
class PathApprovals:
    """One session's read and edit policy, and its memory of "always" answers."""

    roots: tuple[str, ...]
    mode: str = attrs.field(default="default", validator=attrs.validators.in_(EDIT_MODES))
    refusedPaths: set[str] = attrs.field(factory=set)
    #: Reads: paths refused for the session; folders outside the workspace allowed for it.
    refusedReads: set[str] = attrs.field(factory=set)
    readableRoots: set[str] = attrs.field(factory=set)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    @classmethod
    def forWorkspace(cls, cwd: str, extra: Iterable[str] = (), mode: str = "default") -> PathApprovals:
        """Edits under ``cwd``, the ``extra`` folders or the temp folder count as inside."""
        roots = (cwd, *extra, tempfile.gettempdir())
        return cls(tuple(os.path.realpath(root) for root in roots), mode)

    def insideWorkspace(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(inside(real, root) for root in self.roots)

    def decide(self, proposal: EditProposal, question: Callable[[EditProposal], str] | None,
               managed: bool = False) -> Verdict:
        """Allow the edit, or ask ``question(proposal)`` when the policy says so. A ``managed``
        edit is of a folder the agent keeps for the user (their skills, in ``$HERMES_HOME``,
        which is otherwise protected): the mode decides as for the workspace; the caller has
        checked that the path stays in that folder."""
        if self.mode == PLAN:
            return Verdict(False, planRefusal(f"{proposal.toolName} of {proposal.path}"))
        path = os.path.realpath(proposal.path)
        with self._lock:
            if path in self.refusedPaths:
                return Verdict(False, f"Edit refused: the user refused edits to {proposal.path} "
                                      "for the rest of the session; the file was not modified.")
            if (managed or protectedKind(proposal.path) is None) and (
                self.mode == "dont_ask" or (self.mode == "accept_edits" and (managed or self.insideWorkspace(path)))
            ):
                return Verdict(True)
        answer = self._askEdit(path, question, proposal)
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(False, f"Edit not approved ({refusal(answer)}); {proposal.path} was not modified.")

    def _askEdit(self, path: str, question: Callable[[EditProposal], str] | None, proposal: EditProposal) -> str:
        """The user's answer about an edit of ``path``; "reject always" refuses the path from now on."""
        answer = ask(question, proposal)
        if answer == REJECT_ALWAYS:
            with self._lock:
                self.refusedPaths.add(path)
        return answer

    def decideMemory(self, proposal: EditProposal, question: Callable[[EditProposal], str] | None) -> Verdict:
        """A change to the user's memory files (``engine.memory``): their own notes, outside the
        project, bounded and kept free of secrets. Asked like an edit in the default mode; the
        modes that accept edits write it; plan mode changes nothing, so it refuses without asking."""
        if self.mode == PLAN:
            return Verdict(False, planRefusal("saving to memory"))
        path = os.path.realpath(proposal.path)
        with self._lock:
            if path in self.refusedPaths:
                return Verdict(False, "The user refused changes to this memory file for the rest of the session.")
            if self.mode in ("accept_edits", "dont_ask"):
                return Verdict(True)
        answer = self._askEdit(path, question, proposal)
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(False, f"The change was not approved ({refusal(answer)}).")

    def decideRead(self, path: str, question: Callable[[str, str], str] | None) -> Verdict:
        """Allow reading ``path`` (a file, or a folder to search), or ask
        ``question(path, reason)`` when the policy says so."""
        real = os.path.realpath(path)
        secret = secretKind(path)
        with self._lock:
            if real in self.refusedReads:
                return Verdict(False, f"Read refused: the user refused reading {path} for the rest of the session.")
            outside = not self.insideWorkspace(real) and not any(inside(real, root) for root in self.readableRoots)
            if secret is None and (not outside or self.mode == "dont_ask"):
                return Verdict(True)
        reason = f"reads {secret}" if secret else "reads outside the workspace"
        answer = ask(question, path, reason)
        with self._lock:
            if answer == REJECT_ALWAYS:
                self.refusedReads.add(real)
            elif answer == ALLOW_ALWAYS and secret is None:
                self.readableRoots.add(real if os.path.isdir(real) else os.path.dirname(real))
        if answer in ALLOWED:
            return Verdict(True)
        return Verdict(False, f"Read not approved ({reason}: {refusal(answer)}); the content of {path} was not read.")
