"""``tether rewind``: put back the files a session's tools changed after turn N.

What is restored comes from the action journal only (:mod:`tether._effects.journal`): each
``write``/``edit`` call of a turn after N has a row with the file's hash before and after
the change, and (since this module exists) a bounded copy of the bytes before it (evidence
kind ``before``, kept in the intent's transaction). Nothing is guessed: a call the journal
does not know (``bash``, an MCP tool, any tool that ran without a journal row) is listed as
*not restorable*, with its command.

A rewind is a journaled operation of its own:

1. **Plan** (pure once the evidence is read): the journaled changes after turn N, newest
   first, each a step ``path: after_hash → before_hash``.
2. **Record** the plan in the session's side record ``rewind`` (beside the log, written
   atomically while the session's writer lock is held; boundary ``rewind.planned``).
3. **Each step**, newest first, a compare-and-swap (the table :data:`STEP_ACTIONS`): the
   file still holds the recorded after-hash → it is replaced by the before-copy
   (:func:`~tether._tools.builtin.apply_change`: temp file, ``fsync``, rename, directory
   ``fsync``) or deleted if the call created it (boundary ``rewind.step_applied``); it
   already holds the before-hash → nothing to do; anything else → nothing is written, a
   review item (``tether review``) names the file with both hashes, and the older steps of
   that file are skipped (its content is no longer the session's). Then the step's outcome
   is recorded in the side record (boundary ``rewind.step_recorded``) and in the workspace
   database's reconciliation log.
4. **Finish**: the record is marked finished.

A crash anywhere leaves every file at a version of the chain (never a half-written file:
the temp file is renamed only when complete, and an orphan one is removed on resume) and
the record unfinished; running ``rewind`` again finishes the recorded plan: a step whose
file already holds its before-hash is done, so no step is applied twice, and a file changed
by hand is never overwritten. Calls rewound by a finished rewind are not planned again.

The session log itself is not written: the format (docs/SESSION_FORMAT.md) has no fact for
it, and a note entry would change the transcript the model sees. The side record and the
reconciliation log are what ``docs/rewind.md`` calls the rewind's record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import tether._faults as faults
from tether._effects.journal import remove_orphan_temp_files
from tether._ids import new_uuid7
from tether._stores.file import SessionStore
from tether._stores.protocol import SessionSidecar
from tether._tools.builtin import FileChange, apply_change, current_hash
from tether._tools.workspace import ProtectedState, open_parent, stat_entry
from tether._wsdb.protocol import WorkspaceDB
from tether._wsdb.sqlite import EffectsDB
from tether.core.framing import committed_lines, parse_line
from tether.core.records import field, record, replace
from tether.core.state import IdleOperation
from tether.core.turns import ToolCallTurn, check_turn, tool_calls_after, turn_count
from tether.core.values import JournalRow, JournalStatus
from tether.errors import ConfigurationError, StaleFileChange, ToolError

__all__ = [
    "RECORD_NAME",
    "STEP_ACTIONS",
    "NotRestorable",
    "RewindPlan",
    "RewindStep",
    "Seen",
    "StepStatus",
    "is_rewind_evidence",
    "load_facts",
    "plan_rewind",
    "rewind",
    "rewind_session",
]

PLANNED = faults.register(
    "rewind.planned", "rewind: plan durable in the side record, no file touched"
)
STEP_APPLIED = faults.register(
    "rewind.step_applied",
    "rewind: one file restored (renamed or deleted, directory fsynced), its step not recorded",
)
STEP_RECORDED = faults.register(
    "rewind.step_recorded", "rewind: one step's outcome recorded in the side record"
)

RECORD_NAME: Final = "rewind"


def is_rewind_evidence(evidence: Mapping[str, Any]) -> bool:
    """Whether a reconciliation's evidence is a rewind's (a step, the review it opened, or
    the decision on that review): it happened after the session, not in a recovery, so a
    timeline or a time budget must not read it as a crash."""
    inner = evidence.get("evidence")
    return RECORD_NAME in evidence or (isinstance(inner, Mapping) and RECORD_NAME in inner)


"""Name of the session's side record that holds its rewinds."""

RECORD_LIMIT: Final = 8 * 1024 * 1024
"""Largest side record read back (plans of many thousand steps fit)."""

_CHANGED_FILES: Final = frozenset(
    {JournalStatus.SUCCEEDED, JournalStatus.STARTED, JournalStatus.UNKNOWN}
)
"""Journal statuses whose file may hold the change (a ``started``/``unknown`` row included:
the compare-and-swap decides by the file's hash, never by the status)."""


_CHANGES_NOTHING: Final = "safe"
"""The replay declaration of a tool that changes nothing (spec: ``replay``)."""


class StepStatus(StrEnum):
    PENDING = "pending"
    RESTORED = "restored"
    """The file held the after-hash; the before-version is back (or the file is gone)."""
    UNCHANGED = "unchanged"
    """The file already held the before-hash; nothing written."""
    REVIEW = "needs_review"
    """The file holds neither hash (changed since), or its before-copy is missing: nothing
    written, a review item names it."""
    SKIPPED = "skipped"
    """A newer step of the same file needs review: the file is left as it is."""


_CHANGED: Final = (
    "changed since the session (it holds neither the session's version nor the one before "
    "it); not overwritten"
)
_NO_COPY: Final = (
    "the journal kept no copy of the content before the change (an older database, or a "
    "file over the copy limit); not overwritten"
)
_SKIPPED: Final = "a newer change of the file needs review; left as it is"


class Seen(StrEnum):
    """What a step finds in its file (a step's two hashes always differ)."""

    AFTER = "after"
    BEFORE = "before"
    OTHER = "other"


STEP_ACTIONS: Final[Mapping[Seen, StepStatus]] = {
    Seen.AFTER: StepStatus.RESTORED,  # the session's version: put the before-version back
    Seen.BEFORE: StepStatus.UNCHANGED,  # already back: nothing to write
    Seen.OTHER: StepStatus.REVIEW,  # changed since: never overwritten
}
"""The compare-and-swap of one step: what the file holds → what the rewind does."""


def seen(found: str | None, step: RewindStep) -> Seen:
    """Which of the step's versions ``found`` (the file's hash now, ``None``: absent) is."""
    if found == step.before_hash:
        return Seen.BEFORE
    return Seen.AFTER if found == step.after_hash else Seen.OTHER


DONE: Final = frozenset({StepStatus.RESTORED, StepStatus.UNCHANGED})


@record(slots=True)
class RewindStep:
    """Put ``path`` back from ``after_hash`` to ``before_hash`` (``None``: delete it)."""

    operation_id: str
    tool_name: str
    turn: int
    path: str
    before_hash: str | None
    after_hash: str
    status: StepStatus = StepStatus.PENDING
    found_hash: str | None = None
    reason: str = ""
    review_item: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "toolName": self.tool_name,
            "turn": self.turn,
            "path": self.path,
            "beforeHash": self.before_hash,
            "afterHash": self.after_hash,
            "status": self.status.value,
            "foundHash": self.found_hash,
            "reason": self.reason,
            "reviewItem": self.review_item,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RewindStep:
        return cls(
            operation_id=str(data["operationId"]),
            tool_name=str(data["toolName"]),
            turn=int(data["turn"]),
            path=str(data["path"]),
            before_hash=data["beforeHash"],
            after_hash=str(data["afterHash"]),
            status=StepStatus(data["status"]),
            found_hash=data.get("foundHash"),
            reason=str(data.get("reason", "")),
            review_item=data.get("reviewItem"),
        )


@record(slots=True)
class NotRestorable:
    """A call after the turn whose effects the journal does not know."""

    operation_id: str
    tool_name: str
    turn: int
    command: str

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "toolName": self.tool_name,
            "turn": self.turn,
            "command": self.command,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotRestorable:
        return cls(
            str(data["operationId"]), str(data["toolName"]), int(data["turn"]), data["command"]
        )


@record(slots=True)
class RewindPlan:
    """One rewind: its steps newest first, what cannot be restored, and whether it ended."""

    rewind_id: str
    session_id: str
    turn: int
    steps: tuple[RewindStep, ...]
    not_restorable: tuple[NotRestorable, ...] = ()
    finished: bool = False
    resumed: bool = field(default=False, compare=False)

    @property
    def review(self) -> tuple[RewindStep, ...]:
        return tuple(s for s in self.steps if s.status is StepStatus.REVIEW)

    def to_json(self) -> dict[str, Any]:
        return {
            "rewindId": self.rewind_id,
            "sessionId": self.session_id,
            "turn": self.turn,
            "finished": self.finished,
            "steps": [s.to_json() for s in self.steps],
            "notRestorable": [n.to_json() for n in self.not_restorable],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RewindPlan:
        return cls(
            rewind_id=str(data["rewindId"]),
            session_id=str(data["sessionId"]),
            turn=int(data["turn"]),
            steps=tuple(RewindStep.from_json(s) for s in data["steps"]),
            not_restorable=tuple(NotRestorable.from_json(n) for n in data["notRestorable"]),
            finished=bool(data["finished"]),
        )


# =========================================================================== plan


def load_facts(log: bytes) -> list[Mapping[str, Any]]:
    """The committed facts of a log in order (the header left out; a line that is a
    transaction, an array, gives its facts); the caller has reduced it."""
    lines, _end = committed_lines(log)
    found: list[Mapping[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        value = parse_line(raw, number)
        if number == 1:
            continue
        for fact in value if isinstance(value, list) else [value]:
            if isinstance(fact, Mapping):
                found.append(fact)
    return found


def _command(call: ToolCallTurn) -> str:
    command = call.arguments.get("command")
    if isinstance(command, str):
        return command
    return json.dumps(dict(call.arguments), sort_keys=True, ensure_ascii=False)


def plan_rewind(
    rewind_id: str,
    session_id: str,
    facts: Sequence[Mapping[str, Any]],
    turn: int,
    rows: Mapping[str, JournalRow],
    rewound: frozenset[str],
) -> RewindPlan:
    """The steps of a rewind to ``turn``, newest first (pure).

    ``rows`` are the session's journal rows by operation id; ``rewound`` the calls a finished
    rewind already put back (not planned again). A call without a row whose tool declares
    ``replay: safe`` (``read``: it changes nothing) is neither a step nor "not restorable".
    """
    problem = check_turn(turn, turn_count(facts))
    if problem is not None:
        raise ConfigurationError(problem)
    steps: list[RewindStep] = []
    unknown: list[NotRestorable] = []
    for call in reversed(tool_calls_after(facts, turn)):
        row = rows.get(call.operation_id)
        if row is None:
            if call.replay != _CHANGES_NOTHING:
                unknown.append(
                    NotRestorable(call.operation_id, call.tool_name, call.turn, _command(call))
                )
            continue
        if (
            call.operation_id in rewound
            or row.status not in _CHANGED_FILES
            or row.before_hash == row.after_hash
        ):
            continue
        steps.append(
            RewindStep(
                call.operation_id,
                call.tool_name,
                call.turn,
                row.path,
                row.before_hash,
                row.after_hash,
            )
        )
    return RewindPlan(rewind_id, session_id, turn, tuple(steps), tuple(unknown))


# =========================================================================== record


def _read_record(record: SessionSidecar) -> list[dict[str, Any]]:
    data, why = record.read()
    if why is not None:
        raise ConfigurationError(f"the rewind record cannot be read: {why}")
    if data is None:
        return []
    try:
        value = json.loads(data)
        rewinds = value["rewinds"]
        if not isinstance(rewinds, list):
            raise TypeError("rewinds is not a list")
        return rewinds
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{record.location}: not a rewind record ({exc})") from None


def _write_record(record: SessionSidecar, history: list[dict[str, Any]], plan: RewindPlan) -> None:
    """Replace this rewind's entry of the history (or append it), atomically and durably."""
    entry = plan.to_json()
    kept = [r for r in history if r.get("rewindId") != plan.rewind_id]
    kept.append(entry)
    history[:] = kept
    record.write(json.dumps({"rewinds": history}, sort_keys=True).encode())


# =========================================================================== steps


def _delete_if(workspace: Path, path: str, expected: str) -> bool:
    """Delete ``path`` if it holds ``expected`` (compare-and-swap), directory fsynced.
    ``False`` when it is already gone; :class:`StaleFileChange` when it holds other bytes."""
    with open_parent(workspace, path, create=False) as parent:
        if stat_entry(parent) is None:
            return False
        found = current_hash(workspace, path)
        if found != expected:
            raise StaleFileChange(path, expected, found)
        os.unlink(parent.name, dir_fd=parent.fd)
        os.fsync(parent.fd)
    return True


def _restore(workspace: Path, db: WorkspaceDB, step: RewindStep) -> RewindStep:
    """One compare-and-swap (see the module docstring): the step with its outcome."""
    try:
        found = current_hash(workspace, step.path)
    except (ToolError, OSError) as exc:
        return replace(step, status=StepStatus.REVIEW, reason=f"cannot be read: {exc}")
    action = STEP_ACTIONS[seen(found, step)]
    if action is not StepStatus.RESTORED:
        reason = _CHANGED if action is StepStatus.REVIEW else ""
        return replace(step, status=action, found_hash=found, reason=reason)
    try:
        if step.before_hash is None:
            _delete_if(workspace, step.path, step.after_hash)
        else:
            copy = db.journal.before_copy(step.operation_id)
            if copy is None or copy.content is None or copy.content_hash != step.before_hash:
                return replace(step, status=StepStatus.REVIEW, found_hash=found, reason=_NO_COPY)
            change = FileChange(step.path, step.after_hash, step.before_hash, copy.content)
            apply_change(workspace, change, protected=ProtectedState.for_workspace(workspace))
    except StaleFileChange as exc:
        return replace(
            step,
            status=StepStatus.REVIEW,
            found_hash=exc.found,
            reason="changed while the rewind ran; not overwritten",
        )
    except (ToolError, OSError) as exc:
        return replace(step, status=StepStatus.REVIEW, found_hash=found, reason=str(exc))
    faults.hit(STEP_APPLIED)
    return replace(step, status=StepStatus.RESTORED, found_hash=found)


def _preview(workspace: Path, db: WorkspaceDB, plan: RewindPlan) -> RewindPlan:
    """What carrying out ``plan`` would do to the files as they are now (nothing written):
    each pending step's compare-and-swap against the hash the newer steps would leave."""
    now: dict[str, str | None] = {}
    held: set[str] = set()
    steps: list[RewindStep] = []
    for step in plan.steps:
        if step.status is not StepStatus.PENDING:
            if step.status in (StepStatus.REVIEW, StepStatus.SKIPPED):
                held.add(step.path)
            steps.append(step)
            continue
        if step.path in held:
            steps.append(replace(step, status=StepStatus.SKIPPED, reason=_SKIPPED))
            continue
        if step.path not in now:
            try:
                now[step.path] = current_hash(workspace, step.path)
            except (ToolError, OSError) as exc:
                held.add(step.path)
                steps.append(
                    replace(step, status=StepStatus.REVIEW, reason=f"cannot be read: {exc}")
                )
                continue
        found = now[step.path]
        action = STEP_ACTIONS[seen(found, step)]
        if action is not StepStatus.RESTORED:
            if action is StepStatus.REVIEW:
                held.add(step.path)
            reason = _CHANGED if action is StepStatus.REVIEW else ""
            steps.append(replace(step, status=action, found_hash=found, reason=reason))
        elif step.before_hash is not None and not _has_copy(db, step):
            held.add(step.path)
            steps.append(replace(step, status=StepStatus.REVIEW, found_hash=found, reason=_NO_COPY))
        else:
            now[step.path] = step.before_hash
            steps.append(step)  # pending: it would be restored
    return replace(plan, steps=tuple(steps))


def _has_copy(db: WorkspaceDB, step: RewindStep) -> bool:
    copy = db.journal.before_copy(step.operation_id)
    return copy is not None and copy.content is not None and copy.content_hash == step.before_hash


def _open_review(db: WorkspaceDB, plan: RewindPlan, step: RewindStep) -> RewindStep:
    evidence = {
        "rewind": plan.rewind_id,
        "turn": plan.turn,
        "path": step.path,
        "expected_hash": step.after_hash,
        "found_hash": step.found_hash,
        "before_hash": step.before_hash,
    }
    item = db.reviews.open_item(
        plan.session_id,
        step.operation_id,
        step.tool_name,
        f"rewind to turn {plan.turn}: {step.path} {step.reason} "
        f"(expected {step.after_hash}, found {step.found_hash})",
        evidence,
    )
    return replace(step, review_item=item.id)


# =========================================================================== run


def rewind(
    workspace: Path,
    db: WorkspaceDB,
    record: SessionSidecar,
    session_id: str,
    log: bytes,
    turn: int,
    *,
    rewind_id: str,
    dry_run: bool = False,
) -> RewindPlan:
    """Rewind ``session_id``'s files to turn ``turn`` (or finish an unfinished rewind first).

    The caller holds the session's writer lock (no run changes the files meanwhile) and
    gives the committed log. An unfinished rewind in ``record`` is finished first and
    returned (``resumed``); otherwise a new one is planned and carried out. ``dry_run``
    returns the plan (or the unfinished one) and touches nothing.
    """
    history = _read_record(record)
    unfinished = [RewindPlan.from_json(r) for r in history if not r.get("finished")]
    if unfinished:
        plan = replace(unfinished[-1], resumed=True)
        if dry_run:
            return _preview(workspace, db, plan)
        return _carry_out(workspace, db, record, history, plan)
    rewound = frozenset(
        s["operationId"]
        for r in history
        for s in r.get("steps", ())
        if s.get("status") in {d.value for d in DONE}
    )
    rows = {row.operation_id: row for row in db.journal.rows(session_id)}
    facts = load_facts(log)
    plan = plan_rewind(rewind_id, session_id, facts, turn, rows, rewound)
    if dry_run:
        return _preview(workspace, db, plan)
    _write_record(record, history, plan)
    faults.hit(PLANNED)
    return _carry_out(workspace, db, record, history, plan)


def _carry_out(
    workspace: Path,
    db: WorkspaceDB,
    record: SessionSidecar,
    history: list[dict[str, Any]],
    plan: RewindPlan,
) -> RewindPlan:
    steps = list(plan.steps)
    held = {s.path for s in steps if s.status in (StepStatus.REVIEW, StepStatus.SKIPPED)}
    for index, step in enumerate(steps):
        if step.status is not StepStatus.PENDING:
            continue
        if step.path in held:
            done = replace(step, status=StepStatus.SKIPPED, reason=_SKIPPED)
        else:
            remove_orphan_temp_files(workspace, step.path)  # of a restore cut by a crash
            done = _restore(workspace, db, step)
        if done.status is StepStatus.REVIEW:
            held.add(step.path)
            done = _open_review(db, plan, done)
        db.reviews.log_reconciliation(
            plan.session_id,
            step.operation_id,
            f"rewind-{done.status.value}",
            {"rewind": plan.rewind_id, **done.to_json()},
            tool_name=step.tool_name,
            action="rewind",
        )
        steps[index] = done
        plan = replace(plan, steps=tuple(steps))
        _write_record(record, history, plan)
        faults.hit(STEP_RECORDED)
    plan = replace(plan, finished=True)
    _write_record(record, history, plan)
    return plan


def rewind_session(
    workspace: str | os.PathLike[str],
    session: str,
    turn: int,
    *,
    dry_run: bool = False,
    sessions_dir: str | os.PathLike[str] | None = None,
) -> RewindPlan:
    """Open the session (its writer lock: no run of it can change files meanwhile) and the
    workspace's ``effects.db``, and :func:`rewind` (the file store)."""
    root = Path(os.path.realpath(workspace))
    with SessionStore.open(session, workspace=root, sessions_dir=sessions_dir) as store:
        if not isinstance(store.state.operation, IdleOperation):
            # A pending call's recovery reconciles its file by hash: rewound to the
            # before-version, a started change would be applied again on resume.
            raise ConfigurationError(
                f"session {store.session_id} has an unfinished operation; finish it first "
                f"(tether resume {store.session_id}, or --abort), then rewind"
            )
        log = store.path.read_bytes()
        record = replace(store.sidecar(RECORD_NAME), limit=RECORD_LIMIT)
        db = EffectsDB.open_workspace(root)
        try:
            return rewind(
                root,
                db,
                record,
                store.session_id,
                log,
                turn,
                rewind_id=new_uuid7(),
                dry_run=dry_run,
            )
        finally:
            db.close()
