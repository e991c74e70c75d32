"""Replacing a file so that a reader, a crash or a second process sees the old file or the new
one, never half of either: the one way the agent writes its own files (memory, skills, tokens,
checkpoints, the files a rewind puts back, ``.env``).
"""

from __future__ import annotations

import contextlib
import os
import uuid


def replaceFile(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o600,
                durable: bool = False) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8, line ends as given).

    The data goes to a temporary file beside ``path`` under a name made new for this write
    (created exclusively and never through a link, so nothing an attacker left at a name chosen
    in advance, a FIFO or a symlink, is opened), which gets ``mode`` and is renamed over
    ``path``; on failure it is removed and ``path`` is as it was. ``durable`` also flushes the
    data and then the rename to disk, for what must survive a power cut (a rotated refresh
    token, the user's memory).
    """
    target = os.fspath(path)
    folder = os.path.dirname(target) or "."
    temporary = os.path.join(folder, f".{os.path.basename(target)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode != 0o600:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        with contextlib.suppress(OSError):
            handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
