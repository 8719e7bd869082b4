"""A worker drives its sessions as greenlets on a few hub threads (tether._hub).

In process, over an in-memory queue: 40 sessions whose model answers after a delay (the
scripted model waits on the clock, which parks a session on a hub) and whose first step is
a real ``bash`` call (offloaded to a helper thread). With a thread per session the worker
held 40 session threads while they waited; on hubs it holds its two hubs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tether._models.scripted import ScriptedModel
from tether._runtime import Agent
from tether._runtime.worker import FleetSessions, Worker, submit
from tether._stores.memory import MemorySessions

SESSIONS = 40
DELAY = 1.0


class _Queue(MemorySessions):
    """The in-memory store as a worker's queue (what ``claim`` takes, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: list[str] = []
        self.guard = threading.Lock()

    def claim(self, environment: str) -> str | None:
        with self.guard:
            return self.queue.pop(0) if self.queue else None

    def claim_many(self, environment: str, count: int) -> list[str]:
        with self.guard:
            taken, self.queue = self.queue[:count], self.queue[count:]
            return taken

    def waiting(self, environment: str) -> int:
        with self.guard:
            return len(self.queue)

    def release_claim(self, session_id: str) -> None:
        pass

    def park(self, session_id: str) -> None:
        pass


def _script() -> ScriptedModel:
    command = 'echo "$TETHER_SESSION_ID" >> effects.txt'
    return ScriptedModel.from_json(
        {
            "model": "scripted/hubs",
            "responses": [
                {
                    "content": "Counting.",
                    "tool_calls": [{"id": "c1", "name": "bash", "arguments": {"command": command}}],
                    "delay": DELAY,
                },
                {"content": "Done.", "finish_reason": "stop", "delay": DELAY},
            ],
        }
    )


def test_sessions_wait_on_two_hubs_and_each_effect_happens_once(tmp_path: Path) -> None:
    (tmp_path / ".tether").mkdir()
    store = _Queue()
    fleet = FleetSessions(store)  # what a worker's slots share: claims of many at once
    model = _script()

    def make_agent() -> Agent:
        return Agent(
            model, workspace=tmp_path, read_agents_md=False, session_store=fleet, sandbox="off"
        )

    first = make_agent()
    store.queue = [submit(first, f"task {n}") for n in range(SESSIONS)]
    first.close()
    worker = Worker(make_agent, concurrency=SESSIONS, until_empty=True, hubs=2)
    before = threading.active_count()
    peak_waiting = [0]
    done = threading.Event()
    names: list[list[str]] = []

    def sample() -> None:
        # While every session waits for its first answer, nothing runs a tool yet: what
        # the worker holds then is its hubs (a thread per session: 40 more).
        while not done.is_set():
            early = time.monotonic() - started < DELAY * 0.8  # no answer came yet
            if early and worker.in_flight == SESSIONS:
                peak_waiting[0] = max(peak_waiting[0], threading.active_count())
                names.append(sorted(t.name for t in threading.enumerate()))
            time.sleep(0.01)

    started = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    report = worker.run()
    wall = time.monotonic() - started
    done.set()
    sampler.join()

    assert report.failed is None and report.fenced is None
    assert list(report.driven.values()) == ["completed"] * SESSIONS
    lines = (tmp_path / "effects.txt").read_text().split()
    assert sorted(lines) == sorted(report.driven)  # every session's call ran exactly once
    assert worker.peak == SESSIONS  # all in flight at once
    # Two hubs, the two threads that compose new slots, and the sampler.
    assert 0 < peak_waiting[0] <= before + 2 + 2 + 1, names[-1]
    # Waiting together: one after another would take SESSIONS x 2 x DELAY = 80 s.
    assert wall < SESSIONS * 2 * DELAY / 4


def test_a_worker_runs_one_to_64_hubs() -> None:
    from tether.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="1 to 64 hubs"):
        Worker(lambda: None, concurrency=4, hubs=0)  # type: ignore[arg-type,return-value]


def test_a_slot_its_hub_cannot_make_stops_the_worker_with_the_error(tmp_path: Path) -> None:
    """New slots are made by the hubs (Worker._made_here): one that cannot be made gives
    its session back and stops the worker, whose run raises the error, as it did when the
    dispatcher made them."""
    (tmp_path / ".tether").mkdir()
    given_back: list[str] = []

    class Queue(_Queue):
        def release_claim(self, session_id: str) -> None:
            given_back.append(session_id)

    store = Queue()
    fleet = FleetSessions(store)
    model = _script()
    made = [0]

    def make_agent() -> Agent:
        made[0] += 1
        if made[0] > 2:  # the submitter's and the worker's first: then no more
            raise OSError("too many open files")
        return Agent(
            model, workspace=tmp_path, read_agents_md=False, session_store=fleet, sandbox="off"
        )

    first = make_agent()
    store.queue = [submit(first, f"task {n}") for n in range(4)]
    sessions = list(store.queue)
    first.close()
    worker = Worker(make_agent, concurrency=4, until_empty=True, hubs=2)
    with pytest.raises(OSError, match="too many open files"):
        worker.run()
    # Each session was driven (the first had the first slot) or given back, once.
    assert len(given_back) == len(set(given_back)) >= 3
    assert set(given_back) | set(worker.report.driven) == set(sessions)
