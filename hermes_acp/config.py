"""Where hermes-acp keeps its state (private to the user: ``privateFolder``,
``privateFile``) and which model endpoint it talks to.

Pure Python (no Twisted): the agent engine, ``--check`` and ``--setup`` all use it.
"""

from __future__ import annotations

import logging
import math
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path

import attrs

from .engine.secrets import redactURL

log = logging.getLogger(__name__)

DEFAULT_MAX_LINE = 64 * 1024 * 1024
DEFAULT_THREADS = 256
DEFAULT_PERMISSION_TIMEOUT = 60.0
DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_MCP_STARTUP_TIMEOUT = 30.0
DEFAULT_MCP_CALL_TIMEOUT = 300.0
#: The largest question (message and form, as JSON) an MCP server may put to the user.
DEFAULT_MCP_ELICITATION_BYTES = 16 * 1024
DEFAULT_MCP_HTTP_CONNECTIONS = 16
#: How long an MCP server's OAuth sign-in waits for the browser's redirect.
DEFAULT_MCP_LOGIN_TIMEOUT = 300.0
#: The most text of one MCP resource read, or of one MCP prompt's messages, the model gets.
DEFAULT_MCP_RESOURCE_BYTES = 100 * 1024
#: The most MCP prompts offered as slash commands, per server.
DEFAULT_MCP_MAX_PROMPTS = 50
DEFAULT_COMPACT_AT = 0.9
#: The tool calls of one model reply: how many run at all (the rest are refused) and how many
#: at once; and how many run at once in the whole process, every session together.
DEFAULT_MAX_TOOL_CALLS = 32
DEFAULT_TOOL_PARALLEL = 4
DEFAULT_TOOL_THREADS = 16
#: ``delegate_task``: children of one call at once, tasks per call, children running in the
#: process, the characters of each child's summary the parent reads.
DEFAULT_SUBAGENT_PARALLEL = 3
DEFAULT_SUBAGENT_TASKS = 12
DEFAULT_SUBAGENT_THREADS = 48
DEFAULT_SUBAGENT_SUMMARY = 24_000
#: One model reply: the largest server-sent event (or line, or whole JSON answer) in bytes, the
#: most text, reasoning and tool calls in bytes (``engine.model.CALL_BYTES``), the longest time in seconds.
DEFAULT_MODEL_MAX_EVENT = 8 * 1024 * 1024
DEFAULT_MODEL_MAX_REPLY = 32 * 1024 * 1024
DEFAULT_MODEL_REPLY_SECONDS = 3600.0
DEFAULT_TITLE_SECONDS = 15.0
#: Background processes (``terminal(background=true)``): running per session, running in the
#: whole agent, bytes of output kept per process (head and tail).
DEFAULT_BACKGROUND_PROCESSES = 8
DEFAULT_BACKGROUND_TOTAL = 64
DEFAULT_BACKGROUND_OUTPUT = 200_000
#: How long a memory write waits for another process's lock on its file (``engine.memory``).
DEFAULT_MEMORY_LOCK_SECONDS = 10.0
#: Images: Hermes' limits for one (bytes, pixels on the longest side), the most one model
#: request carries, the largest a tool card shows (``engine.images``).
DEFAULT_IMAGE_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_IMAGE_MAX_SIDE = 7900
DEFAULT_IMAGES_PER_REQUEST = 8
DEFAULT_IMAGE_PREVIEW_BYTES = 1024 * 1024
#: Skills (``engine.skills``): the characters of their list in the system prompt, the folders
#: one search may visit, and how many become slash commands.
DEFAULT_SKILLS_PROMPT_CHARS = 8000
DEFAULT_SKILLS_SCAN_DIRS = 2000
DEFAULT_SKILL_COMMANDS = 250
DEFAULT_CHECKPOINT_STORE_MAX = 1024 * 1024 * 1024
DEFAULT_CHECKPOINT_FILE_MAX = 10 * 1024 * 1024
DEFAULT_CHECKPOINT_MAX_FILES = 50_000

# Well-known OpenAI-compatible endpoints, used when HERMES_BASE_URL is unset.
PROVIDERS: dict[str, str] = {
    "openrouter": "https://openrouter.ai/api/v1",
    "openai": "https://api.openai.com/v1",
    "nous": "https://inference-api.nousresearch.com/v1",
}
_FALLBACK_KEYS = (
    ("openrouter", "OPENROUTER_API_KEY"),
    ("openai", "OPENAI_API_KEY"),
    ("nous", "NOUS_API_KEY"),
)


def hermesHome(env: Mapping[str, str] | None = None) -> Path:
    """The config/state folder: ``$HERMES_HOME`` or ``~/.hermes``."""
    env = os.environ if env is None else env
    home = env.get("HERMES_HOME", "").strip()
    return Path(home).expanduser() if home else Path.home() / ".hermes"


def envFile(env: Mapping[str, str] | None = None) -> Path:
    return hermesHome(env) / ".env"


def stateDatabase(env: Mapping[str, str] | None = None) -> Path:
    return hermesHome(env) / "state.db"


def privateFolder(path: Path) -> None:
    """Make the folder ``path`` (and its missing parents) exist, private to the
    user: a new one is made 0700 whatever the umask, an existing one that the
    group or others can use is tightened (``tightenIfShared``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if not path.is_dir():
            raise
        tightenIfShared(path)
    else:
        os.chmod(path, 0o700)


def privateFile(path: Path) -> None:
    """Make the file ``path`` exist, private to the user: a new one is made
    (empty) 0600 whatever the umask, an existing one that the group or others
    can use is tightened (``tightenIfShared``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        tightenIfShared(path)
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def tightenIfShared(path: Path) -> None:
    """Take the group's and others' access to ``path`` away, if it exists and
    has any, and log that it had; a failure to is logged as a warning."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # not there (or not ours to look at): nothing to tighten
        return
    if not mode & 0o077:
        return
    try:
        os.chmod(path, mode & 0o700)
    except OSError as e:
        log.warning("%s can be read by others (mode %04o) and could not be made private: %s", path, mode, e)
    else:
        log.info("%s could be read by others (mode %04o); it is now private to you (%04o)", path, mode, mode & 0o700)


def loadDotenv(env: Mapping[str, str] | None = None) -> Path | None:
    """Load ``$HERMES_HOME/.env`` into ``os.environ`` (it wins over the shell).

    Returns the file loaded, or None when there is none.
    """
    from dotenv import load_dotenv

    path = envFile(env)
    if not path.is_file():
        return None
    load_dotenv(path, override=True)
    return path


@attrs.frozen
class Endpoint:
    """An OpenAI-compatible endpoint, its key and the default model."""

    provider: str
    baseURL: str | None = attrs.field(repr=lambda url: repr(url and redactURL(url)))
    apiKey: str | None = attrs.field(repr=False, default=None)
    model: str | None = None
    models: tuple[str, ...] = ()

    @property
    def keyPresent(self) -> bool:
        return bool(self.apiKey)

    @property
    def shownURL(self) -> str:
        """The base URL as it may be shown or logged: a password in it redacted."""
        return redactURL(self.baseURL) if self.baseURL else "(none)"

    def problems(self) -> list[str]:
        """What stops a turn from running, in words a user can act on."""
        found = []
        if not self.baseURL:
            found.append(
                "no model endpoint: set HERMES_BASE_URL (or OPENROUTER_API_KEY, "
                "OPENAI_API_KEY, NOUS_API_KEY), or run `hermes-acp --setup`"
            )
        if not self.model:
            found.append("no model: set HERMES_MODEL or run `hermes-acp --setup`")
        if self.baseURL and not self.keyPresent and self.provider != "custom":
            found.append(f"no API key for provider {self.provider}")
        return found


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


class ConfigError(ValueError):
    """A setting has a value hermes-acp cannot use; the message names it."""


def _envNumber(env: Mapping[str, str], name: str, convert: Callable[[str], Any], what: str) -> Any:
    """The setting as ``convert`` reads it; None when missing or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return convert(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def envInt(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    """An integer setting; missing or empty gives the default, anything else
    that is not a whole number of at least ``minimum`` is a ConfigError."""
    value = _envNumber(env, name, int, "a whole number")
    if value is None:
        return default
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def envChoice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (case-insensitive; missing or empty gives the first)."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return choices[0]
    if raw not in choices:
        raise ConfigError(f"{name} must be {' or '.join(choices)}, got {raw!r}")
    return raw


def envSeconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A duration in seconds: finite and above 0 (``inf``, ``nan`` and negative
    values are ConfigErrors); missing or empty gives the default."""
    value = _envNumber(env, name, float, "a number of seconds")
    if value is None:
        return default
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds above 0, got {env[name].strip()!r}")
    return float(value)


def envShare(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    """A share between ``low`` and ``high`` (a number like 0.85); missing or empty gives the default."""
    value = _envNumber(env, name, float, f"a number between {low} and {high}")
    if value is None:
        return default
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {env[name].strip()!r}")
    return float(value)


def _sight(raw: str) -> str:
    """``HERMES_ACP_MODEL_VISION``, checked (``hermes_acp.sight.Sight``)."""
    from .sight import Sight

    try:
        Sight.parse(raw)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return raw.strip() or "auto"


def resolveEndpoint(env: Mapping[str, str] | None = None) -> Endpoint:
    """Pick the endpoint from ``HERMES_*``, then the well-known provider keys."""
    env = os.environ if env is None else env
    models = _split(env.get("HERMES_MODELS", ""))
    model = env.get("HERMES_MODEL", "").strip() or (models[0] if models else None)
    baseURL = env.get("HERMES_BASE_URL", "").strip()
    if baseURL:
        return Endpoint(
            provider=env.get("HERMES_PROVIDER", "").strip().lower() or "custom",
            baseURL=baseURL.rstrip("/"),
            apiKey=env.get("HERMES_API_KEY", "").strip() or None,
            model=model,
            models=models,
        )
    for provider, keyName in _FALLBACK_KEYS:
        key = env.get(keyName, "").strip()
        if key:
            url = PROVIDERS[provider]
            if provider == "openai":
                url = env.get("OPENAI_BASE_URL", "").strip().rstrip("/") or url
            return Endpoint(provider, url, key, model, models)
    return Endpoint(provider="none", baseURL=None, apiKey=None, model=model, models=models)


@attrs.frozen
class Settings:
    """Process-wide tunables read once at start."""

    maxLine: int = DEFAULT_MAX_LINE
    threads: int = DEFAULT_THREADS
    permissionTimeout: float = DEFAULT_PERMISSION_TIMEOUT
    contextWindow: int = DEFAULT_CONTEXT_WINDOW
    #: Commands: sandboxed where the machine can ("auto") or never ("off"); with
    #: the network or without; extra writable folders; per-command limits.
    sandbox: str = "auto"
    sandboxNetwork: bool = True
    sandboxWritable: tuple[str, ...] = ()
    commandProcesses: int | None = None
    commandCpuSeconds: int | None = None
    #: MCP servers: how long the first prompt waits for their handshakes; how
    #: long a tool call may go without an answer or progress; the servers whose
    #: tool annotations are believed (by name; config.yaml can also say so).
    mcpStartupTimeout: float = DEFAULT_MCP_STARTUP_TIMEOUT
    mcpCallTimeout: float = DEFAULT_MCP_CALL_TIMEOUT
    mcpTrusted: frozenset[str] = frozenset()
    #: The largest ``elicitation/create`` an MCP server may send on to the editor (bytes of JSON).
    mcpElicitationBytes: int = DEFAULT_MCP_ELICITATION_BYTES
    #: The most connections (POSTs at once) to one HTTP MCP server; more messages wait their turn.
    mcpHTTPConnections: int = DEFAULT_MCP_HTTP_CONNECTIONS
    #: How long an OAuth sign-in (its loopback listener, its editor page) waits for the redirect.
    mcpLoginTimeout: float = DEFAULT_MCP_LOGIN_TIMEOUT
    #: MCP resources and prompts: the most text of one read (or one prompt) the model gets;
    #: the most prompts of one server that become slash commands.
    mcpResourceBytes: int = DEFAULT_MCP_RESOURCE_BYTES
    mcpMaxPrompts: int = DEFAULT_MCP_MAX_PROMPTS
    #: Compact the conversation when a request would pass this share of the context window
    #: (less the room of the reply).
    compactAt: float = DEFAULT_COMPACT_AT
    #: Tool calls: run per reply (the rest refused), at once per reply, at once in the process.
    maxToolCalls: int = DEFAULT_MAX_TOOL_CALLS
    toolParallel: int = DEFAULT_TOOL_PARALLEL
    toolThreads: int = DEFAULT_TOOL_THREADS
    #: ``delegate_task``: children at once per call, tasks per call, children running in the
    #: process, characters of a child's summary, and the children's model (None: the session's).
    subagentParallel: int = DEFAULT_SUBAGENT_PARALLEL
    subagentTasks: int = DEFAULT_SUBAGENT_TASKS
    subagentThreads: int = DEFAULT_SUBAGENT_THREADS
    subagentSummary: int = DEFAULT_SUBAGENT_SUMMARY
    subagentModel: str | None = None
    #: One model reply's bounds: an event's bytes, the reply's bytes, its seconds.
    modelMaxEvent: int = DEFAULT_MODEL_MAX_EVENT
    modelMaxReply: int = DEFAULT_MODEL_MAX_REPLY
    modelReplySeconds: float = DEFAULT_MODEL_REPLY_SECONDS
    #: How long the request for a session's title may take (it never delays a turn).
    titleSeconds: float = DEFAULT_TITLE_SECONDS
    #: Background processes: running per session, running in the agent, output bytes kept per process.
    backgroundProcesses: int = DEFAULT_BACKGROUND_PROCESSES
    backgroundTotal: int = DEFAULT_BACKGROUND_TOTAL
    backgroundOutput: int = DEFAULT_BACKGROUND_OUTPUT
    #: The memory files' limits in characters (None: config.yaml's, else Hermes' 2,200 and 1,375),
    #: and how long a write waits for another process's lock.
    memoryChars: int | None = None
    userChars: int | None = None
    memoryLockSeconds: float = DEFAULT_MEMORY_LOCK_SECONDS
    #: Images (``hermes_acp.sight``, ``engine.images``): which models see them
    #: (``HERMES_ACP_MODEL_VISION``), the model ``vision_analyze`` asks and where, and the bounds.
    modelVision: str = "auto"
    visionModel: str | None = None
    visionBaseURL: str | None = attrs.field(default=None, repr=lambda url: repr(url and redactURL(url)))
    visionApiKey: str | None = attrs.field(default=None, repr=False)
    imageMaxBytes: int = DEFAULT_IMAGE_MAX_BYTES
    imageMaxSide: int = DEFAULT_IMAGE_MAX_SIDE
    imagesPerRequest: int = DEFAULT_IMAGES_PER_REQUEST
    imagePreviewBytes: int = DEFAULT_IMAGE_PREVIEW_BYTES
    #: Skills: their list in the system prompt (characters; 0 leaves it out), the folders one
    #: search visits, the most that are slash commands.
    skillsPromptChars: int = DEFAULT_SKILLS_PROMPT_CHARS
    skillsScanDirs: int = DEFAULT_SKILLS_SCAN_DIRS
    skillCommands: int = DEFAULT_SKILL_COMMANDS
    #: Checkpoints of the session's folders before each turn's first change (``/rewind``):
    #: on or off; the store's size, the largest file copied, the most entries in one folder.
    checkpoints: bool = True
    checkpointStoreMax: int = DEFAULT_CHECKPOINT_STORE_MAX
    checkpointFileMax: int = DEFAULT_CHECKPOINT_FILE_MAX
    checkpointMaxFiles: int = DEFAULT_CHECKPOINT_MAX_FILES

    @classmethod
    def fromEnv(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from the environment; ConfigError names a bad one."""
        env = os.environ if env is None else env
        return cls(
            maxLine=envInt(env, "HERMES_ACP_MAX_LINE", DEFAULT_MAX_LINE, minimum=1024),
            threads=envInt(env, "HERMES_ACP_THREADS", DEFAULT_THREADS),
            permissionTimeout=envSeconds(env, "HERMES_ACP_PERMISSION_TIMEOUT", DEFAULT_PERMISSION_TIMEOUT),
            contextWindow=envInt(env, "HERMES_CONTEXT_WINDOW", DEFAULT_CONTEXT_WINDOW, minimum=1024),
            sandbox=envChoice(env, "HERMES_ACP_SANDBOX", ("auto", "off")),
            sandboxNetwork=envChoice(env, "HERMES_ACP_SANDBOX_NETWORK", ("on", "off")) == "on",
            sandboxWritable=tuple(os.path.abspath(os.path.expanduser(p))
                                  for p in env.get("HERMES_ACP_SANDBOX_WRITABLE", "").split(os.pathsep) if p.strip()),
            commandProcesses=envInt(env, "HERMES_ACP_COMMAND_MAX_PROCESSES", 0, minimum=1) or None,
            commandCpuSeconds=envInt(env, "HERMES_ACP_COMMAND_CPU_SECONDS", 0, minimum=1) or None,
            mcpStartupTimeout=envSeconds(env, "HERMES_ACP_MCP_STARTUP_TIMEOUT", DEFAULT_MCP_STARTUP_TIMEOUT),
            mcpCallTimeout=envSeconds(env, "HERMES_ACP_MCP_CALL_TIMEOUT", DEFAULT_MCP_CALL_TIMEOUT),
            mcpElicitationBytes=envInt(env, "HERMES_ACP_MCP_ELICITATION_BYTES", DEFAULT_MCP_ELICITATION_BYTES,
                                       minimum=256),
            mcpTrusted=frozenset(_split(env.get("HERMES_ACP_MCP_TRUSTED", ""))),
            mcpHTTPConnections=envInt(env, "HERMES_ACP_MCP_HTTP_CONNECTIONS", DEFAULT_MCP_HTTP_CONNECTIONS),
            mcpLoginTimeout=envSeconds(env, "HERMES_ACP_MCP_LOGIN_TIMEOUT", DEFAULT_MCP_LOGIN_TIMEOUT),
            mcpResourceBytes=envInt(env, "HERMES_ACP_MCP_RESOURCE_BYTES", DEFAULT_MCP_RESOURCE_BYTES, minimum=1024),
            mcpMaxPrompts=envInt(env, "HERMES_ACP_MCP_MAX_PROMPTS", DEFAULT_MCP_MAX_PROMPTS, minimum=0),
            compactAt=envShare(env, "HERMES_ACP_COMPACT_AT", DEFAULT_COMPACT_AT, 0.3, 0.98),
            maxToolCalls=envInt(env, "HERMES_ACP_MAX_TOOL_CALLS", DEFAULT_MAX_TOOL_CALLS),
            toolParallel=envInt(env, "HERMES_ACP_TOOL_PARALLEL", DEFAULT_TOOL_PARALLEL),
            toolThreads=envInt(env, "HERMES_ACP_TOOL_THREADS", DEFAULT_TOOL_THREADS),
            subagentParallel=envInt(env, "HERMES_ACP_SUBAGENT_PARALLEL", DEFAULT_SUBAGENT_PARALLEL),
            subagentTasks=envInt(env, "HERMES_ACP_SUBAGENT_TASKS", DEFAULT_SUBAGENT_TASKS),
            subagentThreads=envInt(env, "HERMES_ACP_SUBAGENT_THREADS", DEFAULT_SUBAGENT_THREADS),
            subagentSummary=envInt(env, "HERMES_ACP_SUBAGENT_SUMMARY", DEFAULT_SUBAGENT_SUMMARY, minimum=200),
            subagentModel=env.get("HERMES_ACP_SUBAGENT_MODEL", "").strip() or None,
            modelMaxEvent=envInt(env, "HERMES_ACP_MODEL_MAX_EVENT", DEFAULT_MODEL_MAX_EVENT, minimum=1024),
            modelMaxReply=envInt(env, "HERMES_ACP_MODEL_MAX_REPLY", DEFAULT_MODEL_MAX_REPLY, minimum=1024),
            modelReplySeconds=envSeconds(env, "HERMES_ACP_MODEL_REPLY_SECONDS", DEFAULT_MODEL_REPLY_SECONDS),
            titleSeconds=envSeconds(env, "HERMES_ACP_TITLE_SECONDS", DEFAULT_TITLE_SECONDS),
            backgroundProcesses=envInt(env, "HERMES_ACP_BACKGROUND_PROCESSES", DEFAULT_BACKGROUND_PROCESSES),
            backgroundTotal=envInt(env, "HERMES_ACP_BACKGROUND_TOTAL", DEFAULT_BACKGROUND_TOTAL),
            backgroundOutput=envInt(env, "HERMES_ACP_BACKGROUND_OUTPUT", DEFAULT_BACKGROUND_OUTPUT, minimum=1024),
            memoryChars=envInt(env, "HERMES_ACP_MEMORY_CHARS", 0, minimum=1) or None,
            userChars=envInt(env, "HERMES_ACP_USER_CHARS", 0, minimum=1) or None,
            memoryLockSeconds=envSeconds(env, "HERMES_ACP_MEMORY_LOCK_SECONDS", DEFAULT_MEMORY_LOCK_SECONDS),
            modelVision=_sight(env.get("HERMES_ACP_MODEL_VISION", "")),
            visionModel=env.get("HERMES_ACP_VISION_MODEL", "").strip() or None,
            visionBaseURL=env.get("HERMES_ACP_VISION_BASE_URL", "").strip().rstrip("/") or None,
            visionApiKey=env.get("HERMES_ACP_VISION_API_KEY", "").strip() or None,
            imageMaxBytes=envInt(env, "HERMES_ACP_IMAGE_MAX_BYTES", DEFAULT_IMAGE_MAX_BYTES, minimum=1024),
            imageMaxSide=envInt(env, "HERMES_ACP_IMAGE_MAX_SIDE", DEFAULT_IMAGE_MAX_SIDE, minimum=16),
            imagesPerRequest=envInt(env, "HERMES_ACP_IMAGES_PER_REQUEST", DEFAULT_IMAGES_PER_REQUEST),
            imagePreviewBytes=envInt(env, "HERMES_ACP_IMAGE_PREVIEW_BYTES", DEFAULT_IMAGE_PREVIEW_BYTES, minimum=0),
            skillsPromptChars=envInt(env, "HERMES_ACP_SKILLS_PROMPT_CHARS", DEFAULT_SKILLS_PROMPT_CHARS, minimum=0),
            skillsScanDirs=envInt(env, "HERMES_ACP_SKILLS_SCAN_DIRS", DEFAULT_SKILLS_SCAN_DIRS),
            skillCommands=envInt(env, "HERMES_ACP_SKILL_COMMANDS", DEFAULT_SKILL_COMMANDS, minimum=0),
            checkpoints=envChoice(env, "HERMES_ACP_CHECKPOINTS", ("on", "off")) == "on",
            checkpointStoreMax=envInt(env, "HERMES_ACP_CHECKPOINT_STORE_MAX", DEFAULT_CHECKPOINT_STORE_MAX,
                                      minimum=1024 * 1024),
            checkpointFileMax=envInt(env, "HERMES_ACP_CHECKPOINT_FILE_MAX", DEFAULT_CHECKPOINT_FILE_MAX, minimum=0),
            checkpointMaxFiles=envInt(env, "HERMES_ACP_CHECKPOINT_MAX_FILES", DEFAULT_CHECKPOINT_MAX_FILES),
        )
