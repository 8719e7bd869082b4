"""The ``[model]`` table of ``tether.toml`` and the ``--model-option`` flags.

Every setting that shapes what is sent to the provider is part of the configuration digest,
so changing one meets the configuration gate on resume (spec 10):

* request members — ``temperature``, ``max_tokens``, ``reasoning_effort``, ``provider``
  (OpenRouter provider routing), ``tool_choice``, ``parallel_tool_calls`` — become output
  options (the snapshot's ``outputOptionsDigest``), translated for the adapter in use;
* ``model`` and ``base_url`` are the snapshot's ``model`` and ``routingIdentity`` already;
* ``api_key_env`` (the *name* of the variable holding the key) and ``extra_headers`` (names,
  and a digest of the values, never the values) are appended to the routing identity by
  :class:`ConfiguredModel`.

Connection settings that do not change what the model is asked — ``timeout``,
``idle_timeout``, ``stream``, ``retries`` — are not in the digest.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from tether._models.base import ModelAdapter, call_model, prepare_model
from tether.core.policy import check_known, show_value
from tether.core.records import field, fields, record, replace
from tether.errors import ConfigurationError, ProjectConfigError

if TYPE_CHECKING:  # a call's values, loaded by the first request (tether._models.base)
    from tether._models.messages import ModelRequest, ModelResponse

__all__ = [
    "DEFAULT_RETRIES",
    "KNOWN_SETTINGS",
    "ConfiguredModel",
    "ModelConfig",
    "anthropic_thinking",
    "anthropic_thinking_form",
    "identity_suffix",
    "model_config_from_mapping",
    "output_options_for",
    "parse_model_options",
]

DEFAULT_RETRIES: Final = 2
REASONING_EFFORTS: Final = ("minimal", "low", "medium", "high")
ANTHROPIC_BUDGETS: Final = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576}
"""Thinking budget (tokens) an effort asks of Anthropic's extended thinking."""
ANTHROPIC_MIN_BUDGET: Final = 1024
"""The API's smallest ``budget_tokens``; it must also stay below ``max_tokens``."""
ANTHROPIC_ANSWER_ROOM: Final = 4096
"""Tokens kept for the answer above the thinking budget, out of ``max_tokens``."""
ANTHROPIC_EFFORTS: Final = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}
"""``output_config.effort`` for an effort (Anthropic has no ``minimal``)."""


@cache
def _thinking_forms() -> tuple[tuple[re.Pattern[str], str], ...]:
    """How a Claude model family takes ``reasoning_effort``, first match on the model id
    (``claude-opus-4-6``, ``anthropic.claude-opus-4-6-v1``, ``claude-sonnet-4.6`` alike).
    Any other model — Claude 3.7, Sonnet/Opus 4 to 4.5, Haiku 4.5, an unknown id — takes
    ``thinking: {type: enabled, budget_tokens}``, which every thinking model accepts.
    Compiled by the first Anthropic request that asks for reasoning, not at import."""
    return (
        # Claude 3 (but 3.7), 2 and Instant have no extended thinking at all.
        (re.compile(r"claude-(?:3[-.](?!7)|2(?!\d)|instant)"), "none"),
        # Opus/Sonnet 4.6, Opus 4.7 and every later generation take adaptive thinking with
        # an effort; budget_tokens is deprecated (4.6) or refused (4.7 and later) there.
        (
            re.compile(
                r"claude-(?:(?:opus|sonnet)-4[-.]6|opus-4[-.][7-9]|[a-z]+-(?:[5-9]|\d\d))(?!\d)"
            ),
            "adaptive",
        ),
    )


@cache
def _header_name() -> re.Pattern[str]:
    """An HTTP header's name (a token; compiled for the first ``extra_headers``)."""
    return re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@record
class ModelConfig:
    """The ``[model]`` table (all optional)."""

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    provider: Mapping[str, Any] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    idle_timeout: float | None = None
    stream: bool | None = None
    retries: int = DEFAULT_RETRIES

    def __hash__(self) -> int:  # the tables are dicts; the config is still a value
        return hash(json.dumps([getattr(self, f.name) for f in fields(self)], sort_keys=True))


KNOWN_SETTINGS: Final = tuple(f.name for f in fields(ModelConfig))


def _number(source: str, key: str, value: object, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProjectConfigError(
            f"{source}: [model] {key}: expected a number, got {show_value(value)}"
        )
    if not low <= value <= high:
        raise ProjectConfigError(
            f"{source}: [model] {key}: must be between {low:g} and {high:g}, got {value!r}"
        )
    return float(value)


def model_config_from_mapping(table: Mapping[str, Any], source: str = "tether.toml") -> ModelConfig:
    """Validate a ``[model]`` table; one-line :class:`ProjectConfigError` on bad input."""
    check_known(source, "[model]", table, KNOWN_SETTINGS)
    out: dict[str, Any] = {}

    def text(key: str) -> None:
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value.strip():
                raise ProjectConfigError(
                    f"{source}: [model] {key}: expected a non-empty string, got {show_value(value)}"
                )
            out[key] = value.strip()

    for key in ("model", "base_url", "api_key_env"):
        text(key)
    if "api_key_env" in out and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", out["api_key_env"]):
        raise ProjectConfigError(
            f"{source}: [model] api_key_env: expected an environment variable name, "
            f"got {show_value(out['api_key_env'])}"
        )
    if "temperature" in table:
        out["temperature"] = _number(source, "temperature", table["temperature"], low=0, high=2)
    for key, low in (("timeout", 0.001), ("idle_timeout", 0.001)):
        if key in table:
            out[key] = _number(source, key, table[key], low=low, high=86400)
    for key, low, high in (("max_tokens", 1, 10_000_000), ("retries", 0, 10)):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ProjectConfigError(
                    f"{source}: [model] {key}: expected an integer from {low} to {high}, "
                    f"got {show_value(value)}"
                )
            out[key] = value
    if "reasoning_effort" in table:
        value = table["reasoning_effort"]
        if value not in REASONING_EFFORTS:
            raise ProjectConfigError(
                f"{source}: [model] reasoning_effort: expected one of "
                f"{', '.join(REASONING_EFFORTS)}, got {show_value(value)}"
            )
        out["reasoning_effort"] = value
    if "provider" in table:
        value = table["provider"]
        if not isinstance(value, Mapping):
            raise ProjectConfigError(
                f"{source}: [model] provider: expected a table (OpenRouter provider routing, "
                f'e.g. {{order = ["anthropic"]}}), got {show_value(value)}'
            )
        out["provider"] = json.loads(json.dumps(value))
    if "tool_choice" in table:
        value = table["tool_choice"]
        if not (value in ("auto", "none", "required") or isinstance(value, Mapping)):
            raise ProjectConfigError(
                f'{source}: [model] tool_choice: expected "auto", "none", "required" or a '
                f"table, got {show_value(value)}"
            )
        out["tool_choice"] = json.loads(json.dumps(value)) if isinstance(value, Mapping) else value
    for key in ("parallel_tool_calls", "stream"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ProjectConfigError(
                    f"{source}: [model] {key}: expected true or false, got {show_value(table[key])}"
                )
            out[key] = table[key]
    if "extra_headers" in table:
        value = table["extra_headers"]
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and _header_name().match(k) and isinstance(v, str)
            for k, v in value.items()
        ):
            raise ProjectConfigError(
                f"{source}: [model] extra_headers: expected a table of header names to strings"
            )
        out["extra_headers"] = dict(value)
    return ModelConfig(**out)


def parse_model_options(items: Sequence[str]) -> dict[str, Any]:
    """``--model-option KEY=VALUE`` items as a ``[model]`` table (VALUE in TOML syntax;
    a bare word is a string)."""
    table: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigurationError(
                f"--model-option {item!r}: expected KEY=VALUE (e.g. temperature=0.2)"
            )
        if key not in KNOWN_SETTINGS:
            raise ConfigurationError(
                f"--model-option {key}: unknown setting (known: {', '.join(KNOWN_SETTINGS)})"
            )
        # Imported here: only a --model-option value is read as TOML.
        import tomllib

        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        table[key] = value
    return table


def merge(config: ModelConfig, overrides: Mapping[str, Any], source: str) -> ModelConfig:
    """``config`` with the (validated) ``overrides`` applied."""
    if not overrides:
        return config
    checked = model_config_from_mapping(overrides, source)
    return replace(config, **{k: getattr(checked, k) for k in overrides})


def anthropic_thinking_form(model: str) -> str:
    """``adaptive``, ``budget`` or ``none``: how ``model`` takes a reasoning effort."""
    name = model.lower()
    for pattern, form in _thinking_forms():
        if pattern.search(name):
            return form
    return "budget"


def anthropic_thinking(effort: str, model: str, max_tokens: int | None) -> dict[str, Any]:
    """The request members ``reasoning_effort = effort`` means for the Anthropic ``model``,
    given the configured ``max_tokens`` (``None``: the adapter's default).

    A budget must be at least 1,024 tokens and below ``max_tokens``: without a configured
    ``max_tokens``, tether raises it to the budget plus :data:`ANTHROPIC_ANSWER_ROOM`; a
    configured one is a limit the user chose, so the budget is cut to fit under it instead.
    """
    form = anthropic_thinking_form(model)
    if form == "none":
        raise ConfigurationError(
            f"[model] reasoning_effort: {model} has no extended thinking "
            "(Claude 3.7 and later have it); remove reasoning_effort"
        )
    if form == "adaptive":
        return {
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": ANTHROPIC_EFFORTS[effort]},
        }
    budget = ANTHROPIC_BUDGETS[effort]
    if max_tokens is None:
        from tether._models.anthropic_native import DEFAULT_MAX_TOKENS

        out: dict[str, Any] = {"thinking": {"type": "enabled", "budget_tokens": budget}}
        if budget >= DEFAULT_MAX_TOKENS:
            out["max_tokens"] = budget + ANTHROPIC_ANSWER_ROOM
        return out
    budget = max(ANTHROPIC_MIN_BUDGET, min(budget, max_tokens - ANTHROPIC_ANSWER_ROOM))
    if budget >= max_tokens:
        raise ConfigurationError(
            f"[model] reasoning_effort needs max_tokens above {ANTHROPIC_MIN_BUDGET} for "
            f"{model} (its thinking budget is at least {ANTHROPIC_MIN_BUDGET} tokens and must "
            f"stay below max_tokens), got max_tokens = {max_tokens}"
        )
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}


def output_options_for(
    config: ModelConfig, *, api: str, base_host: str = "", model: str = ""
) -> dict[str, Any]:
    """The request members the config asks for, in the dialect of ``api``
    (``chat-completions`` or ``anthropic``; ``model`` picks the Anthropic thinking form)."""
    options: dict[str, Any] = {}
    if config.temperature is not None:
        options["temperature"] = config.temperature
    if config.max_tokens is not None:
        options["max_tokens"] = config.max_tokens
    if api == "anthropic":
        if config.reasoning_effort is not None:
            options.update(anthropic_thinking(config.reasoning_effort, model, config.max_tokens))
        choice: dict[str, Any] | None = None
        if isinstance(config.tool_choice, Mapping):
            choice = dict(config.tool_choice)
        elif config.tool_choice is not None:
            choice = {"type": {"required": "any"}.get(config.tool_choice, config.tool_choice)}
        if config.parallel_tool_calls is False:
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
        if choice is not None:
            options["tool_choice"] = choice
        return options
    if config.reasoning_effort is not None:
        if base_host == "openrouter.ai":
            options["reasoning"] = {"effort": config.reasoning_effort}
        else:
            options["reasoning_effort"] = config.reasoning_effort
    if config.provider is not None:
        options["provider"] = dict(config.provider)
    if config.tool_choice is not None:
        options["tool_choice"] = config.tool_choice
    if config.parallel_tool_calls is not None:
        options["parallel_tool_calls"] = config.parallel_tool_calls
    return options


def identity_suffix(config: ModelConfig) -> str:
    """What the routing identity gains from ``api_key_env`` and ``extra_headers``."""
    parts: list[str] = []
    if config.api_key_env:
        parts.append(f"key={config.api_key_env}")
    if config.extra_headers:
        canonical = json.dumps(sorted(config.extra_headers.items()), separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        names = ",".join(sorted(h.lower() for h in config.extra_headers))
        parts.append(f"headers={names}:{digest}")
    return "#" + ";".join(parts) if parts else ""


class ConfiguredModel:
    """An adapter whose routing identity also names the key variable and extra headers."""

    def __init__(self, inner: ModelAdapter, suffix: str) -> None:
        self.inner = inner
        self._suffix = suffix

    def prepare(self) -> None:
        prepare_model(self.inner)

    @property
    def provider(self) -> str:
        return self.inner.provider

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def adapter_identity(self) -> str:
        return self.inner.adapter_identity

    @property
    def routing_identity(self) -> str:
        return self.inner.routing_identity + self._suffix

    @property
    def streaming(self) -> bool:
        return bool(getattr(self.inner, "streaming", False))

    def complete(
        self,
        request: ModelRequest,
        *,
        cancel: threading.Event | None = None,
        on_delta: Callable[[Any], None] | None = None,
    ) -> ModelResponse:
        return call_model(self.inner, request, cancel=cancel, on_delta=on_delta)
