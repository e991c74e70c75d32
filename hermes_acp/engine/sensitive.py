"""Which paths hold the user's secrets, or change how their machine behaves.

One list, used by every door: reading a file (``read_file``, ``search_files``)
asks for a *secret* in every mode; writing asks for a secret or a *protected*
file (shell startup files, ``/etc``, ``.git`` folders) in every mode; and the
sandbox hides the secrets from commands (``hiddenPaths``). A path is judged by
where it leads: its symlinks resolved, and a hard link recognised by the file
it shares with a secret.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from hermes_acp.config import hermesHome

#: Beneath the home folder: folders and files that hold keys and credentials.
HOME_SECRETS = {
    ".ssh": "SSH keys and configuration",
    ".gnupg": "GnuPG keys",
    ".aws": "AWS credentials",
    ".azure": "Azure credentials",
    ".config/gcloud": "Google Cloud credentials",
    ".kube": "Kubernetes credentials",
    ".docker/config.json": "Docker registry credentials",
    ".config/gh": "GitHub CLI credentials",
    ".password-store": "a password store",
    ".local/share/keyrings": "the desktop keyring",
}
#: File names that are credentials wherever they are.
SECRET_NAMES = {
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "authorized_keys", "known_hosts", ".netrc", ".pgpass",
    ".npmrc", ".pypirc", ".git-credentials", "credentials.json", "service-account.json",
}
KEY_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore", ".jks")
#: Files whose change runs code later, or changes the whole machine.
SHELL_STARTUP = {".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zprofile",
                 ".zshenv", ".zlogin", ".zlogout", ".kshrc", ".cshrc", ".tcshrc", ".inputrc", ".xprofile",
                 ".xinitrc", ".xsessionrc"}
_PROTECTED_DIRS = {".git", ".hermes"}
#: Folders that hold keys wherever they are (a copy of a home folder, a container's root).
_SECRET_DIRS = {".ssh": "SSH keys and configuration", ".gnupg": "GnuPG keys", ".aws": "AWS credentials"}


def _home(env: Mapping[str, str] | None) -> str:
    env = os.environ if env is None else env
    return os.path.realpath(env.get("HOME") or os.path.expanduser("~"))


def hiddenPaths(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret folders and files a sandboxed command may not read: those of
    ``HOME_SECRETS`` and ``$HERMES_HOME`` (the agent's key and every conversation)."""
    home = _home(env)
    paths = [os.path.join(home, name) for name in HOME_SECRETS]
    paths += [os.path.join(home, name) for name in (".netrc", ".pgpass", ".git-credentials", ".pypirc", ".npmrc")]
    paths.append(str(hermesHome(env)))
    return tuple(os.path.realpath(p) for p in paths)


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies beneath it (both absolute, normalised)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _secretByName(path: str, env: Mapping[str, str] | None) -> str | None:
    home = _home(env)
    for name, kind in HOME_SECRETS.items():
        if inside(path, os.path.join(home, name)):
            return kind
    if inside(path, os.path.realpath(hermesHome(env))):
        return "the agent's own settings and conversations ($HERMES_HOME)"
    parts = path.split(os.sep)[:-1]
    for folder, kind in _SECRET_DIRS.items():
        if folder in parts:
            return kind
    base = os.path.basename(path)
    if base == ".env" or base.startswith(".env."):
        return "an environment (.env) file"
    if base in SECRET_NAMES:
        return "a credentials file"
    if base.endswith(KEY_SUFFIXES):
        return "a key or certificate file"
    return None


def _secretFiles(env: Mapping[str, str] | None, protected: bool = False) -> Iterator[str]:
    """The files of the secret folders (one level deep) and the secret files;
    with ``protected``, the shell startup files of the home folder too."""
    if protected:
        yield from (os.path.join(_home(env), name) for name in SHELL_STARTUP)
    for path in hiddenPaths(env):
        if os.path.isdir(path):
            try:
                yield from (os.path.join(path, name) for name in os.listdir(path))
            except OSError:
                continue
        else:
            yield path


def _linked(path: str, env: Mapping[str, str] | None, protected: bool = False) -> str | None:
    """For a file with more than one name: the secret (or, with ``protected``,
    the startup file) it is another name of."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if info.st_nlink < 2 or not os.path.isfile(path):
        return None
    for other in _secretFiles(env, protected):
        try:
            same = os.stat(other)
        except OSError:
            continue
        if (same.st_dev, same.st_ino) == (info.st_dev, info.st_ino):
            real = os.path.realpath(other)
            return _secretByName(real, env) or _protectedByName(real) or "a secret file"
    return None


#: The longest path the kernel takes, in bytes with the final NUL (Linux).
_PATH_MAX = 4096


def _leadsTo(path: str) -> str:
    """Where ``path`` leads, its links resolved. A path longer than the kernel takes
    (PATH_MAX) leads nowhere, since no system call accepts it: it is only made
    absolute, instead of costing ``realpath`` a system call per component (model-chosen
    text of 100 KB, a sed script read as a path, took seconds)."""
    return os.path.abspath(path) if len(path) >= _PATH_MAX else os.path.realpath(path)


def secretKind(path: str, env: Mapping[str, str] | None = None) -> str | None:
    """What secret ``path`` holds (in words for the user), judged by the path
    itself and by where it leads; None for an ordinary file."""
    return (_secretByName(os.path.abspath(path), env) or _secretByName(_leadsTo(path), env)
            or _linked(path, env))


def _protectedByName(path: str) -> str | None:
    parts = path.split(os.sep)
    if os.path.basename(path) in SHELL_STARTUP:
        return "a shell startup file"
    if path.startswith("/etc/") or path == "/etc":
        return "system configuration under /etc"
    if _PROTECTED_DIRS.intersection(parts[:-1]):
        return "a .git folder" if ".git" in parts[:-1] else "Hermes configuration"
    return None


def protectedKind(path: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why writing ``path`` always needs the user: a secret, or a file whose
    change runs code later or changes the machine; None otherwise."""
    return (secretKind(path, env) or _protectedByName(os.path.abspath(path))
            or _protectedByName(_leadsTo(path)) or _linked(path, env, protected=True))
