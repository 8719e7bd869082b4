r"""The built-in tools: ``read``, ``bash``, ``write`` and ``edit``.

=========  =======  ==================  =================================================
tool       replay   replay key          effect
=========  =======  ==================  =================================================
``read``   safe     ``builtin:read:v1``  none (reading again after a crash is harmless)
``bash``   never    ``builtin:bash:v1``  anything the command does
``write``  never    ``builtin:write:v1`` replaces one file atomically
``edit``   never    ``builtin:edit:v1``  replaces one file atomically
=========  =======  ==================  =================================================

File tools only accept relative paths inside the workspace, and never touch tether's own
state (session logs, locks, the effects database: ``ToolContext.protected``; see
:mod:`tether._tools.workspace`). ``write`` and ``edit`` are :class:`FileChangeTool`\ s
(recovery kind ``journaledFileChange``), split into a pure-ish *plan* step
(:meth:`FileChangeTool.plan_change`: read the current file, compute the new bytes and both
hashes — :func:`plan_write`, :func:`plan_edit`) and an *apply* step (:func:`apply_change`:
compare-and-swap on the content hash, then temp file + fsync + rename + directory fsync),
so that the action journal can record the planned change before applying it and recognise
an applied one. The journal knows no tool: what a change reads like is the tool's
(:meth:`FileChangeTool.result_text`, :meth:`FileChangeTool.result_metadata`).

``bash`` runs its command inside the agent's sandbox (``ToolContext.sandbox``, bubblewrap:
docs/sandbox.md); with the sandbox off (or a context made by hand) the command runs with
tether's privileges and may touch anything they allow. It runs in the workspace, in its own
process group, and that whole group is killed on timeout, on abort, when the command itself
has exited (no background processes are left behind unless they leave the group, and none
at all in the sandbox), and when tether dies (see :mod:`tether._procs`). It gets tether's
environment without tether's credentials.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import IO, Any, Final, Protocol

import tether._faults as faults
from tether._credentials import child_environment
from tether._tools.base import RecoveryKind, Tool, ToolContext, ToolResult
from tether._tools.workspace import (
    ParentDir,
    ProtectedState,
    StateGuard,
    describe_os_error,
    open_parent,
    open_regular_file,
    relative_parts,
    resolve_in_workspace,
    stat_entry,
)
from tether.core.canonical import hasher_digest, sha256_digest
from tether.core.kinds import Replay
from tether.core.records import field, record
from tether.errors import SandboxUnavailable, StaleFileChange, ToolError

__all__ = [
    "BASH_DEFAULT_TIMEOUT",
    "BASH_MAX_TIMEOUT",
    "BASH_OUTPUT_HEAD",
    "BASH_OUTPUT_TAIL",
    "EDIT_MAX_BYTES",
    "READ_MAX_BYTES",
    "READ_MAX_LINES",
    "ApplyOutcome",
    "BashTool",
    "EditTool",
    "FileChange",
    "FileChangePlanner",
    "FileChangeTool",
    "PlannedChange",
    "ReadTool",
    "WriteTool",
    "apply_change",
    "builtin_file_tool",
    "builtin_tools",
    "content_hash",
    "current_hash",
    "plan_edit",
    "plan_write",
]

READ_MAX_LINES: Final = 2000
"""Most lines ``read`` returns per call (also the maximum ``limit``)."""
READ_MAX_BYTES: Final = 50 * 1024
"""Most bytes of file content ``read`` returns per call."""
EDIT_MAX_BYTES: Final = 16 * 1024 * 1024
"""Largest file ``edit`` will load."""
BASH_DEFAULT_TIMEOUT: Final = 120.0
BASH_MAX_TIMEOUT: Final = 600.0
BASH_OUTPUT_HEAD: Final = 10 * 1024
"""Bytes kept from the start of a command's output."""
BASH_OUTPUT_TAIL: Final = 20 * 1024
"""Bytes kept from the end of a command's output."""

_CHUNK: Final = 64 * 1024
_BINARY_PROBE: Final = 8192

BEFORE_REPLACE = faults.register(
    "tools.apply.before_replace", "file change: temp file written and fsynced, not yet renamed"
)
AFTER_REPLACE = faults.register(
    "tools.apply.after_replace", "file change: renamed over the target, directory not fsynced"
)


def _error(exc: Exception, path: object) -> ToolResult:
    """The error result for an expected failure of a file tool."""
    if isinstance(exc, ToolError):
        return ToolResult.error(f"Error: {exc}")
    if isinstance(exc, OSError):
        return ToolResult.error(f"Error: {describe_os_error(str(path), exc)}")
    raise exc


# =========================================================================== read


class ReadTool(Tool):
    """``read`` {path, offset?, limit?}: a window of lines of a text file, exactly as stored.

    Lines are returned verbatim (no line numbers), so a snippet can be pasted into
    ``edit``'s ``old_string`` as is. ``offset`` is the 1-based number of the first line;
    ``limit`` the number of lines (at most :data:`READ_MAX_LINES`). At most
    :data:`READ_MAX_BYTES` bytes of content are returned; whenever the window ends before
    the file does, a final line says how much was cut and which offset continues::

        [... cut: 120 more lines / 4567 bytes not shown; use offset=2001 to read further]

    Invalid UTF-8 is shown as U+FFFD. A file with a NUL byte in its first 8 KiB is
    refused as binary. An empty file reads as ``[empty file]``.
    """

    name = "read"
    description = (
        "Read a text file in the workspace. Returns the file's lines verbatim (no line "
        "numbers). Use offset (1-based first line) and limit (number of lines) to read "
        f"long files in parts; at most {READ_MAX_LINES} lines or {READ_MAX_BYTES // 1024} KB "
        "are returned per call, and a final note says how to continue. Paths are relative "
        "to the workspace."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File path relative to the workspace root.",
                "minLength": 1,
            },
            "offset": {
                "type": "integer",
                "description": "1-based line number to start reading from (default 1).",
                "minimum": 1,
            },
            "limit": {
                "type": "integer",
                "description": f"Maximum number of lines to return (default {READ_MAX_LINES}).",
                "minimum": 1,
                "maximum": READ_MAX_LINES,
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    replay = Replay.SAFE
    replay_key = "builtin:read:v1"

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        path = arguments["path"]
        offset = int(arguments.get("offset", 1))
        limit = min(int(arguments.get("limit", READ_MAX_LINES)), READ_MAX_LINES)
        try:
            # The descriptor walk is the whole check (no symbolic link followed, protected
            # directories refused by identity, hard links to the state refused), so no
            # path-based resolution first: it would lstat every component a second time.
            guard = context.protected_state().guard()
            with open_parent(context.workspace, path, create=False, guard=guard) as parent:
                fd = open_regular_file(parent)
                shown = parent.path
                _refuse_linked_state(guard, parent, fd)
            with os.fdopen(fd, "rb") as file:
                return _read_window(file, shown, offset, limit)
        except (ToolError, OSError) as exc:
            return _error(exc, path)


def _utf8_prefix(data: bytes) -> bytes:
    """``data`` without a trailing incomplete UTF-8 sequence (at most 3 bytes dropped)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            return data if need <= back else data[:-back]
    return data


def _read_window(file: IO[bytes], path: str, offset: int, limit: int) -> ToolResult:
    size = os.fstat(file.fileno()).st_size
    probe = file.read(_BINARY_PROBE)
    if b"\x00" in probe:
        return ToolResult.error(f"Error: {path} looks like a binary file (it contains NUL bytes)")
    if offset == 1 and 0 < len(probe) < _BINARY_PROBE and not file.read(1):
        # The common case, a small file read from the top: the probe already holds all of
        # it, so the line-by-line walk below (a tell and a readline per line) is not needed
        # when every line fits. Same text and metadata as the walk would give.
        lines = probe.count(b"\n") + (not probe.endswith(b"\n"))
        if lines <= limit and len(probe) <= READ_MAX_BYTES:
            text = probe.decode("utf-8", errors="replace")
            return ToolResult(
                text, metadata={"path": path, "size": size, "first_line": 1, "lines": lines}
            )
    file.seek(0)
    if size == 0 and offset == 1:
        return ToolResult("[empty file]", metadata={"path": path, "size": 0, "lines": 0})
    # Skip to the first requested line (in bounded pieces: lines may be huge).
    line_no, partial = 1, False
    while line_no < offset:
        piece = file.readline(_CHUNK)
        if not piece:
            break
        partial = not piece.endswith(b"\n")
        if not partial:
            line_no += 1
    if line_no < offset or file.tell() >= size:
        lines = line_no - 1 + partial
        return ToolResult.error(
            f"Error: offset {offset} is past the end of {path} ({lines} lines)", size=size
        )
    shown = bytearray()
    count = 0
    long_line = False
    while count < limit:
        start = file.tell()
        room = READ_MAX_BYTES - len(shown)
        line = file.readline(room + 1)
        if not line:
            break
        if len(line) <= room:  # complete: ends with a newline or at the end of the file
            shown += line
            count += 1
            continue
        if count == 0:  # a single line longer than the whole budget: show its start
            shown += _utf8_prefix(line[:room])
            count, long_line = 1, True
            file.seek(start + len(shown))
        else:
            file.seek(start)
        break
    rest_lines, rest_bytes = 0, 0
    last = b"\n"
    while chunk := file.read(_CHUNK):
        rest_bytes += len(chunk)
        rest_lines += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        rest_lines += 1
    text = bytes(shown).decode("utf-8", errors="replace")
    metadata: dict[str, Any] = {"path": path, "size": size, "first_line": offset, "lines": count}
    if rest_bytes == 0:
        return ToolResult(text, metadata=metadata)
    if not text.endswith("\n"):
        text += "\n"
    if long_line:
        text += f"[... line {offset} is longer than {READ_MAX_BYTES} bytes; only its start shown]\n"
    text += (
        f"[... cut: {rest_lines} more lines / {rest_bytes} bytes not shown; "
        f"use offset={offset + count} to read further]"
    )
    metadata.update(cut_lines=rest_lines, cut_bytes=rest_bytes)
    return ToolResult(text, metadata=metadata)


# =========================================================================== file changes


def content_hash(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``: the content identity used by file changes."""
    return sha256_digest(data)


@record(slots=True)
class FileChange:
    """A planned replacement of one file's content.

    ``path`` is the normalized workspace-relative path; ``before_hash`` the content hash
    the file had when planned (``None``: it did not exist); ``after_hash`` the hash of
    ``new_bytes``. Everything but the bytes is small and JSON-friendly, for a journal.
    """

    path: str
    before_hash: str | None
    after_hash: str
    new_bytes: bytes = field(repr=False)


class ApplyOutcome(StrEnum):
    APPLIED = "applied"
    """The file now holds the new bytes; this call wrote them."""
    ALREADY_APPLIED = "alreadyApplied"
    """The file already held exactly the new bytes; nothing was written."""


def _hash_fd(fd: int) -> str:
    hasher = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        hasher.update(chunk)
    return hasher_digest(hasher)


def _hash_entry(parent: ParentDir) -> tuple[str | None, os.stat_result | None]:
    """Hash and lstat of the final component (``(None, None)`` when absent)."""
    info = stat_entry(parent)
    if info is None:
        return None, None
    fd = open_regular_file(parent)
    try:
        return _hash_fd(fd), info
    finally:
        os.close(fd)


def current_hash(workspace: Path, relative: str) -> str | None:
    """The content hash of ``relative`` now, ``None`` if it (or a parent) does not exist."""
    try:
        with open_parent(workspace, relative, create=False) as parent:
            return _hash_entry(parent)[0]
    except FileNotFoundError:
        return None


def _refuse_linked_state(guard: StateGuard, parent: ParentDir, fd: int) -> None:
    """Refuse (and close) ``fd`` when the file opened is a hard link to tether's state.

    The path check did the same before the open; this one is on the very file opened.
    """
    try:
        guard.check_file(parent.path, parent.path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise


def _read_existing(
    workspace: Path, relative: str, limit: int, protected: ProtectedState | None
) -> tuple[str, bytes]:
    """Normalized path and bytes of an existing regular file of at most ``limit`` bytes."""
    state = protected or ProtectedState.for_workspace(workspace)
    resolve_in_workspace(workspace, relative, must_exist=True, for_write=True, protected=state)
    guard = state.guard()
    with open_parent(workspace, relative, create=False, guard=guard) as parent:
        fd = open_regular_file(parent)
        path = parent.path
        _refuse_linked_state(guard, parent, fd)
    try:
        if os.fstat(fd).st_size > limit:
            raise ToolError(f"{path} is larger than {limit} bytes; refusing to edit it")
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return path, b"".join(chunks)
    finally:
        os.close(fd)


def plan_write(
    workspace: Path, relative: str, content: str, *, protected: ProtectedState | None = None
) -> FileChange:
    """Plan replacing (or creating) ``relative`` with ``content`` encoded as UTF-8.

    Reads only: checks the path, hashes the current file if there is one. Raises
    :class:`~tether.errors.ToolError` (incl. ``WorkspaceEscape`` and ``ProtectedPath``:
    tether's ``protected`` state, default the layout of
    :meth:`~tether._tools.workspace.ProtectedState.for_workspace`) or :class:`OSError`.
    """
    if relative.endswith("/"):
        raise ToolError(f"{relative!r} names a directory; give a file path")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("content is not valid Unicode text") from None
    resolve_in_workspace(workspace, relative, must_exist=False, for_write=True, protected=protected)
    path = "/".join(relative_parts(relative))
    return FileChange(path, current_hash(workspace, relative), content_hash(data), data)


def plan_edit(
    workspace: Path,
    relative: str,
    old_string: str,
    new_string: str,
    *,
    replace_all: bool = False,
    protected: ProtectedState | None = None,
) -> tuple[FileChange, int]:
    """Plan an exact-text replacement in an existing file; returns the change and the count.

    The file is decoded as UTF-8 with ``surrogateescape``, so bytes that are not UTF-8
    survive the edit unchanged. ``old_string`` must occur exactly once, or at least once
    with ``replace_all``; otherwise :class:`~tether.errors.ToolError` says why. A path
    into tether's ``protected`` state is refused before the file is read (see
    :func:`plan_write`).
    """
    if old_string == "":
        raise ToolError("old_string must not be empty")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    path, data = _read_existing(workspace, relative, EDIT_MAX_BYTES, protected)
    text = data.decode("utf-8", errors="surrogateescape")
    count = text.count(old_string)
    if count == 0:
        raise ToolError(
            f"old_string was not found in {path}; it must match the file exactly, "
            "including whitespace and line breaks"
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {path}; include more surrounding text to "
            "make it unique, or set replace_all to replace every occurrence"
        )
    new_text = (
        text.replace(old_string, new_string)
        if replace_all
        else text.replace(old_string, new_string, 1)
    )
    try:
        new_bytes = new_text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        raise ToolError("new_string is not valid Unicode text") from None
    return FileChange(path, content_hash(data), content_hash(new_bytes), new_bytes), count


def apply_change(
    workspace: Path, change: FileChange, *, protected: ProtectedState | None = None
) -> ApplyOutcome:
    """Apply ``change`` atomically, with compare-and-swap on the content hash.

    * file already holds ``after_hash`` → :attr:`ApplyOutcome.ALREADY_APPLIED`, no write
      (so applying a change again after a crash is harmless);
    * file's hash differs from ``before_hash`` (``None`` = must not exist) →
      :class:`~tether.errors.StaleFileChange`, no write;
    * otherwise missing parent directories are created inside the workspace (each checked
      with ``O_NOFOLLOW``), the bytes go to a temp file in the target directory (fsync),
      which is renamed over the target (``os.replace``; a symlink target is refused), and
      the directory is fsynced.

    A replaced file keeps its permission bits (``0o777`` part; set-id and sticky bits
    are dropped); a new file gets ``0o666`` minus the umask (normally ``0o644``).
    Ownership, ACLs and extended attributes are not preserved; hard links to the old
    file keep the old content.

    tether's ``protected`` state (default: the layout of
    :meth:`~tether._tools.workspace.ProtectedState.for_workspace`) is checked again on
    the way — each directory by identity, before anything is created in it, and the
    target for a hard link — so a folder swapped in since the plan is still refused.
    """
    state = protected or ProtectedState.for_workspace(workspace)
    guard = state.guard()
    with open_parent(workspace, change.path, create=True, guard=guard) as parent:
        entry = stat_entry(parent)
        if entry is not None:
            guard.check_file(change.path, change.path, entry)
        found, info = _hash_entry(parent)
        if found == change.after_hash:
            return ApplyOutcome.ALREADY_APPLIED
        if found != change.before_hash:
            raise StaleFileChange(change.path, change.before_hash, found)
        mode = stat.S_IMODE(info.st_mode) & 0o777 if info is not None else None
        import secrets  # Imported here: only a file change names a temporary file (random).

        temp = f".{parent.name[:200]}.{secrets.token_hex(6)}.tether-tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o666, dir_fd=parent.fd)
        try:
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
                view = memoryview(change.new_bytes)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            faults.hit(BEFORE_REPLACE)
            os.replace(temp, parent.name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=parent.fd)
            except OSError:
                pass
            raise
        faults.hit(AFTER_REPLACE)
        os.fsync(parent.fd)
    return ApplyOutcome.APPLIED


def _change_metadata(change: FileChange, outcome: ApplyOutcome) -> dict[str, Any]:
    return {
        "path": change.path,
        "before_hash": change.before_hash,
        "after_hash": change.after_hash,
        "bytes_written": len(change.new_bytes) if outcome is ApplyOutcome.APPLIED else 0,
        "outcome": outcome.value,
    }


# =========================================================================== write, edit


@record(slots=True)
class PlannedChange:
    """What a :class:`FileChangeTool` plans for one call: the file change and, for the
    result texts, how many replacements it makes (``edit``; 0 for tools without a count)."""

    change: FileChange
    count: int = 0


class FileChangePlanner(Protocol):
    """What the action journal asks of a ``journaledFileChange`` tool (see
    :class:`FileChangeTool`, the base class that provides it)."""

    name: str

    def plan_change(
        self,
        workspace: Path,
        arguments: Mapping[str, Any],
        *,
        protected: ProtectedState | None = None,
    ) -> PlannedChange: ...

    def result_text(self, planned: PlannedChange, outcome: ApplyOutcome) -> str: ...

    def result_metadata(self, planned: PlannedChange, outcome: ApplyOutcome) -> dict[str, Any]: ...


class FileChangeTool(Tool):
    """A tool whose every call replaces the content of one file (``write``, ``edit``).

    It declares :attr:`~tether._tools.base.RecoveryKind.JOURNALED`: the executor runs its
    calls through the action journal (:mod:`tether._effects.journal`), which records the
    planned change before the call starts and applies it under compare-and-swap, so a crash
    can be reconciled against the file. The journal needs only what a subclass provides:

    * :meth:`plan_change` — read the file and plan the new content (no writes), raising
      :class:`~tether.errors.ToolError` or :class:`OSError` for a call that cannot run;
    * :meth:`result_text` and :meth:`result_metadata` — the success result for an outcome.

    :meth:`run` (a call outside the journal) plans and applies the same change, with the
    same texts.
    """

    recovery = RecoveryKind.JOURNALED

    @abstractmethod
    def plan_change(
        self,
        workspace: Path,
        arguments: Mapping[str, Any],
        *,
        protected: ProtectedState | None = None,
    ) -> PlannedChange:
        """Plan the call's file change (read only; ``protected`` is tether's own state)."""

    @abstractmethod
    def result_text(self, planned: PlannedChange, outcome: ApplyOutcome) -> str:
        """The success text of the call once the change has ``outcome``."""

    def result_metadata(self, planned: PlannedChange, outcome: ApplyOutcome) -> dict[str, Any]:
        """The success result's metadata (path, both hashes, bytes written, outcome)."""
        return _change_metadata(planned.change, outcome)

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        path = arguments.get("path")
        return (
            f"{self.name} {path}" if isinstance(path, str) else super().approval_summary(arguments)
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        path = arguments["path"]
        try:
            protected = context.protected_state()
            planned = self.plan_change(context.workspace, arguments, protected=protected)
            outcome = apply_change(context.workspace, planned.change, protected=protected)
        except (ToolError, OSError) as exc:
            return _error(exc, path)
        return ToolResult(
            self.result_text(planned, outcome), metadata=self.result_metadata(planned, outcome)
        )


class WriteTool(FileChangeTool):
    """``write`` {path, content}: create or replace a file with ``content`` (UTF-8)."""

    name = "write"
    description = (
        "Create or overwrite a text file in the workspace with the given content (UTF-8). "
        "Missing parent directories are created. The file is replaced atomically. Paths "
        "are relative to the workspace root; to change part of an existing file, prefer edit."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File path relative to the workspace root.",
                "minLength": 1,
            },
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }
    replay = Replay.NEVER
    replay_key = "builtin:write:v1"

    def plan_change(
        self,
        workspace: Path,
        arguments: Mapping[str, Any],
        *,
        protected: ProtectedState | None = None,
    ) -> PlannedChange:
        return PlannedChange(
            plan_write(workspace, arguments["path"], arguments["content"], protected=protected)
        )

    def result_text(self, planned: PlannedChange, outcome: ApplyOutcome) -> str:
        change = planned.change
        what = "created" if change.before_hash is None else "replaced"
        if outcome is ApplyOutcome.ALREADY_APPLIED:
            what = "unchanged: it already had this content"
        return f"Wrote {len(change.new_bytes)} bytes to {change.path} ({what})"


class EditTool(FileChangeTool):
    """``edit`` {path, old_string, new_string, replace_all?}: exact text replacement."""

    name = "edit"
    description = (
        "Replace exact text in an existing file in the workspace. old_string must match the "
        "file exactly (including whitespace and line breaks) and occur exactly once, unless "
        "replace_all is true, which replaces every occurrence. Read the file first."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "File path relative to the workspace root.",
                "minLength": 1,
            },
            "old_string": {
                "type": "string",
                "description": "The exact text to replace.",
                "minLength": 1,
            },
            "new_string": {"type": "string", "description": "The replacement text."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence instead of exactly one (default false).",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }
    replay = Replay.NEVER
    replay_key = "builtin:edit:v1"

    def plan_change(
        self,
        workspace: Path,
        arguments: Mapping[str, Any],
        *,
        protected: ProtectedState | None = None,
    ) -> PlannedChange:
        change, count = plan_edit(
            workspace,
            arguments["path"],
            arguments["old_string"],
            arguments["new_string"],
            replace_all=bool(arguments.get("replace_all", False)),
            protected=protected,
        )
        return PlannedChange(change, count)

    def result_text(self, planned: PlannedChange, outcome: ApplyOutcome) -> str:
        plural = "occurrence" if planned.count == 1 else "occurrences"
        return f"Edited {planned.change.path}: replaced {planned.count} {plural}"

    def result_metadata(self, planned: PlannedChange, outcome: ApplyOutcome) -> dict[str, Any]:
        return {**_change_metadata(planned.change, outcome), "replacements": planned.count}


_JOURNALED_BUILTINS: Final[Mapping[str, type[FileChangeTool]]] = {
    WriteTool.name: WriteTool,
    EditTool.name: EditTool,
}


def builtin_file_tool(name: str) -> FileChangeTool:
    """A fresh built-in file-change tool by name (``write`` or ``edit``), for callers of
    the journal that name the tool instead of passing it; :class:`ValueError` otherwise."""
    found = _JOURNALED_BUILTINS.get(name)
    if found is None:
        raise ValueError(f"not a journaled tool: {name!r}")
    return found()


# =========================================================================== bash


@record(frozen=False, slots=True)
class _Capture:
    """Combined output, keeping only the first ``head`` and last ``tail`` bytes."""

    head_cap: int
    tail_cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0
    newlines: int = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.newlines += data.count(b"\n")
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: -self.tail_cap]

    def render(self) -> tuple[str, int]:
        """The kept output as text, and the number of bytes cut from the middle."""
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap else b""
        cut = self.total - len(self.head) - len(tail)
        if cut == 0:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace"), 0
        cut_lines = self.newlines - self.head.count(b"\n") - tail.count(b"\n")
        note = f"\n[... cut: {cut} bytes ({cut_lines} lines) of output not shown ...]\n"
        text = (
            _utf8_prefix(bytes(self.head)).decode("utf-8", errors="replace")
            + note
            + tail.decode("utf-8", errors="replace")
        )
        return text, cut


def _exit_text(code: int) -> str:
    if code >= 0:
        return str(code)
    import signal  # only a command killed by a signal needs it, not building the tools

    try:
        return f"{code} (killed by {signal.Signals(-code).name})"
    except ValueError:
        return f"{code} (killed by signal {-code})"


@cache
def _sandbox_refusals() -> re.Pattern[str]:
    """What a refusal by the sandbox looks like (compiled at the first failed command)."""
    return re.compile(
        r"Read-only file system|Permission denied|Operation not permitted|Network is unreachable"
        r"|Could not resolve host|Temporary failure in name resolution"
    )


SANDBOX_REFUSAL_NOTE: Final = (
    "an error above may be the sandbox refusing: only the workspace (and /tmp) can be "
    "written, tether's .tether/ and credential folders are hidden, the network is off "
    "unless allowed; see docs/sandbox.md"
)


class BashTool(Tool):
    """``bash`` {command, timeout?}: run a shell command in the workspace.

    ``/bin/bash -c command`` with the workspace as working directory, stdin from
    ``/dev/null``, stdout and stderr combined, in a new session (its own process group),
    through :func:`tether._procs.run_in_group`. The result shows the output — capped: the
    first :data:`BASH_OUTPUT_HEAD` and last :data:`BASH_OUTPUT_TAIL` bytes, with a note of
    what was cut between them — followed by ``exit code: N``. A non-zero exit code is still
    a *success* result: the command ran and the model sees its status. Timeout
    (``timeout`` argument, default :data:`BASH_DEFAULT_TIMEOUT` s, capped by
    ``context.timeout``) and abort (``context.cancel``, polled every 50 ms) are *error*
    results; both kill the whole process group (SIGTERM, then SIGKILL after ``kill_grace``
    seconds). When the command exits normally, leftover processes of its group are killed
    the same way, and if tether dies the group is killed by tether's reaper.

    ``env`` is the command's whole environment. By default it is tether's own without
    tether's credentials (:func:`tether._credentials.child_environment`), except the
    variables named in ``pass_env``.
    """

    name = "bash"
    parks = True  # run_in_group's waits park a worker's session (tether._hub)
    description = (
        "Run a bash command in the workspace directory and return its combined stdout and "
        "stderr followed by the exit code. stdin is empty; commands must not be interactive. "
        f"Long output is cut in the middle (first {BASH_OUTPUT_HEAD // 1024} KB and last "
        f"{BASH_OUTPUT_TAIL // 1024} KB are kept). The command is killed, with every process "
        f"it started, after timeout seconds (default {BASH_DEFAULT_TIMEOUT:g})."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The bash command line to run.",
                "minLength": 1,
            },
            "timeout": {
                "type": "number",
                "description": (
                    f"Timeout in seconds (default {BASH_DEFAULT_TIMEOUT:g}, "
                    f"at most {BASH_MAX_TIMEOUT:g})."
                ),
                "exclusiveMinimum": 0,
                "maximum": BASH_MAX_TIMEOUT,
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    replay = Replay.NEVER
    replay_key = "builtin:bash:v1"
    runs_commands = True

    poll_interval: float = 0.05

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        command = arguments.get("command")
        return command if isinstance(command, str) else super().approval_summary(arguments)

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        kill_grace: float = 2.0,
        default_timeout: float = BASH_DEFAULT_TIMEOUT,
        output_head: int = BASH_OUTPUT_HEAD,
        output_tail: int = BASH_OUTPUT_TAIL,
    ) -> None:
        super().__init__()
        self.env = dict(env) if env is not None else None
        self.pass_env = tuple(pass_env)
        self.kill_grace = kill_grace
        self.default_timeout = default_timeout
        self.output_head = output_head
        self.output_tail = output_tail

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        command = arguments["command"]
        timeout = float(arguments.get("timeout", self.default_timeout))
        if context.timeout is not None:
            timeout = min(timeout, context.timeout)
        aborted_before = ToolResult.error("Error: aborted before the command started", aborted=True)
        if context.cancel.is_set():
            return aborted_before
        started = time.monotonic()
        capture = _Capture(self.output_head, self.output_tail)
        # The environment is taken at each call, like a child inheriting tether's own.
        env = dict(self.env if self.env is not None else child_environment(self.pass_env))
        # Who is calling: the call's operation id (stable across crashes), its session, and
        # on a shared store the writer's fencing token (docs/scale-out.md).
        env["TETHER_OPERATION_ID"] = context.operation_id
        if context.session_id is not None:
            env["TETHER_SESSION_ID"] = context.session_id
        if context.fencing_token is not None:
            env["TETHER_FENCING_TOKEN"] = str(context.fencing_token)
        # Imported here: the process runner (and its reaper) is a call's, not a construction's.
        from tether._procs import Ending, Supervision, run_in_group

        sandbox = context.sandbox
        try:
            argv = ["/bin/bash", "-c", command]
            if sandbox is not None:
                argv = sandbox.wrap(argv, context.workspace)
            finished = run_in_group(
                argv,
                cwd=context.workspace,
                env=env,
                timeout=timeout,
                on_output=capture.add,
                cancel=context.cancel,
                # After bash exits its leftovers are ended at once; then the pipe is read
                # for up to a second (a process that escaped the group may hold it open).
                supervision=Supervision(
                    kill_grace=self.kill_grace, linger=0.0, final_drain=1.0, poll=self.poll_interval
                ),
                contained=sandbox is not None and sandbox.confined,
            )
        except OSError as exc:
            return ToolResult.error(f"Error: could not start bash: {exc.strerror or exc}")
        except SandboxUnavailable as exc:
            return ToolResult.error(f"Error: the command was not run: {exc}")
        if finished.returncode is None:  # cancel was set just before the start
            return aborted_before
        code = finished.returncode
        output, cut = capture.render()
        body = output if output else "(no output)\n"
        if not body.endswith("\n"):
            body += "\n"
        content = f"{body}exit code: {_exit_text(code)}"
        if sandbox is not None and sandbox.confined:
            # The log keeps how the command ran; a refusal reads as the sandbox's.
            content += "\n" + sandbox.record()
            if code != 0 and _sandbox_refusals().search(output):
                content += f" ({SANDBOX_REFUSAL_NOTE})"
        metadata: dict[str, Any] = {
            "exit_code": code,
            "output_bytes": capture.total,
            "cut_bytes": cut,
            "timed_out": finished.ending is Ending.TIMEOUT,
            "aborted": finished.ending is Ending.CANCELLED,
            "duration": round(time.monotonic() - started, 3),
        }
        if finished.ending is Ending.TIMEOUT:
            content += (
                f"\nError: the command timed out after {timeout:g} s; "
                "it was killed with its whole process group"
            )
            return ToolResult(content, is_error=True, metadata=metadata)
        if finished.ending is Ending.CANCELLED:
            content += "\nError: aborted; the command was killed with its whole process group"
            return ToolResult(content, is_error=True, metadata=metadata)
        return ToolResult(content, metadata=metadata)


# =========================================================================== registry


def builtin_tools(
    *, bash_env: Mapping[str, str] | None = None, pass_env: Sequence[str] = ()
) -> list[Tool]:
    """Fresh instances of the built-in tools, in model-facing order: read, bash, write, edit.

    ``bash_env`` and ``pass_env`` are :class:`BashTool`'s ``env`` and ``pass_env``.
    """
    return [ReadTool(), BashTool(env=bash_env, pass_env=pass_env), WriteTool(), EditTool()]
