"""Run the project's check command and observe it honestly (:func:`run_check`).

The command runs with ``/bin/sh -c`` in the workspace, stdin from ``/dev/null``, stdout and
stderr merged into one pipe, in its own process group, through the same runner as the
``bash`` tool (:func:`tether._procs.run_in_group`), with tether's environment minus its
credentials. Its output is read incrementally: all of it goes into a SHA-256 digest, only
the last ``tail_bytes`` bytes are kept (with tether's credentials masked).

The workspace's artifact version is computed before the command starts and after it ends;
if the two differ the run proves nothing (status ``void``). If the version cannot be computed
before, the command is not run at all (status ``error``).

A timeout or a cancellation ends the whole process group: ``SIGTERM``, then ``SIGKILL`` after
a grace period. When the shell has exited but something it started in the background still
holds the pipe open, the rest of the group is ended the same way after a short drain, so a
stray background process can never hang the check. If tether dies, the group is killed by
tether's reaper (see :mod:`tether._procs`).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from tether._credentials import Masker, child_environment
from tether._procs import Ending, Supervision, run_in_group
from tether.core.canonical import hasher_digest
from tether.core.values import CheckOutcome
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
SUPERVISION: Final = Supervision(
    kill_grace=KILL_GRACE, linger=POST_EXIT_DRAIN, final_drain=FINAL_DRAIN, poll=0.05
)
_SHELL: Final = "/bin/sh"

_NOT_FOUND = re.compile(r"([^:\n]+): (?:command )?not found\s*$", re.MULTILINE)
_NOT_EXECUTABLE = re.compile(r"([^:\n]+): (?:Permission denied|cannot execute)", re.MULTILINE)


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
        return hasher_digest(self.digest)


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
    pass_env: Sequence[str] = (),
    tail_bytes: int = DEFAULT_TAIL_BYTES,
) -> CheckOutcome:
    """Run ``command`` in ``workspace`` and return what it showed; see the module docstring.

    ``env`` is the command's whole environment; by default it is tether's own without
    tether's credentials (:func:`tether._credentials.child_environment`), except the
    variables named in ``pass_env``.

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
    masker = Masker.for_process()

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
            # The tail is recorded and shown; the digest is of the output as it was.
            output_tail=masker.text(output.text()),
            version_start=version_start,
            version_end=version_end,
            started_at_ms=started_at_ms,
            duration_ms=max(0, round((time.monotonic() - began) * 1000)),
        )

    try:
        version_start = version()
    except TetherError as exc:
        return outcome(None, False, _one_line(exc), None, None)

    error: str | None = None
    exit_status: int | None = None
    try:
        finished = run_in_group(
            [_SHELL, "-c", command],
            cwd=cwd,
            env=dict(env) if env is not None else child_environment(pass_env),
            timeout=timeout,
            on_output=output.feed,
            cancel=cancel,
            supervision=SUPERVISION,
        )
    except OSError as exc:
        return outcome(
            None,
            False,
            f"cannot start check command: {exc.strerror or _one_line(exc)}",
            version_start,
            None,
        )
    timed_out = finished.ending is Ending.TIMEOUT
    if finished.ending is Ending.CANCELLED:
        error = "cancelled"
    elif not timed_out:
        assert finished.returncode is not None
        exit_status = _exit_status(finished.returncode)
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
