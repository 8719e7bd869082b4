"""The rules every workspace-database implementation keeps, in one place: the SQLite tables
(:mod:`tether._wsdb.sqlite_journal`, ...) and :mod:`tether._wsdb.memory` call these, so the two
cannot drift (an operation id names one call; summaries are truncated alike; review evidence
is JSON with sorted keys; a verification's id and status are made the same way)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from tether._ids import new_uuid7
from tether.core.values import CheckOutcome, JournalRow, Verification, verification_status
from tether.errors import OperationIdConflict, ReviewItemNotFound

__all__ = [
    "BEFORE_KIND",
    "SUMMARY_LIMIT",
    "check_same_call",
    "check_session",
    "dumps_evidence",
    "loads_evidence",
    "new_verification",
    "parse_item_id",
    "truncate_summary",
]

BEFORE_KIND: Final = "before"
"""Evidence kind of a file's content before a journaled change (what ``tether rewind``
restores)."""


def check_same_call(
    row: JournalRow, session_id: str, digest: str, where: str, tool_name: str = ""
) -> None:
    """:class:`~tether.errors.OperationIdConflict` unless ``row`` is the same call: the same
    session, tool and arguments digest (an operation id names one call, forever)."""
    check_session(row, session_id, where)
    if row.tool_name and tool_name and row.tool_name != tool_name:
        raise OperationIdConflict(
            row.operation_id, f"tool {row.tool_name}", f"tool {tool_name}", where
        )
    if row.arguments_digest != digest:
        raise OperationIdConflict(row.operation_id, row.arguments_digest, digest, where)


def check_session(row: JournalRow, session_id: str, where: str) -> None:
    if row.session_id != session_id:
        raise OperationIdConflict(
            row.operation_id, f"session {row.session_id}", f"session {session_id}", where
        )


def dumps_evidence(value: Mapping[str, Any]) -> str:
    return json.dumps(
        dict(value), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )


def loads_evidence(text: str) -> Mapping[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return MappingProxyType({"unparsable": text})
    return MappingProxyType(value if isinstance(value, dict) else {"value": value})


def parse_item_id(item_id: int | str) -> int:
    if isinstance(item_id, bool):
        raise ReviewItemNotFound(item_id)
    if isinstance(item_id, int):
        return item_id
    text = str(item_id).strip().lstrip("#")
    if not text.isdigit():
        raise ReviewItemNotFound(item_id)
    return int(text)


SUMMARY_LIMIT: Final = 500
"""Summaries longer than this many characters are truncated (ending in ``…``)."""


def truncate_summary(summary: str) -> str:
    if len(summary) <= SUMMARY_LIMIT:
        return summary
    return summary[: SUMMARY_LIMIT - 1] + "…"


def new_verification(
    outcome: CheckOutcome, *, session_id: str | None, tool_started_id: str | None
) -> Verification:
    """The verification to record for one check run (a new id; the status from the facts)."""
    return Verification(
        id=new_uuid7(),
        session_id=session_id,
        tool_started_id=tool_started_id,
        command=outcome.command,
        exit_status=outcome.exit_status,
        timed_out=outcome.timed_out,
        error=outcome.error,
        output_digest=outcome.output_digest,
        output_tail=outcome.output_tail,
        version_start=outcome.version_start,
        version_end=outcome.version_end,
        started_at_ms=outcome.started_at_ms,
        duration_ms=outcome.duration_ms,
        status=verification_status(
            outcome.exit_status,
            outcome.timed_out,
            outcome.error,
            outcome.version_start,
            outcome.version_end,
        ),
    )
