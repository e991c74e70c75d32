"""The read-only allow-list: what may run without a sandbox and without asking."""

from __future__ import annotations

import os
import time

import pytest

from hermes_acp.engine.readonly import isReadOnly

READ_ONLY = [
    "ls",
    "ls -la src",
    "pwd\nls",
    "cat a.txt; wc -l b.txt",
    "grep -r TODO src | head -20",
    "git status && git diff",
    "git log --oneline -5 || true",
    "git --no-pager show HEAD",
    "git rev-parse HEAD",
    "git ls-files",
    "git blame README.md",
    "git describe --tags",
    "git branch -a",
    "git branch --show-current",
    "git remote -v",
    "git tag",
    "git tag -l 'v1*'",
    "git config --get user.name",
    "git config --list",
    "find . -name '*.py' -type f",
    "rg -n 'foo|bar' src",
    'echo "hello world"',
    "printf '%s\\n' a",
    "sort -u f | uniq -c",
    "uniq f",
    "date +%Y-%m-%d",
    "date -d yesterday +%A",
    "hostname",
    "printenv PATH",
    "tail -n 5 log",
    "diff a b",
    "ps aux",
    "ps -ef",
    "ps -o pid,user,command -C sleep",
    "grep --color=auto x f",
    "df -h",
    "du -sh .",
    "tree -L 2",
    "file x",
    "stat x",
    "which python3",
    "cut -d, -f1 f",
    "tr a-z A-Z",
    "seq 1 3",
    "ls |\n  grep x",
    "ls;",
]

# Every indirection of safety.md §1, and what else could run or write something.
INDIRECTIONS = [
    "$(printf rm) -rf x",
    "echo $(date)",
    "`echo rm` -rf x",
    "echo `date`",
    "X=rm; $X -rf x",
    "ls $HOME",
    'echo "$X"',
    'echo "`date`"',
    "${X} -rf x",
    "eval ls",
    "{rm,-rf,x}",
    "ls {a,b}",
    "env -S 'ls'",
    "env ls",
    "sh -c -- 'ls'",
    "bash -c ls",
    "printf 'ls' | sh",
    "echo aGk= | base64 -d | sh",
    "python3 -c 'print(1)'",
    "perl -e 'print 1'",
    "find . -exec sh -c 'ls' \\;",
    "xargs ls",
    "taskset 1 ls",
    "flock f ls",
    "nice ls",
    "timeout 5 ls",
    "chrt 1 ls",
    "strace ls",
    "watch ls",
    "nohup ls",
    "stdbuf -oL ls",
    "ionice ls",
    "git reset --hard",
    "git clean -fdx",
    "git checkout -- .",
    "git restore .",
    "chmod -R 755 .",
    "> file",
    "truncate -s0 f",
    "shred f",
    "unlink f",
    "F=~/.bashrc; echo x >> $F",
    "sqlite3 state.db 'DELETE FROM messages'",
    "rm x",
    "ls > out",
    "ls >> out",
    "cat < in",
    "cat <<EOF",
    "cat <<< x",
    "ls 2>&1",
    "ls &",
    "ls |& cat",
    "(ls)",
    "{ ls; }",
    "ls *",
    "ls ?",
    "ls [ab]",
    "ls ~",
    "! ls",
    "ls # comment",
    "ls\\ x",
    'echo "a\\b"',
    "X=1 ls",
    "/bin/ls",
    "./ls",
    "",
    "   ",
    "; ls",
    "ls; ;",
    "ls &&",
    "ls |",
    "ls 'unterminated",
    'ls "unterminated',
]

# Programs on the list, with an option that makes them run or write something.
OPTIONS = [
    "find . -delete",
    "find . -exec rm {} +",
    "find . -execdir rm {} +",
    "find . -ok rm {} ;",
    "find . -fprint x",
    "find . -fls x",
    "sort -o x f",
    "sort -uo x f",
    "sort --output=x f",
    "sort --out=x f",
    "sort --compress-program=sh f",
    "git -c alias.x=!rm status",
    "git -c core.pager=x log",
    "git --exec-path=/x status",
    "git -p log",
    "git --paginate log",
    "git log --output=x",
    "git diff --ext-diff",
    "git diff --textconv",
    "git push",
    "git branch new",
    "git branch -D x",
    "git tag v1",
    "git tag -l -d x",
    "git config user.name x",
    "git config --edit",
    "git config --get a b c",
    "git remote add o u",
    "git",
    "rg --pre sh x",
    "rg --pre=sh x",
    "rg --pre-glob '*' x",
    "rg -z x",
    "rg --search-zip x",
    "rg --hostname-bin=x y",
    "date -s 2020-01-01",
    "date --set=x",
    "date 0101",
    "hostname x",
    "uniq a b",
    "tree -o x",
    "tree -R",
    "file -C",
    "file --compile",
    "printenv 'A B'",
    "printenv -x",
    # git pointed at another repository, configuration or set of programs (issue 22).
    "git -C sub log",
    "git -C /tmp/evil status",
    "git --git-dir=evil --work-tree=. status",
    "git --git-dir evil status",
    "git --work-tree=/ status",
    "git --config-env=core.pager=X log",
    "git --namespace=x log",
    "git --exec-path status",
    "git --super-prefix=x status",
    "git --bare log",
    "git grep -O x",
    "git grep --open-files-in-pager x",
    "git log --out=x",
    "git show --ext-diff",
    "git log -p --textconv",
    # Variables that point a program elsewhere or make it run one.
    "GIT_DIR=evil git status",
    "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0=x git log",
    "PAGER=x git log",
    "GIT_EXTERNAL_DIFF=x git diff",
    "LESSOPEN='|x %s' cat f",
    # ps shows the environment of other processes with BSD-style e.
    "ps eww",
    "ps auxe",
    "ps e -p 1",
    # Off the list: they run or write something.
    "less f",
    "more f",
    "man ls",
    "xxd -r a b",
    "tee f",
    "tar xf a.tar",
    "sed -n 1p f",
    "awk 1 f",
]


@pytest.mark.parametrize("command", READ_ONLY)
def test_readOnly(command: str) -> None:
    assert isReadOnly(command), command


@pytest.mark.parametrize("command", INDIRECTIONS + OPTIONS)
def test_notReadOnly(command: str) -> None:
    assert not isReadOnly(command), command


def test_longCommandsAreFast() -> None:
    """The scanner is linear: a long command of many words or quotes ends in moments
    (a bound against a quadratic regression, far above the time it takes)."""
    for command in ("ls " + "a " * 60_000, "ls " + "'a'" * 40_000, "ls '" + "a" * 120_000, "ls; " * 30_000):
        started = time.monotonic()
        isReadOnly(command)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize("command", ["cat /root/.ssh/id_rsa", "grep KEY .env", "head server.pem",
                                     "ls /tmp && cat /home/u/.aws/credentials",
                                     "grep --file=/home/u/.ssh/id_rsa -r .", "diff --from-file=.env a",
                                     "file -m/home/u/.ssh/id_rsa /dev/null", "grep -rf/home/u/.ssh/id_rsa .",
                                     "file -m.env x", "git show HEAD:.env", "git show :id_rsa"])
def test_secretOperandsAreNotReadOnly(command: str) -> None:
    assert not isReadOnly(command)


def test_foldersThatHoldSecretsAreNotReadOnly(tmp_path, monkeypatch) -> None:
    """``grep -r`` over a folder that holds a secret reads it; relative operands
    are judged where the command runs."""
    home = tmp_path / "home"
    (home / ".config" / "gcloud").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert not isReadOnly(f"grep -r token {home}/.config")
    assert not isReadOnly("grep -r token .config", cwd=str(home))
    assert not isReadOnly("cat .hermes/state.db", cwd=str(home))
    assert isReadOnly("grep -r token src", cwd=str(home))


# A key the model may plant in the workspace's own .git/config (or a file it
# includes), and the read-only git command that would run it.
PLANTED = [
    ("core.fsmonitor", "touch {mark}; false", "git status"),
    ("core.pager", "touch {mark}; cat", "git log"),
    ("pager.log", "touch {mark}; cat", "git log"),
    ("diff.external", "touch {mark}; true", "git diff"),
    ("diff.evil.textconv", "touch {mark}; cat", "git log -p"),
    ("diff.evil.command", "touch {mark}; true", "git diff"),
    ("filter.evil.clean", "touch {mark}; cat", "git status"),
    ("filter.evil.process", "touch {mark}", "git diff"),
    ("core.hooksPath", "{mark}", "git status"),
    ("alias.st", "!touch {mark}", "git status"),
    ("credential.helper", "!touch {mark}", "git remote -v"),
    ("gpg.program", "touch {mark}", "git log --show-signature"),
    ("core.sshCommand", "touch {mark}", "git status"),
    ("core.worktree", "/", "git status"),
]


def _git(cwd, *args: str) -> None:
    import subprocess

    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"})


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A repository with a commit and a change, in a home of its own with no git configuration."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    work = tmp_path / "work"
    work.mkdir()
    (work / "f.txt").write_text("one\n")
    (work / ".gitattributes").write_text("* diff=evil filter=evil\n")
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "x")
    (work / "f.txt").write_text("two\n")
    return work


def test_aCleanRepositoryIsReadOnly(repository) -> None:
    assert isReadOnly("git status && git diff && git log -p", str(repository))


@pytest.mark.parametrize(("key", "value", "command"), PLANTED)
def test_aRepositoryWhoseConfigRunsProgramsIsNotReadOnly(repository, key: str, value: str, command: str) -> None:
    """However a planted key would make git run a program, the command is not read-only (it asks)."""
    assert isReadOnly(command, str(repository))
    _git(repository, "config", key, value.format(mark=repository / "MARK"))
    assert not isReadOnly(command, str(repository))
    assert isReadOnly("ls", str(repository))  # only git is judged by the repository


def test_anIncludedFileCountsAsTheRepositorysOwn(repository) -> None:
    (repository / "inc").write_text("[core]\n\tfsmonitor = touch x\n")
    _git(repository, "config", "include.path", str(repository / "inc"))
    assert not isReadOnly("git status", str(repository))


@pytest.mark.parametrize("value", ["false", "0", "", "true"])
def test_fsmonitorAsABooleanIsReadOnly(repository, value: str) -> None:
    """Off, or git's own daemon (``true``, as macOS users set it): no planted program."""
    _git(repository, "config", "core.fsmonitor", value)
    assert isReadOnly("git status", str(repository))


def test_theUsersOwnConfigurationIsTrusted(repository) -> None:
    """The user's global pager or diff tool is theirs to run (and the pager is turned off anyway)."""
    (repository.parent / ".gitconfig").write_text("[core]\n\tpager = delta\n[diff]\n\texternal = difft\n")
    assert isReadOnly("git log", str(repository))


def test_anUnreadableConfigurationIsNotReadOnly(repository) -> None:
    (repository / ".git" / "config").write_text("[core\n")
    assert not isReadOnly("git status", str(repository))


@pytest.mark.parametrize("key", ["core.fsmonitor", "core.hooksPath", "core.pager"])
def test_theSafeEnvironmentTurnsProgramsOff(repository, key: str) -> None:
    """Planted after the check (a parallel call), the fsmonitor, hooks and pager still do not run."""
    import subprocess

    from hermes_acp.engine.readonly import GIT_SAFE_ENV

    mark = repository / "MARK"
    hooks = repository / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {mark}\n")
        (hooks / hook).chmod(0o755)
    _git(repository, "config", key, str(hooks) if key == "core.hooksPath" else f"touch {mark}; false")
    env = {"PATH": os.environ["PATH"], "HOME": str(repository.parent), "GIT_CONFIG_NOSYSTEM": "1", **GIT_SAFE_ENV}
    primary, secondary = os.openpty()  # git starts a pager only on a terminal
    try:
        for command in (["git", "status"], ["git", "log"], ["git", "diff"], ["git", "add", "f.txt"]):
            subprocess.run(command, cwd=repository, env=env, stdin=subprocess.DEVNULL, stdout=secondary,
                           stderr=secondary, timeout=30, check=False)
    finally:
        os.close(primary)
        os.close(secondary)
    assert not mark.exists()


def test_aKeyPlantedAfterTheGuardReadTheConfigurationStillRunsNothing(repository, monkeypatch) -> None:
    """The guard read a clean configuration; a parallel call then plants an fsmonitor (here in
    an included workspace file). The command still runs with the safe settings: a second look
    at the configuration must not take them away."""
    from hermes_acp.engine import readonly

    from .conftest import ToolBench

    included, mark = repository / "inc", repository / "MARK"
    included.write_text("")
    _git(repository, "config", "include.path", str(included))
    looked = readonly.gitRunsPrograms

    def plantedAfter(cwd: str) -> str | None:
        found = looked(cwd)
        included.write_text(f"[core]\n\tfsmonitor = touch {mark}; false\n")
        return found

    monkeypatch.setattr(readonly, "gitRunsPrograms", plantedAfter)
    bench = ToolBench(str(repository))
    bench.agent.sandbox = None
    outcome = bench.call("terminal", command="git status")
    assert not outcome.failed and bench.observer.commands == []
    assert not mark.exists()


def test_readingTheConfigurationIsNotReapedByAnotherThread(repository) -> None:
    """The agent reaps the adopted processes it did not start (``processes.reapAdopted``,
    from any thread): the configuration's reader is one of the agent's own, so its exit
    status stays its own, and a configuration git cannot read still asks."""
    import threading

    from hermes_acp.engine import processes

    (repository / ".git" / "config").write_text("[core\n")
    done = threading.Event()

    def reaping() -> None:
        while not done.is_set():
            processes.reapAdopted()

    reaper = threading.Thread(target=reaping)
    reaper.start()
    try:
        assert not any(isReadOnly("git status", str(repository)) for _ in range(40))
    finally:
        done.set()
        reaper.join(10)
