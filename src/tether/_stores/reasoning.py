"""Reasoning side records: what a model thought, kept beside the log, keyed by entry id.

The session log is strictly session v2 and messages admit no extra members (spec 6), so
reasoning text, the provider's reasoning records that must be sent back (OpenRouter
``reasoning_details``, Anthropic thinking blocks with signatures), reasoning-token counts
and the reported cost live in one side record per assistant entry: the session's sidecar
``reasoning.<entry id>`` (for the file store ``.<session id>.reasoning.<entry id>.json``
next to the log, mode 0600, written atomically and durably).

Ordering: the executor provisions the assistant entry's id, writes the side record, and
only then commits the entry — so a side record is durable no later than its entry. A crash
in between leaves a record whose entry never existed; it is never read. A missing,
unreadable or malformed record is treated as absent: the session still reduces and
resumes, and providers are then sent no reasoning for that turn.

Secrets: every string in the record passes through the process's :class:`~tether.
_credentials.Masker`, as the log does. (A thinking block whose text had to be masked no
longer matches its signature; the provider then rejects it — a deliberate trade.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tether._models.base import ModelResponse, Reasoning
from tether._stores.protocol import SessionStoreProtocol
from tether.core.records import record
from tether.core.state import SessionState, Usage

__all__ = [
    "RECORD_VERSION",
    "ReportedCost",
    "SideRecord",
    "align_context_ids",
    "parse_side_record",
    "read_side_record",
    "reported_costs",
    "side_record_name",
    "side_record_reader",
    "wants_side_record",
    "write_side_record",
]

RECORD_VERSION: Final = 1


@record(slots=True)
class SideRecord:
    entry_id: str
    attempt_id: str
    reasoning: Reasoning | None
    reasoning_tokens: int | None
    cost: float | None
    usage: Usage | None = None
    """The attempt's token counts (the log's usage fact): what ``cost`` paid for."""

    def to_json(self) -> dict[str, Any]:
        return {
            "usage": self.usage.to_json() if self.usage is not None else None,
            "version": RECORD_VERSION,
            "entryId": self.entry_id,
            "attemptId": self.attempt_id,
            "reasoning": self.reasoning.to_json() if self.reasoning else None,
            "reasoningTokens": self.reasoning_tokens,
            "cost": self.cost,
        }


def side_record_name(entry_id: str) -> str:
    return f"reasoning.{entry_id}"


def wants_side_record(response: ModelResponse) -> bool:
    return bool(response.reasoning) or bool(response.reasoning_tokens) or response.cost is not None


def _masked(value: Any, mask: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, Mapping):
        return {k: _masked(v, mask) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v, mask) for v in value]
    return value


def write_side_record(
    store: SessionStoreProtocol,
    *,
    entry_id: str,
    attempt_id: str,
    response: ModelResponse,
    mask: Callable[[str], str],
) -> SideRecord:
    """Write the side record of ``response`` durably (raises :class:`OSError`)."""
    record = SideRecord(
        entry_id=entry_id,
        attempt_id=attempt_id,
        reasoning=response.reasoning,
        reasoning_tokens=response.reasoning_tokens,
        cost=response.cost,
        usage=response.usage,
    )
    data = json.dumps(_masked(record.to_json(), mask), ensure_ascii=False, allow_nan=False)
    store.sidecar(side_record_name(entry_id)).write(data.encode("utf-8"))
    return record


def side_record_reader(store: SessionStoreProtocol) -> Callable[[str], SideRecord | None] | None:
    """:func:`read_side_record` for many entries: the session's side records are listed
    once, and only those that exist are read (a long session's cost would otherwise ask
    for thousands of missing records, one system call each); ``None`` when the session has
    none at all."""
    names = store.sidecar_names(side_record_name(""))
    if names is not None and not names:
        return None

    def read(entry_id: str) -> SideRecord | None:
        if names is not None and side_record_name(entry_id) not in names:
            return None
        return read_side_record(store, entry_id)

    return read


def read_side_record(store: SessionStoreProtocol, entry_id: str) -> SideRecord | None:
    """The side record of ``entry_id``, or ``None`` when missing or unusable."""
    data, _why = store.sidecar(side_record_name(entry_id)).read()
    if data is None:
        return None
    return parse_side_record(data, entry_id)


def parse_side_record(data: bytes, entry_id: str) -> SideRecord | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, Mapping) or value.get("entryId") != entry_id:
        return None
    raw = value.get("reasoning")
    tokens = value.get("reasoningTokens")
    cost = value.get("cost")
    attempt = value.get("attemptId")
    return SideRecord(
        entry_id=entry_id,
        attempt_id=attempt if isinstance(attempt, str) else "",
        reasoning=Reasoning.from_json(raw) if isinstance(raw, Mapping) else None,
        reasoning_tokens=tokens
        if isinstance(tokens, int) and not isinstance(tokens, bool)
        else None,
        cost=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        usage=_usage(value.get("usage")),
    )


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return Usage.from_json(value)
    except (TypeError, ValueError, KeyError):
        return None


def align_context_ids(
    context: Sequence[Mapping[str, Any]],
    transcript: Sequence[Mapping[str, Any]],
    transcript_ids: Sequence[str],
) -> list[str | None]:
    """The entry id of each ``context`` message, where it can be told (else ``None``).

    The active context is the transcript, or after a compaction a summary followed by a
    suffix of the transcript (the retained tail and everything after it), so the ids are
    matched from the end for as long as the messages agree.
    """
    out: list[str | None] = [None] * len(context)
    i, j = len(context) - 1, min(len(transcript), len(transcript_ids)) - 1
    while i >= 0 and j >= 0 and context[i] == transcript[j]:
        out[i] = transcript_ids[j]
        i -= 1
        j -= 1
    return out


@record(slots=True)
class ReportedCost:
    """What the side record of one answer says about its price."""

    index: int
    """The answer's position in the transcript."""
    cost: float | None
    """US dollars the provider reported, with ``usage`` the tokens they paid for."""
    usage: Usage | None
    reasoning_tokens: int


def reported_costs(
    state: SessionState, read: Callable[[str], SideRecord | None], *, start: int = 0
) -> list[ReportedCost]:
    """The side records of the answers from transcript index ``start`` on that report a
    cost or reasoning tokens (``read`` gives the record of an entry id, or ``None``)."""
    out: list[ReportedCost] = []
    ids = state.transcript_ids
    transcript = state.transcript
    for index in range(start, len(ids)):
        if transcript[index].get("role") != "assistant":
            continue
        record = read(ids[index])
        if record is None:
            continue
        if record.cost is not None and record.usage is not None:
            out.append(ReportedCost(index, record.cost, record.usage, record.reasoning_tokens or 0))
        elif record.reasoning_tokens:
            out.append(ReportedCost(index, None, None, record.reasoning_tokens))
    return out
