"""Everyday use through the real CLI: continuing a session without retyping its model,
``--last`` and id prefixes, ``tether retry``, ``tether plan SESSION``."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from test_cli_run import cli_env, run_cli, script

FAIL: dict[str, Any] = {"error": {"code": "rate_limited", "message": "slow down"}}


def bash_call(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    # No automatic retries (the CLI's default is 2, docs/models.md): a failing script step
    # must stay the failed run these tests look at.
    (tmp_path / "tether.toml").write_text("[model]\nretries = 0\n")
    return tmp_path


def only_session(workspace: Path) -> str:
    [path] = sorted((workspace / ".tether" / "sessions").glob("*.jsonl"))
    return path.stem.split("_", 1)[1]


def user_entries(workspace: Path, session_id: str) -> list[str]:
    shown = run_cli("inspect", "--json", session_id, cwd=workspace)
    assert shown.returncode == 0, shown.stderr
    transcript = json.loads(shown.stdout)["state"]["transcript"]
    return [m["content"] for m in transcript if m["role"] == "user"]


def one_error(stderr: str, contains: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert contains in stderr, stderr


def test_resume_and_run_session_use_the_recorded_model(ws: Path) -> None:
    (ws / "sub").mkdir()
    model = script(ws, [bash_call("echo 1 >> counter.txt"), {"content": "one"}, {"content": "two"}])
    crashed = run_cli(
        "run", "count", "--model", model, cwd=ws, env=cli_env(TETHER_CRASH_AT="after_result")
    )
    assert crashed.returncode == -signal.SIGKILL
    session_id = only_session(ws)
    # No --model: the session's own (the script path was recorded absolute).
    resumed = run_cli("resume", session_id[:30], cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert "one" in resumed.stdout
    assert (ws / "counter.txt").read_text() == "1\n"
    again = run_cli("run", "--last", "again", cwd=ws)
    assert again.returncode == 0, again.stderr
    assert "two" in again.stdout
    assert user_entries(ws, session_id) == ["count", "again"]


def test_an_explicit_model_flag_wins_and_still_meets_the_gate(ws: Path) -> None:
    model = script(ws, [{"content": "first"}])
    other = script(ws, [{"content": "x"}], name="other.json")
    crashed = run_cli(
        "run", "go", "--model", model, cwd=ws, env=cli_env(TETHER_CRASH_AT="response_received")
    )
    assert crashed.returncode == -signal.SIGKILL
    blocked = run_cli("resume", "--last", "--model", other, cwd=ws)
    assert blocked.returncode == 65, blocked.stderr
    assert "configuration" in blocked.stderr
    assert run_cli("resume", "--last", cwd=ws).returncode == 0


def test_nothing_to_do_does_not_offer_a_resume(ws: Path) -> None:
    model = script(ws, [{"content": "hi"}])
    assert run_cli("run", "hello", "--model", model, cwd=ws).returncode == 0
    idle = run_cli("resume", "--last", cwd=ws)
    assert idle.returncode == 0
    assert "nothing to do" in idle.stderr
    assert "resume with" not in idle.stderr
    assert "continue with: tether run --session" in idle.stderr


def test_last_and_a_session_together_or_neither_is_one_usage_line(ws: Path) -> None:
    model = script(ws, [{"content": "hi"}])
    assert run_cli("run", "hello", "--model", model, cwd=ws).returncode == 0
    session_id = only_session(ws)
    both = run_cli("resume", session_id, "--last", cwd=ws)
    assert both.returncode == 2
    one_error(both.stderr, "not both")
    neither = run_cli("resume", cwd=ws)
    assert neither.returncode == 2
    one_error(neither.stderr, "or --last")
    inspect = run_cli("inspect", cwd=ws)
    assert inspect.returncode == 2
    one_error(inspect.stderr, "or --last")
    assert session_id in run_cli("inspect", "--last", cwd=ws).stdout
    decisions = run_cli("authorizations", "--last", "--json", cwd=ws)
    assert decisions.returncode == 0 and json.loads(decisions.stdout) == []


def test_last_picks_the_latest_activity(ws: Path) -> None:
    model = script(ws, [{"content": "a"}, {"content": "b"}])
    assert run_cli("run", "first", "--model", model, cwd=ws).returncode == 0
    assert run_cli("run", "second", "--model", model, cwd=ws).returncode == 0
    logs = sorted((ws / ".tether" / "sessions").glob("*.jsonl"))
    first_id = logs[0].stem.split("_", 1)[1]
    assert run_cli("run", "--session", first_id, "more", cwd=ws).returncode == 0
    shown = json.loads(run_cli("inspect", "--last", "--json", cwd=ws).stdout)
    assert shown["state"]["header"]["id"] == first_id


def test_retry_runs_the_failed_prompt_again_without_repeating_it(ws: Path) -> None:
    failing = script(ws, [FAIL])
    failed = run_cli("run", "say hi", "--model", failing, cwd=ws)
    assert failed.returncode == 1
    session_id = only_session(ws)
    # The failed step took position 0: the retry's step asks position 1.
    fixed = script(ws, [FAIL, {"content": "hello back"}], name="fixed.json")
    retried = run_cli("retry", "--last", "--model", fixed, cwd=ws)
    assert retried.returncode == 0, retried.stderr
    assert "hello back" in retried.stdout
    assert user_entries(ws, session_id) == ["say hi"]
    nothing = run_cli("retry", session_id, cwd=ws)
    assert nothing.returncode == 2
    assert "error: nothing to retry: the last operation" in nothing.stderr
    assert "resume with" not in nothing.stderr


def test_plan_session_computes_the_current_configuration(ws: Path) -> None:
    model = script(ws, [{"content": "first"}])
    crashed = run_cli(
        "run", "go", "--model", model, cwd=ws, env=cli_env(TETHER_CRASH_AT="response_received")
    )
    assert crashed.returncode == -signal.SIGKILL
    session_id = only_session(ws)
    planned = run_cli("plan", session_id[:13], "--json", cwd=ws)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert (plan["type"], plan["attempt"]) == ("startStep", 2)
    other = script(ws, [{"content": "x"}], name="other.json")
    changed = json.loads(run_cli("plan", "--last", "--model", other, "--json", cwd=ws).stdout)
    assert (changed["type"], changed["reason"]) == ("blocked", "configuration_changed")
    text = run_cli("plan", "--last", cwd=ws)
    assert text.stdout.startswith("retry the model call")


def test_a_failed_run_is_visible_in_sessions_and_inspect(ws: Path) -> None:
    failing = script(ws, [FAIL])
    assert (
        run_cli("run", "say hi to everyone in the room", "--model", failing, cwd=ws).returncode == 1
    )
    session_id = only_session(ws)
    [listed] = json.loads(run_cli("sessions", "--json", cwd=ws).stdout)
    assert listed["lastOutcome"] == "failed"
    assert listed["lastOperation"] == "run"
    assert listed["lastError"]["code"] == "rate_limited"
    assert listed["firstPrompt"] == "say hi to everyone in the room"
    assert listed["lastActivity"] >= listed["created"]
    table = run_cli("sessions", cwd=ws).stdout
    assert "last run failed: rate_limited: slow down" in table
    assert "say hi to everyone in the room" in table
    assert session_id in table  # never folded in a pipe
    shown = run_cli("inspect", session_id, cwd=ws).stdout
    assert "last run failed: rate_limited: slow down" in shown


def test_json_output_is_camel_case_and_to_json_is_text(ws: Path) -> None:
    from tether._runtime import events

    model = script(ws, [bash_call("true"), {"content": "hi"}])
    result = run_cli("run", "go", "--model", model, "--json", "--yes", cwd=ws)
    assert result.returncode == 0, result.stderr

    def keys(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [k for k, v in value.items() for k in (k, *keys(v))]
        if isinstance(value, list):
            return [k for v in value for k in keys(v)]
        return []

    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {line["event"] for line in lines} >= {"session", "tool_started", "result"}
    for line in lines:
        assert all("_" not in key for key in keys(line)), line
    event = events.ToolStarted(name="bash", call_id="c1")
    assert isinstance(event.to_json(), str)
    assert (
        json.loads(event.to_json())
        == event.to_dict()
        == {
            "event": "tool_started",
            "name": "bash",
            "callId": "c1",
            "replay": False,
        }
    )


COMMANDS = (
    "run",
    "resume",
    "retry",
    "repl",
    "inspect",
    "plan",
    "sessions",
    "review",
    "crashlab",
    "lab",
    "verify",
    "authorizations",
    "approvals",
    "approve",
    "deny",
)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run",), "Missing argument 'PROMPT'"),
        (("run", "x", "--bogus"), "No such option: --bogus"),
        (("nosuch",), "No such command 'nosuch'"),
        (("run", "x", "--max-steps", "many"), "Invalid value for '--max-steps'"),
        (("deny", "1"), "Missing option '--why'"),
    ],
)
def test_usage_errors_are_one_error_line(ws: Path, args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args, cwd=ws)
    assert result.returncode == 2
    one_error(result.stderr, needle)
    assert "--help" in result.stderr and "╭" not in result.stderr


def test_help_has_no_type_placeholders_and_examples_where_it_matters(ws: Path) -> None:
    for command in COMMANDS:
        shown = run_cli(command, "--help", cwd=ws)
        assert shown.returncode == 0, command
        for placeholder in ("<bool>", "<str>", "<int>", "<float>", "<path>", "\\["):
            assert placeholder not in shown.stdout, (command, placeholder)
        assert re.search(r"\{[A-Z]", shown.stdout) is None, command  # usage: {PROMPT}
        assert "[default: 0]" not in shown.stdout, command
    for command in ("run", "resume", "retry", "inspect", "plan", "sessions", "approve"):
        assert "Examples:" in run_cli(command, "--help", cwd=ws).stdout, command


def test_shell_completion_is_offered(ws: Path) -> None:
    script_text = run_cli("--show-completion", "bash", cwd=ws)
    assert script_text.returncode == 0 and "_tether_completion" in script_text.stdout
    env = cli_env(_TETHER_COMPLETE="complete_bash", COMP_WORDS="tether ap", COMP_CWORD="1")
    completed = run_cli(cwd=ws, env=env)
    assert completed.stdout.split() == ["approvals", "approve"]


def test_a_prompt_from_stdin(ws: Path) -> None:
    model = script(ws, [{"content": "got it"}])
    result = run_cli("run", "-", "--model", model, cwd=ws, stdin="line one\nline two\n")
    assert result.returncode == 0, result.stderr
    assert user_entries(ws, only_session(ws)) == ["line one\nline two"]
    empty = run_cli("run", "-", "--model", model, cwd=ws, stdin="")
    assert empty.returncode == 2
    one_error(empty.stderr, "the prompt on stdin is empty")


def test_invalid_arguments_print_a_line_and_emit_tool_skipped(ws: Path) -> None:
    bad = {"tool_calls": [{"name": "read", "arguments": {"nopath": 1}}]}
    model = script(ws, [bad, {"content": "ok"}])
    shown = run_cli("run", "go", "--model", model, cwd=ws)
    assert shown.returncode == 0, shown.stderr
    assert "↷ read (invalid arguments)" in shown.stderr
    model = script(ws, [bad, {"content": "ok"}], name="again.json")
    as_json = run_cli("run", "go", "--model", model, "--json", cwd=ws)
    skipped = [json.loads(x) for x in as_json.stdout.splitlines() if "tool_skipped" in x]
    assert [(e["name"], e["reason"]) for e in skipped] == [("read", "invalidArguments")]


def test_piped_authorizations_table_keeps_ids_and_times_on_one_line(ws: Path) -> None:
    (ws / "tether.toml").write_text('[policy.tools]\nbash = "deny"\n')
    long_command = "echo " + "x" * 150
    model = script(ws, [bash_call(long_command), {"content": "ok"}])
    assert run_cli("run", "go", "--model", model, cwd=ws).returncode == 0
    session_id = only_session(ws)
    table = run_cli("authorizations", cwd=ws).stdout
    [row] = [line for line in table.splitlines() if session_id[:13] in line]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row)
    assert f"{session_id[:13]}…" in row and "deny" in row


def test_the_repl_continues_the_last_session_with_its_model(ws: Path) -> None:
    model = script(ws, [{"content": "one"}, {"content": "two"}])
    assert run_cli("run", "first", "--model", model, cwd=ws).returncode == 0
    session_id = only_session(ws)
    repl = run_cli("repl", "--last", cwd=ws, stdin="second\n")
    assert repl.returncode == 0, repl.stderr
    assert "two" in repl.stdout
    assert user_entries(ws, session_id) == ["first", "second"]
