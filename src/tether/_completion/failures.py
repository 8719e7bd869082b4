"""Failed tool calls and the artifact version they failed at (table ``tool_failures``).

Keyed by the ``toolStarted`` id of the call; recording the same call again is ignored (the
first record stays), so recording is idempotent across a crash and a retry. The id of the
call's result entry may be kept too, to find the failure of a given result
(:meth:`FailureStore.by_result_entry`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from tether._wsdb.sqlite import EffectsDB, format_ms

__all__ = ["FailureStore", "ToolFailure"]


@dataclass(frozen=True)
class ToolFailure:
    """One failed tool call."""

    tool_started_id: str
    session_id: str
    tool_name: str
    arguments_digest: str
    artifact_version: str | None
    at_ms: int
    result_entry_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "toolStartedId": self.tool_started_id,
            "sessionId": self.session_id,
            "toolName": self.tool_name,
            "argumentsDigest": self.arguments_digest,
            "artifactVersion": self.artifact_version,
            "atMs": self.at_ms,
            "at": format_ms(self.at_ms),
            "resultEntryId": self.result_entry_id,
        }


_COLUMNS: Final = (
    "tool_started_id, session_id, tool_name, arguments_digest, artifact_version, at_ms, "
    "result_entry_id"
)


class FailureStore:
    """Tool failures of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: EffectsDB) -> None:
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
