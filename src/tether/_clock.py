"""The clock the runtime reads, injected like trio's clock: wall time and monotonic time.

The executor never calls :mod:`time` itself; it asks the :class:`Clock` the composition root
gave it (:mod:`tether._runtime.compose`), so a test can run the loop on a clock it controls.
``now_ms`` is what the session log's timestamps are made of, ``monotonic`` what budgets and
timeouts are measured with.
"""

from __future__ import annotations

import time
from typing import Final, Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in integer milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds of a clock that never goes back (only differences mean anything)."""
        ...


class SystemClock:
    """The machine's clocks (:func:`time.time_ns`, :func:`time.monotonic`)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Final = SystemClock()
