"""How deeply JSON nests, found without recursing (pure).

Every JSON input tether accepts is bounded in depth, and the bound is checked before a
parser sees the text: the standard ``json`` module raises :class:`RecursionError` near
1,000 levels (at a depth that depends on the caller's stack), orjson refuses 1,024 levels
when reading and 255 when writing. :func:`deeper_than` answers from the bytes alone;
:func:`value_deeper_than` walks an already parsed value iteratively. Used by the framing
of session lines (:mod:`tether.core.framing`) and by the shell's input readers
(:mod:`tether._inputs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, Final

__all__ = ["deeper_than", "nesting_depth", "value_deeper_than"]

# Escapes go first (so ``\"`` cannot end a string early), then whole strings, whose
# brackets are text, not structure.
_ESCAPE: Final = re.compile(rb"\\.", re.DOTALL)
_STRING: Final = re.compile(rb'"[^"]*"')
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = tuple(1 if byte in b"[{" else -1 if byte in b"]}" else 0 for byte in range(256))


def nesting_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in the JSON text ``data`` (a scalar: 0).

    Counted from the bytes, without parsing: the deepest point of the running count of
    opening minus closing brackets outside strings. Exact for valid JSON; for text that is
    not JSON it is a number a parser would never get deeper than. Never recurses.
    """
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    text = _STRING.sub(b"", _ESCAPE.sub(b"", data))
    brackets = text.translate(None, _NOT_BRACKETS)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def deeper_than(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects more than ``limit`` deep.

    Each level needs an opening bracket, so a text with at most ``limit`` of them is
    answered by two ``count`` calls; only others are scanned (:func:`nesting_depth`).
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    return nesting_depth(data) > limit


def value_deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON ``value`` nests lists and dicts more than ``limit`` deep.

    Iterative (a value built in Python may be deeper than any parser would produce).
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        if depth > limit:
            return True
        stack.extend((child, depth) for child in children)
    return False
