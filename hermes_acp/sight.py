"""Which models see images: ``HERMES_ACP_MODEL_VISION``.

``auto`` (the default): what the endpoint's model list says, else the model is shown images,
and an endpoint that refuses them teaches the catalog it cannot (``ModelCatalog.sees``);
``on``; ``off``; or the names of the models that can (patterns such as ``gpt-4o*,claude-*``;
every other model cannot). The model ``vision_analyze`` asks is ``engine.images.visionModel``'s.
"""

from __future__ import annotations

import fnmatch
import attrs

_WORDS = ("auto", "on", "off")


@attrs.frozen
class Sight:
    """``HERMES_ACP_MODEL_VISION``: a word, or the patterns of the models that see."""

    word: str = "auto"
    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str) -> Sight:
        value = raw.strip()
        if value.lower() in _WORDS or not value:
            return cls(value.lower() or "auto")
        patterns = tuple(part.strip() for part in value.split(",") if part.strip())
        if any(p.lower() in _WORDS for p in patterns):
            raise ValueError(f"HERMES_ACP_MODEL_VISION must be auto, on, off or model names, got {raw!r}")
        return cls("models", patterns)

    def sees(self, model: str, listed: bool | None) -> bool | None:
        """Whether ``model`` sees, given what the endpoint's list said (``listed``)."""
        if self.word == "auto":
            return listed
        if self.word in ("on", "off"):
            return self.word == "on"
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.patterns)

    @property
    def maybe(self) -> bool:
        """Whether any model may be shown images."""
        return self.word != "off"
