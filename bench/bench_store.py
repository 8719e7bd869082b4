"""Benchmark of SessionStore.commit against raw write baselines.

Run: ``python bench/bench_store.py`` (about 30 s). Everything happens in a temporary directory
on the file system of ``$TMPDIR``.

The typical fact is a user message entry with 200 characters of text (361 bytes per line on
disk). It is the fact a session accumulates most of, and the reducer accepts it at any time,
so the same fact can be committed 100,000 times in a row.

Printed ratios (acceptance targets in brackets):

* ``store.commit.process``: a commit in ``process`` mode against ``orjson.dumps`` of the
  same fact plus ``os.write`` of the bytes [≤ 3x]. A second line gives the ratio against the
  stdlib ``json.dumps``.
* ``store.commit.durable``: a commit in ``durable`` mode against ``os.write`` plus
  ``os.fdatasync`` of the same bytes [≤ 1.2x].
* ``store.commit.scale``: the per-commit cost in process mode with 100,000 facts already in
  the log, against the cost with 100 facts [≤ 1.2x].

Estimator: many short rounds. Each round times one batch of the store and one batch of the
baseline back to back, alternating which goes first. A ratio is the median of the per-round
ratios, so slow drifts in machine load (other jobs on a shared box) cancel out. The absolute
figures printed are medians over rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tether._stores.file import Durability, SessionStore

TEXT = ("The quick brown fox jumps over the lazy dog. " * 5)[:200]


def user_fact() -> dict[str, Any]:
    message = {"role": "user", "content": TEXT}
    return {"kind": "entry", "entry": {"type": "message", "message": message}}


def envelope(seq: int) -> dict[str, Any]:
    """The fact as the store writes it, with every envelope member filled in (for baselines)."""
    return {
        "kind": "entry",
        "seq": seq,
        "id": "01a22d5d-9469-769c-a5aa-fec37507ea65",
        "timestamp": 1_710_000_000_000,
        "entry": {"type": "message", "message": {"role": "user", "content": TEXT}},
    }


Batch = Callable[[int], None]


def timed(run: Batch, n: int) -> float:
    t0 = time.perf_counter()
    run(n)
    return (time.perf_counter() - t0) / n


def paired(mine: Batch, base: Batch, *, rounds: int, batch: int) -> tuple[float, float, float]:
    """(median ratio, median mine, median base); seconds per operation."""
    ratios: list[float] = []
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(rounds):
        if r % 2:
            a = timed(mine, batch)
            b = timed(base, batch)
        else:
            b = timed(base, batch)
            a = timed(mine, batch)
        ratios.append(a / b)
        ours.append(a)
        theirs.append(b)
    return statistics.median(ratios), statistics.median(ours), statistics.median(theirs)


def open_raw(directory: Path, name: str) -> int:
    return os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)


def new_store(work: Path, durability: Durability) -> SessionStore:
    return SessionStore.create(
        work,
        provider="bench",
        model="bench/model",
        environment_identity="bench",
        durability=durability,
    )


def committer(store: SessionStore) -> Batch:
    facts = [user_fact()]

    def run(n: int) -> None:
        for _ in range(n):
            store.commit(facts)

    return run


def bench_process(work: Path) -> None:
    store = new_store(work, Durability.PROCESS)
    fd = open_raw(work, "baseline-orjson.jsonl")
    fd_json = open_raw(work, "baseline-json.jsonl")
    seq = [1]

    def base(n: int) -> None:
        for _ in range(n):
            os.write(fd, orjson.dumps(envelope(seq[0])) + b"\n")
            seq[0] += 1

    def base_json(n: int) -> None:
        for _ in range(n):
            line = json.dumps(envelope(seq[0]), separators=(",", ":"))
            os.write(fd_json, line.encode() + b"\n")
            seq[0] += 1

    mine = committer(store)
    for run in (mine, base, base_json):
        run(500)  # warm up
    ratio, ours, theirs = paired(mine, base, rounds=41, batch=500)
    print(
        f"store.commit.process  ratio={ratio:.2f}x (commit {ours * 1e6:.2f}us, "
        f"baseline orjson.dumps+os.write {theirs * 1e6:.2f}us) [target <= 3x]"
    )
    ratio, ours, theirs = paired(mine, base_json, rounds=41, batch=500)
    print(
        f"store.commit.process  ratio={ratio:.2f}x vs stdlib json (commit {ours * 1e6:.2f}us, "
        f"baseline json.dumps+os.write {theirs * 1e6:.2f}us)"
    )
    store.close()
    os.close(fd)
    os.close(fd_json)


def bench_durable(work: Path) -> None:
    store = new_store(work, Durability.DURABLE)
    fd = open_raw(work, "baseline-durable.jsonl")
    seq = [1]

    def base(n: int) -> None:
        for _ in range(n):
            os.write(fd, orjson.dumps(envelope(seq[0])) + b"\n")
            os.fdatasync(fd)
            seq[0] += 1

    mine = committer(store)
    mine(20)
    base(20)
    ratio, ours, theirs = paired(mine, base, rounds=41, batch=25)
    print(
        f"store.commit.durable  ratio={ratio:.2f}x (commit {ours * 1e6:.1f}us, "
        f"baseline os.write+os.fdatasync {theirs * 1e6:.1f}us) [target <= 1.2x]"
    )
    store.close()
    os.close(fd)


def bench_scale(work: Path) -> None:
    large = new_store(work, Durability.PROCESS)
    t0 = time.perf_counter()
    committer(large)(100_000)
    fill = time.perf_counter() - t0
    assert large.state.last_seq == 100_000
    # The small log must stay small, so each round gets a fresh one holding 100 facts.
    smalls: list[SessionStore] = []

    def fresh_small() -> SessionStore:
        store = new_store(work, Durability.PROCESS)
        committer(store)(100)
        smalls.append(store)
        return store

    ratios: list[float] = []
    at_large: list[float] = []
    at_small: list[float] = []
    big = committer(large)
    for r in range(61):
        small = committer(fresh_small())
        if r % 2:
            a = timed(big, 100)
            b = timed(small, 100)
        else:
            b = timed(small, 100)
            a = timed(big, 100)
        ratios.append(a / b)
        at_large.append(a)
        at_small.append(b)
        old = smalls.pop(0)
        old.close()
        os.unlink(old.path)
    print(
        f"store.commit.scale    ratio={statistics.median(ratios):.2f}x "
        f"(at 100,000 facts {statistics.median(at_large) * 1e6:.2f}us, "
        f"at 100 facts {statistics.median(at_small) * 1e6:.2f}us; "
        f"committing the first 100,000 took {fill:.1f}s) [target <= 1.2x]"
    )
    large.close()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        work = Path(tmp)
        size = len(orjson.dumps(envelope(1))) + 1
        print(f"fact: user message entry with 200 chars of text, {size} bytes per line")
        bench_process(work)
        bench_durable(work)
        bench_scale(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
