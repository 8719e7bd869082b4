"""An Agent holds its session across calls, and syncs the log only at durable points.

docs/runtime.md, "Durable points": a turn of one tool call and an answer costs four
``fdatasync``s (the first attempt, the tool intent, the next attempt, the end of the call),
a held session costs no open, read or reduce, and it is refused to every other writer
until the agent lets go of it (close, ``with`` exit, another session, an exception, or
``SIGKILL`` of its process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, RunStatus, reduce_session
from tether._models.base import ModelRequest, ModelResponse
from tether._stores import file as file_store
from tether._stores.file import SessionStore
from tether.core.reducer import Reducer
from tether.errors import SessionBusy, SessionWriteError, StoreUnavailable
from tether.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def script(turns: int) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for i in range(turns):
        responses.append(
            {"tool_calls": [{"id": f"c{i}", "name": "read", "arguments": {"path": "notes.txt"}}]}
        )
        responses.append({"content": f"Answer {i}."})
    return {"model": "scripted/held", "responses": responses}


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("some notes\n")
    return ws


def agent_for(workspace: Path, turns: int = 5, **options: Any) -> Agent:
    return Agent(ScriptedModel.from_json(script(turns)), workspace=workspace, **options)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every fdatasync the session stores make (the real call, counted)."""
    calls: list[int] = []
    real = file_store._fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(file_store, "_fdatasync", counting)
    yield calls


# --------------------------------------------------------------------------- durable points


def test_a_tool_turn_costs_four_fdatasyncs(workspace: Path, syncs: list[int]) -> None:
    with agent_for(workspace) as agent:
        first = agent.run("one")
        assert first.status is RunStatus.COMPLETED
        for n in range(2, 5):
            syncs.clear()
            result = agent.run(f"turn {n}", session=first.session_id)
            assert result.status is RunStatus.COMPLETED
            # stepAttempt, toolStarted, stepAttempt, the final flush; nothing else.
            assert len(syncs) == 4, n
    data = first.session_path.read_bytes()
    state = reduce_session(data)
    # Still the same eight transactions a turn, one line each (spec 15.2, with the final
    # answer and operationFinished apart): only the syncs were grouped.
    assert len(data.splitlines()) == 1 + 4 * 8
    assert state.operation.kind == "idle"


def test_process_durability_makes_no_fdatasync(workspace: Path, syncs: list[int]) -> None:
    with agent_for(workspace, durability="process") as agent:
        first = agent.run("one")
        syncs.clear()
        agent.run("two", session=first.session_id)
    assert syncs == []


def test_everything_is_durable_when_the_call_returns(workspace: Path, syncs: list[int]) -> None:
    """The last durable point of a call is its end: nothing is left unsynced."""
    with agent_for(workspace) as agent:
        result = agent.run("one")
        held = agent._executor._held  # the store the executor holds (not public)
        assert isinstance(held, SessionStore)
        assert held._synced == held.length == result.session_path.stat().st_size


def test_sync_false_defers_the_sync_to_the_next_durable_point(workspace: Path) -> None:
    from tether.core import facts

    store = SessionStore.create(workspace, provider="p", model="m", environment_identity="e")
    order: list[str] = []
    real_write, real_sync = store._write, store._sync
    store._write = lambda fd, data: order.append("write") or real_write(fd, data)  # type: ignore[assignment]
    store._sync = lambda fd: order.append("sync") or real_sync(fd)  # type: ignore[assignment]
    with store:
        store.commit([facts.user_entry(entry_id=None, content="a")], sync=False)
        store.commit([facts.user_entry(entry_id=None, content="b")], sync=False)
        assert order == ["write", "write"]
        store.commit([facts.user_entry(entry_id=None, content="c")])
        assert order == ["write", "write", "write", "sync"]
        store.flush()  # nothing unsynced: no call
        store.commit([facts.user_entry(entry_id=None, content="d")], sync=False)
        store.flush()
        assert order[-2:] == ["write", "sync"]
    assert len(reduce_session(store.path.read_bytes()).transcript) == 4


def test_a_failed_deferred_sync_fails_the_store(workspace: Path) -> None:
    from tether.core import facts

    store = SessionStore.create(workspace, provider="p", model="m", environment_identity="e")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with store:
        store.commit([facts.user_entry(entry_id=None, content="a")], sync=False)
        store._sync = broken  # type: ignore[assignment]
        with pytest.raises(SessionWriteError) as failed:
            store.flush()
        assert failed.value.failed
        with pytest.raises(StoreUnavailable):
            store.commit([facts.user_entry(entry_id=None, content="b")])


# --------------------------------------------------------------------------- held session


def test_a_held_session_is_not_opened_read_or_reduced_again(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with agent_for(workspace) as agent:
        sid = agent.run("one").session_id
        opens: list[str] = []
        loads: list[int] = []
        real_open, real_load = SessionStore.open, Reducer.load
        monkeypatch.setattr(
            SessionStore, "open", lambda *a, **k: opens.append("open") or real_open(*a, **k)
        )
        monkeypatch.setattr(
            Reducer, "load", staticmethod(lambda data: loads.append(len(data)) or real_load(data))
        )
        for n in range(3):
            assert agent.run(f"again {n}", session=sid).status is RunStatus.COMPLETED
        assert agent.resume(sid).status is RunStatus.IDLE
        assert opens == [] and loads == []
        assert agent.held_session == sid


def test_another_agent_is_refused_until_the_holder_closes(workspace: Path) -> None:
    holder = agent_for(workspace)
    sid = holder.run("one").session_id
    other = agent_for(workspace)
    with pytest.raises(SessionBusy) as busy:
        other.resume(sid)
    assert busy.value.this_process
    assert "already open for writing by this process" in str(busy.value)
    holder.close()
    assert holder.held_session is None
    assert other.resume(sid).status is RunStatus.IDLE
    other.close()


def test_leaving_the_with_block_releases(workspace: Path) -> None:
    with agent_for(workspace) as agent:
        sid = agent.run("one").session_id
        assert agent.held_session == sid
    with SessionStore.open(sid, workspace=workspace) as store:
        assert store.session_id == sid


def test_a_new_session_releases_the_held_one(workspace: Path) -> None:
    with agent_for(workspace) as agent:
        first = agent.run("one").session_id
        second = agent.run("two").session_id
        assert agent.held_session == second != first
        with SessionStore.open(first, workspace=workspace) as store:  # free again
            assert store.session_id == first


class _Exploding:
    """A model adapter that fails with an unexpected error on its second request."""

    provider = "test"
    model = "test/exploding"
    adapter_identity = "test-exploding"
    routing_identity = "test"

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest, *, cancel: Any = None) -> ModelResponse:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("adapter bug")
        return ModelResponse(content="fine")


def test_an_exception_releases_the_session(workspace: Path) -> None:
    agent = Agent(_Exploding(), workspace=workspace)
    sid = agent.run("one").session_id
    with pytest.raises(RuntimeError, match="adapter bug"):
        agent.run("two", session=sid)
    assert agent.held_session is None
    # The next call reads back what is on disk: the attempt the crash left open.
    with SessionStore.open(sid, workspace=workspace) as store:
        assert store.state.operation.kind == "run"
    agent.close()


def test_an_agent_nobody_references_lets_go(workspace: Path) -> None:
    sid = agent_for(workspace).run("one").session_id
    # Each agent here is garbage once its call returns; the next open collects it.
    for n in range(3):
        assert agent_for(workspace).run(f"again {n}", session=sid).status is RunStatus.COMPLETED


# --------------------------------------------------------------------------- other processes

HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from tether import Agent
    from tether.testing import ScriptedModel

    workspace, script = sys.argv[1], json.loads(sys.argv[2])
    agent = Agent(ScriptedModel.from_json(script), workspace=workspace)
    result = agent.run("one")
    print(json.dumps({"session": result.session_id}), flush=True)
    time.sleep(60)  # holding the session, between two calls
    """
)


def _holder(workspace: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(workspace), json.dumps(script(3))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, "the holder died before it ran"
    return child, json.loads(line)["session"]


def test_another_process_is_refused_and_sigkill_releases(workspace: Path) -> None:
    child, sid = _holder(workspace)
    try:
        with pytest.raises(SessionBusy) as busy:
            SessionStore.open(sid, workspace=workspace)
        assert not busy.value.this_process
        assert f"pid {child.pid}" in str(busy.value)
        # The cleanest possible exit of a holder is no exit at all: kill it between calls.
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    # Nothing was lost: the first call's facts were durable when it returned.
    with agent_for(workspace) as agent:
        assert agent.resume(sid).status is RunStatus.IDLE
        result = agent.run("two", session=sid)
        assert result.status is RunStatus.COMPLETED
    state = reduce_session(result.session_path.read_bytes())
    assert [m["role"] for m in state.transcript].count("user") == 2


def test_json_of_a_held_run_is_unchanged(workspace: Path) -> None:
    """The result a held session reports is the one a fresh open would."""
    with agent_for(workspace) as agent:
        sid = agent.run("one").session_id
        held = agent.run("two", session=sid).to_dict()
    fresh_agent = agent_for(workspace, turns=5)
    # A fresh agent on the same log reports the same session usage.
    with fresh_agent:
        idle = fresh_agent.resume(sid).to_dict()
    assert held["sessionUsage"] == idle["sessionUsage"]
