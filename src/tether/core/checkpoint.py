"""A checkpoint of the reducer: its whole state after a log prefix, as explicit JSON.

Reducing a long log checks every fact again on every open; a checkpoint lets a reader start
from the state the reducer had after the first ``length`` bytes and reduce only the lines
after them. It is a cache, never a source of truth: the log's format is unchanged, and
deleting a checkpoint changes nothing but speed.

Rules of this module:

* **Explicit and versioned.** Every field of :class:`~tether.core.reducer.Reducer` that a
  later line's checks read (the ID namespace, the entries, the transcript and the context,
  the attempts, the started tools, the operations, the usage totals, ``seq``, …) is written
  as plain JSON values by :func:`encode_checkpoint` and rebuilt by
  :func:`decode_checkpoint`; nothing is pickled or marshalled. :data:`CHECKPOINT_FORMAT`
  names this layout; a checkpoint of another format is refused.
* **Bound to the exact prefix it covers** (:class:`CheckpointBinding`): its length in bytes,
  its line count, the SHA-256 of its bytes, the session ID, and the identity of the reducer
  code that produced it (computed by the shell, which can read the sources:
  :mod:`tether._stores.checkpoints`). The shell hashes the log it read and compares; this
  module checks the binding is the one expected and parses the header from the log itself.
* **Three lines**: the binding (with the length and CRC-32 of the two others), the *view*
  (what a snapshot of the state reads: the transcript, the context, the totals, …, decoded
  at once) and the *checks* (the indexes only a later line's checks read, the bulk of the
  state: decoded by :meth:`Reducer._complete` when the first line is checked, so that an
  open that only reads the state never builds them).
* **Refused, never half-used.** Anything wrong — bytes that are not a checkpoint, another
  format, a section whose length or CRC-32 does not match, a value of the wrong shape, a
  binding that is not the one expected — raises :class:`~tether.errors.CheckpointMismatch`
  and nothing else (for the checks, when they are decoded, leaving the reducer as it was);
  the shell then reduces the whole log as if there were no checkpoint.
* **What is left out is derived or transient**: the snapshot caches (``_state``,
  ``_frozen_configurations``, ``_last_step``, ``_last_usage``, the operations' completed-tool
  memos), the running compaction source hash (restarted empty: the next compaction hashes
  from the first message, with the same digest), ``_started_now`` and ``_timestamp`` (reset
  by the next transaction before they are read) and the undo log (only inside a
  transaction; a checkpoint is taken between transactions).

Pure, like all of :mod:`tether.core`: bytes in, bytes out; hashing of the log is the
shell's.
"""

from __future__ import annotations

import zlib
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Final

import orjson

from tether.core.records import record
from tether.core.reducer import (
    _FACT_ID,
    _REPLAYS,
    _RESERVED_COMPACTION_RESULT,
    _RESERVED_FOREVER,
    _RESERVED_TOOL_RESULT,
    _STEP_KINDS,
    _STOP_REASONS,
    Reducer,
    _Attempt,
    _Entry,
    _Operation,
)
from tether.core.state import (
    FinishedOperation,
    PersonDenial,
    ToolCallState,
    ToolStatus,
    Usage,
)
from tether.errors import CheckpointMismatch

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointBinding",
    "decode_checkpoint",
    "encode_checkpoint",
    "read_binding",
]

CHECKPOINT_FORMAT: Final = 1
"""The layout of a checkpoint; bump it whenever :func:`encode_checkpoint`'s output changes."""

# The purposes of Reducer._ids, in the order of the checkpoint's "ids" lists.
_PURPOSES: Final = (_FACT_ID, _RESERVED_FOREVER, _RESERVED_TOOL_RESULT, _RESERVED_COMPACTION_RESULT)
_STEP_KIND_NAMES: Final = {kind: name for name, kind in _STEP_KINDS.items()}
_STOP_NAMES: Final = {reason: name for name, reason in _STOP_REASONS.items()}
_REPLAY_NAMES: Final = {replay: name for name, replay in _REPLAYS.items()}
_DICT: Final = frozenset({dict})
_STR: Final = frozenset({str})
_ROLE: Final = itemgetter("role")
_BINDING_KEYS: Final = frozenset(
    {"checkpoint", "reducer", "session", "length", "lines", "digest", "view", "checks"}
    | {"viewCrc32", "checksCrc32"}
)


@record(slots=True)
class CheckpointBinding:
    """What a checkpoint is the state of: the first ``length`` bytes (``lines`` lines, the
    header included) of the log of session ``session_id``, whose SHA-256 is ``digest``
    (``sha256:<hex>``), as reduced by the reducer code ``reducer`` (the shell's identity of
    the reducer's sources), in checkpoint format ``format``."""

    session_id: str
    length: int
    lines: int
    digest: str
    reducer: str
    format: int = CHECKPOINT_FORMAT


def _refuse(why: str) -> CheckpointMismatch:
    return CheckpointMismatch(why)


def encode_checkpoint(reducer: Reducer, binding: CheckpointBinding) -> bytes:
    """The checkpoint of ``reducer`` (between transactions) bound to ``binding``: three
    lines, the binding, the *view* (what a snapshot of the state reads) and the *checks*
    (the indexes only a later line's checks read), each one JSON document.

    Raises :class:`~tether.errors.CheckpointMismatch` if the binding is not the reducer's
    (length, lines, session) or if the state cannot be written as JSON (for instance a value
    nested deeper than the encoder allows): the caller then writes no checkpoint.
    """
    r = reducer
    if r._pending is not None or r._undo is not None:
        raise _refuse("a transaction is pending")
    r._complete()
    if (
        binding.length != r._length
        or binding.lines != r._line
        or binding.session_id != r._header.id
        or binding.format != CHECKPOINT_FORMAT
    ):
        raise _refuse("the binding does not describe this reducer")
    last = r._last_finished
    view = {
        "nextSeq": r._next_seq,
        "stepCount": r._step_count,
        "usage": list(r._usage),
        "transcript": r._transcript,
        "transcriptIds": r._transcript_ids,
        "context": _encode_context(r._context, r._transcript),
        "boundary": r._boundary,
        "openCalls": sorted(r._open_calls),
        "failed": r._failed,
        "denials": [
            [d.tool_name, d.assistant_entry_id, d.tool_index, d.position, d.result_entry_id]
            for d in r._person_denials
        ],
        "active": r._active.id if r._active is not None else None,
        "lastFinished": None
        if last is None
        else [
            last.operation_id,
            last.kind,
            last.outcome,
            last.completion,
            dict(last.error) if last.error is not None else None,
            last.final_entry_id,
        ],
    }
    ids: tuple[list[str], ...] = ([], [], [], [])
    slot = {purpose: ids[i] for i, purpose in enumerate(_PURPOSES)}
    for ident, purpose in r._ids.items():
        slot[purpose].append(ident)
    snapshots = r._snapshots
    checks = {
        # Message entries in order take the transcript's messages in order.
        "entries": [
            [
                ident,
                e.role is not None,
                e.operation_id,
                e.step_id,
                e.attempt_id,
                _STOP_NAMES[e.stop_reason] if e.stop_reason is not None else None,
                e.used_calls,
            ]
            for ident, e in r._entries.items()
        ],
        "ids": ids,
        "snapshots": snapshots,
        "attempts": [
            [
                ident,
                a.operation_id,
                a.step_id,
                a.number,
                _STEP_KIND_NAMES[a.kind],
                a.context,
                a.digest,
                a.open,
                a.failed,
                a.settled_by,
                # Shared with the verified snapshot of its digest unless recorded otherwise.
                None if snapshots.get(a.digest) is a.snapshot else a.snapshot,
            ]
            for ident, a in r._attempts.items()
        ],
        "tools": [
            [
                t.operation_id,
                t.tool_started_id,
                t.step_id,
                t.assistant_entry_id,
                t.tool_index,
                t.tool_call_id,
                t.tool_name,
                t.arguments,
                _REPLAY_NAMES[t.replay],
                t.replay_key,
                t.environment_identity,
                t.result_entry_id,
            ]
            for t in r._tools.values()
        ],
        "operations": [
            [
                op.id,
                op.kind,
                op.input_entry_id,
                op.result_entry_id,
                op.finished,
                op.abort_requested,
                op.compacted_through,
                op.step_id,
                op.attempt_id,
                [t.tool_started_id for t in op.tools],
                _usage_list(op.usage_start),
                op.started_ms,
                op.transcript_from,
            ]
            for op in r._operations.values()
        ],
    }
    try:
        view_line = orjson.dumps(view)
        checks_line = orjson.dumps(checks)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise _refuse(f"the state cannot be written as JSON: {exc}") from None
    head = orjson.dumps(
        {
            "checkpoint": binding.format,
            "reducer": binding.reducer,
            "session": binding.session_id,
            "length": binding.length,
            "lines": binding.lines,
            "digest": binding.digest,
            "view": len(view_line),
            "viewCrc32": zlib.crc32(view_line),
            "checks": len(checks_line),
            "checksCrc32": zlib.crc32(checks_line),
        }
    )
    return b"\n".join((head, view_line, checks_line))


def read_binding(raw: bytes) -> CheckpointBinding:
    """The binding on the first line of a checkpoint (the rest is not read), or
    :class:`~tether.errors.CheckpointMismatch`."""
    return _read_head(raw)[0]


def _read_head(raw: bytes) -> tuple[CheckpointBinding, dict[str, Any], int]:
    """The binding, the whole head and where the view starts."""
    end = raw.find(b"\n")
    if end < 0:
        raise _refuse("no binding line")
    try:
        head = orjson.loads(raw[:end])
    except orjson.JSONDecodeError:
        raise _refuse("the binding line is not JSON") from None
    if type(head) is not dict or set(head) != _BINDING_KEYS:
        raise _refuse("the binding line is not a checkpoint binding")
    fmt = head["checkpoint"]
    if type(fmt) is not int:
        raise _refuse("the binding line is not a checkpoint binding")
    if fmt != CHECKPOINT_FORMAT:
        raise _refuse(f"checkpoint format {fmt}, not {CHECKPOINT_FORMAT}")
    for name in ("length", "lines", "view", "viewCrc32", "checks", "checksCrc32"):
        if type(head[name]) is not int or head[name] < 0:
            raise _refuse(f"the binding's {name} is not a count")
    for name in ("reducer", "session", "digest"):
        if type(head[name]) is not str:
            raise _refuse(f"the binding's {name} is not a string")
    binding = CheckpointBinding(
        session_id=head["session"],
        length=head["length"],
        lines=head["lines"],
        digest=head["digest"],
        reducer=head["reducer"],
        format=fmt,
    )
    return binding, head, end + 1


def decode_checkpoint(raw: bytes, expected: CheckpointBinding, header_line: bytes) -> Reducer:
    """The reducer a checkpoint holds, if its binding is exactly ``expected`` (the shell's
    verdict on the log: the prefix's length, lines, digest, session and the running
    reducer's identity), its sections are whole, and the state agrees with the binding.

    ``header_line`` is the log's first line without its LF: the header is parsed from the
    log itself (the prefix digest covers it). The view is decoded now; the checks (the
    indexes of IDs, entries, attempts, tools and operations, the bulk of the state) are
    checked (CRC-32) and decoded when the reducer first checks a line
    (:meth:`Reducer._complete`), so that an open that only reads the state never builds
    them; anything wrong with them raises :class:`~tether.errors.CheckpointMismatch` then
    (the file store's writer then reduces its log in full). Raises
    :class:`~tether.errors.CheckpointMismatch` for anything else, never another error.
    """
    binding, head, start = _read_head(raw)
    if binding != expected:
        raise _refuse("the checkpoint is bound to another log prefix, session or reducer")
    view_end = start + head["view"]
    checks_end = view_end + 1 + head["checks"]
    if checks_end != len(raw) or raw[view_end : view_end + 1] != b"\n":
        raise _refuse("the checkpoint's sections are not of the lengths recorded")
    view_bytes = memoryview(raw)[start:view_end]
    checks = memoryview(raw)[view_end + 1 :]
    if zlib.crc32(view_bytes) != head["viewCrc32"]:
        raise _refuse("the checkpoint's view does not match its CRC-32")
    try:
        view = orjson.loads(view_bytes)
        reducer = Reducer.from_header_line(header_line)
        if reducer._header.id != binding.session_id:
            raise _refuse("the checkpoint is of another session")
        _fill_view(reducer, view)
    except CheckpointMismatch:
        raise
    except Exception as exc:  # any shape the encoder never writes: refused, not a crash
        raise _refuse(f"malformed checkpoint state ({type(exc).__name__})") from None
    reducer._length = binding.length
    reducer._line = binding.lines
    active = view["active"]
    crc = head["checksCrc32"]
    reducer._deferred = lambda: _fill_checks_or_refuse(reducer, checks, crc, active)
    if active is not None:  # a snapshot of an active operation reads the checks
        reducer._complete()
    return reducer


# ---------------------------------------------------------------------- helpers


def _usage_list(usage: Usage | None) -> list[int] | None:
    if usage is None:
        return None
    return [usage.input, usage.output, usage.cache_read, usage.cache_write]


def _encode_context(context: list[Any], transcript: list[Any]) -> list[Any]:
    """The context as runs ``[start, stop]`` of transcript positions (the very message
    objects of the transcript) and inline messages (a compaction's summary)."""
    position = {id(message): i for i, message in enumerate(transcript)}
    out: list[Any] = []
    run: list[int] | None = None
    for message in context:
        i = position.get(id(message))
        if i is None:
            out.append(message)
            run = None
        elif run is not None and run[1] == i:
            run[1] = i + 1
        else:
            run = [i, i + 1]
            out.append(run)
    return out


def _fill_view(r: Reducer, view: Any) -> None:
    """Set the fields a snapshot of the state reads from the decoded ``view``.

    The view is what :func:`encode_checkpoint` wrote (the shell writes it atomically and
    synced, and refuses one whose binding or sections do not match): its shape is taken as
    written, in one pass, since this is the cost of an open. A value that does not fit
    raises here and is refused by the caller.
    """
    if type(view) is not dict:
        raise _refuse("malformed checkpoint state")
    r._next_seq = _count(view["nextSeq"], 1)
    r._step_count = _count(view["stepCount"])
    usage = [_count(n) for n in view["usage"]]
    if len(usage) != 4:
        raise _refuse("malformed checkpoint state (usage)")
    r._usage = usage
    transcript = view["transcript"]
    transcript_ids = view["transcriptIds"]
    if (
        type(transcript) is not list
        or type(transcript_ids) is not list
        or len(transcript) != len(transcript_ids)
        or not set(map(type, transcript)) <= _DICT
        or not set(map(type, map(_ROLE, transcript))) <= _STR
        or not set(map(type, transcript_ids)) <= _STR
    ):
        raise _refuse("malformed checkpoint state (transcript)")
    r._transcript = transcript
    r._transcript_ids = transcript_ids
    context: list[Any] = []
    for item in view["context"]:
        if type(item) is list:
            start, stop_at = item
            if not 0 <= start < stop_at <= len(transcript):
                raise _refuse("malformed checkpoint state (context)")
            context.extend(transcript[start:stop_at])
        elif type(item) is dict:
            context.append(item)
        else:
            raise _refuse("malformed checkpoint state (context)")
    r._context = context
    r._boundary = _text(view["boundary"], optional=True)
    r._open_calls = frozenset(_text(i) for i in view["openCalls"])
    r._failed = [_count(i) for i in view["failed"]]
    r._person_denials = [
        PersonDenial(_text(name), _text(entry), _count(index), _count(at), _text(result))
        for name, entry, index, at, result in view["denials"]
    ]
    last = view["lastFinished"]
    if last is None:
        r._last_finished = None
    else:
        op_id, kind, outcome, completion, error, final_id = last
        if kind not in ("run", "compaction") or outcome not in ("completed", "failed", "aborted"):
            raise _refuse("malformed checkpoint state (last finished operation)")
        if error is not None and (
            type(error) is not dict or not all(type(v) is str for v in error.values())
        ):
            raise _refuse("malformed checkpoint state (last finished operation)")
        r._last_finished = FinishedOperation(
            operation_id=_text(op_id),
            kind=kind,
            outcome=outcome,
            completion=_text(completion, optional=True),
            error=None if error is None else MappingProxyType(dict(error)),
            final_entry_id=_text(final_id, optional=True),
        )


def _count(value: Any, least: int = 0) -> int:
    if type(value) is not int or value < least:
        raise _refuse("malformed checkpoint state (a count expected)")
    return value


def _text(value: Any, *, optional: bool = False) -> Any:
    if type(value) is not str and not (optional and value is None):
        raise _refuse("malformed checkpoint state (a string expected)")
    return value


def _fill_checks_or_refuse(r: Reducer, raw: memoryview, crc: int, active: str | None) -> None:
    if zlib.crc32(raw) != crc:
        raise _refuse("the checkpoint's checks do not match their CRC-32")
    saved = (r._ids, r._entries, r._snapshots, r._attempts, r._tools, r._operations, r._active)
    try:
        _fill_checks(r, orjson.loads(raw), active)
        # The active operation's snapshot reads the attempts, entries and tools by the ids
        # the operation names: build it once here, so that a checkpoint whose tables do not
        # hold together is refused now, not met later as a KeyError in a state snapshot.
        r._operation_snapshot()
    except Exception as exc:  # any shape the encoder never writes
        (r._ids, r._entries, r._snapshots, r._attempts, r._tools, r._operations, r._active) = saved
        if isinstance(exc, CheckpointMismatch):
            raise
        raise _refuse(f"malformed checkpoint state ({type(exc).__name__})") from None


def _fill_checks(r: Reducer, checks: Any, active: str | None) -> None:
    """Set the indexes a later line's checks read from the decoded ``checks`` (as
    :func:`_fill_view`: taken as written, one pass per table)."""
    if type(checks) is not dict:
        raise _refuse("malformed checkpoint state")
    ids: dict[str, int] = {}
    for purpose, names in zip(_PURPOSES, checks["ids"], strict=True):
        ids.update(dict.fromkeys(names, purpose))

    entries: dict[str, _Entry] = {}
    transcript = r._transcript
    stops = _STOP_REASONS
    new_entry = _Entry
    order = 0
    index = 0  # message entries accepted so far
    for ident, is_message, op_id, step_id, attempt_id, stop, used in checks["entries"]:
        if is_message is True:
            message = transcript[index]
            entry = new_entry(
                message["role"],
                index,
                message,
                op_id,
                step_id,
                attempt_id,
                stops[stop] if stop is not None else None,
            )
            index += 1
        else:  # a compaction entry: index is the messages before it
            entry = new_entry(None, index, None, op_id, step_id, attempt_id)
        entry.order = order
        order += 1
        if used:
            entry.used_calls = _count(used)
        entries[ident] = entry
    if len(entries) != order or index != len(transcript):
        raise _refuse("malformed checkpoint state (entries)")

    snapshots = checks["snapshots"]
    if type(snapshots) is not dict:
        raise _refuse("malformed checkpoint state (snapshots)")
    attempts: dict[str, _Attempt] = {}
    kinds = _STEP_KINDS
    new_attempt = _Attempt
    for (
        ident,
        op_id,
        step_id,
        number,
        kind,
        context_id,
        digest,
        is_open,
        failed,
        settled_by,
        own,
    ) in checks["attempts"]:
        attempt = new_attempt(
            op_id,
            step_id,
            number,
            kinds[kind],
            context_id,
            snapshots[digest] if own is None else own,
            digest,
        )
        if type(number) is not int or type(is_open) is not bool or type(failed) is not bool:
            raise _refuse("malformed checkpoint state (attempt)")
        if not is_open:
            attempt.open = False
        if failed:
            attempt.failed = True
        attempt.settled_by = settled_by
        attempts[ident] = attempt

    tools: dict[str, ToolCallState] = {}
    replays = _REPLAYS
    pending = ToolStatus.PENDING
    new_tool = ToolCallState
    for (
        op_id,
        started,
        step_id,
        assistant,
        tool_index,
        call,
        name,
        args,
        replay,
        key,
        env,
        res,
    ) in checks["tools"]:
        tools[started] = new_tool(
            op_id,
            started,
            step_id,
            assistant,
            _count(tool_index),
            call,
            name,
            args,
            replays[replay],
            key,
            env,
            res,
            pending,
        )

    operations: dict[str, _Operation] = {}
    for (
        op_id,
        kind,
        input_id,
        result_id,
        finished,
        aborted,
        compacted,
        step_id,
        attempt_id,
        started_ids,
        usage_start,
        started_ms,
        transcript_from,
    ) in checks["operations"]:
        if kind != "run" and kind != "compaction":
            raise _refuse("malformed checkpoint state (operation kind)")
        op = _Operation(op_id, kind, input_id, result_id)
        op.finished = finished is True
        op.abort_requested = aborted is True
        op.compacted_through = compacted
        op.step_id = step_id
        op.attempt_id = attempt_id
        op.tools = [tools[i] for i in started_ids]
        op.usage_start = None if usage_start is None else Usage(*usage_start)
        op.started_ms = started_ms
        op.transcript_from = transcript_from
        operations[op_id] = op
    # All or nothing: the reducer's fields change only once every table decoded.
    r._ids = ids
    r._entries = entries
    r._snapshots = snapshots
    r._attempts = attempts
    r._tools = tools
    r._operations = operations
    r._active = None if active is None else operations[active]
