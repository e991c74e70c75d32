"""Where the OAuth tokens of MCP servers live: ``$HERMES_HOME/mcp-tokens/``.

One file per MCP server URL (its tokens, the authorization server that issued
them, the client they were issued to) and one per authorization server issuer
under ``clients/`` (the client registration, kept so that a restart reuses it and
its redirect port instead of piling up registrations). The folder is 0700, each
file 0600, and every write is atomic (a private temporary file, fsynced, renamed
over the old one): a refresh token the server rotated is never half written,
and a process reading at the same time sees the old file or the new one.

Every token and client secret read or written here is taught to the redaction
(``secrets.learnSecret``), so that nothing that logs or traces can show it.
No Twisted: the terminal's ``hermes-acp mcp login`` uses it too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from ..config import hermesHome, privateFolder
from ..engine.atomic import replaceFile
from ..engine.secrets import learnSecret

FOLDER = "mcp-tokens"
#: The fields of a record that are secrets.
SECRET_FIELDS = ("access_token", "refresh_token", "client_secret", "id_token")
#: A file bigger than this is no record of ours (it is not read).
MAX_FILE = 256 * 1024


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _learn(record: dict[str, Any]) -> dict[str, Any]:
    for name in SECRET_FIELDS:
        value = record.get(name)
        if isinstance(value, str):
            learnSecret(value)
    return record


@attrs.define
class TokenStore:
    """The token and client files under one folder."""

    folder: Path

    @classmethod
    def default(cls) -> TokenStore:
        return cls(hermesHome() / FOLDER)

    def tokenPath(self, resource: str) -> Path:
        return self.folder / f"{_key(resource)}.json"

    def clientPath(self, issuer: str) -> Path:
        return self.folder / "clients" / f"{_key(issuer)}.json"

    # -- tokens, per MCP server URL -------------------------------------------------

    def tokens(self, resource: str) -> dict[str, Any] | None:
        record = self._read(self.tokenPath(resource))
        return record if record is not None and record.get("resource") == resource else None

    def saveTokens(self, resource: str, record: dict[str, Any]) -> None:
        self._write(self.tokenPath(resource), {**record, "resource": resource})

    def forget(self, resource: str) -> bool:
        """Remove the server's tokens; whether there were any."""
        try:
            self.tokenPath(resource).unlink()
        except FileNotFoundError:
            return False
        return True

    # -- client registrations, per authorization server -------------------------------

    def client(self, issuer: str) -> dict[str, Any] | None:
        record = self._read(self.clientPath(issuer))
        return record if record is not None and record.get("issuer") == issuer else None

    def saveClient(self, issuer: str, record: dict[str, Any]) -> None:
        self._write(self.clientPath(issuer), {**record, "issuer": issuer})

    def forgetClient(self, issuer: str) -> None:
        try:
            self.clientPath(issuer).unlink()
        except FileNotFoundError:
            pass

    # -- files -------------------------------------------------------------------------

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError:
            return None
        try:
            record = json.loads(data) if len(data) <= MAX_FILE else None
        except ValueError:
            return None
        return _learn(record) if isinstance(record, dict) else None

    def _write(self, path: Path, record: dict[str, Any]) -> None:
        _learn(record)
        privateFolder(self.folder)
        privateFolder(path.parent)
        replaceFile(path, json.dumps(record), durable=True)  # 0600; a rotated refresh token is never half written
