"""Evidence that must exist is proven present: a lost or replaced ``effects.db`` after a crash.

Real processes (the ``tether`` CLI, and ``tests/evidence_child.py`` where a person must be
simulated) are killed with ``SIGKILL`` at named boundaries. Then ``.tether/effects.db`` is
deleted (what the corrupt-database message used to suggest), replaced by a freshly created
database, by one from another workspace, or by an old backup. Recovery must never read "no
record" as "nothing happened": a journaled call goes to review and the file is left exactly
as it is; a recorded ``deny`` never becomes a run; a lost verification reads ``missing``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.effects.db import EffectsDB, effects_db_path
from tether.effects.journal import ActionJournal
from tether.session import reduce_session
from tether.session.state import IdleOperation

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "evidence_child.py"
KILLED = -signal.SIGKILL
EXIT_BLOCKED = 65  # what `tether resume` exits with when recovery waits for a review

# Reproduction first: recovery reads a missing journal row as "not applied" and re-runs.
pytestmark = pytest.mark.xfail(
    strict=True, reason="issue 11: a lost effects.db is read as 'nothing happened'"
)

BEFORE = "counter=1\n"
AFTER = "counter=1+1\n"
TWICE = "counter=1+1+1\n"  # the edit applied a second time
EDIT = {
    "id": "e",
    "name": "edit",
    "arguments": {"path": "c.txt", "old_string": "counter=1", "new_string": "counter=1+1"},
}
WRITE = {"id": "w", "name": "write", "arguments": {"path": "c.txt", "content": AFTER}}

JOURNAL_BOUNDARIES = [
    "before_effect",
    "journal.intent_recorded",
    "tools.apply.before_replace",
    "tools.apply.after_replace",
    "journal.change_applied",
    "after_effect",
]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def tether(*args: str, cwd: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = {"TETHER_CRASH_AT": crash_at, "TETHER_CRASH_MODE": "kill"} if crash_at else {}
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=cli_env(**extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def child(
    mode: str, ws: Path, *extra: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = cli_env(
        **({"TETHER_CRASH_AT": crash_at, "TETHER_CRASH_MODE": "kill"} if crash_at else {})
    )
    return subprocess.run(
        [sys.executable, str(CHILD), mode, str(ws), str(ws / "script.json"), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def script(*responses: dict[str, Any]) -> dict[str, Any]:
    return {"model": "scripted/evidence", "responses": list(responses)}


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    return {"content": "", "tool_calls": list(items), "finish_reason": "tool_calls"}


DONE = {"content": "done", "finish_reason": "stop"}


def make_workspace(tmp_path: Path, steps: dict[str, Any], name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    (ws / "c.txt").write_text(BEFORE)
    (ws / "script.json").write_text(json.dumps(steps))
    return ws.resolve()


def only_session(ws: Path) -> tuple[str, Path]:
    (log,) = (ws / ".tether" / "sessions").glob("*.jsonl")
    return log.stem.split("_", 1)[1], log


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def delete_effects_db(ws: Path) -> None:
    for path in (ws / ".tether").glob("effects.db*"):
        path.unlink()


def foreign_effects_db(tmp_path: Path) -> Path:
    """A used effects.db of another workspace: other session, other rows, other identity."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    with EffectsDB.open_workspace(other) as db:
        ActionJournal(db).record_intent(
            "018f0000-0000-7000-8000-00000000beef", "op-elsewhere", "c.txt", None, "sha256:00", "d"
        )
    return effects_db_path(other)  # closed: the WAL is checkpointed into the file


def lose_effects_db(ws: Path, how: str, tmp_path: Path) -> None:
    """``lost``: deleted; ``fresh``: replaced by a freshly created one; ``other``: replaced
    by the database of another workspace."""
    delete_effects_db(ws)
    target = effects_db_path(ws)
    if how == "fresh":
        EffectsDB.open(target).close()
    elif how == "other":
        shutil.copyfile(foreign_effects_db(tmp_path), target)
        os.chmod(target, 0o600)
    else:
        assert how == "lost"


def review_items(ws: Path) -> list[dict[str, Any]]:
    listed = tether("review", "--json", cwd=ws)
    assert listed.returncode == 0, listed.stderr
    items: list[dict[str, Any]] = json.loads(listed.stdout)
    return items


def tool_results(log: Path) -> list[str]:
    state = reduce_session(log.read_bytes())
    assert isinstance(state.operation, IdleOperation), state.operation
    return [m["content"] for m in state.transcript if m["role"] == "tool"]


# =========================================================================== journaled calls

CASES = [
    *(
        ("edit", boundary, how)
        for boundary in JOURNAL_BOUNDARIES
        for how in ("lost", "fresh", "other")
    ),
    *(
        ("write", boundary, how)
        for boundary, how in zip(JOURNAL_BOUNDARIES, ["lost", "other", "fresh"] * 2, strict=True)
    ),
]


@pytest.mark.parametrize(("tool", "boundary", "how"), CASES)
def test_lost_or_replaced_effects_db_sends_the_pending_call_to_review(
    tmp_path: Path, tool: str, boundary: str, how: str
) -> None:
    ws = make_workspace(tmp_path, script(calls(EDIT if tool == "edit" else WRITE), DONE))
    model = "scripted:script.json"
    crashed = tether("run", "--model", model, "go", cwd=ws, crash_at=boundary)
    assert crashed.returncode == KILLED, crashed.stderr
    session, log = only_session(ws)
    state = (ws / "c.txt").read_bytes()
    assert state in (BEFORE.encode(), AFTER.encode())
    lose_effects_db(ws, how, tmp_path)

    resumed = tether("resume", "--model", model, session, cwd=ws)
    assert (ws / "c.txt").read_bytes() == state  # byte for byte: nothing was re-applied
    assert resumed.returncode == EXIT_BLOCKED, (resumed.stdout, resumed.stderr)
    assert "review" in resumed.stderr
    (item,) = review_items(ws)
    assert item["sessionId"] == session and item["toolName"] == tool
    evidence = item["evidence"]
    assert evidence["missing"] == "effectsDatabase"
    assert evidence["currentHash"] == sha256(state)
    assert evidence["path"] == "c.txt"
    assert evidence["expectedDb"] and evidence["expectedDb"] != evidence["foundDb"]
    assert "effects database" in item["reason"]

    # Still blocked on a second resume: nothing appended, nothing written.
    before = log.read_bytes()
    again = tether("resume", "--model", model, session, cwd=ws)
    assert again.returncode == EXIT_BLOCKED
    assert log.read_bytes() == before and (ws / "c.txt").read_bytes() == state

    decision = "--applied" if state == AFTER.encode() else "--not-applied"
    resolved = tether("review", "resolve", str(item["id"]), decision, cwd=ws)
    assert resolved.returncode == 0, resolved.stderr
    final = tether("resume", "--model", model, session, cwd=ws)
    assert final.returncode == 0, final.stderr
    assert (ws / "c.txt").read_bytes() == state
    (result,) = tool_results(log)
    if decision == "--applied":
        assert "confirmed as applied in review" in result
    else:
        assert result.startswith("Error: the call did not take effect")
    assert (ws / "c.txt").read_text() != TWICE


def test_the_reported_bug_edit_is_not_applied_twice(tmp_path: Path) -> None:
    """The report: crash after the file changed, delete effects.db*, resume."""
    ws = make_workspace(tmp_path, script(calls(EDIT), DONE))
    model = "scripted:script.json"
    crashed = tether("run", "--model", model, "go", cwd=ws, crash_at="journal.change_applied")
    assert crashed.returncode == KILLED
    assert (ws / "c.txt").read_text() == AFTER
    delete_effects_db(ws)
    session, _ = only_session(ws)
    resumed = tether("resume", "--model", model, session, cwd=ws)
    assert (ws / "c.txt").read_text() == AFTER  # was counter=1+1+1
    assert resumed.returncode == EXIT_BLOCKED
