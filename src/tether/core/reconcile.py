"""Reconciling a pending call on recovery: the pure decision tables.

The session log says only that a call was started (``toolStarted``) and not answered. The
effects layer may know more; the shell gathers it (:mod:`tether._effects.recovery`,
:mod:`tether._effects.journal`, :mod:`tether._effects.binding`: the journal row, the file's
current hash, the service's answer, a review decision, which database holds the session's
evidence) and the functions here decide on it. Nothing here reads a file, a database or a
service; the tables below are data the code reads, first matching row wins.

**Is the evidence known?** :func:`judge_binding` compares the session's record of its
effects database with the database there is now (see :mod:`tether._effects.binding`).

**What happened to a journaled file change?** :func:`reconcile_file`, from the journal
row's status, else from what the file holds now:

============  ====================================  ===========================================
verdict       when                                  recovery
============  ====================================  ===========================================
APPLIED       status ``succeeded``, or the file has  fill in a success result saying it was
              the after-hash                         reconciled after a crash
NOT_APPLIED   the file has the before-hash (absent   perform the change once, under
              when before is ``None``), or status    compare-and-swap
              ``proposed``/``authorized``
NO_RECORD     no journal row: the intent is          review: write nothing (the row is written
              recorded before ``toolStarted``, so    before ``toolStarted``; without it the
              it was lost                            outcome is unknown)
FAILED        status ``failed``: the call failed     fill in the recorded error result
              without writing
CONFLICT      neither hash (or unreadable)           write nothing; keep both hashes and a
                                                     copy of the current content; review
============  ====================================  ===========================================

**What does recovery do with the pending call?** :func:`decide_pending`:

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

Precedence (:data:`_PRECEDENCE`): a review item (open or resolved) first — a person's
decision stands; then unknown evidence; then the file verdict; then the lookup. A decision
never rests on the absence of a record the database cannot be shown to hold: "no record" is
read as "nothing happened" nowhere in these tables.

The planner (:func:`tether.core.planner.plan_recovery`) takes the :class:`RecoveryDecision`
itself as its observation of a started call: COMPLETE becomes ``completeTool``, EXECUTE the
replay form of ``startTool`` (spec 15.3), REVIEW ``awaitReview``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import Any, Final

from tether.core.records import field, record
from tether.core.values import (
    BindingState,
    EvidenceCheck,
    JournalRow,
    JournalStatus,
    LookupResult,
    LookupStatus,
    ReviewDecision,
    ReviewItem,
    SessionBinding,
    format_ms,
)

__all__ = [
    "EVIDENCE_UNKNOWN",
    "FileVerdict",
    "PendingObservation",
    "RecoveryAction",
    "RecoveryDecision",
    "Verdict",
    "decide_pending",
    "decision_for_review",
    "judge_binding",
    "reconcile_file",
    "reconciled_text",
    "review_result_text",
    "stale_text",
]


# =========================================================================== result texts


def stale_text(path: str) -> str:
    """The error result of a compare-and-swap that found other content."""
    return f"Error: {path} changed since it was read; read it again."


def reconciled_text(row: JournalRow) -> str:
    """The success text of a change found applied after a crash."""
    base = row.planned_result or f"Applied the change to {row.path}"
    return f"{base} (reconciled after a crash: the change was already applied)"


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


# =========================================================================== evidence binding


def judge_binding(
    session_id: str,
    recorded: SessionBinding | None,
    *,
    database: str,
    db_id: str,
    names_session: bool,
    db_existed: bool = True,
    db_fresh: bool = False,
    unreadable: str | None = None,
) -> EvidenceCheck:
    """Is the database at ``database`` (identity ``db_id``) the one holding the session's
    evidence?

    ``recorded`` is the session's sidecar (``None``: there is none; ``unreadable``: why it
    cannot be read), ``names_session`` whether the database has the session's row,
    ``db_existed`` whether the file existed before it was opened, ``db_fresh`` whether the
    open created its schema.
    """

    def check(state: BindingState, reason: str) -> EvidenceCheck:
        expected = recorded.effects_db if recorded is not None else None
        return EvidenceCheck(state, session_id, database, expected, db_id, reason, recorded)

    if unreadable is not None:
        return check(
            BindingState.UNREADABLE,
            f"the record of which effects database holds this session's evidence cannot be "
            f"read ({unreadable}), so the database {database} cannot be trusted to be complete",
        )
    if recorded is None:
        if names_session:
            return check(BindingState.BOUND, f"the effects database {database} names the session")
        return check(BindingState.UNBOUND, "the session has recorded no evidence yet")
    since = format_ms(recorded.bound_at_ms)
    if db_id == recorded.effects_db:
        if names_session:
            return check(BindingState.BOUND, f"the effects database {database} holds the session")
        return check(
            BindingState.NOT_NAMED,
            f"the effects database {database} ({db_id}) does not name the session: it is a "
            f"copy from before the session's first evidence ({since})",
        )
    if not db_existed:
        return check(
            BindingState.MISSING,
            f"the effects database {database} did not exist: the session's evidence is in "
            f"database {recorded.effects_db} (since {since}), which was deleted or moved away; "
            f"a new, empty one ({db_id}) was created",
        )
    what = "a freshly created database" if db_fresh else "another database"
    return check(
        BindingState.REPLACED,
        f"the effects database {database} is {what} ({db_id}), not database "
        f"{recorded.effects_db} that holds the session's evidence (since {since})",
    )


# =========================================================================== file verdicts


class Verdict(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "notApplied"
    CONFLICT = "conflict"
    NO_RECORD = "noRecord"
    FAILED = "failed"


@record(slots=True)
class FileVerdict:
    """What :func:`reconcile_file` concluded about one journaled call."""

    verdict: Verdict
    row: JournalRow | None
    current_hash: str | None
    reason: str
    evidence_id: int | None = None
    """Id of the kept copy of the current content (conflicts; set by the shell's
    ``observe_file``)."""
    path: str | None = None
    """The file, when there is no row to name it (``NO_RECORD``; from the call's arguments)."""

    def evidence(self) -> dict[str, Any]:
        """JSON evidence: the journal's view, both hashes and the current one."""
        out: dict[str, Any] = {"verdict": self.verdict.value, "reason": self.reason}
        if self.row is None and self.path is not None:
            out["path"] = self.path
        if self.row is not None:
            out.update(
                operationId=self.row.operation_id,
                path=self.row.path,
                journalStatus=self.row.status.value,
                beforeHash=self.row.before_hash,
                afterHash=self.row.after_hash,
                argumentsDigest=self.row.arguments_digest,
            )
        out["currentHash"] = self.current_hash
        if self.evidence_id is not None:
            out["evidenceId"] = self.evidence_id
        return out


_NO_RECORD_REASON: Final = (
    "no journal row: the intent of a journaled call is recorded before its "
    "toolStarted, so its record was lost"
)

_BY_STATUS: Final[Mapping[JournalStatus, tuple[Verdict, str] | None]] = MappingProxyType(
    {
        JournalStatus.SUCCEEDED: (Verdict.APPLIED, "the journal recorded success"),
        JournalStatus.FAILED: (Verdict.FAILED, "the journal recorded a failure without a write"),
        JournalStatus.PROPOSED: (Verdict.NOT_APPLIED, "the change was only proposed"),
        JournalStatus.AUTHORIZED: (Verdict.NOT_APPLIED, "the change was only authorized"),
        # In flight: the file may have been touched; what it holds now decides (_BY_FILE).
        JournalStatus.STARTED: None,
        JournalStatus.UNKNOWN: None,
    }
)
"""A row's status → the verdict and its reason, where the status alone decides."""


class _FileHolds(Enum):
    """What the file of an in-flight row holds now, in the order it is tested."""

    UNREADABLE = "unreadable"
    AFTER = "after"  # tested before BEFORE: a change to identical content is applied
    BEFORE_ABSENT = "before-absent"
    BEFORE = "before"
    NEITHER = "neither"


_BY_FILE: Final[Mapping[_FileHolds, tuple[Verdict, str]]] = MappingProxyType(
    {
        _FileHolds.UNREADABLE: (Verdict.CONFLICT, "the file could not be checked: {unreadable}"),
        _FileHolds.AFTER: (Verdict.APPLIED, "the file has the after-hash"),
        _FileHolds.BEFORE_ABSENT: (Verdict.NOT_APPLIED, "the file is still absent"),
        _FileHolds.BEFORE: (Verdict.NOT_APPLIED, "the file still has the before-hash"),
        _FileHolds.NEITHER: (
            Verdict.CONFLICT,
            "the file has neither the before-hash nor the after-hash",
        ),
    }
)
"""What an in-flight row's file holds → the verdict and its reason."""


def _file_holds(row: JournalRow, current_hash: str | None, unreadable: str | None) -> _FileHolds:
    if unreadable is not None:
        return _FileHolds.UNREADABLE
    if current_hash == row.after_hash:
        return _FileHolds.AFTER
    if current_hash == row.before_hash:
        return _FileHolds.BEFORE_ABSENT if current_hash is None else _FileHolds.BEFORE
    return _FileHolds.NEITHER


def reconcile_file(
    row: JournalRow | None,
    current_hash: str | None,
    *,
    unreadable: str | None = None,
    path: str | None = None,
) -> FileVerdict:
    """Decide what happened to a journaled file change (see the module's first table).

    ``current_hash`` is the file's content hash now (``None``: it does not exist);
    ``unreadable`` — instead — says why it could not be hashed (a conflict for a started
    change). ``path`` names the file when there is no row (kept in the verdict's evidence).
    """
    if row is None:
        why = _NO_RECORD_REASON
        if unreadable is not None:
            why = f"{why}; the file could not be checked: {unreadable}"
        return FileVerdict(Verdict.NO_RECORD, None, current_hash, why, path=path)
    decided = _BY_STATUS[row.status]
    if decided is not None:
        return FileVerdict(decided[0], row, current_hash, decided[1])
    holds = _file_holds(row, current_hash, unreadable)
    verdict, reason = _BY_FILE[holds]
    if holds is _FileHolds.UNREADABLE:
        return FileVerdict(verdict, row, None, reason.format(unreadable=unreadable))
    return FileVerdict(verdict, row, current_hash, reason)


# =========================================================================== recovery decisions


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


EVIDENCE_UNKNOWN: Final = "evidenceUnknown"
"""The verdict of a call whose session's effects database is missing or replaced."""


@record(slots=True)
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


@record(slots=True)
class RecoveryDecision:
    """What to do with a pending call; ``content``/``is_error`` exactly for COMPLETE.

    Also the planner's observation of a started call (:class:`tether.core.plans.Observations`).
    """

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

    @property
    def review_reason(self) -> str:
        """The reason as a person reads it while blocked: with the review item's id."""
        where = f" (review item {self.review_item})" if self.review_item is not None else ""
        return f"{self.reason}{where}"

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


_SPEC: Final = RecoveryDecision(RecoveryAction.SPEC, "noObservation")


# --------------------------------------------------------------------------- by review

_BY_REVIEW: Final[Mapping[ReviewDecision, RecoveryAction]] = MappingProxyType(
    {
        ReviewDecision.APPLIED: RecoveryAction.COMPLETE,
        ReviewDecision.NOT_APPLIED: RecoveryAction.COMPLETE,
        ReviewDecision.ABORT: RecoveryAction.ABORT,
    }
)
"""A resolved review's decision → the action (an open item: REVIEW)."""


def _from_review(item: ReviewItem, row: JournalRow | None) -> RecoveryDecision:
    if item.is_open or item.decision is None:
        return RecoveryDecision(
            RecoveryAction.REVIEW,
            "reviewOpen",
            reason=item.reason,
            evidence=dict(item.evidence),
            review_item=item.id,
        )
    evidence = {"reviewItem": item.id, "decision": item.decision, "note": item.note}
    verdict = f"review:{item.decision.value}"
    action = _BY_REVIEW[item.decision]
    if action is RecoveryAction.ABORT:
        return RecoveryDecision(action, verdict, evidence=evidence, review_item=item.id)
    return RecoveryDecision(
        action,
        verdict,
        content=review_result_text(item.decision, item.note, row),
        is_error=item.decision is ReviewDecision.NOT_APPLIED,
        evidence=evidence,
        review_item=item.id,
    )


# --------------------------------------------------------------------------- by file verdict


def _file_complete(verdict: FileVerdict, row: JournalRow) -> RecoveryDecision:
    if verdict.verdict is Verdict.APPLIED:
        content, is_error = reconciled_text(row), False
    else:  # FAILED: the recorded error result (a row without one: the stale text)
        content = row.result or stale_text(row.path)
        is_error = row.result_is_error or row.result is None
    return RecoveryDecision(
        RecoveryAction.COMPLETE,
        verdict.verdict.value,
        content=content,
        is_error=is_error,
        reason=verdict.reason,
        evidence=verdict.evidence(),
    )


def _file_no_record(verdict: FileVerdict) -> RecoveryDecision:
    # The intent is durable before toolStarted: a started call without a row lost its
    # evidence. Planning it afresh could apply the change a second time.
    what = verdict.path if verdict.path is not None else "the file"
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        Verdict.NO_RECORD.value,
        reason=(
            f"the journal has no record of this call although its intent is recorded "
            f"before it starts: the record was lost (was .tether/effects.db deleted or "
            f"replaced?), so whether it changed {what} is unknown; nothing was written"
        ),
        evidence={**verdict.evidence(), "missing": "journalRow"},
    )


def _file_conflict(verdict: FileVerdict) -> RecoveryDecision:
    path = verdict.row.path if verdict.row is not None else "the file"
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        Verdict.CONFLICT.value,
        reason=(
            f"{path} has neither the content the change was planned against nor the content "
            f"it would produce ({verdict.reason}); nothing was overwritten"
        ),
        evidence=verdict.evidence(),
    )


_BY_FILE_VERDICT: Final[Mapping[Verdict, RecoveryAction]] = MappingProxyType(
    {
        Verdict.APPLIED: RecoveryAction.COMPLETE,
        Verdict.FAILED: RecoveryAction.COMPLETE,
        Verdict.NOT_APPLIED: RecoveryAction.EXECUTE,
        Verdict.NO_RECORD: RecoveryAction.REVIEW,
        Verdict.CONFLICT: RecoveryAction.REVIEW,
    }
)
"""A file verdict → the action."""


def _from_file(verdict: FileVerdict) -> RecoveryDecision:
    action = _BY_FILE_VERDICT[verdict.verdict]
    if action is RecoveryAction.COMPLETE:
        if verdict.row is None:  # only NO_RECORD comes without a row: treat as a conflict
            return _file_conflict(verdict)
        return _file_complete(verdict, verdict.row)
    if action is RecoveryAction.EXECUTE:
        return RecoveryDecision(
            action, verdict.verdict.value, reason=verdict.reason, evidence=verdict.evidence()
        )
    if verdict.verdict is Verdict.NO_RECORD:
        return _file_no_record(verdict)
    return _file_conflict(verdict)


# --------------------------------------------------------------------------- by lookup

_BY_LOOKUP: Final[Mapping[LookupStatus, tuple[RecoveryAction, str]]] = MappingProxyType(
    {
        LookupStatus.COMMITTED: (RecoveryAction.COMPLETE, "the service committed the operation"),
        LookupStatus.NOT_FOUND: (
            RecoveryAction.EXECUTE,
            "the service has no record of the operation",
        ),
        LookupStatus.UNKNOWABLE: (
            RecoveryAction.REVIEW,
            "the outcome cannot be established: {reason}",
        ),
    }
)
"""A lookup's status → the action and its reason."""


def _from_lookup(lookup: LookupResult) -> RecoveryDecision:
    evidence: dict[str, Any] = {"lookup": lookup.to_json()}
    action, reason = _BY_LOOKUP[lookup.status]
    if action is RecoveryAction.COMPLETE and lookup.result is not None:
        return RecoveryDecision(
            action,
            lookup.status.value,
            content=lookup.result.content,
            is_error=lookup.result.is_error,
            recovered_from_ledger=True,
            reason=reason,
            evidence={**evidence, "recoveredFromLedger": True},
        )
    if action is RecoveryAction.EXECUTE:
        return RecoveryDecision(action, lookup.status.value, reason=reason, evidence=evidence)
    _, unknowable = _BY_LOOKUP[LookupStatus.UNKNOWABLE]
    return RecoveryDecision(
        RecoveryAction.REVIEW,
        LookupStatus.UNKNOWABLE.value,
        reason=unknowable.format(reason=lookup.reason),
        evidence=evidence,
    )


# --------------------------------------------------------------------------- unknown evidence


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


# --------------------------------------------------------------------------- precedence


def _by_review(observation: PendingObservation) -> RecoveryDecision | None:
    if observation.review is None:
        return None
    row = observation.file.row if observation.file is not None else None
    return _from_review(observation.review, row)


def _by_unknown_evidence(observation: PendingObservation) -> RecoveryDecision | None:
    return _from_unknown(observation) if observation.evidence_unknown else None


def _by_file(observation: PendingObservation) -> RecoveryDecision | None:
    return _from_file(observation.file) if observation.file is not None else None


def _by_lookup(observation: PendingObservation) -> RecoveryDecision | None:
    return _from_lookup(observation.lookup) if observation.lookup is not None else None


_PRECEDENCE: Final[tuple[Callable[[PendingObservation], RecoveryDecision | None], ...]] = (
    _by_review,  # a review item, open or resolved: a person's decision stands
    _by_unknown_evidence,  # the session's database is missing or replaced
    _by_file,  # the journal row and the file
    _by_lookup,  # the service's answer
)
"""The sources of a decision, strongest first; the first that applies decides."""


def decision_for_review(item: ReviewItem, row: JournalRow | None = None) -> RecoveryDecision:
    """What a review item implies: REVIEW while open; else COMPLETE with the result text of
    ``applied``/``notApplied`` (``row``: the journal row, for the file tools' text), or
    ABORT. What ``tether review resolve`` appends right after recording the decision."""
    return _from_review(item, row)


def decide_pending(observation: PendingObservation | None) -> RecoveryDecision:
    """The recovery decision for one pending call (see the module's second table).

    A review item, open or resolved, takes precedence over everything else; then unknown
    evidence (the session's database is missing or replaced); then the file verdict; then
    the lookup. No observation → SPEC (behave exactly as the spec).
    """
    if observation is None:
        return _SPEC
    for source in _PRECEDENCE:
        decision = source(observation)
        if decision is not None:
            return decision
    return _SPEC
