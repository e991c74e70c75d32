"""What a question to the user (``ToolContext.askUser``) comes back as: one vocabulary
for the engine, which asks, and the ACP layer, which chooses how to ask."""

from __future__ import annotations

import attrs

#: The user answered (``text``); declined to; dismissed the question; nobody answered
#: (``text`` says why: the turn was cancelled, the wait timed out...); or the question
#: became the turn's last message, so the user's next prompt answers it.
ACCEPTED, DECLINED, CANCELLED, NO_ANSWER, DEFERRED = "accepted", "declined", "cancelled", "no_answer", "deferred"
#: The longest answer the model is given (the editor's answer is untrusted input).
MAX_ANSWER_CHARS = 4000


@attrs.frozen
class Answer:
    action: str
    text: str = ""


NOBODY = Answer(NO_ANSWER, "nobody can answer questions here")
