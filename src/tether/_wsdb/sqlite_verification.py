"""Verifications and artifact manifests in SQLite (tables ``verifications``,
``artifact_manifests``): :class:`VerificationStore` (what they mean:
:mod:`tether._completion.evidence`)."""

from __future__ import annotations

import builtins
from typing import Any, Final

from tether._wsdb.rules import new_verification
from tether._wsdb.sqlite_handle import SQLiteDatabase
from tether.core.values import CheckOutcome, Verification, VerificationStatus

_COLUMNS: Final = (
    "id, session_id, tool_started_id, command, exit_status, timed_out, error, output_digest, "
    "output_tail, version_start, version_end, started_at_ms, duration_ms, status"
)


def _row(row: Any) -> Verification:
    exit_status = row["exit_status"]
    return Verification(
        id=row["id"],
        session_id=row["session_id"],
        tool_started_id=row["tool_started_id"],
        command=row["command"],
        exit_status=None if exit_status is None else int(exit_status),
        timed_out=bool(row["timed_out"]),
        error=row["error"],
        output_digest=row["output_digest"],
        output_tail=row["output_tail"],
        version_start=row["version_start"],
        version_end=row["version_end"],
        started_at_ms=int(row["started_at_ms"]),
        duration_ms=int(row["duration_ms"]),
        status=VerificationStatus(row["status"]),
    )


class VerificationStore:
    """Verifications and artifact manifests of an :class:`~tether._wsdb.sqlite.EffectsDB`."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

    def record(
        self,
        *,
        session_id: str | None,
        tool_started_id: str | None,
        outcome: CheckOutcome,
        manifest: tuple[str, bytes] | None = None,
    ) -> Verification:
        """Record one check run (and optionally the manifest ``(version, bytes)`` of its
        starting version) in one transaction, durable before it returns."""
        verification = new_verification(
            outcome, session_id=session_id, tool_started_id=tool_started_id
        )
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO verifications ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    verification.id,
                    verification.session_id,
                    verification.tool_started_id,
                    verification.command,
                    verification.exit_status,
                    int(verification.timed_out),
                    verification.error,
                    verification.output_digest,
                    verification.output_tail,
                    verification.version_start,
                    verification.version_end,
                    verification.started_at_ms,
                    verification.duration_ms,
                    verification.status.value,
                ),
            )
            if manifest is not None:
                version, data = manifest
                conn.execute(
                    "INSERT OR IGNORE INTO artifact_manifests (version, manifest, created_at_ms) "
                    "VALUES (?,?,?)",
                    (version, bytes(data), now),
                )
        return verification

    def get(self, verification_id: str) -> Verification | None:
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM verifications WHERE id = ?", (verification_id,)
        )
        return None if found is None else _row(found)

    def by_tool_started_id(self, tool_started_id: str) -> Verification | None:
        """The verification recorded by that verify tool call (the newest if several)."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM verifications WHERE tool_started_id = ? "
            "ORDER BY started_at_ms DESC, id DESC LIMIT 1",
            (tool_started_id,),
        )
        return None if found is None else _row(found)

    def latest(self) -> Verification | None:
        """The newest verification (by start time, then id), whatever its status."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM verifications ORDER BY started_at_ms DESC, id DESC LIMIT 1"
        )
        return None if found is None else _row(found)

    def latest_passing(self) -> Verification | None:
        """The newest verification with status ``passed``."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM verifications WHERE status = 'passed' "
            "ORDER BY started_at_ms DESC, id DESC LIMIT 1"
        )
        return None if found is None else _row(found)

    def latest_conclusive(self, version: str) -> Verification | None:
        """The newest verification that started at artifact version ``version`` and is not
        ``void`` (``passed``, ``failed`` or ``error``)."""
        found = self.db.query_one(
            f"SELECT {_COLUMNS} FROM verifications WHERE version_start = ? "
            "AND status IN ('passed','failed','error') "
            "ORDER BY started_at_ms DESC, id DESC LIMIT 1",
            (version,),
        )
        return None if found is None else _row(found)

    def list(self, limit: int = 20) -> builtins.list[Verification]:
        """The newest ``limit`` verifications, newest first."""
        rows = self.db.query(
            f"SELECT {_COLUMNS} FROM verifications ORDER BY started_at_ms DESC, id DESC LIMIT ?",
            (max(0, int(limit)),),
        )
        return [_row(row) for row in rows]

    # ------------------------------------------------------------------ manifests

    def save_manifest(self, version: str, manifest: bytes) -> None:
        """Keep the manifest of ``version`` (written once: a later save is ignored)."""
        now = self.db.now_ms()
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO artifact_manifests (version, manifest, created_at_ms) "
                "VALUES (?,?,?)",
                (version, bytes(manifest), now),
            )

    def manifest(self, version: str) -> bytes | None:
        found = self.db.query_one(
            "SELECT manifest FROM artifact_manifests WHERE version = ?", (version,)
        )
        return None if found is None else bytes(found["manifest"])
