"""Crash tests of streaming and automatic retry: real child processes killed with SIGKILL
mid-stream, during a retry backoff, and after a retried success (tests/models_child.py),
against the loopback SSE provider. After every crash and resume: every log reduces, no tool
effect happens twice, no step has more attempts than the spec allows, and nothing of a
partial answer is in the log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fakeprovider import FakeProvider, chunk, error, streamed
from tether.core import reduce_session
from tether.core.state import IdleOperation

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "models_child.py"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def start(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(env),
    )


def kill_after_event(proc: subprocess.Popen[str], kind: str, timeout: float = 30) -> dict[str, Any]:
    """Read the child's events until ``kind``, then SIGKILL it."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == kind:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                return event
    proc.kill()
    raise AssertionError(f"the child never emitted {kind}")


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=60)
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), err


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def session_file(ws: Path) -> Path:
    [path] = list((ws / ".tether" / "sessions").glob("*.jsonl"))
    return path


def facts(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in data.split(b"\n")[1:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a torn tail
        out.extend(value if isinstance(value, list) else [value])
    return out


def records(data: bytes, kind: str) -> list[dict[str, Any]]:
    return [
        f["record"] for f in facts(data) if f["kind"] == "record" and f["record"]["type"] == kind
    ]


def check(data: bytes) -> None:
    """The log reduces, and no step has more than the spec's two attempts."""
    reduce_session(data)
    per_step = Counter(a["stepId"] for a in records(data, "stepAttempt"))
    assert max(per_step.values()) <= 2, per_step
    for attempt in records(data, "stepAttempt"):
        assert attempt["attempt"] in (1, 2)


def test_sigkill_mid_stream_then_resume(fake: FakeProvider, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fake.enqueue(streamed(chunk(content="Half an ans"), chunk(content="wer."), pauses={1: 60}))
    proc = start("run", str(ws), fake.base_url, "2")
    kill_after_event(proc, "model_delta")
    assert fake.disconnected.wait(5), "the killed client's connection stays open"
    path = session_file(ws)
    data = path.read_bytes()
    check(data)
    assert b"Half an ans" not in data  # only complete answers are committed
    assert len(records(data, "stepAttempt")) == 1 and not records(data, "stepFailed")

    fake.enqueue(streamed(chunk(content="Whole answer."), chunk(finish_reason="stop")))
    code, result, err = finish(start("resume", str(ws), fake.base_url, "2", str(path)))
    assert code == 0, err
    assert result["status"] == "completed" and result["text"] == "Whole answer."
    data = path.read_bytes()
    check(data)
    attempts = records(data, "stepAttempt")
    assert [a["attempt"] for a in attempts] == [1, 2]  # the crash-retry of the same step
    assert len({a["stepId"] for a in attempts}) == 1
    assert b"Half an ans" not in data


def test_sigkill_during_backoff_then_resume_continues_the_schedule(
    fake: FakeProvider, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    fake.enqueue(error(429, "slow down", headers={"Retry-After": "2.5"}))
    proc = start("run", str(ws), fake.base_url, "2")
    event = kill_after_event(proc, "retry_scheduled")
    killed_at = time.time()
    assert event["reason"] == "rate limit" and event["delay"] == 2.5
    path = session_file(ws)
    data = path.read_bytes()
    check(data)
    assert [r["outcome"] for r in records(data, "operationFinished")] == ["failed"]
    schedule = json.loads((path.parent / f".{path.stem.split('_', 1)[1]}.retry.json").read_bytes())
    assert schedule["retry"] == 1 and schedule["startedOperationId"] is None
    assert len(fake.requests) == 1

    fake.enqueue(streamed(chunk(content="After the wait."), chunk(finish_reason="stop")))
    code, result, err = finish(start("resume", str(ws), fake.base_url, "2", str(path)))
    assert code == 0, err
    assert result["status"] == "completed" and result["text"] == "After the wait."
    assert time.time() * 1000 >= schedule["dueAt"]  # the wait was not skipped
    assert time.time() - killed_at < 30
    assert len(fake.requests) == 2
    data = path.read_bytes()
    check(data)
    runs = records(data, "runStarted")
    assert len(runs) == 2 and runs[0]["inputEntryId"] == runs[1]["inputEntryId"]
    assert [r["outcome"] for r in records(data, "operationFinished")] == ["failed", "completed"]
    # A second resume finds nothing to do: one failure, one retry.
    code, result, err = finish(start("resume", str(ws), fake.base_url, "2", str(path)))
    assert code == 0, err
    assert len(fake.requests) == 2


@pytest.mark.parametrize("boundary", ["after_effect", "after_result"])
def test_sigkill_after_retried_success_runs_the_effect_once(
    fake: FakeProvider, tmp_path: Path, boundary: str
) -> None:
    ws = workspace(tmp_path)
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": "echo x >> counter.txt"})},
    }
    fake.enqueue(
        error(503, "overloaded"),
        streamed(chunk(tool_calls=[call]), chunk(finish_reason="tool_calls")),
    )
    proc = start(
        "run",
        str(ws),
        fake.base_url,
        "2",
        env={"TETHER_CRASH_AT": boundary, "TETHER_CRASH_MODE": "kill"},
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    assert (ws / "counter.txt").read_text() == "x\n"
    path = session_file(ws)
    check(path.read_bytes())

    fake.enqueue(streamed(chunk(content="Counted."), chunk(finish_reason="stop")))
    code, result, err = finish(start("resume", str(ws), fake.base_url, "2", str(path)))
    assert code == 0, err
    assert result["status"] == "completed"
    assert (ws / "counter.txt").read_text() == "x\n"  # zero duplicate effects
    data = path.read_bytes()
    check(data)
    assert len(records(data, "toolStarted")) == 1
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    runs = records(data, "runStarted")
    assert len(runs) == 2 and runs[0]["inputEntryId"] == runs[1]["inputEntryId"]
