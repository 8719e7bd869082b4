"""A tiny builder for valid session logs (spec SESSION_FORMAT.md), fact by fact.

Every builder method creates one fact as a plain ``dict``, appends it to the log
(as its own line, or to the open :meth:`SessionKit.tx` group) and returns it. The
log keeps *references* to those dicts, so a test can mutate a member of a returned
fact (``fact["record"]["attempt"] = 3``) to produce exactly one defect, then
serialise with :meth:`SessionKit.bytes`. :meth:`SessionKit.where` gives the
``(line, seq)`` the reducer must report for a fact.

The kit tracks just enough of the session (context boundary, active operation and
step, the current assistant entry and its started tools, message entries for the
source digest) to default every reference correctly. It assumes the facts it built
are valid; after a deliberate mutation its bookkeeping may no longer match the log.

IDs are UUIDv7-shaped strings from a counter (``make_id``); ``seq`` and
``timestamp`` are assigned in creation order.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether.core import Reducer, SessionCorruption, SessionState, reduce_session
from tether.core.canonical import configuration_digest, source_digest
from tether.core.contents import SYNTHETIC_CONTENT

__all__ = [
    "ABORTED_ERROR",
    "EPOCH",
    "MAX_SAFE",
    "MODEL_ERROR",
    "ZERO_DIGEST",
    "SessionKit",
    "dumps",
    "expect_error",
    "expect_ok",
    "make_id",
]

ZERO_DIGEST = "sha256:" + "0" * 64
MAX_SAFE = 2**53 - 1
EPOCH = 1710000000000
ABORTED_ERROR = {"code": "aborted", "message": "Operation aborted"}
MODEL_ERROR = {"code": "model_error", "message": "provider request failed"}


def make_id(n: int) -> str:
    """The ``n``-th UUIDv7-shaped ID (lower-case, version 7, variant 8)."""
    return f"01900000-0000-7000-8000-{n:012x}"


def dumps(value: Any) -> bytes:
    """Compact JSON as the writer emits it (no trailing LF)."""
    return orjson.dumps(value)


@dataclass
class _Line:
    facts: list[Any] = field(default_factory=list)
    array: bool = False
    raw: bytes | None = None  # a verbatim line (no LF)
    value: Any = None  # an arbitrary JSON value line
    is_value: bool = False

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        if self.is_value:
            return dumps(self.value)
        if self.array or len(self.facts) != 1:
            return dumps(self.facts)
        return dumps(self.facts[0])


class SessionKit:
    """Builds one session log; see the module docstring."""

    def __init__(
        self,
        *,
        tools: Sequence[str] = ("read", "write"),
        first_id: int = 1,
        timestamp: int = EPOCH,
    ) -> None:
        self._counter = first_id - 1
        self._call_counter = 0
        self.timestamp = timestamp
        self.tools = tuple(tools)
        self.header: dict[str, Any] = {
            "kind": "header",
            "version": 2,
            "id": self.new_id(),
            "createdAt": timestamp,
            "cwd": "/workspace",
            "provider": "openrouter",
            "model": "test/model",
            "environmentIdentity": "fixture",
        }
        self.header_raw: bytes | None = None
        self._lines: list[_Line] = []
        self._group: _Line | None = None
        self.seq = 0
        # --- tracking (what the reducer will know if the facts are valid)
        self.messages: list[tuple[str, dict[str, Any]]] = []  # message entries, in order
        self.entries: list[tuple[str, dict[str, Any] | None]] = []  # None: compaction entry
        self.boundary: str | None = None
        self.op: dict[str, Any] | None = None  # the active operation
        self.last_op: dict[str, Any] | None = None  # the most recent operation
        self.step: dict[str, Any] | None = None  # the active operation's latest attempt
        self.assistant_info: dict[str, Any] | None = None  # latest assistant entry
        self.started: list[dict[str, Any]] = []  # toolStarted facts of the active run
        self.last_user_id: str | None = None

    # ------------------------------------------------------------------ ids, lines

    def new_id(self) -> str:
        self._counter += 1
        return make_id(self._counter)

    def new_call_id(self) -> str:
        self._call_counter += 1
        return f"call_{self._call_counter}"

    def fork(self) -> SessionKit:
        """An independent deep copy (to build alternative continuations)."""
        return copy.deepcopy(self)

    @contextmanager
    def tx(self) -> Iterator[list[Any]]:
        """Group the facts built inside the block into one array transaction."""
        if self._group is not None:
            raise RuntimeError("transactions do not nest")
        line = _Line(array=True)
        self._group = line
        try:
            yield line.facts
        finally:
            self._group = None
        self._lines.append(line)

    def line(self, value: Any) -> Any:
        """Append an arbitrary line: ``bytes`` verbatim, anything else as JSON."""
        if isinstance(value, bytes):
            self._lines.append(_Line(raw=value))
        else:
            self._lines.append(_Line(value=value, is_value=True))
        return value

    def regroup(self, sizes: Iterable[int]) -> None:
        """Merge consecutive fact lines into transactions of the given sizes."""
        merged: list[_Line] = []
        pending = [line for line in self._lines]
        sizes_iter = iter(sizes)
        while pending:
            size = max(1, next(sizes_iter, 1))
            chunk, pending = pending[:size], pending[size:]
            if len(chunk) == 1:
                merged.append(chunk[0])
                continue
            facts = [fact for line in chunk for fact in line.facts]
            merged.append(_Line(facts=facts, array=True))
        self._lines = merged

    def _emit(self, kind: str, members: Mapping[str, Any], fact_id: str | None = None) -> dict:
        self.seq += 1
        fact: dict[str, Any] = {
            "kind": kind,
            "seq": self.seq,
            "id": fact_id if fact_id is not None else self.new_id(),
            "timestamp": self.timestamp + self.seq,
        }
        fact.update(members)
        if self._group is not None:
            self._group.facts.append(fact)
        else:
            self._lines.append(_Line(facts=[fact]))
        return fact

    def _record(self, record: dict[str, Any], fact_id: str | None = None) -> dict:
        return self._emit("record", {"record": record}, fact_id)

    def _entry(self, entry: dict[str, Any], fact_id: str | None = None) -> dict:
        return self._emit("entry", {"entry": entry}, fact_id)

    def fact(self, kind: str, members: Mapping[str, Any], fact_id: str | None = None) -> dict:
        """An arbitrary fact with the next ``seq`` (not tracked: no effect on defaults)."""
        return self._emit(kind, members, fact_id)

    def record(self, record: dict[str, Any], fact_id: str | None = None) -> dict:
        """An arbitrary record fact (not tracked)."""
        return self._record(record, fact_id)

    def entry(self, entry: dict[str, Any], fact_id: str | None = None) -> dict:
        """An arbitrary entry fact (not tracked)."""
        return self._entry(entry, fact_id)

    # ------------------------------------------------------------------ serialisation

    def header_line(self) -> bytes:
        return self.header_raw if self.header_raw is not None else dumps(self.header)

    def lines(self) -> list[bytes]:
        """All committed lines without LFs; line 1 is the header."""
        return [self.header_line(), *(line.encode() for line in self._lines)]

    def bytes(self) -> bytes:
        return b"".join(line + b"\n" for line in self.lines())

    def where(self, fact: Any) -> tuple[int, int]:
        """``(line, seq)`` of a fact built by this kit."""
        return self.line_of(fact), fact["seq"]

    def line_of(self, obj: Any) -> int:
        """The line number holding ``obj`` (a fact or a value added with :meth:`line`)."""
        for number, line in enumerate(self._lines, start=2):
            if any(fact is obj for fact in line.facts) or (line.is_value and line.value is obj):
                return number
        raise LookupError("object not in this log")

    @property
    def next_line(self) -> int:
        return len(self._lines) + 2

    # ------------------------------------------------------------------ snapshots

    def snapshot(self, tools: Sequence[str] | None = None) -> dict[str, Any]:
        names = self.tools if tools is None else tools
        return {
            "model": "test/model",
            "systemPromptDigest": ZERO_DIGEST,
            "tools": [{"name": name, "definitionDigest": ZERO_DIGEST} for name in names],
            "adapterIdentity": "openrouter:chat-completions:v1",
            "routingIdentity": "openrouter:test/model",
            "outputOptionsDigest": ZERO_DIGEST,
        }

    # ------------------------------------------------------------------ messages

    def _accept_message(self, fact_id: str, message: dict[str, Any]) -> None:
        self.messages.append((fact_id, message))
        self.entries.append((fact_id, message))
        self.boundary = fact_id

    def user(self, content: str = "hello") -> dict:
        """A user message entry (7.1)."""
        message = {"role": "user", "content": content}
        fact = self._entry({"type": "message", "message": message})
        self._accept_message(fact["id"], message)
        self.last_user_id = fact["id"]
        return fact

    def run_started(self, input_entry_id: str | None = None) -> dict:
        """``runStarted`` (8.1); the input defaults to the last user entry."""
        op_id = self.new_id()
        input_id = input_entry_id if input_entry_id is not None else self.last_user_id
        record = {
            "type": "runStarted",
            "operationId": op_id,
            "operationKind": "run",
            "inputEntryId": input_id,
        }
        fact = self._record(record)
        self.op = self.last_op = {"kind": "run", "id": op_id, "input": input_id, "aborted": False}
        self.step = None
        self.assistant_info = None
        self.started = []
        return fact

    def start_run(self, content: str = "hello") -> tuple[dict, dict]:
        """[user entry, runStarted] in one transaction (15.2 step 1)."""
        with self.tx():
            user = self.user(content)
            run = self.run_started(user["id"])
        return user, run

    def step_attempt(
        self,
        attempt: int = 1,
        *,
        tools: Sequence[str] | None = None,
        snapshot: dict[str, Any] | None = None,
        context: str | None = None,
        step_id: str | None = None,
    ) -> dict:
        """``stepAttempt`` (8.3). Attempt 2 defaults to the current step's values."""
        assert self.op is not None, "no active operation"
        kind = "assistant" if self.op["kind"] == "run" else "compaction"
        if attempt == 2 and self.step is not None:
            step_id = step_id if step_id is not None else self.step["stepId"]
            context = context if context is not None else self.step["context"]
            if snapshot is None and tools is None:
                snapshot = copy.deepcopy(self.step["snapshot"])
        if step_id is None:
            step_id = self.new_id()
        if context is None:
            context = self.boundary
        if snapshot is None:
            snapshot = self.snapshot(tools)
        attempt_id = self.new_id()
        record = {
            "type": "stepAttempt",
            "operationId": self.op["id"],
            "stepId": step_id,
            "attemptId": attempt_id,
            "stepKind": kind,
            "attempt": attempt,
            "contextThroughEntryId": context,
            "configurationSnapshot": snapshot,
            "configurationDigest": configuration_digest(snapshot),
        }
        fact = self._record(record)
        self.step = {
            "stepId": step_id,
            "attemptId": attempt_id,
            "attempt": attempt,
            "context": context,
            "snapshot": snapshot,
            "kind": kind,
        }
        return fact

    def retry(self) -> dict:
        """Attempt 2 of the current step (same step, boundary and snapshot)."""
        return self.step_attempt(2)

    def call(self, name: str = "read", arguments: str = '{"path":"README.md"}') -> dict:
        """A tool call object with a fresh provider call ID."""
        return {
            "id": self.new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def assistant(
        self,
        content: str | None = "done",
        calls: Sequence[str | tuple[str, str] | dict[str, Any]] = (),
        *,
        stop_reason: str | None = None,
    ) -> dict:
        """An assistant entry settling the current attempt (7.2).

        ``calls`` items are tool names, ``(name, arguments)`` pairs or full call dicts.
        ``stop_reason`` defaults to ``toolUse`` with calls and ``stop`` without.
        """
        assert self.step is not None, "no attempt"
        built: list[dict[str, Any]] = []
        for item in calls:
            if isinstance(item, dict):
                built.append(item)
            elif isinstance(item, tuple):
                built.append(self.call(item[0], item[1]))
            else:
                built.append(self.call(item))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if built:
            message["tool_calls"] = built
        if stop_reason is None:
            stop_reason = "toolUse" if built else "stop"
        entry = {
            "type": "message",
            "stepId": self.step["stepId"],
            "attemptId": self.step["attemptId"],
            "stopReason": stop_reason,
            "message": message,
        }
        fact = self._entry(entry)
        self._accept_message(fact["id"], message)
        self.assistant_info = {
            "id": fact["id"],
            "stepId": self.step["stepId"],
            "calls": built,
            "stop": stop_reason,
        }
        return fact

    def tool_started(
        self,
        index: int = 0,
        *,
        replay: str = "safe",
        arguments: dict[str, Any] | None = None,
        replay_key: str | None = None,
        environment: str = "fixture",
    ) -> dict:
        """``toolStarted`` (8.5) for call ``index`` of the current assistant entry."""
        assert self.op is not None and self.assistant_info is not None
        call = self.assistant_info["calls"][index]
        name = call["function"]["name"]
        if arguments is None:
            try:
                parsed = orjson.loads(call["function"]["arguments"])
            except orjson.JSONDecodeError:
                parsed = {}
            arguments = parsed if isinstance(parsed, dict) else {}
        record = {
            "type": "toolStarted",
            "operationId": self.op["id"],
            "stepId": self.assistant_info["stepId"],
            "assistantEntryId": self.assistant_info["id"],
            "toolIndex": index,
            "toolCallId": call["id"],
            "toolName": name,
            "arguments": arguments,
            "replay": replay,
            "replayKey": replay_key if replay_key is not None else f"builtin:{name}:v1",
            "environmentIdentity": environment,
            "resultEntryId": self.new_id(),
        }
        fact = self._record(record)
        self.started.append(fact)
        return fact

    def _started(self, started: dict | None) -> dict[str, Any]:
        if started is None:
            started = self.started[-1]
        record: dict[str, Any] = started["record"]
        return {"id": started["id"], **record}

    def tool_result(
        self, started: dict | None = None, *, content: str = "ok", result: str = "success"
    ) -> dict:
        """The result entry of a started tool (7.3), ``success`` or ``error``."""
        rec = self._started(started)
        message = {"role": "tool", "content": content, "tool_call_id": rec["toolCallId"]}
        entry = {
            "type": "message",
            "stepId": rec["stepId"],
            "message": message,
            "toolName": rec["toolName"],
            "toolStartedId": rec["id"],
            "result": {"type": result},
        }
        fact = self._entry(entry, fact_id=rec["resultEntryId"])
        self._accept_message(fact["id"], message)
        return fact

    def interrupted(self, started: dict | None = None) -> dict:
        """The ``interrupted`` synthetic result of a started tool (7.3/7.6)."""
        fact = self.tool_result(started, content=SYNTHETIC_CONTENT["interrupted"])
        fact["entry"]["result"] = {"type": "synthetic", "reason": "interrupted"}
        return fact

    def synthetic(self, index: int, reason: str, *, assistant: dict | None = None) -> dict:
        """A pre-execution synthetic result (7.4) for call ``index``."""
        if assistant is None:
            assert self.assistant_info is not None
            info = self.assistant_info
            entry_id, step_id, calls = info["id"], info["stepId"], info["calls"]
        else:
            entry_id = assistant["id"]
            step_id = assistant["entry"]["stepId"]
            calls = assistant["entry"]["message"]["tool_calls"]
        call = calls[index]
        message = {
            "role": "tool",
            "content": SYNTHETIC_CONTENT[reason],
            "tool_call_id": call["id"],
        }
        entry = {
            "type": "message",
            "stepId": step_id,
            "assistantEntryId": entry_id,
            "toolIndex": index,
            "message": message,
            "toolName": call["function"]["name"],
            "result": {"type": "synthetic", "reason": reason},
        }
        fact = self._entry(entry)
        self._accept_message(fact["id"], message)
        return fact

    # ------------------------------------------------------------------ lifecycle

    def step_failed(self, error: dict[str, Any] | None = None) -> dict:
        """``stepFailed`` (8.4) for the current attempt."""
        assert self.op is not None and self.step is not None
        record = {
            "type": "stepFailed",
            "operationId": self.op["id"],
            "stepId": self.step["stepId"],
            "attemptId": self.step["attemptId"],
            "error": dict(error if error is not None else MODEL_ERROR),
        }
        return self._record(record)

    def abort(self, phase: str | None = None, tool_call_id: str | None = None) -> dict:
        """``abortRequested`` (8.6); phase defaults from the operation kind."""
        assert self.op is not None
        if phase is None:
            phase = (
                "tool"
                if tool_call_id is not None
                else ("model" if self.op["kind"] == "run" else "compact")
            )
        record: dict[str, Any] = {
            "type": "abortRequested",
            "operationId": self.op["id"],
            "operationKind": self.op["kind"],
            "phase": phase,
        }
        if phase == "tool":
            record["toolCallId"] = tool_call_id if tool_call_id is not None else ""
        record["reason"] = "escape"
        self.op["aborted"] = True
        return self._record(record)

    def finish(
        self,
        outcome: str = "completed",
        *,
        completion: str | None = None,
        final: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict:
        """``operationFinished`` (8.7) for the active operation."""
        assert self.op is not None
        record: dict[str, Any] = {
            "type": "operationFinished",
            "operationId": self.op["id"],
            "operationKind": self.op["kind"],
            "outcome": outcome,
        }
        if outcome == "completed":
            if self.op["kind"] == "run":
                record["completion"] = completion if completion is not None else "normal"
                assert final is not None or self.assistant_info is not None
                record["finalEntryId"] = (
                    final if final is not None else self.assistant_info["id"]  # type: ignore[index]
                )
            else:
                record["finalEntryId"] = final if final is not None else self.op["result"]
        elif outcome == "failed":
            record["error"] = dict(error if error is not None else MODEL_ERROR)
        fact = self._record(record)
        self.op = None
        return fact

    # ------------------------------------------------------------------ compaction

    def legal_keeps(self) -> list[int]:
        """Numbers of retained messages that leave a legal tail (and compact >= 1)."""
        total = len(self.messages)
        keeps = []
        for keep in range(total):
            tail = [message for _, message in self.messages[total - keep :]]
            if _legal(tail):
                keeps.append(keep)
        return keeps

    def _messages_through(self, entry_id: str) -> list[tuple[str, dict[str, Any]]]:
        count = 0
        for ident, message in self.entries:
            if ident == entry_id:
                if message is not None:
                    count += 1
                break
            if message is not None:
                count += 1
        else:
            raise LookupError(entry_id)
        return self.messages[:count]

    def source_digest(self, through: str | None = None) -> str:
        """The sourceDigest (10.4) through ``through`` (default: the boundary)."""
        through = through if through is not None else self.boundary
        assert through is not None
        return source_digest(self._messages_through(through))

    def compaction_started(self, *, keep: int = 0, through: str | None = None) -> dict:
        """``compactionStarted`` (8.2) retaining the last ``keep`` messages."""
        through = through if through is not None else self.boundary
        assert through is not None, "nothing to compact"
        items = self._messages_through(through)
        ids = [ident for ident, _ in items]
        split = len(ids) - keep
        op_id = self.new_id()
        result_id = self.new_id()
        record = {
            "type": "compactionStarted",
            "operationId": op_id,
            "operationKind": "compaction",
            "inputThroughEntryId": through,
            "resultEntryId": result_id,
            "compactedEntryIds": ids[:split],
            "retainedEntryIds": ids[split:],
            "sourceDigest": source_digest(items),
        }
        fact = self._record(record)
        self.op = self.last_op = {
            "kind": "compaction",
            "id": op_id,
            "through": through,
            "result": result_id,
            "compactedThrough": ids[split - 1] if split > 0 else None,
            "retained": [(ident, copy.deepcopy(message)) for ident, message in items[split:]],
            "aborted": False,
        }
        self.step = None
        return fact

    def compaction(self, summary: str = "summary") -> dict:
        """The compaction entry (7.5) settling the compaction attempt."""
        op = self.op
        assert op is not None and op["kind"] == "compaction"
        entry = {
            "type": "compaction",
            "operationId": op["id"],
            "summary": summary,
            "compactedThroughEntryId": op["compactedThrough"],
            "retainedTail": [
                {"sourceEntryId": ident, "message": copy.deepcopy(message)}
                for ident, message in op["retained"]
            ],
        }
        fact = self._entry(entry, fact_id=op["result"])
        self.entries.append((fact["id"], None))
        self.boundary = op["through"]
        return fact

    # ------------------------------------------------------------------ usage

    def usage(
        self,
        *,
        attempt_id: str | None = None,
        tool_started_id: str | None = None,
        operation_id: str | None = None,
        input: int = 10,
        output: int = 2,
        cache_read: int = 3,
        cache_write: int = 0,
    ) -> dict:
        """A usage fact (9); the owner defaults to the current attempt."""
        if attempt_id is None and tool_started_id is None:
            assert self.step is not None
            attempt_id = self.step["attemptId"]
        if operation_id is None:
            assert self.last_op is not None
            operation_id = self.last_op["id"]
        members: dict[str, Any] = {"operationId": operation_id}
        if attempt_id is not None:
            members["attemptId"] = attempt_id
        if tool_started_id is not None:
            members["toolStartedId"] = tool_started_id
        members["usage"] = {
            "input": input,
            "output": output,
            "cacheRead": cache_read,
            "cacheWrite": cache_write,
        }
        return self._emit("usage", members)

    # ------------------------------------------------------------------ composites

    def simple_run(self, prompt: str = "hello", answer: str = "done") -> dict[str, dict]:
        """A complete run: prompt, one attempt, a ``stop`` answer, completed."""
        user, run = self.start_run(prompt)
        attempt = self.step_attempt()
        reply = self.assistant(answer)
        finish = self.finish()
        return {"user": user, "run": run, "attempt": attempt, "assistant": reply, "finish": finish}

    def tool_run(self, prompt: str = "inspect") -> dict[str, dict]:
        """15.2's run with one tool call: prompt, toolUse, tool, answer, completed."""
        user, run = self.start_run(prompt)
        attempt1 = self.step_attempt()
        call = self.assistant(None, ["read"])
        started = self.tool_started(0)
        result = self.tool_result(started, content="contents")
        attempt2 = self.step_attempt()
        reply = self.assistant("done")
        finish = self.finish()
        return {
            "user": user,
            "run": run,
            "attempt1": attempt1,
            "call": call,
            "started": started,
            "result": result,
            "attempt2": attempt2,
            "assistant": reply,
            "finish": finish,
        }

    def compact(self, keep: int = 0, summary: str = "summary") -> dict[str, dict]:
        """A complete compaction operation (15.2)."""
        started = self.compaction_started(keep=keep)
        attempt = self.step_attempt()
        entry = self.compaction(summary)
        finish = self.finish()
        return {"started": started, "attempt": attempt, "entry": entry, "finish": finish}


def _legal(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Transcript legality (6.3)."""
    open_calls: set[str] = set()
    for message in messages:
        role = message["role"]
        if role == "tool":
            if message["tool_call_id"] not in open_calls:
                return False
            open_calls.discard(message["tool_call_id"])
        elif open_calls:
            return False
        elif role == "assistant":
            open_calls = {call["id"] for call in message.get("tool_calls") or ()}
    return True


def open_calls(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    """The open call IDs after a legal transcript (6.3)."""
    current: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            current.discard(message["tool_call_id"])
        elif message["role"] == "assistant":
            current = {call["id"] for call in message.get("tool_calls") or ()}
    return current


# ---------------------------------------------------------------------- assertions


def _incremental(data: bytes) -> SessionState | SessionCorruption:
    """Feed ``data`` line by line through ``Reducer.from_header_line`` + ``apply``."""
    end = data.rfind(b"\n") + 1
    lines = data[: end - 1].split(b"\n")
    try:
        reducer = Reducer.from_header_line(lines[0])
        for raw in lines[1:]:
            reducer.apply(raw)
    except SessionCorruption as exc:
        return exc
    return reducer.state


def _incremental_applies(data: bytes) -> bool:
    """Whether the whole-file framing checks (2.5 steps 1-4) cannot interfere."""
    end = data.rfind(b"\n") + 1
    if end == 0 or data.startswith(b"\n"):
        return False
    try:
        data[:end].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def expect_error(
    data: bytes | SessionKit, code: str, line: int, seq: int | None = None
) -> SessionCorruption:
    """Assert that reducing ``data`` fails with exactly ``(code, line, seq)``.

    Also checks the incremental API reports the same error, and ``to_json``.
    """
    if isinstance(data, SessionKit):
        data = data.bytes()
    try:
        state = reduce_session(data)
    except SessionCorruption as exc:
        error = exc
    else:
        raise AssertionError(f"expected {code} at line {line} seq {seq}, got a state: {state}")
    assert (error.code, error.line, error.seq) == (code, line, seq), str(error)
    expected_json: dict[str, Any] = {"code": code, "line": line}
    if seq is not None:
        expected_json["seq"] = seq
    assert error.to_json() == expected_json
    if _incremental_applies(data):
        other = _incremental(data)
        assert isinstance(other, SessionCorruption), "incremental apply accepted the log"
        assert (other.code, other.line, other.seq) == (code, line, seq), str(other)
    return error


def expect_ok(data: bytes | SessionKit) -> SessionState:
    """Reduce ``data`` (must succeed) and check the incremental API agrees."""
    if isinstance(data, SessionKit):
        data = data.bytes()
    state = reduce_session(data)
    assert state.repaired_length == data.rfind(b"\n") + 1
    other = _incremental(data)
    assert isinstance(other, SessionState), str(other)
    assert other.to_json() == state.to_json()
    return state
