"""Honest automatic retry of transient provider failures.

Nothing is hidden in the adapter: a failed request closes its attempt as the spec says
(``stepFailed``, the run finishes ``failed``). Then, within the configured number of retries
and after a backoff, the executor starts a **new run on the same input entry** (spec 8.1
allows any earlier user entry). Every physical request is an attempt in the log, the budget
and usage count them, and the spec's per-step attempt cap is never stretched.

The schedule is durable: a sidecar record ``retry`` beside the session names the failed
operation, the input entry, the retry number, the reason and when the retry is due (wall
clock). A process that dies while waiting leaves it behind, and ``tether resume`` (or the
next ``tether run`` on the session, before its new prompt) continues the schedule: waits out
what is left, then starts the retry. The record is only acted on while the log's last
finished operation is the failed one it names and the session is idle, so it can never
start a second retry for one failure nor retry anything else. The due time is the injected
clock's wall time and the wait is the clock's (:mod:`tether._clock`), cut short by
``abort()``: a test's fake clock records the backoff asked and lets it pass at once.

Transient: HTTP 429, 5xx (and 408/409), connection errors (refused, reset, a stream cut
short) and a timeout before the first byte. Permanent — never retried: 400, 401, 403, 404,
a malformed answer, an idle timeout mid-stream, an abort.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from tether._clock import Clock
from tether.core.records import record
from tether.errors import ModelError

if TYPE_CHECKING:
    from tether._runtime.retry_record import RetryRecord as RetryRecord
    from tether._stores.protocol import SessionStoreProtocol
    from tether.core.state import RunOperation

__all__ = [
    "MAX_DELAY",
    "REASONS",
    "RetryPolicy",
    "RetryRecord",
    "RetrySchedule",
    "backoff",
    "is_transient",
    "read_record",
    "write_record",
]

SIDECAR: Final = "retry"
MAX_DELAY: Final = 600.0
"""Longest wait tether accepts; a provider asking for more is not retried."""

REASONS: Final = {
    "rate_limited": "rate limit",
    "provider_error": "server error",
    "connection": "connection error",
    "timeout": "timeout",
}


def __getattr__(name: str) -> Any:
    # The durable schedule's record is a failed run's, not an agent's: its class lives in
    # tether._runtime.retry_record, loaded on first use (PEP 562), so building an agent
    # (which takes its RetryPolicy from here) does not create it.
    if name == "RetryRecord":
        from tether._runtime.retry_record import RetryRecord

        return RetryRecord
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@record(slots=True)
class RetryPolicy:
    """``retries`` new runs at most per input entry; delays ``base * 2**(n-1)`` (capped),
    or the provider's Retry-After when it says more."""

    retries: int = 0
    base_delay: float = 1.0
    max_backoff: float = 60.0


def is_transient(exc: ModelError) -> bool:
    code = exc.code
    if code in ("rate_limited", "connection"):
        return True
    if code == "timeout":
        return "idle timeout" not in exc.message
    if code == "provider_error":
        status = exc.status
        return status is not None and (status >= 500 or status in (408, 409))
    return False


def backoff(policy: RetryPolicy, retry: int, retry_after: float | None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based)."""
    delay = float(min(policy.base_delay * (2.0 ** (retry - 1)), policy.max_backoff))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def read_record(store: SessionStoreProtocol) -> RetryRecord | None:
    data, _why = store.sidecar(SIDECAR).read()
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    from tether._runtime.retry_record import RetryRecord  # see __getattr__

    return RetryRecord.from_json(value) if isinstance(value, Mapping) else None


def write_record(store: SessionStoreProtocol, record: RetryRecord) -> None:
    store.sidecar(SIDECAR).write(json.dumps(record.to_json()).encode())


def describe(entry: Mapping[str, Any]) -> str:
    """``retried after rate limit (2 s)`` for one history item."""
    reason = REASONS.get(str(entry.get("reason")), str(entry.get("reason")))
    delay = entry.get("delaySeconds")
    shown = f"{delay:g} s" if isinstance(delay, (int, float)) else "?"
    return f"retried after {reason} ({shown})"


class RetrySchedule:
    """The executor's view of the durable schedule: which retry is due, and writing the
    next one after a transient failure closed a run (the executor starts the runs)."""

    def __init__(self, clock: Clock, policy: RetryPolicy | None = None) -> None:
        self.clock = clock
        self.policy = policy if policy is not None else RetryPolicy()
        """Read at each use, never copied: ``Agent`` sets it after building the executor."""

    def pending(self, store: SessionStoreProtocol) -> RetryRecord | None:
        """The durable retry schedule, if it still applies to this log."""
        if self.policy.retries <= 0:
            return None
        # Imported here: the state's classes are a session's (loaded with it), not an agent's.
        from tether.core.state import IdleOperation

        state = store.state
        last = state.last_finished
        # Narrowing, not dispatch: only an idle session can start a retry run.
        if not isinstance(state.operation, IdleOperation) or last is None:
            return None
        if last.outcome != "failed" or last.kind != "run":
            return None
        record = read_record(store)
        if record is None or record.exhausted or record.failed_operation_id != last.operation_id:
            return None
        if record.retry > self.policy.retries:
            return None
        return record

    def schedule(
        self, store: SessionStoreProtocol, operation: RunOperation, exc: ModelError
    ) -> None:
        """After a transient failure closed the run: write the durable retry schedule."""
        policy = self.policy
        if policy.retries <= 0 or not is_transient(exc):
            return
        prior = read_record(store)
        number: int = 1
        history: tuple[Mapping[str, Any], ...] = ()
        if (
            prior is not None
            and prior.input_entry_id == operation.input_entry_id
            and prior.started_operation_id == operation.operation_id
        ):
            number, history = prior.retry + 1, prior.history
        delay = backoff(policy, number, exc.retry_after)
        exhausted = number > policy.retries or delay > MAX_DELAY
        from tether._runtime.retry_record import RetryRecord  # see __getattr__

        record = RetryRecord(
            input_entry_id=operation.input_entry_id,
            failed_operation_id=operation.operation_id,
            retry=number,
            reason=exc.code,
            delay=delay,
            due_at_ms=self.clock.now_ms() + int(delay * 1000),
            exhausted=exhausted,
            history=history,
        )
        try:
            write_record(store, record)
        except OSError:
            return  # no durable schedule, no retry
