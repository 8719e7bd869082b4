"""Commands in their own process group that never outlive tether (:func:`run_in_group`).

One runner serves every child process tether starts: the ``bash`` tool
(:class:`tether._tools.builtin.BashTool`), the check command
(:func:`tether._completion.check.run_check`) and ``git ls-files`` for the artifact scanner
(:mod:`tether._completion.artifact`); each caller keeps its own output handling and result
texts, and chooses the few timings that differ (:class:`Supervision`).

A command is started in a **new session** (so it leads its own process group, whose id is
its pid), stdin from ``/dev/null``, stdout and stderr merged into one pipe that is read
incrementally (or stderr discarded, for a caller that parses the output: ``merge_stderr``).
It ends in one of three ways (:class:`Ending`):

* it **exits**: the rest of its group (``sleep 100 &``) is ended right away, or after
  ``linger`` seconds of waiting for the pipe to close;
* it **times out**, or ``cancel`` is set: the whole group is ended.

"Ended" is always the same sequence: ``SIGTERM`` to the group, ``kill_grace`` seconds in
which the output is still read, then ``SIGKILL`` to whatever is left, and the leader is
reaped. An exception in the caller's thread (``KeyboardInterrupt`` in ``tether verify``)
ends the group the same way before it propagates. Only processes that leave the group
(``setsid``, or job control's ``setpgid``) escape.

No orphans
----------
When tether itself dies — ``SIGKILL``, the OOM killer, a crash — nothing above runs, so a
second line of defence does not depend on tether at all: the **reaper**, one small process
per tether process, started on the first command (``python -I -S -c`` with the loop in
:data:`_REAPER_CODE`, in a session of its own so that signals meant for tether's process
group do not reach it). Its stdin is a pipe whose write end only this process holds
(close-on-exec, and a forked child closes its copy). Every command's group is registered
(``+PGID``) *before the command runs*: the command is started behind a gate —
``/bin/sh`` waiting for one line on its stdin before it ``exec``\\ s the real program —
and the gate opens only once the registration is in the pipe. A group that is gone is
unregistered (``-PGID``), so a recycled process id is never mistaken for it. When the
pipe reports end of file — the kernel closes a dead process's descriptors, however it
died — the reaper ``SIGKILL``\\ s every group still registered and exits. (If tether dies
before the gate opens, the gate reads end of file and the command never starts.) As a
backup for a write end leaked into some long-lived child, the reaper also checks twice a
second that its parent is still the process that started it.

``PR_SET_PDEATHSIG`` is not used: it fires when the parent *thread* that started the child
exits (a worker thread of a library user), not the process, and it reaches only the direct
child, not the group. If the reaper cannot be started (no ``sys.executable``), commands
still run, without this protection.

Cost per command: the gate's ``exec`` of ``/bin/sh`` and three short pipe writes; the whole
runner adds about 0.9 ms to a ``bash -c true`` over a bare :func:`subprocess.run`
(``bench/bench_procs.py``). The reaper is started once per process, without waiting for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from tether._hub import on_hub, pause, wait_readable

__all__ = [
    "Ending",
    "Finished",
    "Supervision",
    "group_alive",
    "run_in_group",
]

_SHELL: Final = "/bin/sh"
_GATE: Final = 'IFS= read -r gate && [ "$gate" = go ] && exec "$@" </dev/null; exit 125'
"""Wait for the go line on stdin, then become the command (same pid, same group) with
stdin from ``/dev/null``. End of file instead of ``go`` (tether died) runs nothing."""
_GATE_NAME: Final = "tether-gate"
_CHUNK: Final = 64 * 1024
_REAP_PATIENCE: Final = 5.0
"""Seconds to wait for the group to vanish after ``SIGKILL`` (and for the leader's exit)."""

_REAPER_CODE: Final = r"""
import os, select, signal, sys
parent = int(sys.argv[1])
groups = set()
pending = b""
while True:
    if not select.select([0], [], [], 0.5)[0]:
        if os.getppid() != parent:
            break
        continue
    data = os.read(0, 65536)
    if not data:
        break
    *lines, pending = (pending + data).split(b"\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""
"""The reaper: ``+PGID`` / ``-PGID`` lines on stdin; at end of file (or when its parent
changed) every registered group gets ``SIGKILL``. Kept tiny: it runs with ``-I -S``."""


class Ending(StrEnum):
    """How a command's run ended."""

    EXITED = "exited"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Supervision:
    """The timings of one runner call (seconds)."""

    kill_grace: float = 2.0
    """Between ``SIGTERM`` and ``SIGKILL`` of the group."""
    linger: float = 0.0
    """After the command exited, how long to wait for the pipe to close before the rest
    of its group is ended (``0``: at once)."""
    final_drain: float = 1.0
    """After the group was ended, how long to read what is left in the pipe (a process
    that escaped the group may hold it open)."""
    poll: float = 0.05
    """How often exit, cancellation and the deadline are checked."""


@dataclass(frozen=True)
class Finished:
    """The outcome of :func:`run_in_group`.

    ``returncode`` follows :mod:`subprocess`: ``-N`` when the command died from signal
    ``N``; ``None`` when it was never started (``cancel`` was already set).
    """

    returncode: int | None
    ending: Ending


# --------------------------------------------------------------------------- the runner


def run_in_group(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    timeout: float,
    on_output: Callable[[bytes], None],
    cancel: threading.Event | None = None,
    supervision: Supervision = Supervision(),
    merge_stderr: bool = True,
    contained: bool = False,
) -> Finished:
    """Run ``argv`` (``argv[0]`` an absolute path) in its own process group.

    Output (stdout and stderr, merged) is handed to ``on_output`` as it arrives. Returns
    when the command exited, the ``timeout`` expired or ``cancel`` was set, and the whole
    group is gone (see the module docstring). ``merge_stderr=False`` sends stderr to
    ``/dev/null`` instead. ``contained``: ``argv`` is a sandbox (bubblewrap) around the
    command, whose death ends every process inside (:mod:`tether._sandbox`); ending it
    then sends ``SIGTERM`` to the process groups *inside* first (the sandbox itself would
    die of it at once, and take the command's grace with it), and ``SIGKILL`` to the
    sandbox after the grace. Raises :class:`OSError` when the command
    cannot be started (``argv[0]`` missing or not executable, no ``/bin/sh``, ``cwd``
    missing).
    """
    if cancel is not None and cancel.is_set():
        return Finished(None, Ending.CANCELLED)
    _check_executable(argv[0])
    gate_read, gate_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [_SHELL, "-c", _GATE, _GATE_NAME, *argv],
            cwd=cwd,
            stdin=gate_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env=dict(env),
        )
    except BaseException:
        os.close(gate_write)
        raise
    finally:
        os.close(gate_read)
    group = _Group(proc, on_output, supervision, cancel, contained=contained)
    registered = False
    try:
        registered = _REAPER.register(proc.pid)
        gate, gate_write = gate_write, -1  # _open_gate closes it, whatever happens
        _open_gate(gate)
        ending = group.supervise(timeout)
        # Whatever is left of the group (the command itself after a timeout or a cancel,
        # background processes otherwise) is ended; then the pipe is read a little longer.
        if ending is not Ending.EXITED or not group.eof or group.alive():
            group.end()
        group.drain(supervision.final_drain)
    finally:
        if gate_write >= 0:
            os.close(gate_write)  # the gate reads end of file: nothing runs
        try:
            group.end()
        finally:
            group.close()
            if registered and not group.alive():
                _REAPER.unregister(proc.pid)
    return Finished(proc.returncode, ending)


def _check_executable(program: str) -> None:
    """Raise the :class:`OSError` that ``exec`` of ``program`` would fail with.

    The gate's shell would report it as exit status 127/126 instead, which callers could
    not tell from the command's own status.
    """
    mode = os.stat(program).st_mode
    if stat.S_ISDIR(mode) or not os.access(program, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def _open_gate(fd: int) -> None:
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


class _Group:
    """One started command: its leader, its group, its pipe and the output read so far."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        on_output: Callable[[bytes], None],
        supervision: Supervision,
        cancel: threading.Event | None,
        *,
        contained: bool = False,
    ) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.contained = contained
        self.pgid = proc.pid
        self.on_output = on_output
        self.supervision = supervision
        self.cancel = cancel
        self.fd = proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        # A pidfd becomes readable when the leader exits, so one select wakes up for
        # output and for the exit alike (Linux >= 5.3; otherwise exits are polled).
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(proc.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ)
        self.eof = False
        self.ended = False

    def supervise(self, timeout: float) -> Ending:
        """Read output until the command exits, the deadline passes or cancel is set."""
        poll = self.supervision.poll
        deadline = time.monotonic() + timeout
        exited_at: float | None = None
        while True:
            if self.cancel is not None and self.cancel.is_set():
                return Ending.CANCELLED
            now = time.monotonic()
            if now >= deadline:
                return Ending.TIMEOUT
            if exited_at is None and self.proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (self.eof or now - exited_at >= self.supervision.linger):
                return Ending.EXITED
            self.read(min(deadline - now, poll))

    def read(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for output or the leader's exit; read all output
        that arrived."""
        wait = max(0.0, wait)
        if not self.selector.get_map():  # end of file, and the exit seen (or unwatchable)
            if wait > 0 and self.proc.returncode is None and self.pidfd is None:
                # The pipe closes a moment before the leader can be reaped: wait for its
                # exit itself rather than sleeping a whole poll interval.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=wait)
            elif wait > 0:
                pause(wait)  # time.sleep, parked on a hub
            return
        fileno = getattr(self.selector, "fileno", None)  # epoll, kqueue: not select()
        if wait > 0 and fileno is not None and on_hub():
            # A worker's session waits on its hub's epoll (tether._hub), for this selector's
            # own descriptor: readable when the pipe or the pidfd is.
            try:
                wait_readable(fileno(), wait)
            except TimeoutError:
                return
            wait = 0.0
        for key, _ in self.selector.select(wait):
            if key.fd == self.fd:
                self._read_pipe()
            else:
                self.selector.unregister(key.fd)  # the leader exited; poll() reaps it

    def _read_pipe(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                self.selector.unregister(self.fd)
                return
            self.on_output(chunk)

    def drain(self, seconds: float) -> None:
        """Read until end of file, for at most ``seconds``."""
        end = time.monotonic() + seconds
        while not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                break
            self.read(min(left, self.supervision.poll))

    def alive(self) -> bool:
        self.proc.poll()  # reap the leader: a zombie does not count
        return group_alive(self.pgid)

    def end(self) -> None:
        """``SIGTERM`` the group, ``SIGKILL`` what is left after the grace, reap the leader.

        Idempotent; the output is read while waiting.
        """
        if self.ended:
            return
        self.ended = True
        steps = ((signal.SIGTERM, self.supervision.kill_grace), (signal.SIGKILL, _REAP_PATIENCE))
        for signum, patience in steps:
            if not self.alive():
                break
            targets = [self.pgid]
            if self.contained and signum == signal.SIGTERM:
                targets = sorted(_inner_groups(self.pgid))
            for target in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(target, signum)
            until = time.monotonic() + patience
            while self.alive() and time.monotonic() < until:
                self.read(min(0.01, max(0.0, until - time.monotonic())))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=_REAP_PATIENCE)

    def close(self) -> None:
        self.selector.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# --------------------------------------------------------------------------- groups


_PROC: Final = Path("/proc")
_HAS_PROC: Final = (_PROC / "self" / "stat").exists()


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no member at all: the cheap, common answer
    except PermissionError:
        return True
    if not _HAS_PROC:  # pragma: no cover - not Linux: zombies count as alive
        return True
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(p) for p in handle.read().split())
    return found


def _inner_groups(leader: int) -> set[int]:
    """The process groups of ``leader``'s descendants other than its own: inside a sandbox,
    the command's (it runs in a session of its own) and whatever it started."""
    groups: set[int] = set()
    pending = _children(leader)
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
        pending.extend(_children(pid))
    groups.discard(leader)
    return groups


# --------------------------------------------------------------------------- the reaper


class _Reaper:
    """This process's reaper: started on first use, re-started if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid: int | None = None
        self._groups: set[int] = set()
        os.register_at_fork(after_in_child=self._after_fork)

    def register(self, pgid: int) -> bool:
        """Tell the reaper about ``pgid``; ``False`` when no reaper can run."""
        with self._lock:
            self._groups.add(pgid)
            for _ in range(2):  # a reaper that died is replaced once
                if self._fd is None and not self._start():
                    return False
                if self._send(b"+%d\n" % pgid):
                    return True
            return False

    def unregister(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)
            if self._fd is not None:
                self._send(b"-%d\n" % pgid)

    def _send(self, line: bytes) -> bool:
        assert self._fd is not None
        try:
            os.write(self._fd, line)  # < PIPE_BUF: atomic
        except OSError:  # EPIPE: the reaper died; EAGAIN: it stopped reading
            self._discard()
            return False
        return True

    def _start(self) -> bool:
        """Spawn the reaper and re-register the groups it must know about."""
        if not sys.executable:
            return False
        read_end, write_end = os.pipe()  # both close-on-exec
        try:
            self._pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", _REAPER_CODE, str(os.getpid())],
                {},  # nothing to read in its /proc/PID/environ, credentials least of all
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
        except OSError:
            os.close(write_end)
            return False
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)  # never let a stuck reaper block a command
        self._fd = write_end
        for pgid in self._groups:
            if not self._send(b"+%d\n" % pgid):
                return False
        return True

    def _discard(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, os.WNOHANG)
            self._pid = None

    def _after_fork(self) -> None:
        # The child must not keep its parent's reaper pipe open (the parent's reaper
        # would never see end of file) nor report to it: it starts its own when needed.
        self._lock = threading.Lock()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._pid = None
        self._groups = set()


_REAPER: Final = _Reaper()


def guard_group(pgid: int) -> bool:
    """Have this process's reaper kill process group ``pgid`` if tether dies (for a child
    started elsewhere, e.g. an MCP server the SDK spawned); ``False`` when no reaper runs."""
    return _REAPER.register(pgid)


def release_group(pgid: int) -> None:
    """Forget ``pgid`` (:func:`guard_group`) once the group is gone."""
    _REAPER.unregister(pgid)
