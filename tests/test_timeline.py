"""The timeline model (``tether.core.timeline``): state + facts + evidence → timeline.

Pure tests on the golden conformance fixtures and on logs built fact by fact, then the
same model on crash-lab sessions: real agent runs killed with SIGKILL at a boundary and
recovered in a new process, with the evidence read from their real ``effects.db``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from fixturekit import at_least
from sessionkit import SessionKit
from tether._show import load_log, parse_transactions, session_timeline
from tether.core import reduce_session
from tether.core.timeline import Evidence, Timeline, build_timeline, format_ms
from tether.testing.crashlab.child import WORKSPACE, session_log_path
from tether.testing.crashlab.matrix import LabOptions, run_lab
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS

FIXTURES = Path(__file__).parent / "conformance" / "fixtures"
MODULE = Path(__file__).parent.parent / "src" / "tether" / "core" / "timeline.py"


def timeline_of(data: bytes, evidence: Evidence | None = None, **options: Any) -> Timeline:
    state = reduce_session(data)
    return build_timeline(
        state, parse_transactions(data[: state.repaired_length]), evidence, **options
    )


def reducing_fixtures() -> list[Path]:
    """The golden logs that reduce: 18 today, and fewer fail the collection (fixturekit)."""
    out = []
    for expected in sorted(FIXTURES.glob("*.expected.json")):
        if json.loads(expected.read_text())["ok"]:
            out.append(expected.with_name(expected.name.replace(".expected.json", ".jsonl")))
    return at_least(18, out, f"reducing golden fixtures in {FIXTURES}")


# --------------------------------------------------------------------------- purity


def test_the_model_is_pure() -> None:
    tree = ast.parse(MODULE.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    allowed = {"__future__", "collections.abc", "dataclasses", "typing"}
    assert {m for m in imported if not m.startswith("tether.core")} <= allowed, imported


def test_format_ms_matches_the_calendar() -> None:
    assert format_ms(0) == "1970-01-01T00:00:00.000Z"
    assert format_ms(1710000000000) == "2024-03-09T16:00:00.000Z"
    assert format_ms(951782400123) == "2000-02-29T00:00:00.123Z"  # a leap day
    assert format_ms(-1) == "1969-12-31T23:59:59.999Z"
    assert format_ms(10**17).endswith("ms since the epoch")


# --------------------------------------------------------------------------- golden fixtures


@pytest.mark.parametrize("path", reducing_fixtures(), ids=lambda p: p.stem)
def test_every_golden_fixture_has_a_consistent_timeline(path: Path) -> None:
    data = path.read_bytes()
    state = reduce_session(data)
    timeline = timeline_of(data)
    facts = [f for tx in parse_transactions(data[: state.repaired_length]) for f in tx]
    assert timeline.facts == len(facts) == state.last_seq
    started = [
        f
        for f in facts
        if (f.get("record") or {}).get("type") in ("runStarted", "compactionStarted")
    ]
    assert [o.operation_id for o in timeline.operations] == [
        f["record"]["operationId"] for f in started
    ]
    assert timeline.usage.to_json() == state.usage.to_json()
    assert sum((o.usage.input for o in timeline.operations), 0) == state.usage.input
    assert len(timeline.messages) == len(state.transcript)
    opens = [g for g in timeline.gaps if g.kind == "open"]
    assert len(opens) == (0 if state.operation.kind == "idle" else 1)
    assert timeline.current == state.operation.kind
    for op in timeline.operations:
        assert (op.outcome == "unfinished") == (op.end_ms is None)
    json.dumps(timeline.to_json())  # one JSON document


def fixture(name: str) -> Timeline:
    return timeline_of((FIXTURES / f"{name}.jsonl").read_bytes())


def test_completed_tool_run() -> None:
    timeline = fixture("completed-tool-run")
    (op,) = timeline.operations
    assert (op.kind, op.outcome, op.completion) == ("run", "completed", "normal")
    calls = [c for s in op.steps for c in s.tool_calls]
    assert [(c.outcome, c.started) for c in calls] == [("success", True)]
    assert not timeline.gaps


def test_an_exhausted_retry_shows_both_attempts_and_why() -> None:
    timeline = fixture("attempts-exhausted")
    (op,) = timeline.operations
    (step,) = op.steps
    first, second = step.attempts
    assert first.outcome == "superseded" and second.attempt == 2
    assert second.why is not None and "left open" in second.why
    crash = [g for g in timeline.gaps if g.kind == "crash"]
    assert len(crash) == 1 and crash[0].certain and crash[0].before_seq == second.seq
    assert crash[0].recovery is not None and "attempt 2" in crash[0].recovery
    (open_gap,) = [g for g in timeline.gaps if g.kind == "open"]
    assert "model call open" in open_gap.evidence


def test_a_pending_call_ends_the_log_open() -> None:
    timeline = fixture("pending-never-tool")
    (op,) = timeline.operations
    (call,) = [c for s in op.steps for c in s.tool_calls]
    assert call.outcome == "pending" and call.started and call.end_ms is None
    (gap,) = timeline.gaps
    assert gap.kind == "open" and "no result" in gap.evidence


def test_synthetic_outcomes_are_named() -> None:
    interrupted = fixture("synthetic-interrupted")
    calls = [c for o in interrupted.operations for s in o.steps for c in s.tool_calls]
    assert [c.outcome for c in calls] == ["interrupted"]
    assert any(g.kind == "crash" and g.certain for g in interrupted.gaps)
    unanswered = fixture("truncated-tool-call")  # the length answer, no result yet
    calls = [c for o in unanswered.operations for s in o.steps for c in s.tool_calls]
    assert [(c.outcome, c.started) for c in calls] == [("pending", False)]
    kit = SessionKit()
    kit.start_run("go")
    kit.step_attempt()
    kit.assistant(None, ["read"], stop_reason="length")
    kit.synthetic(0, "truncated")
    kit.finish(completion="truncated")
    (op,) = timeline_of(kit.bytes()).operations
    (call,) = [c for s in op.steps for c in s.tool_calls]
    assert (call.outcome, call.started, op.completion) == ("truncated", False, "truncated")
    assert call.result is not None and "truncated" in call.result
    aborted = fixture("synthetic-aborted")  # the reducer does not require an abort request
    (op,) = aborted.operations
    assert [(c.outcome, c.started) for s in op.steps for c in s.tool_calls] == [("aborted", False)]


def test_a_compaction_is_an_operation_lane() -> None:
    timeline = fixture("completed-compaction")
    kinds = [o.kind for o in timeline.operations]
    assert "compaction" in kinds
    (compaction,) = [o for o in timeline.operations if o.kind == "compaction"]
    assert compaction.outcome == "completed"
    assert [a.outcome for s in compaction.steps for a in s.attempts] == ["settled"]


# --------------------------------------------------------------------------- built logs


def test_pauses_are_stops_when_idle_and_inferred_crashes_only_where_nothing_runs() -> None:
    kit = SessionKit()
    kit.simple_run("first")
    kit.timestamp += 60_000  # a minute idle: stop
    kit.start_run("second")
    kit.step_attempt()
    kit.timestamp += 5_000  # the model took five seconds: no gap
    kit.assistant(None, ["read"])
    kit.timestamp += 3_000  # nothing runs between an answer and toolStarted: inferred crash
    started = kit.tool_started(0)
    kit.timestamp += 10_000  # the tool ran ten seconds: no gap
    kit.tool_result(started, content="ok")
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    timeline = timeline_of(kit.bytes())
    assert [(g.kind, g.certain) for g in timeline.gaps] == [("stop", False), ("crash", False)]
    stop, crash = timeline.gaps
    assert stop.operation_id is None and stop.end_ms is not None
    assert stop.end_ms - stop.start_ms >= 60_000
    assert crash.operation_id == timeline.operations[1].operation_id
    # a person asked to authorize the call explains the pause
    assistant_id = started["record"]["assistantEntryId"]
    asked = Evidence(authorizations={f"{assistant_id}:0": {"decision": "allow", "who": "user"}})
    assert [g.kind for g in timeline_of(kit.bytes(), asked).gaps] == ["stop"]
    # a higher threshold sees no inferred crash, a lower one still none inside the model call
    assert [g.kind for g in timeline_of(kit.bytes(), pause_ms=4_000).gaps] == ["stop"]
    assert [g.kind for g in timeline_of(kit.bytes(), pause_ms=59_000).gaps] == ["stop"]


def test_a_wait_before_the_first_step_is_queued_not_a_crash() -> None:
    """Issue 32 item 2: `tether submit` commits [prompt, runStarted]; a worker picked it up
    14.2 s later. That wait is a queue, not a crash; a pause after work started still is."""
    kit = SessionKit()
    kit.start_run("queued work")  # the submit transaction
    kit.timestamp += 14_200  # no worker free for 14.2 s
    kit.step_attempt()
    kit.assistant(None, ["read"])
    kit.timestamp += 3_000  # work had started: nothing runs here, an inferred crash
    started = kit.tool_started(0)
    kit.tool_result(started, content="ok")
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    timeline = timeline_of(kit.bytes())
    assert [(g.kind, g.certain) for g in timeline.gaps] == [("queued", False), ("crash", False)]
    queued = timeline.gaps[0]
    assert queued.evidence.startswith("queued 14.2 s:") and "crash" not in queued.evidence
    assert queued.operation_id == timeline.operations[0].operation_id
    assert queued.recovery is None


def test_usage_per_step_and_total() -> None:
    kit = SessionKit()
    kit.start_run("go")
    kit.step_attempt()
    with kit.tx():
        kit.assistant(None, ["read"])
        kit.usage(input=100, output=7, cache_read=5)
    started = kit.tool_started(0)
    kit.tool_result(started, content="ok")
    kit.step_attempt()
    with kit.tx():
        kit.assistant("done")
        kit.usage(input=200, output=9, cache_read=0)
    kit.finish()
    timeline = timeline_of(kit.bytes())
    (op,) = timeline.operations
    assert [s.usage.input for s in op.steps] == [100, 200]
    assert op.usage.to_json() == {"input": 300, "output": 16, "cacheRead": 5, "cacheWrite": 0}
    assert timeline.usage == op.usage


def test_evidence_is_attached_to_its_call() -> None:
    kit = SessionKit()
    kit.start_run("go")
    kit.step_attempt()
    assistant = kit.assistant(None, ["write"])
    started = kit.tool_started(0)
    kit.tool_result(started, content="wrote")
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    op_id = started["id"]
    evidence = Evidence(
        journal={
            op_id: {
                "status": "applied",
                "path": "a.txt",
                "beforeHash": None,
                "afterHash": "sha256:ab",
            }
        },
        reconciliations={op_id: [{"verdict": "applied", "action": "complete", "evidence": {}}]},
        reviews={
            op_id: [{"id": 3, "status": "resolved", "reason": "conflict", "decision": "applied"}]
        },
        authorizations={
            f"{assistant['id']}:0": {"decision": "allow", "who": "policy", "rule": "default"}
        },
        verifications=[
            {
                "id": "v1",
                "status": "passed",
                "command": "pytest",
                "startedAtMs": 1,
                "durationMs": 5,
                "versionStart": "a",
                "versionEnd": "a",
                "toolStartedId": None,
            },
            {
                "id": "v2",
                "status": "passed",
                "command": "pytest",
                "startedAtMs": 2,
                "durationMs": 5,
                "versionStart": "b",
                "versionEnd": "b",
                "toolStartedId": None,
            },
        ],
    )
    timeline = timeline_of(kit.bytes(), evidence)
    (call,) = [c for s in timeline.operations[0].steps for c in s.tool_calls]
    assert call.journal is not None and call.journal["status"] == "applied"
    assert call.authorization is not None and call.authorization["who"] == "policy"
    assert call.reviews[0]["decision"] == "applied"
    # the result came right after its start, but a reconciliation says recovery wrote it
    (gap,) = timeline.gaps
    assert gap.kind == "crash" and gap.certain and call.recovered
    assert gap.recovery is not None and "verdict applied, action complete" in gap.recovery
    assert [(v.id, v.current) for v in timeline.verifications] == [("v1", False), ("v2", True)]
    current = timeline_of(
        kit.bytes(), Evidence(verifications=evidence.verifications, artifact_version="a")
    )
    assert [(v.id, v.current) for v in current.verifications] == [("v1", True), ("v2", False)]


def test_an_interrupted_result_after_an_abort_request_is_no_crash() -> None:
    kit = SessionKit()
    kit.start_run("go")
    kit.step_attempt()
    call = kit.assistant(None, ["read"])
    started = kit.tool_started(0)
    kit.abort("tool", call["entry"]["message"]["tool_calls"][0]["id"])
    kit.interrupted(started)
    kit.finish("aborted")
    timeline = timeline_of(kit.bytes())
    assert timeline.gaps == ()
    (op,) = timeline.operations
    assert op.outcome == "aborted" and op.abort is not None and op.abort["phase"] == "tool"


# --------------------------------------------------------------------------- crash lab


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Workspaces of crash-lab cases: killed with SIGKILL, resumed in a new process."""
    base = tmp_path_factory.mktemp("crashlab")
    result = run_lab(
        LabOptions(
            scenarios=[BUILTIN_SCENARIOS["bash-counter"], BUILTIN_SCENARIOS["publish-report"]],
            boundaries=["after_effect@1", "attempt_recorded@1"],
            workdir=base,
            keep=True,
            jobs=2,
        )
    )
    review = run_lab(
        LabOptions(
            scenarios=[BUILTIN_SCENARIOS["conflict"]],
            boundaries=["tools.apply.after_replace@1"],
            workdir=base,
            keep=True,
            jobs=1,
        )
    )
    out = {}
    for case in [*result.results, *review.results]:
        assert case.verdict == "pass", case.to_json()
        assert case.run_dir is not None
        out[case.case.key] = Path(case.run_dir) / WORKSPACE
    return out


def lab_timeline(workspace: Path) -> Timeline:
    log = session_log_path(workspace)
    assert log is not None
    return session_timeline(load_log(log), workspace)


def test_crashlab_after_effect_of_a_ledger_call(crashed: dict[str, Path]) -> None:
    timeline = lab_timeline(crashed["publish-report:after_effect@1"])
    (op,) = timeline.operations
    assert op.outcome == "completed"
    (call,) = [c for s in op.steps for c in s.tool_calls]
    assert call.name == "publish_report" and call.outcome == "success"
    assert call.recovered and call.recovered_from_ledger
    (decision,) = call.reconciliations
    assert (decision["verdict"], decision["action"]) == ("committed", "complete")
    (gap,) = timeline.gaps
    assert gap.kind == "crash" and gap.certain
    assert gap.after_seq == call.start_seq and gap.before_seq == call.result_seq
    assert gap.recovery is not None and "recovered_from_ledger=true" in gap.recovery


def test_crashlab_after_effect_of_bash_is_interrupted(crashed: dict[str, Path]) -> None:
    timeline = lab_timeline(crashed["bash-counter:after_effect@1"])
    (call,) = [c for o in timeline.operations for s in o.steps for c in s.tool_calls]
    assert call.outcome == "interrupted" and call.recovered and not call.reconciliations
    (gap,) = timeline.gaps
    assert gap.kind == "crash" and gap.certain and "interrupted" in (gap.recovery or "")


@pytest.mark.parametrize("scenario", ["bash-counter", "publish-report"])
def test_crashlab_open_attempt_is_retried(crashed: dict[str, Path], scenario: str) -> None:
    timeline = lab_timeline(crashed[f"{scenario}:attempt_recorded@1"])
    (op,) = timeline.operations
    first = op.steps[0]
    assert [a.outcome for a in first.attempts] == ["superseded", "settled"]
    assert first.attempts[1].why is not None
    (gap,) = timeline.gaps
    assert gap.kind == "crash" and gap.before_seq == first.attempts[1].seq
    assert op.outcome == "completed"
    assert timeline.usage.to_json() == orjson.loads(orjson.dumps(op.usage.to_json()))


def test_crashlab_conflict_blocked_on_review(crashed: dict[str, Path]) -> None:
    """The edit was applied, then someone changed the file: recovery opens a review item
    and appends nothing. The crash is certain (the reconciliation log says a later process
    looked), and the log ends open, blocked on the item."""
    timeline = lab_timeline(crashed["conflict:tools.apply.after_replace@1"])
    (op,) = timeline.operations
    assert op.outcome == "unfinished"
    (call,) = [c for s in op.steps for c in s.tool_calls]
    assert call.outcome == "pending" and call.journal is not None
    assert [d["action"] for d in call.reconciliations] == ["review", "review"]
    (item,) = call.reviews
    assert item["status"] == "open"
    crash, still_open = timeline.gaps
    assert crash.kind == "crash" and crash.certain and crash.before_seq is None
    assert crash.end_ms is not None and crash.end_ms >= crash.start_ms
    assert f"tether review resolve {item['id']}" in (crash.recovery or "")
    assert still_open.kind == "open" and f"review item {item['id']}" in still_open.evidence
