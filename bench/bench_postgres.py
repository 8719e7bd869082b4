"""Benchmark of the PostgreSQL session store against a bare INSERT on the same server.

Run: ``python bench/bench_postgres.py [URL] [--only NAME,…]`` (about 45 s; URL default
``$TETHER_BENCH_PG_URL``, else ``$TETHER_TEST_PG_URL``). It works in a schema of its own,
dropped at the end.

Printed (acceptance targets in brackets):

* ``pg.commit``: one ``PostgresSessionStore.commit`` of a typical fact (a user message of
  200 characters; encode, validate, the fenced statement) against a bare ``INSERT`` of the
  same bytes into a table of the same shape followed by ``COMMIT``, on one connection
  [≤ 1.3x]; ``pg.commit.one_statement`` against the stricter baseline of the ``INSERT``
  alone in autocommit mode (one round trip, as the store's commit is);
  ``pg.commit.no_flush``: the same two sides with ``synchronous_commit = off`` on both
  connections, so the WAL flush costs nothing: the regime where the store's fixed work
  (encoding, validation, the client's statement, the session row's ``UPDATE``) weighs most,
  as on a disk whose flush is nearly free;
  ``pg.commit.round_trips``: round trips per commit counted in the client's protocol trace
  (``ReadyForQuery`` messages): the store's commit, and the baseline's
  ``BEGIN``/``INSERT``/``COMMIT``;
* ``pg.throughput.N``: N worker processes (1, 2, 4, 8), each creating sessions of 20
  commits: durable facts per second and sessions per minute, all workers together; and
  the bare-``INSERT`` rate of N processes as the physical baseline;
* ``pg.group_commit.T``: T threads, each driving its own session, committing concurrently
  through one :class:`PostgresSessions` (one process, one pool of ``pool_size``
  connections): durable facts per second, against a bare ``INSERT`` + ``COMMIT`` loop on
  one connection in the same run [≥ 3x at T ≥ 32: the issue's group-commit target]; and
  the mean batch (commits per database transaction, from ``metrics()``);
* ``pg.renewal``: one lease renewal (one ``UPDATE`` for all the leases a worker holds; 8
  held) against a bare ``INSERT`` + ``COMMIT`` of one small row, and its share of a
  worker's time at the default period (every 10 s).

Estimator: rounds that time a batch of the store and a batch of the baseline back to back,
alternating which goes first; a ratio is the median of the per-round ratios, so drifts in
machine load cancel out.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import psycopg

from tether._stores.postgres import PostgresSessions, StoreMetrics, init_schema

TEXT = ("The quick brown fox jumps over the lazy dog. " * 5)[:200]
FACT: dict[str, Any] = {
    "kind": "entry",
    "entry": {"type": "message", "message": {"role": "user", "content": TEXT}},
}
COMMITS_PER_SESSION = 20


def with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def timed(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def ratio_rounds(
    store: Callable[[], None], base: Callable[[], None], rounds: int, batch: int
) -> tuple[float, float, float]:
    ratios, a, b = [], [], []
    for r in range(rounds):
        if r % 2:
            tb = timed(base, batch)
            ta = timed(store, batch)
        else:
            ta = timed(store, batch)
            tb = timed(base, batch)
        ratios.append(ta / tb)
        a.append(ta)
        b.append(tb)
    return statistics.median(ratios), statistics.median(a), statistics.median(b)


def without_flush(url: str) -> str:
    """``url`` as a conninfo string whose connections do not wait for the WAL flush."""
    options = psycopg.conninfo.conninfo_to_dict(url).get("options") or ""
    return psycopg.conninfo.make_conninfo(
        url, options=f"{options} -csynchronous_commit=off".strip()
    )


def round_trips(conn: psycopg.Connection[Any], fn: Callable[[], None], n: int = 20) -> float:
    """Round trips per call of ``fn`` on ``conn``: the ``ReadyForQuery`` messages the
    server sends, from libpq's protocol trace."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            for _ in range(n):
                fn()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        ready = sum(1 for line in trace if "\tB\t" in line and "ReadyForQuery" in line)
    return ready / n


def bench_commit(url: str, label: str = "pg.commit", *, trips: bool = True) -> None:
    # One connection in the pool: the round-trip trace below follows the commit onto it.
    sessions = PostgresSessions(url, lease_seconds=60, pool_size=1)
    store = sessions.create(provider="bench", model="m", environment_identity="bench")
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS bare_lines (session_id text, line_no bigint, data bytea, "
        "PRIMARY KEY (session_id, line_no))"
    )
    line = len(store.state.transcript)
    data = (
        b'{"kind":"entry","seq":1,"id":"01a22d5d-9469-769c-a5aa-fec37507ea65",'
        b'"timestamp":1710000000000,"entry":{"type":"message","message":{"role":"user",'
        b'"content":"' + TEXT.encode() + b'"}}}'
    )
    counter = [line]

    def bare() -> None:
        counter[0] += 1
        conn.execute(
            "INSERT INTO bare_lines (session_id, line_no, data) VALUES (%s, %s, %s)",
            (store.session_id, counter[0], data),
        )

    def commit() -> None:
        store.commit([FACT])

    tx = psycopg.connect(url)  # not autocommit: INSERT, then COMMIT

    def insert_commit() -> None:
        counter[0] += 1
        tx.execute(
            "INSERT INTO bare_lines (session_id, line_no, data) VALUES (%s, %s, %s)",
            (store.session_id, counter[0], data),
        )
        tx.commit()

    for _ in range(20):  # warm up every path (plans, caches)
        commit()
        bare()
        insert_commit()
    ratio, ta, tb = ratio_rounds(commit, insert_commit, rounds=15, batch=40)
    print(f"{label}  {ratio:.2f}x  store {ta * 1e6:.0f} us  bare INSERT + COMMIT {tb * 1e6:.0f} us")
    if trips:
        with sessions.pool.connection() as pooled:
            pass  # the pool's only connection, which every commit borrows
        ratio, ta, tb = ratio_rounds(commit, bare, rounds=15, batch=40)
        print(
            f"{label}.one_statement  {ratio:.2f}x  store {ta * 1e6:.0f} us  "
            f"bare INSERT in autocommit (one round trip) {tb * 1e6:.0f} us"
        )
        print(
            f"{label}.round_trips  store {round_trips(pooled, commit):.1f}  "
            f"bare INSERT + COMMIT {round_trips(tx, insert_commit):.1f}"
        )
    tx.close()
    store.close()
    sessions.close()
    conn.close()


def _worker(url: str, seconds: float, out: Any) -> None:
    sessions = PostgresSessions(url, lease_seconds=60)
    done_sessions = facts = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with sessions.create(provider="bench", model="m", environment_identity="b") as store:
            for _ in range(COMMITS_PER_SESSION):
                store.commit([FACT])
            facts += 1 + COMMITS_PER_SESSION
            done_sessions += 1
    sessions.close()
    out.put((facts, done_sessions))


def _bare_worker(url: str, seconds: float, out: Any) -> None:
    out.put((_bare_loop(url, seconds), 0))


def run_procs(
    target: Callable[..., None], url: str, workers: int, seconds: float
) -> tuple[int, int]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, seconds, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(r[0] for r in results), sum(r[1] for r in results)


def bench_throughput(url: str, seconds: float = 2.0) -> None:
    for workers in (1, 2, 4, 8):
        facts, done = run_procs(_worker, url, workers, seconds)
        bare, _ = run_procs(_bare_worker, url, workers, seconds)
        print(
            f"pg.throughput.{workers}  {facts / seconds:.0f} facts/s  "
            f"{done * 60 / seconds:.0f} sessions/min  "
            f"(bare INSERT+COMMIT {bare / seconds:.0f}/s: {facts / max(bare, 1):.2f} of it)"
        )


def _bare_loop(url: str, seconds: float) -> int:
    """Commits of a bare ``INSERT`` + ``COMMIT`` loop on one connection in ``seconds``."""
    conn = psycopg.connect(url)
    me, n = secrets.token_hex(4), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n += 1
        conn.execute(
            "INSERT INTO bare_lines (session_id, line_no, data) VALUES (%s, %s, %s)",
            (me, n, TEXT.encode()),
        )
        conn.commit()
    conn.close()
    return n


def _group_round(url: str, threads: int, seconds: float) -> tuple[int, StoreMetrics]:
    """Facts committed by ``threads`` threads (one session each, one opener) in
    ``seconds``, and the opener's metrics over the round (commits, transactions)."""
    sessions = PostgresSessions(url, lease_seconds=60)
    stores = [
        sessions.create(provider="bench", model="m", environment_identity="g")
        for _ in range(threads)
    ]
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def drive(i: int) -> None:
        start.wait()
        while not stop.is_set():
            stores[i].commit([FACT])
            counts[i] += 1

    workers = [threading.Thread(target=drive, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    before = sessions.metrics()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    after = sessions.metrics()
    for store in stores:
        store.close()
    sessions.close()
    return sum(counts), replace(
        after,
        commits=after.commits - before.commits,
        commit_transactions=after.commit_transactions - before.commit_transactions,
    )


def bench_group_commit(url: str, seconds: float = 2.0) -> None:
    """T threads x one session each, committing through one opener: facts/s against one
    connection's bare INSERT + COMMIT loop, measured right after."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bare_lines (session_id text, line_no bigint, "
            "data bytea, PRIMARY KEY (session_id, line_no))"
        )
    for threads in (8, 32, 128):
        facts, metrics = _group_round(url, threads, seconds)
        bare = _bare_loop(url, seconds)
        batch = metrics.commits / max(metrics.commit_transactions, 1)
        print(
            f"pg.group_commit.{threads}  {facts / seconds:.0f} facts/s  "
            f"{facts / max(bare, 1):.2f}x a bare INSERT+COMMIT loop on one connection "
            f"({bare / seconds:.0f}/s)  mean batch {batch:.1f}  "
            f"connections {metrics.connections_open}/{metrics.pool_size}"
        )


def bench_renewal(url: str) -> None:
    sessions = PostgresSessions(url, lease_seconds=30)
    stores = [
        sessions.create(provider="bench", model="m", environment_identity="r") for _ in range(8)
    ]
    conn = psycopg.connect(url, autocommit=True)

    def renew() -> None:
        assert sessions.renew_now() == 8

    conn.execute(
        "CREATE TABLE IF NOT EXISTS bare_lines (session_id text, line_no bigint, "
        "data bytea, PRIMARY KEY (session_id, line_no))"
    )
    me, n = secrets.token_hex(4), [0]

    def ping() -> None:
        n[0] += 1
        conn.execute("INSERT INTO bare_lines VALUES (%s, %s, %s)", (me, n[0], b"x"))

    ratio, ta, _tb = ratio_rounds(renew, ping, rounds=11, batch=30)
    period = sessions.lease_seconds / 3
    print(
        f"pg.renewal  {ratio:.2f}x a bare INSERT+COMMIT  "
        f"{ta * 1e6:.0f} us per renewal of 8 leases, "
        f"every {period:.0f} s: {ta / period * 100:.4f}% of one worker's time"
    )
    for store in stores:
        store.close()
    sessions.close()
    conn.close()


PARTS = ("commit", "no_flush", "group_commit", "throughput", "renewal")


def main(argv: list[str]) -> int:
    only = set(PARTS)
    if "--only" in argv:
        at = argv.index("--only")
        only = set(argv[at + 1].split(",")) if at + 1 < len(argv) else set()
        argv = argv[:at] + argv[at + 2 :]
        if not only or not only <= set(PARTS):
            print(f"--only takes names among {', '.join(PARTS)}", file=sys.stderr)
            return 2
    url = (
        argv[0]
        if argv
        else os.environ.get("TETHER_BENCH_PG_URL") or os.environ.get("TETHER_TEST_PG_URL")
    )
    if not url:
        print("usage: bench_postgres.py URL (or set TETHER_BENCH_PG_URL)", file=sys.stderr)
        return 2
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        scoped = with_schema(url, schema)
        init_schema(scoped)
        if "commit" in only:
            bench_commit(scoped)
        if "no_flush" in only:
            bench_commit(without_flush(scoped), "pg.commit.no_flush", trips=False)
        if "group_commit" in only:
            bench_group_commit(scoped)
        if "throughput" in only:
            bench_throughput(scoped)
        if "renewal" in only:
            bench_renewal(scoped)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
