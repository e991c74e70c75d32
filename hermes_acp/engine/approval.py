"""The answers to an approval question, in one vocabulary, and what a refusal tells the model.

The answers are ACP's permission option kinds, plus the three ways a question can
end without a choice; the engine, the permission broker and the editor's options
all use these words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

log = logging.getLogger(__name__)

#: This call; this kind of call for the rest of the session.
ALLOW_ONCE, ALLOW_ALWAYS = "allow_once", "allow_always"
#: Not this call; refuse this kind of call without asking again.
REJECT_ONCE, REJECT_ALWAYS = "reject_once", "reject_always"
#: No choice: the turn was cancelled, nobody answered in time, the question could not be asked.
CANCELLED, TIMEOUT, FAILED = "cancelled", "timeout", "failed"
ANSWERS = (ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS, CANCELLED, TIMEOUT, FAILED)
ALLOWED = frozenset({ALLOW_ONCE, ALLOW_ALWAYS})


@attrs.frozen
class Verdict:
    """A decision; ``message`` tells the model why it was refused."""

    allowed: bool
    message: str = ""


def ask(question: Callable[..., object] | None, *args: object) -> str:
    """Put an approval question; no question to put, an error or a strange answer fail (deny)."""
    if question is None:
        return FAILED
    try:
        answer = question(*args)
    except Exception:
        log.exception("approval question failed")
        return FAILED
    return answer if isinstance(answer, str) and answer in ANSWERS else FAILED


def refusal(answer: str) -> str:
    """Why an answer that is not an allow refused, for the model."""
    return {
        TIMEOUT: "no approval arrived in time",
        CANCELLED: "the turn was cancelled",
        FAILED: "the question could not be put to the user",
    }.get(answer, "the user denied it")
