"""The Landlock sandbox (engine.sandbox), on this kernel: what a confined command
may write, read, signal and reach. Skipped, with the reason, where the kernel
has no Landlock."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
from pathlib import Path

import pytest

from hermes_acp.engine import sandbox
from hermes_acp.engine.sandbox import Policy, grants, runConfined

SUPPORT = sandbox.probe()
needsLandlock = pytest.mark.skipif(not SUPPORT.available, reason=f"no Landlock here: {SUPPORT.reason}")


def run(policy: Policy, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return runConfined(policy, lambda: subprocess.run(
        ["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30))


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A workspace, a folder outside it with a secret folder in it, and a temp folder."""
    found = {name: tmp_path / name for name in ("work", "outside", "temp")}
    for path in found.values():
        path.mkdir()
    found["secret"] = found["outside"] / "keys"
    found["secret"].mkdir()
    (found["secret"] / "id").write_text("KEY")
    (found["outside"] / "keep.txt").write_text("keep")
    return found


def policyOf(places: dict[str, Path], network: bool = True) -> Policy:
    return Policy((str(places["work"]), str(places["temp"])), (str(places["secret"]),), network,
                  (str(places["temp"]),))


def test_grantsSplitOnlyTowardsHiddenPaths(tmp_path: Path) -> None:
    """Folders that lead to a hidden path are split (listed, not granted whole);
    every other entry is granted whole; the hidden path itself is left out."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "c").mkdir()
    (tmp_path / "d").mkdir()
    hidden = (str(tmp_path / "a" / "b"),)
    assert dict(grants(str(tmp_path), hidden)) == {
        str(tmp_path): False, str(tmp_path / "a"): False, str(tmp_path / "a" / "c"): True, str(tmp_path / "d"): True}
    assert list(grants(str(tmp_path / "d"), hidden)) == [(str(tmp_path / "d"), True)]


@needsLandlock
def test_writesOnlyInTheWorkspaceAndTemp(places: dict[str, Path]) -> None:
    policy = policyOf(places)
    done = run(policy, f"touch a && touch {places['temp']}/t && echo ok", places["work"])
    assert (done.returncode, done.stdout.strip()) == (0, "ok")
    for command in (f"rm -rf {places['outside']}", f"touch {places['outside']}/new", f"mv {places['outside']} x",
                    f": > {places['outside']}/keep.txt", f"python3 -c 'import shutil; shutil.rmtree(\"{places['outside']}\")'"):
        denied = run(policy, command, places["work"])
        assert denied.returncode != 0, command
        assert "ermission denied" in denied.stderr or "not permitted" in denied.stderr, (command, denied.stderr)
    assert (places["outside"] / "keep.txt").read_text() == "keep"


@needsLandlock
def test_hiddenPathsCannotBeRead(places: dict[str, Path]) -> None:
    """The secret folder's names may be listed; its contents cannot be read or changed;
    the files beside it can be read."""
    policy = policyOf(places)
    assert run(policy, "cat ../outside/keys/id", places["work"]).returncode != 0
    assert run(policy, "ls ../outside/keys", places["work"]).stdout.strip() == "id"
    assert run(policy, "cat ../outside/keep.txt", places["work"]).stdout == "keep"


@needsLandlock
def test_aHiddenPathInsideTheWorkspaceStaysHidden(places: dict[str, Path]) -> None:
    """A workspace that holds a secret (the home folder opened as a project) is split
    around it: the rest stays writable, the secret unreadable and unchanged."""
    (places["work"] / "keys").mkdir()
    (places["work"] / "keys" / "id").write_text("KEY")
    (places["work"] / "src").mkdir()
    policy = Policy((str(places["work"]),), (str(places["work"] / "keys"),))
    assert run(policy, "touch src/new && echo ok", places["work"]).stdout.strip() == "ok"
    assert run(policy, "cat keys/id", places["work"]).returncode != 0
    assert run(policy, "echo x > keys/id", places["work"]).returncode != 0
    assert (places["work"] / "keys" / "id").read_text() == "KEY"


@needsLandlock
@pytest.mark.skipif(SUPPORT.abi < 6, reason="signal scoping needs Landlock ABI 6")
def test_cannotSignalTheAgent(places: dict[str, Path]) -> None:
    denied = run(policyOf(places), f"kill -0 {os.getpid()}", places["work"])
    assert denied.returncode != 0 and "not permitted" in denied.stderr


@needsLandlock
@pytest.mark.skipif(SUPPORT.abi < 4, reason="network rules need Landlock ABI 4")
def test_networkSettingTurnsTcpOff(places: dict[str, Path]) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe = f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5); print(\"connected\")'"
        assert run(policyOf(places), probe, places["work"]).stdout.strip() == "connected"
        assert run(policyOf(places, network=False), probe, places["work"]).returncode != 0


@needsLandlock
def test_manyPoliciesNeverStrandAJob(places: dict[str, Path]) -> None:
    """More policies than spawner threads: the oldest end, no job is lost."""
    for index in range(sandbox.MAX_SPAWNERS + 3):
        policy = Policy((str(places["work"] / str(index)),))
        assert runConfined(policy, lambda: index) == index


@needsLandlock
def test_anIdleSpawnerEnds(places: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawner with no work for SPAWNER_IDLE seconds ends and leaves the table (sessions
    that came and went leave no threads); the next job of its policy gets a new one."""
    monkeypatch.setattr(sandbox, "SPAWNER_IDLE", 0.2)
    policy = Policy((str(places["work"] / "idle"),))
    assert runConfined(policy, lambda: 1) == 1
    first = sandbox._spawners[policy]
    first.join(10)
    assert not first.is_alive() and policy not in sandbox._spawners
    assert runConfined(policy, lambda: 2) == 2
    assert sandbox._spawners[policy] is not first


def test_unavailableSandboxSaysWhy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "_probed", sandbox.Support(0, "no Landlock in this test"))
    with pytest.raises(sandbox.SandboxError, match="no Landlock in this test"):
        runConfined(Policy(("/tmp",)), lambda: None)
    assert "asks before it runs" in sandbox.describe(True)
    assert sandbox.policyFor(["/tmp"]) is None  # so a session's commands fall back to asking


@needsLandlock
def test_aNewEntryBesideASecretIsReadable(places: dict[str, Path]) -> None:
    """The folder holding a secret is split into rules for what it held; an entry
    made there later is covered too (the sandbox is rebuilt when the folder changes)."""
    policy = policyOf(places)
    assert run(policy, "cat ../outside/keep.txt", places["work"]).stdout == "keep"
    (places["outside"] / "later.txt").write_text("later")
    assert run(policy, "cat ../outside/later.txt", places["work"]).stdout == "later"
    assert run(policy, "cat ../outside/keys/id", places["work"]).returncode != 0


@needsLandlock
def test_aSecretMadeLaterIsHiddenToo(places: dict[str, Path]) -> None:
    """A hidden path that did not exist when the sandbox was built is hidden once it does."""
    later = places["outside"] / "later-keys"
    policy = Policy((str(places["work"]),), (str(places["secret"]), str(later)))
    assert run(policy, "true", places["work"]).returncode == 0
    later.mkdir()
    (later / "id").write_text("KEY")
    assert run(policy, "cat ../outside/later-keys/id", places["work"]).returncode != 0


@needsLandlock
def test_runningOutOfDescriptorsIsNamedAndNotRemembered(places: dict[str, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that cannot be made because the agent is out of file descriptors fails
    the command with that reason (not a sandbox without the rule, whose commands all
    fail with "Permission denied"); once descriptors are free again, commands run."""
    policy = policyOf(places)
    real = os.open

    def exhausted(path, flags, *args, **kwargs):
        if flags & os.O_PATH:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(sandbox.os, "open", exhausted)
    with pytest.raises(sandbox.SandboxError, match="Too many open files"):
        run(policy, "echo never", places["work"])
    monkeypatch.setattr(sandbox.os, "open", real)
    done = run(policy, "echo ok", places["work"])
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "ok", "")


def test_aProbeOutOfDescriptorsIsNotRemembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "_probed", None)

    def exhausted() -> sandbox.Support:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(sandbox, "_probe", exhausted)
    assert "Too many open files" in sandbox.probe().reason
    assert sandbox._probed is None  # asked again next time
