"""Single-writer locking for session logs.

A writer holds ``flock(LOCK_EX)`` on its own open file description of the log. ``flock``
locks belong to the open file description, so a second ``open()`` of the same file — in
another process *or in this one* — conflicts. As a second line of defence (and for file
systems where ``flock`` is emulated per process), this process also remembers which
``(st_dev, st_ino)`` it holds for writing.

The holder's pid is advisory information only, kept in a sidecar ``<log>.lock`` next to the
log so that a refused writer can say who holds the session. The lock itself is the
``flock``; a stale sidecar left by a killed writer is harmless (it is overwritten by the next
writer and only read when the ``flock`` is actually held by someone).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from tether import faults
from tether.errors import SessionBusy

LOCK_SUFFIX = ".lock"

LOCKED = faults.register(
    "store.locked", "a writer holds the log's flock and has not yet recorded its pid"
)

_registry_lock = threading.Lock()
_held: set[tuple[int, int]] = set()


def _forget_all_in_child() -> None:
    # A forked child does not own its parent's writers (flock is shared through the
    # inherited descriptor, but the child must not think it may write).
    global _registry_lock
    _registry_lock = threading.Lock()
    _held.clear()


os.register_at_fork(after_in_child=_forget_all_in_child)


class WriterLock:
    """The exclusive writer lock on one session log (see module docstring)."""

    __slots__ = ("_dir_fd", "_fd", "_key", "_name", "_released")

    def __init__(self, fd: int, dir_fd: int, name: str, key: tuple[int, int]) -> None:
        self._fd = fd
        self._dir_fd = dir_fd
        self._name = name
        self._key = key
        self._released = False

    @classmethod
    def acquire(cls, fd: int, dir_fd: int, name: str, display_path: str) -> WriterLock:
        """Lock ``fd`` (the log ``name`` inside ``dir_fd``) or raise :class:`SessionBusy`."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _registry_lock:
            if key in _held:
                raise SessionBusy(display_path, os.getpid())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SessionBusy(display_path, read_holder_pid(dir_fd, name)) from None
            _held.add(key)
        lock = cls(fd, dir_fd, name, key)
        if faults.ARMED:
            faults.hit(LOCKED)
        lock._record_pid()
        return lock

    def _record_pid(self) -> None:
        sidecar = self._name + LOCK_SUFFIX
        try:
            fd = os.open(
                sidecar,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self._dir_fd,
            )
        except OSError:
            return  # advisory only (e.g. a hostile symlink in its place)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def release(self) -> None:
        """Drop the pid record, then the lock. The caller closes the descriptor afterwards.

        The sidecar is removed *before* unlocking, so it can never delete the record of the
        next writer.
        """
        if self._released:
            return
        self._released = True
        try:
            os.unlink(self._name + LOCK_SUFFIX, dir_fd=self._dir_fd)
        except OSError:
            pass
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass  # closing the descriptor releases it anyway
        with _registry_lock:
            _held.discard(self._key)


def read_holder_pid(dir_fd: int, name: str) -> int | None:
    """The pid recorded by the current writer of ``name``, if it can be read.

    The writer records its pid just after taking the lock; a refused opener that races with
    it retries briefly before giving up with ``None``.
    """
    for attempt in range(3):
        pid = _read_pid_once(dir_fd, name + LOCK_SUFFIX)
        if pid is not None:
            return pid
        if attempt < 2:
            time.sleep(0.01)
    return None


def _read_pid_once(dir_fd: int, sidecar: str) -> int | None:
    try:
        fd = os.open(
            sidecar, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        raw = os.read(fd, 64)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
