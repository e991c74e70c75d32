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


URL = "http://user:s3cretpass@127.0.0.1:1/v1"


class SecretsTests(SynchronousTestCase):
    """``hermes_acp.engine.secrets``: the one home of what a secret is."""

    def test_urlPasswordIsASecretValue(self) -> None:
        """The password in HERMES_BASE_URL or OPENAI_BASE_URL is a known secret value
        (also percent-decoded); a plain user name or a URL without credentials adds none."""
        self.assertEqual(secretValues({"HERMES_BASE_URL": URL}), ["s3cretpass"])
        self.assertEqual(sorted(secretValues({"OPENAI_BASE_URL": "https://me:p%40ssw0rd!@h/v1"})),
                         ["p%40ssw0rd!", "p@ssw0rd!"])
        self.assertEqual(secretValues({"HERMES_BASE_URL": "https://alice@host/v1"}), [])
        self.assertEqual(secretValues({"HERMES_BASE_URL": "http://127.0.0.1:1/v1", "OTHER_URL": URL}), [])
        token = "ghp_0123456789abcdefABCDEF"
        self.assertEqual(secretValues({"HERMES_BASE_URL": f"https://{token}@host/v1"}), [token])
        self.assertEqual(secretValues({"HTTPS_PROXY": "http://bob:proxypass1@proxy:3128", "no_proxy": "x"}),
                         ["proxypass1"])

    def test_redactURL(self) -> None:
        """The password, or a token-like user name without one, becomes [REDACTED];
        everything else of the URL stays as it was."""
        from hermes_acp.engine.secrets import redactURL

        cases = [
            (URL, "http://user:[REDACTED]@127.0.0.1:1/v1"),
            ("https://ghp_0123456789abcdefABCDEF@host/v1", "https://[REDACTED]@host/v1"),
            ("https://u:p@ss:w/rd@host/v1", "https://u:[REDACTED]@ss:w/rd@host/v1"),  # "/" ends the host
            ("https://u:p@ss@host/v1?q=a:b@c", "https://u:[REDACTED]@host/v1?q=a:b@c"),
            ("user:pw@host:8080/v1", "user:[REDACTED]@host:8080/v1"),
            ("https://alice@host/v1", "https://alice@host/v1"),
            ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
            ("https://[::1]:8080/v1", "https://[::1]:8080/v1"),
            ("", ""),
        ]
        for url, shown in cases:
            self.assertEqual(redactURL(url), shown, url)

    def test_childEnvironment(self) -> None:
        """A child gets the user's variables, not the agent's credentials; the
        endpoint URLs keep their user name and lose the password."""
        from hermes_acp.engine.secrets import AGENT_CREDENTIALS, childEnvironment

        env = {name: "sk-0123456789" for name in AGENT_CREDENTIALS}
        env.update(HERMES_BASE_URL=URL, OPENAI_BASE_URL="https://ghp_0123456789abcdefABCDEF@h/v1",
                   GITHUB_TOKEN="ghp_users_own_token", PATH="/usr/bin", HERMES_MODEL="m")
        child = childEnvironment(env)
        self.assertEqual(child, {
            "HERMES_BASE_URL": "http://user@127.0.0.1:1/v1", "OPENAI_BASE_URL": "https://h/v1",
            "GITHUB_TOKEN": "ghp_users_own_token", "PATH": "/usr/bin", "HERMES_MODEL": "m",
        })
        self.assertEqual(set(env) - set(child), set(AGENT_CREDENTIALS))
        self.assertEqual(AGENT_CREDENTIALS, ("HERMES_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "NOUS_API_KEY",
                                             "HERMES_ACP_VISION_API_KEY"))

    def test_childEnvironmentDefaultsToThisProcess(self) -> None:
        """Without an argument it starts from os.environ, and changes nothing there."""
        import os

        from hermes_acp.engine.secrets import childEnvironment

        self.patch(os, "environ", {"HERMES_API_KEY": "sk-0123456789", "HOME": "/home/u", "HERMES_BASE_URL": URL})
        self.assertEqual(childEnvironment(), {"HOME": "/home/u", "HERMES_BASE_URL": "http://user@127.0.0.1:1/v1"})
        self.assertEqual(os.environ["HERMES_API_KEY"], "sk-0123456789")

    def test_redactAll(self) -> None:
        """Every string inside dicts, lists and tuples is redacted; keys, numbers and
        None stay; nothing to redact gives the value itself back."""
        from hermes_acp.engine.secrets import REDACTED, redactAll

        value = {"output": "key s3cretpass!", "exitCode": 0, "items": [("s3cretpass", None)],
                 "nested": {"newText": "a s3cretpass b"}}
        self.assertEqual(redactAll(value, ["s3cretpass"]), {
            "output": f"key {REDACTED}!", "exitCode": 0, "items": [(REDACTED, None)],
            "nested": {"newText": f"a {REDACTED} b"},
        })
        self.assertEqual(value["output"], "key s3cretpass!")  # a copy
        self.assertIs(redactAll(value, []), value)

    def test_logsUseTheOneHome(self) -> None:
        """hermes_acp.logs scrubs with the engine's definitions, not copies of them."""
        from hermes_acp import logs, trace
        from hermes_acp.engine import secrets

        self.assertIs(logs.secretValues, secrets.secretValues)
        self.assertIs(logs.redact, secrets.redact)
        self.assertIs(trace.REDACTED, secrets.REDACTED)
