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
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from tether._credentials import Masker
from tether.core.canonical import MAX_SAFE_INTEGER, has_unpaired_surrogate
from tether.core.kinds import StopReason, Usage
from tether.errors import MODEL_ERROR_CODES, ConfigurationError, ModelError

if TYPE_CHECKING:  # at run time loaded on first use by __getattr__ below
    from tether._models.messages import ModelRequest as ModelRequest
    from tether._models.messages import ModelResponse as ModelResponse
    from tether._models.messages import Purpose as Purpose
    from tether._models.messages import Reasoning as Reasoning
    from tether._models.messages import ToolCallOut as ToolCallOut

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


RESERVED_OUTPUT_OPTIONS: Final = frozenset(
    {"model", "messages", "tools", "functions", "stream", "stream_options", "n"}
)
"""Request members tether sets itself; an output option may not override them."""

# A request and an answer are a call's values: their classes (four records, once ~2 ms of
# an agent's construction as dataclasses) live in tether._models.messages and are this module's
# names too, loaded when first asked for (PEP 562) — by the first request an adapter
# builds or answers, not by building the adapter.
_MESSAGES: Final = frozenset(
    {"ModelRequest", "ModelResponse", "Purpose", "Reasoning", "ToolCallOut"}
)


def __getattr__(name: str) -> Any:
    if name in _MESSAGES:
        from tether._models import messages

        return getattr(messages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TokenUsage = Usage
"""The token counters of one attempt: the core's one usage type, under the name the
adapters have always used (:class:`tether.core.state.Usage` validates them)."""


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


def prepare_model(model: ModelAdapter) -> None:
    """Have ``model`` load now what its first request would (an SDK, its HTTP client), when
    it has a ``prepare()`` for that; adapters without one need nothing."""
    prepare = getattr(model, "prepare", None)
    if callable(prepare):
        prepare()


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


@cache
def _key_patterns() -> tuple[re.Pattern[str], ...]:
    """What looks like an API key; compiled by the first error message redacted."""
    return (
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
    for pattern in _key_patterns():
        text = pattern.sub(_mask, text)
    return text


def _mask(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.lower().startswith("bearer"):
        return "Bearer ***"
    return token[:3] + "***"
