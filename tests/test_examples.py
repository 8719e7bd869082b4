"""Every script and scripted model in ``examples/`` runs, so the examples the README and
the docs point at never go stale.

Each script runs as a user would run it (``python examples/NAME.py``) in a fresh folder
holding a copy of ``examples/`` and the README, and what it prints is checked against its
``# expected`` comments; the workspaces the docs' console examples use
(``examples/policy``, ``verify``, ``nested``, ``mcp``) are run by
``tests/test_docs_examples.py``. Every file of ``examples/`` must be used by one of the two.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_run import cli_env
from tether.core.reducer import Reducer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def copy_examples(into: Path) -> Path:
    shutil.copytree(EXAMPLES, into / "examples")
    shutil.copy(ROOT / "README.md", into / "README.md")
    return into


def run_example(name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, f"examples/{name}"],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def expected_comments(path: Path) -> list[str]:
    """The ``# expected`` comment of every top-level ``print(...)`` of a script."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("print(") and "  # " in line:
            out.append(line.rsplit("  # ", 1)[1].strip())
    return out


def matches(printed: str, expected: str) -> bool:
    """``...``/``…`` in an expected comment stand for anything after it."""
    for mark in ("...", "…"):
        if mark in expected:
            return printed.startswith(expected.split(mark, 1)[0].rstrip())
    return printed == expected


def tool_results(workspace: Path) -> list[dict[str, object]]:
    [log] = (workspace / ".tether" / "sessions").glob("*.jsonl")
    state = Reducer.load(log.read_bytes()).state
    return [m for m in state.transcript if m.get("role") == "tool"]


def test_the_examples_folder_has_what_the_docs_name() -> None:
    assert SCRIPTS == ["effect_tool.py", "run_agent.py", "typed_tool.py"]
    for workspace in ("policy", "verify", "nested", "mcp"):
        assert (EXAMPLES / workspace / "tether.toml").is_file(), workspace
    for script in EXAMPLES.rglob("*.json"):
        json.loads(script.read_text(encoding="utf-8"))  # every scripted model parses


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_example_script_prints_what_its_comments_say(name: str, tmp_path: Path) -> None:
    workspace = copy_examples(tmp_path)
    ran = run_example(name, workspace)
    assert ran.returncode == 0, ran.stderr
    printed = [line for line in ran.stdout.splitlines() if not line.startswith("{")]
    expected = expected_comments(EXAMPLES / name)
    assert len(printed) == len(expected), (printed, expected)
    for got, want in zip(printed, expected, strict=True):
        assert matches(got, want), (got, want)
    if name == "run_agent.py":
        events = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
        kinds = [event["event"] for event in events]
        assert "session" in kinds and "tool_finished" in kinds
        assert all("_" not in key for event in events for key in event)  # camelCase
        ledger = workspace / ".tether" / "ledger.db"
        assert ledger.is_file()  # publish_report wrote its one row there
    if name == "typed_tool.py":
        first, second = tool_results(workspace)
        assert "HI!" in str(first["content"]), first
        # The wrong-typed call is not run; the model reads why.
        assert "Input should be a valid string" in str(second), second
