"""The README's two commands on a machine whose Python refuses `pip install` (PEP 668),
typed into a terminal as a newcomer would (issue 11).

It uses the machine's own system Python when it is such a one (Debian and Ubuntu
ship an EXTERNALLY-MANAGED marker) and skips, saying why, where there is none. The
install downloads the dependencies from the package index (or the pip cache), as
the README's command does.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")


def externallyManagedPython() -> str | None:
    """A system Python >= 3.11 that refuses pip installs, if the machine has one."""
    probe = "import sys, sysconfig, os; print(sys.version_info >= (3, 11) and sys.prefix == sys.base_prefix " \
            "and os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"
    for candidate in CANDIDATES:
        if os.path.exists(candidate):
            found = subprocess.run([candidate, "-I", "-c", probe], capture_output=True, text=True, timeout=30)
            if found.stdout.strip() == "True":
                return candidate
    return None


def readmeCommands() -> list[str]:
    """The shell commands of the README's "Install and run" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Install and run") :]
    section = section[: section.index("\n## ", 3)]
    return [block.strip() for block in re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)]


class Terminal:
    """A command on a pseudo-terminal of its own (its controlling tty), for typing into."""

    def __init__(self, command: str, env: dict[str, str], cwd: Path) -> None:
        master, slave = pty.openpty()

        def becomeTerminalOwner() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(["bash", "-c", command], stdin=slave, stdout=slave, stderr=slave,
                                        env=env, cwd=cwd, preexec_fn=becomeTerminalOwner)
        os.close(slave)
        self.master = master
        self.seen = b""
        self.mark = 0

    def expect(self, text: str, timeout: float = 60) -> None:
        """Wait (at most ``timeout`` s) until ``text`` appears after what was expected last."""
        deadline = time.monotonic() + timeout
        while (found := self.seen.find(text.encode(), self.mark)) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(f"{text!r} never appeared; the terminal shows:\n{self.seen[-3000:].decode(errors='replace')}")
        self.mark = found + len(text)

    def _read(self, timeout: float) -> bool:
        if select.select([self.master], [], [], timeout)[0]:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: everyone closed the terminal
                data = b""
            self.seen += data
            return bool(data)
        return True

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def finish(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        try:
            return self.process.wait(max(0.0, deadline - time.monotonic()))
        finally:
            os.close(self.master)


def scriptedModel(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    script = {
        "default": [
            [{"tool_calls": [{"id": "w", "name": "write_file", "arguments": {"path": "hello.py", "content": "print('hello')\n"}}]}],
            [{"tool_calls": [{"id": "r", "name": "terminal", "arguments": {"command": "python3 hello.py"}}]}],
            [{"text": "Done: hello.py prints hello."}],
        ],
    }
    (tmp / "script.json").write_text(json.dumps(script))
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripted_model.py"), "--script", str(tmp / "script.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert server.stdout is not None
    return server, server.stdout.readline().decode().strip()


def test_readmeFromNothingToAFirstAnswer(tmp_path: Path) -> None:
    """On a Python that refuses `pip install`: the README's first command installs,
    sets up (asking again for a URL without a scheme) and checks; its second runs a
    first prompt that creates and runs hello.py, asking before the edit."""
    python = externallyManagedPython()
    if python is None:
        pytest.skip("this machine has no system Python that refuses pip installs (EXTERNALLY-MANAGED)")
    install, firstPrompt = readmeCommands()
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if key.startswith(("PIP_", "SSL_", "REQUESTS_CA"))}
    env.update(HOME=str(home), PATH=f"{os.path.dirname(python)}:/usr/bin:/bin", LANG="C.UTF-8", TERM="dumb",
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", os.path.expanduser("~/.cache/pip")),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    refused = subprocess.run([python, "-m", "pip", "install", "--dry-run", "attrs"], capture_output=True, text=True,
                             env=env, timeout=300)
    assert refused.returncode != 0 and re.search("externally-managed-environment|No module named pip", refused.stderr)
    if subprocess.run([python, "-c", "import ensurepip"], capture_output=True, env=env).returncode != 0:
        failed = subprocess.run(["bash", "-c", install], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert failed.returncode != 0 and "python3" in failed.stdout + failed.stderr and "venv" in failed.stdout + failed.stderr
        pytest.skip("this system Python has no ensurepip (python3-venv): the README names the package to install")

    server, url = scriptedModel(tmp_path)
    try:
        terminal = Terminal(install, env, ROOT)  # `python3` is the system Python: it comes first on PATH
        terminal.expect("Choose 1-4: ", timeout=900)  # after pip has installed everything
        terminal.type("4\n")
        terminal.expect("Base URL")
        terminal.type("127.0.0.1/v1\n")
        terminal.expect("must start with http:// or https://")
        terminal.expect("Base URL")
        terminal.type(url + "\n")
        terminal.expect("API key")
        terminal.type("\n")
        terminal.expect("Default model")
        terminal.type("scripted-model\n")
        terminal.expect("Ready.")
        assert terminal.finish() == 0
        assert (home / ".local" / "bin" / "hermes-acp").exists()

        # A new terminal, as after the next login: ~/.local/bin is on PATH.
        env["PATH"] = f"{home / '.local' / 'bin'}:{env['PATH']}"
        terminal = Terminal(firstPrompt, env, home)
        terminal.expect("Allow?")
        terminal.type("y\n")
        terminal.expect("Done: hello.py prints hello.")
        terminal.expect("[end_turn]")
        assert terminal.finish() == 0
    finally:
        server.kill()
        server.wait()
    assert (home / "hermes-try" / "hello.py").read_text() == "print('hello')\n"
    assert "hello" in terminal.seen.decode(errors="replace")
