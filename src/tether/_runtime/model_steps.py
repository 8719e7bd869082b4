"""The executor's model-step family: one model attempt, streamed, settled or failed.

``startStep`` (docs/runtime.md, "The loop"): 1. commit ``stepAttempt`` (a durable point:
the request is never sent before it); 2. boundary ``attempt_recorded``; 3. build the
request from the active context (plus the compaction instruction); 4. call the model,
streaming its deltas as events; an error commits ``[stepFailed, operationFinished failed]``
and, for a transient failure of a run, the durable retry schedule
(:class:`~tether._runtime.retry.RetrySchedule`); 5. boundary ``response_received``; 6.
commit the assistant entry (its reasoning side record durable first) or the compaction
entry, with the attempt's usage. ``closeAttempt`` closes an attempt a crash or an abort
left open.

Rules of this module:

* the request is built from the state only (no copy of the history per step: the context
  is the state's read-only view) and the composition's parts;
* reasoning side records are read through a cache: a record is written before its entry
  and never changes, and a session known to have none skips the walk entirely;
* ``isinstance`` here only narrows the state's active operation (a run or a compaction);
  which plan this is was decided by the executor's table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tether._faults as faults
import tether._runtime.boundaries as boundaries
import tether._runtime.events as events
from tether._models.base import ModelRequest, ModelResponse, call_model
from tether._runtime.drive import Drive, Shell
from tether._runtime.recovery import request_abort
from tether._runtime.retry import RetrySchedule
from tether._stores.protocol import SessionStoreProtocol
from tether._stores.reasoning import (
    align_context_ids,
    read_side_record,
    wants_side_record,
    write_side_record,
)
from tether.core import facts
from tether.core.compaction import COMPACTION_INSTRUCTION, COMPACTION_SYSTEM_PROMPT, plan_split
from tether.core.plans import ABORTED_ERROR, CloseAttempt, StartStep
from tether.core.state import CompactionOperation, RunOperation, SessionState, StepKind
from tether.errors import ModelError

__all__ = ["ModelSteps"]


class ModelSteps:
    """Model attempts over one :class:`Shell`; a transient failure of a run is scheduled
    for a retry on ``retries``."""

    def __init__(self, shell: Shell, retries: RetrySchedule) -> None:
        self._shell = shell
        self._parts = shell.parts
        self._retries = retries
        self._side_cache: dict[tuple[str, str], Any] = {}
        # Whether a held session has any reasoning side record: most have none, and then a
        # request needs no walk over the whole context to find them (see _side_reasoning).
        self._has_side: dict[str, bool] = {}
        # And those with no side record at all (nor reported cost): their cost needs no look
        # for records either (Spending.cost).
        self._without_side = self._parts.spending.without_side_records

    def forget(self, session_id: str) -> None:
        """The session was (re)opened: what another writer may have left is not known."""
        self._has_side.pop(session_id, None)
        self._without_side.discard(session_id)

    # ------------------------------------------------------------------ startStep

    def start_step(self, drive: Drive, state: SessionState, plan: StartStep) -> None:
        """``startStep``: one model attempt (docs/runtime.md, "The loop")."""
        store = drive.store
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        # 1. commit stepAttempt (a new step id unless this is attempt 2 of the step)
        step_id = plan.step_id if plan.step_id is not None else self._shell.ids()
        attempt_id = self._shell.ids()
        configuration = self._parts.configuration
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
        request = self._request(store, state, plan)
        self._shell.emit(
            events.ModelStarted(
                operation=operation.kind, attempt=plan.attempt, position=request.position
            )
        )
        # 4. call the model; an error commits [stepFailed, operationFinished failed]
        try:
            response = call_model(
                self._parts.model,
                request,
                cancel=self._shell.cancel,
                on_delta=self._delta if self._shell.listened else None,
            )
        except ModelError as exc:
            self._failed(store, state, step_id, attempt_id, exc)
            return
        # 5. boundary response_received
        faults.hit(boundaries.RESPONSE_RECEIVED)
        # 6. commit [assistant entry, usage], or [compaction entry, usage]
        if plan.step_kind is StepKind.COMPACTION:
            assert isinstance(operation, CompactionOperation)
            self._settle_compaction(store, state, operation, attempt_id, response)
        else:
            self._settle_assistant(store, operation, step_id, attempt_id, response)

    def _request(
        self, store: SessionStoreProtocol, state: SessionState, plan: StartStep
    ) -> ModelRequest:
        compaction = plan.step_kind is StepKind.COMPACTION
        # The context is passed as the state's read-only view, not copied: a copy per step
        # would cost the whole history each step.
        messages: Sequence[Mapping[str, Any]] = state.active_context
        if compaction:
            messages = [*messages, {"role": "user", "content": COMPACTION_INSTRUCTION}]
        parts = self._parts
        return ModelRequest(
            system_prompt=COMPACTION_SYSTEM_PROMPT if compaction else parts.system_prompt,
            messages=messages,
            tools=() if compaction else parts.registry.definitions(),
            output_options=parts.output_options,
            position=max(state.step_count - 1, 0),
            purpose="compaction" if compaction else "assistant",
            reasoning=self._side_reasoning(store, state, state.active_context),
            failed_results=_failed_in_context(state),
        )

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
        records = False
        for message, entry_id in zip(messages, ids, strict=True):
            record = None
            if entry_id is not None and message.get("role") == "assistant":
                # A record is written before its entry and never changes: cache hits and misses.
                key = (store.session_id, entry_id)
                if key not in self._side_cache:
                    self._side_cache[key] = read_side_record(store, entry_id)
                record = self._side_cache[key]
                records = records or record is not None
            out.append(record.reasoning if record is not None else None)
        found = any(r is not None for r in out)
        if not found and len(ids) == len(state.transcript):
            # The whole transcript was looked at (no compaction hides a part): none exists.
            self._has_side[store.session_id] = False
            if not records:
                self._without_side.add(store.session_id)
        return out if found else []

    def _delta(self, delta: Any) -> None:
        self._shell.emit(events.ModelDelta(channel=delta.channel, text=delta.text))

    # ------------------------------------------------------------------ the outcome

    def _failed(
        self,
        store: SessionStoreProtocol,
        state: SessionState,
        step_id: str,
        attempt_id: str,
        exc: ModelError,
    ) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        self._shell.emit(events.ModelFailed(code=exc.code, message=exc.message))
        if exc.code == "aborted" and self._shell.cancel.is_set():
            # The planner closes the attempt as aborted and finishes the operation.
            request_abort(store, state)
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
        self._shell.emit(events.OperationFinished(operation=operation.kind, outcome="failed"))
        if isinstance(operation, RunOperation):  # only a run is retried (a new run)
            self._retries.schedule(store, operation, exc)

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
            entry["id"] = self._shell.ids()
            self._has_side[store.session_id] = True
            self._without_side.discard(store.session_id)
            write_side_record(
                store,
                entry_id=entry["id"],
                attempt_id=attempt_id,
                response=response,
                mask=self._parts.masker.text,
            )
        store.commit([entry, _usage_fact(operation.operation_id, response, attempt_id)], sync=False)
        self._shell.emit(
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
                _usage_fact(operation.operation_id, response, attempt_id),
            ],
            sync=False,
        )
        self._shell.emit(events.ModelFinished(stop_reason=response.stop_reason.value, text=None))
        self._emit_usage(response)

    def _emit_usage(self, response: ModelResponse) -> None:
        usage = response.usage
        self._shell.emit(
            events.UsageReported(
                input=usage.input,
                output=usage.output,
                cache_read=usage.cache_read,
                cache_write=usage.cache_write,
                reasoning_tokens=response.reasoning_tokens,
                cost=response.cost,
            )
        )

    # ------------------------------------------------------------------ closeAttempt

    def close_attempt(self, drive: Drive, state: SessionState, plan: CloseAttempt) -> None:
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


def _usage_fact(operation_id: str, response: ModelResponse, attempt_id: str) -> dict[str, Any]:
    return facts.usage(
        operation_id=operation_id, counters=response.usage.to_json(), attempt_id=attempt_id
    )


def _failed_in_context(state: SessionState) -> frozenset[int]:
    """The active-context indices of the failed tool results (``state.failed_results`` are
    transcript indices). The context is the transcript, or a summary followed by a suffix
    of it, so index ``t`` of the transcript is ``t - shift`` of the context, if it is
    there at all; costs one comparison per failure, not a walk of the history."""
    failed = state.failed_results
    if not failed:
        return frozenset()
    transcript, context = state.transcript, state.active_context
    shift = len(transcript) - len(context)
    return frozenset(
        t - shift
        for t in failed
        if 0 <= t - shift < len(context)
        and t < len(transcript)
        and context[t - shift] == transcript[t]
    )
