"""A scripted model: answers come from a JSON file, chosen by position in the session.

``responses[i]`` is the answer to the request whose ``position`` is ``i`` (the number of
assistant and compaction steps already settled in the session). Because the position is
computed from the log, a process that resumes after a crash asks for the same position
as the one that died and gets the same answer. The model is fully deterministic: no
randomness, no clock in its output (``delay`` only waits, on the clock it was given: a
test's :class:`~tether.testing.clock.FakeClock` lets a slow step pass in no real time).

File format (see ``docs/models.md``)::

    {"model": "scripted/demo",
     "responses": [
       {"content": "Let me look.",
        "tool_calls": [{"id": "call_1", "name": "read", "arguments": {"path": "README.md"}}],
        "usage": {"input": 120, "output": 14}},
       {"content": "Done.", "finish_reason": "stop", "delay": 0.5},
       {"error": {"code": "rate_limited", "message": "slow down"}}
     ]}

The file is validated completely when it is loaded; every problem is reported as one
line naming the file and the JSON pointer of the offending value.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NoReturn

from tether._clock import SYSTEM_CLOCK, Clock
from tether._inputs import (
    MAX_JSON_DEPTH,
    MAX_SCRIPT_BYTES,
    deeper_than,
    read_file,
    value_deeper_than,
)
from tether._models.base import (
    MAX_SAFE_INTEGER,
    ModelRequest,
    ModelResponse,
    TokenUsage,
    ToolCallOut,
    default_call_id,
    has_unpaired_surrogate,
    stop_reason_for,
)
from tether.core.records import record
from tether.errors import MODEL_ERROR_CODES, ConfigurationError, InputTooDeep, ModelError

__all__ = ["ADAPTER_IDENTITY", "FINISH_REASONS", "MAX_DELAY", "ScriptedModel"]

ADAPTER_IDENTITY: Final = "scripted:v1"
FINISH_REASONS: Final = frozenset(
    {"stop", "tool_calls", "length", "content_filter", "function_call"}
)
MAX_DELAY: Final = 3600.0

_SCRIPT_KEYS: Final = frozenset({"model", "responses", "comment"})
_RESPONSE_KEYS: Final = frozenset(
    {"content", "tool_calls", "finish_reason", "usage", "cost", "delay", "error", "comment"}
)
_CALL_KEYS: Final = frozenset({"id", "name", "arguments", "type", "function"})
_USAGE_KEYS: Final = {
    "input": "input",
    "output": "output",
    "cacheRead": "cache_read",
    "cacheWrite": "cache_write",
}


@record(slots=True)
class _Step:
    delay: float
    response: ModelResponse | None
    error: tuple[str, str] | None


class _Invalid(Exception):
    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(message)
        self.pointer = pointer
        self.message = message


def _pointer(parent: str, token: str | int) -> str:
    text = str(token).replace("~", "~0").replace("/", "~1")
    return f"{parent}/{text}"


def _fail(pointer: str, message: str) -> NoReturn:
    raise _Invalid(pointer, message)


def _text(value: object, pointer: str, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty_ok):
        _fail(pointer, "must be a string" if empty_ok else "must be a non-empty string")
    if has_unpaired_surrogate(value):
        _fail(pointer, "contains an unpaired surrogate")
    return value


def _object(value: object, pointer: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _fail(pointer, "must be an object")
    for key in value:
        if key not in allowed:
            names = ", ".join(sorted(allowed))
            _fail(_pointer(pointer, key), f"unknown member (allowed: {names})")
    return value


def _arguments(value: object, pointer: str) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return _text(value, pointer, empty_ok=True)
    if isinstance(value, Mapping):
        _check_strings(value, pointer)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    _fail(pointer, "must be a JSON object or a string of raw arguments")


def _check_strings(value: object, pointer: str) -> None:
    """Check every string (member names too) of ``value``, in document order.

    With an explicit stack, not recursion: arguments may nest up to ``MAX_JSON_DEPTH``
    levels, which would leave little of Python's recursion limit to the caller. A member
    name is checked (at its object's pointer) before its value.
    """
    stack: list[tuple[object, str, bool]] = [(value, pointer, False)]  # (item, where, name?)
    while stack:
        item, where, is_name = stack.pop()
        if is_name or isinstance(item, str):
            _text(item, where, empty_ok=True)
        elif isinstance(item, Mapping):
            pending: list[tuple[object, str, bool]] = []
            for key, member in item.items():
                pending.append((key, where, True))
                pending.append((member, _pointer(where, key), False))
            stack.extend(reversed(pending))
        elif isinstance(item, list):
            members = [(member, _pointer(where, i), False) for i, member in enumerate(item)]
            stack.extend(reversed(members))


def _tool_call(value: object, pointer: str, position: int, index: int) -> ToolCallOut:
    call = _object(value, pointer, frozenset(_CALL_KEYS))
    if "type" in call and call["type"] != "function":
        _fail(_pointer(pointer, "type"), 'must be "function"')
    if "function" in call:  # the OpenAI wire shape, e.g. pasted from a session log
        if "name" in call or "arguments" in call:
            _fail(pointer, 'use either "function" or "name"/"arguments", not both')
        function = _object(
            call["function"], _pointer(pointer, "function"), frozenset({"name", "arguments"})
        )
        where = _pointer(pointer, "function")
    else:
        function = call
        where = pointer
    if "name" not in function:
        _fail(_pointer(where, "name"), "is required")
    name = _text(function["name"], _pointer(where, "name"))
    arguments = _arguments(function.get("arguments"), _pointer(where, "arguments"))
    call_id = (
        _text(call["id"], _pointer(pointer, "id"))
        if "id" in call
        else default_call_id(position, index)
    )
    return ToolCallOut(id=call_id, name=name, arguments=arguments)


def _usage(value: object, pointer: str) -> TokenUsage:
    usage = _object(value, pointer, frozenset(_USAGE_KEYS))
    counters: dict[str, int] = {}
    for key, attribute in _USAGE_KEYS.items():
        if key not in usage:
            continue
        count = usage[key]
        if isinstance(count, bool) or not isinstance(count, int):
            _fail(_pointer(pointer, key), "must be an integer")
        if not 0 <= count <= MAX_SAFE_INTEGER:
            _fail(_pointer(pointer, key), f"must be between 0 and {MAX_SAFE_INTEGER}")
        counters[attribute] = count
    return TokenUsage(**counters)


def _step(value: object, pointer: str, position: int) -> _Step:
    item = _object(value, pointer, _RESPONSE_KEYS)
    delay = 0.0
    if "delay" in item:
        raw_delay = item["delay"]
        if isinstance(raw_delay, bool) or not isinstance(raw_delay, (int, float)):
            _fail(_pointer(pointer, "delay"), "must be a number of seconds")
        if not math.isfinite(raw_delay) or not 0 <= raw_delay <= MAX_DELAY:
            _fail(_pointer(pointer, "delay"), f"must be between 0 and {MAX_DELAY:g} seconds")
        delay = float(raw_delay)
    if "comment" in item:
        _text(item["comment"], _pointer(pointer, "comment"), empty_ok=True)
    if "error" in item:
        for other in ("content", "tool_calls", "finish_reason", "usage"):
            if other in item:
                _fail(_pointer(pointer, other), "not allowed together with error")
        error_pointer = _pointer(pointer, "error")
        error = _object(item["error"], error_pointer, frozenset({"code", "message"}))
        if "code" not in error:
            _fail(_pointer(error_pointer, "code"), "is required")
        code = error["code"]
        if code not in MODEL_ERROR_CODES:
            codes = ", ".join(sorted(MODEL_ERROR_CODES))
            _fail(_pointer(error_pointer, "code"), f"must be one of {codes}")
        message = (
            _text(error["message"], _pointer(error_pointer, "message"))
            if "message" in error
            else f"scripted {code} error"
        )
        if "\n" in message or "\r" in message:
            _fail(_pointer(error_pointer, "message"), "must be a single line")
        return _Step(delay=delay, response=None, error=(str(code), message))

    content: str | None = None
    if item.get("content") is not None:
        content = _text(item["content"], _pointer(pointer, "content"), empty_ok=True)
    calls: list[ToolCallOut] = []
    if "tool_calls" in item:
        raw_calls = item["tool_calls"]
        calls_pointer = _pointer(pointer, "tool_calls")
        if not isinstance(raw_calls, list):
            _fail(calls_pointer, "must be an array")
        seen: set[str] = set()
        for index, raw in enumerate(raw_calls):
            call = _tool_call(raw, _pointer(calls_pointer, index), position, index)
            if call.id in seen:
                _fail(
                    _pointer(_pointer(calls_pointer, index), "id"),
                    f"duplicate tool call id {call.id!r}",
                )
            seen.add(call.id)
            calls.append(call)
    finish: str | None = None
    if item.get("finish_reason") is not None:
        finish = _text(item["finish_reason"], _pointer(pointer, "finish_reason"))
        if finish not in FINISH_REASONS:
            _fail(
                _pointer(pointer, "finish_reason"),
                f"must be one of {', '.join(sorted(FINISH_REASONS))}",
            )
    usage = _usage(item["usage"], _pointer(pointer, "usage")) if "usage" in item else TokenUsage()
    cost: float | None = None
    if "cost" in item:  # the price a provider reports (OpenRouter's usage.cost), US dollars
        value = item["cost"]
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            _fail(_pointer(pointer, "cost"), "must be a number of US dollars, 0 or more")
        cost = float(value)
    response = ModelResponse(
        content=content,
        tool_calls=tuple(calls),
        stop_reason=stop_reason_for(finish, bool(calls)),
        usage=usage,
        finish_reason=finish,
        cost=cost,
    )
    return _Step(delay=delay, response=response, error=None)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate member {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _canonical_bytes(data: Mapping[str, Any]) -> bytes:
    return json.dumps(
        data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8", "surrogatepass")


class ScriptedModel:
    """A :class:`~tether._models.base.ModelAdapter` that replays a validated script."""

    def __init__(
        self,
        steps: tuple[_Step, ...],
        *,
        model: str,
        digest: str,
        source: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._steps = steps
        self._model = model
        self._digest = digest
        self._source = source
        self._clock = clock

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load and validate a script file; problems raise a one-line ConfigurationError.

        The file must be a regular file of at most :data:`~tether._inputs.MAX_SCRIPT_BYTES`
        (links are followed); see :func:`tether._inputs.read_file`.
        """
        source = str(path)
        data = read_file(path, f"model script {source}", limit=MAX_SCRIPT_BYTES)
        return cls.from_json(data, source=source)

    @classmethod
    def from_json(
        cls,
        data: bytes | str | Mapping[str, Any],
        *,
        source: str = "<script>",
        clock: Clock = SYSTEM_CLOCK,
    ) -> ScriptedModel:
        """Build from the script's JSON text (bytes or str) or an already parsed object.

        The routing identity is ``scripted:`` + the first 16 hex digits of SHA-256 over
        the text as given (for a parsed object: over its sorted compact JSON), so any
        edit of the script changes the configuration digest. ``clock`` is what a step's
        ``delay`` waits on.
        """
        if isinstance(data, (bytes, str)):
            raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
            # Checked on the bytes, before the parser: the json module would recurse
            # into deep nesting until RecursionError.
            if deeper_than(raw, MAX_JSON_DEPTH):
                raise InputTooDeep(f"model script {source}", MAX_JSON_DEPTH)
            try:
                parsed = json.loads(
                    raw.decode("utf-8"),
                    object_pairs_hook=_no_duplicates,
                    parse_constant=_reject_constant,
                )
            except UnicodeDecodeError:
                raise ConfigurationError(f"model script {source} is not valid UTF-8") from None
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"model script {source} is not valid JSON: {exc.msg} "
                    f"(line {exc.lineno}, column {exc.colno})"
                ) from None
            except ValueError as exc:
                raise ConfigurationError(
                    f"model script {source} is not valid JSON: {exc}"
                ) from None
        else:
            if value_deeper_than(data, MAX_JSON_DEPTH):
                raise InputTooDeep(f"model script {source}", MAX_JSON_DEPTH)
            parsed = data
            raw = b""
        try:
            script = _object(parsed, "", _SCRIPT_KEYS)
            model = "scripted"
            if "model" in script:
                model = _text(script["model"], "/model")
                if model != model.strip():
                    _fail("/model", "must not start or end with whitespace")
            if "comment" in script:
                _text(script["comment"], "/comment", empty_ok=True)
            if "responses" not in script:
                _fail("/responses", "is required")
            responses = script["responses"]
            if not isinstance(responses, list) or not responses:
                _fail("/responses", "must be a non-empty array")
            steps = tuple(
                _step(item, _pointer("/responses", index), index)
                for index, item in enumerate(responses)
            )
            if not raw:
                try:
                    raw = _canonical_bytes(script)
                except (TypeError, ValueError):
                    _fail("", "contains values that are not JSON")
        except _Invalid as problem:
            where = problem.pointer or "/"
            raise ConfigurationError(
                f"model script {source} at {where}: {problem.message}"
            ) from None
        digest = hashlib.sha256(raw).hexdigest()[:16]
        return cls(steps, model=model, digest=digest, source=source, clock=clock)

    # -- identity ---------------------------------------------------------------------------

    @property
    def provider(self) -> str:
        return "scripted"

    @property
    def model(self) -> str:
        return self._model

    @property
    def adapter_identity(self) -> str:
        return ADAPTER_IDENTITY

    @property
    def routing_identity(self) -> str:
        return f"scripted:{self._digest}"

    @property
    def source(self) -> str:
        return self._source

    def __len__(self) -> int:
        return len(self._steps)

    def __repr__(self) -> str:
        return f"ScriptedModel(source={self._source!r}, responses={len(self._steps)})"

    def response_at(self, position: int) -> ModelResponse | ModelError:
        """What :meth:`complete` gives at ``position`` (without waiting)."""
        if position >= len(self._steps):
            return ModelError(
                "bad_response",
                f"script exhausted at position {position} "
                f"({self._source} has {len(self._steps)} responses)",
            )
        step = self._steps[position]
        if step.error is not None:
            return ModelError(step.error[0], step.error[1])
        assert step.response is not None
        return step.response

    # -- the request ------------------------------------------------------------------------

    def complete(
        self, request: ModelRequest, *, cancel: threading.Event | None = None
    ) -> ModelResponse:
        if cancel is not None and cancel.is_set():
            raise ModelError("aborted", "Operation aborted")
        position = request.position
        if position < len(self._steps):
            delay = self._steps[position].delay
            if delay > 0:
                waiter = cancel if cancel is not None else threading.Event()
                if self._clock.wait(waiter, delay):
                    raise ModelError("aborted", "Operation aborted")
        outcome = self.response_at(position)
        if isinstance(outcome, ModelError):
            raise outcome
        return outcome
