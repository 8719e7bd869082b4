"""The durable session store: the imperative shell around the pure reducer.

The reducer explains what is on disk; the store decides what reaches it. A transaction is
*committed* once :meth:`SessionStore.commit` returns: it has been validated by the
incremental reducer, written as one LF-terminated line, and (in ``durable`` mode) synced.
See ``docs/store.md`` for the exact guarantees.

Layout: ``<workspace>/.tether/sessions/<createdAt-ms>_<session-id>.jsonl`` (directories
0700, files 0600), one append-only log per session, format per ``SESSION_FORMAT.md``.

The executor depends only on :class:`~tether._stores.protocol.SessionStoreProtocol` and
:class:`~tether._stores.protocol.SessionOpener` (this store's opener,
:class:`~tether._stores.opener.FileSessions`, has a module of its own so that building an
agent does not load the store), so another backend (for example PostgreSQL: one row per
transaction, ``seq`` as key, the same reducer validating before ``INSERT``) can be added
without touching the reducer, planner or executor; :mod:`tether._stores.memory` is the second one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

import tether._faults as faults
from tether._clock import SYSTEM_CLOCK
from tether._dirs import DirectoryError, ignore_in_git, make_directories, sync_directory
from tether._ids import new_uuid7
from tether._loading import load_reducer
from tether._stores import checkpoints
from tether._stores.durability import Durability
from tether._stores.locking import LOCK_SUFFIX, WriterLock, record_locked
from tether._stores.protocol import ClosesOnExit, SessionStoreProtocol
from tether._stores.reasoning import (
    ReportedCost,
    SideRecord,
    parse_side_record,
    reported_costs,
    side_record_name,
)
from tether._stores.sidecar import FileSidecar, sidecar_path
from tether._stores.transaction import encode_header, encode_transaction
from tether.core import facts
from tether.core.records import record
from tether.core.reducer import PendingTransaction, Reducer
from tether.core.state import SessionState, Usage
from tether.errors import (
    AmbiguousSessionId,
    CheckpointMismatch,
    ConfigurationError,
    CorruptSession,
    FactRejected,
    SessionCorruption,
    SessionCreateError,
    SessionNotFound,
    SessionWriteError,
    StoreUnavailable,
    TetherError,
    UnsafeSessionPath,
)

__all__ = [
    "Durability",
    "SessionStore",
    "SessionStoreProtocol",
    "SessionSummary",
    "find_session",
    "list_sessions",
    "session_file_name",
    "sessions_dir_for",
]

FORMAT_VERSION = facts.VERSION
LOG_SUFFIX = ".jsonl"
HASH_BATCH = 1 << 20
"""Committed bytes a writer keeps before folding them into its running log hash (the
checkpoint's binding): one hashing call per MiB, not per commit, and bounded memory."""

BEFORE_WRITE = faults.register(
    "store.before_write", "commit validated the transaction, nothing written yet"
)
TORN_WRITE = faults.register(
    "store.torn_write", "commit wrote only the first half of the line (a torn tail)"
)
AFTER_WRITE = faults.register(
    "store.after_write", "commit wrote the whole line, not yet synced or acknowledged"
)
AFTER_SYNC = faults.register(
    "store.after_sync", "commit synced the line (durable mode), not yet acknowledged"
)
CREATE_OPENED = faults.register(
    "store.create_opened", "create made the empty temporary log, not yet locked"
)
CREATE_WRITTEN = faults.register(
    "store.create_written",
    "create wrote the header to the temporary log (and synced it in durable mode), not linked",
)
CREATE_LINKED = faults.register(
    "store.create_linked",
    "create linked the temporary log to its final name, the temporary name not yet removed",
)

_FILE_NAME = re.compile(
    r"^(?P<created>[0-9]+)_(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"\.jsonl$"
)
_PREFIX = re.compile(r"^[0-9a-fA-F-]+$")
_TEMP_SUFFIX = ".creating"
_TEMP_NAME = re.compile(r"^\..+\.jsonl\.creating$")
_HEADER_PROBE = 64 * 1024

_O_CLOEXEC = os.O_CLOEXEC
_O_NOFOLLOW = os.O_NOFOLLOW
_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _strerror(errno_: int | None) -> str | None:
    """The text of ``errno_`` for a store error's message (``tether.errors`` is pure and
    cannot ask the operating system itself)."""
    return os.strerror(errno_) if errno_ else None


def sessions_dir_for(workspace: str | os.PathLike[str]) -> Path:
    """The sessions directory of a workspace: ``<workspace>/.tether/sessions``."""
    return Path(os.path.abspath(workspace)) / ".tether" / "sessions"


def session_file_name(created_ms: int, session_id: str) -> str:
    """``<createdAt-ms>_<session-id>.jsonl``."""
    return f"{created_ms}_{session_id}{LOG_SUFFIX}"


# --------------------------------------------------------------------------- file access


def _checkpoint_of(path: Path) -> FileSidecar | None:
    """The reducer checkpoint beside the log at ``path`` (:mod:`tether._stores.checkpoints`),
    named after the session ID in the log's file name; ``None`` for a log named otherwise."""
    m = _FILE_NAME.match(path.name)
    if m is None:
        return None
    return FileSidecar(sidecar_path(path.parent, m.group("id"), checkpoints.CHECKPOINT_NAME))


def reduce_log_file(path: Path, data: bytes) -> SessionState:
    """The state of the log at ``path`` whose bytes (read whole) are ``data``: from the
    reducer checkpoint beside it when one matches, else the full reduction, for a reader
    that reads the file itself (``tether inspect``). Raises
    :class:`~tether.errors.SessionCorruption` exactly as :func:`tether.reduce_session`."""
    reducer, _, _ = checkpoints.load(data, _checkpoint_of(path))
    return reducer.state


def _open_dir(sessions_dir: Path, *, query: str) -> int:
    try:
        return os.open(sessions_dir, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    except FileNotFoundError:
        raise SessionNotFound(query, f"{sessions_dir} (no such directory)") from None
    except NotADirectoryError:
        raise SessionNotFound(query, f"{sessions_dir} (not a directory)") from None


def _open_in_dir(dir_fd: int, name: str, flags: int, display: str) -> int:
    """Open the direct entry ``name`` of ``dir_fd``: never a symlink, only a regular file."""
    try:
        fd = os.open(name, flags | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SessionNotFound(display) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeSessionPath(display, "it is a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise UnsafeSessionPath(display, "not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSessionPath(display, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_all(fd: int) -> bytes:
    """The file's bytes from offset 0 up to its size when we started reading.

    Bounded, so a reader racing with a busy writer terminates; a line the writer appends
    meanwhile is at worst seen as a torn tail.
    """
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break  # truncated meanwhile
        chunks.append(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _fsync_dir(dir_fd: int) -> None:
    os.fsync(dir_fd)


def _resolve(sessions_dir: Path, path_or_id: str | os.PathLike[str]) -> tuple[Path, str]:
    """Turn a path, a file name or an id (prefix) into (sessions dir, entry name).

    * a :class:`os.PathLike` or a string containing a path separator is a file path; it must
      name a direct entry of the sessions directory (compared by real path) and must not be
      a symbolic link;
    * a string ending in ``.jsonl`` is a file name inside the sessions directory;
    * anything else is a session id or a unique id prefix.
    """
    if isinstance(path_or_id, os.PathLike) or os.sep in path_or_id:
        path = Path(path_or_id)
        display = str(path)
        parent = os.path.realpath(path.parent)
        if parent != os.path.realpath(sessions_dir):
            raise UnsafeSessionPath(display, f"not inside the sessions directory {sessions_dir}")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise SessionNotFound(display) from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeSessionPath(display, "it is a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSessionPath(display, "not a regular file")
        return sessions_dir, path.name
    query = path_or_id
    if query.endswith(LOG_SUFFIX):
        if query in (".", "..") or "/" in query:
            raise UnsafeSessionPath(query, "not a plain file name")
        if not os.path.lexists(sessions_dir / query):
            raise SessionNotFound(query, str(sessions_dir))
        return sessions_dir, query
    return sessions_dir, _match_prefix(sessions_dir, query).name


def _id_of(sessions_dir: Path, name: str) -> str | None:
    """A log's session id: from its file name, else from its header (foreign naming)."""
    m = _FILE_NAME.match(name)
    if m is not None:
        return m.group("id")
    try:
        dir_fd = _open_dir(sessions_dir, query=name)
    except SessionNotFound:
        return None
    try:
        fd = _open_in_dir(dir_fd, name, os.O_RDONLY, name)
    except (SessionNotFound, UnsafeSessionPath, OSError):
        return None
    finally:
        os.close(dir_fd)
    try:
        head = os.pread(fd, _HEADER_PROBE, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    end = head.find(b"\n")
    if end < 0:
        return None
    try:
        header = orjson.loads(head[:end])
    except orjson.JSONDecodeError:
        return None
    value = header.get("id") if isinstance(header, dict) else None
    return value if isinstance(value, str) else None


def _log_names(sessions_dir: Path) -> list[str]:
    try:
        entries = os.listdir(sessions_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in entries if n.endswith(LOG_SUFFIX) and not n.startswith("."))


def _match_prefix(sessions_dir: Path, query: str) -> Path:
    if not query or not _PREFIX.match(query):
        raise SessionNotFound(query, str(sessions_dir))
    if not os.path.isdir(sessions_dir):
        raise SessionNotFound(query, f"{sessions_dir} (no such directory)")
    wanted = query.lower()
    matches: list[tuple[str, str]] = []
    for name in _log_names(sessions_dir):
        session_id = _id_of(sessions_dir, name)
        if session_id is not None and session_id.startswith(wanted):
            matches.append((session_id, name))
    if not matches:
        raise SessionNotFound(query, str(sessions_dir))
    if len(matches) > 1:
        raise AmbiguousSessionId(query, [f"{sid} ({name})" for sid, name in matches])
    return sessions_dir / matches[0][1]


def find_session(
    sessions_dir: str | os.PathLike[str], id_or_prefix: str | os.PathLike[str]
) -> Path:
    """The log for a full session id, a unique id prefix, a file name or a path.

    Raises :class:`SessionNotFound`, :class:`AmbiguousSessionId` (listing the candidates) or
    :class:`UnsafeSessionPath`. Reads at most the header line of foreign-named logs.
    """
    sdir = Path(sessions_dir)
    directory, name = _resolve(sdir, id_or_prefix)
    return directory / name


# --------------------------------------------------------------------------- listing


@record(slots=True)
class SessionSummary:
    """One line of ``tether sessions``. Times are milliseconds since the epoch."""

    id: str | None
    path: Path
    size: int
    last_activity: int
    created: int | None = None
    provider: str | None = None
    model: str | None = None
    operation: str | None = None
    """``"idle"``, ``"run"`` or ``"compaction"``; ``None`` when the log is unreadable."""
    operation_id: str | None = None
    torn_tail: int = 0
    """Bytes after the last LF (an unfinished append a writer would repair)."""
    error: SessionCorruption | None = None
    """Why the log cannot be read (corrupt, foreign version, unsafe); ``None`` when valid."""
    first_prompt: str | None = None
    """The content of the first user message (``None``: there is none)."""
    last_outcome: str | None = None
    """How the last finished operation ended (``completed``, ``failed``, ``aborted``)."""
    last_kind: str | None = None
    """``run`` or ``compaction``: what finished last."""
    last_error: Mapping[str, str] | None = None
    """The recorded ``{"code", "message"}`` of a failed last operation."""
    usage: Usage | None = None
    """The session's usage total (``None`` when the log is unreadable)."""
    reported: tuple[ReportedCost, ...] = ()
    """What the answers' side records report of their price (the cost is priced from
    these and ``usage`` by the caller, who knows the price table)."""

    @property
    def corrupt(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "path": str(self.path),
            "created": self.created,
            "provider": self.provider,
            "model": self.model,
            "operation": self.operation,
            "operationId": self.operation_id,
            "lastActivity": self.last_activity,
            "size": self.size,
            "tornTail": self.torn_tail,
            "error": self.error.to_json() if self.error is not None else None,
            "firstPrompt": self.first_prompt,
            "lastOutcome": self.last_outcome,
            "lastOperation": self.last_kind,
            "lastError": dict(self.last_error) if self.last_error is not None else None,
            "usage": self.usage.to_json() if self.usage is not None else None,
        }
        return out


def _last_timestamp(committed: bytes) -> int | None:
    """The largest ``timestamp`` on the last committed line, if that line holds facts."""
    end = len(committed) - 1
    start = committed.rfind(b"\n", 0, end) + 1
    if start == 0:
        return None  # the last line is the header
    value = orjson.loads(committed[start:end])
    facts = value if isinstance(value, list) else [value]
    stamps = [f["timestamp"] for f in facts if isinstance(f, dict)]
    ints = [t for t in stamps if isinstance(t, int) and not isinstance(t, bool)]
    return max(ints) if ints else None


def list_sessions(sessions_dir: str | os.PathLike[str]) -> list[SessionSummary]:
    """Summaries of every ``*.jsonl`` log in ``sessions_dir``, oldest first.

    Read-only for logs: takes no lock on them and never repairs. Logs that cannot be read
    are listed with ``error`` set (and as much as the file name tells) instead of being
    skipped. Temporaries and pid records are never listed; those provably left by
    interrupted creates are removed (see ``docs/store.md``, "Leftovers").
    """
    sdir = Path(sessions_dir)
    out: list[SessionSummary] = []
    try:
        dir_fd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        _sweep_leftovers(dir_fd)
        for name in _log_names(sdir):
            summary = _summarize(sdir, dir_fd, name)
            if summary is not None:
                out.append(summary)
    finally:
        os.close(dir_fd)
    out.sort(key=lambda s: (s.created if s.created is not None else 0, s.path.name))
    return out


def _summarize(sdir: Path, dir_fd: int, name: str) -> SessionSummary | None:
    path = sdir / name
    m = _FILE_NAME.match(name)
    fallback_id = m.group("id") if m else None
    fallback_created = int(m.group("created")) if m else None
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed while listing
    mtime_ms = st.st_mtime_ns // 1_000_000
    try:
        fd = _open_in_dir(dir_fd, name, os.O_RDONLY, str(path))
    except SessionNotFound:
        return None
    except UnsafeSessionPath as exc:
        return SessionSummary(
            id=fallback_id,
            path=path,
            size=st.st_size,
            last_activity=mtime_ms,
            created=fallback_created,
            error=SessionCorruption("UNSAFE_PATH", 0, None, exc.reason),
        )
    try:
        data = _read_all(fd)
    finally:
        os.close(fd)
    last_lf = data.rfind(b"\n")
    committed = data[: last_lf + 1]
    try:
        state = checkpoints.load(committed, _checkpoint_of(path))[0].state
    except SessionCorruption as exc:
        return SessionSummary(
            id=_id_of(sdir, name) or fallback_id,
            path=path,
            size=len(data),
            last_activity=mtime_ms,
            created=fallback_created,
            torn_tail=len(data) - len(committed),
            error=exc,
        )
    header = state.header
    operation = state.operation
    finished = state.last_finished
    first_prompt = next(
        (
            m["content"]
            for m in state.transcript
            if m.get("role") == "user" and isinstance(m.get("content"), str)
        ),
        None,
    )
    return SessionSummary(
        id=header.id,
        path=path,
        size=len(data),
        last_activity=_last_timestamp(committed) or mtime_ms,
        created=header.created_at,
        provider=header.provider,
        model=header.model,
        operation=operation.kind,
        operation_id=getattr(operation, "operation_id", None),
        torn_tail=len(data) - len(committed),
        first_prompt=first_prompt,
        last_outcome=finished.outcome if finished is not None else None,
        last_kind=finished.kind if finished is not None else None,
        last_error=finished.error if finished is not None else None,
        usage=state.usage,
        reported=tuple(reported_costs(state, _side_reader(sdir, header.id))),
    )


def _side_reader(sdir: Path, session_id: str) -> Callable[[str], SideRecord | None]:
    """Reads the reasoning side record of an entry of ``session_id`` (never a lock)."""

    def read(entry_id: str) -> SideRecord | None:
        path = sidecar_path(sdir, session_id, side_record_name(entry_id))
        data, _ = FileSidecar(path).read()
        return parse_side_record(data, entry_id) if data is not None else None

    return read


# --------------------------------------------------------------------------- the store


_live_writers: weakref.WeakSet[SessionStore] = weakref.WeakSet()


def _disown_writers_in_child() -> None:
    """After ``fork()`` the child shares the parent's locked file descriptions.

    It must neither write (two writers) nor unlock (``flock(LOCK_UN)`` on the shared
    description would release the *parent's* lock): its copies only close their
    descriptors.
    """
    for store in list(_live_writers):
        store._inherited = True
        store._unusable = "this store was inherited across fork(); open the session again"


os.register_at_fork(after_in_child=_disown_writers_in_child)


class SessionStore(ClosesOnExit):
    """One session log, opened for writing (single writer) or read-only.

    Construct with :meth:`create`, :meth:`open` or :meth:`open_read_only`.

    Attributes: ``path``, ``session_id``, ``durability``, ``read_only``; ``repaired`` — bytes
    of torn tail cut away when this writer opened the log (0 if none); ``torn_tail`` — bytes
    after the last LF when the log was read (equals ``repaired`` for writers; for read-only
    stores it is the tail a writer *would* repair).

    Test seams: ``_write(fd, data) -> int`` (default :func:`os.write`) and ``_sync(fd)``
    (default :func:`os.fdatasync`) are called for every commit; replace them on an instance
    to inject short writes or ``ENOSPC``/``EIO``/``EDQUOT``.
    """

    path: Path
    session_id: str
    durability: Durability
    read_only: bool
    repaired: int
    torn_tail: int

    def __init__(
        self,
        *,
        path: Path,
        reducer: Reducer,
        durability: Durability,
        read_only: bool,
        fd: int,
        dir_fd: int,
        lock: WriterLock | None,
        length: int,
        clock: Callable[[], int],
        ids: Callable[[], str],
        repaired: int = 0,
        torn_tail: int = 0,
        checkpointed: int = 0,
        log_hash: Any = None,
    ) -> None:
        """Internal: use :meth:`create`, :meth:`open` or :meth:`open_read_only`.

        ``checkpointed``: the log prefix the reducer checkpoint the store opened with covered
        (0: none); ``log_hash``: a writer's running SHA-256 of its committed log, for the
        checkpoint it may write when it closes (:meth:`close`)."""
        self.path = path
        self._reducer = reducer
        self.session_id = reducer.state.header.id
        self.durability = durability
        self.read_only = read_only
        self.repaired = repaired
        self.torn_tail = torn_tail
        self._fd = fd
        self._dir_fd = dir_fd
        self._lock = lock
        self._length = length
        self._synced = length
        """The length known durable: commits with ``sync=False`` leave ``_length`` ahead of it
        until the next synced commit or :meth:`flush`."""
        self._clock = clock
        self._ids = ids
        self._mutex = threading.Lock()
        self._unusable: str | None = "opened read-only" if read_only else None
        self._closed = False
        self._inherited = False
        if not read_only:
            _live_writers.add(self)
        self._write: Callable[[int, bytes | memoryview], int] = os.write
        self._sync: Callable[[int], None] = _fdatasync
        self._durable = durability is Durability.DURABLE
        self._checkpointed = checkpointed
        # The writer's running hash of its log: the lines it commits are kept (one list
        # append per commit, no hashing on the commit path) and folded into the hash once
        # they reach HASH_BATCH bytes, or when a checkpoint is written at close: the memory
        # they hold stays bounded however long the writer lives.
        self._log_hash = log_hash
        self._unhashed: list[bytes] = []
        self._unhashed_bytes = 0

    # ---------------------------------------------------------------- constructors

    @classmethod
    def create(
        cls,
        workspace: str | os.PathLike[str],
        *,
        provider: str,
        model: str,
        environment_identity: str,
        durability: Durability | str = Durability.DURABLE,
        sessions_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = SYSTEM_CLOCK.now_ms,
        ids: Callable[[], str] = new_uuid7,
        body: bytes = b"",
    ) -> SessionStore:
        """Create a new session log holding only its header and open it for writing.

        ``body`` (a fork, docs/replay.md): complete transaction lines copied from another
        log, written after the header in the same creation, so the new log appears under its
        final name with all of them or not at all; they must reduce after the new header
        (:class:`~tether.errors.FactRejected` otherwise, and nothing is created).

        The log is written under a hidden temporary name (``O_EXCL|O_NOFOLLOW``, mode 0600),
        locked, filled with the header and (durable mode) synced, then hard-linked to its
        final name, which must not exist; so no reader ever sees a log without a complete
        header. In durable mode every directory made, the directories that hold the log and
        the log's own entry are synced before this returns. The steps C1–C11 are those of
        ``docs/store.md`` ("Creating a session").
        """
        mode = Durability(durability)
        sdir = Path(sessions_dir) if sessions_dir is not None else sessions_dir_for(workspace)
        # C1–C2: the directories, and their entries synced.
        _make_dirs(sdir, default_layout=sessions_dir is None, durable=mode is Durability.DURABLE)
        session_id = ids()
        created = clock()
        data, reducer = encode_header(
            session_id=session_id,
            created_at=created,
            cwd=os.path.abspath(workspace),
            provider=provider,
            model=model,
            environment_identity=environment_identity,
        )
        if body:
            data += body
            try:
                reducer = load_reducer(data)
            except SessionCorruption as exc:
                raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
            if reducer.length != len(data):
                raise FactRejected("MALFORMED_JSON", reducer.line_count, None, "torn body")

        name = session_file_name(created, session_id)
        temp = _temporary_name(name)
        path = sdir / name
        durable = mode is Durability.DURABLE
        # C3: the sessions directory, and what interrupted creates left in it.
        try:
            dir_fd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        except OSError as exc:
            raise SessionCreateError(
                str(sdir),
                "open of the sessions directory",
                exc.errno,
                strerror=_strerror(exc.errno),
            ) from exc
        fd = -1
        lock: WriterLock | None = None
        linked = False
        step = "open of the new log"
        try:
            _sweep_leftovers(dir_fd)
            # C4–C5: the temporary log, made and locked (the writer lock of the new session,
            # before its final name exists), then the pid record.
            fd, lock = _make_temporary(dir_fd, temp, name, str(path))
            # C6: the header.
            step = "write of the header"
            _write_all(os.write, fd, data)
            # C7
            step = "fdatasync of the header"
            if durable:
                _fdatasync(fd)
            if faults.ARMED:
                faults.hit(CREATE_WRITTEN)
            # C8: the final name, which must not exist yet.
            step = "link to the final name"
            temp_remains = _link(dir_fd, temp, name)
            linked = True
            if faults.ARMED:
                faults.hit(CREATE_LINKED)
            # C9
            step = "unlink of the temporary name"
            if temp_remains:
                _unlink_temporary(dir_fd, temp)
            # C10: the new name (and the temporary's removal) durable.
            step = "fsync of the sessions directory"
            if durable:
                _fsync_dir(dir_fd)
        except OSError as exc:
            # A full disk, an I/O error, …: the store's write error, and nothing half-made.
            _undo_create(dir_fd, fd, lock, temp, name if linked else None)
            raise SessionCreateError(
                str(sdir), step, exc.errno, strerror=_strerror(exc.errno)
            ) from exc
        except BaseException:
            _undo_create(dir_fd, fd, lock, temp, name if linked else None)
            raise
        # C11: the session exists; this store holds its lock.
        return cls(
            path=path,
            reducer=reducer,
            durability=mode,
            read_only=False,
            fd=fd,
            dir_fd=dir_fd,
            lock=lock,
            length=len(data),
            clock=clock,
            ids=ids,
            log_hash=hashlib.sha256(data),
        )

    @classmethod
    def open(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        workspace: str | os.PathLike[str] | None = None,
        sessions_dir: str | os.PathLike[str] | None = None,
        durability: Durability | str = Durability.DURABLE,
        clock: Callable[[], int] = SYSTEM_CLOCK.now_ms,
        ids: Callable[[], str] = new_uuid7,
    ) -> SessionStore:
        """Open an existing log for writing.

        Order: resolve (id, prefix, name or path; no symlinks, nothing outside the sessions
        directory) → lock (:class:`SessionBusy` if another writer holds it) → read → reduce
        the committed region (a corrupt complete line raises :class:`CorruptSession` with
        code, line and seq and changes nothing) → repair a torn tail (truncate to the last
        LF, sync in durable mode; reported in ``repaired``) → ready for appends.
        """
        mode = Durability(durability)
        sdir = _sessions_dir(workspace, sessions_dir)
        try:
            directory, name = _resolve(sdir, path_or_id)
        except OSError as exc:  # e.g. the sessions directory cannot be listed
            raise SessionWriteError(
                str(sdir), "lookup", exc.errno, False, strerror=_strerror(exc.errno)
            ) from exc
        path = directory / name
        try:
            dir_fd = _open_dir(directory, query=str(path_or_id))
        except OSError as exc:
            raise SessionWriteError(
                str(path),
                "open of the sessions directory",
                exc.errno,
                False,
                strerror=_strerror(exc.errno),
            ) from exc
        fd = -1
        lock: WriterLock | None = None
        step = "open"
        try:
            _sweep_leftovers(dir_fd)
            fd = _open_in_dir(dir_fd, name, os.O_RDWR | os.O_APPEND, str(path))
            step = "lock"
            lock = WriterLock.acquire(fd, dir_fd, name, str(path))
            step = "open"
            _check_single_link(fd, dir_fd, name, str(path))
            step = "read"
            data = _read_all(fd)
            length = data.rfind(b"\n") + 1
            try:
                reducer, checkpointed, log_hash = checkpoints.load(
                    data[:length] if length < len(data) else data,
                    _checkpoint_of(path),
                    running_hash=True,
                )
            except SessionCorruption as exc:
                raise CorruptSession.wrap(str(path), exc) from None
            torn = len(data) - length
            try:
                if torn:
                    os.ftruncate(fd, length)
                if mode is Durability.DURABLE:
                    # Everything this store reports (and the repair) is durable before use,
                    # even if the previous writer ran in process mode: the log, its entry,
                    # and the entries of the directories that hold it.
                    _fdatasync(fd)
                    _fsync_dir(dir_fd)
                    _sync_owned_parents(directory, default_layout=sessions_dir is None)
            except DirectoryError as exc:
                raise SessionWriteError(
                    str(path),
                    f"{exc.op} {exc.path}",
                    exc.errno,
                    True,
                    strerror=_strerror(exc.errno),
                ) from exc
            except OSError as exc:
                op = "repair" if torn else "fdatasync"
                raise SessionWriteError(
                    str(path), op, exc.errno, True, strerror=_strerror(exc.errno)
                ) from exc
        except BaseException as exc:
            if lock is not None:
                lock.release()
            if fd >= 0:
                os.close(fd)
            os.close(dir_fd)
            if isinstance(exc, OSError) and not isinstance(exc, TetherError):
                # Permission, I/O error, no locks available, …: a store error, not a crash.
                raise SessionWriteError(
                    str(path), step, exc.errno, False, strerror=_strerror(exc.errno)
                ) from exc
            raise
        return cls(
            path=path,
            reducer=reducer,
            durability=mode,
            read_only=False,
            fd=fd,
            dir_fd=dir_fd,
            lock=lock,
            length=length,
            clock=clock,
            ids=ids,
            repaired=torn,
            torn_tail=torn,
            checkpointed=checkpointed,
            log_hash=log_hash,
        )

    @classmethod
    def open_read_only(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        workspace: str | os.PathLike[str] | None = None,
        sessions_dir: str | os.PathLike[str] | None = None,
    ) -> SessionStore:
        """A read-only snapshot of a log: no lock, no repair, never modifies anything.

        Always allowed, even while a writer holds the session. A torn tail is ignored (and
        reported in ``torn_tail``); a corrupt complete line raises :class:`CorruptSession`.
        """
        sdir = _sessions_dir(workspace, sessions_dir)
        directory, name = _resolve(sdir, path_or_id)
        path = directory / name
        dir_fd = _open_dir(directory, query=str(path_or_id))
        try:
            fd = _open_in_dir(dir_fd, name, os.O_RDONLY, str(path))
            try:
                data = _read_all(fd)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        length = data.rfind(b"\n") + 1
        try:
            reducer, checkpointed, _ = checkpoints.load(
                data[:length] if length < len(data) else data, _checkpoint_of(path)
            )
        except SessionCorruption as exc:
            raise CorruptSession.wrap(str(path), exc) from None
        store = cls(
            path=path,
            reducer=reducer,
            durability=Durability.PROCESS,
            read_only=True,
            fd=-1,
            dir_fd=-1,
            lock=None,
            length=length,
            clock=SYSTEM_CLOCK.now_ms,
            ids=new_uuid7,
            torn_tail=len(data) - length,
            checkpointed=checkpointed,
        )
        store._closed = True  # nothing stays open
        return store

    # ---------------------------------------------------------------- protocol

    @property
    def state(self) -> SessionState:
        """The reduced state of everything committed so far (an immutable snapshot)."""
        with self._mutex:
            return self._reducer.state

    @property
    def length(self) -> int:
        """Byte length of the committed log."""
        return self._length

    def log_bytes(self) -> bytes:
        """The committed log (this writer's, or what a read-only open reduced)."""
        with self._mutex:
            return os.pread(self._fd, self._length, 0)

    @property
    def closed(self) -> bool:
        return self._closed

    def commit(
        self, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        """Commit one transaction (one or more facts, accepted or rejected together).

        The store assigns ``seq`` (consecutive) and ``timestamp`` (one per transaction, from
        the clock) to every fact and an ``id`` (UUIDv7) to facts that carry none; a
        provisioned ``id`` is kept. The candidate is validated by the reducer first: a
        rejected one raises :class:`FactRejected` and changes nothing. It is then written
        as one line (short writes are continued) and, in durable mode, ``fdatasync``-ed.

        A write error (``ENOSPC``, ``EIO``, ``EDQUOT``, …) truncates the file back to the
        committed length, restores the state and raises :class:`SessionWriteError`
        (``failed=False``): file and state are exactly as before, and the store stays
        usable. A failed sync does the same but also marks the store failed
        (``failed=True``): after a failed ``fdatasync`` the kernel may have dropped dirty
        pages, so the only trustworthy state is what a fresh :meth:`open` reads back.

        ``sync=False`` (a commit that is not a durable point, ``docs/runtime.md``): in
        durable mode the line is written but its ``fdatasync`` is left to the next commit
        with ``sync=True`` or to :meth:`flush`, which covers every earlier write of the
        file. A process crash keeps it (it is in the kernel's cache); a power loss may take
        it, together with everything after the last sync. A failed sync then marks the
        store failed as above, and the unsynced transactions share the unknown fate.

        Returns the facts as committed (new dicts; nested values are shared with the
        input). The steps T1–T8 are those of ``docs/store.md`` ("Commit").
        """
        with self._mutex:
            if self._unusable is not None:
                raise StoreUnavailable(str(self.path), self._unusable)
            reducer = self._reducer
            committed, line = encode_transaction(
                reducer, facts, clock=self._clock, new_id=self._ids
            )
            # T5: validated and applied in memory (with an undo log); nothing written yet.
            try:
                try:
                    pending = reducer.begin(line)
                except CheckpointMismatch:
                    # The checkpoint's deferred indexes did not decode (begin changed
                    # nothing): the committed log, reduced in full, takes its place.
                    reducer = self._reducer = self._reduce_committed()
                    pending = reducer.begin(line)
            except SessionCorruption as exc:
                raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
            data = line + b"\n"
            size = len(data)
            fd = self._fd
            try:
                if faults.ARMED:
                    faults.hit(BEFORE_WRITE)
                    half = data[: size // 2]
                    faults.hit(TORN_WRITE, lambda: _write_all(self._write, fd, half))
                # T6: write(log, line + LF), O_APPEND; short writes continued.
                written = self._write(fd, data)
                if written != size:
                    _write_all(self._write, fd, data, written)
            except OSError as exc:
                self._undo(pending, exc, "write", sync_failed=False)
            except BaseException:
                self._undo_quietly(pending)
                raise
            if faults.ARMED:
                faults.hit(AFTER_WRITE)
            # T7: fdatasync(log) in durable mode, at a durable point (sync=True); one sync
            # also makes every earlier unsynced line of the file durable.
            if self._durable and sync:
                try:
                    self._sync(fd)
                except OSError as exc:
                    self._undo(pending, exc, "fdatasync", sync_failed=True)
                except BaseException:
                    self._undo_quietly(pending)
                    raise
                if faults.ARMED:
                    faults.hit(AFTER_SYNC)
            # T8: adopted; returning acknowledges the transaction.
            pending.commit()
            self._length += size
            if self._log_hash is not None:
                self._unhashed.append(data)
                self._unhashed_bytes += size
                if self._unhashed_bytes >= HASH_BATCH:
                    self._fold_hash()
            if sync or not self._durable:
                self._synced = self._length
            return committed

    def _reduce_committed(self) -> Reducer:
        """The full reduction of this writer's committed log, read back (under its lock)."""
        data = os.pread(self._fd, self._length, 0)
        try:
            return load_reducer(data)
        except SessionCorruption as exc:
            raise CorruptSession.wrap(str(self.path), exc) from None

    def flush(self) -> None:
        """Make every commit made with ``sync=False`` durable (one ``fdatasync``; nothing
        when there is none, or in ``process`` mode).

        A failed sync marks the store failed and raises
        :class:`~tether.errors.SessionWriteError` (``failed=True``), as in :meth:`commit`.
        """
        with self._mutex:
            if self._synced == self._length or self._closed:
                return
            if self._unusable is not None:
                raise StoreUnavailable(str(self.path), self._unusable)
            try:
                self._sync(self._fd)
            except OSError as exc:
                why = os.strerror(exc.errno) if exc.errno else str(exc)
                self._unusable = (
                    f"an earlier fdatasync failed ({why}); close and reopen the session"
                )
                raise SessionWriteError(
                    str(self.path), "fdatasync", exc.errno, True, strerror=_strerror(exc.errno)
                ) from exc
            if faults.ARMED:
                faults.hit(AFTER_SYNC)
            self._synced = self._length

    def _undo(
        self, pending: PendingTransaction, exc: OSError, op: str, *, sync_failed: bool
    ) -> NoReturn:
        """Put file and state back as they were before this commit, then raise."""
        truncated = self._truncate_back()
        if truncated and sync_failed:
            # Best effort to make the truncation itself durable; the store is failed anyway.
            try:
                self._sync(self._fd)
            except OSError:
                pass
        pending.rollback()
        failed = sync_failed or not truncated
        if failed:
            self._unusable = (
                f"an earlier {op} failed ({os.strerror(exc.errno) if exc.errno else exc}); "
                "close and reopen the session"
            )
        raise SessionWriteError(
            str(self.path), op, exc.errno, failed, strerror=_strerror(exc.errno)
        ) from exc

    def _undo_quietly(self, pending: PendingTransaction) -> None:
        """Undo after a non-I/O exception (e.g. ``KeyboardInterrupt``) mid-commit."""
        if not self._truncate_back():
            self._unusable = "a commit was interrupted and could not be undone; reopen"
        pending.rollback()

    def _truncate_back(self) -> bool:
        try:
            os.ftruncate(self._fd, self._length)
        except OSError:
            return False
        return True

    def sidecar(self, name: str) -> FileSidecar:
        """The record ``name`` beside the log: ``.<session id>.<name>.json`` in its directory."""
        return FileSidecar(sidecar_path(self.path.parent, self.session_id, name))

    def sidecar_names(self, prefix: str) -> frozenset[str] | None:
        """Names of records ``.<session id>.<name>.json`` beside the log whose ``name``
        starts with ``prefix``: one listing of the sessions directory."""
        head = f".{self.session_id}."
        start = len(head)
        try:
            entries = os.listdir(self.path.parent)
        except OSError:
            return None
        return frozenset(
            entry[start:-5]
            for entry in entries
            if entry.startswith(head)
            and entry.endswith(".json")
            and entry.startswith(prefix, start)
        )

    def check_lease(self) -> None:
        """Nothing to confirm: the writer lock is held until ``close`` and has no token."""

    def close(self) -> None:
        """Make unsynced commits durable (best effort: nobody was told they were), write a
        reducer checkpoint if the log has grown by :data:`~tether._stores.checkpoints.
        CHECKPOINT_EVERY` bytes since the last one, then release the writer lock and the
        file. Idempotent."""
        self._close(checkpoint=True)

    def _close(self, *, checkpoint: bool) -> None:
        if self._synced != self._length and self._unusable is None and not self._inherited:
            try:
                self.flush()
            except (OSError, StoreUnavailable):
                pass  # marked failed; what a fresh open reads is the truth
        with self._mutex:
            if self._closed:
                return
            if checkpoint:
                try:
                    self._write_checkpoint()
                except Exception:  # a cache never stands between a writer and its close
                    pass
            self._closed = True
            self._unusable = "the store is closed"
            if self._lock is not None:
                if self._inherited:
                    self._lock.abandon()  # the parent's lock: close our copy, unlock nothing
                else:
                    self._lock.release()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1

    def _fold_hash(self) -> None:
        """Hash the committed lines kept since the last fold into the running log hash."""
        log_hash = self._log_hash
        if log_hash is not None:
            for line in self._unhashed:
                log_hash.update(line)
        self._unhashed = []
        self._unhashed_bytes = 0

    def _write_checkpoint(self) -> None:
        """The checkpoint of a writer that reduced or committed enough beyond the last one
        (:mod:`tether._stores.checkpoints`); under the lock, before it is released."""
        if (
            self._log_hash is None
            or self._unusable is not None
            or self._inherited
            or self._length - self._checkpointed < checkpoints.CHECKPOINT_EVERY
        ):
            return
        sidecar = _checkpoint_of(self.path)
        if sidecar is None:
            return
        self._fold_hash()
        if checkpoints.save(self._reducer, self._log_hash, sidecar):
            self._checkpointed = self._length

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._close(checkpoint=False)  # no file written from a finalizer
        except Exception:
            pass

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else self.durability.value
        return f"SessionStore({str(self.path)!r}, {mode}, closed={self._closed})"


# --------------------------------------------------------------------------- helpers


def _sessions_dir(
    workspace: str | os.PathLike[str] | None, sessions_dir: str | os.PathLike[str] | None
) -> Path:
    if sessions_dir is not None:
        return Path(sessions_dir)
    return sessions_dir_for(workspace if workspace is not None else os.getcwd())


def _owned_dirs(sessions_dir: Path, *, default_layout: bool) -> list[Path]:
    """The directories tether makes for its logs, top down: ``.tether`` and the sessions dir.

    With an explicit sessions directory only that one (its ancestors are the caller's).
    """
    return [sessions_dir.parent, sessions_dir] if default_layout else [sessions_dir]


def _make_dirs(sessions_dir: Path, *, default_layout: bool, durable: bool) -> None:
    """Steps C1–C2: make the missing directories (0700) and, durable, sync their entries.

    Default layout: ``.tether`` and ``.tether/sessions`` inside an existing workspace. An
    explicit sessions directory is made with every missing ancestor. In durable mode every
    directory made is followed by ``fsync`` of its parent (:func:`make_directories`), and
    the parents of the directories tether owns are synced even when those existed already:
    an earlier process may have been killed between its ``mkdir`` and its ``fsync``.
    """
    base = None
    if default_layout:
        base = sessions_dir.parent.parent
        if not base.is_dir():
            raise ConfigurationError(f"workspace {base} is not a directory")
    try:
        created = make_directories(sessions_dir, mode=0o700, base=base, durable=durable)
        ignore_in_git(created)
        if durable:
            _sync_owned_parents(sessions_dir, default_layout=default_layout, done=created)
    except DirectoryError as exc:
        raise SessionCreateError(
            str(sessions_dir), f"{exc.op} {exc.path}", exc.errno, strerror=_strerror(exc.errno)
        ) from exc


def _sync_owned_parents(
    sessions_dir: Path, *, default_layout: bool, done: Sequence[Path] = ()
) -> None:
    """``fsync`` the parent of each directory tether owns (not those in ``done``: synced)."""
    for directory in _owned_dirs(sessions_dir, default_layout=default_layout):
        if directory not in done:
            sync_directory(directory.parent)


def _check_single_link(fd: int, dir_fd: int, name: str, display: str) -> None:
    """Refuse a log with other hard links (a writer must not truncate a file elsewhere).

    The one tolerated extra link is the temporary name of an interrupted :meth:`create`
    (crash between ``link`` and ``unlink``); holding the lock, we remove that leftover.
    """
    st = os.fstat(fd)
    if st.st_nlink == 1:
        return
    temp = _temporary_name(name)
    try:
        other = os.stat(temp, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        other = None
    if (
        st.st_nlink == 2
        and other is not None
        and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)
    ):
        _unlink_temporary(dir_fd, temp)
        return
    raise UnsafeSessionPath(display, "it has other hard links")


def _temporary_name(name: str) -> str:
    """The hidden name a log is made under: ``.<name>.creating``."""
    return f".{name}{_TEMP_SUFFIX}"


def _lock_dir(dir_fd: int, operation: int) -> bool:
    """``flock`` the sessions directory; ``False`` where that is not possible.

    A create holds it shared while its temporary log exists unlocked (step C4); a sweep
    holds it exclusively (never waiting), so it never sees a temporary whose create is
    still running but has not locked it yet. Where directories cannot be locked (some
    network file systems) both fail alike: creates go on, sweeps skip their locked part.
    """
    try:
        fcntl.flock(dir_fd, operation)
    except OSError:  # held (LOCK_NB), or not possible here
        return False
    return True


def _unlock_dir(dir_fd: int) -> None:
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)
    except OSError:
        pass


def _make_temporary(dir_fd: int, temp: str, name: str, display: str) -> tuple[int, WriterLock]:
    """Steps C4–C5: make ``temp`` (``O_EXCL``, 0600), lock it and record our pid.

    On failure nothing of it is left (a temporary we did not make is never touched).
    """
    _lock_dir(dir_fd, fcntl.LOCK_SH)
    try:
        fd = os.open(
            temp,
            os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            os.fchmod(fd, 0o600)
            if faults.ARMED:
                faults.hit(CREATE_OPENED)
            # The pid record is keyed by the final name (C5, inside acquire).
            lock = WriterLock.acquire(fd, dir_fd, name, display)
        except BaseException:
            os.close(fd)
            _unlink_quietly(dir_fd, temp)
            raise
    finally:
        _unlock_dir(dir_fd)
    return fd, lock


def _link(dir_fd: int, temp: str, name: str) -> bool:
    """Step C8: give the temporary log its final name, never replacing an existing file.

    ``link`` (the temporary name stays, for C9); on a file system without hard links the
    temporary is renamed instead (the name carries a fresh UUIDv7) and ``False`` returned.
    """
    try:
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return False
        raise FileExistsError(errno.EEXIST, "session file exists", name) from None
    return True


def _unlink_temporary(dir_fd: int, temp: str) -> None:
    """Step C9. Already gone is fine: a sweep removes a published temporary name at once."""
    try:
        os.unlink(temp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _unlink_quietly(dir_fd: int, entry: str) -> bool:
    try:
        os.unlink(entry, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _undo_create(
    dir_fd: int, fd: int, lock: WriterLock | None, temp: str, linked: str | None
) -> None:
    """A create failed: leave no part of the session behind, then close everything.

    The names go while the lock is still held, so nobody can have opened the log for
    writing meanwhile; a header-only log is only left if even its removal fails.
    """
    if fd >= 0:
        if linked is not None:
            _unlink_quietly(dir_fd, linked)
        _unlink_quietly(dir_fd, temp)
    if lock is not None:
        lock.release()  # also removes the pid record
    if fd >= 0:
        os.close(fd)
    os.close(dir_fd)


def _sweep_leftovers(dir_fd: int) -> None:
    """Remove what interrupted creates left in the sessions directory (best effort).

    See ``docs/store.md`` ("Leftovers"). Never raises; never touches a log.

    * A temporary with more than one link whose final name is the same file: a create
      killed between C8 and C9. Its data lives on under the final name; the temporary name
      goes at once (a running create tolerates that in C9).
    * Any other temporary: removed only if nobody holds its ``flock`` — every create holds
      it from C4 until the create ends — and only while this sweep holds the directory's
      lock exclusively, so no create can be between making its temporary and locking it.
    * A pid record (``<log>.lock``) with neither its log nor its temporary, and not
      record-locked by a live writer: a create killed after C5.

    Only regular files are ever removed; the exclusive lock is never waited for (a create
    in its step C4 holds it shared: the sweep is left to the next create, open or listing).
    """
    try:
        names = set(os.listdir(dir_fd))
    except OSError:
        return
    temps = [n for n in names if _TEMP_NAME.match(n)]
    records = [n for n in names if n.endswith(LOG_SUFFIX + LOCK_SUFFIX)]
    if not temps and not records:
        return
    unpublished: list[str] = []
    for temp in temps:
        try:
            st = os.stat(temp, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # not made by tether: left alone
        final = temp[1 : -len(_TEMP_SUFFIX)]
        if st.st_nlink > 1 and _same_file(dir_fd, final, st):
            _unlink_quietly(dir_fd, temp)
        else:
            unpublished.append(temp)
    orphans = [r for r in records if r[: -len(LOCK_SUFFIX)] not in names]  # no log (yet?)
    if not unpublished and not orphans:
        return
    if not _lock_dir(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
        return
    try:
        for temp in unpublished:
            _remove_if_unlocked(dir_fd, temp)
        if orphans:
            names = set(os.listdir(dir_fd))  # again, under the lock, after the temporaries
        for record in orphans:
            log = record[: -len(LOCK_SUFFIX)]
            if log in names or _temporary_name(log) in names:
                continue
            try:
                st = os.stat(record, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and not record_locked(dir_fd, record):
                _unlink_quietly(dir_fd, record)
    except OSError:
        pass
    finally:
        _unlock_dir(dir_fd)


def _same_file(dir_fd: int, entry: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _remove_if_unlocked(dir_fd: int, temp: str) -> bool:
    """Remove the unpublished temporary ``temp`` if no create holds it (caller: dir lock)."""
    try:
        fd = os.open(temp, os.O_RDONLY | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its create is running (or the lock is unavailable: keep it)
        # Ours now, and provably stale; the name must still be this file.
        if not _same_file(dir_fd, temp, st):
            return False
        return _unlink_quietly(dir_fd, temp)
    finally:
        os.close(fd)  # also drops our flock


def _write_all(
    write: Callable[[int, bytes | memoryview], int], fd: int, data: bytes, done: int = 0
) -> None:
    """Write ``data[done:]``, continuing after short writes (``done`` bytes already went)."""
    total = len(data)
    if done == 0:
        done = write(fd, data)
    view = memoryview(data)
    while done < total:
        if done < 0 or done > total:
            raise OSError(errno.EIO, f"write returned an impossible count ({done})")
        n = write(fd, view[done:])
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        done += n
