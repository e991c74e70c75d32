"""A session's name: the model's short title for its first exchange, cleaned.

One small side request, made like compaction's summary request but bounded much tighter:
its input is cut to ``INPUT_CHARS``, its answer to ``MAX_TOKENS`` (and ``MAX_REPLY`` bytes),
its time to the caller's seconds, and it is never retried. It runs beside the session's
turns, so it has a model client of its own (a ``ModelClient`` is used from one thread at a
time). What the model answers is untrusted text: ``cleanTitle`` keeps one plain line of it.
Pure Python; the caller runs ``suggestTitle`` on a worker thread.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermes_acp.config import Endpoint
    from hermes_acp.engine.cancel import Cancellation

#: The most characters of a title (the first prompt line's stand-in is cut the same way).
TITLE_LENGTH = 60
#: Characters of the prompt and of the answer the model reads to name the session (each).
INPUT_CHARS = 2000
#: The title's reply: tokens asked for, and bytes of text and reasoning accepted.
MAX_TOKENS = 32
MAX_REPLY = 16 * 1024
TITLE_PROMPT = (
    "You name conversations. Reply with a short title (at most six words) for the conversation "
    "below: plain text on one line, no quotes, no markdown, no punctuation at the end, nothing else."
)
_MARKUP = re.compile(r"^(?:#+|[-*>]|\d+[.)])\s+|[*_`\"“”„«»]+|^title\s*:\s*", re.IGNORECASE)


def capped(text: str) -> str:
    """At most ``TITLE_LENGTH`` characters, with an ellipsis where it was cut."""
    return text if len(text) <= TITLE_LENGTH else text[: TITLE_LENGTH - 1].rstrip() + "…"


def cleanTitle(raw: str) -> str | None:
    """The first line with words of the model's answer as a plain title, or None when
    nothing is left: no control or format characters, no quotes, no markdown, single
    spaces, no closing full stop, capped."""
    for line in raw.splitlines():
        text = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in line)
        text = " ".join(text.split())
        while (stripped := _MARKUP.sub("", text).strip()) != text:
            text = stripped
        text = text.strip(" '.:;,")
        if any(c.isalnum() for c in text):
            return capped(text)
    return None


def titleRequest(prompt: str, answer: str) -> list[dict[str, str]]:
    """The messages that ask for the title: the first exchange, each side cut short."""
    exchange = f"User:\n{prompt[:INPUT_CHARS]}\n\nAssistant:\n{answer[:INPUT_CHARS]}"
    return [{"role": "system", "content": TITLE_PROMPT}, {"role": "user", "content": exchange}]


def suggestTitle(endpoint: Endpoint, model: str, prompt: str, answer: str, cancellation: Cancellation,
                 seconds: float) -> str | None:
    """The model's title for the exchange, cleaned; None when its answer has none or the
    request was cancelled. Raises ``ModelError`` when the request fails or takes longer
    than ``seconds``."""
    from hermes_acp.engine.model import CANCELLED_FINISH, ModelClient, ReplyLimits

    client = ModelClient(endpoint, connectTimeout=seconds, readTimeout=seconds, maxRetries=0,
                         limits=ReplyLimits(maxReply=MAX_REPLY, seconds=seconds))
    reply = client.complete(model, titleRequest(prompt, answer), [], cancellation, lambda text: None,
                            lambda text: None, max_tokens=MAX_TOKENS)
    if reply.finishReason == CANCELLED_FINISH or cancellation.cancelled:
        return None
    return cleanTitle(reply.text)
