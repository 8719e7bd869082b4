"""The agent with a streaming provider (tests/fakeprovider.py speaking SSE on loopback).

Deltas reach ``on_event`` live as ``model_delta`` events while only the complete answer is
committed; a stream that breaks off mid-answer closes the attempt with ``stepFailed`` and
leaves no partial assistant entry; every log reduces.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakeprovider import FakeProvider, chunk, streamed
from tether._models import OpenAICompatibleModel
from tether._runtime import Agent, RunStatus
from tether._runtime.events import Event, ModelDelta
from tether.core import reduce_session
from tether.core.state import IdleOperation


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


def remote(fake: FakeProvider, **kw: float) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(
        "fake/model", base_url=fake.base_url, api_key="test", timeout=5.0, **kw
    )


def facts(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in data.split(b"\n")[1:-1]:
        value = json.loads(line)
        out.extend(value if isinstance(value, list) else [value])
    return out


def test_streamed_tool_call_and_answer(fake: FakeProvider, workspace: Path) -> None:
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "README.md"}'},
    }
    fake.enqueue(
        streamed(
            chunk(reasoning="Look first."),
            chunk(tool_calls=[call]),
            chunk(finish_reason="tool_calls"),
        ),
        streamed(chunk(content="It says "), chunk(content="hello."), chunk(finish_reason="stop")),
    )
    seen: list[Event] = []
    result = Agent(remote(fake), workspace=workspace, on_event=seen.append).run("README?")
    assert result.status is RunStatus.COMPLETED and result.text == "It says hello."
    deltas = [(e.channel, e.text) for e in seen if isinstance(e, ModelDelta)]
    assert deltas == [("reasoning", "Look first."), ("text", "It says "), ("text", "hello.")]
    kinds = [e.kind for e in seen]
    assert kinds.index("model_delta") < kinds.index("model_finished")
    data = result.session_path.read_bytes()
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    entries = [f["entry"] for f in facts(data) if f["kind"] == "entry"]
    messages = [e["message"] for e in entries if e["message"]["role"] == "assistant"]
    assert messages[1] == {"role": "assistant", "content": "It says hello."}
    assert b"Look first." not in data  # reasoning never enters the v2 log
    assert fake.requests[0].body["stream"] is True


def test_deltas_are_asked_for_only_when_someone_listens(
    fake: FakeProvider, workspace: Path
) -> None:
    # Without an on_event nobody sees a delta: the model is not asked for them, so the
    # waiting session is not woken for each one (a worker's sessions; issue 33).
    asked: list[bool] = []

    class Recording(OpenAICompatibleModel):
        def complete(self, request: Any, *, cancel: Any = None, on_delta: Any = None) -> Any:
            asked.append(on_delta is not None)
            return super().complete(request, cancel=cancel, on_delta=on_delta)

    def answer() -> Any:
        return streamed(
            chunk(content="It says "), chunk(content="hi."), chunk(finish_reason="stop")
        )

    model = Recording("fake/model", base_url=fake.base_url, api_key="test", timeout=5.0)
    fake.enqueue(answer(), answer())
    assert Agent(model, workspace=workspace).run("README?").text == "It says hi."
    seen: list[Event] = []
    assert Agent(model, workspace=workspace, on_event=seen.append).run("again").text == (
        "It says hi."
    )
    assert asked == [False, True]
    assert [e.text for e in seen if isinstance(e, ModelDelta)] == ["It says ", "hi."]


def test_stream_broken_mid_answer_fails_the_step(fake: FakeProvider, workspace: Path) -> None:
    fake.enqueue(streamed(chunk(content="Half of"), done=False, hang_up=True))
    result = Agent(remote(fake), workspace=workspace).run("hi")
    assert result.status is RunStatus.FAILED
    data = result.session_path.read_bytes()
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    kinds = [f["record"]["type"] for f in facts(data) if f["kind"] == "record"]
    assert "stepFailed" in kinds
    assert b"Half of" not in data
    assert len(fake.requests) == 1


# --------------------------------------------------------------------------- reasoning


DETAIL = {"type": "reasoning.text", "index": 0, "format": "anthropic-claude-v1"}
READ_CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "read", "arguments": '{"path": "README.md"}'},
}


def _reasoning_turns(fake: FakeProvider) -> None:
    fake.enqueue(
        streamed(
            chunk(reasoning="Read it.", reasoning_details=[{**DETAIL, "text": "Read it."}]),
            chunk(reasoning_details=[{**DETAIL, "text": "", "signature": "sig=="}]),
            chunk(tool_calls=[READ_CALL]),
            chunk(
                finish_reason="tool_calls",
                usage={
                    "prompt_tokens": 9,
                    "completion_tokens": 30,
                    "completion_tokens_details": {"reasoning_tokens": 21},
                    "cost": 0.0012,
                },
            ),
        ),
        streamed(chunk(content="It says hello."), chunk(finish_reason="stop")),
    )


def side_files(result_path: Path) -> list[Path]:
    return sorted(result_path.parent.glob(".*.reasoning.*.json"))


def test_reasoning_side_record_is_kept_and_sent_back(fake: FakeProvider, workspace: Path) -> None:
    _reasoning_turns(fake)
    result = Agent(remote(fake), workspace=workspace).run("README?")
    assert result.status is RunStatus.COMPLETED
    data = result.session_path.read_bytes()
    assert b"Read it." not in data and b"sig==" not in data  # strictly session v2
    state = reduce_session(data)
    first_assistant = next(
        i
        for i, m in zip(state.transcript_ids, state.transcript, strict=True)
        if m["role"] == "assistant"
    )
    [path] = side_files(result.session_path)
    assert path.name == f".{result.session_id}.reasoning.{first_assistant}.json"
    assert path.stat().st_mode & 0o777 == 0o600
    record = json.loads(path.read_bytes())
    assert record["entryId"] == first_assistant
    assert record["reasoning"]["text"] == "Read it."
    assert record["reasoning"]["details"] == [{**DETAIL, "text": "Read it.", "signature": "sig=="}]
    assert record["reasoningTokens"] == 21 and record["cost"] == 0.0012
    # Sent back verbatim on the next request, as OpenRouter asks.
    assistant = fake.requests[1].body["messages"][2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["reasoning_details"] == record["reasoning"]["details"]


def test_missing_side_records_still_resume(fake: FakeProvider, workspace: Path) -> None:
    _reasoning_turns(fake)
    result = Agent(remote(fake), workspace=workspace).run("README?")
    for path in side_files(result.session_path):
        path.unlink()
    fake.enqueue(streamed(chunk(content="Still here."), chunk(finish_reason="stop")))
    again = Agent(remote(fake), workspace=workspace).run("again?", session=result.session_id)
    assert again.status is RunStatus.COMPLETED and again.text == "Still here."
    messages = fake.requests[2].body["messages"]
    assert all("reasoning_details" not in m for m in messages)
    reduce_session(again.session_path.read_bytes())


def test_inspect_shows_the_reasoning(fake: FakeProvider, workspace: Path) -> None:
    import io

    from rich.console import Console

    from tether._cli.inspect_cmd import render_state

    _reasoning_turns(fake)
    result = Agent(remote(fake), workspace=workspace).run("README?")
    data = result.session_path.read_bytes()
    out = io.StringIO()
    console = Console(file=out, width=200)
    render_state(
        reduce_session(data),
        file_size=len(data),
        console=console,
        log_dir=result.session_path.parent,
    )
    text = out.getvalue()
    assert "thinking" in text and "Read it." in text
    assert "reasoning tokens" in text and "21" in text


def test_usage_event_carries_reasoning_tokens_and_cost(fake: FakeProvider, workspace: Path) -> None:
    from tether._runtime.events import UsageReported

    _reasoning_turns(fake)
    seen: list[Event] = []
    Agent(remote(fake), workspace=workspace, on_event=seen.append).run("README?")
    usage = [e for e in seen if isinstance(e, UsageReported)]
    assert (usage[0].reasoning_tokens, usage[0].cost) == (21, 0.0012)
    assert (usage[1].reasoning_tokens, usage[1].cost) == (None, None)
    assert usage[0].to_dict()["reasoningTokens"] == 21
