"""Run the project's check command and observe it honestly (:func:`run_check`).

The command runs with ``/bin/sh -c`` in the workspace, stdin from ``/dev/null``, stdout and
stderr merged into one pipe, in its own process group. Its output is read incrementally: all
of it goes into a SHA-256 digest, only the last ``tail_bytes`` bytes are kept.

The workspace's artifact version is computed before the command starts and after it ends;
if the two differ the run proves nothing (status ``void``). If the version cannot be computed
before, the command is not run at all (status ``error``).

A timeout or a cancellation ends the whole process group: ``SIGTERM``, then ``SIGKILL`` after
a grace period. When the shell has exited but something it started in the background still
holds the pipe open, the rest of the group is ended the same way after a short drain, so a
stray background process can never hang the check.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tether.completion.evidence import VerificationStatus, verification_status
from tether.errors import CheckCommandError, TetherError

__all__ = [
    "DEFAULT_TAIL_BYTES",
    "KILL_GRACE",
    "CheckOutcome",
    "run_check",
]

DEFAULT_TAIL_BYTES: Final = 4096
KILL_GRACE: Final = 2.0
"""Seconds between ``SIGTERM`` and ``SIGKILL`` of the check's process group."""
POST_EXIT_DRAIN: Final = 0.5
"""Seconds to keep reading after the shell exited while the pipe is still held open."""
FINAL_DRAIN: Final = 0.2
"""Seconds to read what is left in the pipe after the group was killed."""
_POLL: Final = 0.05
_CHUNK: Final = 65536
_SHELL: Final = "/bin/sh"

_NOT_FOUND = re.compile(r"([^:\n]+): (?:command )?not found\s*$", re.MULTILINE)
_NOT_EXECUTABLE = re.compile(r"([^:\n]+): (?:Permission denied|cannot execute)", re.MULTILINE)


@dataclass(frozen=True)
class CheckOutcome:
    """What one run of the check command showed (see :func:`run_check`)."""

    command: str
    exit_status: int | None
    timed_out: bool
    error: str | None
    output_digest: str
    output_tail: str
    version_start: str | None
    version_end: str | None
    started_at_ms: int
    duration_ms: int

    @property
    def status(self) -> VerificationStatus:
        return verification_status(
            self.exit_status, self.timed_out, self.error, self.version_start, self.version_end
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _first_word(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return words[0] if words else command.strip()


def _decode_tail(tail: bytes, complete: bool) -> str:
    """Decode the kept tail; when it was cut, skip a partial UTF-8 character at its start."""
    if not complete:
        skip = 0
        while skip < min(3, len(tail)) and 0x80 <= tail[skip] <= 0xBF:
            skip += 1
        tail = tail[skip:]
    return tail.decode("utf-8", errors="replace")


def _shell_name(pattern: re.Pattern[str], text: str) -> str | None:
    found = pattern.findall(text)
    if not found:
        return None
    name = str(found[-1]).strip()
    return name or None


class _Output:
    """Digest of all output, and its last ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.digest = hashlib.sha256()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.total += len(chunk)
        if self.limit <= 0:
            return
        self.tail += chunk
        excess = len(self.tail) - self.limit
        if excess > 0:
            del self.tail[:excess]

    def text(self) -> str:
        return _decode_tail(bytes(self.tail), complete=self.total == len(self.tail))

    def hexdigest(self) -> str:
        return "sha256:" + self.digest.hexdigest()


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = raw[raw.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


class _Run:
    """One started check command: its process, its pipe, and the output read so far."""

    def __init__(self, proc: subprocess.Popen[bytes], output: _Output) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.output = output
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        self.eof = False

    def read(self, wait: float) -> None:
        """Read what arrives within ``wait`` seconds (one chunk at most)."""
        if self.eof:
            if wait > 0:
                time.sleep(wait)
            return
        if self.selector.select(max(0.0, wait)):
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk:
                self.output.feed(chunk)
            else:
                self.eof = True

    def drain(self, seconds: float) -> None:
        """Read until end of file or for at most ``seconds``."""
        end = time.monotonic() + seconds
        while not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                break
            self.read(min(left, _POLL))

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def kill_group(self) -> None:
        """``SIGTERM`` the group, ``SIGKILL`` it after the grace period, reap the shell."""
        self.signal_group(signal.SIGTERM)
        end = time.monotonic() + KILL_GRACE
        while time.monotonic() < end:
            self.proc.poll()
            if not _group_alive(self.pgid):
                break
            self.read(_POLL)
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=KILL_GRACE)

    def close(self) -> None:
        self.selector.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _exit_status(returncode: int) -> int:
    """The shell convention: a command ended by signal *n* has status ``128 + n``."""
    return 128 - returncode if returncode < 0 else returncode


def run_check(
    workspace: Path,
    command: str,
    *,
    timeout: float,
    version: Callable[[], str],
    cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.time,
    env: Mapping[str, str] | None = None,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
) -> CheckOutcome:
    """Run ``command`` in ``workspace`` and return what it showed; see the module docstring.

    Raises :class:`~tether.errors.CheckCommandError` if the command is empty or the workspace
    is not a directory. Everything that goes wrong once the check has begun is reported in
    the outcome (``error``/``timed_out``), never raised, except errors of ``version()`` other
    than :class:`~tether.errors.TetherError`.
    """
    if not command.strip():
        raise CheckCommandError("no check command: the command is empty")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    if tail_bytes < 0:
        raise ValueError(f"tail_bytes must be >= 0, got {tail_bytes!r}")
    cwd = Path(workspace)
    if not cwd.is_dir():
        raise CheckCommandError(f"check workspace is not a directory: {cwd}")

    started_at_ms = round(clock() * 1000)
    began = time.monotonic()
    output = _Output(tail_bytes)

    def outcome(
        exit_status: int | None,
        timed_out: bool,
        error: str | None,
        version_start: str | None,
        version_end: str | None,
    ) -> CheckOutcome:
        return CheckOutcome(
            command=command,
            exit_status=exit_status,
            timed_out=timed_out,
            error=error,
            output_digest=output.hexdigest(),
            output_tail=output.text(),
            version_start=version_start,
            version_end=version_end,
            started_at_ms=started_at_ms,
            duration_ms=max(0, round((time.monotonic() - began) * 1000)),
        )

    try:
        version_start = version()
    except TetherError as exc:
        return outcome(None, False, _one_line(exc), None, None)

    try:
        proc = subprocess.Popen(
            [_SHELL, "-c", command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=None if env is None else dict(env),
        )
    except OSError as exc:
        return outcome(
            None,
            False,
            f"cannot start check command: {exc.strerror or _one_line(exc)}",
            version_start,
            None,
        )

    run = _Run(proc, output)
    deadline = time.monotonic() + timeout
    timed_out = False
    cancelled = False
    finished = False
    try:
        exited_at: float | None = None
        while True:
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if run.eof and exited_at is not None:
                break
            if exited_at is not None and now - exited_at >= POST_EXIT_DRAIN:
                break  # the shell is gone but something it started holds the pipe open
            run.read(min(deadline - now, _POLL))
        # Whatever is left of the group (the command itself after a timeout or a cancel,
        # background processes otherwise) is ended; then read what is left briefly.
        if timed_out or cancelled or not run.eof or _group_alive(run.pgid):
            run.kill_group()
        run.drain(FINAL_DRAIN)
        finished = True
    finally:
        if not finished:
            run.kill_group()
        run.close()

    returncode = proc.wait()
    error: str | None = None
    exit_status: int | None = None
    if cancelled:
        error = "cancelled"
    elif not timed_out:
        exit_status = _exit_status(returncode)
        text = output.text()
        if exit_status == 127 and "not found" in text:
            name = _shell_name(_NOT_FOUND, text) or _first_word(command)
            error = f"check command not found: {name}"
        elif exit_status == 126:
            name = _shell_name(_NOT_EXECUTABLE, text) or _first_word(command)
            error = f"check command is not executable: {name}"

    try:
        version_end: str | None = version()
    except TetherError as exc:
        version_end = None
        if error is None:
            error = _one_line(exc)
    return outcome(exit_status, timed_out, error, version_start, version_end)
