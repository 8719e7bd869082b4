"""Where a session log may be cut: settled points and the ends of turns (pure).

``tether fork`` copies a prefix of a log into a new session, ``tether replay --crash-points``
plans recovery at every prefix, and ``tether rewind --turn N`` needs the same numbering of
turns; this module is the one place that says, for a log's bytes, which line ends which turn
and after which lines the reducer's state is settled.

Definitions (docs/replay.md):

* A **cut after line L** keeps the header and the transactions of lines 2..L (``L = 1``:
  the header only). A log is always cut between transactions, never inside one.
* The state after line L is **settled** when nothing is in flight: no model attempt is open
  (``stepAttempt`` without its answer or ``stepFailed``) and no started tool is without its
  result (``toolStarted`` without the result entry). A fork may only be cut at a settled
  point: a copy cut inside an open attempt or between a tool's intent and its result would
  ask recovery of the fork to decide about an effect that belongs to the original.
  The header alone (line 1) is settled.
* **Turns** are :mod:`tether.core.turns`' (the one numbering, shared with ``tether rewind``):
  a turn starts at a user message, numbered from 1 in log order; its runs are the runs
  started in it (a ``tether retry`` runs the same prompt again, in the same turn). The
  **end of turn N** is the line holding the ``operationFinished`` of its last finished
  run, and "as after turn N" means cut after that line. Turn 0 ends at the header (before
  the first turn). A turn none of whose runs has finished has no end.

Pure (``tether.core`` rule): bytes in, values out; the reducer does the validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from tether.core.framing import committed_lines
from tether.core.reducer import Reducer
from tether.core.state import (
    CompactionOperation,
    RunOperation,
    SessionState,
    StepStatus,
    ToolStatus,
)
from tether.core.turns import starts_turn
from tether.errors import ConfigurationError

__all__ = [
    "CutPoint",
    "LineMark",
    "LogMap",
    "in_flight",
    "is_settled",
    "map_log",
]


def is_settled(state: SessionState) -> bool:
    """Whether nothing is in flight in ``state``: no open model attempt, no started tool
    without its result (see the module docstring)."""
    return in_flight(state) is None


def in_flight(state: SessionState) -> str | None:
    """What is in flight in ``state`` (``None``: it is settled), in words."""
    operation = state.operation
    if isinstance(operation, (RunOperation, CompactionOperation)):
        step = operation.step
        if step is not None and step.status is StepStatus.ATTEMPTING:
            return f"model attempt {step.attempt_id} is open"
    if isinstance(operation, RunOperation):
        for call in operation.tool_calls:
            if call.status is ToolStatus.PENDING:
                return (
                    f"tool {call.tool_name!r} ({call.tool_started_id}) is started without a result"
                )
    return None


@dataclass(frozen=True, slots=True)
class LineMark:
    """One line of a log, as a place to cut after."""

    line: int
    """The line number (1 is the header)."""
    end: int
    """The byte length of the log through this line's LF: a cut after it keeps ``end`` bytes."""
    fact_ids: tuple[str, ...]
    """The ``id``s of the facts of this line (none for the header)."""
    in_flight: str | None
    """What is in flight after this line (``None``: the state is settled)."""
    turn: int
    """The number of turns (runs) started through this line."""
    ends_turn: int | None
    """The turn whose run finishes on this line, if any."""

    @property
    def settled(self) -> bool:
        return self.in_flight is None

    @property
    def name(self) -> str:
        """How a person names this point: ``line 7 (entry <last fact id>)``."""
        if not self.fact_ids:
            return f"line {self.line} (the header)"
        return f"line {self.line} (entry {self.fact_ids[-1]})"


@dataclass(frozen=True, slots=True)
class CutPoint:
    """A settled place to cut a log: after ``mark``; ``turn`` is the turn it ends, if any."""

    mark: LineMark

    @property
    def line(self) -> int:
        return self.mark.line

    @property
    def end(self) -> int:
        return self.mark.end


@dataclass(frozen=True, slots=True)
class LogMap:
    """Every line of a log with its settledness and turn (see :func:`map_log`)."""

    marks: tuple[LineMark, ...]

    @property
    def turns(self) -> int:
        """How many turns the log has finished."""
        return len({mark.ends_turn for mark in self.marks if mark.ends_turn is not None})

    def turn_end(self, turn: int) -> CutPoint:
        """The point "as after turn ``turn``" (0: the header); :class:`ConfigurationError`
        (one line) when the log has no such finished turn."""
        if turn < 0:
            raise ConfigurationError(f"--turn {turn}: turns are numbered from 1 (0: before all)")
        if turn == 0:
            return CutPoint(self.marks[0])
        for mark in reversed(self.marks):  # a retried turn ends with its last run
            if mark.ends_turn == turn:
                return CutPoint(mark)
        started = self.marks[-1].turn
        if turn <= started:
            raise ConfigurationError(
                f"--turn {turn}: turn {turn} has not finished in this log "
                f"({self.turns} finished; the last valid point is {self.last_settled().name})"
            )
        raise ConfigurationError(
            f"--turn {turn}: the session has {self.turns} finished turn"
            f"{'' if self.turns == 1 else 's'} (give 0..{self.turns})"
        )

    def last_settled(self) -> LineMark:
        for mark in reversed(self.marks):
            if mark.settled:
                return mark
        return self.marks[0]

    def line_of(self, fact_id: str) -> LineMark:
        """The line holding the fact ``fact_id`` (:class:`ConfigurationError` if none)."""
        for mark in self.marks:
            if fact_id in mark.fact_ids:
                return mark
        raise ConfigurationError(f"--at {fact_id}: no entry with that id in the log")

    def cut_at(self, fact_id: str) -> CutPoint:
        """The point after the line holding ``fact_id``, if settled; else
        :class:`ConfigurationError` naming the nearest settled points before and after."""
        mark = self.line_of(fact_id)
        if mark.settled:
            return CutPoint(mark)
        before = next((m for m in reversed(self.marks[: mark.line - 1]) if m.settled), None)
        after = next((m for m in self.marks[mark.line :] if m.settled), None)
        near = " or ".join(m.name for m in (before, after) if m is not None)
        raise ConfigurationError(
            f"--at {fact_id}: cannot cut at {mark.name}: "
            f"{mark.in_flight}; nearest valid points: {near}"
        )


def map_log(data: bytes) -> LogMap:
    """Reduce ``data`` line by line (a torn tail is ignored) and mark every line; raises
    :class:`~tether.errors.SessionCorruption` as the reducer does."""
    lines, _end = committed_lines(data)
    header = next(lines)
    reducer = Reducer.from_header_line(header)
    marks = [LineMark(1, reducer.length, (), None, 0, None)]
    turns = 0
    run_turns: dict[str, int] = {}
    for raw in lines:
        reducer.feed(raw)
        ids, users, started, finished = _facts_of(orjson.loads(raw))
        turns += users  # the user message comes before its runStarted (one transaction)
        for operation_id in started:
            run_turns[operation_id] = turns
        ends = next((run_turns[op] for op in finished if op in run_turns), None)
        marks.append(
            LineMark(
                reducer.line_count,
                reducer.length,
                ids,
                in_flight(reducer.state),
                turns,
                ends,
            )
        )
    return LogMap(tuple(marks))


def _facts_of(value: object) -> tuple[tuple[str, ...], int, list[str], list[str]]:
    """The fact ids of a (valid) transaction, the turns it starts (its user messages), the
    runs it starts and the operations it finishes."""
    facts: Sequence[object] = value if isinstance(value, list) else [value]
    ids: list[str] = []
    users = 0
    started: list[str] = []
    finished: list[str] = []
    for fact in facts:
        assert isinstance(fact, dict)
        ids.append(fact["id"])
        users += starts_turn(fact)
        record = fact.get("record")
        if record is None:
            continue
        if record["type"] == "runStarted":
            started.append(record["operationId"])
        elif record["type"] == "operationFinished" and record["operationKind"] == "run":
            finished.append(record["operationId"])
    return tuple(ids), users, started, finished
