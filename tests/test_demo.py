"""``make demo`` tells the story (crash, recovery, timeline, one ledger row) and the crash
lab prints progress when it is not on a terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_cli_run import cli_env, run_cli


def test_the_demo_story_crashes_recovers_and_shows_one_ledger_row(tmp_path: Path) -> None:
    story = subprocess.run(
        [sys.executable, "-m", "tether.testing.demo", "--no-matrix"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert story.returncode == 0, story.stderr
    out = story.stdout
    assert "killed at after_effect" in out and "(exit status 75" in out
    assert "INJECTED_CRASH boundary=after_effect" in story.stderr
    assert "recovered_from_ledger=true" in out
    assert "timeline:" in out and "effect committed" in out
    assert "ledger_rows=1 results=1" in out
    assert out.rstrip().endswith("PASS duplicate_effects=0")
    assert out.index("1. ") < out.index("2. ") < out.index("3. ")


def test_the_demo_explains_every_matrix_column() -> None:
    from tether.testing.demo import COLUMNS

    for column in ("runs", "boundaries", "effects", "dupl.", "unknown", "reviews", "N"):
        assert f"    {column} " in COLUMNS, column
    for column in ("recovery ms med/max", "facts added", "effects per op id"):
        assert column in COLUMNS


def test_crashlab_prints_progress_when_piped(tmp_path: Path) -> None:
    result = run_cli(
        "crashlab", "--scenario", "read-only", "--boundary", "run_accepted", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "discovering boundaries" in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("crash runs: ")]
    assert lines and lines[-1].split()[-1].split("/")[0] == lines[-1].split("/")[-1]
    assert result.stdout.splitlines()[-1].startswith("PASS duplicate_effects=0")
