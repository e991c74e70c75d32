"""``hermes-acp --setup``: choose a provider, key and model; write ``.env`` (0600).

Interactive on a terminal; scripts pass ``--provider``, ``--base-url``,
``--api-key`` and ``--model`` instead.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from .config import PROVIDERS, envFile

CHOICES = [
    ("openrouter", "OpenRouter"),
    ("openai", "OpenAI"),
    ("nous", "Nous Portal"),
    ("custom", "Any OpenAI-compatible URL (Ollama, llama.cpp, vLLM, LM Studio, ...)"),
]
OWNED_KEYS = ("HERMES_PROVIDER", "HERMES_BASE_URL", "HERMES_API_KEY", "HERMES_MODEL")
_LINE_KEY = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


class SetupError(Exception):
    """The answers given cannot make a working configuration."""


def settingsFor(provider: str, baseURL: str | None, apiKey: str | None, model: str | None) -> dict[str, str]:
    provider = (provider or "").strip().lower()
    if provider not in dict(CHOICES):
        raise SetupError(f"unknown provider {provider!r}; choose one of {', '.join(dict(CHOICES))}")
    url = (baseURL or "").strip() or PROVIDERS.get(provider, "")
    if not url:
        raise SetupError("a custom provider needs --base-url (e.g. http://localhost:11434/v1)")
    if not re.match(r"^https?://", url):
        raise SetupError(f"base URL must start with http:// or https://, got {url!r}")
    if provider != "custom" and not (apiKey or "").strip():
        raise SetupError(f"{dict(CHOICES)[provider]} needs an API key (--api-key)")
    if not (model or "").strip():
        raise SetupError("a default model is required (--model)")
    values = {"HERMES_PROVIDER": provider, "HERMES_BASE_URL": url.rstrip("/"), "HERMES_MODEL": model.strip()}
    if (apiKey or "").strip():
        values["HERMES_API_KEY"] = apiKey.strip()
    return values


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def writeEnv(path: Path, values: Mapping[str, str]) -> None:
    """Merge ``values`` into the file, dropping our stale keys; mode 0600, atomic."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    kept = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            match = _LINE_KEY.match(line)
            if not (match and match.group(1) in OWNED_KEYS):
                kept.append(line)
    kept += [f"{key}={_quote(value)}" for key, value in values.items()]
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(kept) + "\n")
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def runSetup(
    options: Mapping[str, str | None],
    out: TextIO,
    ask: Callable[[str], str] = input,
    askSecret: Callable[[str], str] = getpass.getpass,
    interactive: bool = True,
) -> int:
    """Run the dialogue (or take the flags) and write ``$HERMES_HOME/.env``."""
    provider, baseURL = options.get("provider"), options.get("base-url")
    apiKey, model = options.get("api-key"), options.get("model")
    path = envFile()
    try:
        if provider is None:
            if not interactive:
                raise SetupError("not a terminal: pass --provider, --api-key and --model")
            provider = _askProvider(out, ask)
        if provider == "custom" and not baseURL and interactive:
            baseURL = ask("Base URL (e.g. http://localhost:11434/v1): ").strip()
        if apiKey is None and interactive:
            optional = " (leave empty if the server needs none)" if provider == "custom" else ""
            apiKey = askSecret(f"API key{optional}: ")
        if model is None and interactive:
            model = ask("Default model (e.g. the name your provider lists): ").strip()
        values = settingsFor(provider, baseURL, apiKey, model)
    except (SetupError, EOFError) as e:
        out.write(f"hermes-acp --setup: {e or 'input ended'}\n")
        return 2
    writeEnv(path, values)
    out.write(f"Wrote {path} (mode 0600). Run `hermes-acp --check` to verify.\n")
    return 0


def _askProvider(out: TextIO, ask: Callable[[str], str]) -> str:
    out.write("Which model provider?\n")
    for number, (_, label) in enumerate(CHOICES, 1):
        out.write(f"  {number}) {label}\n")
    while True:
        answer = ask("Choose 1-4: ").strip().lower()
        if answer.isdigit() and 1 <= int(answer) <= len(CHOICES):
            return CHOICES[int(answer) - 1][0]
        if answer in dict(CHOICES):
            return answer
        out.write("Please answer with a number from the list.\n")
