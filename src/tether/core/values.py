"""The value types the pure decisions take and give: frozen data, no I/O.

The shell produces these values (a tool runs and returns a :class:`ToolResult`, a service
answers a lookup with a :class:`LookupResult`, the workspace database reads back a
:class:`JournalRow`, a :class:`ReviewItem`, a :class:`Verification`, the artifact scanner
hashes the workspace into an :class:`ArtifactVersion`) and the core decides on them
(:mod:`tether.core.reconcile`, :mod:`tether.core.gate`). They live here so that a decision
can be imported, tested and reasoned about without the code that gathers its inputs; each
shell module that makes or stores one re-exports it under its old name. The values the
workspace database stores live here too (not beside their SQLite tables), so that the
database seam, its implementations and the effects and completion code share them without
importing each other.

Sections: times (:func:`format_ms`, :func:`format_duration`), tool results, effect lookups,
the action journal (rows, transitions, :class:`EvidenceCopy`), reviews, artifact versions,
verifications (and :class:`CheckOutcome`), decisions and failures, parked approvals,
evidence binding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, overload

from tether.core.canonical import arguments_digest, sha256_digest
from tether.core.records import field, record
from tether.core.toolresult import ToolResult

__all__ = [
    "BINDING_FORMAT",
    "BINDING_VERSION",
    "JOURNAL_TRANSITIONS",
    "ApprovalRequest",
    "ArtifactVersion",
    "Authorization",
    "BindingState",
    "CheckOutcome",
    "EvidenceCheck",
    "EvidenceCopy",
    "JournalRow",
    "JournalStatus",
    "LookupResult",
    "LookupStatus",
    "ReconciliationEntry",
    "ReviewDecision",
    "ReviewItem",
    "ReviewStatus",
    "SessionBinding",
    "ToolFailure",
    "ToolResult",
    "Verification",
    "VerificationStatus",
    "check_transition",
    "format_duration",
    "format_ms",
    "legacy_journal_digest",
    "verification_status",
]


# =========================================================================== times

_MS_PER_DAY: Final = 86_400_000


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """``(year, month, day)`` of the proleptic Gregorian calendar, ``days`` after
    1970-01-01 (H. Hinnant's ``civil_from_days``; exact for every integer)."""
    z = days + 719_468  # days since 0000-03-01
    era = z // 146_097
    doe = z - era * 146_097  # day of the 400-year era, 0 .. 146096
    yoe = (doe - doe // 1_460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)  # day of the March-based year
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


@overload
def format_ms(ms: int) -> str: ...
@overload
def format_ms(ms: None) -> None: ...
@overload
def format_ms(ms: int | None) -> str | None: ...
def format_ms(ms: int | None) -> str | None:
    """An epoch-millisecond time as ISO 8601 UTC text (``2024-05-01T12:00:00.000Z``).

    The one time formatter of tether (the timeline, the CLI and every table's ``to_json``
    use it). Integer arithmetic only, so it is pure (no clock, no time zone database) and
    exact; ``None`` stays ``None``; a time outside years 0-9999, which ISO 8601's four year
    digits cannot show, is the number itself (``"<ms> ms since the epoch"``).
    """
    if ms is None:
        return None
    days, rest = divmod(ms, _MS_PER_DAY)
    year, month, day = _civil_from_days(days)
    if not 0 <= year <= 9999:
        return f"{ms} ms since the epoch"
    seconds, milli = divmod(rest, 1000)
    hour, seconds = divmod(seconds, 3600)
    minute, second = divmod(seconds, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


def format_duration(ms: int) -> str:
    """A span of milliseconds for people: ``850 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 3 min``
    (the timeline's pauses, the show view's spans)."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min {ms % 60_000 // 1000} s"
    return f"{ms // 3_600_000} h {ms % 3_600_000 // 60_000} min"


# =========================================================================== tool results

# ToolResult lives in tether.core.toolresult (every tool module needs it, and building an
# agent needs no other value type here); it is re-exported above.


# =========================================================================== effect lookups


class LookupStatus(StrEnum):
    COMMITTED = "committed"
    NOT_FOUND = "notFound"
    UNKNOWABLE = "unknowable"


@record(slots=True)
class LookupResult:
    """A lookup's answer; build it with :meth:`committed`, :meth:`not_found`, :meth:`unknowable`.

    ``result`` is present exactly for ``committed``; ``reason`` says why for ``unknowable``.
    """

    status: LookupStatus
    result: ToolResult | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.status is LookupStatus.COMMITTED) != (self.result is not None):
            raise ValueError("a lookup result carries a ToolResult exactly when committed")
        if self.result is not None and not isinstance(self.result, ToolResult):
            raise TypeError(f"LookupResult.result must be a ToolResult, got {self.result!r}")

    @classmethod
    def committed(cls, result: ToolResult | str) -> LookupResult:
        """The service committed the operation; ``result`` is what the call returned."""
        return cls(
            LookupStatus.COMMITTED, ToolResult(result) if isinstance(result, str) else result
        )

    @classmethod
    def not_found(cls) -> LookupResult:
        """The service has no record of the operation: it never took effect."""
        return cls(LookupStatus.NOT_FOUND)

    @classmethod
    def unknowable(cls, reason: str) -> LookupResult:
        """The service cannot tell (or could not be asked)."""
        return cls(LookupStatus.UNKNOWABLE, reason=reason or "the lookup could not tell")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status.value}
        if self.result is not None:
            out["result"] = {"content": self.result.content, "isError": self.result.is_error}
        if self.reason:
            out["reason"] = self.reason
        return out


# =========================================================================== the journal


class JournalStatus(StrEnum):
    PROPOSED = "proposed"
    """Planned, not yet allowed to run (reserved for an approval step)."""
    AUTHORIZED = "authorized"
    """Planned and allowed to run, recorded before the call's ``toolStarted``; the file has
    not been touched."""
    STARTED = "started"
    """About to touch, or touching, the file; the outcome is not recorded."""
    SUCCEEDED = "succeeded"
    """The file holds the after-content, durably."""
    FAILED = "failed"
    """Finished without writing anything (stale content, path refused, I/O error before the
    rename); ``result`` is the error the model was (or is to be) given."""
    UNKNOWN = "unknown"
    """Something failed at a point where the file may or may not have changed."""

    @property
    def terminal(self) -> bool:
        return self in (JournalStatus.SUCCEEDED, JournalStatus.FAILED)


_S = JournalStatus
JOURNAL_TRANSITIONS: Final[Mapping[JournalStatus, frozenset[JournalStatus]]] = MappingProxyType(
    {
        _S.PROPOSED: frozenset({_S.PROPOSED, _S.AUTHORIZED, _S.STARTED, _S.FAILED}),
        _S.AUTHORIZED: frozenset({_S.AUTHORIZED, _S.STARTED, _S.FAILED}),
        _S.STARTED: frozenset({_S.STARTED, _S.SUCCEEDED, _S.FAILED, _S.UNKNOWN}),
        _S.UNKNOWN: frozenset({_S.UNKNOWN, _S.STARTED, _S.SUCCEEDED, _S.FAILED}),
        _S.SUCCEEDED: frozenset({_S.SUCCEEDED}),
        _S.FAILED: frozenset({_S.FAILED}),
    }
)
"""status → the statuses a row may move to (a terminal status only to itself)."""


def legacy_journal_digest(tool_name: str, arguments: Mapping[str, Any]) -> str | None:
    """The ``arguments_digest`` journal rows were written with before tether had one
    arguments digest: ``sha256`` of ``json.dumps({"arguments", "tool"})`` with sorted keys,
    compact separators and raw UTF-8. Only read, to recognise the rows of existing
    databases; ``None`` for arguments that form never admitted (a non-finite number)."""
    try:
        text = json.dumps(
            {"arguments": dict(arguments), "tool": tool_name},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
    except ValueError:
        return None
    return sha256_digest(text.encode("utf-8", errors="surrogatepass"))


@record(slots=True)
class JournalRow:
    """One journal row (one journaled call)."""

    operation_id: str
    session_id: str
    tool_name: str
    path: str
    before_hash: str | None
    after_hash: str
    arguments_digest: str
    status: JournalStatus
    detail: str | None
    planned_result: str
    """The success text the call will report once applied (computed when planned)."""
    result: str | None
    """The result text recorded with a terminal status."""
    result_is_error: bool
    created_at_ms: int
    updated_at_ms: int

    def records_call(self, tool_name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether this row is the intent of a call of ``tool_name`` with ``arguments``.

        Rows hold :func:`~tether.core.canonical.arguments_digest` of the arguments, next to
        the tool's name (a row without a name, written by hand, matches any tool); rows of
        older databases hold :func:`legacy_journal_digest`, which covers the tool's name
        too, and are recognised by it.
        """
        if self.arguments_digest == arguments_digest(arguments):
            return not self.tool_name or self.tool_name == tool_name
        return self.arguments_digest == legacy_journal_digest(tool_name, arguments)

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "sessionId": self.session_id,
            "toolName": self.tool_name,
            "path": self.path,
            "beforeHash": self.before_hash,
            "afterHash": self.after_hash,
            "argumentsDigest": self.arguments_digest,
            "status": self.status.value,
            "detail": self.detail,
            "plannedResult": self.planned_result,
            "result": self.result,
            "resultIsError": self.result_is_error,
            "createdAt": format_ms(self.created_at_ms),
            "updatedAt": format_ms(self.updated_at_ms),
        }


def check_transition(operation_id: str, current: JournalStatus, new: JournalStatus) -> None:
    """:class:`ValueError` unless a row may go from ``current`` to ``new``
    (:data:`~tether.core.values.JOURNAL_TRANSITIONS`)."""
    if new not in JOURNAL_TRANSITIONS[current]:
        raise ValueError(
            f"journal row {operation_id}: cannot go from {current.value} to {new.value}"
        )


@record(slots=True)
class EvidenceCopy:
    """A copy of file content the action journal kept as evidence (table ``evidence``).

    Named apart from :class:`tether.core.timeline.Evidence` (what the workspace database
    knows about a session, for the timeline): a copy is one row, that is a whole view."""

    id: int
    operation_id: str
    kind: str
    path: str | None
    content_hash: str | None
    size: int | None
    truncated: bool
    content: bytes | None = field(repr=False)
    created_at_ms: int

    def to_json(self) -> dict[str, Any]:
        """Everything but the bytes (which may be large and binary)."""
        return {
            "id": self.id,
            "operationId": self.operation_id,
            "kind": self.kind,
            "path": self.path,
            "contentHash": self.content_hash,
            "size": self.size,
            "truncated": self.truncated,
            "createdAt": format_ms(self.created_at_ms),
        }


# =========================================================================== reviews


class ReviewDecision(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "notApplied"
    ABORT = "abort"


class ReviewStatus(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


@record(slots=True)
class ReviewItem:
    """One review item."""

    id: int
    session_id: str
    operation_id: str
    tool_name: str
    reason: str
    evidence: Mapping[str, Any] = field(repr=False)
    status: ReviewStatus
    decision: ReviewDecision | None
    note: str | None
    opened_at_ms: int
    resolved_at_ms: int | None

    @property
    def is_open(self) -> bool:
        return self.status is ReviewStatus.OPEN

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "operationId": self.operation_id,
            "toolName": self.tool_name,
            "reason": self.reason,
            "evidence": dict(self.evidence),
            "status": self.status.value,
            "decision": None if self.decision is None else self.decision.value,
            "note": self.note,
            "openedAt": format_ms(self.opened_at_ms),
            "resolvedAt": format_ms(self.resolved_at_ms),
        }


@record(slots=True)
class ReconciliationEntry:
    """One line of the reconciliation log."""

    id: int
    session_id: str
    operation_id: str
    tool_name: str
    verdict: str
    action: str
    evidence: Mapping[str, Any] = field(repr=False)
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "operationId": self.operation_id,
            "toolName": self.tool_name,
            "verdict": self.verdict,
            "action": self.action,
            "evidence": dict(self.evidence),
            "at": format_ms(self.at_ms),
        }


# =========================================================================== artifact versions


@record(eq=False)
class ArtifactVersion:
    """The content of a workspace: its digest and every file's digest.

    Two versions are equal when their digests and files are. ``files`` is a read-only
    mapping from relative POSIX path to ``"sha256:<hex>"``. Computing one (the scanner) and
    its manifest encoding (which depends on the file system's encoding of names) are the
    shell's: :mod:`tether._completion.artifact`.
    """

    digest: str
    files: Mapping[str, str]

    def __post_init__(self) -> None:
        if not isinstance(self.files, MappingProxyType):
            object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArtifactVersion):
            return NotImplemented
        return self.digest == other.digest and (
            self.files is other.files or self.files == other.files
        )

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"ArtifactVersion(digest={self.digest!r}, files=<{len(self.files)} files>)"

    def changed_since(self, earlier: ArtifactVersion) -> list[str]:
        """Sorted paths added, removed or modified between `earlier` and self."""
        if self is earlier:
            return []
        now, then = self.files, earlier.files
        changed = [p for p, d in now.items() if then.get(p) != d]
        changed.extend(p for p in then if p not in now)
        changed.sort()
        return changed


# =========================================================================== verifications


class VerificationStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    VOID = "void"
    ERROR = "error"


def verification_status(
    exit_status: int | None,
    timed_out: bool,
    error: str | None,
    version_start: str | None,
    version_end: str | None,
) -> VerificationStatus:
    """The status of a check run, from its facts alone:

    * ``error`` — the command could not be run, was cancelled, or a version could not be
      computed: nothing is known;
    * ``void`` — the files changed while the command ran: the result proves nothing about
      any version, even if the command exited 0;
    * ``failed`` — the command timed out or exited non-zero;
    * ``passed`` — it exited 0 and the workspace was the same version before and after.
    """
    if error is not None or version_start is None or version_end is None:
        return VerificationStatus.ERROR
    if version_start != version_end:
        return VerificationStatus.VOID
    if timed_out or exit_status != 0:
        return VerificationStatus.FAILED
    return VerificationStatus.PASSED


@record
class Verification:
    """One recorded run of the check command."""

    id: str
    session_id: str | None
    tool_started_id: str | None
    command: str
    exit_status: int | None
    timed_out: bool
    error: str | None
    output_digest: str
    output_tail: str
    version_start: str | None
    version_end: str | None
    started_at_ms: int
    duration_ms: int
    status: VerificationStatus

    @property
    def passed(self) -> bool:
        """Whether this run verifies its version (status ``passed``)."""
        return self.status is VerificationStatus.PASSED

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "toolStartedId": self.tool_started_id,
            "command": self.command,
            "exitStatus": self.exit_status,
            "timedOut": self.timed_out,
            "error": self.error,
            "outputDigest": self.output_digest,
            "outputTail": self.output_tail,
            "versionStart": self.version_start,
            "versionEnd": self.version_end,
            "startedAtMs": self.started_at_ms,
            "startedAt": format_ms(self.started_at_ms),
            "durationMs": self.duration_ms,
            "status": self.status.value,
        }


@record
class CheckOutcome:
    """What one run of the check command showed (see :func:`run_check`)."""

    command: str
    exit_status: int | None
    timed_out: bool
    error: str | None
    output_digest: str
    output_tail: str
    version_start: str | None
    version_end: str | None
    started_at_ms: int
    duration_ms: int

    @property
    def status(self) -> VerificationStatus:
        return verification_status(
            self.exit_status, self.timed_out, self.error, self.version_start, self.version_end
        )


# =========================================================================== decisions, failures


@record
class Authorization:
    """One recorded decision on one tool call."""

    id: int
    session_id: str
    call_key: str
    tool_name: str
    arguments_digest: str
    summary: str
    decision: str
    who: str
    rule: str
    reason: str | None
    decided_at_ms: int

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "callKey": self.call_key,
            "toolName": self.tool_name,
            "argumentsDigest": self.arguments_digest,
            "summary": self.summary,
            "decision": self.decision,
            "who": self.who,
            "rule": self.rule,
            "reason": self.reason,
            "decidedAtMs": self.decided_at_ms,
            "decidedAt": format_ms(self.decided_at_ms),
        }


@record
class ToolFailure:
    """One failed tool call."""

    tool_started_id: str
    session_id: str
    tool_name: str
    arguments_digest: str
    artifact_version: str | None
    at_ms: int
    result_entry_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "toolStartedId": self.tool_started_id,
            "sessionId": self.session_id,
            "toolName": self.tool_name,
            "argumentsDigest": self.arguments_digest,
            "artifactVersion": self.artifact_version,
            "atMs": self.at_ms,
            "at": format_ms(self.at_ms),
            "resultEntryId": self.result_entry_id,
        }


# =========================================================================== parked approvals


@record
class ApprovalRequest:
    """One parked call and what was decided about it."""

    id: int
    session_id: str
    call_key: str
    tool_name: str
    arguments: dict[str, Any]
    arguments_digest: str
    artifact_version: str | None
    touched: dict[str, str | None]
    """The files the call touches and their content hash when it was proposed (``None``: it
    did not exist); empty when the call's files are unknown (then ``artifact_version``)."""
    summary: str
    rule: str
    status: str
    always: bool
    decided_by: str | None
    reason: str | None
    proposed_at_ms: int
    decided_at_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sessionId": self.session_id,
            "callKey": self.call_key,
            "toolName": self.tool_name,
            "arguments": self.arguments,
            "argumentsDigest": self.arguments_digest,
            "artifactVersion": self.artifact_version,
            "touched": self.touched,
            "summary": self.summary,
            "rule": self.rule,
            "status": self.status,
            "always": self.always,
            "decidedBy": self.decided_by,
            "reason": self.reason,
            "proposedAt": format_ms(self.proposed_at_ms),
            "decidedAt": format_ms(self.decided_at_ms) if self.decided_at_ms else None,
        }


# =========================================================================== evidence binding

BINDING_FORMAT: Final = "tether.evidence-binding"
"""``format`` of a session's evidence sidecar (see :mod:`tether._effects.binding`)."""
BINDING_VERSION: Final = 1


class BindingState(StrEnum):
    UNBOUND = "unbound"
    """The session has recorded no evidence yet (or was written by an older tether)."""
    BOUND = "bound"
    """The database is the one the session recorded, and it names the session."""
    MISSING = "missing"
    """The session recorded a database, and there was none: it was deleted or moved away."""
    REPLACED = "replaced"
    """The database has another identity than the one the session recorded."""
    NOT_NAMED = "notNamed"
    """The right identity, but the database does not name the session: a copy from before
    the session's first evidence (an old backup)."""
    UNREADABLE = "unreadable"
    """The session's sidecar cannot be read: which database it used is not known."""

    @property
    def known(self) -> bool:
        """Whether the absence of a record in the database can be trusted."""
        return self in (BindingState.UNBOUND, BindingState.BOUND)


@record(slots=True)
class SessionBinding:
    """The sidecar's content: the database that holds the session's evidence."""

    session_id: str
    effects_db: str
    database: str
    bound_at_ms: int
    replaced: tuple[dict[str, Any], ...] = ()
    """Databases the session used before (each ``{"effectsDb", "state", "reboundAt"}``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": BINDING_FORMAT,
            "version": BINDING_VERSION,
            "sessionId": self.session_id,
            "effectsDb": self.effects_db,
            "database": self.database,
            "boundAt": self.bound_at_ms,
            "replaced": [dict(item) for item in self.replaced],
        }

    @classmethod
    def from_json(cls, value: Any, session_id: str) -> SessionBinding:
        """Parse a sidecar; :class:`ValueError` with the reason when it is not one."""
        if not isinstance(value, dict) or value.get("format") != BINDING_FORMAT:
            raise ValueError("it is not a tether evidence record")
        if value.get("version") != BINDING_VERSION:
            raise ValueError(f"unknown version {value.get('version')!r}")
        if value.get("sessionId") != session_id:
            raise ValueError(f"it names session {value.get('sessionId')!r}")
        effects_db, database, bound = (value.get(k) for k in ("effectsDb", "database", "boundAt"))
        replaced = value.get("replaced", [])
        if not isinstance(effects_db, str) or not effects_db:
            raise ValueError("it names no database identity")
        if not isinstance(database, str) or isinstance(bound, bool) or not isinstance(bound, int):
            raise ValueError("its database path or binding time is malformed")
        if not isinstance(replaced, list) or not all(isinstance(r, dict) for r in replaced):
            raise ValueError("its history of replaced databases is malformed")
        return cls(session_id, effects_db, database, bound, tuple(replaced))


@record(slots=True)
class EvidenceCheck:
    """Whether a database is the one holding a session's evidence (see
    :func:`tether.core.reconcile.judge_binding`)."""

    state: BindingState
    session_id: str
    database: str
    """The path of the database that was checked."""
    expected_db: str | None
    """The identity the session recorded (``None``: none, or unreadable)."""
    found_db: str | None
    """The identity of the database now."""
    reason: str
    recorded: SessionBinding | None = field(default=None, repr=False)

    @property
    def known(self) -> bool:
        return self.state.known

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "sessionId": self.session_id,
            "database": self.database,
            "expectedDb": self.expected_db,
            "foundDb": self.found_db,
            "reason": self.reason,
        }
