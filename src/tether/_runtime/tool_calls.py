"""The executor's tool-call family: validate, authorize, start, run and answer tool calls.

A call the model asked for is, in this order (docs/runtime.md, "The loop"): validated (a
violation becomes an ``invalidArguments`` result), authorized (a decision is durable before
the call starts; a denied call's intent and error result are one transaction; a parked call
stops the run), prepared as its recovery kind says (a journaled file change's intent is in
the journal first), started (``toolStarted`` is durable before the effect), run, and
answered (its result entry). Calls the planner answers without running them are the
synthetic results (``appendSynthetic``), and a reconciled call's result is ``completeTool``.

Rules of this module:

* every intent is durable before it acts; the crash boundaries
  (:mod:`tether._runtime.boundaries`) sit exactly where the spec puts them;
* how a call runs and is prepared follows from the tool's declared
  :class:`~tether._tools.base.RecoveryKind` (:data:`tether._runtime.runners.RUNNERS`), never
  from its class or name; the store is asked for its lease through the seam
  (:meth:`~tether._stores.protocol.SessionStoreProtocol.check_lease`), never probed;
* ``isinstance`` here only narrows a value whose type is a union by contract (the state's
  active operation, a validation or authorization answer): it never picks a behaviour by a
  plan's or a tool's class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tether._faults as faults
import tether._runtime.boundaries as boundaries
import tether._runtime.events as events
from tether._effects.authorization import Authorization
from tether._effects.journal import PreparedChange
from tether._hub import offload
from tether._runtime.drive import Drive, Shell, running
from tether._runtime.guards import ParkedCall, is_failure
from tether._runtime.results import RunResult, RunStatus
from tether._runtime.runners import RUNNERS, CallSite
from tether._stores.protocol import SessionStoreProtocol
from tether._tools.base import Rejection, Tool, ToolContext, ValidatedCall
from tether.core import facts
from tether.core.plans import (
    AppendSynthetic,
    CompleteTool,
    StartTool,
    SyntheticReason,
    SyntheticResult,
    ToolMode,
)
from tether.core.policy import decided_by_person
from tether.core.records import record
from tether.core.state import RunOperation, SessionState, ToolCallState

__all__ = ["ToolCalls"]


@record(slots=True)
class _NewCall:
    """The names a call is given before anything of it is committed."""

    tool_name: str
    call_id: str
    step_id: str
    started_id: str
    result_id: str


class ToolCalls:
    """Tool calls over one :class:`Shell` (the runners' :class:`CallSite` built from it)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        self._parts = parts = shell.parts
        self._site = CallSite(parts.workspace, parts.protected, parts.evidence)

    # ------------------------------------------------------------------ startTool

    def start_tool(self, drive: Drive, state: SessionState, plan: StartTool) -> RunResult | None:
        """``startTool``: a call started now, or a replay (docs/runtime.md, "The loop")."""
        store = drive.store
        operation = running(state)
        assert operation.step is not None
        call = _assistant_call(state, plan.assistant_entry_id, plan.tool_index)
        if plan.mode is ToolMode.REPLAY:
            self._replay(drive, operation, plan, call["id"])
            return None
        # 1. validate the arguments (a violation becomes an invalidArguments result)
        earlier = self._parts.evidence.earlier_decision(store, plan.assistant_entry_id)
        validated = self._parts.registry.validate(plan.tool_name, call["function"]["arguments"])
        if isinstance(validated, Rejection):  # narrowing: validate answers one or the other
            self._reject(store, operation, plan, call["id"], validated)
            return None
        # 2. authorize (boundary authorized when a decision is recorded)
        decided = self._parts.guards.authorize(
            store.session_id,
            plan.assistant_entry_id,
            plan.tool_index,
            validated.tool,
            validated.arguments,
            earlier_decision=earlier,
            state=state,
        )
        if isinstance(decided, ParkedCall):  # narrowing: authorize answers one or the other
            return self._park(drive, decided, call["id"])
        authorization, denial = decided
        if authorization is not None:
            self._shell.emit(
                events.ToolAuthorized(
                    name=plan.tool_name,
                    call_id=call["id"],
                    decision="deny" if denial is not None else "allow",
                )
            )
        new = _NewCall(
            tool_name=plan.tool_name,
            call_id=call["id"],
            step_id=operation.step.step_id,
            started_id=self._shell.ids(),
            result_id=self._shell.ids(),
        )
        intent = [self._intent(operation, plan, new, validated)]
        if denial is not None:
            self._deny(drive, new, intent, validated, authorization, denial)
            return None
        self._start(drive, new, validated, intent)
        return None

    def _replay(self, drive: Drive, operation: RunOperation, plan: StartTool, call_id: str) -> None:
        """Replay: 1. run again with the recorded arguments (same operation id)
        → after_effect  2. commit the result entry under the provisioned id."""
        tool = self._parts.registry.get(plan.tool_name)
        assert tool is not None and plan.tool_started_id is not None  # the replay form
        self._shell.emit(events.ToolStarted(name=plan.tool_name, call_id=call_id, replay=True))
        started = operation.tool_call(plan.tool_started_id)
        self._execute(drive, tool, dict(plan.arguments), started, None)

    def _reject(
        self,
        store: SessionStoreProtocol,
        operation: RunOperation,
        plan: StartTool,
        call_id: str,
        rejection: Rejection,
    ) -> None:
        """Answer a call whose arguments the tool's schema rejects (it never starts)."""
        assert operation.step is not None
        store.commit(
            [
                facts.pre_execution_entry(
                    step_id=operation.step.step_id,
                    assistant_entry_id=plan.assistant_entry_id,
                    tool_index=plan.tool_index,
                    call_id=call_id,
                    tool_name=plan.tool_name,
                    reason=rejection.reason,
                    content=SyntheticReason(rejection.reason).content,
                )
            ],
            sync=False,
        )
        self._shell.emit(
            events.ToolSkipped(name=plan.tool_name, call_id=call_id, reason=rejection.reason)
        )

    def _intent(
        self, operation: RunOperation, plan: StartTool, new: _NewCall, validated: ValidatedCall
    ) -> dict[str, Any]:
        """The call's ``toolStarted`` (its result entry id provisioned with it)."""
        return facts.tool_started(
            fact_id=new.started_id,
            operation_id=operation.operation_id,
            step_id=new.step_id,
            assistant_entry_id=plan.assistant_entry_id,
            tool_index=plan.tool_index,
            tool_call_id=new.call_id,
            tool_name=new.tool_name,
            arguments=validated.arguments,
            replay=validated.declaration.replay.value,
            replay_key=validated.declaration.replay_key,
            environment_identity=self._parts.environment,
            result_entry_id=new.result_id,
        )

    def _deny(
        self,
        drive: Drive,
        new: _NewCall,
        intent: list[dict[str, Any]],
        validated: ValidatedCall,
        authorization: Authorization | None,
        denial: str,
    ) -> None:
        """A denied call never runs: its intent and its error result are one transaction,
        so no crash can leave it pending (and replayable)."""
        intent.append(
            facts.started_result_entry(
                result_entry_id=new.result_id,
                step_id=new.step_id,
                tool_started_id=new.started_id,
                tool_name=new.tool_name,
                call_id=new.call_id,
                content=denial,
                is_error=True,
            )
        )
        drive.store.commit(intent, sync=False)
        person = authorization is not None and decided_by_person(authorization.who)
        reason = "declined" if person else "denied"
        self._shell.emit(events.ToolSkipped(name=new.tool_name, call_id=new.call_id, reason=reason))
        self._note_failure(drive, new.started_id, new.result_id, new.tool_name, validated.arguments)

    def _start(
        self, drive: Drive, new: _NewCall, validated: ValidatedCall, intent: list[dict[str, Any]]
    ) -> None:
        """Steps 3-6 of a call that may run."""
        store = drive.store
        # 3. what the tool's recovery kind records before toolStarted (a journaled file
        # change: its planned change in the journal, boundary journal.intent_prepared)
        runner = RUNNERS[validated.tool.recovery]
        prepared = runner.prepare(
            self._site, store, validated.tool, new.started_id, validated.arguments
        )
        # 4. commit toolStarted → before_effect
        store.commit(intent)
        faults.hit(boundaries.BEFORE_EFFECT)
        started = running(store.state).tool_call(new.started_id)
        self._shell.emit(events.ToolStarted(name=new.tool_name, call_id=new.call_id))
        # 5. run it → after_effect  6. commit the result entry → after_result
        self._execute(drive, validated.tool, validated.arguments, started, prepared)

    def _park(self, drive: Drive, parked: ParkedCall, call_id: str) -> RunResult:
        """A call waits for a person: the run stops, its operation stays open (the next
        resume carries the decision out); nothing is appended to the log."""
        message = parked.message()
        self._shell.emit(
            events.ApprovalParked(
                name=parked.tool_name,
                call_id=call_id,
                request_id=parked.request_id,
                summary=parked.summary,
            )
        )
        self._shell.emit(events.Blocked(reason="approval_required", detail=message))
        return self._shell.result(
            drive.store,
            RunStatus.AWAITING_APPROVAL,
            usage_before=drive.usage_before,
            blocked_reason="approval_required",
            message=message,
            parked_call=parked.request_id,
        )

    # ------------------------------------------------------------------ running a call

    def _execute(
        self,
        drive: Drive,
        tool: Tool,
        arguments: Mapping[str, Any],
        started: ToolCallState,
        prepared: PreparedChange | None,
    ) -> None:
        """Run a started call as its recovery kind says, then commit its result."""
        store = drive.store
        # A leased store (PostgreSQL) confirms the lease first: a writer that lost it
        # starts no effect (SessionFenced); its epoch goes to the tool as fencing token.
        token = store.check_lease()
        context = ToolContext(
            workspace=self._parts.workspace,
            operation_id=started.tool_started_id,
            cancel=self._shell.cancel,
            timeout=self._tool_timeout(drive),
            session_id=store.session_id,
            protected=self._parts.protected,
            fencing_token=token,
            sandbox=self._parts.sandbox,
        )
        runner = RUNNERS[tool.recovery]
        # In a worker the session is a greenlet on a hub: a call runs on a helper thread
        # while it is parked, so a long tool holds no other session (tether._hub), unless
        # the tool's own waits park it (bash).
        call = (self._site, store, tool, arguments, context, prepared)
        result = runner.run(*call) if tool.parks else offload(runner.run, *call)
        faults.hit(boundaries.AFTER_EFFECT)
        if result is None or (self._shell.cancel.is_set() and result.metadata.get("aborted")):
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

    def _tool_timeout(self, drive: Drive) -> float | None:
        """The tool's time bound: ``tool_timeout``, cut to what the time budget has left
        (a tool that runs past the budget is stopped; its result says it timed out)."""
        timeout = self._parts.tool_timeout
        if drive.deadline is None:
            return timeout
        left = max(drive.deadline - self._shell.clock.monotonic(), 0.001)
        return left if timeout is None else min(timeout, left)

    def _note_failure(
        self,
        drive: Drive,
        tool_started_id: str,
        result_entry_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
    ) -> None:
        """Record a failed call; a repeated failure ends the run before the next plan."""
        if drive.run_input is None:
            return
        drive.pending_stop = self._parts.guards.failed_call(
            drive.store.state,
            session_id=drive.store.session_id,
            input_entry_id=drive.run_input,
            tool_started_id=tool_started_id,
            result_entry_id=result_entry_id,
            tool_name=tool_name,
            arguments=arguments,
        )

    # ------------------------------------------------------------------ results

    def complete_tool(self, drive: Drive, state: SessionState, plan: CompleteTool) -> None:
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
        self._shell.emit(
            events.ToolFinished(
                name=entry["tool_name"],
                call_id=entry["call_id"],
                is_error=entry["is_error"],
                size=len(entry["content"]),
            )
        )

    def append_synthetic(self, drive: Drive, state: SessionState, plan: AppendSynthetic) -> None:
        """``appendSynthetic``: one transaction with every synthetic result of the plan."""
        drive.store.commit(self.synthetic_facts(state, plan.results), sync=False)

    def synthetic_facts(
        self, state: SessionState, results: Sequence[SyntheticResult]
    ) -> list[dict[str, Any]]:
        """The entries of synthetic results (spec 15: interrupted → started form, the
        other reasons → pre-execution form); each is reported as a skipped call."""
        out: list[dict[str, Any]] = []
        if not results:
            return out
        operation = running(state)
        assert operation.step is not None
        for item in results:
            out.append(_synthetic_entry(operation, item))
            self._shell.emit(
                events.ToolSkipped(
                    name=item.tool_name, call_id=item.tool_call_id, reason=item.reason.value
                )
            )
        return out


def _synthetic_entry(operation: RunOperation, item: SyntheticResult) -> dict[str, Any]:
    if item.reason is SyntheticReason.INTERRUPTED:
        assert item.tool_started_id is not None and item.result_entry_id is not None
        started = operation.tool_call(item.tool_started_id)
        return facts.interrupted_result_entry(
            result_entry_id=item.result_entry_id,
            step_id=started.step_id,
            tool_started_id=item.tool_started_id,
            tool_name=item.tool_name,
            call_id=item.tool_call_id,
            content=item.content,
        )
    assert operation.step is not None
    return facts.pre_execution_entry(
        step_id=operation.step.step_id,
        assistant_entry_id=item.assistant_entry_id,
        tool_index=item.tool_index,
        call_id=item.tool_call_id,
        tool_name=item.tool_name,
        reason=item.reason.value,
        content=item.content,
    )


def _assistant_call(state: SessionState, entry_id: str, index: int) -> Mapping[str, Any]:
    """Tool call ``index`` of the assistant entry ``entry_id``."""
    ids = state.transcript_ids
    for position in range(len(ids) - 1, -1, -1):
        if ids[position] == entry_id:
            call: Mapping[str, Any] = state.transcript[position]["tool_calls"][index]
            return call
    raise LookupError(f"assistant entry {entry_id} is not in the transcript")
