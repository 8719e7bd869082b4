"""Every check of the spec's ordered checklists (sections 4, 5 and 13), one defect at a time.

Each test builds a minimal valid session with :mod:`sessionkit`, breaks exactly one
thing (or two, for precedence cases where the checklist order decides), and asserts
the exact ``(code, line, seq)``. Positive cases at the end check the state members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sessionkit import (
    ABORTED_ERROR,
    MAX_SAFE,
    ZERO_DIGEST,
    SessionKit,
    expect_error,
    expect_ok,
    make_id,
)
from tether.core import reduce_session
from tether.core.canonical import configuration_digest
from tether.core.contents import SYNTHETIC_CONTENT
from tether.core.state import RunOperation, StepStatus

FACT = "INVALID_FACT"
REF = "INVALID_REFERENCE"
TRANS = "INVALID_TRANSITION"
SCRIPT = "INVALID_TRANSCRIPT"
DUP = "DUPLICATE_ID"

UNUSED_ID = make_id(0xFFFFFFFF)  # well-formed, never allocated by a kit
UPPER_ID = make_id(0xABCDEF).upper()  # upper-case hex is not an ID


def fails(kit: SessionKit, fact: dict, code: str) -> None:
    """The log fails with ``code`` at ``fact``'s line and seq."""
    expect_error(kit, code, *kit.where(fact))


def running(**kwargs: Any) -> SessionKit:
    kit = SessionKit(**kwargs)
    kit.start_run()
    return kit


def attempting(**kwargs: Any) -> SessionKit:
    kit = running(**kwargs)
    kit.step_attempt()
    return kit


def tool_use(calls: tuple[str, ...] = ("read",), **kwargs: Any) -> SessionKit:
    kit = attempting(**kwargs)
    kit.assistant(None, list(calls))
    return kit


def pending(calls: tuple[str, ...] = ("read",)) -> SessionKit:
    kit = tool_use(calls)
    kit.tool_started(0)
    return kit


def compacting(keep: int = 0) -> SessionKit:
    kit = SessionKit()
    kit.tool_run()
    kit.compaction_started(keep=keep)
    return kit


def aborted_compaction() -> tuple[SessionKit, dict]:
    """A finished (aborted) compaction whose provisioned result ID was never consumed."""
    kit = SessionKit()
    kit.simple_run()
    started = kit.compaction_started()
    kit.abort()
    kit.finish("aborted")
    return kit, started


# ====================================================================== section 4: header


def _header(**changes: Any) -> dict[str, Any]:
    header = dict(SessionKit().header)
    for name, value in changes.items():
        if value is _ABSENT:
            header.pop(name, None)
        else:
            header[name] = value
    return header


_ABSENT = object()


def _header_line(value: Any) -> bytes:
    return orjson.dumps(value) + b"\n"


@pytest.mark.parametrize("value", [[], [_header()], "header", 1, None, True, 2.0])
def test_header_not_an_object(value: Any) -> None:
    expect_error(_header_line(value), "INVALID_HEADER", 1)


@pytest.mark.parametrize(
    "header",
    [
        _header(extra=1),
        _header(type="session"),
        _header(extra=1, version=3),  # unknown member wins over the version
        _header(extra=1, version=_ABSENT),
        _header(kind="session"),
        _header(kind="Header"),
        _header(kind=None),
        _header(kind=_ABSENT),
        _header(kind="session", version=1),  # wrong kind wins over the version
        _header(kind=_ABSENT, version="2"),
    ],
)
def test_header_closed_and_kind_before_version(header: dict) -> None:
    expect_error(_header_line(header), "INVALID_HEADER", 1)


def test_v1_header_is_invalid_header() -> None:
    v1 = {
        "type": "session",
        "version": 1,
        "id": make_id(1),
        "timestamp": "2024-01-01T00:00:00Z",
        "cwd": "/workspace",
    }
    expect_error(_header_line(v1), "INVALID_HEADER", 1)


@pytest.mark.parametrize(
    "version", [_ABSENT, "2", 1, 3, 2.5, 1.9999, None, True, False, [2], {"major": 2}, 0, -2]
)
def test_unsupported_version(version: Any) -> None:
    expect_error(_header_line(_header(version=version)), "UNSUPPORTED_VERSION", 1)


@pytest.mark.parametrize(
    "changes",
    [
        {"id": "nope"},
        {"createdAt": -1},
        {"cwd": ""},
        {"environmentIdentity": _ABSENT},
        {"id": _ABSENT, "createdAt": "x", "model": 1},
    ],
)
def test_version_is_checked_before_id_created_at_and_texts(changes: dict) -> None:
    expect_error(_header_line(_header(version=3, **changes)), "UNSUPPORTED_VERSION", 1)


def test_numeric_version_two_is_accepted() -> None:
    expect_ok(_header_line(_header(version=2.0)))


@pytest.mark.parametrize(
    "changes",
    [
        {"id": _ABSENT},
        {"id": None},
        {"id": 1},
        {"id": UPPER_ID},
        {"id": "01900000-0000-4000-8000-000000000001"},  # version 4
        {"id": "01900000-0000-7000-c000-000000000001"},  # wrong variant
        {"id": "01900000000070008000000000000001"},
        {"id": "{01900000-0000-7000-8000-000000000001}"},
        {"id": make_id(1) + " "},
        {"id": ""},
        {"createdAt": _ABSENT},
        {"createdAt": -1},
        {"createdAt": MAX_SAFE + 1},
        {"createdAt": "1710000000000"},
        {"createdAt": True},
        {"createdAt": None},
        {"createdAt": 1.5},
        {"cwd": ""},
        {"cwd": _ABSENT},
        {"cwd": 1},
        {"provider": ""},
        {"provider": None},
        {"model": ""},
        {"model": ["m"]},
        {"environmentIdentity": ""},
        {"environmentIdentity": _ABSENT},
    ],
)
def test_invalid_header_members(changes: dict) -> None:
    expect_error(_header_line(_header(**changes)), "INVALID_HEADER", 1)


@pytest.mark.parametrize("created_at", [0, MAX_SAFE])
def test_created_at_bounds_accepted(created_at: int) -> None:
    state = expect_ok(_header_line(_header(createdAt=created_at)))
    assert state.header.created_at == created_at


def test_header_members_any_order_and_copied_to_state() -> None:
    header = _header(cwd=" ", provider="p", model="m", environmentIdentity="e")
    reordered = dict(reversed(list(header.items())))
    state = expect_ok(_header_line(reordered))
    assert state.to_json()["header"] == {
        "id": header["id"],
        "createdAt": header["createdAt"],
        "cwd": " ",
        "provider": "p",
        "model": "m",
        "environmentIdentity": "e",
    }


def test_header_id_is_not_in_the_fact_namespace() -> None:
    kit = SessionKit()
    header_id = kit.header["id"]
    with kit.tx():
        user = kit.entry(
            {"type": "message", "message": {"role": "user", "content": "hi"}}, fact_id=header_id
        )
        kit.record(
            {
                "type": "runStarted",
                "operationId": header_id.replace("0001", "00ff"),
                "operationKind": "run",
                "inputEntryId": user["id"],
            }
        )
    expect_ok(kit)
    kit2 = SessionKit()
    user2 = kit2.user()
    kit2.record(
        {
            "type": "runStarted",
            "operationId": kit2.header["id"],
            "operationKind": "run",
            "inputEntryId": user2["id"],
        }
    )
    expect_ok(kit2)


def test_header_error_precedes_everything_after_it() -> None:
    data = _header_line(_header(cwd="")) + b"not json\n"
    expect_error(data, "INVALID_HEADER", 1)


# ====================================================================== 5.1 transactions


def test_empty_transaction() -> None:
    kit = SessionKit()
    kit.simple_run()
    value = kit.line([])
    expect_error(kit, "EMPTY_TRANSACTION", kit.line_of(value), None)


def test_empty_transaction_as_first_fact_line() -> None:
    kit = SessionKit()
    kit.line([])
    expect_error(kit, "EMPTY_TRANSACTION", 2, None)


@pytest.mark.parametrize("value", [[1], "x", 1, None, True, [[]], [None], 1.5, [[{}]]])
def test_fact_not_an_object(value: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    kit.line(value)
    expect_error(kit, FACT, kit.next_line - 1, None)


def test_later_fact_of_array_not_an_object() -> None:
    kit = SessionKit()
    with kit.tx() as facts:
        kit.user()
    facts.append("x")
    expect_error(kit, FACT, 2, None)


@pytest.mark.parametrize("seq", [_ABSENT, 0, -1, 1.0, 1.5, True, False, "1", None, MAX_SAFE + 1])
def test_invalid_seq_is_invalid_fact_without_seq(seq: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if seq is _ABSENT:
        del fact["seq"]
    else:
        fact["seq"] = seq
    expect_error(kit, FACT, 2, None)


def test_empty_object_fact() -> None:
    kit = SessionKit()
    kit.line({})
    expect_error(kit, FACT, 2, None)


def test_invalid_seq_in_second_fact_of_array() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user()
        run = kit.run_started()
    run["seq"] = 0
    expect_error(kit, FACT, 2, None)


def test_seq_must_start_at_one() -> None:
    kit = SessionKit()
    fact = kit.user()
    fact["seq"] = 2
    expect_error(kit, "SEQ_MISMATCH", 2, 2)


def test_seq_mismatch_reports_the_found_seq() -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.user()
    fact["seq"] = 42
    expect_error(kit, "SEQ_MISMATCH", kit.line_of(fact), 42)


def test_seq_repeated_inside_an_array() -> None:
    kit = SessionKit()
    with kit.tx():
        user = kit.user()
        run = kit.run_started()
    run["seq"] = user["seq"]
    expect_error(kit, "SEQ_MISMATCH", 2, 1)


def test_seq_going_back_across_lines() -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.user()
    fact["seq"] = 3
    expect_error(kit, "SEQ_MISMATCH", kit.line_of(fact), 3)


def test_seq_mismatch_wins_over_later_envelope_checks() -> None:
    kit = SessionKit()
    fact = kit.user()
    fact.update(seq=5, id="bad", timestamp=-1, kind="nope")
    expect_error(kit, "SEQ_MISMATCH", 2, 5)


def test_not_an_object_wins_over_everything() -> None:
    kit = SessionKit()
    kit.line(["x", {"seq": 9}])
    expect_error(kit, FACT, 2, None)


# ====================================================================== 13.1 envelope


@pytest.mark.parametrize(
    "fact_id",
    [_ABSENT, None, 7, "", UPPER_ID, "01900000-0000-4000-8000-000000000063", "x"],
)
def test_envelope_invalid_id(fact_id: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if fact_id is _ABSENT:
        del fact["id"]
    else:
        fact["id"] = fact_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("timestamp", [_ABSENT, -1, 1.5, True, "1", None, MAX_SAFE + 1])
def test_envelope_invalid_timestamp(timestamp: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if timestamp is _ABSENT:
        del fact["timestamp"]
    else:
        fact["timestamp"] = timestamp
    fails(kit, fact, FACT)


@pytest.mark.parametrize("timestamp", [0, MAX_SAFE, 5])
def test_envelope_timestamp_is_never_ordered(timestamp: int) -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    facts["assistant"]["timestamp"] = timestamp
    expect_ok(kit)


def test_envelope_duplicate_fact_id_of_earlier_line() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.user()
    fact["id"] = facts["assistant"]["id"]
    fails(kit, fact, DUP)


def test_envelope_duplicate_fact_id_within_array() -> None:
    kit = SessionKit()
    with kit.tx():
        user = kit.user()
        second = kit.user()
    second["id"] = user["id"]
    fails(kit, second, DUP)


def test_envelope_invalid_timestamp_wins_over_duplicate_id() -> None:
    kit = SessionKit()
    first = kit.user()
    fact = kit.user()
    fact.update(id=first["id"], timestamp=-5)
    fails(kit, fact, FACT)


def test_envelope_duplicate_id_wins_over_unknown_kind() -> None:
    kit = SessionKit()
    first = kit.user()
    fact = kit.user()
    fact.update(id=first["id"], kind="bogus")
    fails(kit, fact, DUP)


@pytest.mark.parametrize("kind", [_ABSENT, "Entry", "header", "records", None, 1])
def test_envelope_unknown_kind(kind: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if kind is _ABSENT:
        del fact["kind"]
    else:
        fact["kind"] = kind
    fails(kit, fact, FACT)


def test_consumed_result_id_cannot_be_reused() -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    fact = kit.user()
    fact["id"] = facts["result"]["id"]
    fails(kit, fact, DUP)


# --- 13.1 step 8: reserved IDs, checked after the kind-specific checks


def test_record_fact_id_equal_to_reserved_operation_id() -> None:
    kit = attempting()
    op_id = kit.op["id"]  # type: ignore[index]
    fact = kit.step_failed()
    fact["id"] = op_id
    fails(kit, fact, DUP)


def test_record_fact_id_equal_to_reserved_step_and_attempt_ids() -> None:
    for member in ("stepId", "attemptId"):
        kit = attempting()
        reserved = kit.step[member]  # type: ignore[index]
        fact = kit.abort()
        fact["id"] = reserved
        fails(kit, fact, DUP)


def test_usage_fact_id_equal_to_reserved_id() -> None:
    kit = attempting()
    fact = kit.usage()
    fact["id"] = kit.step["stepId"]  # type: ignore[index]
    fails(kit, fact, DUP)


def test_reserved_id_check_runs_after_kind_specific_checks() -> None:
    # A record with a reserved fact ID *and* a kind-specific defect reports the defect.
    kit = attempting()
    fact = kit.abort()
    fact["id"] = kit.step["attemptId"]  # type: ignore[index]
    fact["record"]["reason"] = "timeout"
    fails(kit, fact, TRANS)

    kit = attempting()
    fact = kit.usage()
    fact["id"] = kit.step["stepId"]  # type: ignore[index]
    fact["usage"]["input"] = -1
    fails(kit, fact, FACT)


def test_run_started_whose_id_equals_its_own_operation_id() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user()
        run = kit.run_started()
    run["id"] = run["record"]["operationId"]
    fails(kit, run, DUP)


def test_step_attempt_whose_id_equals_its_own_step_or_attempt_id() -> None:
    for member in ("stepId", "attemptId"):
        kit = running()
        fact = kit.step_attempt()
        fact["id"] = fact["record"][member]
        fails(kit, fact, DUP)


def test_tool_started_whose_id_equals_its_own_result_entry_id() -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["id"] = fact["record"]["resultEntryId"]
    fails(kit, fact, DUP)


def test_compaction_started_whose_id_equals_its_own_ids() -> None:
    for member in ("operationId", "resultEntryId"):
        kit = SessionKit()
        kit.simple_run()
        fact = kit.compaction_started()
        fact["id"] = fact["record"][member]
        fails(kit, fact, DUP)


def test_pre_execution_result_with_a_provisioned_result_id() -> None:
    # Call 1 is answered by a pre-execution result whose fact ID is the result ID
    # provisioned for call 0: all 7.4 checks pass, 13.1 step 8 rejects it.
    kit = tool_use(("read", "nope"))
    started = kit.tool_started(0)
    kit.tool_result(started)
    kit2 = tool_use(("read", "nope"))
    started2 = kit2.tool_started(0)
    fact = kit2.synthetic(1, "unknownTool")
    fact["id"] = started2["record"]["resultEntryId"]
    fails(kit2, fact, DUP)


def test_record_with_provisioned_tool_result_id_as_fact_id() -> None:
    kit = pending()
    reserved = kit.started[-1]["record"]["resultEntryId"]
    fact = kit.usage()
    fact["id"] = reserved
    fails(kit, fact, DUP)


def test_record_with_unconsumed_compaction_result_id_as_fact_id() -> None:
    kit, started = aborted_compaction()
    _, run = kit.start_run()
    run["id"] = started["record"]["resultEntryId"]
    fails(kit, run, DUP)


# ====================================================================== 13.2 entries


def test_entry_fact_closed() -> None:
    kit = SessionKit()
    fact = kit.user()
    fact["record"] = {}
    fails(kit, fact, FACT)


@pytest.mark.parametrize("entry", [_ABSENT, None, [], "message", 1])
def test_entry_not_an_object(entry: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if entry is _ABSENT:
        del fact["entry"]
    else:
        fact["entry"] = entry
    fails(kit, fact, FACT)


@pytest.mark.parametrize("entry_type", [_ABSENT, "Message", "tool", "compacted", None])
def test_entry_unknown_type(entry_type: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    if entry_type is _ABSENT:
        del fact["entry"]["type"]
    else:
        fact["entry"]["type"] = entry_type
    fails(kit, fact, FACT)


# --- 13.2.M step 1: message shapes (6.1)

_USER_MESSAGES: list[Any] = [
    None,
    [],
    "hi",
    {},
    {"role": "user"},
    {"role": "user", "content": ""},
    {"role": "user", "content": None},
    {"role": "user", "content": 1},
    {"role": "user", "content": ["text"]},
    {"role": "user", "content": "hi", "name": "bob"},
    {"role": "system", "content": "hi"},
    {"role": "developer", "content": "hi"},
    {"role": "User", "content": "hi"},
    {"content": "hi"},
    {"role": None, "content": "hi"},
]


@pytest.mark.parametrize("message", _USER_MESSAGES)
def test_invalid_user_message(message: Any) -> None:
    kit = SessionKit()
    fact = kit.user()
    fact["entry"]["message"] = message
    fails(kit, fact, FACT)


def test_user_message_missing() -> None:
    kit = SessionKit()
    fact = kit.user()
    del fact["entry"]["message"]
    fails(kit, fact, FACT)


def _call(**changes: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": "call_x",
        "type": "function",
        "function": {"name": "read", "arguments": "{}"},
    }
    for name, value in changes.items():
        if value is _ABSENT:
            call.pop(name)
        else:
            call[name] = value
    return call


_ASSISTANT_MESSAGES: list[Any] = [
    {"role": "assistant"},  # content absent: readers SHOULD reject (spec 6.1 / 17)
    {"role": "assistant", "content": 1},
    {"role": "assistant", "content": ["a"]},
    {"role": "assistant", "content": {"text": "a"}},
    {"role": "assistant", "content": "a", "extra": 1},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "assistant", "content": None, "tool_calls": None},
    {"role": "assistant", "content": None, "tool_calls": {}},
    {"role": "assistant", "content": None, "tool_calls": [None]},
    {"role": "assistant", "content": None, "tool_calls": [_call(id="")]},
    {"role": "assistant", "content": None, "tool_calls": [_call(id=1)]},
    {"role": "assistant", "content": None, "tool_calls": [_call(id=_ABSENT)]},
    {"role": "assistant", "content": None, "tool_calls": [_call(type="tool")]},
    {"role": "assistant", "content": None, "tool_calls": [_call(type=_ABSENT)]},
    {"role": "assistant", "content": None, "tool_calls": [_call(extra=1)]},
    {"role": "assistant", "content": None, "tool_calls": [_call(function=None)]},
    {"role": "assistant", "content": None, "tool_calls": [_call(function={"name": "read"})]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call(function={"name": "", "arguments": "{}"})],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call(function={"name": "read", "arguments": {}})],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call(function={"name": "read", "arguments": None})],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call(function={"name": "read", "arguments": "", "strict": True})],
    },
]


@pytest.mark.parametrize("message", _ASSISTANT_MESSAGES)
def test_invalid_assistant_message(message: Any) -> None:
    kit = attempting()
    fact = kit.assistant("x")
    fact["entry"]["message"] = message
    fact["entry"]["stopReason"] = "length"
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "content": "ok"},
        {"role": "tool", "content": "ok", "tool_call_id": ""},
        {"role": "tool", "content": "ok", "tool_call_id": 1},
        {"role": "tool", "content": None, "tool_call_id": "call_1"},
        {"role": "tool", "tool_call_id": "call_1"},
        {"role": "tool", "content": ["ok"], "tool_call_id": "call_1"},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1", "name": "read"},
    ],
)
def test_invalid_tool_message(message: Any) -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["entry"]["message"] = message
    fails(kit, fact, FACT)


def test_empty_tool_content_and_arguments_are_fine() -> None:
    kit = tool_use()
    kit.assistant_info["calls"][0]["function"]["arguments"] = ""  # type: ignore[index]
    kit.tool_started(0, arguments={})
    kit.tool_result(content="")
    kit.step_attempt()
    kit.assistant("", stop_reason="length")
    expect_ok(kit)


def test_duplicate_call_ids_in_one_message() -> None:
    kit = attempting()
    fact = kit.assistant(None, ["read", "write"])
    calls = fact["entry"]["message"]["tool_calls"]
    calls[1]["id"] = calls[0]["id"]
    fails(kit, fact, SCRIPT)


def test_invalid_call_wins_over_duplicate_call_ids() -> None:
    kit = attempting()
    fact = kit.assistant(None, ["read", "write", "read"])
    calls = fact["entry"]["message"]["tool_calls"]
    calls[1]["id"] = calls[0]["id"]
    calls[2]["type"] = "other"
    fails(kit, fact, FACT)


def test_duplicate_call_ids_win_over_reserved_id_and_bad_references() -> None:
    kit = attempting()
    fact = kit.assistant(None, ["read", "write"])
    calls = fact["entry"]["message"]["tool_calls"]
    calls[1]["id"] = calls[0]["id"]
    fact["id"] = kit.step["stepId"]  # type: ignore[index]
    fact["entry"]["attemptId"] = UNUSED_ID
    fails(kit, fact, SCRIPT)


def test_same_call_id_in_different_messages_is_fine() -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.assistant(None, [kit.call("read") | {"id": "same"}])
    kit.tool_result(kit.tool_started(0))
    kit.step_attempt()
    kit.assistant(None, [kit.call("read") | {"id": "same"}])
    kit.tool_result(kit.tool_started(0))
    expect_ok(kit)


# --- user entries (7.1)


def test_user_entry_with_reserved_id() -> None:
    kit = attempting()
    fact = kit.user()
    fact["id"] = kit.step["attemptId"]  # type: ignore[index]
    fails(kit, fact, DUP)


def test_user_entry_with_provisioned_result_id_is_duplicate_not_transcript() -> None:
    kit = pending()
    fact = kit.user()
    fact["id"] = kit.started[-1]["record"]["resultEntryId"]
    fails(kit, fact, DUP)


@pytest.mark.parametrize(
    "member", [("stepId", make_id(5)), ("toolName", "read"), ("attemptId", make_id(6))]
)
def test_user_entry_closed(member: tuple[str, Any]) -> None:
    kit = SessionKit()
    fact = kit.user()
    fact["entry"][member[0]] = member[1]
    fails(kit, fact, FACT)


def test_user_entry_reserved_id_wins_over_closed() -> None:
    kit = attempting()
    fact = kit.user()
    fact["id"] = kit.op["id"]  # type: ignore[index]
    fact["entry"]["stepId"] = kit.step["stepId"]  # type: ignore[index]
    fails(kit, fact, DUP)


def test_user_entry_invalid_message_wins_over_reserved_id() -> None:
    kit = attempting()
    fact = kit.user()
    fact["id"] = kit.op["id"]  # type: ignore[index]
    fact["entry"]["message"]["content"] = ""
    fails(kit, fact, FACT)


def test_user_message_while_calls_are_open() -> None:
    kit = tool_use()
    fact = kit.user("interrupting")
    fails(kit, fact, SCRIPT)


def test_user_message_while_a_started_tool_is_pending() -> None:
    kit = pending()
    fact = kit.user("interrupting")
    fails(kit, fact, SCRIPT)


def test_user_message_inside_an_operation_is_fine_when_no_call_is_open() -> None:
    kit = attempting()
    kit.user("by the way")
    expect_ok(kit)
    kit2 = SessionKit()
    kit2.simple_run()
    kit2.compaction_started()
    kit2.user("during compaction")
    expect_ok(kit2)


# --- assistant entries (7.2, 13.2.M assistant)


def test_assistant_entry_with_reserved_id() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["id"] = kit.step["stepId"]  # type: ignore[index]
    fails(kit, fact, DUP)


def test_assistant_entry_reserved_id_wins_over_everything_after() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["id"] = kit.op["id"]  # type: ignore[index]
    fact["entry"].update(extra=1, stopReason="bogus", attemptId=UNUSED_ID)
    fails(kit, fact, DUP)


@pytest.mark.parametrize(
    "member", [("toolName", "read"), ("toolStartedId", make_id(5)), ("operationId", make_id(4))]
)
def test_assistant_entry_closed(member: tuple[str, Any]) -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["entry"][member[0]] = member[1]
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "changes",
    [
        {"stepId": "x"},
        {"stepId": None},
        {"attemptId": "x"},
        {"attemptId": UPPER_ID},
        {"stepId": _ABSENT},
        {"attemptId": _ABSENT},
    ],
)
def test_assistant_entry_invalid_ids(changes: dict) -> None:
    kit = attempting()
    fact = kit.assistant()
    for name, value in changes.items():
        if value is _ABSENT:
            del fact["entry"][name]
        else:
            fact["entry"][name] = value
    fails(kit, fact, FACT)


@pytest.mark.parametrize("stop", [_ABSENT, "end_turn", "tool_use", "STOP", None, "error"])
def test_assistant_entry_invalid_stop_reason(stop: Any) -> None:
    kit = attempting()
    fact = kit.assistant()
    if stop is _ABSENT:
        del fact["entry"]["stopReason"]
    else:
        fact["entry"]["stopReason"] = stop
    fails(kit, fact, FACT)


def test_assistant_entry_invalid_ids_win_over_stop_reason() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["entry"].update(stepId="x", stopReason="x")
    fails(kit, fact, FACT)


def test_assistant_entry_unknown_attempt() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["entry"]["attemptId"] = UNUSED_ID
    fails(kit, fact, REF)


def test_assistant_entry_attempt_of_another_step() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["entry"]["stepId"] = kit.op["id"]  # type: ignore[index]
    fails(kit, fact, REF)


def test_assistant_entry_attempt_id_names_a_step() -> None:
    kit = attempting()
    fact = kit.assistant()
    fact["entry"]["attemptId"] = kit.step["stepId"]  # type: ignore[index]
    fails(kit, fact, REF)


def test_assistant_entry_settles_a_settled_attempt() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    first_step = dict(kit.step)  # type: ignore[arg-type]
    kit.step_attempt()
    fact = kit.assistant()
    fact["entry"].update(stepId=first_step["stepId"], attemptId=first_step["attemptId"])
    fails(kit, fact, REF)


def test_assistant_entry_settles_a_failed_attempt() -> None:
    kit = attempting()
    kit.step_failed()
    fact = kit.assistant()
    fails(kit, fact, REF)


def test_assistant_entry_settles_a_superseded_attempt() -> None:
    kit = attempting()
    first = dict(kit.step)  # type: ignore[arg-type]
    kit.retry()
    fact = kit.assistant()
    fact["entry"]["attemptId"] = first["attemptId"]
    fails(kit, fact, REF)


def test_assistant_entry_settles_a_compaction_attempt() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.entry(
        {
            "type": "message",
            "stepId": kit.step["stepId"],  # type: ignore[index]
            "attemptId": kit.step["attemptId"],  # type: ignore[index]
            "stopReason": "stop",
            "message": {"role": "assistant", "content": "summary"},
        }
    )
    fails(kit, fact, REF)


def test_assistant_entry_for_open_attempt_of_a_failed_run() -> None:
    # The run finished "failed" with its attempt still open (allowed); the attempt
    # exists and is open, but the run is no longer the active operation.
    kit = attempting()
    kit.finish("failed")
    fact = kit.assistant()
    fails(kit, fact, TRANS)


def test_assistant_entry_for_open_attempt_of_another_operation() -> None:
    kit = attempting()
    kit.finish("failed")
    stale = dict(kit.step)  # type: ignore[arg-type]
    kit.start_run("again")
    kit.step_attempt()
    fact = kit.assistant()
    fact["entry"].update(stepId=stale["stepId"], attemptId=stale["attemptId"])
    fails(kit, fact, TRANS)


def test_assistant_entry_while_a_compaction_is_active() -> None:
    # An open attempt from a failed run, settled while a compaction is active.
    kit = attempting()
    stale = dict(kit.step)  # type: ignore[arg-type]
    kit.finish("failed")
    kit.user("more")
    kit.compaction_started()
    fact = kit.entry(
        {
            "type": "message",
            "stepId": stale["stepId"],
            "attemptId": stale["attemptId"],
            "stopReason": "stop",
            "message": {"role": "assistant", "content": "late"},
        }
    )
    fails(kit, fact, TRANS)


def test_assistant_tool_use_without_calls() -> None:
    kit = attempting()
    fact = kit.assistant("x", stop_reason="toolUse")
    fails(kit, fact, SCRIPT)


def test_assistant_stop_with_calls() -> None:
    kit = attempting()
    fact = kit.assistant(None, ["read"], stop_reason="stop")
    fails(kit, fact, SCRIPT)


def test_assistant_reference_error_wins_over_stop_reason_mismatch() -> None:
    kit = attempting()
    fact = kit.assistant(None, ["read"], stop_reason="stop")
    fact["entry"]["attemptId"] = UNUSED_ID
    fails(kit, fact, REF)


def test_assistant_transition_error_wins_over_stop_reason_mismatch() -> None:
    kit = attempting()
    kit.finish("failed")
    fact = kit.assistant("x", stop_reason="toolUse")
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("calls", [(), ("read",)])
def test_assistant_length_allows_calls_or_none(calls: tuple[str, ...]) -> None:
    kit = attempting()
    kit.assistant("partial", list(calls), stop_reason="length")
    state = expect_ok(kit)
    assert state.operation.step.stop_reason == "length"  # type: ignore[union-attr]


def test_assistant_message_while_calls_are_open() -> None:
    # Step 2 may start while call 1 of step 1 is unanswered (no started tool is pending),
    # but its answer would follow an assistant message with an open call.
    kit = tool_use(("read", "nope"))
    kit.tool_result(kit.tool_started(0))
    kit.step_attempt()
    fact = kit.assistant("done")
    fails(kit, fact, SCRIPT)


# --- pre-execution synthetic results (7.4)


def _pre(kit: SessionKit, index: int = 0, reason: str = "unknownTool") -> dict:
    return kit.synthetic(index, reason)


@pytest.mark.parametrize(
    "member", [("toolStartedId", make_id(9)), ("attemptId", make_id(9)), ("extra", 1)]
)
def test_pre_execution_closed(member: tuple[str, Any]) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"][member[0]] = member[1]
    fails(kit, fact, FACT)


def test_pre_execution_form_chosen_by_tool_index_alone() -> None:
    # toolIndex without assistantEntryId selects the pre-execution form (missing member).
    kit = tool_use(("nope",))
    fact = _pre(kit)
    del fact["entry"]["assistantEntryId"]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("step_id", ["x", None, _ABSENT])
def test_pre_execution_invalid_step_id(step_id: Any) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    if step_id is _ABSENT:
        del fact["entry"]["stepId"]
    else:
        fact["entry"]["stepId"] = step_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "result",
    [
        None,
        "synthetic",
        [],
        {"type": "synthetic", "reason": "unknownTool", "extra": 1},
        {"type": "synthetic", "reason": "unknownTool", "detail": "x"},
    ],
)
def test_pre_execution_invalid_result_object(result: Any) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["result"] = result
    fails(kit, fact, FACT)


@pytest.mark.parametrize("name", ["", None, 1, _ABSENT])
def test_pre_execution_invalid_tool_name(name: Any) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    if name is _ABSENT:
        del fact["entry"]["toolName"]
    else:
        fact["entry"]["toolName"] = name
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "result",
    [
        {"type": "success"},
        {"type": "error"},
        {"type": "synthetic"},
        {"type": "synthetic", "reason": "interrupted"},  # started form only
        {"type": "synthetic", "reason": "UnknownTool"},
        {"type": "synthetic", "reason": None},
        {"reason": "unknownTool"},
    ],
)
def test_pre_execution_invalid_result(result: Any) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["result"] = result
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "changes",
    [
        {"assistantEntryId": "x"},
        {"assistantEntryId": None},
        {"toolIndex": -1},
        {"toolIndex": "0"},
        {"toolIndex": True},
        {"toolIndex": 0.5},
        {"toolIndex": None},
        {"toolIndex": MAX_SAFE + 1},
    ],
)
def test_pre_execution_invalid_pair(changes: dict) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"].update(changes)
    fails(kit, fact, FACT)


def test_pre_execution_invalid_result_wins_over_invalid_pair() -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"].update(toolIndex=-1, result={"type": "success"})
    fails(kit, fact, FACT)


def test_pre_execution_unknown_assistant_entry() -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["assistantEntryId"] = UNUSED_ID
    fails(kit, fact, REF)


def test_pre_execution_user_entry_as_assistant() -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["assistantEntryId"] = kit.last_user_id
    fails(kit, fact, REF)


def test_pre_execution_record_id_as_assistant() -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["assistantEntryId"] = kit.op["id"]  # type: ignore[index]
    fails(kit, fact, REF)


def test_pre_execution_step_mismatch() -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["stepId"] = kit.step["attemptId"]  # type: ignore[index]
    fails(kit, fact, REF)


def test_pre_execution_after_the_run_finished() -> None:
    kit = tool_use(("nope",))
    kit.finish("failed")
    fact = _pre(kit)
    fails(kit, fact, REF)


def test_pre_execution_for_an_assistant_entry_of_another_run() -> None:
    kit = tool_use(("nope",))
    old = kit.fork().assistant_info
    kit.synthetic(0, "unknownTool")
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    kit.start_run("second")
    kit.step_attempt()
    kit.assistant(None, ["nope"])
    fact = _pre(kit)
    fact["entry"].update(assistantEntryId=old["id"], stepId=old["stepId"])  # type: ignore[index]
    fails(kit, fact, REF)


def test_pre_execution_while_a_compaction_is_active() -> None:
    kit = tool_use(("nope",))
    info = dict(kit.assistant_info)  # type: ignore[arg-type]
    kit.finish("failed")
    kit.compaction_started()
    fact = kit.entry(
        {
            "type": "message",
            "stepId": info["stepId"],
            "assistantEntryId": info["id"],
            "toolIndex": 0,
            "message": {
                "role": "tool",
                "content": SYNTHETIC_CONTENT["unknownTool"],
                "tool_call_id": info["calls"][0]["id"],
            },
            "toolName": "nope",
            "result": {"type": "synthetic", "reason": "unknownTool"},
        }
    )
    fails(kit, fact, REF)


@pytest.mark.parametrize(
    "changes",
    [
        {"toolIndex": 1},
        {"toolIndex": MAX_SAFE},
        {"toolName": "read"},
        {
            "message": {
                "role": "tool",
                "content": SYNTHETIC_CONTENT["unknownTool"],
                "tool_call_id": "call_other",
            }
        },
    ],
)
def test_pre_execution_call_mismatch(changes: dict) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"].update(changes)
    fails(kit, fact, REF)


def test_pre_execution_for_an_assistant_without_calls() -> None:
    kit = tool_use(("nope",))
    kit.synthetic(0, "unknownTool")
    kit.step_attempt()
    answer = kit.assistant("done", stop_reason="length")
    fact = kit.entry(
        {
            "type": "message",
            "stepId": kit.step["stepId"],  # type: ignore[index]
            "assistantEntryId": answer["id"],
            "toolIndex": 0,
            "message": {
                "role": "tool",
                "content": SYNTHETIC_CONTENT["truncated"],
                "tool_call_id": "call_1",
            },
            "toolName": "nope",
            "result": {"type": "synthetic", "reason": "truncated"},
        }
    )
    fails(kit, fact, REF)


def test_pre_execution_pair_used_twice() -> None:
    kit = tool_use(("nope", "nope"))
    kit.synthetic(0, "unknownTool")
    fact = _pre(kit, 0)
    fails(kit, fact, TRANS)


def test_pre_execution_for_a_started_call() -> None:
    kit = pending()
    fact = kit.synthetic(0, "aborted")
    fails(kit, fact, TRANS)


def test_pre_execution_after_the_call_completed() -> None:
    kit = pending()
    kit.tool_result()
    fact = kit.synthetic(0, "aborted")
    fails(kit, fact, TRANS)


@pytest.mark.parametrize(
    "content",
    [
        SYNTHETIC_CONTENT["unknownTool"] + "\n",
        SYNTHETIC_CONTENT["unknownTool"].lower(),
        SYNTHETIC_CONTENT["invalidArguments"],  # the text of another reason
        "",
        " " + SYNTHETIC_CONTENT["unknownTool"],
    ],
)
def test_pre_execution_wrong_content(content: str) -> None:
    kit = tool_use(("nope",))
    fact = _pre(kit)
    fact["entry"]["message"]["content"] = content
    fails(kit, fact, SCRIPT)


def test_pre_execution_pair_check_wins_over_content() -> None:
    kit = tool_use(("nope",))
    kit.synthetic(0, "unknownTool")
    fact = _pre(kit, 0)
    fact["entry"]["message"]["content"] = "wrong"
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("reason", ["invalidArguments", "unknownTool", "truncated", "aborted"])
def test_pre_execution_any_reason_on_a_tool_use_answer(reason: str) -> None:
    kit = tool_use(("read",))
    kit.synthetic(0, reason)
    state = expect_ok(kit)
    assert state.transcript[-1] == {
        "role": "tool",
        "content": SYNTHETIC_CONTENT[reason],
        "tool_call_id": kit.assistant_info["calls"][0]["id"],  # type: ignore[index]
    }


def test_tool_result_answering_a_call_of_an_older_message() -> None:
    # Step 1 asked for two calls; call 0 was answered and step 2 answered with a new
    # call. A pre-execution result for step 1's call 1 passes every fact check but is
    # not answering a call of the nearest assistant message.
    kit = tool_use(("read", "nope"))
    old = dict(kit.assistant_info)  # type: ignore[arg-type]
    kit.tool_result(kit.tool_started(0))
    kit.step_attempt()
    with kit.tx():
        kit.assistant(None, ["read"])
        fact = kit.entry(
            {
                "type": "message",
                "stepId": old["stepId"],
                "assistantEntryId": old["id"],
                "toolIndex": 1,
                "message": {
                    "role": "tool",
                    "content": SYNTHETIC_CONTENT["unknownTool"],
                    "tool_call_id": old["calls"][1]["id"],
                },
                "toolName": "nope",
                "result": {"type": "synthetic", "reason": "unknownTool"},
            }
        )
    # The assistant entry itself is illegal here (call 1 of step 1 is still open), so
    # the end-of-transaction check fails, reported at the last fact.
    fails(kit, fact, SCRIPT)


def test_started_result_after_a_new_assistant_message() -> None:
    # The run failed with the tool pending; nothing prevents its result later, but
    # only while its call is still the open one.
    kit = pending(("read",))
    started = kit.started[-1]
    kit.finish("failed")
    kit.tool_result(started)
    state = expect_ok(kit)
    assert state.transcript[-1]["role"] == "tool"
    assert state.operation.kind == "idle"


# --- started-form results (7.3)


@pytest.mark.parametrize(
    "member", [("extra", 1), ("attemptId", make_id(5)), ("stopReason", "stop")]
)
def test_started_result_closed(member: tuple[str, Any]) -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["entry"][member[0]] = member[1]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("step_id", ["x", None, _ABSENT])
def test_started_result_invalid_step_id(step_id: Any) -> None:
    kit = pending()
    fact = kit.tool_result()
    if step_id is _ABSENT:
        del fact["entry"]["stepId"]
    else:
        fact["entry"]["stepId"] = step_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "result", [None, [], "success", _ABSENT, {"type": "success", "detail": "x"}]
)
def test_started_result_invalid_result_object(result: Any) -> None:
    kit = pending()
    fact = kit.tool_result()
    if result is _ABSENT:
        del fact["entry"]["result"]
    else:
        fact["entry"]["result"] = result
    fails(kit, fact, FACT)


@pytest.mark.parametrize("name", ["", None, _ABSENT])
def test_started_result_invalid_tool_name(name: Any) -> None:
    kit = pending()
    fact = kit.tool_result()
    if name is _ABSENT:
        del fact["entry"]["toolName"]
    else:
        fact["entry"]["toolName"] = name
    fails(kit, fact, FACT)


def test_started_result_with_a_fresh_id() -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["id"] = UNUSED_ID
    fails(kit, fact, REF)


def test_started_result_with_a_reserved_non_result_id() -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["id"] = kit.op["id"]  # type: ignore[index]
    fails(kit, fact, REF)


def test_started_result_with_a_compaction_result_id() -> None:
    kit = compacting()
    fact = kit.entry(
        {
            "type": "message",
            "stepId": make_id(5),
            "message": {"role": "tool", "content": "x", "tool_call_id": "call_1"},
            "toolName": "read",
            "toolStartedId": make_id(9),
            "result": {"type": "success"},
        },
        fact_id=kit.op["result"],  # type: ignore[index]
    )
    fails(kit, fact, REF)


def test_started_result_fresh_id_wins_over_result_type() -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["id"] = UNUSED_ID
    fact["entry"]["result"] = {"type": "bogus"}
    fails(kit, fact, REF)


def test_started_result_result_object_wins_over_fresh_id() -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["id"] = UNUSED_ID
    fact["entry"]["result"] = {"type": "success", "extra": 1}
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "result",
    [
        {"type": "bogus"},
        {"type": None},
        {},
        {"type": "synthetic"},
        {"type": "synthetic", "reason": "aborted"},
        {"type": "synthetic", "reason": "unknownTool"},
        {"type": "success", "reason": "interrupted"},
        {"type": "error", "reason": "x"},
    ],
)
def test_started_result_invalid_result(result: dict) -> None:
    kit = pending()
    fact = kit.tool_result()
    fact["entry"]["result"] = result
    fails(kit, fact, FACT)


def test_started_result_interrupted_wrong_content() -> None:
    kit = pending()
    fact = kit.interrupted()
    fact["entry"]["message"]["content"] = "interrupted"
    fails(kit, fact, SCRIPT)


def test_started_result_interrupted_content_on_success_is_fine() -> None:
    kit = pending()
    kit.tool_result(content=SYNTHETIC_CONTENT["interrupted"])
    expect_ok(kit)


def test_started_result_content_check_wins_over_started_id() -> None:
    kit = pending()
    fact = kit.interrupted()
    fact["entry"]["message"]["content"] = "x"
    fact["entry"]["toolStartedId"] = "bad"
    fails(kit, fact, SCRIPT)


@pytest.mark.parametrize("started_id", ["x", None, _ABSENT, 5])
def test_started_result_invalid_tool_started_id(started_id: Any) -> None:
    kit = pending()
    fact = kit.tool_result()
    if started_id is _ABSENT:
        del fact["entry"]["toolStartedId"]
    else:
        fact["entry"]["toolStartedId"] = started_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda kit, e: e.update(toolStartedId=UNUSED_ID),
        lambda kit, e: e.update(toolStartedId=kit.op["id"]),
        lambda kit, e: e.update(stepId=kit.op["id"]),
        lambda kit, e: e.update(toolName="write"),
        lambda kit, e: e["message"].update(tool_call_id="call_other"),
    ],
    ids=["unknown", "not-a-tool", "step", "name", "call-id"],
)
def test_started_result_reference_mismatch(mutate: Callable[[SessionKit, dict], None]) -> None:
    kit = pending()
    fact = kit.tool_result()
    mutate(kit, fact["entry"])
    fails(kit, fact, REF)


def test_started_result_of_another_tool_uses_its_result_id() -> None:
    # Two pending tools: the result for tool 0 carries the ID provisioned for tool 1.
    kit = tool_use(("read", "write"))
    first = kit.tool_started(0)
    second = kit.tool_started(1)
    fact = kit.tool_result(first)
    fact["id"] = second["record"]["resultEntryId"]
    fails(kit, fact, REF)


def test_started_result_twice() -> None:
    kit = pending()
    first = kit.tool_result()
    fact = kit.tool_result()
    assert fact["id"] == first["id"]
    fails(kit, fact, DUP)


# ====================================================================== 13.3 compaction entry


def test_compaction_entry_with_a_fresh_id() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    fact["id"] = UNUSED_ID
    fails(kit, fact, REF)


def test_compaction_entry_with_a_tool_result_id() -> None:
    kit = pending()
    fact = kit.entry(
        {
            "type": "compaction",
            "operationId": kit.op["id"],  # type: ignore[index]
            "summary": "s",
            "compactedThroughEntryId": kit.last_user_id,
            "retainedTail": [],
        },
        fact_id=kit.started[-1]["record"]["resultEntryId"],
    )
    fails(kit, fact, REF)


def test_compaction_entry_fresh_id_wins_over_closed() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    fact["id"] = UNUSED_ID
    fact["entry"]["extra"] = 1
    fails(kit, fact, REF)


@pytest.mark.parametrize("member", [("extra", 1), ("stepId", make_id(3)), ("message", {})])
def test_compaction_entry_closed(member: tuple[str, Any]) -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    fact["entry"][member[0]] = member[1]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op_id", ["x", None, _ABSENT])
def test_compaction_entry_invalid_operation_id(op_id: Any) -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    if op_id is _ABSENT:
        del fact["entry"]["operationId"]
    else:
        fact["entry"]["operationId"] = op_id
    fails(kit, fact, FACT)


def test_compaction_entry_unknown_operation() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    fact["entry"]["operationId"] = UNUSED_ID
    fails(kit, fact, REF)


def _compaction_entry_for(kit: SessionKit, started: dict, op_id: str) -> dict:
    rec = started["record"]
    return kit.entry(
        {
            "type": "compaction",
            "operationId": op_id,
            "summary": "s",
            "compactedThroughEntryId": rec["inputThroughEntryId"],
            "retainedTail": [],
        },
        fact_id=rec["resultEntryId"],
    )


def test_compaction_entry_for_a_finished_compaction() -> None:
    kit, started = aborted_compaction()
    fact = _compaction_entry_for(kit, started, started["record"]["operationId"])
    fails(kit, fact, TRANS)


def test_compaction_entry_for_a_run() -> None:
    kit, started = aborted_compaction()
    kit.start_run()
    fact = _compaction_entry_for(kit, started, kit.op["id"])  # type: ignore[index]
    fails(kit, fact, TRANS)


def test_compaction_entry_with_another_compactions_result_id() -> None:
    kit, started = aborted_compaction()
    kit.compaction_started()
    kit.step_attempt()
    fact = _compaction_entry_for(kit, started, kit.op["id"])  # type: ignore[index]
    fails(kit, fact, REF)


@pytest.mark.parametrize("through", ["x", None, _ABSENT])
def test_compaction_entry_invalid_compacted_through(through: Any) -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    if through is _ABSENT:
        del fact["entry"]["compactedThroughEntryId"]
    else:
        fact["entry"]["compactedThroughEntryId"] = through
    fails(kit, fact, FACT)


@pytest.mark.parametrize("through", ["unused", "operation", "attempt"])
def test_compaction_entry_compacted_through_not_an_entry(through: str) -> None:
    kit = compacting()
    kit.step_attempt()
    value = {
        "unused": UNUSED_ID,
        "operation": kit.op["id"],  # type: ignore[index]
        "attempt": kit.step["attemptId"],  # type: ignore[index]
    }[through]
    fact = kit.compaction()
    fact["entry"]["compactedThroughEntryId"] = value
    fails(kit, fact, REF)


def test_compaction_entry_unknown_through_wins_over_bad_summary() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    fact["entry"].update(compactedThroughEntryId=UNUSED_ID, summary=None)
    fails(kit, fact, REF)


@pytest.mark.parametrize(
    "changes",
    [
        {"summary": None},
        {"summary": 1},
        {"summary": ["s"]},
        {"summary": _ABSENT},
        {"retainedTail": None},
        {"retainedTail": {}},
        {"retainedTail": _ABSENT},
    ],
)
def test_compaction_entry_invalid_summary_or_tail(changes: dict) -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.compaction()
    for name, value in changes.items():
        if value is _ABSENT:
            del fact["entry"][name]
        else:
            fact["entry"][name] = value
    fails(kit, fact, FACT)


def test_compaction_entry_empty_summary_is_fine() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.compaction("")
    state = expect_ok(kit)
    assert state.active_context[0] == {"role": "user", "content": "[Compacted history]\n"}


def test_compaction_entry_compacted_through_after_input_through() -> None:
    kit = compacting()
    kit.step_attempt()
    late = kit.user("late")
    fact = kit.compaction()
    fact["entry"]["compactedThroughEntryId"] = late["id"]
    fails(kit, fact, REF)


def test_compaction_entry_compacted_through_is_its_own_record() -> None:
    kit = compacting()
    started = kit.fork()
    kit.step_attempt()
    fact = kit.compaction()
    fact["entry"]["compactedThroughEntryId"] = started.op["id"]  # type: ignore[index]
    fails(kit, fact, REF)


def _tail(fact: dict) -> list[dict]:
    tail: list[dict] = fact["entry"]["retainedTail"]
    return tail


@pytest.mark.parametrize(
    "item",
    [
        None,
        [],
        "x",
        {"sourceEntryId": make_id(2)},
        {"message": {"role": "user", "content": "x"}},
        {"sourceEntryId": "x", "message": {"role": "user", "content": "inspect"}},
        {"sourceEntryId": make_id(2), "message": {"role": "user", "content": ""}},
        {"sourceEntryId": make_id(2), "message": {"role": "user", "content": "i"}, "extra": 1},
        {"sourceEntryId": make_id(2), "message": {"role": "assistant"}},
    ],
)
def test_compaction_entry_invalid_tail_item(item: Any) -> None:
    kit = compacting(keep=2)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact)[0] = item
    fails(kit, fact, FACT)


def test_compaction_entry_tail_item_with_duplicate_call_ids() -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.assistant(None, ["read", "write"])
    kit.synthetic(0, "unknownTool")
    kit.synthetic(1, "unknownTool")
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    kit.compaction_started(keep=4)
    kit.step_attempt()
    fact = kit.compaction()
    calls = _tail(fact)[0]["message"]["tool_calls"]
    calls[1]["id"] = calls[0]["id"]
    fails(kit, fact, SCRIPT)


def test_compaction_entry_tail_wrong_id() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    tail = _tail(fact)
    tail[1]["sourceEntryId"] = tail[2]["sourceEntryId"]
    fails(kit, fact, REF)


def test_compaction_entry_tail_items_out_of_order() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    tail = _tail(fact)
    tail[1], tail[2] = tail[2], tail[1]
    fails(kit, fact, REF)


def test_compaction_entry_tail_message_differs() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact)[2]["message"]["content"] = "edited"
    fails(kit, fact, REF)


def test_compaction_entry_tail_message_of_other_role() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact)[2]["message"] = {"role": "user", "content": "done"}
    fails(kit, fact, REF)


def test_compaction_entry_tail_message_null_vs_empty_content() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    assert _tail(fact)[0]["message"]["content"] is None
    _tail(fact)[0]["message"]["content"] = ""
    fails(kit, fact, REF)


def test_compaction_entry_tail_member_order_is_irrelevant() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    for item in _tail(fact):
        item["message"] = dict(reversed(list(item["message"].items())))
    _tail(fact)[0] = dict(reversed(list(_tail(fact)[0].items())))
    expect_ok(kit)


def test_compaction_entry_tail_too_long() -> None:
    kit = compacting(keep=1)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact).append(dict(_tail(fact)[0]))
    fails(kit, fact, REF)


def test_compaction_entry_tail_too_short() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact).pop()
    fails(kit, fact, REF)


def test_compaction_entry_tail_missing_entirely() -> None:
    kit = compacting(keep=2)
    kit.step_attempt()
    fact = kit.compaction()
    fact["entry"]["retainedTail"] = []
    fails(kit, fact, REF)


def test_compaction_entry_tail_items_checked_in_order() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    tail = _tail(fact)
    tail[0]["sourceEntryId"] = UNUSED_ID  # reference error on item 0 ...
    tail[1]["message"] = {"role": "nobody"}  # ... comes before the shape error on item 1
    fails(kit, fact, REF)

    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    tail = _tail(fact)
    tail[0]["message"] = {"role": "nobody"}
    tail[0]["sourceEntryId"] = UNUSED_ID
    fails(kit, fact, FACT)


def test_compaction_entry_illegal_split() -> None:
    # Compacted through the assistant message: the tail starts with its tool result.
    kit = compacting(keep=2)
    kit.step_attempt()
    fact = kit.compaction()
    assert _tail(fact)[0]["message"]["role"] == "tool"
    fails(kit, fact, SCRIPT)


def test_compaction_entry_legal_split_keeping_only_assistant_with_open_calls() -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.assistant(None, ["read"])
    kit.finish("failed")
    kit.compaction_started(keep=1)
    kit.step_attempt()
    kit.compaction()
    kit.finish()
    state = expect_ok(kit)
    assert len(state.active_context) == 2


def test_compaction_entry_tail_reference_wins_over_illegal_split() -> None:
    kit = compacting(keep=2)
    kit.step_attempt()
    fact = kit.compaction()
    _tail(fact)[1]["message"]["content"] = "edited"
    fails(kit, fact, REF)


def test_compaction_entry_without_attempt() -> None:
    kit = compacting()
    fact = kit.compaction()
    fails(kit, fact, TRANS)


def test_compaction_entry_after_failed_attempt() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.step_failed()
    fact = kit.compaction()
    fails(kit, fact, TRANS)


def test_compaction_entry_tail_error_wins_over_missing_attempt() -> None:
    kit = compacting(keep=3)
    fact = kit.compaction()
    _tail(fact).pop()
    fails(kit, fact, REF)


def test_compaction_entry_after_retry_settles_attempt_two() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.retry()
    kit.compaction()
    state = expect_ok(kit)
    step = state.operation.step  # type: ignore[union-attr]
    assert (step.attempt, step.status) == (2, StepStatus.SETTLED)


def test_second_compaction_entry() -> None:
    kit = compacting()
    kit.step_attempt()
    first = kit.compaction()
    fact = kit.entry(dict(first["entry"]), fact_id=UNUSED_ID)
    fails(kit, fact, REF)


# ====================================================================== 13.4 records: common


def test_record_fact_closed() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["entry"] = {}
    fails(kit, fact, FACT)


@pytest.mark.parametrize("record", [_ABSENT, None, [], "stepAttempt"])
def test_record_not_an_object(record: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if record is _ABSENT:
        del fact["record"]
    else:
        fact["record"] = record
    fails(kit, fact, FACT)


@pytest.mark.parametrize("record_type", [_ABSENT, "stepattempt", "runFinished", None, "header"])
def test_record_unknown_type(record_type: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if record_type is _ABSENT:
        del fact["record"]["type"]
    else:
        fact["record"]["type"] = record_type
    fails(kit, fact, FACT)


# --- runStarted


def test_run_started_closed() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user()
        fact = kit.run_started()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("kind", [_ABSENT, "compaction", "Run", None])
def test_run_started_wrong_operation_kind(kind: Any) -> None:
    kit = SessionKit()
    kit.user()
    fact = kit.run_started()
    if kind is _ABSENT:
        del fact["record"]["operationKind"]
    else:
        fact["record"]["operationKind"] = kind
    fails(kit, fact, TRANS)


def test_run_started_while_a_run_is_active() -> None:
    kit = attempting()
    kit.assistant("x")
    with kit.tx():
        kit.user("second")
        fact = kit.run_started()
    fails(kit, fact, TRANS)


def test_run_started_while_a_compaction_is_active() -> None:
    kit = compacting()
    user = kit.user("hi")
    fact = kit.run_started(user["id"])
    fails(kit, fact, TRANS)


def test_run_started_closed_wins_over_active_operation() -> None:
    kit = attempting()
    user = kit.user("second")
    fact = kit.run_started(user["id"])
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


def test_run_started_active_operation_wins_over_operation_id() -> None:
    kit = attempting()
    user = kit.user("second")
    fact = kit.run_started(user["id"])
    fact["record"]["operationId"] = "x"
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("op_id", [_ABSENT, "x", None, UPPER_ID])
def test_run_started_invalid_operation_id(op_id: Any) -> None:
    kit = SessionKit()
    kit.user()
    fact = kit.run_started()
    if op_id is _ABSENT:
        del fact["record"]["operationId"]
    else:
        fact["record"]["operationId"] = op_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("source", ["user", "old-op", "old-step", "old-attempt", "consumed"])
def test_run_started_operation_id_already_used(source: str) -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    user = kit.user("again")
    fact = kit.run_started(user["id"])
    fact["record"]["operationId"] = {
        "user": user["id"],
        "old-op": facts["run"]["record"]["operationId"],
        "old-step": facts["attempt1"]["record"]["stepId"],
        "old-attempt": facts["attempt2"]["record"]["attemptId"],
        "consumed": facts["result"]["id"],
    }[source]
    fails(kit, fact, DUP)


def test_run_started_operation_id_is_an_unconsumed_compaction_result_id() -> None:
    kit, started = aborted_compaction()
    kit.user()
    fact = kit.run_started()
    fact["record"]["operationId"] = started["record"]["resultEntryId"]
    fails(kit, fact, DUP)


@pytest.mark.parametrize("input_id", [_ABSENT, "x", None])
def test_run_started_invalid_input_entry_id(input_id: Any) -> None:
    kit = SessionKit()
    kit.user()
    fact = kit.run_started()
    if input_id is _ABSENT:
        del fact["record"]["inputEntryId"]
    else:
        fact["record"]["inputEntryId"] = input_id
    fails(kit, fact, FACT)


def test_run_started_duplicate_operation_id_wins_over_invalid_input() -> None:
    kit = SessionKit()
    user = kit.user()
    fact = kit.run_started()
    fact["record"].update(operationId=user["id"], inputEntryId="x")
    fails(kit, fact, DUP)


@pytest.mark.parametrize("target", ["unused", "assistant", "tool", "compaction", "record", "self"])
def test_run_started_input_not_a_user_entry(target: str) -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    comp = kit.compact()
    fact = kit.run_started()
    fact["record"]["inputEntryId"] = {
        "unused": UNUSED_ID,
        "assistant": facts["assistant"]["id"],
        "tool": facts["result"]["id"],
        "compaction": comp["entry"]["id"],
        "record": facts["run"]["id"],
        "self": fact["id"],
    }[target]
    fails(kit, fact, REF)


def test_run_started_with_a_user_entry_of_a_later_fact() -> None:
    kit = SessionKit()
    with kit.tx():
        fact = kit.run_started(make_id(50))
        kit.entry(
            {"type": "message", "message": {"role": "user", "content": "x"}}, fact_id=make_id(50)
        )
    fails(kit, fact, REF)


def test_run_started_with_an_older_user_entry() -> None:
    kit = SessionKit()
    facts = kit.simple_run("first")
    kit.run_started(facts["user"]["id"])  # reuse an earlier prompt
    kit.step_attempt()
    kit.assistant("again")
    kit.finish()
    state = expect_ok(kit)
    assert [m["content"] for m in state.transcript] == ["first", "done", "again"]


# --- compactionStarted


def test_compaction_started_closed() -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("kind", [_ABSENT, "run", None])
def test_compaction_started_wrong_operation_kind(kind: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    if kind is _ABSENT:
        del fact["record"]["operationKind"]
    else:
        fact["record"]["operationKind"] = kind
    fails(kit, fact, TRANS)


def test_compaction_started_while_a_run_is_active() -> None:
    kit = attempting()
    kit.assistant("x")
    fact = kit.compaction_started()
    fails(kit, fact, TRANS)


def test_compaction_started_while_a_compaction_is_active() -> None:
    kit = compacting()
    fact = kit.compaction_started()
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("op_id", ["x", _ABSENT])
def test_compaction_started_invalid_operation_id(op_id: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    if op_id is _ABSENT:
        del fact["record"]["operationId"]
    else:
        fact["record"]["operationId"] = op_id
    fails(kit, fact, FACT)


def test_compaction_started_operation_id_already_used() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    fact["record"]["operationId"] = facts["run"]["record"]["operationId"]
    fails(kit, fact, DUP)


@pytest.mark.parametrize("through", ["x", None, _ABSENT])
def test_compaction_started_invalid_input_through(through: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    if through is _ABSENT:
        del fact["record"]["inputThroughEntryId"]
    else:
        fact["record"]["inputThroughEntryId"] = through
    fails(kit, fact, FACT)


def test_compaction_started_operation_id_checked_before_input_through() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    fact["record"].update(
        operationId=facts["user"]["id"], inputThroughEntryId="x", resultEntryId="x"
    )
    fails(kit, fact, DUP)


@pytest.mark.parametrize("result_id", ["x", None, _ABSENT])
def test_compaction_started_invalid_result_entry_id(result_id: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    if result_id is _ABSENT:
        del fact["record"]["resultEntryId"]
    else:
        fact["record"]["resultEntryId"] = result_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("source", ["operation", "fact", "user"])
def test_compaction_started_result_entry_id_already_used(source: str) -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    rec = fact["record"]
    rec["resultEntryId"] = {
        "operation": rec["operationId"],
        "fact": facts["finish"]["id"],
        "user": facts["user"]["id"],
    }[source]
    fails(kit, fact, DUP)


def test_compaction_started_duplicate_result_wins_over_unknown_input() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    fact["record"].update(resultEntryId=facts["user"]["id"], inputThroughEntryId=UNUSED_ID)
    fails(kit, fact, DUP)


@pytest.mark.parametrize("target", ["unused", "record"])
def test_compaction_started_input_through_not_an_entry(target: str) -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    fact["record"]["inputThroughEntryId"] = {
        "unused": UNUSED_ID,
        "record": facts["finish"]["id"],
    }[target]
    fails(kit, fact, REF)


def test_compaction_started_unknown_input_wins_over_malformed_digest() -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    fact["record"].update(inputThroughEntryId=UNUSED_ID, sourceDigest="x")
    fails(kit, fact, REF)


@pytest.mark.parametrize(
    "digest",
    [
        _ABSENT,
        None,
        "x",
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "SHA256:" + "0" * 64,
        "sha512:" + "0" * 64,
        "0" * 64,
    ],
)
def test_compaction_started_malformed_source_digest(digest: Any) -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    if digest is _ABSENT:
        del fact["record"]["sourceDigest"]
    else:
        fact["record"]["sourceDigest"] = digest
    fails(kit, fact, FACT)


def test_compaction_started_wrong_source_digest() -> None:
    kit = SessionKit()
    kit.simple_run()
    fact = kit.compaction_started()
    fact["record"]["sourceDigest"] = ZERO_DIGEST
    fails(kit, fact, REF)


def test_compaction_started_source_digest_of_a_different_prefix() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    fact = kit.compaction_started()
    fact["record"]["sourceDigest"] = kit.source_digest(facts["user"]["id"])
    fails(kit, fact, REF)


def test_compaction_started_source_digest_covers_earlier_compactions() -> None:
    kit = SessionKit()
    kit.tool_run()
    kit.compact(keep=1)
    kit.simple_run("second", "answer")
    good = kit.fork()
    good.compaction_started(keep=2)
    expect_ok(good)
    # A digest over the messages since the last compaction only is wrong.
    fact = kit.compaction_started(keep=2)
    from tether.core.canonical import source_digest

    fact["record"]["sourceDigest"] = source_digest(kit.messages[-2:])
    fails(kit, fact, REF)


def test_compaction_started_through_an_earlier_message() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.compaction_started(through=facts["user"]["id"])
    state = expect_ok(kit)
    assert state.operation.input_through_entry_id == facts["user"]["id"]  # type: ignore[union-attr]


def test_compaction_started_through_a_compaction_entry() -> None:
    # The digest stops before a compaction entry named as inputThroughEntryId.
    kit = SessionKit()
    kit.simple_run()
    comp = kit.compact()
    kit.compaction_started(through=comp["entry"]["id"])
    expect_ok(kit)


# --- stepAttempt


def test_step_attempt_closed() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op_id", [_ABSENT, "x", None])
def test_step_attempt_invalid_operation_id(op_id: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if op_id is _ABSENT:
        del fact["record"]["operationId"]
    else:
        fact["record"]["operationId"] = op_id
    fails(kit, fact, FACT)


def test_step_attempt_unknown_operation() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["operationId"] = kit.last_user_id
    fails(kit, fact, REF)


def test_step_attempt_finished_operation() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.user("again")
    fact = kit.record(
        dict(
            facts["attempt"]["record"],
            stepId=make_id(90),
            attemptId=make_id(91),
            contextThroughEntryId=kit.boundary,
        )
    )
    fails(kit, fact, TRANS)


def test_step_attempt_unknown_operation_wins_over_attempt_number() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"].update(operationId=UNUSED_ID, attempt=0)
    fails(kit, fact, REF)


@pytest.mark.parametrize("number", [_ABSENT, 0, -1, 1.5, "1", True, None])
def test_step_attempt_invalid_attempt_number(number: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if number is _ABSENT:
        del fact["record"]["attempt"]
    else:
        fact["record"]["attempt"] = number
    fails(kit, fact, FACT)


@pytest.mark.parametrize("step_id", [_ABSENT, "x", None])
def test_step_attempt_invalid_step_id(step_id: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if step_id is _ABSENT:
        del fact["record"]["stepId"]
    else:
        fact["record"]["stepId"] = step_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("number", [2, 3])
def test_step_attempt_later_attempt_invalid_step_id(number: int) -> None:
    kit = attempting()
    fact = kit.retry()
    fact["record"].update(attempt=number, stepId="x")
    fails(kit, fact, FACT)


def test_step_attempt_step_id_already_used() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["stepId"] = kit.op["id"]  # type: ignore[index]
    fails(kit, fact, DUP)


def test_step_attempt_attempt_one_reuses_a_step_id() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    old_step = kit.step["stepId"]  # type: ignore[index]
    fact = kit.step_attempt()
    fact["record"]["stepId"] = old_step
    fails(kit, fact, DUP)


@pytest.mark.parametrize("attempt_id", [_ABSENT, "x", None])
def test_step_attempt_invalid_attempt_id(attempt_id: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if attempt_id is _ABSENT:
        del fact["record"]["attemptId"]
    else:
        fact["record"]["attemptId"] = attempt_id
    fails(kit, fact, FACT)


def test_step_attempt_attempt_id_equals_step_id() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["attemptId"] = fact["record"]["stepId"]
    fails(kit, fact, DUP)


def test_step_attempt_retry_reuses_the_attempt_id() -> None:
    kit = attempting()
    first = kit.step["attemptId"]  # type: ignore[index]
    fact = kit.retry()
    fact["record"]["attemptId"] = first
    fails(kit, fact, DUP)


def test_step_attempt_three_is_invalid_fact() -> None:
    kit = attempting()
    kit.retry()
    fact = kit.retry()
    fact["record"]["attempt"] = 3
    fails(kit, fact, FACT)


def test_step_attempt_three_right_after_attempt_one() -> None:
    kit = attempting()
    fact = kit.retry()
    fact["record"]["attempt"] = 3
    fails(kit, fact, FACT)


def test_step_attempt_duplicate_attempt_id_wins_over_attempt_three() -> None:
    kit = attempting()
    fact = kit.retry()
    fact["record"].update(attempt=3, attemptId=kit.op["id"])  # type: ignore[index]
    fails(kit, fact, DUP)


@pytest.mark.parametrize("kind", [_ABSENT, "model", None, "Assistant"])
def test_step_attempt_invalid_step_kind(kind: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if kind is _ABSENT:
        del fact["record"]["stepKind"]
    else:
        fact["record"]["stepKind"] = kind
    fails(kit, fact, FACT)


def test_step_attempt_compaction_step_in_a_run() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["stepKind"] = "compaction"
    fails(kit, fact, TRANS)


def test_step_attempt_assistant_step_in_a_compaction() -> None:
    kit = compacting()
    fact = kit.step_attempt()
    fact["record"]["stepKind"] = "assistant"
    fails(kit, fact, TRANS)


def test_step_attempt_invalid_kind_wins_over_kind_mismatch() -> None:
    kit = compacting()
    fact = kit.step_attempt()
    fact["record"].update(stepKind="assistant", attempt=3)
    fails(kit, fact, FACT)


@pytest.mark.parametrize("context", [_ABSENT, "x", None])
def test_step_attempt_invalid_context(context: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if context is _ABSENT:
        del fact["record"]["contextThroughEntryId"]
    else:
        fact["record"]["contextThroughEntryId"] = context
    fails(kit, fact, FACT)


def test_step_attempt_kind_mismatch_wins_over_invalid_context() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"].update(stepKind="compaction", contextThroughEntryId="x")
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("target", ["unused", "operation", "self"])
def test_step_attempt_context_not_an_entry(target: str) -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["contextThroughEntryId"] = {
        "unused": UNUSED_ID,
        "operation": kit.op["id"],  # type: ignore[index]
        "self": fact["record"]["stepId"],
    }[target]
    fails(kit, fact, REF)


def test_step_attempt_context_not_the_boundary() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.start_run("second")
    fact = kit.step_attempt()
    fact["record"]["contextThroughEntryId"] = facts["assistant"]["id"]
    fails(kit, fact, TRANS)


def test_step_attempt_context_after_tool_result_must_be_the_result() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    fact = kit.step_attempt()
    fact["record"]["contextThroughEntryId"] = kit.assistant_info["id"]  # type: ignore[index]
    fails(kit, fact, TRANS)


def test_step_attempt_boundary_after_a_later_user_message() -> None:
    kit = running()
    later = kit.user("more")
    fact = kit.step_attempt()
    assert fact["record"]["contextThroughEntryId"] == later["id"]
    expect_ok(kit)
    fact["record"]["contextThroughEntryId"] = kit.op["input"]  # type: ignore[index]
    fails(kit, fact, TRANS)


def test_step_attempt_context_the_compaction_entry_is_not_the_boundary() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    comp = kit.compact()
    kit.run_started(facts["user"]["id"])
    fact = kit.step_attempt()
    assert fact["record"]["contextThroughEntryId"] == facts["assistant"]["id"]
    expect_ok(kit)
    fact["record"]["contextThroughEntryId"] = comp["entry"]["id"]
    fails(kit, fact, TRANS)


def test_step_attempt_boundary_mismatch_wins_over_bad_snapshot() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.start_run()
    fact = kit.step_attempt()
    fact["record"]["contextThroughEntryId"] = facts["user"]["id"]
    fact["record"]["configurationSnapshot"] = {}
    fails(kit, fact, TRANS)


def _snapshot_variants() -> list[Callable[[dict], Any]]:
    def drop(name: str) -> Callable[[dict], Any]:
        return lambda s: s.pop(name)

    def tool(**changes: Any) -> Callable[[dict], Any]:
        return lambda s: s["tools"][0].update(changes)

    return [
        lambda s: s.clear(),
        lambda s: s.update(extra="x"),
        drop("model"),
        drop("systemPromptDigest"),
        drop("tools"),
        drop("adapterIdentity"),
        drop("routingIdentity"),
        drop("outputOptionsDigest"),
        lambda s: s.update(model=""),
        lambda s: s.update(model=None),
        lambda s: s.update(adapterIdentity=""),
        lambda s: s.update(routingIdentity=1),
        lambda s: s.update(systemPromptDigest="sha256:abc"),
        lambda s: s.update(outputOptionsDigest="sha256:" + "F" * 64),
        lambda s: s.update(tools={}),
        lambda s: s.update(tools=None),
        lambda s: s.update(tools=["read"]),
        lambda s: s["tools"].append(dict(s["tools"][0])),  # duplicate tool name
        tool(name=""),
        tool(name=None),
        tool(definitionDigest="x"),
        tool(extra=1),
        lambda s: s["tools"][0].pop("definitionDigest"),
        lambda s: s["tools"][0].pop("name"),
    ]


@pytest.mark.parametrize("mutate", _snapshot_variants())
def test_step_attempt_invalid_snapshot(mutate: Callable[[dict], Any]) -> None:
    kit = running()
    fact = kit.step_attempt()
    snapshot = fact["record"]["configurationSnapshot"]
    mutate(snapshot)
    try:
        fact["record"]["configurationDigest"] = configuration_digest(snapshot)
    except Exception:  # not canonicalizable: keep the old digest
        pass
    fails(kit, fact, FACT)


@pytest.mark.parametrize("snapshot", [None, [], "x", _ABSENT])
def test_step_attempt_snapshot_not_an_object(snapshot: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if snapshot is _ABSENT:
        del fact["record"]["configurationSnapshot"]
    else:
        fact["record"]["configurationSnapshot"] = snapshot
    fails(kit, fact, FACT)


def test_step_attempt_empty_tools_is_fine() -> None:
    kit = running(tools=())
    kit.step_attempt()
    expect_ok(kit)


@pytest.mark.parametrize(
    "digest", [_ABSENT, None, "x", ZERO_DIGEST, "sha256:" + "0" * 63, "sha256:" + "8" * 64]
)
def test_step_attempt_wrong_digest(digest: Any) -> None:
    kit = running()
    fact = kit.step_attempt()
    if digest is _ABSENT:
        del fact["record"]["configurationDigest"]
    else:
        fact["record"]["configurationDigest"] = digest
    fails(kit, fact, FACT)


def test_step_attempt_upper_case_digest_is_invalid() -> None:
    kit = running()
    fact = kit.step_attempt()
    digest = fact["record"]["configurationDigest"]
    fact["record"]["configurationDigest"] = "sha256:" + digest[7:].upper()
    fails(kit, fact, FACT)


def test_step_attempt_digest_of_another_snapshot() -> None:
    kit = running()
    fact = kit.step_attempt()
    fact["record"]["configurationDigest"] = configuration_digest(kit.snapshot(["read"]))
    fails(kit, fact, FACT)


def test_step_attempt_digest_depends_on_tool_order() -> None:
    kit = running(tools=("read", "write"))
    fact = kit.step_attempt()
    fact["record"]["configurationSnapshot"]["tools"].reverse()
    fails(kit, fact, FACT)


def test_step_attempt_snapshot_seen_before_with_another_digest_claim() -> None:
    # A cache of known snapshots must not let a wrong digest through.
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    fact = kit.step_attempt()
    fact["record"]["configurationDigest"] = configuration_digest(kit.snapshot(["read"]))
    fails(kit, fact, FACT)


def test_step_attempt_same_digest_different_snapshot() -> None:
    # The digest of the first attempt claimed for a different snapshot.
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    fact = kit.step_attempt(tools=["read"])
    fact["record"]["configurationDigest"] = configuration_digest(kit.snapshot())
    fails(kit, fact, FACT)


def test_step_attempt_digest_mismatch_wins_over_overlap() -> None:
    kit = attempting()
    fact = kit.step_attempt()
    fact["record"]["configurationDigest"] = ZERO_DIGEST
    fails(kit, fact, FACT)


def test_step_attempt_overlapping_step() -> None:
    kit = attempting()
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_after_stop() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("calls", [(), ("read",)])
def test_step_attempt_after_length(calls: tuple[str, ...]) -> None:
    kit = attempting()
    kit.assistant("partial", list(calls), stop_reason="length")
    for index in range(len(calls)):
        kit.synthetic(index, "truncated")
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_after_failed_step() -> None:
    kit = attempting()
    kit.step_failed()
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_with_pending_tool() -> None:
    kit = pending()
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_with_one_of_two_tools_pending() -> None:
    kit = tool_use(("read", "write"))
    kit.tool_result(kit.tool_started(0))
    kit.tool_started(1)
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_second_compaction_step() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.compaction()
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_after_failed_compaction_step() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.step_failed()
    fact = kit.step_attempt()
    fails(kit, fact, TRANS)


def test_step_attempt_with_unanswered_unstarted_call_is_accepted() -> None:
    # 8.3: only *pending started* tools block a new step (the transcript rule will
    # reject the answer, see test_assistant_message_while_calls_are_open).
    kit = tool_use(("read", "nope"))
    kit.tool_result(kit.tool_started(0))
    kit.step_attempt()
    expect_ok(kit)


def test_step_attempt_retry_after_settle() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.retry()
    fails(kit, fact, TRANS)


def test_step_attempt_retry_after_fail() -> None:
    kit = attempting()
    kit.step_failed()
    fact = kit.retry()
    fails(kit, fact, TRANS)


def test_step_attempt_retry_twice() -> None:
    kit = attempting()
    first = dict(kit.step)  # type: ignore[arg-type]
    kit.retry()
    fact = kit.retry()
    assert fact["record"]["stepId"] == first["stepId"]
    fails(kit, fact, TRANS)


def test_step_attempt_retry_with_different_digest() -> None:
    kit = attempting()
    fact = kit.step_attempt(2, tools=["read"])
    fails(kit, fact, TRANS)


def test_step_attempt_retry_with_different_context() -> None:
    kit = running()
    kit.user("more")
    kit.step_attempt()
    fact = kit.retry()
    fact["record"]["contextThroughEntryId"] = kit.op["input"]  # type: ignore[index]
    fails(kit, fact, TRANS)


def test_step_attempt_retry_unknown_step() -> None:
    kit = attempting()
    fact = kit.retry()
    fact["record"]["stepId"] = UNUSED_ID
    fails(kit, fact, TRANS)


def test_step_attempt_retry_step_id_names_something_else() -> None:
    kit = attempting()
    fact = kit.retry()
    fact["record"]["stepId"] = kit.step["attemptId"]  # type: ignore[index]
    fails(kit, fact, TRANS)


def test_step_attempt_retry_without_any_step() -> None:
    kit = running()
    fact = kit.step_attempt(2, step_id=make_id(77))
    fails(kit, fact, TRANS)


def test_step_attempt_retry_of_another_operations_step() -> None:
    kit = attempting()
    stale = dict(kit.step)  # type: ignore[arg-type]
    kit.finish("failed")
    kit.start_run("again")
    kit.step_attempt()
    fact = kit.retry()
    fact["record"].update(stepId=stale["stepId"], contextThroughEntryId=stale["context"])
    fails(kit, fact, TRANS)


def test_step_attempt_retry_in_a_compaction() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.retry()
    expect_ok(kit)


def test_step_attempt_retry_of_a_settled_previous_step() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    old = dict(kit.step)  # type: ignore[arg-type]
    kit.step_attempt()
    fact = kit.retry()
    fact["record"].update(stepId=old["stepId"], contextThroughEntryId=old["context"])
    fails(kit, fact, TRANS)


# --- stepFailed


def test_step_failed_closed() -> None:
    kit = attempting()
    fact = kit.step_failed()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op", ["x", "unknown", "finished"], ids=["invalid", "unknown", "finished"])
def test_step_failed_op_lookup(op: str) -> None:
    kit = attempting()
    if op == "finished":
        kit.finish("failed")
        kit.op = kit.last_op
    fact = kit.step_failed()
    if op == "x":
        fact["record"]["operationId"] = "x"
    elif op == "unknown":
        fact["record"]["operationId"] = UNUSED_ID
    fails(kit, fact, {"x": FACT, "unknown": REF, "finished": TRANS}[op])


@pytest.mark.parametrize("attempt_id", [_ABSENT, "x", None])
def test_step_failed_invalid_attempt_id(attempt_id: Any) -> None:
    kit = attempting()
    fact = kit.step_failed()
    if attempt_id is _ABSENT:
        del fact["record"]["attemptId"]
    else:
        fact["record"]["attemptId"] = attempt_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "error",
    [
        _ABSENT,
        None,
        "boom",
        {},
        {"code": "x"},
        {"message": "x"},
        {"code": "", "message": "x"},
        {"code": "x", "message": ""},
        {"code": 1, "message": "x"},
        {"code": "x", "message": "y", "detail": "z"},
    ],
)
def test_step_failed_invalid_error(error: Any) -> None:
    kit = attempting()
    fact = kit.step_failed()
    if error is _ABSENT:
        del fact["record"]["error"]
    else:
        fact["record"]["error"] = error
    fails(kit, fact, FACT)


def test_step_failed_invalid_error_wins_over_unknown_attempt() -> None:
    kit = attempting()
    fact = kit.step_failed()
    fact["record"].update(attemptId=UNUSED_ID, error={})
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda kit, r: r.update(attemptId=UNUSED_ID),
        lambda kit, r: r.update(attemptId=kit.step["stepId"]),
        lambda kit, r: r.update(stepId=kit.op["id"]),
        lambda kit, r: r.update(stepId="not an id"),
        lambda kit, r: r.pop("stepId"),
    ],
    ids=["unknown", "step-as-attempt", "wrong-step", "bad-step", "no-step"],
)
def test_step_failed_reference(mutate: Callable[[SessionKit, dict], Any]) -> None:
    kit = attempting()
    fact = kit.step_failed()
    mutate(kit, fact["record"])
    fails(kit, fact, REF)


def test_step_failed_settled_attempt() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.step_failed()
    fails(kit, fact, REF)


def test_step_failed_twice() -> None:
    kit = attempting()
    kit.step_failed()
    fact = kit.step_failed()
    fails(kit, fact, REF)


def test_step_failed_superseded_attempt() -> None:
    kit = attempting()
    first = dict(kit.step)  # type: ignore[arg-type]
    kit.retry()
    fact = kit.step_failed()
    fact["record"]["attemptId"] = first["attemptId"]
    fails(kit, fact, REF)


def test_step_failed_attempt_of_another_operation() -> None:
    kit = attempting()
    stale = dict(kit.step)  # type: ignore[arg-type]
    kit.finish("failed")
    kit.start_run("again")
    kit.step_attempt()
    fact = kit.step_failed()
    fact["record"].update(stepId=stale["stepId"], attemptId=stale["attemptId"])
    fails(kit, fact, REF)


# --- toolStarted


def test_tool_started_closed() -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op", ["x", "unknown"])
def test_tool_started_op_lookup(op: str) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"]["operationId"] = "x" if op == "x" else UNUSED_ID
    fails(kit, fact, FACT if op == "x" else REF)


def test_tool_started_finished_run() -> None:
    kit = tool_use()
    kit.finish("failed")
    kit.op = kit.last_op
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_in_a_compaction() -> None:
    kit = tool_use()
    info = kit.assistant_info
    kit.finish("failed")
    kit.compaction_started(keep=1)
    kit.assistant_info = info
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_compaction_wins_over_invalid_assistant_id() -> None:
    kit = tool_use()
    info = kit.assistant_info
    kit.finish("failed")
    kit.compaction_started(keep=1)
    kit.assistant_info = info
    fact = kit.tool_started(0)
    fact["record"]["assistantEntryId"] = "x"
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("assistant_id", [_ABSENT, "x", None])
def test_tool_started_invalid_assistant_entry_id(assistant_id: Any) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    if assistant_id is _ABSENT:
        del fact["record"]["assistantEntryId"]
    else:
        fact["record"]["assistantEntryId"] = assistant_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("target", ["unused", "user", "operation"])
def test_tool_started_assistant_entry_not_a_message(target: str) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"]["assistantEntryId"] = {
        "unused": UNUSED_ID,
        "user": kit.last_user_id,
        "operation": kit.op["id"],  # type: ignore[index]
    }[target]
    fails(kit, fact, REF)


def test_tool_started_for_a_length_answer() -> None:
    kit = attempting()
    kit.assistant(None, ["read"], stop_reason="length")
    fact = kit.tool_started(0)
    fails(kit, fact, REF)


def test_tool_started_for_a_stop_answer() -> None:
    kit = attempting()
    kit.assistant("done")
    kit.assistant_info["calls"] = [kit.call("read")]  # type: ignore[index]
    fact = kit.tool_started(0)
    fails(kit, fact, REF)


def test_tool_started_for_a_tool_result_entry() -> None:
    kit = tool_use()
    result = kit.tool_result(kit.tool_started(0))
    fact = kit.tool_started(0)
    fact["record"]["assistantEntryId"] = result["id"]
    fails(kit, fact, REF)


def test_tool_started_for_another_runs_assistant_entry() -> None:
    kit = tool_use(("nope",))
    old = kit.assistant_info
    kit.synthetic(0, "unknownTool")
    kit.finish("failed")
    kit.start_run("again")
    kit.step_attempt()
    kit.assistant(None, ["read"])
    kit.assistant_info = old
    fact = kit.tool_started(0)
    fails(kit, fact, REF)


def test_tool_started_reference_wins_over_invalid_index() -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"].update(assistantEntryId=UNUSED_ID, toolIndex=-1)
    fails(kit, fact, REF)


@pytest.mark.parametrize(
    "changes",
    [
        {"toolIndex": -1},
        {"toolIndex": "0"},
        {"toolIndex": None},
        {"toolIndex": True},
        {"toolCallId": ""},
        {"toolCallId": None},
        {"toolCallId": 1},
        {"toolName": ""},
        {"toolName": None},
    ],
)
def test_tool_started_invalid_index_call_or_name(changes: dict) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"].update(changes)
    fails(kit, fact, FACT)


@pytest.mark.parametrize("member", ["toolIndex", "toolCallId", "toolName"])
def test_tool_started_missing_index_call_or_name(member: str) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    del fact["record"][member]
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda kit, r: r.update(toolIndex=1),
        lambda kit, r: r.update(toolIndex=MAX_SAFE),
        lambda kit, r: r.update(toolCallId="call_other"),
        lambda kit, r: r.update(toolName="write"),
        lambda kit, r: r.update(stepId=kit.op["id"]),
        lambda kit, r: r.update(stepId="x"),
        lambda kit, r: r.pop("stepId"),
    ],
    ids=["index", "huge-index", "call-id", "name", "step", "bad-step", "no-step"],
)
def test_tool_started_call_mismatch(mutate: Callable[[SessionKit, dict], Any]) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    mutate(kit, fact["record"])
    fails(kit, fact, REF)


def test_tool_started_call_mismatch_wins_over_bad_arguments() -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"].update(toolName="write", arguments="{}")
    fails(kit, fact, REF)


def test_tool_started_twice() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_twice_while_pending() -> None:
    kit = pending()
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_after_pre_execution_result() -> None:
    kit = tool_use()
    kit.synthetic(0, "invalidArguments")
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_pair_used_wins_over_bad_arguments() -> None:
    kit = pending()
    fact = kit.tool_started(0)
    fact["record"]["arguments"] = []
    fails(kit, fact, TRANS)


@pytest.mark.parametrize(
    "changes",
    [
        {"arguments": "{}"},
        {"arguments": []},
        {"arguments": None},
        {"arguments": 1},
        {"replay": "always"},
        {"replay": None},
        {"replay": "Safe"},
        {"replayKey": ""},
        {"replayKey": None},
    ],
)
def test_tool_started_invalid_arguments_replay_or_key(changes: dict) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"].update(changes)
    fails(kit, fact, FACT)


@pytest.mark.parametrize("member", ["arguments", "replay", "replayKey"])
def test_tool_started_missing_arguments_replay_or_key(member: str) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    del fact["record"][member]
    fails(kit, fact, FACT)


def test_tool_started_tool_not_in_producing_snapshot() -> None:
    kit = running(tools=("read",))
    kit.step_attempt()
    kit.assistant(None, ["write"])
    fact = kit.tool_started(0)
    fails(kit, fact, TRANS)


def test_tool_started_snapshot_of_producing_attempt_not_latest() -> None:
    # The producing attempt's snapshot counts, even though a later step uses another.
    kit = running(tools=("read",))
    kit.step_attempt()
    kit.assistant(None, ["read", "write"])
    kit.tool_result(kit.tool_started(0))
    producer = kit.assistant_info
    kit.step_attempt(tools=("read", "write"))
    kit.assistant_info = producer
    fact = kit.tool_started(1)
    fails(kit, fact, TRANS)


def test_tool_started_not_in_snapshot_wins_over_duplicate_result_id() -> None:
    kit = running(tools=("read",))
    kit.step_attempt()
    kit.assistant(None, ["write"])
    fact = kit.tool_started(0)
    fact["record"]["resultEntryId"] = kit.op["id"]  # type: ignore[index]
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("result_id", [_ABSENT, "x", None])
def test_tool_started_invalid_result_entry_id(result_id: Any) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    if result_id is _ABSENT:
        del fact["record"]["resultEntryId"]
    else:
        fact["record"]["resultEntryId"] = result_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("source", ["operation", "assistant", "attempt", "other-result"])
def test_tool_started_result_entry_id_already_used(source: str) -> None:
    kit = tool_use(("read", "write"))
    first = kit.tool_started(0)
    fact = kit.tool_started(1)
    fact["record"]["resultEntryId"] = {
        "operation": kit.op["id"],  # type: ignore[index]
        "assistant": kit.assistant_info["id"],  # type: ignore[index]
        "attempt": kit.step["attemptId"],  # type: ignore[index]
        "other-result": first["record"]["resultEntryId"],
    }[source]
    fails(kit, fact, DUP)


def test_tool_started_duplicate_result_wins_over_bad_environment() -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    fact["record"].update(resultEntryId=kit.op["id"], environmentIdentity="")  # type: ignore[index]
    fails(kit, fact, DUP)


@pytest.mark.parametrize("environment", [_ABSENT, "", None, 1])
def test_tool_started_invalid_environment(environment: Any) -> None:
    kit = tool_use()
    fact = kit.tool_started(0)
    if environment is _ABSENT:
        del fact["record"]["environmentIdentity"]
    else:
        fact["record"]["environmentIdentity"] = environment
    fails(kit, fact, FACT)


def test_tool_started_after_abort_is_accepted() -> None:
    kit = tool_use()
    kit.abort("tool", kit.assistant_info["calls"][0]["id"])  # type: ignore[index]
    kit.tool_started(0, environment="elsewhere")
    state = expect_ok(kit)
    op = state.operation
    assert isinstance(op, RunOperation)
    assert op.abort_requested and op.tool_calls[0].environment_identity == "elsewhere"


# --- abortRequested


def test_abort_closed() -> None:
    kit = attempting()
    fact = kit.abort()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op", ["x", "unknown"])
def test_abort_op_lookup(op: str) -> None:
    kit = attempting()
    fact = kit.abort()
    fact["record"]["operationId"] = "x" if op == "x" else UNUSED_ID
    fails(kit, fact, FACT if op == "x" else REF)


def test_abort_after_finish() -> None:
    kit = SessionKit()
    kit.simple_run()
    kit.op = kit.last_op
    fact = kit.abort()
    fails(kit, fact, TRANS)


@pytest.mark.parametrize(
    "changes",
    [
        {"operationKind": "compaction"},
        {"operationKind": None},
        {"reason": "user"},
        {"reason": None},
    ],
)
def test_abort_kind_or_reason(changes: dict) -> None:
    kit = attempting()
    fact = kit.abort()
    fact["record"].update(changes)
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("member", ["operationKind", "reason"])
def test_abort_missing_kind_or_reason(member: str) -> None:
    kit = attempting()
    fact = kit.abort()
    del fact["record"][member]
    fails(kit, fact, TRANS)


def test_abort_reason_wins_over_phase() -> None:
    kit = attempting()
    fact = kit.abort()
    fact["record"].update(reason="nope", phase="nope")
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("phase", [_ABSENT, "Model", "network", None])
def test_abort_invalid_phase(phase: Any) -> None:
    kit = attempting()
    fact = kit.abort()
    if phase is _ABSENT:
        del fact["record"]["phase"]
    else:
        fact["record"]["phase"] = phase
    fails(kit, fact, FACT)


def test_abort_tool_phase_without_call_id() -> None:
    kit = attempting()
    fact = kit.abort("tool", "call_1")
    del fact["record"]["toolCallId"]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("call_id", [None, 1, ["call_1"]])
def test_abort_tool_phase_with_non_string_call_id(call_id: Any) -> None:
    kit = attempting()
    fact = kit.abort("tool", "call_1")
    fact["record"]["toolCallId"] = call_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("phase", ["model", "compact"])
@pytest.mark.parametrize("call_id", ["call_1", ""])
def test_abort_other_phase_with_call_id(phase: str, call_id: Any) -> None:
    # (``toolCallId: null`` with another phase is left out on purpose: 8.6 says the
    # member is present only for phase ``tool``, 13.4 step 5 only tests for a string.)
    kit = attempting()
    fact = kit.abort(phase)
    fact["record"]["toolCallId"] = call_id
    fails(kit, fact, FACT)


def test_abort_twice() -> None:
    kit = attempting()
    kit.abort()
    fact = kit.abort()
    fails(kit, fact, TRANS)


def test_abort_twice_phase_error_wins() -> None:
    kit = attempting()
    kit.abort()
    fact = kit.abort()
    fact["record"]["phase"] = "x"
    fails(kit, fact, FACT)


@pytest.mark.parametrize("phase", ["model", "compact"])
def test_abort_phase_is_not_cross_checked(phase: str) -> None:
    kit = attempting()
    kit.abort(phase)
    state = expect_ok(kit)
    assert state.operation.abort_requested  # type: ignore[union-attr]


def test_abort_tool_phase_call_id_not_cross_checked() -> None:
    kit = attempting()
    kit.abort("tool", "")
    expect_ok(kit)
    kit = compacting()
    kit.abort("tool", "no such call")
    expect_ok(kit)


def test_abort_before_any_step() -> None:
    kit = running()
    kit.abort()
    kit.finish("aborted")
    state = expect_ok(kit)
    assert state.operation.kind == "idle"


# --- operationFinished


def test_finish_closed() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"]["extra"] = 1
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op", ["x", "unknown"])
def test_finish_op_lookup(op: str) -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"]["operationId"] = "x" if op == "x" else UNUSED_ID
    fails(kit, fact, FACT if op == "x" else REF)


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_finish_twice(outcome: str) -> None:
    kit = SessionKit()
    kit.simple_run()
    kit.op = kit.last_op
    fact = kit.finish(outcome)
    fails(kit, fact, TRANS)


@pytest.mark.parametrize(
    "changes",
    [
        {"operationKind": "compaction"},
        {"operationKind": None},
        {"outcome": "cancelled"},
        {"outcome": None},
        {"outcome": "Completed"},
    ],
)
def test_finish_kind_or_outcome(changes: dict) -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"].update(changes)
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("member", ["operationKind", "outcome"])
def test_finish_missing_kind_or_outcome(member: str) -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    del fact["record"][member]
    fails(kit, fact, TRANS)


def test_finish_compaction_kind_mismatch() -> None:
    kit = compacting()
    fact = kit.finish("failed")
    fact["record"]["operationKind"] = "run"
    fails(kit, fact, TRANS)


def test_finish_outcome_wins_over_completion() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"].update(outcome="x", completion="x")
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("completion", [_ABSENT, "partial", None, "Normal"])
def test_finish_run_invalid_completion(completion: Any) -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    if completion is _ABSENT:
        del fact["record"]["completion"]
    else:
        fact["record"]["completion"] = completion
    fails(kit, fact, FACT)


def test_finish_compaction_with_completion() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.compaction()
    fact = kit.finish()
    fact["record"]["completion"] = "normal"
    fails(kit, fact, FACT)


@pytest.mark.parametrize("final", [_ABSENT, "x", None])
def test_finish_completed_invalid_final(final: Any) -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    if final is _ABSENT:
        del fact["record"]["finalEntryId"]
    else:
        fact["record"]["finalEntryId"] = final
    fails(kit, fact, FACT)


def test_finish_completion_checked_before_final() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"].update(completion="x", finalEntryId=UNUSED_ID)
    fails(kit, fact, FACT)


@pytest.mark.parametrize("target", ["unused", "user", "record", "compaction"])
def test_finish_run_final_not_an_assistant_entry(target: str) -> None:
    kit = SessionKit()
    kit.simple_run()
    comp_facts = kit.compact()
    kit.start_run("again")
    kit.step_attempt()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"]["finalEntryId"] = {
        "unused": UNUSED_ID,
        "user": kit.last_user_id,
        "record": kit.last_op["id"],  # type: ignore[index]
        "compaction": comp_facts["entry"]["id"],
    }[target]
    fails(kit, fact, REF)


def test_finish_run_final_of_another_run() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.start_run("again")
    kit.step_attempt()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"]["finalEntryId"] = facts["assistant"]["id"]
    fails(kit, fact, REF)


def test_finish_normal_with_tool_use_entry() -> None:
    kit = tool_use()
    kit.tool_result(kit.tool_started(0))
    fact = kit.finish()
    fails(kit, fact, REF)


def test_finish_normal_with_length_entry() -> None:
    kit = attempting()
    kit.assistant("partial", stop_reason="length")
    fact = kit.finish()
    fails(kit, fact, REF)


def test_finish_truncated_with_stop_entry() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish(completion="truncated")
    fails(kit, fact, REF)


def test_finish_normal_with_a_tool_result_entry() -> None:
    kit = tool_use()
    result = kit.tool_result(kit.tool_started(0))
    fact = kit.finish(final=result["id"])
    fails(kit, fact, REF)


def test_finish_truncated_without_calls() -> None:
    kit = attempting()
    kit.assistant("partial", stop_reason="length")
    fact = kit.finish(completion="truncated")
    fails(kit, fact, SCRIPT)


_BLANK = [
    "",
    " ",
    "\t\n\x0b\x0c\r",
    "\x1c",
    "\x1d\x1e\x1f",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    " \u3000\x1c\t",
    None,
]


@pytest.mark.parametrize("content", _BLANK)
def test_finish_normal_with_blank_content(content: str | None) -> None:
    kit = attempting()
    kit.assistant(content)
    fact = kit.finish()
    fails(kit, fact, SCRIPT)


@pytest.mark.parametrize(
    "content", ["x", " x ", "\ufeff", "\u200b", "\u180e", "\x00", "\x1b", "\u2060", "."]
)
def test_finish_normal_with_non_blank_content(content: str) -> None:
    kit = attempting()
    kit.assistant(content)
    kit.finish()
    expect_ok(kit)


def test_finish_truncated_with_blank_content_and_calls() -> None:
    kit = attempting()
    kit.assistant(None, ["read", "write"], stop_reason="length")
    kit.synthetic(0, "truncated")
    kit.synthetic(1, "truncated")
    kit.finish(completion="truncated")
    expect_ok(kit)


def test_finish_completed_with_a_pending_tool() -> None:
    # A pending tool can only exist at completion when a toolStarted refers back to an
    # older step. [answer, finish, usage]: the finish check fails at the finish's seq
    # (the end-of-transaction check would report the usage's seq).
    kit = tool_use(("read", "write"))
    first = kit.assistant_info
    kit.tool_result(kit.tool_started(0))
    kit.step_attempt()
    kit.assistant_info = first
    kit.tool_started(1)
    with kit.tx():
        kit.assistant("done")
        fact = kit.finish()
        kit.usage()
    fails(kit, fact, SCRIPT)


def test_finish_compaction_final_is_not_the_result() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.compaction()
    fact = kit.finish(final=kit.last_user_id)
    fails(kit, fact, REF)


def test_finish_compaction_before_its_entry() -> None:
    kit = compacting()
    kit.step_attempt()
    fact = kit.finish()
    fails(kit, fact, REF)


def test_finish_compaction_with_another_compactions_entry() -> None:
    kit = SessionKit()
    kit.simple_run()
    first = kit.compact()
    kit.compaction_started()
    kit.step_attempt()
    fact = kit.finish(final=first["entry"]["id"])
    fails(kit, fact, REF)


@pytest.mark.parametrize("outcome", ["aborted", "failed"])
def test_finish_not_completed_with_final_entry(outcome: str) -> None:
    kit = attempting()
    kit.abort()
    kit.assistant("done")
    fact = kit.finish(outcome)
    fact["record"]["finalEntryId"] = kit.assistant_info["id"]  # type: ignore[index]
    fails(kit, fact, FACT)


def test_finish_aborted_with_final_entry_wins_over_missing_abort() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish("aborted")
    fact["record"]["finalEntryId"] = kit.assistant_info["id"]  # type: ignore[index]
    fails(kit, fact, FACT)


def test_finish_aborted_without_abort_request() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish("aborted")
    fails(kit, fact, TRANS)


def test_finish_aborted_with_open_attempt() -> None:
    kit = attempting()
    kit.abort()
    fact = kit.finish("aborted")
    fails(kit, fact, TRANS)


def test_finish_aborted_with_open_attempt_two() -> None:
    kit = attempting()
    kit.retry()
    kit.abort()
    fact = kit.finish("aborted")
    fails(kit, fact, TRANS)


def test_finish_aborted_with_pending_tool() -> None:
    kit = pending()
    kit.abort("tool", kit.started[-1]["record"]["toolCallId"])
    fact = kit.finish("aborted")
    fails(kit, fact, TRANS)


def test_finish_aborted_compaction_with_open_attempt() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.abort()
    fact = kit.finish("aborted")
    fails(kit, fact, TRANS)


def test_finish_aborted_precondition_wins_over_completion_member() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish("aborted")
    fact["record"]["completion"] = "normal"
    fails(kit, fact, TRANS)


@pytest.mark.parametrize("outcome", ["aborted", "failed"])
def test_finish_not_completed_with_completion(outcome: str) -> None:
    kit = attempting()
    kit.abort()
    kit.step_failed(ABORTED_ERROR)
    fact = kit.finish(outcome)
    fact["record"]["completion"] = "normal"
    fails(kit, fact, FACT)


def test_finish_failed_completion_member_wins_over_missing_error() -> None:
    kit = attempting()
    fact = kit.finish("failed")
    fact["record"]["completion"] = "normal"
    del fact["record"]["error"]
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "error",
    [
        _ABSENT,
        None,
        {},
        {"code": "x"},
        {"code": "", "message": "m"},
        {"code": "c", "message": "m", "x": 1},
    ],
)
def test_finish_failed_invalid_error(error: Any) -> None:
    kit = attempting()
    fact = kit.finish("failed")
    if error is _ABSENT:
        del fact["record"]["error"]
    else:
        fact["record"]["error"] = error
    fails(kit, fact, FACT)


def test_finish_aborted_with_error() -> None:
    kit = attempting()
    kit.abort()
    kit.step_failed(ABORTED_ERROR)
    fact = kit.finish("aborted")
    fact["record"]["error"] = ABORTED_ERROR
    fails(kit, fact, FACT)


def test_finish_completed_with_error() -> None:
    kit = attempting()
    kit.assistant("done")
    fact = kit.finish()
    fact["record"]["error"] = dict(ABORTED_ERROR)
    fails(kit, fact, FACT)


def test_finish_completed_compaction_with_error() -> None:
    kit = compacting()
    kit.step_attempt()
    kit.compaction()
    fact = kit.finish()
    fact["record"]["error"] = dict(ABORTED_ERROR)
    fails(kit, fact, FACT)


def test_finish_failed_is_accepted_in_any_state() -> None:
    for build in (running, attempting, tool_use, pending, compacting):
        kit = build()
        kit.finish("failed", error={"code": "c", "message": "m"})
        state = expect_ok(kit)
        assert state.operation.kind == "idle"


def test_finish_aborted_run_and_compaction() -> None:
    kit = attempting()
    kit.abort()
    with kit.tx():
        kit.step_failed(ABORTED_ERROR)
        kit.finish("aborted")
    kit.compaction_started()
    kit.abort()
    kit.finish("aborted")
    state = expect_ok(kit)
    assert state.operation.kind == "idle"


@pytest.mark.parametrize(
    "build",
    [
        lambda kit: kit.abort(),
        lambda kit: kit.step_failed(),
        lambda kit: kit.finish("failed"),
        lambda kit: kit.finish("aborted"),
        lambda kit: kit.step_attempt(),
    ],
    ids=["abort", "stepFailed", "failed", "aborted", "stepAttempt"],
)
def test_records_for_a_finished_operation_fail_op_lookup(
    build: Callable[[SessionKit], dict],
) -> None:
    kit = attempting()
    kit.finish("failed")  # the attempt stays open
    kit.op = kit.last_op
    fact = build(kit)
    fails(kit, fact, TRANS)


# ====================================================================== 13.5 usage


def test_usage_closed() -> None:
    kit = attempting()
    fact = kit.usage()
    fact["entry"] = {}
    fails(kit, fact, FACT)


@pytest.mark.parametrize("op_id", [_ABSENT, "x", None])
def test_usage_invalid_operation_id(op_id: Any) -> None:
    kit = attempting()
    fact = kit.usage()
    if op_id is _ABSENT:
        del fact["operationId"]
    else:
        fact["operationId"] = op_id
    fails(kit, fact, FACT)


@pytest.mark.parametrize("target", ["unused", "user", "step"])
def test_usage_unknown_operation(target: str) -> None:
    kit = attempting()
    fact = kit.usage()
    fact["operationId"] = {
        "unused": UNUSED_ID,
        "user": kit.last_user_id,
        "step": kit.step["stepId"],  # type: ignore[index]
    }[target]
    fails(kit, fact, REF)


def test_usage_unknown_operation_wins_over_owner_count() -> None:
    kit = pending()
    fact = kit.usage()
    fact["operationId"] = UNUSED_ID
    fact["toolStartedId"] = kit.started[-1]["id"]
    fails(kit, fact, REF)


def test_usage_both_owners() -> None:
    kit = pending()
    fact = kit.usage()
    fact["toolStartedId"] = kit.started[-1]["id"]
    fails(kit, fact, FACT)


def test_usage_neither_owner() -> None:
    kit = attempting()
    fact = kit.usage()
    del fact["attemptId"]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("owner", ["attemptId", "toolStartedId"])
@pytest.mark.parametrize("value", ["x", None, 1])
def test_usage_invalid_owner(owner: str, value: Any) -> None:
    kit = pending()
    fact = kit.usage()
    del fact["attemptId"]
    fact[owner] = value
    fails(kit, fact, FACT)


def test_usage_owner_count_wins_over_invalid_usage() -> None:
    kit = pending()
    fact = kit.usage()
    fact["toolStartedId"] = "x"
    fact["usage"] = None
    fails(kit, fact, FACT)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda kit, f: f.update(attemptId=UNUSED_ID),
        lambda kit, f: f.update(attemptId=kit.step["stepId"]),
        lambda kit, f: f.update(attemptId=kit.started[-1]["id"]),
        lambda kit, f: (f.pop("attemptId"), f.update(toolStartedId=UNUSED_ID)),
        lambda kit, f: (f.pop("attemptId"), f.update(toolStartedId=kit.step["attemptId"])),
        lambda kit, f: (
            f.pop("attemptId"),
            f.update(toolStartedId=kit.started[-1]["record"]["resultEntryId"]),
        ),
    ],
    ids=["attempt", "step", "tool-as-attempt", "tool", "attempt-as-tool", "result-as-tool"],
)
def test_usage_unknown_owner(mutate: Callable[[SessionKit, dict], Any]) -> None:
    kit = pending()
    fact = kit.usage()
    mutate(kit, fact)
    fails(kit, fact, REF)


def test_usage_attempt_of_another_operation() -> None:
    kit = SessionKit()
    facts = kit.simple_run()
    kit.start_run("again")
    kit.step_attempt()
    fact = kit.usage(attempt_id=facts["attempt"]["record"]["attemptId"])
    fails(kit, fact, REF)


def test_usage_tool_of_another_operation() -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    kit.start_run("again")
    kit.step_attempt()
    fact = kit.usage(tool_started_id=facts["started"]["id"], operation_id=kit.op["id"])  # type: ignore[index]
    fails(kit, fact, REF)


def test_usage_owner_reference_wins_over_invalid_counters() -> None:
    kit = attempting()
    fact = kit.usage()
    fact["attemptId"] = UNUSED_ID
    fact["usage"] = {}
    fails(kit, fact, REF)


@pytest.mark.parametrize(
    "usage",
    [
        None,
        [],
        {},
        {"input": 1, "output": 1, "cacheRead": 1},
        {"input": 1, "output": 1, "cacheRead": 1, "cacheWrite": 1, "total": 4},
        {"input": -1, "output": 1, "cacheRead": 1, "cacheWrite": 1},
        {"input": 1, "output": 1.5, "cacheRead": 1, "cacheWrite": 1},
        {"input": 1, "output": 1, "cacheRead": "1", "cacheWrite": 1},
        {"input": 1, "output": 1, "cacheRead": 1, "cacheWrite": True},
        {"input": 1, "output": 1, "cacheRead": 1, "cacheWrite": None},
        {"input": MAX_SAFE + 1, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    ],
)
def test_usage_invalid_counters(usage: Any) -> None:
    kit = attempting()
    fact = kit.usage()
    fact["usage"] = usage
    fails(kit, fact, FACT)


def test_usage_missing_usage() -> None:
    kit = attempting()
    fact = kit.usage()
    del fact["usage"]
    fails(kit, fact, FACT)


@pytest.mark.parametrize("counter", ["input", "output", "cache_read", "cache_write"])
def test_usage_overflow(counter: str) -> None:
    kit = attempting()
    kit.usage(**{counter: MAX_SAFE - 5})  # type: ignore[arg-type]
    fact = kit.usage(**{counter: 6})  # type: ignore[arg-type]
    fails(kit, fact, FACT)


def test_usage_reaching_exactly_max_safe() -> None:
    kit = attempting()
    kit.usage(input=MAX_SAFE - 5, output=MAX_SAFE, cache_read=0, cache_write=1)
    kit.usage(input=5, output=0, cache_read=MAX_SAFE, cache_write=MAX_SAFE - 1)
    state = expect_ok(kit)
    assert state.to_json()["usage"] == {
        "input": MAX_SAFE,
        "output": MAX_SAFE,
        "cacheRead": MAX_SAFE,
        "cacheWrite": MAX_SAFE,
    }


def test_usage_overflow_in_one_transaction() -> None:
    kit = attempting()
    with kit.tx():
        kit.usage(input=MAX_SAFE, output=0, cache_read=0, cache_write=0)
        fact = kit.usage(input=1, output=0, cache_read=0, cache_write=0)
    fails(kit, fact, FACT)


def test_usage_overflow_of_a_later_counter_after_valid_ones() -> None:
    kit = attempting()
    kit.usage(input=0, output=0, cache_read=0, cache_write=MAX_SAFE)
    fact = kit.usage(input=1, output=1, cache_read=1, cache_write=1)
    fails(kit, fact, FACT)


def test_usage_after_operation_finished() -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    kit.usage(
        attempt_id=facts["attempt1"]["record"]["attemptId"],
        input=1,
        output=1,
        cache_read=1,
        cache_write=1,
    )
    kit.usage(
        tool_started_id=facts["started"]["id"], input=2, output=0, cache_read=0, cache_write=0
    )
    kit.simple_run("later")
    # Usage for the first run even after a later operation started and finished.
    kit.usage(
        attempt_id=facts["attempt2"]["record"]["attemptId"],
        operation_id=facts["run"]["record"]["operationId"],
    )
    state = expect_ok(kit)
    assert state.to_json()["usage"] == {"input": 13, "output": 3, "cacheRead": 4, "cacheWrite": 1}


def test_usage_for_a_superseded_attempt_and_a_compaction() -> None:
    kit = attempting()
    first = kit.step["attemptId"]  # type: ignore[index]
    kit.retry()
    kit.usage(attempt_id=first)
    kit.assistant("done")
    kit.finish()
    kit.compaction_started()
    kit.step_attempt()
    kit.usage()
    expect_ok(kit)


def test_usage_several_facts_same_owner_all_counted() -> None:
    kit = attempting()
    for _ in range(3):
        kit.usage(input=1, output=2, cache_read=3, cache_write=4)
    assert expect_ok(kit).to_json()["usage"] == {
        "input": 3,
        "output": 6,
        "cacheRead": 9,
        "cacheWrite": 12,
    }


# ====================================================================== 5.1 end-of-transaction


def test_end_of_transaction_transcript_check_reports_the_last_fact() -> None:
    kit = tool_use()
    with kit.tx():
        kit.user("interrupting")  # illegal: the call is still open
        last = kit.usage()
    fails(kit, last, SCRIPT)


def test_end_of_transaction_check_runs_only_after_all_facts() -> None:
    # The illegal user message is followed by a fact that itself fails: that fact wins.
    kit = tool_use()
    with kit.tx():
        kit.user("interrupting")
        bad = kit.usage()
        kit.usage()
    bad["usage"] = None
    fails(kit, bad, FACT)


def test_transcript_legal_again_at_end_of_transaction() -> None:
    # Intermediate order matters: a result before its assistant message is illegal even
    # though the final multiset of messages would be fine.
    kit = attempting()
    with kit.tx():
        kit.assistant(None, ["read", "write"])
        kit.synthetic(1, "unknownTool")
        kit.synthetic(0, "unknownTool")  # results may arrive in any order
        kit.usage()
    expect_ok(kit)


def test_single_fact_as_one_element_array() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user()
    assert kit.lines()[1].startswith(b"[")
    expect_ok(kit)


def test_a_whole_run_in_one_transaction() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user("inspect")
        kit.run_started()
        kit.step_attempt()
        kit.assistant(None, ["read"])
        kit.tool_result(kit.tool_started(0))
        kit.step_attempt()
        kit.assistant("done")
        kit.finish()
        last = kit.usage()
    state = expect_ok(kit)
    assert len(state.transcript) == 4
    # ... and one bad fact anywhere rejects all of it.
    last["usage"]["input"] = -1
    fails(kit, last, FACT)


def test_error_in_array_reports_that_facts_seq() -> None:
    kit = SessionKit()
    with kit.tx():
        kit.user()
        kit.run_started()
        bad = kit.step_attempt()
        kit.usage()
    bad["record"]["attempt"] = 0
    expect_error(kit, FACT, 2, 3)


# ====================================================================== positive scenarios


def test_full_tool_run_state() -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    kit.usage(input=10, output=2, cache_read=3, cache_write=0)
    kit.usage(
        tool_started_id=facts["started"]["id"],
        operation_id=kit.last_op["id"],  # type: ignore[index]
        input=1,
        output=1,
        cache_read=1,
        cache_write=1,
    )
    state = expect_ok(kit)
    call = facts["call"]["entry"]["message"]["tool_calls"][0]
    transcript = [
        {"role": "user", "content": "inspect"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "contents", "tool_call_id": call["id"]},
        {"role": "assistant", "content": "done"},
    ]
    out = state.to_json()
    assert out["transcript"] == transcript
    assert out["activeContext"] == transcript
    assert out["operation"] == {"kind": "idle"}
    assert out["usage"] == {"input": 11, "output": 3, "cacheRead": 4, "cacheWrite": 1}
    assert state.context_boundary == facts["assistant"]["id"]
    assert state.last_seq == kit.seq


def test_mid_run_state_members() -> None:
    kit = SessionKit()
    user, run = kit.start_run("inspect")
    attempt = kit.step_attempt()
    state = expect_ok(kit)
    op = state.to_json()["operation"]
    rec = attempt["record"]
    assert op == {
        "kind": "run",
        "operationId": run["record"]["operationId"],
        "inputEntryId": user["id"],
        "toolCalls": [],
        "abortRequested": False,
        "step": {
            "operationId": run["record"]["operationId"],
            "stepId": rec["stepId"],
            "attemptId": rec["attemptId"],
            "attempt": 1,
            "stepKind": "assistant",
            "status": "attempting",
            "contextThroughEntryId": user["id"],
            "configurationSnapshot": rec["configurationSnapshot"],
            "configurationDigest": rec["configurationDigest"],
        },
    }
    answer = kit.assistant(None, ["read"])
    started = kit.tool_started(0, replay="never", arguments={"path": "x"})
    out = expect_ok(kit).to_json()["operation"]
    assert out["step"]["status"] == "settled"
    assert out["step"]["settledEntryId"] == answer["id"]
    assert out["step"]["stopReason"] == "toolUse"
    srec = started["record"]
    assert out["toolCalls"] == [
        {
            "operationId": run["record"]["operationId"],
            "toolStartedId": started["id"],
            "stepId": rec["stepId"],
            "assistantEntryId": answer["id"],
            "toolIndex": 0,
            "toolCallId": srec["toolCallId"],
            "toolName": "read",
            "arguments": {"path": "x"},
            "replay": "never",
            "replayKey": "builtin:read:v1",
            "environmentIdentity": "fixture",
            "resultEntryId": srec["resultEntryId"],
            "status": "pending",
        }
    ]
    kit.interrupted(started)
    out = expect_ok(kit).to_json()["operation"]
    assert out["toolCalls"][0]["status"] == "completed"
    assert expect_ok(kit).transcript[-1]["content"] == SYNTHETIC_CONTENT["interrupted"]


@pytest.mark.parametrize(
    "reason,stop",
    [("invalidArguments", None), ("unknownTool", None), ("truncated", "length"), ("aborted", None)],
)
def test_synthetic_results_of_each_reason(reason: str, stop: str | None) -> None:
    kit = attempting()
    kit.assistant(None, [("read", "{not json")], stop_reason=stop)
    if reason == "aborted":
        kit.abort("tool", kit.assistant_info["calls"][0]["id"])  # type: ignore[index]
    kit.synthetic(0, reason)
    if reason == "truncated":
        kit.finish(completion="truncated")
    elif reason == "aborted":
        kit.finish("aborted")
    else:
        kit.step_attempt()
        kit.assistant("done")
        kit.finish()
    state = expect_ok(kit)
    assert state.operation.kind == "idle"
    tool_messages = [m for m in state.transcript if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [SYNTHETIC_CONTENT[reason]]


def test_retry_then_settle() -> None:
    kit = attempting()
    first = dict(kit.step)  # type: ignore[arg-type]
    second = kit.retry()
    state = expect_ok(kit)
    step = state.operation.step  # type: ignore[union-attr]
    assert (step.attempt, step.status, step.step_id, step.attempt_id) == (
        2,
        StepStatus.ATTEMPTING,
        first["stepId"],
        second["record"]["attemptId"],
    )
    assert step.context_through_entry_id == first["context"]
    answer = kit.assistant("done")
    state = expect_ok(kit)
    step = state.operation.step  # type: ignore[union-attr]
    assert (step.attempt, step.status, step.settled_entry_id) == (
        2,
        StepStatus.SETTLED,
        answer["id"],
    )
    kit.finish()
    expect_ok(kit)


def test_retry_then_fail_then_finish_failed() -> None:
    kit = attempting()
    kit.retry()
    kit.step_failed()
    kit.finish("failed")
    expect_ok(kit)


def test_abort_during_model() -> None:
    kit = attempting()
    kit.abort("model")
    state = expect_ok(kit)
    assert state.operation.abort_requested  # type: ignore[union-attr]
    kit.step_failed(ABORTED_ERROR)
    state = expect_ok(kit)
    assert state.operation.step.status == StepStatus.FAILED  # type: ignore[union-attr]
    kit.finish("aborted")
    state = expect_ok(kit)
    assert state.to_json()["operation"] == {"kind": "idle"}
    assert list(state.transcript) == [{"role": "user", "content": "hello"}]


def test_abort_during_tool() -> None:
    kit = attempting()
    kit.assistant(None, ["read", "write", "read"])
    calls = kit.assistant_info["calls"]  # type: ignore[index]
    kit.tool_result(kit.tool_started(0))
    running_tool = kit.tool_started(1, replay="never")
    kit.abort("tool", calls[1]["id"])
    with kit.tx():
        kit.interrupted(running_tool)
        kit.synthetic(2, "aborted")
        kit.finish("aborted")
    state = expect_ok(kit)
    assert state.operation.kind == "idle"
    assert [m["content"] for m in state.transcript[-3:]] == [
        "ok",
        SYNTHETIC_CONTENT["interrupted"],
        SYNTHETIC_CONTENT["aborted"],
    ]
    # A user message is legal again afterwards.
    kit.simple_run("next")
    expect_ok(kit)


def test_abort_during_tool_leaving_calls_unanswered_blocks_the_next_user_message() -> None:
    kit = attempting()
    kit.assistant(None, ["read", "write"])
    kit.abort("tool", kit.assistant_info["calls"][0]["id"])  # type: ignore[index]
    kit.finish("aborted")
    expect_ok(kit)
    fact = kit.user("next")
    fails(kit, fact, SCRIPT)


def test_compaction_then_another_run_using_the_new_boundary() -> None:
    kit = SessionKit()
    facts = kit.tool_run()
    comp = kit.compact(keep=3, summary="sum")
    state = expect_ok(kit)
    call = facts["call"]["entry"]["message"]["tool_calls"][0]
    retained = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "contents", "tool_call_id": call["id"]},
        {"role": "assistant", "content": "done"},
    ]
    assert state.to_json()["activeContext"] == [
        {"role": "user", "content": "[Compacted history]\nsum"},
        *retained,
    ]
    assert len(state.transcript) == 4
    assert state.context_boundary == facts["assistant"]["id"]
    assert state.operation.kind == "idle"
    assert comp["started"]["record"]["inputThroughEntryId"] == facts["assistant"]["id"]

    # A run on an earlier prompt: its first attempt names the compaction's input boundary.
    kit.run_started(facts["user"]["id"])
    kit.step_attempt()
    kit.assistant("more")
    kit.finish()
    state = expect_ok(kit)
    assert state.active_context[-1] == {"role": "assistant", "content": "more"}
    assert len(state.active_context) == 5

    # A regular run afterwards, and a second compaction over everything.
    kit.simple_run("again", "fine")
    kit.compact(keep=0, summary="all")
    state = expect_ok(kit)
    assert state.to_json()["activeContext"] == [
        {"role": "user", "content": "[Compacted history]\nall"}
    ]
    assert len(state.transcript) == 7


def test_compaction_state_while_active() -> None:
    kit = SessionKit()
    kit.simple_run()
    started = kit.compaction_started()
    attempt = kit.step_attempt()
    rec = started["record"]
    op = expect_ok(kit).to_json()["operation"]
    assert op["kind"] == "compaction"
    assert op["operationId"] == rec["operationId"]
    assert op["inputThroughEntryId"] == rec["inputThroughEntryId"]
    assert op["resultEntryId"] == rec["resultEntryId"]
    assert op["abortRequested"] is False
    assert op["step"]["stepKind"] == "compaction"
    assert op["step"]["status"] == "attempting"
    entry = kit.compaction()
    op = expect_ok(kit).to_json()["operation"]
    assert op["step"]["status"] == "settled"
    assert op["step"]["settledEntryId"] == entry["id"]
    assert "stopReason" not in op["step"]
    del attempt


def test_second_compaction_through_the_first_compaction_entry() -> None:
    kit = SessionKit()
    kit.simple_run("a", "b")
    first = kit.compact()
    kit.simple_run("c", "d")
    kit.compaction_started(keep=2)
    kit.step_attempt()
    entry = kit.compaction("second")
    # Compacted through the first compaction entry: expected tail = messages after it.
    entry["entry"]["compactedThroughEntryId"] = first["entry"]["id"]
    kit.finish()
    state = expect_ok(kit)
    assert state.to_json()["activeContext"] == [
        {"role": "user", "content": "[Compacted history]\nsecond"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]


def test_usage_totals_across_operations() -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.usage(input=1, output=2, cache_read=3, cache_write=4)
    kit.assistant("x")
    kit.finish()
    kit.compaction_started()
    kit.step_attempt()
    kit.usage(input=10, output=20, cache_read=30, cache_write=40)
    kit.compaction()
    kit.finish()
    state = expect_ok(kit)
    assert state.to_json()["usage"] == {
        "input": 11,
        "output": 22,
        "cacheRead": 33,
        "cacheWrite": 44,
    }


def test_fixture_shaped_session_reduces_like_the_golden_file() -> None:
    # Same structure as the golden completed-tool-run fixture.
    kit = SessionKit(tools=("read",))
    kit.tool_run()
    kit.usage()
    state = reduce_session(kit.bytes())
    assert state.to_json()["usage"] == {"input": 10, "output": 2, "cacheRead": 3, "cacheWrite": 0}


# ====================================================================== non-hashable values
#
# Enum-like members compared against fixed sets must reject any JSON value, including
# arrays and objects (which a dict/set lookup cannot hash), with the checklist's code.


def _enum_cases() -> list[tuple[str, Callable[[], tuple[SessionKit, dict]], str, str]]:
    def user() -> tuple[SessionKit, dict]:
        kit = SessionKit()
        return kit, kit.user()

    def attempt() -> tuple[SessionKit, dict]:
        kit = running()
        return kit, kit.step_attempt()

    def answer() -> tuple[SessionKit, dict]:
        kit = attempting()
        return kit, kit.assistant("done")

    def pre() -> tuple[SessionKit, dict]:
        kit = tool_use(("nope",))
        return kit, kit.synthetic(0, "unknownTool")

    def result() -> tuple[SessionKit, dict]:
        kit = pending()
        return kit, kit.tool_result()

    def started() -> tuple[SessionKit, dict]:
        kit = tool_use()
        return kit, kit.tool_started(0)

    def abort() -> tuple[SessionKit, dict]:
        kit = attempting()
        return kit, kit.abort()

    def finish() -> tuple[SessionKit, dict]:
        kit = attempting()
        kit.assistant("done")
        return kit, kit.finish()

    def run() -> tuple[SessionKit, dict]:
        kit = SessionKit()
        kit.user()
        return kit, kit.run_started()

    def compaction() -> tuple[SessionKit, dict]:
        kit = SessionKit()
        kit.simple_run()
        return kit, kit.compaction_started()

    return [
        ("kind", user, "kind", FACT),
        ("entry.type", user, "entry.type", FACT),
        ("message.role", user, "entry.message.role", FACT),
        ("record.type", attempt, "record.type", FACT),
        ("stepKind", attempt, "record.stepKind", FACT),
        ("stopReason", answer, "entry.stopReason", FACT),
        ("call.type", answer, "entry.tool_calls", FACT),
        ("pre.result.type", pre, "entry.result.type", FACT),
        ("pre.result.reason", pre, "entry.result.reason", FACT),
        ("result.type", result, "entry.result.type", FACT),
        ("result.reason", result, "entry.result.reason", FACT),
        ("replay", started, "record.replay", FACT),
        ("abort.phase", abort, "record.phase", FACT),
        ("abort.operationKind", abort, "record.operationKind", TRANS),
        ("abort.reason", abort, "record.reason", TRANS),
        ("finish.outcome", finish, "record.outcome", TRANS),
        ("finish.operationKind", finish, "record.operationKind", TRANS),
        ("finish.completion", finish, "record.completion", FACT),
        ("run.operationKind", run, "record.operationKind", TRANS),
        ("compaction.operationKind", compaction, "record.operationKind", TRANS),
    ]


@pytest.mark.parametrize(
    "value", [[], {}, ["stop"], {"type": "run"}], ids=["list", "dict", "list1", "dict1"]
)
@pytest.mark.parametrize("case", _enum_cases(), ids=[name for name, *_ in _enum_cases()])
def test_non_hashable_enum_values(case: tuple[str, Any, str, str], value: Any) -> None:
    _, build, path, code = case
    kit, fact = build()
    keys = path.split(".")
    target = fact
    for key in keys[:-1]:
        target = target[key]
    if keys[-1] == "tool_calls":
        kit_call = kit.call("read")
        kit_call["type"] = value
        target["message"]["tool_calls"] = [kit_call]
        target["stopReason"] = "toolUse"
    else:
        target[keys[-1]] = value
    fails(kit, fact, code)


def test_compaction_entry_tail_message_without_its_tool_calls() -> None:
    kit = compacting(keep=3)
    kit.step_attempt()
    fact = kit.compaction()
    del _tail(fact)[0]["message"]["tool_calls"]
    fails(kit, fact, REF)


def test_compaction_through_an_earlier_message_than_the_boundary() -> None:
    kit = SessionKit()
    first = kit.simple_run("one", "uno")
    kit.simple_run("two", "dos")
    kit.compaction_started(keep=1, through=first["assistant"]["id"])
    attempt = kit.step_attempt()
    assert attempt["record"]["contextThroughEntryId"] == kit.boundary != first["assistant"]["id"]
    kit.compaction("s")
    kit.finish()
    state = expect_ok(kit)
    # Only messages through inputThroughEntryId are retained; later ones leave the context.
    assert state.to_json()["activeContext"] == [
        {"role": "user", "content": "[Compacted history]\ns"},
        {"role": "assistant", "content": "uno"},
    ]
    assert len(state.transcript) == 4
    assert state.context_boundary == first["assistant"]["id"]
    # The next first attempt must name that boundary.
    kit.run_started(first["user"]["id"])
    good = kit.fork()
    good.step_attempt()
    expect_ok(good)
    # ... naming the latest message (the boundary before the compaction) is wrong now.
    bad = kit.step_attempt(context=kit.messages[-1][0])
    assert bad["record"]["contextThroughEntryId"] != first["assistant"]["id"]
    fails(kit, bad, TRANS)
