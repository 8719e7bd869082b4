"""Turns of a session: which facts belong to which turn (pure).

A *turn* starts at a user message entry (spec 7.1: an entry whose message has role
``user``) and runs up to the next one. Turns are numbered from 1; facts before the first
user message (none in a log tether writes) are in turn 0. ``--turn N`` of ``tether
rewind`` (and of ``fork``/``replay``) means "as after turn N": everything in turns
``> N`` is what comes after it, and ``--turn 0`` means before the session's first turn.

Rules of this module: pure (facts in, values out); it reads only the members the format
guarantees once a log reduces (the shell reduces it first), and never raises on a fact it
does not care about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tether.core.records import record

__all__ = [
    "ToolCallTurn",
    "check_turn",
    "starts_turn",
    "tool_calls_after",
    "turn_count",
    "turns_of",
]


def starts_turn(fact: Mapping[str, Any]) -> bool:
    """Whether ``fact`` starts a turn: a user message entry."""
    if fact.get("kind") != "entry":
        return False
    entry = fact.get("entry")
    if not isinstance(entry, Mapping) or entry.get("type") != "message":
        return False
    message = entry.get("message")
    return isinstance(message, Mapping) and message.get("role") == "user"


def turns_of(facts: Iterable[Mapping[str, Any]]) -> tuple[int, ...]:
    """The turn number of every fact, in order (0 before the first user message)."""
    numbers: list[int] = []
    turn = 0
    for fact in facts:
        if starts_turn(fact):
            turn += 1
        numbers.append(turn)
    return tuple(numbers)


def turn_count(facts: Iterable[Mapping[str, Any]]) -> int:
    """How many turns the session has (its number of user messages)."""
    return sum(1 for fact in facts if starts_turn(fact))


def check_turn(turn: int, count: int) -> str | None:
    """``None`` when ``turn`` names a point of a session of ``count`` turns, else why not."""
    if turn < 0:
        return f"--turn must be 0 or more, not {turn}"
    if turn > count:
        return f"--turn {turn}: the session has {count} turn{'' if count == 1 else 's'}"
    return None


@record(slots=True)
class ToolCallTurn:
    """A started tool call (its ``toolStarted`` record) and the turn it belongs to.

    ``operation_id`` is the ``toolStarted`` fact's id: the id the action journal records
    the call under. ``replay`` the call's declaration (``safe``: running it twice is
    harmless, i.e. it changes nothing). ``index`` is the fact's position in the log (0 =
    first fact).
    """

    operation_id: str
    tool_name: str
    arguments: Mapping[str, Any]
    replay: str
    turn: int
    index: int


def tool_calls_after(facts: Sequence[Mapping[str, Any]], turn: int) -> tuple[ToolCallTurn, ...]:
    """Every started tool call in turns after ``turn``, in log order."""
    calls: list[ToolCallTurn] = []
    for index, (fact, number) in enumerate(zip(facts, turns_of(facts), strict=True)):
        if number <= turn or fact.get("kind") != "record":
            continue
        record = fact.get("record")
        if not isinstance(record, Mapping) or record.get("type") != "toolStarted":
            continue
        fact_id = fact.get("id")
        arguments = record.get("arguments")
        calls.append(
            ToolCallTurn(
                operation_id=fact_id if isinstance(fact_id, str) else "",
                tool_name=str(record.get("toolName", "")),
                arguments=arguments if isinstance(arguments, Mapping) else {},
                replay=str(record.get("replay", "")),
                turn=number,
                index=index,
            )
        )
    return tuple(calls)
