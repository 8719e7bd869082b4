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

from tether._effects.journal import ActionJournal
from tether._effects.review import ReviewStore
from tether._wsdb.sqlite import EffectsDB, effects_db_path
from tether.core import reduce_session
from tether.core.state import IdleOperation
from tether.testing.ledger import ReportLedger

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "evidence_child.py"
KILLED = -signal.SIGKILL
EXIT_BLOCKED = 65  # what `tether resume` exits with when recovery waits for a review

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


def review_items(ws: Path, *, cli: bool = False) -> list[dict[str, Any]]:
    """The open review items (``cli``: as ``tether review --json`` lists them)."""
    if cli:
        listed = tether("review", "--json", cwd=ws)
        assert listed.returncode == 0, listed.stderr
        items: list[dict[str, Any]] = json.loads(listed.stdout)
        return items
    with EffectsDB.open_workspace(ws) as db:
        return [item.to_json() for item in ReviewStore(db).list_open()]


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
    (item,) = review_items(ws, cli=how == "lost")
    assert item["sessionId"] == session and item["toolName"] == tool
    evidence = item["evidence"]
    assert evidence["missing"] == "effectsDatabase"
    assert evidence["currentHash"] == sha256(state)
    assert evidence["path"] == "c.txt"
    assert evidence["expectedDb"] and evidence["expectedDb"] != evidence["foundDb"]
    assert "effects database" in item["reason"]

    if how == "lost":  # still blocked on a second resume: nothing appended, nothing written
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


def test_an_old_backup_without_the_row_sends_the_call_to_review(tmp_path: Path) -> None:
    """Same database identity, but restored from a copy made before the call's intent."""
    second = {
        "id": "e2",
        "name": "edit",
        "arguments": {"path": "c.txt", "old_string": "counter=1+1", "new_string": "counter=1+1+1"},
    }
    ws = make_workspace(tmp_path, script(calls(EDIT), calls(second), DONE))
    crashed = child("run", ws, crash_at="after_result")  # the first edit is answered
    assert crashed.returncode == KILLED, crashed.stderr
    backup = tmp_path / "backup.db"
    with EffectsDB.open_workspace(ws) as db:
        db.query("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copyfile(db.path, backup)
    session, _ = only_session(ws)
    crashed = child("resume", ws, session, crash_at="after_effect")  # the second edit ran
    assert crashed.returncode == KILLED, crashed.stderr
    assert (ws / "c.txt").read_text() == TWICE  # the second edit, applied once
    delete_effects_db(ws)
    shutil.copyfile(backup, effects_db_path(ws))

    resumed = json.loads(child("resume", ws, session).stdout)
    assert resumed["status"] == "blocked" and resumed["blockedReason"] == "review_required"
    assert resumed["events"][0]["verdict"] == "noRecord"
    assert (ws / "c.txt").read_text() == TWICE  # not applied a second time
    (item,) = review_items(ws)
    assert item["evidence"]["missing"] == "journalRow"
    assert item["evidence"]["currentHash"] == sha256(TWICE.encode())
    assert "no record of this call" in item["reason"]


def test_crash_before_tool_started_is_started_again_and_applied_once(tmp_path: Path) -> None:
    """journal.intent_prepared: the intent is durable, toolStarted is not: the log proves
    the file was never touched, so the call starts again (under a new operation id)."""
    ws = make_workspace(tmp_path, script(calls(EDIT), DONE))
    crashed = child("run", ws, crash_at="journal.intent_prepared")
    assert crashed.returncode == KILLED, crashed.stderr
    assert (ws / "c.txt").read_text() == BEFORE
    session, log = only_session(ws)
    resumed = json.loads(child("resume", ws, session).stdout)
    assert resumed["status"] == "completed"
    assert (ws / "c.txt").read_text() == AFTER
    (result,) = tool_results(log)
    assert result == "Edited c.txt: replaced 1 occurrence"
    with EffectsDB.open_workspace(ws) as db:
        statuses = sorted(row.status.value for row in ActionJournal(db).rows(session))
    assert statuses == ["authorized", "succeeded"]  # the first intent never started


@pytest.mark.parametrize("terminal", [False, True])
def test_crash_before_tool_started_with_a_lost_db_never_counts_as_allowed(
    tmp_path: Path, terminal: bool
) -> None:
    """A call that may have been decided before the crash, whose record may be lost, is
    not allowed by default: without a terminal it is denied, with one the person is asked."""
    ws = make_workspace(tmp_path, script(calls(EDIT), DONE))
    crashed = child("run", ws, crash_at="journal.intent_prepared")
    assert crashed.returncode == KILLED, crashed.stderr
    delete_effects_db(ws)
    session, log = only_session(ws)
    extra = ("--ask", "yes") if terminal else ()
    resumed = json.loads(child("resume", ws, session, *extra).stdout)
    assert resumed["status"] == "completed"
    (result,) = tool_results(log)
    if terminal:
        assert (ws / "c.txt").read_text() == AFTER  # asked again, allowed, applied once
        asked = (tmp_path / "asked.txt").read_text()
        assert asked.startswith("edit edit c.txt [no authorization record")
    else:
        assert (ws / "c.txt").read_text() == BEFORE
        assert result.startswith("Error: permission denied")
        assert "lost with the effects database" in result


BASH = {"id": "b", "name": "bash", "arguments": {"command": "echo 1 >> runs.txt"}}


@pytest.mark.parametrize("loss", ["kept", "lost", "fresh"])
def test_a_persons_deny_before_a_crash_never_becomes_a_run(tmp_path: Path, loss: str) -> None:
    """The REPL asks, the person says no, the process dies before toolStarted (boundary
    ``authorized``); a resume where nobody can be asked must not run the command — whether
    the decision's record is still there or was lost with effects.db."""
    ws = make_workspace(tmp_path, script(calls(BASH), DONE))
    crashed = child("run", ws, "--ask", "no", "--repl", crash_at="authorized")
    assert crashed.returncode == KILLED, crashed.stderr
    assert (tmp_path / "asked.txt").read_text().startswith("bash echo 1 >> runs.txt")
    if loss != "kept":
        lose_effects_db(ws, loss, tmp_path)
    session, log = only_session(ws)
    resumed = json.loads(child("resume", ws, session).stdout)  # no terminal, no policy
    assert resumed["status"] == "completed"
    assert not (ws / "runs.txt").exists()  # never ran
    (result,) = tool_results(log)
    assert result.startswith("Error: permission denied")
    if loss == "kept":
        assert "declined at the terminal" in result  # the person's answer stands


def test_a_deny_rule_denies_whatever_happened_to_the_db(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, script(calls(BASH), DONE))
    (ws / "tether.toml").write_text('[[policy.bash]]\npattern = "*runs.txt*"\ndecision = "ask"\n')
    crashed = child("run", ws, "--ask", "yes", crash_at="authorized")
    assert crashed.returncode == KILLED, crashed.stderr
    delete_effects_db(ws)
    (ws / "tether.toml").write_text(
        '[[policy.bash]]\npattern = "*runs.txt*"\ndecision = "deny"\nreason = "no"\n'
    )
    session, log = only_session(ws)
    resumed = json.loads(child("resume", ws, session, "--ask", "yes").stdout)
    assert resumed["status"] == "completed"
    assert not (ws / "runs.txt").exists()
    (result,) = tool_results(log)
    assert result.startswith("Error: permission denied") and "runs.txt" in result


def test_a_lost_verification_reads_missing(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, script(DONE))
    (ws / "tether.toml").write_text('[verify]\ncommand = "grep -q counter c.txt"\n')
    passed = tether("verify", cwd=ws)
    assert passed.returncode == 0, passed.stderr
    assert tether("verify", "--status", cwd=ws).returncode == 0
    delete_effects_db(ws)
    status = tether("verify", "--status", "--json", cwd=ws)
    assert status.returncode == 1, status.stderr  # not verified
    assert json.loads(status.stdout)["status"] == "missing"


PUBLISH = {"id": "p", "name": "publish_report", "arguments": {"title": "Q3", "body": "ok"}}


def test_an_effect_tools_pending_call_goes_to_review_when_the_db_was_replaced(
    tmp_path: Path,
) -> None:
    """The session's review decisions live in effects.db; the service's own ledger is its
    truth and is shown to the reviewer, but a replaced database is not read as "no review"."""
    ws = make_workspace(tmp_path, script(calls(EDIT), calls(PUBLISH), DONE))
    crashed = child("run", ws, crash_at="ledger.committed")
    assert crashed.returncode == KILLED, crashed.stderr
    ledger_path = ws / ".tether" / "ledger.db"
    assert ReportLedger(ledger_path).count_all() == 1
    lose_effects_db(ws, "other", tmp_path)
    session, log = only_session(ws)
    resumed = json.loads(child("resume", ws, session).stdout)
    assert resumed["status"] == "blocked" and resumed["blockedReason"] == "review_required"
    (item,) = review_items(ws)
    assert item["toolName"] == "publish_report"
    assert item["evidence"]["missing"] == "effectsDatabase"
    assert item["evidence"]["lookup"]["status"] == "committed"  # what the service says
    resolved = tether("review", "resolve", str(item["id"]), "--applied", cwd=ws)
    assert resolved.returncode == 0, resolved.stderr
    final = json.loads(child("resume", ws, session).stdout)
    assert final["status"] == "completed"
    assert ReportLedger(ledger_path).count_all() == 1  # published once
    results = tool_results(log)
    assert len(results) == 2 and "confirmed as applied in review" in results[1]


def test_an_idle_session_is_bound_to_the_new_db_before_its_next_run(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, script(calls(EDIT), DONE))
    crashed = child("run", ws, crash_at="after_effect")
    assert crashed.returncode == KILLED, crashed.stderr
    delete_effects_db(ws)
    session, log = only_session(ws)
    blocked = json.loads(child("resume", ws, session).stdout)
    assert blocked["blockedReason"] == "review_required"
    (item,) = review_items(ws)
    assert tether("review", "resolve", str(item["id"]), "--applied", cwd=ws).returncode == 0
    assert json.loads(child("resume", ws, session).stdout)["status"] == "completed"
    sidecar = json.loads((log.parent / f".{session}.evidence.json").read_text())
    with EffectsDB.open_workspace(ws) as db:
        current = db.identity
    assert sidecar["effectsDb"] != current  # still the lost one: the session was not idle

    # A new run in the session: bound to the current database first, then a crash in its
    # edit is reconciled from the journal again (no review).
    again = {
        "id": "e3",
        "name": "edit",
        "arguments": {"path": "c.txt", "old_string": "1+1", "new_string": "2"},
    }
    (ws / "script.json").write_text(json.dumps(script(calls(EDIT), DONE, calls(again), DONE)))
    model = "scripted:script.json"
    crashed = tether("run", "--model", model, "--session", session, "more", cwd=ws,
                     crash_at="after_effect")  # fmt: skip
    assert crashed.returncode == KILLED, crashed.stderr
    sidecar = json.loads((log.parent / f".{session}.evidence.json").read_text())
    assert sidecar["effectsDb"] == current
    # The first resume found the database missing (and created it); this process finds
    # another database than the one recorded.
    assert sidecar["replaced"][0]["state"] == "replaced"
    assert sidecar["replaced"][0]["effectsDb"] not in (None, current)
    resumed = tether("resume", "--model", model, session, cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert (ws / "c.txt").read_text() == "counter=2\n"
    assert review_items(ws) == []
