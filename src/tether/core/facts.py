"""Every fact shape of the session format (spec 4, 7, 8 and 9), spelled once.

Rules of this module:

* It is the one place a fact's JSON shape is written down. The shell builds every fact it
  commits with the constructors below, never with a dict literal; the reducer's closed-member
  checks (spec 13: "no member outside S") read the member tables below. A shape changes here
  or nowhere.
* Pure: the caller passes every id, and the store assigns the envelope members it owns
  (``seq``, ``timestamp``, and ``id`` where a constructor leaves it out). No clock, no
  randomness.
* A constructor returns a fresh ``dict`` ready for ``SessionStore.commit``; nested values
  the caller passes (messages, arguments, snapshots) are shared, not copied.
* Constructors do not validate: the reducer does, before anything is written (the store
  runs every candidate transaction through it). Keyword-only parameters make a misplaced
  argument a ``TypeError`` at the call site instead of a corrupt candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

Fact = dict[str, Any]
"""A fact as the store commits it (without the envelope members the store assigns)."""

VERSION: Final = 2
"""The format version this module spells (spec 4: the header's ``version``)."""

# =========================================================================== member tables
#
# Closed member sets, read by the reducer as ``TABLE.issuperset(obj)`` (spec 13). Optional
# members are in the set; which of them are required is the reducer's checklist.

HEADER: Final = frozenset(
    {"kind", "version", "id", "createdAt", "cwd", "provider", "model", "environmentIdentity"}
)
ENTRY_FACT: Final = frozenset({"kind", "seq", "id", "timestamp", "entry"})
RECORD_FACT: Final = frozenset({"kind", "seq", "id", "timestamp", "record"})
USAGE_FACT: Final = frozenset(
    {"kind", "seq", "id", "timestamp", "operationId", "attemptId", "toolStartedId", "usage"}
)

USER_ENTRY: Final = frozenset({"type", "message"})
ASSISTANT_ENTRY: Final = frozenset({"type", "stepId", "attemptId", "stopReason", "message"})
PRE_TOOL_ENTRY: Final = frozenset(
    {"type", "stepId", "assistantEntryId", "toolIndex", "message", "toolName", "result"}
)
STARTED_TOOL_ENTRY: Final = frozenset(
    {"type", "stepId", "message", "toolName", "toolStartedId", "result"}
)
COMPACTION_ENTRY: Final = frozenset(
    {"type", "operationId", "summary", "compactedThroughEntryId", "retainedTail"}
)
RESULT: Final = frozenset({"type", "reason"})
TAIL_ITEM: Final = frozenset({"sourceEntryId", "message"})

RUN_STARTED: Final = frozenset({"type", "operationId", "operationKind", "inputEntryId"})
COMPACTION_STARTED: Final = frozenset(
    {
        "type",
        "operationId",
        "operationKind",
        "inputThroughEntryId",
        "resultEntryId",
        "compactedEntryIds",
        "retainedEntryIds",
        "sourceDigest",
    }
)
STEP_ATTEMPT: Final = frozenset(
    {
        "type",
        "operationId",
        "stepId",
        "attemptId",
        "stepKind",
        "attempt",
        "contextThroughEntryId",
        "configurationSnapshot",
        "configurationDigest",
    }
)
STEP_FAILED: Final = frozenset({"type", "operationId", "stepId", "attemptId", "error"})
TOOL_STARTED: Final = frozenset(
    {
        "type",
        "operationId",
        "stepId",
        "assistantEntryId",
        "toolIndex",
        "toolCallId",
        "toolName",
        "arguments",
        "replay",
        "replayKey",
        "environmentIdentity",
        "resultEntryId",
    }
)
ABORT_REQUESTED: Final = frozenset(
    {"type", "operationId", "operationKind", "phase", "toolCallId", "reason"}
)
OPERATION_FINISHED: Final = frozenset(
    {"type", "operationId", "operationKind", "outcome", "completion", "finalEntryId", "error"}
)
ERROR: Final = frozenset({"code", "message"})
SNAPSHOT: Final = frozenset(
    {
        "model",
        "systemPromptDigest",
        "tools",
        "adapterIdentity",
        "routingIdentity",
        "outputOptionsDigest",
    }
)
SNAPSHOT_TOOL: Final = frozenset({"name", "definitionDigest"})
USAGE: Final = frozenset({"input", "output", "cacheRead", "cacheWrite"})
USAGE_COUNTERS: Final = ("input", "output", "cacheRead", "cacheWrite")

USER_MESSAGE: Final = frozenset({"role", "content"})
ASSISTANT_MESSAGE: Final = frozenset({"role", "content", "tool_calls"})
TOOL_MESSAGE: Final = frozenset({"role", "content", "tool_call_id"})
TOOL_CALL: Final = frozenset({"id", "type", "function"})
FUNCTION: Final = frozenset({"name", "arguments"})

# Closed value sets of enumerated members, read by the reducer as ``value in SET`` (after
# checking that the value is a string); the constructors below spell these values.

PRE_EXECUTION_REASONS: Final = frozenset(
    {"invalidArguments", "unknownTool", "truncated", "aborted"}
)
"""``result.reason`` of a pre-execution synthetic result (7.4); see :data:`PreExecutionReason`."""
ABORT_PHASES: Final = frozenset({"model", "tool", "compact"})
"""``abortRequested.phase`` (8.6)."""
OUTCOMES: Final = frozenset({"completed", "aborted", "failed"})
"""``operationFinished.outcome`` (8.7)."""

ErrorValue = Mapping[str, str]
"""``{"code": text, "message": text}`` (spec 8.4, 8.7)."""


def _record(record: Fact, fact_id: str | None = None) -> Fact:
    fact: Fact = {"kind": "record", "record": record}
    if fact_id is not None:
        fact["id"] = fact_id
    return fact


def _entry(entry: Fact, fact_id: str | None = None) -> Fact:
    fact: Fact = {"kind": "entry", "entry": entry}
    if fact_id is not None:
        fact["id"] = fact_id
    return fact


# =========================================================================== header (4)


def header(
    *,
    session_id: str,
    created_at: int,
    cwd: str,
    provider: str,
    model: str,
    environment_identity: str,
) -> Fact:
    """Line 1 of every log (spec 4); not a fact: it has no ``seq`` and is not committed."""
    return {
        "kind": "header",
        "version": VERSION,
        "id": session_id,
        "createdAt": created_at,
        "cwd": cwd,
        "provider": provider,
        "model": model,
        "environmentIdentity": environment_identity,
    }


# =========================================================================== entries (7)


def user_entry(*, entry_id: str, content: str) -> Fact:
    """A user message entry (7.1); its ``id`` is named by ``runStarted.inputEntryId``."""
    return _entry({"type": "message", "message": {"role": "user", "content": content}}, entry_id)


def assistant_entry(
    *, step_id: str, attempt_id: str, stop_reason: str, message: Mapping[str, Any]
) -> Fact:
    """The assistant entry that settles an attempt (7.2); ``message`` is normalized (6.2)."""
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "attemptId": attempt_id,
            "stopReason": stop_reason,
            "message": message,
        }
    )


def _tool_message(content: str, call_id: str) -> Fact:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def started_result_entry(
    *,
    result_entry_id: str,
    step_id: str,
    tool_started_id: str,
    tool_name: str,
    call_id: str,
    content: str,
    is_error: bool,
) -> Fact:
    """The result entry of a started tool (7.3): ``success`` or ``error``."""
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "toolStartedId": tool_started_id,
            "toolName": tool_name,
            "message": _tool_message(content, call_id),
            "result": {"type": "error" if is_error else "success"},
        },
        result_entry_id,
    )


def interrupted_result_entry(
    *,
    result_entry_id: str,
    step_id: str,
    tool_started_id: str,
    tool_name: str,
    call_id: str,
    content: str,
) -> Fact:
    """The synthetic ``interrupted`` result of a started tool (7.3; ``content`` is the
    fixed text of 7.6)."""
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "toolStartedId": tool_started_id,
            "toolName": tool_name,
            "message": _tool_message(content, call_id),
            "result": {"type": "synthetic", "reason": "interrupted"},
        },
        result_entry_id,
    )


PreExecutionReason = Literal["invalidArguments", "unknownTool", "truncated", "aborted"]


def pre_execution_entry(
    *,
    step_id: str,
    assistant_entry_id: str,
    tool_index: int,
    call_id: str,
    tool_name: str,
    reason: str,
    content: str,
) -> Fact:
    """A pre-execution synthetic result (7.4) answering a call that never started;
    ``content`` is the fixed text of ``reason`` (7.6)."""
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "assistantEntryId": assistant_entry_id,
            "toolIndex": tool_index,
            "toolName": tool_name,
            "message": _tool_message(content, call_id),
            "result": {"type": "synthetic", "reason": reason},
        }
    )


def retained_item(*, source_entry_id: str, message: Mapping[str, Any]) -> Fact:
    """One item of a compaction entry's ``retainedTail`` (7.5)."""
    return {"sourceEntryId": source_entry_id, "message": message}


def compaction_entry(
    *,
    entry_id: str,
    operation_id: str,
    summary: str,
    compacted_through_entry_id: str,
    retained_tail: Sequence[Mapping[str, Any]],
) -> Fact:
    """The compaction entry (7.5); ``entry_id`` is the operation's ``resultEntryId``."""
    return _entry(
        {
            "type": "compaction",
            "operationId": operation_id,
            "summary": summary,
            "compactedThroughEntryId": compacted_through_entry_id,
            "retainedTail": list(retained_tail),
        },
        entry_id,
    )


# =========================================================================== records (8)


def run_started(*, operation_id: str, input_entry_id: str) -> Fact:
    """``runStarted`` (8.1)."""
    return _record(
        {
            "type": "runStarted",
            "operationId": operation_id,
            "operationKind": "run",
            "inputEntryId": input_entry_id,
        }
    )


def compaction_started(
    *,
    operation_id: str,
    input_through_entry_id: str,
    result_entry_id: str,
    compacted_entry_ids: Sequence[str],
    retained_entry_ids: Sequence[str],
    source_digest: str,
) -> Fact:
    """``compactionStarted`` (8.2)."""
    return _record(
        {
            "type": "compactionStarted",
            "operationId": operation_id,
            "operationKind": "compaction",
            "inputThroughEntryId": input_through_entry_id,
            "resultEntryId": result_entry_id,
            "compactedEntryIds": list(compacted_entry_ids),
            "retainedEntryIds": list(retained_entry_ids),
            "sourceDigest": source_digest,
        }
    )


def step_attempt(
    *,
    operation_id: str,
    step_id: str,
    attempt_id: str,
    step_kind: str,
    attempt: int,
    context_through_entry_id: str,
    configuration_snapshot: Mapping[str, Any],
    configuration_digest: str,
) -> Fact:
    """``stepAttempt`` (8.3): one physical model request, durable before it is sent."""
    return _record(
        {
            "type": "stepAttempt",
            "operationId": operation_id,
            "stepId": step_id,
            "attemptId": attempt_id,
            "stepKind": step_kind,
            "attempt": attempt,
            "contextThroughEntryId": context_through_entry_id,
            "configurationSnapshot": configuration_snapshot,
            "configurationDigest": configuration_digest,
        }
    )


def step_failed(*, operation_id: str, step_id: str, attempt_id: str, error: ErrorValue) -> Fact:
    """``stepFailed`` (8.4)."""
    return _record(
        {
            "type": "stepFailed",
            "operationId": operation_id,
            "stepId": step_id,
            "attemptId": attempt_id,
            "error": {"code": error["code"], "message": error["message"]},
        }
    )


def tool_started(
    *,
    fact_id: str,
    operation_id: str,
    step_id: str,
    assistant_entry_id: str,
    tool_index: int,
    tool_call_id: str,
    tool_name: str,
    arguments: Mapping[str, Any],
    replay: str,
    replay_key: str,
    environment_identity: str,
    result_entry_id: str,
) -> Fact:
    """``toolStarted`` (8.5), the durable intent before a tool runs. ``fact_id`` is the
    call's operation id (known before the commit, so evidence can be recorded under it)."""
    return _record(
        {
            "type": "toolStarted",
            "operationId": operation_id,
            "stepId": step_id,
            "assistantEntryId": assistant_entry_id,
            "toolIndex": tool_index,
            "toolCallId": tool_call_id,
            "toolName": tool_name,
            "arguments": arguments,
            "replay": replay,
            "replayKey": replay_key,
            "environmentIdentity": environment_identity,
            "resultEntryId": result_entry_id,
        },
        fact_id,
    )


def abort_requested(
    *, operation_id: str, operation_kind: str, tool_call_id: str | None = None
) -> Fact:
    """``abortRequested`` (8.6): phase ``compact`` for a compaction, ``tool`` with the
    running call's id when one is pending, else ``model``."""
    record: Fact = {
        "type": "abortRequested",
        "operationId": operation_id,
        "operationKind": operation_kind,
        "reason": "escape",
    }
    if operation_kind == "compaction":
        record["phase"] = "compact"
    elif tool_call_id is not None:
        record["phase"] = "tool"
        record["toolCallId"] = tool_call_id
    else:
        record["phase"] = "model"
    return _record(record)


def operation_finished(
    *,
    operation_id: str,
    operation_kind: str,
    outcome: str,
    completion: str | None = None,
    final_entry_id: str | None = None,
    error: ErrorValue | None = None,
) -> Fact:
    """``operationFinished`` (8.7); the optional members appear only when given, as the
    variant of ``outcome`` requires."""
    record: Fact = {
        "type": "operationFinished",
        "operationId": operation_id,
        "operationKind": operation_kind,
        "outcome": outcome,
    }
    if completion is not None:
        record["completion"] = completion
    if final_entry_id is not None:
        record["finalEntryId"] = final_entry_id
    if error is not None:
        record["error"] = {"code": error["code"], "message": error["message"]}
    return _record(record)


# =========================================================================== usage (9)


def usage(
    *,
    operation_id: str,
    counters: Mapping[str, int],
    attempt_id: str | None = None,
    tool_started_id: str | None = None,
) -> Fact:
    """A usage fact (9) for an attempt or a started tool (exactly one of the two)."""
    fact: Fact = {"kind": "usage", "operationId": operation_id}
    if attempt_id is not None:
        fact["attemptId"] = attempt_id
    if tool_started_id is not None:
        fact["toolStartedId"] = tool_started_id
    fact["usage"] = {name: counters[name] for name in USAGE_COUNTERS}
    return fact
