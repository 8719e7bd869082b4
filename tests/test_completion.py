"""Honest completion end to end: the real agent, store, tools, effects.db and check runs.

* the completion gate: a passing ``verify`` followed by an edit is stale and names the
  file; a failing ``verify`` is never reported as verified; ``--require-verified``
  follow-up runs;
* stop conditions: two identical failing calls on unchanged files end the run with
  ``repeated_failure``; budgets end it with ``budget_exhausted``;
* authorization: a denied bash command never runs and the model receives the denial;
  ``ask`` without a terminal denies, ``--yes`` allows, a person's answer is recorded;
* crashes (real subprocesses killed with SIGKILL at named boundaries): a call authorized
  before the crash is not asked again; a ``verify`` whose evidence was recorded is not run
  again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tether._cli import app
from tether._completion.evidence import VerificationStatus, VerificationStore
from tether._effects.authorization import AuthorizationStore
from tether._models import ScriptedModel
from tether._project import BudgetConfig
from tether._runtime import Agent, RunResult, RunStatus
from tether._runtime.guards import AuthorizationRequest
from tether._wsdb.sqlite import EffectsDB
from tether.core import reduce_session
from tether.core.state import IdleOperation
from tether.errors import ConfigurationError, ProjectConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "completion_child.py"

CHECK = "grep -q good status.txt"
"""The check command of these workspaces: passes while status.txt says good."""


@pytest.fixture(autouse=True)
def _default_environment() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
        yield


# --------------------------------------------------------------------------- helpers


def calls(*items: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [dict(i) for i in items],
        "usage": {"input": 10, "output": 5},
    }


def done(text: str = "Done, the tests pass.") -> dict[str, Any]:
    return {"content": text, "finish_reason": "stop", "usage": {"input": 10, "output": 5}}


def bash(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "name": "bash", "arguments": {"command": command}}


def write(call_id: str, path: str, content: str) -> dict[str, Any]:
    return {"id": call_id, "name": "write", "arguments": {"path": path, "content": content}}


def edit(call_id: str, path: str, old: str, new: str) -> dict[str, Any]:
    arguments = {"path": path, "old_string": old, "new_string": new}
    return {"id": call_id, "name": "edit", "arguments": arguments}


def verify(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": "verify", "arguments": {}}


def script(*responses: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "scripted/completion", "responses": [dict(r) for r in responses]}


def workspace(tmp_path: Path, toml: str | None = f'[verify]\ncommand = "{CHECK}"\n') -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    if toml is not None:
        (root / "tether.toml").write_text(toml)
    return root


def agent(root: Path, steps: dict[str, Any], **options: Any) -> Agent:
    return Agent(ScriptedModel.from_json(steps), workspace=root, read_agents_md=False, **options)


def run(root: Path, steps: dict[str, Any], prompt: str = "do it", **options: Any) -> RunResult:
    subject = agent(root, steps, **options)
    try:
        return subject.run(prompt)
    finally:
        subject.close()


def session_state(result: RunResult) -> Any:
    state = reduce_session(result.session_path.read_bytes())
    assert isinstance(state.operation, IdleOperation)
    return state


def tool_messages(result: RunResult) -> list[str]:
    return [m["content"] for m in session_state(result).transcript if m["role"] == "tool"]


def effects_db(root: Path) -> EffectsDB:
    return EffectsDB.open_workspace(root)


# --------------------------------------------------------------------------- the gate


def test_verified_when_the_passing_check_is_the_last_word(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(write("w", "status.txt", "good\n")), calls(verify("v")), done()),
    )
    assert result.status is RunStatus.COMPLETED
    assert result.verification is not None and result.verification.verified
    assert result.verification.command == CHECK
    assert "PASSED" in tool_messages(result)[-1]


def test_an_edit_after_a_passing_verify_makes_completion_stale_and_names_the_file(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path)
    (root / "other.txt").write_text("untouched\n")
    result = run(
        root,
        script(
            calls(write("w", "status.txt", "good\n")),
            calls(verify("v")),
            calls(edit("e", "status.txt", "good", "good, edited")),
            done(),
        ),
    )
    check = result.verification
    assert check is not None and check.status.value == "stale"
    assert check.changed_files == ("status.txt",)
    assert "status.txt" in check.message
    assert not check.verified
    assert result.to_dict()["verification"]["changedFiles"] == ["status.txt"]


def test_a_failing_verify_is_never_reported_as_verified(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    # First a passing verification of the good version, then the file turns bad and the
    # check fails on it: the gate must say failed, not fall back to the old pass.
    result = run(
        root,
        script(
            calls(write("w", "status.txt", "good\n")),
            calls(verify("v1")),
            calls(write("w2", "status.txt", "bad\n")),
            calls(verify("v2")),
            done("Done (the tests pass, honestly)."),
        ),
    )
    check = result.verification
    assert check is not None and check.status.value == "failed"
    assert not check.verified
    assert check.changed_files == ("status.txt",)
    assert "FAILED" in tool_messages(result)[-1]
    db = effects_db(root)
    try:
        statuses = [v.status for v in VerificationStore(db).list()]
    finally:
        db.close()
    assert statuses == [VerificationStatus.FAILED, VerificationStatus.PASSED]


def test_a_run_that_changed_nothing_gets_no_verdict(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    (root / "status.txt").write_text("good\n")
    result = run(
        root,
        script(calls({"id": "r", "name": "read", "arguments": {"path": "status.txt"}}), done()),
    )
    assert result.status is RunStatus.COMPLETED
    assert result.verification is None


def test_without_a_check_command_a_changing_run_is_unverified(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=None)
    result = run(root, script(calls(write("w", "status.txt", "good\n")), done()))
    check = result.verification
    assert check is not None and check.status.value == "missing"
    assert "no check command" in check.message
    # No check command: the model is not offered a verify tool.
    assert all(t["name"] != "verify" for t in agent(root, script(done())).registry.definitions())


def test_require_verified_follow_up_gets_the_work_verified(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(
            calls(write("w", "status.txt", "good\n")),
            done("Done."),
            # The follow-up run: the model verifies, then finishes.
            calls(verify("v")),
            done("Verified."),
        ),
        require_verified=True,
    )
    assert result.status is RunStatus.COMPLETED
    assert result.follow_ups == 1
    assert result.verification is not None and result.verification.verified
    assert not result.unverified
    state = session_state(result)
    prompts = [m["content"] for m in state.transcript if m["role"] == "user"]
    assert len(prompts) == 2 and "verify" in prompts[1]


def test_require_verified_gives_up_after_two_follow_ups(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(
            calls(write("w", "status.txt", "bad\n")),
            done("Done."),
            calls(verify("v1")),
            done("It fails, sorry."),
            calls(verify("v2")),
            done("Still failing."),
        ),
        require_verified=True,
    )
    assert result.follow_ups == 2
    assert result.unverified
    assert result.verification is not None and result.verification.status.value == "failed"
    assert result.to_dict()["unverified"] is True


def test_require_verified_without_a_check_command_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path, toml=None)
    with pytest.raises(ConfigurationError, match="no check command"):
        agent(root, script(done()), require_verified=True)


def test_verify_ignores_caches_the_check_writes(tmp_path: Path) -> None:
    root = workspace(
        tmp_path,
        toml='[verify]\ncommand = "mkdir -p __pycache__ && touch __pycache__/x.pyc && '
        'grep -q good status.txt"\n',
    )
    result = run(
        root, script(calls(write("w", "status.txt", "good\n")), calls(verify("v")), done())
    )
    assert result.verification is not None and result.verification.verified


def test_a_check_that_writes_tracked_files_is_void(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml='[verify]\ncommand = "date +%N > stamp.txt"\n')
    result = run(
        root, script(calls(write("w", "status.txt", "good\n")), calls(verify("v")), done())
    )
    assert "VOID" in tool_messages(result)[-1] and "stamp.txt" in tool_messages(result)[-1]
    assert result.verification is not None and not result.verification.verified


# --------------------------------------------------------------------------- stop conditions


def test_two_identical_failing_calls_end_the_run_with_repeated_failure(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(
            calls(bash("b1", "echo broken; exit 3")),
            calls(bash("b2", "echo broken; exit 3")),
            calls(bash("b3", "echo broken; exit 3")),
            done(),
        ),
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "repeated_failure"
    assert "bash" in result.error["message"] and "exit 3" in result.error["message"]
    # Two calls ran, the third was never asked for.
    assert len(tool_messages(result)) == 2
    finished = [
        json.loads(line)
        for line in result.session_path.read_bytes().splitlines()[1:]
        if b"operationFinished" in line
    ]
    assert finished[-1]["record"]["error"]["code"] == "repeated_failure"


def test_a_stop_answers_the_calls_it_did_not_run_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path)
    steps = script(
        calls(
            bash("b1", "exit 3"),
            bash("b2", "exit 3"),
            bash("b3", "echo later >> later.txt"),
        ),
        done("Next run."),
    )
    subject = agent(root, steps)
    try:
        stopped = subject.run("do it")
        assert stopped.error is not None and stopped.error["code"] == "repeated_failure"
        assert not (root / "later.txt").exists()
        state = session_state(stopped)
        answers = [m for m in state.transcript if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in answers] == ["b1", "b2", "b3"]
        assert answers[2]["content"] == "Operation aborted before execution."
        # The transcript is legal, so the session can go on.
        following = subject.run("and now?", session=stopped.session_id)
    finally:
        subject.close()
    assert following.status is RunStatus.COMPLETED and following.text == "Next run."


def test_the_time_budget_bounds_a_running_command(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    began = time.monotonic()
    result = run(
        root,
        script(calls(bash("b1", "sleep 20; echo late >> late.txt")), done()),
        budget=BudgetConfig(max_seconds=0.5),
    )
    assert time.monotonic() - began < 10
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert not (root / "late.txt").exists()
    assert "timed out" in tool_messages(result)[0]


def test_a_time_budget_between_calls_answers_the_rest_aborted(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(bash("b1", "sleep 0.3"), bash("b2", "echo 1 >> late.txt")), done()),
        budget=BudgetConfig(max_seconds=0.2),
    )
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert not (root / "late.txt").exists()
    assert tool_messages(result)[1] == "Operation aborted before execution."


def test_a_failing_call_that_changes_files_is_not_a_repeat(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(
            calls(bash("b1", "echo x >> log.txt; exit 3")),
            calls(bash("b2", "echo x >> log.txt; exit 3")),
            done("Gave up."),
        ),
    )
    assert result.status is RunStatus.COMPLETED


def test_different_arguments_are_not_a_repeat(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(bash("b1", "exit 3")), calls(bash("b2", "exit 4")), done("Gave up.")),
    )
    assert result.status is RunStatus.COMPLETED


def test_the_step_budget_ends_the_run(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(bash("b1", "echo one")), calls(bash("b2", "echo two")), done()),
        budget=BudgetConfig(max_steps=2),
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert "2 of 2 steps" in result.error["message"]
    # The second step's call still ran; no third step was started.
    assert len(tool_messages(result)) == 2


def test_the_token_budget_ends_the_run(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(bash("b1", "echo one")), done()),
        budget=BudgetConfig(max_tokens=15),
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert "token budget (15 of 15 tokens)" in result.error["message"]


def test_the_time_budget_ends_the_run(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    result = run(
        root,
        script(calls(bash("b1", "sleep 0.3")), done()),
        budget=BudgetConfig(max_seconds=0.2),
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "budget_exhausted"
    assert "time budget" in result.error["message"]


# --------------------------------------------------------------------------- authorization

DENY_COUNTER = """\
[[policy.bash]]
pattern = "*counter.txt*"
decision = "deny"
reason = "counting is not allowed here"
"""


def test_a_denied_bash_command_never_runs_and_the_model_gets_the_denial(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=DENY_COUNTER)
    result = run(
        root, script(calls(bash("b", "echo 1 >> counter.txt")), done("I was not allowed."))
    )
    assert result.status is RunStatus.COMPLETED
    assert not (root / "counter.txt").exists()
    [denial] = tool_messages(result)
    assert denial.startswith("Error: permission denied")
    assert "counting is not allowed here" in denial
    db = effects_db(root)
    try:
        [decision] = AuthorizationStore(db).list(result.session_id)
    finally:
        db.close()
    assert (decision.decision, decision.who, decision.tool_name) == ("deny", "policy", "bash")
    assert decision.summary == "echo 1 >> counter.txt"
    assert "*counter.txt*" in decision.rule


def test_ask_without_a_terminal_denies_and_yes_allows(tmp_path: Path) -> None:
    toml = '[policy.tools]\nbash = "ask"\n'
    root = workspace(tmp_path, toml=toml)
    denied = run(root, script(calls(bash("b", "echo 1 >> counter.txt")), done()))
    assert not (root / "counter.txt").exists()
    assert "no terminal" in tool_messages(denied)[0]
    allowed = run(root, script(calls(bash("b", "echo 1 >> counter.txt")), done()), assume_yes=True)
    assert (root / "counter.txt").read_text() == "1\n"
    db = effects_db(root)
    try:
        [decision] = AuthorizationStore(db).list(allowed.session_id)
    finally:
        db.close()
    assert (decision.decision, decision.who) == ("allow", "--yes")
    # An explicit allow rule is the policy's decision, even with --yes.
    (tmp_path / "explicit").mkdir()
    explicit = workspace(tmp_path / "explicit", toml='[policy.tools]\nbash = "allow"\n')
    ran = run(explicit, script(calls(bash("b", "true")), done()), assume_yes=True)
    db = effects_db(explicit)
    try:
        [decision] = AuthorizationStore(db).list(ran.session_id)
    finally:
        db.close()
    assert (decision.decision, decision.who) == ("allow", "policy")


def test_a_persons_answer_decides_and_is_recorded_before_the_call(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=None)
    questions: list[AuthorizationRequest] = []
    seen: list[str] = []

    def answer(request: AuthorizationRequest) -> bool:
        questions.append(request)
        # Each decision is asked before its call runs: the file holds only earlier runs.
        counter = root / "counter.txt"
        seen.append(counter.read_text() if counter.exists() else "")
        return request.summary.startswith("echo yes")

    result = run(
        root,
        script(
            calls(bash("b1", "echo yes >> counter.txt"), bash("b2", "echo no >> counter.txt")),
            calls({"id": "r", "name": "read", "arguments": {"path": "counter.txt"}}),
            done(),
        ),
        authorize=answer,
    )
    # A terminal makes ask the default for bash; read-only tools are never asked about.
    assert [q.tool_name for q in questions] == ["bash", "bash"]
    assert seen == ["", "yes\n"]
    assert (root / "counter.txt").read_text() == "yes\n"
    db = effects_db(root)
    try:
        decisions = AuthorizationStore(db).list(result.session_id)
    finally:
        db.close()
    assert [(d.decision, d.who) for d in decisions] == [("allow", "user"), ("deny", "user")]
    assert "declined at the terminal" in tool_messages(result)[1]


def test_run_on_a_terminal_asks_only_where_a_rule_says_ask(tmp_path: Path) -> None:
    asked: list[str] = []

    def answer(request: AuthorizationRequest) -> bool:
        asked.append(request.summary)
        return True

    steps = script(calls(bash("b", "echo 1 >> counter.txt"), write("w", "a.txt", "a")), done())
    # tether run on a terminal: a person can answer, but allow stays the default.
    plain = workspace(tmp_path, toml=None)
    run(plain, steps, authorize=answer, ask_by_default=False)
    assert asked == [] and (plain / "counter.txt").exists()
    (tmp_path / "ruled").mkdir()
    ruled = workspace(tmp_path / "ruled", toml='[policy.tools]\nbash = "ask"\n')
    run(ruled, steps, authorize=answer, ask_by_default=False)
    assert asked == ["echo 1 >> counter.txt"]


def test_a_denial_is_final_two_identical_denials_stop_the_run(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=DENY_COUNTER)
    result = run(
        root,
        script(
            calls(bash("b1", "echo 1 >> counter.txt")),
            calls(bash("b2", "echo 1 >> counter.txt")),
            done(),
        ),
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error["code"] == "repeated_failure"
    assert not (root / "counter.txt").exists()


# --------------------------------------------------------------------------- crashes


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_CRASH") and k != "TETHER_ENVIRONMENT_IDENTITY"
    }
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def spawn(args: list[str], crash: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = {"TETHER_CRASH_AT": crash, "TETHER_CRASH_MODE": "kill"} if crash else {}
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        env=child_env(extra),
        timeout=60,
        check=False,
    )


def only_session(root: Path) -> str:
    [path] = sorted((root / ".tether" / "sessions").glob("*.jsonl"))
    return str(path)


def test_a_call_authorized_before_a_crash_is_not_asked_again(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml='[policy.tools]\nbash = "ask"\n')
    steps = tmp_path / "script.json"
    steps.write_text(json.dumps(script(calls(bash("b", "echo 1 >> counter.txt")), done())))
    asked = tmp_path / "asked.txt"
    crashed = spawn(["run", str(root), str(steps), str(asked)], crash="authorized")
    assert crashed.returncode == -9, crashed.stderr
    assert asked.read_text() == "bash echo 1 >> counter.txt\n"
    assert not (root / "counter.txt").exists()  # decided, not started
    resumed = spawn(["resume", str(root), str(steps), str(asked), only_session(root)])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert asked.read_text() == "bash echo 1 >> counter.txt\n"  # not asked again
    assert (root / "counter.txt").read_text() == "1\n"  # ran exactly once


def test_a_call_allowed_by_a_person_before_a_crash_runs_on_a_resume_without_terminal(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path, toml='[policy.tools]\nbash = "ask"\n')
    steps = tmp_path / "script.json"
    steps.write_text(json.dumps(script(calls(bash("b", "echo 1 >> counter.txt")), done())))
    asked = tmp_path / "asked.txt"
    crashed = spawn(["run", str(root), str(steps), str(asked)], crash="authorized")
    assert crashed.returncode == -9, crashed.stderr
    args = ["resume", str(root), str(steps), str(asked), only_session(root), "--no-terminal"]
    resumed = spawn(args)
    assert resumed.returncode == 0, resumed.stderr
    # Nobody can be asked now, but the person's earlier answer stands.
    assert (root / "counter.txt").read_text() == "1\n"
    assert asked.read_text() == "bash echo 1 >> counter.txt\n"


def test_a_verify_recorded_before_a_crash_is_answered_from_its_evidence(tmp_path: Path) -> None:
    toml = '[verify]\ncommand = "echo run >> ../check-runs.txt; grep -q good status.txt"\n'
    root = workspace(tmp_path, toml=toml)
    (root / "status.txt").write_text("good\n")
    steps = tmp_path / "script.json"
    steps.write_text(json.dumps(script(calls(verify("v")), done())))
    asked = tmp_path / "asked.txt"
    crashed = spawn(["run", str(root), str(steps), str(asked)], crash="after_effect")
    assert crashed.returncode == -9, crashed.stderr
    runs = tmp_path / "check-runs.txt"
    assert runs.read_text() == "run\n"
    resumed = spawn(["resume", str(root), str(steps), str(asked), only_session(root)])
    assert resumed.returncode == 0, resumed.stderr
    assert runs.read_text() == "run\n"  # replayed from the evidence, not run again
    state = reduce_session(next((root / ".tether" / "sessions").glob("*.jsonl")).read_bytes())
    [result] = [m["content"] for m in state.transcript if m["role"] == "tool"]
    assert "PASSED" in result


# --------------------------------------------------------------------------- CLI and bad input

runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_cli_verify_records_evidence_and_status_tracks_edits(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    (root / "status.txt").write_text("good\n")
    passed = invoke("verify", "--workspace", str(root))
    assert passed.exit_code == 0, passed.output
    assert "PASSED" in passed.output
    fresh = invoke("verify", "--status", "--workspace", str(root))
    assert fresh.exit_code == 0 and fresh.output.startswith("verified")
    (root / "status.txt").write_text("good and edited\n")
    stale = invoke("verify", "--status", "--workspace", str(root), "--json")
    assert stale.exit_code == 1
    document = json.loads(stale.output)
    assert document["status"] == "stale" and document["changedFiles"] == ["status.txt"]
    (root / "status.txt").write_text("bad\n")
    failed = invoke("verify", "--workspace", str(root))
    assert failed.exit_code == 1 and "FAILED" in failed.output
    assert invoke("verify", "--status", "--workspace", str(root)).output.startswith("failed")


def test_cli_verify_without_a_command_or_with_a_bad_toml(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=None)
    missing = invoke("verify", "--workspace", str(root))
    assert missing.exit_code == 2
    assert "no check command" in missing.output and "Traceback" not in missing.output
    (root / "tether.toml").write_text("[verify\ncommand = 1\n")
    broken = invoke("verify", "--workspace", str(root))
    assert broken.exit_code == 2
    assert "tether.toml is not valid TOML" in broken.output
    assert len(broken.output.strip().splitlines()) == 1


def test_cli_run_with_a_malformed_toml_is_one_line_exit_2(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml='[verify]\ntimeout = "ten"\n')
    steps = tmp_path / "script.json"
    steps.write_text(json.dumps(script(done())))
    result = invoke("run", "hi", "--model", f"scripted:{steps}", "--workspace", str(root))
    assert result.exit_code == 2
    assert "[verify] timeout" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_require_verified_exit_66_when_still_unverified(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    steps = tmp_path / "script.json"
    steps.write_text(
        json.dumps(
            script(
                calls(write("w", "status.txt", "bad\n")),
                done(),
                done("I will not verify."),
                done("Still not."),
            )
        )
    )
    result = invoke(
        "run",
        "fix it",
        "--model",
        f"scripted:{steps}",
        "--workspace",
        str(root),
        "--require-verified",
    )
    assert result.exit_code == 66, result.output
    assert "not verified" in result.output


def test_check_command_not_found_is_never_verified(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml='[verify]\ncommand = "no-such-check-command-xyz"\n')
    result = invoke("verify", "--workspace", str(root))
    assert result.exit_code == 31
    assert "check command not found: no-such-check-command-xyz" in result.output
    db = effects_db(root)
    try:
        assert VerificationStore(db).latest_passing() is None
    finally:
        db.close()


def test_a_hanging_check_times_out_and_is_not_verified(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml='[verify]\ncommand = "sleep 30"\ntimeout = 0.5\n')
    result = invoke("verify", "--workspace", str(root))
    assert result.exit_code == 1
    assert "timed out" in result.output
    assert invoke("verify", "--status", "--workspace", str(root)).exit_code == 1


def test_an_unreadable_file_is_a_clear_error_and_nothing_is_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = workspace(tmp_path)
    (root / "status.txt").write_text("good\n")
    secret = root / "secret.txt"
    secret.write_text("x")
    real_open = os.open

    def guarded(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).endswith("secret.txt"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    result = invoke("verify", "--workspace", str(root))
    monkeypatch.setattr(os, "open", real_open)
    assert result.exit_code == 30, result.output
    assert "secret.txt" in result.output and "Traceback" not in result.output
    db = effects_db(root)
    try:
        assert VerificationStore(db).latest_passing() is None
    finally:
        db.close()


def test_project_config_error_is_a_configuration_error() -> None:
    assert issubclass(ProjectConfigError, ConfigurationError)


def test_ctrl_c_during_tether_verify_ends_the_check_and_exits_130(tmp_path: Path) -> None:
    root = workspace(
        tmp_path, toml='[verify]\ncommand = "sleep 30 & echo $! > ../sleep.pid; wait"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "verify", "--workspace", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    pid_file = tmp_path / "sleep.pid"
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the check never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(sleeper):
        assert time.monotonic() < deadline, "the check's process group outlived tether"
        time.sleep(0.05)
    db = effects_db(root)
    try:
        assert VerificationStore(db).latest() is None
    finally:
        db.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cli_authorizations_lists_who_what_why(tmp_path: Path) -> None:
    root = workspace(tmp_path, toml=DENY_COUNTER)
    result = run(root, script(calls(bash("b", "echo 1 >> counter.txt")), done()))
    listed = invoke("authorizations", "--workspace", str(root), "--json")
    assert listed.exit_code == 0
    [decision] = json.loads(listed.output)
    assert decision["sessionId"] == result.session_id
    assert (decision["decision"], decision["who"]) == ("deny", "policy")
    assert decision["summary"] == "echo 1 >> counter.txt"
    assert decision["reason"] == "counting is not allowed here"
    table = invoke("authorizations", "--workspace", str(root))
    assert table.exit_code == 0 and "deny" in table.output and "counter.txt" in table.output
    empty = tmp_path / "empty"
    empty.mkdir()
    none = invoke("authorizations", "--workspace", str(empty))
    assert none.exit_code == 0 and "no authorization decisions" in none.output


def test_help_shows_the_tether_toml_tables_literally() -> None:
    # Typer renders help as rich markup: an unescaped "[verify]" would vanish.
    assert "[verify]" in invoke("verify", "--help").output
    run_help = invoke("run", "--help").output
    assert "[verify]" in run_help and "[budget]" in run_help
