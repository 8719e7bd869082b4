"""The enums and the token counters of the session state (spec sections 9 and 11).

They are :mod:`tether.core.state`'s names (import them from there or from here): they live
in a module of their own because the shell's construction-time modules name them at class
definition — a model response's stop reason and usage, a tool's replay class, a run
result's usage — and building an agent should not create the state's dozen dataclasses,
which only a session driven, opened or inspected needs (start-up, ``bench/README.md``).
Pure, as the rest of :mod:`tether.core`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from tether.core.canonical import MAX_SAFE_INTEGER
from tether.core.records import record

__all__ = ["Replay", "StepKind", "StepStatus", "StopReason", "ToolStatus", "Usage"]


class StepKind(StrEnum):
    ASSISTANT = "assistant"
    COMPACTION = "compaction"


class StepStatus(StrEnum):
    ATTEMPTING = "attempting"
    SETTLED = "settled"
    FAILED = "failed"


class StopReason(StrEnum):
    STOP = "stop"
    TOOL_USE = "toolUse"
    LENGTH = "length"


class Replay(StrEnum):
    SAFE = "safe"
    NEVER = "never"


class ToolStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"


_USAGE_COUNTERS = ("input", "output", "cache_read", "cache_write")


@record(slots=True)
class Usage:
    """Token counters (spec 9): of one attempt as a model adapter reports them, or summed
    over a session by the reducer; all ints in ``0 .. MAX_SAFE_INTEGER``. The one usage
    type of tether (``tether._models.TokenUsage`` is this class).

    The four counters are disjoint: ``input`` counts only prompt tokens that were
    neither read from nor written to the provider's cache, so ``input + cache_read +
    cache_write`` is the whole prompt.

    Sums are ``+`` (:meth:`__add__`, the one summing function: a run's usage over its
    retries, a step's over its attempts and calls in the timeline) and a run's share of a
    session total is ``after - before``; both give a checked :class:`Usage` again.
    """

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __post_init__(self) -> None:
        # The reducer makes one per state snapshot: the common case is one cheap test per
        # counter; anything unusual (an int subclass, a bool, out of range) is looked at
        # closely by _check.
        for value in (self.input, self.output, self.cache_read, self.cache_write):
            if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
                self._check()
                return

    def _check(self) -> None:
        for name in _USAGE_COUNTERS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Usage.{name} must be an int")
            if not 0 <= value <= MAX_SAFE_INTEGER:
                raise ValueError(f"Usage.{name} out of range: {value}")

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
        )

    def __sub__(self, before: Usage) -> Usage:
        """What was used since ``before`` (an earlier total of the same counters)."""
        return Usage(
            self.input - before.input,
            self.output - before.output,
            self.cache_read - before.cache_read,
            self.cache_write - before.cache_write,
        )

    def to_json(self) -> dict[str, int]:
        """The ``usage`` object of a usage fact (and of the serialized state)."""
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
        }

    @classmethod
    def from_json(cls, usage: Mapping[str, Any]) -> Usage:
        """The inverse of :meth:`to_json` (a usage fact's ``usage``, a serialized total)."""
        return cls(usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"])
