"""Hostile session logs on the resume path: real ``python -m tether resume`` subprocesses.

A log whose line nests JSON thousands deep (a ``stepAttempt`` line of the body, or the
header line) is named as corrupt (exit 5, the line given), never ``internal error:
RecursionError`` (exit 70): the settings bound to the session are looked up in the log
before the store opens it, and that lookup once parsed with ``json.loads``. A FIFO in
place of the log is refused at once as not a regular file (exit 8), never a hang: the
subprocess runs under a timeout, so a regression fails instead of blocking the suite.
Under a reducer checkpoint (``.<id>.checkpoint.json``) the same: a line rewritten inside
the prefix it covers, or a hostile line after it, is named exactly as without it, and a
checkpoint of another session changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from test_cli_inputs import run_bounded
from tether._loading import load_reducer
from tether._stores import checkpoints
from tether._stores.sidecar import FileSidecar

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 20.0
DEEP = 100_000

EXIT_CORRUPT = 5
EXIT_UNSAFE_PATH = 8


def _tether(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_bounded(*args, cwd=cwd, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with one finished session run with a flag (so a settings record exists,
    and resume reads the log's ``stepAttempt`` to vouch for it)."""
    base = tmp_path_factory.mktemp("recorded")
    script = base / "script.json"
    script.write_text(json.dumps({"responses": [{"content": "done"}]}), encoding="utf-8")
    workspace = base / "ws"
    workspace.mkdir()
    result = _tether(
        "run", "hi", "--model", f"scripted:{script}", "--workspace", workspace, cwd=base
    )
    assert result.returncode == 0, result.stderr
    return workspace


@pytest.fixture
def workspace(recorded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ws"
    shutil.copytree(recorded, copy)
    return copy


def _log(workspace: Path) -> Path:
    (log,) = (workspace / ".tether" / "sessions").glob("*.jsonl")
    return log


def _session_id(log: Path) -> str:
    return str(json.loads(log.read_bytes().split(b"\n", 1)[0])["id"])


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert "internal error" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _deep_body(log: Path) -> int:
    line = b"[" * DEEP + b'{"record":{"type":"stepAttempt"}}' + b"]" * DEEP + b"\n"
    data = log.read_bytes()
    log.write_bytes(data + line)
    return data.count(b"\n") + 1


def _deep_header(log: Path) -> int:
    header, rest = log.read_bytes().split(b"\n", 1)
    deep = header[:-1] + b',"x":' + b"[" * DEEP + b"]" * DEEP + b"}\n"
    log.write_bytes(deep + rest)
    return 1


@pytest.mark.parametrize(
    ("damage", "by_path"),
    [(_deep_body, False), (_deep_header, False), (_deep_header, True)],
    ids=["body-by-id", "header-by-id", "header-by-path"],
)
def test_deeply_nested_line_is_named_as_corrupt(
    damage: Callable[[Path], int], by_path: bool, workspace: Path
) -> None:
    log = _log(workspace)
    session = str(log) if by_path else _session_id(log)
    line_number = damage(log)
    result = _tether("resume", session, "--workspace", workspace, cwd=workspace.parent)
    line = _one_error(result)
    assert result.returncode == EXIT_CORRUPT, line
    assert f"MALFORMED_JSON at line {line_number}" in line, line


@pytest.mark.parametrize("by_path", [False, True], ids=["by-id", "by-path"])
def test_fifo_in_place_of_the_log_is_refused_without_blocking(
    by_path: bool, workspace: Path
) -> None:
    log = _log(workspace)
    session = str(log) if by_path else _session_id(log)
    log.unlink()
    os.mkfifo(log)
    result = _tether("resume", session, "--workspace", workspace, cwd=workspace.parent)
    line = _one_error(result)
    assert result.returncode == EXIT_UNSAFE_PATH, line
    assert "not a regular file" in line, line
    assert result.stdout == ""


# ------------------------------------------------- under a reducer checkpoint (its sidecar)


def _checkpoint(workspace: Path) -> Path:
    """Write the reducer checkpoint of the recorded session (too short for a writer to
    write one on its own) and return its path."""
    log = _log(workspace)
    data = log.read_bytes()
    sidecar = log.parent / f".{_session_id(log)}.checkpoint.json"
    assert checkpoints.save(load_reducer(data), hashlib.sha256(data), FileSidecar(sidecar))
    return sidecar


def _rewrite_under(log: Path) -> int:
    """A line inside the prefix the checkpoint covers made corrupt (its seq bumped)."""
    lines = log.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"seq":', b'"seq":7', 1)
    log.write_bytes(b"\n".join(lines))
    return 3


@pytest.mark.parametrize(
    ("damage", "code"),
    [(_rewrite_under, "SEQ_MISMATCH"), (_deep_body, "MALFORMED_JSON")],
    ids=["rewritten-under-the-checkpoint", "deep-line-after-the-checkpoint"],
)
def test_a_log_damaged_under_or_after_its_checkpoint_is_named_as_corrupt(
    damage: Callable[[Path], int], code: str, workspace: Path
) -> None:
    _checkpoint(workspace)
    log = _log(workspace)
    line_number = damage(log)
    result = _tether("resume", _session_id(log), "--workspace", workspace, cwd=workspace.parent)
    line = _one_error(result)
    assert result.returncode == EXIT_CORRUPT, line
    assert f"{code} at line {line_number}" in line, line


def test_a_checkpoint_of_another_session_or_garbage_changes_nothing(workspace: Path) -> None:
    sidecar = _checkpoint(workspace)
    log = _log(workspace)
    forged = sidecar.read_bytes().replace(_session_id(log).encode(), b"0" * 36)
    sidecar.write_bytes(forged)
    result = _tether("resume", _session_id(log), "--workspace", workspace, cwd=workspace.parent)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
