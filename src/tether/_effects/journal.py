"""The action journal of file-change tools (table ``journal`` of ``effects.db``).

The journal serves every tool that declares the recovery kind ``journaledFileChange``
(:class:`~tether._tools.builtin.FileChangeTool`: the built-in ``write`` and ``edit``). It
knows nothing of a particular tool: the tool plans the change
(:meth:`~tether._tools.builtin.FileChangeTool.plan_change`) and says what its result reads
(``result_text``, ``result_metadata``); the journal records, applies and reconciles.

Before a file tool touches a file, the intent is made durable: session, operation id (the
``toolStarted`` fact id), path, the content hash the change was planned against
(``before_hash``, ``None`` = the file did not exist), the hash it will produce
(``after_hash``), the tool's name and the digest of its arguments
(:func:`~tether.core.canonical.arguments_digest`; rows of older databases hold a digest of
both, still recognised: :meth:`~tether.core.values.JournalRow.records_call`), and a
status. Then the change is applied with compare-and-swap
(:func:`tether._tools.builtin.apply_change`: temp file in the same directory, fsync,
``os.replace``, directory fsync) and the row is marked ``succeeded``.

The executor records the intent *before* it commits the call's ``toolStarted``
(:func:`prepare_journaled`, status ``authorized``), and marks it ``started`` right before
applying (:func:`run_prepared`). So every started call has its row, and a started call
without one means the evidence was lost (a deleted or replaced ``effects.db``), never that
the file was untouched.

After a crash, :func:`~tether.core.reconcile.reconcile_file` (pure, in the core, with its
table of verdicts; re-exported here) compares the row with the file's current hash, which
:func:`observe_file` reads.

Crash boundaries of this module (see :mod:`tether._faults`): ``journal.intent_prepared``
(intent durable as ``authorized``, ``toolStarted`` not committed, file untouched),
``journal.intent_recorded`` (intent durable as ``started``, file untouched) and
``journal.change_applied`` (file replaced and directory fsynced, journal still
``started``). Inside :func:`apply_change` the tools module has
``tools.apply.before_replace`` (temp file written and fsynced) and
``tools.apply.after_replace`` (renamed, directory not yet fsynced).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast

import tether._faults as faults
from tether._tools.base import RecoveryKind, Tool, ToolResult
from tether._tools.builtin import (
    ApplyOutcome,
    FileChange,
    FileChangePlanner,
    PlannedChange,
    apply_change,
    builtin_file_tool,
    current_hash,
)
from tether._tools.workspace import (
    ProtectedState,
    describe_os_error,
    open_parent,
    open_regular_file,
    stat_entry,
)
from tether._wsdb.protocol import JournalTable
from tether._wsdb.rules import check_same_call, check_session
from tether._wsdb.sqlite_journal import ActionJournal
from tether.core.canonical import arguments_digest, hasher_digest
from tether.core.reconcile import FileVerdict, Verdict, reconcile_file, reconciled_text, stale_text
from tether.core.records import field, record
from tether.core.values import EvidenceCopy, JournalRow, JournalStatus, check_transition
from tether.errors import EffectsDatabaseError, OperationIdConflict, StaleFileChange, ToolError

__all__ = [
    "CHANGE_APPLIED",
    "EVIDENCE_MAX_BYTES",
    "INTENT_PREPARED",
    "INTENT_RECORDED",
    "ActionJournal",
    "EvidenceCopy",
    "FileVerdict",
    "JournalRow",
    "JournalStatus",
    "PreparedChange",
    "Verdict",
    "arguments_digest",
    "check_same_call",
    "check_transition",
    "is_journaled",
    "journaled_edit",
    "journaled_resume",
    "journaled_run",
    "journaled_write",
    "observe_file",
    "prepare_journaled",
    "reconcile_file",
    "reconciled_text",
    "remove_orphan_temp_files",
    "run_prepared",
    "stale_text",
]

INTENT_PREPARED = faults.register(
    "journal.intent_prepared",
    "journaled write/edit: planned change durable in effects.db (status authorized); "
    "toolStarted not committed, file untouched",
)
INTENT_RECORDED = faults.register(
    "journal.intent_recorded",
    "journaled write/edit: intent durable in effects.db (status started), file untouched",
)
CHANGE_APPLIED = faults.register(
    "journal.change_applied",
    "journaled write/edit: file replaced and directory fsynced, journal not yet 'succeeded'",
)

EVIDENCE_MAX_BYTES: Final = 16 * 1024 * 1024
"""Largest content copy kept as evidence; longer files keep their first bytes (``truncated``)."""

_CHUNK: Final = 64 * 1024


def _check_call(
    row: JournalRow, session_id: str, tool_name: str, arguments: Mapping[str, Any], where: str
) -> None:
    """The row of an operation id is this call (rows of older databases included, see
    :meth:`~tether.core.values.JournalRow.records_call`), else a conflict."""
    check_session(row, session_id, where)
    if not row.records_call(tool_name, arguments):
        given = arguments_digest(arguments)
        if row.tool_name and row.tool_name != tool_name:
            raise OperationIdConflict(
                row.operation_id, f"tool {row.tool_name}", f"tool {tool_name}", where
            )
        raise OperationIdConflict(row.operation_id, row.arguments_digest, given, where)


# =========================================================================== reconcile


_IN_FLIGHT: Final = frozenset({JournalStatus.STARTED, JournalStatus.UNKNOWN})
"""Statuses in which the file may have been touched without the outcome being recorded."""


def _snapshot(workspace: Path, relative: str) -> tuple[str | None, bytes | None, int, bool]:
    """``(hash, first bytes, size, truncated)`` of the file now, read once; hash ``None``
    (and no bytes) when it does not exist."""
    try:
        with open_parent(workspace, relative, create=False) as parent:
            if stat_entry(parent) is None:
                return None, None, 0, False
            fd = open_regular_file(parent)
    except FileNotFoundError:
        return None, None, 0, False
    hasher = hashlib.sha256()
    kept = bytearray()
    size = 0
    try:
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
            room = EVIDENCE_MAX_BYTES - len(kept)
            if room > 0:
                kept += chunk[:room]
    finally:
        os.close(fd)
    return hasher_digest(hasher), bytes(kept), size, size > len(kept)


def observe_file(
    workspace: Path,
    journal: JournalTable,
    operation_id: str,
    *,
    keep_evidence: bool = True,
    path: str | None = None,
) -> FileVerdict:
    """Gather the evidence for one pending journaled call and reconcile it (I/O).

    Reads the journal row and the file's current content (once). On a conflict a copy of
    the current content is stored as evidence (``FileVerdict.evidence_id``). ``path`` (the
    call's argument) is hashed when there is no row, for the review's evidence.
    """
    row = journal.get(operation_id)
    if row is None:
        return _observe_unrecorded(workspace, path)
    if row.status not in _IN_FLIGHT:
        try:
            now: str | None = current_hash(workspace, row.path)
        except (ToolError, OSError):
            now = None
        return reconcile_file(row, now)
    try:
        digest, data, size, truncated = _snapshot(workspace, row.path)
    except (ToolError, OSError) as exc:
        verdict = reconcile_file(row, None, unreadable=str(exc))
        if keep_evidence:
            evidence_id = journal.keep_evidence(
                operation_id, "unreadable", path=row.path, content=None, content_hash=None
            )
            verdict = FileVerdict(
                verdict.verdict, row, None, verdict.reason, evidence_id=evidence_id
            )
        return verdict
    verdict = reconcile_file(row, digest)
    if verdict.verdict is Verdict.CONFLICT and keep_evidence:
        evidence_id = journal.keep_evidence(
            operation_id,
            "conflict" if digest is not None else "conflict-absent",
            path=row.path,
            content=data,
            content_hash=digest,
            size=size,
            truncated=truncated,
        )
        verdict = FileVerdict(verdict.verdict, row, digest, verdict.reason, evidence_id=evidence_id)
    return verdict


def _observe_unrecorded(workspace: Path, path: str | None) -> FileVerdict:
    """The ``NO_RECORD`` verdict, with the file's current hash when it can be read."""
    if path is None:
        return reconcile_file(None, None)
    try:
        return reconcile_file(None, current_hash(workspace, path), path=path)
    except (ToolError, OSError) as exc:
        return reconcile_file(None, None, unreadable=str(exc), path=path)


def hash_for_evidence(workspace: Path, path: object) -> tuple[str | None, str | None]:
    """``(current hash, None)`` of a call's file, or ``(None, why)`` when it cannot be read."""
    if not isinstance(path, str):
        return None, "the call names no file"
    try:
        return current_hash(workspace, path), None
    except (ToolError, OSError) as exc:
        return None, str(exc)


# =========================================================================== run


_TEMP_PATTERN: Final = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tether-tmp")


def remove_orphan_temp_files(workspace: Path, relative: str) -> list[str]:
    """Delete temp files an interrupted :func:`apply_change` left next to ``relative``.

    A crash between writing the temp file and the rename leaves
    ``.<name>.<12 hex>.tether-tmp`` in the target's directory. Only names of that exact
    form for this target are removed (regular files, never followed links). Returns the
    removed names. Call it only while no other writer is changing that file.
    """
    removed: list[str] = []
    try:
        with open_parent(workspace, relative, create=False) as parent:
            prefix = parent.name[:200]
            for entry in os.listdir(parent.fd):
                match = _TEMP_PATTERN.fullmatch(entry)
                if match is None or match.group("name") != prefix:
                    continue
                try:
                    info = os.stat(entry, dir_fd=parent.fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        os.unlink(entry, dir_fd=parent.fd)
                        removed.append(entry)
                except OSError:
                    continue
            if removed:
                os.fsync(parent.fd)
    except (ToolError, OSError):
        return removed
    return removed


def is_journaled(tool: Tool) -> bool:
    """Whether calls of ``tool`` go through the journal (it declares ``journaledFileChange``)."""
    return tool.recovery is RecoveryKind.JOURNALED


JournaledTool = Tool | str
"""A tool that declares ``journaledFileChange`` (e.g. a
:class:`~tether._tools.builtin.FileChangeTool`), or the name of a built-in one (``write``,
``edit``)."""


def _file_tool(tool: JournaledTool) -> FileChangePlanner:
    """The tool as the planner its declaration promises (checked when it was built:
    :class:`~tether._tools.base.Tool` requires ``plan_change`` and the result texts)."""
    if isinstance(tool, str):
        return builtin_file_tool(tool)
    if not is_journaled(tool):
        raise ValueError(f"not a journaled tool: {tool.name!r}")
    return cast(FileChangePlanner, tool)


def _tool_error(exc: Exception, path: object) -> ToolResult:
    if isinstance(exc, ToolError):
        return ToolResult.error(f"Error: {exc}")
    if isinstance(exc, OSError):
        return ToolResult.error(f"Error: {describe_os_error(str(path), exc)}")
    raise exc


def _plan(
    tool: FileChangePlanner,
    workspace: Path,
    arguments: Mapping[str, Any],
    protected: ProtectedState | None = None,
) -> PlannedChange:
    return tool.plan_change(workspace, arguments, protected=protected)


def _metadata(
    tool: FileChangePlanner, planned: PlannedChange, outcome: ApplyOutcome, operation_id: str
) -> dict[str, Any]:
    return {
        **tool.result_metadata(planned, outcome),
        "operation_id": operation_id,
        "journaled": True,
    }


def _row_metadata(row: JournalRow, outcome: str) -> dict[str, Any]:
    return {
        "path": row.path,
        "before_hash": row.before_hash,
        "after_hash": row.after_hash,
        "bytes_written": 0,
        "outcome": outcome,
        "operation_id": row.operation_id,
        "journaled": True,
    }


@record(slots=True)
class PreparedChange:
    """A journaled call planned and recorded before its ``toolStarted`` is committed.

    Made by :func:`prepare_journaled`, carried out by :func:`run_prepared`. ``planned`` is
    the tool's :class:`~tether._tools.builtin.PlannedChange` (its bytes stay in memory, the
    row keeps the hashes); ``error`` the error result of a call that could not be planned
    (its row is ``failed`` with that result, so recovery gives the model the same text).
    """

    tool: FileChangePlanner
    row: JournalRow
    arguments: Mapping[str, Any] = field(repr=False)
    planned: PlannedChange | None = field(default=None, repr=False)
    error: ToolResult | None = None

    @property
    def tool_name(self) -> str:
        return self.tool.name

    @property
    def change(self) -> FileChange | None:
        return self.planned.change if self.planned is not None else None


def _raw_path(arguments: Mapping[str, Any]) -> str:
    path = arguments.get("path")
    if not isinstance(path, str):
        return ""
    # A path that is not valid UTF-8 (refused by the planning) is still recorded on its
    # failed row: escaped, since SQLite text cannot hold a lone surrogate.
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def prepare_journaled(
    tool: JournaledTool,
    workspace: Path,
    journal: JournalTable,
    session_id: str,
    operation_id: str,
    arguments: Mapping[str, Any],
    *,
    protected: ProtectedState | None = None,
) -> PreparedChange:
    """Plan the change and record its intent durably, before ``toolStarted`` (step 1 of 2).

    The row is ``authorized`` (planned, allowed, the file untouched; boundary
    ``journal.intent_prepared`` right after). A planning error (bad path, text not found,
    …) records the row ``failed`` with the error result the model is to receive. An
    operation id already recorded (same session and arguments) is returned as it is;
    otherwise :class:`~tether.errors.OperationIdConflict`. Nothing touches the file.
    """
    file_tool = _file_tool(tool)
    existing = journal.get(operation_id)
    if existing is not None:
        _check_call(existing, session_id, file_tool.name, arguments, journal.location)
        return PreparedChange(file_tool, existing, arguments)
    digest = arguments_digest(arguments)
    try:
        planned = _plan(file_tool, workspace, arguments, protected)
    except (ToolError, OSError) as exc:
        error = _tool_error(exc, arguments.get("path"))
        row, created = journal.insert(
            session_id,
            operation_id,
            _raw_path(arguments),
            None,
            "",
            digest,
            tool_name=file_tool.name,
            planned_result="",
            status=JournalStatus.FAILED,
            result=error.content,
            detail="the change could not be planned; nothing was written",
        )
        faults.hit(INTENT_PREPARED)
        return PreparedChange(file_tool, row, arguments, error=error if created else None)
    row, created = _record_change(
        journal,
        workspace,
        session_id,
        operation_id,
        file_tool,
        digest,
        planned,
        JournalStatus.AUTHORIZED,
    )
    faults.hit(INTENT_PREPARED)
    if not created:  # recorded concurrently by someone else: reconcile like a resume
        return PreparedChange(file_tool, row, arguments)
    return PreparedChange(file_tool, row, arguments, planned)


def run_prepared(
    workspace: Path,
    journal: JournalTable,
    prepared: PreparedChange,
    *,
    protected: ProtectedState | None = None,
) -> ToolResult:
    """Carry out a prepared call once its ``toolStarted`` is durable (step 2 of 2).

    A call that could not be planned returns its recorded error result. Otherwise the row is
    marked ``started`` (boundary ``journal.intent_recorded``: the file is still untouched)
    and the change applied under compare-and-swap, as in :func:`journaled_run`. A row that
    was already there when it was prepared is reconciled like a resume.
    """
    if prepared.error is not None:
        return prepared.error
    row = prepared.row
    if prepared.planned is None:
        return _resume(prepared.tool, workspace, journal, row, prepared.arguments, protected)
    row = journal.mark(row.operation_id, JournalStatus.STARTED, "starting")
    faults.hit(INTENT_RECORDED)
    return _apply(prepared.tool, workspace, journal, row, prepared.planned, protected)


def _record_change(
    journal: JournalTable,
    workspace: Path,
    session_id: str,
    operation_id: str,
    tool: FileChangePlanner,
    digest: str,
    planned: PlannedChange,
    status: JournalStatus,
) -> tuple[JournalRow, bool]:
    """Record the intent of a planned change with the success text it will report, and
    the file's content before it (what ``tether rewind`` restores, :func:`_before_content`)."""
    change = planned.change
    outcome = (
        ApplyOutcome.ALREADY_APPLIED
        if change.before_hash == change.after_hash
        else ApplyOutcome.APPLIED
    )
    return journal.insert(
        session_id,
        operation_id,
        change.path,
        change.before_hash,
        change.after_hash,
        digest,
        tool_name=tool.name,
        planned_result=tool.result_text(planned, outcome),
        status=status,
        before_content=_before_content(workspace, change),
    )


def _before_content(workspace: Path, change: FileChange) -> bytes | None:
    """The file's bytes as the change was planned against them, kept with the intent (in
    the same transaction) so that ``tether rewind`` can restore them; ``None`` for a new
    file, a file over :data:`EVIDENCE_MAX_BYTES` (a rewind then lists it as not
    restorable, never restores a part) or one that changed since it was planned."""
    if change.before_hash is None or change.before_hash == change.after_hash:
        return None
    try:
        digest, data, _size, truncated = _snapshot(workspace, change.path)
    except (ToolError, OSError):
        return None
    if digest != change.before_hash or truncated:
        return None
    return data


def journaled_run(
    tool: JournaledTool,
    workspace: Path,
    journal: JournalTable,
    session_id: str,
    operation_id: str,
    arguments: Mapping[str, Any],
    *,
    protected: ProtectedState | None = None,
) -> ToolResult:
    """Run a file-change tool (or the built-in ``write``/``edit`` by name) through the
    journal in one go; the same result texts as the tool (the executor splits this into
    :func:`prepare_journaled` before ``toolStarted`` and :func:`run_prepared` after it).

    ``protected`` is tether's own state the change must never touch (the agent's
    layout; default that of :meth:`~tether._tools.workspace.ProtectedState.for_workspace`):
    such a path is a planning error, refused before anything is recorded.

    1. Plan the change (read only). A planning error (bad path, text not found, …) is an
       error result and records nothing.
    2. Record the intent (status ``started``; boundary ``journal.intent_recorded``).
    3. Apply with compare-and-swap. Stale content → error result
       ``"Error: <path> changed since it was read; read it again."``, nothing written, row
       ``failed``.
    4. Mark ``succeeded`` (boundary ``journal.change_applied`` just before).

    Calling it again with the same ``operation_id`` (re-execution after a crash) never
    applies the change twice: a ``succeeded`` row gives the reconciled success text, a
    ``failed`` row its recorded error, and a started row is reconciled against the file
    first (applied → success; before-content → applied once; other content → the stale
    error, nothing written). The same ``operation_id`` with other arguments or another
    session raises :class:`~tether.errors.OperationIdConflict`.
    """
    file_tool = _file_tool(tool)
    existing = journal.get(operation_id)
    if existing is not None:
        _check_call(existing, session_id, file_tool.name, arguments, journal.location)
        return _resume(file_tool, workspace, journal, existing, arguments, protected)
    digest = arguments_digest(arguments)
    try:
        planned = _plan(file_tool, workspace, arguments, protected)
    except (ToolError, OSError) as exc:
        return _tool_error(exc, arguments.get("path"))
    row, created = _record_change(
        journal,
        workspace,
        session_id,
        operation_id,
        file_tool,
        digest,
        planned,
        JournalStatus.STARTED,
    )
    if not created:  # recorded concurrently by someone else: reconcile like a resume
        return _resume(file_tool, workspace, journal, row, arguments, protected)
    faults.hit(INTENT_RECORDED)
    return _apply(file_tool, workspace, journal, row, planned, protected)


def journaled_resume(
    tool: JournaledTool,
    workspace: Path,
    journal: JournalTable,
    session_id: str,
    operation_id: str,
    arguments: Mapping[str, Any],
    *,
    protected: ProtectedState | None = None,
) -> ToolResult | None:
    """Re-execute a started call from its recorded intent, never without it.

    Like :func:`journaled_run` for an operation id that has a row; ``None`` (the outcome is
    unknown, nothing was done) when there is none: the intent is recorded before
    ``toolStarted``, so a started call without a row lost its evidence, and planning it
    afresh could apply the change a second time.
    """
    file_tool = _file_tool(tool)
    existing = journal.get(operation_id)
    if existing is None:
        return None
    _check_call(existing, session_id, file_tool.name, arguments, journal.location)
    return _resume(file_tool, workspace, journal, existing, arguments, protected)


def _apply(
    tool: FileChangePlanner,
    workspace: Path,
    journal: JournalTable,
    row: JournalRow,
    planned: PlannedChange,
    protected: ProtectedState | None = None,
) -> ToolResult:
    op = row.operation_id
    change = planned.change
    try:
        outcome = apply_change(workspace, change, protected=protected)
    except StaleFileChange as exc:
        text = stale_text(change.path)
        problem = _settle(journal, op, JournalStatus.FAILED, str(exc), text, True)
        return ToolResult.error(
            text,
            path=change.path,
            expected_hash=exc.expected,
            found_hash=exc.found,
            operation_id=op,
            journaled=True,
            **problem,
        )
    except (ToolError, OSError) as exc:
        return _apply_failed(workspace, journal, row, change, exc)
    faults.hit(CHANGE_APPLIED)
    text = tool.result_text(planned, outcome)
    problem = _settle(journal, op, JournalStatus.SUCCEEDED, outcome.value, text, False)
    return ToolResult(text, metadata={**_metadata(tool, planned, outcome, op), **problem})


def _settle(
    journal: JournalTable,
    operation_id: str,
    status: JournalStatus,
    detail: str,
    text: str | None,
    is_error: bool,
) -> dict[str, str]:
    """Record the outcome. The file's state is already decided, so a journal that
    cannot be updated (locked, failing) does not change the result: the row stays
    ``started`` and recovery reconciles it by hash. Returns ``{"journal_error": …}`` then."""
    try:
        journal.mark(operation_id, status, detail, result=text, result_is_error=is_error)
    except EffectsDatabaseError as exc:
        return {"journal_error": str(exc)}
    return {}


def _apply_failed(
    workspace: Path, journal: JournalTable, row: JournalRow, change: FileChange, exc: Exception
) -> ToolResult:
    """An unexpected failure while applying: find out whether the file changed."""
    error = _tool_error(exc, change.path)
    try:
        now: str | None = current_hash(workspace, change.path)
        known = True
    except (ToolError, OSError):
        now, known = None, False
    op = row.operation_id
    if known and now == change.before_hash:
        _settle(journal, op, JournalStatus.FAILED, str(exc), error.content, True)
        return error
    if known and now == change.after_hash:
        text = (
            f"Error: {change.path}: the new content is in place but could not be made "
            f"durable: {exc}"
        )
        _settle(journal, op, JournalStatus.UNKNOWN, str(exc), text, True)
        return ToolResult.error(text, path=change.path, operation_id=op, journaled=True)
    _settle(journal, op, JournalStatus.UNKNOWN, str(exc), None, False)
    return error


def _resume(
    tool: FileChangePlanner,
    workspace: Path,
    journal: JournalTable,
    row: JournalRow,
    arguments: Mapping[str, Any],
    protected: ProtectedState | None = None,
) -> ToolResult:
    """Run a call whose intent is already recorded, without ever applying it twice."""
    op = row.operation_id
    if row.status is JournalStatus.SUCCEEDED:
        return ToolResult(reconciled_text(row), metadata=_row_metadata(row, "reconciled"))
    if row.status is JournalStatus.FAILED:
        return ToolResult.error(row.result or stale_text(row.path), operation_id=op, journaled=True)
    untouched = row.status in (JournalStatus.PROPOSED, JournalStatus.AUTHORIZED)
    if not untouched:
        remove_orphan_temp_files(workspace, row.path)  # left by a crash before the rename
    try:
        now = current_hash(workspace, row.path)
    except (ToolError, OSError) as exc:
        return _tool_error(exc, row.path)
    if untouched:
        row = journal.mark(op, JournalStatus.STARTED, "starting")
        faults.hit(INTENT_RECORDED)
    # This call never touched the file while it was untouched: the before-content means a
    # first execution (with the normal texts, also for a change that changes nothing).
    first = untouched and now == row.before_hash
    if now == row.after_hash and not first:
        text = reconciled_text(row)
        journal.mark(
            op, JournalStatus.SUCCEEDED, "reconciled: the file has the after-hash", result=text
        )
        return ToolResult(text, metadata=_row_metadata(row, "reconciled"))
    if now != row.before_hash:
        if untouched:
            journal.mark(
                op,
                JournalStatus.FAILED,
                "stale before the change was started",
                result=stale_text(row.path),
                result_is_error=True,
            )
        else:
            # Neither state: write nothing; the earlier attempt's outcome is not known.
            journal.mark(op, JournalStatus.UNKNOWN, "conflict: the file has neither hash")
        return ToolResult.error(
            stale_text(row.path), path=row.path, found_hash=now, operation_id=op, journaled=True
        )
    try:
        planned = _plan(tool, workspace, arguments, protected)
    except (ToolError, OSError) as exc:
        return _tool_error(exc, arguments.get("path"))
    change = planned.change
    if (change.path, change.before_hash, change.after_hash) != (
        row.path,
        row.before_hash,
        row.after_hash,
    ):
        return ToolResult.error(
            stale_text(row.path), path=row.path, operation_id=op, journaled=True
        )
    if row.status is not JournalStatus.STARTED:
        row = journal.mark(op, JournalStatus.STARTED, "re-executing after recovery")
    elif not untouched:
        journal.mark(op, JournalStatus.STARTED, "re-executing after recovery")
    return _apply(tool, workspace, journal, row, planned, protected)


def journaled_write(
    workspace: Path,
    journal: JournalTable,
    session_id: str,
    operation_id: str,
    arguments: Mapping[str, Any],
) -> ToolResult:
    """``write`` {path, content} through the journal (see :func:`journaled_run`)."""
    return journaled_run("write", workspace, journal, session_id, operation_id, arguments)


def journaled_edit(
    workspace: Path,
    journal: JournalTable,
    session_id: str,
    operation_id: str,
    arguments: Mapping[str, Any],
) -> ToolResult:
    """``edit`` {path, old_string, new_string, replace_all?} through the journal."""
    return journaled_run("edit", workspace, journal, session_id, operation_id, arguments)
