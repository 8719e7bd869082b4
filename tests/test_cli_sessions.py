"""``tether sessions`` and ``tether inspect SESSION`` (lookup by id), as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tether._stores.file import SessionStore, sessions_dir_for

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "conformance" / "fixtures"


def run_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TETHER_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "tether", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_session(workspace: Path, model: str = "test/model") -> str:
    store = SessionStore.create(
        workspace, provider="openrouter", model=model, environment_identity="fixture"
    )
    try:
        return store.session_id
    finally:
        store.close()


def test_sessions_lists_created_sessions(tmp_path: Path) -> None:
    first = make_session(tmp_path, "model/one")
    second = make_session(tmp_path, "model/two")
    result = run_cli("sessions", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = {item["id"]: item for item in json.loads(result.stdout)}
    assert set(listed) == {first, second}
    assert listed[first]["model"] == "model/one"
    assert listed[first]["operation"] == "idle"
    assert listed[first]["size"] > 0
    human = run_cli("sessions", cwd=tmp_path)
    assert human.returncode == 0
    assert first in human.stdout and second in human.stdout
    assert "model/two" in human.stdout


def test_sessions_empty_and_missing_folder(tmp_path: Path) -> None:
    result = run_cli("sessions", cwd=tmp_path)
    assert result.returncode == 0
    assert "no sessions" in result.stdout
    missing = run_cli("sessions", "--sessions-dir", tmp_path / "nope", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr


def test_sessions_reads_foreign_folder_and_flags_corrupt_logs(tmp_path: Path) -> None:
    foreign = tmp_path / ".tiny-agent" / "sessions"
    foreign.mkdir(parents=True)
    (foreign / "a.jsonl").write_bytes((FIXTURES / "completed-tool-run.jsonl").read_bytes())
    (foreign / "b.jsonl").write_bytes((FIXTURES / "overlapping-step.jsonl").read_bytes())
    result = run_cli("sessions", "--json", "--sessions-dir", foreign, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    by_name = {Path(item["path"]).name: item for item in json.loads(result.stdout)}
    assert by_name["a.jsonl"]["operation"] == "idle"
    assert by_name["a.jsonl"]["error"] is None
    assert by_name["b.jsonl"]["error"]["code"] == "INVALID_TRANSITION"


def test_inspect_by_id_and_prefix(tmp_path: Path) -> None:
    session_id = make_session(tmp_path)
    for query in (session_id, session_id[:13]):
        result = run_cli("inspect", query, "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        state = json.loads(result.stdout)["state"]
        assert state["header"]["id"] == session_id


def test_inspect_unknown_and_ambiguous_ids(tmp_path: Path) -> None:
    unknown = run_cli("inspect", "0000", cwd=tmp_path)
    assert unknown.returncode == 3
    assert "Traceback" not in unknown.stderr and unknown.stderr.count("\n") == 1
    ids = [make_session(tmp_path) for _ in range(3)]
    common = ids[0][:4]  # UUIDv7s made within the same minute share their leading hex
    assert all(i.startswith(common) for i in ids)
    ambiguous = run_cli("inspect", common, cwd=tmp_path)
    assert ambiguous.returncode == 7
    assert "Traceback" not in ambiguous.stderr


def test_inspect_by_id_in_other_sessions_dir(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    session_id = make_session(workspace)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli(
        "inspect",
        session_id,
        "--json",
        "--sessions-dir",
        sessions_dir_for(workspace),
        cwd=elsewhere,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
