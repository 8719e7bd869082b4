"""Builders of the facts the runtime appends (shapes of spec 7 and 8; pure)."""

from __future__ import annotations

from typing import Any


def started_result_entry(
    *,
    result_entry_id: str,
    step_id: str,
    tool_started_id: str,
    tool_name: str,
    call_id: str,
    content: str,
    is_error: bool,
) -> dict[str, Any]:
    """The result entry of a started tool (spec 7.3)."""
    return {
        "kind": "entry",
        "id": result_entry_id,
        "entry": {
            "type": "message",
            "stepId": step_id,
            "toolStartedId": tool_started_id,
            "toolName": tool_name,
            "message": {"role": "tool", "content": content, "tool_call_id": call_id},
            "result": {"type": "error" if is_error else "success"},
        },
    }


def abort_requested_record(
    operation_id: str, operation_kind: str, tool_call_id: str | None = None
) -> dict[str, Any]:
    """``abortRequested`` (spec 8.6): phase ``compact`` for a compaction, ``tool`` with the
    running call's id when one is pending, else ``model``."""
    record: dict[str, Any] = {
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
    return {"kind": "record", "record": record}
