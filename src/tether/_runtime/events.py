"""Progress events the agent loop emits for user interfaces (pure values)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from tether.core.records import fields, record, replace

_E = TypeVar("_E", bound="Event")


def _camel(name: str) -> str:
    """``session_id`` → ``sessionId``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@record
class Event:
    """Base class; ``kind`` names the event in ``--json`` output."""

    kind: str = "event"

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-ready dict: ``{"event": kind, …}`` with camelCase members
        (like the session log), e.g. ``{"event": "tool_started", "callId": …}``."""
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        kind = data.pop("kind")
        return {"event": kind, **{_camel(name): value for name, value in data.items()}}

    def to_json(self) -> str:
        """The event as one line of JSON text (:meth:`to_dict` serialized)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))


@record
class SessionOpened(Event):
    session_id: str = ""
    path: str = ""
    created: bool = False
    repaired: int = 0
    kind: str = "session"


@record
class ModelStarted(Event):
    operation: str = "run"
    attempt: int = 1
    position: int = 0
    kind: str = "model_started"


@record
class ModelFinished(Event):
    stop_reason: str = ""
    text: str | None = None
    tool_calls: int = 0
    kind: str = "model_finished"


@record
class ModelDelta(Event):
    """A piece of a streaming answer as it arrives: ``channel`` ``text`` or ``reasoning``.

    Shown live; the answer itself is recorded only when complete (``model_finished``)."""

    channel: str = "text"
    text: str = ""
    kind: str = "model_delta"


@record
class ModelFailed(Event):
    code: str = ""
    message: str = ""
    kind: str = "model_failed"


@record
class RetryScheduled(Event):
    """A transient provider failure ended the run; a new run on the same input entry
    starts after ``wait`` seconds (``delay`` was the whole backoff)."""

    reason: str = ""
    delay: float = 0.0
    wait: float = 0.0
    retry: int = 1
    retries: int = 0
    kind: str = "retry_scheduled"


@record
class UsageReported(Event):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reasoning_tokens: int | None = None
    """Reasoning tokens the provider reported (included in ``output``; side record only)."""
    cost: float | None = None
    """The request's price as the provider reported it (OpenRouter, LiteLLM; side record)."""
    kind: str = "usage"


@record
class ToolStarted(Event):
    name: str = ""
    call_id: str = ""
    replay: bool = False
    kind: str = "tool_started"


@record
class ToolFinished(Event):
    name: str = ""
    call_id: str = ""
    is_error: bool = False
    size: int = 0
    kind: str = "tool_finished"


@record
class ToolSkipped(Event):
    """A call answered without running (synthetic result: unknown tool, interrupted, …)."""

    name: str = ""
    call_id: str = ""
    reason: str = ""
    kind: str = "tool_skipped"


@record
class ToolReconciled(Event):
    """Recovery established a started call's outcome from evidence (journal, lookup,
    review) instead of guessing."""

    name: str = ""
    call_id: str = ""
    verdict: str = ""
    action: str = ""
    recovered_from_ledger: bool = False
    review_item: int | None = None
    kind: str = "tool_reconciled"


@record
class OperationFinished(Event):
    operation: str = "run"
    outcome: str = ""
    kind: str = "operation_finished"


@record
class Blocked(Event):
    reason: str = ""
    detail: str = ""
    kind: str = "blocked"


@record
class ApprovalParked(Event):
    """A call was parked until a person decides; the run stops after this."""

    name: str = ""
    call_id: str = ""
    request_id: int = 0
    summary: str = ""
    kind: str = "approval_parked"


@record
class ToolAuthorized(Event):
    """A side-effecting call was decided before it started (policy, a person or --yes)."""

    name: str = ""
    call_id: str = ""
    decision: str = ""
    kind: str = "tool_authorized"


@record
class CompletionChecked(Event):
    """The completion gate's verdict on a finished run that changed files."""

    status: str = ""
    message: str = ""
    changed_files: tuple[str, ...] = ()
    kind: str = "completion"


@record
class FollowUpStarted(Event):
    """``--require-verified``: a follow-up run asks the model to verify (1 or 2)."""

    number: int = 0
    prompt: str = ""
    kind: str = "follow_up"


EventSink = Callable[[Event], None]
"""Receives every progress event (``Agent(on_event=…)``)."""


def masked(event: _E, mask: Callable[[str], str]) -> _E:
    """``event`` with ``mask`` applied to every text in it (strings and tuples of strings);
    the same object when nothing changed."""
    changes: dict[str, Any] = {}
    for item in fields(event):
        value = getattr(event, item.name)
        if isinstance(value, str):
            new: Any = mask(value)
        elif isinstance(value, tuple):
            new = tuple(mask(part) if isinstance(part, str) else part for part in value)
        else:
            continue
        if new != value:
            changes[item.name] = new
    return replace(event, **changes) if changes else event
