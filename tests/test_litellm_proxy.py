"""The HTTP adapters against a third-party server: the LiteLLM proxy (PyPI).

The OpenAI-compatible adapter talks to its chat endpoint (``/v1/chat/completions``), the
Anthropic adapter to its Anthropic endpoint (``/v1/messages``, translated to chat
completions by ``use_chat_completions_url_for_anthropic_messages: true``), both to the one
proxy this module starts (its start-up is the slow part).

LiteLLM pins an ``openai``/``httpx`` generation other than tether's, so it lives in its own
virtual environment, ``.venv-litellm`` (``.ci/run`` creates it: ``pip install
'litellm[proxy]==1.106.12'``); ``TETHER_LITELLM`` may name another ``litellm`` executable.
The proxy runs as a real process on loopback, offline (``LITELLM_LOCAL_MODEL_COST_MAP``),
with three kinds of deployment:

* ``mock-text`` — LiteLLM's own ``mock_response`` (streamed by LiteLLM in pieces, with usage
  and cost);
* ``mock-tools`` — ``mock_response`` plus ``mock_tool_calls`` (two calls in one answer, sent
  with ``finish_reason: "stop"``; LiteLLM mocks tool calls only in whole answers);
* ``mock-429`` — ``mock_response: litellm.RateLimitError``;
* ``via-proxy`` — LiteLLM forwarding to tether's loopback fake, so the streamed tool-call
  fragments tether reads are LiteLLM's re-serialization, not the fake's;
* ``via-anthropic`` — LiteLLM forwarding ``/v1/messages`` to the same fake speaking
  Anthropic's protocol (how an overload reaches a client inside a 200 stream).

On ``/v1/messages`` LiteLLM answers the mock deployments with a whole JSON Message whatever
``stream`` says, and it drops ``mock_tool_calls`` there, so tool calls go through
``via-proxy``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fakeprovider import Canned, FakeProvider, anthropic_event, chunk, sse_data, streamed
from tether._models import OpenAICompatibleModel
from tether._models.anthropic_native import AnthropicModel
from tether._models.base import ModelRequest
from tether._models.streaming import Delta
from tether._runtime import Agent, RunStatus
from tether._runtime.retry import is_transient
from tether.core import reduce_session
from tether.core.state import StopReason
from tether.errors import ModelError

ROOT = Path(__file__).resolve().parent.parent
MASTER_KEY = "sk-litellm-test-master-key"


def _litellm() -> str | None:
    chosen = os.environ.get("TETHER_LITELLM") or str(ROOT / ".venv-litellm" / "bin" / "litellm")
    return chosen if Path(chosen).is_file() else shutil.which("litellm")


@dataclass
class Proxy:
    base_url: str
    upstream: FakeProvider

    @property
    def root_url(self) -> str:
        """The proxy root, for the Anthropic SDK (which appends ``/v1/messages``)."""
        return self.base_url.removesuffix("/v1")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    executable = _litellm()
    if executable is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the LiteLLM proxy is not installed (.ci/run creates .venv-litellm)")
        pytest.skip("the LiteLLM proxy is not installed (see .ci/run: .venv-litellm)")
    upstream = FakeProvider()
    folder = tmp_path_factory.mktemp("litellm")
    config = folder / "config.yaml"
    config.write_text(
        f"""
model_list:
  - model_name: mock-text
    litellm_params:
      model: openai/gpt-4o-mini
      api_key: sk-fake-upstream
      mock_response: "Hello from LiteLLM."
  - model_name: mock-tools
    litellm_params:
      model: openai/gpt-4o-mini
      api_key: sk-fake-upstream
      mock_response: "Reading both."
      mock_tool_calls:
        - id: call_a
          type: function
          function: {{name: read, arguments: '{{"path": "README.md"}}'}}
        - id: call_b
          type: function
          function: {{name: read, arguments: '{{"path": "b.md"}}'}}
  - model_name: mock-429
    litellm_params:
      model: openai/gpt-4o-mini
      api_key: sk-fake-upstream
      mock_response: litellm.RateLimitError
  - model_name: via-proxy
    litellm_params:
      model: openai/fake-model
      api_key: sk-fake-upstream
      api_base: {upstream.base_url}
  - model_name: via-anthropic
    litellm_params:
      model: anthropic/claude-fake
      api_key: sk-fake-upstream
      api_base: {upstream.root_url}
litellm_settings:
  num_retries: 0
  request_timeout: 30
  use_chat_completions_url_for_anthropic_messages: true
general_settings:
  master_key: {MASTER_KEY}
"""
    )
    port = _free_port()
    log = (folder / "proxy.log").open("wb")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    process = subprocess.Popen(
        [executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=folder,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"the LiteLLM proxy exited: {(folder / 'proxy.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/health/liveliness", timeout=2
                ):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the LiteLLM proxy did not start within 180 s")
                time.sleep(0.5)
        yield Proxy(f"http://127.0.0.1:{port}/v1", upstream)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        upstream.close()


def adapter(proxy: Proxy, model: str, **kw: object) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(
        model,
        base_url=proxy.base_url,
        api_key=MASTER_KEY,
        timeout=30.0,
        **kw,  # type: ignore[arg-type]
    )


def request(**changes: object) -> ModelRequest:
    base: dict[str, object] = {
        "system_prompt": "Be terse.",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "read", "description": "read", "parameters": {"type": "object"}}],
    }
    base.update(changes)
    return ModelRequest(**base)  # type: ignore[arg-type]


def test_streamed_mock_answer(proxy: Proxy) -> None:
    seen: list[Delta] = []
    response = adapter(proxy, "mock-text").complete(request(), on_delta=seen.append)
    assert response.content == "Hello from LiteLLM."
    assert response.stop_reason is StopReason.STOP
    assert len(seen) > 1 and "".join(d.text for d in seen) == "Hello from LiteLLM."
    assert response.usage.output > 0
    assert response.cost is not None  # LiteLLM reports usage.cost


def test_mock_tool_calls_with_finish_reason_stop(proxy: Proxy) -> None:
    response = adapter(proxy, "mock-tools", stream=False).complete(request())
    assert response.finish_reason == "stop"
    assert response.stop_reason is StopReason.TOOL_USE  # calls decide, not "stop"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "read", '{"path": "README.md"}'),
        ("call_b", "read", '{"path": "b.md"}'),
    ]


def test_rate_limit_is_rate_limited(proxy: Proxy) -> None:
    with pytest.raises(ModelError) as info:
        adapter(proxy, "mock-429").complete(request())
    assert info.value.code == "rate_limited" and info.value.status == 429
    assert MASTER_KEY not in info.value.message


def test_unknown_model_shows_the_server_message(proxy: Proxy) -> None:
    with pytest.raises(ModelError) as info:
        adapter(proxy, "no-such-model").complete(request())
    assert info.value.code == "provider_error"
    assert "'no-such-model'" in info.value.message and "HTTP 400" in info.value.message


def test_agent_through_the_proxy_streams_tool_calls(proxy: Proxy, tmp_path: Path) -> None:
    upstream = proxy.upstream
    calls = [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path": '},
        },
        {
            "index": 1,
            "id": "call_2",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path": "b.md"}'},
        },
    ]
    upstream.enqueue(
        streamed(
            chunk(content="Reading."),
            chunk(tool_calls=calls),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": '"README.md"}'}}]),
            chunk(finish_reason="tool_calls"),
            chunk(no_choices=True, usage={"prompt_tokens": 20, "completion_tokens": 9}),
        ),
        streamed(chunk(content="Both read."), chunk(finish_reason="stop")),
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("a\n")
    (workspace / "b.md").write_text("b\n")
    result = Agent(adapter(proxy, "via-proxy"), workspace=workspace).run("read both")
    assert result.status is RunStatus.COMPLETED, result.message
    assert result.text == "Both read."
    state = reduce_session(result.session_path.read_bytes())
    assistant = state.transcript[1]
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [
        '{"path": "README.md"}',
        '{"path": "b.md"}',
    ]
    tool_results = [m["content"] for m in state.transcript if m["role"] == "tool"]
    assert tool_results == ["a\n", "b\n"]


# -- the Anthropic adapter against LiteLLM's /v1/messages ------------------------------------


def anthropic_adapter(proxy: Proxy, model: str, **kw: Any) -> AnthropicModel:
    return AnthropicModel(model, base_url=proxy.root_url, api_key=MASTER_KEY, timeout=30.0, **kw)


def test_anthropic_whole_json_answer_is_taken(proxy: Proxy) -> None:
    """LiteLLM's mock models answer ``/v1/messages`` with a complete ``application/json``
    Message although ``stream: true`` was asked: that is the answer, first time."""
    seen: list[Delta] = []
    response = anthropic_adapter(proxy, "mock-text").complete(request(), on_delta=seen.append)
    assert response.content == "Hello from LiteLLM."
    assert response.stop_reason is StopReason.STOP and response.finish_reason == "end_turn"
    assert response.usage.output > 0 and seen == []


def test_anthropic_streamed_overload_is_retryable(proxy: Proxy) -> None:
    """An overload inside a 200 stream (how Anthropic usually sends it), passed through by
    LiteLLM, is classed like HTTP 529, so the executor retries it; a chat-completions
    backend failing mid-stream reaches the client as ``api_error``, a retried 500 too."""
    upstream = proxy.upstream
    events = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-fake",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        },
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ]
    upstream.enqueue(Canned(chunks=tuple((0.0, anthropic_event(e)) for e in events)))
    with pytest.raises(ModelError) as info:
        anthropic_adapter(proxy, "via-anthropic").complete(request())
    err = info.value
    assert (err.code, err.status, is_transient(err)) == ("provider_error", 529, True)
    assert "Overloaded" in err.message and MASTER_KEY not in err.message

    broken = {"error": {"message": "Overloaded", "type": "overloaded_error", "code": 529}}
    upstream.enqueue(
        Canned(chunks=((0.0, sse_data(chunk(content="Hal"))), (0.0, sse_data(broken))))
    )
    with pytest.raises(ModelError) as info:
        anthropic_adapter(proxy, "via-proxy").complete(request())
    err = info.value
    assert (err.code, err.status, is_transient(err)) == ("provider_error", 500, True)


def test_anthropic_two_tool_calls_in_one_answer(proxy: Proxy, tmp_path: Path) -> None:
    """Through the agent: two tool_use blocks in one streamed answer (LiteLLM's translation
    of a chat-completions stream), both results back in one user turn, the failed one with
    ``is_error`` (which LiteLLM accepts)."""
    upstream = proxy.upstream
    before = len(upstream.requests)
    first = [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path": '},
        }
    ]
    second = [
        {
            "index": 1,
            "id": "call_2",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path": "missing.md"}'},
        }
    ]
    upstream.enqueue(
        streamed(
            chunk(content="Reading."),
            chunk(tool_calls=first),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": '"README.md"}'}}]),
            chunk(tool_calls=second),
            chunk(finish_reason="tool_calls"),
            chunk(no_choices=True, usage={"prompt_tokens": 20, "completion_tokens": 9}),
        ),
        streamed(chunk(content="One read, one missing."), chunk(finish_reason="stop")),
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("a\n")
    result = Agent(anthropic_adapter(proxy, "via-proxy"), workspace=workspace).run("read both")
    assert result.status is RunStatus.COMPLETED, result.message
    assert result.text == "One read, one missing."
    state = reduce_session(result.session_path.read_bytes())
    assistant = state.transcript[1]
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        ("call_1", '{"path": "README.md"}'),
        ("call_2", '{"path": "missing.md"}'),
    ]
    results = [m for m in state.transcript if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_1", "call_2"]
    assert results[0]["content"] == "a\n" and results[1]["content"].startswith("Error")
    # LiteLLM turned the two tool_result blocks back into two tool messages upstream
    sent = upstream.requests[before + 1].body["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call_1", "call_2"]


def test_anthropic_wrong_base_url_shows_the_server_message(proxy: Proxy) -> None:
    model = AnthropicModel("mock-text", base_url=proxy.root_url + "/gateway", api_key=MASTER_KEY)
    with pytest.raises(ModelError) as info:
        model.complete(request())
    err = info.value
    assert err.code == "provider_error" and err.status == 404
    assert "Not Found" in err.message  # FastAPI's detail, not a bare "HTTP 404"
    assert f"{proxy.root_url}/gateway/v1/messages" in err.message
