"""The fleet benchmark still runs and prints every figure it promises (``bench/README.md``).

A benchmark is a report, not a test: nothing here looks at a time. What is checked is that
the script drives real ``tether worker`` processes against the test server, that every
session ends with exactly one effect, and that the machine's CPU is split and bounded as
the closing notes quote it (the parts add up to no more than the whole).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pgkit import CLUSTER_ENV, server_url

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_fleet.py"
NUMBER = r"(\d+(?:\.\d+)?)"


def test_a_short_run_prints_every_figure(tmp_path: Path) -> None:
    url = server_url()
    done = subprocess.run(
        [sys.executable, str(BENCH), url, "--sessions", "100", "--delay", "0.2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "finished 100/100; effects: exactly one in 100, none in 0, more than one in 0" in out
    assert re.search(r"wall \d+\.\d s, ideal 0\.4 s \(\d+\.\d\dx\)", out), out
    assert re.search(r"facts/s \d+, commits/s \d+; bare INSERT\+COMMIT loop \d+/s", out), out
    split = re.search(
        rf"the machine's CPU over the wall {NUMBER} s \((\d+) cores\): the workers' own "
        rf"{NUMBER} s, their bash calls {NUMBER} s, PostgreSQL {NUMBER} s, this script "
        rf"\(model server, sampler\) {NUMBER} s, the rest {NUMBER} s",
        out,
    )
    assert split, out
    whole, _cores, *parts = (float(x) for x in split.groups())
    # The parts are measured apart (/proc, wait4, the script's own clock) and rounded to
    # tenths: together they may exceed the whole by a little, never by much.
    assert sum(parts[:-1]) <= whole + 0.3, out
    assert parts[1] > 0, "100 bash calls took no CPU: the split lost them"
    bounds = re.findall(
        rf"  (.+) could not end before {NUMBER} s: \d+ facts/s, {NUMBER}x the bare loop", out
    )
    assert [who for who, _, _ in bounds] == [
        "workers that took no CPU at all",
        "nothing but the bash calls and PostgreSQL",
        "nothing but PostgreSQL and bare starts of bash",
    ], out
    assert re.search(r"\(a bare start: \d+\.\d\d ms CPU, measured after the fleet\)", out)
    assert re.search(
        r"acceptance \(.*\): finished once PASS, wall (PASS|MISS), connections PASS, RSS PASS",
        out,
    ), out


def test_postgres_cpu_counts_the_servers_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split's PostgreSQL share reads the server's processes: a query that keeps a
    backend busy shows in it (only where the server runs here: a cluster the tests know)."""
    if not os.environ.get(CLUSTER_ENV):
        pytest.skip(f"the server may run elsewhere: {CLUSTER_ENV} is not set")
    spec = importlib.util.spec_from_file_location("bench_fleet", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    busy = "SELECT count(*) FROM generate_series(1, 3000000)"
    with psycopg.connect(server_url()) as conn:
        conn.execute("SELECT 1")
        # A live backend, busy between the two readings.
        before, start = bench._postgres_cpu(), time.perf_counter()
        conn.execute(busy).fetchone()
        used, took = bench._postgres_cpu() - before, time.perf_counter() - start
    # A CPU-bound query's backend is on a core for much of its wall time, however busy the
    # machine (/proc counts in ticks of 10 ms: hence the floor).
    assert used >= max(0.3 * took, 0.05), f"{used:.2f} CPU-s seen in {took:.2f} s"
    # A backend that is gone by the second reading: its CPU is in what the postmaster reaped.
    before, start = bench._postgres_cpu(), time.perf_counter()
    with psycopg.connect(server_url()) as conn:
        conn.execute(busy).fetchone()
    time.sleep(0.2)  # the postmaster reaps the backend once it has exited
    used, took = bench._postgres_cpu() - before, time.perf_counter() - start - 0.2
    assert used >= max(0.3 * took, 0.05), f"{used:.2f} CPU-s seen in {took:.2f} s"
