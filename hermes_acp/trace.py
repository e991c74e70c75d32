"""``--trace FILE``: a copy of every JSON-RPC frame in and out, secrets redacted.

Each frame becomes one JSON line ``{"t": <unix time>, "dir": "in"|"out",
"frame": <the message, or the raw text of a line that is not JSON>}`` appended to
FILE. Known credentials (the values of ``*_API_KEY``/``*_TOKEN``/... variables
and the password in the endpoint URL: ``hermes_acp.engine.secrets``) are
replaced wherever they appear, and so is every string under a key that
names a credential (``apiKey``, ``accessToken``, ``Authorization``, an MCP
server's ``{"name": "GITHUB_TOKEN", "value": ...}`` pair). Token *counts*
(``inputTokens``) are kept. The file is never the protocol's stdout, and a
failing disk never takes the agent down: tracing just stops, with a warning.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from twisted.logger import Logger

from . import safejson
from .engine.secrets import REDACTED, learnedSecrets, redact, secretValues

log = Logger()

# Key names (lowercased, without "_" and "-") whose string values are credentials.
_SECRET_KEY = re.compile(r"(apikey|token|secret|password|passwd|authorization|credential|cookie)$")


class TraceError(Exception):
    """The trace file cannot be used; the message says why."""


def secretKey(name: str) -> bool:
    """Whether a key (or an env/header name) names a credential."""
    return bool(_SECRET_KEY.search(re.sub(r"[-_]", "", name.lower())))


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of a decoded frame with credentials replaced by ``[REDACTED]``."""
    secrets = list(secrets)
    if isinstance(value, dict):
        pairName = value.get("name")
        hidesValue = isinstance(pairName, str) and secretKey(pairName) and "value" in value
        return {
            key: REDACTED
            if isinstance(item, str) and item and (secretKey(key) or (hidesValue and key == "value"))
            else scrub(item, secrets)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [scrub(item, secrets) for item in value]
    if isinstance(value, str):
        return redact(value, secrets)
    return value


class FrameTrace:
    """Appends frames to an open file descriptor; call it as ``trace(direction, line)``."""

    def __init__(self, fd: int, secrets: Iterable[str], clock: Callable[[], float] = time.time) -> None:
        self.fd: int | None = fd
        self.secrets = list(secrets)
        self.clock = clock

    def __call__(self, direction: str, line: bytes, message: Any = None) -> None:
        """Record one frame: ``message`` decoded, or None to record the raw text
        (a line that was not JSON)."""
        if self.fd is None:
            return
        record: dict[str, Any] = {"t": round(self.clock(), 6), "dir": direction}
        secrets = [*self.secrets, *learnedSecrets()]
        if message is None:
            record["frame"] = redact(line.decode("utf-8", "replace"), secrets)
        else:
            try:
                record["frame"] = scrub(message, secrets)
            except RecursionError:
                record["frame"] = f"(a frame of {len(line)} bytes, nested too deeply to record)"
        data = safejson.encodeHealed(record)  # (NaN or Infinity in what the peer sent: recorded as null)
        try:
            os.write(self.fd, data + b"\n")
        except OSError as e:
            log.warn("trace file write failed ({error}); tracing stops", error=e)
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def openTrace(path: str, protocolOut: int) -> FrameTrace:
    """Open ``path`` for appending (created 0600); refuse the protocol's own stdout."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TraceError(f"cannot open trace file {path}: {e.strerror}") from e
    mine, protocol = os.fstat(fd), os.fstat(protocolOut)
    if (mine.st_dev, mine.st_ino) == (protocol.st_dev, protocol.st_ino):
        os.close(fd)
        raise TraceError(f"trace file {path} is the protocol's stdout; give a file")
    return FrameTrace(fd, secretValues())
