"""The crash lab: ``tether crashlab`` (the boundary matrix) and ``tether lab publish-report``.

The full default matrix runs here too (``test_full_default_matrix``): every built-in
scenario killed at every boundary it reaches, including every N-th hit — a few hundred
crash runs, well under a minute on two cores with the fork server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tether._cli import app
from tether._faults import CRASH_EXIT_CODE
from tether._runtime import boundaries as runtime_boundaries
from tether.testing.crashlab.child import (
    ACKS_FILE,
    EFFECTS_FILE,
    WORKSPACE,
    LogFacts,
    prepare_run_dir,
)
from tether.testing.crashlab.matrix import (
    Case,
    CaseResult,
    JobResult,
    LabOptions,
    SpawnRunner,
    evaluate,
    run_lab,
    session_log_path,
)
from tether.testing.crashlab.report import OUTSIDE_THE_LAB, all_boundaries, summary_line
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS

REPO_ROOT = Path(__file__).resolve().parent.parent
BAD_TOOL = "tests.crashlab_badtool:BAD"
NO_LOOKUP_TOOL = "tests.crashlab_badtool:NO_LOOKUP"
INVOICE_ARGS = '{"customer": "ACME"}'
SUMMARY = re.compile(
    r"^(PASS|FAIL|REVIEW) duplicate_effects=(\d+) scenarios=(\d+) boundaries=(\d+) runs=(\d+)"
)

runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def summary(text: str) -> re.Match[str]:
    match = SUMMARY.match(last_line(text))
    assert match is not None, text
    return match


# =========================================================================== boundaries


def test_list_boundaries_names_every_boundary_with_its_description() -> None:
    result = invoke("crashlab", "--list-boundaries")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines}
    registered = all_boundaries()
    assert set(listed) == set(registered)
    for name in runtime_boundaries.ALL:
        assert listed[name] == registered[name]
    for name in ("store.before_write", "store.torn_write", "store.after_write", "store.after_sync"):
        assert name in listed
    for name in ("journal.intent_recorded", "tools.apply.after_replace", "ledger.committed"):
        assert name in listed

    as_json = json.loads(invoke("crashlab", "--list-boundaries", "--json").output)
    assert {item["name"]: item["description"] for item in as_json} == registered


def test_list_scenarios() -> None:
    result = invoke("crashlab", "--list-scenarios")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.splitlines()]
    assert names == list(BUILTIN_SCENARIOS)
    for required in (
        "read-only",
        "bash-counter",
        "write",
        "edit",
        "publish-report",
        "multi-call",
        "abort",
        "compaction",
        "provider-failure",
    ):
        assert required in names


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scenario", "nope"], "unknown scenario 'nope'"),
        (["--boundary", "nope"], "unknown boundary 'nope'"),
        (["--boundary", "after_effect@0"], "N must be a positive integer"),
        (["--tool", "tests.crashlab_badtool:BAD", "--args", "[1]"], "must be a JSON object"),
        (["--tool", "tests.crashlab_badtool:BAD", "--args", "{}"], "do not match"),
        (["--tool", "no_such_module:X"], "cannot load --tool"),
        (["--scenario", "write", "--boundary", "after_effect@9"], "is not reached"),
    ],
)
def test_usage_errors(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = invoke("crashlab", *args)
    assert result.exit_code == 2
    assert message in result.output


# =========================================================================== small matrices


def test_small_matrix_passes() -> None:
    result = invoke("crashlab", "--scenario", "bash-counter", "--scenario", "publish-report")
    assert result.exit_code == 0, result.output
    match = summary(result.output)
    assert match.group(1) == "PASS"
    assert match.group(2) == "0"
    assert match.group(3) == "2"
    assert int(match.group(5)) >= 80
    assert "boundaries" in result.output and "scenarios" in result.output


def test_json_report() -> None:
    result = invoke("crashlab", "-s", "publish-report", "-b", "after_effect", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["verdict"] == "PASS"
    assert document["summary"] == "PASS duplicate_effects=0 scenarios=1 boundaries=1 runs=1"
    (case,) = document["cases"]
    assert case["boundary"] == "after_effect" and case["hit"] == 1
    assert case["resumeStatus"] == "completed"
    assert case["factsAppended"] > 0
    assert case["recoveryMs"] is not None
    (effect,) = case["effects"].values()
    assert effect == {
        "callId": "call_publish",
        "tool": "publish_report",
        "count": 1,
        "outcome": "success",
        "perOperation": {next(iter(case["effects"])): 1},
    }
    # The ledger had the row: recovery filled in the result without publishing again.
    assert case["reconciled"] == [
        {
            "tool": "publish_report",
            "callId": "call_publish",
            "verdict": "committed",
            "action": "complete",
            "recoveredFromLedger": True,
            "reviewItem": None,
        }
    ]


def test_spawned_interpreters_give_the_same_answer() -> None:
    result = invoke(
        "crashlab", "-s", "bash-counter", "-b", "after_effect", "-b", "store.torn_write@3",
        "--no-fork", "--jobs", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert last_line(result.output) == "PASS duplicate_effects=0 scenarios=1 boundaries=2 runs=2"


def test_conflict_opens_review_items_only_where_the_outcome_is_unknowable() -> None:
    document = json.loads(invoke("crashlab", "-s", "conflict", "--json").output)
    assert document["verdict"] == "PASS"
    with_review = {c["boundary"] for c in document["cases"] if c["reviews"]}
    # Only while the edit's journal row is open and the file was changed by someone else.
    assert with_review == {
        "journal.intent_recorded",
        "tools.apply.before_replace",
        "tools.apply.after_replace",
        "journal.change_applied",
    }
    for case in document["cases"]:
        for item in case["reviews"]:
            assert item["reason"].startswith("counter.txt has neither")
            assert case["resumeStatus"] == "blocked"


# =========================================================================== user tools


def test_bad_tool_fails_with_a_reproducing_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = invoke(
        "crashlab", "--tool", BAD_TOOL, "--args", INVOICE_ARGS, "--workdir", str(tmp_path)
    )
    assert result.exit_code == 1, result.output
    match = summary(result.output)
    assert match.group(1) == "FAIL"
    assert int(match.group(2)) > 0
    line = last_line(result.output)
    assert "DUPLICATE EFFECT" in line
    reproduce = re.search(r'reproduce="((?:[^"\\]|\\.)*)"', line)
    assert reproduce is not None
    command = reproduce.group(1).replace('\\"', '"')
    argv = shlex.split(command)
    assert argv[:2] == ["tether", "crashlab"]
    assert "--tool" in argv and "--boundary" in argv

    again = invoke(*argv[1:], "--workdir", str(tmp_path))
    assert again.exit_code == 1
    assert last_line(again.output).startswith("FAIL duplicate_effects=1 scenarios=1 ")


def test_tool_without_lookup_is_never_pass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = invoke(
        "crashlab", "--tool", NO_LOOKUP_TOOL, "--args", INVOICE_ARGS, "--workdir", str(tmp_path)
    )
    assert result.exit_code == 1, result.output
    match = summary(result.output)
    assert match.group(1) == "REVIEW"
    assert "unknown_outcomes=" in last_line(result.output)


def test_reference_effect_tool_passes_with_its_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = invoke(
        "crashlab",
        "--tool",
        "tether.testing.ledger:PublishReportTool",
        "--args",
        '{"title": "t", "body": "b"}',
    )
    assert result.exit_code == 0, result.output
    assert summary(result.output).group(1) == "PASS"


# =========================================================================== the checks


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real bash-counter run, uncrashed, and a resume of it (fresh interpreters)."""
    run_dir = tmp_path_factory.mktemp("checks") / "run"
    scenario = BUILTIN_SCENARIOS["bash-counter"]
    prepare_run_dir(run_dir, scenario, "durable")
    spawn = SpawnRunner()
    run = spawn.run(
        ["bash-counter", str(run_dir), "discover"], env={}, out=run_dir / "out" / "r", timeout=60
    )
    log = session_log_path(run_dir / WORKSPACE)
    assert log is not None
    resume = spawn.run(
        ["bash-counter", str(run_dir), "resume"], env={}, out=run_dir / "out" / "s", timeout=60
    )
    assert run.returncode == 0 and resume.returncode == 0, (run.stderr, resume.stderr)
    acks: list[tuple[int, str]] = []
    for line in (run_dir / ACKS_FILE).read_text().splitlines():
        value = json.loads(line)
        acks.extend(zip(value["seqs"], value["ids"], strict=True))
    return {"run": run, "resume": resume, "log": log.read_bytes(), "acks": acks, "dir": run_dir}


def check(finished: dict[str, Any], **changes: Any) -> CaseResult:
    scenario = BUILTIN_SCENARIOS["bash-counter"]
    inputs: dict[str, Any] = {
        "run": finished["run"],
        "pre_log": finished["log"],
        "acks": finished["acks"],
        "resume1": finished["resume"],
        "log1": finished["log"],
        "resume2": finished["resume"],
        "log2": finished["log"],
    }
    inputs.update(changes)
    result = CaseResult(Case("bash-counter", "none", 0), crashed=False)
    return evaluate(scenario, result, strict=True, **inputs)


def with_count(resume: JobResult, count: int) -> JobResult:
    out = resume.json()
    assert out is not None
    for effect in out["probeAfter"]["effects"]:
        effect["count"] = count
    return JobResult(0, resume.elapsed, False, json.dumps(out), "")


def test_checks_accept_a_clean_run(finished_run: dict[str, Any]) -> None:
    result = check(finished_run)
    assert result.verdict == "pass", result.failures
    assert next(iter(result.effects.values()))["count"] == 1


def test_checks_catch_a_duplicate_effect(finished_run: dict[str, Any]) -> None:
    doubled = with_count(finished_run["resume"], 2)
    result = check(finished_run, resume1=doubled, resume2=doubled)
    assert result.verdict == "fail"
    assert result.duplicates == 1
    assert any("DUPLICATE EFFECT" in f for f in result.failures)


def test_checks_catch_a_lost_effect(finished_run: dict[str, Any]) -> None:
    lost = with_count(finished_run["resume"], 0)
    result = check(finished_run, resume1=lost, resume2=lost)
    assert any("LOST EFFECT" in f for f in result.failures)


def test_checks_catch_a_second_resume_that_appends(finished_run: dict[str, Any]) -> None:
    log = finished_run["log"]
    result = check(finished_run, log2=log + b'{"kind":"entry"}\n')
    assert any("second resume appended" in f for f in result.failures)


def test_checks_catch_a_lost_acknowledged_commit(finished_run: dict[str, Any]) -> None:
    acks = [*finished_run["acks"], (LogFacts(finished_run["log"]).last_seq + 1, "x")]
    result = check(finished_run, acks=acks)
    assert any("acknowledged before the crash" in f for f in result.failures)


def test_checks_catch_a_rewritten_prefix(finished_run: dict[str, Any]) -> None:
    log: bytes = finished_run["log"]
    first_line_end = log.index(b"\n") + 1
    result = check(finished_run, pre_log=log[:first_line_end] + b"X" + log[first_line_end:])
    assert any("changed or lost" in f for f in result.failures)


def test_checks_catch_a_run_that_did_not_crash(finished_run: dict[str, Any]) -> None:
    scenario = BUILTIN_SCENARIOS["bash-counter"]
    result = CaseResult(Case("bash-counter", "after_effect", 1), crashed=True)
    evaluate(
        scenario,
        result,
        strict=True,
        run=finished_run["run"],
        pre_log=finished_run["log"],
        acks=finished_run["acks"],
        resume1=finished_run["resume"],
        log1=finished_run["log"],
        resume2=finished_run["resume"],
        log2=finished_run["log"],
    )
    assert any("did not crash at after_effect@1" in f for f in result.failures)


def test_the_effects_side_channel_counts_file_changes(finished_run: dict[str, Any]) -> None:
    # bash-counter writes no file; its side channel holds no apply lines.
    assert not (finished_run["dir"] / EFFECTS_FILE).exists()


# =========================================================================== the lab command


def tether(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_CRASH")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lab_state(cwd: Path) -> tuple[bytes, bytes]:
    workspace = cwd / ".tether" / "lab" / "workspace"
    log = session_log_path(workspace)
    assert log is not None
    from tether.testing.ledger import ReportLedger

    ledger = ReportLedger(workspace / ".tether" / "ledger.db")
    try:
        rows = json.dumps([p.to_json() for p in ledger.publications()]).encode()
    finally:
        ledger.close()
    return log.read_bytes(), rows


@pytest.mark.parametrize("boundary", ["before_effect", "after_effect", "after_result"])
def test_lab_publish_report(boundary: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crashed = tether(tmp_path, "lab", "publish-report", "--reset", "--crash-at", boundary)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert f"INJECTED_CRASH boundary={boundary}" in crashed.stderr
    assert (tmp_path / ".tether" / "lab").is_dir()

    monkeypatch.chdir(tmp_path)
    report = invoke("lab", "publish-report", "--report")
    assert report.exit_code == 1  # not recovered yet
    assert last_line(report.output).startswith("FAIL")

    recovered = invoke("lab", "publish-report")
    assert recovered.exit_code == 0, recovered.output
    if boundary == "after_effect":
        assert "verdict=committed action=complete recovered_from_ledger=true" in recovered.output
    elif boundary == "before_effect":
        assert "verdict=notFound action=execute" in recovered.output
    else:
        assert "nothing to reconcile" in recovered.output
    assert "run completed" in recovered.output
    first_report = invoke("lab", "publish-report", "--report")
    before = lab_state(tmp_path)

    again = invoke("lab", "publish-report")
    assert again.exit_code == 0
    assert "nothing to recover" in again.output
    assert lab_state(tmp_path) == before  # no event, no effect

    report = invoke("lab", "publish-report", "--report")
    assert report.exit_code == 0, report.output
    assert report.output == first_report.output
    assert last_line(report.output) == "PASS duplicate_effects=0"
    for step in ("1. planned", "2. effect committed", "3. result persisted", "4. verified"):
        assert step in report.output
    assert "ledger_rows=1 results=1" in report.output
    if boundary == "after_effect":
        assert "recovered_from_ledger=true" in report.output


def test_lab_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert invoke("lab", "publish-report", "--report").exit_code == 2
    assert invoke("lab", "publish-report", "--crash-at", "nowhere").exit_code == 2
    assert invoke("lab", "publish-report", "--report", "--reset").exit_code == 2
    # A plain run without state runs the lab once, uncrashed.
    plain = invoke("lab", "publish-report")
    assert plain.exit_code == 0 and "run completed" in plain.output
    refused = invoke("lab", "publish-report", "--crash-at", "after_effect")
    assert refused.exit_code == 2 and "--reset" in refused.output
    assert (
        last_line(invoke("lab", "publish-report", "--report").output) == "PASS duplicate_effects=0"
    )


# =========================================================================== the full matrix


def test_full_default_matrix() -> None:
    """Every built-in scenario × every boundary it reaches × every N-th hit (runs in CI).

    Except the MCP scenario: it starts a real server process in every run (twice), which
    would take most of this test's time; its effect boundaries are in
    test_mcp_scenario_has_no_duplicate_effects, the rest in tests/test_mcp_crash.py.
    """
    scenarios = [s for s in BUILTIN_SCENARIOS.values() if s.name != "mcp"]
    result = run_lab(LabOptions(scenarios=scenarios, jobs=max(2, os.cpu_count() or 1)))
    failures = [f"{r.case.key}: {r.failures}" for r in result.failures]
    assert not failures, failures[:5]
    line = summary_line(result)
    assert line.startswith("PASS duplicate_effects=0 scenarios=11 ")
    assert len(result.results) >= 400
    unreached = set(all_boundaries()) - set(result.boundaries) - set(OUTSIDE_THE_LAB)
    assert not unreached, f"no scenario reaches {sorted(unreached)}: add one to the crash lab"
    # The N-th hits of repeating boundaries are their own cases.
    assert any(r.case.boundary == "before_effect" and r.case.hit == 5 for r in result.results)
    # How long it took is a benchmark figure (the crash lab prints it), not a test.


def test_mcp_scenario_has_no_duplicate_effects() -> None:
    """The MCP scenario (tether.testing.mcp_notes, a real server process in every run)."""
    result = invoke(
        "crashlab", "-s", "mcp", "-b", "before_effect@1", "-b", "after_effect", "--json"
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["summary"] == "PASS duplicate_effects=0 scenarios=1 boundaries=2 runs=4"
    for case in document["cases"]:
        effects = {e["tool"]: e for e in case["effects"].values()}
        assert effects["notes__append_once"]["count"] == 1  # recovered or run exactly once
        assert effects["notes__append_once"]["outcome"] == "success"
        assert effects["notes__append"]["count"] <= 1
        assert effects["notes__count_lines"]["outcome"] == "success"  # replayed if pending
