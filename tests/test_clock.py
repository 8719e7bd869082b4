"""The clock seam (:mod:`tether._clock`): budgets and backoffs on an injected fake clock.

* :class:`~tether.testing.clock.FakeClock` moves only when told: ``advance`` wakes the waits
  whose time has come, an event cuts a wait short, ``autojump`` lets a wait pass at once, and
  every wait asked is recorded;
* the time budget: a model step during which the fake clock moves past ``max_seconds`` ends
  the run ``budget_exhausted`` before its tool call runs, with no real sleep;
* the retry backoff: the executor waits for it on the clock, which records the delays the
  policy asked for (``base * 2**(n-1)``), and the retry schedule's due time is the clock's;
* the worker: its pauses between claims and the length of a store outage are the clock's
  (it gives up after :data:`~tether._runtime.worker.UNREACHABLE_SECONDS` of fake time).

No test here sleeps to let time pass.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tether._clock import SYSTEM_CLOCK, Clock, SystemClock, WakingEvent, wake_on
from tether._project import BudgetConfig
from tether._runtime import Agent, RunStatus
from tether._runtime.retry import read_record
from tether._runtime.worker import GC_FIRST_THRESHOLD, UNREACHABLE_SECONDS, Worker, when_reachable
from tether._stores.memory import MemorySessions
from tether.errors import StoreUnavailable
from tether.testing.clock import START_MS, FakeClock
from tether.testing.scripted import ScriptedModel

REAL_SECONDS = 5.0
"""Generous bound on the real time of a test whose fake clock moves minutes."""


# --------------------------------------------------------------------------- the clocks


def test_both_clocks_are_clocks() -> None:
    clocks: list[Clock] = [SYSTEM_CLOCK, FakeClock()]
    assert isinstance(SYSTEM_CLOCK, SystemClock)
    assert all(callable(c.wait) and callable(c.sleep) for c in clocks)
    event = threading.Event()
    event.set()
    assert SYSTEM_CLOCK.wait(event, 10.0) is True  # a set event: no wait at all


def test_a_waking_event_calls_its_wakers_while_registered() -> None:
    calls: list[str] = []
    event = WakingEvent()
    with wake_on(event, lambda: calls.append("a")) as woken:
        assert woken is True
        with wake_on(event, lambda: calls.append("b")):
            event.set()
        assert calls == ["a", "b"]
        event.clear()
        event.set()  # "b" left its block: only "a"
    assert calls == ["a", "b", "a"]
    event.set()  # nobody registered
    assert calls == ["a", "b", "a"]
    # Set before the registration: woken at once, so a racing set is never lost.
    with wake_on(event, lambda: calls.append("late")):
        pass
    assert calls[-1] == "late"
    # Any other event cannot wake: the caller is told to poll it.
    plain = threading.Event()
    with wake_on(plain, lambda: calls.append("never")) as woken:
        plain.set()
        assert woken is False
    with wake_on(None, lambda: calls.append("never")) as woken:
        assert woken is False
    assert "never" not in calls
    assert event.wait(0) and isinstance(event, threading.Event)


def test_a_fake_clock_moves_only_when_advanced() -> None:
    clock = FakeClock(now_ms=1_000, monotonic=50.0)
    assert (clock.now_ms(), clock.monotonic()) == (1_000, 50.0)
    clock.advance(2.5)
    assert (clock.now_ms(), clock.monotonic()) == (3_500, 52.5)
    assert FakeClock().now_ms() == START_MS
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


def test_a_blocked_wait_returns_when_the_clock_passes_its_end() -> None:
    clock = FakeClock()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(clock.wait(threading.Event(), 10.0)))
    waiter.start()
    assert clock.waiting_for(1)
    clock.advance(9.0)
    waiter.join(0.2)
    assert waiter.is_alive()  # 9 of 10 s: still waiting
    clock.advance(1.0)
    waiter.join(REAL_SECONDS)
    assert not waiter.is_alive() and woke == [False]
    assert clock.waits == [10.0]


def test_an_event_cuts_a_wait_short() -> None:
    clock = FakeClock()
    stop = threading.Event()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(clock.wait(stop, 3600.0)))
    waiter.start()
    assert clock.waiting_for(1)
    stop.set()
    waiter.join(REAL_SECONDS)
    assert woke == [True] and clock.monotonic() == 0.0


def test_autojump_lets_a_wait_pass_at_once() -> None:
    clock = FakeClock(autojump=True)
    began = time.monotonic()
    clock.sleep(600.0)
    assert clock.wait(threading.Event(), 30.0) is False
    assert time.monotonic() - began < REAL_SECONDS
    assert clock.monotonic() == 630.0 and clock.now_ms() == START_MS + 630_000
    assert clock.waits == [600.0, 30.0]


# --------------------------------------------------------------------------- the time budget


def _workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    root = tmp_path / "ws"
    root.mkdir()
    return root


def _agent(root: Path, clock: FakeClock, responses: list[dict[str, Any]], **kw: Any) -> Agent:
    model = ScriptedModel.from_json({"responses": responses}, clock=clock)
    return Agent(model, workspace=root, read_agents_md=False, clock=clock, **kw)


WRITE_LATE = {
    "tool_calls": [
        {"id": "w1", "name": "write", "arguments": {"path": "late.txt", "content": "late\n"}}
    ]
}


def test_a_model_step_past_the_time_budget_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    began = time.monotonic()
    agent = _agent(
        root,
        clock,
        [{**WRITE_LATE, "delay": 6}, {"content": "Done.", "finish_reason": "stop"}],
        budget=BudgetConfig(max_seconds=5),
    )
    try:
        result = agent.run("write it")
    finally:
        agent.close()
    assert time.monotonic() - began < REAL_SECONDS
    assert clock.waits == [6.0]  # the model step, on the fake clock
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert "time budget (6.0 s of 5 s)" in result.error["message"]
    assert not (root / "late.txt").exists()  # the call after the budget never ran


def test_a_model_step_within_the_time_budget_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    agent = _agent(
        root,
        clock,
        [{**WRITE_LATE, "delay": 4}, {"content": "Done.", "finish_reason": "stop"}],
        budget=BudgetConfig(max_seconds=5),
    )
    try:
        result = agent.run("write it")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED and result.text == "Done."
    assert (root / "late.txt").read_text() == "late\n"


# --------------------------------------------------------------------------- the backoff

RATE_LIMITED = {"error": {"code": "rate_limited", "message": "slow down"}}


def test_the_retry_backoff_waits_on_the_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    began = time.monotonic()
    agent = _agent(
        root,
        clock,
        [RATE_LIMITED, RATE_LIMITED, {"content": "Done.", "finish_reason": "stop"}],
        model_retries=3,
        retry_base_delay=30.0,
    )
    try:
        result = agent.run("hi")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED and result.text == "Done."
    assert clock.waits == [30.0, 60.0]  # base * 2**(n-1), asked of the clock
    assert time.monotonic() - began < REAL_SECONDS


def test_the_retry_schedule_is_due_on_the_clock_and_abort_cuts_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock()  # no autojump: the wait blocks until the clock moves or abort()
    agent = _agent(
        root,
        clock,
        [RATE_LIMITED, {"content": "Done.", "finish_reason": "stop"}],
        model_retries=1,
        retry_base_delay=45.0,
    )
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(agent.run("hi")))
    try:
        runner.start()
        assert clock.waiting_for(1)
        assert clock.waits == [45.0]
        agent.abort()
        runner.join(REAL_SECONDS)
        assert not runner.is_alive()
        [result] = results
        assert result.status is RunStatus.FAILED  # the retry stays scheduled, for resume
        agent.release()
        store = agent.parts.sessions.open(result.session_id)
        try:
            record = read_record(store)
        finally:
            store.close()
        assert record is not None and record.due_at_ms == START_MS + 45_000
    finally:
        agent.abort()
        runner.join(REAL_SECONDS)
        agent.close()


# --------------------------------------------------------------------------- the worker


class _Unreachable(MemorySessions):
    """A shared store whose database is away: every claim fails."""

    def claim(self, environment: str) -> str | None:
        raise StoreUnavailable("postgresql://db", "connection refused")

    def waiting(self, environment: str) -> int:
        raise StoreUnavailable("postgresql://db", "connection refused")


def test_a_worker_gives_up_on_an_unreachable_store_after_its_clock_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    lines: list[str] = []

    def make_agent() -> Agent:
        model = ScriptedModel.from_json({"responses": [{"content": "Done."}]}, clock=clock)
        return Agent(
            model, workspace=root, read_agents_md=False, clock=clock, session_store=_Unreachable()
        )

    thresholds: list[int] = []

    def log(line: str) -> None:
        thresholds.append(gc.get_threshold()[0])
        lines.append(line)

    began = time.monotonic()
    before = gc.get_threshold()
    report = Worker(make_agent, log=log).run()
    assert time.monotonic() - began < REAL_SECONDS
    # While it ran (its log line), the collector ran less often; then as before.
    assert thresholds == [GC_FIRST_THRESHOLD] and gc.get_threshold() == before
    assert isinstance(report.failed, StoreUnavailable)
    # One pause of a second between claims, until more than UNREACHABLE_SECONDS had passed.
    assert clock.waits == [1.0] * (int(UNREACHABLE_SECONDS) + 1)
    assert lines == ["store unavailable, retrying: session postgresql://db: connection refused"]


def test_a_worker_starting_before_its_store_waits_for_it_by_its_clock() -> None:
    # tether worker opens its store through when_reachable: a database that answers only
    # after a few tries is waited for (said once, a second between tries); one that stays
    # away past UNREACHABLE_SECONDS raises its error; a stop ends the wait with None.
    clock = FakeClock(autojump=True)
    lines: list[str] = []
    refusals = iter(range(3))

    def opens_on_the_fourth_try() -> str:
        if next(refusals, None) is not None:
            raise StoreUnavailable("postgresql://db", "the database system is starting up")
        return "opened"

    stop = threading.Event()
    assert when_reachable(opens_on_the_fourth_try, stop=stop, log=lines.append, clock=clock) == (
        "opened"
    )
    assert clock.waits == [1.0] * 3
    assert lines == [
        "store unavailable, retrying: session postgresql://db: the database system is starting up"
    ]

    def never() -> str:
        raise StoreUnavailable("postgresql://db", "connection refused")

    clock.waits.clear()
    with pytest.raises(StoreUnavailable, match="connection refused"):
        when_reachable(never, stop=stop, log=lines.append, clock=clock)
    assert clock.waits == [1.0] * (int(UNREACHABLE_SECONDS) + 1)

    stop.set()
    clock.waits.clear()
    assert when_reachable(never, stop=stop, log=lines.append, clock=clock) is None
    assert clock.waits == [1.0]
