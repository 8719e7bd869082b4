"""The native Anthropic Messages adapter against a real SSE server on loopback.

The fake (tests/fakeprovider.py) speaks the Messages streaming protocol: ``message_start``,
``content_block_*`` with text, thinking (with signatures), redacted thinking and tool-use
input deltas, ``ping``, ``message_delta`` and ``message_stop``, with real pauses, hang-ups
and error bodies. The official ``anthropic`` SDK is what talks to it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # in CI the dev extra installs it: never skip there
    pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

from fakeprovider import (
    Canned,
    FakeProvider,
    anthropic_error,
    anthropic_event,
    anthropic_stream,
    ok,
    raw,
)
from tether._models.anthropic_native import AnthropicModel
from tether._models.base import ModelRequest, Reasoning, TokenUsage
from tether._models.streaming import Delta
from tether._runtime.retry import is_transient
from tether.core.state import StopReason
from tether.errors import ConfigurationError, ModelError

KEY = "sk-ant-test-SECRET-0123456789"
READ = {
    "name": "read",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


def adapter(fake: FakeProvider, **kw: Any) -> AnthropicModel:
    kw.setdefault("timeout", 5.0)
    return AnthropicModel("claude-fake", base_url=fake.root_url, api_key=KEY, **kw)


def request(**changes: Any) -> ModelRequest:
    base: dict[str, Any] = {
        "system_prompt": "Be terse.",
        "messages": [{"role": "user", "content": "What is in a and b?"}],
        "tools": [READ],
    }
    base.update(changes)
    return ModelRequest(**base)


def fail(model: AnthropicModel, req: ModelRequest, **kw: Any) -> ModelError:
    with pytest.raises(ModelError) as info:
        model.complete(req, **kw)
    assert "\n" not in info.value.message and KEY not in info.value.message
    return info.value


THINKING = {"type": "thinking", "thinking": "I should read both files.", "signature": "sig-abc=="}
REDACTED = {"type": "redacted_thinking", "data": "EncryptedBlob=="}


def test_text_answer_request_shape_and_cache_usage(fake: FakeProvider) -> None:
    usage = {"input_tokens": 5, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40}
    fake.enqueue(anthropic_stream({"type": "text", "text": "Hello there."}, usage=usage))
    seen: list[Delta] = []
    model = adapter(fake)
    response = model.complete(request(output_options={"temperature": 0}), on_delta=seen.append)
    assert response.content == "Hello there."
    assert response.stop_reason is StopReason.STOP
    assert response.usage == TokenUsage(input=5, output=7, cache_read=900, cache_write=40)
    assert [d.text for d in seen] == ["Hello ", "there."]
    [sent] = fake.requests
    assert sent.path == "/v1/messages"
    sent_key = sent.headers.get("x-api-key") or sent.headers.get("authorization", "")[7:]
    assert sent_key == KEY  # the SDK's choice of header
    assert "anthropic-version" in sent.headers
    assert sent.headers.get("x-stainless-retry-count", "0") == "0"
    body = sent.body
    assert body["model"] == "claude-fake" and body["stream"] is True
    assert body["max_tokens"] == 8192 and body["temperature"] == 0
    assert body["system"] == [
        {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"] == [
        {
            "name": "read",
            "description": "Read a file",
            "input_schema": READ["parameters"],
            "cache_control": {"type": "ephemeral"},
        }
    ]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "What is in a and b?",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
    ]
    assert model.adapter_identity == "anthropic:messages:v1"
    assert model.routing_identity == f"127.0.0.1:{fake.port}/claude-fake"


def test_thinking_with_parallel_tool_use_is_kept_and_sent_back(fake: FakeProvider) -> None:
    fake.enqueue(
        anthropic_stream(
            THINKING,
            REDACTED,
            {"type": "text", "text": "Reading both."},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b"}},
            stop_reason="tool_use",
        ),
        anthropic_stream({"type": "text", "text": "a says A, b says B."}),
    )
    model = adapter(fake)
    seen: list[Delta] = []
    thinking_on = {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 4096}
    first = model.complete(request(output_options=thinking_on), on_delta=seen.append)
    assert first.stop_reason is StopReason.TOOL_USE
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("toolu_1", "read", '{"path": "a"}'),
        ("toolu_2", "read", '{"path": "b"}'),
    ]
    assert first.reasoning == Reasoning(
        text="I should read both files.", details=(THINKING, REDACTED), format="anthropic"
    )
    assert [d.text for d in seen if d.channel == "reasoning"] == ["I should rea", "d both files."]

    history = [
        {"role": "user", "content": "What is in a and b?"},
        first.to_message(),
        {"role": "tool", "content": "A", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "B", "tool_call_id": "toolu_2"},
    ]
    second = model.complete(
        request(
            messages=history,
            reasoning=[None, first.reasoning, None, None],
            output_options=thinking_on,
        )
    )
    assert second.content == "a says A, b says B."
    body = fake.requests[1].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 4096
    _user, assistant, results = body["messages"]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        THINKING,
        REDACTED,
        {"type": "text", "text": "Reading both."},
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b"}},
    ]
    assert results["role"] == "user"  # both results in one turn, as parallel tool use needs
    assert [b["type"] for b in results["content"]] == ["tool_result", "tool_result"]
    assert results["content"][1]["cache_control"] == {"type": "ephemeral"}


def test_missing_side_record_sends_no_thinking(fake: FakeProvider) -> None:
    fake.enqueue(anthropic_stream({"type": "text", "text": "ok"}))
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": "{not json"},
                }
            ],
        },
        {"role": "tool", "content": "A", "tool_call_id": "toolu_1"},
    ]
    adapter(fake).complete(request(messages=history))
    assistant = fake.requests[0].body["messages"][1]
    assert assistant["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}
    ]


def test_max_tokens_is_length(fake: FakeProvider) -> None:
    fake.enqueue(anthropic_stream({"type": "text", "text": "cut of"}, stop_reason="max_tokens"))
    assert adapter(fake).complete(request()).stop_reason is StopReason.LENGTH


def test_stream_cut_before_message_stop(fake: FakeProvider) -> None:
    fake.enqueue(anthropic_stream({"type": "text", "text": "half"}, complete=False, hang_up=True))
    err = fail(adapter(fake), request())
    assert err.code == "connection"
    assert len(fake.requests) == 1


def test_idle_timeout_and_cancel_close_the_connection(fake: FakeProvider) -> None:
    fake.enqueue(anthropic_stream({"type": "text", "text": "slow"}, pauses={3: 10.0}))
    started = time.monotonic()
    err = fail(adapter(fake, idle_timeout=0.4), request())
    assert err.code == "timeout" and "idle timeout" in err.message
    assert time.monotonic() - started < 3.0
    assert fake.disconnected.wait(3.0)

    fake.disconnected.clear()
    fake.enqueue(anthropic_stream({"type": "text", "text": "slow"}, pauses={3: 10.0}))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    err = fail(adapter(fake), request(), cancel=cancel)
    assert err.code == "aborted"
    assert fake.disconnected.wait(2.0)


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (429, "rate_limit_error", "rate_limited"),
        (529, "overloaded_error", "provider_error"),
        (401, "authentication_error", "authentication"),
        (400, "invalid_request_error", "provider_error"),
    ],
)
def test_errors_are_not_retried(fake: FakeProvider, status: int, kind: str, code: str) -> None:
    fake.enqueue(anthropic_error(status, kind, "said the server", {"retry-after": "2"}))
    err = fail(adapter(fake), request())
    assert err.code == code and err.status == status
    assert "said the server" in err.message
    if code == "rate_limited":
        assert err.retry_after == 2.0
    assert len(fake.requests) == 1


def error_stream(kind: str, message: str) -> Canned:
    """A 200 stream that starts a message, then reports an ``error`` event (how Anthropic
    usually reports an overload)."""
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 1}}},
        {"type": "ping"},
        {"type": "error", "error": {"type": kind, "message": message}},
    ]
    return Canned(chunks=tuple((0.0, anthropic_event(e)) for e in events))


@pytest.mark.parametrize(
    ("kind", "code", "status", "transient"),
    [
        ("overloaded_error", "provider_error", 529, True),
        ("api_error", "provider_error", 500, True),
        ("rate_limit_error", "rate_limited", 429, True),
        ("invalid_request_error", "provider_error", 400, False),
        ("something_new", "provider_error", None, False),
    ],
)
def test_error_event_mid_stream_is_classed_like_its_http_status(
    fake: FakeProvider, kind: str, code: str, status: int | None, transient: bool
) -> None:
    fake.enqueue(error_stream(kind, f"Overloaded now (key {KEY})"))
    err = fail(adapter(fake), request())  # the key the server echoes is masked
    assert (err.code, err.status, is_transient(err)) == (code, status, transient)
    assert "Overloaded now" in err.message and err.message.startswith(fake.root_url)
    assert len(fake.requests) == 1  # the adapter never retries by itself


def test_a_streamed_overload_is_retried_by_the_agent(fake: FakeProvider, tmp_path: Path) -> None:
    """docs/models.md promises Anthropic's overload is retried; the streamed form is the
    usual one, so it must be retried too (a new run, in the log)."""
    from tether._runtime import Agent, RunStatus
    from tether.testing.clock import FakeClock

    workspace = tmp_path / "ws"
    workspace.mkdir()
    fake.enqueue(
        error_stream("overloaded_error", "Overloaded"),
        anthropic_stream({"type": "text", "text": "Fine now."}),
    )
    agent = Agent(
        adapter(fake),
        workspace=workspace,
        model_retries=1,
        retry_base_delay=0.05,
        clock=FakeClock(autojump=True),
    )
    try:
        result = agent.run("hi")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED and result.text == "Fine now."
    assert len(fake.requests) == 2
    assert b"Overloaded" in result.session_path.read_bytes()  # the failed attempt is logged


def message_json(*blocks: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_whole",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 12, "cache_read_input_tokens": 5},
    }


def test_a_whole_json_message_is_the_answer_not_a_broken_stream(fake: FakeProvider) -> None:
    """A server that ignores ``stream`` answers ``200 application/json`` with a complete
    Message: it is the answer (taken by content type), not a stream cut short."""
    fake.enqueue(
        ok(
            message_json(
                THINKING,
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b"}},
                stop_reason="tool_use",
            )
        )
    )
    seen: list[Delta] = []
    response = adapter(fake).complete(request(), on_delta=seen.append)
    assert response.content == "Reading both."
    assert response.stop_reason is StopReason.TOOL_USE
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("toolu_1", "read", '{"path": "a"}'),
        ("toolu_2", "read", '{"path": "b"}'),
    ]
    assert response.usage == TokenUsage(input=30, output=12, cache_read=5, cache_write=0)
    assert response.reasoning is not None and response.reasoning.details == (THINKING,)
    assert seen == []  # nothing streamed
    [sent] = fake.requests
    assert sent.body["stream"] is True


def test_a_json_error_body_with_200_and_a_non_json_body(fake: FakeProvider) -> None:
    fake.enqueue(
        ok({"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}}),
        raw(200, b"<html>gateway</html>", "text/html"),
    )
    err = fail(adapter(fake), request())
    assert (err.code, err.status) == ("provider_error", 529) and "Busy" in err.message
    err = fail(adapter(fake), request())
    assert err.code == "bad_response" and "text/html" in err.message and "gateway" in err.message


@pytest.mark.parametrize("whole", [False, True])
def test_context_window_exceeded_is_length(fake: FakeProvider, whole: bool) -> None:
    block = {"type": "text", "text": "cut"}
    reason = "model_context_window_exceeded"
    fake.enqueue(
        ok(message_json(block, stop_reason=reason))
        if whole
        else anthropic_stream(block, stop_reason=reason)
    )
    response = adapter(fake).complete(request())
    assert response.stop_reason is StopReason.LENGTH and response.finish_reason == reason


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="no API key"):
        AnthropicModel("claude-fake", base_url="https://api.anthropic.com")
    with pytest.raises(ConfigurationError, match="ends in /v1/messages"):
        AnthropicModel("m", base_url="https://api.anthropic.com/v1/messages", api_key=KEY)


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/v1/messages"])
def test_a_base_url_with_v1_is_one_clear_line(fake: FakeProvider, suffix: str) -> None:
    from tether._models import load_model

    with pytest.raises(ConfigurationError) as info:
        load_model(
            "anthropic:claude-fake",
            base_url=fake.root_url + suffix,
            environ={"ANTHROPIC_API_KEY": KEY},
        )
    message = str(info.value)
    assert "\n" not in message and KEY not in message
    assert message.endswith(f"use {fake.root_url}")
    assert fake.requests == []  # refused before any request


def test_the_openrouter_key_never_goes_to_anthropic(fake: FakeProvider) -> None:
    """TETHER_API_KEY is the OpenAI-compatible endpoint's key (OpenRouter's by default):
    the Anthropic adapter must not send it anywhere."""
    from tether._models import load_model

    router_key = "sk-or-v1-ROUTER-KEY-0123456789"
    with pytest.raises(ConfigurationError) as info:
        load_model(
            "anthropic:claude-fake",
            base_url=fake.root_url,
            environ={"TETHER_API_KEY": router_key},
        )
    assert "ANTHROPIC_API_KEY" in str(info.value) and router_key not in str(info.value)
    assert fake.requests == []
    fake.enqueue(anthropic_stream({"type": "text", "text": "ok"}))
    model = load_model(
        "anthropic:claude-fake",
        base_url=fake.root_url,
        environ={"TETHER_API_KEY": router_key, "ANTHROPIC_API_KEY": KEY},
    )
    model.complete(request())
    [sent] = fake.requests
    assert router_key not in repr(sent.headers) and KEY in repr(sent.headers)


def test_anthropic_base_url_is_honoured(fake: FakeProvider) -> None:
    from tether._models import load_model

    fake.enqueue(anthropic_stream({"type": "text", "text": "via the variable"}))
    env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.root_url}
    model = load_model("anthropic:claude-fake", environ=env)
    assert model.routing_identity == f"127.0.0.1:{fake.port}/claude-fake"
    assert model.complete(request()).content == "via the variable"
    assert [r.path for r in fake.requests] == ["/v1/messages"]


def test_a_404_shows_the_server_message_and_the_url(fake: FakeProvider) -> None:
    model = AnthropicModel("claude-fake", base_url=fake.root_url + "/gateway", api_key=KEY)
    err = fail(model, request())
    assert err.code == "provider_error" and err.status == 404
    assert "not found" in err.message  # the fake's own words
    assert f"tether posts to {fake.root_url}/gateway/v1/messages" in err.message
    assert [r.path for r in fake.requests] == ["/gateway/v1/messages"]


def test_load_model_dispatch(fake: FakeProvider) -> None:
    from tether._models import load_model

    env = {"ANTHROPIC_API_KEY": KEY}
    model = load_model("anthropic:claude-fake", base_url=fake.root_url, environ=env)
    assert isinstance(model, AnthropicModel) and model.model == "claude-fake"
    assert model.provider == "anthropic"


def test_agent_keeps_thinking_across_the_tool_loop(fake: FakeProvider, tmp_path: Any) -> None:
    """Through the executor: the thinking block goes to the side record, never the log, and
    back to Anthropic at the start of its turn on the next request."""
    from tether._runtime import Agent, RunStatus
    from tether.core import reduce_session

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello\n")
    fake.enqueue(
        anthropic_stream(
            THINKING,
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "README.md"}},
            stop_reason="tool_use",
        ),
        anthropic_stream({"type": "text", "text": "It says hello."}),
    )
    model = adapter(fake)
    result = Agent(model, workspace=workspace, output_options={"max_tokens": 2048}).run("README?")
    assert result.status is RunStatus.COMPLETED and result.text == "It says hello."
    data = result.session_path.read_bytes()
    reduce_session(data)
    assert b"sig-abc==" not in data and b"I should read both" not in data
    messages = fake.requests[1].body["messages"]
    assert messages[1]["role"] == "assistant"
    assert messages[1]["content"][0] == THINKING
    assert messages[1]["content"][1]["type"] == "tool_use"
    assert messages[2]["content"][0]["type"] == "tool_result"


@pytest.mark.parametrize(
    ("model", "effort", "max_tokens", "thinking", "sent_max", "extra"),
    [
        # budget_tokens models: the default max_tokens is raised above the budget ...
        ("claude-sonnet-4-5", "high", None, {"type": "enabled", "budget_tokens": 24576}, 28672, {}),
        ("claude-opus-4-1", "medium", None, {"type": "enabled", "budget_tokens": 8192}, 12288, {}),
        (
            "claude-3-7-sonnet-latest",
            "low",
            None,
            {"type": "enabled", "budget_tokens": 2048},
            8192,
            {},
        ),
        # ... a configured one is the user's limit: the budget is cut to fit under it
        ("claude-haiku-4-5", "high", 10000, {"type": "enabled", "budget_tokens": 5904}, 10000, {}),
        ("claude-sonnet-4-5", "medium", 2048, {"type": "enabled", "budget_tokens": 1024}, 2048, {}),
        # adaptive thinking with an effort for the newer families
        ("claude-opus-4-6", "medium", None, {"type": "adaptive"}, 8192, {"effort": "medium"}),
        ("claude-sonnet-4-6", "minimal", 4096, {"type": "adaptive"}, 4096, {"effort": "low"}),
        ("claude-opus-4-7", "high", None, {"type": "adaptive"}, 8192, {"effort": "high"}),
    ],
)
def test_reasoning_effort_makes_a_valid_request_per_family(
    fake: FakeProvider,
    model: str,
    effort: str,
    max_tokens: int | None,
    thinking: dict[str, Any],
    sent_max: int,
    extra: dict[str, Any],
) -> None:
    from tether._models.options import ModelConfig, output_options_for

    config = ModelConfig(reasoning_effort=effort, max_tokens=max_tokens)
    options = output_options_for(config, api="anthropic", model=model)
    fake.enqueue(anthropic_stream({"type": "text", "text": "ok"}))
    AnthropicModel(model, base_url=fake.root_url, api_key=KEY, timeout=5.0).complete(
        request(output_options=options)
    )
    body = fake.requests[0].body
    assert body["thinking"] == thinking and body["max_tokens"] == sent_max
    assert body.get("output_config", {}) == extra
    if thinking["type"] == "enabled":  # what the API requires of a budget
        assert 1024 <= thinking["budget_tokens"] < body["max_tokens"]


def test_reasoning_effort_that_cannot_be_valid_is_one_clear_line() -> None:
    from tether._models.options import ModelConfig, output_options_for

    with pytest.raises(ConfigurationError, match="no extended thinking"):
        output_options_for(
            ModelConfig(reasoning_effort="high"), api="anthropic", model="claude-3-5-sonnet"
        )
    with pytest.raises(ConfigurationError, match="max_tokens above 1024") as info:
        output_options_for(
            ModelConfig(reasoning_effort="low", max_tokens=1024),
            api="anthropic",
            model="claude-sonnet-4-5",
        )
    assert "\n" not in str(info.value)


def test_a_failed_tool_result_is_sent_with_is_error(fake: FakeProvider, tmp_path: Path) -> None:
    """The log records the result type; the normalized tool message has no member for it,
    so the request carries the failed indices and Anthropic gets ``is_error: true`` — also
    after the session is reopened (the reducer derives them from the log)."""
    from dataclasses import replace

    from tether._runtime import Agent, RunStatus
    from tether._runtime.model_steps import _failed_in_context
    from tether.core import reduce_session

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello\n")
    calls = (
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "README.md"}},
        {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "missing.md"}},
    )
    fake.enqueue(
        anthropic_stream(*calls, stop_reason="tool_use"),
        anthropic_stream({"type": "text", "text": "One of two."}),
        anthropic_stream({"type": "text", "text": "Still one of two."}),
    )
    agent = Agent(adapter(fake), workspace=workspace)
    try:
        result = agent.run("read both")
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED and result.text == "One of two."
    state = reduce_session(result.session_path.read_bytes())
    assert list(state.failed_results) == [3]  # user, assistant, ok result, failed result
    # after a compaction the context is a summary and a suffix of the transcript
    summary = {"role": "system", "content": "summary"}
    kept = replace(state, active_context=(summary, *state.transcript[2:]))
    assert _failed_in_context(kept) == frozenset({2})
    gone = replace(state, active_context=(summary, *state.transcript[4:]))
    assert _failed_in_context(gone) == frozenset()

    def results(body: dict[str, Any]) -> list[dict[str, Any]]:
        turn = body["messages"][2]["content"]
        return [{k: v for k, v in b.items() if k != "cache_control"} for b in turn]

    sent = results(fake.requests[1].body)
    assert sent[0] == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello\n"}
    assert sent[1]["is_error"] is True and sent[1]["content"].startswith("Error")

    again = Agent(adapter(fake), workspace=workspace)  # a new agent reads the log afresh
    try:
        assert again.run("and now?", session=result.session_id).text == "Still one of two."
    finally:
        again.close()
    assert results(fake.requests[2].body)[1]["is_error"] is True
