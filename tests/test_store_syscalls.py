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
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stracekit import Call, Traced, cli_env, fail_call, nth_call, require_strace, tether_argv, trace
from tether._stores.file import SessionStore, sessions_dir_for


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
    # .tether/settings (the CLI's record of the settings a session was run with, written
    # after its first model request) is no part of the log's durability.
    settings = workspace / ".tether" / "settings"
    made = [d for d in directories_made(run.calls, workspace) if d != settings]
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
    # The workspace's .tether/settings (the CLI's record of the run's settings, written
    # after the first model request) is no part of the log's durability.
    state = workspace / ".tether"
    made = [
        d for d in directories_made(run.calls, tmp_path) if d not in (state, state / "settings")
    ]
    assert made == [tmp_path / "state", tmp_path / "state" / "deep", sessions]
    assert_dirs_durable_before_first_fact(run, made, sessions, log)


EFFECTS_CHILD = """
import sys
from tether._wsdb.sqlite import EffectsDB
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


# --------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class Failure:
    """One system call of ``create`` to fail, and what the user must get."""

    label: str
    syscall: str
    error: str
    match: Callable[[Call, Path], bool]
    """Whether a recorded call (of ``syscall``) is the one to fail, given the workspace."""
    words: str
    """Text the one error line must contain (the step that failed)."""


def _path_is(call: Call, expected: Path) -> bool:
    return call.path_arg() == str(expected)


def _temp(call: Call) -> bool:
    path = call.path_arg() or ""
    return path.endswith(".jsonl.creating")


FAILURES = [
    Failure(
        "mkdir .tether",
        "mkdir",
        "ENOSPC",
        lambda c, ws: _path_is(c, ws / ".tether"),
        "mkdir",
    ),
    Failure(
        "mkdir sessions",
        "mkdir",
        "ENOSPC",
        lambda c, ws: _path_is(c, ws / ".tether" / "sessions"),
        "mkdir",
    ),
    Failure(
        "fsync of the workspace",
        "fsync",
        "EIO",
        lambda c, ws: c.fd_path() == str(ws),
        "fsync",
    ),
    Failure(
        "fsync of .tether",
        "fsync",
        "EIO",
        lambda c, ws: c.fd_path() == str(ws / ".tether"),
        "fsync",
    ),
    Failure(
        "open of the temporary log",
        "openat",
        "ENOSPC",
        lambda c, ws: _temp(c) and "O_CREAT" in c.args[2],
        "open",
    ),
    Failure(
        "write of the header",
        "write",
        "ENOSPC",
        lambda c, ws: (c.fd_path() or "").endswith(".creating"),
        "write",
    ),
    Failure(
        "fdatasync of the header",
        "fdatasync",
        "EIO",
        lambda c, ws: (c.fd_path() or "").endswith(".creating"),
        "fdatasync",
    ),
    Failure("link to the final name", "linkat", "ENOSPC", lambda c, ws: _temp(c), "link"),
    Failure("unlink of the temporary name", "unlinkat", "EIO", lambda c, ws: _temp(c), "unlink"),
    Failure(
        "fsync of the sessions dir",
        "fsync",
        "EIO",
        lambda c, ws: c.fd_path() == str(sessions_dir_for(ws)),
        "fsync",
    ),
]


def fresh_workspace(root: Path) -> tuple[Path, str]:
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    return workspace, script(workspace, [{"content": "done"}])


def leftovers(workspace: Path) -> list[str]:
    """Files in the sessions directory: logs, temporaries, pid records."""
    sessions = sessions_dir_for(workspace)
    return sorted(os.listdir(sessions)) if sessions.is_dir() else []


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """One uninjected run of the main thread: the K-th call of each kind, per target."""
    root = tmp_path_factory.mktemp("dry")
    workspace, model = fresh_workspace(root)
    run = trace(
        tether_argv("run", "hi", "--model", model),
        cwd=workspace,
        log=root / "trace.txt",
        follow_forks=False,
    )
    assert run.returncode == 0, run.stderr
    return run


@pytest.mark.parametrize("failure", FAILURES, ids=[f.label for f in FAILURES])
def test_a_failing_system_call_of_create_is_one_store_error(
    failure: Failure, dry_run: Traced, tmp_path: Path
) -> None:
    # The dry run's workspace: where its sessions directory was made.
    made = [c for c in dry_run.calls if c.name == "mkdir" and c.ok]
    assert made, "the dry run made no directory"
    ws_dry = Path(made[0].path_arg() or "").parent
    k = nth_call(dry_run.calls, failure.syscall, lambda c: failure.match(c, ws_dry))
    assert k is not None, f"create never calls {failure.syscall} for {failure.label}"

    workspace, model = fresh_workspace(tmp_path)
    run = fail_call(
        tether_argv("run", "hi", "--model", model),
        cwd=workspace,
        log=tmp_path / "trace.txt",
        syscall=failure.syscall,
        error=failure.error,
        nth=k,
        expected=lambda c: failure.match(c, workspace),
    )
    assert run.returncode == 9, (run.returncode, run.stderr)
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: "), run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr
    reason = "No space left on device" if failure.error == "ENOSPC" else "Input/output error"
    assert reason in run.stderr and failure.words in run.stderr, run.stderr
    assert run.stdout == ""
    assert leftovers(workspace) == [], "a failed create left part of a session behind"
    # The failure left nothing that gets in the way: the next run just works.
    again = trace(
        tether_argv("run", "hi", "--model", model),
        cwd=workspace,
        log=tmp_path / "again.txt",
        follow_forks=False,
        syscalls="none",
        env=cli_env(),
    )
    assert again.returncode == 0, again.stderr
    [log_file] = [n for n in leftovers(workspace) if n.endswith(".jsonl")]
    with SessionStore.open(log_file, workspace=workspace) as store:
        assert store.state.operation.kind == "idle"


OPEN_FAILURES = [
    Failure(
        "open of the log",
        "openat",
        "EACCES",
        lambda c, log: c.path_arg() == str(log) and "O_RDWR" in c.args[2],
        "open failed: Permission denied",
    ),
    Failure(
        "flock of the log",
        "flock",
        "ENOLCK",
        lambda c, log: c.fd_path() == str(log),
        "lock failed: No locks available",
    ),
    Failure(
        "read of the log",
        "pread64",
        "EIO",
        lambda c, log: c.fd_path() == str(log),
        "read failed: Input/output error",
    ),
]


def resumable(root: Path) -> tuple[Path, str, Path]:
    workspace, model = fresh_workspace(root)
    with SessionStore.create(
        workspace, provider="scripted", model="scripted/test", environment_identity="t"
    ) as store:
        return workspace, model, store.path


@pytest.mark.parametrize("failure", OPEN_FAILURES, ids=[f.label for f in OPEN_FAILURES])
def test_a_failing_system_call_of_open_is_one_store_error(failure: Failure, tmp_path: Path) -> None:
    workspace, model, log = resumable(tmp_path / "dry")
    argv = tether_argv("resume", log.name, "--model", model)
    dry = trace(
        argv, cwd=workspace, log=tmp_path / "dry.txt", follow_forks=False, syscalls=failure.syscall
    )
    assert dry.returncode == 0, dry.stderr
    k = nth_call(dry.calls, failure.syscall, lambda c: failure.match(c, log))
    assert k is not None, f"open never calls {failure.syscall} for {failure.label}"

    workspace, model, log = resumable(tmp_path / "injected")
    before = log.read_bytes()
    run = fail_call(
        tether_argv("resume", log.name, "--model", model),
        cwd=workspace,
        log=tmp_path / "trace.txt",
        syscall=failure.syscall,
        error=failure.error,
        nth=k,
        expected=lambda c: failure.match(c, log),
    )
    assert run.returncode == 9, (run.returncode, run.stderr)
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: "), run.stderr
    assert failure.words in run.stderr and "internal error" not in run.stderr, run.stderr
    assert log.read_bytes() == before
    assert leftovers(workspace) == [log.name]  # no pid record left either
    with SessionStore.open(log.name, workspace=workspace) as store:
        assert store.state.operation.kind == "idle"


def test_a_pid_record_that_cannot_be_made_does_not_fail_the_run(tmp_path: Path) -> None:
    """The pid record is advisory: a full disk there costs only the holder's name."""
    workspace, model = fresh_workspace(tmp_path / "dry")
    dry = trace(
        tether_argv("run", "hi", "--model", model),
        cwd=workspace,
        log=tmp_path / "dry.txt",
        follow_forks=False,
        syscalls="openat",
    )
    assert dry.returncode == 0, dry.stderr
    k = nth_call(dry.calls, "openat", lambda c: (c.path_arg() or "").endswith(".jsonl.lock"))
    assert k is not None
    workspace, model = fresh_workspace(tmp_path / "injected")
    run = fail_call(
        tether_argv("run", "hi", "--model", model),
        cwd=workspace,
        log=tmp_path / "trace.txt",
        syscall="openat",
        error="ENOSPC",
        nth=k,
        expected=lambda c: (c.path_arg() or "").endswith(".jsonl.lock"),
    )
    assert run.returncode == 0, run.stderr
    assert [n for n in leftovers(workspace) if not n.endswith(".jsonl")] == []
    assert len(leftovers(workspace)) == 1
