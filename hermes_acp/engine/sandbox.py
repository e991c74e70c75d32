"""The OS sandbox for commands the agent runs: Linux Landlock, through its system calls.

A sandboxed command may write only beneath the session's folders, the temp
folder and the tool caches a build needs (``Policy.writable``); it may read
everything except the user's secrets (``Policy.hidden``: SSH and cloud keys,
``$HERMES_HOME``, credential files), and it cannot signal processes outside
its sandbox (the agent, the user's programs). With ``network=False`` it cannot
open or accept TCP connections either.

Landlock restricts the calling *thread* and everything it starts afterwards.
So each policy gets a spawner thread of its own that restricts itself once
(``PR_SET_NO_NEW_PRIVS``, then ``landlock_restrict_self``) and from then on only
starts processes: they inherit its sandbox before they run a single
instruction of the command, the agent's other threads stay free, and a
process still starts with ``vfork`` (no Python code in the child, unless
resource limits are set: ``processes.Limits`` applies them before exec).

No library is needed: the three system calls are made with ``ctypes``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import attrs

from hermes_acp.engine import exhausted
from hermes_acp.engine.sensitive import SHELL_STARTUP, hiddenPaths, inside

T = TypeVar("T")

# System call numbers (the same on every Linux architecture) and prctl options.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Access rights (linux/landlock.h) and the ABI version that introduced each.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14
_WRITE_V1 = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO \
    | MAKE_BLOCK | MAKE_SYM
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
#: The rights that a rule on a single file (not a folder) may carry.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE
#: Devices every program expects to write to.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx")
_DEVICE_FOLDERS = ("/dev/pts", "/dev/shm")
#: Spawner threads kept at once; the least recently used one ends first. One that had no job
#: for ``SPAWNER_IDLE`` seconds ends too (the next command of its policy starts another), so
#: sessions that came and went leave no threads behind.
MAX_SPAWNERS = 32
SPAWNER_IDLE = 60.0


class SandboxError(OSError):
    """The sandbox could not be set up for a command; the message says why."""


@attrs.frozen
class Support:
    """What this machine offers: the Landlock ABI version (0: none) and, when
    there is none, why."""

    abi: int
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.abi > 0

    @property
    def networkRules(self) -> bool:
        return self.abi >= 4


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _syscall(number: int, *args: Any) -> int:
    result = int(_libc().syscall(ctypes.c_long(number), *args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


_probed: Support | None = None


def probe() -> Support:
    """Ask the kernel (once) which Landlock ABI it offers."""
    global _probed
    if _probed is None:
        try:
            _probed = _probe()
        except OSError as e:  # out of descriptors or memory: asked again next time
            return Support(0, f"the sandbox could not be set up: {e.strerror}")
    return _probed


def _probe() -> Support:
    if not sys.platform.startswith("linux"):
        return Support(0, f"Landlock is Linux-only and this is {sys.platform}")
    try:
        abi = _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError as e:
        if e.errno in exhausted.EXHAUSTED:
            raise
        if e.errno == errno.ENOSYS:
            return Support(0, "this kernel has no Landlock (Linux 5.13 or later is needed)")
        if e.errno == errno.EOPNOTSUPP:
            return Support(0, "Landlock is built into this kernel but not enabled (boot option lsm=...,landlock)")
        return Support(0, f"Landlock is unavailable: {e.strerror}")
    return Support(abi)


def writeRights(abi: int) -> int:
    """Every right that changes the file system, as far as ``abi`` knows them."""
    rights = _WRITE_V1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


@attrs.frozen
class Policy:
    """What one session's sandboxed commands may touch.

    ``writable``: folders (and files) beneath which they may change anything;
    ``hidden``: paths whose contents they may neither read nor change, even
    beneath a writable folder (but not beneath a temp folder); ``network``:
    whether they may use TCP."""

    writable: tuple[str, ...]
    hidden: tuple[str, ...] = ()
    network: bool = True
    #: Those of ``writable`` that are temp folders: never split for ``hidden``
    #: (programs must be able to make new files in them).
    temporary: tuple[str, ...] = ()
    #: Paths beneath a writable folder that stay read-only (shell startup files,
    #: when the home folder is a session's folder).
    readOnly: tuple[str, ...] = ()


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handledAccessFs", ctypes.c_uint64), ("handledAccessNet", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowedAccess", ctypes.c_uint64), ("parentFd", ctypes.c_int32)]


def grants(root: str, hidden: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    """The rules that cover ``root`` except ``hidden``, as ``(path, whole)``:
    ``(root, True)`` when nothing hidden lies beneath it; else ``(root, False)``
    (the folder itself, split) and then each of its entries in turn, leaving out
    the hidden ones and splitting those that hold one.

    Entries made later in a split folder are not covered; only folders that
    lead to a hidden path are ever split."""
    if root in hidden:
        return
    if not any(inside(path, root) for path in hidden):
        yield root, True
        return
    yield root, False
    try:
        names = os.listdir(root)
    except OSError as e:
        if e.errno in exhausted.EXHAUSTED:
            raise
        return
    for name in names:
        path = os.path.join(root, name)
        if not os.path.islink(path):  # a link is covered (or not) where it leads
            yield from grants(path, hidden)


def _real(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.lexists(p)))


def restrictThisThread(policy: Policy, support: Support) -> list[str]:
    """Confine the calling thread, and all it starts later, to ``policy``;
    return the folders split to leave the hidden paths out.

    Irreversible for the thread: call it only in a thread that does nothing
    but start the sandboxed processes."""
    abi = support.abi
    write = writeRights(abi)
    read = READ_FILE | READ_DIR
    hidden = _real(policy.hidden)
    kept = hidden + _real(policy.readOnly)
    attr = _RulesetAttr(write | read, 0 if policy.network else _NET_BIND_TCP | _NET_CONNECT_TCP,
                        (_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET) if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    if not policy.network and abi < 4:
        raise SandboxError(errno.EOPNOTSUPP, "turning the network off needs Landlock ABI 4 (Linux 6.7)")
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    temp = _real(policy.temporary)
    split: list[str] = []
    try:
        # A split folder may still be listed (the names in it, not their contents);
        # nothing can be made directly inside it, except in a temp folder, never split.
        for path, whole in grants("/", hidden):
            _allow(ruleset, path, read if whole else READ_DIR)
            split += [] if whole else [path]
        for root in _real(policy.writable):
            for path, whole in grants(root, () if root in temp else kept):
                _allow(ruleset, path, (write | read) if whole else READ_DIR)
                split += [] if whole else [path]
        for device in _real(_DEVICES):
            _allow(ruleset, device, WRITE_FILE | (TRUNCATE if abi >= 3 else 0))
        for folder in _real(_DEVICE_FOLDERS):
            _allow(ruleset, folder, write | read)
        _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return split


def _allow(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in exhausted.EXHAUSTED:
            raise
        return  # gone since it was listed: nothing to allow
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        if rights:
            rule = _PathBeneathAttr(rights, fd)
            _syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                     ctypes.c_uint32(0))
    finally:
        os.close(fd)


@attrs.define(eq=False)
class _Job:
    work: Callable[[], Any]
    done: threading.Event = attrs.field(factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self.error = e
        self.done.set()


_STOP = object()


class _Spawner(threading.Thread):
    """A thread confined to one policy; it runs the jobs given to it (starting processes).

    Its rules name what the split folders held when it started; once one of
    them changes (an entry made or removed), or the folder where a missing
    secret would appear does, it is ``stale`` and replaced; so is one that
    failed to set up (the next command tries again)."""

    def __init__(self, policy: Policy, support: Support) -> None:
        super().__init__(name="hermes-sandbox", daemon=True)
        self.policy, self.support = policy, support
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ready = threading.Event()
        self.failure: SandboxError | None = None
        self.splits: dict[str, int] = {}

    def run(self) -> None:
        try:
            watched = restrictThisThread(self.policy, self.support) + [
                _existing(p) for p in self.policy.hidden if not os.path.lexists(p)]
            self.splits = {path: _changed(path) for path in watched}
        except BaseException as e:  # noqa: BLE001 - every job is told, none waits for ever
            self.failure = SandboxError(
                getattr(e, "errno", None) or (errno.ENOMEM if isinstance(e, MemoryError) else errno.EPERM),
                f"the sandbox could not be set up: {getattr(e, 'strerror', None) or str(e) or type(e).__name__}")
        self.ready.set()
        while (job := self._next()) is not _STOP:
            if self.failure is not None:
                job.error = self.failure
                job.done.set()
            else:
                job.run()


    def _next(self) -> Any:
        """The next job; ``_STOP`` once idle for ``SPAWNER_IDLE`` seconds. Jobs are queued
        under ``_spawnersLock``, so none can arrive after the spawner left the table."""
        while True:
            try:
                return self.jobs.get(timeout=SPAWNER_IDLE)
            except queue.Empty:
                with _spawnersLock:
                    if self.jobs.empty():
                        if _spawners.get(self.policy) is self:
                            del _spawners[self.policy]
                        return _STOP

    def stale(self) -> bool:
        return self.ready.is_set() and any(_changed(path) != seen for path, seen in self.splits.items())


def _existing(path: str) -> str:
    """``path``, or its nearest folder that exists (where a secret made later appears)."""
    while not os.path.lexists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _changed(path: str) -> int:
    """When the folder ``path`` last changed (-1: gone)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


_spawners: OrderedDict[Policy, _Spawner] = OrderedDict()
_spawnersLock = threading.Lock()


def runConfined(policy: Policy, work: Callable[[], T]) -> T:
    """Run ``work`` (which starts a process) in ``policy``'s sandbox and return
    what it returned; a ``SandboxError`` when the sandbox cannot be had."""
    support = probe()
    if not support.available:
        raise SandboxError(errno.EOPNOTSUPP, support.reason)
    with _spawnersLock:
        spawner = _spawners.get(policy)
        if spawner is not None and (spawner.stale() or spawner.failure is not None):
            del _spawners[policy]
            spawner.jobs.put(_STOP)
            spawner = None
        if spawner is None:
            spawner = _spawners[policy] = _Spawner(policy, support)
            spawner.start()
            if len(_spawners) > MAX_SPAWNERS:
                _, oldest = _spawners.popitem(last=False)
                oldest.jobs.put(_STOP)
        _spawners.move_to_end(policy)
        job = _Job(work)
        spawner.jobs.put(job)  # under the lock: never behind the _STOP of an eviction
    job.done.wait()
    if job.error is not None:
        raise job.error
    result: T = job.result
    return result


#: Beneath the home folder: the caches builds and package managers write to.
TOOL_CACHES = (".cache", ".npm", ".yarn", ".pnpm-store", ".local/share/pnpm", ".bun/install", ".cargo/registry",
               ".cargo/git", ".rustup/tmp", "go/pkg/mod", ".m2/repository", ".gradle/caches", ".gradle/wrapper",
               ".ivy2/cache", ".sbt", ".nuget/packages", ".deno", ".ccache", ".node-gyp", ".pub-cache")


def policyFor(folders: Iterable[str], network: bool = True, extraWritable: Iterable[str] = (),
              env: Any = None) -> Policy | None:
    """The policy of a session whose folders are ``folders``: writes there, in
    the temp folder, the tool caches and ``extraWritable``; secrets hidden.
    None where this machine has no sandbox (its commands then ask instead)."""
    if not probe().available:
        return None
    home = os.path.expanduser("~")
    try:
        temporary = (os.path.realpath(tempfile.gettempdir()),)
    except FileNotFoundError:  # "no usable temporary directory": also what it says out of descriptors
        exhausted.check()
        raise
    caches = tuple(os.path.join(home, name) for name in TOOL_CACHES)
    writable = (*(os.path.realpath(f) for f in folders), *temporary, *caches, *extraWritable)
    startup = tuple(os.path.join(home, name) for name in SHELL_STARTUP)
    return Policy(tuple(dict.fromkeys(writable)), hiddenPaths(env), network or not probe().networkRules, temporary,
                  startup)


def describe(enabled: bool, network: bool = True) -> str:
    """Which protection commands get on this machine, in a sentence for ``--check`` and ``/doctor``."""
    support = probe()
    if not enabled:
        return ("off (HERMES_ACP_SANDBOX=off): every command that is not a known read-only command asks "
                "before it runs")
    if not support.available:
        return (f"none ({support.reason}): every command that is not a known read-only command asks "
                "before it runs")
    net = "network on" if network else "network off" if support.networkRules else \
        f"network on (turning it off needs Landlock ABI 4; this kernel has {support.abi})"
    return (f"sandboxed (Landlock ABI {support.abi}): commands write only in the session's folders, the temp "
            f"folder and build caches, cannot read secrets, cannot signal other processes; {net}")
