"""The durable retry schedule's record (the ``retry`` side record of a session): which
retry of which input is due when, and the history of those made.

It is :mod:`tether._runtime.retry`'s name (import it from there or from here): it lives in a
module of its own so that building an agent, which takes its ``RetryPolicy`` from that
module, does not create its class; a failed run's schedule loads it (start-up,
``bench/README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RetryRecord"]


@dataclass(frozen=True, slots=True)
class RetryRecord:
    input_entry_id: str
    failed_operation_id: str
    retry: int
    """Number of the retry this record schedules (1 = the first)."""
    reason: str
    delay: float
    due_at_ms: int
    exhausted: bool = False
    """No retry is scheduled: the retries are used up (kept for ``inspect``)."""
    started_operation_id: str | None = None
    history: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "inputEntryId": self.input_entry_id,
            "failedOperationId": self.failed_operation_id,
            "retry": self.retry,
            "reason": self.reason,
            "delaySeconds": self.delay,
            "dueAt": self.due_at_ms,
            "exhausted": self.exhausted,
            "startedOperationId": self.started_operation_id,
            "history": [dict(h) for h in self.history],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetryRecord | None:
        try:
            history = data.get("history") or []
            return cls(
                input_entry_id=str(data["inputEntryId"]),
                failed_operation_id=str(data["failedOperationId"]),
                retry=int(data["retry"]),
                reason=str(data["reason"]),
                delay=float(data["delaySeconds"]),
                due_at_ms=int(data["dueAt"]),
                exhausted=bool(data.get("exhausted", False)),
                started_operation_id=(
                    str(data["startedOperationId"]) if data.get("startedOperationId") else None
                ),
                history=tuple(h for h in history if isinstance(h, Mapping)),
            )
        except (KeyError, TypeError, ValueError):
            return None
