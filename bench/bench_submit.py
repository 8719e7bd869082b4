"""Benchmark of ``tether submit --from`` on PostgreSQL: sessions accepted per second.

Run: ``python bench/bench_submit.py [URL] [--sessions N]`` (about 20 s; URL default
``$TETHER_BENCH_PG_URL``, else ``$TETHER_TEST_PG_URL``). It works in a schema of its own,
dropped at the end.

Printed, each the best of three repetitions:

* ``submit.batched``: :meth:`PostgresSessions.create_queued` with
  :data:`~tether._runtime.worker.SUBMIT_BATCH` sessions per transaction (each session: its
  header and [user entry, ``runStarted``], encoded and validated by the reducer, sent by
  ``COPY``), the path of ``tether submit --from``;
* ``submit.one_by_one``: the path of one ``tether submit`` per prompt inside one process
  (create the session under a lease, commit, release): three transactions a session;
* ``baseline.insert_commit``: the physical baseline, one bare ``INSERT`` of a row of the
  same size followed by ``COMMIT`` per session, on one connection (one WAL flush each).

and the ratios of the batched path to both.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import psycopg

from tether._ids import new_uuid7
from tether._runtime.worker import SUBMIT_BATCH
from tether._stores.postgres import PostgresSessions, init_schema
from tether.core import facts

PROMPT = ("Fix the failing test in the parser module and explain the cause. " * 3)[:200]


def with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def run_facts() -> list[dict[str, Any]]:
    entry_id = new_uuid7()
    return [
        facts.user_entry(entry_id=entry_id, content=PROMPT),
        facts.run_started(operation_id=new_uuid7(), input_entry_id=entry_id),
    ]


def best(fn: Callable[[], int], repeat: int = 3) -> float:
    """Sessions per second, the best of ``repeat`` runs of ``fn`` (it returns its count)."""
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        rates.append(count / (time.perf_counter() - start))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?")
    parser.add_argument("--sessions", type=int, default=2000)
    args = parser.parse_args()
    base = args.url or os.environ.get("TETHER_BENCH_PG_URL") or os.environ["TETHER_TEST_PG_URL"]
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    url = with_schema(base, schema)
    try:
        init_schema(url)
        sessions = PostgresSessions(url, lease_seconds=60)
        n = args.sessions
        few = max(n // 10, 20)

        def batched() -> int:
            done = 0
            while done < n:
                size = min(SUBMIT_BATCH, n - done)
                ids = sessions.create_queued(
                    [run_facts() for _ in range(size)],
                    provider="bench",
                    model="m",
                    environment_identity="bench",
                )
                done += len(ids)
            return done

        def one_by_one() -> int:
            for _ in range(few):
                with sessions.create(
                    provider="bench", model="m", environment_identity="bench"
                ) as store:
                    store.commit(run_facts())
            return few

        conn = psycopg.connect(url)
        conn.execute("CREATE TABLE bare (id text PRIMARY KEY, data bytea)")
        conn.commit()
        row = b"x" * 900  # about a session's two lines

        def insert_commit() -> int:
            for _ in range(few):
                conn.execute("INSERT INTO bare VALUES (%s, %s)", (new_uuid7(), row))
                conn.commit()
            return few

        rate_batched = best(batched)
        rate_single = best(one_by_one)
        rate_bare = best(insert_commit)
        conn.close()
        sessions.close()
        print(f"submit.batched          {rate_batched:10.0f} sessions/s  ({n} a run)")
        print(f"submit.one_by_one       {rate_single:10.0f} sessions/s  ({few} a run)")
        print(f"baseline.insert_commit  {rate_bare:10.0f} rows/s      ({few} a run)")
        print(f"ratio batched/one_by_one      {rate_batched / rate_single:6.1f}x")
        print(f"ratio batched/insert_commit   {rate_batched / rate_bare:6.1f}x")
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
