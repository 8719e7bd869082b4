"""The executor: the loop that carries out recovery plans, as a table.

One loop serves a fresh run and a resume alike: take the reduced state the store keeps, ask
:func:`plan_recovery` for the next action, carry out exactly that action with the handler
:data:`HANDLERS` names for its plan type, commit exactly the facts the spec requires
(section 15), repeat until the session is idle or recovery is blocked. Every intent is
durable before it acts: the ``stepAttempt`` before the provider request, the
``toolStarted`` before the tool, and for a journaled file change the journal's intent
before the ``toolStarted``. The session is bound to the workspace database before its first
evidence, so recovery can tell a lost or replaced database from "nothing happened"
(:mod:`tether._effects.binding`).

The executor reads nothing of the outside world itself: the composition root
(:mod:`tether._runtime.compose`) hands it the clock, the id source, the session-store and
workspace-database openers, the tools, the guards and the configuration. It is typed
against the seams only (:mod:`tether._stores.protocol`, :mod:`tether._wsdb.protocol`). How a
call runs and how its pending state is recovered follows from the tool's declared
:class:`~tether._tools.base.RecoveryKind` (:data:`tether._runtime.runners.RUNNERS`), never
from its class or name.
The result of a call is derived from the final state (:mod:`tether._runtime.results`).
A caller's stop signal (:meth:`Executor.set_stop_signal`, a worker's ``SIGTERM``) ends a
drive between two handlers, a durable point, with the operation left unfinished.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Final, Self

import tether._faults as faults
import tether._runtime.boundaries as boundaries
import tether._runtime.events as events
from tether._effects.journal import PreparedChange
from tether._effects.recovery import RecoveryAction, reconcile_pending
from tether._models.base import ModelRequest, ModelResponse, call_model
from tether._runtime.compose import Composition
from tether._runtime.guards import ParkedCall, follow_up_prompt, is_failure, run_range
from tether._runtime.masking import mask_commits
from tether._runtime.results import RunResult, RunStatus, finished_details
from tether._runtime.retry import (
    MAX_DELAY,
    REASONS,
    RetryRecord,
    backoff,
    is_transient,
    read_record,
    write_record,
)
from tether._runtime.runners import RUNNERS, CallSite
from tether._stores.protocol import SessionOpener, SessionStoreProtocol
from tether._stores.reasoning import (
    align_context_ids,
    read_side_record,
    wants_side_record,
    write_side_record,
)
from tether._tools.base import RecoveryKind, Rejection, Tool, ToolContext
from tether.core import facts
from tether.core.canonical import source_digest
from tether.core.compaction import COMPACTION_INSTRUCTION, COMPACTION_SYSTEM_PROMPT, plan_split
from tether.core.configuration import explain_blocked
from tether.core.gate import CompletionCheck
from tether.core.planner import plan_recovery, unanswered_calls
from tether.core.plans import (
    ABORTED_ERROR,
    AppendSynthetic,
    AwaitReview,
    Blocked,
    CloseAttempt,
    CompleteTool,
    Finish,
    Observations,
    Plan,
    StartStep,
    StartTool,
    SyntheticReason,
    SyntheticResult,
    ToolMode,
)
from tether.core.state import (
    CompactionOperation,
    FinishedOperation,
    IdleOperation,
    RunOperation,
    SessionState,
    StepKind,
    ToolCallState,
    ToolStatus,
    Usage,
)
from tether.core.stops import StopError, budget_exhausted
from tether.errors import ConfigurationError, ModelError, SessionBusy

__all__ = ["HANDLERS", "MAX_FOLLOW_UPS", "Executor", "RunResult", "RunStatus"]

MAX_FOLLOW_UPS: Final = 2
"""Follow-up runs ``require_verified`` starts at most, asking the model to verify."""


@dataclass(slots=True)
class _Drive:
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


class Executor:
    """Runs, resumes and compacts sessions: the loop over a :class:`Composition`."""

    def __init__(self, parts: Composition) -> None:
        self.parts = parts
        # Read by the CLI, the crash lab and tests.
        self.workspace = parts.workspace
        self.model = parts.model
        self.project = parts.project
        self.budget = parts.budget
        self.require_verified = parts.require_verified
        self.registry = parts.registry
        self.system_prompt = parts.system_prompt
        self.durability = parts.durability
        self.output_options = parts.output_options
        self.sessions_dir = parts.sessions_dir
        self.protected = parts.protected
        self.tool_timeout = parts.tool_timeout
        self.environment = parts.environment
        self.configuration = parts.configuration
        self.masker = parts.masker
        self._guards = parts.guards
        self._evidence = parts.evidence
        self._calls = CallSite(parts.workspace, parts.protected, parts.evidence)
        self._clock = parts.clock
        self._ids = parts.ids
        self._on_event = parts.on_event
        self._cancel = threading.Event()
        # The caller's request to stop at the next durable point (set_stop_signal): unlike
        # _cancel it records nothing and is never cleared here (it belongs to the caller).
        self._stop_signal: threading.Event | None = None
        self._last_session: str | None = None
        self._side_cache: dict[tuple[str, str], Any] = {}
        # Whether a held session has any reasoning side record: most have none, and then a
        # request needs no walk over the whole context to find them (see _side_reasoning).
        self._has_side: dict[str, bool] = {}
        self.retry_policy = parts.retry_policy
        """Automatic retries of transient provider failures (:mod:`tether._runtime.retry`)."""
        # The session held open across calls (its lock held, its state kept by the store
        # incrementally), so a call on it costs no open, read or reduce (see _open).
        self._held: SessionStoreProtocol | None = None

    # ------------------------------------------------------------------ public API

    def run(self, prompt: str, *, session: str | None = None) -> RunResult:
        """Accept ``prompt`` as a new run (in a new session unless ``session`` is given).

        With ``require_verified``, a run that changed files and completed without fresh
        passing evidence is followed by up to :data:`MAX_FOLLOW_UPS` runs in the same
        session asking the model to verify; :attr:`RunResult.unverified` says whether it
        is still unverified after them.
        """
        if not prompt or not prompt.strip():
            raise ConfigurationError("the prompt is empty")
        result = self._run_once(prompt, session)
        return self._follow_up(result)

    def retry(self, session: str) -> RunResult:
        """Start a new run on the input entry of the session's failed (or aborted) last run:
        the prompt is not appended again (spec 8.1 allows any earlier user entry)."""
        with self._open(session) as store, self._abortable():
            state = store.state
            finished = state.last_finished
            if not isinstance(state.operation, IdleOperation):
                raise ConfigurationError(
                    f"session {store.session_id} has unfinished work: finish it with "
                    f"`tether resume {store.session_id}` (or abort it with --abort) first"
                )
            if finished is None or finished.kind != "run" or finished.outcome == "completed":
                what = "no run" if finished is None else f"a {finished.outcome} {finished.kind}"
                raise ConfigurationError(
                    f"nothing to retry: the last operation of session {store.session_id} is "
                    f"{what}; retry takes a session whose last run failed or was aborted"
                )
            users = [
                entry_id
                for entry_id, message in zip(state.transcript_ids, state.transcript, strict=True)
                if message.get("role") == "user"
            ]
            if not users:
                raise ConfigurationError(f"session {store.session_id} has no prompt to retry")
            self._evidence.rebind_if_lost(store)
            before = state.usage
            store.commit([facts.run_started(operation_id=self._ids(), input_entry_id=users[-1])])
            faults.hit(boundaries.RUN_ACCEPTED)
            result = self._drive(store, usage_before=before)
        return self._follow_up(result)

    def resume(self, session: str, *, abort: bool = False) -> RunResult:
        """Continue the session's unfinished operation exactly as the planner says.

        With ``abort=True`` an unfinished operation is aborted durably instead: the
        open attempt is closed as aborted, started tools whose outcome is unknown
        become ``interrupted``, queued calls ``aborted``; nothing is re-executed.
        """
        with self._open(session) as store, self._abortable():
            if abort:
                self._request_abort(store, store.state)
            result = self._drive(store)
            if not abort:
                result = self._continue_retries(store, result)
        return result if abort else self._follow_up(result)

    def compact(self, session: str, *, keep_turns: int = 1) -> RunResult:
        """Summarise the history as its own durable operation, keeping the latest turns."""
        if keep_turns < 1:
            raise ConfigurationError("keep_turns must be at least 1")
        with self._open(session) as store, self._abortable():
            blocked = self._settle_unfinished(store)
            if blocked is not None:
                return blocked
            state = store.state
            split = plan_split(state.transcript, state.transcript_ids, keep_turns)
            if split is None or state.context_boundary != state.transcript_ids[-1]:
                return self._result(
                    store, RunStatus.IDLE, message="nothing to compact: too few complete turns"
                )
            compacted, retained = split
            ids = state.transcript_ids
            assert state.context_boundary is not None  # a split needs complete turns
            store.commit(
                [
                    facts.compaction_started(
                        operation_id=self._ids(),
                        input_through_entry_id=state.context_boundary,
                        result_entry_id=self._ids(),
                        compacted_entry_ids=compacted,
                        retained_entry_ids=retained,
                        source_digest=source_digest(zip(ids, state.transcript, strict=True)),
                    )
                ],
                sync=False,
            )
            faults.hit(boundaries.RUN_ACCEPTED)
            return self._drive(store, usage_before=state.usage)

    def abort(self) -> None:
        """Ask the running operation to stop (thread-safe; e.g. from a SIGINT handler)."""
        self._cancel.set()

    def set_stop_signal(self, signal: threading.Event | None) -> None:
        """Stop drives at a durable point once ``signal`` is set (``None``: never).

        The executor checks it between steps: after a model request's answer or a tool
        call's result is committed, before the next plan is carried out. A drive that sees
        it set ends there with status ``stopped``; nothing is recorded (no abort), so the
        operation stays unfinished and a later ``resume`` (another worker) continues it
        exactly as after a crash at that point. A retry the schedule asks for is not
        started (the schedule stays for ``resume``) and no follow-up run begins. What a
        worker asks on ``SIGTERM`` (:mod:`tether._runtime.worker`).
        """
        self._stop_signal = signal

    def _stopping(self) -> bool:
        signal = self._stop_signal
        return signal is not None and signal.is_set()

    @property
    def last_session(self) -> str | None:
        """The id of the session the last call worked on."""
        return self._last_session

    def close(self) -> None:
        """Release the session this agent holds, close the workspace database and a shared
        store's connections (idempotent; the agent can be used again, it then opens what it
        needs anew)."""
        try:
            self._release()
        finally:
            self._evidence.close()
            owned = self.parts.owned_sessions
            if owned is not None:
                owned.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

    def _run_once(
        self, prompt: str, session: str | None, *, always_gate: bool = False
    ) -> RunResult:
        with self._open(session) as store, self._abortable():
            blocked = self._settle_unfinished(store)
            if blocked is not None:
                return blocked
            self._evidence.rebind_if_lost(store)
            before = store.state.usage
            entry_id = self._ids()
            store.commit(
                [
                    facts.user_entry(entry_id=entry_id, content=prompt),
                    facts.run_started(operation_id=self._ids(), input_entry_id=entry_id),
                ],
                sync=False,
            )
            faults.hit(boundaries.RUN_ACCEPTED)
            result = self._drive(store, usage_before=before, always_gate=always_gate)
            return self._continue_retries(store, result)

    def _continue_retries(self, store: SessionStoreProtocol, result: RunResult) -> RunResult:
        """Start the retries the durable schedule asks for, one after another."""
        usage = result.usage
        while True:
            record = self._retry_pending(store)
            if record is None:
                return replace(result, usage=usage)
            wait = max(record.due_at_ms - self._clock.now_ms(), 0) / 1000.0
            self._emit(
                events.RetryScheduled(
                    reason=REASONS.get(record.reason, record.reason),
                    delay=record.delay,
                    wait=wait,
                    retry=record.retry,
                    retries=self.retry_policy.retries,
                )
            )
            if self._stopping() or (wait > 0 and self._clock.wait(self._cancel, wait)):
                return replace(result, usage=usage)  # the schedule stays for resume
            operation_id = record.started_operation_id or self._ids()
            if record.started_operation_id is None:
                step = {
                    "failedOperationId": record.failed_operation_id,
                    "reason": record.reason,
                    "delaySeconds": record.delay,
                    "retryOperationId": operation_id,
                }
                record = replace(
                    record, started_operation_id=operation_id, history=(*record.history, step)
                )
                write_record(store, record)
            before = store.state.usage
            store.commit(
                [facts.run_started(operation_id=operation_id, input_entry_id=record.input_entry_id)]
            )
            faults.hit(boundaries.RUN_ACCEPTED)
            result = self._drive(store, usage_before=before)
            usage += result.usage

    def _retry_pending(self, store: SessionStoreProtocol) -> RetryRecord | None:
        """The durable retry schedule, if it still applies to this log."""
        if self.retry_policy.retries <= 0:
            return None
        state = store.state
        last = state.last_finished
        if not isinstance(state.operation, IdleOperation) or last is None:
            return None
        if last.outcome != "failed" or last.kind != "run":
            return None
        record = read_record(store)
        if record is None or record.exhausted or record.failed_operation_id != last.operation_id:
            return None
        if record.retry > self.retry_policy.retries:
            return None
        return record

    def _schedule_retry(
        self, store: SessionStoreProtocol, operation: RunOperation, exc: ModelError
    ) -> None:
        """After a transient failure closed the run: write the durable retry schedule."""
        policy = self.retry_policy
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
        record = RetryRecord(
            input_entry_id=operation.input_entry_id,
            failed_operation_id=operation.operation_id,
            retry=number,
            reason=exc.code,
            delay=delay,
            due_at_ms=self._clock.now_ms() + int(delay * 1000),
            exhausted=exhausted,
            history=history,
        )
        try:
            write_record(store, record)
        except OSError:
            return  # no durable schedule, no retry

    def _follow_up(self, result: RunResult) -> RunResult:
        usage = result.usage
        count = 0
        while (
            self.require_verified
            and result.status is RunStatus.COMPLETED
            and result.verification is not None
            and not result.verification.verified
            and count < MAX_FOLLOW_UPS
            and not self._stopping()
        ):
            count += 1
            prompt = follow_up_prompt(result.verification)
            self._emit(events.FollowUpStarted(number=count, prompt=prompt))
            result = self._run_once(prompt, result.session_id, always_gate=True)
            usage += result.usage
        return replace(result, usage=usage, follow_ups=count)

    def _settle_unfinished(self, store: SessionStoreProtocol) -> RunResult | None:
        """Finish what a crash left unfinished before starting something new (one loop
        for runs and resumes); the blocked result if that cannot be done."""
        if isinstance(store.state.operation, IdleOperation):
            return None
        earlier = self._drive(store)
        stopped = (RunStatus.BLOCKED, RunStatus.AWAITING_APPROVAL, RunStatus.STOPPED)
        return earlier if earlier.status in stopped else None

    @contextmanager
    def _abortable(self) -> Iterator[None]:
        """An abort requested before or during the call applies to it; none outlives it."""
        try:
            yield
        finally:
            self._cancel.clear()

    @contextmanager
    def _open(self, session: str | None) -> Iterator[SessionStoreProtocol]:
        """The session this call works on, held open for the calls after it.

        1. reuse the session this agent holds when ``session`` names it (no read, no
           reduce: its state is kept incrementally), else release the held one and open
           (or, ``session=None``, create) the session, and hold it;
        2. the call runs;
        3. the caller is about to be told the outcome: everything committed is made
           durable (``flush``, the last durable point of the call, ``docs/runtime.md``);
        4. on an exception the session is released, so the next call reads back what is
           on disk instead of trusting memory.
        """
        store = self._hold(session)
        try:
            yield store
            store.flush()
        except BaseException:
            self._release()
            raise

    def _hold(self, session: str | None) -> SessionStoreProtocol:
        held = self._held
        reused = (
            held is not None
            and not held.closed
            and session is not None
            and session in (held.session_id, str(held.path))
        )
        if reused:
            assert held is not None
            store = held
        else:
            self._release()
            sessions = self.parts.sessions
            if session is None:
                store = sessions.create(
                    provider=self.model.provider,
                    model=self.model.model,
                    environment_identity=self.environment,
                )
            else:
                store = _open_existing(sessions, session)
            store = mask_commits(store, self.masker)
            self._held = store
            # Read back from disk: what another writer may have left is not known here.
            self._has_side.pop(store.session_id, None)
        self._last_session = store.session_id
        self._emit(
            events.SessionOpened(
                session_id=store.session_id,
                path=str(store.path),
                created=session is None,
                repaired=0 if reused else store.repaired,
            )
        )
        return store

    def _release(self) -> None:
        """Close the held session (its unsynced commits made durable first), if any."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def release(self) -> None:
        """Let go of the held session now (its lock, or a shared store's lease), keeping
        everything else open: what a worker does after each session it drives."""
        self._release()

    @property
    def held_session(self) -> str | None:
        """The id of the session this agent holds open (its writer lock held), if any."""
        held = self._held
        return held.session_id if held is not None and not held.closed else None

    def _emit(self, event: events.Event) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _result(
        self,
        store: SessionStoreProtocol,
        status: RunStatus,
        *,
        usage_before: Usage | None = None,
        **details: Any,
    ) -> RunResult:
        usage = store.state.usage
        return RunResult(
            status=status,
            session_id=store.session_id,
            session_path=store.path,
            usage=usage - usage_before if usage_before is not None else Usage(),
            session_usage=usage,
            require_verified=self.require_verified,
            **details,
        )

    # ------------------------------------------------------------------ the loop

    def _drive(
        self,
        store: SessionStoreProtocol,
        *,
        usage_before: Usage | None = None,
        always_gate: bool = False,
    ) -> RunResult:
        """Carry out plans until the session is idle or recovery is blocked: plan (one
        place, :meth:`_next_plan`), then the handler of the plan's type
        (:data:`HANDLERS`); a handler returns the result when the drive ends."""
        drive = self._begin_drive(store, usage_before, always_gate)
        while True:
            # Every handler returns at a durable point (what it did is committed): the
            # place to honour a stop signal. Not once idle: a finished operation still
            # gets its result (and a completed run its gate) below. Not with a stop
            # condition noted in memory only (a repeated failure): it is committed first,
            # else the next drive would never see it.
            if (
                self._stopping()
                and drive.pending_stop is None
                and not isinstance(store.state.operation, IdleOperation)
            ):
                return self._result(
                    store,
                    RunStatus.STOPPED,
                    usage_before=drive.usage_before,
                    message="stopped at a durable point: the operation is unfinished "
                    f"(`tether resume {store.session_id}` continues it)",
                )
            planned = self._next_plan(drive)
            if planned is None:
                continue  # an abort or a stop was recorded: plan again
            state, plan = planned
            result = HANDLERS[type(plan)](self, drive, state, plan)
            if result is not None:
                return result

    def _begin_drive(
        self, store: SessionStoreProtocol, usage_before: Usage | None, always_gate: bool
    ) -> _Drive:
        self._evidence.attach(store)
        state = store.state
        operation = state.operation
        run_input = operation.input_entry_id if isinstance(operation, RunOperation) else None
        began = self._clock.monotonic()
        seconds = self.budget.max_seconds
        return _Drive(
            store=store,
            usage_before=usage_before if usage_before is not None else state.usage,
            always_gate=always_gate,
            run_input=run_input,
            began=began,
            deadline=began + seconds if run_input is not None and seconds is not None else None,
            finished_before=state.last_finished,
        )

    def _next_plan(self, drive: _Drive) -> tuple[SessionState, Plan] | None:
        """The next plan, or ``None`` when something was recorded instead (plan again).

        1. ``abort()`` was called: ``abortRequested`` is recorded (once);
        2. a ``repeated_failure`` noted by the last tool call ends the run ``failed``;
        3. :func:`plan_recovery`; where it would replay a pending journaled or lookup tool
           or record it ``interrupted``, the tool is reconciled against the truth and the
           planner asked again with that observation (a reviewer's abort is recorded);
        4. an exhausted budget ends the run ``failed`` before a new step or tool call.
        """
        store = drive.store
        state = store.state
        if self._cancel.is_set() and not isinstance(state.operation, IdleOperation):
            self._request_abort(store, state)
            state = store.state
        stop, drive.pending_stop = drive.pending_stop, None
        if stop is not None and _stoppable(state):
            self._fail_operation(drive, state, stop)
            return None
        current = self.configuration.current
        plan: Plan = plan_recovery(state, current)
        observed = self._reconcile(store, state, plan)
        if isinstance(observed, _Aborted):
            return None
        if observed is not None:
            plan = plan_recovery(state, current, observed)
        if drive.run_input is not None and _stoppable(state):
            stop = self._budget_stop(drive, state, plan)
            if stop is not None:
                self._fail_operation(drive, state, stop)
                return None
        return state, plan

    # ------------------------------------------------------------------ finish, block

    def _finish(self, drive: _Drive, state: SessionState, plan: Finish) -> RunResult | None:
        """``finish``: the idle form ends the drive with the result the final state says
        (and, for a completed run that changed files, the completion gate's verdict);
        otherwise commit ``operationFinished``."""
        if plan.is_idle:
            details = finished_details(state, drive.finished_before)
            verification: CompletionCheck | None = None
            run_input = drive.run_input
            if run_input is not None and details.status is RunStatus.COMPLETED:
                gate = drive.always_gate or self._guards.changed_files_in_run(
                    state, run_input, self.registry.get
                )
                if gate:
                    verification = self._assess()
            return self._result(
                drive.store,
                details.status,
                usage_before=drive.usage_before,
                text=details.text,
                completion=details.completion,
                error=details.error,
                message=details.message,
                verification=verification,
            )
        operation = state.operation
        assert not isinstance(operation, IdleOperation)
        # 1. commit operationFinished  2. boundary operation_finished  3. report it
        drive.store.commit(
            [
                facts.operation_finished(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    outcome=plan.outcome.value,
                    completion=plan.completion.value if plan.completion is not None else None,
                    final_entry_id=plan.final_entry_id,
                    error=plan.error.to_json() if plan.error is not None else None,
                )
            ],
            sync=False,
        )
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome=plan.outcome.value))
        return None

    def _blocked(self, drive: _Drive, state: SessionState, plan: Blocked) -> RunResult:
        """``blocked``: append nothing; the result names the reason and the ways out."""
        message = explain_blocked(plan.reason, state, self.configuration)
        self._emit(events.Blocked(reason=plan.reason.value, detail=message))
        return self._result(
            drive.store,
            RunStatus.BLOCKED,
            usage_before=drive.usage_before,
            blocked_reason=plan.reason.value,
            message=message,
        )

    def _await_review(self, drive: _Drive, state: SessionState, plan: AwaitReview) -> RunResult:
        """``awaitReview`` (tether): blocked ``review_required`` until a person decides."""
        message = (
            f"review required: the outcome of {plan.tool_name} (operation "
            f"{plan.tool_started_id}) cannot be established: {plan.reason}. Decide with "
            "`tether review` and `tether review resolve ITEM --applied|--not-applied|--abort`, "
            f"then run `tether resume {drive.store.session_id}`."
        )
        self._emit(events.Blocked(reason="review_required", detail=message))
        return self._result(
            drive.store,
            RunStatus.BLOCKED,
            usage_before=drive.usage_before,
            blocked_reason="review_required",
            message=message,
        )

    # ------------------------------------------------------------------ stops and gate

    def _tool_timeout(self, drive: _Drive) -> float | None:
        """The tool's time bound: ``tool_timeout``, cut to what the time budget has left
        (a tool that runs past the budget is stopped; its result says it timed out)."""
        if drive.deadline is None:
            return self.tool_timeout
        left = max(drive.deadline - self._clock.monotonic(), 0.001)
        return left if self.tool_timeout is None else min(self.tool_timeout, left)

    def _budget_stop(self, drive: _Drive, state: SessionState, plan: Plan) -> StopError | None:
        """``budget_exhausted`` before a new step (steps, tokens, time) or a new tool call
        (tokens, time). Retries and replays after a crash are not new work."""
        budget = self.budget
        if budget.max_steps is None and budget.max_tokens is None and budget.max_seconds is None:
            return None
        assert drive.run_input is not None
        if isinstance(plan, StartStep) and plan.attempt == 1:
            steps = _assistant_steps(state, drive.run_input) if budget.max_steps is not None else 0
        elif isinstance(plan, StartTool) and plan.mode is not ToolMode.REPLAY:
            steps = 0
        else:
            return None
        used = state.usage - drive.usage_before
        return budget_exhausted(
            steps=steps,
            tokens=used.input + used.output,
            elapsed=self._clock.monotonic() - drive.began,
            max_steps=budget.max_steps,
            max_tokens=budget.max_tokens,
            max_seconds=budget.max_seconds,
        )

    def _fail_operation(self, drive: _Drive, state: SessionState, stop: StopError) -> None:
        """End the active run ``failed`` with a stop condition's error.

        Calls of the current step that were not carried out are answered first (``aborted``,
        never run), in the same transaction: the transcript stays legal for the next run
        and no crash can separate the answers from the end of the run.
        """
        operation = state.operation
        assert isinstance(operation, RunOperation)
        answers = self._synthetic_facts(state, unanswered_calls(state))
        answers.append(
            facts.operation_finished(
                operation_id=operation.operation_id,
                operation_kind=operation.kind,
                outcome="failed",
                error=stop.to_json(),
            )
        )
        drive.store.commit(answers, sync=False)
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome="failed"))

    def _assess(self) -> CompletionCheck:
        check = self._guards.assess()
        self._emit(
            events.CompletionChecked(
                status=check.status.value,
                message=check.message,
                changed_files=check.changed_files,
            )
        )
        return check

    def _request_abort(self, store: SessionStoreProtocol, state: SessionState) -> None:
        """Record ``abortRequested`` for the active operation (once)."""
        operation = state.operation
        if isinstance(operation, IdleOperation) or operation.abort_requested:
            return
        pending = _pending_tool(operation) if isinstance(operation, RunOperation) else None
        store.commit(
            [
                facts.abort_requested(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    tool_call_id=pending.tool_call_id if pending is not None else None,
                )
            ],
            sync=False,
        )

    # ------------------------------------------------------------------ reconciliation

    def _reconcile(
        self, store: SessionStoreProtocol, state: SessionState, plan: Plan
    ) -> Observations | _Aborted | None:
        """The truth about a pending started tool, where the spec would replay it or record
        it ``interrupted`` (rule 9), for tools whose effect can be observed (recovery kind
        ``journaledFileChange`` or ``lookupByOperationId``): the journal and file hashes,
        or the service's lookup. Returns the observation to plan with, the :data:`_ABORT`
        marker (a reviewer chose abort; it was recorded), or ``None`` (the spec's answer).
        """
        operation = state.operation
        if not isinstance(operation, RunOperation) or operation.abort_requested:
            return None
        started_id: str | None = None
        if isinstance(plan, StartTool) and plan.mode is ToolMode.REPLAY:
            started_id = plan.tool_started_id
        elif (
            isinstance(plan, AppendSynthetic)
            and len(plan.results) == 1
            and plan.results[0].reason is SyntheticReason.INTERRUPTED
        ):
            started_id = plan.results[0].tool_started_id
        if started_id is None:
            return None
        pending = operation.tool_call(started_id)
        tool = self.registry.get(pending.tool_name)
        if tool is None or tool.recovery is RecoveryKind.NONE:
            return None
        db = self._evidence.db()
        decision, item = reconcile_pending(
            tool,
            started_id,
            store.session_id,
            workspace=self.workspace,
            journal=db.journal,
            reviews=db.reviews,
            arguments=pending.arguments,
            evidence=self._evidence.check(store),
        )
        if decision.action is RecoveryAction.SPEC:
            return None
        self._emit(
            events.ToolReconciled(
                name=pending.tool_name,
                call_id=pending.tool_call_id,
                verdict=decision.verdict,
                action=decision.action.value,
                recovered_from_ledger=decision.recovered_from_ledger,
                review_item=item.id if item is not None else decision.review_item,
            )
        )
        if decision.action is RecoveryAction.ABORT:
            self._request_abort(store, state)
            return _ABORT
        # The planner takes the decision itself (its review reason names the item).
        return Observations({started_id: decision})

    def _complete_tool(self, drive: _Drive, state: SessionState, plan: CompleteTool) -> None:
        """``completeTool`` (tether): the reconciled result entry of a started call."""
        self._commit_result(
            drive.store,
            result_entry_id=plan.result_entry_id,
            step_id=plan.step_id,
            tool_started_id=plan.tool_started_id,
            tool_name=plan.tool_name,
            call_id=plan.tool_call_id,
            content=plan.content,
            is_error=plan.is_error,
        )

    def _commit_result(self, store: SessionStoreProtocol, **entry: Any) -> None:
        """Append a started call's result entry (spec 7.3) and report it."""
        store.commit([facts.started_result_entry(**entry)], sync=False)
        faults.hit(boundaries.AFTER_RESULT)
        self._emit(
            events.ToolFinished(
                name=entry["tool_name"],
                call_id=entry["call_id"],
                is_error=entry["is_error"],
                size=len(entry["content"]),
            )
        )

    # ------------------------------------------------------------------ model steps

    def _start_step(self, drive: _Drive, state: SessionState, plan: StartStep) -> None:
        """``startStep``: one model attempt (docs/runtime.md, "The loop")."""
        store = drive.store
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        # 1. commit stepAttempt (a new step id unless this is attempt 2 of the step)
        step_id = plan.step_id if plan.step_id is not None else self._ids()
        attempt_id = self._ids()
        configuration = self.configuration
        store.commit(
            [
                facts.step_attempt(
                    operation_id=operation.operation_id,
                    step_id=step_id,
                    attempt_id=attempt_id,
                    step_kind=plan.step_kind.value,
                    attempt=plan.attempt,
                    context_through_entry_id=plan.context_through_entry_id,
                    configuration_snapshot=configuration.snapshot,
                    configuration_digest=configuration.digest,
                )
            ]
        )
        # 2. boundary attempt_recorded
        faults.hit(boundaries.ATTEMPT_RECORDED)
        # 3. the request: the active context (plus the instruction of a compaction)
        state = store.state
        compaction = plan.step_kind is StepKind.COMPACTION
        # The context is passed as the state's read-only view, not copied: a copy per step
        # would cost the whole history each step.
        messages: Sequence[Mapping[str, Any]] = state.active_context
        if compaction:
            messages = [*messages, {"role": "user", "content": COMPACTION_INSTRUCTION}]
        request = ModelRequest(
            system_prompt=COMPACTION_SYSTEM_PROMPT if compaction else self.system_prompt,
            messages=messages,
            tools=() if compaction else self.registry.definitions(),
            output_options=self.output_options,
            position=max(state.step_count - 1, 0),
            purpose="compaction" if compaction else "assistant",
            reasoning=self._side_reasoning(store, state, state.active_context),
        )
        self._emit(
            events.ModelStarted(
                operation=operation.kind, attempt=plan.attempt, position=request.position
            )
        )
        # 4. call the model; an error commits [stepFailed, operationFinished failed]
        try:
            response = call_model(self.model, request, cancel=self._cancel, on_delta=self._delta)
        except ModelError as exc:
            self._model_failed(store, state, step_id, attempt_id, exc)
            return
        # 5. boundary response_received
        faults.hit(boundaries.RESPONSE_RECEIVED)
        # 6. commit [assistant entry, usage], or [compaction entry, usage]
        if compaction:
            assert isinstance(operation, CompactionOperation)
            self._settle_compaction(store, state, operation, attempt_id, response)
        else:
            self._settle_assistant(store, operation, step_id, attempt_id, response)

    def _side_reasoning(
        self,
        store: SessionStoreProtocol,
        state: SessionState,
        messages: Sequence[Mapping[str, Any]],
    ) -> list[Any]:
        """The reasoning side records of the assistant messages in ``messages``
        (docs/models.md, "Reasoning side records"); missing ones are ``None``."""
        if self._has_side.get(store.session_id) is False:
            return []  # none on disk when the session was opened, and none written since
        ids = align_context_ids(messages, state.transcript, state.transcript_ids)
        out: list[Any] = []
        for message, entry_id in zip(messages, ids, strict=True):
            record = None
            if entry_id is not None and message.get("role") == "assistant":
                # A record is written before its entry and never changes: cache hits and misses.
                key = (store.session_id, entry_id)
                if key not in self._side_cache:
                    self._side_cache[key] = read_side_record(store, entry_id)
                record = self._side_cache[key]
            out.append(record.reasoning if record is not None else None)
        found = any(r is not None for r in out)
        if not found and len(ids) == len(state.transcript):
            # The whole transcript was looked at (no compaction hides a part): none exists.
            self._has_side[store.session_id] = False
        return out if found else []

    def _delta(self, delta: Any) -> None:
        self._emit(events.ModelDelta(channel=delta.channel, text=delta.text))

    def _model_failed(
        self,
        store: SessionStoreProtocol,
        state: SessionState,
        step_id: str,
        attempt_id: str,
        exc: ModelError,
    ) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        self._emit(events.ModelFailed(code=exc.code, message=exc.message))
        if exc.code == "aborted" and self._cancel.is_set():
            # The planner closes the attempt as aborted and finishes the operation.
            self._request_abort(store, state)
            return
        error = {"code": exc.code, "message": exc.message}
        store.commit(
            [
                facts.step_failed(
                    operation_id=operation.operation_id,
                    step_id=step_id,
                    attempt_id=attempt_id,
                    error=error,
                ),
                facts.operation_finished(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    outcome="failed",
                    error=error,
                ),
            ],
            sync=False,
        )
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome="failed"))
        if isinstance(operation, RunOperation):
            self._schedule_retry(store, operation, exc)

    def _usage_fact(
        self, operation_id: str, response: ModelResponse, attempt_id: str
    ) -> dict[str, Any]:
        return facts.usage(
            operation_id=operation_id, counters=response.usage.to_json(), attempt_id=attempt_id
        )

    def _emit_usage(self, response: ModelResponse) -> None:
        usage = response.usage
        self._emit(
            events.UsageReported(
                input=usage.input,
                output=usage.output,
                cache_read=usage.cache_read,
                cache_write=usage.cache_write,
                reasoning_tokens=response.reasoning_tokens,
                cost=response.cost,
            )
        )

    def _settle_assistant(
        self,
        store: SessionStoreProtocol,
        operation: RunOperation | CompactionOperation,
        step_id: str,
        attempt_id: str,
        response: ModelResponse,
    ) -> None:
        entry = facts.assistant_entry(
            step_id=step_id,
            attempt_id=attempt_id,
            stop_reason=response.stop_reason.value,
            message=response.to_message(),
        )
        if wants_side_record(response):
            # The side record is durable before the entry that owns it (docs/models.md).
            entry["id"] = self._ids()
            self._has_side[store.session_id] = True
            write_side_record(
                store,
                entry_id=entry["id"],
                attempt_id=attempt_id,
                response=response,
                mask=self.masker.text,
            )
        store.commit(
            [entry, self._usage_fact(operation.operation_id, response, attempt_id)], sync=False
        )
        self._emit(
            events.ModelFinished(
                stop_reason=response.stop_reason.value,
                text=response.content,
                tool_calls=len(response.tool_calls),
            )
        )
        self._emit_usage(response)

    def _settle_compaction(
        self,
        store: SessionStoreProtocol,
        state: SessionState,
        operation: CompactionOperation,
        attempt_id: str,
        response: ModelResponse,
    ) -> None:
        through = operation.compacted_through_entry_id
        ids = state.transcript_ids
        end = ids.index(operation.input_through_entry_id) + 1
        if through is None or through not in ids[:end]:
            split = plan_split(state.transcript[:end], ids[:end], 1)
            through = split[0][-1] if split is not None else ids[0]
        start = ids.index(through) + 1
        tail = [
            facts.retained_item(source_entry_id=ids[i], message=state.transcript[i])
            for i in range(start, end)
        ]
        store.commit(
            [
                facts.compaction_entry(
                    entry_id=operation.result_entry_id,
                    operation_id=operation.operation_id,
                    summary=response.content or "",
                    compacted_through_entry_id=through,
                    retained_tail=tail,
                ),
                self._usage_fact(operation.operation_id, response, attempt_id),
            ],
            sync=False,
        )
        self._emit(events.ModelFinished(stop_reason=response.stop_reason.value, text=None))
        self._emit_usage(response)

    def _close_attempt(self, drive: _Drive, state: SessionState, plan: CloseAttempt) -> None:
        """``closeAttempt``: commit ``stepFailed`` with the fixed aborted error."""
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        step = operation.step
        assert step is not None
        drive.store.commit(
            [
                facts.step_failed(
                    operation_id=operation.operation_id,
                    step_id=step.step_id,
                    attempt_id=step.attempt_id,
                    error=ABORTED_ERROR.to_json(),
                )
            ],
            sync=False,
        )

    # ------------------------------------------------------------------ tools

    def _start_tool(self, drive: _Drive, state: SessionState, plan: StartTool) -> RunResult | None:
        """``startTool``: a call started now, or a replay (docs/runtime.md, "The loop")."""
        store = drive.store
        operation = state.operation
        assert isinstance(operation, RunOperation) and operation.step is not None
        call = _assistant_call(state, plan.assistant_entry_id, plan.tool_index)
        if plan.mode is ToolMode.REPLAY:
            # Replay: 1. run again with the recorded arguments (same operation id)
            # → after_effect  2. commit the result entry under the provisioned id
            tool = self.registry.get(plan.tool_name)
            assert tool is not None and plan.tool_started_id is not None  # the replay form
            self._emit(events.ToolStarted(name=plan.tool_name, call_id=call["id"], replay=True))
            started = operation.tool_call(plan.tool_started_id)
            self._execute(drive, tool, dict(plan.arguments), started, None)
            return None
        # 1. validate the arguments (a violation becomes an invalidArguments result)
        earlier = self._evidence.earlier_decision(store, plan.assistant_entry_id)
        validated = self.registry.validate(plan.tool_name, call["function"]["arguments"])
        if isinstance(validated, Rejection):
            store.commit(
                [
                    facts.pre_execution_entry(
                        step_id=operation.step.step_id,
                        assistant_entry_id=plan.assistant_entry_id,
                        tool_index=plan.tool_index,
                        call_id=call["id"],
                        tool_name=plan.tool_name,
                        reason=validated.reason,
                        content=SyntheticReason(validated.reason).content,
                    )
                ],
                sync=False,
            )
            self._emit(
                events.ToolSkipped(name=plan.tool_name, call_id=call["id"], reason=validated.reason)
            )
            return None
        # 2. authorize (boundary authorized when a decision is recorded)
        decided = self._guards.authorize(
            store.session_id,
            plan.assistant_entry_id,
            plan.tool_index,
            validated.tool,
            validated.arguments,
            earlier_decision=earlier,
        )
        if isinstance(decided, ParkedCall):
            return self._park(drive, decided, call["id"])
        authorization, denial = decided
        if authorization is not None:
            self._emit(
                events.ToolAuthorized(
                    name=plan.tool_name,
                    call_id=call["id"],
                    decision="deny" if denial is not None else "allow",
                )
            )
        started_id = self._ids()
        result_id = self._ids()
        intent = [
            facts.tool_started(
                fact_id=started_id,
                operation_id=operation.operation_id,
                step_id=operation.step.step_id,
                assistant_entry_id=plan.assistant_entry_id,
                tool_index=plan.tool_index,
                tool_call_id=call["id"],
                tool_name=plan.tool_name,
                arguments=validated.arguments,
                replay=validated.declaration.replay.value,
                replay_key=validated.declaration.replay_key,
                environment_identity=self.environment,
                result_entry_id=result_id,
            )
        ]
        if denial is not None:
            # A denied call never runs: its intent and its error result are one
            # transaction, so no crash can leave it pending (and replayable).
            intent.append(
                facts.started_result_entry(
                    result_entry_id=result_id,
                    step_id=operation.step.step_id,
                    tool_started_id=started_id,
                    tool_name=plan.tool_name,
                    call_id=call["id"],
                    content=denial,
                    is_error=True,
                )
            )
            store.commit(intent, sync=False)
            person = authorization is not None and authorization.who not in ("policy", "--yes")
            reason = "declined" if person else "denied"
            self._emit(events.ToolSkipped(name=plan.tool_name, call_id=call["id"], reason=reason))
            self._note_failure(drive, started_id, result_id, plan.tool_name, validated.arguments)
            return None
        # 3. what the tool's recovery kind records before toolStarted (a journaled file
        # change: its planned change in the journal, boundary journal.intent_prepared)
        runner = RUNNERS[validated.tool.recovery]
        prepared = runner.prepare(
            self._calls, store, validated.tool, started_id, validated.arguments
        )
        # 4. commit toolStarted → before_effect
        store.commit(intent)
        faults.hit(boundaries.BEFORE_EFFECT)
        started = _running(store.state).tool_call(started_id)
        self._emit(events.ToolStarted(name=plan.tool_name, call_id=call["id"]))
        # 5. run it → after_effect  6. commit the result entry → after_result
        self._execute(drive, validated.tool, validated.arguments, started, prepared)
        return None

    def _park(self, drive: _Drive, parked: ParkedCall, call_id: str) -> RunResult:
        """A call waits for a person: the run stops, its operation stays open (the next
        resume carries the decision out); nothing is appended to the log."""
        message = parked.message()
        self._emit(
            events.ApprovalParked(
                name=parked.tool_name,
                call_id=call_id,
                request_id=parked.request_id,
                summary=parked.summary,
            )
        )
        self._emit(events.Blocked(reason="approval_required", detail=message))
        return self._result(
            drive.store,
            RunStatus.AWAITING_APPROVAL,
            usage_before=drive.usage_before,
            blocked_reason="approval_required",
            message=message,
            parked_call=parked.request_id,
        )

    def _execute(
        self,
        drive: _Drive,
        tool: Tool,
        arguments: Mapping[str, Any],
        started: ToolCallState,
        prepared: PreparedChange | None,
    ) -> None:
        """Run a started call as its recovery kind says, then commit its result."""
        store = drive.store
        # A leased store (PostgreSQL) confirms the lease first: a writer that lost it
        # starts no effect (SessionFenced); its epoch goes to the tool as fencing token.
        check_lease = getattr(store, "check_lease", None)
        if check_lease is not None:
            check_lease()
        token = getattr(store, "fencing_token", None)
        context = ToolContext(
            workspace=self.workspace,
            operation_id=started.tool_started_id,
            cancel=self._cancel,
            timeout=self._tool_timeout(drive),
            session_id=store.session_id,
            protected=self.protected,
            fencing_token=token if isinstance(token, int) else None,
        )
        result = RUNNERS[tool.recovery].run(self._calls, store, tool, arguments, context, prepared)
        faults.hit(boundaries.AFTER_EFFECT)
        if result is None or (self._cancel.is_set() and result.metadata.get("aborted")):
            # The tool was killed by an abort, or its outcome is not known (an effect tool
            # failed and its service cannot say whether the effect committed): leave the
            # call pending; the planner (abort: interrupted) or reconciliation (review)
            # decides. A tool that finished despite an abort keeps its result.
            return
        self._commit_result(
            store,
            result_entry_id=started.result_entry_id,
            step_id=started.step_id,
            tool_started_id=started.tool_started_id,
            tool_name=started.tool_name,
            call_id=started.tool_call_id,
            content=result.content,
            is_error=result.is_error,
        )
        if is_failure(result):
            self._note_failure(
                drive, started.tool_started_id, started.result_entry_id, tool.name, arguments
            )

    def _note_failure(
        self,
        drive: _Drive,
        tool_started_id: str,
        result_entry_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
    ) -> None:
        """Record a failed call; a repeated failure ends the run before the next plan."""
        if drive.run_input is None:
            return
        drive.pending_stop = self._guards.failed_call(
            drive.store.state,
            session_id=drive.store.session_id,
            input_entry_id=drive.run_input,
            tool_started_id=tool_started_id,
            result_entry_id=result_entry_id,
            tool_name=tool_name,
            arguments=arguments,
        )

    # ---- synthetic results

    def _append_synthetic(self, drive: _Drive, state: SessionState, plan: AppendSynthetic) -> None:
        """``appendSynthetic``: one transaction with every synthetic result of the plan."""
        drive.store.commit(self._synthetic_facts(state, plan.results), sync=False)

    def _synthetic_facts(
        self, state: SessionState, results: Sequence[SyntheticResult]
    ) -> list[dict[str, Any]]:
        """The entries of synthetic results (spec 15: interrupted → started form, the
        other reasons → pre-execution form); each is reported as a skipped call."""
        operation = state.operation
        out: list[dict[str, Any]] = []
        if not results:
            return out
        assert isinstance(operation, RunOperation) and operation.step is not None
        for item in results:
            if item.reason is SyntheticReason.INTERRUPTED:
                assert item.tool_started_id is not None and item.result_entry_id is not None
                started = operation.tool_call(item.tool_started_id)
                out.append(
                    facts.interrupted_result_entry(
                        result_entry_id=item.result_entry_id,
                        step_id=started.step_id,
                        tool_started_id=item.tool_started_id,
                        tool_name=item.tool_name,
                        call_id=item.tool_call_id,
                        content=item.content,
                    )
                )
            else:
                out.append(
                    facts.pre_execution_entry(
                        step_id=operation.step.step_id,
                        assistant_entry_id=item.assistant_entry_id,
                        tool_index=item.tool_index,
                        call_id=item.tool_call_id,
                        tool_name=item.tool_name,
                        reason=item.reason.value,
                        content=item.content,
                    )
                )
            self._emit(
                events.ToolSkipped(
                    name=item.tool_name, call_id=item.tool_call_id, reason=item.reason.value
                )
            )
        return out


# ====================================================================== the tables

_Handler = Callable[[Executor, _Drive, SessionState, Any], RunResult | None]

HANDLERS: Final[Mapping[type, _Handler]] = {
    StartStep: Executor._start_step,
    StartTool: Executor._start_tool,
    AppendSynthetic: Executor._append_synthetic,
    CloseAttempt: Executor._close_attempt,
    CompleteTool: Executor._complete_tool,
    Finish: Executor._finish,
    AwaitReview: Executor._await_review,
    Blocked: Executor._blocked,
}
"""Plan type → the handler that carries it out (a result ends the drive)."""


class _Aborted:
    """Marker: a review decided to abort; ``abortRequested`` was recorded, plan again."""


_ABORT = _Aborted()


def _open_existing(sessions: SessionOpener, session: str) -> SessionStoreProtocol:
    """``sessions.open(session)``; where this process holds the session, an agent that is
    no longer referenced may be what holds it (``Agent(...).run(...)`` without keeping the
    agent): collecting garbage closes its session, and the open is tried once more. An
    agent still in use keeps its session, and this open gets the busy error."""
    for attempt in range(_COLLECT_ATTEMPTS):
        try:
            return sessions.open(session)
        except SessionBusy as busy:
            if not busy.this_process or attempt == _COLLECT_ATTEMPTS - 1:
                raise
        # gc.collect() does nothing while another thread is collecting: wait a moment then.
        if not gc.collect():
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


_COLLECT_ATTEMPTS: Final = 4
"""Opens tried when this process holds the session (each after collecting garbage)."""


def _stoppable(state: SessionState) -> bool:
    """A run that may still be ended ``failed`` by a stop condition."""
    operation = state.operation
    return isinstance(operation, RunOperation) and not operation.abort_requested


def _running(state: SessionState) -> RunOperation:
    operation = state.operation
    assert isinstance(operation, RunOperation)
    return operation


def _assistant_steps(state: SessionState, input_entry_id: str) -> int:
    """How many model steps of the run settled (its assistant entries)."""
    transcript = state.transcript
    span = run_range(state, input_entry_id)
    return sum(1 for i in span if transcript[i]["role"] == "assistant")


def _pending_tool(operation: RunOperation) -> ToolCallState | None:
    for tool in operation.tool_calls:
        if tool.status is ToolStatus.PENDING:
            return tool
    return None


def _assistant_call(state: SessionState, entry_id: str, index: int) -> Mapping[str, Any]:
    """Tool call ``index`` of the assistant entry ``entry_id``."""
    ids = state.transcript_ids
    for position in range(len(ids) - 1, -1, -1):
        if ids[position] == entry_id:
            call: Mapping[str, Any] = state.transcript[position]["tool_calls"][index]
            return call
    raise LookupError(f"assistant entry {entry_id} is not in the transcript")
