"""Model prices: what a request cost when the provider does not say.

A provider that reports the price of a request (OpenRouter's ``usage.cost``) is believed;
that figure is kept in the answer's side record (:mod:`tether._stores.reasoning`). For every
other request the cost follows from the token counts of the log and a price table: US
dollars per million tokens of uncached input, cached input (read from the provider's
cache), cache writes, output and reasoning.

Rules of this module:

* :data:`BUILTIN_PRICES` is a small table of common models (list prices when it was
  written); ``[prices]`` in ``tether.toml`` adds models or replaces rows
  (``docs/config.md``). A model in neither has no price: its cost is unknown, never zero;
* a model id is looked up as configured first, then without its provider prefix
  (``openai/``, ``anthropic:``) and a trailing release date (``-20250514``)
  (:func:`price_for`), so one row serves OpenRouter, the provider's own API and a proxy;
* the arithmetic is :func:`cost_of`, one linear function of the four counters of the log
  (and the reasoning tokens a provider reported, which are part of ``output``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from tether.core.kinds import Usage
from tether.core.records import record

__all__ = ["BUILTIN_PRICES", "Price", "cost_of", "price_for"]

PER: Final = 1_000_000
"""Prices are per this many tokens."""


@record(slots=True)
class Price:
    """US dollars per million tokens; a missing kind is priced as the one it is a form of
    (cached input and cache writes as input, reasoning as output)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None
    reasoning: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {
            "input": self.input,
            "cached_input": self.cached_input,
            "cache_write": self.cache_write,
            "output": self.output,
            "reasoning": self.reasoning,
        }


def cost_of(usage: Usage, price: Price, *, reasoning_tokens: int = 0) -> float:
    """The cost in US dollars of ``usage`` at ``price`` (``reasoning_tokens`` are a part of
    ``usage.output``)."""
    reasoning = min(max(reasoning_tokens, 0), usage.output)
    cached = price.input if price.cached_input is None else price.cached_input
    written = price.input if price.cache_write is None else price.cache_write
    thinking = price.output if price.reasoning is None else price.reasoning
    total = (
        usage.input * price.input
        + usage.cache_read * cached
        + usage.cache_write * written
        + (usage.output - reasoning) * price.output
        + reasoning * thinking
    )
    return total / PER


BUILTIN_PRICES: Final[Mapping[str, Price]] = {
    # OpenAI
    "gpt-4o": Price(input=2.50, cached_input=1.25, output=10.00),
    "gpt-4o-mini": Price(input=0.15, cached_input=0.075, output=0.60),
    "gpt-4.1": Price(input=2.00, cached_input=0.50, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, cached_input=0.10, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, cached_input=0.025, output=0.40),
    "o3": Price(input=2.00, cached_input=0.50, output=8.00),
    "o4-mini": Price(input=1.10, cached_input=0.275, output=4.40),
    # Anthropic (cache writes at the 5-minute rate)
    "claude-opus-4": Price(input=15.00, cached_input=1.50, cache_write=18.75, output=75.00),
    "claude-sonnet-4": Price(input=3.00, cached_input=0.30, cache_write=3.75, output=15.00),
    "claude-3-7-sonnet": Price(input=3.00, cached_input=0.30, cache_write=3.75, output=15.00),
    "claude-3-5-haiku": Price(input=0.80, cached_input=0.08, cache_write=1.00, output=4.00),
    # Google
    "gemini-2.5-pro": Price(input=1.25, cached_input=0.31, output=10.00),
    "gemini-2.5-flash": Price(input=0.30, cached_input=0.075, output=2.50),
    # DeepSeek
    "deepseek-chat": Price(input=0.27, cached_input=0.07, output=1.10),
}
"""Common models, by their id without a provider prefix (see :func:`price_for`)."""

_DATED: Final = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def _names(model: str) -> list[str]:
    """``model`` as configured, then without a provider prefix, then without a date."""
    names = [model]
    bare = re.split(r"[:/]", model)[-1]
    for name in (bare, _DATED.sub("", bare)):
        if name not in names:
            names.append(name)
    return names


def price_for(model: str, table: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model``: ``table`` (``[prices]``) before :data:`BUILTIN_PRICES`, each
    looked up by the names :func:`_names` gives; ``None`` when neither has it."""
    for source in (table or {}, BUILTIN_PRICES):
        for name in _names(model):
            price = source.get(name)
            if price is not None:
                return price
    return None
