"""The read-only allow-list: what may run without a sandbox and without asking."""

from __future__ import annotations

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
    "git -C sub log",
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
                                     "ls /tmp && cat /home/u/.aws/credentials"])
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
