"""The executor's stop signal (``Executor.set_stop_signal``), on the local file store.

A worker's ``SIGTERM`` sets it (tests/test_pg_workers.py drives that with real processes on
PostgreSQL). Here, in one process: the signal set while a tool call runs lets the call
finish and commit its result, then the drive ends ``stopped`` with the operation still
unfinished and nothing recorded for the stop; a later resume finishes the run from there,
and the bash call ran exactly once. Without a signal (the default) nothing changes; a stop
condition already noted (a repeated failure) is still committed before the drive stops.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, RunStatus
from tether._runtime import events
from tether._tools.builtin import builtin_tools
from tether.core.reducer import Reducer
from tether.testing import ScriptedModel


def _script() -> dict[str, Any]:
    bash = {"command": "echo ran >> counter.txt"}
    return {
        "model": "scripted/stop-signal",
        "responses": [
            {"tool_calls": [{"id": "b1", "name": "bash", "arguments": bash}]},
            {"tool_calls": [{"id": "b2", "name": "bash", "arguments": bash}]},
            {"content": "All done.", "finish_reason": "stop"},
        ],
    }


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    monkeypatch.delenv("TETHER_STORE_URL", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def _agent(workspace: Path, on_event: Any = None) -> Agent:
    return Agent(
        ScriptedModel.from_json(_script()),
        [*builtin_tools()],
        workspace=workspace,
        read_agents_md=False,
        on_event=on_event,
    )


def _record_types(path: Path) -> list[str]:
    """The record types of the log. After the header each line is a transaction: a list
    of facts, or a single fact as an object (as ``abortRequested`` is committed)."""
    lines = [json.loads(line) for line in path.read_bytes().splitlines()[1:]]
    facts = [fact for line in lines for fact in (line if isinstance(line, list) else [line])]
    return [str(fact["record"]["type"]) for fact in facts if fact.get("kind") == "record"]


def test_a_stop_during_a_tool_call_ends_the_drive_after_its_result(workspace: Path) -> None:
    stop = threading.Event()

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.ToolStarted):
            stop.set()  # as a SIGTERM arriving while the call runs

    agent = _agent(workspace, on_event)
    agent.set_stop_signal(stop)
    try:
        result = agent.run("go")
        session, path = result.session_id, result.session_path
        assert result.status is RunStatus.STOPPED
        state = Reducer.load(path.read_bytes()).state
    finally:
        agent.close()
    # The call that was running finished and its result is committed; nothing was aborted,
    # and the second call was not started.
    assert state.operation.kind == "run"
    tool_messages = [m for m in state.transcript if m["role"] == "tool"]
    assert len(tool_messages) == 1
    assert "interrupted" not in str(tool_messages[0]["content"]).lower()
    assert (workspace / "counter.txt").read_text() == "ran\n"
    assert "abortRequested" not in _record_types(path)

    again = _agent(workspace)
    try:
        finished = again.resume(session)
    finally:
        again.close()
    assert finished.status is RunStatus.COMPLETED
    assert finished.text == "All done."
    assert (workspace / "counter.txt").read_text() == "ran\nran\n"


def test_without_a_signal_the_drive_runs_to_its_end(workspace: Path) -> None:
    stop = threading.Event()
    agent = _agent(workspace)
    agent.set_stop_signal(stop)  # never set
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED
    assert (workspace / "counter.txt").read_text() == "ran\nran\n"


def test_a_stop_set_before_the_drive_changes_nothing(workspace: Path) -> None:
    stop = threading.Event()
    first = _agent(workspace)
    try:
        session = first.run("go").session_id  # completed: idle
    finally:
        first.close()
    stop.set()
    agent = _agent(workspace)
    agent.set_stop_signal(stop)
    try:
        # An idle session has nothing to stop: resume reports idle, as without a signal.
        assert agent.resume(session).status is RunStatus.IDLE
    finally:
        agent.close()


def test_a_repeated_failure_noted_before_the_stop_still_ends_the_run(workspace: Path) -> None:
    # The second identical failing call is a repeated failure: a stop condition the
    # executor holds in memory until its next plan. A stop arriving during that call must
    # not drop it: the run ends failed, as without the stop.
    # The counter is outside the workspace (a writable root): a change to the workspace
    # between the two calls would make the second failure a new one, not a repeat.
    fail = {"command": "echo failing >> ../counter.txt; exit 3"}
    script = {
        "model": "scripted/stop-signal",
        "responses": [
            {"tool_calls": [{"id": "f1", "name": "bash", "arguments": fail}]},
            {"tool_calls": [{"id": "f2", "name": "bash", "arguments": fail}]},
            {"content": "Never reached.", "finish_reason": "stop"},
        ],
    }
    stop = threading.Event()
    started: list[str] = []

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.ToolStarted):
            started.append(event.call_id)
            if len(started) == 2:
                stop.set()

    agent = Agent(
        ScriptedModel.from_json(script),
        [*builtin_tools()],
        workspace=workspace,
        read_agents_md=False,
        on_event=on_event,
        writable_roots=[str(workspace.parent)],
    )
    agent.set_stop_signal(stop)
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert started == ["f1", "f2"]
    assert result.status is RunStatus.FAILED, result
    assert result.message is not None and result.message.startswith("repeated_failure")
