"""What one engine run gives back: ``TurnResult`` and its ``TurnUsage``."""

from __future__ import annotations

from typing import Any

import attrs

from hermes_acp.engine.model import ModelError


@attrs.frozen
class TurnUsage:
    """Tokens used by one turn (all its model requests), not the session."""

    inputTokens: int = 0
    outputTokens: int = 0
    totalTokens: int = 0
    thoughtTokens: int = 0
    cachedReadTokens: int = 0

    def plus(self, usage: dict[str, Any] | None) -> TurnUsage:
        if not usage:
            return self
        prompt = usage.get("prompt_tokens") or 0
        completion = usage.get("completion_tokens") or 0
        details = usage.get("completion_tokens_details") or {}
        cached = usage.get("prompt_tokens_details") or {}
        return TurnUsage(
            self.inputTokens + prompt,
            self.outputTokens + completion,
            self.totalTokens + (usage.get("total_tokens") or prompt + completion),
            self.thoughtTokens + (details.get("reasoning_tokens") or 0),
            self.cachedReadTokens + (cached.get("cached_tokens") or 0),
        )


@attrs.frozen
class TurnResult:
    """How a run ended.

    ``messages`` are the new history entries (the user message first);
    ``last_prompt_tokens`` is the context size of the last model request, as the endpoint
    reported it, or else the engine's measure of the history after the run.
    ``failure`` is set, with ``stop_reason`` "end_turn", when the model endpoint
    failed in a way retrying did not fix. ``history`` is the model's whole history
    after the run when a compaction replaced it (``messages`` then are still every
    new entry as it was, for the record), else None; ``window`` the context window
    an overflow error taught.
    """

    final_text: str
    messages: list[dict[str, Any]]
    usage: TurnUsage
    stop_reason: str
    failure: ModelError | None = None
    last_prompt_tokens: int = 0
    history: list[dict[str, Any]] | None = None
    window: int | None = None
    #: What the endpoint said the run's requests cost (OpenRouter's ``usage.cost``), if it did.
    cost: float | None = None
