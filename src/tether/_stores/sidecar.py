"""A small record kept beside a session log, as a file (the file store's sidecars).

A session keeps one such record today: which effects database holds its evidence
(:mod:`tether._effects.binding`). The record is not part of the log — the log's format is a
strict published contract — but it belongs to the session's side, so it lives wherever the
session store keeps the session: for the file store, a hidden file next to the log,
``.<session id>.<name>.json`` (hidden, so session listings ignore it; mode ``0600``).

:class:`FileSidecar` implements :class:`tether._stores.protocol.SessionSidecar`:

* :meth:`~FileSidecar.read` never follows a link, never blocks on a FIFO and reads at
  most ``limit`` bytes; what cannot be read is reported with the reason, not raised;
* :meth:`~FileSidecar.write` replaces the record atomically and durably: a temporary
  name, ``fsync``, rename, directory ``fsync``. Only the session's writer writes (it holds
  the session lock), so one temporary name per record is enough.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

from tether.core.records import record

__all__ = ["DEFAULT_LIMIT", "FileSidecar", "sidecar_path"]

DEFAULT_LIMIT: Final = 64 * 1024
"""Largest record :meth:`FileSidecar.read` accepts."""


def sidecar_path(sessions_dir: str | os.PathLike[str], session_id: str, name: str) -> Path:
    """``<sessions dir>/.<session id>.<name>.json``."""
    return Path(sessions_dir) / f".{session_id}.{name}.json"


@record(slots=True)
class FileSidecar:
    """One record as a file at ``path`` (see the module docstring)."""

    path: Path
    limit: int = DEFAULT_LIMIT

    @property
    def location(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        """Whether something is at the record's name (a link or a directory counts: it
        is there, and unreadable)."""
        return os.path.lexists(self.path)

    def read(self) -> tuple[bytes | None, str | None]:
        """``(data, None)``; ``(None, None)`` when there is none; ``(None, why)`` when it
        cannot be read (a link, not a regular file, too large, an I/O error)."""
        path = self.path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None, f"{path} is a symbolic link"
            return None, f"{path}: {exc.strerror or exc}"
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None, f"{path} is not a regular file"
            if info.st_size > self.limit:
                return None, f"{path} is larger than {self.limit} bytes"
            return os.read(fd, self.limit + 1), None
        except OSError as exc:
            return None, f"{path}: {exc.strerror or exc}"
        finally:
            os.close(fd)

    def write(self, data: bytes) -> None:
        """Replace the record with ``data``, atomically and durably (mode ``0600``).

        Raises :class:`OSError`; a temporary file left by the failure is removed.
        """
        final = self.path
        temp = f"{final.name}.tmp"
        dir_fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except OSError:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        finally:
            os.close(dir_fd)
