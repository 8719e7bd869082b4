"""The in-memory workspace database: the seam's second implementation, in pure Python.

:class:`MemoryWorkspace` holds the content of one workspace database — every table of
``effects.db`` as Python lists and dicts — and opens handles on it
(:class:`MemoryWorkspaceDB`, a :class:`~tether._wsdb.protocol.WorkspaceDB`); it is also a
:class:`~tether._wsdb.protocol.WorkspaceDBOpener`, so an agent built with it, and a new agent
after a simulated crash, use the same records. It is not SQLite ``:memory:``: it is a
second implementation of the seam, so the rules of :mod:`tether._wsdb.protocol` are kept
here in Python (the SQLite one keeps them in SQL), with the same value types, the same
errors and the same JSON round trip of evidence:

* every method holds the workspace's lock, so each write is atomic, and "durable" means
  "kept in this object" (nothing outlives the process);
* first record wins, transitions and the open-item rule as in the protocol module;
* the identity is a random id made with the workspace; the first handle reports
  ``existed=False`` and ``fresh=True``, later ones ``existed=True``.
"""

from __future__ import annotations

import builtins
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from tether._wsdb.rules import (
    BEFORE_KIND,
    check_same_call,
    dumps_evidence,
    loads_evidence,
    new_verification,
    parse_item_id,
    truncate_summary,
)
from tether.core.values import (
    Authorization,
    CheckOutcome,
    EvidenceCopy,
    JournalRow,
    JournalStatus,
    ReconciliationEntry,
    ReviewDecision,
    ReviewItem,
    ReviewStatus,
    ToolFailure,
    Verification,
    check_transition,
    format_ms,
)
from tether.errors import EffectsDatabaseError, ReviewItemNotFound, ReviewItemResolved

__all__ = ["MEMORY_DB", "MemoryWorkspace", "MemoryWorkspaceDB"]

MEMORY_DB: Final = "memory:effects.db"
"""The location an in-memory workspace database reports."""

_CONCLUSIVE: Final = frozenset({"passed", "failed", "error"})


@dataclass
class _Tables:
    """The content of one workspace database (the fake disk)."""

    journal: dict[str, JournalRow] = field(default_factory=dict)
    journal_history: list[tuple[str, JournalStatus, str | None, int]] = field(default_factory=list)
    evidence: list[EvidenceCopy] = field(default_factory=list)
    reviews: list[ReviewItem] = field(default_factory=list)
    reconciliations: list[ReconciliationEntry] = field(default_factory=list)
    authorizations: list[Authorization] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)
    manifests: dict[str, bytes] = field(default_factory=dict)
    failures: dict[str, ToolFailure] = field(default_factory=dict)
    sessions: dict[str, tuple[int, str | None]] = field(default_factory=dict)


class MemoryWorkspace:
    """One workspace database in memory, and its opener (call it, or :meth:`open`).

    ``clock`` is seconds since the epoch, like :class:`~tether._wsdb.sqlite.EffectsDB`'s.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.identity = secrets.token_hex(16)
        self.tables = _Tables()
        self.lock = threading.RLock()
        self.opened = 0

    def open(self) -> MemoryWorkspaceDB:
        with self.lock:
            first = self.opened == 0
            self.opened += 1
        return MemoryWorkspaceDB(self, existed=not first, fresh=first)

    def __call__(self) -> MemoryWorkspaceDB:
        return self.open()


class MemoryWorkspaceDB:
    """An open handle on a :class:`MemoryWorkspace` (see the module docstring)."""

    def __init__(self, workspace: MemoryWorkspace, *, existed: bool, fresh: bool) -> None:
        self._workspace = workspace
        self.existed = existed
        self.fresh = fresh
        self._closed = False
        self.journal = _Journal(self)
        self.reviews = _Reviews(self)
        self.authorizations = _Authorizations(self)
        self.verifications = _Verifications(self)
        self.failures = _Failures(self)
        self.approvals: None = None
        """The in-memory database keeps no parked approvals: a call nobody can be asked
        about is denied."""

    @property
    def location(self) -> str:
        return MEMORY_DB

    @property
    def identity(self) -> str:
        return self._workspace.identity

    @property
    def closed(self) -> bool:
        return self._closed

    def now_ms(self) -> int:
        return round(self._workspace.clock() * 1000)

    def use(self) -> tuple[_Tables, threading.RLock]:
        """The tables and the lock to hold while using them (refused once closed)."""
        if self._closed:
            raise EffectsDatabaseError(MEMORY_DB, "the database is closed")
        return self._workspace.tables, self._workspace.lock

    def names_session(self, session_id: str) -> bool:
        tables, lock = self.use()
        with lock:
            return session_id in tables.sessions

    def bind_session(self, session_id: str, previous_db: str | None, at_ms: int) -> None:
        tables, lock = self.use()
        with lock:
            bound, previous = tables.sessions.get(session_id, (at_ms, None))
            tables.sessions[session_id] = (bound, previous_db or previous)

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryWorkspaceDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# =========================================================================== journal


class _Journal:
    def __init__(self, db: MemoryWorkspaceDB) -> None:
        self._db = db

    @property
    def location(self) -> str:
        return MEMORY_DB

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
        status = JournalStatus(status)
        if result is not None and status is not JournalStatus.FAILED:
            raise ValueError("only a failed row is recorded with a result")
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            found = tables.journal.get(operation_id)
            if found is not None:
                check_same_call(found, session_id, digest, MEMORY_DB, tool_name)
                return found, False
            row = JournalRow(
                operation_id,
                session_id,
                tool_name,
                path,
                before_hash,
                after_hash,
                digest,
                status,
                detail,
                planned_result,
                result,
                result is not None,
                now,
                now,
            )
            tables.journal[operation_id] = row
            tables.journal_history.append((operation_id, status, detail or "intent recorded", now))
            if before_content is not None and before_hash is not None:
                tables.evidence.append(
                    EvidenceCopy(
                        id=len(tables.evidence) + 1,
                        operation_id=operation_id,
                        kind=BEFORE_KIND,
                        path=path,
                        content_hash=before_hash,
                        size=len(before_content),
                        truncated=False,
                        content=before_content,
                        created_at_ms=now,
                    )
                )
        return row, True

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
        status: JournalStatus = JournalStatus.STARTED,
    ) -> JournalRow:
        return self.insert(
            session_id,
            operation_id,
            path,
            before_hash,
            after_hash,
            arguments_digest,
            tool_name=tool_name,
            planned_result=planned_result,
            status=status,
        )[0]

    def mark(
        self,
        operation_id: str,
        status: JournalStatus,
        detail: str | None = None,
        *,
        result: str | None = None,
        result_is_error: bool = False,
    ) -> JournalRow:
        status = JournalStatus(status)
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            row = tables.journal.get(operation_id)
            if row is None:
                raise LookupError(f"no journal row for operation id {operation_id}")
            check_transition(operation_id, row.status, status)
            if status is row.status and status.terminal:
                return row  # idempotent: a terminal status is recorded once
            keep_result = result if result is not None else row.result
            keep_error = result_is_error if result is not None else row.result_is_error
            row = replace(
                row,
                status=status,
                detail=detail,
                result=keep_result,
                result_is_error=keep_error,
                updated_at_ms=now,
            )
            tables.journal[operation_id] = row
            tables.journal_history.append((operation_id, status, detail, now))
        return row

    def get(self, operation_id: str) -> JournalRow | None:
        tables, lock = self._db.use()
        with lock:
            return tables.journal.get(operation_id)

    def rows(self, session_id: str | None = None) -> list[JournalRow]:
        tables, lock = self._db.use()
        with lock:
            found = list(tables.journal.values())
        return [r for r in found if session_id is None or r.session_id == session_id]

    def history(self, operation_id: str) -> list[tuple[JournalStatus, str | None, int]]:
        tables, lock = self._db.use()
        with lock:
            return [(s, d, at) for op, s, d, at in tables.journal_history if op == operation_id]

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
    ) -> int:
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            number = len(tables.evidence) + 1
            tables.evidence.append(
                EvidenceCopy(
                    id=number,
                    operation_id=operation_id,
                    kind=kind,
                    path=path,
                    content_hash=content_hash,
                    size=size
                    if size is not None
                    else (len(content) if content is not None else None),
                    truncated=truncated,
                    content=content,
                    created_at_ms=now,
                )
            )
        return number

    def evidence(self, evidence_id: int) -> EvidenceCopy | None:
        tables, lock = self._db.use()
        with lock:
            return next((e for e in tables.evidence if e.id == evidence_id), None)

    def before_copy(self, operation_id: str) -> EvidenceCopy | None:
        tables, lock = self._db.use()
        with lock:
            return next(
                (
                    e
                    for e in reversed(tables.evidence)
                    if e.operation_id == operation_id and e.kind == BEFORE_KIND
                ),
                None,
            )


# =========================================================================== reviews


class _Reviews:
    def __init__(self, db: MemoryWorkspaceDB) -> None:
        self._db = db

    def _log(
        self,
        tables: _Tables,
        item: ReviewItem | tuple[str, str, str],
        verdict: str,
        action: str,
        evidence: Mapping[str, Any],
        now: int,
    ) -> ReconciliationEntry:
        session_id, operation_id, tool_name = (
            (item.session_id, item.operation_id, item.tool_name)
            if isinstance(item, ReviewItem)
            else item
        )
        entry = ReconciliationEntry(
            len(tables.reconciliations) + 1,
            session_id,
            operation_id,
            tool_name,
            verdict,
            action,
            loads_evidence(dumps_evidence(evidence)),  # JSON round trip, as in SQLite
            now,
        )
        tables.reconciliations.append(entry)
        return entry

    def open_item(
        self,
        session_id: str,
        operation_id: str,
        tool_name: str,
        reason: str,
        evidence: Mapping[str, Any],
    ) -> ReviewItem:
        text = dumps_evidence(evidence)
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            for item in tables.reviews:
                if item.operation_id == operation_id and item.is_open:
                    return item
            item = ReviewItem(
                len(tables.reviews) + 1,
                session_id,
                operation_id,
                tool_name,
                reason,
                loads_evidence(text),
                ReviewStatus.OPEN,
                None,
                None,
                now,
                None,
            )
            tables.reviews.append(item)
            logged = {"reviewItem": item.id, "reason": reason, **dict(evidence)}
            self._log(tables, item, "reviewOpened", "review", logged, now)
        return item

    def get(self, item_id: int | str) -> ReviewItem:
        number = parse_item_id(item_id)
        tables, lock = self._db.use()
        with lock:
            if 1 <= number <= len(tables.reviews):
                return tables.reviews[number - 1]
        raise ReviewItemNotFound(item_id)

    def list_open(self, session_id: str | None = None) -> list[ReviewItem]:
        return [item for item in self.list_all(session_id) if item.is_open]

    def list_all(self, session_id: str | None = None) -> list[ReviewItem]:
        tables, lock = self._db.use()
        with lock:
            found = list(tables.reviews)
        return [item for item in found if session_id is None or item.session_id == session_id]

    def for_operation(self, operation_id: str) -> ReviewItem | None:
        tables, lock = self._db.use()
        with lock:
            items = [item for item in tables.reviews if item.operation_id == operation_id]
        opened = [item for item in items if item.is_open]
        if opened:
            return opened[-1]
        return items[-1] if items else None

    def resolve(
        self, item_id: int | str, decision: ReviewDecision | str, note: str | None = None
    ) -> ReviewItem:
        number = parse_item_id(item_id)
        choice = ReviewDecision(decision)
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            if not 1 <= number <= len(tables.reviews):
                raise ReviewItemNotFound(item_id)
            item = tables.reviews[number - 1]
            if not item.is_open:
                raise ReviewItemResolved(
                    item_id,
                    item.decision.value if item.decision is not None else "?",
                    format_ms(item.resolved_at_ms) or "?",
                )
            resolved = replace(
                item,
                status=ReviewStatus.RESOLVED,
                decision=choice,
                note=note,
                resolved_at_ms=now,
            )
            tables.reviews[number - 1] = resolved
            logged = {
                "reviewItem": number,
                "decision": choice.value,
                "note": note,
                "reason": item.reason,
                "evidence": dict(item.evidence),
            }
            self._log(tables, item, f"review:{choice.value}", "decision", logged, now)
        return resolved

    def log_reconciliation(
        self,
        session_id: str,
        operation_id: str,
        verdict: str,
        evidence: Mapping[str, Any],
        *,
        tool_name: str = "",
        action: str = "",
    ) -> ReconciliationEntry:
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            where = (session_id, operation_id, tool_name)
            return self._log(tables, where, verdict, action, evidence, now)

    def reconciliations(
        self, *, operation_id: str | None = None, session_id: str | None = None
    ) -> list[ReconciliationEntry]:
        tables, lock = self._db.use()
        with lock:
            found = list(tables.reconciliations)
        return [
            entry
            for entry in found
            if (operation_id is None or entry.operation_id == operation_id)
            and (session_id is None or entry.session_id == session_id)
        ]


# =========================================================================== authorizations


class _Authorizations:
    def __init__(self, db: MemoryWorkspaceDB) -> None:
        self._db = db

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
    ) -> Authorization:
        if decision not in ("allow", "deny"):
            raise ValueError(f"decision must be 'allow' or 'deny', got {decision!r}")
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            earlier = self._find(tables, session_id, call_key)
            if earlier is not None:
                return earlier  # the first decision wins
            recorded = Authorization(
                len(tables.authorizations) + 1,
                session_id,
                call_key,
                tool_name,
                arguments_digest,
                truncate_summary(summary),
                decision,
                who,
                rule,
                reason,
                now,
            )
            tables.authorizations.append(recorded)
        return recorded

    @staticmethod
    def _find(tables: _Tables, session_id: str, call_key: str) -> Authorization | None:
        for item in tables.authorizations:
            if item.session_id == session_id and item.call_key == call_key:
                return item
        return None

    def get(self, session_id: str, call_key: str) -> Authorization | None:
        tables, lock = self._db.use()
        with lock:
            return self._find(tables, session_id, call_key)

    def list(self, session_id: str | None = None) -> builtins.list[Authorization]:
        tables, lock = self._db.use()
        with lock:
            found = builtins.list(tables.authorizations)
        return [item for item in found if session_id is None or item.session_id == session_id]


# =========================================================================== verifications


def _newest(found: builtins.list[Verification]) -> builtins.list[Verification]:
    """Newest first: by start time, then id (as the SQLite table orders them)."""
    return sorted(found, key=lambda v: (v.started_at_ms, v.id), reverse=True)


class _Verifications:
    def __init__(self, db: MemoryWorkspaceDB) -> None:
        self._db = db

    def record(
        self,
        *,
        session_id: str | None,
        tool_started_id: str | None,
        outcome: CheckOutcome,
        manifest: tuple[str, bytes] | None = None,
    ) -> Verification:
        verification = new_verification(
            outcome, session_id=session_id, tool_started_id=tool_started_id
        )
        tables, lock = self._db.use()
        with lock:
            tables.verifications.append(verification)
            if manifest is not None:
                tables.manifests.setdefault(manifest[0], bytes(manifest[1]))
        return verification

    def _select(self, keep: Callable[[Verification], bool]) -> Verification | None:
        tables, lock = self._db.use()
        with lock:
            found = [v for v in tables.verifications if keep(v)]
        newest = _newest(found)
        return newest[0] if newest else None

    def get(self, verification_id: str) -> Verification | None:
        return self._select(lambda v: v.id == verification_id)

    def by_tool_started_id(self, tool_started_id: str) -> Verification | None:
        return self._select(lambda v: v.tool_started_id == tool_started_id)

    def latest(self) -> Verification | None:
        return self._select(lambda v: True)

    def latest_passing(self) -> Verification | None:
        return self._select(lambda v: v.status.value == "passed")

    def latest_conclusive(self, version: str) -> Verification | None:
        return self._select(lambda v: v.version_start == version and v.status.value in _CONCLUSIVE)

    def list(self, limit: int = 20) -> builtins.list[Verification]:
        tables, lock = self._db.use()
        with lock:
            found = builtins.list(tables.verifications)
        return _newest(found)[: max(0, int(limit))]

    def save_manifest(self, version: str, manifest: bytes) -> None:
        tables, lock = self._db.use()
        with lock:
            tables.manifests.setdefault(version, bytes(manifest))  # written once

    def manifest(self, version: str) -> bytes | None:
        tables, lock = self._db.use()
        with lock:
            return tables.manifests.get(version)


# =========================================================================== failures


class _Failures:
    def __init__(self, db: MemoryWorkspaceDB) -> None:
        self._db = db

    def record(
        self,
        *,
        tool_started_id: str,
        session_id: str,
        tool_name: str,
        arguments_digest: str,
        artifact_version: str | None,
        result_entry_id: str | None = None,
    ) -> None:
        now = self._db.now_ms()
        tables, lock = self._db.use()
        with lock:
            tables.failures.setdefault(  # the first record stays
                tool_started_id,
                ToolFailure(
                    tool_started_id,
                    session_id,
                    tool_name,
                    arguments_digest,
                    artifact_version,
                    now,
                    result_entry_id,
                ),
            )

    def get(self, tool_started_id: str) -> ToolFailure | None:
        tables, lock = self._db.use()
        with lock:
            return tables.failures.get(tool_started_id)

    def by_result_entry(self, result_entry_id: str) -> ToolFailure | None:
        tables, lock = self._db.use()
        with lock:
            found = [f for f in tables.failures.values() if f.result_entry_id == result_entry_id]
        return max(found, key=lambda f: f.at_ms) if found else None
