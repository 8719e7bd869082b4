"""The model adapter contract: one request in, one normalized answer (or one error) out.

The executor records a ``stepAttempt`` before every physical model request, calls
:meth:`ModelAdapter.complete` exactly once for it, and then records either the assistant
entry plus a usage fact, or ``stepFailed`` with :meth:`ModelError.to_json` (spec 8.3, 8.4,
15.2). Adapters therefore never retry: one ``complete`` call is at most one physical
request.

Everything here is pure data and pure functions; adapters live in
:mod:`tether._models.openai_compat` and :mod:`tether.testing.scripted`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, runtime_checkable

from tether._credentials import Masker
from tether.core.canonical import MAX_SAFE_INTEGER
from tether.core.kinds import StopReason, Usage
from tether.errors import MODEL_ERROR_CODES, ConfigurationError, ModelError

__all__ = [
    "MAX_SAFE_INTEGER",
    "MODEL_ERROR_CODES",
    "RESERVED_OUTPUT_OPTIONS",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "Purpose",
    "Reasoning",
    "TokenUsage",
    "ToolCallOut",
    "call_model",
    "default_call_id",
    "has_unpaired_surrogate",
    "redact",
    "stop_reason_for",
    "validate_output_options",
]


Purpose = Literal["assistant", "compaction"]

RESERVED_OUTPUT_OPTIONS: Final = frozenset(
    {"model", "messages", "tools", "functions", "stream", "stream_options", "n"}
)
"""Request members tether sets itself; an output option may not override them."""

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Reasoning:
    """What a model said while thinking, kept beside the log (never in it, spec 6).

    ``text`` is the readable reasoning (OpenRouter ``reasoning``, DeepSeek/vLLM
    ``reasoning_content``, Anthropic ``thinking`` text). ``details`` are the provider's own
    structured records that must be sent back verbatim on later requests (OpenRouter
    ``reasoning_details``, Anthropic ``thinking``/``redacted_thinking`` blocks with their
    signatures); ``format`` names whose records they are (``openrouter``, ``anthropic``).
    """

    text: str = ""
    details: tuple[Mapping[str, Any], ...] = ()
    format: str = ""

    def __post_init__(self) -> None:
        details: Any = self.details
        if not isinstance(details, tuple):
            object.__setattr__(self, "details", tuple(details))

    def __bool__(self) -> bool:
        return bool(self.text or self.details)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "details": [dict(d) for d in self.details],
            "format": self.format,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reasoning:
        text = data.get("text")
        details = data.get("details")
        fmt = data.get("format")
        return cls(
            text=text if isinstance(text, str) else "",
            details=tuple(d for d in details if isinstance(d, Mapping))
            if isinstance(details, list)
            else (),
            format=fmt if isinstance(fmt, str) else "",
        )


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model request is made of.

    ``messages`` is the session's ``activeContext`` (normalized messages, spec 6.2) and
    ``tools`` the ordered model-facing definitions ``{"name", "description",
    "parameters"}``. ``output_options`` are extra request members such as
    ``temperature`` or ``max_tokens`` (their canonical digest is the snapshot's
    ``outputOptionsDigest``). ``position`` is the number of assistant and compaction
    steps already settled in the session, computed from the log, so it is the same in
    a process that resumes after a crash; the scripted model answers by it.
    """

    system_prompt: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] = ()
    output_options: Mapping[str, Any] = field(default_factory=dict)
    position: int = 0
    purpose: Purpose = "assistant"
    reasoning: Sequence[Reasoning | None] = ()
    """Side records aligned with ``messages`` (``reasoning[i]`` belongs to ``messages[i]``,
    an assistant message); empty or shorter when they are missing. Adapters send them
    back to providers that want them; they never affect the configuration digest."""
    failed_results: frozenset[int] = frozenset()
    """Indices of the ``messages`` that are tool results recorded as failed (an ``error``
    result, or a synthetic one: the call never ran). The normalized message has no member
    for it (spec 6); an adapter whose provider has one sends it (Anthropic's
    ``is_error``)."""

    def __post_init__(self) -> None:
        if isinstance(self.position, bool) or not isinstance(self.position, int):
            raise TypeError("ModelRequest.position must be an int")
        if self.position < 0:
            raise ValueError("ModelRequest.position must be >= 0")
        if self.purpose not in ("assistant", "compaction"):
            raise ValueError(
                f"ModelRequest.purpose must be 'assistant' or 'compaction', not {self.purpose!r}"
            )


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    """One tool call of an answer; ``arguments`` is the provider's raw JSON text.

    The arguments are deliberately not parsed here: the recovery planner turns
    unparsable arguments and unknown tool names into synthetic results (spec 14.4
    rule 9), so they are facts to record, not adapter errors.
    """

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        """The normalized tool call ``{"id","type","function":{"name","arguments"}}``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


TokenUsage = Usage
"""The token counters of one attempt: the core's one usage type, under the name the
adapters have always used (:class:`tether.core.state.Usage` validates them)."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A normalized answer.

    ``stop_reason`` always agrees with the tool calls the way the log requires (spec
    7.2): ``TOOL_USE`` exactly when there are calls, unless the answer was cut off
    (``LENGTH``, with or without calls). Use :func:`stop_reason_for` to derive it from
    a provider's ``finish_reason``. An empty answer (no content, no calls) is a valid
    response: the planner finishes such a run as failed (spec 14.4 rule 7).
    ``finish_reason`` keeps the provider's raw value for diagnostics only.
    ``reasoning``, ``reasoning_tokens`` and ``cost`` have no place in the session log; the
    executor keeps them in the reasoning side record (:mod:`tether._stores.reasoning`).
    """

    content: str | None
    tool_calls: tuple[ToolCallOut, ...] = ()
    stop_reason: StopReason = StopReason.STOP
    usage: TokenUsage = field(default_factory=TokenUsage)
    finish_reason: str | None = None
    reasoning: Reasoning | None = None
    reasoning_tokens: int | None = None
    """Reasoning tokens the provider reported (already included in ``usage.output``)."""
    cost: float | None = None
    """The price the provider reported for this request (OpenRouter ``usage.cost``)."""

    def __post_init__(self) -> None:
        if self.content is not None and not isinstance(self.content, str):
            raise TypeError("ModelResponse.content must be a str or None")
        calls: Any = self.tool_calls
        if not isinstance(calls, tuple):  # accept any sequence, store a tuple
            object.__setattr__(self, "tool_calls", tuple(calls))
        if self.stop_reason is StopReason.TOOL_USE and not self.tool_calls:
            raise ValueError("stop reason toolUse requires tool calls")
        if self.stop_reason is StopReason.STOP and self.tool_calls:
            raise ValueError("stop reason stop forbids tool calls")
        ids = [call.id for call in self.tool_calls]
        if len(set(ids)) != len(ids):
            raise ValueError("tool call ids must be unique within one answer")

    def to_message(self) -> dict[str, Any]:
        """The normalized assistant message (spec 6.2); ``tool_calls`` omitted when none."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_json() for call in self.tool_calls]
        return message


@runtime_checkable
class ModelAdapter(Protocol):
    """What the executor needs from a model.

    ``provider`` and ``model`` go into the session header; ``model``,
    ``adapter_identity`` and ``routing_identity`` into every configuration snapshot
    (spec 10.2). None of them ever contains a credential.
    """

    @property
    def provider(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def adapter_identity(self) -> str: ...

    @property
    def routing_identity(self) -> str: ...

    def complete(
        self, request: ModelRequest, *, cancel: threading.Event | None = None
    ) -> ModelResponse:
        """Perform at most one physical request and return the normalized answer.

        Raises :class:`ModelError` for every failure (including ``aborted`` when
        ``cancel`` is set before or during the request). Never retries.
        """
        ...


def call_model(
    model: ModelAdapter,
    request: ModelRequest,
    *,
    cancel: threading.Event | None = None,
    on_delta: Callable[[Any], None] | None = None,
) -> ModelResponse:
    """``model.complete(request, cancel=cancel)``, plus ``on_delta`` for streaming adapters.

    An adapter that streams says so with a true ``streaming`` attribute and then accepts
    ``on_delta`` (a :data:`tether._models.streaming.DeltaSink`); other adapters are called
    with the plain protocol signature.
    """
    if on_delta is not None and getattr(model, "streaming", False):
        complete: Any = model.complete
        return complete(request, cancel=cancel, on_delta=on_delta)  # type: ignore[no-any-return]
    return model.complete(request, cancel=cancel)


def stop_reason_for(finish_reason: str | None, has_tool_calls: bool) -> StopReason:
    """Map a provider ``finish_reason`` to the log's stop reason.

    ``"length"`` → ``LENGTH`` (with or without calls: truncation wins). Everything
    else — ``"stop"``, ``"tool_calls"``, ``"function_call"``, ``"content_filter"``,
    ``None`` and unknown values — is decided by the calls alone: ``TOOL_USE`` when the
    answer has tool calls, otherwise ``STOP``. So a provider that reports ``stop``
    together with tool calls yields ``TOOL_USE``, and ``tool_calls`` without any call
    yields ``STOP``, as the log requires (``toolUse`` ⇔ ``tool_calls``).
    """
    if finish_reason == "length":
        return StopReason.LENGTH
    return StopReason.TOOL_USE if has_tool_calls else StopReason.STOP


def default_call_id(position: int, index: int) -> str:
    """The deterministic id given to a tool call that arrived without one."""
    return f"call_{position}_{index}"


def has_unpaired_surrogate(text: str) -> bool:
    """True when ``text`` cannot be written to the log (spec 2.3, 2.4)."""
    return _SURROGATE.search(text) is not None


def validate_output_options(options: Mapping[str, Any]) -> None:
    """Reject output options that cannot be sent as extra request members.

    Call this before recording a ``stepAttempt``; adapters call it too. Raises
    :class:`~tether.errors.ConfigurationError` with a one-line message.
    """
    if not isinstance(options, Mapping):
        raise ConfigurationError("output options must be a JSON object")
    for name in options:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("output option names must be non-empty strings")
        if name in RESERVED_OUTPUT_OPTIONS:
            raise ConfigurationError(
                f"output option {name!r} is set by tether itself and cannot be overridden"
            )
        _check_json_value(options[name], f"output option {name!r}")


def _check_json_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigurationError(f"{where} must be a finite number")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigurationError(f"{where} has a non-string key")
            _check_json_value(item, where)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_json_value(item, where)
        return
    raise ConfigurationError(f"{where} is not a JSON value")


_KEY_PATTERNS: Final = (
    re.compile(r"(?i)\bbearer\s+[^\s\"',;]+"),
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}"),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every given secret and anything that looks like an API key masked.

    Exact secrets are replaced as everywhere else in tether (:class:`~tether._credentials.
    Masker`: ``[redacted]``, secrets of at least :data:`~tether._credentials.
    MIN_SECRET_LENGTH` characters); ``Bearer …`` tokens and ``sk-…``/``pk-…``/``rk-…``
    style keys become ``Bearer ***`` and ``sk-***``, since a provider may echo a key that
    is not the one in use.
    """
    text = Masker(tuple(secrets)).text(text)
    for pattern in _KEY_PATTERNS:
        text = pattern.sub(_mask, text)
    return text


def _mask(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.lower().startswith("bearer"):
        return "Bearer ***"
    return token[:3] + "***"
