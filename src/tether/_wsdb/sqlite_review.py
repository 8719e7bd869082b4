"""Review items and the reconciliation log in SQLite (tables ``review_items``,
``reconciliations``): :class:`ReviewStore` (what they mean: :mod:`tether._effects.review`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tether._wsdb.rules import dumps_evidence, loads_evidence, parse_item_id
from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import (
    ReconciliationEntry,
    ReviewDecision,
    ReviewItem,
    ReviewStatus,
    format_ms,
)
from tether.errors import ReviewItemNotFound, ReviewItemResolved

_ITEM_COLUMNS: Final = (
    "id, session_id, operation_id, tool_name, reason, evidence, status, decision, note, "
    "opened_at_ms, resolved_at_ms"
)


def _item(row: Any) -> ReviewItem:
    decision = row["decision"]
    resolved = row["resolved_at_ms"]
    return ReviewItem(
        id=int(row["id"]),
        session_id=row["session_id"],
        operation_id=row["operation_id"],
        tool_name=row["tool_name"],
        reason=row["reason"],
        evidence=loads_evidence(row["evidence"]),
        status=ReviewStatus(row["status"]),
        decision=None if decision is None else ReviewDecision(decision),
        note=row["note"],
        opened_at_ms=int(row["opened_at_ms"]),
        resolved_at_ms=None if resolved is None else int(resolved),
    )


def _entry(row: Any) -> ReconciliationEntry:
    return ReconciliationEntry(
        id=int(row["id"]),
        session_id=row["session_id"],
        operation_id=row["operation_id"],
        tool_name=row["tool_name"],
        verdict=row["verdict"],
        action=row["action"],
        evidence=loads_evidence(row["evidence"]),
        at_ms=int(row["at_ms"]),
    )


class ReviewStore:
    """Review items and the reconciliation log of an :class:`~tether._wsdb.sqlite.EffectsDB`.

    Times come from the database's clock (``EffectsDB.open(..., clock=...)``).
    """

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

    # ------------------------------------------------------------------ items

    def open_item(
        self,
        session_id: str,
        operation_id: str,
        tool_name: str,
        reason: str,
        evidence: Mapping[str, Any],
    ) -> ReviewItem:
        """Open a review item for a call (idempotent while one is open for that operation id:
        the open item is returned unchanged). Logged in the reconciliation log."""
        text = dumps_evidence(evidence)
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_ITEM_COLUMNS} FROM review_items "
                "WHERE operation_id = ? AND status = 'open'",
                (operation_id,),
            ).fetchone()
            if found is not None:
                return _item(found)
            cursor = conn.execute(
                "INSERT INTO review_items (session_id, operation_id, tool_name, reason, "
                "evidence, status, decision, note, opened_at_ms, resolved_at_ms) "
                "VALUES (?,?,?,?,?,'open',NULL,NULL,?,NULL)",
                (session_id, operation_id, tool_name, reason, text, now),
            )
            item_id = cursor.lastrowid
            assert item_id is not None
            conn.execute(
                "INSERT INTO reconciliations (session_id, operation_id, tool_name, verdict, "
                "action, evidence, at_ms) VALUES (?,?,?,?,?,?,?)",
                (
                    session_id,
                    operation_id,
                    tool_name,
                    "reviewOpened",
                    "review",
                    dumps_evidence(
                        {"reviewItem": int(item_id), "reason": reason, **dict(evidence)}
                    ),
                    now,
                ),
            )
        return ReviewItem(
            int(item_id),
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

    def get(self, item_id: int | str) -> ReviewItem:
        """The item with that id (``7``, ``"7"`` or ``"#7"``), or :class:`ReviewItemNotFound`."""
        number = parse_item_id(item_id)
        found = self.db.query_one(
            f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE id = ?", (number,)
        )
        if found is None:
            raise ReviewItemNotFound(item_id)
        return _item(found)

    def list_open(self, session_id: str | None = None) -> list[ReviewItem]:
        """Open items (of one session), oldest first."""
        if session_id is None:
            rows = self.db.query(
                f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE status = 'open' ORDER BY id"
            )
        else:
            rows = self.db.query(
                f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE status = 'open' "
                "AND session_id = ? ORDER BY id",
                (session_id,),
            )
        return [_item(row) for row in rows]

    def list_all(self, session_id: str | None = None) -> list[ReviewItem]:
        """Every item, open or resolved (of one session), oldest first."""
        if session_id is None:
            rows = self.db.query(f"SELECT {_ITEM_COLUMNS} FROM review_items ORDER BY id")
        else:
            rows = self.db.query(
                f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE session_id = ? ORDER BY id",
                (session_id,),
            )
        return [_item(row) for row in rows]

    def for_operation(self, operation_id: str) -> ReviewItem | None:
        """The open item of ``operation_id``; else its latest resolved item; else ``None``."""
        found = self.db.query_one(
            f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE operation_id = ? "
            "ORDER BY (status = 'open') DESC, id DESC LIMIT 1",
            (operation_id,),
        )
        return None if found is None else _item(found)

    def resolve(
        self, item_id: int | str, decision: ReviewDecision | str, note: str | None = None
    ) -> ReviewItem:
        """Record the decision for an open item (durable before returning).

        :class:`~tether.errors.ReviewItemNotFound` if there is no such item,
        :class:`~tether.errors.ReviewItemResolved` if it was already decided.
        """
        number = parse_item_id(item_id)
        choice = ReviewDecision(decision)
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_ITEM_COLUMNS} FROM review_items WHERE id = ?", (number,)
            ).fetchone()
            if found is None:
                raise ReviewItemNotFound(item_id)
            item = _item(found)
            if not item.is_open:
                raise ReviewItemResolved(
                    item_id,
                    item.decision.value if item.decision is not None else "?",
                    format_ms(item.resolved_at_ms) or "?",
                )
            conn.execute(
                "UPDATE review_items SET status = 'resolved', decision = ?, note = ?, "
                "resolved_at_ms = ? WHERE id = ?",
                (choice.value, note, now, number),
            )
            conn.execute(
                "INSERT INTO reconciliations (session_id, operation_id, tool_name, verdict, "
                "action, evidence, at_ms) VALUES (?,?,?,?,?,?,?)",
                (
                    item.session_id,
                    item.operation_id,
                    item.tool_name,
                    f"review:{choice.value}",
                    "decision",
                    dumps_evidence(
                        {
                            "reviewItem": number,
                            "decision": choice.value,
                            "note": note,
                            "reason": item.reason,
                            "evidence": dict(item.evidence),
                        }
                    ),
                    now,
                ),
            )
        return ReviewItem(
            item.id,
            item.session_id,
            item.operation_id,
            item.tool_name,
            item.reason,
            item.evidence,
            ReviewStatus.RESOLVED,
            choice,
            note,
            item.opened_at_ms,
            now,
        )

    # ------------------------------------------------------------------ log

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
        """Append one reconciliation (what was observed, what was decided) to the log."""
        text = dumps_evidence(evidence)
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO reconciliations (session_id, operation_id, tool_name, verdict, "
                "action, evidence, at_ms) VALUES (?,?,?,?,?,?,?)",
                (session_id, operation_id, tool_name, verdict, action, text, now),
            )
            entry_id = cursor.lastrowid
        assert entry_id is not None
        return ReconciliationEntry(
            int(entry_id),
            session_id,
            operation_id,
            tool_name,
            verdict,
            action,
            loads_evidence(text),
            now,
        )

    def reconciliations(
        self, *, operation_id: str | None = None, session_id: str | None = None
    ) -> list[ReconciliationEntry]:
        """The log (filtered by operation and/or session), oldest first."""
        clauses, params = [], []
        if operation_id is not None:
            clauses.append("operation_id = ?")
            params.append(operation_id)
        if session_id is not None:
            clauses.append("session_id = ?")
            params.append(session_id)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = self.db.query(f"SELECT * FROM reconciliations{where} ORDER BY id", params)
        return [_entry(row) for row in rows]
