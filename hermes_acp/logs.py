"""Logging: everything goes to stderr through ``twisted.logger``; secrets never do."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import IO

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEventAsClassicLogText,
    globalLogBeginner,
)
from zope.interface import implementer

from .engine.secrets import learnedSecrets, redact, secretValues


#: Whether a debug line can reach anyone: False once ``startLogging`` chose a higher level. A
#: discarded ``log.debug`` still builds its event and walks the observers, which for a line per
#: frame costs more than the frame's encoding; hot paths ask ``debugging()`` first. Where
#: logging is someone else's (``twist``, tests), debug lines are assumed to be wanted.
_debugging = True


def debugging() -> bool:
    return _debugging


@implementer(ILogObserver)
class RedactingTextObserver:
    """Classic one-line text to a stream, with known secrets scrubbed."""

    def __init__(self, stream: IO[str], secrets: Iterable[str]) -> None:
        self.stream = stream
        self.secrets = list(secrets)

    def __call__(self, event: dict) -> None:
        text = formatEventAsClassicLogText(event)
        if text is None:
            return
        try:
            self.stream.write(redact(text, [*self.secrets, *learnedSecrets()]))
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must never take the agent down


#: Lines Twisted itself writes at ``info`` on every run. Routine, so ``debug`` here: some
#: editors (acp.el) show every stderr line as an error, so the default level keeps quiet.
ROUTINE = frozenset({
    ("twisted.internet.base", "Main loop terminated."),
    ("twisted.application.runner._runner.Runner", "Starting reactor..."),
})


def demoteRoutine(event: dict) -> None:
    """Lower Twisted's routine ``info`` lines (``ROUTINE``) to ``debug``, in place."""
    if event.get("log_level") == LogLevel.info and (event.get("log_namespace"), event.get("log_format")) in ROUTINE:
        event["log_level"] = LogLevel.debug


@implementer(ILogObserver)
class EventPreparer:
    """Added to the global log publisher before any other observer (``twist`` begins
    its logging after it built our service): lowers routine events (``demoteRoutine``)
    and replaces known secrets inside each event's text fields, so observers we did
    not install (``twist``'s own log file) never see them either."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = list(secrets)

    def __call__(self, event: dict) -> None:
        demoteRoutine(event)
        secrets = [*self.secrets, *learnedSecrets()]
        if not secrets:
            return
        for key, value in event.items():
            if isinstance(value, str) and any(secret in value for secret in secrets):
                event[key] = redact(value, secrets)


def prepareEvents() -> None:
    from twisted.logger import globalLogPublisher

    globalLogPublisher.addObserver(EventPreparer(secretValues()))


def parseLevel(name: str) -> LogLevel:
    try:
        return LogLevel.levelWithName(name.lower())
    except Exception:
        raise ValueError(f"unknown log level {name!r} (debug, info, warn, error, critical)")


def startLogging(level: LogLevel, stream: IO[str] | None = None) -> None:
    """Send ``twisted.logger`` and stdlib ``logging`` to stderr."""
    global _debugging
    _debugging = level == LogLevel.debug
    observer = RedactingTextObserver(stream or sys.stderr, secretValues())
    filtered = FilteringLogObserver(observer, [LogLevelFilterPredicate(defaultLogLevel=level)])

    def observe(event: dict) -> None:
        demoteRoutine(event)  # this observer comes first: the preparer is added later
        filtered(event)

    globalLogBeginner.beginLoggingTo([observe], redirectStandardIO=False)


class _ToTwisted(logging.Handler):
    """Forwards stdlib records (openai, httpx, the engine) into twisted.logger."""

    def __init__(self) -> None:
        super().__init__()
        from twisted.logger import Logger

        self._log = Logger(namespace="stdlib")

    _LEVELS = {
        logging.DEBUG: LogLevel.debug,
        logging.INFO: LogLevel.info,
        logging.WARNING: LogLevel.warn,
        logging.ERROR: LogLevel.error,
        logging.CRITICAL: LogLevel.critical,
    }

    def emit(self, record: logging.LogRecord) -> None:
        level = self._LEVELS.get(record.levelno, LogLevel.warn)
        if record.exc_info and record.exc_info[1] is not None:
            from twisted.python.failure import Failure

            _, error, traceback = record.exc_info
            self._log.failure("{name}: {text}", Failure(error, type(error), traceback), level,
                              name=record.name, text=record.getMessage())
        else:
            self._log.emit(level, "{name}: {text}", name=record.name, text=record.getMessage())


def bridgeStdlibLogging() -> None:
    """Forward stdlib ``logging`` (the engine's model and tool lines) into
    twisted.logger, whose observers filter by the chosen ``--log-level``. The HTTP
    libraries stay at warnings: their debug output holds request bodies, which hold
    the user's files."""
    root = logging.getLogger()
    if not any(isinstance(h, _ToTwisted) for h in root.handlers):
        root.addHandler(_ToTwisted())
    root.setLevel(logging.DEBUG if _debugging else logging.INFO)  # (a debug record nobody shows still costs)
    for noisy in ("httpx", "httpcore", "openai", "httpx2", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

