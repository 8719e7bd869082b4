"""``tether run``, ``tether resume`` and the REPL, as real subprocesses with a scripted model.

Every case runs ``python -m tether`` in a temporary workspace (the current directory),
so exit status, stream separation, SIGINT handling and crash recovery are exercised
exactly as a user sees them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether._cli.progress import format_size, summarize_arguments
from tether._cli.run_cmd import EXIT_ABORTED, EXIT_BLOCKED, exit_code_for
from tether._runtime.executor import RunResult, RunStatus
from tether._stores.file import SessionStore

ROOT = Path(__file__).resolve().parent.parent
SCRUBBED = (
    "TETHER_MODEL",
    "TETHER_BASE_URL",
    "TETHER_API_KEY",
    "TETHER_DEBUG",
    "TETHER_CRASH_AT",
    "TETHER_CRASH_MODE",
    "TETHER_ENVIRONMENT_IDENTITY",
)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_cli(
    *args: str | Path, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *map(str, args)],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
        check=False,
    )


def spawn(*args: str | Path, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tether", *map(str, args)],
        cwd=cwd,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )


def script(workspace: Path, responses: list[dict[str, Any]], name: str = "script.json") -> str:
    """Write a scripted-model file into the workspace; returns the ``--model`` value."""
    path = workspace / name
    path.write_text(json.dumps({"model": "scripted/test", "responses": responses}))
    return f"scripted:{name}"


def one_error_line(stderr: str) -> str:
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("error: "), stderr
    assert "Traceback" not in stderr
    return stderr


def session_files(workspace: Path) -> list[Path]:
    return sorted((workspace / ".tether" / "sessions").glob("*.jsonl"))


def only_session(workspace: Path) -> tuple[str, Path]:
    files = session_files(workspace)
    assert len(files) == 1, files
    return files[0].stem.split("_", 1)[1], files[0]


def facts(path: Path) -> list[dict[str, Any]]:
    """Every fact of a log (transactions flattened), header excluded."""
    out: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines()[1:]:
        value = json.loads(line)
        out.extend(value if isinstance(value, list) else [value])
    return out


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    return [
        f["record"] for f in facts(path) if f["kind"] == "record" and f["record"]["type"] == kind
    ]


def tool_results(path: Path) -> list[dict[str, Any]]:
    return [
        f["entry"]
        for f in facts(path)
        if f["kind"] == "entry" and f["entry"].get("message", {}).get("role") == "tool"
    ]


def inspect_state(workspace: Path, session_id: str) -> dict[str, Any]:
    result = run_cli("inspect", "--json", session_id, cwd=workspace)
    assert result.returncode == 0, result.stderr
    state: dict[str, Any] = json.loads(result.stdout)["state"]
    return state


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def read_events_until(proc: subprocess.Popen[str], kind: str, name: str | None = None) -> None:
    """Read ``--json`` lines from a running CLI until an event of ``kind`` arrives."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"the CLI ended before a {kind} event"
        event = json.loads(line)
        if event["event"] == kind and (name is None or event.get("name") == name):
            return
    raise AssertionError(f"no {kind} event")


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "README.md").write_text("hello from the readme\n")
    yield tmp_path


READ_THEN_ANSWER: list[dict[str, Any]] = [
    {
        "content": "Let me look.",
        "tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}],
        "usage": {"input": 120, "output": 14},
    },
    {"content": "The readme says hello.", "usage": {"input": 150, "output": 6}},
]


# --------------------------------------------------------------------------- tether run


def test_run_prints_answer_progress_and_resume_command(workspace: Path) -> None:
    model = script(workspace, READ_THEN_ANSWER)
    result = run_cli("run", "what does the readme say?", "--model", model, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The readme says hello.\n"
    session_id, _ = only_session(workspace)
    assert "✓ read README.md → 22 B" in result.stderr
    assert "usage: input 270, output 20" in result.stderr
    # Completed: nothing is left to resume (following it would say "nothing to do").
    assert "resume with" not in result.stderr
    assert f"continue with: tether run --session {session_id}" in result.stderr


def test_run_json_emits_one_event_per_line_and_a_result(workspace: Path) -> None:
    model = script(workspace, READ_THEN_ANSWER)
    result = run_cli("run", "look", "--model", model, "--json", cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = json_lines(result.stdout)
    kinds = [line["event"] for line in lines]
    assert kinds[0] == "session" and kinds[-1] == "result"
    assert {"model_started", "tool_started", "tool_finished", "usage"} <= set(kinds)
    final = lines[-1]
    assert final["status"] == "completed"
    assert final["text"] == "The readme says hello."
    assert final["sessionId"] == only_session(workspace)[0]
    assert final["usage"] == {"input": 270, "output": 20, "cacheRead": 0, "cacheWrite": 0}


def test_run_with_session_continues_the_conversation(workspace: Path) -> None:
    model = script(workspace, [{"content": "first answer"}, {"content": "second answer"}])
    first = run_cli("run", "one", "--model", model, "--json", cwd=workspace)
    assert first.returncode == 0, first.stderr
    session_id = json_lines(first.stdout)[-1]["sessionId"]
    assert len(inspect_state(workspace, session_id)["transcript"]) == 2
    elsewhere = workspace / "sub"
    elsewhere.mkdir()
    second = run_cli(
        "run",
        "two",
        "--session",
        session_id[:13],
        "--model",
        f"scripted:{workspace / 'script.json'}",
        "--workspace",
        "..",
        cwd=elsewhere,
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout == "second answer\n"
    resolved = workspace.resolve()
    assert f"continue with: tether run --session {session_id} --workspace {resolved}" in (
        second.stderr
    )
    assert "resume with" not in second.stderr
    assert only_session(workspace)[0] == session_id
    transcript = inspect_state(workspace, session_id)["transcript"]
    assert [m["content"] for m in transcript] == ["one", "first answer", "two", "second answer"]


def test_path_escape_is_a_tool_error_not_a_crash(workspace: Path) -> None:
    model = script(
        workspace,
        [
            {
                "tool_calls": [
                    {"name": "read", "arguments": {"path": "../x"}},
                    {"name": "read", "arguments": {"path": "[/bold]:smile:"}},
                ]
            },
            {"content": "ok [/bold]\x1b[31m"},
        ],
    )
    result = run_cli("run", "read outside", "--model", model, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert "✗ read ../x → " in result.stderr and "(error)" in result.stderr
    assert "✗ read [/bold]:smile: → " in result.stderr  # untrusted text is not markup
    assert result.stdout == "ok [/bold]\x1b[31m\n"  # a pipe gets the answer verbatim
    _, path = only_session(workspace)
    escape, _ = tool_results(path)
    assert "path escapes the workspace" in escape["message"]["content"]
    assert escape["result"] == {"type": "error"}


# --------------------------------------------------------------------------- bad input


def test_missing_model_is_one_line_exit_2(workspace: Path) -> None:
    result = run_cli("run", "hi", cwd=workspace)
    assert result.returncode == 2
    assert "no model given" in one_error_line(result.stderr)
    assert result.stdout == ""
    assert not session_files(workspace)


def test_missing_script_file_is_one_line_exit_2(workspace: Path) -> None:
    result = run_cli("run", "hi", "--model", "scripted:absent.json", cwd=workspace)
    assert result.returncode == 2
    assert "absent.json" in one_error_line(result.stderr)


def test_missing_api_key_is_one_line_exit_2(workspace: Path) -> None:
    result = run_cli("run", "hi", "--model", "openai/gpt-4o-mini", cwd=workspace)
    assert result.returncode == 2
    assert "TETHER_API_KEY" in one_error_line(result.stderr)
    assert not session_files(workspace)


def test_unreachable_endpoint_fails_durably(workspace: Path) -> None:
    secret = "sk-test-secret-123456"
    result = run_cli(
        "run",
        "hi",
        "--model",
        "some/model",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--api-key",
        secret,
        "--timeout",
        "5",
        "--model-option",
        "retries=0",  # automatic retries: tests/test_runtime_retry.py
        cwd=workspace,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert secret not in result.stderr + result.stdout
    assert "run failed: model request failed (connection)" in result.stderr
    session_id, path = only_session(workspace)
    # The failed run is finished: `tether retry` runs it again, `resume` would do nothing.
    assert f"retry with: tether retry {session_id}" in result.stderr
    assert "resume with" not in result.stderr
    assert records(path, "stepFailed")[0]["error"]["code"] == "connection"
    [finished] = records(path, "operationFinished")
    assert finished["outcome"] == "failed"
    assert inspect_state(workspace, session_id)["operation"]["kind"] == "idle"


def test_busy_session_is_one_line_exit_4(workspace: Path) -> None:
    model = script(workspace, [{"content": "done"}])
    assert run_cli("run", "hi", "--model", model, cwd=workspace).returncode == 0
    session_id, _ = only_session(workspace)
    with SessionStore.open(session_id, workspace=workspace):
        result = run_cli("resume", session_id, "--model", model, cwd=workspace)
    assert result.returncode == 4
    assert "already open for writing" in one_error_line(result.stderr)


def test_resume_of_an_idle_session_does_nothing(workspace: Path) -> None:
    model = script(workspace, [{"content": "done"}])
    assert run_cli("run", "hi", "--model", model, cwd=workspace).returncode == 0
    session_id, path = only_session(workspace)
    before = path.read_bytes()
    result = run_cli("resume", session_id, "--model", model, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stderr
    assert path.read_bytes() == before
    missing = run_cli("resume", "0000", "--model", model, cwd=workspace)
    assert missing.returncode == 3
    one_error_line(missing.stderr)


# --------------------------------------------------------------------------- Ctrl+C


def test_sigint_during_model_call_aborts_durably(workspace: Path) -> None:
    model = script(workspace, [{"content": "too late", "delay": 5}])
    proc = spawn("run", "slow", "--model", model, "--json", cwd=workspace)
    read_events_until(proc, "model_started")
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == EXIT_ABORTED, stderr
    assert time.monotonic() - started < 3.0  # the model would have taken 5 s
    assert "aborting…" in stderr and "Traceback" not in stderr
    assert json_lines(stdout)[-1]["status"] == "aborted"
    session_id, path = only_session(workspace)
    [abort] = records(path, "abortRequested")
    assert abort["phase"] == "model"
    assert records(path, "stepFailed")[0]["error"]["code"] == "aborted"
    assert records(path, "operationFinished")[-1]["outcome"] == "aborted"
    assert inspect_state(workspace, session_id)["operation"]["kind"] == "idle"


def test_sigint_during_bash_interrupts_the_tool(workspace: Path) -> None:
    model = script(
        workspace,
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30"}}]}],
    )
    proc = spawn("run", "sleep", "--model", model, cwd=workspace)
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # human mode: wait for the session line, then the tool
        if "session" in proc.stderr.readline():
            break
    _, path = only_session(workspace)
    while not records(path, "toolStarted") and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=15)
    assert proc.returncode == EXIT_ABORTED, stderr
    assert "↷ bash sleep 30 (interrupted)" in stderr
    assert stderr.count("(interrupted)") == 1
    [result] = tool_results(path)
    assert result["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert records(path, "operationFinished")[-1]["outcome"] == "aborted"


def test_double_sigint_exits_at_once_and_resume_reconciles(workspace: Path) -> None:
    # The command ignores SIGTERM, so the first abort waits out the kill grace (2 s);
    # the second Ctrl+C must not wait for it.
    command = "echo effect >> effects.txt; echo $$ > bash.pid; trap '' TERM; sleep 4"
    model = script(
        workspace,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"content": "reconciled"},
        ],
    )
    proc = spawn("run", "effect", "--model", model, "--json", cwd=workspace)
    read_events_until(proc, "tool_started", "bash")
    time.sleep(0.3)  # let bash write the effect
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == EXIT_ABORTED, stderr
    assert time.monotonic() - started < 1.9  # the kill grace alone is 2 s
    with contextlib.suppress(OSError, ValueError):  # the orphaned command: not needed any more
        os.killpg(int((workspace / "bash.pid").read_text()), signal.SIGKILL)
    session_id, path = only_session(workspace)
    assert f"exiting now; the session stays resumable\nresume with: tether resume {session_id}" in (
        stderr
    )
    assert inspect_state(workspace, session_id)["operation"]["kind"] == "run"
    resumed = run_cli("resume", session_id, "--model", model, cwd=workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "reconciled\n"
    assert (workspace / "effects.txt").read_text() == "effect\n"  # never re-run
    assert len(records(path, "toolStarted")) == 1
    [result] = tool_results(path)
    assert result["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert records(path, "operationFinished")[-1]["outcome"] == "completed"


def test_resume_says_it_sends_the_interrupted_model_call_again(workspace: Path) -> None:
    """Issue 32 item 10: after a crash during a model request, resume says that it sent
    the interrupted call again as attempt 2 (text and --json)."""
    model = script(workspace, [{"content": "A"}])
    crashed = run_cli(
        "run",
        "hi",
        "--model",
        model,
        cwd=workspace,
        env=cli_env(TETHER_CRASH_AT="attempt_recorded"),
    )
    assert crashed.returncode == -signal.SIGKILL
    session_id, path = only_session(workspace)
    twin = workspace.parent / f"{workspace.name}-twin"  # the same crash, resumed with --json
    shutil.copytree(workspace, twin)
    resumed = run_cli("resume", session_id, "--model", model, cwd=workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "A\n"
    line = (
        "↻ the model call interrupted by the crash is sent again "
        "(attempt 2, same context and configuration)"
    )
    assert resumed.stderr.count(line) == 1, resumed.stderr
    assert [r["attempt"] for r in records(path, "stepAttempt")] == [1, 2]
    as_json = run_cli("resume", session_id, "--model", model, "--json", cwd=twin)
    assert as_json.returncode == 0, as_json.stderr
    started = [e for e in json_lines(as_json.stdout) if e["event"] == "model_started"]
    assert [e["attempt"] for e in started] == [2]


def test_a_corrupt_log_is_worded_the_same_by_every_command(workspace: Path) -> None:
    """Issue 32 item 9: inspect (as plan) and resume (as run --session) say where the log stops
    being readable, "corrupt" once, and the next step (what show draws)."""
    from sessionkit import SessionKit

    kit = SessionKit()
    kit.simple_run("first")
    kit.simple_run("second")
    lines = kit.bytes().split(b"\n")
    lines[6] = lines[6].replace(b'"seq":', b'"seq":9', 1)  # line 7: a seq out of order
    folder = workspace / ".tether" / "sessions"
    folder.mkdir(parents=True)
    session_id = kit.header["id"]
    path = folder / f"1710000000000_{session_id}.jsonl"
    path.write_bytes(b"\n".join(lines))
    model = script(workspace, [{"content": "A"}])
    # inspect and plan reduce the file they found (the user's name for it); resume and
    # run --session open it through the store (its path): one of each keeps this fast.
    told = {
        "inspect": run_cli("inspect", session_id, cwd=workspace),
        "resume": run_cli("resume", session_id, "--model", model, cwd=workspace),
    }
    for command, result in told.items():
        line = one_error_line(result.stderr)
        assert line.replace(str(workspace), "").count("corrupt") == 1, (command, line)
        assert " is corrupt: SEQ_MISMATCH at line 7, seq " in line, (command, line)
        assert "; the 6 lines before it are intact: `tether show " in line, (command, line)
        assert line.rstrip().endswith("` shows them and where the log stops"), (command, line)
    assert (told["inspect"].returncode, told["resume"].returncode) == (1, 5)
    assert f"`tether show {session_id}`" in told["inspect"].stderr
    assert f"`tether show {path}`" in told["resume"].stderr


# --------------------------------------------------------------------------- blocked resume


def test_blocked_resume_explains_and_abort_gets_out(workspace: Path) -> None:
    original = script(workspace, [{"content": "A"}], "a.json")
    crashed = run_cli(
        "run",
        "hi",
        "--model",
        original,
        cwd=workspace,
        env=cli_env(TETHER_CRASH_AT="attempt_recorded"),
    )
    assert crashed.returncode == -signal.SIGKILL
    session_id, path = only_session(workspace)
    edited = script(workspace, [{"content": "B"}], "b.json")

    blocked = run_cli("resume", session_id, "--model", edited, cwd=workspace)
    assert blocked.returncode == EXIT_BLOCKED, blocked.stderr
    assert "blocked: configuration changed" in blocked.stderr
    assert "routing" in blocked.stderr  # what changed
    assert "restore the configuration" in blocked.stderr
    assert f"tether resume {session_id} --abort" in blocked.stderr
    assert blocked.stdout == ""
    # Blocked: the operation is unfinished, so the closing line offers the resume.
    assert f"resume with: tether resume {session_id}" in blocked.stderr
    assert "continue with" not in blocked.stderr
    as_json = run_cli("resume", session_id, "--model", edited, "--json", cwd=workspace)
    assert as_json.returncode == EXIT_BLOCKED
    final = json_lines(as_json.stdout)[-1]
    assert final["status"] == "blocked" and final["blockedReason"] == "configuration_changed"

    aborted = run_cli("resume", session_id, "--abort", "--model", edited, cwd=workspace)
    assert aborted.returncode == 0, aborted.stderr
    assert "aborted" in aborted.stderr.splitlines()  # the line of status aborted
    assert "resume with" not in aborted.stderr  # closed durably: nothing left to resume
    assert records(path, "operationFinished")[-1]["outcome"] == "aborted"
    assert inspect_state(workspace, session_id)["operation"]["kind"] == "idle"


# --------------------------------------------------------------------------- REPL


def test_repl_reads_prompts_from_stdin(workspace: Path) -> None:
    model = script(
        workspace,
        [{"content": "hi there"}, {"content": "again here"}, {"content": "SUMMARY"}],
    )
    result = run_cli(
        "repl",
        "--model",
        model,
        cwd=workspace,
        stdin="hello\nagain\n/compact\n/help\n/nope\n/exit\nnot read\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi there\nagain here\n"
    session_id, path = only_session(workspace)
    assert "history compacted" in result.stderr
    assert "/compact" in result.stderr  # the help text
    assert "unknown command '/nope'" in result.stderr
    assert f"          or: tether repl --session {session_id}" in result.stderr
    assert "resume with" not in result.stderr  # the last call completed
    assert len(records(path, "runStarted")) == 2
    assert records(path, "compactionStarted")
    assert any(f["kind"] == "entry" and f["entry"]["type"] == "compaction" for f in facts(path))


def test_bare_tether_starts_the_repl(workspace: Path) -> None:
    model = script(workspace, [{"content": "hi there"}])
    result = run_cli(cwd=workspace, stdin="hello\n", env=cli_env(TETHER_MODEL=model))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi there\n"
    session_id, _ = only_session(workspace)
    assert f"continue with: tether run --session {session_id}" in result.stderr
    assert "resume with" not in result.stderr
    no_model = run_cli(cwd=workspace, stdin="hello\n")
    assert no_model.returncode == 2
    one_error_line(no_model.stderr)


# --------------------------------------------------------------------------- helpers


def test_exit_codes_and_formatting() -> None:
    def result(status: RunStatus) -> RunResult:
        return RunResult(status=status, session_id="s", session_path=Path("s.jsonl"))

    assert exit_code_for(result(RunStatus.COMPLETED)) == 0
    assert exit_code_for(result(RunStatus.IDLE)) == 0
    assert exit_code_for(result(RunStatus.FAILED)) == 1
    assert exit_code_for(result(RunStatus.BLOCKED)) == EXIT_BLOCKED == 65
    assert exit_code_for(result(RunStatus.ABORTED)) == EXIT_ABORTED == 130
    assert exit_code_for(result(RunStatus.ABORTED), abort_requested=True) == 0
    assert format_size(12) == "12 B"
    assert format_size(1229) == "1.2 KB"
    assert format_size(3 * 1024 * 1024) == "3.0 MB"
    assert summarize_arguments("bash", '{"command": "ls\\n-la"}') == "ls -la"
    assert summarize_arguments("read", '{"path": "a.txt"}') == "a.txt"
    assert summarize_arguments("read", "{not json") == "{not json"
    assert len(summarize_arguments("write", json.dumps({"path": "x" * 200}))) == 60
