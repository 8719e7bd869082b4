"""Workspace confinement: every path a file tool touches stays inside the workspace.

A tool path is *relative* text. It is refused (:class:`~tether.errors.WorkspaceEscape`)
when it is empty, absolute, contains a NUL byte or a ``..`` component, or when any
existing component on the way — intermediate directories and the final name — is a
symbolic link, even one pointing back inside the workspace. ``.`` components and repeated
slashes are ignored (``./src//a.py`` is ``src/a.py``).

Two layers do the checking:

* :func:`resolve_in_workspace` — a path-level check (``lstat`` of every component, then
  the real path compared with the workspace's real path). It gives precise messages.
* :func:`open_parent` and friends — the operations themselves walk the path with
  directory file descriptors, opening each component with ``O_NOFOLLOW | O_DIRECTORY``
  relative to the previous one, and open or replace the final name relative to its
  parent's descriptor with ``O_NOFOLLOW``. A component swapped for a symbolic link
  between the check and the use therefore fails instead of being followed.

Hard links cannot be told apart from ordinary files. Reading a file that is hard-linked
to one outside the workspace reads it; writing never modifies such a file, because
writes replace the name with a new file (the link is broken, the other name keeps the
old content).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tether.errors import ToolError, WorkspaceEscape

__all__ = [
    "ParentDir",
    "describe_os_error",
    "open_parent",
    "open_regular_file",
    "relative_parts",
    "resolve_in_workspace",
    "stat_entry",
]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


TETHER_DIR = ".tether"


def relative_parts(relative: str) -> tuple[str, ...]:
    """The components of a tool path, or :class:`WorkspaceEscape` if it is not allowed.

    An empty tuple means the workspace itself (``"."``).
    """
    if not isinstance(relative, str):
        raise WorkspaceEscape(repr(relative), "path must be text")
    if relative == "":
        raise WorkspaceEscape(relative, "empty path")
    if "\x00" in relative:
        raise WorkspaceEscape(relative, "path contains a NUL byte")
    if relative.startswith("/"):
        raise WorkspaceEscape(relative, "absolute paths are not allowed; use a relative path")
    parts = tuple(p for p in relative.split("/") if p not in ("", "."))
    if ".." in parts:
        raise WorkspaceEscape(relative, "'..' components are not allowed")
    if parts and parts[0] == TETHER_DIR:
        # tether's own state (session logs, effects journal, ledgers) is not the agent's
        # to read or rewrite: a tool must never be able to forge or erase evidence.
        raise WorkspaceEscape(relative, f"{TETHER_DIR}/ holds tether's own state")
    return parts


def _inside(root: str, candidate: str) -> bool:
    return candidate == root or candidate.startswith(root.rstrip(os.sep) + os.sep)


def resolve_in_workspace(
    workspace: Path, relative: str, *, must_exist: bool, for_write: bool
) -> Path:
    """The absolute path of ``relative`` inside ``workspace``, after checking it.

    Every existing component is ``lstat``-ed: a symbolic link anywhere is refused, an
    intermediate non-directory is :class:`NotADirectoryError`. A missing component is
    :class:`FileNotFoundError` when ``must_exist``; otherwise the rest of the path is
    taken as to-be-created. With ``for_write`` an existing final component must be a
    regular file (:class:`IsADirectoryError` for a directory,
    :class:`~tether.errors.ToolError` for a FIFO, device or socket). Finally the real
    path must lie inside the workspace's real path.
    """
    parts = relative_parts(relative)
    root = os.path.realpath(workspace)
    current = root
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        shown = "/".join(parts[: index + 1])
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            if must_exist:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown) from None
            break
        if stat.S_ISLNK(info.st_mode):
            raise WorkspaceEscape(relative, f"{shown} is a symbolic link")
        last = index == len(parts) - 1
        if not last and not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
        if last and for_write and not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
            raise ToolError(f"{shown} is not a regular file; refusing to use it")
    full = os.path.join(root, *parts)
    if not _inside(root, os.path.realpath(full)):
        raise WorkspaceEscape(relative, "resolves outside the workspace")
    return Path(full)


@dataclass(frozen=True, slots=True)
class ParentDir:
    """An open descriptor of a path's parent directory, and the final component's name.

    ``path`` is the normalized relative path (components joined with ``/``).
    ``created`` lists the directories :func:`open_parent` created, outermost first.
    """

    fd: int
    name: str
    path: str
    created: tuple[str, ...]


def _refuse_non_directory(parent_fd: int, part: str, relative: str, shown: str) -> None:
    """Classify a failed directory open: symlink → escape, other non-directory → ENOTDIR."""
    try:
        info = os.stat(part, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise WorkspaceEscape(relative, f"{shown} is a symbolic link")
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)


@contextmanager
def open_parent(workspace: Path, relative: str, *, create: bool) -> Iterator[ParentDir]:
    """Open the parent directory of ``relative`` without following any symbolic link.

    Each component is opened relative to the previous one with ``O_NOFOLLOW``. Missing
    directories raise :class:`FileNotFoundError`, or are created (mode ``0o777`` minus
    umask) when ``create`` — each new directory is opened the same way right after
    ``mkdir``, and its parent is fsynced so the new entry is durable. The descriptor is
    closed when the ``with`` block ends.
    """
    parts = relative_parts(relative)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the path names the workspace itself", ".")
    fd = os.open(workspace, _ROOT_FLAGS)
    created: list[str] = []
    try:
        for index, part in enumerate(parts[:-1]):
            shown = "/".join(parts[: index + 1])
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(
                        errno.ENOENT, os.strerror(errno.ENOENT), shown
                    ) from None
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # created concurrently: the O_NOFOLLOW open below checks it
                else:
                    created.append(shown)
                    os.fsync(fd)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    _refuse_non_directory(fd, part, relative, shown)
                    raise
            except OSError:
                _refuse_non_directory(fd, part, relative, shown)
                raise
            os.close(fd)
            fd = child
        yield ParentDir(fd, parts[-1], "/".join(parts), tuple(created))
    finally:
        os.close(fd)


def stat_entry(parent: ParentDir) -> os.stat_result | None:
    """``lstat`` of the final component, ``None`` if it does not exist.

    A symbolic link raises :class:`WorkspaceEscape`.
    """
    try:
        info = os.stat(parent.name, dir_fd=parent.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise WorkspaceEscape(parent.path, f"{parent.path} is a symbolic link")
    return info


def open_regular_file(parent: ParentDir) -> int:
    """Open the final component read-only; it must be an existing regular file.

    Refuses symbolic links (checked with ``lstat`` and again by ``O_NOFOLLOW``), and
    anything that is not a regular file (directories, FIFOs, devices, sockets) before
    opening it, so a FIFO can never block the call. Returns a descriptor the caller
    closes.
    """
    info = stat_entry(parent)
    if info is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), parent.path)
    _require_regular(parent.path, info)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(parent.name, flags, dir_fd=parent.fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WorkspaceEscape(parent.path, f"{parent.path} is a symbolic link") from None
        raise
    try:
        _require_regular(parent.path, os.fstat(fd))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(path: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{path} is not a regular file; refusing to use it")


_MESSAGES: Final[dict[int, str]] = {
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOSPC: "no space left on device",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "file name too long",
}


def describe_os_error(relative: str, exc: OSError) -> str:
    """A one-line message for an :class:`OSError` of a tool operation on ``relative``."""
    if exc.errno == errno.ELOOP:
        return str(WorkspaceEscape(relative, "a component is a symbolic link"))
    reason = _MESSAGES.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    where = exc.filename
    try:
        normalized = "/".join(relative_parts(relative))
    except WorkspaceEscape:
        normalized = relative
    if isinstance(where, str) and where and normalized.startswith(where + "/"):
        return f"{relative}: {where}: {reason}"  # the failing component is a parent
    return f"{relative}: {reason}"
