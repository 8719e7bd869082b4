"""The timeline of a session: what happened, when, and what recovery did (pure).

``build_timeline(state, facts, evidence)`` turns a reduced session, the facts of its
committed lines and the workspace evidence about its tool calls (the action journal, the
reconciliation log, review items, authorizations, verifications — gathered by the shell
as plain JSON values) into :class:`Timeline` values: operations with their steps, each step
with its attempts and tool calls, gaps where the process was down, and usage.

The facts must be those of a log that reduces (the shell reduces it first): this module
trusts their shapes and reports nothing as corrupt.

Gaps. The log does not name processes, so a process boundary is inferred:

* **crash** (certain): the first fact of a recovery — ``stepAttempt`` attempt 2 (attempt 1
  was left open: the runtime never retries a model call in the same process), an
  ``interrupted`` result of a started call without an abort request, or the result of a
  call the reconciliation log says was reconciled after a crash (journal verdict, ledger
  lookup). The gap runs from the last fact before that transaction to it;
* **crash** (inferred): a pause of at least ``pause_ms`` while an operation was active at
  a point where the runtime does not wait (no model attempt open, no tool running);
* **stop**: a pause of at least ``pause_ms`` while the session was idle (the process
  ended, or waited for the next prompt);
* **queued**: a pause of at least ``pause_ms`` between a run's ``runStarted`` and its first
  step: the run was accepted and waited to be picked up (``tether submit`` commits the
  prompt and ``runStarted``; a worker starts step 1 later). Not a crash: no work had
  started (a crash right after acceptance looks the same, and loses nothing);
* **open**: the log ends inside an operation (crashed, stopped, or still running).

Active time. :func:`active_ms` is how long processes drove an operation: its span up to
its end (or the log's last fact) minus the closed gaps above inside it — the same rule,
used by the ``[budget] time = "active"`` budget (docs/config.md).

Pure (``tether.core`` rule): no clock, no disk; times are the log's millisecond integers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from tether.core.contents import sandbox_of
from tether.core.state import SessionState, Usage
from tether.core.values import format_duration, format_ms

__all__ = [
    "DEFAULT_PAUSE_MS",
    "AttemptView",
    "Evidence",
    "Gap",
    "MessageView",
    "OperationView",
    "StepView",
    "Timeline",
    "ToolCallView",
    "VerificationView",
    "active_ms",
    "build_timeline",
    "format_ms",
]

DEFAULT_PAUSE_MS: Final = 1000
"""A pause this long between two transactions, where the runtime does not wait, is a gap."""

PREVIEW: Final = 160
"""Characters kept of a message or result preview."""

ARGUMENTS_PREVIEW: Final = 120
"""Characters kept of an arguments summary."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the workspace database knows about a session's tool calls, as JSON values.

    Keys are the ``toolStarted`` ids (the calls' operation ids), except ``authorizations``
    (keyed ``<assistantEntryId>:<toolIndex>``, the call key). Values are the shell types'
    ``to_json()`` forms; ``verifications`` are the session's recorded checks.
    """

    journal: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reconciliations: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    reviews: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    authorizations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    verifications: Sequence[Mapping[str, Any]] = ()
    artifact_version: str | None = None
    """The workspace's current artifact version, when the shell computed it."""
    note: str | None = None
    """Why evidence is missing (e.g. no effects.db), or ``None``."""


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt_id: str
    attempt: int
    start_ms: int
    end_ms: int | None
    outcome: str
    """``settled``, ``failed``, ``superseded`` (a crash left it open; attempt 2 replaced it)
    or ``open``."""
    seq: int
    why: str | None = None
    """Why this attempt happened (attempt 2 only)."""
    error: Mapping[str, Any] | None = None
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def to_json(self) -> dict[str, Any]:
        return {
            "attemptId": self.attempt_id,
            "attempt": self.attempt,
            "start": self.start_ms,
            "end": self.end_ms,
            "outcome": self.outcome,
            "seq": self.seq,
            "why": self.why,
            "error": dict(self.error) if self.error is not None else None,
            "stopReason": self.stop_reason,
            "usage": self.usage.to_json(),
        }


@dataclass(frozen=True, slots=True)
class ToolCallView:
    call_id: str
    name: str
    index: int
    arguments: str
    """A one-line summary of the arguments (the recorded ones when the call started)."""
    started: bool
    """Whether a ``toolStarted`` was recorded (pre-execution results never start)."""
    start_ms: int | None
    end_ms: int | None
    outcome: str
    """``success``, ``error``, ``interrupted``, ``aborted``, ``truncated``,
    ``invalidArguments``, ``unknownTool``, or ``pending`` (no result recorded)."""
    tool_started_id: str | None = None
    replay: str | None = None
    replay_key: str | None = None
    result: str | None = None
    """Preview of the result message."""
    start_seq: int | None = None
    result_seq: int | None = None
    authorization: Mapping[str, Any] | None = None
    journal: Mapping[str, Any] | None = None
    reconciliations: tuple[Mapping[str, Any], ...] = ()
    reviews: tuple[Mapping[str, Any], ...] = ()
    recovered_from_ledger: bool = False
    recovered: bool = False
    """Whether the result was recorded by a recovery (after a crash)."""
    usage: Usage = field(default_factory=Usage)
    verification: VerificationView | None = None
    """The check this call ran (the ``verify`` tool), with its artifact versions."""
    sandbox: str | None = None
    """How its command was confined (``workspace-write, network off``), when it ran in
    tether's sandbox (docs/sandbox.md)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "callId": self.call_id,
            "name": self.name,
            "index": self.index,
            "arguments": self.arguments,
            "started": self.started,
            "start": self.start_ms,
            "end": self.end_ms,
            "outcome": self.outcome,
            "toolStartedId": self.tool_started_id,
            "replay": self.replay,
            "replayKey": self.replay_key,
            "result": self.result,
            "startSeq": self.start_seq,
            "resultSeq": self.result_seq,
            "authorization": _plain(self.authorization),
            "journal": _plain(self.journal),
            "reconciliations": [_plain(r) for r in self.reconciliations],
            "reviews": [_plain(r) for r in self.reviews],
            "recoveredFromLedger": self.recovered_from_ledger,
            "recovered": self.recovered,
            "usage": self.usage.to_json(),
            "verification": self.verification.to_json() if self.verification else None,
            "sandbox": self.sandbox,
        }


@dataclass(frozen=True, slots=True)
class StepView:
    step_id: str
    kind: str
    number: int
    """1-based index of the step in its operation."""
    attempts: tuple[AttemptView, ...]
    tool_calls: tuple[ToolCallView, ...]
    usage: Usage

    @property
    def start_ms(self) -> int:
        return self.attempts[0].start_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "stepId": self.step_id,
            "kind": self.kind,
            "number": self.number,
            "attempts": [a.to_json() for a in self.attempts],
            "toolCalls": [t.to_json() for t in self.tool_calls],
            "usage": self.usage.to_json(),
        }


@dataclass(frozen=True, slots=True)
class OperationView:
    operation_id: str
    kind: str
    number: int
    """1-based index of the operation in the session."""
    start_ms: int
    end_ms: int | None
    outcome: str
    """``completed``, ``failed``, ``aborted`` or ``unfinished``."""
    seq: int
    steps: tuple[StepView, ...]
    usage: Usage
    prompt: str | None = None
    """Preview of the user message a run answers."""
    completion: str | None = None
    error: Mapping[str, Any] | None = None
    abort: Mapping[str, Any] | None = None
    """``{"phase", "toolCallId", "at", "seq"}`` of the abort request, if one was recorded."""

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "kind": self.kind,
            "number": self.number,
            "start": self.start_ms,
            "end": self.end_ms,
            "outcome": self.outcome,
            "seq": self.seq,
            "prompt": self.prompt,
            "completion": self.completion,
            "error": _plain(self.error),
            "abort": _plain(self.abort),
            "steps": [s.to_json() for s in self.steps],
            "usage": self.usage.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Gap:
    kind: str
    """``crash``, ``stop``, ``queued`` or ``open`` (see the module docstring)."""
    start_ms: int
    end_ms: int | None
    after_seq: int
    """The last fact before the gap (0: the header)."""
    before_seq: int | None
    """The first fact after it (``None`` for ``open``)."""
    operation_id: str | None
    evidence: str
    """Why this is a gap of this kind."""
    certain: bool
    recovery: str | None
    """What the next process did first (the recovery plan that followed)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start": self.start_ms,
            "end": self.end_ms,
            "afterSeq": self.after_seq,
            "beforeSeq": self.before_seq,
            "operationId": self.operation_id,
            "evidence": self.evidence,
            "certain": self.certain,
            "recovery": self.recovery,
        }


@dataclass(frozen=True, slots=True)
class MessageView:
    number: int
    role: str
    at_ms: int
    seq: int
    entry_id: str
    text: str
    operation_id: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "role": self.role,
            "at": self.at_ms,
            "seq": self.seq,
            "entryId": self.entry_id,
            "text": self.text,
            "operationId": self.operation_id,
        }


@dataclass(frozen=True, slots=True)
class VerificationView:
    id: str
    status: str
    command: str
    start_ms: int
    duration_ms: int
    version_start: str | None
    version_end: str | None
    tool_started_id: str | None
    current: bool
    """Whether its end version is the latest one recorded (else it went stale)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "command": self.command,
            "start": self.start_ms,
            "durationMs": self.duration_ms,
            "versionStart": self.version_start,
            "versionEnd": self.version_end,
            "toolStartedId": self.tool_started_id,
            "current": self.current,
        }


@dataclass(frozen=True, slots=True)
class Timeline:
    session_id: str
    created_ms: int
    model: str
    provider: str
    cwd: str
    start_ms: int
    end_ms: int
    facts: int
    operations: tuple[OperationView, ...]
    gaps: tuple[Gap, ...]
    messages: tuple[MessageView, ...]
    verifications: tuple[VerificationView, ...]
    usage: Usage
    current: str
    """The operation in progress at the end of the log: ``idle``, ``run`` or
    ``compaction``."""
    evidence_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "session": {
                "id": self.session_id,
                "created": self.created_ms,
                "createdAt": format_ms(self.created_ms),
                "model": self.model,
                "provider": self.provider,
                "cwd": self.cwd,
            },
            "start": self.start_ms,
            "end": self.end_ms,
            "facts": self.facts,
            "current": self.current,
            "evidenceNote": self.evidence_note,
            "usage": self.usage.to_json(),
            "operations": [o.to_json() for o in self.operations],
            "gaps": [g.to_json() for g in self.gaps],
            "verifications": [v.to_json() for v in self.verifications],
            "transcript": [m.to_json() for m in self.messages],
        }


def _plain(value: Any) -> Any:
    """Deep copy of a JSON-like value into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- helpers


def _flat(text: str, width: int) -> str:
    flat = " ".join(text[: width * 4].split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _arguments_summary(arguments: Any) -> str:
    if isinstance(arguments, Mapping):
        parts = []
        for key, value in arguments.items():
            shown = value if isinstance(value, str) else _compact(value)
            parts.append(f"{key}={_flat(str(shown), 40)}")
        return _flat(", ".join(parts), ARGUMENTS_PREVIEW)
    return _flat(str(arguments), ARGUMENTS_PREVIEW)


def _compact(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_compact(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    text = content[: PREVIEW * 4] if isinstance(content, str) else ""
    calls = message.get("tool_calls") or []
    names = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            names.append(f"{function.get('name')}({function.get('arguments')})")
    if names:
        text = f"{text} → {', '.join(names)}" if text.strip() else "→ " + ", ".join(names)
    return _flat(text, PREVIEW) if text.strip() else "(no text)"


# --------------------------------------------------------------------------- builder


class _Call:
    """A tool call being assembled (mutable, private)."""

    def __init__(self, call_id: str, name: str, index: int, arguments: str) -> None:
        self.call_id = call_id
        self.name = name
        self.index = index
        self.arguments = arguments
        self.started = False
        self.start_ms: int | None = None
        self.end_ms: int | None = None
        self.outcome = "pending"
        self.tool_started_id: str | None = None
        self.replay: str | None = None
        self.replay_key: str | None = None
        self.result: str | None = None
        self.sandbox: str | None = None
        self.start_seq: int | None = None
        self.result_seq: int | None = None
        self.recovered = False
        self.usage = Usage()
        self.assistant_entry_id = ""


class _Attempt:
    def __init__(self, attempt_id: str, attempt: int, start_ms: int, seq: int) -> None:
        self.attempt_id = attempt_id
        self.attempt = attempt
        self.start_ms = start_ms
        self.seq = seq
        self.end_ms: int | None = None
        self.outcome = "open"
        self.why: str | None = None
        self.error: Mapping[str, Any] | None = None
        self.stop_reason: str | None = None
        self.usage = Usage()


class _Step:
    def __init__(self, step_id: str, kind: str, number: int) -> None:
        self.step_id = step_id
        self.kind = kind
        self.number = number
        self.attempts: list[_Attempt] = []
        self.calls: list[_Call] = []


class _Op:
    def __init__(self, op_id: str, kind: str, number: int, start_ms: int, seq: int) -> None:
        self.op_id = op_id
        self.kind = kind
        self.number = number
        self.start_ms = start_ms
        self.seq = seq
        self.end_ms: int | None = None
        self.outcome = "unfinished"
        self.completion: str | None = None
        self.error: Mapping[str, Any] | None = None
        self.abort: dict[str, Any] | None = None
        self.prompt: str | None = None
        self.steps: list[_Step] = []
        self.usage = Usage()


class _Builder:
    def __init__(self, evidence: Evidence, pause_ms: int) -> None:
        self.evidence = evidence
        self.pause_ms = pause_ms
        self.ops: list[_Op] = []
        self.active: _Op | None = None
        self.steps: dict[str, _Step] = {}
        self.attempts: dict[str, _Attempt] = {}
        self.open_attempts: set[str] = set()
        self.calls_by_started: dict[str, _Call] = {}
        self.calls_by_key: dict[tuple[str, int], _Call] = {}
        self.assistant_step: dict[str, _Step] = {}
        self.user_text: dict[str, str] = {}
        self.messages: list[MessageView] = []
        self.gaps: list[Gap] = []
        self.pending: set[str] = set()
        self.last_ms: int | None = None
        self.last_seq = 0
        self.first_ms: int | None = None
        self.facts = 0
        self.verifications = _verifications(evidence.verifications, evidence.artifact_version)
        self.verification_of = {
            v.tool_started_id: v for v in self.verifications if v.tool_started_id is not None
        }

    # ---- per transaction

    def transaction(self, facts: Sequence[Mapping[str, Any]]) -> None:
        if not facts:
            return
        first_ms = int(facts[0].get("timestamp", 0))
        recovery = self._recovery_signature(facts)
        if self.last_ms is not None:
            self._maybe_gap(first_ms, int(facts[0].get("seq", 0)), recovery, facts)
        if self.first_ms is None:
            self.first_ms = first_ms
        for fact in facts:
            self._fact(fact)
            self.facts += 1
            self.last_ms = int(fact.get("timestamp", self.last_ms or 0))
            self.last_seq = int(fact.get("seq", self.last_seq))

    def _recovery_signature(self, facts: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
        """``(evidence, recovery)`` when this transaction is the first act of a recovery."""
        for fact in facts:
            kind = fact.get("kind")
            if kind == "record":
                record = fact.get("record") or {}
                if record.get("type") == "stepAttempt" and record.get("attempt") == 2:
                    return (
                        "attempt 1 of the model call was still open (the runtime never "
                        "retries a model call in the same process)",
                        "retried the model call: attempt 2 of the same step, same context "
                        "and configuration",
                    )
            elif kind == "entry":
                entry = fact.get("entry") or {}
                started_id = entry.get("toolStartedId")
                if not isinstance(started_id, str):
                    continue
                result = entry.get("result") or {}
                name = entry.get("toolName")
                op = self.active
                aborted = op is not None and op.abort is not None
                if result.get("reason") == "interrupted" and not aborted:
                    return (
                        f"{name} was started and had no result (its process ended between "
                        "the intent and the result: before, during or after the call)",
                        f"recorded {name} as interrupted: it is not replayable, its outcome "
                        "is unknown, it was not run again",
                    )
                decisions = self.evidence.reconciliations.get(started_id, ())
                if decisions:
                    return (
                        f"{name} was started and had no result; recovery reconciled it",
                        _decision_text(str(name), decisions),
                    )
        return None

    def _asked_a_person(self, facts: Sequence[Mapping[str, Any]]) -> bool:
        """Whether this transaction starts a call a person authorized (the runtime waited
        for the answer)."""
        for fact in facts:
            record = fact.get("record") if fact.get("kind") == "record" else None
            if isinstance(record, Mapping) and record.get("type") == "toolStarted":
                key = f"{record.get('assistantEntryId')}:{record.get('toolIndex')}"
                decision = self.evidence.authorizations.get(key)
                if decision is not None and decision.get("who") == "user":
                    return True
        return False

    def _maybe_gap(
        self,
        start: int,
        next_seq: int,
        recovery: tuple[str, str] | None,
        facts: Sequence[Mapping[str, Any]],
    ) -> None:
        assert self.last_ms is not None
        last = self.last_ms
        op_id = self.active.op_id if self.active is not None else None
        if recovery is not None:
            self.gaps.append(
                Gap(
                    "crash",
                    last,
                    start,
                    self.last_seq,
                    next_seq,
                    op_id,
                    recovery[0],
                    True,
                    recovery[1],
                )
            )
            return
        if start - last < self.pause_ms:
            return
        pause = format_duration(start - last)
        if self.active is None:
            self.gaps.append(
                Gap(
                    "stop",
                    last,
                    start,
                    self.last_seq,
                    next_seq,
                    None,
                    f"idle for {pause}: the process ended or waited for the next prompt",
                    False,
                    None,
                )
            )
            return
        if self.open_attempts or self.pending or self._asked_a_person(facts):
            return  # a model call or a tool ran, or a person was asked: the runtime waited
        if not self.active.steps:
            # Accepted, not started: `tether submit` commits [prompt, runStarted] and a
            # worker starts step 1 when it is free, so nothing here says a process died.
            self.gaps.append(
                Gap(
                    "queued",
                    last,
                    start,
                    self.last_seq,
                    next_seq,
                    op_id,
                    f"queued {pause}: the run was accepted and waited for a process to "
                    "start it (a worker picks up a submitted run when it is free)",
                    False,
                    None,
                )
            )
            return
        self.gaps.append(
            Gap(
                "crash",
                last,
                start,
                self.last_seq,
                next_seq,
                op_id,
                f"a pause of {pause} inside the operation where the runtime does not wait",
                False,
                "continued the operation from the log",
            )
        )

    # ---- per fact

    def _fact(self, fact: Mapping[str, Any]) -> None:
        kind = fact.get("kind")
        at = int(fact.get("timestamp", 0))
        seq = int(fact.get("seq", 0))
        ident = str(fact.get("id"))
        if kind == "entry":
            self._entry(fact.get("entry") or {}, ident, at, seq)
        elif kind == "record":
            self._record(fact.get("record") or {}, ident, at, seq)
        elif kind == "usage":
            self._usage(fact)

    def _entry(self, entry: Mapping[str, Any], ident: str, at: int, seq: int) -> None:
        if entry.get("type") == "compaction":
            attempt = self._settle_current(at)
            if attempt is not None:
                attempt.outcome = "settled"
            return
        message = entry.get("message") or {}
        role = str(message.get("role"))
        op = self.active
        self.messages.append(
            MessageView(
                len(self.messages) + 1,
                role,
                at,
                seq,
                ident,
                _message_text(message),
                op.op_id if op is not None else None,
            )
        )
        if role == "user":
            self.user_text[ident] = _flat(str(message.get("content", "")), PREVIEW)
        elif role == "assistant":
            attempt = self.attempts.get(str(entry.get("attemptId")))
            step = self.steps.get(str(entry.get("stepId")))
            if attempt is not None:
                attempt.end_ms = at
                attempt.outcome = "settled"
                attempt.stop_reason = entry.get("stopReason")
                self.open_attempts.discard(attempt.attempt_id)
            if step is not None:
                self.assistant_step[ident] = step
                for index, raw_call in enumerate(message.get("tool_calls") or []):
                    function = raw_call.get("function") or {}
                    raw = function.get("arguments")
                    c = _Call(
                        str(raw_call.get("id")),
                        str(function.get("name")),
                        index,
                        _flat(str(raw), ARGUMENTS_PREVIEW),
                    )
                    c.assistant_entry_id = ident
                    step.calls.append(c)
                    self.calls_by_key[(ident, index)] = c
        elif role == "tool":
            result = entry.get("result") or {}
            started_id = entry.get("toolStartedId")
            call: _Call | None = None
            if isinstance(started_id, str):
                call = self.calls_by_started.get(started_id)
                self.pending.discard(started_id)
            else:
                call = self.calls_by_key.get(
                    (str(entry.get("assistantEntryId")), int(entry.get("toolIndex", -1)))
                )
                if call is not None:
                    call.start_ms = at
            if call is None:
                return
            call.end_ms = at
            call.result_seq = seq
            kind = result.get("type")
            call.outcome = str(result.get("reason")) if kind == "synthetic" else str(kind)
            call.result = _flat(str(message.get("content", "")), PREVIEW)
            call.sandbox = sandbox_of(message.get("content"))
            if self.gaps and self.gaps[-1].before_seq == seq and self.gaps[-1].certain:
                call.recovered = True

    def _record(self, record: Mapping[str, Any], ident: str, at: int, seq: int) -> None:
        rtype = record.get("type")
        if rtype in ("runStarted", "compactionStarted"):
            new_op = _Op(
                str(record.get("operationId")),
                str(record.get("operationKind")),
                len(self.ops) + 1,
                at,
                seq,
            )
            if rtype == "runStarted":
                input_id = str(record.get("inputEntryId"))
                new_op.prompt = self.user_text.get(input_id)
                last = self.messages[-1] if self.messages else None
                if last is not None and last.entry_id == input_id:
                    self.messages[-1] = replace(last, operation_id=new_op.op_id)
            self.ops.append(new_op)
            self.active = new_op
        elif rtype == "stepAttempt":
            op = self.active
            if op is None:
                return
            step_id = str(record.get("stepId"))
            attempt = _Attempt(str(record.get("attemptId")), int(record.get("attempt", 1)), at, seq)
            step = self.steps.get(step_id)
            if step is None:
                step = _Step(step_id, str(record.get("stepKind")), len(op.steps) + 1)
                self.steps[step_id] = step
                op.steps.append(step)
            else:
                for earlier in step.attempts:
                    if earlier.outcome == "open":
                        earlier.outcome = "superseded"
                        earlier.end_ms = self.last_ms if self.last_ms is not None else at
                        self.open_attempts.discard(earlier.attempt_id)
                attempt.why = (
                    "attempt 1 was left open by a process that ended before the answer was "
                    "recorded; asked again with the same context and configuration"
                )
            step.attempts.append(attempt)
            self.attempts[attempt.attempt_id] = attempt
            self.open_attempts.add(attempt.attempt_id)
        elif rtype == "stepFailed":
            failed = self.attempts.get(str(record.get("attemptId")))
            if failed is not None:
                failed.end_ms = at
                failed.outcome = "failed"
                failed.error = record.get("error")
                self.open_attempts.discard(failed.attempt_id)
        elif rtype == "toolStarted":
            key = (str(record.get("assistantEntryId")), int(record.get("toolIndex", -1)))
            call = self.calls_by_key.get(key)
            if call is None:
                return
            call.started = True
            call.start_ms = at
            call.start_seq = seq
            call.tool_started_id = ident
            call.replay = record.get("replay")
            call.replay_key = record.get("replayKey")
            call.arguments = _arguments_summary(record.get("arguments"))
            self.calls_by_started[ident] = call
            self.pending.add(ident)
        elif rtype == "abortRequested":
            if self.active is not None:
                self.active.abort = {
                    "phase": record.get("phase"),
                    "toolCallId": record.get("toolCallId"),
                    "at": at,
                    "seq": seq,
                }
        elif rtype == "operationFinished":
            op = self.active
            if op is None:
                return
            op.end_ms = at
            op.outcome = str(record.get("outcome"))
            op.completion = record.get("completion")
            op.error = record.get("error")
            self.active = None
            self.open_attempts.clear()
            for step in op.steps:
                for attempt in step.attempts:
                    if attempt.outcome == "open":
                        attempt.outcome = "superseded"
                        attempt.end_ms = at

    def _settle_current(self, at: int) -> _Attempt | None:
        op = self.active
        if op is None or not op.steps or not op.steps[-1].attempts:
            return None
        attempt = op.steps[-1].attempts[-1]
        attempt.end_ms = at
        self.open_attempts.discard(attempt.attempt_id)
        return attempt

    def _usage(self, fact: Mapping[str, Any]) -> None:
        usage = Usage.from_json(fact["usage"])  # the log reduced: the four counters are there
        attempt_id = fact.get("attemptId")
        if isinstance(attempt_id, str) and attempt_id in self.attempts:
            attempt = self.attempts[attempt_id]
            attempt.usage += usage
        started = fact.get("toolStartedId")
        if isinstance(started, str) and started in self.calls_by_started:
            call = self.calls_by_started[started]
            call.usage += usage

    # ---- result

    def finish(self, state: SessionState) -> Timeline:
        header = state.header
        start = self.first_ms if self.first_ms is not None else header.created_at
        end = self.last_ms if self.last_ms is not None else header.created_at
        if self.active is not None:
            self._trailing_gaps(end)
        operations = tuple(self._operation(op) for op in self.ops)
        return Timeline(
            session_id=header.id,
            created_ms=header.created_at,
            model=header.model,
            provider=header.provider,
            cwd=header.cwd,
            start_ms=start,
            end_ms=end,
            facts=self.facts,
            operations=operations,
            gaps=tuple(self.gaps),
            messages=tuple(self.messages),
            verifications=self.verifications,
            usage=state.usage,
            current=state.operation.kind,
            evidence_note=self.evidence.note,
        )

    def _trailing_gaps(self, end: int) -> None:
        """The gaps after the last fact: a later process that reconciled a pending call
        but appended nothing (blocked, e.g. on a review), then the open end."""
        assert self.active is not None
        op_id = self.active.op_id
        blocked: list[str] = []
        for started_id in sorted(self.pending):
            decisions = self.evidence.reconciliations.get(started_id, ())
            call = self.calls_by_started.get(started_id)
            if not decisions or call is None:
                continue
            at = decisions[0].get("atMs")
            recovery = _decision_text(call.name, decisions)
            for item in self.evidence.reviews.get(started_id, ()):
                if item.get("status") == "open":
                    blocked.append(f"review item {item.get('id')} ({call.name})")
                    recovery += (
                        f"; blocked: review item {item.get('id')} is open — `tether review "
                        f"resolve {item.get('id')} --applied|--not-applied|--abort`"
                    )
            self.gaps.append(
                Gap(
                    "crash",
                    end,
                    int(at) if isinstance(at, int) else None,
                    self.last_seq,
                    None,
                    op_id,
                    f"{call.name} was started and had no result when its process ended; a "
                    "later process reconciled it and appended nothing",
                    True,
                    recovery,
                )
            )
        what = "the log ends inside this operation"
        if blocked:
            what += ", blocked on " + ", ".join(blocked)
        elif self.pending:
            what += " with a started tool call and no result"
        elif self.open_attempts:
            what += " with a model call open"
        if blocked:
            what += ": recovery appends nothing until a person decides"
            plan = "`tether review resolve ITEM …`, then `tether resume SESSION` finishes it"
        else:
            what += ": its process crashed, was stopped, or is still running"
            plan = "`tether resume SESSION` finishes it, `--abort` closes it"
        self.gaps.append(Gap("open", end, None, self.last_seq, None, op_id, what, False, plan))

    def _operation(self, op: _Op) -> OperationView:
        steps = tuple(self._step(step) for step in op.steps)
        usage = Usage()
        for step in steps:
            usage += step.usage
        return OperationView(
            operation_id=op.op_id,
            kind=op.kind,
            number=op.number,
            start_ms=op.start_ms,
            end_ms=op.end_ms,
            outcome=op.outcome,
            seq=op.seq,
            steps=steps,
            usage=usage,
            prompt=op.prompt,
            completion=op.completion,
            error=op.error,
            abort=op.abort,
        )

    def _step(self, step: _Step) -> StepView:
        attempts = tuple(
            AttemptView(
                a.attempt_id,
                a.attempt,
                a.start_ms,
                a.end_ms,
                a.outcome,
                a.seq,
                a.why,
                a.error,
                a.stop_reason,
                a.usage,
            )
            for a in step.attempts
        )
        calls = tuple(self._call(c) for c in step.calls)
        usage = Usage()
        for attempt in attempts:
            usage += attempt.usage
        for call in calls:
            usage += call.usage
        return StepView(step.step_id, step.kind, step.number, attempts, calls, usage)

    def _call(self, c: _Call) -> ToolCallView:
        ev = self.evidence
        started = c.tool_started_id
        decisions = tuple(ev.reconciliations.get(started, ())) if started else ()
        reviews = tuple(ev.reviews.get(started, ())) if started else ()
        from_ledger = any(
            bool((d.get("evidence") or {}).get("recoveredFromLedger")) for d in decisions
        )
        return ToolCallView(
            call_id=c.call_id,
            name=c.name,
            index=c.index,
            arguments=c.arguments,
            started=c.started,
            start_ms=c.start_ms,
            end_ms=c.end_ms,
            outcome=c.outcome,
            tool_started_id=started,
            replay=c.replay,
            replay_key=c.replay_key,
            result=c.result,
            start_seq=c.start_seq,
            result_seq=c.result_seq,
            authorization=ev.authorizations.get(f"{c.assistant_entry_id}:{c.index}"),
            journal=ev.journal.get(started) if started else None,
            reconciliations=decisions,
            reviews=reviews,
            recovered_from_ledger=from_ledger,
            recovered=c.recovered,
            usage=c.usage,
            verification=self.verification_of.get(started) if started else None,
            sandbox=c.sandbox,
        )


def _decision_text(name: str, decisions: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for decision in decisions:
        verdict = decision.get("verdict")
        action = decision.get("action")
        evidence = decision.get("evidence") or {}
        text = f"reconciled {name}: verdict {verdict}, action {action}"
        if evidence.get("recoveredFromLedger"):
            text += " (looked up in the ledger: the effect had happened; result backfilled, "
            text += "recovered_from_ledger=true, nothing executed again)"
        elif action == "execute":
            text += " (no record of the effect: executed once, same operation id)"
        elif action == "complete":
            text += " (the recorded outcome was appended, nothing executed again)"
        elif action == "review":
            text += " (outcome unknowable: handed to a human review)"
        parts.append(text)
    return "; then ".join(parts)


def _verifications(
    rows: Sequence[Mapping[str, Any]], current: str | None
) -> tuple[VerificationView, ...]:
    ordered = sorted(rows, key=lambda r: int(r.get("startedAtMs", 0)))
    latest = (
        current if current is not None else (ordered[-1].get("versionEnd") if ordered else None)
    )
    return tuple(
        VerificationView(
            id=str(r.get("id")),
            status=str(r.get("status")),
            command=str(r.get("command")),
            start_ms=int(r.get("startedAtMs", 0)),
            duration_ms=int(r.get("durationMs", 0)),
            version_start=r.get("versionStart"),
            version_end=r.get("versionEnd"),
            tool_started_id=r.get("toolStartedId"),
            current=r.get("versionEnd") == latest,
        )
        for r in ordered
    )


def build_timeline(
    state: SessionState,
    transactions: Sequence[Sequence[Mapping[str, Any]]],
    evidence: Evidence | None = None,
    *,
    pause_ms: int = DEFAULT_PAUSE_MS,
) -> Timeline:
    """The timeline of a session.

    ``state`` is the reduced state of the log; ``transactions`` the facts of its committed
    lines after the header, one sequence per line (a line holding one object is a sequence
    of one); ``evidence`` what the workspace database knows about its calls.
    """
    builder = _Builder(evidence if evidence is not None else Evidence(), pause_ms)
    for transaction in transactions:
        builder.transaction(transaction)
    return builder.finish(state)


def active_ms(timeline: Timeline, operation_id: str) -> int:
    """How long processes drove ``operation_id``, in milliseconds, as far as the log goes.

    Its span, from its first fact to its end (or to the log's last fact while it is
    unfinished), minus the closed gaps inside it (``crash``, ``stop``, ``queued``: no
    process drove it then, or it waited to be picked up). A pause where a person was asked
    counts as a gap unless the evidence says a person answered at a terminal, where the
    process waited (a parked call's process ended: its wait is a gap); the ``open`` gap
    after the last fact is the caller's to count (the process reading the log knows when
    it began). 0 for an operation the timeline does not hold."""
    for op in timeline.operations:
        if op.operation_id == operation_id:
            break
    else:
        return 0
    start = op.start_ms
    end = op.end_ms if op.end_ms is not None else timeline.end_ms
    down = 0
    for gap in timeline.gaps:
        if gap.end_ms is None or gap.kind == "open":
            continue
        down += max(min(gap.end_ms, end) - max(gap.start_ms, start), 0)
    return max(end - start - down, 0)
