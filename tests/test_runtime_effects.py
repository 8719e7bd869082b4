"""Recovery from the truth: journaled file tools and effect tools after SIGKILL.

Each test crashes a real child process at a named boundary (``TETHER_CRASH_AT``),
then resumes in new processes and checks that the effect happened exactly once
where its outcome can be established, and that review takes over where it cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.core import reduce_session
from tether.core.state import IdleOperation
from tether.testing.ledger import ReportLedger

CHILD = Path(__file__).resolve().parent / "effects_child.py"
SRC = Path(__file__).resolve().parent.parent / "src"

PUBLISH_SCRIPT = {
    "model": "scripted/effects",
    "responses": [
        {
            "tool_calls": [
                {"name": "publish_report", "arguments": {"title": "Q3", "body": "All good."}}
            ],
            "finish_reason": "tool_calls",
        },
        {"content": "Published.", "finish_reason": "stop"},
    ],
}
WRITE_SCRIPT = {
    "model": "scripted/effects",
    "responses": [
        {
            "tool_calls": [
                {"name": "write", "arguments": {"path": "notes.txt", "content": "after\n"}}
            ],
            "finish_reason": "tool_calls",
        },
        {"content": "Written.", "finish_reason": "stop"},
    ],
}


def child(
    mode: str, workspace: Path, *extra: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TETHER_CRASH_AT", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    if crash_at is not None:
        env["TETHER_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, str(CHILD), mode, str(workspace), str(workspace / "script.json"), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def setup(tmp_path: Path, script: dict[str, Any]) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "script.json").write_text(json.dumps(script))
    return workspace


def session_of(workspace: Path) -> tuple[str, Path]:
    (log,) = (workspace / ".tether" / "sessions").glob("*.jsonl")
    return log.stem.split("_", 1)[1], log


def crash_then_resume(
    workspace: Path, crash_at: str, *extra: str
) -> tuple[dict[str, Any], Path, str]:
    crashed = child("run", workspace, *extra, crash_at=crash_at)
    assert crashed.returncode == -9, crashed.stderr
    session, log = session_of(workspace)
    resumed = child("resume", workspace, session, *extra)
    assert resumed.returncode == 0, resumed.stderr
    return json.loads(resumed.stdout), log, session


def assert_second_resume_appends_nothing(workspace: Path, log: Path, session: str) -> None:
    before = log.read_bytes()
    again = child("resume", workspace, session)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "idle"
    assert log.read_bytes() == before


def tool_results(log: Path) -> list[dict[str, Any]]:
    state = reduce_session(log.read_bytes())
    assert isinstance(state.operation, IdleOperation)
    return [m for m in state.transcript if m["role"] == "tool"]


@pytest.mark.parametrize("boundary", ["ledger.committed", "after_effect"])
def test_publish_committed_before_the_crash_is_recovered_from_the_ledger(
    tmp_path: Path, boundary: str
) -> None:
    workspace = setup(tmp_path, PUBLISH_SCRIPT)
    result, log, session = crash_then_resume(workspace, boundary)
    assert result["status"] == "completed"
    (event,) = result["events"]
    assert event["verdict"] == "committed" and event["recoveredFromLedger"] is True
    ledger = ReportLedger.for_workspace(workspace)
    assert ledger.count_all() == 1 and ledger.duplicate_effects() == 0
    (tool,) = tool_results(log)
    assert tool["content"].startswith('Published report "Q3"')
    assert_second_resume_appends_nothing(workspace, log, session)
    assert ledger.count_all() == 1


def test_publish_not_committed_is_executed_exactly_once(tmp_path: Path) -> None:
    workspace = setup(tmp_path, PUBLISH_SCRIPT)
    result, log, session = crash_then_resume(workspace, "before_effect")
    assert result["status"] == "completed"
    assert result["events"][0]["verdict"] == "notFound"
    ledger = ReportLedger.for_workspace(workspace)
    assert ledger.count_all() == 1
    assert_second_resume_appends_nothing(workspace, log, session)
    assert ledger.count_all() == 1


def test_publish_with_a_failing_lookup_goes_to_review_then_resolves(tmp_path: Path) -> None:
    workspace = setup(tmp_path, PUBLISH_SCRIPT)
    result, log, session = crash_then_resume(workspace, "after_effect", "--lookup", "raise")
    assert result["status"] == "blocked" and result["blockedReason"] == "review_required"
    assert "tether review" in result["message"]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    listed = subprocess.run(
        [sys.executable, "-m", "tether", "review", "--json"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)
    assert "unreachable" in item["reason"]
    # Still blocked on a second resume: nothing appended, nothing executed.
    before = log.read_bytes()
    again = child("resume", workspace, session, "--lookup", "raise")
    assert json.loads(again.stdout)["status"] == "blocked"
    assert log.read_bytes() == before
    resolved = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "review",
            "resolve",
            str(item["id"]),
            "--applied",
            "--note",
            "checked the ledger by hand",
        ],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert resolved.returncode == 0, resolved.stderr
    assert "appended" in resolved.stdout
    final = child("resume", workspace, session, "--lookup", "raise")
    assert json.loads(final.stdout)["status"] == "completed"
    assert ReportLedger.for_workspace(workspace).count_all() == 1
    (tool,) = tool_results(log)
    assert "confirmed as applied in review" in tool["content"]


def test_effect_tool_without_lookup_is_interrupted_as_the_spec_says(tmp_path: Path) -> None:
    workspace = setup(tmp_path, PUBLISH_SCRIPT)
    result, log, _ = crash_then_resume(workspace, "before_effect", "--lookup", "none")
    assert result["status"] == "completed"
    (tool,) = tool_results(log)
    assert tool["content"].startswith("Operation interrupted")
    assert ReportLedger.for_workspace(workspace).count_all() == 0


@pytest.mark.parametrize(
    ("boundary", "verdict"),
    [
        ("journal.intent_recorded", "notApplied"),
        ("tools.apply.before_replace", "notApplied"),
        ("tools.apply.after_replace", "applied"),
        ("after_effect", "applied"),
        # The intent is recorded (authorized) before toolStarted, so it is there.
        ("before_effect", "notApplied"),
    ],
)
def test_write_is_reconciled_against_the_journal(
    tmp_path: Path, boundary: str, verdict: str
) -> None:
    workspace = setup(tmp_path, WRITE_SCRIPT)
    (workspace / "notes.txt").write_text("before\n")
    result, log, session = crash_then_resume(workspace, boundary)
    assert result["status"] == "completed"
    assert result["events"][0]["verdict"] == verdict
    assert (workspace / "notes.txt").read_text() == "after\n"
    assert not [p for p in workspace.iterdir() if p.name.endswith(".tether-tmp")]
    assert_second_resume_appends_nothing(workspace, log, session)


def test_file_changed_during_the_crash_window_goes_to_review(tmp_path: Path) -> None:
    workspace = setup(tmp_path, WRITE_SCRIPT)
    (workspace / "notes.txt").write_text("before\n")
    crashed = child("run", workspace, crash_at="journal.intent_recorded")
    assert crashed.returncode == -9
    (workspace / "notes.txt").write_text("someone else\n")
    session, log = session_of(workspace)
    resumed = json.loads(child("resume", workspace, session).stdout)
    assert resumed["status"] == "blocked" and resumed["blockedReason"] == "review_required"
    assert resumed["events"][0]["verdict"] == "conflict"
    assert (workspace / "notes.txt").read_text() == "someone else\n"  # never overwritten
    env = dict(os.environ, PYTHONPATH=str(SRC))
    listed = subprocess.run(
        [sys.executable, "-m", "tether", "review", "--json"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    (item,) = json.loads(listed.stdout)
    assert item["evidence"]  # both hashes and the evidence copy are kept
    resolved = subprocess.run(
        [sys.executable, "-m", "tether", "review", "resolve", str(item["id"]), "--not-applied"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert resolved.returncode == 0, resolved.stderr
    final = json.loads(child("resume", workspace, session).stdout)
    assert final["status"] == "completed"
    (tool,) = tool_results(log)
    assert tool["content"].startswith("Error: the call did not take effect")
    assert (workspace / "notes.txt").read_text() == "someone else\n"
    missing = subprocess.run(
        [sys.executable, "-m", "tether", "review", "resolve", "999", "--applied"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 22 and missing.stderr.count("\n") == 1
