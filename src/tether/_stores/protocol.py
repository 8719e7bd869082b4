"""The session-store seam: what the executor asks of a session log, whatever holds it.

Two protocols, httpx's ``BaseTransport`` being the model:

* :class:`SessionStoreProtocol` — one open session log: its reduced state, ``commit`` of
  one transaction, and the small record kept beside the log (:class:`SessionSidecar`);
* :class:`SessionOpener` — creates a session from its header values, or opens one by id
  (single writer: a second writer is refused with :class:`~tether.errors.SessionBusy`).

Implementations:

* :mod:`tether._stores.file` — one append-only JSONL file per session
  (:class:`~tether._stores.file.SessionStore`, opened by
  :class:`~tether._stores.opener.FileSessions`); its guarantees are in ``docs/store.md``;
* :mod:`tether._stores.memory` — the committed bytes of each session held in memory, a
  fake disk that a new agent in the same process can reopen (tests, and the reference for
  a new backend).

What every implementation keeps (the executor relies on nothing else):

1. ``commit`` assigns ``seq`` (consecutive), one ``timestamp`` per transaction and ids to
   facts without one (:func:`tether._stores.transaction.encode_transaction`), has the
   reducer validate the whole transaction before anything is stored, and stores it as one
   unit: a rejected transaction raises :class:`~tether.errors.FactRejected` and changes
   nothing; once ``commit`` returns the transaction is committed and ``state`` includes it;
2. ``state`` is the reducer's state of everything committed (an immutable snapshot);
3. a session has at most one writer at a time;
4. reopening a session reads back exactly the committed transactions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

if TYPE_CHECKING:  # the state's classes load with a session, not with the seam's types
    from tether.core.state import SessionState

__all__ = ["SessionOpener", "SessionSidecar", "SessionStoreProtocol"]


class SessionSidecar(Protocol):
    """A small record a session keeps beside its log (not part of the log's format).

    Today one: which effects database holds the session's evidence
    (:mod:`tether._effects.binding`).
    """

    @property
    def location(self) -> str:
        """Where the record is, for messages."""
        ...

    def exists(self) -> bool:
        """Whether there is something under the record's name (readable or not)."""
        ...

    def read(self) -> tuple[bytes | None, str | None]:
        """``(data, None)``; ``(None, None)`` when there is none; ``(None, why)`` when it
        cannot be read. Never raises for the record's own state."""
        ...

    def write(self, data: bytes) -> None:
        """Replace the record atomically and durably; :class:`OSError` on failure."""
        ...


class SessionStoreProtocol(Protocol):
    """One open session log (see the module docstring for the rules)."""

    @property
    def session_id(self) -> str: ...

    @property
    def path(self) -> Path:
        """The log's path; for a store without files, the name it is shown under."""
        ...

    @property
    def read_only(self) -> bool: ...

    @property
    def repaired(self) -> int:
        """Bytes of torn tail this writer cut away when it opened the log (0: none)."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def state(self) -> SessionState: ...

    def commit(
        self, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        """Validate, persist and adopt one transaction; return the facts as committed.

        ``sync=False``: the transaction is not a durable point (``docs/runtime.md``); the
        store may defer making it durable until the next commit with ``sync=True`` or
        :meth:`flush`, but must keep the order (nothing later durable before it)."""
        ...

    def flush(self) -> None:
        """Make every transaction committed with ``sync=False`` durable."""
        ...

    def log_bytes(self) -> bytes:
        """The committed log as the file store holds it (header and lines, LF after each):
        what the state was reduced from (the active time budget reads its timestamps)."""
        ...

    def sidecar(self, name: str) -> SessionSidecar:
        """The record ``name`` kept beside this session's log."""
        ...

    def sidecar_names(self, prefix: str) -> frozenset[str] | None:
        """The names of this session's records that start with ``prefix``, listed at once
        (so that a reader of thousands of possible records, such as the cost of a long
        session, asks only for those that exist); ``None`` when they cannot be listed."""
        ...

    def check_lease(self) -> int | None:
        """Before an effect: confirm this writer still holds the session, and return its
        fencing token (the lease epoch a tool passes on to the services it calls).

        A store whose writer can lose the session while it is open (a shared store's
        lease) raises :class:`~tether.errors.SessionFenced` when it has; a store whose
        writer lock cannot be lost while held returns ``None`` (no token to pass on).
        """
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ClosesOnExit:
    """``with x:`` closes ``x`` on the way out: the one ``__enter__``/``__exit__`` of the
    stores and openers (each defines :meth:`close`)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SessionOpener(Protocol):
    """Creates and opens the session logs of one agent (one workspace's sessions)."""

    def create(
        self, *, provider: str, model: str, environment_identity: str
    ) -> SessionStoreProtocol:
        """A new session holding only its header, open for writing."""
        ...

    def open(self, session: str) -> SessionStoreProtocol:
        """An existing session, by id (or what the backend accepts for one), for writing.

        :class:`~tether.errors.SessionNotFound` when there is none,
        :class:`~tether.errors.SessionBusy` when another writer holds it.
        """
        ...
