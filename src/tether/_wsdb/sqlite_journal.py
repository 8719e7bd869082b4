"""The action journal's SQLite table (``journal``, ``journal_history``, ``evidence``):
:class:`ActionJournal`, the journal of an :class:`~tether._wsdb.sqlite.EffectsDB` (the rules
of the journal are in :mod:`tether._effects.journal`)."""

from __future__ import annotations

from typing import Any, Final

from tether._wsdb.rules import BEFORE_KIND, check_same_call
from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import EvidenceCopy, JournalRow, JournalStatus, check_transition

_COLUMNS: Final = (
    "operation_id, session_id, tool_name, path, before_hash, after_hash, arguments_digest, "
    "status, detail, planned_result, result, result_is_error, created_at_ms, updated_at_ms"
)


def _row(data: Any) -> JournalRow:
    return JournalRow(
        operation_id=data["operation_id"],
        session_id=data["session_id"],
        tool_name=data["tool_name"],
        path=data["path"],
        before_hash=data["before_hash"],
        after_hash=data["after_hash"],
        arguments_digest=data["arguments_digest"],
        status=JournalStatus(data["status"]),
        detail=data["detail"],
        planned_result=data["planned_result"],
        result=data["result"],
        result_is_error=bool(data["result_is_error"]),
        created_at_ms=int(data["created_at_ms"]),
        updated_at_ms=int(data["updated_at_ms"]),
    )


class ActionJournal:
    """The ``journal`` table of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

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
        """Durably record the intent of a file change (one transaction, fsynced).

        Idempotent: when ``operation_id`` is already recorded for the same session with the
        same ``arguments_digest`` the existing row is returned unchanged. With a different
        session or digest, :class:`~tether.errors.OperationIdConflict` is raised and nothing
        is recorded.
        """
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

    @property
    def location(self) -> str:
        """Where the journal is, for messages (the database's path)."""
        return str(self.db.path)

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
        """Record a row unless ``operation_id`` has one: ``(row, created)``.

        An existing row of another session or digest raises
        :class:`~tether.errors.OperationIdConflict`. ``result`` (an error) only with status
        ``failed``. ``before_content`` (the file's bytes, hashing to ``before_hash``) is kept
        in the same transaction as evidence of kind ``before``, what ``tether rewind``
        restores. Durable on return.
        """
        status = JournalStatus(status)
        if result is not None and status is not JournalStatus.FAILED:
            raise ValueError("only a failed row is recorded with a result")
        is_error = result is not None
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM journal WHERE operation_id = ?", (operation_id,)
            ).fetchone()
            if found is not None:
                row = _row(found)
                check_same_call(row, session_id, digest, self.location, tool_name)
                return row, False
            conn.execute(
                f"INSERT INTO journal ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    operation_id,
                    session_id,
                    tool_name,
                    path,
                    before_hash,
                    after_hash,
                    digest,
                    status.value,
                    detail,
                    planned_result,
                    result,
                    int(is_error),
                    now,
                    now,
                ),
            )
            conn.execute(
                "INSERT INTO journal_history (operation_id, status, detail, at_ms) "
                "VALUES (?,?,?,?)",
                (operation_id, status.value, detail or "intent recorded", now),
            )
            if before_content is not None and before_hash is not None:
                conn.execute(
                    "INSERT INTO evidence (operation_id, kind, path, content_hash, size, "
                    "truncated, content, created_at_ms) VALUES (?,?,?,?,?,0,?,?)",
                    (
                        operation_id,
                        BEFORE_KIND,
                        path,
                        before_hash,
                        len(before_content),
                        before_content,
                        now,
                    ),
                )
        return (
            JournalRow(
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
                is_error,
                now,
                now,
            ),
            True,
        )

    def mark(
        self,
        operation_id: str,
        status: JournalStatus,
        detail: str | None = None,
        *,
        result: str | None = None,
        result_is_error: bool = False,
    ) -> JournalRow:
        """Move a row to ``status`` (fsynced); ``result`` is kept with terminal statuses.

        Raises :class:`LookupError` for an unknown operation id and :class:`ValueError` for a
        transition the journal does not allow (a terminal status never changes, except to
        itself).
        """
        status = JournalStatus(status)
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM journal WHERE operation_id = ?", (operation_id,)
            ).fetchone()
            if found is None:
                raise LookupError(f"no journal row for operation id {operation_id}")
            row = _row(found)
            check_transition(operation_id, row.status, status)
            if status is row.status and status.terminal:
                return row  # idempotent: a terminal status is recorded once
            keep_result = result if result is not None else row.result
            keep_error = result_is_error if result is not None else row.result_is_error
            conn.execute(
                "UPDATE journal SET status = ?, detail = ?, result = ?, result_is_error = ?, "
                "updated_at_ms = ? WHERE operation_id = ?",
                (status.value, detail, keep_result, int(keep_error), now, operation_id),
            )
            conn.execute(
                "INSERT INTO journal_history (operation_id, status, detail, at_ms) "
                "VALUES (?,?,?,?)",
                (operation_id, status.value, detail, now),
            )
        return JournalRow(
            row.operation_id,
            row.session_id,
            row.tool_name,
            row.path,
            row.before_hash,
            row.after_hash,
            row.arguments_digest,
            status,
            detail,
            row.planned_result,
            keep_result,
            keep_error,
            row.created_at_ms,
            now,
        )

    def get(self, operation_id: str) -> JournalRow | None:
        """The row of ``operation_id``, or ``None``."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM journal WHERE operation_id = ?", (operation_id,)
        )
        return None if found is None else _row(found)

    def rows(self, session_id: str | None = None) -> list[JournalRow]:
        """Every row (of one session), oldest first."""
        if session_id is None:
            found = self.db.query(f"SELECT {_COLUMNS} FROM journal ORDER BY created_at_ms, rowid")
        else:
            found = self.db.query(
                f"SELECT {_COLUMNS} FROM journal WHERE session_id = ? "
                "ORDER BY created_at_ms, rowid",
                (session_id,),
            )
        return [_row(item) for item in found]

    def history(self, operation_id: str) -> list[tuple[JournalStatus, str | None, int]]:
        """``(status, detail, at_ms)`` of every status the row went through, in order."""
        found = self.db.query(
            "SELECT status, detail, at_ms FROM journal_history WHERE operation_id = ? ORDER BY id",
            (operation_id,),
        )
        return [(JournalStatus(r["status"]), r["detail"], int(r["at_ms"])) for r in found]

    # ------------------------------------------------------------------ evidence

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
        """Store a content copy as evidence; returns its id."""
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO evidence (operation_id, kind, path, content_hash, size, truncated, "
                "content, created_at_ms) VALUES (?,?,?,?,?,?,?,?)",
                (
                    operation_id,
                    kind,
                    path,
                    content_hash,
                    size if size is not None else (len(content) if content is not None else None),
                    int(truncated),
                    content,
                    now,
                ),
            )
            rowid = cursor.lastrowid
        assert rowid is not None
        return int(rowid)

    def evidence(self, evidence_id: int) -> EvidenceCopy | None:
        """A kept evidence copy, or ``None``."""
        return _copy(self.db.query_one("SELECT * FROM evidence WHERE id = ?", (evidence_id,)))

    def before_copy(self, operation_id: str) -> EvidenceCopy | None:
        """The content the call's file had before it (kind ``before``), or ``None``."""
        return _copy(
            self.db.query_one(
                "SELECT * FROM evidence WHERE operation_id = ? AND kind = ? "
                "ORDER BY id DESC LIMIT 1",
                (operation_id, BEFORE_KIND),
            )
        )


def _copy(found: Any) -> EvidenceCopy | None:
    if found is None:
        return None
    return EvidenceCopy(
        id=int(found["id"]),
        operation_id=found["operation_id"],
        kind=found["kind"],
        path=found["path"],
        content_hash=found["content_hash"],
        size=found["size"],
        truncated=bool(found["truncated"]),
        content=found["content"],
        created_at_ms=int(found["created_at_ms"]),
    )
