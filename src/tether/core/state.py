"""Reduced session state (spec section 11): frozen values, no I/O.

A :class:`SessionState` is an immutable snapshot. Messages are kept as the JSON
objects the reducer validated (``dict``s with only the normalized members); treat
them as read-only. ``transcript`` and ``active_context`` are :class:`FrozenView`s:
O(1) snapshots of the reducer's append-only lists, so taking a snapshot after
every transaction never copies the history.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Generic, Literal, TypeVar, overload

# The enums and the token counters are defined in tether.core.kinds (a model response, a
# tool and a run's result name them without the state's dataclasses) and are this module's
# names too: import them from either.
from tether.core.kinds import Replay as Replay
from tether.core.kinds import StepKind as StepKind
from tether.core.kinds import StepStatus as StepStatus
from tether.core.kinds import StopReason as StopReason
from tether.core.kinds import ToolStatus as ToolStatus
from tether.core.kinds import Usage as Usage

Message = Mapping[str, Any]
"""A normalized provider message (spec 6.2), read-only by convention."""


_T = TypeVar("_T")


class FrozenView(Sequence[_T], Generic[_T]):
    """A read-only, fixed-length view of the first ``length`` items of a list.

    The reducer only ever appends to the lists behind these views (or replaces them
    wholesale), and a rolled-back transaction only removes items it appended itself,
    so a view taken between transactions never changes.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[_T], length: int | None = None) -> None:
        self._items = items
        self._length = len(items) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if isinstance(index, slice):
            return self._items[: self._length][index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("FrozenView index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[_T]:
        # islice iterates in C: a request is built from the whole active context each step.
        return islice(self._items, self._length)

    def __reversed__(self) -> Iterator[_T]:
        items = self._items
        for i in range(self._length - 1, -1, -1):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenView):
            return list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FrozenView(len={self._length})"


def normalize_message(message: Message) -> dict[str, Any]:
    """The normalized form (spec 6.2): members in canonical order, nothing else."""
    role = message["role"]
    if role == "tool":
        return {
            "role": "tool",
            "content": message["content"],
            "tool_call_id": message["tool_call_id"],
        }
    out: dict[str, Any] = {"role": role, "content": message["content"]}
    calls = message.get("tool_calls")
    if role == "assistant" and calls is not None:
        out["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                },
            }
            for call in calls
        ]
    return out


@dataclass(frozen=True, slots=True)
class Header:
    id: str
    created_at: int
    cwd: str
    provider: str
    model: str
    environment_identity: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "createdAt": self.created_at,
            "cwd": self.cwd,
            "provider": self.provider,
            "model": self.model,
            "environmentIdentity": self.environment_identity,
        }


@dataclass(frozen=True, slots=True)
class ToolConfig:
    """One model-facing tool of a configuration snapshot."""

    name: str
    definition_digest: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "definitionDigest": self.definition_digest}


@dataclass(frozen=True, slots=True)
class ConfigurationSnapshot:
    """Everything that shapes a model request (spec 10.2)."""

    model: str
    system_prompt_digest: str
    tools: tuple[ToolConfig, ...]
    adapter_identity: str
    routing_identity: str
    output_options_digest: str

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "systemPromptDigest": self.system_prompt_digest,
            "tools": [tool.to_json() for tool in self.tools],
            "adapterIdentity": self.adapter_identity,
            "routingIdentity": self.routing_identity,
            "outputOptionsDigest": self.output_options_digest,
        }

    def tool_names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self.tools)


@dataclass(frozen=True, slots=True)
class Step:
    """The most recent model attempt of an operation (spec 11.1)."""

    operation_id: str
    step_id: str
    attempt_id: str
    attempt: int
    step_kind: StepKind
    status: StepStatus
    context_through_entry_id: str
    configuration_snapshot: ConfigurationSnapshot
    configuration_digest: str
    settled_entry_id: str | None = None
    stop_reason: StopReason | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operationId": self.operation_id,
            "stepId": self.step_id,
            "attemptId": self.attempt_id,
            "attempt": self.attempt,
            "stepKind": self.step_kind.value,
            "status": self.status.value,
            "contextThroughEntryId": self.context_through_entry_id,
            "configurationSnapshot": self.configuration_snapshot.to_json(),
            "configurationDigest": self.configuration_digest,
        }
        if self.settled_entry_id is not None:
            out["settledEntryId"] = self.settled_entry_id
        if self.stop_reason is not None:
            out["stopReason"] = self.stop_reason.value
        return out


@dataclass(frozen=True, slots=True)
class ToolCallState:
    """A started tool of the active run (one per ``toolStarted`` record)."""

    operation_id: str
    tool_started_id: str
    step_id: str
    assistant_entry_id: str
    tool_index: int
    tool_call_id: str
    tool_name: str
    arguments: Mapping[str, Any]
    replay: Replay
    replay_key: str
    environment_identity: str
    result_entry_id: str
    status: ToolStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "toolStartedId": self.tool_started_id,
            "stepId": self.step_id,
            "assistantEntryId": self.assistant_entry_id,
            "toolIndex": self.tool_index,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "arguments": self.arguments,
            "replay": self.replay.value,
            "replayKey": self.replay_key,
            "environmentIdentity": self.environment_identity,
            "resultEntryId": self.result_entry_id,
            "status": self.status.value,
        }


@dataclass(frozen=True, slots=True)
class IdleOperation:
    kind: Literal["idle"] = "idle"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "idle"}


@dataclass(frozen=True, slots=True)
class RunOperation:
    operation_id: str
    input_entry_id: str
    tool_calls: tuple[ToolCallState, ...]
    abort_requested: bool
    step: Step | None
    kind: Literal["run"] = "run"
    # What the run had spent before this state, as the log says (not part of the serialized
    # state, never compared): the budgets count every process that drove the run, so a
    # resume continues the spend instead of starting over (docs/config.md, [budget]).
    usage_at_start: Usage | None = field(default=None, compare=False)
    """The session's usage total when ``runStarted`` was accepted (``None``: zero)."""
    started_ms: int | None = field(default=None, compare=False)
    """The ``timestamp`` of the ``runStarted`` fact (the writer's clock, milliseconds)."""
    entries_from: int = field(default=0, compare=False)
    """The transcript's length when the run started: its entries are the ones after."""

    def spent(self, session_usage: Usage) -> Usage:
        """The run's usage so far, given the session's total (``SessionState.usage``)."""
        start = self.usage_at_start
        return session_usage if start is None else session_usage - start

    def tool_call(self, tool_started_id: str) -> ToolCallState:
        """The started call ``tool_started_id`` of this run (:class:`LookupError` if none)."""
        for call in self.tool_calls:
            if call.tool_started_id == tool_started_id:
                return call
        raise LookupError(f"no started tool call {tool_started_id} in run {self.operation_id}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "run",
            "operationId": self.operation_id,
            "inputEntryId": self.input_entry_id,
            "toolCalls": [tool.to_json() for tool in self.tool_calls],
            "abortRequested": self.abort_requested,
        }
        if self.step is not None:
            out["step"] = self.step.to_json()
        return out


@dataclass(frozen=True, slots=True)
class CompactionOperation:
    operation_id: str
    input_through_entry_id: str
    result_entry_id: str
    abort_requested: bool
    step: Step | None
    kind: Literal["compaction"] = "compaction"
    compacted_through_entry_id: str | None = None
    """Last id of the writer's ``compactedEntryIds`` (not part of the serialized state;
    ``None`` when that member is not a non-empty list of strings)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "compaction",
            "operationId": self.operation_id,
            "inputThroughEntryId": self.input_through_entry_id,
            "resultEntryId": self.result_entry_id,
            "abortRequested": self.abort_requested,
        }
        if self.step is not None:
            out["step"] = self.step.to_json()
        return out


Operation = IdleOperation | RunOperation | CompactionOperation

IDLE = IdleOperation()


@dataclass(frozen=True, slots=True)
class FinishedOperation:
    """The last ``operationFinished`` of the log, as recorded (internal bookkeeping per
    spec 11.2: not part of the serialized state). ``error`` is the recorded
    ``{"code", "message"}`` of a failed operation."""

    operation_id: str
    kind: Literal["run", "compaction"]
    outcome: Literal["completed", "failed", "aborted"]
    completion: str | None = None
    error: Mapping[str, str] | None = None
    final_entry_id: str | None = None


@dataclass(frozen=True, slots=True)
class PersonDenial:
    """A call a person denied (tether's convention on top of the format: its error result,
    committed with its ``toolStarted`` in one transaction, starts with
    :data:`~tether.core.contents.PERSON_DENIAL_PREFIX`). Internal bookkeeping of the
    reducer, not part of the serialized state; read by
    :func:`tether.core.policy.standing_denial`."""

    tool_name: str
    assistant_entry_id: str
    tool_index: int
    position: int
    """The transcript position of the assistant entry that asked for the call: with
    ``tool_index``, the call's place in the session's order of calls."""
    result_entry_id: str

    @property
    def order(self) -> tuple[int, int]:
        """The call's place in the session's order of calls."""
        return (self.position, self.tool_index)


@dataclass(frozen=True, slots=True)
class SessionState:
    """What a valid session log means (spec 11).

    ``context_boundary`` is the internal context boundary B (spec 11.2/11.3): the
    entry every first attempt must name; ``None`` before any message entry.
    ``last_seq`` is the ``seq`` of the last accepted fact (0 when there is none).
    ``transcript_ids`` are the entry ids of the ``transcript`` messages (same order) and
    ``step_count`` the number of steps recorded so far (first attempts), and
    ``last_finished`` the last finished operation (``None`` before the first);
    ``failed_results`` the ``transcript`` indices (ascending) of the tool results that
    are not a success (an ``error``, or a synthetic result: the call never ran), which an
    adapter may mark as failed (Anthropic's ``is_error``); ``person_denials`` the calls a
    person denied, in log order. None of these is part of the serialized state.
    """

    header: Header
    transcript: Sequence[Message]
    active_context: Sequence[Message]
    usage: Usage
    operation: Operation
    repaired_length: int
    context_boundary: str | None = None
    last_seq: int = 0
    transcript_ids: Sequence[str] = ()
    failed_results: Sequence[int] = ()
    step_count: int = 0
    last_finished: FinishedOperation | None = None
    person_denials: Sequence[PersonDenial] = ()

    def to_json(self) -> dict[str, Any]:
        """Exactly the six public members of the spec's serialized state."""
        return {
            "header": self.header.to_json(),
            "transcript": [normalize_message(m) for m in self.transcript],
            "activeContext": [normalize_message(m) for m in self.active_context],
            "usage": self.usage.to_json(),
            "operation": self.operation.to_json(),
            "repairedLength": self.repaired_length,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionState:
        """Rebuild a state from :meth:`to_json` output (the internal boundary is lost)."""
        header = data["header"]
        return cls(
            header=Header(
                id=header["id"],
                created_at=header["createdAt"],
                cwd=header["cwd"],
                provider=header["provider"],
                model=header["model"],
                environment_identity=header["environmentIdentity"],
            ),
            transcript=tuple(normalize_message(m) for m in data["transcript"]),
            active_context=tuple(normalize_message(m) for m in data["activeContext"]),
            usage=Usage.from_json(data["usage"]),
            operation=_operation_from_json(data["operation"]),
            repaired_length=data["repairedLength"],
        )


def _snapshot_from_json(data: Mapping[str, Any]) -> ConfigurationSnapshot:
    return ConfigurationSnapshot(
        model=data["model"],
        system_prompt_digest=data["systemPromptDigest"],
        tools=tuple(ToolConfig(t["name"], t["definitionDigest"]) for t in data["tools"]),
        adapter_identity=data["adapterIdentity"],
        routing_identity=data["routingIdentity"],
        output_options_digest=data["outputOptionsDigest"],
    )


def _step_from_json(data: Mapping[str, Any] | None) -> Step | None:
    if data is None:
        return None
    stop = data.get("stopReason")
    return Step(
        operation_id=data["operationId"],
        step_id=data["stepId"],
        attempt_id=data["attemptId"],
        attempt=data["attempt"],
        step_kind=StepKind(data["stepKind"]),
        status=StepStatus(data["status"]),
        context_through_entry_id=data["contextThroughEntryId"],
        configuration_snapshot=_snapshot_from_json(data["configurationSnapshot"]),
        configuration_digest=data["configurationDigest"],
        settled_entry_id=data.get("settledEntryId"),
        stop_reason=StopReason(stop) if stop is not None else None,
    )


def _operation_from_json(data: Mapping[str, Any]) -> Operation:
    kind = data["kind"]
    if kind == "idle":
        return IDLE
    if kind == "run":
        return RunOperation(
            operation_id=data["operationId"],
            input_entry_id=data["inputEntryId"],
            tool_calls=tuple(
                ToolCallState(
                    operation_id=t["operationId"],
                    tool_started_id=t["toolStartedId"],
                    step_id=t["stepId"],
                    assistant_entry_id=t["assistantEntryId"],
                    tool_index=t["toolIndex"],
                    tool_call_id=t["toolCallId"],
                    tool_name=t["toolName"],
                    arguments=t["arguments"],
                    replay=Replay(t["replay"]),
                    replay_key=t["replayKey"],
                    environment_identity=t["environmentIdentity"],
                    result_entry_id=t["resultEntryId"],
                    status=ToolStatus(t["status"]),
                )
                for t in data["toolCalls"]
            ),
            abort_requested=data["abortRequested"],
            step=_step_from_json(data.get("step")),
        )
    return CompactionOperation(
        operation_id=data["operationId"],
        input_through_entry_id=data["inputThroughEntryId"],
        result_entry_id=data["resultEntryId"],
        abort_requested=data["abortRequested"],
        step=_step_from_json(data.get("step")),
    )
