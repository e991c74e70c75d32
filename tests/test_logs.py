"""Logging: stdlib records reach twisted.logger with their tracebacks; secrets are scrubbed."""

from __future__ import annotations

import io
import logging

from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.logs import RedactingTextObserver, bridgeStdlibLogging, secretValues


class LogTests(SynchronousTestCase):
    def test_stdlibExceptionsKeepTheirTraceback(self) -> None:
        """logging.exception in the engine arrives as a failure with its traceback."""
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        bridgeStdlibLogging()
        try:
            raise KeyError("lost-key")
        except KeyError:
            logging.getLogger("hermes_acp.engine.test").exception("tool %s failed", "read_file")
        [event] = [e for e in events if e.get("name") == "hermes_acp.engine.test"]
        self.assertEqual(event["text"], "tool read_file failed")
        self.assertEqual(event["log_level"], LogLevel.error)
        self.assertIn("lost-key", event["log_failure"].getTraceback())
        self.flushLoggedErrors(KeyError)

    def test_secretsAreRedacted(self) -> None:
        """Values of *_API_KEY-like variables never reach the log text."""
        secrets = secretValues({"HERMES_API_KEY": "sk-abcdefgh12345", "HERMES_MODEL": "m", "SHORT_TOKEN": "x"})
        self.assertEqual(secrets, ["sk-abcdefgh12345"])
        stream = io.StringIO()
        observer = RedactingTextObserver(stream, secrets)
        observer({"log_format": "calling with {key}", "key": "sk-abcdefgh12345", "log_level": LogLevel.info, "log_time": 0.0, "log_namespace": "t"})
        self.assertNotIn("sk-abcdefgh12345", stream.getvalue())
        self.assertIn("[REDACTED]", stream.getvalue())
