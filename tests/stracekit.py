"""Run real tether processes under ``strace``: record their system calls, or fail one.

``strace -y`` prints the path behind every file descriptor argument and result (the
kernel's answer from ``/proc/PID/fd``), so a recorded call says which file or directory it
touched without replaying ``openat`` results by hand. ``-e inject=SYSCALL:error=E:when=K``
makes the K-th call of SYSCALL fail with E *in the kernel's place*: a real process gets a
real ``ENOSPC`` or ``EIO`` at exactly that call (the call is not executed).

Tests that need strace call :func:`require_strace`: without it they are skipped with a
one-line reason, except under ``CI=true``, where a missing strace is a failure (CI must
install it: ``apt-get install -y strace``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TRACED = (
    "mkdir,mkdirat,openat,fsync,fdatasync,link,linkat,rename,renameat,renameat2,"
    "unlink,unlinkat,write,pwrite64"
)
"""The calls the durability tests look at (the set the brief of issue 11 names)."""

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<body>.*)$")
_RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>(?P<rest>.*)$")
_CALL = re.compile(
    r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+|\?)(?P<after>.*)$", re.DOTALL
)
_FD = re.compile(r"^(?P<fd>-?\d+|AT_FDCWD)<(?P<path>.*?)>(?P<deleted>\(deleted\))?$")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ERRNO = re.compile(r"^\s*(?P<errno>E[A-Z0-9]+)\b")


@functools.cache
def strace_problem() -> str | None:
    """Why strace cannot be used here (``None`` when it can)."""
    exe = shutil.which("strace")
    if exe is None:
        return "strace is not installed (apt-get install -y strace)"
    probe = subprocess.run(
        [exe, "-f", "-qq", "-e", "trace=none", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"strace cannot trace here: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def require_strace() -> str:
    """The strace executable; skip (or, with ``CI=true``, fail) when it cannot be used."""
    problem = strace_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must be able to run strace: {problem}")
        pytest.skip(problem)
    exe = shutil.which("strace")
    assert exe is not None
    return exe


def split_args(args: str) -> list[str]:
    """strace's argument text split at top-level commas (not inside strings or brackets)."""
    out: list[str] = []
    depth = 0
    quoted = False
    escaped = False
    start = 0
    for i, char in enumerate(args):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            continue
        if char == '"':
            quoted = True
        elif char in "[{(<":
            depth += 1
        elif char in "]})>":
            depth -= 1
        elif char == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    tail = args[start:].strip()
    if tail:
        out.append(tail)
    return out


def unescape(text: str) -> str:
    """Undo strace's C-style string escapes (enough for paths and JSON text)."""
    return re.sub(
        r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)",
        lambda m: _unescape_one(m.group(1)),
        text,
    )


def _unescape_one(code: str) -> str:
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "v": "\v", "f": "\f"}
    if code in simple:
        return simple[code]
    if code.startswith("x"):
        return chr(int(code[1:], 16))
    if code.isdigit():
        return chr(int(code, 8))
    return code


@dataclass(frozen=True)
class Call:
    """One completed system call of a traced process."""

    index: int
    """Position of the line that *completed* the call."""
    start: int
    """Position of the line where the call began (equals ``index`` unless interrupted)."""
    pid: int
    name: str
    args: tuple[str, ...]
    ret: int | None
    ret_path: str | None
    errno: str | None
    injected: bool

    def fd_path(self, position: int = 0) -> str | None:
        """The path behind the file descriptor argument at ``position`` (``-y``)."""
        if position >= len(self.args):
            return None
        m = _FD.match(self.args[position])
        return m.group("path") if m else None

    def string(self, position: int) -> str | None:
        """The string argument at ``position``, unescaped (``None`` if it is not one)."""
        if position >= len(self.args):
            return None
        m = _STRING.match(self.args[position])
        return unescape(m.group(1)) if m else None

    @property
    def ok(self) -> bool:
        return self.ret is not None and self.ret >= 0

    def path_arg(self) -> str | None:
        """The file a path-taking call names (for ``linkat``/``renameat*``: the old name),
        made absolute against its directory descriptor."""
        if self.name in ("mkdir", "unlink", "link", "rename"):
            return self.string(0)
        if self.name not in ("mkdirat", "openat", "unlinkat", "linkat", "renameat", "renameat2"):
            return self.fd_path(0)
        name = self.string(1)
        if name is None or name.startswith("/"):
            return name
        base = self.fd_path(0)
        return f"{base}/{name}" if base is not None else name


def parse(text: str, *, default_pid: int = 0) -> list[Call]:
    """The completed calls of an ``strace -y`` log (``-f`` prefixes lines with the pid)."""
    calls: list[Call] = []
    pending: dict[int, tuple[int, str]] = {}
    for position, raw in enumerate(text.splitlines()):
        m = _LINE.match(raw)
        if m is not None and not raw.startswith(tuple("<-+")):
            pid, body = int(m.group("pid")), m.group("body")
        else:
            pid, body = default_pid, raw
        if body.startswith(("---", "+++")):
            continue
        if body.endswith("<unfinished ...>"):
            pending[pid] = (position, body[: -len("<unfinished ...>")].rstrip())
            continue
        resumed = _RESUMED.match(body)
        start = position
        if resumed is not None:
            begun = pending.pop(pid, None)
            if begun is None:
                continue
            start, head = begun
            body = head + resumed.group("rest")
        call = _CALL.match(body)
        if call is None:
            continue
        ret_text = call.group("ret")
        after = call.group("after")
        ret = None if ret_text == "?" else int(ret_text)
        ret_path = None
        path_match = re.match(r"^<(.*?)>", after)
        if path_match is not None:
            ret_path = path_match.group(1)
        errno_match = _ERRNO.match(after)
        calls.append(
            Call(
                index=position,
                start=start,
                pid=pid,
                name=call.group("name"),
                args=tuple(split_args(call.group("args"))),
                ret=ret,
                ret_path=ret_path,
                errno=errno_match.group("errno") if errno_match and ret == -1 else None,
                injected="(INJECTED)" in after,
            )
        )
    return calls


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a traced ``python -m tether``: this checkout, deterministic start."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_") and k not in ("PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    # The same calls in the same order on every run: the K-th call of a kind is the same
    # call in a dry run and in the run that fails it.
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


@dataclass(frozen=True)
class Traced:
    returncode: int
    stdout: str
    stderr: str
    calls: list[Call]


def trace(
    argv: Sequence[str],
    *,
    cwd: Path,
    log: Path,
    follow_forks: bool = True,
    syscalls: str = TRACED,
    inject: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> Traced:
    """Run ``argv`` under strace; the completed calls it made (``log`` keeps the raw text).

    Without ``follow_forks`` only the first thread of the process is traced, so ``when=K``
    of an injection counts that thread's calls alone (the store runs in the main thread).
    """
    exe = require_strace()
    command = [exe, "-qq", "-y", "-s", "96", "-e", "signal=none", "-e", f"trace={syscalls}"]
    if follow_forks:
        command.append("-f")
    if inject is not None:
        command += ["-e", f"inject={inject}"]
    command += ["-o", str(log), "--", *argv]
    proc = subprocess.run(
        command,
        cwd=cwd,
        env=dict(env) if env is not None else cli_env(),
        input="",
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        check=False,
    )
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return Traced(proc.returncode, proc.stdout, proc.stderr, parse(text))


def tether_argv(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "tether", *map(str, args)]


def nth_call(calls: Sequence[Call], name: str, predicate: Callable[[Call], bool]) -> int | None:
    """1-based position of the first call matching ``predicate`` among the calls ``name``."""
    count = 0
    for call in calls:
        if call.name != name:
            continue
        count += 1
        if predicate(call):
            return count
    return None


def fail_call(
    argv: Sequence[str],
    *,
    cwd: Path,
    log: Path,
    syscall: str,
    error: str,
    nth: int,
    expected: Callable[[Call], bool],
) -> Traced:
    """Run ``argv`` (main thread traced) with its ``nth`` call of ``syscall`` failed.

    ``nth`` comes from an uninjected dry run of the same command (:func:`nth_call`); the
    injected call must satisfy ``expected``, so a run that hit some other call fails the
    test instead of passing it by accident.
    """
    run = trace(
        argv,
        cwd=cwd,
        log=log,
        follow_forks=False,
        syscalls=syscall,
        inject=f"{syscall}:error={error}:when={nth}",
    )
    injected = [c for c in run.calls if c.injected]
    assert len(injected) == 1 and expected(injected[0]), f"injected {injected} (see {log})"
    return run
