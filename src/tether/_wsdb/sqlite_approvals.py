"""Parked approvals in SQLite (tables ``approval_requests``, ``approval_grants``):
:class:`ApprovalStore` (what they mean: :mod:`tether._effects.approvals`)."""

from __future__ import annotations

import builtins
import json
from typing import Any, Final

from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import ApprovalRequest, format_ms
from tether.errors import ApprovalDecided, ApprovalNotFound

_ACTIVE: Final = ("proposed", "approved", "denied")


_COLUMNS: Final = (
    "id, session_id, call_key, tool_name, arguments, arguments_digest, artifact_version, "
    "touched, summary, rule, status, always, decided_by, reason, proposed_at_ms, decided_at_ms"
)


def _row(row: Any) -> ApprovalRequest:
    return ApprovalRequest(
        id=int(row["id"]),
        session_id=row["session_id"],
        call_key=row["call_key"],
        tool_name=row["tool_name"],
        arguments=json.loads(row["arguments"]),
        arguments_digest=row["arguments_digest"],
        artifact_version=row["artifact_version"],
        touched=json.loads(row["touched"]),
        summary=row["summary"],
        rule=row["rule"],
        status=row["status"],
        always=bool(row["always"]),
        decided_by=row["decided_by"],
        reason=row["reason"],
        proposed_at_ms=int(row["proposed_at_ms"]),
        decided_at_ms=None if row["decided_at_ms"] is None else int(row["decided_at_ms"]),
    )


class ApprovalStore:
    """The parked approvals of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

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
    ) -> ApprovalRequest:
        """Park a call, durable before it returns; the active request of the call if it
        has one already (proposed, approved or denied): a call is parked once."""
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM approval_requests WHERE session_id = ? AND call_key = ? "
                "AND status IN (?,?,?) ORDER BY id DESC LIMIT 1",
                (session_id, call_key, *_ACTIVE),
            ).fetchone()
            if found is not None:
                return _row(found)
            cursor = conn.execute(
                "INSERT INTO approval_requests (session_id, call_key, tool_name, arguments, "
                "arguments_digest, artifact_version, touched, summary, rule, status, "
                "proposed_at_ms) VALUES (?,?,?,?,?,?,?,?,?,'proposed',?)",
                (
                    session_id,
                    call_key,
                    tool_name,
                    json.dumps(arguments, sort_keys=True, ensure_ascii=False),
                    arguments_digest,
                    artifact_version,
                    json.dumps(touched, sort_keys=True),
                    summary,
                    rule,
                    now,
                ),
            )
            row_id = cursor.lastrowid
        assert row_id is not None
        return self.get(int(row_id))

    def get(self, request_id: int) -> ApprovalRequest:
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM approval_requests WHERE id = ?", (request_id,)
        )
        if found is None:
            raise ApprovalNotFound(f"no parked call #{request_id} (see `tether approvals`)")
        return _row(found)

    def active(self, session_id: str, call_key: str) -> ApprovalRequest | None:
        """The call's request that is not void, if any."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM approval_requests WHERE session_id = ? AND call_key = ? "
            "AND status IN (?,?,?) ORDER BY id DESC LIMIT 1",
            (session_id, call_key, *_ACTIVE),
        )
        return None if found is None else _row(found)

    def list(
        self, *, session_id: str | None = None, status: str | None = None
    ) -> builtins.list[ApprovalRequest]:
        """Requests oldest first, optionally of one session and/or one status."""
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self.db.query(
            f"SELECT {_COLUMNS} FROM approval_requests{clause} ORDER BY id", tuple(params)
        )
        return [_row(row) for row in rows]

    def decide(
        self, request_id: int, *, approve: bool, who: str, reason: str | None, always: bool
    ) -> ApprovalRequest:
        """Approve or deny a proposed request (one transaction, with the grant for
        ``always``); :class:`ApprovalDecided` if it was decided or voided already."""
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM approval_requests WHERE id = ?", (request_id,)
            ).fetchone()
            if found is None:
                raise ApprovalNotFound(f"no parked call #{request_id} (see `tether approvals`)")
            request = _row(found)
            if request.status != "proposed":
                raise ApprovalDecided(_decided_text(request))
            conn.execute(
                "UPDATE approval_requests SET status = ?, always = ?, decided_by = ?, "
                "reason = ?, decided_at_ms = ? WHERE id = ?",
                ("approved" if approve else "denied", int(always), who, reason, now, request_id),
            )
            if approve and always:
                conn.execute(
                    "INSERT OR IGNORE INTO approval_grants (session_id, tool_name, rule, "
                    "granted_by, granted_at_ms) VALUES (?,?,?,?,?)",
                    (request.session_id, request.tool_name, request.rule, who, now),
                )
        return self.get(request_id)

    def void(self, request_id: int, why: str) -> None:
        """Mark a request void (its call or files changed); idempotent."""
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE approval_requests SET status = 'void', reason = ? "
                "WHERE id = ? AND status != 'void'",
                (why, request_id),
            )

    def grant(self, session_id: str, tool_name: str, rule: str, who: str) -> None:
        """Allow later calls of ``tool_name`` under ``rule`` in the session (idempotent)."""
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO approval_grants (session_id, tool_name, rule, "
                "granted_by, granted_at_ms) VALUES (?,?,?,?,?)",
                (session_id, tool_name, rule, who, self.db.now_ms()),
            )

    def granted(self, session_id: str, tool_name: str, rule: str) -> str | None:
        """Who granted "always" for this tool and rule in the session, if anybody."""
        found = self.db.query_one(
            "SELECT granted_by FROM approval_grants WHERE session_id = ? AND tool_name = ? "
            "AND rule = ?",
            (session_id, tool_name, rule),
        )
        return None if found is None else str(found["granted_by"])


def _decided_text(request: ApprovalRequest) -> str:
    if request.status == "void":
        return f"parked call #{request.id} is void: {request.reason or 'it changed'}"
    when = format_ms(request.decided_at_ms) if request.decided_at_ms else "?"
    return (
        f"parked call #{request.id} was already {request.status} by {request.decided_by} at {when}"
    )
