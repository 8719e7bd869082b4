"""Single-writer locking for session logs.

**The lock.** A writer holds ``flock(LOCK_EX)`` on its own open file description of the log.
``flock`` locks belong to the open file description, so a second ``open()`` of the same file
— in another process *or in this one* — conflicts. As a second line of defence (and for file
systems where ``flock`` is emulated per process), this process also remembers which
``(st_dev, st_ino)`` it holds for writing. The lock dies with its process.

**Who holds it.** A refused writer may name the holder's pid, but only a pid the kernel
vouches for. After taking the ``flock`` the writer opens the sidecar ``<log>.lock``, takes a
POSIX record lock on it (``fcntl(F_SETLK, F_WRLCK)``), writes its pid (and the device and
inode numbers of the log) into it and keeps it open until it releases the session. A
refused opener asks the kernel who holds that record lock (``F_GETLK`` reports the holder's
pid) and names the pid only when the sidecar's text says the same pid for the same log.
The kernel drops record locks when their process ends, so the sidecar a killed writer left
behind is never believed: not even in the instant after the next writer took the ``flock``
and before it rewrote the sidecar, when the file still names the dead (or by now reused)
pid. Whenever the holder cannot be proven that way the message says "another process".

The record lock is on the sidecar, not on the log, because POSIX record locks are dropped
when their process closes *any* descriptor of the file: a writer that also reads its own log
(a read-only snapshot, a listing) would lose it. The sidecar is opened only by its writer
and by refused openers, which are other processes (a conflict inside this process is caught
by the registry before anything is read). Record locks are not inherited by ``fork()``, so a
child never appears to hold its parent's session.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import sys
import threading
import time

import tether._faults as faults
from tether.errors import SessionBusy

LOCK_SUFFIX = ".lock"

LOCKED = faults.register(
    "store.locked", "a writer holds the log's flock and has not yet recorded its pid"
)

# Reentrant: the garbage collector may run a dropped store's finalizer (which releases its
# lock) in the middle of an acquire, in the same thread; a plain lock deadlocked there.
_registry_lock = threading.RLock()
_held: set[tuple[int, int]] = set()

# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (native alignment). The
# buffer handed to fcntl is padded so the kernel's copy of the struct always fits.
_FLOCK = struct.Struct("hhqqi")
_FLOCK_BUFFER = 64
_PROBE_ATTEMPTS = 3
_PROBE_PAUSE = 0.01  # a new writer records its pid right after locking; give it a moment


def _forget_all_in_child() -> None:
    # A forked child does not own its parent's writers (flock is shared through the
    # inherited descriptor, but the child must not think it may write).
    global _registry_lock
    _registry_lock = threading.RLock()
    _held.clear()


os.register_at_fork(after_in_child=_forget_all_in_child)


class WriterLock:
    """The exclusive writer lock on one session log (see module docstring)."""

    __slots__ = ("_dir_fd", "_fd", "_key", "_name", "_released", "_sidecar_fd")

    def __init__(self, fd: int, dir_fd: int, name: str, key: tuple[int, int]) -> None:
        self._fd = fd
        self._dir_fd = dir_fd
        self._name = name
        self._key = key
        self._released = False
        self._sidecar_fd = -1

    @classmethod
    def acquire(cls, fd: int, dir_fd: int, name: str, display_path: str) -> WriterLock:
        """Lock ``fd`` (the log ``name`` inside ``dir_fd``) or raise :class:`SessionBusy`.

        Other failures of ``flock`` (e.g. ``ENOLCK``) propagate as :class:`OSError`.
        """
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _registry_lock:
            if key in _held:
                raise SessionBusy(display_path, os.getpid(), this_process=True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = holder_pid(dir_fd, name, key)
                raise SessionBusy(display_path, pid, this_process=pid == os.getpid()) from None
            _held.add(key)
        lock = cls(fd, dir_fd, name, key)
        if faults.ARMED:
            faults.hit(LOCKED)
        lock._record_pid()
        return lock

    def _record_pid(self) -> None:
        """Record-lock the sidecar and write this pid into it (advisory: failures ignored)."""
        try:
            fd = os.open(
                self._name + LOCK_SUFFIX,
                os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
                dir_fd=self._dir_fd,
            )
        except OSError:
            return  # e.g. a hostile symlink or a FIFO in its place, or a full disk
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            # Locked before it is rewritten: a reader that sees the lock held and this pid
            # in the text has proof; one that reads the old text sees no lock (or ours).
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        # Record-locked: the file is ours from here on, and release removes it, even if
        # the text below cannot be written (e.g. a full disk): a text that does not match
        # this writer is never believed.
        self._sidecar_fd = fd
        text = _record_text(os.getpid(), self._key).encode()
        try:
            # Over the old text, then cut to length: truncating to zero first would make
            # ext4 flush the file when it is closed (auto_da_alloc), ~0.5 ms per writer.
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))
        except OSError:
            pass

    def release(self) -> None:
        """Drop the pid record, then the lock. The caller closes the descriptor afterwards.

        The sidecar is removed *before* unlocking, so it can never delete the record of the
        next writer; its record lock goes before the ``flock`` for the same reason. A
        record this writer did not write stays (it is never believed for this log).
        """
        if self._released:
            return
        self._released = True
        if self._sidecar_fd >= 0:
            self._remove_own_record()
        self._close_sidecar()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass  # closing the descriptor releases it anyway
        with _registry_lock:
            _held.discard(self._key)

    def _remove_own_record(self) -> None:
        """Unlink the pid record, but only the very file this writer record-locked.

        A record this writer could not take (another process still holds its record lock:
        the writer of a log since replaced under the same name) is not ours to remove.
        """
        sidecar = self._name + LOCK_SUFFIX
        try:
            ours = os.fstat(self._sidecar_fd)
            named = os.stat(sidecar, dir_fd=self._dir_fd, follow_symlinks=False)
            if (ours.st_dev, ours.st_ino) == (named.st_dev, named.st_ino):
                os.unlink(sidecar, dir_fd=self._dir_fd)
        except OSError:
            pass

    def abandon(self) -> None:
        """Close this process's copy of the sidecar without unlocking anything.

        For a lock inherited across ``fork()``: the parent still holds the session (the
        child holds no record lock, so closing its copy drops nothing of the parent's).
        """
        self._released = True
        self._close_sidecar()

    def _close_sidecar(self) -> None:
        if self._sidecar_fd >= 0:
            try:
                os.close(self._sidecar_fd)
            except OSError:
                pass
            self._sidecar_fd = -1


def _record_text(pid: int, key: tuple[int, int]) -> str:
    """The pid record: the writer's pid, then the device and inode of the log it holds."""
    return f"{pid} {key[0]} {key[1]}\n"


def holder_pid(dir_fd: int, name: str, key: tuple[int, int]) -> int | None:
    """The pid of the process that provably holds the writer lock of ``name``, else ``None``.

    ``key`` is ``(st_dev, st_ino)`` of the log the caller failed to lock. Proof is the
    kernel's answer to ``F_GETLK`` on the sidecar, confirmed by the sidecar's text naming
    the same pid *and this log* (not an earlier file of the same name). A writer that has
    just taken the ``flock`` records itself immediately; an unproven answer is retried
    briefly before giving up with ``None``.
    """
    for attempt in range(_PROBE_ATTEMPTS):
        pid = _proven_holder(dir_fd, name + LOCK_SUFFIX, key)
        if pid is not None:
            return pid
        if attempt < _PROBE_ATTEMPTS - 1:
            time.sleep(_PROBE_PAUSE)
    return None


def record_locked(dir_fd: int, sidecar: str) -> bool:
    """Whether a live process holds the record lock of the pid record ``sidecar``.

    Where that cannot be asked (not Linux, unreadable) the answer is ``True``: a caller that
    would remove the record on ``False`` must not guess.
    """
    fd = _open_sidecar(dir_fd, sidecar)
    if fd < 0:
        return True
    try:
        return _record_holder(fd) != 0
    finally:
        os.close(fd)


def _open_sidecar(dir_fd: int, sidecar: str) -> int:
    """A read-only descriptor of the regular file ``sidecar``, or -1."""
    if not sys.platform.startswith("linux"):
        return -1  # the struct flock layout above is Linux's; elsewhere prove nothing
    try:
        fd = os.open(
            sidecar, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return -1
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


def _record_holder(fd: int) -> int | None:
    """The kernel's answer: the pid holding a record lock on ``fd``'s file, 0 if none.

    ``None`` when the kernel cannot say (the call failed, or the holder's pid is not
    visible in this pid namespace).
    """
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(_FLOCK_BUFFER, b"\0")
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    lock_type, _, _, _, pid = _FLOCK.unpack_from(answer)
    if lock_type == fcntl.F_UNLCK:
        return 0
    return pid if pid > 0 else None


def _proven_holder(dir_fd: int, sidecar: str, key: tuple[int, int]) -> int | None:
    fd = _open_sidecar(dir_fd, sidecar)
    if fd < 0:
        return None
    try:
        pid = _record_holder(fd)
        if not pid:
            return None  # nobody holds the record lock, or the kernel cannot say who
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return pid if text == _record_text(pid, key).strip() else None
