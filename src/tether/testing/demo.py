"""``make demo``: the story first, then the proof.

1. One agent publishes a report through an effect tool and is killed at ``after_effect``:
   the report is published, its result is not in the session log yet.
2. ``tether`` recovers it: the pending call is looked up in the service's ledger and its
   result filled in (``recovered_from_ledger=true``); nothing is published again.
3. The timeline of that one call and the ledger, holding exactly one row.
4. A representative crash lab (``tether crashlab --sample``, under a minute on 2 cores):
   every boundary at least once, the crash points around an effect in every scenario, each
   run recovered and checked, with progress and the time left; it says what it left for
   the whole lab (``make crashlab``, several minutes). The columns are explained before it
   runs, and its last line is ``PASS duplicate_effects=0 …``.

Every step runs the real ``tether`` command in a fresh folder, so the output is exactly what
a user sees. The exit status is the crash lab's (0 PASS).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tether.errors import EXIT_FAILED

__all__ = ["COLUMNS", "main"]

COLUMNS = """\
How to read the crash lab's tables:
  scenarios table (one row per scenario, e.g. an agent that writes files or calls a service)
    runs        crash runs of the scenario (make crashlab: one per boundary and hit it
                reaches; this sample: a few of them, see the line before the runs)
    boundaries  distinct crash points it was killed at (store writes, tool start, effect…)
    effects     effects whose count was checked against the service or the files
    dupl.       effects that happened twice: must be 0
    unknown     calls whose outcome could not be established (they go to review)
    reviews     review items opened for a person instead of guessing
  boundaries table (one row per crash point, all scenarios together)
    N                    the most hits of the boundary in one run (each hit is its own case)
    recovery ms med/max  time of the recovering process, median / slowest
    facts added          facts the recovery appended to the session log
    effects per op id    most times one operation id took effect (≤1 is exactly once)
  The last line sums it up: PASS only if every run recovered with no duplicate effect."""


def _tether(args: Sequence[str], cwd: Path) -> int:
    """Run ``tether ARGS`` in ``cwd`` with this interpreter, output passed through."""
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, check=False).returncode


def _step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    matrix = [] if "--no-matrix" in args else ["crashlab", "--sample"]
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as folder:
        root = Path(folder)
        _step(
            "1. an agent publishes a report and is killed at after_effect (published, not logged)"
        )
        crashed = _tether(["lab", "publish-report", "--reset", "--crash-at", "after_effect"], root)
        print(f"(exit status {crashed}: the injected crash)", flush=True)
        _step("2. recovery: the ledger says it happened, so its result is filled in, not redone")
        if _tether(["lab", "publish-report"], root) != 0:
            return EXIT_FAILED
        _step("3. the timeline of that call, and the ledger: one row")
        if _tether(["lab", "publish-report", "--report"], root) != 0:
            return EXIT_FAILED
        if not matrix:
            return 0
        _step(
            "4. the crash lab, a representative sample: every boundary at least once, "
            "before/after an effect in every scenario (the whole lab: make crashlab)"
        )
        print(COLUMNS, flush=True)
        return _tether(matrix, root)


if __name__ == "__main__":
    raise SystemExit(main())
