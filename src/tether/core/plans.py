"""The plan types of recovery (spec 14.2) and tether's two reconciliation plans.

Pure values: :func:`tether.core.planner.plan_recovery` returns one of them; the executor
carries it out. Every plan has ``to_json`` (the spec's JSON form, as ``tether plan`` prints
it) and :func:`plan_from_json` parses that form back. :class:`Observations` is the
planner's optional evidence input (out-of-log knowledge of started tools, as
:class:`~tether.core.reconcile.RecoveryDecision` values) and :class:`CompleteTool` /
:class:`AwaitReview` the plans only evidence can produce.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from itertools import pairwise
from typing import Any, ClassVar, Final, Literal, NoReturn, TypeAlias

from tether.core.contents import SYNTHETIC_CONTENT
from tether.core.reconcile import RecoveryDecision
from tether.core.records import field, record
from tether.core.state import StepKind, ToolCallState

__all__ = [
    "ABORTED_ERROR",
    "MODEL_ERROR",
    "PLAN_TYPES",
    "AppendSynthetic",
    "AwaitReview",
    "Blocked",
    "BlockedReason",
    "CloseAttempt",
    "CompleteTool",
    "Completion",
    "Finish",
    "Observations",
    "Outcome",
    "Plan",
    "PlanError",
    "RecoveryPlan",
    "StartStep",
    "StartTool",
    "SyntheticReason",
    "SyntheticResult",
    "ToolMode",
    "plan_from_json",
]


class Outcome(StrEnum):
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"


class Completion(StrEnum):
    NORMAL = "normal"
    TRUNCATED = "truncated"


class ToolMode(StrEnum):
    START = "start"
    REPLAY = "replay"


class SyntheticReason(StrEnum):
    INVALID_ARGUMENTS = "invalidArguments"
    UNKNOWN_TOOL = "unknownTool"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"

    @property
    def content(self) -> str:
        """The fixed tool-message content for this reason (spec 7.6)."""
        return SYNTHETIC_CONTENT[self.value]


class BlockedReason(StrEnum):
    CONFIGURATION_CHANGED = "configuration_changed"
    ENVIRONMENT_CHANGED = "environment_changed"
    REPLAY_DECLARATION_CHANGED = "replay_declaration_changed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"


@record(slots=True)
class PlanError:
    """An ``error`` member of a plan: ``{"code", "message"}``."""

    code: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


MODEL_ERROR: Final = PlanError("model_error", "provider request failed")
"""The one error of every failed finish (spec 14.2), whatever ``stepFailed`` said."""

ABORTED_ERROR: Final = PlanError("aborted", "Operation aborted")
"""The one error of ``closeAttempt`` (spec 14.2)."""


@record(slots=True)
class Finish:
    """``finish``: append ``operationFinished`` — or, in the idle form, do nothing.

    Only the six forms of spec 14.2 can be constructed; use the class methods.
    """

    outcome: Outcome
    completion: Completion | None = None
    final_entry_id: str | None = None
    error: PlanError | None = None

    type: ClassVar[Literal["finish"]] = "finish"

    def __post_init__(self) -> None:
        ok: bool
        if self.outcome is Outcome.COMPLETED:
            ok = self.error is None and (
                self.final_entry_id is not None or self.completion is Completion.NORMAL
            )
        elif self.outcome is Outcome.FAILED:
            ok = self.error is not None and self.completion is None and self.final_entry_id is None
        else:
            ok = self.error is None and self.completion is None and self.final_entry_id is None
        if not ok:
            raise ValueError(f"not a finish form of spec 14.2: {self!r}")

    @classmethod
    def idle(cls) -> Finish:
        return cls(Outcome.COMPLETED, Completion.NORMAL)

    @classmethod
    def completed(cls, final_entry_id: str, completion: Completion) -> Finish:
        """A completed run (normal or truncated) with its final assistant entry."""
        return cls(Outcome.COMPLETED, completion, final_entry_id)

    @classmethod
    def compaction_completed(cls, result_entry_id: str) -> Finish:
        return cls(Outcome.COMPLETED, None, result_entry_id)

    @classmethod
    def failed(cls) -> Finish:
        return cls(Outcome.FAILED, error=MODEL_ERROR)

    @classmethod
    def aborted(cls) -> Finish:
        return cls(Outcome.ABORTED)

    @property
    def is_idle(self) -> bool:
        """The idle form: nothing to append."""
        return (
            self.outcome is Outcome.COMPLETED
            and self.completion is Completion.NORMAL
            and self.final_entry_id is None
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "finish", "outcome": self.outcome.value}
        if self.completion is not None:
            out["completion"] = self.completion.value
        if self.final_entry_id is not None:
            out["finalEntryId"] = self.final_entry_id
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out


@record(slots=True)
class StartStep:
    """``startStep``: append ``stepAttempt`` and call the model.

    ``step_id`` is present exactly for attempt 2 (the step being retried).
    """

    step_kind: StepKind
    attempt: Literal[1, 2]
    context_through_entry_id: str
    step_id: str | None = None

    type: ClassVar[Literal["startStep"]] = "startStep"

    def __post_init__(self) -> None:
        if self.attempt not in (1, 2) or (self.attempt == 2) != (self.step_id is not None):
            raise ValueError(f"startStep needs a stepId exactly for attempt 2: {self!r}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "startStep",
            "stepKind": self.step_kind.value,
            "attempt": self.attempt,
        }
        if self.step_id is not None:
            out["stepId"] = self.step_id
        out["contextThroughEntryId"] = self.context_through_entry_id
        return out


@record(slots=True)
class StartTool:
    """``startTool``: start (``toolStarted`` then execute) or replay a started tool.

    ``tool_started_id`` is present exactly in ``replay`` mode.
    """

    mode: ToolMode
    assistant_entry_id: str
    tool_index: int
    tool_name: str
    arguments: Mapping[str, Any]
    tool_started_id: str | None = None

    type: ClassVar[Literal["startTool"]] = "startTool"

    def __post_init__(self) -> None:
        if (self.mode is ToolMode.REPLAY) != (self.tool_started_id is not None):
            raise ValueError(f"startTool needs a toolStartedId exactly for replay: {self!r}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "startTool",
            "mode": self.mode.value,
            "assistantEntryId": self.assistant_entry_id,
            "toolIndex": self.tool_index,
        }
        if self.tool_started_id is not None:
            out["toolStartedId"] = self.tool_started_id
        out["toolName"] = self.tool_name
        out["arguments"] = dict(self.arguments)
        return out


@record(slots=True)
class SyntheticResult:
    """One item of ``appendSynthetic``.

    ``interrupted`` items answer a started tool and carry ``tool_started_id`` and
    ``result_entry_id``; items with a pre-execution reason never do. ``content`` is
    always the fixed string of spec 7.6 for ``reason``.
    """

    assistant_entry_id: str
    tool_index: int
    tool_call_id: str
    tool_name: str
    reason: SyntheticReason
    tool_started_id: str | None = None
    result_entry_id: str | None = None

    def __post_init__(self) -> None:
        started = self.reason is SyntheticReason.INTERRUPTED
        if (self.tool_started_id is not None) != started or (
            self.result_entry_id is not None
        ) != started:
            raise ValueError(
                "synthetic items carry toolStartedId/resultEntryId exactly for "
                f"'interrupted': {self!r}"
            )

    @classmethod
    def interrupted(cls, tool: ToolCallState) -> SyntheticResult:
        """The ``interrupted`` item for a pending started tool (identifiers from ``tool``)."""
        return cls(
            assistant_entry_id=tool.assistant_entry_id,
            tool_index=tool.tool_index,
            tool_call_id=tool.tool_call_id,
            tool_name=tool.tool_name,
            reason=SyntheticReason.INTERRUPTED,
            tool_started_id=tool.tool_started_id,
            result_entry_id=tool.result_entry_id,
        )

    @property
    def content(self) -> str:
        return self.reason.content

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "assistantEntryId": self.assistant_entry_id,
            "toolIndex": self.tool_index,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
        }
        if self.tool_started_id is not None and self.result_entry_id is not None:
            out["toolStartedId"] = self.tool_started_id
            out["resultEntryId"] = self.result_entry_id
        out["reason"] = self.reason.value
        out["content"] = self.content
        return out


@record(slots=True)
class AppendSynthetic:
    """``appendSynthetic``: one transaction with one synthetic tool entry per item."""

    results: tuple[SyntheticResult, ...]

    type: ClassVar[Literal["appendSynthetic"]] = "appendSynthetic"

    def __post_init__(self) -> None:
        if not self.results:
            raise ValueError("appendSynthetic needs at least one result")
        indexes = [item.tool_index for item in self.results]
        if any(a >= b for a, b in pairwise(indexes)):
            raise ValueError(f"appendSynthetic results must be ordered by toolIndex: {indexes}")

    def to_json(self) -> dict[str, Any]:
        return {"type": "appendSynthetic", "results": [item.to_json() for item in self.results]}


@record(slots=True)
class CloseAttempt:
    """``closeAttempt``: append ``stepFailed`` for the open attempt with :data:`error`."""

    type: ClassVar[Literal["closeAttempt"]] = "closeAttempt"

    @property
    def error(self) -> PlanError:
        return ABORTED_ERROR

    def to_json(self) -> dict[str, Any]:
        return {"type": "closeAttempt", "error": ABORTED_ERROR.to_json()}


@record(slots=True)
class Blocked:
    """``blocked``: append nothing; report ``reason`` to the user."""

    reason: BlockedReason

    type: ClassVar[Literal["blocked"]] = "blocked"

    def to_json(self) -> dict[str, Any]:
        return {"type": "blocked", "reason": self.reason.value}


RecoveryPlan: TypeAlias = Finish | StartStep | StartTool | AppendSynthetic | CloseAttempt | Blocked
"""Exactly one of the six plan types of spec 14.2."""

PLAN_TYPES: Final = (Finish, StartStep, StartTool, AppendSynthetic, CloseAttempt, Blocked)
"""The plan classes, e.g. for ``isinstance(plan, PLAN_TYPES)``."""


# --------------------------------------------------------------------------- from JSON


def _plan_bad(problem: str) -> NoReturn:
    raise ValueError(f"invalid recovery plan: {problem}")


def _members(data: Mapping[str, Any], required: set[str], optional: set[str]) -> None:
    names = set(data)
    if not required <= names:
        _plan_bad(f"missing {sorted(required - names)}")
    if not names <= required | optional:
        _plan_bad(f"unexpected {sorted(names - required - optional)}")


def _str(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        _plan_bad(f"{name} must be a string")
    return value


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    return _str(data, name) if name in data else None


def _index(data: Mapping[str, Any], name: str) -> int:
    value = data[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _plan_bad(f"{name} must be a non-negative integer")
    return value


def _error(value: object, expected: PlanError | None = None) -> PlanError:
    if not isinstance(value, Mapping) or set(value) != {"code", "message"}:
        _plan_bad("error must be {code, message}")
    error = PlanError(value["code"], value["message"])
    if not isinstance(error.code, str) or not isinstance(error.message, str):
        _plan_bad("error code and message must be strings")
    if expected is not None and error != expected:
        _plan_bad(f"error must be {expected.to_json()}")
    return error


def _synthetic_from_json(data: object) -> SyntheticResult:
    if not isinstance(data, Mapping):
        _plan_bad("a synthetic result must be an object")
    base = {"assistantEntryId", "toolIndex", "toolCallId", "toolName", "reason", "content"}
    _members(data, base, {"toolStartedId", "resultEntryId"})
    try:
        reason = SyntheticReason(data["reason"])
    except ValueError:
        _plan_bad(f"unknown synthetic reason {data['reason']!r}")
    if data["content"] != reason.content:
        _plan_bad(f"content for {reason.value!r} must be the fixed string of spec 7.6")
    return SyntheticResult(
        assistant_entry_id=_str(data, "assistantEntryId"),
        tool_index=_index(data, "toolIndex"),
        tool_call_id=_str(data, "toolCallId"),
        tool_name=_str(data, "toolName"),
        reason=reason,
        tool_started_id=_opt_str(data, "toolStartedId"),
        result_entry_id=_opt_str(data, "resultEntryId"),
    )


def plan_from_json(data: Mapping[str, Any]) -> RecoveryPlan:
    """Parse the JSON form of a plan (inverse of ``to_json``); ``ValueError`` if malformed."""
    if not isinstance(data, Mapping):
        _plan_bad("a plan must be an object")
    kind = data.get("type")
    try:
        if kind == "finish":
            _members(data, {"type", "outcome"}, {"completion", "finalEntryId", "error"})
            completion = data.get("completion")
            error = data.get("error")
            return Finish(
                outcome=Outcome(data["outcome"]),
                completion=Completion(completion) if completion is not None else None,
                final_entry_id=_opt_str(data, "finalEntryId"),
                error=_error(error) if "error" in data else None,
            )
        if kind == "startStep":
            _members(data, {"type", "stepKind", "attempt", "contextThroughEntryId"}, {"stepId"})
            attempt = data["attempt"]
            if attempt not in (1, 2) or isinstance(attempt, bool):
                _plan_bad("attempt must be 1 or 2")
            return StartStep(
                step_kind=StepKind(data["stepKind"]),
                attempt=1 if attempt == 1 else 2,
                context_through_entry_id=_str(data, "contextThroughEntryId"),
                step_id=_opt_str(data, "stepId"),
            )
        if kind == "startTool":
            required = {"type", "mode", "assistantEntryId", "toolIndex", "toolName", "arguments"}
            _members(data, required, {"toolStartedId"})
            arguments = data["arguments"]
            if not isinstance(arguments, Mapping):
                _plan_bad("arguments must be an object")
            return StartTool(
                mode=ToolMode(data["mode"]),
                assistant_entry_id=_str(data, "assistantEntryId"),
                tool_index=_index(data, "toolIndex"),
                tool_name=_str(data, "toolName"),
                arguments=dict(arguments),
                tool_started_id=_opt_str(data, "toolStartedId"),
            )
        if kind == "appendSynthetic":
            _members(data, {"type", "results"}, set())
            results = data["results"]
            if not isinstance(results, (list, tuple)):
                _plan_bad("results must be an array")
            return AppendSynthetic(tuple(_synthetic_from_json(item) for item in results))
        if kind == "closeAttempt":
            _members(data, {"type", "error"}, set())
            _error(data["error"], ABORTED_ERROR)
            return CloseAttempt()
        if kind == "blocked":
            _members(data, {"type", "reason"}, set())
            return Blocked(BlockedReason(data["reason"]))
    except (TypeError, KeyError) as exc:  # e.g. an unhashable enum value
        _plan_bad(str(exc))
    _plan_bad(f"unknown plan type {kind!r}")


# =========================================================================== observations


@record(slots=True)
class Observations:
    """Out-of-log evidence for :func:`~tether.core.planner.plan_recovery`, keyed by
    ``toolStartedId``: the recovery decision of each started tool whose outcome the
    effects layer looked into (:func:`tether.core.reconcile.decide_pending`).

    When ``None`` or empty, the planner behaves exactly as spec 14.4 says. An
    observation is consulted only where the spec would replay the call or record it
    as ``interrupted`` (rule 9, pending branch, after the environment and declaration
    gates passed); it can turn that into :class:`CompleteTool` (COMPLETE), a replay
    (:class:`StartTool` in ``replay`` mode, same operation id: EXECUTE), or
    :class:`AwaitReview` (REVIEW). A SPEC decision changes nothing; an ABORT decision is
    the executor's to carry out (``abortRequested``) before it plans, and until then the
    planner waits like REVIEW: it appends nothing and never replays the call.
    """

    tool_outcomes: Mapping[str, RecoveryDecision] = field(default_factory=dict)


@record(slots=True)
class CompleteTool:
    """tether extension: append the result entry of a started tool whose outcome was
    established from evidence (spec 7.3 form: ``id`` = ``resultEntryId``)."""

    tool_started_id: str
    result_entry_id: str
    step_id: str
    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool = False

    type: ClassVar[Literal["completeTool"]] = "completeTool"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "completeTool",
            "toolStartedId": self.tool_started_id,
            "resultEntryId": self.result_entry_id,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "isError": self.is_error,
            "content": self.content,
        }


@record(slots=True)
class AwaitReview:
    """tether extension: the outcome of a started tool cannot be known; append
    nothing and wait for a person's decision (``tether review``)."""

    tool_started_id: str
    tool_name: str
    reason: str

    type: ClassVar[Literal["awaitReview"]] = "awaitReview"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "awaitReview",
            "toolStartedId": self.tool_started_id,
            "toolName": self.tool_name,
            "reason": self.reason,
        }


Plan: TypeAlias = RecoveryPlan | CompleteTool | AwaitReview
"""What :func:`plan_recovery` returns: a spec plan, or (only when observations are given)
one of tether's two reconciliation plans."""
