"""Answers from the user's approval callbacks, and what a refusal tells the model."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

log = logging.getLogger(__name__)

# once: this call; always: this kind of call for the rest of the session;
# deny: not this call; never: refuse this kind of call without asking again.
# "timeout" is a deny that tells the model nobody answered.
ANSWERS = ("once", "always", "deny", "never", "timeout")


@attrs.frozen
class Verdict:
    """A decision; C{message} tells the model why it was refused."""

    allowed: bool
    message: str = ""


def ask(callback: Callable[..., object] | None, *args: object) -> str:
    """Call an approval callback; no callback, an error or a strange answer mean "deny"."""
    if callback is None:
        return "deny"
    try:
        answer = callback(*args)
    except Exception:
        log.exception("approval callback failed")
        return "deny"
    return answer if isinstance(answer, str) and answer in ANSWERS else "deny"


def refusal(answer: str) -> str:
    return "no approval arrived in time" if answer == "timeout" else "the user denied it"
