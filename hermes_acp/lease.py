"""Which process runs a session's turn: the owner recorded in ``state.db``.

Two editor windows may share one ``state.db``. A turn records its process as
the owner; another process that loads the session mid-turn must leave that
turn alone (not journal its tool calls as failed, not start a second turn on
the same history), and may only recover it once its owner is gone. A token
names the host, the boot, the process id and the process's start time, so a
reused pid is not mistaken for the owner. Pure Python, no Twisted.
"""

from __future__ import annotations

import os
import socket
from functools import cache


def _bootId() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _startTime(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), else ""."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 :].split()[19].decode()  # field 22, after "(comm)"


@cache
def ownerToken() -> str:
    """This process, as recorded on the turns it runs."""
    return f"{socket.gethostname()}|{_bootId()}|{os.getpid()}|{_startTime(os.getpid())}"


def ownerAlive(token: str | None) -> bool:
    """Whether another live process on this machine holds ``token``.

    An empty token, this process's own, another boot's, or a process that has
    exited (or whose pid now belongs to a younger process) is not alive. So is
    another host's: its process cannot be checked from here, and a session is
    better recovered than wedged for good (SQLite on a shared network disk is
    not supported anyway).
    """
    if not token or token == ownerToken():
        return False
    try:
        host, boot, pidText, started = token.split("|")
        pid = int(pidText)
    except ValueError:
        return False
    if host != socket.gethostname() or boot != _bootId() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, and someone else's
    return not started or _startTime(pid) in ("", started)


def describeOwner(token: str | None) -> str:
    """"process 123" for a message to the user."""
    try:
        return f"process {int((token or '').split('|')[2])}"
    except (IndexError, ValueError):
        return "another process"
