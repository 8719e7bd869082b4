"""How an agent call ended: :class:`RunResult`, derived from the session's final state.

The loop passes nothing up but the state it leaves behind. :func:`finished_details` reads
the operation the drive finished from the reduced state
(:attr:`~tether.core.state.SessionState.last_finished`: what the ``operationFinished``
recorded) and turns it into the result's status, final text, completion, error and message:

==============================================  =============================================
recorded                                        result
==============================================  =============================================
nothing finished during the drive               ``idle``
``completed`` run with ``finalEntryId``         ``completed``, ``text`` = that entry's content
``failed`` run, error of a stop condition       ``failed``, message ``"<code>: <message>"``
(``repeated_failure``, ``budget_exhausted``)
``failed``, error of a model request            ``failed``, message ``"model request failed
(a :data:`~tether.errors.MODEL_ERROR_CODES`)    (<code>): <message>"``
any other end of a compaction                   message ``"history compacted"``
==============================================  =============================================

``error`` is the recorded ``{"code", "message"}`` of a failed operation (as committed: with
credentials masked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tether.core.gate import CompletionCheck
from tether.core.kinds import Usage
from tether.core.records import field, record
from tether.core.stops import BUDGET_EXHAUSTED, REPEATED_FAILURE
from tether.errors import MODEL_ERROR_CODES

if TYPE_CHECKING:
    from tether.core.state import FinishedOperation, SessionState

__all__ = ["FinishedDetails", "RunResult", "RunStatus", "finished_details"]

STOP_CODES: Final = frozenset({REPEATED_FAILURE, BUDGET_EXHAUSTED})
"""Error codes of the stop conditions that end a run ``failed`` (:mod:`tether.core.stops`)."""


class RunStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    BLOCKED = "blocked"
    AWAITING_APPROVAL = "awaiting_approval"
    """A call is parked until a person decides (``tether approve``/``deny``)."""
    IDLE = "idle"  # nothing was unfinished and nothing was asked
    STOPPED = "stopped"
    """The caller asked the drive to stop (a worker's ``SIGTERM``): it ended at a durable
    point with the operation unfinished (:meth:`Executor.set_stop_signal`)."""


@record
class RunResult:
    """How an operation ended, with its final text and usage."""

    status: RunStatus
    session_id: str
    session_path: Path
    text: str | None = None
    completion: str | None = None
    error: Mapping[str, str] | None = None
    blocked_reason: str | None = None
    message: str | None = None
    usage: Usage = field(default_factory=Usage)
    session_usage: Usage = field(default_factory=Usage)
    verification: CompletionCheck | None = None
    """The completion gate's verdict, for a completed run that changed files."""
    follow_ups: int = 0
    """Follow-up runs started to get the work verified (``require_verified``)."""
    require_verified: bool = False
    parked_call: int | None = None
    """The id of the call parked for approval (status ``awaiting_approval``)."""
    session_cost_usd: float | None = None
    """What the whole session cost so far in US dollars (``None``: unknown, some tokens
    have neither a reported cost nor a price; :mod:`tether._runtime.spend`)."""

    @property
    def resume_command(self) -> str:
        return f"tether resume {self.session_id}"

    @property
    def unverified(self) -> bool:
        """Verification was required, the run completed, and it is still not verified."""
        return (
            self.require_verified
            and self.status is RunStatus.COMPLETED
            and self.verification is not None
            and not self.verification.verified
        )

    def to_json(self) -> str:
        """The result as JSON text (:meth:`to_dict` serialized)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict with camelCase members."""
        return {
            "status": self.status.value,
            "sessionId": self.session_id,
            "sessionPath": str(self.session_path),
            "text": self.text,
            "completion": self.completion,
            "error": dict(self.error) if self.error is not None else None,
            "blockedReason": self.blocked_reason,
            "message": self.message,
            "usage": self.usage.to_json(),
            "sessionUsage": self.session_usage.to_json(),
            "verification": (
                self.verification.to_json() if self.verification is not None else None
            ),
            "followUps": self.follow_ups,
            "unverified": self.unverified,
            "parkedCall": self.parked_call,
            "sessionCostUsd": self.session_cost_usd,
        }


@record
class FinishedDetails:
    """The part of a :class:`RunResult` that says how the operation ended."""

    status: RunStatus = RunStatus.IDLE
    text: str | None = None
    completion: str | None = None
    error: Mapping[str, str] | None = None
    message: str | None = None


_IDLE: Final = FinishedDetails()


def finished_details(state: SessionState, before: FinishedOperation | None) -> FinishedDetails:
    """How the drive ended, from ``state``; ``before`` is what had finished when it began
    (the same operation still: nothing finished during the drive → ``idle``)."""
    finished = state.last_finished
    if finished is None or (before is not None and finished.operation_id == before.operation_id):
        return _IDLE  # an operation finishes once: the same id is the same finish
    error = dict(finished.error) if finished.error is not None else None
    code = error.get("code", "") if error is not None else ""
    why = error.get("message", "") if error is not None else ""
    message: str | None = None
    if finished.outcome == "failed" and finished.kind == "run" and code in STOP_CODES:
        message = f"{code}: {why}"
    elif finished.outcome == "failed" and code in MODEL_ERROR_CODES:
        message = f"model request failed ({code}): {why}"
    elif finished.kind == "compaction":
        message = "history compacted"
    text: str | None = None
    if finished.kind == "run" and finished.final_entry_id is not None:
        text = _content_of(state, finished.final_entry_id)
    return FinishedDetails(RunStatus(finished.outcome), text, finished.completion, error, message)


def _content_of(state: SessionState, entry_id: str) -> str | None:
    ids = state.transcript_ids
    for position in range(len(ids) - 1, -1, -1):
        if ids[position] == entry_id:
            content: str | None = state.transcript[position]["content"]
            return content
    return None
