"""The executor: the loop that carries out recovery plans, through one table.

One loop serves a fresh run and a resume alike: take the reduced state the store keeps, ask
:func:`plan_recovery` for the next action, carry out exactly that action with the handler
the table :data:`PLANS` names for its plan type, commit exactly the facts the spec requires
(section 15), repeat until the session is idle or recovery is blocked. Every intent is
durable before it acts: the ``stepAttempt`` before the provider request, the
``toolStarted`` before the tool, and for a journaled file change the journal's intent
before the ``toolStarted``. The session is bound to the workspace database before its first
evidence, so recovery can tell a lost or replaced database from "nothing happened"
(:mod:`tether._effects.binding`).

The handlers live in three families, each a small class built from what it needs
(:mod:`tether._runtime.drive`): model steps (:mod:`~tether._runtime.model_steps`), tool
calls (:mod:`~tether._runtime.tool_calls`), outcomes, stops and reconciliation
(:mod:`~tether._runtime.recovery`). This module keeps what is not a plan: the public entry
points, the session held across calls, retries and follow-up runs, and the loop itself.

Rules of this module:

* :data:`PLANS` is the only place a plan's type decides anything: its row names the
  handler, what new work the budget counts, and which pending started call is reconciled
  before the plan is carried out. No ``isinstance`` on a plan, no ``getattr`` probing;
  ``isinstance`` on the state's active operation only narrows it (idle or not, a run or
  not: what the state says is active);
* the executor reads nothing of the outside world itself: the composition root
  (:mod:`tether._runtime.compose`) hands it the clock, the id source, the session-store and
  workspace-database openers, the tools, the guards and the configuration. It is typed
  against the seams only (:mod:`tether._stores.protocol`, :mod:`tether._wsdb.protocol`);
* how a call runs and how its pending state is recovered follows from the tool's declared
  :class:`~tether._tools.base.RecoveryKind` (:data:`tether._runtime.runners.RUNNERS`), never
  from its class or name;
* the result of a call is derived from the final state (:mod:`tether._runtime.results`);
* a caller's stop signal (:meth:`Executor.set_stop_signal`, a worker's ``SIGTERM``) ends a
  drive between two handlers, a durable point, with the operation left unfinished.

What ``Agent`` (and the CLI, the worker, the crash lab and the tests) use of an executor is
its public surface: ``run``, ``retry``, ``resume``, ``compact``, ``abort``,
``set_stop_signal``, ``close``, ``release``, the context manager, ``last_session``,
``held_session``, ``retry_policy`` and the composition's parts it exposes as attributes
(``parts``, ``workspace``, ``model``, ``project``, ``budget``, ``require_verified``,
``registry``, ``system_prompt``, ``durability``, ``output_options``, ``sessions_dir``,
``protected``, ``tool_timeout``, ``environment``, ``configuration``, ``masker``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Self

import tether._faults as faults
import tether._runtime.boundaries as boundaries
import tether._runtime.events as events
from tether._effects.rewind import is_rewind_evidence
from tether._runtime.compose import Composition
from tether._runtime.drive import Drive, NewWork, Shell
from tether._runtime.guards import follow_up_prompt
from tether._runtime.masking import mask_commits
from tether._runtime.model_steps import ModelSteps
from tether._runtime.recovery import Recovery, request_abort
from tether._runtime.results import RunResult, RunStatus
from tether._runtime.retry import REASONS, RetryPolicy, RetrySchedule, write_record
from tether._runtime.spend import run_seconds
from tether._runtime.tool_calls import ToolCalls
from tether._stores.protocol import SessionOpener, SessionStoreProtocol
from tether.core import facts
from tether.core.canonical import source_digest
from tether.core.compaction import plan_split
from tether.core.planner import plan_recovery
from tether.core.plans import (
    AppendSynthetic,
    AwaitReview,
    Blocked,
    CloseAttempt,
    CompleteTool,
    Finish,
    Plan,
    StartStep,
    StartTool,
    SyntheticReason,
    ToolMode,
)
from tether.core.records import record, replace
from tether.core.state import IdleOperation, RunOperation, SessionState, Usage
from tether.core.stops import BudgetTime
from tether.errors import ConfigurationError, SessionBusy

__all__ = ["MAX_FOLLOW_UPS", "PLANS", "Executor", "PlanRow", "RunResult", "RunStatus"]

MAX_FOLLOW_UPS: Final = 2
"""Follow-up runs ``require_verified`` starts at most, asking the model to verify."""


# ====================================================================== the table


@record(slots=True)
class Families:
    """The handler families of one executor."""

    steps: ModelSteps
    tools: ToolCalls
    outcomes: Recovery


Handler = Callable[[Drive, SessionState, Any], RunResult | None]
"""``(drive, state, plan)``; a result ends the drive."""


def _no_new_work(plan: Plan) -> NewWork:
    return NewWork.NONE


def _no_pending_call(plan: Plan) -> str | None:
    return None


@record(slots=True)
class PlanRow:
    """What the executor does with one type of plan."""

    handler: Callable[[Families], Handler]
    """The family handler that carries the plan out."""
    new_work: Callable[[Any], NewWork] = _no_new_work
    """What the plan starts that the budget counts (checked before it is carried out)."""
    pending_call: Callable[[Any], str | None] = _no_pending_call
    """The pending started call the plan would replay or record ``interrupted``: the
    executor reconciles it against the truth first (rule 9) and plans again with that."""


def _step_work(plan: StartStep) -> NewWork:
    # A second attempt of a step is a retry, not a new step.
    return NewWork.STEP if plan.attempt == 1 else NewWork.NONE


def _call_work(plan: StartTool) -> NewWork:
    # A replay after a crash is the same call again, not new work.
    return NewWork.NONE if plan.mode is ToolMode.REPLAY else NewWork.TOOL_CALL


def _replayed_call(plan: StartTool) -> str | None:
    return plan.tool_started_id if plan.mode is ToolMode.REPLAY else None


def _interrupted_call(plan: AppendSynthetic) -> str | None:
    # Only the form that answers one started call as interrupted (what a crash leaves).
    results = plan.results
    if len(results) == 1 and results[0].reason is SyntheticReason.INTERRUPTED:
        return results[0].tool_started_id
    return None


PLANS: Final[Mapping[type, PlanRow]] = {
    StartStep: PlanRow(lambda f: f.steps.start_step, new_work=_step_work),
    StartTool: PlanRow(
        lambda f: f.tools.start_tool, new_work=_call_work, pending_call=_replayed_call
    ),
    AppendSynthetic: PlanRow(lambda f: f.tools.append_synthetic, pending_call=_interrupted_call),
    CloseAttempt: PlanRow(lambda f: f.steps.close_attempt),
    CompleteTool: PlanRow(lambda f: f.tools.complete_tool),
    Finish: PlanRow(lambda f: f.outcomes.finish),
    AwaitReview: PlanRow(lambda f: f.outcomes.await_review),
    Blocked: PlanRow(lambda f: f.outcomes.blocked),
}
"""Plan type → how the executor carries it out (the one table; see :class:`PlanRow`)."""


# ====================================================================== the executor


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
        self._shell = shell = Shell(parts)
        self._retries = RetrySchedule(parts.clock, parts.retry_policy)
        tools = ToolCalls(shell)
        self._families = Families(
            steps=ModelSteps(shell, self._retries),
            tools=tools,
            outcomes=Recovery(shell, tools),
        )
        self._last_session: str | None = None
        # The session held open across calls (its lock held, its state kept by the store
        # incrementally), so a call on it costs no open, read or reduce (see _open).
        self._held: SessionStoreProtocol | None = None

    @property
    def retry_policy(self) -> RetryPolicy:
        """Automatic retries of transient provider failures (:mod:`tether._runtime.retry`)."""
        return self._retries.policy

    @retry_policy.setter
    def retry_policy(self, policy: RetryPolicy) -> None:
        self._retries.policy = policy

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
            self.parts.evidence.rebind_if_lost(store)
            before = state.usage
            store.commit(
                [facts.run_started(operation_id=self._shell.ids(), input_entry_id=users[-1])]
            )
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
                request_abort(store, store.state)
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
                return self._shell.result(
                    store, RunStatus.IDLE, message="nothing to compact: too few complete turns"
                )
            compacted, retained = split
            ids = state.transcript_ids
            assert state.context_boundary is not None  # a split needs complete turns
            store.commit(
                [
                    facts.compaction_started(
                        operation_id=self._shell.ids(),
                        input_through_entry_id=state.context_boundary,
                        result_entry_id=self._shell.ids(),
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
        self._shell.cancel.set()

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
        self._shell.stop_signal = signal

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
            self.parts.close()

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
            self.parts.evidence.rebind_if_lost(store)
            before = store.state.usage
            entry_id = self._shell.ids()
            store.commit(
                [
                    facts.user_entry(entry_id=entry_id, content=prompt),
                    facts.run_started(operation_id=self._shell.ids(), input_entry_id=entry_id),
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
            record = self._retries.pending(store)
            if record is None:
                return replace(result, usage=usage)
            wait = max(record.due_at_ms - self._shell.clock.now_ms(), 0) / 1000.0
            self._shell.emit(
                events.RetryScheduled(
                    reason=REASONS.get(record.reason, record.reason),
                    delay=record.delay,
                    wait=wait,
                    retry=record.retry,
                    retries=self._retries.policy.retries,
                )
            )
            if self._shell.stopping() or (
                wait > 0 and self._retries.clock.wait(self._shell.cancel, wait)
            ):
                return replace(result, usage=usage)  # the schedule stays for resume
            operation_id = record.started_operation_id or self._shell.ids()
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

    def _follow_up(self, result: RunResult) -> RunResult:
        usage = result.usage
        count = 0
        while (
            self.require_verified
            and result.status is RunStatus.COMPLETED
            and result.verification is not None
            and not result.verification.verified
            and count < MAX_FOLLOW_UPS
            and not self._shell.stopping()
        ):
            count += 1
            prompt = follow_up_prompt(result.verification)
            self._shell.emit(events.FollowUpStarted(number=count, prompt=prompt))
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
            self._shell.cancel.clear()

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

        First of all, the sandbox of the tools' commands is checked (fail closed): a
        refused agent neither creates nor opens a session.
        """
        self.parts.ensure_sandbox()
        store = self._hold(session)
        try:
            with self.parts.tracing.invocation(store.session_id):
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
            self._families.steps.forget(store.session_id)
        self._last_session = store.session_id
        self._shell.emit(
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

    # ------------------------------------------------------------------ the loop

    def _drive(
        self,
        store: SessionStoreProtocol,
        *,
        usage_before: Usage | None = None,
        always_gate: bool = False,
    ) -> RunResult:
        """Carry out plans until the session is idle or recovery is blocked: plan (one
        place, :meth:`_next_plan`), then the handler the plan's row names (:data:`PLANS`);
        a handler returns the result when the drive ends."""
        drive = self._begin_drive(store, usage_before, always_gate)
        while True:
            # Every handler returns at a durable point (what it did is committed): the
            # place to honour a stop signal. Not once idle: a finished operation still
            # gets its result (and a completed run its gate) below. Not with a stop
            # condition noted in memory only (a repeated failure): it is committed first,
            # else the next drive would never see it.
            if (
                self._shell.stopping()
                and drive.pending_stop is None
                and not isinstance(store.state.operation, IdleOperation)
            ):
                return self._shell.result(
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
            result = PLANS[type(plan)].handler(self._families)(drive, state, plan)
            if result is not None:
                return result

    def _begin_drive(
        self, store: SessionStoreProtocol, usage_before: Usage | None, always_gate: bool
    ) -> Drive:
        self.parts.evidence.attach(store)
        state = store.state
        operation = state.operation
        run_input = operation.input_entry_id if isinstance(operation, RunOperation) else None
        clock = self._shell.clock
        began = clock.monotonic()
        seconds = self.budget.max_seconds
        if isinstance(operation, RunOperation) and seconds is not None:
            # The run's time counts from its first start, whichever process wrote it: a
            # resume continues the clock instead of starting it again; [budget] time says
            # whether the time no process drove the run counts (docs/config.md).
            began -= self._run_seconds(store, operation)
        return Drive(
            store=store,
            usage_before=usage_before if usage_before is not None else state.usage,
            always_gate=always_gate,
            run_input=run_input,
            began=began,
            deadline=began + seconds if run_input is not None and seconds is not None else None,
            finished_before=state.last_finished,
        )

    def _run_seconds(self, store: SessionStoreProtocol, operation: RunOperation) -> float:
        """What the run's time budget has counted before this drive (:func:`run_seconds`)."""
        mode = self.budget.time
        reconciliations: dict[str, list[Mapping[str, Any]]] = {}
        if mode is BudgetTime.ACTIVE and operation.tool_calls:
            # Only a run with started calls can have been reconciled after a crash.
            reviews = self.parts.evidence.db().reviews
            for entry in reviews.reconciliations(session_id=store.session_id):
                if is_rewind_evidence(entry.evidence):  # after the session, not a recovery
                    continue
                decision = {**entry.to_json(), "atMs": entry.at_ms}  # as `tether show` has it
                reconciliations.setdefault(entry.operation_id, []).append(decision)
        return run_seconds(
            store,
            operation,
            mode,
            now_ms=self._shell.clock.now_ms(),
            reconciliations=reconciliations,
        )

    def _next_plan(self, drive: Drive) -> tuple[SessionState, Plan] | None:
        """The next plan, or ``None`` when something was recorded instead (plan again).

        1. ``abort()`` was called: ``abortRequested`` is recorded (once);
        2. a ``repeated_failure`` noted by the last tool call ends the run ``failed``;
        3. :func:`plan_recovery`; where it would replay a pending journaled or lookup tool
           or record it ``interrupted`` (its row's ``pending_call``), the tool is reconciled
           against the truth and the planner asked again with that observation (a
           reviewer's abort is recorded);
        4. an exhausted budget ends the run ``failed`` before a new step or tool call (its
           row's ``new_work``).
        """
        store = drive.store
        outcomes = self._families.outcomes
        state = store.state
        if self._shell.cancel.is_set() and not isinstance(state.operation, IdleOperation):
            request_abort(store, state)
            state = store.state
        stop, drive.pending_stop = drive.pending_stop, None
        if stop is not None and _stoppable(state):
            outcomes.fail_operation(drive, state, stop)
            return None
        current = self.configuration.current
        plan: Plan = plan_recovery(state, current)
        reconciled = outcomes.reconcile(store, state, PLANS[type(plan)].pending_call(plan))
        if reconciled.aborted:
            return None
        if reconciled.observed is not None:
            plan = plan_recovery(state, current, reconciled.observed)
        if drive.run_input is not None and _stoppable(state):
            stop = outcomes.budget_stop(drive, state, PLANS[type(plan)].new_work(plan))
            if stop is not None:
                outcomes.fail_operation(drive, state, stop)
                return None
        return state, plan


# ====================================================================== helpers


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
