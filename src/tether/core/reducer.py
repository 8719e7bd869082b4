"""The pure session reducer: log bytes -> :class:`SessionState` (spec sections 4-13).

:class:`Reducer` applies one transaction (one committed line) at a time. A
candidate transaction is validated and applied in place while an undo log
records every change; if any check fails the undo log restores the previous
state exactly, so a rejected transaction changes nothing. The cost of a
transaction is proportional to its own size, never to the size of the session:
nothing is deep-copied, the transcript legality check resumes from the set of
open calls, and the compaction source digest is kept as a running hash.

The checks follow the ordered checklists of spec section 13 to the letter; the
first failing check decides the error code.

Pure, like all of :mod:`tether.core`: in particular it leaves the garbage collector alone.
Loading a whole log is faster with the cyclic collector paused; the shell's entry points
(:mod:`tether._loading`, used by the stores, the CLI and the public ``tether`` API) wrap
:meth:`Reducer.load` with that pause.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar

import orjson

from tether.core.canonical import (
    MAX_SAFE_INTEGER,
    SourceDigestBuilder,
    configuration_digest,
    source_digest,
)
from tether.core.contents import PERSON_DENIAL_PREFIX, SYNTHETIC_CONTENT, is_blank

# The closed member sets of the spec's *closed*(S) checks, written ``S.issuperset(obj)``
# (the object has no member outside S), and the closed value sets: each fact shape is
# spelled once, in tether.core.facts, next to the constructors the shell writes facts with.
# Imported by name so that every check is one global lookup, as fast as a local constant.
from tether.core.facts import (
    ABORT_PHASES,
    ABORT_REQUESTED,
    ASSISTANT_ENTRY,
    ASSISTANT_MESSAGE,
    COMPACTION_ENTRY,
    COMPACTION_STARTED,
    ENTRY_FACT,
    ERROR,
    FUNCTION,
    HEADER,
    OPERATION_FINISHED,
    OUTCOMES,
    PRE_EXECUTION_REASONS,
    PRE_TOOL_ENTRY,
    RECORD_FACT,
    RESULT,
    RUN_STARTED,
    SNAPSHOT,
    SNAPSHOT_TOOL,
    STARTED_TOOL_ENTRY,
    STEP_ATTEMPT,
    STEP_FAILED,
    TAIL_ITEM,
    TOOL_CALL,
    TOOL_MESSAGE,
    TOOL_STARTED,
    USAGE,
    USAGE_COUNTERS,
    USAGE_FACT,
    USER_ENTRY,
    USER_MESSAGE,
)
from tether.core.framing import MISSING_HEADER, committed_lines, parse_line, utf8_error
from tether.core.state import (
    IDLE,
    CompactionOperation,
    ConfigurationSnapshot,
    FinishedOperation,
    FrozenView,
    Header,
    Message,
    Operation,
    PersonDenial,
    Replay,
    RunOperation,
    SessionState,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    ToolCallState,
    ToolConfig,
    ToolStatus,
    Usage,
)
from tether.errors import CanonicalizationError, SessionCorruption

__all__ = ["PendingTransaction", "Reducer", "reduce_session"]

_T = TypeVar("_T")

INVALID_HEADER = "INVALID_HEADER"
UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
EMPTY_TRANSACTION = "EMPTY_TRANSACTION"
INVALID_FACT = "INVALID_FACT"
SEQ_MISMATCH = "SEQ_MISMATCH"
DUPLICATE_ID = "DUPLICATE_ID"
INVALID_REFERENCE = "INVALID_REFERENCE"
INVALID_TRANSITION = "INVALID_TRANSITION"
INVALID_TRANSCRIPT = "INVALID_TRANSCRIPT"

_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_ID_MATCH = _ID_RE.fullmatch

_STOP_REASONS = {
    "stop": StopReason.STOP,
    "toolUse": StopReason.TOOL_USE,
    "length": StopReason.LENGTH,
}
_REPLAYS = {"safe": Replay.SAFE, "never": Replay.NEVER}
_STEP_KINDS = {"assistant": StepKind.ASSISTANT, "compaction": StepKind.COMPACTION}

# What an ID of the namespace (spec 3) is used as, in Reducer._ids: an accepted fact
# ID, or a reserved ID with the purpose of its reservation. An ID is never both: only
# an unused ID can be reserved, and a fact ID must not be reserved once its fact has
# been checked (a result entry consumes its reservation first).
_FACT_ID = -1
_RESERVED_FOREVER = 0
_RESERVED_TOOL_RESULT = 1
_RESERVED_COMPACTION_RESULT = 2


def _is_id(value: Any) -> bool:
    return type(value) is str and len(value) == 36 and _ID_MATCH(value) is not None


def _find(table: Mapping[str, _T], ident: Any, seq: int) -> _T | None:
    """``table[ident]`` or ``None``; ``INVALID_FACT`` if ``ident`` is not an ID.

    The reducer's tables are keyed by well-formed IDs only, so a hit proves the form
    and only a miss needs the pattern match. Use it where the spec checks *ID(x)*
    immediately before looking x up.
    """
    if type(ident) is str:
        found = table.get(ident)
        if found is not None:
            return found
    if not _is_id(ident):
        raise _Invalid(INVALID_FACT, seq)
    return None


def _enum(table: Mapping[str, _T], value: Any) -> _T | None:
    """``table[value]`` for a string ``value`` in ``table``, else ``None``.

    JSON arrays and objects are unhashable: looking them up directly would raise
    ``TypeError`` instead of failing the check.
    """
    return table.get(value) if type(value) is str else None


def _one_of(value: Any, names: frozenset[str]) -> bool:
    """Whether ``value`` is one of the strings ``names`` (any JSON value allowed)."""
    return type(value) is str and value in names


def _is_digest(value: Any) -> bool:
    return type(value) is str and len(value) == 71 and _DIGEST_RE.fullmatch(value) is not None


def _is_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _is_text(value: Any) -> bool:
    return type(value) is str and len(value) > 0


_UndoLog = list[tuple[Callable[..., object], tuple[Any, ...]]]


def _run_undo(undo: _UndoLog) -> None:
    for action, args in reversed(undo):
        action(*args)


class _Invalid(Exception):
    """Raised inside a transaction; converted to :class:`SessionCorruption`."""

    def __init__(self, code: str, seq: int | None) -> None:
        self.code = code
        self.seq = seq


class _Entry:
    """Bookkeeping for one accepted entry (spec 11.2)."""

    __slots__ = (
        "attempt_id",
        "index",
        "message",
        "operation_id",
        "order",
        "role",
        "step_id",
        "stop_reason",
        "used_calls",
    )

    def __init__(
        self,
        role: str | None,
        index: int,
        message: Message | None,
        operation_id: str | None = None,
        step_id: str | None = None,
        attempt_id: str | None = None,
        stop_reason: StopReason | None = None,
    ) -> None:
        # role is None for compaction entries. For message entries ``index`` is the
        # position in the transcript; for compaction entries it is the number of
        # message entries accepted before it.
        self.role = role
        self.index = index
        self.message = message
        self.operation_id = operation_id
        self.step_id = step_id
        self.attempt_id = attempt_id
        self.stop_reason = stop_reason
        self.order = 0  # position in acceptance order among all entries
        # Bit i set: tool call i of this (assistant) entry has been started or answered
        # by a pre-execution result; a valid index is below len(tool_calls).
        self.used_calls = 0


class _Attempt:
    __slots__ = (
        "context",
        "digest",
        "failed",
        "kind",
        "number",
        "open",
        "operation_id",
        "settled_by",
        "snapshot",
        "step_id",
    )

    def __init__(
        self,
        operation_id: str,
        step_id: str,
        number: int,
        kind: StepKind,
        context: str,
        snapshot: Mapping[str, Any],
        digest: str,
    ) -> None:
        self.operation_id = operation_id
        self.step_id = step_id
        self.number = number
        self.kind = kind
        self.context = context
        self.snapshot = snapshot
        self.digest = digest
        self.open = True
        self.failed = False
        self.settled_by: str | None = None


class _Operation:
    __slots__ = (
        "abort_requested",
        "attempt_id",
        "compacted_through",
        "done_tools",
        "finished",
        "id",
        "input_entry_id",
        "kind",
        "result_entry_id",
        "started_ms",
        "step_id",
        "tools",
        "transcript_from",
        "usage_start",
    )

    def __init__(
        self,
        op_id: str,
        kind: str,
        input_entry_id: str,
        result_entry_id: str | None = None,
    ) -> None:
        self.id = op_id
        self.kind = kind  # "run" or "compaction"
        self.input_entry_id = input_entry_id  # inputThroughEntryId for compactions
        self.result_entry_id = result_entry_id
        self.finished = False
        self.abort_requested = False
        self.compacted_through: str | None = None  # writer's last compactedEntryIds item
        self.step_id: str | None = None  # most recent step
        self.attempt_id: str | None = None  # most recent attempt
        # Started tools in record order, as recorded (status pending); a tool is
        # completed once its result entry is accepted, see Reducer._is_pending.
        self.tools: list[ToolCallState] = []
        # Memo of Reducer._operation_snapshot: completed-state copies of tools[:n] for the
        # longest committed prefix of completed tools. Snapshots are only taken between
        # transactions, and a committed result is never undone, so it only grows.
        self.done_tools: list[ToolCallState] = []
        # What the session had spent when the operation started (the budgets' baseline,
        # RunOperation.usage_at_start) and when: set once, by _run_started.
        self.usage_start: Usage | None = None
        self.started_ms: int | None = None
        self.transcript_from = 0


class PendingTransaction:
    """A validated transaction applied in memory, awaiting commit or rollback."""

    __slots__ = ("_done", "_reducer", "_undo")

    def __init__(self, reducer: Reducer, undo: _UndoLog) -> None:
        self._reducer = reducer
        self._undo = undo
        self._done = False

    def commit(self) -> None:
        """Adopt the transaction."""
        self._finish()

    def rollback(self) -> None:
        """Restore the state exactly as it was before the transaction."""
        undo = self._undo
        self._finish()
        _run_undo(undo)
        self._reducer._invalidate()

    def _finish(self) -> None:
        if self._done:
            raise RuntimeError("transaction already finished")
        self._done = True
        self._reducer._pending = None
        self._reducer._undo = None


class Reducer:
    """Incremental reducer over one session log.

    Create it from the header line (:meth:`from_header_line`) or from a whole file
    (:meth:`load`), then feed transactions with :meth:`apply`, :meth:`check` or
    :meth:`begin`. All inputs are the bytes of a line without its LF.
    """

    def __init__(self, header: Header, header_length: int) -> None:
        self._header = header
        self._length = header_length
        self._line = 1
        self._next_seq = 1
        # The ID namespace: accepted fact IDs and reserved IDs in one table, so that
        # checking a new ID against both costs one lookup (see _FACT_ID).
        self._ids: dict[str, int] = {}
        self._entries: dict[str, _Entry] = {}
        self._transcript: list[Message] = []
        self._transcript_ids: list[str] = []
        self._step_count = 0
        # Calls a person denied (PersonDenial), and the tools started by the transaction
        # being applied: a person's denial is only believed in the transaction that
        # started its call (a call that ran has its result in a later one, so its output
        # can never pass for a denial).
        self._person_denials: list[PersonDenial] = []
        self._started_now: set[str] = set()
        self._context: list[Message] = []
        self._boundary: str | None = None
        self._open_calls: frozenset[str] = frozenset()
        # Transcript indices of the tool results that are not a success, ascending (a
        # FrozenView in the state, cut back with the transcript on a rollback).
        self._failed: list[int] = []
        self._usage = [0, 0, 0, 0]
        self._operations: dict[str, _Operation] = {}
        self._active: _Operation | None = None
        self._attempts: dict[str, _Attempt] = {}
        self._tools: dict[str, ToolCallState] = {}  # as recorded; see _is_pending
        self._snapshots: dict[str, Mapping[str, Any]] = {}
        self._source = SourceDigestBuilder()
        self._undo: _UndoLog | None = None
        self._pending: PendingTransaction | None = None
        self._state: SessionState | None = None
        self._last_finished: FinishedOperation | None = None
        # Snapshot caches, keyed by everything the cached value is built from (so no
        # undo step is needed): the executor reads the state after every commit, and
        # the step and its configuration mostly have not changed since the last read.
        self._frozen_configurations: dict[str, ConfigurationSnapshot] = {}
        self._last_step: tuple[tuple[str, bool, str | None], Step] | None = None
        # The totals list is replaced, never changed in place (_usage_fact, _restore):
        # the same list object means the same counters.
        self._last_usage: tuple[list[int], Usage] | None = None
        self._timestamp = 0  # the timestamp of the fact being applied
        # Set by a checkpoint (tether.core.checkpoint) whose check indexes are decoded only
        # when the first line is checked: see _complete.
        self._deferred: Callable[[], None] | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_header_line(cls, raw: bytes) -> Reducer:
        """Validate line 1 (without its LF) and start an empty session."""
        if not raw:
            raise SessionCorruption(MISSING_HEADER, 1, detail="first line is empty")
        value = parse_line(raw, 1)
        return cls(_parse_header(value), len(raw) + 1)

    @classmethod
    def load(cls, data: bytes) -> Reducer:
        """Reduce a whole file; the torn tail after the last LF is ignored."""
        # Every line goes through framing.parse_line, which accepts only valid UTF-8,
        # so the file-wide UTF-8 check (spec 2.5 check 3) is needed only to decide
        # which error to report when something fails.
        lines, end = committed_lines(data, check_utf8=False)
        try:
            reducer = cls.from_header_line(next(lines))
            apply = reducer._apply_unchecked
            for raw in lines:
                apply(raw)
        except Exception:
            error = utf8_error(data, end)
            if error is not None:
                raise error from None
            raise
        if reducer._length != end:  # pragma: no cover - defensive
            raise AssertionError("committed length mismatch")
        return reducer

    # ------------------------------------------------------------------ public API

    @property
    def length(self) -> int:
        """Byte length of the committed region so far (``repairedLength``)."""
        return self._length

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def line_count(self) -> int:
        return self._line

    @property
    def state(self) -> SessionState:
        """An immutable snapshot of the current state (cached until the next change)."""
        if self._pending is not None:
            raise RuntimeError("a transaction is pending")
        state = self._state
        if state is None:
            state = self._state = self._snapshot()
        return state

    def begin(self, transaction: bytes | Sequence[Any] | Mapping[str, Any]) -> PendingTransaction:
        """Validate and apply a candidate transaction, keeping an undo log.

        Raises :class:`SessionCorruption` (leaving the state unchanged) if the
        transaction is invalid. Call ``commit()`` or ``rollback()`` on the result
        before using the reducer again.
        """
        if self._pending is not None:
            raise RuntimeError("a transaction is already pending")
        raw = transaction if isinstance(transaction, bytes) else orjson.dumps(transaction)
        undo: _UndoLog = []
        self._undo = undo
        try:
            self._apply_unchecked(raw)
        except BaseException:
            self._undo = None
            _run_undo(undo)
            self._invalidate()
            raise
        pending = PendingTransaction(self, undo)
        self._pending = pending
        return pending

    def apply(self, transaction: bytes | Sequence[Any] | Mapping[str, Any]) -> None:
        """Validate the whole transaction, then adopt it; on error nothing changes."""
        self.begin(transaction).commit()

    def check(self, transaction: bytes | Sequence[Any] | Mapping[str, Any]) -> None:
        """Validate a candidate transaction without applying it."""
        self.begin(transaction).rollback()

    def feed(self, raw: bytes) -> None:
        """Apply the next committed line of a log being read (as :meth:`load` does, with no
        undo log): for a reader that stops after each line (``tether replay``, fork's
        cut points). On :class:`SessionCorruption` the reducer must not be used again."""
        self._apply_unchecked(raw)

    # ------------------------------------------------------------------ undo helpers

    def _invalidate(self) -> None:
        self._state = None

    def _record(self, action: Callable[..., object], *args: Any) -> None:
        """Log ``action(*args)`` to be run on rollback (only while a transaction is open).

        Undo steps are (function, arguments) pairs rather than closures, so that
        nothing is allocated for them when no undo log is active (``load``).
        """
        undo = self._undo
        if undo is not None:
            undo.append((action, args))

    def _setattr(self, obj: Any, name: str, value: Any) -> None:
        undo = self._undo
        if undo is not None:
            undo.append((setattr, (obj, name, getattr(obj, name))))
        setattr(obj, name, value)

    def _settle(self, attempt: _Attempt, entry_id: str) -> None:
        """Close ``attempt`` as settled by the entry ``entry_id``."""
        undo = self._undo
        if undo is not None:
            undo.append((setattr, (attempt, "open", attempt.open)))
            undo.append((setattr, (attempt, "settled_by", attempt.settled_by)))
        attempt.open = False
        attempt.settled_by = entry_id

    def _reserve(self, ident: str, purpose: int) -> None:
        reserved = self._ids
        reserved[ident] = purpose
        undo = self._undo
        if undo is not None:
            undo.append((reserved.pop, (ident, None)))

    def _consume(self, ident: str) -> None:
        reserved = self._ids
        purpose = reserved.pop(ident)
        undo = self._undo
        if undo is not None:
            undo.append((reserved.__setitem__, (ident, purpose)))

    # ------------------------------------------------------------------ transactions

    def _complete(self) -> None:
        """Decode what a checkpoint deferred (the indexes only a line's checks read, see
        :func:`tether.core.checkpoint.decode_checkpoint`); nothing otherwise. Raises
        :class:`~tether.errors.CheckpointMismatch` (the reducer unchanged) if they cannot
        be decoded."""
        deferred = self._deferred
        if deferred is not None:
            deferred()
            self._deferred = None

    def _apply_unchecked(self, raw: bytes) -> None:
        """Apply one transaction line; undo is the caller's business."""
        if self._deferred is not None:
            self._complete()
        line = self._line + 1
        value = parse_line(raw, line)
        self._state = None
        undo = self._undo
        if undo is not None:
            saved = (
                self._line,
                self._length,
                self._next_seq,
                len(self._transcript),
                self._context,
                len(self._context),
                self._boundary,
                self._open_calls,
                list(self._usage),
                self._active,
                self._step_count,
                len(self._failed),
                len(self._person_denials),
            )
            undo.append((self._restore, (saved,)))
        if self._started_now:
            self._started_now = set()
        facts = value if type(value) is list else [value]
        if not facts:
            raise SessionCorruption(EMPTY_TRANSACTION, line)
        transcript = self._transcript
        start = len(transcript)
        apply_fact = self._fact
        try:
            seq: int | None = None
            for fact in facts:
                seq = apply_fact(fact)
            if len(transcript) != start:  # no new message: the open set is unchanged
                opened = self._scan(self._open_calls, transcript, start)
                if opened is None:
                    raise _Invalid(INVALID_TRANSCRIPT, seq)
                self._open_calls = opened
        except _Invalid as exc:
            raise SessionCorruption(exc.code, line, exc.seq) from None
        self._line = line
        self._length += len(raw) + 1

    def _restore(self, saved: tuple[Any, ...]) -> None:
        (
            self._line,
            self._length,
            self._next_seq,
            transcript_len,
            context,
            context_len,
            self._boundary,
            self._open_calls,
            self._usage,
            self._active,
            self._step_count,
            failed_len,
            denials_len,
        ) = saved
        del self._person_denials[denials_len:]
        del self._transcript[transcript_len:]
        del self._failed[failed_len:]
        del self._transcript_ids[transcript_len:]
        self._context = context
        del context[context_len:]

    @staticmethod
    def _scan(
        open_calls: frozenset[str], messages: Sequence[Message], start: int
    ) -> frozenset[str] | None:
        """Transcript legality (spec 6.3) from ``start``; the new open set or None."""
        current = open_calls
        for index in range(start, len(messages)):
            message = messages[index]
            role = message["role"]
            if role == "tool":
                call_id = message["tool_call_id"]
                if call_id not in current:
                    return None
                current = current - {call_id}
            elif current:
                return None
            elif role == "assistant":
                calls = message.get("tool_calls")
                if calls:
                    current = frozenset([call["id"] for call in calls])
        return current

    # ------------------------------------------------------------------ facts (13.1)

    def _fact(self, fact: Any) -> int:
        if type(fact) is not dict:
            raise _Invalid(INVALID_FACT, None)
        seq: Any = fact.get("seq")
        if type(seq) is not int or not 1 <= seq <= MAX_SAFE_INTEGER:
            raise _Invalid(INVALID_FACT, None)
        if seq != self._next_seq:
            raise _Invalid(SEQ_MISMATCH, seq)
        fact_id: Any = fact.get("id")
        if type(fact_id) is not str or len(fact_id) != 36 or _ID_MATCH(fact_id) is None:
            raise _Invalid(INVALID_FACT, seq)
        timestamp: Any = fact.get("timestamp")
        if type(timestamp) is not int or not 0 <= timestamp <= MAX_SAFE_INTEGER:
            raise _Invalid(INVALID_FACT, seq)
        self._timestamp = timestamp  # for the record handlers (a run's start time)
        ids = self._ids
        if ids.get(fact_id) == _FACT_ID:
            raise _Invalid(DUPLICATE_ID, seq)
        kind = fact.get("kind")
        if kind == "entry":
            self._entry_fact(fact, fact_id, seq)
        elif kind == "record":
            self._record_fact(fact, fact_id, seq)
        elif kind == "usage":
            self._usage_fact(fact, seq)
        else:
            raise _Invalid(INVALID_FACT, seq)
        if fact_id in ids:  # reserved (it is not an accepted fact ID, see above)
            raise _Invalid(DUPLICATE_ID, seq)
        ids[fact_id] = _FACT_ID
        undo = self._undo
        if undo is not None:
            undo.append((ids.pop, (fact_id, None)))
        self._next_seq = seq + 1
        return seq

    def _new(self, ident: Any, seq: int) -> str:
        """*new(x)*: a well-formed ID not used anywhere yet; reserve it forever."""
        if not _is_id(ident):
            raise _Invalid(INVALID_FACT, seq)
        if ident in self._ids:  # an accepted fact ID or a reserved ID
            raise _Invalid(DUPLICATE_ID, seq)
        self._reserve(ident, _RESERVED_FOREVER)
        return str(ident)

    def _lookup(self, op_id: Any, seq: int) -> _Operation:
        """Op lookup (spec 8): an ID naming an unfinished operation."""
        # Every key of _operations is a well-formed ID, so a hit needs no pattern match.
        op = self._operations.get(op_id) if type(op_id) is str else None
        if op is None:
            if not _is_id(op_id):
                raise _Invalid(INVALID_FACT, seq)
            raise _Invalid(INVALID_REFERENCE, seq)
        if op.finished:
            raise _Invalid(INVALID_TRANSITION, seq)
        return op

    # ------------------------------------------------------------------ entries (13.2)

    def _entry_fact(self, fact: Any, fact_id: str, seq: int) -> None:
        if not ENTRY_FACT.issuperset(fact):
            raise _Invalid(INVALID_FACT, seq)
        entry = fact.get("entry")
        if type(entry) is not dict:
            raise _Invalid(INVALID_FACT, seq)
        entry_type = entry.get("type")
        if entry_type == "message":
            self._message_entry(entry, fact_id, seq)
        elif entry_type == "compaction":
            self._compaction_entry(entry, fact_id, seq)
        else:
            raise _Invalid(INVALID_FACT, seq)

    def _message_entry(self, entry: Any, fact_id: str, seq: int) -> None:
        message = entry.get("message")
        code = _message_error(message)
        if code is not None:
            raise _Invalid(code, seq)
        role = message["role"]
        if role == "user":
            if fact_id in self._ids:  # reserved: _fact has ruled out fact IDs
                raise _Invalid(DUPLICATE_ID, seq)
            if not USER_ENTRY.issuperset(entry):
                raise _Invalid(INVALID_FACT, seq)
            self._accept_message(fact_id, _Entry("user", len(self._transcript), message))
        elif role == "assistant":
            self._assistant_entry(entry, message, fact_id, seq)
        elif "assistantEntryId" in entry or "toolIndex" in entry:
            self._pre_execution_result(entry, message, fact_id, seq)
        else:
            self._started_result(entry, message, fact_id, seq)

    def _accept_message(self, fact_id: str, info: _Entry) -> None:
        message = info.message
        assert message is not None
        self._add_entry(fact_id, info)
        self._transcript.append(message)
        self._transcript_ids.append(fact_id)
        self._context.append(message)
        self._boundary = fact_id

    def _add_entry(self, fact_id: str, info: _Entry) -> None:
        entries = self._entries
        info.order = len(entries)
        entries[fact_id] = info
        undo = self._undo
        if undo is not None:
            undo.append((entries.pop, (fact_id, None)))

    def _assistant_entry(self, entry: Any, message: Any, fact_id: str, seq: int) -> None:
        if fact_id in self._ids:  # reserved: _fact has ruled out fact IDs
            raise _Invalid(DUPLICATE_ID, seq)
        if not ASSISTANT_ENTRY.issuperset(entry):
            raise _Invalid(INVALID_FACT, seq)
        step_id = entry.get("stepId")
        attempt_id = entry.get("attemptId")
        attempt = self._attempts.get(attempt_id) if type(attempt_id) is str else None
        if attempt is None or attempt.step_id != step_id:  # a match proves both IDs
            if not _is_id(step_id) or not _is_id(attempt_id):
                raise _Invalid(INVALID_FACT, seq)
        stop = _enum(_STOP_REASONS, entry.get("stopReason"))
        if stop is None:
            raise _Invalid(INVALID_FACT, seq)
        if (
            attempt is None
            or attempt.step_id != step_id
            or not attempt.open
            or attempt.kind is not StepKind.ASSISTANT
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        active = self._active
        if active is None or active.kind != "run" or attempt.operation_id != active.id:
            raise _Invalid(INVALID_TRANSITION, seq)
        has_calls = "tool_calls" in message
        if (stop is StopReason.TOOL_USE and not has_calls) or (
            stop is StopReason.STOP and has_calls
        ):
            raise _Invalid(INVALID_TRANSCRIPT, seq)
        self._settle(attempt, fact_id)
        info = _Entry(
            "assistant", len(self._transcript), message, active.id, step_id, attempt_id, stop
        )
        self._accept_message(fact_id, info)

    def _result_common(self, entry: Any, allowed: frozenset[str], seq: int) -> None:
        if not allowed.issuperset(entry):
            raise _Invalid(INVALID_FACT, seq)
        if not _is_id(entry.get("stepId")):
            raise _Invalid(INVALID_FACT, seq)
        result = entry.get("result")
        if type(result) is not dict or not RESULT.issuperset(result):
            raise _Invalid(INVALID_FACT, seq)
        if not _is_text(entry.get("toolName")):
            raise _Invalid(INVALID_FACT, seq)

    def _pre_execution_result(self, entry: Any, message: Any, fact_id: str, seq: int) -> None:
        self._result_common(entry, PRE_TOOL_ENTRY, seq)
        result = entry["result"]
        reason = result.get("reason")
        if result.get("type") != "synthetic" or not _one_of(reason, PRE_EXECUTION_REASONS):
            raise _Invalid(INVALID_FACT, seq)
        assistant_id = entry.get("assistantEntryId")
        index = entry.get("toolIndex")
        if not _is_id(assistant_id) or not _is_int(index):
            raise _Invalid(INVALID_FACT, seq)
        step_id = entry["stepId"]
        target = self._entries.get(assistant_id)
        active = self._active
        if (
            target is None
            or target.role is None
            or target.step_id is None
            or target.step_id != step_id
            or active is None
            or active.kind != "run"
            or target.operation_id != active.id
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        call = _tool_call(target, index)
        if (
            call is None
            or call["id"] != message["tool_call_id"]
            or call["function"]["name"] != entry["toolName"]
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        if target.used_calls >> index & 1:
            raise _Invalid(INVALID_TRANSITION, seq)
        if message["content"] != SYNTHETIC_CONTENT[reason]:
            raise _Invalid(INVALID_TRANSCRIPT, seq)
        self._use_call(target, index)
        info = _Entry("tool", len(self._transcript), message, active.id, step_id)
        self._accept_message(fact_id, info)
        self._failed.append(info.index)  # synthetic: the call never ran

    def _use_call(self, target: _Entry, index: int) -> None:
        """Mark the pair (``target``, ``index``) as started or answered (spec 7.4, 8.5)."""
        undo = self._undo
        if undo is not None:
            undo.append((setattr, (target, "used_calls", target.used_calls)))
        target.used_calls |= 1 << index

    def _started_result(self, entry: Any, message: Any, fact_id: str, seq: int) -> None:
        self._result_common(entry, STARTED_TOOL_ENTRY, seq)
        if self._ids.get(fact_id) != _RESERVED_TOOL_RESULT:
            raise _Invalid(INVALID_REFERENCE, seq)
        result = entry["result"]
        result_type = result.get("type")
        if result_type == "synthetic":
            if result.get("reason") != "interrupted":
                raise _Invalid(INVALID_FACT, seq)
            if message["content"] != SYNTHETIC_CONTENT["interrupted"]:
                raise _Invalid(INVALID_TRANSCRIPT, seq)
        elif result_type == "success" or result_type == "error":
            if "reason" in result:
                raise _Invalid(INVALID_FACT, seq)
        else:
            raise _Invalid(INVALID_FACT, seq)
        tool = _find(self._tools, entry.get("toolStartedId"), seq)
        if (
            tool is None
            or tool.step_id != entry["stepId"]
            or tool.result_entry_id != fact_id
            or tool.tool_call_id != message["tool_call_id"]
            or tool.tool_name != entry["toolName"]
            or not self._is_pending(tool)
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        self._consume(fact_id)
        info = _Entry("tool", len(self._transcript), message, tool.operation_id, tool.step_id)
        self._accept_message(fact_id, info)
        if result_type != "success":
            self._failed.append(info.index)
        if result_type == "error" and tool.tool_started_id in self._started_now:
            self._note_denial(tool, message["content"], fact_id)

    def _note_denial(self, tool: ToolCallState, content: Any, result_id: str) -> None:
        """Note a call a person denied (its error result says so, and it came in the
        transaction that started the call: it never ran)."""
        if type(content) is not str or not content.startswith(PERSON_DENIAL_PREFIX):
            return
        self._person_denials.append(
            PersonDenial(
                tool_name=tool.tool_name,
                assistant_entry_id=tool.assistant_entry_id,
                tool_index=tool.tool_index,
                position=self._entries[tool.assistant_entry_id].index,
                result_entry_id=result_id,
            )
        )

    def _is_pending(self, tool: ToolCallState) -> bool:
        """Whether a started tool still awaits its result.

        Tool states are stored as recorded (pending). The provisioned result ID is
        reserved, so the only entry that can ever be accepted under it is the tool's
        result: the tool is completed exactly when that entry exists. Deriving the
        status avoids rebuilding the frozen tool state (and an undo step) per result.
        """
        return tool.result_entry_id not in self._entries

    def _any_pending(self, op: _Operation) -> bool:
        entries = self._entries
        return any(tool.result_entry_id not in entries for tool in op.tools)

    # ------------------------------------------------------------------ compaction (13.3)

    def _compaction_entry(self, entry: Any, fact_id: str, seq: int) -> None:
        if self._ids.get(fact_id) != _RESERVED_COMPACTION_RESULT:
            raise _Invalid(INVALID_REFERENCE, seq)
        if not COMPACTION_ENTRY.issuperset(entry):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(entry.get("operationId"), seq)
        if op.kind != "compaction" or op is not self._active:
            raise _Invalid(INVALID_TRANSITION, seq)
        if op.result_entry_id != fact_id:
            raise _Invalid(INVALID_REFERENCE, seq)
        through_id = entry.get("compactedThroughEntryId")
        if not _is_id(through_id):
            raise _Invalid(INVALID_FACT, seq)
        through = self._entries.get(through_id)
        if through is None:
            raise _Invalid(INVALID_REFERENCE, seq)
        summary = entry.get("summary")
        tail = entry.get("retainedTail")
        if type(summary) is not str or type(tail) is not list:
            raise _Invalid(INVALID_FACT, seq)
        input_entry = self._entries.get(op.input_entry_id)
        if input_entry is None or through.order > input_entry.order:
            raise _Invalid(INVALID_REFERENCE, seq)
        start = _messages_through(through)
        expected = self._transcript_ids[start : _messages_through(input_entry)]
        retained: list[Message] = []
        for position, item in enumerate(tail):
            if type(item) is not dict or not TAIL_ITEM.issuperset(item):
                raise _Invalid(INVALID_FACT, seq)
            if not _is_id(item.get("sourceEntryId")):
                raise _Invalid(INVALID_FACT, seq)
            code = _message_error(item.get("message"))
            if code is not None:
                raise _Invalid(code, seq)
            if position >= len(expected) or item["sourceEntryId"] != expected[position]:
                raise _Invalid(INVALID_REFERENCE, seq)
            source = self._transcript[start + position]
            if source != item["message"]:
                raise _Invalid(INVALID_REFERENCE, seq)
            retained.append(source)
        if len(tail) != len(expected):
            raise _Invalid(INVALID_REFERENCE, seq)
        if self._scan(frozenset(), retained, 0) is None:
            raise _Invalid(INVALID_TRANSCRIPT, seq)
        attempt = self._attempts.get(op.attempt_id) if op.attempt_id is not None else None
        if attempt is None or not attempt.open or attempt.kind is not StepKind.COMPACTION:
            raise _Invalid(INVALID_TRANSITION, seq)
        self._consume(fact_id)
        self._settle(attempt, fact_id)
        info = _Entry(None, len(self._transcript), None, op.id, attempt.step_id, op.attempt_id)
        self._add_entry(fact_id, info)
        summary_message: Message = {"role": "user", "content": "[Compacted history]\n" + summary}
        self._context = [summary_message, *retained]
        self._boundary = op.input_entry_id

    # ------------------------------------------------------------------ records (13.4)

    def _record_fact(self, fact: Any, fact_id: str, seq: int) -> None:
        if not RECORD_FACT.issuperset(fact):
            raise _Invalid(INVALID_FACT, seq)
        record: Any = fact.get("record")
        if type(record) is not dict:
            raise _Invalid(INVALID_FACT, seq)
        record_type: Any = record.get("type")
        handler = _enum(_RECORD_HANDLERS, record_type)
        if handler is None:
            raise _Invalid(INVALID_FACT, seq)
        handler(self, record, fact_id, seq)

    def _run_started(self, record: Any, fact_id: str, seq: int) -> None:
        if not RUN_STARTED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        if record.get("operationKind") != "run" or self._active is not None:
            raise _Invalid(INVALID_TRANSITION, seq)
        op_id = self._new(record.get("operationId"), seq)
        input_id = record.get("inputEntryId")
        target = _find(self._entries, input_id, seq)
        if target is None or target.role != "user":
            raise _Invalid(INVALID_REFERENCE, seq)
        op = _Operation(op_id, "run", input_id)
        totals = self._usage
        op.usage_start = Usage(totals[0], totals[1], totals[2], totals[3])
        op.started_ms = self._timestamp
        op.transcript_from = len(self._transcript)
        self._start_operation(op)

    def _start_operation(self, op: _Operation) -> None:
        operations = self._operations
        operations[op.id] = op
        undo = self._undo
        if undo is not None:
            undo.append((operations.pop, (op.id, None)))
        self._active = op

    def _compaction_started(self, record: Any, fact_id: str, seq: int) -> None:
        if not COMPACTION_STARTED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        if record.get("operationKind") != "compaction" or self._active is not None:
            raise _Invalid(INVALID_TRANSITION, seq)
        op_id = self._new(record.get("operationId"), seq)
        through_id = record.get("inputThroughEntryId")
        if not _is_id(through_id):
            raise _Invalid(INVALID_FACT, seq)
        result_id = self._new(record.get("resultEntryId"), seq)
        self._ids[result_id] = _RESERVED_COMPACTION_RESULT  # undo pops it already
        through = self._entries.get(through_id)
        if through is None:
            raise _Invalid(INVALID_REFERENCE, seq)
        claimed = record.get("sourceDigest")
        if not _is_digest(claimed):
            raise _Invalid(INVALID_FACT, seq)
        if claimed != self._source_digest_through(through):
            raise _Invalid(INVALID_REFERENCE, seq)
        op = _Operation(op_id, "compaction", through_id, result_id)
        compacted = record.get("compactedEntryIds")
        if type(compacted) is list and compacted and type(compacted[-1]) is str:
            op.compacted_through = compacted[-1]
        self._start_operation(op)

    def _source_digest_through(self, through: _Entry) -> str:
        """``sourceDigest`` (spec 10.4) over the message entries through ``through``.

        The running hash is advanced lazily, here, over the messages accepted since
        it was last advanced: compactions are rare, so ordinary transactions never
        pay for hashing, and a compaction of the latest boundary costs only the
        messages added since the previous one (the undo log restores the hash).
        """
        count = _messages_through(through)
        source = self._source
        ids = self._transcript_ids
        messages = self._transcript
        if count < len(source):
            return source_digest((ids[i], messages[i]) for i in range(count))
        if count > len(source):
            self._record(setattr, self, "_source", source.copy())
        for i in range(len(source), count):
            source.add(ids[i], messages[i])
        return source.digest()

    def _step_attempt(self, record: Any, fact_id: str, seq: int) -> None:
        if not STEP_ATTEMPT.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(record.get("operationId"), seq)
        number = record.get("attempt")
        if not _is_int(number) or number < 1:
            raise _Invalid(INVALID_FACT, seq)
        step_id = record.get("stepId")
        if number == 1:
            step_id = self._new(step_id, seq)
        elif not _is_id(step_id):
            raise _Invalid(INVALID_FACT, seq)
        attempt_id = self._new(record.get("attemptId"), seq)
        kind = _enum(_STEP_KINDS, record.get("stepKind"))
        if number > 2 or kind is None:
            raise _Invalid(INVALID_FACT, seq)
        if (kind is StepKind.ASSISTANT) != (op.kind == "run"):
            raise _Invalid(INVALID_TRANSITION, seq)
        context = record.get("contextThroughEntryId")
        if _find(self._entries, context, seq) is None:
            raise _Invalid(INVALID_REFERENCE, seq)
        if number == 1 and context != self._boundary:
            raise _Invalid(INVALID_TRANSITION, seq)
        snapshot = record.get("configurationSnapshot")
        digest = record.get("configurationDigest")
        # A snapshot JSON-equal to one already verified under the same digest is valid
        # and matches it; only other snapshots need the checks and the digest.
        known = self._snapshots.get(digest) if type(digest) is str else None
        if known is None or known != snapshot:
            if not _valid_snapshot(snapshot):
                raise _Invalid(INVALID_FACT, seq)
            if not _is_digest(digest):
                raise _Invalid(INVALID_FACT, seq)
            try:
                computed = configuration_digest(snapshot)
            except CanonicalizationError:  # pragma: no cover - validated above
                raise _Invalid(INVALID_FACT, seq) from None
            if computed != digest:
                raise _Invalid(INVALID_FACT, seq)
            if known is None:
                self._snapshots[digest] = snapshot
                self._record(self._snapshots.pop, digest, None)
            known = snapshot
        if number == 1:
            current = self._attempts.get(op.attempt_id) if op.attempt_id is not None else None
            if current is not None:
                settled_by = current.settled_by
                settling = self._entries.get(settled_by) if settled_by is not None else None
                if (
                    current.failed
                    or settling is None
                    or op.kind != "run"
                    or settling.stop_reason is not StopReason.TOOL_USE
                    or self._any_pending(op)
                ):
                    raise _Invalid(INVALID_TRANSITION, seq)
        else:
            # "Exactly one attempt exists for stepId, it is attempt 1 and still open"
            # holds iff the operation's current attempt is that attempt: an operation
            # never has an open attempt other than its current one (attempt 1 of a new
            # step needs the current one settled, attempt 2 closes attempt 1, and
            # recording attempt 2 makes it the current one).
            first = self._attempts.get(op.attempt_id) if op.attempt_id is not None else None
            if (
                first is None
                or first.step_id != step_id
                or first.number != 1
                or not first.open
                or first.failed
                or first.kind is not kind
                or first.operation_id != op.id
                or first.context != context
                or first.digest != digest
            ):
                raise _Invalid(INVALID_TRANSITION, seq)
            self._setattr(first, "open", False)
        attempt = _Attempt(op.id, step_id, number, kind, context, known, digest)
        self._attempts[attempt_id] = attempt
        undo = self._undo
        if undo is not None:
            undo.append((self._attempts.pop, (attempt_id, None)))
            undo.append((setattr, (op, "step_id", op.step_id)))
            undo.append((setattr, (op, "attempt_id", op.attempt_id)))
        op.step_id = step_id
        op.attempt_id = attempt_id
        if number == 1:
            self._step_count += 1

    def _step_failed(self, record: Any, fact_id: str, seq: int) -> None:
        if not STEP_FAILED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(record.get("operationId"), seq)
        attempt_id = record.get("attemptId")
        if not _is_id(attempt_id):
            raise _Invalid(INVALID_FACT, seq)
        if not _valid_error(record.get("error")):
            raise _Invalid(INVALID_FACT, seq)
        attempt = self._attempts.get(attempt_id)
        if (
            attempt is None
            or attempt.operation_id != op.id
            or attempt.step_id != record.get("stepId")
            or not attempt.open
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        self._setattr(attempt, "open", False)
        self._setattr(attempt, "failed", True)

    def _tool_started(self, record: Any, fact_id: str, seq: int) -> None:
        if not TOOL_STARTED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(record.get("operationId"), seq)
        if op.kind != "run" or op is not self._active:
            raise _Invalid(INVALID_TRANSITION, seq)
        assistant_id = record.get("assistantEntryId")
        target = _find(self._entries, assistant_id, seq)
        if (
            target is None
            or target.role is None
            or target.stop_reason is not StopReason.TOOL_USE
            or target.operation_id != op.id
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        index = record.get("toolIndex")
        call_id = record.get("toolCallId")
        name = record.get("toolName")
        if not _is_int(index) or not _is_text(call_id) or not _is_text(name):
            raise _Invalid(INVALID_FACT, seq)
        call = _tool_call(target, index)
        if (
            call is None
            or call["id"] != call_id
            or call["function"]["name"] != name
            or target.step_id != record.get("stepId")
        ):
            raise _Invalid(INVALID_REFERENCE, seq)
        if target.used_calls >> index & 1:
            raise _Invalid(INVALID_TRANSITION, seq)
        arguments = record.get("arguments")
        replay = _enum(_REPLAYS, record.get("replay"))
        replay_key = record.get("replayKey")
        if type(arguments) is not dict or replay is None or not _is_text(replay_key):
            raise _Invalid(INVALID_FACT, seq)
        producer = self._attempts[target.attempt_id] if target.attempt_id else None
        if producer is None or not any(t["name"] == name for t in producer.snapshot["tools"]):
            raise _Invalid(INVALID_TRANSITION, seq)
        result_id = self._new(record.get("resultEntryId"), seq)
        self._ids[result_id] = _RESERVED_TOOL_RESULT
        environment = record.get("environmentIdentity")
        if not _is_id(record.get("stepId")) or not _is_text(environment):
            raise _Invalid(INVALID_FACT, seq)
        self._use_call(target, index)
        tool = ToolCallState(
            operation_id=op.id,
            tool_started_id=fact_id,
            step_id=record["stepId"],
            assistant_entry_id=assistant_id,
            tool_index=index,
            tool_call_id=call_id,
            tool_name=name,
            arguments=arguments,
            replay=replay,
            replay_key=replay_key,
            environment_identity=environment,
            result_entry_id=result_id,
            status=ToolStatus.PENDING,
        )
        self._tools[fact_id] = tool
        op.tools.append(tool)
        self._started_now.add(fact_id)
        undo = self._undo
        if undo is not None:
            undo.append((self._tools.pop, (fact_id, None)))
            undo.append((op.tools.pop, ()))

    def _abort_requested(self, record: Any, fact_id: str, seq: int) -> None:
        if not ABORT_REQUESTED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(record.get("operationId"), seq)
        if record.get("operationKind") != op.kind or record.get("reason") != "escape":
            raise _Invalid(INVALID_TRANSITION, seq)
        phase = record.get("phase")
        if not _one_of(phase, ABORT_PHASES):
            raise _Invalid(INVALID_FACT, seq)
        has_call = type(record.get("toolCallId")) is str
        if (phase == "tool") != has_call or (phase != "tool" and "toolCallId" in record):
            raise _Invalid(INVALID_FACT, seq)
        if op is not self._active or op.abort_requested:
            raise _Invalid(INVALID_TRANSITION, seq)
        self._setattr(op, "abort_requested", True)

    def _operation_finished(self, record: Any, fact_id: str, seq: int) -> None:
        if not OPERATION_FINISHED.issuperset(record):
            raise _Invalid(INVALID_FACT, seq)
        op = self._lookup(record.get("operationId"), seq)
        outcome = record.get("outcome")
        if record.get("operationKind") != op.kind or not _one_of(outcome, OUTCOMES):
            raise _Invalid(INVALID_TRANSITION, seq)
        if op is not self._active:
            raise _Invalid(INVALID_TRANSITION, seq)
        attempt = self._attempts.get(op.attempt_id) if op.attempt_id is not None else None
        if outcome == "completed":
            self._check_completion(record, op, seq)
        elif "finalEntryId" in record:
            raise _Invalid(INVALID_FACT, seq)
        if outcome == "aborted" and (
            not op.abort_requested
            or self._any_pending(op)
            or (attempt is not None and attempt.open)
        ):
            raise _Invalid(INVALID_TRANSITION, seq)
        if outcome != "completed" and "completion" in record:
            raise _Invalid(INVALID_FACT, seq)
        if outcome == "failed":
            if not _valid_error(record.get("error")):
                raise _Invalid(INVALID_FACT, seq)
        elif "error" in record:
            raise _Invalid(INVALID_FACT, seq)
        self._setattr(op, "finished", True)
        self._active = None
        error = record.get("error")
        self._setattr(
            self,
            "_last_finished",
            FinishedOperation(
                operation_id=op.id,
                kind="run" if op.kind == "run" else "compaction",
                outcome=outcome,
                completion=record.get("completion"),
                error=MappingProxyType(dict(error)) if error is not None else None,
                final_entry_id=record.get("finalEntryId"),
            ),
        )

    def _check_completion(self, record: Any, op: _Operation, seq: int) -> None:
        completion = record.get("completion")
        if op.kind == "run":
            if completion != "normal" and completion != "truncated":
                raise _Invalid(INVALID_FACT, seq)
        elif "completion" in record:
            raise _Invalid(INVALID_FACT, seq)
        final_id = record.get("finalEntryId")
        final = _find(self._entries, final_id, seq)
        if op.kind == "run":
            wanted = StopReason.STOP if completion == "normal" else StopReason.LENGTH
            if (
                final is None
                or final.operation_id != op.id
                or final.role is None
                or final.stop_reason is not wanted
            ):
                raise _Invalid(INVALID_REFERENCE, seq)
            self._check_settled_by(final, final_id, op, seq)
            message = final.message
            assert message is not None
            if (
                message["role"] != "assistant"
                or (completion == "normal" and is_blank(message["content"]))
                or (completion == "truncated" and "tool_calls" not in message)
                or self._any_pending(op)
            ):
                raise _Invalid(INVALID_TRANSCRIPT, seq)
        else:
            if (
                final is None
                or final.operation_id != op.id
                or final.role is not None
                or final_id != op.result_entry_id
            ):
                raise _Invalid(INVALID_REFERENCE, seq)
            self._check_settled_by(final, final_id, op, seq)

    def _check_settled_by(self, final: _Entry, final_id: str, op: _Operation, seq: int) -> None:
        attempt = self._attempts.get(final.attempt_id) if final.attempt_id else None
        if (
            attempt is None
            or attempt.open
            or attempt.failed
            or attempt.operation_id != op.id
            or attempt.step_id != op.step_id
            or attempt.settled_by != final_id
        ):
            raise _Invalid(INVALID_REFERENCE, seq)

    # ------------------------------------------------------------------ usage (13.5)

    def _usage_fact(self, fact: Any, seq: int) -> None:
        if not USAGE_FACT.issuperset(fact):
            raise _Invalid(INVALID_FACT, seq)
        op_id = fact.get("operationId")
        if _find(self._operations, op_id, seq) is None:
            raise _Invalid(INVALID_REFERENCE, seq)
        has_attempt = "attemptId" in fact
        if has_attempt == ("toolStartedId" in fact):
            raise _Invalid(INVALID_FACT, seq)
        owner_id = fact["attemptId"] if has_attempt else fact["toolStartedId"]
        owner: _Attempt | ToolCallState | None = (
            _find(self._attempts, owner_id, seq)
            if has_attempt
            else _find(self._tools, owner_id, seq)
        )
        if owner is None or owner.operation_id != op_id:
            raise _Invalid(INVALID_REFERENCE, seq)
        usage = fact.get("usage")
        if type(usage) is not dict or not USAGE.issuperset(usage):
            raise _Invalid(INVALID_FACT, seq)
        totals = []
        for total, name in zip(self._usage, USAGE_COUNTERS, strict=True):
            value: Any = usage.get(name)
            if type(value) is not int or value < 0 or total + value > MAX_SAFE_INTEGER:
                raise _Invalid(INVALID_FACT, seq)
            totals.append(total + value)
        self._usage = totals

    # ------------------------------------------------------------------ snapshot

    def _snapshot(self) -> SessionState:
        totals = self._usage
        cached = self._last_usage
        if cached is not None and cached[0] is totals:
            usage = cached[1]
        else:
            usage = Usage(totals[0], totals[1], totals[2], totals[3])
            self._last_usage = (totals, usage)
        return SessionState(
            header=self._header,
            transcript=FrozenView(self._transcript),
            active_context=FrozenView(self._context),
            usage=usage,
            operation=self._operation_snapshot(),
            repaired_length=self._length,
            context_boundary=self._boundary,
            last_seq=self._next_seq - 1,
            transcript_ids=FrozenView(self._transcript_ids),
            failed_results=FrozenView(self._failed),
            step_count=self._step_count,
            last_finished=self._last_finished,
            person_denials=FrozenView(self._person_denials),
        )

    def _operation_snapshot(self) -> Operation:
        op = self._active
        if op is None:
            return IDLE
        step = self._step_snapshot(op)
        if op.kind == "run":
            return RunOperation(
                operation_id=op.id,
                input_entry_id=op.input_entry_id,
                tool_calls=self._tool_snapshots(op),
                abort_requested=op.abort_requested,
                step=step,
                usage_at_start=op.usage_start,
                started_ms=op.started_ms,
                entries_from=op.transcript_from,
            )
        assert op.result_entry_id is not None
        return CompactionOperation(
            operation_id=op.id,
            input_through_entry_id=op.input_entry_id,
            result_entry_id=op.result_entry_id,
            abort_requested=op.abort_requested,
            step=step,
            compacted_through_entry_id=op.compacted_through,
        )

    def _tool_snapshots(self, op: _Operation) -> tuple[ToolCallState, ...]:
        """``op.tools`` with their current status, in O(pending) beyond a tuple copy."""
        tools = op.tools
        done = op.done_tools
        is_pending = self._is_pending
        n = len(done)
        while n < len(tools) and not is_pending(tools[n]):
            done.append(_completed(tools[n]))
            n += 1
        if n == len(tools):
            return tuple(done)
        rest = [tool if is_pending(tool) else _completed(tool) for tool in tools[n:]]
        return (*done, *rest)

    def _step_snapshot(self, op: _Operation) -> Step | None:
        if op.attempt_id is None:
            return None
        attempt = self._attempts[op.attempt_id]
        # The attempt id names its operation too: an attempt belongs to one operation.
        key = (op.attempt_id, attempt.failed, attempt.settled_by)
        cached = self._last_step
        if cached is not None and cached[0] == key:
            return cached[1]
        if attempt.failed:
            status = StepStatus.FAILED
        elif attempt.settled_by is not None:
            status = StepStatus.SETTLED
        else:
            status = StepStatus.ATTEMPTING
        stop = None
        if attempt.settled_by is not None:
            stop = self._entries[attempt.settled_by].stop_reason
        # One digest names one canonical snapshot (checked when it was recorded).
        configuration = self._frozen_configurations.get(attempt.digest)
        if configuration is None:
            configuration = _snapshot_value(attempt.snapshot)
            self._frozen_configurations[attempt.digest] = configuration
        step = Step(
            operation_id=op.id,
            step_id=attempt.step_id,
            attempt_id=op.attempt_id,
            attempt=attempt.number,
            step_kind=attempt.kind,
            status=status,
            context_through_entry_id=attempt.context,
            configuration_snapshot=configuration,
            configuration_digest=attempt.digest,
            settled_entry_id=attempt.settled_by,
            stop_reason=stop,
        )
        self._last_step = (key, step)
        return step


_RECORD_HANDLERS: dict[str, Callable[[Reducer, dict[str, Any], str, int], None]] = {
    "runStarted": Reducer._run_started,
    "compactionStarted": Reducer._compaction_started,
    "stepAttempt": Reducer._step_attempt,
    "stepFailed": Reducer._step_failed,
    "toolStarted": Reducer._tool_started,
    "abortRequested": Reducer._abort_requested,
    "operationFinished": Reducer._operation_finished,
}


def reduce_session(data: bytes) -> SessionState:
    """Reduce a whole session log (spec section 11), or raise :class:`SessionCorruption`."""
    return Reducer.load(data).state


# ---------------------------------------------------------------------- helpers


def _fail_header(code: str = INVALID_HEADER) -> NoReturn:
    raise SessionCorruption(code, 1)


def _parse_header(value: Any) -> Header:
    """Header rules of spec section 4, in the table's order."""
    if type(value) is not dict or not HEADER.issuperset(value):
        _fail_header()
    if value.get("kind") != "header":
        _fail_header()
    version = value.get("version")
    if type(version) not in (int, float) or version != 2:
        _fail_header(UNSUPPORTED_VERSION)
    if not _is_id(value.get("id")) or not _is_int(value.get("createdAt")):
        _fail_header()
    for name in ("cwd", "provider", "model", "environmentIdentity"):
        if not _is_text(value.get(name)):
            _fail_header()
    return Header(
        id=value["id"],
        created_at=value["createdAt"],
        cwd=value["cwd"],
        provider=value["provider"],
        model=value["model"],
        environment_identity=value["environmentIdentity"],
    )


def _message_error(message: Any) -> str | None:
    """Spec 6.1: ``None`` if valid, else the error code."""
    if type(message) is not dict:
        return INVALID_FACT
    role = message.get("role")
    content = message.get("content")
    if role == "user":
        if not USER_MESSAGE.issuperset(message) or not _is_text(content):
            return INVALID_FACT
        return None
    if role == "tool":
        if (
            not TOOL_MESSAGE.issuperset(message)
            or type(content) is not str
            or not _is_text(message.get("tool_call_id"))
        ):
            return INVALID_FACT
        return None
    if role != "assistant":
        return INVALID_FACT
    if not ASSISTANT_MESSAGE.issuperset(message) or "content" not in message:
        return INVALID_FACT
    if content is not None and type(content) is not str:
        return INVALID_FACT
    if "tool_calls" not in message:
        return None
    calls = message["tool_calls"]
    if type(calls) is not list or not calls:
        return INVALID_FACT
    for call in calls:
        if type(call) is not dict or not TOOL_CALL.issuperset(call):
            return INVALID_FACT
        function = call.get("function")
        if (
            not _is_text(call.get("id"))
            or call.get("type") != "function"
            or type(function) is not dict
            or not FUNCTION.issuperset(function)
            or not _is_text(function.get("name"))
            or type(function.get("arguments")) is not str
        ):
            return INVALID_FACT
    if len({call["id"] for call in calls}) != len(calls):
        return INVALID_TRANSCRIPT
    return None


def _completed(tool: ToolCallState) -> ToolCallState:
    """``tool`` with status completed."""
    return ToolCallState(
        tool.operation_id,
        tool.tool_started_id,
        tool.step_id,
        tool.assistant_entry_id,
        tool.tool_index,
        tool.tool_call_id,
        tool.tool_name,
        tool.arguments,
        tool.replay,
        tool.replay_key,
        tool.environment_identity,
        tool.result_entry_id,
        ToolStatus.COMPLETED,
    )


def _tool_call(target: _Entry, index: int) -> Mapping[str, Any] | None:
    message = target.message
    if message is None:
        return None
    calls = message.get("tool_calls")
    if not calls or index >= len(calls):
        return None
    call: Mapping[str, Any] = calls[index]
    return call


def _messages_through(entry: _Entry) -> int:
    """Number of message entries accepted up to and including ``entry``."""
    return entry.index + 1 if entry.role is not None else entry.index


def _valid_error(error: Any) -> bool:
    return (
        type(error) is dict
        and ERROR.issuperset(error)
        and _is_text(error.get("code"))
        and _is_text(error.get("message"))
    )


def _valid_snapshot(snapshot: Any) -> bool:
    """Spec 10.2: six members, all required, no others."""
    if type(snapshot) is not dict or len(snapshot) != 6 or not SNAPSHOT.issuperset(snapshot):
        return False
    if not (
        _is_text(snapshot["model"])
        and _is_digest(snapshot["systemPromptDigest"])
        and _is_text(snapshot["adapterIdentity"])
        and _is_text(snapshot["routingIdentity"])
        and _is_digest(snapshot["outputOptionsDigest"])
    ):
        return False
    tools = snapshot["tools"]
    if type(tools) is not list:
        return False
    names: set[str] = set()
    for tool in tools:
        if type(tool) is not dict or len(tool) != 2 or not SNAPSHOT_TOOL.issuperset(tool):
            return False
        name = tool["name"]
        if not _is_text(name) or not _is_digest(tool["definitionDigest"]) or name in names:
            return False
        names.add(name)
    return True


def _snapshot_value(snapshot: Mapping[str, Any]) -> ConfigurationSnapshot:
    return ConfigurationSnapshot(
        model=snapshot["model"],
        system_prompt_digest=snapshot["systemPromptDigest"],
        tools=tuple(ToolConfig(t["name"], t["definitionDigest"]) for t in snapshot["tools"]),
        adapter_identity=snapshot["adapterIdentity"],
        routing_identity=snapshot["routingIdentity"],
        output_options_digest=snapshot["outputOptionsDigest"],
    )
