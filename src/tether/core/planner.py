"""The recovery planner (spec section 14): what to do next with a reduced session.

:func:`plan_recovery` maps a :class:`~tether.core.state.SessionState` and the
runtime's :class:`~tether.core.current.CurrentConfiguration` to exactly one plan
(:mod:`tether.core.plans`), following the decision procedure of spec 14.4 (first matching
rule wins) with the terms of 14.3. Where tiny-agent's reference planners differ from the
spec (spec 17), this module follows the spec column. With
:class:`~tether.core.plans.Observations` (the recovery decisions of started tools, from
:mod:`tether.core.reconcile`) rule 9's pending branch can also complete, replay or wait
for review (:data:`_BY_DECISION`).

Everything here is pure: no I/O, clock, environment, randomness or mutable globals.
The planner never allocates IDs; the writer does that when it applies a plan (15.3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from tether.core.arguments import parse_tool_arguments
from tether.core.contents import is_blank
from tether.core.current import CurrentConfiguration
from tether.core.plans import (
    AppendSynthetic,
    AwaitReview,
    Blocked,
    BlockedReason,
    CloseAttempt,
    CompleteTool,
    Completion,
    Finish,
    Observations,
    Plan,
    StartStep,
    StartTool,
    SyntheticReason,
    SyntheticResult,
    ToolMode,
)
from tether.core.reconcile import RecoveryAction, RecoveryDecision
from tether.core.records import record
from tether.core.state import (
    CompactionOperation,
    IdleOperation,
    Message,
    Replay,
    RunOperation,
    SessionState,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    ToolCallState,
    ToolStatus,
)

__all__ = ["plan_recovery", "unanswered_calls"]


# =========================================================================== observations


def _complete(tool: ToolCallState, entry_id: str, index: int, seen: RecoveryDecision) -> Plan:
    assert seen.content is not None  # a COMPLETE decision always carries its content
    return CompleteTool(
        tool_started_id=tool.tool_started_id,
        result_entry_id=tool.result_entry_id,
        step_id=tool.step_id,
        tool_call_id=tool.tool_call_id,
        tool_name=tool.tool_name,
        content=seen.content,
        is_error=seen.is_error,
    )


def _replay(tool: ToolCallState, entry_id: str, index: int, seen: RecoveryDecision) -> Plan:
    return StartTool(
        ToolMode.REPLAY,
        entry_id,
        index,
        tool.tool_name,
        tool.arguments,
        tool_started_id=tool.tool_started_id,
    )


def _await_review(tool: ToolCallState, entry_id: str, index: int, seen: RecoveryDecision) -> Plan:
    return AwaitReview(tool.tool_started_id, tool.tool_name, seen.review_reason)


def _await_abort(tool: ToolCallState, entry_id: str, index: int, seen: RecoveryDecision) -> Plan:
    # The executor appends abortRequested for an ABORT decision before it plans (rule 2
    # then applies). Given one anyway, appending nothing is the only safe plan: replaying
    # or answering the call would go against the reviewer.
    where = f" (review item {seen.review_item})" if seen.review_item is not None else ""
    return AwaitReview(
        tool.tool_started_id,
        tool.tool_name,
        f"a review decided to abort the run{where}; record abortRequested, then plan again",
    )


_ObservedPlan = Callable[[ToolCallState, str, int, RecoveryDecision], Plan]

_BY_DECISION: Final[Mapping[RecoveryAction, _ObservedPlan | None]] = MappingProxyType(
    {
        RecoveryAction.SPEC: None,  # no evidence: spec 14.4 exactly
        RecoveryAction.COMPLETE: _complete,
        RecoveryAction.EXECUTE: _replay,
        RecoveryAction.REVIEW: _await_review,
        RecoveryAction.ABORT: _await_abort,
    }
)
"""A started tool's recovery decision → the plan that replaces spec 14.4's replay or
``interrupted`` result (``None``: keep the spec's)."""


def _reconcile_pending(
    tool: ToolCallState,
    assistant_entry_id: str,
    index: int,
    observations: Observations | None,
) -> Plan | None:
    """Rule 9, pending branch: reconcile a started tool against outside evidence.

    Called after the environment and declaration checks passed and before the
    replay/interrupted decision; ``None`` (no evidence) keeps spec 14.4 exactly.
    """
    if not observations:
        return None
    observed = observations.tool_outcomes.get(tool.tool_started_id)
    if observed is None:
        return None
    plan = _BY_DECISION[observed.action]
    return None if plan is None else plan(tool, assistant_entry_id, index, observed)


# =========================================================================== planner


@record(slots=True)
class _Assistant:
    """The current assistant A of spec 14.3."""

    entry_id: str
    content: object
    calls: Sequence[Mapping[str, Any]]
    answered: frozenset[str]
    """``tool_call_id``s of the tool messages after ``A.message`` in the transcript."""


def _current_assistant(transcript: Sequence[Message], step: Step) -> _Assistant | None:
    """A for a run whose step is settled; O(number of messages after A.message).

    Scans backwards from the end: tool messages seen before reaching the last assistant
    message are exactly the tool messages *after* ``A.message``. ``None`` only for a
    settled step without ``settledEntryId`` (impossible in a reduced state).
    """
    if step.settled_entry_id is None:
        return None
    answered: set[str] = set()
    for message in reversed(transcript):
        role = message["role"]
        if role == "assistant":
            return _Assistant(
                entry_id=step.settled_entry_id,
                content=message["content"],
                calls=message.get("tool_calls") or (),
                answered=frozenset(answered),
            )
        if role == "tool":
            answered.add(message["tool_call_id"])
    # No assistant message at all (impossible in a reduced state): no calls, no text.
    return _Assistant(step.settled_entry_id, None, (), frozenset(answered))


def _pending_tools(op: RunOperation, assistant_entry_id: str) -> dict[int, ToolCallState]:
    """toolIndex → the first pending started tool of A (spec 14.3 "pending")."""
    pending: dict[int, ToolCallState] = {}
    for tool in op.tool_calls:
        if (
            tool.assistant_entry_id == assistant_entry_id
            and tool.status is ToolStatus.PENDING
            and tool.tool_index not in pending
        ):
            pending[tool.tool_index] = tool
    return pending


def _pre_execution(assistant: _Assistant, index: int, reason: SyntheticReason) -> SyntheticResult:
    call = assistant.calls[index]
    return SyntheticResult(
        assistant_entry_id=assistant.entry_id,
        tool_index=index,
        tool_call_id=call["id"],
        tool_name=call["function"]["name"],
        reason=reason,
    )


def unanswered_calls(state: SessionState) -> tuple[SyntheticResult, ...]:
    """The results that answer every call of the run's current assistant message that has
    none yet: ``interrupted`` for a started call, a pre-execution ``aborted`` for one that
    never started (rule 2.2). Used whenever a run ends before its calls were all carried
    out, so that the transcript stays legal (every call answered exactly once)."""
    op = state.operation
    if not isinstance(op, RunOperation):
        return ()
    step = op.step
    if step is None or step.status is not StepStatus.SETTLED:
        return ()
    assistant = _current_assistant(state.transcript, step)
    if assistant is None or not assistant.calls:
        return ()
    pending = _pending_tools(op, assistant.entry_id)
    items: list[SyntheticResult] = []
    for index, call in enumerate(assistant.calls):
        if call["id"] in assistant.answered:
            continue
        tool = pending.get(index)
        if tool is not None:
            items.append(SyntheticResult.interrupted(tool))
        else:
            items.append(_pre_execution(assistant, index, SyntheticReason.ABORTED))
    return tuple(items)


def _boundary(state: SessionState, fallback: str) -> str:
    """B; ``fallback`` only when the state has none (impossible once a run/compaction exists)."""
    return state.context_boundary if state.context_boundary is not None else fallback


_FINISH_IDLE: Final = Finish.idle()
_FINISH_FAILED: Final = Finish.failed()
_FINISH_ABORTED: Final = Finish.aborted()


def plan_recovery(
    state: SessionState,
    current: CurrentConfiguration,
    observations: Observations | None = None,
) -> Plan:
    """The next action for ``state`` under ``current`` (spec 14.4, first matching rule wins).

    ``state`` must come from the reducer (messages in normalized form, 6.2); for states
    no reducer can produce the result is still one of the plan types, but unspecified.
    Without ``observations`` the result is always a spec plan (:data:`RecoveryPlan`);
    see :class:`Observations` for what evidence can change.
    """
    op = state.operation

    # Rule 1: nothing unfinished.
    if isinstance(op, IdleOperation):
        return _FINISH_IDLE

    step = op.step

    # Rule 2: an abort is handled before any retry, replay or continuation.
    if op.abort_requested:
        if step is not None and step.status is StepStatus.ATTEMPTING:  # 2.1
            return CloseAttempt()
        items = unanswered_calls(state)  # 2.2
        if items:
            return AppendSynthetic(items)
        return _FINISH_ABORTED  # 2.3

    # Rule 3: no attempt yet — the first attempt names the boundary B.
    if step is None:
        if isinstance(op, RunOperation):
            return StartStep(StepKind.ASSISTANT, 1, _boundary(state, op.input_entry_id))
        return StartStep(StepKind.COMPACTION, 1, _boundary(state, op.input_through_entry_id))

    # Rule 4: the step failed.
    if step.status is StepStatus.FAILED:
        return _FINISH_FAILED

    # Rule 5: an attempt is open (the process died during the model call).
    if step.status is StepStatus.ATTEMPTING:
        if step.attempt >= 2:
            return Blocked(BlockedReason.ATTEMPTS_EXHAUSTED)
        if step.configuration_digest != current.configuration_digest:
            return Blocked(BlockedReason.CONFIGURATION_CHANGED)
        return StartStep(step.step_kind, 2, step.context_through_entry_id, step.step_id)

    # Rule 6: a settled compaction step means the compaction entry is present.
    if isinstance(op, CompactionOperation):
        return Finish.compaction_completed(op.result_entry_id)

    assistant = _current_assistant(state.transcript, step)
    if assistant is None:  # settled without settledEntryId: no valid completion exists
        return _FINISH_FAILED

    # Rule 7: an answer without tool calls.
    if not assistant.calls:
        if step.stop_reason is StopReason.STOP and not is_blank(assistant.content):
            return Finish.completed(assistant.entry_id, Completion.NORMAL)
        return _FINISH_FAILED

    unanswered = [
        index for index, call in enumerate(assistant.calls) if call["id"] not in assistant.answered
    ]

    # Rule 8: a truncated answer's calls are never executed.
    if step.stop_reason is StopReason.LENGTH:
        if unanswered:
            return AppendSynthetic(
                tuple(
                    _pre_execution(assistant, index, SyntheticReason.TRUNCATED)
                    for index in unanswered
                )
            )
        return Finish.completed(assistant.entry_id, Completion.TRUNCATED)

    # Rule 9: resolve the lowest unanswered call. (Reached with stopReason toolUse; a
    # settled answer with calls and any other stop reason cannot be reduced.)
    if unanswered:
        index = unanswered[0]
        tool = _pending_tools(op, assistant.entry_id).get(index)
        if tool is None:  # unstarted
            call = assistant.calls[index]
            name = call["function"]["name"]
            if current.declaration(name) is None:
                return AppendSynthetic(
                    (_pre_execution(assistant, index, SyntheticReason.UNKNOWN_TOOL),)
                )
            arguments = parse_tool_arguments(call["function"]["arguments"])
            if arguments is None:
                return AppendSynthetic(
                    (_pre_execution(assistant, index, SyntheticReason.INVALID_ARGUMENTS),)
                )
            return StartTool(ToolMode.START, assistant.entry_id, index, name, arguments)
        # pending: started, outcome unknown
        if tool.environment_identity != current.environment_identity:
            return Blocked(BlockedReason.ENVIRONMENT_CHANGED)
        declaration = current.declaration(tool.tool_name)
        if declaration is None or not declaration.definition_digest:
            return Blocked(BlockedReason.CONFIGURATION_CHANGED)
        # ---- HOOK: executor reconciliation (journal / file hash / effect lookup). ----
        reconciled = _reconcile_pending(tool, assistant.entry_id, index, observations)
        if reconciled is not None:
            return reconciled
        # ------------------------------------------------------------------------------
        if tool.replay is Replay.SAFE:
            if declaration.replay is Replay.SAFE and declaration.replay_key == tool.replay_key:
                return StartTool(
                    ToolMode.REPLAY,
                    assistant.entry_id,
                    index,
                    tool.tool_name,
                    tool.arguments,
                    tool_started_id=tool.tool_started_id,
                )
            return Blocked(BlockedReason.REPLAY_DECLARATION_CHANGED)
        return AppendSynthetic((SyntheticResult.interrupted(tool),))

    # Rule 10: every call answered — the next assistant step starts at B.
    return StartStep(StepKind.ASSISTANT, 1, _boundary(state, assistant.entry_id))
