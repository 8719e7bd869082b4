"""Tool-call arguments: when a call's ``function.arguments`` text is valid (spec 14.4 rule 9).

Pure. :func:`parse_tool_arguments` is the one parser of the arguments a model wrote: the
planner uses it to choose between ``startTool`` and an ``invalidArguments`` result, the tool
registry to validate a call, and both must agree on every text.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, NoReturn

__all__ = ["MAX_ARGUMENT_DEPTH", "MAX_ARGUMENT_INTEGER_DIGITS", "parse_tool_arguments"]

MAX_ARGUMENT_DEPTH: Final = 128
"""Deepest array/object nesting accepted in tool-call arguments (top-level object = 1)."""

MAX_ARGUMENT_INTEGER_DIGITS: Final = 640
"""Longest integer literal accepted in tool-call arguments.

640 is the smallest value Python's process-wide ``int_max_str_digits`` can be set to,
so parsing never depends on that global.
"""


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON token {name}")


def _parse_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_ARGUMENT_INTEGER_DIGITS:
        raise ValueError("integer literal too long")
    return int(text)


def _well_formed(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an unpaired surrogate
        return False
    return True


def _persistable(value: object) -> bool:
    """Can ``value`` be written in a ``toolStarted`` record and read back unchanged?"""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_ARGUMENT_DEPTH:
                return False
            for key, member in item.items():
                if not _well_formed(key):
                    return False
                stack.append((member, depth + 1))
        elif isinstance(item, list):
            if depth > MAX_ARGUMENT_DEPTH:
                return False
            stack.extend((member, depth + 1) for member in item)
        elif isinstance(item, str):
            if not _well_formed(item):
                return False
        elif isinstance(item, float) and not math.isfinite(item):
            return False
    return True


def parse_tool_arguments(text: object) -> dict[str, Any] | None:
    """Parse a tool call's ``function.arguments`` (spec 14.4 rule 9); ``None`` if invalid.

    Valid means: RFC 8259 JSON text (``NaN``/``Infinity`` rejected, surrounding JSON
    whitespace allowed) whose top-level value is an object. Duplicate member names are
    accepted, the last one wins (as in every reference parser). Values that could not be
    persisted in ``toolStarted`` and read back by a spec reducer are also invalid:
    unpaired surrogates, numbers that overflow to infinity, integer literals longer than
    :data:`MAX_ARGUMENT_INTEGER_DIGITS` digits and nesting deeper than
    :data:`MAX_ARGUMENT_DEPTH` (the reference parsers disagree on all of these).
    """
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not _persistable(value):
        return None
    return value
