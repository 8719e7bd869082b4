"""Reconciling a pending call on recovery: gather evidence (I/O), decide (pure), record.

The session log says only that a call was started (``toolStarted``) and not answered. The
effects layer may know more. :func:`observe_pending` gathers it for one pending call — the
journal row and the file's current hash for ``write``/``edit``, the service's answer
(:func:`~tether._effects.contract.safe_lookup`) for an effect tool with a lookup, a review
decision if there is one, and whether the workspace's ``effects.db`` is the one holding the
session's evidence (:mod:`tether._effects.binding`) — and :func:`decide_pending`, a pure
function, turns it into a :class:`RecoveryDecision`:

======================================  ==========  ===========================================
observation                             action      what the executor does
======================================  ==========  ===========================================
none (no journal/lookup/review)         SPEC        exactly spec 14.4 rule 9 (``interrupted``
                                                    for ``replay: never``)
review item still open                  REVIEW      stay blocked; nothing appended
review resolved ``applied``             COMPLETE    success result (``content``)
review resolved ``notApplied``          COMPLETE    error result (``content``)
review resolved ``abort``               ABORT       ``abortRequested``, then re-plan
evidence unknown: the session's         REVIEW      open a review item (what is missing, the
``effects.db`` is missing, replaced,                database ids, the file's current hash or
or does not name it                                 the service's answer); nothing is written
file APPLIED                            COMPLETE    success result "… (reconciled after a
                                                    crash …)"
file NOT_APPLIED                        EXECUTE     run it once more (same operation id,
                                                    compare-and-swap)
file NO_RECORD (no journal row)         REVIEW      open a review item: the intent is recorded
                                                    before ``toolStarted``, so it was lost
file FAILED                             COMPLETE    the recorded error result
file CONFLICT                           REVIEW      open a review item (evidence kept)
lookup committed                        COMPLETE    the service's result,
                                                    ``recovered_from_ledger``; nothing runs
lookup not found                        EXECUTE     run it once more, same operation id
lookup unknowable / failed / hung       REVIEW      open a review item
======================================  ==========  ===========================================

Precedence: a review item (open or resolved) first — a person's decision stands; then
unknown evidence; then the file verdict; then the lookup. A decision never rests on the
absence of a record the database cannot be shown to hold: "no record" is read as "nothing
happened" nowhere in this table.

:func:`record_decision` keeps every decision in the reconciliation log (time and evidence)
and opens the review item for REVIEW. The session log itself stays exactly the spec's:
COMPLETE is an ordinary result entry (7.3) with the tool's ``resultEntryId``; EXECUTE is the
``startTool`` replay form of 15.3; REVIEW appends nothing (like ``blocked``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tether._effects.binding import EvidenceCheck
from tether._effects.contract import (
    DEFAULT_LOOKUP_TIMEOUT,
    LookupResult,
    LookupStatus,
    as_lookup,
    safe_lookup,
)
from tether._effects.journal import (
    FileVerdict,
    JournalRow,
    JournalStatus,
    Verdict,
    hash_for_evidence,
    observe_file,
    reconciled_text,
    stale_text,
)
from tether._effects.review import ReviewDecision, ReviewItem
from tether._tools.base import RecoveryKind, Tool
from tether._wsdb.protocol import JournalTable, ReviewTable

__all__ = [
    "EVIDENCE_UNKNOWN",
    "PendingObservation",
    "RecoveryAction",
    "RecoveryDecision",
    "decide_pending",
    "decision_for_review",
    "observe_pending",
    "reconcile_pending",
    "record_decision",
    "review_result_text",
]


class RecoveryAction(StrEnum):
    SPEC = "spec"
    """No usable evidence: do exactly what spec 14.4 rule 9 says."""
    COMPLETE = "complete"
    """Append the started call's result entry with ``content`` / ``is_error``."""
    EXECUTE = "execute"
    """Run the call once more with the same operation id (the 15.3 replay form)."""
    REVIEW = "review"
    """Stop, blocked; a review item names the call and its evidence."""
    ABORT = "abort"
    """A reviewer chose to abort: append ``abortRequested`` and re-plan."""


EVIDENCE_UNKNOWN = "evidenceUnknown"
"""The verdict of a call whose session's effects database is missing or replaced."""


@dataclass(frozen=True, slots=True)
class PendingObservation:
    """What the effects layer knows about one pending call (``toolStartedId`` =
    ``operation_id``). At most one of ``file`` and ``lookup``.

    ``evidence`` says whether the workspace's database holds the session's evidence
    (``None``: not checked). When it does not, ``current_hash``/``path`` (a file tool's
    file now, or ``hash_error``) and ``lookup`` (an effect tool's service answer) are kept
    for the reviewer; the journal is not read.
    """

    operation_id: str
    tool_name: str
    file: FileVerdict | None = None
    lookup: LookupResult | None = None
    review: ReviewItem | None = None
    evidence: EvidenceCheck | None = None
    path: str | None = None
    current_hash: str | None = None
    hash_error: str | None = None

    def __post_init__(self) -> None:
        if self.file is not None and self.lookup is not None:
            raise ValueError("an observation has a file verdict or a lookup result, not both")

    @property
    def evidence_unknown(self) -> bool:
        return self.evidence is not None and not self.evidence.known


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    """What to do with a pending call; ``content``/``is_error`` exactly for COMPLETE."""

    action: RecoveryAction
    verdict: str
    """What was observed, e.g. ``applied``, ``conflict``, ``committed``, ``review:abort``."""
    content: str | None = None
    is_error: bool = False
    recovered_from_ledger: bool = False
    reason: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    review_item: int | None = None

    def __post_init__(self) -> None:
        if (self.action is RecoveryAction.COMPLETE) != (self.content is not None):
            raise ValueError("a recovery decision carries content exactly when it completes")
        object.__setattr__(self, "evidence", MappingProxyType(dict(self.evidence)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action.value, "verdict": self.verdict}
        if self.content is not None:
            out["content"] = self.content
            out["isError"] = self.is_error
        if self.recovered_from_ledger:
            out["recoveredFromLedger"] = True
        if self.reason:
            out["reason"] = self.reason
        if self.review_item is not None:
            out["reviewItem"] = self.review_item
        out["evidence"] = dict(self.evidence)
        return out


_SPEC = RecoveryDecision(RecoveryAction.SPEC, "noObservation")


def review_result_text(
    decision: ReviewDecision, note: str | None, row: JournalRow | None = None
) -> str:
    """The result text a resolved review implies (``applied`` / ``notApplied``)."""
    tail = f" Reviewer's note: {note}" if note else ""
    if decision is ReviewDecision.APPLIED:
        base = (
            row.planned_result
            if row is not None and row.planned_result
            else ("The call took effect")
        )
        return f"{base} (confirmed as applied in review after a crash).{tail}"
    if decision is ReviewDecision.NOT_APPLIED:
        return (
            "Error: the call did not take effect (decided in review after a crash); "
            f"check the current state before trying again.{tail}"
        )
    raise ValueError(f"a review decision of {decision.value!r} implies no result text")


def _from_review(item: ReviewItem, row: JournalRow | None) -> RecoveryDecision:
    evidence = {"reviewItem": item.id, "decision": item.decision, "note": item.note}
    if item.is_open or item.decision is None:
        return RecoveryDecision(
            RecoveryAction.REVIEW,
            "reviewOpen",
            reason=item.reason,
            evidence=dict(item.evidence),
            review_item=item.id,
        )
    verdict = f"review:{item.decision.value}"
    if item.decision is ReviewDecision.ABORT:
        return RecoveryDecision(
            RecoveryAction.ABORT, verdict, evidence=evidence, review_item=item.id
        )
    return RecoveryDecision(
        RecoveryAction.COMPLETE,
        verdict,
        content=review_result_text(item.decision, item.note, row),
        is_error=item.decision is ReviewDecision.NOT_APPLIED,
        evidence=evidence,
        review_item=item.id,
    )


def _from_file(verdict: FileVerdict) -> RecoveryDecision:
    evidence = verdict.evidence()
    kind = verdict.verdict
    row = verdict.row
    if kind is Verdict.APPLIED and row is not None:
        return RecoveryDecision(
            RecoveryAction.COMPLETE,
            kind.value,
            content=reconciled_text(row),
            reason=verdict.reason,
            evidence=evidence,
        )
    if kind is Verdict.FAILED and row is not None:
        return RecoveryDecision(
            RecoveryAction.COMPLETE,
            kind.value,
            content=row.result or stale_text(row.path),
            is_error=row.result_is_error or row.result is None,
            reason=verdict.reason,
            evidence=evidence,
        )
    if kind is Verdict.NOT_APPLIED:
        return RecoveryDecision(
            RecoveryAction.EXECUTE, kind.value, reason=verdict.reason, evidence=evidence
        )
    if kind is Verdict.NO_RECORD:
        # The intent is durable before toolStarted: a started call without a row lost its
        # evidence. Planning it afresh could apply the change a second time.
        what = verdict.path if verdict.path is not None else "the file"
        return RecoveryDecision(
            RecoveryAction.REVIEW,
            kind.value,
            reason=(
                f"the journal has no record of this call although its intent is recorded "
                f"before it starts: the record was lost (was .tether/effects.db deleted or "
                f"replaced?), so whether it changed {what} is unknown; nothing was written"
            ),
            evidence={**evidence, "missing": "journalRow"},
        )
    path = row.path if row is not None else "the file"
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        Verdict.CONFLICT.value,
        reason=(
            f"{path} has neither the content the change was planned against nor the content "
            f"it would produce ({verdict.reason}); nothing was overwritten"
        ),
        evidence=evidence,
    )


def _from_lookup(lookup: LookupResult) -> RecoveryDecision:
    evidence = {"lookup": lookup.to_json()}
    if lookup.status is LookupStatus.COMMITTED and lookup.result is not None:
        return RecoveryDecision(
            RecoveryAction.COMPLETE,
            lookup.status.value,
            content=lookup.result.content,
            is_error=lookup.result.is_error,
            recovered_from_ledger=True,
            reason="the service committed the operation",
            evidence={**evidence, "recoveredFromLedger": True},
        )
    if lookup.status is LookupStatus.NOT_FOUND:
        return RecoveryDecision(
            RecoveryAction.EXECUTE,
            lookup.status.value,
            reason="the service has no record of the operation",
            evidence=evidence,
        )
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        LookupStatus.UNKNOWABLE.value,
        reason=f"the outcome cannot be established: {lookup.reason}",
        evidence=evidence,
    )


def _from_unknown(observation: PendingObservation) -> RecoveryDecision:
    check = observation.evidence
    assert check is not None
    evidence: dict[str, Any] = {
        "missing": "effectsDatabase",
        "effectsDatabase": check.to_json(),
        "expectedDb": check.expected_db,
        "foundDb": check.found_db,
    }
    if observation.path is not None:
        evidence["path"] = observation.path
        evidence["currentHash"] = observation.current_hash
        if observation.hash_error is not None:
            evidence["hashError"] = observation.hash_error
    if observation.lookup is not None:
        evidence["lookup"] = observation.lookup.to_json()
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        EVIDENCE_UNKNOWN,
        reason=(
            f"the evidence of this call is unknown: {check.reason}; whether it took effect "
            "cannot be established from the records, so nothing was run or written"
        ),
        evidence=evidence,
    )


def decision_for_review(item: ReviewItem, row: JournalRow | None = None) -> RecoveryDecision:
    """What a review item implies (pure): REVIEW while open; else COMPLETE with the result
    text of ``applied``/``notApplied`` (``row``: the journal row, for the file tools' text),
    or ABORT. What ``tether review resolve`` appends right after recording the decision."""
    return _from_review(item, row)


def decide_pending(observation: PendingObservation | None) -> RecoveryDecision:
    """The recovery decision for one pending call (pure; see the module table).

    A review item, open or resolved, takes precedence over everything else; then unknown
    evidence (the session's database is missing or replaced); then the file verdict; then
    the lookup. No observation → SPEC (behave exactly as the spec).
    """
    if observation is None:
        return _SPEC
    if observation.review is not None:
        row = observation.file.row if observation.file is not None else None
        return _from_review(observation.review, row)
    if observation.evidence_unknown:
        return _from_unknown(observation)
    if observation.file is not None:
        return _from_file(observation.file)
    if observation.lookup is not None:
        return _from_lookup(observation.lookup)
    return _SPEC


# =========================================================================== I/O helpers


def observe_pending(
    tool: Tool | None,
    operation_id: str,
    *,
    workspace: Path,
    journal: JournalTable | None,
    reviews: ReviewTable | None,
    lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT,
    arguments: Mapping[str, Any] | None = None,
    evidence: EvidenceCheck | None = None,
) -> PendingObservation | None:
    """Gather the evidence about one pending call (I/O: effects.db, the file, the service).

    ``tool`` is the runtime's tool of that name (``None`` if there is none); ``arguments``
    the call's recorded arguments (to name and hash a file tool's file without a journal
    row); ``evidence`` the check of the session's database (:mod:`tether._effects.binding`).
    An open review item short-circuits (nothing else is asked); a resolved one is returned
    with the journal row (for the result text) but no new lookup. With unknown evidence the
    journal is not consulted: the file's current hash, or the service's answer, is kept for
    the reviewer. ``None`` when there is nothing to say. What is observed follows from the
    tool's declared recovery kind alone (:class:`~tether._tools.base.RecoveryKind`).
    """
    if tool is None:
        return _unknown_tool(operation_id, reviews)
    name = tool.name
    kind = tool.recovery
    review = reviews.for_operation(operation_id) if reviews is not None else None
    if review is not None and review.is_open:
        return PendingObservation(operation_id, name, review=review)
    path = arguments.get("path") if arguments is not None else None
    file_path = path if isinstance(path, str) else None
    unknown = evidence is not None and not evidence.known and review is None
    if unknown and kind is RecoveryKind.JOURNALED:
        now, why = hash_for_evidence(workspace, file_path)
        return PendingObservation(
            operation_id,
            name,
            evidence=evidence,
            path=file_path,
            current_hash=now,
            hash_error=why,
        )
    if unknown and kind is RecoveryKind.LOOKUP:
        # Its recovery rests on "no review decision" too, and those were in the lost
        # database. The service's own record is its truth: asked, and kept for the reviewer.
        lookup = safe_lookup(as_lookup(tool), operation_id, lookup_timeout)
        return PendingObservation(operation_id, name, lookup=lookup, evidence=evidence)
    if kind is RecoveryKind.JOURNALED and journal is not None:
        verdict = observe_file(
            workspace, journal, operation_id, keep_evidence=review is None, path=file_path
        )
        return PendingObservation(
            operation_id, name, file=verdict, review=review, evidence=evidence
        )
    if review is not None:
        return PendingObservation(operation_id, name, review=review)
    if kind is RecoveryKind.LOOKUP:
        return PendingObservation(
            operation_id, name, lookup=safe_lookup(as_lookup(tool), operation_id, lookup_timeout)
        )
    return None


def _unknown_tool(operation_id: str, reviews: ReviewTable | None) -> PendingObservation | None:
    """A pending call of a tool the runtime no longer has: only a review item can say more."""
    review = reviews.for_operation(operation_id) if reviews is not None else None
    return PendingObservation(operation_id, "", review=review) if review is not None else None


def record_decision(
    reviews: ReviewTable,
    session_id: str,
    observation: PendingObservation,
    decision: RecoveryDecision,
    journal: JournalTable | None = None,
) -> ReviewItem | None:
    """Keep ``decision`` in the reconciliation log; for REVIEW open (or return) the item.

    With ``journal``, a COMPLETE decision also settles a journal row that is still open
    (``succeeded`` for a success result, ``failed`` for an error one), so the journal
    agrees with the result about to be appended. SPEC decisions carry no evidence and are
    not logged.
    """
    if decision.action is RecoveryAction.SPEC:
        return None
    row = observation.file.row if observation.file is not None else None
    if (
        journal is not None
        and row is not None
        and decision.action is RecoveryAction.COMPLETE
        and decision.content is not None
        and row.status in (JournalStatus.STARTED, JournalStatus.UNKNOWN)
    ):
        journal.mark(
            row.operation_id,
            JournalStatus.FAILED if decision.is_error else JournalStatus.SUCCEEDED,
            f"reconciled: {decision.verdict}",
            result=decision.content,
            result_is_error=decision.is_error,
        )
    if decision.action is RecoveryAction.REVIEW and observation.review is not None:
        if observation.review.is_open:
            return observation.review  # already blocked on it; nothing new to record
    evidence: dict[str, Any] = {**dict(decision.evidence), "decision": decision.to_json()}
    reviews.log_reconciliation(
        session_id,
        observation.operation_id,
        decision.verdict,
        evidence,
        tool_name=observation.tool_name,
        action=decision.action.value,
    )
    if decision.action is RecoveryAction.REVIEW:
        return reviews.open_item(
            session_id,
            observation.operation_id,
            observation.tool_name,
            decision.reason,
            dict(decision.evidence),
        )
    return None


def reconcile_pending(
    tool: Tool | None,
    operation_id: str,
    session_id: str,
    *,
    workspace: Path,
    journal: JournalTable | None,
    reviews: ReviewTable,
    lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT,
    arguments: Mapping[str, Any] | None = None,
    evidence: EvidenceCheck | None = None,
) -> tuple[RecoveryDecision, ReviewItem | None]:
    """:func:`observe_pending` + :func:`decide_pending` + :func:`record_decision`."""
    observation = observe_pending(
        tool,
        operation_id,
        workspace=workspace,
        journal=journal,
        reviews=reviews,
        lookup_timeout=lookup_timeout,
        arguments=arguments,
        evidence=evidence,
    )
    decision = decide_pending(observation)
    if observation is None:
        return decision, None
    item = record_decision(reviews, session_id, observation, decision, journal)
    if item is not None and decision.review_item is None:
        decision = RecoveryDecision(
            decision.action,
            decision.verdict,
            decision.content,
            decision.is_error,
            decision.recovered_from_ledger,
            decision.reason,
            decision.evidence,
            item.id,
        )
    return decision, item
