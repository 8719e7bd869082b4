"""Crash consistency of the effects layer with real processes and ``SIGKILL``.

A child process runs a journaled write/edit or a ``publish_report`` and is killed — at a
named crash boundary (``TETHER_CRASH_AT``) or at a random moment. The parent then checks:

* a journaled file is in exactly one of the before/after states, never torn, and
  :func:`reconcile_file` says which; recovery (the decision, then at most one execution
  under compare-and-swap) ends in the after state without ever applying the change twice;
* the report ledger holds at most one row per operation id, and the lookup finds it iff it
  was committed; recovery fills in a committed result without executing and executes a
  missing one exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tether._effects.journal import (
    ActionJournal,
    JournalStatus,
    Verdict,
    journaled_run,
    observe_file,
)
from tether._effects.recovery import (
    PendingObservation,
    RecoveryAction,
    decide_pending,
    reconcile_pending,
)
from tether._effects.review import ReviewStore
from tether._tools import EditTool, ToolContext, WriteTool
from tether._tools.builtin import content_hash
from tether._wsdb.sqlite import EffectsDB
from tether.testing.ledger import PublishReportTool, ReportLedger

REPO_ROOT = Path(__file__).resolve().parent.parent

CHILD_FILE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tether._wsdb.sqlite import EffectsDB
    from tether._effects.journal import ActionJournal, journaled_run

    ws, session, op, tool, arguments = sys.argv[1:6]
    db = EffectsDB.open_workspace(ws)
    result = journaled_run(tool, Path(ws), ActionJournal(db), session, op, json.loads(arguments))
    print(json.dumps({"content": result.content, "is_error": result.is_error}), flush=True)
    """
)

CHILD_EDIT_LOOP = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tether._wsdb.sqlite import EffectsDB
    from tether._effects.journal import ActionJournal, journaled_edit

    ws = Path(sys.argv[1])
    journal = ActionJournal(EffectsDB.open_workspace(ws))
    n = int((ws / "counter.txt").read_text().split("=")[1])
    print("ready", flush=True)
    while True:
        arguments = {"path": "counter.txt", "old_string": f"n={n}\\n",
                     "new_string": f"n={n + 1}\\n"}
        result = journaled_edit(ws, journal, "s", f"op-{n:06d}", arguments)
        assert not result.is_error, result.content
        n += 1
        print(f"ack {n}", flush=True)
    """
)

CHILD_PUBLISH = textwrap.dedent(
    """
    import sys, time
    from tether.testing.ledger import ReportLedger

    path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start_at = float(sys.argv[4])
    ledger = ReportLedger(path)
    ledger.db()
    print("ready", flush=True)
    while time.time() < start_at:
        time.sleep(0.0005)
    for i in range(first, first + count):
        op = f"op-{i:06d}"
        publication = ledger.publish(op, f"report {i}", "body")
        print(f"ack {op} {publication.receipt}", flush=True)
    """
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_CRASH")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_child(script: str, *args: str, crash_at: str | None = None) -> subprocess.Popen[bytes]:
    extra = {"TETHER_CRASH_AT": crash_at, "TETHER_CRASH_MODE": "kill"} if crash_at else None
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(extra),
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


# =========================================================================== journaled files

BEFORE = "counter=1\n"
AFTER = "counter=1+1\n"  # applying the edit twice would give counter=1+1+1
EDIT_ARGS = {"path": "sub/c.txt", "old_string": "counter=1", "new_string": "counter=1+1"}
WRITE_ARGS = {"path": "sub/new.txt", "content": AFTER}

# boundary → (file state right after the crash, verdict)
FILE_CASES = [
    ("journal.intent_recorded", "before", Verdict.NOT_APPLIED),
    ("tools.apply.before_replace", "before", Verdict.NOT_APPLIED),
    ("tools.apply.after_replace", "after", Verdict.APPLIED),
    ("journal.change_applied", "after", Verdict.APPLIED),
    (None, "after", Verdict.APPLIED),  # no crash: the journal says succeeded
]


def _temp_files(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return [p.name for p in directory.iterdir() if p.name.endswith(".tether-tmp")]


def _file_state(path: Path) -> str:
    if not path.exists():
        return "absent"
    text = path.read_text()
    return {BEFORE: "before", AFTER: "after"}.get(text, f"torn:{text!r}")


@pytest.mark.parametrize("tool", ["edit", "write"])
@pytest.mark.parametrize(("boundary", "state", "verdict"), FILE_CASES)
def test_journaled_change_killed_at_each_boundary(
    ws: Path, tool: str, boundary: str | None, state: str, verdict: Verdict
) -> None:
    if tool == "edit":
        (ws / "sub").mkdir()
        (ws / "sub/c.txt").write_text(BEFORE)
        arguments, target, before_state = EDIT_ARGS, ws / "sub/c.txt", "before"
    else:
        arguments, target, before_state = WRITE_ARGS, ws / "sub/new.txt", "absent"
    child = run_child(
        CHILD_FILE, str(ws), "s", "op-1", tool, json.dumps(arguments), crash_at=boundary
    )
    out, err = child.communicate(timeout=60)
    if boundary is None:
        assert child.returncode == 0, err.decode()
    else:
        assert child.returncode == -signal.SIGKILL, err.decode()
        assert out == b""  # killed before it could report anything
    expected_state = before_state if state == "before" else "after"
    assert _file_state(target) == expected_state  # exactly one of the two states

    with EffectsDB.open_workspace(ws) as db:
        journal = ActionJournal(db)
        observed = observe_file(ws, journal, "op-1")
        assert observed.verdict is verdict
        row = journal.get("op-1")
        assert row is not None
        assert row.status is (
            JournalStatus.SUCCEEDED if boundary is None else JournalStatus.STARTED
        )
        temp_files = _temp_files(ws / "sub")
        assert bool(temp_files) == (boundary == "tools.apply.before_replace")

        # Recovery, as the executor does it: decide, then complete or execute once.
        reviews = ReviewStore(db)
        runtime_tool = EditTool() if tool == "edit" else WriteTool()
        decision, item = reconcile_pending(
            runtime_tool, "op-1", "s", workspace=ws, journal=journal, reviews=reviews
        )
        assert item is None
        if verdict is Verdict.APPLIED:
            assert decision.action is RecoveryAction.COMPLETE and not decision.is_error
            if boundary is not None:
                assert "reconciled after a crash" in (decision.content or "")
        else:
            assert decision.action is RecoveryAction.EXECUTE
            result = journaled_run(tool, ws, journal, "s", "op-1", arguments)
            assert not result.is_error, result.content
        assert _file_state(target) == "after"
        final = journal.get("op-1")
        assert final is not None and final.status is JournalStatus.SUCCEEDED
        # Re-running once more (a second crash before the result was appended) never
        # applies it again.
        again = journaled_run(tool, ws, journal, "s", "op-1", arguments)
        assert not again.is_error and "reconciled after a crash" in again.content
        assert _file_state(target) == "after"
        assert _temp_files(ws / "sub") == []
        assert target.read_bytes() == AFTER.encode()
        assert content_hash(target.read_bytes()) == final.after_hash


def test_journaled_edits_killed_at_random_moments(ws: Path) -> None:
    rng = random.Random(f"effects-random-{os.getpid()}-{time.time_ns()}")
    counter = ws / "counter.txt"
    counter.write_text("n=0\n")
    executed_in_recovery = 0
    for _ in range(12):
        child = run_child(CHILD_EDIT_LOOP, str(ws))
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n", child.stderr.read() if child.stderr else ""
        time.sleep(rng.uniform(0.0, 0.06))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode()
        acked = [int(line[4:]) for line in out.split(b"\n") if line.startswith(b"ack ")]

        text = counter.read_text()
        assert text.startswith("n=") and text.endswith("\n"), text  # never torn
        n = int(text[2:])
        if acked:
            assert n >= acked[-1]
        with EffectsDB.open_workspace(ws) as db:
            journal = ActionJournal(db)
            rows = sorted(journal.rows(), key=lambda r: r.operation_id)
            for row in rows[:-1]:
                assert row.status is JournalStatus.SUCCEEDED, row
            if rows:
                last = rows[-1]
                m = int(last.operation_id[3:])
                assert n in (m, m + 1)
                verdict = observe_file(ws, journal, last.operation_id)
                if last.status is JournalStatus.SUCCEEDED:
                    assert n == m + 1 and verdict.verdict is Verdict.APPLIED
                else:
                    assert last.status is JournalStatus.STARTED
                    assert verdict.verdict is (
                        Verdict.APPLIED if n == m + 1 else Verdict.NOT_APPLIED
                    )
                decision, _ = reconcile_pending(
                    EditTool(),
                    last.operation_id,
                    "s",
                    workspace=ws,
                    journal=journal,
                    reviews=ReviewStore(db),
                )
                expected = {Verdict.APPLIED: RecoveryAction.COMPLETE}.get(
                    verdict.verdict, RecoveryAction.EXECUTE
                )
                assert decision.action is expected
                assert (
                    decide_pending(
                        PendingObservation(last.operation_id, "edit", file=verdict)
                    ).action
                    is expected
                )
                if decision.action is RecoveryAction.EXECUTE:
                    executed_in_recovery += 1
                    arguments = {
                        "path": "counter.txt",
                        "old_string": f"n={m}\n",
                        "new_string": f"n={m + 1}\n",
                    }
                    result = journaled_run("edit", ws, journal, "s", last.operation_id, arguments)
                    assert not result.is_error, result.content
                assert counter.read_text() == f"n={m + 1}\n"
    with EffectsDB.open_workspace(ws) as db:
        rows = ActionJournal(db).rows()
        assert all(row.status is JournalStatus.SUCCEEDED for row in rows)
        final = int(counter.read_text()[2:])
        assert len(rows) == final  # one journaled edit per increment, none applied twice
    assert final > 12
    assert executed_in_recovery >= 0  # how often the in-flight edit had not happened yet


# =========================================================================== report ledger


def _ledger_rows(path: Path) -> dict[str, int]:
    ledger = ReportLedger(path)
    try:
        rows = ledger.db().query("SELECT operation_id, COUNT(*) FROM reports GROUP BY 1")
        return {row[0]: int(row[1]) for row in rows}
    finally:
        ledger.close()


def test_publish_killed_after_the_ledger_commit_is_recovered_from_the_ledger(ws: Path) -> None:
    tool = PublishReportTool.for_workspace(ws)
    path = tool.ledger.path
    child = run_child(CHILD_PUBLISH, str(path), "1", "1", "0", crash_at="ledger.committed")
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert b"ack" not in out  # the harness never heard back
    assert _ledger_rows(path) == {"op-000001": 1}

    with EffectsDB.open_workspace(ws) as db:
        reviews = ReviewStore(db)
        decision, item = reconcile_pending(
            tool, "op-000001", "s", workspace=ws, journal=ActionJournal(db), reviews=reviews
        )
        assert item is None
        assert decision.action is RecoveryAction.COMPLETE and decision.recovered_from_ledger
        publication = tool.ledger.find("op-000001")
        assert publication is not None
        assert decision.content == f'Published report "report 1" (receipt {publication.receipt})'
        log = reviews.reconciliations(operation_id="op-000001")
        assert [(e.verdict, e.action) for e in log] == [("committed", "complete")]
    assert _ledger_rows(path) == {"op-000001": 1}  # nothing executed


def test_publish_killed_before_the_commit_is_executed_once(ws: Path) -> None:
    tool = PublishReportTool.for_workspace(ws)
    path = tool.ledger.path
    far_future = str(time.time() + 3600)  # the child waits; it never publishes
    child = run_child(CHILD_PUBLISH, str(path), "1", "1", far_future)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert _ledger_rows(path) == {}
    with EffectsDB.open_workspace(ws) as db:
        journal, reviews = ActionJournal(db), ReviewStore(db)
        decision, _ = reconcile_pending(
            tool, "op-000001", "s", workspace=ws, journal=journal, reviews=reviews
        )
        assert decision.action is RecoveryAction.EXECUTE
        result = tool.run({"title": "report 1", "body": "body"}, ToolContext(ws, "op-000001"))
        assert not result.is_error
        # Crash again before the result was appended: now it is committed, not re-executed.
        decision, _ = reconcile_pending(
            tool, "op-000001", "s", workspace=ws, journal=journal, reviews=reviews
        )
        assert decision.action is RecoveryAction.COMPLETE and decision.content == result.content
    assert _ledger_rows(path) == {"op-000001": 1}


def test_publishes_killed_at_random_moments_commit_at_most_once(ws: Path) -> None:
    rng = random.Random(f"ledger-random-{os.getpid()}-{time.time_ns()}")
    tool = PublishReportTool.for_workspace(ws)
    path = tool.ledger.path
    next_op = 0
    for _ in range(8):
        child = run_child(CHILD_PUBLISH, str(path), str(next_op), "100000", "0")
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode()
        acked = [line.split()[1].decode() for line in out.split(b"\n") if line.startswith(b"ack ")]
        rows = _ledger_rows(path)
        assert all(count == 1 for count in rows.values())  # duplicate effects: 0
        assert set(acked) <= set(rows)
        mine = sorted(op for op in rows if int(op[3:]) >= next_op)
        assert mine == [f"op-{i:06d}" for i in range(next_op, next_op + len(mine))]
        # The call in flight when the child died: committed → found; else not found.
        in_flight = f"op-{next_op + len(mine):06d}"
        assert tool.lookup(in_flight).status.value == "notFound"
        if mine:
            assert tool.lookup(mine[-1]).status.value == "committed"
        next_op += len(mine) + 1  # recovery would execute in_flight once; skip it here
    total = ReportLedger(path)
    assert total.duplicate_effects() == 0
    assert total.count_all() == len(_ledger_rows(path))


def test_two_processes_publishing_the_same_ids_commit_once(ws: Path) -> None:
    path = ws / ".tether" / "ledger.db"
    ReportLedger(path).db()  # schema exists before the race
    start_at = time.time() + 1.5
    count = 150
    children = [
        run_child(CHILD_PUBLISH, str(path), "0", str(count), str(start_at)) for _ in range(2)
    ]
    receipts: list[dict[str, str]] = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err.decode()
        lines = [line.split() for line in out.split(b"\n") if line.startswith(b"ack ")]
        receipts.append({op.decode(): receipt.decode() for _, op, receipt in lines})
    ledger = ReportLedger(path)
    assert ledger.count_all() == count and ledger.duplicate_effects() == 0
    for i in range(count):
        op = f"op-{i:06d}"
        found = ledger.find(op)
        assert found is not None and ledger.effect_count(op) == 1
        assert receipts[0][op] == receipts[1][op] == found.receipt
