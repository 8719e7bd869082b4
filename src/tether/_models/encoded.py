"""Request bodies in O(new bytes): each message's wire form is encoded once.

An agent's context grows by appending: the state's active context at one step is the
context of the step before plus a few new messages, and the messages it shares with it are
the *same* objects (the reducer appends to its lists and hands out read-only views of
them). :class:`EncodedPrefix` keeps the encoded wire form of every message it has seen, in
context order, beside the objects themselves; a request reuses the pieces of the longest
prefix of *identical* objects and encodes only the messages after it. Compaction replaces
the context (its first message is a new object), so the compacted context is encoded once
and becomes the new base.

Rules of this module:

* **Identity, never equality.** Comparing by ``is`` is a pointer compare done in C (about
  15 ns a message), and it cannot be fooled by two equal-looking values encoded
  differently: a new object is always encoded. The cache holds strong references to the
  objects it is keyed on, so an ``id`` is never reused while it is cached.
* **Messages are read-only.** The state treats its messages as frozen; a message mutated
  in place after it was encoded would be sent as it was (the reducer never does this).
* **One encoder, orjson.** The pieces are ``orjson`` bytes of the wire value (UTF-8, no
  whitespace, members in the order the message has them); ``Mapping`` values that are not
  ``dict`` are encoded as objects.
* **Counted.** :attr:`EncodedPrefix.encoded_messages` and :attr:`EncodedPrefix.encoded_bytes`
  count what was encoded, so tests assert O(new bytes) by counting, never by timing.
* A few sessions may share one adapter (a worker): each keeps its own slot, found by the
  identity of its first message; the least recently used slot is dropped.
* **Pieces may depend on what came before**, never on what comes after: the encoder gets
  the state the previous message left (the Anthropic adapter's open turn, for instance)
  and returns its own, so a cached piece stays valid as long as its prefix is identical.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from operator import is_
from typing import Any, Final

__all__ = ["EncodedPrefix", "dumps"]

_SLOTS: Final = 4
"""Sessions one adapter keeps encoded histories for (a worker drives a few at once)."""


def _default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(value: Any) -> bytes:
    """The wire bytes of a JSON value (read-only mappings included)."""
    import orjson  # loaded by the first request, not by building an agent

    return orjson.dumps(value, default=_default)


Encode = Callable[[Mapping[str, Any], Any, Any], tuple[bytes, Any]]
"""``encode(message, side, state) -> (piece, state)``: the wire bytes of one context
message; ``side`` is its reasoning side record (or ``None``), ``state`` what the previous
message's encoding left (``None`` before the first)."""

Finish = Callable[[Any], tuple[int, bytes]]
"""``finish(state) -> (cut, tail)``: how a body ends after the last piece, given the state
the last message left: drop ``cut`` bytes from the end of the pieces, then ``tail``."""


def _identical_prefix(new: Sequence[Any], cached: list[Any], limit: int) -> int:
    """How many of the first ``limit`` items of ``new`` are the very objects in ``cached``."""
    if all(map(is_, islice(new, limit), cached)):  # the usual case, in C
        return limit
    for index, (a, b) in enumerate(zip(islice(new, limit), cached, strict=False)):
        if a is not b:
            return index
    return limit  # pragma: no cover - all() said otherwise


class _Slot:
    __slots__ = ("buffer", "ends", "objects", "sides", "states", "with_side")

    def __init__(self) -> None:
        self.objects: list[Any] = []
        self.sides: list[Any] = []
        self.states: list[Any] = []  # states[i]: what message i left for the next
        self.with_side = 0  # how many of ``sides`` are not None
        self.buffer = bytearray()  # the pieces, joined by the separator
        self.ends: list[int] = []  # ends[i]: where piece i ends in ``buffer``

    def truncate(self, keep: int) -> None:
        if keep >= len(self.objects):
            return
        del self.objects[keep:]
        del self.sides[keep:]
        del self.states[keep:]
        self.with_side = sum(side is not None for side in self.sides)
        del self.ends[keep:]
        del self.buffer[self.ends[-1] if self.ends else 0 :]


class EncodedPrefix:
    """Encoded context messages, reused across requests by identity (see the module)."""

    def __init__(self, encode: Encode, *, separator: bytes = b",") -> None:
        self._encode = encode
        self._separator = separator
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []
        self.encoded_messages = 0
        """Messages encoded so far (a cached message is never counted again)."""
        self.encoded_bytes = 0
        """Bytes of the messages encoded so far."""

    def join(
        self,
        head: bytes,
        messages: Sequence[Mapping[str, Any]],
        sides: Sequence[Any],
        tail: bytes | Finish,
    ) -> bytes:
        """``head`` + the messages' pieces (joined by the separator) + ``tail``, one copy.

        ``sides[i]`` is the side record of ``messages[i]`` (``sides`` may be shorter:
        missing ones are ``None``). ``tail`` may be a :data:`Finish`, for a body whose end
        depends on its last message.
        """
        if not len(messages):
            return head + (tail if isinstance(tail, bytes) else tail(None)[1])
        with self._lock:
            slot = self._slot(messages)
            self._extend(slot, messages, sides)
            if isinstance(tail, bytes):
                return b"".join((head, slot.buffer, tail))
            cut, end = tail(slot.states[-1])
            # Views, released at once: a bytearray with a live view cannot be resized.
            with memoryview(slot.buffer) as view, view[: len(view) - cut] as kept:
                return b"".join((head, kept, end))

    def _slot(self, messages: Sequence[Mapping[str, Any]]) -> _Slot:
        slots = self._slots
        first = messages[0]
        for index, slot in enumerate(slots):
            if slot.objects and slot.objects[0] is first:
                if index:
                    slots.insert(0, slots.pop(index))  # most recently used first
                return slot
        slot = _Slot()
        slots.insert(0, slot)
        del slots[_SLOTS:]
        return slot

    def _extend(
        self, slot: _Slot, messages: Sequence[Mapping[str, Any]], sides: Sequence[Any]
    ) -> None:
        count = len(messages)
        cached = slot.objects
        shared = _identical_prefix(messages, cached, min(count, len(cached)))
        if sides or slot.with_side:
            padded = [*islice(sides, count), *([None] * (count - len(sides)))]
            shared = _identical_prefix(padded, slot.sides, shared)
        else:
            padded = None
        slot.truncate(shared)
        if shared == count:
            return
        encode = self._encode
        separator = self._separator
        buffer = slot.buffer
        ends = slot.ends
        states = slot.states
        state = states[-1] if states else None
        encoded = 0
        for index in range(shared, count):
            message = messages[index]
            side = padded[index] if padded is not None else None
            piece, state = encode(message, side, state)
            encoded += len(piece)
            if buffer and separator:
                buffer += separator
            buffer += piece
            ends.append(len(buffer))
            cached.append(message)
            states.append(state)
            slot.sides.append(side)
            if side is not None:
                slot.with_side += 1
        self.encoded_messages += count - shared
        self.encoded_bytes += encoded
