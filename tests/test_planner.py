"""Recovery planner (spec section 14): golden cases, every rule of 14.4, properties.

* Conformance: every case of ``planner-fixtures/manifest.json`` (the repository's copy of
  the spec bundle under ``tests/conformance/``; a missing file or fewer than
  :data:`MIN_PLANNER_CASES` cases fail the collection) is reduced with the real reducer and
  planned; the plan must equal the expected JSON.
* Unit tests build states directly from the ``state.py`` dataclasses, one test (or
  parametrized group) per rule and branch of 14.4, plus the plan and ``current`` types.
* A hypothesis property checks that arbitrary states never make the planner raise and
  that every plan serializes to JSON valid under ``recovery-plan.schema.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from fixturekit import MissingFixtures, at_least, conformance_path
from tether.core import contents
from tether.core.arguments import MAX_ARGUMENT_DEPTH, parse_tool_arguments
from tether.core.contents import SYNTHETIC_CONTENT, WHITESPACE, is_blank
from tether.core.current import CurrentConfiguration, ToolDeclaration
from tether.core.planner import plan_recovery
from tether.core.plans import (
    ABORTED_ERROR,
    MODEL_ERROR,
    PLAN_TYPES,
    AppendSynthetic,
    AwaitReview,
    Blocked,
    BlockedReason,
    CloseAttempt,
    CompleteTool,
    Completion,
    Finish,
    Observations,
    Outcome,
    PlanError,
    RecoveryPlan,
    StartStep,
    StartTool,
    SyntheticReason,
    SyntheticResult,
    ToolMode,
    plan_from_json,
)
from tether.core.reconcile import RecoveryAction, RecoveryDecision
from tether.core.reducer import reduce_session
from tether.core.state import (
    IDLE,
    CompactionOperation,
    ConfigurationSnapshot,
    FrozenView,
    Header,
    Message,
    Operation,
    Replay,
    RunOperation,
    SessionState,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    ToolCallState,
    ToolConfig,
    ToolStatus,
    Usage,
)
from tether.errors import ConfigurationError, TetherError

# =========================================================================== paths

MIN_PLANNER_CASES = 12
"""The planner fixtures the spec bundle holds today: fewer fail the collection."""


def _load_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


PLANNER_FIXTURES = conformance_path("planner-fixtures", "manifest.json")
PLAN_SCHEMA_PATH = conformance_path("schemas", "recovery-plan.schema.json")
CURRENT_SCHEMA_PATH = conformance_path("schemas", "current-configuration.schema.json")


def _session_fixture(name: str) -> Path:
    return conformance_path("fixtures", name)


def _planner_cases() -> list[Any]:
    manifest = _load_json(PLANNER_FIXTURES)
    assert manifest["version"] == 1
    cases = [pytest.param(case, id=case["name"]) for case in manifest["fixtures"]]
    return at_least(MIN_PLANNER_CASES, cases, f"planner cases in {PLANNER_FIXTURES}")


def _validator(path: Path) -> Draft202012Validator:
    schema = _load_json(path)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


PLAN_VALIDATOR = _validator(PLAN_SCHEMA_PATH)
CURRENT_VALIDATOR = _validator(CURRENT_SCHEMA_PATH)


def _check_plan_schema(plan_json: Mapping[str, Any]) -> None:
    PLAN_VALIDATOR.validate(plan_json)


# =========================================================================== conformance


@pytest.mark.parametrize("case", _planner_cases())
def test_planner_conformance(case: Mapping[str, str]) -> None:
    folder = PLANNER_FIXTURES.parent
    data = _load_json(folder / case["input"])
    expected = _load_json(folder / case["expected"])
    assert set(data) == {"sessionFile", "current"}
    CURRENT_VALIDATOR.validate(data["current"])
    _check_plan_schema(expected)
    state = reduce_session(_session_fixture(data["sessionFile"]).read_bytes())
    plan = plan_recovery(state, CurrentConfiguration.from_json(data["current"]))
    assert plan.to_json() == expected
    assert plan_from_json(expected) == plan


def test_planner_fixtures_are_present() -> None:
    assert len(_planner_cases()) >= MIN_PLANNER_CASES
    with pytest.raises(MissingFixtures, match="expected at least 3"):
        at_least(3, [1, 2], "cases")
    with pytest.raises(MissingFixtures, match="is missing"):
        conformance_path("planner-fixtures", "no-such-manifest.json")


# =========================================================================== builders

D0 = "sha256:" + "0" * 64
D1 = "sha256:" + "1" * 64
ENV = "env-a"

HEADER = Header("H", 0, "/workspace", "openrouter", "test/model", ENV)
SNAPSHOT = ConfigurationSnapshot(
    model="test/model",
    system_prompt_digest=D0,
    tools=(ToolConfig("read", D0), ToolConfig("write", D0)),
    adapter_identity="adapter",
    routing_identity="routing",
    output_options_digest=D0,
)
READ = ToolDeclaration("read", D0, Replay.SAFE, "builtin:read:v1")
WRITE = ToolDeclaration("write", D0, Replay.NEVER, "builtin:write:v1")
CURRENT = CurrentConfiguration(D0, ENV, (READ, WRITE))

OP = "OP"
STEP = "S1"
A_ID = "E-assistant"
B_ID = "E-boundary"


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(call_id: str, name: str = "read", arguments: str = '{"path":"a"}') -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def assistant(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool_msg(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def step(
    status: StepStatus = StepStatus.SETTLED,
    *,
    attempt: int = 1,
    kind: StepKind = StepKind.ASSISTANT,
    stop: StopReason | None = None,
    settled: str | None = None,
    context: str = "E-context",
    digest: str = D0,
    step_id: str = STEP,
) -> Step:
    if status is StepStatus.SETTLED and settled is None:
        settled = A_ID
    if status is StepStatus.SETTLED and kind is StepKind.ASSISTANT and stop is None:
        stop = StopReason.TOOL_USE
    return Step(
        operation_id=OP,
        step_id=step_id,
        attempt_id=f"AT{attempt}",
        attempt=attempt,
        step_kind=kind,
        status=status,
        context_through_entry_id=context,
        configuration_snapshot=SNAPSHOT,
        configuration_digest=digest,
        settled_entry_id=settled if status is StepStatus.SETTLED else None,
        stop_reason=stop if status is StepStatus.SETTLED else None,
    )


def started(
    index: int,
    call_id: str,
    *,
    name: str = "read",
    replay: Replay = Replay.SAFE,
    replay_key: str = "builtin:read:v1",
    status: ToolStatus = ToolStatus.PENDING,
    assistant_entry_id: str = A_ID,
    environment: str = ENV,
    arguments: Mapping[str, Any] | None = None,
) -> ToolCallState:
    return ToolCallState(
        operation_id=OP,
        tool_started_id=f"T{index}-{assistant_entry_id}",
        step_id=STEP,
        assistant_entry_id=assistant_entry_id,
        tool_index=index,
        tool_call_id=call_id,
        tool_name=name,
        arguments={"path": "a"} if arguments is None else arguments,
        replay=replay,
        replay_key=replay_key,
        environment_identity=environment,
        result_entry_id=f"R{index}-{assistant_entry_id}",
        status=status,
    )


def run(
    current_step: Step | None = None,
    *,
    tools: Sequence[ToolCallState] = (),
    abort: bool = False,
) -> RunOperation:
    return RunOperation(OP, "E-input", tuple(tools), abort, current_step)


def compaction(current_step: Step | None = None, *, abort: bool = False) -> CompactionOperation:
    return CompactionOperation(OP, "E-through", "E-compaction", abort, current_step)


def state(
    operation: Operation,
    transcript: Sequence[Message] = (),
    boundary: str | None = B_ID,
) -> SessionState:
    messages = [user("start"), *transcript]
    return SessionState(
        header=HEADER,
        transcript=FrozenView(messages),
        active_context=FrozenView(messages),
        usage=Usage(),
        operation=operation,
        repaired_length=0,
        context_boundary=boundary,
    )


def plan_json(
    session: SessionState,
    current: CurrentConfiguration = CURRENT,
    observations: Observations | None = None,
) -> dict[str, Any]:
    plan = plan_recovery(session, current, observations)
    result: dict[str, Any] = plan.to_json()
    _check_plan_schema(result)
    assert plan_from_json(result) == plan
    return result


def item(
    index: int,
    call_id: str,
    reason: str,
    *,
    name: str = "read",
    assistant_entry_id: str = A_ID,
) -> dict[str, Any]:
    return {
        "assistantEntryId": assistant_entry_id,
        "toolIndex": index,
        "toolCallId": call_id,
        "toolName": name,
        "reason": reason,
        "content": SYNTHETIC_CONTENT[reason],
    }


def interrupted_item(tool: ToolCallState) -> dict[str, Any]:
    return {
        "assistantEntryId": tool.assistant_entry_id,
        "toolIndex": tool.tool_index,
        "toolCallId": tool.tool_call_id,
        "toolName": tool.tool_name,
        "toolStartedId": tool.tool_started_id,
        "resultEntryId": tool.result_entry_id,
        "reason": "interrupted",
        "content": SYNTHETIC_CONTENT["interrupted"],
    }


FINISH_FAILED = {
    "type": "finish",
    "outcome": "failed",
    "error": {"code": "model_error", "message": "provider request failed"},
}
FINISH_ABORTED = {"type": "finish", "outcome": "aborted"}
CLOSE_ATTEMPT = {
    "type": "closeAttempt",
    "error": {"code": "aborted", "message": "Operation aborted"},
}


# =========================================================================== rule 1


def test_rule1_idle_finishes_with_the_idle_form() -> None:
    assert plan_json(state(IDLE)) == {
        "type": "finish",
        "outcome": "completed",
        "completion": "normal",
    }
    plan = plan_recovery(state(IDLE), CURRENT)
    assert isinstance(plan, Finish) and plan.is_idle


# =========================================================================== rule 2


@pytest.mark.parametrize("attempt", [1, 2])
@pytest.mark.parametrize("kind", ["run", "compaction"])
def test_rule2_1_abort_with_open_attempt_closes_it(kind: str, attempt: int) -> None:
    if kind == "run":
        operation: Operation = run(step(StepStatus.ATTEMPTING, attempt=attempt), abort=True)
    else:
        operation = compaction(
            step(StepStatus.ATTEMPTING, attempt=attempt, kind=StepKind.COMPACTION), abort=True
        )
    # Even with a changed configuration: the abort comes before any retry decision.
    changed = CurrentConfiguration(D1, "elsewhere", ())
    assert plan_json(state(operation), changed) == CLOSE_ATTEMPT
    assert plan_json(state(operation)) == CLOSE_ATTEMPT


def test_rule2_2_abort_answers_open_calls_in_index_order() -> None:
    pending = started(2, "c2", name="write", replay=Replay.NEVER, replay_key="builtin:write:v1")
    transcript = [
        assistant(None, call("c0"), call("c1", "gone"), call("c2", "write"), call("c3")),
        tool_msg("c0"),
    ]
    session = state(run(step(), tools=[pending], abort=True), transcript)
    assert plan_json(session) == {
        "type": "appendSynthetic",
        "results": [
            item(1, "c1", "aborted", name="gone"),
            interrupted_item(pending),
            item(3, "c3", "aborted"),
        ],
    }


def test_rule2_2_abort_pending_safe_tool_is_interrupted_not_replayed() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending], abort=True), [assistant(None, call("c0"))])
    assert plan_json(session) == {"type": "appendSynthetic", "results": [interrupted_item(pending)]}


def test_rule2_2_abort_of_a_length_answer_uses_aborted_items() -> None:
    transcript = [assistant("cut", call("c0"), call("c1"))]
    session = state(run(step(stop=StopReason.LENGTH), abort=True), transcript)
    assert plan_json(session) == {
        "type": "appendSynthetic",
        "results": [item(0, "c0", "aborted"), item(1, "c1", "aborted")],
    }


@pytest.mark.parametrize(
    ("operation", "transcript"),
    [
        pytest.param(run(abort=True), [], id="run-no-step"),
        pytest.param(run(step(StepStatus.FAILED), abort=True), [], id="run-step-failed"),
        pytest.param(
            run(step(stop=StopReason.STOP), abort=True), [assistant("done")], id="run-answered"
        ),
        pytest.param(
            run(step(), abort=True),
            [assistant(None, call("c0"), call("c1")), tool_msg("c1"), tool_msg("c0")],
            id="run-all-calls-answered",
        ),
        pytest.param(
            run(step(stop=StopReason.STOP), abort=True), [assistant("   ")], id="run-blank-stop"
        ),
        pytest.param(compaction(abort=True), [], id="compaction-no-step"),
        pytest.param(
            compaction(step(kind=StepKind.COMPACTION), abort=True), [], id="compaction-settled"
        ),
        pytest.param(
            compaction(step(StepStatus.FAILED, kind=StepKind.COMPACTION), abort=True),
            [],
            id="compaction-failed",
        ),
    ],
)
def test_rule2_3_abort_with_nothing_open_finishes_aborted(
    operation: Operation, transcript: list[Message]
) -> None:
    assert plan_json(state(operation, transcript)) == FINISH_ABORTED


# =========================================================================== rule 3


def test_rule3_run_without_step_starts_first_assistant_attempt_at_b() -> None:
    assert plan_json(state(run())) == {
        "type": "startStep",
        "stepKind": "assistant",
        "attempt": 1,
        "contextThroughEntryId": B_ID,
    }


def test_rule3_compaction_without_step_starts_first_compaction_attempt_at_b() -> None:
    assert plan_json(state(compaction())) == {
        "type": "startStep",
        "stepKind": "compaction",
        "attempt": 1,
        "contextThroughEntryId": B_ID,
    }


def test_rule3_without_boundary_falls_back_to_the_operation_input() -> None:
    # Unreachable for reduced states (a run's input entry sets B); documented fallback.
    assert plan_json(state(run(), boundary=None))["contextThroughEntryId"] == "E-input"
    assert plan_json(state(compaction(), boundary=None))["contextThroughEntryId"] == "E-through"


# =========================================================================== rule 4


@pytest.mark.parametrize(
    "operation",
    [run(step(StepStatus.FAILED)), compaction(step(StepStatus.FAILED, kind=StepKind.COMPACTION))],
)
def test_rule4_failed_step_finishes_failed_with_the_fixed_error(operation: Operation) -> None:
    assert plan_json(state(operation)) == FINISH_FAILED


# =========================================================================== rule 5


@pytest.mark.parametrize("kind", [StepKind.ASSISTANT, StepKind.COMPACTION])
def test_rule5_open_attempt_2_is_exhausted(kind: StepKind) -> None:
    op_: Operation = (
        run(step(StepStatus.ATTEMPTING, attempt=2))
        if kind is StepKind.ASSISTANT
        else compaction(step(StepStatus.ATTEMPTING, attempt=2, kind=kind))
    )
    expected = {"type": "blocked", "reason": "attempts_exhausted"}
    assert plan_json(state(op_)) == expected
    # attempt = 2 is checked before the digest
    assert plan_json(state(op_), CurrentConfiguration(D1, ENV, ())) == expected


def test_rule5_open_attempt_1_with_changed_digest_is_blocked() -> None:
    session = state(run(step(StepStatus.ATTEMPTING)))
    changed = CurrentConfiguration(D1, ENV, CURRENT.tools)
    assert plan_json(session, changed) == {"type": "blocked", "reason": "configuration_changed"}


@pytest.mark.parametrize("kind", [StepKind.ASSISTANT, StepKind.COMPACTION])
def test_rule5_open_attempt_1_is_retried_with_same_step_and_context(kind: StepKind) -> None:
    attempting = step(StepStatus.ATTEMPTING, kind=kind, context="E-old", step_id="S-open")
    op_: Operation = run(attempting) if kind is StepKind.ASSISTANT else compaction(attempting)
    # A different environment or tool set does not matter for a retry.
    current = CurrentConfiguration(D0, "elsewhere", ())
    assert plan_json(state(op_), current) == {
        "type": "startStep",
        "stepKind": kind.value,
        "attempt": 2,
        "stepId": "S-open",
        "contextThroughEntryId": "E-old",
    }


# =========================================================================== rule 6


def test_rule6_settled_compaction_finishes_with_the_compaction_entry() -> None:
    session = state(compaction(step(kind=StepKind.COMPACTION, settled="E-compaction")))
    assert plan_json(session) == {
        "type": "finish",
        "outcome": "completed",
        "finalEntryId": "E-compaction",
    }


# =========================================================================== rule 7


@pytest.mark.parametrize("text", ["done", " x ", "\ufeff", "\u200b"])
def test_rule7_stop_with_text_finishes_normally(text: str) -> None:
    session = state(run(step(stop=StopReason.STOP)), [assistant(text)])
    assert plan_json(session) == {
        "type": "finish",
        "outcome": "completed",
        "completion": "normal",
        "finalEntryId": A_ID,
    }


@pytest.mark.parametrize(
    "text", [None, "", " ", "\t\r\n\x0b\x0c", "\x1c\x1d\x1e\x1f", "\u3000\u00a0\u2028"]
)
def test_rule7_blank_stop_finishes_failed(text: str | None) -> None:
    session = state(run(step(stop=StopReason.STOP)), [assistant(text)])
    assert plan_json(session) == FINISH_FAILED


@pytest.mark.parametrize("text", [None, "partial answer"])
def test_rule7_length_without_calls_finishes_failed(text: str | None) -> None:
    session = state(run(step(stop=StopReason.LENGTH)), [assistant(text)])
    assert plan_json(session) == FINISH_FAILED


def test_rule7_uses_the_last_assistant_message_not_an_older_one_with_calls() -> None:
    # spec 17: the reference would pick the older message with calls; the spec does not.
    transcript = [
        assistant(None, call("c0")),
        tool_msg("c0"),
        assistant("final"),
    ]
    session = state(run(step(stop=StopReason.STOP, settled="E-final")), transcript)
    assert plan_json(session) == {
        "type": "finish",
        "outcome": "completed",
        "completion": "normal",
        "finalEntryId": "E-final",
    }


# =========================================================================== rule 8


def test_rule8_length_with_calls_truncates_only_unanswered_calls() -> None:
    transcript = [
        assistant("cut", call("c0"), call("c1", "gone"), call("c2")),
        tool_msg("c0", SYNTHETIC_CONTENT["truncated"]),
    ]
    session = state(run(step(stop=StopReason.LENGTH)), transcript)
    assert plan_json(session) == {
        "type": "appendSynthetic",
        "results": [item(1, "c1", "truncated", name="gone"), item(2, "c2", "truncated")],
    }


def test_rule8_length_with_all_calls_answered_finishes_truncated() -> None:
    transcript = [assistant(None, call("c0"), call("c1")), tool_msg("c1"), tool_msg("c0")]
    session = state(run(step(stop=StopReason.LENGTH)), transcript)
    assert plan_json(session) == {
        "type": "finish",
        "outcome": "completed",
        "completion": "truncated",
        "finalEntryId": A_ID,
    }


# =========================================================================== rule 9


def test_rule9_unknown_tool_gives_one_item_for_the_lowest_unanswered_call() -> None:
    transcript = [
        assistant(None, call("c0"), call("c1", "gone"), call("c2", "also-gone")),
        tool_msg("c0"),
    ]
    session = state(run(step()), transcript)
    assert plan_json(session) == {
        "type": "appendSynthetic",
        "results": [item(1, "c1", "unknownTool", name="gone")],
    }


@pytest.mark.parametrize(
    "arguments",
    [
        "not json",
        "",
        "   ",
        "[1, 2]",
        "null",
        '"text"',
        "42",
        "NaN",
        "Infinity",
        '{"a": NaN}',
        '{"a": -Infinity}',
        '{"a": 1} trailing',
        '{"a": 1,}',
        "{'a': 1}",
        '{"a": "\\ud800"}',
        '{"\\udc00": 1}',
        '{"a": 1e400}',
        '{"a": "\x01"}',
        "\ufeff{}",
        '{"a": ' + "1" * 641 + "}",
        '{"a": ' + "[" * MAX_ARGUMENT_DEPTH + "]" * MAX_ARGUMENT_DEPTH + "}",
        "[" * 100_000,
    ],
)
def test_rule9_invalid_arguments(arguments: str) -> None:
    transcript = [assistant(None, call("c0", arguments=arguments))]
    session = state(run(step()), transcript)
    assert plan_json(session) == {
        "type": "appendSynthetic",
        "results": [item(0, "c0", "invalidArguments")],
    }


def test_rule9_unknown_tool_is_checked_before_arguments() -> None:
    session = state(run(step()), [assistant(None, call("c0", "gone", arguments="NaN"))])
    assert plan_json(session)["results"][0]["reason"] == "unknownTool"


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"path":"a"}', {"path": "a"}),
        (" \t\r\n{}\n ", {}),
        ('{"a": 1, "a": 2}', {"a": 2}),
        (
            '{"a": [1.5, -0, true, null, {"b": "\\ud83d\\ude00"}]}',
            {"a": [1.5, 0, True, None, {"b": "😀"}]},
        ),
        ('{"n": ' + "9" * 640 + "}", {"n": int("9" * 640)}),
        (
            '{"d": ' + "[" * (MAX_ARGUMENT_DEPTH - 1) + "]" * (MAX_ARGUMENT_DEPTH - 1) + "}",
            None,
        ),
    ],
)
def test_rule9_unstarted_known_tool_with_object_arguments_starts(
    arguments: str, parsed: dict[str, Any] | None
) -> None:
    transcript = [assistant(None, call("c0", "write", arguments=arguments))]
    result = plan_json(state(run(step()), transcript))
    expected_arguments = parse_tool_arguments(arguments) if parsed is None else parsed
    assert expected_arguments is not None
    assert result == {
        "type": "startTool",
        "mode": "start",
        "assistantEntryId": A_ID,
        "toolIndex": 0,
        "toolName": "write",
        "arguments": expected_arguments,
    }


def test_rule9_start_does_not_look_at_the_declaration_digest() -> None:
    # Unstarted calls only need a declaration to exist (14.4 rule 9).
    current = CurrentConfiguration(D0, ENV, (ToolDeclaration("read", "", Replay.NEVER, "k"),))
    session = state(run(step()), [assistant(None, call("c0"))])
    assert plan_json(session, current)["type"] == "startTool"


@pytest.mark.parametrize("replay", [Replay.SAFE, Replay.NEVER])
def test_rule9_pending_in_another_environment_is_blocked(replay: Replay) -> None:
    pending = started(0, "c0", replay=replay, environment="env-b")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    assert plan_json(session) == {"type": "blocked", "reason": "environment_changed"}
    # environment is checked before the declaration
    assert plan_json(session, CurrentConfiguration(D0, ENV, ())) == {
        "type": "blocked",
        "reason": "environment_changed",
    }


@pytest.mark.parametrize("replay", [Replay.SAFE, Replay.NEVER])
@pytest.mark.parametrize(
    "tools",
    [
        pytest.param((), id="no-declarations"),
        pytest.param((WRITE,), id="other-tool-only"),
        pytest.param(
            (ToolDeclaration("read", "", Replay.SAFE, "builtin:read:v1"),), id="empty-digest"
        ),
        pytest.param(
            (ToolDeclaration("read", "", Replay.SAFE, "builtin:read:v1"), READ),
            id="first-declaration-has-empty-digest",
        ),
    ],
)
def test_rule9_pending_without_usable_declaration_is_configuration_changed(
    replay: Replay, tools: tuple[ToolDeclaration, ...]
) -> None:
    pending = started(0, "c0", replay=replay)
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    assert plan_json(session, CurrentConfiguration(D0, ENV, tools)) == {
        "type": "blocked",
        "reason": "configuration_changed",
    }


def test_rule9_pending_safe_tool_with_same_declaration_is_replayed() -> None:
    pending = started(1, "c1", arguments={"path": "persisted", "n": [1, 2]})
    transcript = [
        assistant(None, call("c0"), call("c1", arguments='{"path":"model-said"}')),
        tool_msg("c0"),
    ]
    session = state(
        run(step(), tools=[started(0, "c0", status=ToolStatus.COMPLETED), pending]), transcript
    )
    # A different configuration digest does not block a replay (spec 17).
    current = CurrentConfiguration(D1, ENV, CURRENT.tools)
    assert plan_json(session, current) == {
        "type": "startTool",
        "mode": "replay",
        "assistantEntryId": A_ID,
        "toolIndex": 1,
        "toolStartedId": pending.tool_started_id,
        "toolName": "read",
        "arguments": {"path": "persisted", "n": [1, 2]},
    }


@pytest.mark.parametrize(
    "declaration",
    [
        pytest.param(ToolDeclaration("read", D0, Replay.SAFE, "builtin:read:v2"), id="key-changed"),
        pytest.param(ToolDeclaration("read", D0, Replay.NEVER, "builtin:read:v1"), id="now-never"),
    ],
)
def test_rule9_pending_safe_tool_with_changed_declaration_is_blocked(
    declaration: ToolDeclaration,
) -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    assert plan_json(session, CurrentConfiguration(D0, ENV, (declaration,))) == {
        "type": "blocked",
        "reason": "replay_declaration_changed",
    }


def test_rule9_the_first_declaration_of_a_name_decides() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    other = ToolDeclaration("read", D1, Replay.SAFE, "builtin:read:v2")
    assert plan_json(session, CurrentConfiguration(D0, ENV, (READ, other)))["mode"] == "replay"
    assert plan_json(session, CurrentConfiguration(D0, ENV, (other, READ))) == {
        "type": "blocked",
        "reason": "replay_declaration_changed",
    }


@pytest.mark.parametrize(
    "declared", [WRITE, ToolDeclaration("write", D0, Replay.SAFE, "builtin:write:v1")]
)
def test_rule9_pending_never_tool_is_interrupted(declared: ToolDeclaration) -> None:
    pending = started(0, "c0", name="write", replay=Replay.NEVER, replay_key="builtin:write:v1")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0", "write"))])
    assert plan_json(session, CurrentConfiguration(D0, ENV, (declared,))) == {
        "type": "appendSynthetic",
        "results": [interrupted_item(pending)],
    }


def test_rule9_lowest_unanswered_call_first_even_if_a_later_one_is_pending() -> None:
    # spec 17: the reference handles unstarted calls before pending ones; the spec does not.
    pending0 = started(0, "c0", name="write", replay=Replay.NEVER, replay_key="builtin:write:v1")
    transcript = [assistant(None, call("c0", "write"), call("c1"))]
    session = state(run(step(), tools=[pending0]), transcript)
    assert plan_json(session)["results"] == [interrupted_item(pending0)]

    pending1 = started(1, "c1")
    session = state(run(step(), tools=[pending1]), [assistant(None, call("c0"), call("c1"))])
    assert plan_json(session) == {
        "type": "startTool",
        "mode": "start",
        "assistantEntryId": A_ID,
        "toolIndex": 0,
        "toolName": "read",
        "arguments": {"path": "a"},
    }


def test_rule9_started_tools_of_other_assistant_entries_do_not_make_a_call_pending() -> None:
    old = started(0, "c0", assistant_entry_id="E-older")
    session = state(run(step(), tools=[old]), [assistant(None, call("c0"))])
    assert plan_json(session)["mode"] == "start"


def test_rule9_answer_to_an_earlier_message_with_the_same_call_id_does_not_count() -> None:
    transcript = [
        assistant(None, call("c0")),
        tool_msg("c0"),
        assistant(None, call("c0", arguments='{"path":"b"}')),
    ]
    session = state(
        run(
            step(),
            tools=[started(0, "c0", assistant_entry_id="E-first", status=ToolStatus.COMPLETED)],
        ),
        transcript,
    )
    assert plan_json(session) == {
        "type": "startTool",
        "mode": "start",
        "assistantEntryId": A_ID,
        "toolIndex": 0,
        "toolName": "read",
        "arguments": {"path": "b"},
    }


def test_rule9_call_answered_by_a_pre_execution_result_is_not_offered_again() -> None:
    # spec 17: only the transcript decides "answered".
    transcript = [
        assistant(None, call("c0", "gone"), call("c1")),
        tool_msg("c0", SYNTHETIC_CONTENT["unknownTool"]),
    ]
    assert plan_json(state(run(step()), transcript))["toolIndex"] == 1


# =========================================================================== rule 10


def test_rule10_all_calls_answered_starts_the_next_step_at_b() -> None:
    transcript = [
        assistant(None, call("c0"), call("c1")),
        tool_msg("c1"),
        tool_msg("c0"),
        user("by the way"),
    ]
    tools = [started(0, "c0", status=ToolStatus.COMPLETED)]
    session = state(run(step(context="E-old"), tools=tools), transcript, boundary="E-user-later")
    assert plan_json(session) == {
        "type": "startStep",
        "stepKind": "assistant",
        "attempt": 1,
        "contextThroughEntryId": "E-user-later",
    }


# =========================================================================== observations


def test_empty_or_unrelated_observations_change_nothing() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    unrelated = Observations(
        {"other": RecoveryDecision(RecoveryAction.COMPLETE, "applied", content="x")}
    )
    assert plan_json(session, CURRENT, unrelated) == plan_json(session)
    assert plan_json(session, CURRENT, Observations()) == plan_json(session)
    assert Observations().tool_outcomes == {}


def test_observation_complete_appends_the_started_result() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    observed = Observations(
        {
            pending.tool_started_id: RecoveryDecision(
                RecoveryAction.COMPLETE, "applied", content="done"
            )
        }
    )
    plan = plan_recovery(session, CURRENT, observed)
    assert isinstance(plan, CompleteTool)
    assert plan.result_entry_id == pending.result_entry_id
    assert plan.tool_call_id == "c0" and plan.content == "done" and not plan.is_error
    assert plan.to_json()["type"] == "completeTool"


def test_observation_execute_replays_a_never_tool_once() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    observed = Observations(
        {pending.tool_started_id: RecoveryDecision(RecoveryAction.EXECUTE, "notApplied")}
    )
    plan = plan_recovery(session, CURRENT, observed)
    assert isinstance(plan, StartTool)
    assert plan.mode is ToolMode.REPLAY and plan.tool_started_id == pending.tool_started_id


def test_observation_review_waits_and_gates_still_come_first() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    observed = Observations(
        {
            pending.tool_started_id: RecoveryDecision(
                RecoveryAction.REVIEW, "unknowable", reason="unknowable"
            )
        }
    )
    plan = plan_recovery(session, CURRENT, observed)
    assert isinstance(plan, AwaitReview) and plan.reason == "unknowable"
    moved = CurrentConfiguration(CURRENT.configuration_digest, "elsewhere", CURRENT.tools)
    assert plan_json(session, moved, observed) == {
        "type": "blocked",
        "reason": "environment_changed",
    }


def test_observation_review_reason_names_the_review_item() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    decision = RecoveryDecision(
        RecoveryAction.REVIEW, "conflict", reason="the file changed", review_item=7
    )
    plan = plan_recovery(session, CURRENT, Observations({pending.tool_started_id: decision}))
    assert isinstance(plan, AwaitReview)
    assert plan.reason == "the file changed (review item 7)"


def test_observation_spec_decision_keeps_the_spec_plan() -> None:
    pending = started(0, "c0")
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    spec = RecoveryDecision(RecoveryAction.SPEC, "noObservation")
    observed = Observations({pending.tool_started_id: spec})
    assert plan_json(session, CURRENT, observed) == plan_json(session)


def test_observation_abort_decision_appends_nothing_and_never_replays() -> None:
    # The executor records abortRequested for an ABORT decision before it plans; a planner
    # given one anyway must not replay the call (the pending tool here is replay-safe, so
    # spec 14.4 alone would replay it) nor answer it.
    pending = started(0, "c0")  # replay-safe, and declared so: the spec alone replays it
    session = state(run(step(), tools=[pending]), [assistant(None, call("c0"))])
    assert plan_json(session)["type"] == "startTool"
    abort = RecoveryDecision(RecoveryAction.ABORT, "review:abort", review_item=3)
    plan = plan_recovery(session, CURRENT, Observations({pending.tool_started_id: abort}))
    assert isinstance(plan, AwaitReview)
    assert "abort" in plan.reason and "review item 3" in plan.reason


# =========================================================================== complexity


class CountingTranscript(Sequence[Message]):
    """A transcript that records the lowest index the planner looked at."""

    def __init__(self, items: list[Message]) -> None:
        self._items = items
        self.lowest = len(items)

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            raise AssertionError("the planner must not slice the transcript")
        if index < 0:
            index += len(self._items)
        self.lowest = min(self.lowest, index)
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        raise AssertionError("the planner must not iterate the whole transcript")

    def __reversed__(self) -> Iterator[Message]:
        for index in range(len(self._items) - 1, -1, -1):
            yield self[index]


def test_current_assistant_is_found_in_time_proportional_to_the_tail() -> None:
    history: list[Message] = []
    for n in range(5000):
        history += [user(f"q{n}"), assistant(None, call("c0")), tool_msg("c0"), assistant("a")]
    tail: list[Message] = [assistant(None, call("c0"), call("c1")), tool_msg("c1")]
    transcript = CountingTranscript(history + tail)
    session = SessionState(HEADER, transcript, (), Usage(), run(step()), 0, B_ID)
    assert plan_recovery(session, CURRENT).to_json()["toolIndex"] == 0
    assert transcript.lowest == len(history)


# =========================================================================== current


VALID_CURRENT: dict[str, Any] = {
    "configurationDigest": D0,
    "environmentIdentity": "fixture",
    "tools": [
        {"name": "read", "definitionDigest": D0, "replay": "safe", "replayKey": "builtin:read:v1"},
        {"name": "read", "definitionDigest": D1, "replay": "never", "replayKey": "k"},
    ],
}


def test_current_configuration_round_trip() -> None:
    current = CurrentConfiguration.from_json(VALID_CURRENT)
    assert current.configuration_digest == D0
    assert current.environment_identity == "fixture"
    assert current.tools[1] == ToolDeclaration("read", D1, Replay.NEVER, "k")
    assert current.to_json() == VALID_CURRENT
    CURRENT_VALIDATOR.validate(current.to_json())
    assert CurrentConfiguration.from_json({**VALID_CURRENT, "tools": []}).tools == ()


def test_declaration_returns_the_first_match() -> None:
    current = CurrentConfiguration.from_json(VALID_CURRENT)
    declaration = current.declaration("read")
    assert declaration is not None and declaration.replay_key == "builtin:read:v1"
    assert current.declaration("write") is None


def _with_tool(**changes: Any) -> dict[str, Any]:
    tool = {**VALID_CURRENT["tools"][0], **changes}
    return {**VALID_CURRENT, "tools": [VALID_CURRENT["tools"][0], tool]}


def _without(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != name}


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ([], "current"),
        (None, "current"),
        ({**VALID_CURRENT, "extra": 1}, "current: unexpected member 'extra'"),
        (_without(VALID_CURRENT, "configurationDigest"), "current.configurationDigest"),
        (_without(VALID_CURRENT, "environmentIdentity"), "current.environmentIdentity"),
        (_without(VALID_CURRENT, "tools"), "current.tools"),
        (
            {**VALID_CURRENT, "configurationDigest": "sha256:" + "A" * 64},
            "current.configurationDigest",
        ),
        ({**VALID_CURRENT, "configurationDigest": D0 + "\n"}, "current.configurationDigest"),
        ({**VALID_CURRENT, "configurationDigest": "sha256:00"}, "current.configurationDigest"),
        ({**VALID_CURRENT, "configurationDigest": 5}, "current.configurationDigest"),
        ({**VALID_CURRENT, "environmentIdentity": ""}, "current.environmentIdentity"),
        ({**VALID_CURRENT, "environmentIdentity": None}, "current.environmentIdentity"),
        ({**VALID_CURRENT, "tools": {}}, "current.tools"),
        ({**VALID_CURRENT, "tools": "read"}, "current.tools"),
        ({**VALID_CURRENT, "tools": [1]}, "current.tools[0]"),
        (_with_tool(extra=True), "current.tools[1]: unexpected member 'extra'"),
        (
            {**VALID_CURRENT, "tools": [_without(VALID_CURRENT["tools"][0], "replayKey")]},
            "current.tools[0].replayKey",
        ),
        (_with_tool(name=""), "current.tools[1].name"),
        (_with_tool(name=["read"]), "current.tools[1].name"),
        (_with_tool(definitionDigest=""), "current.tools[1].definitionDigest"),
        (_with_tool(replay="sometimes"), "current.tools[1].replay"),
        (_with_tool(replay=True), "current.tools[1].replay"),
        (_with_tool(replayKey=""), "current.tools[1].replayKey"),
    ],
)
def test_current_configuration_rejects_malformed_input(data: Any, where: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        CurrentConfiguration.from_json(data)
    message = str(info.value)
    assert where in message
    assert "\n" not in message
    assert isinstance(info.value, TetherError) and isinstance(info.value, ValueError)
    # Python's jsonschema lets "$" match before a final "\n" (ECMA-262 does not).
    python_regex_quirk = isinstance(data, dict) and data.get("configurationDigest") == D0 + "\n"
    if not python_regex_quirk:
        assert not CURRENT_VALIDATOR.is_valid(data)


# =========================================================================== plan types


def test_each_plan_type_serializes_to_exactly_the_spec_members() -> None:
    cases: list[tuple[RecoveryPlan, dict[str, Any]]] = [
        (Finish.idle(), {"type": "finish", "outcome": "completed", "completion": "normal"}),
        (
            Finish.completed("E", Completion.NORMAL),
            {"type": "finish", "outcome": "completed", "completion": "normal", "finalEntryId": "E"},
        ),
        (
            Finish.completed("E", Completion.TRUNCATED),
            {
                "type": "finish",
                "outcome": "completed",
                "completion": "truncated",
                "finalEntryId": "E",
            },
        ),
        (
            Finish.compaction_completed("X"),
            {"type": "finish", "outcome": "completed", "finalEntryId": "X"},
        ),
        (Finish.failed(), FINISH_FAILED),
        (Finish.aborted(), FINISH_ABORTED),
        (
            StartStep(StepKind.ASSISTANT, 1, "B"),
            {
                "type": "startStep",
                "stepKind": "assistant",
                "attempt": 1,
                "contextThroughEntryId": "B",
            },
        ),
        (
            StartStep(StepKind.COMPACTION, 2, "C", "S"),
            {
                "type": "startStep",
                "stepKind": "compaction",
                "attempt": 2,
                "stepId": "S",
                "contextThroughEntryId": "C",
            },
        ),
        (
            StartTool(ToolMode.START, "A", 0, "read", {"p": 1}),
            {
                "type": "startTool",
                "mode": "start",
                "assistantEntryId": "A",
                "toolIndex": 0,
                "toolName": "read",
                "arguments": {"p": 1},
            },
        ),
        (
            StartTool(ToolMode.REPLAY, "A", 3, "read", {}, "T"),
            {
                "type": "startTool",
                "mode": "replay",
                "assistantEntryId": "A",
                "toolIndex": 3,
                "toolStartedId": "T",
                "toolName": "read",
                "arguments": {},
            },
        ),
        (
            AppendSynthetic(
                (
                    SyntheticResult("A", 0, "c0", "x", SyntheticReason.UNKNOWN_TOOL),
                    SyntheticResult("A", 1, "c1", "y", SyntheticReason.INTERRUPTED, "T", "R"),
                )
            ),
            {
                "type": "appendSynthetic",
                "results": [
                    {
                        "assistantEntryId": "A",
                        "toolIndex": 0,
                        "toolCallId": "c0",
                        "toolName": "x",
                        "reason": "unknownTool",
                        "content": SYNTHETIC_CONTENT["unknownTool"],
                    },
                    {
                        "assistantEntryId": "A",
                        "toolIndex": 1,
                        "toolCallId": "c1",
                        "toolName": "y",
                        "toolStartedId": "T",
                        "resultEntryId": "R",
                        "reason": "interrupted",
                        "content": SYNTHETIC_CONTENT["interrupted"],
                    },
                ],
            },
        ),
        (CloseAttempt(), CLOSE_ATTEMPT),
        *[
            (Blocked(reason), {"type": "blocked", "reason": reason.value})
            for reason in BlockedReason
        ],
    ]
    seen: set[type] = set()
    for plan, expected in cases:
        result = plan.to_json()
        assert result == expected
        assert list(result) == list(expected), "member order as in spec 14.2"
        assert result["type"] == type(plan).type
        _check_plan_schema(result)
        assert plan_from_json(result) == plan
        seen.add(type(plan))
    assert seen == set(PLAN_TYPES)


def test_synthetic_item_member_order() -> None:
    pre = SyntheticResult("A", 0, "c0", "x", SyntheticReason.TRUNCATED).to_json()
    assert list(pre) == [
        "assistantEntryId",
        "toolIndex",
        "toolCallId",
        "toolName",
        "reason",
        "content",
    ]
    started_item = SyntheticResult(
        "A", 0, "c0", "x", SyntheticReason.INTERRUPTED, "T", "R"
    ).to_json()
    assert list(started_item) == [
        "assistantEntryId",
        "toolIndex",
        "toolCallId",
        "toolName",
        "toolStartedId",
        "resultEntryId",
        "reason",
        "content",
    ]


def test_blocked_reason_values() -> None:
    assert {reason.value for reason in BlockedReason} == {
        "configuration_changed",
        "environment_changed",
        "replay_declaration_changed",
        "attempts_exhausted",
    }


def test_fixed_errors() -> None:
    assert MODEL_ERROR == PlanError("model_error", "provider request failed")
    assert ABORTED_ERROR.to_json() == {"code": "aborted", "message": "Operation aborted"}
    assert CloseAttempt().error == ABORTED_ERROR
    assert {o.value for o in Outcome} == {"completed", "aborted", "failed"}


@pytest.mark.parametrize(
    "build",
    [
        lambda: Finish(Outcome.COMPLETED),
        lambda: Finish(Outcome.COMPLETED, Completion.TRUNCATED),
        lambda: Finish(Outcome.COMPLETED, Completion.NORMAL, "E", MODEL_ERROR),
        lambda: Finish(Outcome.FAILED),
        lambda: Finish(Outcome.FAILED, Completion.NORMAL, error=MODEL_ERROR),
        lambda: Finish(Outcome.FAILED, None, "E", MODEL_ERROR),
        lambda: Finish(Outcome.ABORTED, final_entry_id="E"),
        lambda: Finish(Outcome.ABORTED, error=ABORTED_ERROR),
        lambda: StartStep(StepKind.ASSISTANT, 1, "B", "S"),
        lambda: StartStep(StepKind.ASSISTANT, 2, "B"),
        lambda: StartTool(ToolMode.START, "A", 0, "read", {}, "T"),
        lambda: StartTool(ToolMode.REPLAY, "A", 0, "read", {}),
        lambda: SyntheticResult("A", 0, "c", "n", SyntheticReason.ABORTED, "T", "R"),
        lambda: SyntheticResult("A", 0, "c", "n", SyntheticReason.ABORTED, "T"),
        lambda: SyntheticResult("A", 0, "c", "n", SyntheticReason.INTERRUPTED),
        lambda: SyntheticResult("A", 0, "c", "n", SyntheticReason.INTERRUPTED, "T"),
        lambda: AppendSynthetic(()),
        lambda: AppendSynthetic(
            (
                SyntheticResult("A", 1, "c1", "n", SyntheticReason.ABORTED),
                SyntheticResult("A", 0, "c0", "n", SyntheticReason.ABORTED),
            )
        ),
    ],
)
def test_plan_constructors_reject_forms_outside_the_spec(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"type": "nope"},
        {"type": "finish"},
        {"type": "finish", "outcome": "completed", "completion": "normal", "extra": 1},
        {"type": "finish", "outcome": "done"},
        {"type": "finish", "outcome": "failed", "error": {"code": "x"}},
        {"type": "startStep", "stepKind": "assistant", "attempt": 3, "contextThroughEntryId": "B"},
        {
            "type": "startStep",
            "stepKind": "assistant",
            "attempt": True,
            "contextThroughEntryId": "B",
        },
        {
            "type": "startTool",
            "mode": "start",
            "assistantEntryId": "A",
            "toolIndex": -1,
            "toolName": "r",
            "arguments": {},
        },
        {
            "type": "startTool",
            "mode": "start",
            "assistantEntryId": "A",
            "toolIndex": 0,
            "toolName": "r",
            "arguments": [],
        },
        {"type": "appendSynthetic", "results": []},
        {"type": "appendSynthetic", "results": [{**item(0, "c", "aborted"), "content": "other"}]},
        {"type": "appendSynthetic", "results": [{**item(0, "c", "interrupted")}]},
        {"type": "closeAttempt", "error": {"code": "aborted", "message": "other"}},
        {"type": "blocked", "reason": "tired"},
        {"type": "blocked", "reason": ["configuration_changed"]},
    ],
)
def test_plan_from_json_rejects_malformed_plans(data: Any) -> None:
    with pytest.raises(ValueError):
        plan_from_json(data)


# =========================================================================== contents


def test_synthetic_contents_are_the_fixed_strings_of_7_6() -> None:
    assert dict(SYNTHETIC_CONTENT) == {
        "invalidArguments": "Error: Tool arguments were invalid; the tool was not executed.",
        "unknownTool": "Error: Unknown tool; the tool was not executed.",
        "truncated": (
            "Error: Tool call arguments were truncated by the model token limit; "
            "the tool was not executed."
        ),
        "aborted": "Operation aborted before execution.",
        "interrupted": (
            "Operation interrupted after execution status became unknown; "
            "the tool was not replayed."
        ),
    }
    assert {reason.value for reason in SyntheticReason} == set(SYNTHETIC_CONTENT)
    assert contents.PRE_EXECUTION_REASONS | contents.STARTED_REASONS == set(SYNTHETIC_CONTENT)
    assert not contents.PRE_EXECUTION_REASONS & contents.STARTED_REASONS
    with pytest.raises(TypeError):
        SYNTHETIC_CONTENT["aborted"] = "x"  # type: ignore[index]


def test_whitespace_set_is_the_spec_set() -> None:
    spec_set = {
        *range(0x09, 0x0E),
        *range(0x1C, 0x20),
        0x20,
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    }
    assert {ord(c) for c in WHITESPACE} == spec_set
    assert len(WHITESPACE) == len(spec_set)
    # ... which is Python's str.isspace set (spec 17: "Python's").
    assert spec_set == {c for c in range(sys.maxunicode + 1) if chr(c).isspace()}


@pytest.mark.parametrize(
    ("value", "blank"),
    [
        (None, True),
        ("", True),
        (" \t\n", True),
        (WHITESPACE, True),
        ("\ufeff", False),
        ("\u200b", False),
        (" a ", False),
        (0, False),
        ([], False),
    ],
)
def test_is_blank(value: object, blank: bool) -> None:
    assert is_blank(value) is blank


# =========================================================================== properties

_IDS = st.sampled_from(["E1", "E2", "E3", A_ID, B_ID])
_CALL_IDS = st.sampled_from(["c0", "c1", "c2", "c3"])
_NAMES = st.sampled_from(["read", "write", "gone"])
_TEXT = st.one_of(st.none(), st.sampled_from(["", " ", "\u3000", "answer"]), st.text(max_size=6))
_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
_JSON_OBJECTS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        _JSON_LEAVES,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=3,
)
_ARGUMENTS = st.one_of(
    _JSON_OBJECTS.map(json.dumps),
    st.sampled_from(
        ['{"path":"a"}', "{}", "null", "[]", "NaN", "", '{"a":"\\ud800"}', '{"a":1e400}', "{"]
    ),
    st.text(max_size=12),
)


@st.composite
def _assistant_messages(draw: st.DrawFn) -> dict[str, Any]:
    ids = draw(st.lists(_CALL_IDS, unique=True, max_size=4))
    calls = [call(call_id, draw(_NAMES), draw(_ARGUMENTS)) for call_id in ids]
    return assistant(draw(_TEXT), *calls)


_MESSAGES = st.one_of(
    st.builds(user, st.text(min_size=1, max_size=5)),
    _assistant_messages(),
    st.builds(tool_msg, _CALL_IDS, st.text(max_size=5)),
)

_STEPS = st.builds(
    Step,
    operation_id=st.just(OP),
    step_id=_IDS,
    attempt_id=_IDS,
    attempt=st.integers(min_value=1, max_value=3),
    step_kind=st.sampled_from(StepKind),
    status=st.sampled_from(StepStatus),
    context_through_entry_id=_IDS,
    configuration_snapshot=st.just(SNAPSHOT),
    configuration_digest=st.sampled_from([D0, D1]),
    settled_entry_id=st.one_of(st.none(), _IDS),
    stop_reason=st.one_of(st.none(), st.sampled_from(StopReason)),
)

_TOOL_STATES = st.builds(
    ToolCallState,
    operation_id=st.just(OP),
    tool_started_id=_IDS,
    step_id=_IDS,
    assistant_entry_id=_IDS,
    tool_index=st.integers(min_value=0, max_value=4),
    tool_call_id=_CALL_IDS,
    tool_name=_NAMES,
    arguments=_JSON_OBJECTS,
    replay=st.sampled_from(Replay),
    replay_key=st.sampled_from(["builtin:read:v1", "builtin:write:v1", "k"]),
    environment_identity=st.sampled_from([ENV, "env-b"]),
    result_entry_id=_IDS,
    status=st.sampled_from(ToolStatus),
)

_OPERATIONS = st.one_of(
    st.just(IDLE),
    st.builds(
        RunOperation,
        operation_id=st.just(OP),
        input_entry_id=_IDS,
        tool_calls=st.lists(_TOOL_STATES, max_size=4).map(tuple),
        abort_requested=st.booleans(),
        step=st.one_of(st.none(), _STEPS),
    ),
    st.builds(
        CompactionOperation,
        operation_id=st.just(OP),
        input_through_entry_id=_IDS,
        result_entry_id=_IDS,
        abort_requested=st.booleans(),
        step=st.one_of(st.none(), _STEPS),
    ),
)

_STATES = st.builds(
    lambda transcript, operation, boundary: SessionState(
        HEADER, FrozenView(transcript), FrozenView(transcript), Usage(), operation, 0, boundary
    ),
    st.lists(_MESSAGES, max_size=8),
    _OPERATIONS,
    st.one_of(st.none(), _IDS),
)

_REPLAY_KEYS = st.sampled_from(["builtin:read:v1", "builtin:write:v1", "k"])


@st.composite
def _settled_run_states(draw: st.DrawFn) -> SessionState:
    """Reducer-like states of a run whose step settled: reaches rules 2.2 and 7-10."""
    call_ids = [f"c{i}" for i in range(draw(st.integers(min_value=0, max_value=4)))]
    calls = [call(call_id, draw(_NAMES), draw(_ARGUMENTS)) for call_id in call_ids]
    answered = draw(
        st.permutations(call_ids).flatmap(
            lambda ids: st.sampled_from([ids[:k] for k in range(len(ids) + 1)])
        )
    )
    started_indexes = draw(
        st.lists(st.sampled_from(range(len(call_ids))), unique=True) if call_ids else st.just([])
    )
    tools = [
        started(
            index,
            call_ids[index],
            name=calls[index]["function"]["name"],
            replay=draw(st.sampled_from(Replay)),
            replay_key=draw(_REPLAY_KEYS),
            environment=draw(st.sampled_from([ENV, "env-b"])),
            status=ToolStatus.COMPLETED if call_ids[index] in answered else ToolStatus.PENDING,
        )
        for index in started_indexes
    ]
    earlier = draw(st.lists(_MESSAGES, max_size=3))
    transcript = [*earlier, assistant(draw(_TEXT), *calls), *map(tool_msg, answered)]
    stop = draw(st.sampled_from(StopReason))
    operation = run(step(stop=stop), tools=tools, abort=draw(st.booleans()))
    return state(operation, transcript)


_DECLARATIONS = st.builds(
    ToolDeclaration,
    name=_NAMES,
    definition_digest=st.sampled_from([D0, D1, ""]),
    replay=st.sampled_from(Replay),
    replay_key=_REPLAY_KEYS,
)

_CURRENTS = st.builds(
    CurrentConfiguration,
    configuration_digest=st.sampled_from([D0, D1]),
    environment_identity=st.sampled_from([ENV, "env-b"]),
    tools=st.lists(st.one_of(st.sampled_from([READ, WRITE]), _DECLARATIONS), max_size=4).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(session=st.one_of(_STATES, _settled_run_states()), current=_CURRENTS)
def test_property_any_state_yields_a_schema_valid_plan(
    session: SessionState, current: CurrentConfiguration
) -> None:
    plan = plan_recovery(session, current)
    assert isinstance(plan, PLAN_TYPES)
    result = plan.to_json()
    _check_plan_schema(result)
    json.dumps(result, allow_nan=False).encode("utf-8")  # plain, persistable JSON
    assert plan_from_json(result) == plan
    # pure: same inputs, same plan; empty observations change nothing
    assert plan_recovery(session, current) == plan
    assert plan_recovery(session, current, Observations()) == plan


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        _ARGUMENTS,
        _JSON_OBJECTS.map(json.dumps),
        st.text(alphabet='{}[]":,0123456789.eE+-tfrnul \\ud8', max_size=20),
    )
)
def test_property_parsed_arguments_are_objects_that_round_trip(text: str) -> None:
    parsed = parse_tool_arguments(text)
    if parsed is not None:
        assert isinstance(parsed, dict)
        assert (
            json.loads(json.dumps(parsed, allow_nan=False, ensure_ascii=False).encode("utf-8"))
            == parsed
        )
