"""What the executor's plan families share: one drive's working memory and the shell.

The executor (:mod:`tether._runtime.executor`) carries plans out through three families of
handlers, each a small class built from the parts it names in its ``__init__`` (composition,
not inheritance, so what a family can touch is visible where it is built):

* model steps — :class:`~tether._runtime.model_steps.ModelSteps`;
* tool calls — :class:`~tether._runtime.tool_calls.ToolCalls`;
* outcomes, stops and reconciliation — :class:`~tether._runtime.recovery.Recovery`.

Rules of this module:

* :class:`Drive` lives only while one drive runs (mutable working memory, never persisted):
  everything that must survive a crash is committed to the store;
* :class:`Shell` reads nothing of the outside world itself: the clock, the ids and the event
  sink are the :class:`~tether._runtime.compose.Composition`'s;
* nothing here decides by a plan's type: that is the executor's one table
  (:data:`tether._runtime.executor.PLANS`).
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import Any

import tether._runtime.events as events
from tether._clock import WakingEvent
from tether._runtime.compose import Composition
from tether._runtime.results import RunResult, RunStatus
from tether._stores.protocol import SessionStoreProtocol
from tether.core.records import record
from tether.core.state import FinishedOperation, RunOperation, SessionState, Usage
from tether.core.stops import StopError

__all__ = ["Drive", "NewWork", "Shell", "running"]


class NewWork(Enum):
    """What a plan starts that the budget counts (retries and replays are not new work)."""

    NONE = "none"
    STEP = "step"
    TOOL_CALL = "toolCall"


@record(frozen=False, slots=True)
class Drive:
    """The loop's working memory for one drive of one session (not state: it lives only
    while the loop runs, so it is mutable)."""

    store: SessionStoreProtocol
    usage_before: Usage
    always_gate: bool
    run_input: str | None
    """The user entry of the run being driven (stop conditions and the gate apply), else
    ``None`` (a compaction)."""
    began: float
    deadline: float | None
    finished_before: FinishedOperation | None
    """What had finished when the drive began: the result reports a later finish only."""
    pending_stop: StopError | None = None
    """A ``repeated_failure`` the last tool call noted, applied before the next plan."""


class Shell:
    """What every family needs of the executor: the parts, ids, events, the caller's abort
    and stop requests, and the form of a result."""

    def __init__(self, parts: Composition) -> None:
        self.parts = parts
        self.clock = parts.clock
        self.ids = parts.ids
        self.cancel = WakingEvent()
        """``abort()`` was asked: recorded as ``abortRequested``, cleared after each call."""
        # The caller's request to stop at the next durable point (set_stop_signal): unlike
        # cancel it records nothing and is never cleared here (it belongs to the caller).
        self.stop_signal: threading.Event | None = None
        self._on_event = parts.on_event

    def emit(self, event: events.Event) -> None:
        if self._on_event is not None:
            self._on_event(event)

    @property
    def listened(self) -> bool:
        """Whether anyone receives events: without a listener, a model's streamed deltas
        are not asked for (each would wake the waiting session for nothing)."""
        return self._on_event is not None

    def stopping(self) -> bool:
        signal = self.stop_signal
        return signal is not None and signal.is_set()

    def result(
        self,
        store: SessionStoreProtocol,
        status: RunStatus,
        *,
        usage_before: Usage | None = None,
        **details: Any,
    ) -> RunResult:
        state = store.state
        usage = state.usage
        cost = self.parts.spending.cost(store, state, start=0, usage=usage)
        return RunResult(
            status=status,
            session_id=store.session_id,
            session_path=store.path,
            usage=usage - usage_before if usage_before is not None else Usage(),
            session_usage=usage,
            require_verified=self.parts.require_verified,
            session_cost_usd=cost.to_json(),
            **details,
        )


def running(state: SessionState) -> RunOperation:
    """The active run (its callers hold a plan only a run can have)."""
    operation = state.operation
    assert isinstance(operation, RunOperation)
    return operation
