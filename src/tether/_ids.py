"""UUIDv7 identifiers (RFC 9562) in the lower-case text form the session format requires.

:func:`uuid7` is a pure formatter; :func:`new_uuid7` is the process-wide generator.

Layout (RFC 9562, section 5.7)::

    unix_ts_ms (48) | ver=7 (4) | rand_a (12) | var=0b10 (2) | rand_b (62)

:func:`new_uuid7` is monotonic within a process (RFC 9562 section 6.2, method 1: a 12-bit
counter in ``rand_a``). When the millisecond changes the counter is re-seeded with 11 random
bits (so at least 2048 more IDs fit into the same millisecond); when the millisecond repeats,
or the clock steps backwards, the counter is incremented; when the counter overflows, the
timestamp is advanced by one millisecond ("borrowing" from the future, as the RFC allows).
``rand_b`` is always fresh randomness from :func:`os.urandom`, so IDs stay unique across
processes and across ``fork()``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable

UUID7_PATTERN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
"""The ID rule of the session format (spec section 3)."""

_MAX_MS = (1 << 48) - 1
_COUNTER_MAX = 0xFFF
_RANDOM_CHUNK = 4096


def uuid7(now_ms: int, rand: bytes) -> str:
    """Format a UUIDv7 from a millisecond timestamp and at least 10 random bytes.

    The low 12 bits of ``rand[0:2]`` (big-endian) become ``rand_a`` and the low 62 bits of
    ``rand[2:10]`` become ``rand_b``; extra bytes are ignored. Pure: the same input always
    gives the same output.
    """
    if not 0 <= now_ms <= _MAX_MS:
        raise ValueError(f"uuid7 timestamp out of range: {now_ms}")
    if len(rand) < 10:
        raise ValueError("uuid7 needs at least 10 random bytes")
    rand_a = int.from_bytes(rand[0:2], "big") & 0xFFF
    rand_b = int.from_bytes(rand[2:10], "big") & 0x3FFF_FFFF_FFFF_FFFF
    return _format(now_ms, rand_a, rand_b)


def _format(ms: int, rand_a: int, rand_b: int) -> str:
    value = (ms << 80) | (0x7000 | rand_a) << 64 | (0x8000_0000_0000_0000 | rand_b)
    h = f"{value:032x}"
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def is_uuid7(value: object) -> bool:
    """Whether ``value`` is a string in the session format's ID form."""
    return isinstance(value, str) and UUID7_PATTERN.match(value) is not None


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


class _Generator:
    """Monotonic UUIDv7 source; one instance per process (see :func:`new_uuid7`).

    Hot path: randomness is read from :func:`os.urandom` 4 KiB at a time and kept as hex
    text, and the timestamp part of the text is formatted once per millisecond.
    """

    __slots__ = ("_counter", "_hex", "_last_ms", "_lock", "_offset", "_prefix")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0
        self._prefix = ""
        self._hex = ""
        self._offset = 0

    def reset(self) -> None:
        """Forget buffered randomness (called in a forked child)."""
        self._lock = threading.Lock()
        self._hex = ""
        self._offset = 0

    def _random_hex(self, n: int) -> str:
        """``n`` random hex digits."""
        start = self._offset
        if start + n > len(self._hex):
            self._hex = os.urandom(_RANDOM_CHUNK).hex()
            start = 0
        self._offset = start + n
        return self._hex[start : start + n]

    def _seed(self, ms: int) -> None:
        if ms > _MAX_MS:
            raise OverflowError("uuid7 timestamp out of range")
        self._last_ms = ms
        self._counter = int(self._random_hex(3), 16) & 0x7FF
        h = f"{ms:012x}"
        self._prefix = f"{h[0:8]}-{h[8:12]}-"

    def __call__(self) -> str:
        with self._lock:
            now = time.time_ns() // 1_000_000
            if now > self._last_ms:
                self._seed(now)
            else:
                self._counter += 1
                if self._counter > _COUNTER_MAX:
                    self._seed(self._last_ms + 1)
            rb = self._random_hex(16)
            return f"{self._prefix}{0x7000 | self._counter:04x}-{_VARIANT[rb[0]]}{rb[1:4]}-{rb[4:]}"


_GENERATOR = _Generator()
os.register_at_fork(after_in_child=_GENERATOR.reset)


def new_uuid7() -> str:
    """A fresh UUIDv7, strictly greater (as text and as a number) than the previous one
    returned in this process."""
    return _GENERATOR()


IdSource = Callable[[], str]
"""Where the runtime gets new ids from (:func:`new_uuid7` unless a test injects another)."""
