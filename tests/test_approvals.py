"""Parked approvals through the real CLI: ``run`` with nobody to ask parks an ``ask`` call,
``tether approvals``/``approve``/``deny`` decide it from another process, ``resume`` carries
the decision out. Crash cases kill the parker and the approver with SIGKILL at named
boundaries (:mod:`tether._faults`)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from test_cli_run import cli_env, json_lines, run_cli, script, tool_results
from tether._cli.run_cmd import EXIT_AWAITING_APPROVAL

ASK_TOML = '[policy.tools]\nbash = "ask"\nwrite = "ask"\nedit = "ask"\n'


def bash_call(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def write_call(path: str, content: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "write", "arguments": {"path": path, "content": content}}]}


DONE: dict[str, Any] = {"content": "done"}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "tether.toml").write_text(ASK_TOML)
    return tmp_path


def session_of(workspace: Path) -> tuple[str, Path]:
    [path] = sorted((workspace / ".tether" / "sessions").glob("*.jsonl"))
    return path.stem.split("_", 1)[1], path


def parked(workspace: Path, *extra: str) -> list[dict[str, Any]]:
    listed = run_cli("approvals", "--json", *extra, cwd=workspace)
    assert listed.returncode == 0, listed.stderr
    value: list[dict[str, Any]] = json.loads(listed.stdout)
    return value


def one_error(stderr: str, contains: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert contains in stderr, stderr


def test_a_parked_call_waits_and_runs_once_after_approval(ws: Path) -> None:
    model = script(ws, [bash_call("echo 1 >> counter.txt"), DONE])
    first = run_cli("run", "count", "--model", model, cwd=ws)
    assert first.returncode == EXIT_AWAITING_APPROVAL, first.stderr
    assert "awaiting approval: call #1 (bash: echo 1 >> counter.txt)" in first.stderr
    assert "tether approve 1" in first.stderr
    assert not (ws / "counter.txt").exists()
    session_id, path = session_of(ws)
    # The parked message names the resume once; no closing line repeats it.
    assert first.stderr.count(f"tether resume {session_id}") == 1, first.stderr
    assert "continue with" not in first.stderr
    [request] = parked(ws)
    assert request["status"] == "proposed"
    assert request["arguments"] == {"command": "echo 1 >> counter.txt"}
    assert request["sessionId"] == session_id
    assert request["argumentsDigest"].startswith("sha256:")
    assert request["artifactVersion"]  # bash touches unknown files: the whole workspace
    shown = run_cli("approvals", cwd=ws)
    assert "$ echo 1 >> counter.txt" in shown.stdout
    # Resuming before anybody decided parks it again (same call, same id).
    again = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert again.returncode == EXIT_AWAITING_APPROVAL
    assert len(parked(ws)) == 1
    approved = run_cli("approve", "1", "--as", "alice", cwd=ws)
    assert approved.returncode == 0, approved.stderr
    assert f"tether resume {session_id}" in approved.stdout
    resumed = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert (ws / "counter.txt").read_text() == "1\n"
    assert parked(ws) == []
    [decision] = json.loads(run_cli("authorizations", "--json", cwd=ws).stdout)
    assert (decision["decision"], decision["who"]) == ("allow", "alice")
    assert "tether approve" in decision["reason"]
    # Done once: another resume has nothing to do.
    assert run_cli("resume", session_id, "--model", model, cwd=ws).returncode == 0
    assert (ws / "counter.txt").read_text() == "1\n"
    assert len(tool_results(path)) == 1


def test_a_denied_call_never_runs_and_the_model_reads_why(ws: Path) -> None:
    model = script(ws, [bash_call("echo 1 >> counter.txt"), DONE])
    assert run_cli("run", "count", "--model", model, cwd=ws).returncode == 67
    session_id, path = session_of(ws)
    missing_why = run_cli("deny", "1", cwd=ws)
    assert missing_why.returncode == 2
    denied = run_cli("deny", "1", "--why", "not today", "--as", "bob", cwd=ws)
    assert denied.returncode == 0, denied.stderr
    resumed = run_cli("resume", session_id, "--model", model, "--json", cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert not (ws / "counter.txt").exists()
    [result] = tool_results(path)
    content = result["message"]["content"]
    assert "permission denied" in content and "not today" in content and "bob" in content
    skipped = [e for e in json_lines(resumed.stdout) if e["event"] == "tool_skipped"]
    assert [e["reason"] for e in skipped] == ["declined"]
    approve_after = run_cli("approve", "1", cwd=ws)
    assert approve_after.returncode == 26
    one_error(approve_after.stderr, "already denied by bob")


def test_approving_twice_unknown_ids_and_bad_ids_give_one_line(ws: Path) -> None:
    none_yet = run_cli("approve", "1", cwd=ws)
    assert none_yet.returncode == 25
    one_error(none_yet.stderr, "no parked call #1")
    model = script(ws, [bash_call("true"), DONE])
    assert run_cli("run", "go", "--model", model, cwd=ws).returncode == 67
    assert run_cli("approve", "#1", cwd=ws).returncode == 0
    twice = run_cli("approve", "1", cwd=ws)
    assert twice.returncode == 26
    one_error(twice.stderr, "parked call #1 was already approved")
    unknown = run_cli("approve", "42", cwd=ws)
    assert unknown.returncode == 25
    one_error(unknown.stderr, "no parked call #42")
    bad = run_cli("deny", "x1", "--why", "no", cwd=ws)
    assert bad.returncode == 25
    one_error(bad.stderr, "ids are numbers")


def test_a_stale_call_cannot_be_approved_and_is_proposed_again(ws: Path) -> None:
    (ws / "notes.txt").write_text("old\n")
    model = script(ws, [write_call("notes.txt", "new\n"), DONE])
    assert run_cli("run", "write", "--model", model, cwd=ws).returncode == 67
    session_id, _ = session_of(ws)
    shown = run_cli("approvals", cwd=ws).stdout
    assert "-old" in shown and "+new" in shown  # the diff against the file as it is now
    (ws / "notes.txt").write_text("changed by a person\n")
    stale = run_cli("approve", "1", cwd=ws)
    assert stale.returncode == 26
    one_error(stale.stderr, "stale and now void: notes.txt changed")
    [void] = parked(ws, "--all")
    assert void["status"] == "void"
    again = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert again.returncode == 67
    [fresh] = parked(ws)
    assert fresh["id"] == 2
    assert run_cli("approve", "2", cwd=ws).returncode == 0
    assert run_cli("resume", session_id, "--model", model, cwd=ws).returncode == 0
    assert (ws / "notes.txt").read_text() == "new\n"


def test_an_approval_goes_void_when_the_file_changes_before_the_resume(ws: Path) -> None:
    model = script(ws, [write_call("notes.txt", "new\n"), DONE])
    assert run_cli("run", "write", "--model", model, cwd=ws).returncode == 67
    session_id, _ = session_of(ws)
    assert run_cli("approve", "1", cwd=ws).returncode == 0
    (ws / "notes.txt").write_text("appeared meanwhile\n")
    resumed = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert resumed.returncode == 67
    assert "the decision on call #1 is void: notes.txt changed" in resumed.stderr
    assert (ws / "notes.txt").read_text() == "appeared meanwhile\n"
    assert [r["id"] for r in parked(ws)] == [2]


def test_always_allows_later_calls_under_the_same_rule(ws: Path) -> None:
    model = script(ws, [bash_call("echo a >> log.txt"), bash_call("echo b >> log.txt"), DONE])
    assert run_cli("run", "go", "--model", model, cwd=ws).returncode == 67
    session_id, _ = session_of(ws)
    assert run_cli("approve", "1", "--always", cwd=ws).returncode == 0
    resumed = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert (ws / "log.txt").read_text() == "a\nb\n"
    assert len(parked(ws, "--all")) == 1


def test_run_json_names_the_parked_call(ws: Path) -> None:
    model = script(ws, [bash_call("true"), DONE])
    result = run_cli("run", "go", "--model", model, "--json", cwd=ws)
    assert result.returncode == 67
    lines = json_lines(result.stdout)
    [event] = [e for e in lines if e["event"] == "approval_parked"]
    assert event["requestId"] == 1 and event["callId"]
    assert lines[-1]["status"] == "awaiting_approval"
    assert lines[-1]["parkedCall"] == 1


def test_yes_still_allows_without_parking(ws: Path) -> None:
    model = script(ws, [bash_call("echo 1 >> counter.txt"), DONE])
    assert run_cli("run", "go", "--model", model, "--yes", cwd=ws).returncode == 0
    assert (ws / "counter.txt").read_text() == "1\n"
    assert parked(ws, "--all") == []


# --------------------------------------------------------------------------- SIGKILL


def test_the_parked_call_survives_sigkill_of_the_parker(ws: Path) -> None:
    model = script(ws, [bash_call("echo 1 >> counter.txt"), DONE])
    env = cli_env(TETHER_CRASH_AT="approval.parked")
    killed = run_cli("run", "count", "--model", model, cwd=ws, env=env)
    assert killed.returncode == -signal.SIGKILL
    session_id, _ = session_of(ws)
    [request] = parked(ws)  # durable before the parker died
    assert request["status"] == "proposed"
    assert run_cli("approve", str(request["id"]), cwd=ws).returncode == 0
    assert run_cli("resume", session_id, "--model", model, cwd=ws).returncode == 0
    assert (ws / "counter.txt").read_text() == "1\n"


@pytest.mark.parametrize(
    ("boundary", "recorded"), [("approval.deciding", False), ("approval.decided", True)]
)
def test_a_decision_survives_sigkill_of_the_approver(
    ws: Path, boundary: str, recorded: bool
) -> None:
    model = script(ws, [bash_call("echo 1 >> counter.txt"), DONE])
    assert run_cli("run", "count", "--model", model, cwd=ws).returncode == 67
    session_id, _ = session_of(ws)
    killed = run_cli("approve", "1", cwd=ws, env=cli_env(TETHER_CRASH_AT=boundary))
    assert killed.returncode == -signal.SIGKILL
    [request] = parked(ws, "--all")
    assert request["status"] == ("approved" if recorded else "proposed")
    again = run_cli("approve", "1", cwd=ws)
    assert again.returncode == (26 if recorded else 0), again.stderr
    assert run_cli("resume", session_id, "--model", model, cwd=ws).returncode == 0
    assert (ws / "counter.txt").read_text() == "1\n"
