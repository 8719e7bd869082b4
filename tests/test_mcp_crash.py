"""Crash consistency of MCP tools: a real agent process (tests/mcp_child.py) calls a real
MCP server (tests/mcp_server.py, written with the SDK) and is killed with SIGKILL at
before_effect, after_effect and after_result; a second process resumes the session.

* ``notes__append`` (untrusted, no lookup): never run again — ``interrupted`` when the
  crash left it pending — so notes.txt never holds a line twice;
* ``notes__count_lines`` (``trusted_read_only``): replayed after a crash;
* ``notes__append_once`` (``lookup = "find_append"``): recovered from the server's record
  when it committed (``recovered_from_ledger``), executed exactly once when it did not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpkit import child, lines, notes_server, script_calling, session_of, workspace_with
from tether.core import reduce_session
from tether.core.state import IdleOperation

BOUNDARIES = ["before_effect", "after_effect", "after_result"]


def crash_then_resume(workspace: Path, boundary: str) -> tuple[dict, Path, str]:
    crashed = child("run", workspace, crash_at=boundary)
    assert crashed.returncode == -9, crashed.stderr
    session, log = session_of(workspace)
    resumed = child("resume", workspace, session)
    assert resumed.returncode == 0, resumed.stderr
    return json.loads(resumed.stdout), log, session


def tool_messages(log: Path) -> list[dict]:
    state = reduce_session(log.read_bytes())
    assert isinstance(state.operation, IdleOperation)
    return [m for m in state.transcript if m["role"] == "tool"]


def assert_resume_again_changes_nothing(workspace: Path, log: Path, session: str) -> None:
    before = log.read_bytes()
    again = child("resume", workspace, session)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "idle"
    assert log.read_bytes() == before


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_untrusted_append_is_never_run_twice(tmp_path: Path, boundary: str) -> None:
    script = script_calling(("notes__append", {"line": "one"}))
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), script=script)
    result, log, session = crash_then_resume(workspace, boundary)
    assert result["status"] == "completed"
    (tool,) = tool_messages(log)
    notes = lines(workspace / "notes.txt")
    assert notes.count("one") <= 1  # zero duplicates
    if boundary == "before_effect":
        assert notes == [] and tool["content"].startswith("Operation interrupted")
    elif boundary == "after_effect":
        assert notes == ["one"] and tool["content"].startswith("Operation interrupted")
    else:
        assert notes == ["one"] and tool["content"] == "appended 'one'"
    assert_resume_again_changes_nothing(workspace, log, session)
    assert lines(workspace / "notes.txt").count("one") <= 1


@pytest.mark.parametrize("boundary", ["before_effect", "after_effect"])
def test_trusted_read_only_tool_is_replayed(tmp_path: Path, boundary: str) -> None:
    script = script_calling(("notes__count_lines", {}))
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), script=script)
    (workspace / "notes.txt").write_text("a\nb\n")
    result, log, _ = crash_then_resume(workspace, boundary)
    assert result["status"] == "completed"
    (tool,) = tool_messages(log)
    assert tool["content"] == "2 lines"  # the replay's own result, not "interrupted"
    reads = len(lines(workspace / "reads.txt"))
    assert reads == (1 if boundary == "before_effect" else 2)


def test_the_same_tool_untrusted_is_interrupted(tmp_path: Path) -> None:
    script = script_calling(("notes__count_lines", {}))
    table = notes_server(tmp_path / "ws", trusted=())
    workspace = workspace_with(tmp_path, table, script=script)
    result, log, _ = crash_then_resume(workspace, "after_effect")
    assert result["status"] == "completed"
    (tool,) = tool_messages(log)
    assert tool["content"].startswith("Operation interrupted")
    assert len(lines(workspace / "reads.txt")) == 1  # never run again


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_tool_with_a_lookup_is_recovered_from_it_and_never_rerun(
    tmp_path: Path, boundary: str
) -> None:
    script = script_calling(("notes__append_once", {"line": "two"}))
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), script=script)
    result, log, session = crash_then_resume(workspace, boundary)
    assert result["status"] == "completed"
    (tool,) = tool_messages(log)
    assert tool["content"] == "appended 'two' once"
    assert lines(workspace / "notes.txt") == ["two"]  # exactly once
    ops = json.loads((workspace / "ops.json").read_text())
    assert list(ops) == [tool_started_id(log)]  # the operation id reached the server
    if boundary == "after_effect":
        (event,) = result["events"]
        assert event["verdict"] == "committed" and event["recoveredFromLedger"] is True
    elif boundary == "before_effect":
        (event,) = result["events"]
        assert event["verdict"] == "notFound"  # executed once, with the same operation id
    else:
        assert result["events"] == []
    assert_resume_again_changes_nothing(workspace, log, session)
    assert lines(workspace / "notes.txt") == ["two"]


def tool_started_id(log: Path) -> str:
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if isinstance(record, dict) and (record.get("record") or {}).get("type") == "toolStarted":
            return str(record["id"])
    raise AssertionError("no toolStarted in the log")
