"""The leader/follower group commit of a worker's pool (``tether._stores.pgpool.GroupCommit``),
over a store function of the test's: batches, answers, one leader at a time, hand-off.

The same class under a real PostgreSQL: tests/test_pg_pool.py.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time

import pytest

from tether._stores.pgpool import CommitLost, CommitRequest, GroupCommit


def _request(n: int, data: bytes = b"x" * 100) -> CommitRequest:
    return CommitRequest(
        session_id=f"s{n}",
        lines=n,
        epoch=1,
        owner="w",
        operation="idle",
        pending=False,
        ttl=30.0,
        data=data,
    )


class Recorder:
    """A store that answers each request as ``verdict`` says, taking ``seconds``, and records
    its batches and how many ran at once."""

    def __init__(self, seconds: float = 0.002, verdict: object = True) -> None:
        self.seconds = seconds
        self.verdict = verdict
        self.batches: list[list[str]] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, batch: list[CommitRequest]) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        for r in batch:
            if isinstance(self.verdict, BaseException):
                r.error = self.verdict
            else:
                r.stored = r.lines % 3 != 0 if self.verdict == "fence" else True
        with self._lock:
            self.running -= 1
            self.batches.append([r.session_id for r in batch])


def _commit_all(group: GroupCommit, count: int) -> dict[int, object]:
    answers: dict[int, object] = {}
    start = threading.Barrier(count)

    def one(n: int) -> None:
        start.wait()
        try:
            answers[n] = group.commit(_request(n))
        except BaseException as exc:  # recorded for the assertion
            answers[n] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a committer was never answered"
    return answers


def test_two_hundred_committers_are_each_answered_once_in_few_batches_one_at_a_time() -> None:
    store = Recorder()
    answers = _commit_all(GroupCommit(store), 200)
    assert answers == dict.fromkeys(range(200), True)
    stored = [s for batch in store.batches for s in batch]
    assert sorted(stored) == sorted(f"s{n}" for n in range(200))  # each in one batch
    assert store.most == 1  # never two leaders at once
    assert len(store.batches) < 100  # they shared transactions


def test_each_committer_gets_its_own_verdict_and_the_leaders_error_reaches_its_batch() -> None:
    fenced = _commit_all(GroupCommit(Recorder(verdict="fence")), 60)
    assert fenced == {n: n % 3 != 0 for n in range(60)}

    lost = _commit_all(GroupCommit(Recorder(verdict=CommitLost("gone"))), 40)
    assert all(isinstance(a, CommitLost) for a in lost.values()), lost


def test_a_lone_commit_leads_at_once_and_leaves_no_leader_behind() -> None:
    store = Recorder(seconds=0)
    group = GroupCommit(store)
    assert group.commit(_request(1)) is True
    assert group.commit(_request(2)) is True
    assert store.batches == [["s1"], ["s2"]]


@pytest.mark.parametrize("when", ["waiting", "just_promoted"])
def test_an_interrupted_waiter_leaves_the_queue_and_the_next_commit_still_lands(
    when: str,
) -> None:
    """Interrupted while it waits (a real SIGINT ends the lock wait) or just as the lead is
    handed to it (the interrupt is raised once it holds it): either way its line is never sent
    and the lead is not left with it."""
    release = threading.Event()
    store = Recorder(seconds=0)

    def slow(batch: list[CommitRequest]) -> None:
        release.wait(10)
        store(batch)

    group = GroupCommit(slow)
    leader = threading.Thread(target=group.commit, args=(_request(1),))
    leader.start()
    time.sleep(0.05)  # the leader is storing now; the main thread waits behind it
    if when == "waiting":
        threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGINT)).start()
    else:  # pending until the wait ends: the leader answers and hands over the lead first
        threading.Timer(0.1, _thread.interrupt_main).start()
        threading.Timer(0.2, release.set).start()
    with pytest.raises(KeyboardInterrupt):
        group.commit(_request(2))
    release.set()
    leader.join(5)
    assert _commit_all(group, 1) == {0: True}  # answered: no leader was left behind
    assert store.batches == [["s1"], ["s0"]]


def test_committers_on_hubs_park_while_they_wait_and_their_hubs_go_on() -> None:
    """Sessions on two hubs (tether._hub) commit while a slow leader stores: the followers
    park, so each hub runs its other sessions meanwhile (a follower that blocked its hub's
    thread would hold them until the leader's transaction ended), and every commit of every
    hub is answered, in few batches."""
    from concurrent.futures import ThreadPoolExecutor

    from tether._hub import Hub

    recorder = Recorder(seconds=0.3)
    group = GroupCommit(recorder)
    helpers = ThreadPoolExecutor(2)
    hubs = [Hub(f"hub-{n}", helpers) for n in range(2)]
    answers: dict[int, object] = {}
    ran_while_storing: list[int] = []
    lock = threading.Lock()

    def committer(n: int) -> None:
        answer = group.commit(_request(n))
        with lock:
            answers[n] = answer

    def other(n: int) -> None:
        if recorder.running:  # a leader's transaction is under way
            with lock:
                ran_while_storing.append(n)

    try:
        for n in range(40):
            hubs[n % 2].spawn(lambda n=n: committer(n))
        deadline = time.monotonic() + 10
        while not recorder.running:  # the first leader stores; the others queue
            assert time.monotonic() < deadline
            time.sleep(0.005)
        for n in range(2):
            hubs[n].spawn(lambda n=n: other(n))
        while len(answers) < 40:
            assert time.monotonic() < deadline, "a committer was never answered"
            time.sleep(0.01)
    finally:
        for hub in hubs:
            hub.close()
        helpers.shutdown()
    assert answers == dict.fromkeys(range(40), True)
    # The hub whose session leads is held by its statement; the other ran its session.
    assert ran_while_storing
    assert len(recorder.batches) <= 4
    assert recorder.most == 1
