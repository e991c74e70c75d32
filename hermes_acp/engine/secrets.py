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
AGENT_CREDENTIALS = ("HERMES_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "NOUS_API_KEY",
                     "HERMES_ACP_VISION_API_KEY")
#: The endpoint URLs the agent reads (the model's, the vision model's, and the web search
#: backends'); a password in them is a credential too.
ENDPOINT_URLS = ("HERMES_BASE_URL", "OPENAI_BASE_URL", "HERMES_ACP_VISION_BASE_URL", "SEARXNG_URL", "FIRECRAWL_API_URL")
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


#: Credentials by their look, for text that must never hold one (memory entries): the
#: well-known key formats, a private key block, a JWT, a bearer token, a password written
#: as an assignment, and a long random-looking word. Each names its kind, never the value.
_KEY_SHAPES = (
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a Stripe key", re.compile(r"\b[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a package registry token", re.compile(r"\b(?:npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,})")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")),
    ("a bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}")),
    ("a password or key written as a value", re.compile(
        r"(?i)\b(?:api[_-]?key|access[_-]?key|secret(?:[_-]?key)?|token|password|passwd|pwd)\b[\"']?\s*[:=]\s*[\"']?"
        r"(?=[^\s\"']*[0-9!@#$%^&*_+=-])[^\s\"']{8,}")),
)
# A URL, tried only where a word starts: from every letter of a long word it took time squared.
_URL = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://\S+")
# A word of letters and digits (and ``+=_-``; a path's slashes split it) long and mixed enough to
# be random: upper and lower case and digits, and few repeats (an identifier repeats its letters).
_RANDOM_WORD = re.compile(r"[A-Za-z0-9+=_-]{32,}")


def _random(word: str) -> bool:
    if not (any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word)):
        return False
    return len(set(word)) >= min(len(word) * 0.55, 26)


def secretLike(text: str, known: Iterable[str] = ()) -> str | None:
    """What kind of secret ``text`` seems to hold (in words for the model; never the value): one
    of ``known`` (the user's actual secret values, ``secretValues``), a URL with a password, or
    a value shaped like a key; None when it holds none."""
    if any(secret in text for secret in known):
        return "one of your secret values (a key, token or password from the environment or .env)"
    for kind, shape in _KEY_SHAPES:
        if shape.search(text):
            return kind
    for url in _URL.findall(text):
        if _userinfo(url) is not None:
            return "a URL with a password"
    if any(_random(word) for word in _RANDOM_WORD.findall(text)):
        return "a long random-looking value (a key or token)"
    return None
