"""Stop conditions: when a run must end ``failed`` instead of burning more budget.

Pure: counts, elapsed time and the failures to compare are passed in.

* ``repeated_failure`` — the same tool with the same arguments failed twice in a row while
  the artifact version stayed the same: the second attempt learned nothing, a third would
  not either.
* ``budget_exhausted`` — the run used its steps, tokens or wall time (``[budget]`` in
  ``tether.toml`` or the ``--max-*`` flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = [
    "BUDGET_EXHAUSTED",
    "REPEATED_FAILURE",
    "FailedCall",
    "StopError",
    "budget_exhausted",
    "repeated_failure",
]

REPEATED_FAILURE: Final = "repeated_failure"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
MAX_SUMMARY: Final = 200


@dataclass(frozen=True)
class StopError:
    """The ``error`` of the ``operationFinished`` that ends the run ``failed``."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class FailedCall:
    """One tool call that ended in an error result."""

    tool_name: str
    arguments_digest: str
    artifact_version: str | None
    """``None`` when the version could not be computed: then nothing is "unchanged"."""
    summary: str = ""
    """How the call reads for a person, e.g. ``bash {"command":"make"}``."""


def _short(text: str) -> str:
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def repeated_failure(previous: FailedCall | None, current: FailedCall) -> StopError | None:
    """The stop for ``current`` if ``previous`` (the call right before it) is the same
    failing call on the same files."""
    if previous is None or current.artifact_version is None:
        return None
    same = (
        previous.tool_name == current.tool_name
        and previous.arguments_digest == current.arguments_digest
        and previous.artifact_version == current.artifact_version
    )
    if not same:
        return None
    what = _short(current.summary or current.tool_name)
    return StopError(
        REPEATED_FAILURE,
        f"{what} failed twice in a row with the files unchanged; stopping instead of "
        "trying it a third time",
    )


def budget_exhausted(
    *,
    steps: int,
    tokens: int,
    elapsed: float,
    max_steps: int | None,
    max_tokens: int | None,
    max_seconds: float | None,
) -> StopError | None:
    """The stop if the run may not start another step or tool call."""
    if max_steps is not None and steps >= max_steps:
        return StopError(
            BUDGET_EXHAUSTED, f"the run used its step budget ({steps} of {max_steps} steps)"
        )
    if max_tokens is not None and tokens >= max_tokens:
        return StopError(
            BUDGET_EXHAUSTED,
            f"the run used its token budget ({tokens} of {max_tokens} tokens)",
        )
    if max_seconds is not None and elapsed >= max_seconds:
        return StopError(
            BUDGET_EXHAUSTED,
            f"the run used its time budget ({elapsed:.1f} s of {max_seconds:g} s)",
        )
    return None


def describe_call(tool_name: str, arguments: Any) -> str:
    """``bash {"command":"make"}`` — the call as one short line."""
    try:
        text = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        text = repr(arguments)
    return _short(f"{tool_name} {text}")
