"""A clock a test moves by hand: budgets, backoffs, polls and lease renewals without sleeping.

:class:`FakeClock` is a :class:`tether._clock.Clock` (give it to ``Agent(clock=...)``, a
``Worker``'s agents or a ``PostgresSessions(waits=...)``). Its time moves only when told:
:meth:`FakeClock.advance` moves the wall and the monotonic clock together and wakes every
wait whose time has come. Every ``sleep``/``wait`` asked is recorded in
:attr:`FakeClock.waits` (seconds, in order), so a test asserts the backoff a retry policy
asked for instead of measuring it.

Waiting, like trio's ``MockClock``: by default a wait blocks until another thread advances
the clock past its end (or sets the wait's event), which is what a test of a background
thread (a lease renewal, a worker's poll) wants. With ``autojump=True`` a wait moves the
clock to its own end at once (the event still cuts it short), which is what a test driving
one thread wants: a retry's backoff passes in no real time at all.
"""

from __future__ import annotations

import threading
from typing import Final

__all__ = ["FakeClock"]

START_MS: Final = 1_710_000_000_000
"""The wall time a fake clock starts at unless told (2024-03-09T16:00:00Z)."""

_POLL: Final = 0.005
"""Seconds a blocked wait sleeps for real between looks at an event set elsewhere."""


class FakeClock:
    """Wall time, monotonic time and waits that move only when the test says so (thread
    safe: any thread may advance it or wait on it)."""

    def __init__(
        self, *, now_ms: int = START_MS, monotonic: float = 0.0, autojump: bool = False
    ) -> None:
        self._wall_ms = now_ms
        self._mono = monotonic
        self.autojump = autojump
        self.waits: list[float] = []
        """Every ``sleep``/``wait`` asked, in seconds, in the order asked."""
        self._changed = threading.Condition()

    # ------------------------------------------------------------------ reading

    def now_ms(self) -> int:
        with self._changed:
            return self._wall_ms

    def monotonic(self) -> float:
        with self._changed:
            return self._mono

    # ------------------------------------------------------------------ moving

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks; waits that end by then return."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds!r} s)")
        with self._changed:
            self._mono += seconds
            self._wall_ms += round(seconds * 1000)
            self._changed.notify_all()

    # ------------------------------------------------------------------ waiting

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._changed:
            self.waits.append(seconds)
            self._changed.notify_all()  # a test may be waiting for a wait (waiting_for)
            end = self._mono + max(seconds, 0.0)
        if event.is_set():
            return True
        if self.autojump:
            with self._changed:
                step = end - self._mono
                if step > 0:
                    self._mono = end
                    self._wall_ms += round(step * 1000)
                    self._changed.notify_all()
            return event.is_set()
        with self._changed:
            while self._mono < end and not event.is_set():
                # An event set by another thread does not notify this condition: look again
                # after a short real pause.
                self._changed.wait(_POLL)
        return event.is_set()

    def waiting_for(self, count: int, timeout: float = 10.0) -> bool:
        """Block (real time, at most ``timeout``) until ``count`` waits were asked in all;
        whether they were. For a test that advances the clock once a thread is waiting."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.waits) >= count, timeout)
