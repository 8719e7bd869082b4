"""Failed tool calls in SQLite (table ``tool_failures``): :class:`FailureStore` (what they
mean: :mod:`tether._completion.failures`)."""

from __future__ import annotations

from typing import Any, Final

from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import ToolFailure

_COLUMNS: Final = (
    "tool_started_id, session_id, tool_name, arguments_digest, artifact_version, at_ms, "
    "result_entry_id"
)


class FailureStore:
    """Tool failures of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

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
        """Record a failed call (durable on return; ignored if that call is recorded)."""
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT OR IGNORE INTO tool_failures ({_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                (
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
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM tool_failures WHERE tool_started_id = ?", (tool_started_id,)
        )
        return None if found is None else _row(found)

    def by_result_entry(self, result_entry_id: str) -> ToolFailure | None:
        """The failure recorded with that result entry id, if any."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM tool_failures WHERE result_entry_id = ? "
            "ORDER BY at_ms DESC LIMIT 1",
            (result_entry_id,),
        )
        return None if found is None else _row(found)


def _row(row: Any) -> ToolFailure:
    return ToolFailure(
        tool_started_id=row["tool_started_id"],
        session_id=row["session_id"],
        tool_name=row["tool_name"],
        arguments_digest=row["arguments_digest"],
        artifact_version=row["artifact_version"],
        at_ms=int(row["at_ms"]),
        result_entry_id=row["result_entry_id"],
    )
