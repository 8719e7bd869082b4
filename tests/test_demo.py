"""``make demo`` tells the story (crash, recovery, timeline, one ledger row) and runs a
representative sample of the crash lab (``tether crashlab --sample``: every boundary at least
once, the effect boundaries in every scenario, what is left named) with progress and the time
left; ``make crashlab`` runs the whole lab. The lab prints progress when it is not on a
terminal."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from test_cli_run import cli_env, run_cli
from tether.testing.crashlab.matrix import Case


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


# --------------------------------------------------------------------------- the sample


def _discovery(name: str, hits: list[str]) -> Any:
    from tether.testing.crashlab.matrix import CaseResult, Discovery
    from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS

    scenario = dataclasses.replace(next(iter(BUILTIN_SCENARIOS.values())), name=name)
    seen: Counter[str] = Counter()
    cases = []
    for boundary in hits:
        seen[boundary] += 1
        cases.append(Case(name, boundary, seen[boundary]))
    return Discovery(scenario, list(cases), CaseResult(Case(name, "-", 0)), len(hits), cases)


def test_the_sample_covers_every_boundary_every_scenario_and_each_effect_everywhere() -> None:
    from tether.testing.crashlab.matrix import sample_cases

    store = ["store.before_write"] * 3
    discoveries = [
        _discovery("a", [*store, "before_effect", "after_effect", "run_accepted", *store]),
        _discovery("b", [*store, *["before_effect", "after_effect"] * 3, "authorized"]),
        _discovery("c", [*store, "compaction_x"]),
        _discovery("d", ["run_accepted", "after_result"]),
    ]
    everything = {c for d in discoveries for c in d.cases}
    sample_cases(discoveries)
    chosen = [c for d in discoveries for c in d.cases]
    assert {c for d in discoveries for c in d.left_out} | set(chosen) == everything
    assert not {c for d in discoveries for c in d.left_out} & set(chosen)
    assert {c.boundary for c in chosen} == {c.boundary for c in everything}
    assert all(d.cases for d in discoveries)  # every scenario at least once
    for name in ("a", "b"):
        assert {"before_effect", "after_effect"} <= {
            c.boundary for c in chosen if c.scenario == name
        }
    # The middle hit; the other boundaries go to the scenario with the fewest cases so far.
    assert Case("b", "before_effect", 2) in chosen
    assert Case("c", "store.before_write", 2) in chosen
    assert Case("d", "run_accepted", 1) in chosen and Case("a", "run_accepted", 1) not in chosen
    assert len(chosen) < len(everything)


def test_a_sampled_lab_says_what_it_left_out_and_estimates_the_time(tmp_path: Path) -> None:
    result = run_cli(
        "crashlab", "--sample", "-s", "read-only", "-s", "bash-counter", "-j", "2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr.splitlines()
    # The header is one line however long, never cut by the console's width.
    [header] = [line for line in err if line.startswith("tether crash lab: ")]
    assert "(fork server)" in header or "(fresh interpreters)" in header
    # The lab's bash commands run in the sandbox, as every agent's do.
    assert re.search(r"; sandbox=workspace-write \(bubblewrap [0-9.]+\)$", header), header
    [note] = [line for line in err if line.startswith("representative sample: ")]
    runs = int(result.stdout.splitlines()[-1].rsplit("runs=", 1)[1])
    assert note.startswith(f"representative sample: {runs} of ")
    assert "make crashlab" in note and "before_effect/after_effect in every scenario" in note
    assert any(re.search(r"crash runs: \d+/\d+, about \d+ s left$", line) for line in err)
    assert result.stdout.splitlines()[-1].startswith("PASS duplicate_effects=0 scenarios=2")


def test_make_demo_runs_the_sample_and_make_crashlab_the_whole_lab() -> None:
    from tether.testing import demo

    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "\ncrashlab: .venv\n\t$(BIN)/python -m tether crashlab\n" in makefile
    assert "make crashlab" in makefile
    source = Path(demo.__file__).read_text()
    assert '["crashlab", "--sample"]' in source and "make crashlab" in source
