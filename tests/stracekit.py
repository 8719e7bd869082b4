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

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tether.testing.crashlab.strace import (
    Call,
    parse,
    split_args,
    strace_problem,
    unescape,
    unescape_bytes,
)

__all__ = [
    "Call",
    "Traced",
    "cli_env",
    "fail_call",
    "nth_call",
    "parse",
    "require_strace",
    "split_args",
    "strace_problem",
    "tether_argv",
    "trace",
    "unescape",
    "unescape_bytes",
]

ROOT = Path(__file__).resolve().parent.parent

TRACED = (
    "mkdir,mkdirat,openat,fsync,fdatasync,link,linkat,rename,renameat,renameat2,"
    "unlink,unlinkat,write,pwrite64"
)
"""The calls the durability tests look at (the set the brief of issue 11 names)."""


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
