"""What is a secret, in one place.

The agent's own credentials are its model keys (``AGENT_CREDENTIALS``) and the
password in its endpoint URL (``ENDPOINT_URLS``); any variable named like a
credential (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``) holds one
too. Their values are scrubbed from logs, traces and tool output
(``secretValues``, ``redact``, ``redactAll``), a URL is shown with its password
replaced (``redactURL``), and a child process gets an environment without the
agent's credentials (``childEnvironment``).

Pure Python (no Twisted): the engine, the logs and the trace all use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

REDACTED = "[REDACTED]"
#: Names of environment variables whose values are credentials.
SECRET_NAME = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD)$")
#: The keys the agent itself uses to reach its model; no child process gets them.
AGENT_CREDENTIALS = ("HERMES_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "NOUS_API_KEY")
#: The endpoint URLs the agent reads; a password in them is a credential too.
ENDPOINT_URLS = ("HERMES_BASE_URL", "OPENAI_BASE_URL")
#: Shorter values are not scrubbed from free text, where they would garble
#: every word that holds them (a URL is redacted by its structure, whatever the length).
MIN_SECRET_LENGTH = 8

# The authority of a URL (group 1): between "//" and the path, or before the
# path of a URL written without a scheme (``user:pw@host:8080/v1``).
_AUTHORITY = re.compile(r"^\s*(?:(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?([^/?#]*)")
# A user name that is really a token (``https://ghp_0123...@host``): long, letters and digits.
_TOKEN_LIKE = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9._~+/=%-]{16,}$")


def _userinfo(url: str) -> tuple[str, str | None, tuple[int, int]] | None:
    """The user name, the password (None without one) and where the user
    information lies in ``url``; None when the URL carries no credential."""
    match = _AUTHORITY.match(url)
    if match is None or "@" not in match.group(1):
        return None
    userinfo = match.group(1).rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    if not password and not _TOKEN_LIKE.match(user):
        return None
    start = match.start(1)
    return user, password or None, (start, start + len(userinfo) + 1)


def _replaceCredential(url: str, replacement: str | None) -> str:
    """``url`` with its password (or token-like user name) replaced, or left out
    when ``replacement`` is None."""
    found = _userinfo(url)
    if found is None:
        return url
    user, password, (start, end) = found
    if password is None:
        kept = f"{replacement}@" if replacement else ""
    else:
        kept = f"{user}:{replacement}@" if replacement else f"{user}@"
    return url[:start] + kept + url[end:]


def redactURL(url: str) -> str:
    """``url`` as it may be shown: a password (``https://user:pw@host``) or a
    token-like user name without one (``https://TOKEN@host``) becomes ``[REDACTED]``."""
    return _replaceCredential(url, REDACTED)


def urlSecrets(url: str) -> set[str]:
    """The credential in ``url`` (as written and percent-decoded), if it has one."""
    found = _userinfo(url)
    if found is None:
        return set()
    user, password, _ = found
    secret = user if password is None else password
    return {value for value in (secret, unquote(secret)) if len(value) >= MIN_SECRET_LENGTH}


def secretValues(env: Mapping[str, str] | None = None) -> list[str]:
    """The known secret values, longest first: those of credential-named
    variables and the credentials in the endpoint and proxy URLs (at least
    ``MIN_SECRET_LENGTH`` characters each)."""
    env = os.environ if env is None else env
    found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}
    for name in ENDPOINT_URLS:
        found |= urlSecrets(env.get(name, ""))
    for name, value in env.items():  # https_proxy=http://user:password@proxy:3128
        if name.lower().endswith("_proxy"):
            found |= urlSecrets(value)
    return sorted(found, key=len, reverse=True)


#: Secrets the agent learned while it runs (an MCP server's OAuth tokens): redacted
#: like the configured ones wherever a log or a trace is written. Replaced whole on
#: each change, so a reader in another thread never sees it half changed.
_learned: tuple[str, ...] = ()


def learnSecret(value: str) -> None:
    """Keep ``value`` (a token the agent obtained) out of every log and trace from now on."""
    global _learned
    if len(value) >= MIN_SECRET_LENGTH and value not in _learned:
        _learned = tuple(sorted((*_learned, value), key=len, reverse=True))


def learnedSecrets() -> tuple[str, ...]:
    return _learned


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``[REDACTED]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def redactAll(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of ``value`` with ``secrets`` redacted from every string in it,
    through dicts, lists and tuples (dict keys are kept as they are)."""
    secrets = list(secrets)
    if not secrets:
        return value
    return _redacted(value, secrets)


def _redacted(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {key: _redacted(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, secrets) for item in value]
    if isinstance(value, tuple):
        return tuple(_redacted(item, secrets) for item in value)
    return value


def childEnvironment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process (a command, a search): ``env``
    (``os.environ`` by default) without ``AGENT_CREDENTIALS``, and with the
    credential taken out of the endpoint URLs. The user's other variables stay:
    their builds may need them."""
    env = os.environ if env is None else env
    child = {name: value for name, value in env.items() if name not in AGENT_CREDENTIALS}
    for name in ENDPOINT_URLS:
        if name in child:
            child[name] = _replaceCredential(child[name], None)
    return child
