"""``tether rewind``: put back the files a session changed after turn N (docs/rewind.md).

One recorded two-turn session (built once, with the real CLI) changes five files after
turn 1: ``a.txt`` (write), ``b.txt`` (two edits: a chain), ``new.txt`` (created),
``hand.txt`` (edited, then changed by hand after the session) and ``bashed.txt`` (made
by bash). Each crash test copies it, kills a real ``tether rewind`` process with SIGKILL
at one named boundary, checks that every file is at a version of its chain (never half
written; ``hand.txt`` never overwritten), then runs ``tether rewind`` again, which must
finish the job.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_evidence_crash import cli_env, tether
from tether._effects.review import ReviewStore
from tether._tools.builtin import content_hash
from tether._wsdb.sqlite import EffectsDB
from tether.core.turns import check_turn, tool_calls_after, turn_count, turns_of

SCRIPT = {
    "model": "scripted/rewind",
    "responses": [
        {
            "content": "",
            "tool_calls": [
                {"id": "c1", "name": "write", "arguments": {"path": "a.txt", "content": "a1\n"}}
            ],
        },
        {"content": "turn one done", "finish_reason": "stop"},
        {
            "content": "",
            "tool_calls": [
                {"id": "c2", "name": "write", "arguments": {"path": "a.txt", "content": "a2\n"}},
                {
                    "id": "c3",
                    "name": "edit",
                    "arguments": {"path": "b.txt", "old_string": "b0", "new_string": "b1"},
                },
                {"id": "c4", "name": "write", "arguments": {"path": "new.txt", "content": "n1\n"}},
                {
                    "id": "c5",
                    "name": "edit",
                    "arguments": {"path": "hand.txt", "old_string": "h0", "new_string": "h1"},
                },
                {"id": "c6", "name": "bash", "arguments": {"command": "echo made > bashed.txt"}},
            ],
        },
        {
            "content": "",
            "tool_calls": [
                {
                    "id": "c7",
                    "name": "edit",
                    "arguments": {"path": "b.txt", "old_string": "b1", "new_string": "b2"},
                }
            ],
        },
        {"content": "turn two done", "finish_reason": "stop"},
    ],
}

CHAINS: dict[str, tuple[str | None, ...]] = {
    # every version a file may hold during a rewind to turn 1, the target first
    "a.txt": ("a1\n", "a2\n"),
    "b.txt": ("b0\n", "b1\n", "b2\n"),
    "new.txt": (None, "n1\n"),
    "hand.txt": ("by hand\n",),  # changed after the session: never touched
    "bashed.txt": ("made\n",),  # bash: not restorable, never touched
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The workspace after the session and the hand edit, and the session id."""
    ws = tmp_path_factory.mktemp("rewind") / "ws"
    ws.mkdir()
    for name, text in (("a.txt", "a0\n"), ("b.txt", "b0\n"), ("hand.txt", "h0\n")):
        (ws / name).write_text(text)
    script = ws.parent / "script.json"
    script.write_text(json.dumps(SCRIPT))
    first = tether("run", "--yes", "--model", f"scripted:{script}", "turn one", cwd=ws)
    assert first.returncode == 0, first.stderr
    listed = tether("sessions", "--json", cwd=ws)
    session = json.loads(listed.stdout)[0]["id"]
    second = tether("run", "--yes", "--session", session, "turn two", cwd=ws)
    assert second.returncode == 0, second.stderr
    assert (ws / "bashed.txt").read_text() == "made\n"
    (ws / "hand.txt").write_text("by hand\n")
    return ws, session


def copy_of(recorded: tuple[Path, str], into: Path) -> tuple[Path, str]:
    ws, session = recorded
    target = into / "ws"
    shutil.copytree(ws, target, symlinks=True)
    return target, session


def contents(ws: Path) -> dict[str, str | None]:
    return {name: (ws / name).read_text() if (ws / name).exists() else None for name in CHAINS}


def check_finished(ws: Path, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 24, done.stdout + done.stderr
    assert "hand.txt" in done.stderr
    assert "not restorable" in done.stdout and "echo made > bashed.txt" in done.stdout
    assert contents(ws) == {name: chain[0] for name, chain in CHAINS.items()}
    assert not list(ws.rglob("*.tether-tmp"))
    db = EffectsDB.open_workspace(ws)  # what `tether review` lists
    try:
        items = ReviewStore(db).list_open()
    finally:
        db.close()
    assert [item.evidence["path"] for item in items] == ["hand.txt"]
    assert items[0].evidence["found_hash"] == content_hash(b"by hand\n")
    assert items[0].evidence["expected_hash"] == content_hash(b"h1\n")


def test_dry_run_shows_the_plan_and_changes_nothing(
    recorded: tuple[Path, str], tmp_path: Path
) -> None:
    ws, session = copy_of(recorded, tmp_path)
    before = contents(ws)
    plan = tether("rewind", session, "--turn", "1", "--dry-run", cwd=ws)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    # newest first: b.txt's second edit before its first
    assert [line.split(":")[1].split()[0] for line in lines if "b.txt" in line] == [
        "b.txt",
        "b.txt",
    ]
    assert "NEEDS REVIEW: hand.txt" in plan.stdout
    assert "new.txt (created by the session: deleted)" in plan.stdout
    assert "turn 2 bash: echo made > bashed.txt" in plan.stdout
    assert contents(ws) == before
    repl = subprocess.run(
        [sys.executable, "-m", "tether", "repl", "--session", session],
        cwd=ws,
        env=cli_env(),
        input="/rewind 1 --dry-run\n/exit\n",
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert repl.returncode == 0, repl.stderr
    assert "NEEDS REVIEW: hand.txt" in repl.stdout + repl.stderr
    assert "turn 2 bash: echo made > bashed.txt" in repl.stdout + repl.stderr
    assert contents(ws) == before
    bad = tether("rewind", session, "--turn", "3", cwd=ws)
    assert bad.returncode == 2 and "the session has 2 turns" in bad.stderr
    # turn 2 is the last: nothing after it
    nothing = tether("rewind", session, "--turn", "2", cwd=ws)
    assert nothing.returncode == 0 and "no file changed" in nothing.stdout


@pytest.mark.parametrize(
    "boundary",
    [
        "rewind.planned",
        "tools.apply.before_replace",  # the first restore's temp file written, not renamed
        "tools.apply.after_replace@2",  # a restore renamed, its directory not fsynced
        "rewind.step_applied@3",  # b.txt back to b0, not recorded (b1 recorded done)
        "rewind.step_recorded@2",  # hand.txt's review recorded
        "rewind.step_recorded@5",  # every step recorded, the rewind not marked finished
    ],
)
def test_sigkill_during_rewind_then_rewind_finishes(
    recorded: tuple[Path, str], tmp_path: Path, boundary: str
) -> None:
    ws, session = copy_of(recorded, tmp_path)
    killed = tether("rewind", session, "--turn", "1", cwd=ws, crash_at=boundary)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    for name, text in contents(ws).items():
        assert text in CHAINS[name], (name, text)  # a whole version, never half written
    done = tether("rewind", session, "--turn", "1", cwd=ws)
    check_finished(ws, done)
    if boundary == "rewind.planned":  # once: a finished rewind is not carried out twice
        again = tether("rewind", session, "--turn", "1", cwd=ws)
        assert again.returncode == 24 and "restored" not in again.stdout
        assert contents(ws) == {name: chain[0] for name, chain in CHAINS.items()}
        shown = tether("show", session, "--workspace", str(ws), cwd=ws)  # no crash: a rewind
        assert shown.returncode == 0 and "0 crash(es)" in shown.stdout, shown.stdout
        assert "rewind to turn 1: hand.txt" in shown.stdout, shown.stdout[-3000:]


def test_turns_are_numbered_from_one() -> None:
    facts = [
        {"kind": "entry", "id": "u1", "entry": {"type": "message", "message": {"role": "user"}}},
        {
            "kind": "record",
            "id": "op1",
            "record": {
                "type": "toolStarted",
                "toolName": "write",
                "arguments": {},
                "replay": "never",
            },
        },
        {"kind": "entry", "id": "u2", "entry": {"type": "message", "message": {"role": "user"}}},
        {
            "kind": "record",
            "id": "op2",
            "record": {
                "type": "toolStarted",
                "toolName": "read",
                "arguments": {},
                "replay": "safe",
            },
        },
    ]
    assert turns_of(facts) == (1, 1, 2, 2)
    assert turn_count(facts) == 2
    assert [c.operation_id for c in tool_calls_after(facts, 0)] == ["op1", "op2"]
    assert [c.operation_id for c in tool_calls_after(facts, 1)] == ["op2"]
    assert tool_calls_after(facts, 2) == ()
    assert check_turn(2, 2) is None and check_turn(3, 2) and check_turn(-1, 2)


def test_a_session_with_an_unfinished_operation_is_not_rewound(tmp_path: Path) -> None:
    """Its pending call would be reconciled by hash on resume: rewound to the before-version,
    the change would be applied again. So the rewind refuses and says what to do."""
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "scripted/r", "responses": SCRIPT["responses"][:2]}))
    crashed = tether(
        "run",
        "--yes",
        "--model",
        f"scripted:{script}",
        "go",
        cwd=ws,
        crash_at="journal.change_applied",
    )
    assert crashed.returncode == -signal.SIGKILL
    assert (ws / "a.txt").read_text() == "a1\n"
    listed = tether("sessions", "--json", cwd=ws)
    session = json.loads(listed.stdout)[0]["id"]
    refused = tether("rewind", session, "--turn", "0", cwd=ws)
    assert refused.returncode == 2, refused.stderr
    assert "unfinished operation" in refused.stderr and f"tether resume {session}" in refused.stderr
    assert (ws / "a.txt").read_text() == "a1\n"
