"""Reconciling a pending call on recovery: gather evidence (I/O), decide (pure), record.

The session log says only that a call was started (``toolStarted``) and not answered. The
effects layer may know more. :func:`observe_pending` gathers it for one pending call — the
journal row and the file's current hash for ``write``/``edit``, the service's answer
(:func:`~tether._effects.contract.safe_lookup`) for an effect tool with a lookup, a review
decision if there is one, and whether the workspace's ``effects.db`` is the one holding the
session's evidence (:mod:`tether._effects.binding`) — and
:func:`~tether.core.reconcile.decide_pending`, pure and in the core with its decision table
(re-exported here), turns it into a :class:`~tether.core.reconcile.RecoveryDecision`.

:func:`record_decision` keeps every decision in the reconciliation log (time and evidence)
and opens the review item for REVIEW. The session log itself stays exactly the spec's:
COMPLETE is an ordinary result entry (7.3) with the tool's ``resultEntryId``; EXECUTE is the
``startTool`` replay form of 15.3; REVIEW appends nothing (like ``blocked``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tether._effects.contract import DEFAULT_LOOKUP_TIMEOUT, as_lookup, safe_lookup
from tether._effects.journal import hash_for_evidence, observe_file
from tether._tools.base import RecoveryKind, Tool
from tether._wsdb.protocol import JournalTable, ReviewTable
from tether.core.reconcile import (
    EVIDENCE_UNKNOWN,
    PendingObservation,
    RecoveryAction,
    RecoveryDecision,
    decide_pending,
    decision_for_review,
    review_result_text,
)
from tether.core.values import EvidenceCheck, JournalStatus, ReviewItem

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
