"""Workspace confinement: every path a file tool touches stays inside the workspace.

A tool path is *relative* text. It is refused (:class:`~tether.errors.WorkspaceEscape`)
when it is empty, absolute, not valid UTF-8 (a lone surrogate), contains a NUL byte or a
``..`` component, or when any existing component on the way — intermediate directories
and the final name — is a symbolic link, even one pointing back inside the workspace.
``.`` components and repeated slashes are ignored (``./src//a.py`` is ``src/a.py``).

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

**tether's own state** (:class:`ProtectedState`) is never a file-tool target, for
reading or writing: the workspace's ``.tether/`` folder (effects database and its
``-wal``/``-shm``/``-journal`` companions, ledgers, caches, the default sessions
directory) and the sessions directory wherever it is configured (logs, ``*.lock``
sidecars, ``.NAME.jsonl.creating`` temp files). A path is refused
(:class:`~tether.errors.ProtectedPath`) when one of its components *is* one of those
directories — by real path, or by identity (``st_dev``, ``st_ino``: a bind mount or any
second path to the same directory) — or when it names a file with more than one link
that is a hard link to a file of one of them. The descriptor walk checks the identities
again. The protected set comes from the agent's configuration through
:attr:`~tether._tools.base.ToolContext.protected`; ``bash`` is not a file tool and is not
held back by it (only by the authorization policy).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from tether.core.records import record
from tether.errors import ConfigurationError, ProtectedPath, ToolError, WorkspaceEscape

__all__ = [
    "TETHER_DIR",
    "ParentDir",
    "ProtectedState",
    "StateGuard",
    "describe_os_error",
    "open_parent",
    "open_regular_file",
    "relative_parts",
    "resolve_in_workspace",
    "stat_entry",
]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


TETHER_DIR: Final = ".tether"
"""The folder of tether's own state at the workspace root."""


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
    if not _is_utf8_text(relative):
        # A lone surrogate (how Python carries bytes that are not UTF-8): refused before
        # anything is written, by every file tool alike. The session log (JSON) and the
        # effects journal (SQLite text) could not record such a name faithfully.
        raise WorkspaceEscape(relative, "path is not valid UTF-8 text")
    if relative.startswith("/"):
        raise WorkspaceEscape(relative, "absolute paths are not allowed; use a relative path")
    parts = tuple(p for p in relative.split("/") if p not in ("", "."))
    if ".." in parts:
        raise WorkspaceEscape(relative, "'..' components are not allowed")
    if parts and parts[0] == TETHER_DIR:
        # tether's own state (session logs, effects journal, ledgers) is not the agent's
        # to read or rewrite: a tool must never be able to forge or erase evidence.
        raise ProtectedPath(relative, f"{TETHER_DIR}/ is tether's state folder")
    return parts


def _is_utf8_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------- own state


Identity = tuple[int, int]
"""``(st_dev, st_ino)``: what a file or directory is, whatever the path to it."""


def _identity(info: os.stat_result) -> Identity:
    return info.st_dev, info.st_ino


@record(slots=True)
class ProtectedState:
    """tether's own state, which the file tools never touch (see the module docstring).

    ``state_dir`` is the workspace's ``.tether`` folder: everything in it, at any depth,
    is tether's. ``sessions_dir`` is the sessions directory as configured (default
    ``<workspace>/.tether/sessions``, then inside ``state_dir``): everything in it is
    tether's too; the store keeps its files (logs, lock sidecars, creation temp files)
    directly in it, so only its direct entries are compared for hard links. Both are
    absolute; they are resolved (and their identities taken) at every check, since
    they may be created — or replaced — after the agent starts.
    """

    state_dir: Path
    sessions_dir: Path

    def __post_init__(self) -> None:
        for name in ("state_dir", "sessions_dir"):
            if not getattr(self, name).is_absolute():
                raise ValueError(f"ProtectedState.{name} must be absolute")

    @classmethod
    def for_workspace(
        cls,
        workspace: str | os.PathLike[str],
        sessions_dir: str | os.PathLike[str] | None = None,
    ) -> ProtectedState:
        """The state of an agent on ``workspace`` with its sessions in ``sessions_dir``.

        ``sessions_dir`` ``None`` is the default ``<workspace>/.tether/sessions``; a
        relative one is taken relative to the current directory (as the session store
        takes it). A sessions directory that *is* the workspace is refused
        (:class:`~tether.errors.ConfigurationError`): the logs would lie among the
        workspace's own files, where no rule can tell them apart.
        """
        root = Path(os.path.realpath(workspace))
        state = root / TETHER_DIR
        if sessions_dir is None:
            return cls(state, state / "sessions")
        sessions = Path(os.path.abspath(sessions_dir))
        if os.path.realpath(sessions) == str(root):
            raise ConfigurationError(
                f"the sessions directory {os.fspath(sessions_dir)!r} is the workspace itself: "
                "the file tools could not tell its session logs from the workspace's files; "
                "use a folder of its own (e.g. logs/ or the default .tether/sessions)"
            )
        return cls(state, sessions)

    def guard(self) -> StateGuard:
        """The identities and real paths of the protected directories, as they are now."""
        return StateGuard(self)


class StateGuard:
    """One check's view of a :class:`ProtectedState`: real paths and identities, taken once."""

    def __init__(self, state: ProtectedState) -> None:
        self._real: dict[str, str] | None = None  # real path -> what (see _paths)
        self._ids: dict[Identity, str] = {}
        # (directory, what it is, how deep its files are looked for: None = any depth)
        self._scan: tuple[tuple[Path, str, int | None], ...] = (
            (state.state_dir, f"the workspace's {TETHER_DIR}/ folder", None),
            (state.sessions_dir, "the sessions directory", 1),
        )
        for path, what, _ in self._scan:
            try:
                info = os.stat(path)
            except OSError:
                continue  # not created yet: the real path comparison still holds
            if stat.S_ISDIR(info.st_mode):
                self._ids.setdefault(_identity(info), what)

    def _paths(self) -> dict[str, str]:
        """The protected directories by real path, resolved on first use: only a path
        walk asks (for a component that does not exist yet), while the descriptor walk
        of every read and edit goes by identity alone, and ``realpath`` costs an
        ``lstat`` per component."""
        if self._real is None:
            self._real = {}
            for path, what, _ in self._scan:
                self._real.setdefault(os.path.realpath(path), what)
        return self._real

    def check_component(
        self, relative: str, shown: str, real: str | None, info: os.stat_result | None
    ) -> None:
        """Refuse a path whose component ``shown`` (real path ``real``, ``lstat`` ``info``)
        is a protected directory."""
        what = self._paths().get(real) if real is not None else None
        if what is None and info is not None and stat.S_ISDIR(info.st_mode):
            what = self._ids.get(_identity(info))
        if what is not None:
            raise ProtectedPath(relative, f"{shown} is {what}")

    def check_file(self, relative: str, shown: str, info: os.stat_result) -> None:
        """Refuse a regular file that is a hard link to a file of the protected state.

        A file with a single link is never a second name of anything; only for more
        links are the protected directories looked through (``.tether`` at any depth, the
        sessions directory's own entries), so the common case costs nothing.
        """
        if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
            return
        wanted = _identity(info)
        for directory, what, depth in self._scan:
            found = _find_identity(directory, wanted, depth)
            if found is not None:
                # The name only: where the sessions directory lies is none of the model's
                # business (it may be outside the workspace).
                raise ProtectedPath(relative, f"{shown} is a hard link to {found} in {what}")

    def check_directory_fd(self, relative: str, shown: str, fd: int) -> None:
        """The descriptor walk's check: refuse an opened directory that is protected."""
        what = self._ids.get(_identity(os.fstat(fd)))
        if what is not None:
            raise ProtectedPath(relative, f"{shown} is {what}")


def _find_identity(directory: Path, wanted: Identity, depth: int | None) -> str | None:
    """The name of a file under ``directory`` (``depth`` levels, ``None``: all) whose
    identity is ``wanted``; symbolic links are not followed."""
    pending: list[tuple[str, int]] = [(os.fspath(directory), 1)]
    while pending:
        folder, level = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth is None or level < depth:
                    pending.append((entry.path, level + 1))
            elif _identity(info) == wanted:
                return entry.name
    return None


def _inside(root: str, candidate: str) -> bool:
    return candidate == root or candidate.startswith(root.rstrip(os.sep) + os.sep)


def resolve_in_workspace(
    workspace: Path,
    relative: str,
    *,
    must_exist: bool,
    for_write: bool,
    protected: ProtectedState | None = None,
) -> Path:
    """The absolute path of ``relative`` inside ``workspace``, after checking it.

    Every existing component is ``lstat``-ed: a symbolic link anywhere is refused, an
    intermediate non-directory is :class:`NotADirectoryError`. A missing component is
    :class:`FileNotFoundError` when ``must_exist``; otherwise the rest of the path is
    taken as to-be-created. A component that is one of the ``protected`` directories
    (default: the layout of :meth:`ProtectedState.for_workspace`), or a final file hard-
    linked to a file of them, is :class:`~tether.errors.ProtectedPath`. With
    ``for_write`` an existing final component must be a regular file
    (:class:`IsADirectoryError` for a directory, :class:`~tether.errors.ToolError` for a
    FIFO, device or socket). Finally the real path must lie inside the workspace's real
    path.
    """
    parts = relative_parts(relative)
    root = os.path.realpath(workspace)
    guard = (protected or ProtectedState.for_workspace(root)).guard()
    current = root
    missing = False
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        shown = "/".join(parts[: index + 1])
        if missing:
            # Not there yet (it would be created): still not inside a protected folder
            # that does not exist yet either. No link on the way, so this is its real path.
            guard.check_component(relative, shown, current, None)
            continue
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            if must_exist:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown) from None
            missing = True
            guard.check_component(relative, shown, current, None)
            continue
        if stat.S_ISLNK(info.st_mode):
            raise WorkspaceEscape(relative, f"{shown} is a symbolic link")
        guard.check_component(relative, shown, current, info)
        last = index == len(parts) - 1
        if not last and not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
        if last:
            guard.check_file(relative, shown, info)
        if last and for_write and not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
            raise ToolError(f"{shown} is not a regular file; refusing to use it")
    full = os.path.join(root, *parts)
    if not _inside(root, os.path.realpath(full)):
        raise WorkspaceEscape(relative, "resolves outside the workspace")
    return Path(full)


@record(slots=True)
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
def open_parent(
    workspace: Path, relative: str, *, create: bool, guard: StateGuard | None = None
) -> Iterator[ParentDir]:
    """Open the parent directory of ``relative`` without following any symbolic link.

    Each component is opened relative to the previous one with ``O_NOFOLLOW``. Missing
    directories raise :class:`FileNotFoundError`, or are created (mode ``0o777`` minus
    umask) when ``create`` — each new directory is opened the same way right after
    ``mkdir``, and its parent is fsynced so the new entry is durable. With ``guard``,
    a directory on the way that is protected state (by identity) is
    :class:`~tether.errors.ProtectedPath`, checked on the open descriptor before anything
    is created in it. The descriptor is closed when the ``with`` block ends.
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
            if guard is not None:
                guard.check_directory_fd(relative, shown, fd)
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
