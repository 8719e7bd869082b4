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
``sleep`` a pause nothing cuts short. A wait for something else (a model's answer arriving
on its own queue) that a cancel must also end registers with the cancel's
:class:`WakingEvent` (:func:`wake_on`) instead of polling it.

Not on this clock, on purpose: a lease's expiry is the database's ``now()`` (never a
worker's clock, docs/scale-out.md); the time bounds of real subprocesses, sockets and file
locks (:mod:`tether._procs`, the model adapters, :mod:`tether._stores.locking`) measure the
real world they wait for.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final, Protocol

from tether._hub import pause, wait_event

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "WakingEvent", "wake_on"]


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
        pause(seconds)  # time.sleep, but a session on a hub parks instead (tether._hub)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return wait_event(event, seconds)  # event.wait, parked on a hub


SYSTEM_CLOCK: Final = SystemClock()


class WakingEvent(threading.Event):
    """A :class:`threading.Event` whose ``set`` also calls the callbacks registered with
    :func:`wake_on`.

    Why: a thread that waits on something else (a model's answer arriving on a queue) must
    also return when the event is set. Without a callback it has to poll the event, and a
    worker with 1,000 sessions waiting on their models polled 50,000 times a second, most
    of its CPU (issue 33). No lock guards the callbacks: list appends, removals and copies
    are atomic, and ``set`` may run in a signal handler (``tether run``'s SIGINT handler
    aborts the agent) that interrupted a registration. So a callback must be quick, must
    not raise and must take no lock the interrupted thread may hold: a
    :class:`queue.SimpleQueue`'s ``put`` is made for this, an ``Event.set`` is not.
    """

    def __init__(self) -> None:
        super().__init__()
        self._wakers: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for wake in tuple(self._wakers):
            wake()

    @contextlib.contextmanager
    def waking(self, wake: Callable[[], None]) -> Iterator[None]:
        """Call ``wake`` on ``set`` for the length of the ``with`` block (at once if the
        event is set already, so a ``set`` racing the registration is not lost)."""
        self._wakers.append(wake)
        try:
            if self.is_set():
                wake()
            yield
        finally:
            self._wakers.remove(wake)


@contextlib.contextmanager
def wake_on(event: threading.Event | None, wake: Callable[[], None]) -> Iterator[bool]:
    """Call ``wake`` when ``event`` is set, for the length of the ``with`` block; yield
    whether it will (a :class:`WakingEvent`); for any other event the caller must poll.
    """
    if not isinstance(event, WakingEvent):
        yield False
        return
    with event.waking(wake):
        yield True
