"""The loop benchmark still runs and prints every figure it promises (``bench/README.md``).

A benchmark is a report, not a test: no time is looked at. What is checked is that the
script works against the current code, that each figure line is there, and that tether and
the floor each kept one connection to the scripted server for the whole run (the peers,
installed or not, are left out).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_loop.py"


def test_a_short_run_prints_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "4", "--process", "--no-peers"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for system in ("floor", "tether"):
        assert re.search(rf"^{system} +\d+\.\d\d +\d+\.\d\d +\d+\.\d\dx$", out, re.M), out
    for figure in ("loop.turn", "loop.last50", "loop.growth"):
        assert re.search(rf"^{figure} +tether/floor +\d+\.\d\dx", out, re.M), out
    assert "connections accepted: 2 " in out  # one kept-alive connection each
