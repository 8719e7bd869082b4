"""``[model]`` in tether.toml and ``--model-option``: validation, what is sent, the digest.

The CLI tests run ``tether`` as a real subprocess against the loopback SSE server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakeprovider import FakeProvider, chunk, streamed
from tether._models.options import (
    ModelConfig,
    identity_suffix,
    merge,
    model_config_from_mapping,
    output_options_for,
    parse_model_options,
)
from tether._project import parse_project_config
from tether.errors import ConfigurationError, ProjectConfigError

ROOT = Path(__file__).resolve().parent.parent


class TestConfig:
    def test_full_table(self) -> None:
        config = parse_project_config(
            """
[model]
model = "openai/gpt-4o-mini"
base_url = "https://openrouter.ai/api/v1"
api_key_env = "MY_ROUTER_KEY"
temperature = 0.2
max_tokens = 2048
reasoning_effort = "high"
provider = {order = ["anthropic", "openai"], allow_fallbacks = false}
tool_choice = "required"
parallel_tool_calls = false
extra_headers = {"HTTP-Referer" = "https://example.com", "X-Title" = "tether"}
timeout = 30
idle_timeout = 120
retries = 3
stream = true
"""
        ).model
        assert config.model == "openai/gpt-4o-mini" and config.retries == 3
        assert output_options_for(config, api="chat-completions", base_host="openrouter.ai") == {
            "temperature": 0.2,
            "max_tokens": 2048,
            "reasoning": {"effort": "high"},
            "provider": {"order": ["anthropic", "openai"], "allow_fallbacks": False},
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
        assert output_options_for(config, api="chat-completions")["reasoning_effort"] == "high"
        assert output_options_for(config, api="anthropic") == {
            "temperature": 0.2,
            "max_tokens": 2048,
            # budget_tokens must stay below max_tokens: cut to fit the configured 2048
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        }
        suffix = identity_suffix(config)
        assert suffix.startswith("#key=MY_ROUTER_KEY;headers=http-referer,x-title:")
        assert "example.com" not in suffix

    def test_defaults(self) -> None:
        config = parse_project_config("").model
        assert config == ModelConfig()
        assert output_options_for(config, api="chat-completions") == {}
        assert identity_suffix(config) == ""

    @pytest.mark.parametrize(
        ("toml", "message"),
        [
            ("temperature = 3", "[model] temperature: must be between 0 and 2"),
            ("reasoning_effort = 'extreme'", "[model] reasoning_effort: expected one of"),
            ("provider = 'anthropic'", "[model] provider: expected a table"),
            ("tool_choice = 'sometimes'", "[model] tool_choice: expected"),
            ("parallel_tool_calls = 'no'", "[model] parallel_tool_calls: expected true or false"),
            ("retries = -1", "[model] retries: expected an integer from 0 to 10"),
            ("api_key_env = 'not a name'", "[model] api_key_env: expected an environment"),
            ("extra_headers = {'bad header' = 'x'}", "[model] extra_headers: expected a table"),
            ("colour = 'blue'", "colour"),
        ],
    )
    def test_bad_values_are_one_line(self, toml: str, message: str) -> None:
        with pytest.raises(ProjectConfigError) as info:
            parse_project_config(f"[model]\n{toml}\n")
        assert message in str(info.value) and "\n" not in str(info.value)

    def test_cli_options(self) -> None:
        table = parse_model_options(
            ["temperature=0.5", "reasoning_effort=low", 'provider={order=["a"]}', "stream=false"]
        )
        assert table == {
            "temperature": 0.5,
            "reasoning_effort": "low",
            "provider": {"order": ["a"]},
            "stream": False,
        }
        merged = merge(model_config_from_mapping({"temperature": 0.1, "max_tokens": 5}), table, "x")
        assert (merged.temperature, merged.max_tokens, merged.stream) == (0.5, 5, False)
        with pytest.raises(ConfigurationError, match="unknown setting"):
            parse_model_options(["temprature=1"])
        with pytest.raises(ConfigurationError, match="expected KEY=VALUE"):
            parse_model_options(["temperature"])


# --------------------------------------------------------------------------- the CLI


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def tether(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


def answer(text: str = "Done.") -> Any:
    return streamed(chunk(content=text), chunk(finish_reason="stop"))


def write_config(workspace: Path, fake: FakeProvider) -> None:
    (workspace / "tether.toml").write_text(
        f"""
[model]
model = "fake/model"
base_url = "{fake.base_url}"
api_key_env = "MY_FAKE_KEY"
temperature = 0.3
max_tokens = 512
reasoning_effort = "medium"
provider = {{order = ["x"]}}
parallel_tool_calls = false
extra_headers = {{"X-Title" = "tether-test"}}
"""
    )


def test_options_reach_the_request_and_the_digest(fake: FakeProvider, tmp_path: Path) -> None:
    write_config(tmp_path, fake)
    env = cli_env(MY_FAKE_KEY="sk-fake-options-0123456789")
    fake.enqueue(answer())
    result = tether(
        "run", "hi", "--json", "--model-option", "temperature=0.6", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"event": "model_delta", "channel": "text", "text": "Done."} in events
    [sent] = fake.requests
    assert sent.headers["authorization"] == "Bearer sk-fake-options-0123456789"
    assert sent.headers["x-title"] == "tether-test"
    body = sent.body
    assert (body["temperature"], body["max_tokens"]) == (0.6, 512)
    assert body["reasoning_effort"] == "medium"
    assert body["provider"] == {"order": ["x"]} and body["parallel_tool_calls"] is False
    log = next((tmp_path / ".tether" / "sessions").glob("*.jsonl")).read_text()
    assert "sk-fake-options" not in log
    assert "#key=MY_FAKE_KEY;headers=x-title:" in log  # in the snapshot's routing identity


def test_changed_option_meets_the_configuration_gate(fake: FakeProvider, tmp_path: Path) -> None:
    write_config(tmp_path, fake)
    env = cli_env(MY_FAKE_KEY="sk-fake-options-0123456789")
    crashed = tether("run", "hi", cwd=tmp_path, env={**env, "TETHER_CRASH_AT": "attempt_recorded"})
    assert crashed.returncode != 0
    session = str(next((tmp_path / ".tether" / "sessions").glob("*.jsonl")))
    blocked = tether("resume", session, "--model-option", "temperature=0.9", cwd=tmp_path, env=env)
    assert blocked.returncode == 65, blocked.stderr
    assert "configuration" in blocked.stderr
    assert fake.requests == []
    fake.enqueue(answer("Resumed."))
    resumed = tether("resume", session, cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "Resumed.\n"


def test_unset_key_variable_is_one_line(fake: FakeProvider, tmp_path: Path) -> None:
    write_config(tmp_path, fake)
    result = tether("run", "hi", cwd=tmp_path, env=cli_env())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: [model] api_key_env names MY_FAKE_KEY, which is not set"
    )


def test_ctrl_c_mid_stream_closes_the_connection(fake: FakeProvider, tmp_path: Path) -> None:
    import signal

    write_config(tmp_path, fake)
    env = cli_env(MY_FAKE_KEY="sk-fake-options-0123456789")
    fake.enqueue(streamed(chunk(content="Thinking out lo"), chunk(content="ud."), pauses={1: 60}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "run", "hi", "--json"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line).get("event") == "model_delta":
            break
    proc.send_signal(signal.SIGINT)
    assert fake.disconnected.wait(5), "Ctrl+C left the provider generating"
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "aborted"


def test_anthropic_from_the_cli_effort_key_and_base_url(fake: FakeProvider, tmp_path: Path) -> None:
    """End to end for anthropic: ANTHROPIC_BASE_URL is honoured, the key is
    ANTHROPIC_API_KEY's and never TETHER_API_KEY's, reasoning_effort takes the model
    family's form, and a /v1 base URL is one line before any request."""
    from fakeprovider import anthropic_stream

    router_key, anthropic_key = "sk-or-v1-ROUTER-0123456789", "sk-ant-CLI-0123456789"
    env = {k: v for k, v in cli_env().items() if not k.startswith("ANTHROPIC_")}
    env.update(
        TETHER_API_KEY=router_key,
        ANTHROPIC_API_KEY=anthropic_key,
        ANTHROPIC_BASE_URL=fake.root_url,
    )
    fake.enqueue(anthropic_stream({"type": "text", "text": "Thought about it."}))
    model = ("--model", "anthropic:claude-opus-4-6")
    effort = ("--model-option", "reasoning_effort=high")
    result = tether("run", "hi", *model, *effort, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Thought about it.\n"
    [sent] = fake.requests
    assert sent.path == "/v1/messages"
    assert anthropic_key in repr(sent.headers) and router_key not in repr(sent.headers)
    assert sent.body["thinking"] == {"type": "adaptive"}
    assert sent.body["output_config"] == {"effort": "high"}

    bad = tether("run", "hi", *model, "--base-url", fake.root_url + "/v1", cwd=tmp_path, env=env)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: the Anthropic base URL ends in /v1, which the SDK appends itself "
        f"(it posts to BASE/v1/messages): use {fake.root_url}"
    )
    assert len(fake.requests) == 1
