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

from .config import PROVIDERS, envFile, privateFolder
from .engine.secrets import redactURL

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


def checkProvider(provider: str | None) -> str:
    provider = (provider or "").strip().lower()
    if provider not in dict(CHOICES):
        raise SetupError(f"unknown provider {provider!r}; choose one of {', '.join(dict(CHOICES))}")
    return provider


def checkURL(provider: str, url: str | None) -> str:
    """The base URL to use: as given, else the provider's own."""
    url = (url or "").strip() or PROVIDERS.get(provider, "")
    if not url:
        raise SetupError("a custom provider needs a base URL (e.g. http://localhost:11434/v1)")
    if not re.match(r"^https?://[^/\s]", url):
        raise SetupError(f"the base URL must start with http:// or https:// and a host, got {redactURL(url)!r}")
    return url.rstrip("/")


def checkKey(provider: str, key: str | None) -> str:
    if provider != "custom" and not (key or "").strip():
        raise SetupError(f"{dict(CHOICES)[provider]} needs an API key")
    return (key or "").strip()


def checkModel(model: str | None) -> str:
    if not (model or "").strip():
        raise SetupError("a default model is required")
    return (model or "").strip()


def settingsFor(provider: str, baseURL: str | None, apiKey: str | None, model: str | None) -> dict[str, str]:
    """The .env values for these answers; SetupError (naming the option) when one is wrong."""
    chosen = _flagged(lambda: checkProvider(provider), "--provider")
    values = {
        "HERMES_PROVIDER": chosen,
        "HERMES_BASE_URL": _flagged(lambda: checkURL(chosen, baseURL), "--base-url"),
        "HERMES_MODEL": _flagged(lambda: checkModel(model), "--model"),
    }
    key = _flagged(lambda: checkKey(chosen, apiKey), "--api-key")
    if key:
        values["HERMES_API_KEY"] = key
    return values


def _flagged(check: Callable[[], str], option: str) -> str:
    try:
        return check()
    except SetupError as e:
        raise SetupError(f"{e} ({option})") from None


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def writeEnv(path: Path, values: Mapping[str, str]) -> None:
    """Merge ``values`` into the file, dropping our stale keys; mode 0600, atomic,
    in a folder private to the user (``config.privateFolder``)."""
    privateFolder(path.parent)
    kept = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            match = _LINE_KEY.match(line)
            if not (match and match.group(1) in OWNED_KEYS):
                kept.append(line)
    kept += [f"{key}={_quote(value)}" for key, value in values.items()]
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # before the key is in it: a stale file may have been 0644, and the umask counts
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(kept) + "\n")
    os.replace(temporary, path)


def runSetup(
    options: Mapping[str, str | None],
    out: TextIO,
    err: TextIO | None = None,
    ask: Callable[[str], str] = input,
    askSecret: Callable[[str], str] = getpass.getpass,
    interactive: bool = True,
) -> int:
    """Run the dialogue (or take the flags) and write ``$HERMES_HOME/.env``.

    On a terminal, a question whose answer cannot work is asked again, with the
    reason; options given on the command line are checked as they are, and a bad
    one names itself. Problems go to ``err`` (stderr), the dialogue to ``out``.
    """
    err = err or out
    provider, baseURL = options.get("provider"), options.get("base-url")
    apiKey, model = options.get("api-key"), options.get("model")
    path = envFile()
    try:
        if not interactive:
            if provider is None:
                raise SetupError("not a terminal: pass --provider, --model, and --api-key or --base-url as needed")
            values = settingsFor(provider, baseURL, apiKey, model)
        else:
            values = _dialogue(provider, baseURL, apiKey, model, out, err, ask, askSecret)
    except SetupError as e:
        err.write(f"hermes-acp --setup: {e}\n")
        return 2
    except (EOFError, KeyboardInterrupt):
        err.write("\nhermes-acp --setup: stopped before the end; nothing was written\n")
        return 2
    writeEnv(path, values)
    out.write(f"Wrote {path} (mode 0600). Run `hermes-acp --check` to verify.\n")
    return 0


def _dialogue(
    provider: str | None, baseURL: str | None, apiKey: str | None, model: str | None,
    out: TextIO, err: TextIO, ask: Callable[[str], str], askSecret: Callable[[str], str],
) -> dict[str, str]:
    """Ask what the options did not say, each until its answer can work."""
    chosen = _flagged(lambda: checkProvider(provider), "--provider") if provider else _askProvider(out, err, ask)
    if baseURL is not None or chosen != "custom":
        url = _flagged(lambda: checkURL(chosen, baseURL), "--base-url")
    else:
        url = _askUntil(lambda: checkURL(chosen, ask("Base URL (e.g. http://localhost:11434/v1): ")), err)
    if apiKey is not None:
        key = _flagged(lambda: checkKey(chosen, apiKey), "--api-key")
    else:
        optional = " (leave empty if the server needs none)" if chosen == "custom" else ""
        key = _askUntil(lambda: checkKey(chosen, askSecret(f"API key{optional}: ")), err)
    if model is not None:
        name = _flagged(lambda: checkModel(model), "--model")
    else:
        name = _askUntil(lambda: checkModel(ask("Default model (e.g. the name your provider lists): ")), err)
    values = {"HERMES_PROVIDER": chosen, "HERMES_BASE_URL": url, "HERMES_MODEL": name}
    if key:
        values["HERMES_API_KEY"] = key
    return values


def _askUntil(question: Callable[[], str], err: TextIO) -> str:
    while True:
        try:
            return question()
        except SetupError as e:
            err.write(f"{str(e)[0].upper()}{str(e)[1:]}; try again.\n")


def _askProvider(out: TextIO, err: TextIO, ask: Callable[[str], str]) -> str:
    out.write("Which model provider?\n")
    for number, (_, label) in enumerate(CHOICES, 1):
        out.write(f"  {number}) {label}\n")
    while True:
        answer = ask(f"Choose 1-{len(CHOICES)}: ").strip().lower()
        if answer.isdigit() and 1 <= int(answer) <= len(CHOICES):
            return CHOICES[int(answer) - 1][0]
        if answer in dict(CHOICES):
            return answer
        err.write("Please answer with a number from the list.\n")
