"""Streaming chat completions against a real SSE server on loopback (tests/fakeprovider.py).

The fake sends chunked ``text/event-stream`` bodies with real pauses, can hang up mid-answer,
and notices when the client closes its connection, so the tests below observe what a real
provider would: one request per call, the deltas in order, the whole answer only when it is
complete, timeouts between chunks, and a closed connection on cancel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fakeprovider import (
    REQUEST_ORDERS,
    FakeProvider,
    chunk,
    completion,
    error,
    fresh_watchdog,
    ok,
    streamed,
    watchdog_wakes,
)
from tether._clock import WakingEvent
from tether._models import streaming
from tether._models.base import ModelRequest, Reasoning, TokenUsage
from tether._models.openai_compat import OpenAICompatibleModel
from tether._models.streaming import Delta, SSEDecoder
from tether.core.state import StopReason
from tether.errors import ConfigurationError, ModelError

KEY = "sk-test-SECRET-0123456789"


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
    another adapter's (see tests/test_models.py's fixture of the same name)."""
    _ORDER[0] = request.param
    try:
        yield
    finally:
        _ORDER[0] = "first request"


def adapter(fake: FakeProvider, **kw: Any) -> OpenAICompatibleModel:
    kw.setdefault("timeout", 5.0)
    kw.setdefault("api_key", KEY)
    return fake.in_order(  # type: ignore[no-any-return]
        lambda: OpenAICompatibleModel("fake/model", base_url=fake.base_url, **kw), _ORDER[0]
    )


def request(**changes: Any) -> ModelRequest:
    base: dict[str, Any] = {
        "system_prompt": "Be terse.",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "read", "description": "read", "parameters": {"type": "object"}}],
    }
    base.update(changes)
    return ModelRequest(**base)


def fail(model: OpenAICompatibleModel, req: ModelRequest, **kw: Any) -> ModelError:
    with pytest.raises(ModelError) as info:
        model.complete(req, **kw)
    assert "\n" not in info.value.message and KEY not in info.value.message
    return info.value


USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 20,
    "prompt_tokens_details": {"cached_tokens": 30},
    "completion_tokens_details": {"reasoning_tokens": 12},
    "cost": 0.00042,
}


class TestSSEDecoder:
    def test_events(self) -> None:
        decoder = SSEDecoder()
        lines = [": keep-alive", "event: ping", "data: a", "data: b", "", "", "data:c"]
        out = [decoder.line(line) for line in lines]
        assert out == [None, None, None, None, ("ping", "a\nb"), None, None]
        assert decoder.end() == ("message", "c")


@pytest.mark.usefixtures("request_order")
class TestStreaming:
    def test_text_streams_live_and_whole_answer_returned(self, fake: FakeProvider) -> None:
        fake.enqueue(
            streamed(
                chunk(content="Hel"),
                chunk(content="lo, "),
                chunk(content="world."),
                chunk(finish_reason="stop"),
                chunk(no_choices=True, usage=USAGE),
                pause=0.05,
            )
        )
        seen: list[tuple[Delta, float]] = []
        started = time.monotonic()
        response = adapter(fake).complete(
            request(), on_delta=lambda d: seen.append((d, time.monotonic() - started))
        )
        assert response.content == "Hello, world."
        assert response.stop_reason is StopReason.STOP
        assert response.usage == TokenUsage(input=10, output=20, cache_read=30)
        assert response.reasoning_tokens == 12 and response.cost == pytest.approx(0.00042)
        assert [d.text for d, _ in seen] == ["Hel", "lo, ", "world."]
        # Live: the first delta arrived before the last piece was even sent.
        assert seen[0][1] < seen[-1][1] - 0.05
        [sent] = fake.requests
        assert sent.body["stream"] is True
        assert sent.body["stream_options"] == {"include_usage": True}

    def test_parallel_tool_calls_in_fragments(self, fake: FakeProvider) -> None:
        def call(index: int, **fields: Any) -> dict[str, Any]:
            return {"index": index, **fields}

        fake.enqueue(
            streamed(
                chunk(content="Reading both."),
                chunk(
                    tool_calls=[
                        call(0, id="c1", type="function", function={"name": "read"}),
                        call(1, id="c2", type="function", function={"name": "read"}),
                    ]
                ),
                chunk(tool_calls=[call(0, function={"arguments": '{"path":'})]),
                chunk(tool_calls=[call(1, function={"arguments": '{"path":"b"}'})]),
                chunk(tool_calls=[call(0, function={"arguments": '"a"}'})]),
                chunk(finish_reason="stop"),  # "stop" with calls: still toolUse
            )
        )
        response = adapter(fake).complete(request())
        assert response.stop_reason is StopReason.TOOL_USE
        assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
            ("c1", "read", '{"path":"a"}'),
            ("c2", "read", '{"path":"b"}'),
        ]
        assert response.content == "Reading both."

    @pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
    def test_reasoning_chunks(self, fake: FakeProvider, field: str) -> None:
        detail = {"type": "reasoning.text", "index": 0, "format": "anthropic-claude-v1"}
        fake.enqueue(
            streamed(
                chunk(
                    reasoning="Think ",
                    reasoning_field=field,
                    reasoning_details=[{**detail, "text": "Think "}],
                ),
                chunk(
                    reasoning="hard.",
                    reasoning_field=field,
                    reasoning_details=[{**detail, "text": "hard.", "signature": "sig"}],
                ),
                chunk(content="Done."),
                chunk(finish_reason="stop", usage=USAGE),
            )
        )
        seen: list[Delta] = []
        response = adapter(fake).complete(request(), on_delta=seen.append)
        assert [(d.channel, d.text) for d in seen] == [
            ("reasoning", "Think "),
            ("reasoning", "hard."),
            ("text", "Done."),
        ]
        assert response.reasoning == Reasoning(
            text="Think hard.",
            details=({**detail, "text": "Think hard.", "signature": "sig"},),
            format="openrouter",
        )
        assert response.content == "Done."

    def test_stream_cut_mid_answer_is_an_error(self, fake: FakeProvider) -> None:
        fake.enqueue(streamed(chunk(content="Half an ans"), done=False, hang_up=True))
        err = fail(adapter(fake), request())
        assert err.code == "connection"
        assert "ended before it was complete" in err.message or "broke off" in err.message
        assert len(fake.requests) == 1

    def test_idle_stream_times_out_and_closes_connection(self, fake: FakeProvider) -> None:
        fake.enqueue(streamed(chunk(content="a"), chunk(content="b"), pauses={1: 10.0}))
        model = adapter(fake, timeout=5.0, idle_timeout=0.4)
        started = time.monotonic()
        err = fail(model, request())
        assert err.code == "timeout" and "idle timeout" in err.message
        assert "0.4 s" in err.message
        assert time.monotonic() - started < 3.0
        assert fake.disconnected.wait(3.0), "the server never saw the connection close"

    def test_slow_steady_stream_outlives_the_idle_timeout(self, fake: FakeProvider) -> None:
        pieces = [chunk(content=str(i)) for i in range(8)]
        fake.enqueue(streamed(*pieces, chunk(finish_reason="stop"), pause=0.15))
        model = adapter(fake, timeout=0.6, idle_timeout=0.6)
        started = time.monotonic()
        response = model.complete(request())
        assert time.monotonic() - started > 0.9  # longer than either timeout as a whole
        assert response.content == "01234567"

    def test_first_byte_timeout(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("late"), delay=10.0))
        started = time.monotonic()
        err = fail(adapter(fake, timeout=0.4), request())
        assert err.code == "timeout" and "first-byte timeout" in err.message
        assert time.monotonic() - started < 3.0
        assert fake.disconnected.wait(3.0)

    @pytest.mark.parametrize("kind", [threading.Event, WakingEvent])
    def test_cancel_mid_stream_closes_the_connection(
        self, fake: FakeProvider, kind: type[threading.Event]
    ) -> None:
        fake.enqueue(streamed(chunk(content="a"), chunk(content="b"), pauses={1: 10.0}))
        cancel = kind()
        model = adapter(fake)

        def on_delta(delta: Delta) -> None:
            threading.Timer(0.1, cancel.set).start()

        started = time.monotonic()
        err = fail(model, request(), cancel=cancel, on_delta=on_delta)
        assert err.code == "aborted" and err.message == "Operation aborted"
        assert time.monotonic() - started < 2.0
        assert fake.disconnected.wait(2.0), "the provider would keep generating"

    @pytest.mark.parametrize("kind", [threading.Event, WakingEvent])
    def test_cancel_before_the_first_byte_closes_the_connection(
        self, fake: FakeProvider, kind: type[threading.Event]
    ) -> None:
        fake.enqueue(ok(completion("late"), delay=10.0))
        cancel = kind()
        model = adapter(fake)  # first: its earlier request (REQUEST_ORDERS) is not timed
        threading.Timer(0.3, cancel.set).start()
        err = fail(model, request(), cancel=cancel)
        assert err.code == "aborted"
        assert fake.disconnected.wait(2.0)

    def test_a_waking_cancel_is_not_polled(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A plain event is polled every 20 ms while the answer is awaited; the executor's
        # WakingEvent wakes the watchdog itself, so a worker's thousand waiting sessions
        # cost nothing (issue 33). Counted: the wakes of a watchdog of the test's own during
        # a 0.6 s answer.
        fresh_watchdog(monkeypatch)
        for kind, most in ((WakingEvent, 3), (threading.Event, None)):
            model = adapter(fake)
            fake.enqueue(streamed(chunk(content="a"), chunk(finish_reason="stop"), pauses={0: 0.6}))
            before = watchdog_wakes()
            assert model.complete(request(), cancel=kind()).content == "a"
            wakes = watchdog_wakes() - before
            if most is None:
                assert wakes >= 15, wakes  # the polled kind: the count is what it costs
            else:
                assert wakes <= most, wakes

    def test_a_call_runs_on_its_caller_s_thread_and_wakes_nobody_per_chunk(
        self, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The request is read on the calling thread (no thread per request, no switch per
        # answer) and its deltas reach the listener there; the watchdog is not woken by the
        # stream's chunks, listened to or not: a worker waiting on hundreds of
        # token-by-token streams does no work per token beyond reading it (issue 33).
        pieces = [chunk(content=str(i % 10)) for i in range(120)]
        text = "".join(str(i % 10) for i in range(120))
        fresh_watchdog(monkeypatch)
        for listening in (False, True):
            model = adapter(fake)
            seen: list[tuple[Delta, int]] = []

            def listen(delta: Delta, seen: list[tuple[Delta, int]] = seen) -> None:
                seen.append((delta, threading.get_ident()))

            fake.enqueue(streamed(*pieces, chunk(finish_reason="stop"), pause=0.002))
            before = watchdog_wakes()
            answer = model.complete(
                request(), cancel=WakingEvent(), on_delta=listen if listening else None
            )
            assert answer.content == text
            assert watchdog_wakes() - before <= 3
            if listening:
                assert "".join(d.text for d, _ in seen) == text
                assert {thread for _, thread in seen} == {threading.get_ident()}

    def test_rate_limit_before_the_stream(self, fake: FakeProvider) -> None:
        fake.enqueue(error(429, "slow down", headers={"Retry-After": "3"}))
        err = fail(adapter(fake), request())
        assert err.code == "rate_limited" and err.retry_after == 3.0
        assert len(fake.requests) == 1

    def test_server_that_ignores_stream(self, fake: FakeProvider) -> None:
        fake.enqueue(ok(completion("whole")))
        seen: list[Delta] = []
        assert adapter(fake).complete(request(), on_delta=seen.append).content == "whole"

    def test_error_in_the_stream(self, fake: FakeProvider) -> None:
        bad = {"error": {"message": "upstream overloaded", "code": 502}, "choices": []}
        fake.enqueue(streamed(chunk(content="par"), bad))
        err = fail(adapter(fake), request())
        assert err.code == "provider_error" and "upstream overloaded" in err.message

    def test_chunk_that_is_not_json(self, fake: FakeProvider) -> None:
        fake.enqueue(streamed(b"data: {nope\n\n"))
        err = fail(adapter(fake), request())
        assert err.code == "bad_response" and "not JSON" in err.message


@pytest.mark.usefixtures("request_order")
class TestClearErrors:
    def test_base_url_with_chat_completions(self) -> None:
        with pytest.raises(ConfigurationError) as info:
            OpenAICompatibleModel(
                "m", base_url="https://api.example.com/v1/chat/completions", api_key=KEY
            )
        assert str(info.value) == (
            "the model base URL ends in /chat/completions, which tether appends itself: "
            "use https://api.example.com/v1"
        )

    def test_no_key_sent_says_so(self, fake: FakeProvider) -> None:
        fake.enqueue(error(401, "Unauthorized: key required"))
        model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, timeout=5.0)
        err = fail(model, request())
        assert err.code == "authentication"
        assert "no key was sent" in err.message and "TETHER_API_KEY" in err.message
        assert "Unauthorized: key required" in err.message

    def test_unknown_model_shows_the_server_message(self, fake: FakeProvider) -> None:
        fake.enqueue(error(404, "The model `nope` does not exist"))
        err = fail(adapter(fake), request())
        assert err.code == "provider_error"
        assert "'fake/model'" in err.message and "The model `nope` does not exist" in err.message


def test_gzip_compressed_stream_is_decoded(fake: FakeProvider) -> None:
    """Proxies (Cloudflare in front of a provider) may gzip an event stream."""
    import zlib

    from fakeprovider import Canned, sse_data

    packer = zlib.compressobj(wbits=31)
    pieces = []
    for event in (chunk(content="Zip"), chunk(content="ped."), chunk(finish_reason="stop")):
        pieces.append((0.05, packer.compress(sse_data(event)) + packer.flush(zlib.Z_SYNC_FLUSH)))
    pieces.append((0.0, packer.compress(sse_data("[DONE]")) + packer.flush()))
    fake.enqueue(Canned(chunks=tuple(pieces), headers={"Content-Encoding": "gzip"}))
    seen: list[Delta] = []
    response = adapter(fake).complete(request(), on_delta=seen.append)
    assert response.content == "Zipped." and [d.text for d in seen] == ["Zip", "ped."]


def test_cancel_without_streaming_closes_the_connection(fake: FakeProvider) -> None:
    fake.enqueue(ok(completion("late"), delay=10.0))
    cancel = threading.Event()
    model = adapter(fake, stream=False)  # first: its earlier request is not timed
    threading.Timer(0.3, cancel.set).start()
    err = fail(model, request(), cancel=cancel)
    assert err.code == "aborted"
    assert fake.disconnected.wait(2.0)


def test_one_tls_context_per_process_even_when_first_requests_race(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Loading the CA bundle costs ~20 ms; a worker's sessions make their first requests at
    # the same moment, and each used to build a context of its own.
    built: list[object] = []
    real = streaming.httpx2.create_ssl_context

    def slow_build(**kwargs: Any) -> Any:
        time.sleep(0.05)
        built.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(streaming.httpx2, "create_ssl_context", slow_build)
    streaming._build_ssl_context.cache_clear()
    try:
        contexts: list[object] = []
        threads = [
            threading.Thread(
                target=lambda: contexts.append(streaming._default_ssl_context("/x.pem", None))
            )
            for _ in range(16)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(built) == 1 and len(contexts) == 16
        assert all(c is contexts[0] for c in contexts)
    finally:
        streaming._build_ssl_context.cache_clear()


def test_the_watchdog_forgets_ended_calls() -> None:
    # A process making hundreds of requests a second: the watchdog's heap holds the live
    # calls and a bounded number of ended ones, never one entry per request made.
    tracker = streaming.ConnectionTracker()
    dog = streaming._the_watchdog()
    for n in range(2_000):
        assert (
            streaming.run_stream(
                lambda emit, n=n: n,
                cancel=WakingEvent(),
                tracker=tracker,
                first_byte_timeout=60.0,
                idle_timeout=30.0,
                on_delta=None,
                where="loopback",
            )
            == n
        )
    assert len(dog._heap) <= 2 * streaming._STALE + 8, len(dog._heap)


def test_a_call_that_timed_out_leaves_the_next_one_alone(fake: FakeProvider) -> None:
    # The watchdog shuts a call's connection down only while that call is running: a
    # deadline it acts on late (its slack) never reaches the adapter's next request.
    model = adapter(fake, timeout=0.3, idle_timeout=0.3)
    fake.enqueue(ok(completion("late"), delay=5.0))
    assert fail(model, request()).code == "timeout"
    for text in ("one", "two", "three"):
        fake.enqueue(streamed(chunk(content=text), chunk(finish_reason="stop"), pause=0.1))
        assert model.complete(request()).content == text
