"""The harness benchmark still runs and prints every figure it promises (``bench/README.md``).

A benchmark is a report, not a test: nothing here looks at a time. What is checked is
that the script works against the current code (it uses the store's sync seam and the
agent's event sink) and that each line says what it measures, so a figure in a closing
note can be reproduced.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_harness.py"


def test_a_short_run_prints_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "6", "--process", "--timeline"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("h")}
    for ratio in ("harness.turn", "harness.growth", "harness.store_commit"):
        assert re.search(r"ratio=\d+\.\d\dx", lines[ratio]), lines[ratio]
    assert "harness.turn.process" in lines and "harness.breakdown" in lines
    # A turn is 4 syncs and the 3 actions they precede (2 model requests and the read),
    # in the order the write-ahead rule requires: each action right after a sync.
    segments = lines["harness.timeline"].split("  ", 2)[2].split(" | ")
    names = [segment.rsplit(" ", 1)[0] for segment in segments]
    assert names == [
        "run->sync",
        "fdatasync",
        "synced->model",
        "model->sync",
        "fdatasync",
        "synced->tool",
        "tool->tool done",
        "tool done->sync",
        "fdatasync",
        "synced->model",
        "model->sync",
        "fdatasync",
        "synced->returned",
    ]
    assert "(info, median us, 5 turns)" in lines["harness.timeline"]
    assert re.search(r"\d+us a turn between the syncs", lines["harness.after_sync"])
