"""Model adapter contract and the OpenAI-compatible adapter, end to end over real HTTP.

Every adapter test talks to :mod:`fakeprovider` — a real HTTP server on 127.0.0.1 — through
the official ``openai`` SDK, and checks that each ``complete`` call made exactly one HTTP
request (no retries), what was sent, and how answers and failures are normalized. Answers
are also fed through the real reducer (via ``sessionkit``) to prove they are writable.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from fakeprovider import (
    REQUEST_ORDERS,
    Canned,
    FakeProvider,
    completion,
    error,
    fresh_watchdog,
    ok,
    raw,
    watchdog_wakes,
)
from sessionkit import SessionKit, expect_ok
from tether._clock import WakingEvent
from tether._models import (
    ModelAdapter,
    ModelRequest,
    ModelResponse,
    OpenAICompatibleModel,
    ScriptedModel,
    TokenUsage,
    ToolCallOut,
    load_model,
    stop_reason_for,
    validate_output_options,
)
from tether._models.base import redact
from tether._models.openai_compat import (
    ADAPTER_IDENTITY,
    DEFAULT_BASE_URL,
    parse_chat_completion,
    usage_from_json,
)
from tether.core.state import StopReason
from tether.errors import ConfigurationError, ModelError, TetherError

KEY = "sk-test-SECRET0123456789abcdef"

READ_TOOL = {
    "name": "read",
    "description": "Read a file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}


def request(**changes: Any) -> ModelRequest:
    base: dict[str, Any] = {
        "system_prompt": "You are terse.",
        "messages": [{"role": "user", "content": "What is in README.md?"}],
        "tools": [READ_TOOL],
        "output_options": {"temperature": 0},
        "position": 0,
    }
    base.update(changes)
    return ModelRequest(**base)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


_ORDER = ["first request"]
"""Which request :func:`adapter` hands out adapters ready to send (REQUEST_ORDERS)."""


@pytest.fixture(params=REQUEST_ORDERS)
def request_order(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run a test with the adapter's first request, a later one, and a first one after
    another adapter's: the first goes through the SDK's ``post``, the others as the SDK
    sent a first one (``OpenAICompatibleModel._send_as_before``; the last without an SDK
    client of the adapter's own), and all must behave alike."""
    _ORDER[0] = request.param
    try:
        yield
    finally:
        _ORDER[0] = "first request"


def adapter(fake: FakeProvider, *, timeout: float = 5.0, **kw: Any) -> OpenAICompatibleModel:
    """The adapter in its non-streamed mode (streaming: tests/test_models_streaming.py)."""
    kw.setdefault("stream", False)
    return fake.in_order(  # type: ignore[no-any-return]
        lambda: OpenAICompatibleModel(
            "fake/model", base_url=fake.base_url, api_key=KEY, timeout=timeout, **kw
        ),
        _ORDER[0],
    )


def fail(model: ModelAdapter, req: ModelRequest, **kw: Any) -> ModelError:
    with pytest.raises(ModelError) as info:
        model.complete(req, **kw)
    err = info.value
    assert "\n" not in err.message
    assert KEY not in err.message and "SECRET" not in err.message
    assert err.to_json() == {"code": err.code, "message": err.message}
    return err


def record_answer(response: ModelResponse) -> None:
    """Write the answer (and its usage) as the executor would; the reducer must accept it."""
    kit = SessionKit(tools=("read", "write"))
    kit.start_run()
    kit.step_attempt()
    kit.assistant(
        response.content,
        [call.to_json() for call in response.tool_calls],
        stop_reason=response.stop_reason.value,
    )
    usage = response.usage
    kit.usage(
        input=usage.input,
        output=usage.output,
        cache_read=usage.cache_read,
        cache_write=usage.cache_write,
    )
    state = expect_ok(kit)
    assert state.transcript[-1] == response.to_message()


def record_failure(err: ModelError) -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.step_failed(err.to_json())
    kit.finish("failed", error={"code": "model_error", "message": "provider request failed"})
    expect_ok(kit)


# ---------------------------------------------------------------------------- base types


class TestBase:
    def test_stop_reason_mapping(self) -> None:
        assert stop_reason_for("stop", False) is StopReason.STOP
        assert stop_reason_for("stop", True) is StopReason.TOOL_USE
        assert stop_reason_for("tool_calls", True) is StopReason.TOOL_USE
        assert stop_reason_for("tool_calls", False) is StopReason.STOP
        assert stop_reason_for("function_call", True) is StopReason.TOOL_USE
        assert stop_reason_for("length", True) is StopReason.LENGTH
        assert stop_reason_for("length", False) is StopReason.LENGTH
        assert stop_reason_for("content_filter", False) is StopReason.STOP
        assert stop_reason_for("content_filter", True) is StopReason.TOOL_USE
        assert stop_reason_for(None, False) is StopReason.STOP
        assert stop_reason_for("weird", True) is StopReason.TOOL_USE

    def test_response_invariants_and_message(self) -> None:
        call = ToolCallOut("c1", "read", '{"path":"a"}')
        with pytest.raises(ValueError):
            ModelResponse("x", (call,), StopReason.STOP)
        with pytest.raises(ValueError):
            ModelResponse("x", (), StopReason.TOOL_USE)
        with pytest.raises(ValueError):
            ModelResponse(None, (call, call), StopReason.TOOL_USE)
        assert ModelResponse(None).to_message() == {"role": "assistant", "content": None}
        assert ModelResponse(None, (call,), StopReason.LENGTH).to_message() == {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a"}'},
                }
            ],
        }

    def test_usage_validation(self) -> None:
        assert TokenUsage(1, 2, 3, 4).to_json() == {
            "input": 1,
            "output": 2,
            "cacheRead": 3,
            "cacheWrite": 4,
        }
        with pytest.raises(ValueError):
            TokenUsage(-1)
        with pytest.raises(TypeError):
            TokenUsage(True)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            TokenUsage(2**53)

    def test_request_validation(self) -> None:
        with pytest.raises(ValueError):
            request(position=-1)
        with pytest.raises(ValueError):
            request(purpose="other")

    def test_model_error_is_one_line(self) -> None:
        err = ModelError("timeout", "line one\n  line two\t")
        assert err.message == "line one line two"
        assert str(err) == "line one line two"
        assert isinstance(err, TetherError)
        with pytest.raises(ValueError):
            ModelError("nope", "x")

    def test_redact(self) -> None:
        text = f"key {KEY} and Bearer abc.def and sk-or-v1-0123456789abcdef"
        out = redact(text, (KEY,))
        assert KEY not in out and "abc.def" not in out and "0123456789abcdef" not in out
        assert "***" in out

    def test_output_options(self) -> None:
        validate_output_options({"temperature": 0.2, "max_tokens": 100, "provider": {"a": [1]}})
        for bad in ({"model": "x"}, {"stream": True}, {"messages": []}, {"n": 2}):
            with pytest.raises(ConfigurationError):
                validate_output_options(bad)
        with pytest.raises(ConfigurationError):
            validate_output_options({"temperature": float("nan")})
        with pytest.raises(ConfigurationError):
            validate_output_options({"x": object()})

    def test_adapters_satisfy_protocol(self, fake: FakeProvider) -> None:
        assert isinstance(adapter(fake), ModelAdapter)
        script = ScriptedModel.from_json({"responses": [{"content": "hi"}]})
        assert isinstance(script, ModelAdapter)


# ---------------------------------------------------------------------------- usage mapping


class TestUsage:
    def test_openai_cached_tokens(self) -> None:
        usage = usage_from_json(
            {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "total_tokens": 107,
                "prompt_tokens_details": {"cached_tokens": 60},
            }
        )
        assert usage == TokenUsage(input=40, output=7, cache_read=60, cache_write=0)

    def test_openrouter_cache_write(self) -> None:
        usage = usage_from_json(
            {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 50},
            }
        )
        assert usage == TokenUsage(input=20, output=7, cache_read=30, cache_write=50)

    def test_anthropic_style_top_level(self) -> None:
        usage = usage_from_json(
            {
                "prompt_tokens": 120,
                "completion_tokens": 3,
                "cache_read_input_tokens": 70,
                "cache_creation_input_tokens": 40,
            }
        )
        assert usage == TokenUsage(input=10, output=3, cache_read=70, cache_write=40)

    def test_exclusive_prompt_tokens_used_as_is(self) -> None:
        usage = usage_from_json(
            {
                "prompt_tokens": 10,
                "completion_tokens": 3,
                "cache_read_input_tokens": 500,
                "cache_creation_input_tokens": 40,
            }
        )
        assert usage == TokenUsage(input=10, output=3, cache_read=500, cache_write=40)

    def test_deepseek_and_missing(self) -> None:
        usage = usage_from_json(
            {
                "prompt_tokens": 50,
                "completion_tokens": 5,
                "prompt_cache_hit_tokens": 20,
                "prompt_cache_miss_tokens": 30,
            }
        )
        assert usage == TokenUsage(input=30, output=5, cache_read=20)
        assert usage_from_json(None) == TokenUsage()
        assert usage_from_json({"prompt_tokens_details": None}) == TokenUsage()
        assert usage_from_json({"prompt_tokens": 4.0}) == TokenUsage(input=4)

    @pytest.mark.parametrize(
        "usage",
        [
            {"prompt_tokens": -1},
            {"prompt_tokens": "12"},
            {"completion_tokens": 1.5},
            {"prompt_tokens": True},
            {"prompt_tokens": 2**53},
            "nope",
        ],
    )
    def test_malformed_usage(self, usage: Any) -> None:
        with pytest.raises(ModelError) as info:
            usage_from_json(usage)
        assert info.value.code == "bad_response"


# ---------------------------------------------------------------------------- over HTTP


@pytest.mark.usefixtures("request_order")
class TestOpenAICompatible:
    def test_text_answer_and_request_shape(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    "It says hello.",
                    usage={
                        "prompt_tokens": 100,
                        "completion_tokens": 12,
                        "total_tokens": 112,
                        "prompt_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 6},
                    },
                )
            )
        )
        model = adapter(fake)
        response = model.complete(request())
        assert response.content == "It says hello."
        assert response.tool_calls == ()
        assert response.stop_reason is StopReason.STOP
        assert response.finish_reason == "stop"
        assert response.usage == TokenUsage(input=30, output=12, cache_read=64, cache_write=6)

        [sent] = fake.requests
        assert sent.path == "/v1/chat/completions"
        assert sent.headers["authorization"] == f"Bearer {KEY}"
        assert sent.headers.get("x-stainless-retry-count", "0") == "0"
        body = sent.body
        assert body["model"] == "fake/model"
        assert body["messages"] == [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is in README.md?"},
        ]
        assert body["tools"] == [{"type": "function", "function": READ_TOOL}]
        assert body["temperature"] == 0
        assert "stream" not in body and "n" not in body
        record_answer(response)

    def test_identity(self, fake: FakeProvider) -> None:
        model = adapter(fake)
        assert model.adapter_identity == ADAPTER_IDENTITY
        assert model.routing_identity == f"127.0.0.1:{fake.port}/v1/fake/model"
        assert model.provider == "127.0.0.1"
        assert model.model == "fake/model"
        assert KEY not in repr(model)
        assert adapter(fake, provider="vllm").provider == "vllm"

    def test_no_tools_no_system_and_history(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("ok")))
        history = [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path":"a"}'},
                    }
                ],
            },
            {"role": "tool", "content": "file text", "tool_call_id": "c1"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "again"},
        ]
        adapter(fake).complete(
            request(system_prompt="", messages=history, tools=[], output_options={})
        )
        body = fake.requests[0].body
        assert "tools" not in body
        assert "temperature" not in body
        assert body["messages"][:3] == history[:3]
        assert body["messages"][3] == {"role": "assistant", "content": ""}
        assert body["messages"][4] == history[4]

    def test_output_options_are_sent(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("ok")))
        options = {"max_tokens": 64, "top_p": 0.5, "provider": {"order": ["a", "b"]}}
        adapter(fake).complete(request(output_options=options))
        body = fake.requests[0].body
        for name, value in options.items():
            assert body[name] == value

    def test_reserved_output_option_rejected_before_request(self, fake: FakeProvider) -> None:
        with pytest.raises(ConfigurationError):
            adapter(fake).complete(request(output_options={"stream": True}))
        assert fake.requests == []

    def test_one_tool_call(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[
                        {"id": "call_a", "name": "read", "arguments": {"path": "README.md"}}
                    ],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert response.stop_reason is StopReason.TOOL_USE
        assert response.tool_calls == (ToolCallOut("call_a", "read", '{"path": "README.md"}'),)
        assert response.to_message() == {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "README.md"}'},
                }
            ],
        }
        assert len(fake.requests) == 1
        record_answer(response)

    def test_several_tool_calls(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    "Reading both.",
                    tool_calls=[
                        {"id": "c1", "name": "read", "arguments": '{"path":"a"}'},
                        {"id": "c2", "name": "read", "arguments": '{"path":"b"}'},
                        {"id": "c3", "name": "write", "arguments": '{"path":"c","content":"x"}'},
                    ],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert [c.id for c in response.tool_calls] == ["c1", "c2", "c3"]
        assert [c.name for c in response.tool_calls] == ["read", "read", "write"]
        assert response.content == "Reading both."
        assert response.stop_reason is StopReason.TOOL_USE
        record_answer(response)

    def test_stop_with_calls_is_tool_use(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    finish_reason="stop",
                    tool_calls=[{"id": "c1", "name": "read", "arguments": "{}"}],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert response.stop_reason is StopReason.TOOL_USE
        assert response.finish_reason == "stop"
        record_answer(response)

    def test_length_with_truncated_call(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    finish_reason="length",
                    tool_calls=[
                        {
                            "id": "c1",
                            "name": "write",
                            "arguments": '{"path":"a","content":"lorem ip',
                        }
                    ],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert response.stop_reason is StopReason.LENGTH
        assert response.tool_calls[0].arguments == '{"path":"a","content":"lorem ip'
        record_answer(response)

    def test_length_without_calls(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("The answer is cut sho", finish_reason="length")))
        response = adapter(fake).complete(request())
        assert response.stop_reason is StopReason.LENGTH
        assert response.content == "The answer is cut sho"
        record_answer(response)

    def test_rate_limited_no_retry(self, fake: FakeProvider) -> None:
        fake.enqueue(
            error(
                429,
                "Rate limit reached for requests",
                type_="rate_limit_exceeded",
                headers={"Retry-After": "7", "x-should-retry": "true"},
            ),
            ok(completion("must never be fetched")),
        )
        err = fail(adapter(fake), request())
        assert err.code == "rate_limited"
        assert err.status == 429
        assert err.retry_after == 7
        assert "Rate limit reached for requests" in err.message
        assert "HTTP 429" in err.message
        assert len(fake.requests) == 1
        record_failure(err)

    def test_openrouter_upstream_message(self, fake: FakeProvider) -> None:
        fake.enqueue(
            error(
                429,
                "Provider returned error",
                code=429,
                metadata={"raw": "anthropic overloaded", "provider_name": "Anthropic"},
            )
        )
        err = fail(adapter(fake), request())
        assert "Provider returned error" in err.message
        assert "Anthropic: anthropic overloaded" in err.message

    def test_server_error_no_retry(self, fake: FakeProvider) -> None:
        fake.enqueue(
            error(
                500,
                "The server had an error while processing your request",
                headers={"x-should-retry": "true"},
            ),
            ok(completion("must never be fetched")),
        )
        err = fail(adapter(fake), request())
        assert err.code == "provider_error"
        assert err.status == 500
        assert "HTTP 500" in err.message
        assert "The server had an error" in err.message
        assert len(fake.requests) == 1
        record_failure(err)

    def test_non_json_error_body(self, fake: FakeProvider) -> None:
        fake.enqueue(raw(502, b"<html>Bad Gateway</html>", "text/html"))
        err = fail(adapter(fake), request())
        assert err.code == "provider_error"
        assert "HTTP 502" in err.message and "Bad Gateway" in err.message

    def test_bad_request_message(self, fake: FakeProvider) -> None:
        fake.enqueue(error(400, "model 'fake/model' does not support tools"))
        err = fail(adapter(fake), request())
        assert err.code == "provider_error"
        assert "does not support tools" in err.message

    def test_authentication_error_redacts_key(self, fake: FakeProvider) -> None:
        fake.enqueue(error(401, f"Incorrect API key provided: {KEY}. Bearer {KEY}"))
        err = fail(adapter(fake), request())
        assert err.code == "authentication"
        assert "TETHER_API_KEY" in err.message
        assert "Incorrect API key provided" in err.message
        assert "***" in err.message
        assert len(fake.requests) == 1

    def test_timeout_no_retry(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("too late"), delay=3.0), ok(completion("never")))
        started = time.monotonic()
        err = fail(adapter(fake, timeout=0.5), request())
        elapsed = time.monotonic() - started
        assert err.code == "timeout"
        assert "0.5 s" in err.message
        assert elapsed < 2.0
        assert len(fake.requests) == 1
        record_failure(err)

    def test_slow_but_within_timeout(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("slow answer"), delay=0.3))
        response = adapter(fake, timeout=3.0).complete(request())
        assert response.content == "slow answer"

    @pytest.mark.parametrize("kind", [threading.Event, WakingEvent])
    def test_cancel_during_request(self, fake: FakeProvider, kind: type[threading.Event]) -> None:
        fake.enqueue(ok(completion("too late"), delay=5.0))
        cancel = kind()
        cancelled: list[float] = []

        def cancel_once_sent() -> None:
            # Once the server has the request (the first request of a process imports the
            # SDK first, which can take longer than any fixed delay on a busy machine).
            deadline = time.monotonic() + 5.0
            while not fake.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            cancelled.append(time.monotonic())
            cancel.set()

        # The adapter first: an earlier request it or a sibling sends (REQUEST_ORDERS) is
        # recorded, then forgotten, and must not be taken for this one.
        model = adapter(fake, timeout=10.0)
        threading.Thread(target=cancel_once_sent, daemon=True).start()
        err = fail(model, request(), cancel=cancel)
        assert err.code == "aborted"
        assert err.message == "Operation aborted"
        assert time.monotonic() - cancelled[0] < 1.0  # the answer would take 5 s
        assert len(fake.requests) == 1

    def test_a_waking_cancel_is_not_polled(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # As for a streamed answer (tests/test_models_streaming.py): the executor's
        # WakingEvent wakes the watchdog; a plain Event is polled.
        fresh_watchdog(monkeypatch)
        for kind, most in ((WakingEvent, 3), (threading.Event, None)):
            model = adapter(fake)
            fake.enqueue(ok(completion("whole"), delay=0.6))
            before = watchdog_wakes()
            assert model.complete(request(), cancel=kind()).content == "whole"
            wakes = watchdog_wakes() - before
            if most is None:
                assert wakes >= 15, wakes
            else:
                assert wakes <= most, wakes

    def test_cancel_before_request_sends_nothing(self, fake: FakeProvider) -> None:
        cancel = threading.Event()
        cancel.set()
        err = fail(adapter(fake), request(), cancel=cancel)
        assert err.code == "aborted"
        assert fake.requests == []

    def test_cancel_not_set_is_harmless(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("fine"), delay=0.1))
        assert adapter(fake).complete(request(), cancel=threading.Event()).content == "fine"

    def test_malformed_json_body(self, fake: FakeProvider) -> None:
        fake.enqueue(raw(200, b'{"choices": [ {"message": '))
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"
        assert "not JSON" in err.message
        assert len(fake.requests) == 1
        record_failure(err)

    def test_empty_body(self, fake: FakeProvider) -> None:
        fake.enqueue(raw(200, b""))
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"

    def test_empty_choices(self, fake: FakeProvider) -> None:
        body = completion("x")
        body["choices"] = []
        fake.enqueue(ok(body))
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"
        assert "no choices" in err.message

    def test_error_object_in_200_body(self, fake: FakeProvider) -> None:
        fake.enqueue(ok({"error": {"message": "upstream exploded", "code": 502}}))
        err = fail(adapter(fake), request())
        assert err.code == "provider_error"
        assert "upstream exploded" in err.message

    def test_bad_json_arguments_and_unknown_tool_are_kept(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[
                        {"id": "c1", "name": "read", "arguments": "{not json"},
                        {"id": "c2", "name": "launch_missiles", "arguments": "{}"},
                    ],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert response.tool_calls[0].arguments == "{not json"
        assert response.tool_calls[1].name == "launch_missiles"
        assert response.stop_reason is StopReason.TOOL_USE

    def test_empty_answer_is_kept(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion(None, usage={})))
        response = adapter(fake).complete(request())
        assert response.content is None
        assert response.tool_calls == ()
        assert response.stop_reason is StopReason.STOP
        assert response.usage == TokenUsage()
        record_answer(response)

    def test_missing_usage(self, fake: FakeProvider) -> None:
        body = completion("x")
        del body["usage"]
        fake.enqueue(ok(body))
        assert adapter(fake).complete(request()).usage == TokenUsage()

    def test_missing_call_id_is_deterministic(self, fake: FakeProvider) -> None:
        call = {"type": "function", "function": {"name": "read", "arguments": "{}"}}
        fake.enqueue(ok(completion(None, tool_calls=[call, dict(call)])))
        response = adapter(fake).complete(request(position=4))
        assert [c.id for c in response.tool_calls] == ["call_4_0", "call_4_1"]

    def test_duplicate_call_ids(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[
                        {"id": "c1", "name": "read", "arguments": "{}"},
                        {"id": "c1", "name": "read", "arguments": "{}"},
                    ],
                )
            )
        )
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"
        assert "repeats tool call id" in err.message

    def test_call_without_name(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],
                )
            )
        )
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"
        assert "no function name" in err.message

    def test_object_arguments_are_serialized(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "read", "arguments": {"path": "ü"}},
                        }
                    ],
                )
            )
        )
        response = adapter(fake).complete(request())
        assert response.tool_calls[0].arguments == '{"path":"ü"}'

    def test_content_parts_and_refusal(self, fake: FakeProvider) -> None:
        fake.enqueue(
            ok(completion([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),  # type: ignore[arg-type]
            ok(completion(None, extra_message={"refusal": "I can't help with that."})),
        )
        model = adapter(fake)
        assert model.complete(request()).content == "ab"
        assert model.complete(request()).content == "I can't help with that."
        assert len(fake.requests) == 2

    def test_unpaired_surrogate_rejected(self, fake: FakeProvider) -> None:
        fake.enqueue(
            raw(200, b'{"choices":[{"message":{"content":"bad \\ud800"},"finish_reason":"stop"}]}')
        )
        err = fail(adapter(fake), request())
        assert err.code == "bad_response"
        assert "surrogate" in err.message

    def test_legacy_function_call(self) -> None:
        body = (
            b'{"choices":[{"message":{"content":null,"function_call":'
            b'{"name":"read","arguments":"{}"}},"finish_reason":"function_call"}]}'
        )
        response = parse_chat_completion(body, position=2)
        assert response.tool_calls == (ToolCallOut("call_2_0", "read", "{}"),)
        assert response.stop_reason is StopReason.TOOL_USE

    def test_unreachable_endpoint(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        model = OpenAICompatibleModel(
            "m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, timeout=2.0
        )
        started = time.monotonic()
        err = fail(model, request())
        assert err.code == "connection"
        assert f"http://127.0.0.1:{port}/v1" in err.message
        assert "cannot reach" in err.message
        assert time.monotonic() - started < 2.0

    def test_base_url_with_user_info_is_refused_without_showing_it(self) -> None:
        # User info would be sent as HTTP Basic auth, whose echo no masking recognises.
        for url in ("http://user:hunter2@127.0.0.1:9/v1", "https://hunter2@api.openai.com/v1"):
            with pytest.raises(ConfigurationError) as info:
                OpenAICompatibleModel("m", base_url=url, api_key=KEY, timeout=2.0)
            assert "user info" in str(info.value) and "hunter2" not in str(info.value)
        with pytest.raises(ConfigurationError) as info:
            OpenAICompatibleModel.from_env(
                "m", environ={"TETHER_BASE_URL": "http://u:hunter2@127.0.0.1/v1"}
            )
        assert str(info.value).startswith("TETHER_BASE_URL must not contain user info")
        assert "hunter2" not in str(info.value)

    def test_base_url_query_never_shown(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        model = OpenAICompatibleModel(
            "m", base_url=f"http://127.0.0.1:{port}/v1?token=hunter2", api_key=KEY, timeout=2.0
        )
        assert "hunter2" not in model.routing_identity
        assert "hunter2" not in model.base_url
        err = fail(model, request())
        assert "hunter2" not in err.message


# ---------------------------------------------------------------------------- configuration


def count_posts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests sent through the SDK's ``post`` from now on."""
    import openai

    posts: list[str] = []
    real_post = openai.OpenAI.post

    def counted(client: Any, path: str, *args: Any, **kw: Any) -> Any:
        posts.append(path)
        return real_post(client, path, *args, **kw)

    monkeypatch.setattr(openai.OpenAI, "post", counted)
    return posts


class TestSentAsBefore:
    """A session's later requests skip the SDK's ``post`` and are sent as it sent the first."""

    def test_later_requests_carry_the_first_ones_headers(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        posts = count_posts(monkeypatch)
        model = adapter(fake, extra_headers={"X-Title": "tether tests"})
        for text in ("one", "two", "three"):
            fake.enqueue(ok(completion(text)))
            assert model.complete(request()).content == text
        assert posts == ["/chat/completions"]  # the first only
        first, *later = fake.requests
        assert first.headers["authorization"] == f"Bearer {KEY}"  # recorded in lower case
        assert first.headers["x-title"] == "tether tests"
        assert first.headers["user-agent"].startswith("OpenAI/Python")
        assert len(later) == 2
        for sent in later:
            assert (sent.path, sent.body, sent.headers) == (first.path, first.body, first.headers)

    def test_a_client_whose_key_can_change_keeps_the_sdks_path(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A client with a key provider (or a provider runtime, or a workload identity) may
        # send other headers next time: its every request goes through the SDK.
        posts = count_posts(monkeypatch)
        model = adapter(fake)
        keys = iter(("sk-rotated-1", "sk-rotated-2"))
        model._client._api_key_provider = lambda: next(keys)  # type: ignore[attr-defined]
        for text in ("one", "two"):
            fake.enqueue(ok(completion(text)))
            assert model.complete(request()).content == text
        assert len(posts) == 2
        assert [r.headers["authorization"] for r in fake.requests] == [
            "Bearer sk-rotated-1",
            "Bearer sk-rotated-2",
        ]

    def test_a_later_request_redirected_is_followed(self, fake: FakeProvider) -> None:
        # Later requests go to the client's transport, which does not follow redirects;
        # the client does (the SDK asks it to): a redirect is handed back to it.
        model = adapter(fake)
        fake.enqueue(ok(completion("first")))
        assert model.complete(request()).content == "first"
        fake.enqueue(
            Canned(307, b"", {"Location": "/v1/chat/completions", "Content-Length": "0"}),
            ok(completion("second")),
        )
        assert model.complete(request()).content == "second"
        assert len(fake.requests) == 3
        assert fake.requests[2].body == fake.requests[1].body

    def test_a_client_with_event_hooks_sends_through_the_client(self, fake: FakeProvider) -> None:
        # A hook sees every request the client sends: the transport is not used directly.
        model = adapter(fake)
        seen: list[str] = []
        model._client._client.event_hooks["request"].append(lambda r: seen.append(r.url.path))
        for text in ("one", "two"):
            fake.enqueue(ok(completion(text)))
            assert model.complete(request()).content == text
        assert seen == ["/v1/chat/completions"] * 2

    def test_a_later_request_that_cannot_connect(self, fake: FakeProvider) -> None:
        model = adapter(fake, timeout=2.0)
        first = ok(completion("first"))
        fake.enqueue(replace(first, headers={**first.headers, "Connection": "close"}))
        assert model.complete(request()).content == "first"
        fake.close()  # the server goes away between two requests (and its connection)
        started = time.monotonic()
        err = fail(model, request())
        assert err.code == "connection"
        assert "cannot reach" in err.message and fake.base_url in err.message
        assert time.monotonic() - started < 2.0

    def test_adapters_with_the_same_settings_share_the_first_ones_head_not_its_connections(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A worker builds an adapter per session in flight: only the process's first request
        # of these settings goes through the SDK's post; each adapter keeps its connections.
        posts = count_posts(monkeypatch)
        first, second = adapter(fake), adapter(fake)
        fake.enqueue(ok(completion("one")), ok(completion("two")))
        assert first.complete(request()).content == "one"
        assert second.complete(request()).content == "two"
        assert posts == ["/chat/completions"]
        sent_first, sent_second = fake.requests
        assert (sent_second.path, sent_second.headers) == (sent_first.path, sent_first.headers)
        assert first.open_connections == second.open_connections == 1  # one each
        # Nor does the second build an SDK client of its own (a worker's every session
        # did): one is made only when an answer needs it, an error here.
        assert second._sdk_client is None
        fake.enqueue(error(400, "no such model"))
        assert fail(second, request()).code == "provider_error"
        assert second._sdk_client is not None and posts == ["/chat/completions"]

    def test_a_first_request_shows_the_others_how_before_its_answer_comes(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A worker's sessions make their first requests together, to a model that may take
        # seconds: the second adapter must not wait for the first answer to skip post.
        posts = count_posts(monkeypatch)
        first, second = adapter(fake), adapter(fake)
        fake.enqueue(ok(completion("slow"), delay=1.5), ok(completion("fast")))
        answers: list[str] = []
        waiting = threading.Thread(target=lambda: answers.append(first.complete(request()).content))
        waiting.start()
        try:
            deadline = time.monotonic() + 5
            while not fake.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            assert second.complete(request()).content == "fast"
            assert answers == []  # the first is still waiting for its answer
        finally:
            waiting.join()
        assert answers == ["slow"]
        assert posts == ["/chat/completions"]
        sent_first, sent_second = fake.requests
        assert (sent_second.path, sent_second.headers) == (sent_first.path, sent_first.headers)

    def test_other_headers_or_another_organization_go_through_post_again(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        posts = count_posts(monkeypatch)
        fake.enqueue(*(ok(completion(t)) for t in ("one", "two", "three")))
        assert adapter(fake).complete(request()).content == "one"
        titled = adapter(fake, extra_headers={"X-Title": "other"})
        assert titled.complete(request()).content == "two"
        monkeypatch.setenv("OPENAI_ORG_ID", "org-elsewhere")  # the SDK reads it at construction
        assert adapter(fake).complete(request()).content == "three"
        assert len(posts) == 3
        assert fake.requests[1].headers["x-title"] == "other"
        assert fake.requests[2].headers["openai-organization"] == "org-elsewhere"
        assert "openai-organization" not in fake.requests[0].headers


class TestConfiguration:
    def test_missing_api_key(self) -> None:
        with pytest.raises(ConfigurationError) as info:
            OpenAICompatibleModel.from_env("openai/gpt-4o-mini", environ={})
        message = str(info.value)
        assert "TETHER_API_KEY" in message
        assert "openrouter.ai" in message
        assert "\n" not in message

    def test_blank_key_counts_as_missing(self) -> None:
        with pytest.raises(ConfigurationError):
            OpenAICompatibleModel.from_env(
                "m",
                environ={"TETHER_API_KEY": "  ", "TETHER_BASE_URL": "https://api.openai.com/v1"},
            )

    def test_local_server_needs_no_key(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("local")))
        model = OpenAICompatibleModel.from_env("llama", environ={"TETHER_BASE_URL": fake.base_url})
        assert model.complete(request()).content == "local"
        assert fake.requests[0].headers["authorization"].startswith("Bearer ")
        for url in (
            "http://localhost:11434/v1",
            "http://[::1]:8080/v1",
            "http://192.168.1.20:8000/v1",
            "http://ollama.localhost/v1",
        ):
            OpenAICompatibleModel("m", base_url=url)

    def test_defaults_and_precedence(self) -> None:
        env = {"TETHER_API_KEY": KEY, "TETHER_MODEL": "env/model"}
        model = OpenAICompatibleModel.from_env(environ=env)
        assert model.model == "env/model"
        assert model.base_url == DEFAULT_BASE_URL
        assert model.provider == "openrouter"
        assert model.routing_identity == "openrouter.ai/api/v1/env/model"
        assert model.timeout == 60.0
        env["TETHER_BASE_URL"] = "https://api.openai.com/v1/"
        model = OpenAICompatibleModel.from_env(environ=env)
        assert model.provider == "openai"
        assert model.routing_identity == "api.openai.com/v1/env/model"
        model = OpenAICompatibleModel.from_env(
            "flag/model",
            base_url="http://127.0.0.1:9/v1",
            api_key="other-key",
            timeout=3,
            environ=env,
        )
        assert model.model == "flag/model"
        assert model.base_url == "http://127.0.0.1:9/v1"
        assert model.timeout == 3.0
        assert KEY not in model.routing_identity

    def test_never_falls_back_to_openai_key(self) -> None:
        with pytest.raises(ConfigurationError):
            OpenAICompatibleModel.from_env("m", environ={"OPENAI_API_KEY": "sk-openai-xxxxxxxx"})

    def test_missing_model(self) -> None:
        with pytest.raises(ConfigurationError) as info:
            OpenAICompatibleModel.from_env(environ={"TETHER_API_KEY": KEY})
        assert "TETHER_MODEL" in str(info.value)
        with pytest.raises(ConfigurationError) as info:
            load_model(None, environ={"TETHER_API_KEY": KEY})
        assert "TETHER_MODEL" in str(info.value)

    @pytest.mark.parametrize(
        "url", ["ftp://example.com/v1", "openrouter.ai/api/v1", "http://", "http://h:99999/v1"]
    )
    def test_bad_base_url(self, url: str) -> None:
        with pytest.raises(ConfigurationError) as info:
            OpenAICompatibleModel.from_env(
                "m", environ={"TETHER_BASE_URL": url, "TETHER_API_KEY": KEY}
            )
        assert "TETHER_BASE_URL" in str(info.value)

    @pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
    def test_bad_timeout(self, timeout: float) -> None:
        with pytest.raises(ConfigurationError):
            OpenAICompatibleModel("m", base_url="http://127.0.0.1:9/v1", timeout=timeout)

    def test_load_model_dispatch(self, tmp_path: Any) -> None:
        script = tmp_path / "s.json"
        script.write_text('{"model": "scripted/x", "responses": [{"content": "hi"}]}')
        model = load_model(f"scripted:{script}", api_key="ignored")
        assert isinstance(model, ScriptedModel)
        assert model.model == "scripted/x"
        model = load_model(None, environ={"TETHER_MODEL": f"scripted:{script}"})
        assert isinstance(model, ScriptedModel)
        model = load_model("some/model", environ={"TETHER_API_KEY": KEY})
        assert isinstance(model, OpenAICompatibleModel)
        assert model.model == "some/model"
        with pytest.raises(ConfigurationError):
            load_model("scripted:")
        with pytest.raises(ConfigurationError) as info:
            load_model(f"scripted:{tmp_path / 'missing.json'}")
        assert "missing.json" in str(info.value)
