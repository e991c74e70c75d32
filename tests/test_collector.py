"""The collector while the agent loads its modules for good (``hermes_acp.collector``): off during
the load, what loaded frozen after, on again as before; in the real entry points' order."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from hermes_acp.collector import loadingForGood

from .agentproc import agentEnv


@pytest.fixture
def unfrozen():
    """Whatever a test freezes is thawed again after it (the test process keeps its collector)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.enable() if enabled else gc.disable()


def test_theCollectorIsOffWhileLoadingAndWhatLoadedIsFrozen(unfrozen: None) -> None:
    gc.unfreeze()
    gc.enable()
    with loadingForGood():
        assert not gc.isenabled()
        made = [[n] for n in range(5000)]  # tracked objects made while loading
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)


def test_anErrorWhileLoadingStillFreezesAndTurnsTheCollectorBackOn(unfrozen: None) -> None:
    gc.enable()
    with pytest.raises(ImportError):
        with loadingForGood():
            raise ImportError("a module that is not there")
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def test_aCollectorThatWasOffStaysOff(unfrozen: None) -> None:
    gc.disable()
    with loadingForGood():
        pass
    assert not gc.isenabled()


def _inFreshProcess(code: str) -> list[object]:
    """Run ``code`` (which prints one JSON line) in a fresh interpreter with its own HERMES_HOME."""
    done = subprocess.run([sys.executable, "-c", code], env=agentEnv(), capture_output=True, timeout=60, check=True)
    return json.loads(done.stdout.decode().splitlines()[-1])


def test_theEnginesWarmUpFreezesItOncePerProcess() -> None:
    """The engine's warm-up freezes it; a second warm-up (another connection's) finds
    it imported and freezes nothing: that connection's sessions, which can end, stay collectable."""
    before, after, again, enabled = _inFreshProcess(
        "import gc, json; from hermes_acp import acp\n"
        "before = gc.get_freeze_count(); acp._importEngine(); after = gc.get_freeze_count()\n"
        "kept = [[n] for n in range(1000)]; acp._importEngine()\n"
        "print(json.dumps([before, after, gc.get_freeze_count(), gc.isenabled()]))")
    assert after - before > 10_000  # the engine's modules and what they hold
    assert again <= after  # (frozen objects freed meanwhile leave the count)
    assert enabled


def test_theServiceIsBuiltWithItsModulesFrozenAndTheCollectorOn() -> None:
    """``makeService`` (the ``hermes-acp`` command's and ``twist hermes-acp``'s) loads the agent's
    modules for good and leaves the collector on for the agent's life."""
    before, after, enabled = _inFreshProcess(
        "import gc, json; from hermes_acp.tap import Options, makeService\n"
        "options = Options(); options.parseOptions([]); before = gc.get_freeze_count()\n"
        "makeService(options)\n"
        "print(json.dumps([before, gc.get_freeze_count(), gc.isenabled()]))")
    assert after - before > 10_000
    assert enabled
