"""The split of ``make test`` (Makefile): the suite on every core with ``-m 'not serial'``,
then ``-m serial`` alone. The serial part is exactly the tests that stop a service the others
share, and every test is in one part or the other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESTARTS = {
    "tests/test_pg_workers.py::test_workers_survive_a_postgres_restart",
    "tests/test_pg_fleet.py::test_many_sessions_in_flight_survive_a_postgres_restart",
    "tests/test_pg_fleet.py::test_a_worker_started_before_its_database_waits_for_it",
}


def _collected(*options: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_serial_part_is_the_restart_tests_and_the_parts_cover_the_suite() -> None:
    serial = _collected("-m", "serial")
    parallel = _collected("-m", "not serial")
    everything = _collected()
    assert serial == RESTARTS
    assert not serial & parallel
    assert serial | parallel == everything
