"""The suite's own collection rules (tests/conftest.py): under ``make test``'s pytest-xdist,
every PostgreSQL test is in the ``postgres`` group (one worker, in order), because the
restart test stops the server under any PostgreSQL test running beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Collected in a child pytest: a plugin writes each item's node id and its xdist group.
PLUGIN = """
import json, os

def pytest_collection_finish(session):
    rows = []
    for item in session.items:
        marks = [m.args[0] for m in item.iter_markers("xdist_group")]
        rows.append([item.nodeid, marks])
    with open(os.environ["LAYOUT_OUT"], "w") as out:
        json.dump(rows, out)
"""


def _groups(tmp_path: Path, *files: str) -> dict[str, list[str]]:
    (tmp_path / "layout_plugin.py").write_text(PLUGIN)
    out = tmp_path / "items.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LAYOUT_OUT": str(out)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "layout_plugin",
            "-p",
            "no:cacheprovider",
            *(str(TESTS / name) for name in files),
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {nodeid: marks for nodeid, marks in json.loads(out.read_text())}


def test_postgres_tests_share_one_group_and_others_none(tmp_path: Path) -> None:
    groups = _groups(tmp_path, "test_pg_workers.py", "test_seams.py", "test_framing.py")
    restart = [n for n in groups if n.endswith("test_workers_survive_a_postgres_restart")]
    assert restart and groups[restart[0]] == ["postgres"]
    for nodeid, marks in groups.items():
        if "test_pg_workers.py" in nodeid or "postgres" in nodeid:
            assert marks == ["postgres"], nodeid
        else:
            assert marks == [], nodeid
    # Both kinds exist in test_seams.py: the store/database parameters other than postgres
    # stay free to run on any worker.
    seams = [n for n in groups if "test_seams.py" in n]
    assert any("postgres" in n for n in seams) and any("postgres" not in n for n in seams)
