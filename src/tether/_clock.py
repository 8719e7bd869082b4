"""The clock the runtime reads and waits on, injected like trio's clock.

Wall time, monotonic time and waiting are one seam: the executor, the retry schedule, the
worker's loop and the shared store's lease renewal never call :mod:`time` for them; they
ask the :class:`Clock` they were given (the composition root,
:mod:`tether._runtime.compose`, passes one down; the default is :data:`SYSTEM_CLOCK`), so a
test runs them on a clock it controls (:class:`tether.testing.clock.FakeClock`) and never
sleeps to let time pass.

``now_ms`` is what the session log's timestamps and the retry schedule's due times are made
of, ``monotonic`` what budgets and outages are measured with; ``wait`` is every pause that
a stop signal may cut short (a retry's backoff, a worker's poll, a lease renewal period) and
``sleep`` a pause nothing cuts short.

Not on this clock, on purpose: a lease's expiry is the database's ``now()`` (never a
worker's clock, docs/scale-out.md); the time bounds of real subprocesses, sockets and file
locks (:mod:`tether._procs`, the model adapters, :mod:`tether._stores.locking`) measure the
real world they wait for.
"""

from __future__ import annotations

import threading
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

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Let up to ``seconds`` pass, less if ``event`` is set; whether it is set."""
        ...


class SystemClock:
    """The machine's clocks (:func:`time.time_ns`, :func:`time.monotonic`) and waits."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


SYSTEM_CLOCK: Final = SystemClock()
