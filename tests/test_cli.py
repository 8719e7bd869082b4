"""The ``tether`` command line: output, exit codes and error reporting.

Most cases run the CLI as a real subprocess (``python -m tether``) so that entry point,
exit status and stream separation are exercised exactly as a user sees them; a few
use typer's in-process runner for speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tether._cli import app
from tether._cli.common import one_line, printable
from tether._cli.inspect_cmd import format_timestamp, message_preview
from tether._cli.plan_cmd import describe_plan
from tether.core import SessionState

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = REPO_ROOT / "tests" / "conformance"
FIXTURES = CONFORMANCE / "fixtures"
PLANNER_FIXTURES = CONFORMANCE / "planner-fixtures"


def load_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tether ARGS`` in a subprocess, capturing both streams."""
    env = dict(os.environ)
    env.pop("TETHER_DEBUG", None)
    env.pop("TETHER_MODEL", None)  # bare `tether` starts the REPL only with a model
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "tether", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )


def session(name: str) -> Path:
    return FIXTURES / f"{name}.jsonl"


def expected(name: str) -> Any:
    return load_json(FIXTURES / f"{name}.expected.json")


def expected_state(name: str) -> SessionState:
    return SessionState.from_json(expected(name)["state"])


def planner_case(name: str, tmp_path: Path) -> tuple[Path, Path, Any]:
    """(session file, CURRENT.json written to tmp_path, expected plan) of a planner case."""
    case = load_json(PLANNER_FIXTURES / f"{name}.json")
    current = tmp_path / f"{name}.current.json"
    current.write_text(json.dumps(case["current"]), encoding="utf-8")
    plan = load_json(PLANNER_FIXTURES / f"{name}.expected.json")
    return FIXTURES / case["sessionFile"], current, plan


def assert_one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def runner() -> CliRunner:
    try:  # click < 8.2 mixes stderr into stdout unless told otherwise
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner()


# ------------------------------------------------------------------------ inspect --json


# The cost stands beside the spec's members: 0 for a session that used nothing, null
# (unknown) for tokens of a model with no price (the fixtures' test/model).
@pytest.mark.parametrize(
    ("name", "cost"),
    [("header-only", 0.0), ("completed-tool-run", None), ("pending-safe-tool", 0.0)],
)
def test_inspect_json_ok_matches_fixture(name: str, cost: float | None) -> None:
    result = run_cli("inspect", session(name), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document.pop("costUsd") == cost
    assert document == expected(name)  # "ok" and the state exactly as the spec has them
    assert result.stderr == ""


def test_inspect_json_torn_tail_reports_repaired_length() -> None:
    result = run_cli("inspect", session("torn-tail"), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document.pop("costUsd") == 0.0
    assert document == expected("torn-tail")
    assert document["state"]["repairedLength"] < session("torn-tail").stat().st_size


@pytest.mark.parametrize(
    "name", ["overlapping-step", "malformed-complete-line", "crlf", "legacy-version-rejected"]
)
def test_inspect_json_corrupt_matches_fixture(name: str) -> None:
    result = run_cli("inspect", session(name), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == expected(name)
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------ inspect (human)


def test_inspect_human_completed_run() -> None:
    result = run_cli("inspect", session("completed-tool-run"))
    assert result.returncode == 0, result.stderr
    state = expected("completed-tool-run")["state"]
    out = result.stdout
    header = state["header"]
    for item in (header["id"], header["cwd"], header["provider"], header["model"]):
        assert item in out
    assert format_timestamp(header["createdAt"]) in out
    assert "idle" in out
    assert f"{len(state['transcript'])} messages" in out
    usage = state["usage"]
    assert f"input {usage['input']}, output {usage['output']}" in out
    assert "no torn tail" in out
    assert result.stderr == ""


def test_inspect_human_pending_tool() -> None:
    result = run_cli("inspect", session("pending-safe-tool"))
    assert result.returncode == 0, result.stderr
    operation = expected("pending-safe-tool")["state"]["operation"]
    out = result.stdout
    assert f"run {operation['operationId']}" in out
    assert operation["step"]["stepId"] in out
    assert "stop reason" in out and operation["step"]["stopReason"] in out
    tool = operation["toolCalls"][0]
    assert tool["toolName"] in out and tool["toolCallId"] in out
    assert "pending" in out
    assert "abort" in out


def test_inspect_human_torn_tail() -> None:
    result = run_cli("inspect", session("torn-tail"))
    assert result.returncode == 0, result.stderr
    torn = session("torn-tail").stat().st_size - expected("torn-tail")["state"]["repairedLength"]
    assert f"torn tail: {torn} bytes would be cut on repair" in result.stdout


def test_inspect_human_corrupt_is_one_line_on_stderr() -> None:
    result = run_cli("inspect", session("overlapping-step"))
    assert result.returncode == 1
    assert result.stdout == ""
    error = expected("overlapping-step")["error"]
    line = assert_one_error_line(result.stderr)
    name = session("overlapping-step")
    assert line.startswith(f"error: session {name} is corrupt: ")
    assert f"{error['code']} at line {error['line']}, seq {error['seq']}" in line
    # the next step, and "corrupt" once (issue 32, item 9)
    before = error["line"] - 1
    assert f"the {before} lines before it are intact: `tether show {name}` shows them" in line
    assert line.count("corrupt") == 1


def test_inspect_non_session_file_is_corrupt(tmp_path: Path) -> None:
    not_a_session = tmp_path / "notes.txt"
    not_a_session.write_bytes(b"hello\nworld\n\xff\xfe garbage")
    result = run_cli("inspect", not_a_session)
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr)
    assert f"session {not_a_session} is corrupt: " in line
    assert "its first line is no session header" in line


def test_inspect_empty_file_is_missing_header(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    result = run_cli("inspect", empty, "--json")
    assert result.returncode == 1
    error = {"code": "MISSING_HEADER", "line": 1}
    assert json.loads(result.stdout) == {"ok": False, "error": error}


def test_inspect_missing_file_exits_2(tmp_path: Path) -> None:
    for extra in ((), ("--json",)):
        result = run_cli("inspect", tmp_path / "absent.jsonl", *extra)
        assert result.returncode == 2
        assert result.stdout == ""
        assert "absent.jsonl" in assert_one_error_line(result.stderr)


def test_inspect_directory_exits_2(tmp_path: Path) -> None:
    result = run_cli("inspect", tmp_path)
    assert result.returncode == 2
    assert "directory" in assert_one_error_line(result.stderr)


def test_usage_errors_exit_2() -> None:
    assert run_cli("inspect", session("header-only"), "--bogus").returncode == 2
    assert run_cli("inspect").returncode == 2
    assert run_cli("no-such-command").returncode == 2
    assert run_cli().returncode == 2


def test_help_and_version() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "inspect" in result.stdout and "plan" in result.stdout
    version = run_cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("tether ")


def test_exit_freezes_what_the_command_left() -> None:
    """The process's exit (``tether._cli.main``): what the command left is frozen, so the
    interpreter's exit does not collect it; the command's output and the exit's handlers
    are still there, in order."""
    script = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('at exit: frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['tether', '--version']\n"
        "from tether._cli import main\n"
        "print('before: frozen', gc.get_freeze_count() > 0)\n"
        "main()\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH")) if p
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    before, version, at_exit = result.stdout.splitlines()
    assert (before, at_exit) == ("before: frozen False", "at exit: frozen True")
    assert version.startswith("tether ")


# ------------------------------------------------------------------------ plan


@pytest.mark.parametrize("name", ["retry-attempt", "configuration-changed", "replay-safe-tool"])
def test_plan_json_matches_fixture(name: str, tmp_path: Path) -> None:
    session_file, current, plan = planner_case(name, tmp_path)
    result = run_cli("plan", session_file, "--current", current, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == plan


def test_plan_human_retry(tmp_path: Path) -> None:
    session_file, current, plan = planner_case("retry-attempt", tmp_path)
    result = run_cli("plan", session_file, "--current", current)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"retry the model call: attempt 2 of step {plan['stepId']} "
        f"at context {plan['contextThroughEntryId']}"
    )


def test_plan_human_blocked(tmp_path: Path) -> None:
    session_file, current, _ = planner_case("configuration-changed", tmp_path)
    result = run_cli("plan", session_file, "-c", current)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("blocked: configuration_changed")


def test_plan_corrupt_session_exits_1(tmp_path: Path) -> None:
    _, current, _ = planner_case("retry-attempt", tmp_path)
    result = run_cli("plan", session("overlapping-step"), "--current", current)
    assert result.returncode == 1
    assert "INVALID_TRANSITION" in assert_one_error_line(result.stderr)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"configurationDigest": 5, "environmentIdentity": [], "tools": "x"}', "current"),
        (b"", "not valid JSON"),
    ],
    ids=["not-json", "not-an-object", "wrong-shape", "empty"],
)
def test_plan_bad_current_exits_2(content: bytes, fragment: str, tmp_path: Path) -> None:
    bad = tmp_path / "current.json"
    bad.write_bytes(content)
    result = run_cli("plan", session("open-attempt"), "--current", bad, "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert fragment in assert_one_error_line(result.stderr)


def test_plan_missing_current_exits_2(tmp_path: Path) -> None:
    result = run_cli("plan", session("open-attempt"), "--current", tmp_path / "absent.json")
    assert result.returncode == 2
    assert "absent.json" in assert_one_error_line(result.stderr)
    assert run_cli("plan", session("open-attempt")).returncode == 2  # --current is required


# ------------------------------------------------------------------------ in-process


def test_in_process_inspect_json() -> None:
    result = runner().invoke(app, ["inspect", str(session("run-accepted")), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document.pop("costUsd") == 0.0
    assert document == expected("run-accepted")


def test_in_process_missing_file() -> None:
    result = runner().invoke(app, ["inspect", "/nonexistent/session.jsonl"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot read session file")


# ------------------------------------------------------------------------ pure helpers


def test_describe_plan_sentences() -> None:
    idle = expected_state("header-only")
    running = expected_state("open-attempt")
    assert describe_plan(
        {"type": "finish", "outcome": "completed", "completion": "normal"}, idle
    ).startswith("nothing to do")
    assert (
        describe_plan(
            {"type": "finish", "outcome": "completed", "completion": "normal", "finalEntryId": "E"},
            running,
        )
        == "finish the run as completed (normal) with final entry E"
    )
    failed = {
        "type": "finish",
        "outcome": "failed",
        "error": {"code": "model_error", "message": "provider request failed"},
    }
    assert describe_plan(failed, running) == (
        "finish the run as failed (model_error: provider request failed)"
    )
    assert describe_plan({"type": "finish", "outcome": "aborted"}, running) == (
        "finish the run as aborted"
    )
    assert describe_plan(
        {"type": "startStep", "stepKind": "assistant", "attempt": 1, "contextThroughEntryId": "E"},
        running,
    ) == ("start the model call: attempt 1 of a new step at context E")
    assert describe_plan(
        {
            "type": "startStep",
            "stepKind": "assistant",
            "attempt": 2,
            "stepId": "S",
            "contextThroughEntryId": "E",
        },
        running,
    ) == ("retry the model call: attempt 2 of step S at context E")
    assert describe_plan({"type": "blocked", "reason": "configuration_changed"}, running) == (
        "blocked: configuration_changed — restore the configuration or abort"
    )
    close = {"type": "closeAttempt", "error": {"code": "aborted", "message": "Operation aborted"}}
    assert describe_plan(close, running).startswith("close the open attempt of step ")
    synthetic = {
        "type": "appendSynthetic",
        "results": [
            {"toolIndex": 0, "toolName": "read", "toolCallId": "c0", "reason": "truncated"},
            {"toolIndex": 1, "toolName": "ls", "toolCallId": "c1", "reason": "truncated"},
        ],
    }
    assert describe_plan(synthetic, running) == (
        "append 2 synthetic tool results: #0 read [c0]: truncated; #1 ls [c1]: truncated"
    )
    start = {
        "type": "startTool",
        "mode": "start",
        "assistantEntryId": "A",
        "toolIndex": 0,
        "toolName": "read",
        "arguments": {"path": "x"},
    }
    assert 'record toolStarted, then execute with {"path":"x"}' in describe_plan(start, running)


def test_format_timestamp() -> None:
    assert format_timestamp(1710000000000) == "2024-03-09T16:00:00.000Z"
    assert format_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert "ms since the epoch" in format_timestamp(9007199254740991)


def test_message_preview_is_one_safe_line() -> None:
    assert message_preview({"role": "user", "content": "hi\nthere"}) == "hi there"
    assert message_preview({"role": "assistant", "content": None}) == "(no text)"
    call = {"id": "c", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    assert message_preview({"role": "assistant", "content": "", "tool_calls": [call]}) == (
        "→ read({})"
    )
    assert message_preview({"role": "tool", "content": "ok", "tool_call_id": "c"}) == "[c] ok"
    long = message_preview({"role": "user", "content": "x" * 500})
    assert len(long) <= 72 and long.endswith("…")
    assert "\x1b" not in message_preview({"role": "user", "content": "\x1b[2Jboom"})


def test_printable_escapes_controls() -> None:
    assert printable("a\x1bb\x85c\u202ed") == "a\\x1bb\\x85c\\u202ed"
    assert one_line("a\n\tb  c") == "a b c"
