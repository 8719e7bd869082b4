"""The resume benchmark still runs and prints every figure it promises (``bench/README.md``).

A benchmark is a report, not a test: no time is looked at. What is checked is that the
script works against the current code and that each line names what it measures, so the
figures in the README can be reproduced.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_resume.py"

FIGURES = (
    "resume.orjson",
    "resume.json",
    "resume.tether.open",
    "resume.tether.read_only",
    "resume.tether.reduce",
    "resume.tether.checkpoint.write",
    "resume.tether.checkpoint.full",
    "resume.tether.resume",
    "resume.Agent(...)",
    "startup.import",
    "startup.runtime",
    "startup.first_agent_scripted",
    "startup.first_agent_openai",
    "startup.total_scripted",
    "startup.total_openai",
    "startup.floor",
)


def test_a_short_run_prints_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "5", "--repeat", "1", "--starts", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line[:1].isalpha()}
    for figure in FIGURES:
        assert re.search(r" \d+\.\d ms", lines[figure]), figure
    # Measured when the Agents SDK is importable (or --agents-python), said so when not.
    assert "resume.agents.SQLiteSession" in lines
    verdicts = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "MISS"))]
    assert [v.split(":")[0].split(None, 1)[1] for v in verdicts][:5] == [
        "open vs orjson.loads",
        "import tether",
        "Agent(...) warm",
        "import tether + first Agent(...), scripted",
        "import tether + first Agent(...), OpenAI-compatible",
    ]
