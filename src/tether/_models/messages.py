"""A model request and its normalized answer: the values one call of
:meth:`~tether._models.base.ModelAdapter.complete` takes and gives.

They are :mod:`tether._models.base`'s names (import them from there or from here); they live
in a module of their own so that building an agent and its adapter, which needs the adapter
contract but no request or answer, does not create their classes (start-up,
``bench/README.md``). Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tether.core.kinds import StopReason, Usage
from tether.core.records import field, record

__all__ = ["ModelRequest", "ModelResponse", "Purpose", "Reasoning", "ToolCallOut"]

Purpose = Literal["assistant", "compaction"]


@record(slots=True)
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


@record(slots=True)
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


@record(slots=True)
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


@record(slots=True)
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
    usage: Usage = field(default_factory=Usage)  # tether._models.base.TokenUsage
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
