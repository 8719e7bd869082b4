"""Crash consistency with real processes.

A child process opens a session and commits in a loop, printing ``ack <seq>`` after each
``commit`` returned. The parent kills it with ``SIGKILL`` at a random moment (or arms a
named crash boundary), then opens the log itself, which repairs a torn tail, and checks:

* the log reduces (never corrupt);
* it holds a *prefix* of what the child committed — the facts on disk are exactly
  ``msg 1 … msg N`` in order, with no gap and nothing foreign;
* every acknowledged commit is present (``N >=`` the last acknowledged seq).

Each mode runs one long session across all its children, so every child also exercises
reopening (and repairing) after the previous child's crash.
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
from typing import Any

import pytest

from tether._faults import CRASH_EXIT_CODE
from tether._stores.file import SessionStore, list_sessions, sessions_dir_for
from tether.core import reduce_session

REPO_ROOT = Path(__file__).resolve().parent.parent

RUNS_PER_MODE = 30
RUNS_PER_SESSION = 6

CHILD = textwrap.dedent(
    """
    import random, sys
    from tether._stores.file import SessionStore

    path, sessions_dir, durability, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rng = random.Random(seed)
    store = SessionStore.open(path, sessions_dir=sessions_dir, durability=durability)
    seq = store.state.last_seq
    print(f"open {store.repaired} {seq}", flush=True)
    while True:
        size = rng.choice((1, 1, 1, 2, 3))
        facts = [
            {"kind": "entry", "entry": {"type": "message", "message": {
                "role": "user", "content": f"msg {seq + i + 1} " + "x" * rng.randrange(400)}}}
            for i in range(size)
        ]
        seq = store.commit(facts)[-1]["seq"]
        print(f"ack {seq}", flush=True)
    """
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_CRASH")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def spawn(path: Path, durability: str, seed: int, extra: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(path.parent), durability, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(extra),
    )


def acked(stdout: bytes) -> int:
    """The highest acknowledged seq (only complete lines count)."""
    best = 0
    for line in stdout.split(b"\n")[:-1]:
        if line.startswith(b"ack "):
            best = max(best, int(line[4:]))
    return best


def verify(path: Path, last_acked: int) -> tuple[int, int]:
    """Open (repairing), check the prefix property; return (last_seq, bytes repaired)."""
    with SessionStore.open(path, sessions_dir=path.parent, durability="process") as store:
        state = store.state
        repaired = store.repaired
    data = path.read_bytes()
    assert data.endswith(b"\n"), "repair must leave only complete lines"
    assert reduce_session(data).to_json() == state.to_json()
    expected = 1
    for raw in data.split(b"\n")[1:-1]:
        value = json.loads(raw)
        for fact in value if isinstance(value, list) else [value]:
            assert fact["seq"] == expected
            content = fact["entry"]["message"]["content"]
            assert content.startswith(f"msg {expected} "), (expected, content[:20])
            expected += 1
    assert state.last_seq == expected - 1
    assert state.last_seq >= last_acked, f"acknowledged seq {last_acked} lost"
    return state.last_seq, repaired


def new_session(tmp_path: Path, name: str) -> Path:
    workspace = tmp_path / name
    workspace.mkdir()
    with SessionStore.create(
        workspace, provider="openrouter", model="test/model", environment_identity="crash"
    ) as store:
        return store.path


@pytest.mark.parametrize("durability", ["process", "durable"])
def test_sigkill_at_random_moments_never_loses_an_acknowledged_commit(
    tmp_path: Path, durability: str
) -> None:
    rng = random.Random(f"sigkill-{durability}-{os.getpid()}-{time.time_ns()}")
    max_delay = 0.05 if durability == "process" else 0.12
    kills_mid_loop = 0
    progress = 0
    last_seq = 0
    path = tmp_path
    for run in range(RUNS_PER_MODE):
        if run % RUNS_PER_SESSION == 0:  # keep sessions small so reopening stays cheap
            progress += last_seq
            path = new_session(tmp_path, f"{durability}-{run}")
            last_seq = 0
        child = spawn(path, durability, rng.randrange(1 << 30))
        assert child.stdout is not None
        if run % 5 == 4:
            # kill anywhere from start-up through open/repair into the loop
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            first = child.stdout.readline()
            assert first.startswith(b"open "), child.stderr.read() if child.stderr else first
            _, _repaired, seen = first.split()
            assert int(seen) == last_seq  # the child saw everything the last one left
            time.sleep(rng.uniform(0.0, max_delay))
            kills_mid_loop += 1
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode()
        last_acked = acked(out)
        new_last, _ = verify(path, last_acked)
        assert new_last >= last_seq
        last_seq = new_last
    assert kills_mid_loop >= RUNS_PER_MODE // 2
    assert progress + last_seq > RUNS_PER_MODE  # the children did make progress


BOUNDARY_CASES = [
    # boundary, crash mode, durability, what the log holds after the crash
    ("store.before_write", "kill", "process", "acked"),
    ("store.before_write", "exit", "durable", "acked"),
    ("store.torn_write", "kill", "process", "torn"),
    ("store.torn_write", "exit", "process", "torn"),
    ("store.torn_write", "kill", "durable", "torn"),
    ("store.after_write", "kill", "process", "unacked"),
    ("store.after_write", "exit", "durable", "unacked"),
    ("store.after_sync", "kill", "durable", "unacked"),
]


@pytest.mark.parametrize(("boundary", "mode", "durability", "outcome"), BOUNDARY_CASES)
def test_named_crash_boundaries(
    tmp_path: Path, boundary: str, mode: str, durability: str, outcome: str
) -> None:
    rng = random.Random(f"{boundary}-{mode}-{durability}")
    path = new_session(tmp_path, "ws")
    last_seq = 0
    for _ in range(3):
        nth = rng.randrange(1, 25)
        env = {"TETHER_CRASH_AT": f"{boundary}@{nth}", "TETHER_CRASH_MODE": mode}
        child = spawn(path, durability, rng.randrange(1 << 30), env)
        out, err = child.communicate(timeout=60)
        if mode == "kill":
            assert child.returncode == -signal.SIGKILL, err.decode()
        else:
            assert child.returncode == CRASH_EXIT_CODE
            assert err.decode() == f"INJECTED_CRASH boundary={boundary}\n"
        acks = [int(x[4:]) for x in out.split(b"\n") if x.startswith(b"ack ")]
        assert len(acks) == nth - 1  # crashed inside the nth commit
        last_acked = acks[-1] if acks else last_seq
        size_before = path.stat().st_size
        committed_before = path.read_bytes().rfind(b"\n") + 1
        new_last, repaired = verify(path, last_acked)
        if outcome == "acked":
            assert new_last == last_acked and repaired == 0
        elif outcome == "torn":
            assert new_last == last_acked
            assert repaired == size_before - committed_before > 0  # reported and cut
        else:  # written (and maybe synced) but never acknowledged: still a valid prefix
            assert new_last > last_acked and repaired == 0
        last_seq = new_last


# --------------------------------------------------------------------------- killed creates

CREATE_CHILD = textwrap.dedent(
    """
    import sys
    from tether._stores.file import SessionStore

    store = SessionStore.create(
        sys.argv[1], provider="openrouter", model="test/model", environment_identity="crash",
        durability=sys.argv[2],
    )
    print(f"created {store.session_id}", flush=True)
    sys.stdin.read()  # stay open (holding the session) until the parent closes our stdin
    store.close()
    """
)

CREATE_POINTS = [
    # boundary, what the kill leaves in the sessions directory
    ("store.create_opened", "an empty temporary log, unlocked"),
    ("store.locked", "an empty temporary log, locked until the kill"),
    ("store.create_written", "a temporary log with the header, and a pid record"),
    ("store.create_linked", "the final log and its temporary name, one file with two names"),
]


def spawn_create(workspace: Path, durability: str, env: dict[str, str]) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", CREATE_CHILD, str(workspace), durability],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(env),
    )


def user(text: str) -> dict[str, Any]:
    return {
        "kind": "entry",
        "entry": {"type": "message", "message": {"role": "user", "content": text}},
    }


def debris(sessions: Path) -> list[str]:
    """Temporaries of creates, and pid records whose log does not exist."""
    names = set(os.listdir(sessions))
    return sorted(
        n
        for n in names
        if n.endswith(".creating") or (n.endswith(".lock") and n[: -len(".lock")] not in names)
    )


@pytest.mark.parametrize("then", ["create", "open", "list"])
@pytest.mark.parametrize(("boundary", "left"), CREATE_POINTS, ids=[b for b, _ in CREATE_POINTS])
def test_a_create_killed_at_any_point_leaves_nothing_after_the_next_use(
    tmp_path: Path, boundary: str, left: str, then: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with SessionStore.create(
        workspace, provider="openrouter", model="test/model", environment_identity="crash"
    ) as existing:
        existing.commit([user("keep me")])
    sessions = existing.path.parent
    child = spawn_create(workspace, "durable", {"TETHER_CRASH_AT": boundary})
    out, err = child.communicate(b"", timeout=60)
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert b"created" not in out  # create never returned
    assert debris(sessions), f"the kill should leave {left}"

    if then == "create":
        with SessionStore.create(
            workspace, provider="openrouter", model="test/model", environment_identity="crash"
        ):
            pass
    elif then == "open":
        with SessionStore.open(existing.session_id, workspace=workspace):
            pass
    else:
        list_sessions(sessions)
    assert debris(sessions) == [], f"{then} left {left} behind"

    # No session was lost: the old one is whole; a log that got its final name is a
    # complete (header-only) session that opens for writing.
    with SessionStore.open(existing.session_id, workspace=workspace) as again:
        assert [m["content"] for m in again.state.transcript] == ["keep me"]
    logs = [s for s in list_sessions(sessions) if s.id != existing.session_id]
    expected = 1 if then == "create" else 0
    if boundary == "store.create_linked":
        expected += 1
    assert len(logs) == expected and all(s.error is None for s in logs)
    for summary in logs:
        with SessionStore.open(summary.path, sessions_dir=sessions) as store:
            assert store.state.operation.kind == "idle"


def wait_stopped(child: Any) -> None:
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status


@pytest.mark.parametrize(
    "boundary",
    ["store.create_opened", "store.locked", "store.create_written", "store.create_linked"],
)
def test_a_create_in_progress_keeps_its_temporary_while_others_clean_up(
    tmp_path: Path, boundary: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sessions = sessions_dir_for(workspace)
    child = spawn_create(
        workspace, "durable", {"TETHER_CRASH_AT": boundary, "TETHER_CRASH_MODE": "stop"}
    )
    try:
        wait_stopped(child)  # frozen inside create, at the boundary
        [temp] = [n for n in os.listdir(sessions) if n.endswith(".creating")]
        # Everything that cleans up runs meanwhile, in this process.
        list_sessions(sessions)
        with SessionStore.create(
            workspace, provider="openrouter", model="test/model", environment_identity="crash"
        ) as other:
            pass
        with SessionStore.open(other.session_id, workspace=workspace):
            pass
        if boundary != "store.create_linked":
            assert temp in os.listdir(sessions), "removed the temporary of a live create"
        os.kill(child.pid, signal.SIGCONT)
        assert child.stdout is not None
        line = child.stdout.readline().decode()
        assert line.startswith("created "), child.stderr.read() if child.stderr else line
        created = line.split()[1]
        child.communicate(b"", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert debris(sessions) == []
    with SessionStore.open(created, workspace=workspace) as store:
        assert store.state.header.id == created
