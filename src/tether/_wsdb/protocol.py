"""The workspace database seam: what the shell asks of ``effects.db``, whatever holds it.

The workspace database keeps everything tether knows about effects outside the session
log: the action journal, review items and the reconciliation log, authorization
decisions, verifications with their artifact manifests, failed tool calls, and the
database's identity with the sessions it holds evidence for. :class:`WorkspaceDB` is that
seam, one sub-protocol per table group (httpx's ``BaseTransport`` is the model): the
executor, the guards, the verifier, recovery and the evidence binding are typed against
it, never against SQLite.

Implementations:

* :class:`tether._wsdb.sqlite.EffectsDB` — ``<workspace>/.tether/effects.db`` (SQLite,
  WAL, ``synchronous=FULL``); its tables, beside it, are
  :class:`~tether._wsdb.sqlite_journal.ActionJournal`,
  :class:`~tether._wsdb.sqlite_review.ReviewStore`,
  :class:`~tether._wsdb.sqlite_authorization.AuthorizationStore`,
  :class:`~tether._wsdb.sqlite_verification.VerificationStore` and
  :class:`~tether._wsdb.sqlite_failures.FailureStore`;
* :class:`tether._wsdb.memory.MemoryWorkspaceDB` — pure Python, in memory (tests, and the
  reference for a new backend: the same rules without a database).

The rules every implementation keeps (the SQLite one states them in SQL):

* every write is durable when the method returns, and atomic: all of it or nothing;
* first record wins where the tables say so: a journal row per operation id (same session
  and arguments digest, else :class:`~tether.errors.OperationIdConflict`), an
  authorization per (session, call key), a failure per ``toolStarted`` id, a manifest per
  version; at most one open review item per operation id;
* a journal row moves only along the journal's transitions (the table in
  :mod:`tether.core.values`, checked by :func:`~tether.core.values.check_transition`);
  a terminal status never changes;
* times come from the implementation's clock, in integer milliseconds since the epoch;
* the identity (:attr:`WorkspaceDB.identity`) is created with the database and never
  changes: a session records it before its first evidence (:mod:`tether._effects.binding`).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the value types are the core's (tether.core.values): no shell module
    from tether.core.values import (
        ApprovalRequest,
        Authorization,
        CheckOutcome,
        EvidenceCopy,
        JournalRow,
        JournalStatus,
        ReconciliationEntry,
        ReviewDecision,
        ReviewItem,
        ToolFailure,
        Verification,
    )

__all__ = [
    "ApprovalTable",
    "AuthorizationTable",
    "FailureTable",
    "JournalTable",
    "ReviewTable",
    "VerificationTable",
    "WorkspaceDB",
    "WorkspaceDBOpener",
]


class JournalTable(Protocol):
    """The action journal of file-change tools and the evidence copies it keeps."""

    @property
    def location(self) -> str:
        """Where the journal is, for messages."""
        ...

    def insert(
        self,
        session_id: str,
        operation_id: str,
        path: str,
        before_hash: str | None,
        after_hash: str,
        digest: str,
        *,
        tool_name: str,
        planned_result: str,
        status: JournalStatus,
        result: str | None = None,
        detail: str | None = None,
        before_content: bytes | None = None,
    ) -> tuple[JournalRow, bool]:
        """The row of ``operation_id``, recorded now unless it exists: ``(row, created)``;
        ``before_content`` is kept with it (atomically) as the ``before`` evidence copy."""
        ...

    def record_intent(
        self,
        session_id: str,
        operation_id: str,
        path: str,
        before_hash: str | None,
        after_hash: str,
        arguments_digest: str,
        *,
        tool_name: str = "",
        planned_result: str = "",
        status: JournalStatus = ...,
    ) -> JournalRow: ...

    def mark(
        self,
        operation_id: str,
        status: JournalStatus,
        detail: str | None = None,
        *,
        result: str | None = None,
        result_is_error: bool = False,
    ) -> JournalRow: ...

    def get(self, operation_id: str) -> JournalRow | None: ...

    def rows(self, session_id: str | None = None) -> list[JournalRow]: ...

    def history(self, operation_id: str) -> list[tuple[JournalStatus, str | None, int]]: ...

    def keep_evidence(
        self,
        operation_id: str,
        kind: str,
        *,
        path: str | None,
        content: bytes | None,
        content_hash: str | None,
        size: int | None = None,
        truncated: bool = False,
    ) -> int: ...

    def evidence(self, evidence_id: int) -> EvidenceCopy | None: ...

    def before_copy(self, operation_id: str) -> EvidenceCopy | None:
        """The file's content before the call's change (``tether rewind``), or ``None``."""
        ...


class ReviewTable(Protocol):
    """Review items and the reconciliation log."""

    def open_item(
        self,
        session_id: str,
        operation_id: str,
        tool_name: str,
        reason: str,
        evidence: Mapping[str, Any],
    ) -> ReviewItem: ...

    def get(self, item_id: int | str) -> ReviewItem: ...

    def list_open(self, session_id: str | None = None) -> list[ReviewItem]: ...

    def list_all(self, session_id: str | None = None) -> list[ReviewItem]: ...

    def for_operation(self, operation_id: str) -> ReviewItem | None: ...

    def resolve(
        self, item_id: int | str, decision: ReviewDecision | str, note: str | None = None
    ) -> ReviewItem: ...

    def log_reconciliation(
        self,
        session_id: str,
        operation_id: str,
        verdict: str,
        evidence: Mapping[str, Any],
        *,
        tool_name: str = "",
        action: str = "",
    ) -> ReconciliationEntry: ...

    def reconciliations(
        self, *, operation_id: str | None = None, session_id: str | None = None
    ) -> list[ReconciliationEntry]: ...


class AuthorizationTable(Protocol):
    """Authorization decisions, one per call (first decision wins)."""

    def record(
        self,
        *,
        session_id: str,
        call_key: str,
        tool_name: str,
        arguments_digest: str,
        summary: str,
        decision: str,
        who: str,
        rule: str,
        reason: str | None,
    ) -> Authorization: ...

    def get(self, session_id: str, call_key: str) -> Authorization | None: ...

    def list(self, session_id: str | None = None) -> builtins.list[Authorization]: ...


class VerificationTable(Protocol):
    """Runs of the check command and the manifests of artifact versions."""

    def record(
        self,
        *,
        session_id: str | None,
        tool_started_id: str | None,
        outcome: CheckOutcome,
        manifest: tuple[str, bytes] | None = None,
    ) -> Verification: ...

    def get(self, verification_id: str) -> Verification | None: ...

    def by_tool_started_id(self, tool_started_id: str) -> Verification | None: ...

    def latest(self) -> Verification | None: ...

    def latest_passing(self) -> Verification | None: ...

    def latest_conclusive(self, version: str) -> Verification | None: ...

    def list(self, limit: int = 20) -> builtins.list[Verification]: ...

    def save_manifest(self, version: str, manifest: bytes) -> None: ...

    def manifest(self, version: str) -> bytes | None: ...


class FailureTable(Protocol):
    """Failed tool calls with the artifact version they failed at."""

    def record(
        self,
        *,
        tool_started_id: str,
        session_id: str,
        tool_name: str,
        arguments_digest: str,
        artifact_version: str | None,
        result_entry_id: str | None = None,
    ) -> None: ...

    def get(self, tool_started_id: str) -> ToolFailure | None: ...

    def by_result_entry(self, result_entry_id: str) -> ToolFailure | None: ...


@runtime_checkable
class ApprovalTable(Protocol):
    """Parked approvals (what the runtime's authorization needs of them): what
    :attr:`WorkspaceDB.approvals` gives where the database keeps them (the SQLite one,
    :class:`~tether._wsdb.sqlite_approvals.ApprovalStore`)."""

    def propose(
        self,
        *,
        session_id: str,
        call_key: str,
        tool_name: str,
        arguments: dict[str, Any],
        arguments_digest: str,
        artifact_version: str | None,
        touched: dict[str, str | None],
        summary: str,
        rule: str,
    ) -> ApprovalRequest: ...

    def active(self, session_id: str, call_key: str) -> ApprovalRequest | None: ...

    def void(self, request_id: int, why: str) -> None: ...

    def grant(self, session_id: str, tool_name: str, rule: str, who: str) -> None: ...

    def granted(self, session_id: str, tool_name: str, rule: str) -> str | None: ...


class WorkspaceDB(Protocol):
    """One open workspace database: its tables, its identity, the sessions it holds."""

    @property
    def location(self) -> str:
        """Where the database is (its path), for messages and the session's binding."""
        ...

    @property
    def identity(self) -> str | None:
        """The database's random id, created with it (``None``: a database without one)."""
        ...

    @property
    def existed(self) -> bool:
        """Whether it existed before this open (``False``: this open created it)."""
        ...

    @property
    def fresh(self) -> bool:
        """Whether this open created its schema (it was new or empty)."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def journal(self) -> JournalTable: ...

    @property
    def reviews(self) -> ReviewTable: ...

    @property
    def authorizations(self) -> AuthorizationTable: ...

    @property
    def verifications(self) -> VerificationTable: ...

    @property
    def failures(self) -> FailureTable: ...

    @property
    def approvals(self) -> ApprovalTable | None:
        """The parked approvals, or ``None`` where this database keeps none (then a call
        nobody can be asked about is denied instead of parked)."""
        ...

    def now_ms(self) -> int:
        """The database's clock, in integer milliseconds since the epoch."""
        ...

    def names_session(self, session_id: str) -> bool:
        """Whether the database holds evidence for ``session_id`` (it was bound to it)."""
        ...

    def bind_session(self, session_id: str, previous_db: str | None, at_ms: int) -> None:
        """Record that the database holds ``session_id``'s evidence (idempotent; a later
        call keeps the first time and fills in ``previous_db`` if it was unknown)."""
        ...

    def close(self) -> None: ...


class WorkspaceDBOpener(Protocol):
    """Opens the workspace database (the executor calls it on first use)."""

    def __call__(self) -> WorkspaceDB: ...
