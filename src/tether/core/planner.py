"""The recovery planner (spec section 14): what to do next with a reduced session.

:func:`plan_recovery` maps a :class:`~tether.core.state.SessionState` and the
runtime's :class:`CurrentConfiguration` to exactly one :data:`RecoveryPlan`, following
the decision procedure of spec 14.4 (first matching rule wins) with the terms of 14.3.
Where tiny-agent's reference planners differ from the spec (spec 17), this module
follows the spec column.

Everything here is pure: no I/O, clock, environment, randomness or mutable globals.
The planner never allocates IDs; the writer does that when it applies a plan (15.3).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any, ClassVar, Final, Literal, NoReturn, TypeAlias

from tether.core.contents import SYNTHETIC_CONTENT, is_blank
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
from tether.errors import ConfigurationError

__all__ = [
    "ABORTED_ERROR",
    "MAX_ARGUMENT_DEPTH",
    "MAX_ARGUMENT_INTEGER_DIGITS",
    "MODEL_ERROR",
    "PLAN_TYPES",
    "AppendSynthetic",
    "AwaitReview",
    "Blocked",
    "BlockedReason",
    "CloseAttempt",
    "CompleteTool",
    "Completion",
    "CurrentConfiguration",
    "Finish",
    "Observations",
    "ObservedAction",
    "Outcome",
    "Plan",
    "PlanError",
    "RecoveryPlan",
    "StartStep",
    "StartTool",
    "SyntheticReason",
    "SyntheticResult",
    "ToolDeclaration",
    "ToolMode",
    "ToolObservation",
    "parse_tool_arguments",
    "plan_from_json",
    "plan_recovery",
    "unanswered_calls",
]


# =========================================================================== current


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _short(value: str, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(path: str, problem: str) -> NoReturn:
    raise ConfigurationError(f"invalid current configuration: {path}: {problem}")


def _closed_object(value: object, path: str, members: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _bad(path, f"expected an object, got {_json_kind(value)}")
    for name in value:
        if name not in members:
            shown = _short(name) if isinstance(name, str) else repr(name)
            _bad(path, f"unexpected member {shown}")
    for name in members:
        if name not in value:
            _bad(f"{path}.{name}", "missing required member")
    return value


def _text_member(obj: Mapping[str, Any], path: str, name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        _bad(f"{path}.{name}", f"expected a non-empty string, got {_json_kind(value)}")
    if not value:
        _bad(f"{path}.{name}", "expected a non-empty string, got an empty string")
    return value


def _digest_member(obj: Mapping[str, Any], path: str, name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        _bad(f"{path}.{name}", f"expected a digest string, got {_json_kind(value)}")
    if _DIGEST.fullmatch(value) is None:
        _bad(
            f"{path}.{name}",
            f"expected 'sha256:' followed by 64 lower-case hex digits, got {_short(value)}",
        )
    return value


@dataclass(frozen=True, slots=True)
class ToolDeclaration:
    """One trusted, pre-classified tool of the runtime (an item of ``current.tools``)."""

    name: str
    definition_digest: str
    replay: Replay
    replay_key: str

    _MEMBERS: ClassVar[tuple[str, ...]] = ("name", "definitionDigest", "replay", "replayKey")

    @classmethod
    def from_json(cls, data: object, path: str = "tool") -> ToolDeclaration:
        """Validate one ``current.tools`` item; :class:`ConfigurationError` if malformed."""
        obj = _closed_object(data, path, cls._MEMBERS)
        name = _text_member(obj, path, "name")
        definition_digest = _digest_member(obj, path, "definitionDigest")
        replay = obj["replay"]
        if not isinstance(replay, str) or replay not in (Replay.SAFE.value, Replay.NEVER.value):
            shown = _short(replay) if isinstance(replay, str) else _json_kind(replay)
            _bad(f"{path}.replay", f'expected "safe" or "never", got {shown}')
        replay_key = _text_member(obj, path, "replayKey")
        return cls(name, definition_digest, Replay(replay), replay_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "definitionDigest": self.definition_digest,
            "replay": self.replay.value,
            "replayKey": self.replay_key,
        }


@dataclass(frozen=True, slots=True)
class CurrentConfiguration:
    """The planner's ``current`` input (spec 14.1).

    The constructor does not validate (tests build deliberately odd values); use
    :meth:`from_json` for untrusted input.
    """

    configuration_digest: str
    environment_identity: str
    tools: tuple[ToolDeclaration, ...] = ()

    _MEMBERS: ClassVar[tuple[str, ...]] = ("configurationDigest", "environmentIdentity", "tools")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurrentConfiguration:
        """Validate the shape of ``current-configuration.schema.json`` and build the value.

        Raises :class:`~tether.errors.ConfigurationError` with a one-line message naming
        the offending member (e.g. ``current.tools[1].replay``).
        """
        obj = _closed_object(data, "current", cls._MEMBERS)
        digest = _digest_member(obj, "current", "configurationDigest")
        environment = _text_member(obj, "current", "environmentIdentity")
        tools = obj["tools"]
        if not isinstance(tools, (list, tuple)):
            _bad("current.tools", f"expected an array, got {_json_kind(tools)}")
        return cls(
            configuration_digest=digest,
            environment_identity=environment,
            tools=tuple(
                ToolDeclaration.from_json(item, f"current.tools[{index}]")
                for index, item in enumerate(tools)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "configurationDigest": self.configuration_digest,
            "environmentIdentity": self.environment_identity,
            "tools": [tool.to_json() for tool in self.tools],
        }

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The *first* declaration named ``name`` (spec 14.3), or ``None``."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None


# =========================================================================== plans


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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class CloseAttempt:
    """``closeAttempt``: append ``stepFailed`` for the open attempt with :data:`error`."""

    type: ClassVar[Literal["closeAttempt"]] = "closeAttempt"

    @property
    def error(self) -> PlanError:
        return ABORTED_ERROR

    def to_json(self) -> dict[str, Any]:
        return {"type": "closeAttempt", "error": ABORTED_ERROR.to_json()}


@dataclass(frozen=True, slots=True)
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


class ObservedAction(StrEnum):
    """What out-of-log evidence established about a started tool's effect."""

    COMPLETE = "complete"
    """The outcome is known: append the started call's result entry (spec 7.3)."""
    EXECUTE = "execute"
    """The effect provably never happened: run the call once, same operation id."""
    REVIEW = "review"
    """The outcome cannot be known: stop until a person decides."""


@dataclass(frozen=True, slots=True)
class ToolObservation:
    """Evidence about one started tool, gathered by the executor before planning
    (action journal and file hashes, an effect lookup by operation id, a review
    decision). ``content``/``is_error`` are the result to record for COMPLETE."""

    action: ObservedAction
    content: str | None = None
    is_error: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.action is ObservedAction.COMPLETE) != (self.content is not None):
            raise ValueError("an observation carries content exactly when it completes")


@dataclass(frozen=True, slots=True)
class Observations:
    """Out-of-log evidence for :func:`plan_recovery`, keyed by ``toolStartedId``.

    When ``None`` or empty, the planner behaves exactly as spec 14.4 says. An
    observation is consulted only where the spec would replay the call or record it
    as ``interrupted`` (rule 9, pending branch, after the environment and declaration
    gates passed); it can turn that into :class:`CompleteTool`, a replay
    (:class:`StartTool` in ``replay`` mode, same operation id), or :class:`AwaitReview`.
    """

    tool_outcomes: Mapping[str, ToolObservation] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
    if observed.action is ObservedAction.COMPLETE:
        assert observed.content is not None
        return CompleteTool(
            tool_started_id=tool.tool_started_id,
            result_entry_id=tool.result_entry_id,
            step_id=tool.step_id,
            tool_call_id=tool.tool_call_id,
            tool_name=tool.tool_name,
            content=observed.content,
            is_error=observed.is_error,
        )
    if observed.action is ObservedAction.EXECUTE:
        return StartTool(
            ToolMode.REPLAY,
            assistant_entry_id,
            index,
            tool.tool_name,
            tool.arguments,
            tool_started_id=tool.tool_started_id,
        )
    return AwaitReview(tool.tool_started_id, tool.tool_name, observed.reason)


# =========================================================================== arguments


MAX_ARGUMENT_DEPTH: Final = 128
"""Deepest array/object nesting accepted in tool-call arguments (top-level object = 1)."""

MAX_ARGUMENT_INTEGER_DIGITS: Final = 640
"""Longest integer literal accepted in tool-call arguments.

640 is the smallest value Python's process-wide ``int_max_str_digits`` can be set to,
so parsing never depends on that global.
"""


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON token {name}")


def _parse_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_ARGUMENT_INTEGER_DIGITS:
        raise ValueError("integer literal too long")
    return int(text)


def _well_formed(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate
        return False
    return True


def _persistable(value: object) -> bool:
    """Can ``value`` be written in a ``toolStarted`` record and read back unchanged?"""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_ARGUMENT_DEPTH:
                return False
            for key, member in item.items():
                if not _well_formed(key):
                    return False
                stack.append((member, depth + 1))
        elif isinstance(item, list):
            if depth > MAX_ARGUMENT_DEPTH:
                return False
            stack.extend((member, depth + 1) for member in item)
        elif isinstance(item, str):
            if not _well_formed(item):
                return False
        elif isinstance(item, float) and not math.isfinite(item):
            return False
    return True


def parse_tool_arguments(text: object) -> dict[str, Any] | None:
    """Parse a tool call's ``function.arguments`` (spec 14.4 rule 9); ``None`` if invalid.

    Valid means: RFC 8259 JSON text (``NaN``/``Infinity`` rejected, surrounding JSON
    whitespace allowed) whose top-level value is an object. Duplicate member names are
    accepted, the last one wins (as in every reference parser). Values that could not be
    persisted in ``toolStarted`` and read back by a spec reducer are also invalid:
    unpaired surrogates, numbers that overflow to infinity, integer literals longer than
    :data:`MAX_ARGUMENT_INTEGER_DIGITS` digits and nesting deeper than
    :data:`MAX_ARGUMENT_DEPTH` (the reference parsers disagree on all of these).
    """
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not _persistable(value):
        return None
    return value


# =========================================================================== planner


@dataclass(frozen=True, slots=True)
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
