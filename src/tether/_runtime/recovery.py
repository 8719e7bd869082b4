"""The executor's outcome and recovery family: finish, blocked, review, stops, reconciliation.

What ends or redirects a drive rather than doing work: ``finish`` (the result, or
``operationFinished``), ``blocked`` and ``awaitReview`` (a result and nothing appended),
the stop conditions (a budget, a repeated failure: the run ends ``failed``), a caller's
abort (``abortRequested``), and reconciling a pending started call against the truth before
the planner would replay it or record it ``interrupted`` (:func:`reconcile_pending`).

Rules of this module:

* it appends only what the spec says for these plans, in the order the crash boundaries
  (:mod:`tether._runtime.boundaries`) name: a handler returns at a durable point;
* it never looks at a plan's type: the executor's table says which started call a plan
  would replay or interrupt and what new work it starts (:data:`~tether._runtime.executor.PLANS`);
* how a tool is reconciled follows from its declared
  :class:`~tether._tools.base.RecoveryKind`, never its class or name;
* ``isinstance`` here only narrows the state's active operation (idle, a run): the state
  says what is active, and only a run has tool calls to stop, answer or reconcile.
"""

from __future__ import annotations

import tether._faults as faults
import tether._runtime.boundaries as boundaries
import tether._runtime.events as events
from tether._effects.recovery import RecoveryAction, reconcile_pending
from tether._project import BudgetConfig
from tether._runtime.drive import Drive, NewWork, Shell, running
from tether._runtime.guards import run_range
from tether._runtime.results import RunResult, RunStatus, finished_details
from tether._runtime.tool_calls import ToolCalls
from tether._stores.protocol import SessionStoreProtocol
from tether._tools.base import RecoveryKind
from tether.core import facts
from tether.core.configuration import explain_blocked
from tether.core.gate import CompletionCheck
from tether.core.planner import unanswered_calls
from tether.core.plans import AwaitReview, Blocked, Finish, Observations
from tether.core.records import record
from tether.core.state import IdleOperation, RunOperation, SessionState, ToolCallState, ToolStatus
from tether.core.stops import BUDGET_CHECKS, StopError, budget_exhausted

__all__ = ["Reconciled", "Recovery", "request_abort"]


@record(slots=True)
class Reconciled:
    """What reconciling a pending call found: the observation to plan with (``None``: the
    spec's answer stands), or that a reviewer chose abort (``abortRequested`` was recorded;
    plan again)."""

    observed: Observations | None = None
    aborted: bool = False


class Recovery:
    """Outcomes, stops and reconciliation over one :class:`Shell`."""

    def __init__(self, shell: Shell, tool_calls: ToolCalls) -> None:
        self._shell = shell
        self._parts = shell.parts
        # The answers of calls a stop leaves unanswered are the tool family's entries.
        self._tool_calls = tool_calls

    # ------------------------------------------------------------------ finish, block

    def finish(self, drive: Drive, state: SessionState, plan: Finish) -> RunResult | None:
        """``finish``: the idle form ends the drive with the result the final state says
        (and, for a completed run that changed files, the completion gate's verdict);
        otherwise commit ``operationFinished``."""
        if plan.is_idle:
            return self._final_result(drive, state)
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
        self._shell.emit(
            events.OperationFinished(operation=operation.kind, outcome=plan.outcome.value)
        )
        return None

    def _final_result(self, drive: Drive, state: SessionState) -> RunResult:
        details = finished_details(state, drive.finished_before)
        verification: CompletionCheck | None = None
        run_input = drive.run_input
        if run_input is not None and details.status is RunStatus.COMPLETED:
            parts = self._parts
            gate = drive.always_gate or parts.guards.changed_files_in_run(
                state, run_input, parts.registry.get
            )
            if gate:
                verification = self._assess()
        return self._shell.result(
            drive.store,
            details.status,
            usage_before=drive.usage_before,
            text=details.text,
            completion=details.completion,
            error=details.error,
            message=details.message,
            verification=verification,
        )

    def blocked(self, drive: Drive, state: SessionState, plan: Blocked) -> RunResult:
        """``blocked``: append nothing; the result names the reason and the ways out."""
        message = explain_blocked(plan.reason, state, self._parts.configuration)
        self._shell.emit(events.Blocked(reason=plan.reason.value, detail=message))
        return self._shell.result(
            drive.store,
            RunStatus.BLOCKED,
            usage_before=drive.usage_before,
            blocked_reason=plan.reason.value,
            message=message,
        )

    def await_review(self, drive: Drive, state: SessionState, plan: AwaitReview) -> RunResult:
        """``awaitReview`` (tether): blocked ``review_required`` until a person decides."""
        message = (
            f"review required: the outcome of {plan.tool_name} (operation "
            f"{plan.tool_started_id}) cannot be established: {plan.reason}. Decide with "
            "`tether review` and `tether review resolve ITEM --applied|--not-applied|--abort`, "
            f"then run `tether resume {drive.store.session_id}`."
        )
        self._shell.emit(events.Blocked(reason="review_required", detail=message))
        return self._shell.result(
            drive.store,
            RunStatus.BLOCKED,
            usage_before=drive.usage_before,
            blocked_reason="review_required",
            message=message,
        )

    def _assess(self) -> CompletionCheck:
        check = self._parts.guards.assess()
        self._shell.emit(
            events.CompletionChecked(
                status=check.status.value,
                message=check.message,
                changed_files=check.changed_files,
            )
        )
        return check

    # ------------------------------------------------------------------ stops

    def budget_stop(self, drive: Drive, state: SessionState, work: NewWork) -> StopError | None:
        """``budget_exhausted`` before a new step (steps, tokens, time, money) or a new tool
        call (tool calls, tokens, time, money). Retries and replays after a crash are not new work.

        Every figure is the run's (or the session's) over every process that drove it, as
        the log says (:mod:`tether._runtime.spend`): a resume continues the spend."""
        budget = self._parts.budget
        if work is NewWork.NONE or not _limited(budget):
            return None
        assert drive.run_input is not None
        operation = running(state)
        steps = 0
        if work is NewWork.STEP and budget.max_steps is not None:
            steps = _assistant_steps(state, drive.run_input)
        used = operation.spent(state.usage)
        spending = self._parts.spending
        cost = session_cost = 0.0
        if budget.max_cost_usd is not None:
            cost = spending.cost(drive.store, state, start=operation.entries_from, usage=used).usd
        if budget.max_session_cost_usd is not None:
            session_cost = spending.cost(drive.store, state, start=0, usage=state.usage).usd
        return budget_exhausted(
            steps=steps,
            tokens=used.input + used.output,
            elapsed=self._shell.clock.monotonic() - drive.began,
            max_steps=budget.max_steps,
            max_tokens=budget.max_tokens,
            max_seconds=budget.max_seconds,
            tool_calls=len(operation.tool_calls) if work is NewWork.TOOL_CALL else 0,
            max_tool_calls=budget.max_tool_calls if work is NewWork.TOOL_CALL else None,
            cost=cost,
            max_cost=budget.max_cost_usd,
            session_tokens=state.usage.input + state.usage.output,
            max_session_tokens=budget.max_session_tokens,
            session_cost=session_cost,
            max_session_cost=budget.max_session_cost_usd,
        )

    def fail_operation(self, drive: Drive, state: SessionState, stop: StopError) -> None:
        """End the active run ``failed`` with a stop condition's error.

        Calls of the current step that were not carried out are answered first (``aborted``,
        never run), in the same transaction: the transcript stays legal for the next run
        and no crash can separate the answers from the end of the run.
        """
        operation = state.operation
        assert isinstance(operation, RunOperation)
        answers = self._tool_calls.synthetic_facts(state, unanswered_calls(state))
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
        self._shell.emit(events.OperationFinished(operation=operation.kind, outcome="failed"))

    # ------------------------------------------------------------------ reconciliation

    def reconcile(
        self, store: SessionStoreProtocol, state: SessionState, started_id: str | None
    ) -> Reconciled:
        """The truth about the pending started call ``started_id``, which the plan would
        replay or record ``interrupted`` (rule 9), for tools whose effect can be observed
        (recovery kind ``journaledFileChange`` or ``lookupByOperationId``): the journal and
        file hashes, or the service's lookup. ``started_id`` is ``None`` for every other plan
        (the executor's table says which).
        """
        operation = state.operation
        if not isinstance(operation, RunOperation) or operation.abort_requested:
            return Reconciled()
        if started_id is None:
            return Reconciled()
        pending = operation.tool_call(started_id)
        tool = self._parts.registry.get(pending.tool_name)
        if tool is None or tool.recovery is RecoveryKind.NONE:
            return Reconciled()
        evidence = self._parts.evidence
        db = evidence.db()
        decision, item = reconcile_pending(
            tool,
            started_id,
            store.session_id,
            workspace=self._parts.workspace,
            journal=db.journal,
            reviews=db.reviews,
            arguments=pending.arguments,
            evidence=evidence.check(store),
        )
        if decision.action is RecoveryAction.SPEC:
            return Reconciled()
        self._shell.emit(
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
            request_abort(store, state)
            return Reconciled(aborted=True)
        # The planner takes the decision itself (its review reason names the item).
        return Reconciled(observed=Observations({started_id: decision}))


def request_abort(store: SessionStoreProtocol, state: SessionState) -> None:
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


def _pending_tool(operation: RunOperation) -> ToolCallState | None:
    for tool in operation.tool_calls:
        if tool.status is ToolStatus.PENDING:
            return tool
    return None


def _assistant_steps(state: SessionState, input_entry_id: str) -> int:
    """How many model steps of the run settled (its assistant entries)."""
    transcript = state.transcript
    span = run_range(state, input_entry_id)
    return sum(1 for i in span if transcript[i]["role"] == "assistant")


def _limited(budget: BudgetConfig) -> bool:
    """Whether any budget is set (no limit: nothing to count); the table names them."""
    return any(getattr(budget, row.key) is not None for row in BUDGET_CHECKS)
