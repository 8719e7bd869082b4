"""Authorization decisions of tool calls (table ``authorizations``).

Before a tool call with effects starts, someone (the policy, the user, ``--yes``) decides
whether it may run. The decision is recorded durably before the call starts, keyed by the
session and a *call key* that identifies the call before it has a ``toolStarted`` id
(:func:`call_key`: ``"<assistantEntryId>:<toolIndex>"``).

The first decision for a call wins: recording again (after a crash, on a retry) returns the
existing row unchanged, so a call is never decided twice with different outcomes.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Final

from tether._wsdb.sqlite import EffectsDB, format_ms

__all__ = [
    "SUMMARY_LIMIT",
    "Authorization",
    "AuthorizationStore",
    "call_key",
]

SUMMARY_LIMIT: Final = 500
"""Summaries longer than this many characters are truncated (ending in ``…``)."""

_DECISIONS: Final = frozenset({"allow", "deny"})


def call_key(assistant_entry_id: str, tool_index: int) -> str:
    """The key of one tool call of a session: ``"<assistantEntryId>:<toolIndex>"``."""
    if isinstance(tool_index, bool) or not isinstance(tool_index, int) or tool_index < 0:
        raise ValueError(f"tool_index must be a non-negative int, got {tool_index!r}")
    return f"{assistant_entry_id}:{tool_index}"


def _truncate(summary: str) -> str:
    if len(summary) <= SUMMARY_LIMIT:
        return summary
    return summary[: SUMMARY_LIMIT - 1] + "…"


@dataclass(frozen=True)
class Authorization:
    """One recorded decision on one tool call."""

    id: int
    session_id: str
    call_key: str
    tool_name: str
    arguments_digest: str
    summary: str
    decision: str
    who: str
    rule: str
    reason: str | None
    decided_at_ms: int

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "callKey": self.call_key,
            "toolName": self.tool_name,
            "argumentsDigest": self.arguments_digest,
            "summary": self.summary,
            "decision": self.decision,
            "who": self.who,
            "rule": self.rule,
            "reason": self.reason,
            "decidedAtMs": self.decided_at_ms,
            "decidedAt": format_ms(self.decided_at_ms),
        }


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

    def __init__(self, db: EffectsDB) -> None:
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
        text = _truncate(summary)
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
