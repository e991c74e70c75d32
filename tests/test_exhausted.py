"""Running out of descriptors or memory is named as such (engine.exhausted)."""

from __future__ import annotations

import errno
import os

import pytest

from hermes_acp.engine import exhausted


def test_whatRanOutIsNamed() -> None:
    assert exhausted.describe(OSError(errno.EMFILE, os.strerror(errno.EMFILE))) == (
        "the agent has run out of file descriptors (Too many open files)")
    assert "file descriptors" in exhausted.describe(OSError(errno.ENFILE, "x"))
    assert "memory" in exhausted.describe(MemoryError())
    assert "memory" in exhausted.describe(OSError(errno.ENOMEM, "x"))
    assert exhausted.describe(PermissionError(errno.EACCES, "Permission denied")) is None
    assert exhausted.describe(ValueError("x")) is None


def test_anErrorThatHidesItIsReplaced(monkeypatch: pytest.MonkeyPatch) -> None:
    assert exhausted.orShown("DNS lookup failed") == "DNS lookup failed"
    exhausted.check()  # descriptors to spare: nothing raised

    def out(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(exhausted.os, "open", out)
    assert exhausted.orShown("DNS lookup failed") == "the agent has run out of file descriptors (Too many open files)"
    with pytest.raises(OSError, match="Too many open files"):
        exhausted.check()
