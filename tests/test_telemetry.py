"""OpenTelemetry GenAI spans, exported to a real OTLP/HTTP receiver on loopback.

* a session with a tool call, a SIGKILL while its second tool runs, and a resume form one
  trace (its id is the session id's bits) with the expected span names and attributes, the
  spans finished before the kill exported before it, and the recovery decision (the call
  the kill interrupted) as a span event;
* with content capture off no prompt, file or answer text leaves the process (the raw
  bodies the receiver got are searched); with it on the answer does, masked;
* a collector that cannot be reached costs one warning line and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otlpkit import Receiver, Span, start_receiver
from tether._runtime import Agent, RunStatus
from tether._runtime.tracing import RECOVERY_EVENT
from tether._telemetry import TelemetryConfig, open_telemetry, trace_id_for
from tether.testing.scripted import ScriptedModel

PROMPT = "PROMPT-TEXT-789 read the file"
FILE_TEXT = "FILE-SECRET-TEXT-123"
ANSWER = "ANSWER-TEXT-456"
MODEL = "scripted/otel"

SCRIPT = {
    "model": MODEL,
    "responses": [
        {
            "content": "reading",
            "tool_calls": [{"id": "c1", "name": "read", "arguments": {"path": "f.txt"}}],
            "usage": {"input": 11, "output": 3},
        },
        {
            "content": "waiting",
            "tool_calls": [{"id": "c2", "name": "bash", "arguments": {"command": "sleep 30"}}],
            "usage": {"input": 20, "output": 4},
        },
        {"content": ANSWER, "finish_reason": "stop", "usage": {"input": 30, "output": 5}},
    ],
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found, server = start_receiver()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TETHER_")) or k == "TETHER_TEST_PG_URL"
    }
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").write_text(FILE_TEXT + "\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return root, script


def _tether(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "tether", *map(str, args)]


def _by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_a_crashed_and_resumed_session_is_one_trace(tmp_path: Path, receiver: Receiver) -> None:
    root, script = _workspace(tmp_path)
    env = _env(receiver.endpoint)
    child = subprocess.Popen(
        _tether("run", "-m", f"scripted:{script}", "-w", root, PROMPT),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # The spans that finished (two model attempts, the read) are exported while the
        # run goes on: the bash call is still running when they have all arrived.
        arrived = receiver.wait_for(
            lambda spans: (
                len(_by_name(spans, f"chat {MODEL}")) == 2
                and len(_by_name(spans, "execute_tool read")) == 1
            )
        )
        assert arrived, receiver.names()
        assert child.poll() is None
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL
    (log,) = (root / ".tether" / "sessions").glob("*.jsonl")
    session = log.stem.split("_", 1)[1]
    before = len(receiver.spans)

    resumed = subprocess.run(
        _tether("resume", session, "-w", root),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "warning" not in resumed.stderr
    spans = list(receiver.spans)
    after = spans[before:]

    # One trace: every span of both processes, its id the session id's 128 bits.
    trace = f"{trace_id_for(session):032x}"
    assert trace == uuid.UUID(session).hex
    assert {s.trace_id for s in spans} == {trace}
    # The crashed process: its invoke_agent span was still open at the kill (lost), what
    # finished was exported. The resume: one invocation, one more model attempt.
    assert sorted(s.name for s in spans[:before]) == [
        f"chat {MODEL}",
        f"chat {MODEL}",
        "execute_tool read",
    ]
    assert sorted(s.name for s in after) == [f"chat {MODEL}", "invoke_agent"]
    (invocation,) = _by_name(after, "invoke_agent")
    assert invocation.parent_id == ""
    assert invocation.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert invocation.attributes["gen_ai.conversation.id"] == session
    assert all(s.parent_id == invocation.span_id for s in after if s is not invocation)

    chats = _by_name(spans, f"chat {MODEL}")
    assert [c.attributes["gen_ai.usage.input_tokens"] for c in chats] == [11, 20, 30]
    assert [c.attributes["gen_ai.usage.output_tokens"] for c in chats] == [3, 4, 5]
    for chat in chats:
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        assert chat.attributes["gen_ai.request.model"] == MODEL
        assert chat.attributes["gen_ai.response.model"] == MODEL
        assert chat.attributes["gen_ai.conversation.id"] == session
    (read,) = _by_name(spans, "execute_tool read")
    assert read.attributes["gen_ai.tool.name"] == "read"
    assert read.attributes["gen_ai.tool.call.id"] == "c1"
    assert read.status != 2

    # The recovery decision: the bash call the kill interrupted.
    recoveries = [attrs for name, attrs in invocation.events if name == RECOVERY_EVENT]
    assert recoveries == [
        {
            "tether.recovery.decision": "interrupted_call",
            "tether.recovery.plan": "appendSynthetic",
            "gen_ai.tool.name": "bash",
            "gen_ai.tool.call.id": "c2",
        }
    ]

    # Content capture is off: nothing the user, the file or the model wrote left.
    sent = b"".join(receiver.bodies)
    for text in (PROMPT, FILE_TEXT, ANSWER, "sleep 30", "reading", "waiting"):
        assert text.encode() not in sent, text


def test_content_capture_sends_the_answers_masked(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = _workspace(tmp_path)
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    secret = "sk-live-SECRETVALUE0123456789"
    script = {
        "model": MODEL,
        "responses": [{"content": f"{ANSWER} key {secret}", "finish_reason": "stop"}],
    }
    telemetry = open_telemetry(
        TelemetryConfig(endpoint=receiver.endpoint, capture_content=True), environ={}
    )
    assert telemetry is not None and telemetry.capture_content
    agent = Agent(
        ScriptedModel.from_json(script),
        workspace=root,
        read_agents_md=False,
        telemetry=telemetry,
        secrets=[secret],
    )
    try:
        result = agent.run(PROMPT)
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED
    telemetry.flush()
    sent = b"".join(receiver.bodies)
    assert ANSWER.encode() in sent
    assert secret.encode() not in sent
    (chat,) = _by_name(receiver.spans, f"chat {MODEL}")
    messages: Any = json.loads(chat.attributes["gen_ai.output.messages"])
    assert messages[0]["role"] == "assistant"
    assert ANSWER in messages[0]["parts"][0]["content"]


def test_an_unreachable_collector_costs_one_warning_line(tmp_path: Path) -> None:
    root, _ = _workspace(tmp_path)
    done = tmp_path / "done.json"
    done.write_text(
        json.dumps(
            {
                "model": MODEL,
                "responses": [SCRIPT["responses"][0], {"content": "ok", "finish_reason": "stop"}],
            }
        )
    )
    # A port nobody listens on (bound, then closed).
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        _tether("run", "-m", f"scripted:{done}", "-w", root, PROMPT),
        env=_env(f"http://127.0.0.1:{port}"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "telemetry" in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("warning: telemetry: cannot export spans")
    assert "Traceback" not in result.stderr


def test_an_mcp_call_carries_the_trace_context_in_its_meta(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mcp")
    root, _ = _workspace(tmp_path)
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    (root / "tether.toml").write_text(
        "[mcp.servers.notes]\n"
        f"command = {json.dumps(sys.executable)}\n"
        'args = ["-m", "tether.testing.mcp_notes"]\n'
    )
    script = {
        "model": MODEL,
        "responses": [
            {"tool_calls": [{"id": "m1", "name": "notes__append", "arguments": {"line": "x"}}]},
            {"content": "done", "finish_reason": "stop"},
        ],
    }
    telemetry = open_telemetry(TelemetryConfig(endpoint=receiver.endpoint), environ={})
    assert telemetry is not None
    agent = Agent(
        ScriptedModel.from_json(script), workspace=root, read_agents_md=False, telemetry=telemetry
    )
    try:
        result = agent.run(PROMPT)
    finally:
        agent.close()
    assert result.status is RunStatus.COMPLETED, result.message
    telemetry.flush()
    (span,) = _by_name(receiver.spans, "execute_tool notes__append")
    # The server got the W3C traceparent of the tool's span: its spans can join the trace.
    (sent,) = (root / "mcp-traceparents.txt").read_text().split()
    version, trace, parent, flags = sent.split("-")
    assert (version, trace, parent) == ("00", span.trace_id, span.span_id)
    assert int(flags, 16) & 1  # sampled
    assert span.trace_id == uuid.UUID(result.session_id).hex


@pytest.mark.parametrize(
    ("config", "environ", "on"),
    [
        (TelemetryConfig(), {}, False),  # nothing asks: no telemetry at all
        (TelemetryConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
        (TelemetryConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/x"}, True),
        (TelemetryConfig(endpoint="http://127.0.0.1:9"), {}, True),
        (TelemetryConfig(enabled=True), {}, True),
        (
            TelemetryConfig(endpoint="http://127.0.0.1:9"),
            {"OTEL_SDK_DISABLED": "true"},
            False,
        ),
        (TelemetryConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1"}, False),
    ],
)
def test_what_turns_telemetry_on(
    config: TelemetryConfig, environ: dict[str, str], on: bool
) -> None:
    assert (open_telemetry(config, environ=environ) is not None) is on


def test_content_capture_follows_the_conventions_switch() -> None:
    switch = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    captured = open_telemetry(TelemetryConfig(endpoint="http://127.0.0.1:9"), environ=switch)
    plain = open_telemetry(TelemetryConfig(endpoint="http://127.0.0.1:9"), environ={})
    assert captured is not None and captured.capture_content
    assert plain is not None and not plain.capture_content


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[telemetry]\nendpoint = 'localhost:4318'", "[telemetry] endpoint"),
        ("[telemetry]\nenabled = 'yes'", "[telemetry] enabled"),
        ("[telemetry]\nsample = 1", "unknown setting [telemetry] sample"),
    ],
)
def test_a_bad_telemetry_table_is_one_line(table: str, message: str) -> None:
    import tomllib

    from tether._project import project_config_from_mapping
    from tether.errors import ProjectConfigError

    with pytest.raises(ProjectConfigError) as caught:
        project_config_from_mapping(tomllib.loads(table))
    assert message in str(caught.value) and "\n" not in str(caught.value)
