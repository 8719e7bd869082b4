"""The in-memory session store: a fake disk for tests and a reference for new backends.

:class:`MemorySessions` holds the committed bytes of every session it created — exactly the
lines the file store would have written — and is the
:class:`~tether._stores.protocol.SessionOpener`; :class:`MemorySessionStore` is one open
session. It keeps the rules of :mod:`tether._stores.protocol` the way the file store does,
without files:

* a transaction is encoded like the file store's (:mod:`tether._stores.transaction`),
  validated by the reducer before anything is kept, and appended as one line: rejected →
  :class:`~tether.errors.FactRejected`, nothing changed;
* one writer per session: opening a session that another store holds for writing raises
  :class:`~tether.errors.SessionBusy` until that store is closed;
* opening a session reduces its committed bytes from the start, as the file store reads
  its file, so a new agent in the same process (after an exception, a simulated crash)
  resumes from exactly what was committed.

Nothing is durable beyond the process, and nothing can tear: there are no store crash
boundaries here (``store.*`` are the file store's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tether._clock import SYSTEM_CLOCK
from tether._ids import new_uuid7
from tether._loading import load_reducer
from tether._stores.protocol import ClosesOnExit
from tether._stores.transaction import encode_header, encode_transaction
from tether.core.reducer import Reducer
from tether.core.state import SessionState
from tether.errors import (
    CorruptSession,
    FactRejected,
    SessionBusy,
    SessionCorruption,
    SessionNotFound,
    StoreUnavailable,
)

__all__ = ["MEMORY_ROOT", "MemorySessionStore", "MemorySessions", "MemorySidecar"]

MEMORY_ROOT: Final = "memory:"
"""The prefix of the names an in-memory session is shown under (``memory:/<id>.jsonl``)."""


class MemorySessions:
    """The fake disk and its opener: every session's committed bytes and sidecar records.

    ``cwd`` is the header's ``cwd`` of the sessions it creates (the workspace); ``clock``
    (integer milliseconds) and ``ids`` are those of the stores it opens.
    """

    def __init__(
        self,
        cwd: str = "/",
        *,
        clock: Callable[[], int] = SYSTEM_CLOCK.now_ms,
        ids: Callable[[], str] = new_uuid7,
    ) -> None:
        self.cwd = cwd
        self.clock = clock
        self.ids = ids
        self._logs: dict[str, bytearray] = {}
        self._records: dict[tuple[str, str], bytes] = {}
        self._writers: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ opener

    def create(self, *, provider: str, model: str, environment_identity: str) -> MemorySessionStore:
        session_id = self.ids()
        data, reducer = encode_header(
            session_id=session_id,
            created_at=self.clock(),
            cwd=self.cwd,
            provider=provider,
            model=model,
            environment_identity=environment_identity,
        )
        with self._lock:
            if session_id in self._logs:
                raise FactRejected("DUPLICATE_ID", 1, None, f"session {session_id} exists")
            self._logs[session_id] = bytearray(data)
            self._writers.add(session_id)
        return MemorySessionStore(self, reducer)

    def open(self, session: str) -> MemorySessionStore:
        with self._lock:
            log = self._logs.get(session)
            if log is None:
                raise SessionNotFound(session, MEMORY_ROOT)
            if session in self._writers:
                raise SessionBusy(f"{MEMORY_ROOT}/{session}.jsonl", None)
            data = bytes(log)
            self._writers.add(session)
        try:
            reducer = load_reducer(data)
        except SessionCorruption as exc:
            self._release(session)
            raise CorruptSession.wrap(f"{MEMORY_ROOT}/{session}.jsonl", exc) from None
        except BaseException:
            self._release(session)
            raise
        return MemorySessionStore(self, reducer)

    # ------------------------------------------------------------------ the fake disk

    def session_ids(self) -> list[str]:
        """Every session, in the order they were created."""
        with self._lock:
            return list(self._logs)

    def log_bytes(self, session_id: str) -> bytes:
        """The committed bytes of a session's log (what the file store would hold)."""
        with self._lock:
            return bytes(self._logs[session_id])

    def _append(self, session_id: str, data: bytes) -> None:
        with self._lock:
            self._logs[session_id] += data

    def _release(self, session_id: str) -> None:
        with self._lock:
            self._writers.discard(session_id)

    def _read_record(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            return self._records.get(key)

    def _record_names(self, session_id: str, prefix: str) -> frozenset[str]:
        with self._lock:
            return frozenset(
                name
                for owner, name in self._records
                if owner == session_id and name.startswith(prefix)
            )

    def _write_record(self, key: tuple[str, str], data: bytes) -> None:
        with self._lock:
            self._records[key] = bytes(data)


@dataclass(frozen=True, slots=True)
class MemorySidecar:
    """A session's record kept by :class:`MemorySessions`."""

    disk: MemorySessions
    session_id: str
    name: str

    @property
    def location(self) -> str:
        return f"{MEMORY_ROOT}/.{self.session_id}.{self.name}.json"

    def exists(self) -> bool:
        return self.disk._read_record((self.session_id, self.name)) is not None

    def read(self) -> tuple[bytes | None, str | None]:
        return self.disk._read_record((self.session_id, self.name)), None

    def write(self, data: bytes) -> None:
        self.disk._write_record((self.session_id, self.name), data)


class MemorySessionStore(ClosesOnExit):
    """One session of a :class:`MemorySessions`, open for writing (the only writer)."""

    read_only: bool = False
    repaired: int = 0

    def __init__(self, disk: MemorySessions, reducer: Reducer) -> None:
        self._disk = disk
        self._reducer = reducer
        self.session_id = reducer.state.header.id
        self.path = Path(f"{MEMORY_ROOT}/{self.session_id}.jsonl")
        self._mutex = threading.Lock()
        self._closed = False

    @property
    def state(self) -> SessionState:
        with self._mutex:
            return self._reducer.state

    @property
    def closed(self) -> bool:
        return self._closed

    def commit(
        self, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        """Commit one transaction: encoded (T1–T4), validated (T5), appended, adopted.
        ``sync`` changes nothing: memory has no durable point to defer."""
        with self._mutex:
            if self._closed:
                raise StoreUnavailable(str(self.path), "the store is closed")
            reducer = self._reducer
            committed, line = encode_transaction(
                reducer, facts, clock=self._disk.clock, new_id=self._disk.ids
            )
            try:
                pending = reducer.begin(line)
            except SessionCorruption as exc:
                raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
            try:
                self._disk._append(self.session_id, line + b"\n")
            except BaseException:
                pending.rollback()
                raise
            pending.commit()
            return committed

    def flush(self) -> None:
        """Nothing to make durable: every commit is already as durable as memory gets."""

    def log_bytes(self) -> bytes:
        return self._disk.log_bytes(self.session_id)

    def sidecar(self, name: str) -> MemorySidecar:
        return MemorySidecar(self._disk, self.session_id, name)

    def sidecar_names(self, prefix: str) -> frozenset[str] | None:
        return self._disk._record_names(self.session_id, prefix)

    def check_lease(self) -> None:
        """Nothing to confirm: the writer slot is held until ``close``."""

    def close(self) -> None:
        """Give up the writer slot. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        self._disk._release(self.session_id)

    def __repr__(self) -> str:
        return f"MemorySessionStore({str(self.path)!r}, closed={self._closed})"
