"""``--check`` and ``--setup``, as a user runs them."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from hermes_acp.config import resolveEndpoint
from hermes_acp.setup_wizard import runSetup, writeEnv

from .agentproc import ENTRY_POINTS, agentEnv

SECRET = "sk-test-0123456789abcdef"


def cli(*args: str, home: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ENTRY_POINTS["hermes-acp"] + list(args),
        capture_output=True,
        text=True,
        env=agentEnv(home, **env),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


class CheckTests(SynchronousTestCase):
    def test_unconfiguredSaysWhatIsMissing(self) -> None:
        """With nothing configured, --check exits 1 and names each missing piece."""
        home = tempfile.mkdtemp()
        out = cli("--check", home=home)
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"home:        {home}", out.stdout)
        self.assertIn("not found", out.stdout)
        self.assertIn("no model endpoint", out.stdout)
        self.assertIn("no model:", out.stdout)

    def test_configuredIsReadyAndNeverShowsTheKey(self) -> None:
        """A configured .env passes; the key is reported present, never printed."""
        home = tempfile.mkdtemp()
        Path(home, ".env").write_text(
            f"HERMES_BASE_URL=http://127.0.0.1:9/v1\nHERMES_API_KEY={SECRET}\nHERMES_MODEL=test-model\n"
        )
        out = cli("--check", home=home)
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("API key:     present", out.stdout)
        self.assertIn("model:       test-model", out.stdout)
        self.assertIn("http://127.0.0.1:9/v1", out.stdout)
        self.assertIn("writable", out.stdout)
        self.assertNotIn(SECRET, out.stdout + out.stderr)

    def test_urlPasswordIsNeverShown(self) -> None:
        """A password in HERMES_BASE_URL is shown as [REDACTED], even at debug level."""
        home = tempfile.mkdtemp()
        out = cli("--check", "--log-level", "debug", home=home,
                  HERMES_BASE_URL="http://user:s3cretpass@127.0.0.1:1/v1", HERMES_MODEL="m")
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("endpoint:    http://user:[REDACTED]@127.0.0.1:1/v1\n", out.stdout)
        self.assertNotIn("s3cretpass", out.stdout + out.stderr)

    def test_unwritableStateIsReported(self) -> None:
        """A state.db that cannot be written makes --check fail with the reason."""
        home = tempfile.mkdtemp()
        Path(home, ".env").write_text("HERMES_BASE_URL=http://127.0.0.1:9/v1\nHERMES_MODEL=m\n")
        Path(home, "state.db").mkdir()  # a directory where the database should be
        out = cli("--check", home=home)
        self.assertEqual(out.returncode, 1)
        self.assertIn("not writable", out.stdout)

    def test_endpointShowsNoPassword(self) -> None:
        """An Endpoint's repr and shownURL redact a password in its URL; baseURL keeps it (to connect)."""
        endpoint = resolveEndpoint({"HERMES_BASE_URL": "http://user:s3cretpass@127.0.0.1:1/v1/", "HERMES_MODEL": "m"})
        self.assertEqual(endpoint.baseURL, "http://user:s3cretpass@127.0.0.1:1/v1")
        self.assertEqual(endpoint.shownURL, "http://user:[REDACTED]@127.0.0.1:1/v1")
        self.assertNotIn("s3cretpass", repr(endpoint))
        self.assertEqual(resolveEndpoint({}).shownURL, "(none)")

    def test_providerKeyFallback(self) -> None:
        """OPENROUTER_API_KEY alone picks OpenRouter's endpoint."""
        endpoint = resolveEndpoint({"OPENROUTER_API_KEY": SECRET, "HERMES_MODEL": "m"})
        self.assertEqual((endpoint.provider, endpoint.baseURL), ("openrouter", "https://openrouter.ai/api/v1"))
        self.assertNotIn(SECRET, repr(endpoint))
        self.assertEqual(endpoint.problems(), [])


class SetupTests(SynchronousTestCase):
    def test_nonInteractiveWritesPrivateEnv(self) -> None:
        """--setup with flags writes .env with mode 0600, and --check then passes."""
        home = tempfile.mkdtemp()
        out = cli("--setup", "--provider", "custom", "--base-url", "http://localhost:11434/v1",
                  "--model", "llama3", home=home)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        env = Path(home, ".env")
        self.assertEqual(stat.S_IMODE(env.stat().st_mode), 0o600)
        self.assertIn('HERMES_BASE_URL="http://localhost:11434/v1"', env.read_text())
        self.assertEqual(cli("--check", home=home).returncode, 0)

    def test_checkSaysWhichProtectionCommandsGet(self) -> None:
        """--check names the protection of commands: the sandbox with its ABI where
        the kernel has Landlock, the asking fallback when it is turned off."""
        from hermes_acp.engine.sandbox import probe

        line = next(row for row in cli("--check", home=tempfile.mkdtemp()).stdout.splitlines() if row.startswith("commands:"))
        support = probe()
        if support.available:
            self.assertIn(f"sandboxed (Landlock ABI {support.abi})", line)
        else:
            self.assertIn(support.reason, line)
        off = cli("--check", home=tempfile.mkdtemp(), HERMES_ACP_SANDBOX="off").stdout
        self.assertIn("commands:    off (HERMES_ACP_SANDBOX=off): every command that is not a known read-only", off)

    def test_setupThenCheck(self) -> None:
        """--setup --check writes .env and then checks it: one command, one exit code."""
        home = tempfile.mkdtemp()
        out = cli("--setup", "--check", "--provider", "custom", "--base-url", "http://localhost:11434/v1",
                  "--model", "llama3", home=home)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("Wrote ", out.stdout)
        self.assertIn("Ready.", out.stdout)
        failing = cli("--setup", "--check", "--provider", "custom", "--model", "llama3", home=tempfile.mkdtemp())
        self.assertEqual(failing.returncode, 2)
        self.assertNotIn("Ready.", failing.stdout)

    def test_nonInteractiveNeedsEnoughFlags(self) -> None:
        """Without a terminal and without the flags, --setup explains and exits 2."""
        home = tempfile.mkdtemp()
        out = cli("--setup", home=home)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--provider", out.stderr)
        out = cli("--setup", "--provider", "openrouter", "--model", "m", home=home)
        self.assertEqual(out.returncode, 2)
        self.assertIn("needs an API key (--api-key)", out.stderr)
        out = cli("--setup", "--provider", "custom", "--base-url", "localhost:11434", "--model", "m", home=home)
        self.assertIn("must start with http:// or https:// and a host, got 'localhost:11434' (--base-url)", out.stderr)
        self.assertEqual(out.stdout, "")
        self.assertFalse(Path(home, ".env").exists())

    def test_setupFlagsNeedSetup(self) -> None:
        """--model without --setup is a usage error."""
        out = cli("--model", "m", home=tempfile.mkdtemp())
        self.assertEqual(out.returncode, 64)

    def test_interactiveDialogue(self) -> None:
        """The terminal dialogue asks provider, key and model, and keeps other .env lines."""
        home = tempfile.mkdtemp()
        Path(home, ".env").write_text("OTHER_SETTING=keep\nHERMES_MODEL=old\n")
        answers = iter(["9", "2", "", "  ", "gpt-test"])
        keys = iter(["", SECRET])
        out, err = io.StringIO(), io.StringIO()
        code = self.inHome(home, lambda: runSetup({}, out, err, ask=lambda prompt: next(answers),
                                                  askSecret=lambda prompt: next(keys)))
        self.assertEqual(code, 0, err.getvalue())
        self.assertIn("Please answer with a number", err.getvalue())
        self.assertIn("OpenAI needs an API key; try again.", err.getvalue())
        self.assertEqual(err.getvalue().count("A default model is required; try again."), 2)
        text = Path(home, ".env").read_text()
        self.assertIn("OTHER_SETTING=keep", text)
        self.assertIn('HERMES_MODEL="gpt-test"', text)
        self.assertNotIn("HERMES_MODEL=old", text)
        self.assertIn('HERMES_BASE_URL="https://api.openai.com/v1"', text)
        self.assertNotIn(SECRET, out.getvalue())

    def test_interactiveReasksABadURLAndStopsCleanlyAtEOF(self) -> None:
        """A base URL without a scheme is asked again with the reason; the end of input
        stops the dialogue with a message, writing nothing."""
        home = tempfile.mkdtemp()
        answers = iter(["4", "localhost:11434/v1", "http://localhost:11434/v1", "qwen"])
        out, err = io.StringIO(), io.StringIO()
        code = self.inHome(home, lambda: runSetup({}, out, err, ask=lambda prompt: next(answers), askSecret=lambda prompt: ""))
        self.assertEqual(code, 0, err.getvalue())
        self.assertIn("must start with http:// or https://", err.getvalue())
        self.assertIn('HERMES_BASE_URL="http://localhost:11434/v1"', Path(home, ".env").read_text())

        def ended(prompt: str) -> str:
            raise EOFError

        other = tempfile.mkdtemp()
        code = self.inHome(other, lambda: runSetup({}, out, err, ask=ended))
        self.assertEqual(code, 2)
        self.assertIn("nothing was written", err.getvalue())
        self.assertFalse(Path(other, ".env").exists())

    def inHome(self, home: str, run):
        old = os.environ.get("HERMES_HOME")
        os.environ["HERMES_HOME"] = home
        try:
            return run()
        finally:
            if old is None:
                del os.environ["HERMES_HOME"]
            else:
                os.environ["HERMES_HOME"] = old

    def test_writeEnvKeepsTheHomePrivate(self) -> None:
        """.env is 0600 in a home made 0700 whatever the umask; a home others could
        read is tightened, and a stale 0644 .env.tmp leaves no trace."""
        top = Path(tempfile.mkdtemp())
        old = os.umask(0o000)
        try:
            writeEnv(top / "new" / ".env", {"HERMES_API_KEY": SECRET})
        finally:
            os.umask(old)
        self.assertEqual(stat.S_IMODE((top / "new").stat().st_mode), 0o700)
        self.assertEqual(stat.S_IMODE((top / "new" / ".env").stat().st_mode), 0o600)
        shared = top / "shared"
        shared.mkdir(mode=0o755)
        shared.chmod(0o755)
        (shared / ".env.tmp").write_text("stale")
        (shared / ".env.tmp").chmod(0o644)
        writeEnv(shared / ".env", {"HERMES_API_KEY": SECRET})
        self.assertEqual(stat.S_IMODE(shared.stat().st_mode), 0o700)
        self.assertEqual(stat.S_IMODE((shared / ".env").stat().st_mode), 0o600)
        self.assertEqual(sorted(p.name for p in shared.iterdir()), [".env"])

    def test_writeEnvQuotesValues(self) -> None:
        """Values with quotes and backslashes survive a round trip through python-dotenv."""
        from dotenv import dotenv_values

        path = Path(tempfile.mkdtemp(), "sub", ".env")
        writeEnv(path, {"HERMES_API_KEY": 'a"b\\c d#e'})
        self.assertEqual(dotenv_values(path)["HERMES_API_KEY"], 'a"b\\c d#e')
