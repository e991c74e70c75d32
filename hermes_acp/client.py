"""What the editor said about itself in ``initialize``: its capabilities and name.

One instance per connection, filled in by ``initialize`` and read by whoever
needs to know what the editor offers (its files, terminals, notices, terminal
authentication).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class ClientInfo:
    """The editor's ``clientCapabilities`` and ``clientInfo``."""

    capabilities: dict[str, Any] = attrs.field(factory=dict)
    info: dict[str, Any] = attrs.field(factory=dict)

    def update(self, capabilities: dict[str, Any], info: dict[str, Any]) -> None:
        self.capabilities, self.info = capabilities, info

    def supportsTerminalAuth(self) -> bool:
        auth = self.capabilities.get("auth")
        meta = self.capabilities.get("_meta")
        return bool(
            (isinstance(auth, dict) and auth.get("terminal") is True)
            or (isinstance(meta, dict) and meta.get("terminal-auth") is True)
        )

    def fs(self, name: str) -> bool:
        fs = self.capabilities.get("fs")
        return isinstance(fs, dict) and fs.get(name) is True

    @property
    def terminal(self) -> bool:
        return self.capabilities.get("terminal") is True

    @property
    def notices(self) -> bool:
        session = self.capabilities.get("session")
        return isinstance(session, dict) and isinstance(session.get("notices"), dict)

    @property
    def compaction(self) -> bool:
        session = self.capabilities.get("session")
        return isinstance(session, dict) and isinstance(session.get("compaction"), dict)

    @property
    def subagents(self) -> bool:
        """Whether the editor shows children as sessions of their own (unstable ``subagents: {}``)."""
        return isinstance(self.capabilities.get("subagents"), dict)

    def elicitation(self, mode: str) -> bool:
        """Whether the editor takes ``elicitation/create`` in ``mode`` ("form" or "url"):
        only a mode whose key is present and not null (``{}`` advertises none)."""
        elicitation = self.capabilities.get("elicitation")
        return isinstance(elicitation, dict) and isinstance(elicitation.get(mode), dict)

    def offers(self) -> list[str]:
        """The capabilities this agent uses, as the editor advertised them."""
        offers = [f"fs.{name}" for name in ("readTextFile", "writeTextFile") if self.fs(name)]
        if self.terminal:
            offers.append("terminal")
        if self.notices:
            offers.append("session.notices")
        if self.compaction:
            offers.append("session.compaction")
        if self.subagents:
            offers.append("subagents")
        offers += [f"elicitation.{mode}" for mode in ("form", "url") if self.elicitation(mode)]
        if self.supportsTerminalAuth():
            offers.append("terminal auth")
        return offers
