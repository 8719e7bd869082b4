"""tether's own state is never a file-tool target, as real ``python -m tether`` processes.

The session log, its lock sidecar, the temp names of session creation, the workspace
database and everything else tether keeps are refused by ``read``, ``write`` and ``edit``
in every layout: the default ``.tether/``, ``--sessions-dir`` inside the workspace and
``--sessions-dir`` outside it; by path, through a hard link and through a directory
symlink. Each case runs one session twice: the first run creates the log and the
effects database, the second (``--session``, so the live log's name is known to the
script) aims every call at them while the log is open for writing.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from test_cli_run import cli_env, json_lines, run_cli, script, tool_results
from tether._models import ScriptedModel
from tether._runtime import Agent
from tether._tools import EditTool, ReadTool, ToolContext, WriteTool, tool
from tether._tools.builtin import apply_change, builtin_tools, plan_write
from tether._tools.workspace import ProtectedState
from tether._wsdb.sqlite import EffectsDB
from tether.core import reduce_session
from tether.errors import ConfigurationError, ProtectedPath

REFUSED = "tether's own state"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def forge(path: str) -> dict[str, Any]:
    return call("write", path=path, content="forged\n")


def sessions_flags(layout: str, root: Path, tmp_path: Path) -> tuple[list[str], Path]:
    """The ``--sessions-dir`` flags of ``layout`` and the sessions directory it means."""
    if layout == "default":
        return [], root / ".tether" / "sessions"
    if layout == "inside":
        return ["--sessions-dir", "logs"], root / "logs"
    outside = tmp_path / "elsewhere" / "sessions"
    return ["--sessions-dir", str(outside)], outside


FIRST_RUN: list[dict[str, Any]] = [
    {"tool_calls": [call("write", path="notes.txt", content="hello\n")]},  # opens effects.db
    {"content": "first"},
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder.resolve()


def start_session(root: Path, flags: list[str]) -> tuple[str, Path]:
    model = script(root, FIRST_RUN)
    first = run_cli("run", "one", "--model", model, "--json", *flags, cwd=root)
    assert first.returncode == 0, first.stderr
    result = json_lines(first.stdout)[-1]
    return result["sessionId"], root / result["sessionPath"]


def continue_session(
    root: Path, flags: list[str], session_id: str, calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """Run the session again: one bash call, then ``calls`` in one step, then an answer."""
    model = script(root, [*FIRST_RUN, {"tool_calls": calls}, {"content": "done"}])
    second = run_cli(
        "run", "two", "--session", session_id, "--model", model, "--json", *flags, cwd=root
    )
    assert second.returncode == 0, second.stderr
    final: dict[str, Any] = json_lines(second.stdout)[-1]
    assert (final["status"], final["text"]) == ("completed", "done")
    return final


def assert_refused(log: Path, count: int, why: str = REFUSED) -> None:
    """The last ``count`` tool results of ``log`` are error results saying ``why``."""
    results = tool_results(log)[-count:]
    assert len(results) == count
    for entry in results:
        assert entry["result"]["type"] == "error", entry
        assert why in entry["message"]["content"], entry


def assert_log_intact(log: Path, before: bytes) -> None:
    """The log only grew (the first run's bytes are its prefix) and still reduces."""
    after = log.read_bytes()
    assert after.startswith(before)
    state = reduce_session(after)
    assert state.header.id == json.loads(before.split(b"\n", 1)[0])["id"]


@pytest.mark.parametrize("layout", ["default", "inside", "outside"])
def test_the_live_log_lock_and_database_are_refused_in_every_layout(
    layout: str, root: Path, tmp_path: Path
) -> None:
    flags, sessions = sessions_flags(layout, root, tmp_path)
    # The sandbox off: with it on, bash cannot even see the log, the lock or the database
    # (tests/test_sandbox.py); here its hard links test the file tools' own defence.
    flags = [*flags, "--sandbox", "off"]
    session_id, log = start_session(root, flags)
    assert log.parent.resolve() == sessions.resolve()
    before = log.read_bytes()
    db = root / ".tether" / "effects.db"
    assert db.exists()
    lock = log.parent / (log.name + ".lock")

    # Hard links inside the workspace to the live log, its lock sidecar and the database,
    # made while the second run holds the log (the sidecar exists only then).
    links = f"ln {log} log-link.jsonl && ln {lock} lock-link && ln {db} db-link"
    targets: list[dict[str, Any]] = [
        call("bash", command=links),
        forge("log-link.jsonl"),
        forge("lock-link"),
        forge("db-link"),
        call("edit", path="log-link.jsonl", old_string='"kind"', new_string='"KIND"'),
        call("edit", path="db-link", old_string="SQLite", new_string="SQLITE"),
        call("read", path="log-link.jsonl"),
        forge(".tether/effects.db"),
        forge(".tether/effects.db-wal"),
        forge(".tether/effects.db-shm"),
        forge(".tether/effects.db-journal"),
        forge(".tether/artifact-cache.json"),
    ]
    if layout != "outside":
        relative = log.parent.relative_to(root).as_posix()
        targets += [
            forge(f"{relative}/{log.name}"),
            call("edit", path=f"{relative}/{log.name}", old_string='"kind"', new_string='"K"'),
            call("read", path=f"{relative}/{log.name}"),
            forge(f"{relative}/{log.name}.lock"),
            forge(f"{relative}/.{log.name}.creating"),
            forge(f"{relative}/another.jsonl"),
            forge(f"{relative}/sub/deeper.jsonl"),
            forge(relative),
        ]
    final = continue_session(root, flags, session_id, targets)
    assert final["sessionId"] == session_id
    assert_refused(log, len(targets) - 1)
    assert_log_intact(log, before)
    # Every link still names the very file it was made from: nothing was replaced.
    for link, original in (("log-link.jsonl", log), ("db-link", db)):
        assert os.stat(root / link).st_ino == os.stat(original).st_ino
    assert (root / "db-link").read_bytes().startswith(b"SQLite format 3")
    assert not (root / "lock-link").read_bytes().startswith(b"forged")
    names = {p.name for p in log.parent.iterdir()}
    # Besides the log and its lock only the session's evidence binding (effects.md).
    binding = f".{session_id}.evidence.json"
    assert names <= {log.name, lock.name, binding}, names
    assert not (root / ".tether" / "effects.db-journal").exists()
    database = EffectsDB.open_workspace(root)
    try:
        row = database.query_one("PRAGMA integrity_check")
        assert row is not None and row[0] == "ok"
    finally:
        database.close()
    # A third run in the same session still commits to the same, intact log.
    shown = run_cli("inspect", "--json", str(log), cwd=root)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"]["operation"] == {"kind": "idle"}


def test_a_directory_symlink_to_the_sessions_directory_is_refused(root: Path) -> None:
    flags = ["--sessions-dir", "logs"]
    session_id, log = start_session(root, flags)
    before = log.read_bytes()
    targets = [
        call("bash", command="ln -s logs logs-link && ln -s ../logs sub-link"),
        forge(f"logs-link/{log.name}"),
        call("edit", path=f"logs-link/{log.name}", old_string='"kind"', new_string='"K"'),
        call("read", path=f"logs-link/{log.name}"),
    ]
    continue_session(root, flags, session_id, targets)
    assert_refused(log, 3, why="symbolic link")
    assert_log_intact(log, before)


def test_the_commits_after_a_refused_write_land_in_the_live_log(root: Path) -> None:
    # Before the fix the write replaced the live log's name: the log read back as
    # "forged" and every later commit went to the unlinked old file.
    flags = ["--sessions-dir", "logs"]
    session_id, log = start_session(root, flags)
    continue_session(root, flags, session_id, [forge(f"logs/{log.name}")])
    assert_refused(log, 1)
    state = reduce_session(log.read_bytes())
    assert [m["content"] for m in state.transcript if m["role"] == "user"] == ["one", "two"]
    assert state.transcript[-1]["content"] == "done"


def _unshare_prefix() -> list[str] | None:
    """A command prefix giving a private mount namespace, or ``None`` if none can be had."""
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def test_a_bind_mount_of_the_state_is_refused_by_identity(root: Path, tmp_path: Path) -> None:
    # A second path to the very same directories: no symlink on the way, another real
    # path, only (st_dev, st_ino) tells. The mounts live in a private mount namespace.
    prefix = _unshare_prefix()
    if prefix is None:
        pytest.skip("no private mount namespace available (unshare -m)")
    sessions = tmp_path / "elsewhere" / "sessions"
    flags = ["--sessions-dir", str(sessions)]
    session_id, log = start_session(root, flags)
    before = log.read_bytes()
    (root / "mirror-sessions").mkdir()
    (root / "mirror-state").mkdir()
    targets = [
        forge(f"mirror-sessions/{log.name}"),
        forge("mirror-sessions/new.jsonl"),
        call("read", path=f"mirror-sessions/{log.name}"),
        forge("mirror-state/effects.db"),
        call("edit", path="mirror-state/effects.db", old_string="SQLite", new_string="x"),
    ]
    model = script(root, [*FIRST_RUN, {"tool_calls": targets}, {"content": "done"}])
    command = [sys.executable, "-m", "tether", "run", "two", "--session", session_id]
    inner = shlex.join([*command, "--model", model, "--json", *flags])
    mounts = (
        f"mount --bind {shlex.quote(str(sessions))} mirror-sessions && "
        f"mount --bind {shlex.quote(str(root / '.tether'))} mirror-state && exec {inner}"
    )
    second = subprocess.run(
        [*prefix, "sh", "-c", mounts],
        cwd=root,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    assert json_lines(second.stdout)[-1]["status"] == "completed"
    assert_refused(log, len(targets))
    assert_log_intact(log, before)
    # The log, and the session's evidence binding (effects.md): nothing forged beside them.
    binding = f".{session_id}.evidence.json"
    assert {p.name for p in sessions.iterdir()} <= {log.name, binding}
    assert (root / ".tether" / "effects.db").read_bytes().startswith(b"SQLite format 3")


# --------------------------------------------------------------------------- the Python API


def test_the_agent_hands_its_own_layout_to_every_tool(tmp_path: Path) -> None:
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    seen: list[ProtectedState | None] = []

    @tool
    def probe(arguments: Mapping[str, Any], context: ToolContext) -> str:
        """Record the context."""
        seen.append(context.protected)
        return "ok"

    responses = [
        {"tool_calls": [call("probe"), forge("logs/x.jsonl"), forge("keep.txt")]},
        {"content": "done"},
    ]
    (ws / "s.json").write_text(json.dumps({"model": "scripted/t", "responses": responses}))
    agent = Agent(
        ScriptedModel.from_file(ws / "s.json"),
        [*builtin_tools(), probe],
        workspace=ws,
        sessions_dir=ws / "logs",
    )
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert result.status.value == "completed"
    assert seen == [ProtectedState(ws / ".tether", ws / "logs")]
    logs = [p for p in (ws / "logs").iterdir() if not p.name.endswith(".evidence.json")]
    assert [p.suffix for p in logs] == [".jsonl"]  # nothing forged beside the log
    transcript = reduce_session(result.session_path.read_bytes()).transcript
    [refusal] = [m["content"] for m in transcript if "own state" in (m["content"] or "")]
    assert refusal.startswith("Error: 'logs/x.jsonl' is tether's own state")
    assert (ws / "keep.txt").read_text() == "forged\n"


def test_a_sessions_directory_that_is_the_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is the workspace itself"):
        ProtectedState.for_workspace(tmp_path, tmp_path)
    with pytest.raises(ConfigurationError, match="is the workspace itself"):
        Agent(
            ScriptedModel.from_json({"model": "scripted/t", "responses": [{"content": "x"}]}),
            workspace=tmp_path,
            sessions_dir=tmp_path / "a" / "..",
        )
    # Above the workspace is fine: its logs are out of the tools' reach (but hard links).
    assert ProtectedState.for_workspace(tmp_path / "ws", tmp_path).sessions_dir == tmp_path


def test_file_tools_with_a_hand_made_context(tmp_path: Path) -> None:
    ws = (tmp_path / "ws").resolve()
    (ws / "logs").mkdir(parents=True)
    (ws / "logs" / "a.jsonl").write_text("log\n")
    os.link(ws / "logs" / "a.jsonl", ws / "alias.jsonl")
    (ws / "plain.txt").write_text("plain\n")
    os.link(ws / "plain.txt", ws / "plain-too.txt")  # linked, but not to tether's state
    custom = ToolContext(ws, "op", protected=ProtectedState.for_workspace(ws, ws / "logs"))
    default = ToolContext(ws, "op")  # the default layout: .tether/ only
    for path in ("logs/a.jsonl", "alias.jsonl"):
        result = WriteTool().run({"path": path, "content": "x"}, custom)
        assert result.is_error and REFUSED in result.content, result.content
        result = ReadTool().run({"path": path}, custom)
        assert result.is_error and REFUSED in result.content, result.content
        assert not ReadTool().run({"path": path}, default).is_error
    assert (ws / "logs" / "a.jsonl").read_text() == "log\n"
    assert os.stat(ws / "alias.jsonl").st_ino == os.stat(ws / "logs" / "a.jsonl").st_ino
    edited = EditTool().run(
        {"path": "plain-too.txt", "old_string": "plain", "new_string": "edited"}, custom
    )
    assert not edited.is_error, edited.content
    # The same checks hold in the plan/apply functions the journal uses.
    with pytest.raises(ProtectedPath, match="logs is the sessions directory"):
        plan_write(ws, "logs/new.jsonl", "x", protected=custom.protected)
    change = plan_write(ws, "later/x.jsonl", "x", protected=custom.protected)
    os.rename(ws / "logs", ws / "later")  # the sessions folder moved in since the plan…
    (ws / "logs").symlink_to(ws / "later")  # …and the configured path still leads to it
    with pytest.raises(ProtectedPath, match="later is the sessions directory"):
        apply_change(ws, change, protected=custom.protected)
    assert sorted(p.name for p in (ws / "later").iterdir()) == ["a.jsonl"]
