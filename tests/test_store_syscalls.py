"""The store's system calls, recorded from real ``tether`` processes with ``strace``.

Two kinds of test (see ``tests/stracekit.py``):

* **order** — a real ``tether run`` on a fresh workspace, traced: every directory tether
  creates is ``fsync``-ed, and so is its parent, before the first fact of the log is written
  (so before it can be acknowledged). Without the parent's sync a power cut may drop the new
  directory, and every acknowledged fact in it, whatever was synced inside it
  (``docs/store.md``, "Durability").
* **failures** — the same run with one system call of ``create`` failed by the kernel's
  stand-in (``strace -e inject``): ``ENOSPC`` for a full disk, ``EIO`` for a failed sync.
  The CLI must print one ``error:`` line and exit with the store's write error (9), and
  leave no half-made session behind.

Skipped with a one-line reason when strace cannot run, except under ``CI=true``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from stracekit import Call, Traced, require_strace, tether_argv, trace
from tether.session.store import sessions_dir_for


@pytest.fixture(autouse=True)
def _needs_strace() -> None:
    require_strace()


def script(workspace: Path, responses: list[dict[str, Any]]) -> str:
    (workspace / "script.json").write_text(
        json.dumps({"model": "scripted/test", "responses": responses})
    )
    return "scripted:script.json"


BASH_THEN_ANSWER: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi > out.txt"}}]},
    {"content": "done"},
]


def is_log(path: str | None, sessions: Path) -> bool:
    """A descriptor of a session log: the final name, or the temporary one it was made as."""
    if path is None:
        return False
    parent, _, name = path.rpartition("/")
    return parent == str(sessions) and (name.endswith(".jsonl") or name.endswith(".creating"))


def first_fact_write(calls: list[Call], sessions: Path) -> Call:
    for call in calls:
        if call.name in ("write", "pwrite64") and call.ok and is_log(call.fd_path(), sessions):
            data = call.string(1) or ""
            if not data.startswith('{"kind":"header"'):
                return call
    raise AssertionError("the log never got a fact")


def directories_made(calls: list[Call], under: Path) -> list[Path]:
    made = []
    for call in calls:
        if call.name in ("mkdir", "mkdirat") and call.ok:
            path = call.path_arg()
            if path is not None and (path == str(under) or path.startswith(f"{under}/")):
                made.append(Path(path))
    return made


def synced_before(calls: list[Call], moment: int) -> set[Path]:
    """Every file or directory whose ``fsync``/``fdatasync`` completed before ``moment``."""
    return {
        Path(path)
        for call in calls
        if call.name in ("fsync", "fdatasync") and call.ok and call.index < moment
        for path in [call.fd_path()]
        if path is not None
    }


def assert_dirs_durable_before_first_fact(
    run: Traced, made: list[Path], sessions: Path, log: Path
) -> None:
    fact = first_fact_write(run.calls, sessions)
    synced = synced_before(run.calls, fact.start)
    for directory in made:
        assert directory in synced, f"{directory} was made but not synced before the first fact"
        assert directory.parent in synced, (
            f"the parent of {directory} was not synced before the first fact (trace: {log})"
        )
    # The fact itself is acknowledged only after its own fdatasync (durable mode).
    later = [c for c in run.calls if c.index > fact.index and c.name == "fdatasync"]
    assert later and later[0].fd_path() == fact.fd_path()


# --------------------------------------------------------------------------- order


def test_a_fresh_run_syncs_the_directories_it_makes_before_the_first_fact(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = script(workspace, BASH_THEN_ANSWER)
    log = tmp_path / "trace.txt"
    run = trace(tether_argv("run", "do it", "--model", model), cwd=workspace, log=log)
    assert run.returncode == 0, run.stderr
    assert (workspace / "out.txt").read_text() == "hi\n"  # the bash call ran
    sessions = sessions_dir_for(workspace)
    made = directories_made(run.calls, workspace)
    assert made == [workspace / ".tether", sessions]
    assert_dirs_durable_before_first_fact(run, made, sessions, log)


def test_a_new_sessions_dir_and_its_new_ancestors_are_synced(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = script(workspace, BASH_THEN_ANSWER)
    log = tmp_path / "trace.txt"
    sessions = tmp_path / "state" / "deep" / "sessions"
    run = trace(
        tether_argv("run", "do it", "--model", model, "--sessions-dir", sessions),
        cwd=workspace,
        log=log,
    )
    assert run.returncode == 0, run.stderr
    made = directories_made(run.calls, tmp_path)
    assert made == [tmp_path / "state", tmp_path / "state" / "deep", sessions]
    assert_dirs_durable_before_first_fact(run, made, sessions, log)


EFFECTS_CHILD = """
import sys
from tether.effects.db import EffectsDB
with EffectsDB.open_workspace(sys.argv[1]) as db:
    with db.transaction() as conn:
        conn.execute("INSERT INTO artifact_manifests VALUES ('v1', x'00', 1)")
"""


def test_the_effects_database_syncs_the_tether_dir_it_makes(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    log = tmp_path / "trace.txt"
    run = trace([sys.executable, "-c", EFFECTS_CHILD, str(workspace)], cwd=tmp_path, log=log)
    assert run.returncode == 0, run.stderr
    tether_dir = workspace / ".tether"
    assert directories_made(run.calls, workspace) == [tether_dir]
    db = str(tether_dir / "effects.db")
    first = next(
        c
        for c in run.calls
        if c.name in ("write", "pwrite64") and c.ok and (c.fd_path() or "").startswith(db)
    )
    synced = synced_before(run.calls, first.start)
    assert tether_dir in synced and workspace in synced, f"trace: {log}"
