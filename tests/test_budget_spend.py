"""Budgets that survive a crash: a run's spend counts every process that drove it.

* tokens, time and money are computed from the log (the usage ledger, the ``runStarted``
  timestamp, the provider's reported cost in the answers' side records, else ``[prices]``),
  so a resumed run continues the spend instead of starting over;
* the session-wide limits count every run of the session;
* a kill-and-resume loop (forked children SIGKILLed after each tool result, 20 crashes)
  never spends more than the budget plus one step;
* active time (``[budget] time = "active"``, the default) counts what processes drove the
  run: a resume after a long downtime, or after a parked call waited for a person,
  continues the active time, not the wall time; a crash inside a journaled call is
  downtime once recovery reconciled it; a kill-and-resume loop with an hour down between
  processes stops within one step of the time budget.

The "crash" of the in-process tests is an exception out of the event sink right after a
durable point: nothing after it runs and the next agent reads the log back from disk.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

import tether._faults as faults
import tether._runtime.events as events
from tether._loading import reduce_session
from tether._models.prices import BUILTIN_PRICES, Price, cost_of, price_for
from tether._project import (
    BudgetConfig,
    BudgetTime,
    ProjectConfig,
    project_config_from_mapping,
)
from tether._runtime import Agent, RunStatus
from tether.core.state import Usage
from tether.errors import ProjectConfigError
from tether.testing.clock import START_MS, FakeClock
from tether.testing.scripted import ScriptedModel

STEP_TOKENS = 15
STEP_COST = 0.015625  # 1/64: sums exactly in binary


class Crash(Exception):
    """Raised by the event sink: the process "dies" at a durable point."""


def _step(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "content": f"step {n}",
        "tool_calls": [{"id": f"c{n}", "name": "read", "arguments": {"path": "f.txt"}}],
        "usage": {"input": 10, "output": 5},
        **extra,
    }


def _script(steps: int, **extra: Any) -> dict[str, Any]:
    done = {"content": "done", "finish_reason": "stop", "usage": {"input": 10, "output": 5}}
    return {
        "model": "scripted/budget",
        "responses": [_step(n, **extra) for n in range(steps)] + [done],
    }


def _workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").write_text("hi\n")
    return root


def _crash_after_tool(count: int) -> Any:
    """An event sink that raises after the ``count``-th tool result of this agent."""
    seen = [0]

    def sink(event: events.Event) -> None:
        if isinstance(event, events.ToolFinished):
            seen[0] += 1
            if seen[0] == count:
                raise Crash

    return sink


def _agent(root: Path, script: dict[str, Any], clock: FakeClock, **kw: Any) -> Agent:
    model = ScriptedModel.from_json(script, clock=clock)
    return Agent(model, workspace=root, read_agents_md=False, clock=clock, **kw)


def _session_usage(root: Path) -> Usage:
    (log,) = (root / ".tether" / "sessions").glob("*.jsonl")
    return reduce_session(log.read_bytes()).usage


def _crash_then_resume(
    root: Path, script: dict[str, Any], clock: FakeClock, *, steps_before: int, **kw: Any
) -> Any:
    first = _agent(root, script, clock, on_event=_crash_after_tool(steps_before), **kw)
    with pytest.raises(Crash):
        first.run("go")
    session = first.last_session
    assert session is not None
    first.close()
    second = _agent(root, script, clock, **kw)
    try:
        return second.resume(session)
    finally:
        second.close()


# --------------------------------------------------------------------------- resume continues


def test_a_resume_continues_the_token_spend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    result = _crash_then_resume(
        root, _script(8), FakeClock(), steps_before=2, budget=BudgetConfig(max_tokens=40)
    )
    # 2 steps (30 tokens) before the crash, one after (45): the next tool call is refused.
    assert result.status is RunStatus.FAILED
    assert result.error == {
        "code": "budget_exhausted",
        "message": "the run used its token budget (45 of 40 tokens)",
    }
    assert _session_usage(root) == Usage(30, 15)


def test_a_resume_continues_the_run_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    script = _script(4, delay=2)
    first = _agent(root, script, clock, on_event=_crash_after_tool(1))
    with pytest.raises(Crash):
        first.run("go")  # one step of 2 s
    session = first.last_session
    first.close()
    clock.advance(3)  # the process was down for 3 s: wall time goes on
    wall = BudgetConfig(max_seconds=6, time=BudgetTime.WALL)
    second = _agent(root, script, clock, budget=wall)
    try:
        result = second.resume(session or "")
    finally:
        second.close()
    # 5 s at the resume; its step takes 2 more: 7 s when the tool call would start.
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its time budget (7.0 s of 6 s)"
    assert clock.waits == [2.0, 2.0]


def test_a_resume_after_a_long_downtime_continues_the_active_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    script = _script(6, delay=2)
    first = _agent(root, script, clock, on_event=_crash_after_tool(2))
    with pytest.raises(Crash):
        first.run("go")  # two steps of 2 s
    session = first.last_session or ""
    first.close()
    clock.advance(86_400)  # down for a day
    # Wall time would stop the resume before it did anything (the settings row: the
    # --budget-time flag's AgentOptions key).
    wall = _agent(root, script, clock, max_seconds=7, budget_time="wall")
    try:
        refused = wall.resume(session)
    finally:
        wall.close()
    assert refused.status is RunStatus.FAILED
    assert refused.error is not None
    assert refused.error["message"] == "the run used its time budget (86404.0 s of 7 s)"
    assert clock.waits == [2.0, 2.0]
    # Undo the refusal: the same log without the failed finish, for the active budget.
    (log,) = (root / ".tether" / "sessions").glob("*.jsonl")
    lines = log.read_bytes().splitlines(keepends=True)
    assert b"budget_exhausted" in lines[-1]
    log.write_bytes(b"".join(lines[:-1]))
    clock.advance(3600)
    active = _agent(root, script, clock, max_seconds=7)  # active time: the default
    try:
        result = active.resume(session)
    finally:
        active.close()
    # 4 s before the crash, then steps 3 and 4 (8 s): the 4th step's tool call is refused.
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its time budget (8.0 s of 7 s)"
    assert clock.waits == [2.0, 2.0, 2.0, 2.0]


def test_a_parked_calls_wait_for_a_person_is_not_active_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether._wsdb.sqlite import EffectsDB
    from tether._wsdb.sqlite_approvals import ApprovalStore
    from tether.core.policy import Policy

    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    write = {"id": "w", "name": "write", "arguments": {"path": "g.txt", "content": "x\n"}}
    asks = {"content": "write", "tool_calls": [write], "usage": {"input": 10, "output": 5}}
    script = _script(4, delay=2)
    script["responses"].insert(1, {**asks, "delay": 2})
    kw: dict[str, Any] = {
        "budget": BudgetConfig(max_seconds=7),
        "project": ProjectConfig(policy=Policy(tools={"write": "ask"})),
        "park_approvals": True,
    }
    first = _agent(root, script, clock, **kw)
    try:
        parked = first.run("go")  # step 1 and its read (2 s), step 2 (2 s): parked
    finally:
        first.close()
    assert parked.status is RunStatus.AWAITING_APPROVAL, parked.error
    clock.advance(7200)  # the person answers two hours later
    db = EffectsDB.open_workspace(root)
    try:
        (request,) = ApprovalStore(db).list()
        ApprovalStore(db).decide(request.id, approve=True, who="alice", reason=None, always=False)
    finally:
        db.close()
    # The approved call runs, then the process dies: the next one reads the wait back
    # from the log (a pause before a call a person allowed), and does not count it.
    second = _agent(root, script, clock, on_event=_crash_after_tool(1), **kw)
    with pytest.raises(Crash):
        second.resume(parked.session_id)
    second.close()
    assert (root / "g.txt").read_text() == "x\n"  # the approved call ran
    third = _agent(root, script, clock, **kw)
    try:
        result = third.resume(parked.session_id)
    finally:
        third.close()
    # 4 s before parking; step 3 makes 6 s, step 4 makes 8 s: its call is refused.
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its time budget (8.0 s of 7 s)"


def _crash_on(event_type: type[events.Event], name: str) -> Any:
    """An event sink that raises at the first ``event_type`` event of the tool ``name``."""

    def sink(event: events.Event) -> None:
        if isinstance(event, event_type) and getattr(event, "name", None) == name:
            raise Crash

    return sink


def test_a_crash_inside_a_journaled_call_is_downtime_once_it_was_reconciled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock(autojump=True)
    write = {"id": "w", "name": "write", "arguments": {"path": "g.txt", "content": "x\n"}}
    script = _script(4, delay=2)
    script["responses"].insert(0, {"content": "write", "tool_calls": [write], "delay": 2})
    first = _agent(root, script, clock, on_event=_crash_on(events.ToolStarted, "write"))
    with pytest.raises(Crash):
        first.run("go")  # step 1 (2 s); the process dies with the write started
    session = first.last_session or ""
    first.close()
    clock.advance(3600)  # down for an hour with a call pending
    # The next process reconciles the write against its journal, then dies after a read:
    # its log now holds the hour between the write's toolStarted and its result.
    second = _agent(root, script, clock, on_event=_crash_on(events.ToolFinished, "read"))
    with pytest.raises(Crash):
        second.resume(session)
    second.close()
    assert (root / "g.txt").read_text() == "x\n"
    third = _agent(root, script, clock, max_seconds=7)
    try:
        result = third.resume(session)
    finally:
        third.close()
    # The reconciliation says the hour was a crash, not a slow write: steps 1-2 before
    # (4 s), steps 3 and 4 now (8 s), and the 4th step's call is refused.
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its time budget (8.0 s of 7 s)"


def test_a_resume_continues_the_tool_call_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    result = _crash_then_resume(
        root, _script(8), FakeClock(), steps_before=1, budget=BudgetConfig(max_tool_calls=2)
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its tool-call budget (2 of 2 calls)"
    assert _session_usage(root) == Usage(30, 15)  # the third step's call never started


def test_the_reported_cost_stops_the_run_at_the_right_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    # A price table that would say otherwise: the provider's reported cost wins.
    project = ProjectConfig(prices=(("scripted/budget", Price(input=1e6, output=1e6)),))
    result = _crash_then_resume(
        root,
        _script(8, cost=STEP_COST),
        FakeClock(),
        steps_before=2,
        budget=BudgetConfig(max_cost_usd=3 * STEP_COST),
        project=project,
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its money budget ($0.0469 of $0.046875)"
    assert _session_usage(root) == Usage(30, 15)  # the third step's tool call never ran


def test_the_price_table_prices_a_provider_that_reports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    # $1000 per million input, $2000 per million output: 10 + 5 tokens cost $0.02.
    project = project_config_from_mapping(
        {"prices": {"scripted/budget": {"input": 1000, "output": 2000}}}
    )
    result = _crash_then_resume(
        root,
        _script(8),
        FakeClock(),
        steps_before=1,
        budget=BudgetConfig(max_cost_usd=0.05),
        project=project,
    )
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["message"] == "the run used its money budget ($0.0600 of $0.05)"


def test_session_limits_count_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _workspace(tmp_path, monkeypatch)
    clock = FakeClock()
    done = {"content": "ok", "finish_reason": "stop", "usage": {"input": 20, "output": 10}}
    script = {"model": "scripted/budget", "responses": [done, _step(1), _step(2), done]}
    agent = _agent(root, script, clock, budget=BudgetConfig(max_session_tokens=50))
    try:
        first = agent.run("one")
        assert first.status is RunStatus.COMPLETED
        second = agent.run("two", session=first.session_id)
    finally:
        agent.close()
    # 30 tokens in the first run; the second is stopped once the session reaches 60.
    assert second.status is RunStatus.FAILED
    assert second.error is not None
    assert second.error["message"] == "the session used its token budget (60 of 50 tokens)"


# --------------------------------------------------------------------------- prices


def test_prices_are_looked_up_by_the_model_as_configured_then_bare() -> None:
    own = {"openai/gpt-4o-mini": Price(input=1, output=2)}
    assert price_for("openai/gpt-4o-mini", own) == Price(input=1, output=2)
    assert price_for("openai/gpt-4o-mini") == BUILTIN_PRICES["gpt-4o-mini"]
    assert price_for("anthropic:claude-sonnet-4-20250514") == BUILTIN_PRICES["claude-sonnet-4"]
    assert price_for("someone/unknown-model") is None
    price = Price(input=2, output=10, cached_input=0.5, cache_write=3, reasoning=20)
    usage = Usage(input=1_000_000, output=2_000_000, cache_read=1_000_000, cache_write=1_000_000)
    # 2 + 0.5 + 3 + (1M plain output x 10) + (1M reasoning x 20)
    assert cost_of(usage, price, reasoning_tokens=1_000_000) == pytest.approx(35.5)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"m": {"input": 1}}, "tether.toml: [prices.m]: output is required"),
        ({"m": {"input": -1, "output": 1}}, "[prices.m] input"),
        ({"m": {"input": 1, "output": 1, "cheap": 0}}, "unknown setting [prices.m] cheap"),
        ({"m": 3}, "[prices.m]"),
    ],
)
def test_a_bad_price_table_is_one_line(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ProjectConfigError, match=None) as caught:
        project_config_from_mapping({"prices": table})
    assert message in str(caught.value) and "\n" not in str(caught.value)


# --------------------------------------------------------------------------- kill and resume


CRASHES = 20


def _child(root: Path, script: dict[str, Any], session: str | None, budget: BudgetConfig) -> None:
    """In a forked child: run (or resume) until the first tool result is durable, then
    SIGKILL (the crash boundary ``after_result``); exit 0 if the run ended first."""
    try:
        faults.configure("after_result@1")
        agent = _agent(root, script, FakeClock(), budget=budget)
        if session is None:
            agent.run("go")
        else:
            agent.resume(session)
        os._exit(0)
    except BaseException:  # pragma: no cover - reported by the parent as exit 1
        os._exit(1)


def test_a_kill_and_resume_loop_never_overspends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    script = _script(CRASHES + 10, cost=STEP_COST)
    # The 21st step crosses the budget: 20 processes are killed after their tool call, the
    # 21st is refused its tool call and ends the run.
    budget = BudgetConfig(max_cost_usd=(CRASHES + 1) * STEP_COST, max_tokens=10_000)
    session: str | None = None
    kills = 0
    while True:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            _child(root, script, session, budget)
        _, status = os.waitpid(pid, 0)
        (log,) = (root / ".tether" / "sessions").glob("*.jsonl")
        state = reduce_session(log.read_bytes())
        session = state.header.id
        spent = state.usage.input + state.usage.output
        # Never more than the budget plus the one step that crossed it.
        assert spent <= (CRASHES + 1) * STEP_TOKENS + STEP_TOKENS
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            kills += 1
            assert kills <= CRASHES, "the budget did not stop the crash loop"
            continue
        assert os.WEXITSTATUS(status) == 0
        break
    assert kills == CRASHES
    finished = state.last_finished
    assert finished is not None and finished.outcome == "failed"
    assert finished.error is not None
    assert finished.error["message"] == "the run used its money budget ($0.3281 of $0.328125)"
    assert spent == (CRASHES + 1) * STEP_TOKENS


TIME_CRASHES = 10
HOUR_MS = 3_600_000


def _timed_child(root: Path, session: str | None, number: int) -> None:
    """As :func:`_child`, with a step of 2 s on a clock an hour later than the last
    process's (the downtime between crashes)."""
    try:
        faults.configure("after_result@1")
        clock = FakeClock(now_ms=START_MS + number * HOUR_MS, autojump=True)
        budget = BudgetConfig(max_seconds=2 * TIME_CRASHES + 1)
        agent = _agent(root, _script(TIME_CRASHES + 5, delay=2), clock, budget=budget)
        if session is None:
            agent.run("go")
        else:
            agent.resume(session)
        os._exit(0)
    except BaseException:  # pragma: no cover - reported by the parent as exit 1
        os._exit(1)


def test_a_kill_and_resume_loop_stays_within_one_step_of_the_active_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _workspace(tmp_path, monkeypatch)
    session: str | None = None
    kills = 0
    while True:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            _timed_child(root, session, kills)
        _, status = os.waitpid(pid, 0)
        (log,) = (root / ".tether" / "sessions").glob("*.jsonl")
        state = reduce_session(log.read_bytes())
        session = state.header.id
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            kills += 1
            assert kills <= TIME_CRASHES, "the time budget did not stop the crash loop"
            continue
        assert os.WEXITSTATUS(status) == 0
        break
    # Each process drove the run for one step of 2 s; ten hours passed on the wall.
    assert kills == TIME_CRASHES
    finished = state.last_finished
    assert finished is not None and finished.outcome == "failed"
    assert finished.error is not None
    # 21 s of budget, one step over at most: the 11th step's tool call is refused.
    assert finished.error["message"] == "the run used its time budget (22.0 s of 21 s)"
    assert state.usage == Usage(10 * (TIME_CRASHES + 1), 5 * (TIME_CRASHES + 1))


# --------------------------------------------------------------------------- reporting


def test_inspect_sessions_show_and_the_result_report_the_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from tether._cli import app

    root = _workspace(tmp_path, monkeypatch)
    # Two answers report $1/64 each; the last reports nothing and is priced from [prices]:
    # 10 input tokens at $1000 and 5 output tokens at $2000 per million: $0.02.
    (root / "tether.toml").write_text('[prices."scripted/budget"]\ninput = 1000\noutput = 2000\n')
    agent = _agent(root, _script(2, cost=STEP_COST), FakeClock())
    try:
        result = agent.run("go")
    finally:
        agent.close()
    expected = 2 * STEP_COST + 0.02
    assert result.status is RunStatus.COMPLETED
    assert result.session_cost_usd == pytest.approx(expected)
    assert result.to_dict()["sessionCostUsd"] == pytest.approx(expected)

    monkeypatch.chdir(root)
    runner = CliRunner()
    human = runner.invoke(app, ["inspect", "--last"], catch_exceptions=False)
    assert "$0.0513" in human.stdout
    inspected = json.loads(
        runner.invoke(app, ["inspect", "--last", "--json"], catch_exceptions=False).stdout
    )
    assert inspected["costUsd"] == pytest.approx(expected)
    assert set(inspected) == {"ok", "state", "costUsd"}  # beside the state, not inside it
    assert set(inspected["state"]) == {
        "header",
        "transcript",
        "activeContext",
        "operation",
        "usage",
        "repairedLength",
    }
    listed = runner.invoke(app, ["sessions", "--json"], catch_exceptions=False)
    (row,) = json.loads(listed.stdout)
    assert row["costUsd"] == pytest.approx(expected)
    assert row["usage"] == {"input": 30, "output": 15, "cacheRead": 0, "cacheWrite": 0}
    shown = runner.invoke(app, ["show", "--last", "--json"], catch_exceptions=False)
    assert json.loads(shown.stdout)["costUsd"] == pytest.approx(expected)
    drawn = runner.invoke(app, ["show", "--last"], catch_exceptions=False)
    assert "Cost $0.0513" in drawn.stdout


def test_a_session_known_to_have_no_side_records_is_costed_without_looking_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's every session ended with a look for side records (a statement on a shared
    # store). None is needed when the session had none when opened and none was written.
    from tether._stores.file import SessionStore

    looked: list[str] = []
    real = SessionStore.sidecar_names

    def counted(store: SessionStore, prefix: str) -> frozenset[str] | None:
        looked.append(prefix)
        return real(store, prefix)

    monkeypatch.setattr(SessionStore, "sidecar_names", counted)
    root = _workspace(tmp_path, monkeypatch)
    (root / "tether.toml").write_text('[prices."scripted/budget"]\ninput = 1000\noutput = 2000\n')
    agent = _agent(root, _script(2), FakeClock())
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED
    assert result.session_cost_usd == pytest.approx(3 * 0.02)  # priced, none reported
    assert looked == []
    # Answers that report a cost write side records: the cost reads them.
    agent = _agent(root, _script(2, cost=STEP_COST), FakeClock())
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert result.session_cost_usd == pytest.approx(2 * STEP_COST + 0.02)
    assert looked
