"""Stop conditions: when a run must end ``failed`` instead of burning more budget.

Pure: counts, elapsed time and the failures to compare are passed in.

* ``repeated_failure`` — the same tool with the same arguments failed twice in a row while
  the artifact version stayed the same: the second attempt learned nothing, a third would
  not either.
* ``budget_exhausted`` — the run used its steps, tokens, wall time, tool calls or money, or
  the session its tokens or money (``[budget]`` in ``tether.toml`` or the ``--max-*``
  flags); the figures count every process that drove the run (:data:`BUDGET_CHECKS` is the
  table).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from tether.core.records import record

__all__ = [
    "BUDGET_CHECKS",
    "BUDGET_EXHAUSTED",
    "REPEATED_FAILURE",
    "BudgetTime",
    "FailedCall",
    "StopError",
    "budget_exhausted",
    "repeated_failure",
]


class BudgetTime(StrEnum):
    """What ``max_seconds`` counts (``[budget] time``, docs/config.md)."""

    ACTIVE = "active"
    """The time processes drove the run: a crash's downtime, a queue's wait and a wait for
    a person's answer do not count (the log's gaps, :func:`tether.core.timeline.active_ms`)."""
    WALL = "wall"
    """Wall-clock time from the run's first start, downtime included."""


REPEATED_FAILURE: Final = "repeated_failure"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
MAX_SUMMARY: Final = 200


@record
class StopError:
    """The ``error`` of the ``operationFinished`` that ends the run ``failed``."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@record
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


@record
class _Limit:
    """One row of :data:`BUDGET_CHECKS`: a spent figure, its limit, the ``[budget]`` key
    that sets the limit, how the stop reads."""

    spent: str
    limit: str
    key: str
    """The ``[budget]`` key (and ``BudgetConfig`` field) of the limit."""
    message: str
    """Formatted with ``spent`` and ``limit``."""


BUDGET_CHECKS: Final[tuple[_Limit, ...]] = (
    _Limit(
        "steps",
        "max_steps",
        "max_steps",
        "the run used its step budget ({spent} of {limit} steps)",
    ),
    _Limit(
        "tokens",
        "max_tokens",
        "max_tokens",
        "the run used its token budget ({spent} of {limit} tokens)",
    ),
    _Limit(
        "elapsed",
        "max_seconds",
        "max_seconds",
        "the run used its time budget ({spent:.1f} s of {limit:g} s)",
    ),
    _Limit(
        "tool_calls",
        "max_tool_calls",
        "max_tool_calls",
        "the run used its tool-call budget ({spent} of {limit} calls)",
    ),
    _Limit(
        "cost",
        "max_cost",
        "max_cost_usd",
        "the run used its money budget (${spent:.4f} of ${limit:g})",
    ),
    _Limit(
        "session_tokens",
        "max_session_tokens",
        "max_session_tokens",
        "the session used its token budget ({spent} of {limit} tokens)",
    ),
    _Limit(
        "session_cost",
        "max_session_cost",
        "max_session_cost_usd",
        "the session used its money budget (${spent:.4f} of ${limit:g})",
    ),
)
"""The budgets, in the order they are checked: the first one used up is the stop."""


def budget_exhausted(
    *,
    steps: int,
    tokens: int,
    elapsed: float,
    max_steps: int | None,
    max_tokens: int | None,
    max_seconds: float | None,
    tool_calls: int = 0,
    max_tool_calls: int | None = None,
    cost: float = 0.0,
    max_cost: float | None = None,
    session_tokens: int = 0,
    max_session_tokens: int | None = None,
    session_cost: float = 0.0,
    max_session_cost: float | None = None,
) -> StopError | None:
    """The stop if the run may not start another step or tool call.

    Every figure is what the run (or the session) has spent so far, over every process that
    drove it; ``cost`` and ``session_cost`` are US dollars."""
    figures = locals()
    for row in BUDGET_CHECKS:
        limit = figures[row.limit]
        spent = figures[row.spent]
        if limit is not None and spent >= limit:
            return StopError(BUDGET_EXHAUSTED, row.message.format(spent=spent, limit=limit))
    return None


def describe_call(tool_name: str, arguments: Any) -> str:
    """``bash {"command":"make"}`` — the call as one short line."""
    import orjson  # only once a call fails; building an agent loads this module

    try:
        text = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        text = repr(arguments)
    return _short(f"{tool_name} {text}")
