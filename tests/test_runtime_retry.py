"""Honest automatic retry against the loopback provider: every request is an attempt in the
log, a transient failure closes its run, a new run on the same input entry follows after the
backoff (Retry-After honoured), permanent errors never retry.

The backoff is waited on the agent's clock: here a :class:`~tether.testing.clock.FakeClock`
that records the waits asked and lets them pass at once (no test sleeps for a backoff)."""

from __future__ import annotations

import email.utils
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fakeprovider import FakeProvider, chunk, error, streamed
from tether._cli.inspect_cmd import render_state
from tether._models import OpenAICompatibleModel
from tether._models.http_common import retry_after_seconds as _retry_after
from tether._runtime import Agent, RunStatus
from tether._runtime.events import Event, RetryScheduled
from tether._runtime.retry import RetryPolicy, backoff, is_transient
from tether.core import reduce_session
from tether.core.state import IdleOperation
from tether.errors import ModelError
from tether.testing.clock import FakeClock


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    return ws


def agent(
    fake: FakeProvider, workspace: Path, retries: int = 2, clock: FakeClock | None = None, **kw: Any
) -> Agent:
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, api_key="test", timeout=5)
    return Agent(
        model,
        workspace=workspace,
        model_retries=retries,
        retry_base_delay=0.05,
        clock=clock if clock is not None else FakeClock(autojump=True),
        **kw,
    )


def answer(text: str = "Done.") -> Any:
    return streamed(chunk(content=text), chunk(finish_reason="stop"))


def records(data: bytes, kind: str) -> list[dict[str, Any]]:
    out = []
    for line in data.split(b"\n")[1:-1]:
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:
            if fact["kind"] == "record" and fact["record"]["type"] == kind:
                out.append(fact["record"])
    return out


class TestClassification:
    @pytest.mark.parametrize(
        ("error", "transient"),
        [
            (ModelError("rate_limited", "x", status=429), True),
            (ModelError("provider_error", "x", status=500), True),
            (ModelError("provider_error", "x", status=529), True),
            (ModelError("connection", "reset"), True),
            (ModelError("timeout", "no answer within 5 s (first-byte timeout)"), True),
            (ModelError("timeout", "stopped: nothing arrived for 5 s (idle timeout)"), False),
            (ModelError("provider_error", "x", status=400), False),
            (ModelError("provider_error", "x", status=403), False),
            (ModelError("provider_error", "in-body error"), False),
            (ModelError("authentication", "x", status=401), False),
            (ModelError("bad_response", "x"), False),
            (ModelError("aborted", "Operation aborted"), False),
        ],
    )
    def test_transient(self, error: ModelError, transient: bool) -> None:
        assert is_transient(error) is transient

    def test_backoff(self) -> None:
        policy = RetryPolicy(retries=5, base_delay=1.0, max_backoff=60)
        assert [backoff(policy, n, None) for n in (1, 2, 3, 8)] == [1, 2, 4, 60]
        assert backoff(policy, 1, 7.5) == 7.5 and backoff(policy, 3, 0.5) == 4

    def test_retry_after_both_forms(self) -> None:
        assert _retry_after({"retry-after": "3"}) == 3.0
        assert _retry_after({"retry-after-ms": "1500"}) == 1.5
        now = 1_800_000_000.0
        date = email.utils.formatdate(now + 42, usegmt=True)
        assert _retry_after({"retry-after": date}, now=now) == pytest.approx(42)
        past = email.utils.formatdate(now - 42, usegmt=True)
        assert _retry_after({"retry-after": past}, now=now) == 0.0
        assert _retry_after({"retry-after": "soon"}) is None


def test_rate_limit_then_success_is_a_second_run(fake: FakeProvider, workspace: Path) -> None:
    fake.enqueue(error(429, "slow down", headers={"Retry-After": "0.4"}), answer())
    seen: list[Event] = []
    clock = FakeClock(autojump=True)
    result = agent(fake, workspace, clock=clock, on_event=seen.append).run("hi")
    assert result.status is RunStatus.COMPLETED and result.text == "Done."
    assert clock.waits == [0.4]  # Retry-After, waited out on the clock
    assert len(fake.requests) == 2
    [retry] = [e for e in seen if isinstance(e, RetryScheduled)]
    assert (retry.reason, retry.delay, retry.retry, retry.retries) == ("rate limit", 0.4, 1, 2)
    data = result.session_path.read_bytes()
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    runs = records(data, "runStarted")
    assert len(runs) == 2 and runs[0]["inputEntryId"] == runs[1]["inputEntryId"]
    assert [r["outcome"] for r in records(data, "operationFinished")] == ["failed", "completed"]
    assert records(data, "stepFailed")[0]["error"]["code"] == "rate_limited"
    assert len(records(data, "stepAttempt")) == 2  # every physical request is an attempt
    assert [m["role"] for m in state.transcript] == ["user", "assistant"]
    out = io.StringIO()
    render_state(
        state,
        file_size=len(data),
        console=Console(file=out, width=200),
        log_dir=result.session_path.parent,
    )
    assert "retried after rate limit (0.4 s)" in out.getvalue()


def test_retries_are_bounded(fake: FakeProvider, workspace: Path) -> None:
    fake.enqueue(*(error(503, "overloaded") for _ in range(3)))
    clock = FakeClock(autojump=True)
    result = agent(fake, workspace, retries=2, clock=clock).run("hi")
    assert result.status is RunStatus.FAILED
    assert clock.waits == [0.05, 0.1]  # base * 2**(n-1) before each retry
    assert len(fake.requests) == 3  # the first request and two retries
    data = result.session_path.read_bytes()
    reduce_session(data)
    assert [r["outcome"] for r in records(data, "operationFinished")] == ["failed"] * 3
    out = io.StringIO()
    render_state(
        reduce_session(data),
        file_size=len(data),
        console=Console(file=out, width=200),
        log_dir=result.session_path.parent,
    )
    assert "gave up after server error: retries used up" in out.getvalue()


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_permanent_errors_never_retry(fake: FakeProvider, workspace: Path, status: int) -> None:
    fake.enqueue(error(status, "no"), answer())
    result = agent(fake, workspace).run("hi")
    assert result.status is RunStatus.FAILED
    assert len(fake.requests) == 1


def test_retry_after_a_tool_step(fake: FakeProvider, workspace: Path) -> None:
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "README.md"}'},
    }
    fake.enqueue(
        streamed(chunk(tool_calls=[call]), chunk(finish_reason="tool_calls")),
        error(500, "boom"),
        answer("It says hello."),
    )
    result = agent(fake, workspace).run("README?")
    assert result.status is RunStatus.COMPLETED and result.text == "It says hello."
    data = result.session_path.read_bytes()
    state = reduce_session(data)
    assert [m["role"] for m in state.transcript] == ["user", "assistant", "tool", "assistant"]
    # The retried request carries the tool result: nothing was lost or repeated.
    assert fake.requests[2].body["messages"][-1]["role"] == "tool"
    assert len(records(data, "toolStarted")) == 1


def test_no_retries_by_default_in_the_library(fake: FakeProvider, workspace: Path) -> None:
    fake.enqueue(error(429, "slow down"), answer())
    result = agent(fake, workspace, retries=0).run("hi")
    assert result.status is RunStatus.FAILED and len(fake.requests) == 1
