"""Authorization decisions in SQLite (table ``authorizations``): :class:`AuthorizationStore`
(what they mean: :mod:`tether._effects.authorization`)."""

from __future__ import annotations

import builtins
from typing import Any, Final

from tether._wsdb.rules import truncate_summary
from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import Authorization

_DECISIONS: Final = frozenset({"allow", "deny"})


_COLUMNS: Final = (
    "id, session_id, call_key, tool_name, arguments_digest, summary, decision, who, rule, "
    "reason, decided_at_ms"
)


def _row(row: Any) -> Authorization:
    return Authorization(
        id=int(row["id"]),
        session_id=row["session_id"],
        call_key=row["call_key"],
        tool_name=row["tool_name"],
        arguments_digest=row["arguments_digest"],
        summary=row["summary"],
        decision=row["decision"],
        who=row["who"],
        rule=row["rule"],
        reason=row["reason"],
        decided_at_ms=int(row["decided_at_ms"]),
    )


class AuthorizationStore:
    """Authorization decisions of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

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
        """Record the decision on a call, durable before it returns.

        If the call (``session_id``, ``call_key``) was decided already, the existing row is
        returned unchanged: the first decision wins.
        """
        if decision not in _DECISIONS:
            raise ValueError(f"decision must be 'allow' or 'deny', got {decision!r}")
        text = truncate_summary(summary)
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM authorizations WHERE session_id = ? AND call_key = ?",
                (session_id, call_key),
            ).fetchone()
            if found is not None:
                return _row(found)
            cursor = conn.execute(
                "INSERT INTO authorizations (session_id, call_key, tool_name, arguments_digest, "
                "summary, decision, who, rule, reason, decided_at_ms) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    session_id,
                    call_key,
                    tool_name,
                    arguments_digest,
                    text,
                    decision,
                    who,
                    rule,
                    reason,
                    now,
                ),
            )
            row_id = cursor.lastrowid
        assert row_id is not None
        return Authorization(
            int(row_id),
            session_id,
            call_key,
            tool_name,
            arguments_digest,
            text,
            decision,
            who,
            rule,
            reason,
            now,
        )

    def get(self, session_id: str, call_key: str) -> Authorization | None:
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM authorizations WHERE session_id = ? AND call_key = ?",
            (session_id, call_key),
        )
        return None if found is None else _row(found)

    def list(self, session_id: str | None = None) -> builtins.list[Authorization]:
        """Every decision (of one session), oldest first."""
        if session_id is None:
            rows = self.db.query(f"SELECT {_COLUMNS} FROM authorizations ORDER BY id")
        else:
            rows = self.db.query(
                f"SELECT {_COLUMNS} FROM authorizations WHERE session_id = ? ORDER BY id",
                (session_id,),
            )
        return [_row(row) for row in rows]
