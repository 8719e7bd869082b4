"""Directories tether creates for its own files, made durable before anything depends on them.

A new directory's name is an entry of its *parent*; by POSIX (and in practice on ext4, xfs
and btrfs) that entry survives a power cut only once the parent has been ``fsync``-ed. A
file synced inside a directory whose own entry was never synced can vanish with it. So
every directory made here is followed at once by ``fsync(parent)``, top down; the new
directory is then the parent of the next one (or of the file the caller creates next), and
the caller's own ``fsync`` of it makes that entry durable in turn (see ``docs/store.md``).

Used by the session store (``.tether/``, ``.tether/sessions/``, ``--sessions-dir``) and the
effects databases (``.tether/effects.db`` and ledgers).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "STATE_DIR_NAME",
    "DirectoryError",
    "ignore_in_git",
    "make_directories",
    "sync_directory",
]

STATE_DIR_NAME = ".tether"
"""The workspace's own state folder (sessions, effects.db, caches)."""

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class DirectoryError(OSError):
    """Creating or syncing a directory failed; ``op`` says which (``"mkdir"``/``"fsync"``).

    An :class:`OSError` with the original ``errno`` and the directory as ``filename``, so
    callers can map it to their own error without losing the cause.
    """

    def __init__(self, op: str, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.op = op
        self.path = path


def sync_directory(path: Path) -> None:
    """``fsync`` the directory ``path`` (its entries: files and directories made in it)."""
    try:
        fd = os.open(path, _O_DIR)
    except OSError as exc:
        raise DirectoryError("fsync", path, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DirectoryError("fsync", path, exc) from exc
    finally:
        os.close(fd)


def make_directories(
    path: Path, *, mode: int = 0o700, base: Path | None = None, durable: bool = True
) -> list[Path]:
    """Create ``path`` and its missing ancestors below ``base``; return those created.

    ``base`` (when given) must already exist: only directories under it are made (a missing
    ``base`` raises :class:`DirectoryError` with ``ENOENT`` from the first ``mkdir``). With
    ``durable``, each ``mkdir`` is followed by ``fsync`` of its parent before the next one.
    A directory that appears concurrently counts as existing (not created here). Raises
    :class:`DirectoryError` (``mkdir`` or ``fsync``) on failure; directories made before
    the failure stay (they are empty and harmless).
    """
    missing: list[Path] = []
    probe = path
    while not probe.is_dir():
        if base is not None and probe == base:
            break  # the base itself is never created: mkdir below reports ENOENT
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    created: list[Path] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError as exc:
            if directory.is_dir():
                continue  # made by someone else meanwhile; they sync their own mkdir
            raise DirectoryError("mkdir", directory, exc) from exc
        except OSError as exc:
            raise DirectoryError("mkdir", directory, exc) from exc
        created.append(directory)
        if durable:
            sync_directory(directory.parent)
    return created


def ignore_in_git(created: list[Path]) -> None:
    """Give each ``.tether`` folder among ``created`` a ``.gitignore`` of ``*``.

    The folder holds transcripts, the effects database and caches: nothing to commit, and
    easy to commit by accident with ``git add .``. Written only when tether made the folder
    (a user's own ``.gitignore`` there is never replaced); best effort, since git hygiene
    must never fail a run. Synced with the folder's next ``fsync`` like any entry of it.
    """
    for directory in created:
        if directory.name != STATE_DIR_NAME:
            continue
        try:
            fd = os.open(
                directory / ".gitignore",
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
            )
        except OSError:
            continue
        try:
            os.write(fd, b"# tether's own state (sessions, effects.db): never commit it\n*\n")
        except OSError:
            pass
        finally:
            os.close(fd)
