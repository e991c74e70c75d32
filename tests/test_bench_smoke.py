"""The benchmark script itself still runs (it reports speed; nothing here asserts it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "bench" / "run.py"


@pytest.mark.slow
def test_benchQuickRuns() -> None:
    """A short run of two cases prints the table with their rows and exits 0."""
    result = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--only", "session,cancel"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| measure | median | runs |" in result.stdout
    assert "| `session/new` |" in result.stdout
    assert "| cancel latency" in result.stdout
    assert "Machine: CPU " in result.stdout
