"""Reading the files a user hands tether: bounded, typed, and never blocking.

Every file tether reads as input — the session file of ``tether inspect``/``tether plan``,
``CURRENT.json``, a model script, the workspace's ``AGENTS.md`` and ``tether.toml`` — goes
through :func:`read_file` (or :func:`read_optional_file` for a file that may be absent):

1. ``os.stat`` of the path, following symbolic links: anything but a regular file
   (directory, FIFO, device, socket) is refused before it is opened, so a device is never
   even opened.
2. ``os.open`` with ``O_NONBLOCK`` (a FIFO put there after the ``stat`` cannot block the
   open) and ``O_NOCTTY`` (a terminal never becomes tether's controlling terminal).
3. ``os.fstat`` of the open descriptor decides: the name may name something else by now,
   the descriptor cannot. Not a regular file → :class:`~tether.errors.NotARegularFile`.
4. A size above the input's limit → :class:`~tether.errors.InputTooLarge`, before a byte
   is read (or, for an input documented as cut at its limit, the first ``limit`` bytes).
5. At most ``limit + 1`` bytes are read, so a file that grows meanwhile, or that reports a
   size of 0 (``/proc``), is still bounded.

Every failure is an :class:`~tether.errors.InputFileError` (exit 2) whose one-line message
names the input: ``cannot read model script demo.json: it is not a regular file``.

JSON inputs are also bounded in depth: :func:`~tether.core.depth.deeper_than` (pure, in
the core; re-exported here) finds nesting beyond a limit from the bytes alone, without
parsing, so no parser ever recurses into them. The limits are documented in
``docs/cli.md``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

from tether.core.depth import deeper_than, nesting_depth, value_deeper_than
from tether.errors import InputFileError, InputTooLarge, NotARegularFile

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CURRENT_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_SCRIPT_BYTES",
    "MAX_SESSION_FILE_BYTES",
    "MAX_SUBMIT_BYTES",
    "deeper_than",
    "nesting_depth",
    "read_file",
    "read_optional_file",
    "value_deeper_than",
]

MAX_SESSION_FILE_BYTES: Final = 1 << 30
"""A session log read whole by ``tether inspect``/``tether plan`` (1 GiB).

Generous: a 10,000-turn session is about 65 MB. The reduced state takes about 1.7 times the
file's size on top of its bytes, so a log near the limit needs about 3 GB of memory.
"""

MAX_SCRIPT_BYTES: Final = 8 << 20
"""A model script (8 MiB)."""

MAX_SUBMIT_BYTES: Final = 256 << 20
"""The prompts file of ``tether submit --from`` (256 MiB: 100,000 prompts of 2 KB)."""

MAX_CURRENT_BYTES: Final = 1 << 20
"""``CURRENT.json`` of ``tether plan`` (1 MiB)."""

MAX_CONFIG_BYTES: Final = 1 << 20
"""``tether.toml`` (1 MiB)."""

MAX_JSON_DEPTH: Final = 512
"""Deepest nesting of arrays and objects in a JSON input file (model script, CURRENT.json)."""

_OPEN_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_CHUNK: Final = 1 << 20


# --------------------------------------------------------------------------- files


def read_file(
    path: str | os.PathLike[str],
    label: str,
    *,
    limit: int,
    truncate: bool = False,
    within: str | os.PathLike[str] | None = None,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    ``label`` names the input in error messages (``model script demo.json``). Over the
    limit the file is refused (:class:`~tether.errors.InputTooLarge`) unless ``truncate``,
    which returns its first ``limit`` bytes. With ``within``, the file's real path (links
    followed) must be inside that directory. Symbolic links are followed; what they lead to
    must be a regular file. Any problem raises :class:`~tether.errors.InputFileError`.
    """
    data = _read(path, label, limit=limit, truncate=truncate, within=within, missing_ok=False)
    assert data is not None  # missing_ok=False never returns None
    return data


def read_optional_file(
    path: str | os.PathLike[str],
    label: str,
    *,
    limit: int,
    truncate: bool = False,
    within: str | os.PathLike[str] | None = None,
) -> bytes | None:
    """Like :func:`read_file`, but ``None`` when nothing at all is at ``path``.

    A symbolic link to a missing file is still an error: the user meant something to be
    there.
    """
    return _read(path, label, limit=limit, truncate=truncate, within=within, missing_ok=True)


def _read(
    path: str | os.PathLike[str],
    label: str,
    *,
    limit: int,
    truncate: bool,
    within: str | os.PathLike[str] | None,
    missing_ok: bool,
) -> bytes | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputFileError(label, "it is a symbolic link to a missing file") from None
        if missing_ok:
            return None
        raise InputFileError(label, os.strerror(errno.ENOENT)) from None
    except OSError as exc:
        raise InputFileError(label, _reason(exc)) from None
    except ValueError:  # an embedded NUL: no file can have that name
        raise InputFileError(label, "the path contains a NUL character") from None
    _require_regular(label, info)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise InputFileError(label, _reason(exc)) from None
    try:
        info = os.fstat(fd)
        _require_regular(label, info)
        if within is not None:
            _require_within(label, path, info, within)
        if info.st_size > limit and not truncate:
            raise InputTooLarge(label, info.st_size, limit)
        data = _read_at_most(fd, limit if truncate else limit + 1, info.st_size)
    except OSError as exc:
        raise InputFileError(label, _reason(exc)) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the fstat, or its size is not its length (/proc)
        raise InputTooLarge(label, None, limit)
    return data


def _require_regular(label: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise NotARegularFile(label, "it is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(label, "it is not a regular file")


def _require_within(
    label: str, path: str | os.PathLike[str], info: os.stat_result, within: str | os.PathLike[str]
) -> None:
    """The open file (``info``) is the file whose real path lies inside ``within``."""
    real = os.path.realpath(path)
    root = os.path.realpath(within)
    if os.path.commonpath([real, root]) != root:
        raise InputFileError(label, f"it leads to {real}, outside {root}; refusing to read it")
    # The name was resolved after the open: make sure it still names the file we opened,
    # or a link swapped in between could pass the check for a file it does not lead to.
    try:
        now = os.stat(real)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        raise InputFileError(label, "it changed while it was being opened")


def _read_at_most(fd: int, count: int, size: int) -> bytes:
    """Up to ``count`` bytes from ``fd``; ``size`` (the file's size) sizes the first read.

    One ``read`` of the whole file in the common case: its buffer becomes the result, so a
    large file is not held twice in memory.
    """
    chunks: list[bytes] = []
    left = count
    want = min(left, size + 1) if size > 0 else min(left, _CHUNK)
    while left > 0:
        chunk = os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
        want = min(left, _CHUNK)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EISDIR:
        return "it is a directory, not a file"
    return exc.strerror or type(exc).__name__
