"""The agent end to end: the real executor, store, planner and tools, with

* the OpenAI-compatible adapter against :mod:`fakeprovider`, a real chat-completions
  server on loopback (tool calls, several calls in one answer, ``length`` truncation,
  HTTP 429 and 500, slow answers and timeouts, malformed output, empty answers), and
* the scripted model (compaction, abort from another thread, environment identity,
  tool declarations).

After every run the log is checked: it reduces with :func:`reduce_session`, the session
is idle, the provider transcript is legal with every call answered exactly once, and a
read-only :class:`SessionStore` sees the same state.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fakeprovider import FakeProvider, completion, error, ok
from tether._models import ModelRequest, ModelResponse, OpenAICompatibleModel, ScriptedModel
from tether._models.base import ModelAdapter
from tether._runtime import Agent, RunResult, RunStatus
from tether._runtime.events import Event
from tether._stores.file import SessionStore
from tether._tools import builtin
from tether._tools.base import ToolContext, ToolResult
from tether._tools.decorator import tool
from tether.core import reduce_session
from tether.core.state import IdleOperation, Replay, SessionState
from tether.errors import ConfigurationError

README_TEXT = "hello from the README\n"
SYNTHETIC = {
    "invalidArguments": "Error: Tool arguments were invalid; the tool was not executed.",
    "unknownTool": "Error: Unknown tool; the tool was not executed.",
    "truncated": (
        "Error: Tool call arguments were truncated by the model token limit; "
        "the tool was not executed."
    ),
    "aborted": "Operation aborted before execution.",
    "interrupted": (
        "Operation interrupted after execution status became unknown; the tool was not replayed."
    ),
}
MODEL_ERROR = {"code": "model_error", "message": "provider request failed"}
ABORTED_ERROR = {"code": "aborted", "message": "Operation aborted"}


# --------------------------------------------------------------------------- fixtures


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
    (ws / "README.md").write_text(README_TEXT)
    return ws


def remote(fake: FakeProvider, timeout: float = 5.0) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(
        "fake/model", base_url=fake.base_url, api_key="test", timeout=timeout
    )


def scripted(*responses: Mapping[str, Any]) -> ScriptedModel:
    return ScriptedModel.from_json({"model": "scripted/e2e", "responses": list(responses)})


class Recording:
    """A model adapter that records every request and delegates to another adapter."""

    def __init__(self, inner: ModelAdapter) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self.provider = inner.provider
        self.model = inner.model
        self.adapter_identity = inner.adapter_identity
        self.routing_identity = inner.routing_identity

    def complete(
        self, request: ModelRequest, *, cancel: threading.Event | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        return self.inner.complete(request, cancel=cancel)


# --------------------------------------------------------------------------- log checks


def facts(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in data.split(b"\n")[1:-1]:
        value = json.loads(line)
        out.extend(value if isinstance(value, list) else [value])
    return out


def records(data: bytes, kind: str) -> list[dict[str, Any]]:
    return [
        f["record"] for f in facts(data) if f["kind"] == "record" and f["record"]["type"] == kind
    ]


def tool_entries(data: bytes) -> list[dict[str, Any]]:
    return [
        f["entry"]
        for f in facts(data)
        if f["kind"] == "entry"
        and f["entry"]["type"] == "message"
        and f["entry"]["message"]["role"] == "tool"
    ]


def assert_legal(state: SessionState) -> None:
    """Spec 6.3 plus: at rest, every tool call of the transcript is answered exactly once."""
    open_calls: set[str] = set()
    answered: Counter[str] = Counter()
    calls: list[str] = []
    for message in state.transcript:
        if message["role"] == "assistant":
            assert not open_calls
            ids = [c["id"] for c in message.get("tool_calls", ())]
            open_calls = set(ids)
            calls.extend(ids)
        elif message["role"] == "tool":
            assert message["tool_call_id"] in open_calls
            open_calls.discard(message["tool_call_id"])
            answered[message["tool_call_id"]] += 1
        else:
            assert not open_calls
    assert not open_calls
    assert all(answered[c] == 1 for c in calls)


def check_log(result: RunResult, workspace: Path) -> tuple[bytes, SessionState]:
    """The log of ``result``: valid, idle, legal; the read-only view agrees."""
    data = result.session_path.read_bytes()
    assert data.endswith(b"\n")
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    assert_legal(state)
    view = SessionStore.open_read_only(result.session_id, workspace=workspace)
    assert view.read_only and view.torn_tail == 0
    assert view.state.to_json() == state.to_json()
    assert state.usage == result.session_usage
    return data, state


def wire_messages(fake: FakeProvider, index: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = fake.requests[index].body["messages"]
    return messages


# --------------------------------------------------------------------------- HTTP provider


class TestChatCompletionsProvider:
    def test_read_tool_then_answer(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(
            ok(
                completion(
                    "Let me read it.",
                    tool_calls=[
                        {"id": "call_1", "name": "read", "arguments": {"path": "README.md"}}
                    ],
                    usage={"prompt_tokens": 100, "completion_tokens": 10},
                )
            ),
            ok(completion("It says hello.", usage={"prompt_tokens": 150, "completion_tokens": 4})),
        )
        result = Agent(remote(fake), workspace=workspace).run("What is in README.md?")
        assert result.status is RunStatus.COMPLETED
        assert result.completion == "normal"
        assert result.text == "It says hello."
        assert result.usage.input == 250 and result.usage.output == 14
        assert len(fake.requests) == 2

        first = fake.requests[0].body
        assert first["model"] == "fake/model"
        assert first["messages"][0]["role"] == "system"
        assert first["messages"][1:] == [{"role": "user", "content": "What is in README.md?"}]
        assert [t["function"]["name"] for t in first["tools"]] == ["read", "bash", "write", "edit"]
        second = wire_messages(fake, 1)
        assert second[2]["role"] == "assistant"
        assert second[2]["tool_calls"][0]["id"] == "call_1"
        assert second[3] == {"role": "tool", "content": README_TEXT, "tool_call_id": "call_1"}

        data, state = check_log(result, workspace)
        (started,) = records(data, "toolStarted")
        assert started["toolName"] == "read" and started["arguments"] == {"path": "README.md"}
        assert (started["replay"], started["replayKey"]) == ("safe", "builtin:read:v1")
        assert started["environmentIdentity"] == os.path.realpath(workspace)
        (entry,) = tool_entries(data)
        assert entry["result"] == {"type": "success"}
        assert [r["outcome"] for r in records(data, "operationFinished")] == ["completed"]
        assert state.header.provider == "127.0.0.1"
        assert state.header.model == "fake/model"

    def test_several_calls_in_one_answer_run_in_order(
        self, fake: FakeProvider, workspace: Path
    ) -> None:
        (workspace / "b.txt").write_text("bee\n")
        calls = [
            {"id": "c_read", "name": "read", "arguments": {"path": "README.md"}},
            {"id": "c_bash", "name": "bash", "arguments": {"command": "cat b.txt > copy.txt"}},
            {"id": "c_write", "name": "write", "arguments": {"path": "w.txt", "content": "w\n"}},
            {"id": "c_read2", "name": "read", "arguments": {"path": "copy.txt"}},
        ]
        fake.enqueue(ok(completion(None, tool_calls=calls)), ok(completion("All done.")))
        result = Agent(remote(fake), workspace=workspace).run("do four things")
        assert result.status is RunStatus.COMPLETED
        assert len(fake.requests) == 2
        assert (workspace / "w.txt").read_text() == "w\n"
        data, _ = check_log(result, workspace)
        started = records(data, "toolStarted")
        assert [s["toolIndex"] for s in started] == [0, 1, 2, 3]
        assert [s["toolCallId"] for s in started] == [c["id"] for c in calls]
        entries = tool_entries(data)
        assert [e["message"]["tool_call_id"] for e in entries] == [c["id"] for c in calls]
        assert all(e["result"] == {"type": "success"} for e in entries)
        assert entries[3]["message"]["content"] == "bee\n"  # ran after the bash call
        tool_msgs = [m for m in wire_messages(fake, 1) if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_msgs] == [c["id"] for c in calls]
        # Each step's attempt names the boundary: the last tool result before step 2.
        attempts = records(data, "stepAttempt")
        last_result_id = [f["id"] for f in facts(data) if f["kind"] == "entry"][-2]
        assert attempts[1]["contextThroughEntryId"] == last_result_id

    def test_length_with_truncated_call(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[
                        {"id": "c1", "name": "bash", "arguments": {"command": "touch ran1"}},
                        {
                            "id": "c2",
                            "name": "write",
                            "arguments": '{"path":"a.txt","content":"lor',
                        },
                    ],
                    finish_reason="length",
                )
            ),
            ok(completion("must never be fetched")),
        )
        result = Agent(remote(fake), workspace=workspace).run("write a long file")
        assert result.status is RunStatus.COMPLETED
        assert result.completion == "truncated"
        assert len(fake.requests) == 1
        assert not (workspace / "a.txt").exists() and not (workspace / "ran1").exists()
        data, _ = check_log(result, workspace)
        assert records(data, "toolStarted") == []
        entries = tool_entries(data)
        assert [e["result"] for e in entries] == [{"type": "synthetic", "reason": "truncated"}] * 2
        assert [e["toolIndex"] for e in entries] == [0, 1]
        assert all(e["message"]["content"] == SYNTHETIC["truncated"] for e in entries)
        (finish,) = records(data, "operationFinished")
        assert finish["outcome"] == "completed" and finish["completion"] == "truncated"
        assistant = next(f for f in facts(data) if f.get("entry", {}).get("stopReason"))
        assert assistant["entry"]["stopReason"] == "length"
        assert finish["finalEntryId"] == assistant["id"]

    def test_length_without_calls_fails(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(ok(completion("The answer is cut sho", finish_reason="length")))
        result = Agent(remote(fake), workspace=workspace).run("long answer please")
        assert result.status is RunStatus.FAILED
        assert result.error == MODEL_ERROR
        data, _ = check_log(result, workspace)
        assert records(data, "operationFinished")[0]["error"] == MODEL_ERROR

    @pytest.mark.parametrize(
        ("status", "text", "code"),
        [
            (429, "Rate limit reached for requests", "rate_limited"),
            (500, "The server had an error while processing your request", "provider_error"),
        ],
    )
    def test_http_error_fails_the_run_without_retry(
        self, fake: FakeProvider, workspace: Path, status: int, text: str, code: str
    ) -> None:
        fake.enqueue(
            error(status, text, headers={"Retry-After": "1", "x-should-retry": "true"}),
            ok(completion("must never be fetched")),
        )
        result = Agent(remote(fake), workspace=workspace).run("hi")
        assert result.status is RunStatus.FAILED
        assert len(fake.requests) == 1
        assert result.error is not None and result.error["code"] == code
        assert text in result.error["message"]
        assert f"HTTP {status}" in result.error["message"]
        data, _ = check_log(result, workspace)
        (failed,) = records(data, "stepFailed")
        assert failed["error"] == result.error
        (finish,) = records(data, "operationFinished")
        assert finish["outcome"] == "failed" and finish["error"] == result.error
        # stepFailed and the terminal are one transaction (spec 15.2).
        last = json.loads(data.split(b"\n")[-2])
        assert [f["record"]["type"] for f in last] == ["stepFailed", "operationFinished"]
        # Nothing to recover: a resume finds the session idle and appends nothing.
        again = Agent(remote(fake), workspace=workspace).resume(result.session_id)
        assert again.status is RunStatus.IDLE
        assert result.session_path.read_bytes() == data
        assert len(fake.requests) == 1

    def test_error_after_a_tool_step(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(
            ok(
                completion(
                    None,
                    tool_calls=[{"id": "c", "name": "read", "arguments": {"path": "README.md"}}],
                )
            ),
            error(500, "upstream exploded"),
        )
        result = Agent(remote(fake), workspace=workspace).run("hi")
        assert result.status is RunStatus.FAILED
        assert "upstream exploded" in (result.error or {}).get("message", "")
        data, _ = check_log(result, workspace)
        assert len(records(data, "stepAttempt")) == 2 and len(fake.requests) == 2

    def test_slow_answer_within_timeout(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(ok(completion("Slow but fine."), delay=0.4))
        result = Agent(remote(fake, timeout=3.0), workspace=workspace).run("hi")
        assert result.status is RunStatus.COMPLETED and result.text == "Slow but fine."
        check_log(result, workspace)

    def test_timeout_fails_the_run(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(ok(completion("too late"), delay=4.0), ok(completion("never")))
        started = time.monotonic()
        result = Agent(remote(fake, timeout=0.5), workspace=workspace).run("hi")
        elapsed = time.monotonic() - started
        assert result.status is RunStatus.FAILED
        assert result.error is not None and result.error["code"] == "timeout"
        assert "0.5 s" in result.error["message"]
        assert elapsed < 3.0
        assert len(fake.requests) == 1
        data, _ = check_log(result, workspace)
        assert records(data, "stepFailed")[0]["error"]["code"] == "timeout"

    def test_malformed_arguments_and_unknown_tool(
        self, fake: FakeProvider, workspace: Path
    ) -> None:
        calls: list[dict[str, Any]] = [
            {"id": "c_bad_json", "name": "read", "arguments": "{not json"},
            {"id": "c_array", "name": "read", "arguments": "[1, 2]"},
            {"id": "c_schema", "name": "read", "arguments": {"path": 5}},
            {"id": "c_unknown", "name": "fly_to_the_moon", "arguments": {}},
            {"id": "c_ok", "name": "read", "arguments": {"path": "README.md"}},
        ]
        fake.enqueue(ok(completion("Trying.", tool_calls=calls)), ok(completion("Sorry.")))
        result = Agent(remote(fake), workspace=workspace).run("go")
        assert result.status is RunStatus.COMPLETED
        data, _ = check_log(result, workspace)
        entries = tool_entries(data)
        reasons = [e["result"].get("reason", e["result"]["type"]) for e in entries]
        assert reasons == [
            "invalidArguments",
            "invalidArguments",
            "invalidArguments",
            "unknownTool",
            "success",
        ]
        for entry in entries[:4]:
            assert entry["message"]["content"] == SYNTHETIC[entry["result"]["reason"]]
            assert "toolStartedId" not in entry
        assert [e["toolIndex"] for e in entries[:4]] == [0, 1, 2, 3]
        (started,) = records(data, "toolStarted")
        assert started["toolCallId"] == "c_ok"
        sent = [m for m in wire_messages(fake, 1) if m["role"] == "tool"]
        assert [m["content"] for m in sent[:4]] == [SYNTHETIC[r] for r in reasons[:4]]

    @pytest.mark.parametrize("content", [None, "", "  \n\t"])
    def test_empty_answer_fails(
        self, fake: FakeProvider, workspace: Path, content: str | None
    ) -> None:
        fake.enqueue(ok(completion(content)))
        result = Agent(remote(fake), workspace=workspace).run("hi")
        assert result.status is RunStatus.FAILED
        assert result.error == MODEL_ERROR  # spec 14.4 rule 7
        data, _ = check_log(result, workspace)
        assert records(data, "stepFailed") == []
        (finish,) = records(data, "operationFinished")
        assert finish == {
            "type": "operationFinished",
            "operationId": finish["operationId"],
            "operationKind": "run",
            "outcome": "failed",
            "error": MODEL_ERROR,
        }

    def test_abort_during_slow_request(self, fake: FakeProvider, workspace: Path) -> None:
        fake.enqueue(ok(completion("too late"), delay=10.0))
        agent: Agent

        def on_event(event: Event) -> None:
            if event.kind == "model_started":
                threading.Timer(0.3, agent.abort).start()

        agent = Agent(remote(fake, timeout=30.0), workspace=workspace, on_event=on_event)
        started = time.monotonic()
        result = agent.run("hi")
        assert time.monotonic() - started < 3.0
        assert result.status is RunStatus.ABORTED
        assert len(fake.requests) == 1
        data, _ = check_log(result, workspace)
        assert records(data, "abortRequested")[0]["phase"] == "model"
        assert records(data, "stepFailed")[0]["error"] == ABORTED_ERROR

    def test_agents_md_is_in_the_system_prompt(self, fake: FakeProvider, workspace: Path) -> None:
        (workspace / "AGENTS.md").write_text("Always answer in exactly three words.\n")
        fake.enqueue(ok(completion("Three words exactly.")))
        result = Agent(remote(fake), workspace=workspace).run("hi")
        assert result.status is RunStatus.COMPLETED
        system = wire_messages(fake, 0)[0]
        assert system["role"] == "system"
        assert "Always answer in exactly three words." in system["content"]
        assert "AGENTS.md" in system["content"]
        # The system prompt (with AGENTS.md) is part of the configuration snapshot.
        without = Agent(remote(fake), workspace=workspace, read_agents_md=False)
        with_md = Agent(remote(fake), workspace=workspace)
        assert without.configuration.digest != with_md.configuration.digest
        assert "three words" not in without.system_prompt


# --------------------------------------------------------------------------- configuration


class TestConfiguration:
    def test_environment_identity_override(
        self, workspace: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("TETHER_ENVIRONMENT_IDENTITY", "  ci-box-7  ")
        model = scripted(
            {"tool_calls": [{"id": "c", "name": "read", "arguments": {"path": "README.md"}}]},
            {"content": "ok"},
        )
        result = Agent(model, workspace=workspace).run("hi")
        data, state = check_log(result, workspace)
        assert state.header.environment_identity == "ci-box-7"
        assert records(data, "toolStarted")[0]["environmentIdentity"] == "ci-box-7"

    def test_environment_identity_defaults_to_workspace_realpath(
        self, tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        link = tmp_path / "link"
        link.symlink_to(workspace)
        monkeypatch.setenv("TETHER_ENVIRONMENT_IDENTITY", "   ")  # blank counts as unset
        agent = Agent(scripted({"content": "ok"}), workspace=link)
        assert agent.environment == os.path.realpath(workspace)
        explicit = Agent(scripted({"content": "ok"}), workspace=link, environment="given")
        assert explicit.environment == "given"

    def test_duplicate_tool_names_rejected(self, workspace: Path) -> None:
        with pytest.raises(ConfigurationError, match="duplicate tool name 'read'"):
            Agent(
                scripted({"content": "ok"}),
                [builtin.ReadTool(), builtin.ReadTool()],
                workspace=workspace,
            )

        @tool(name="read", parameters={"type": "object"})
        def my_read(arguments: Mapping[str, Any], context: ToolContext) -> str:
            return "mine"

        with pytest.raises(ConfigurationError, match="duplicate tool name"):
            Agent(
                scripted({"content": "ok"}),
                [*builtin.builtin_tools(), my_read],
                workspace=workspace,
            )

    def test_user_tool_named_read_is_never_replayed(self, workspace: Path) -> None:
        seen: list[str] = []

        @tool(name="read", parameters={"type": "object"}, replay=Replay.SAFE)
        def my_read(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            seen.append(context.operation_id)
            return ToolResult("my own read")

        assert my_read.replay is Replay.NEVER
        model = scripted(
            {"tool_calls": [{"id": "c", "name": "read", "arguments": {}}]}, {"content": "ok"}
        )
        result = Agent(model, [my_read], workspace=workspace).run("hi")
        assert result.status is RunStatus.COMPLETED
        data, _ = check_log(result, workspace)
        (started,) = records(data, "toolStarted")
        assert (started["replay"], started["replayKey"]) == ("never", "user:read:v1")
        assert tool_entries(data)[0]["message"]["content"] == "my own read"
        started_ids = [
            f["id"] for f in facts(data) if f.get("record", {}).get("type") == "toolStarted"
        ]
        assert seen == started_ids

    def test_empty_prompt_and_bad_workspace(self, workspace: Path) -> None:
        agent = Agent(scripted({"content": "ok"}), workspace=workspace)
        with pytest.raises(ConfigurationError):
            agent.run("   ")
        with pytest.raises(ConfigurationError):
            Agent(scripted({"content": "ok"}), workspace=workspace / "missing")
        assert not (workspace / ".tether").exists()


# --------------------------------------------------------------------------- scripted model


class TestScriptedRuns:
    def test_two_runs_then_compaction_then_run(self, workspace: Path) -> None:
        model = Recording(
            scripted(
                {"content": "First answer."},
                {
                    "tool_calls": [{"id": "c", "name": "read", "arguments": {"path": "README.md"}}],
                },
                {"content": "Second answer."},
                {"content": "The user asked twice; README says hello."},
                {"content": "Third answer."},
            )
        )
        agent = Agent(model, workspace=workspace)
        first = agent.run("one")
        sid = first.session_id
        assert agent.run("two", session=sid).text == "Second answer."

        compacted = agent.compact(sid)
        assert compacted.status is RunStatus.COMPLETED
        data, state = check_log(compacted, workspace)
        context = state.to_json()["activeContext"]
        assert context[0] == {
            "role": "user",
            "content": "[Compacted history]\nThe user asked twice; README says hello.",
        }
        # The latest turn is kept verbatim; the transcript itself is never shortened.
        assert [m["role"] for m in context[1:]] == ["user", "assistant", "tool", "assistant"]
        assert context[1] == {"role": "user", "content": "two"}
        assert len(state.transcript) == 6
        (started,) = records(data, "compactionStarted")
        entry_ids = [f["id"] for f in facts(data) if f["kind"] == "entry"]
        assert started["compactedEntryIds"] == entry_ids[:2]
        assert started["retainedEntryIds"] == entry_ids[2:6]
        assert started["inputThroughEntryId"] == entry_ids[5]
        summary_request = model.requests[3]
        assert summary_request.purpose == "compaction"
        assert summary_request.tools == ()
        assert [m["content"] for m in summary_request.messages][:1] == ["one"]
        assert records(data, "operationFinished")[-1] == {
            "type": "operationFinished",
            "operationId": started["operationId"],
            "operationKind": "compaction",
            "outcome": "completed",
            "finalEntryId": started["resultEntryId"],
        }

        third = agent.run("three", session=sid)
        assert third.status is RunStatus.COMPLETED and third.text == "Third answer."
        sent = model.requests[4].messages
        assert sent[0]["content"].startswith("[Compacted history]\n")
        assert sent[-1] == {"role": "user", "content": "three"}
        assert all(m.get("content") != "one" for m in sent)
        check_log(third, workspace)

    def test_compaction_with_too_little_history(self, workspace: Path) -> None:
        agent = Agent(scripted({"content": "Only answer."}), workspace=workspace)
        result = agent.run("one")
        before = result.session_path.read_bytes()
        nothing = agent.compact(result.session_id)
        assert nothing.status is RunStatus.IDLE
        assert "nothing to compact" in (nothing.message or "")
        assert result.session_path.read_bytes() == before

    def test_abort_during_model_delay(self, workspace: Path) -> None:
        agent: Agent

        def on_event(event: Event) -> None:
            if event.kind == "model_started":
                threading.Timer(0.2, agent.abort).start()

        agent = Agent(
            scripted({"content": "too late", "delay": 30}), workspace=workspace, on_event=on_event
        )
        started = time.monotonic()
        result = agent.run("hi")
        assert time.monotonic() - started < 5.0
        assert result.status is RunStatus.ABORTED
        data, state = check_log(result, workspace)
        types = [f["record"]["type"] for f in facts(data) if f["kind"] == "record"]
        assert types == [
            "runStarted",
            "stepAttempt",
            "abortRequested",
            "stepFailed",
            "operationFinished",
        ]
        assert records(data, "abortRequested")[0]["phase"] == "model"
        assert records(data, "stepFailed")[0]["error"] == ABORTED_ERROR
        assert records(data, "operationFinished")[0]["outcome"] == "aborted"
        assert [m["role"] for m in state.transcript] == ["user"]
        # A later run in the same session works (once the first agent lets go of it).
        agent.close()
        again = Agent(scripted({"content": "Fresh."}), workspace=workspace)
        assert again.resume(result.session_id).status is RunStatus.IDLE

    def test_abort_during_bash(self, workspace: Path) -> None:
        agent: Agent

        def on_event(event: Event) -> None:
            if event.kind == "tool_started" and getattr(event, "name", "") == "bash":
                threading.Timer(0.3, agent.abort).start()

        model = scripted(
            {
                "tool_calls": [
                    {
                        "id": "c_bash",
                        "name": "bash",
                        "arguments": {"command": "sleep 30; touch late"},
                    },
                    {"id": "c_read", "name": "read", "arguments": {"path": "README.md"}},
                ]
            },
            {"content": "never asked"},
        )
        agent = Agent(model, workspace=workspace, on_event=on_event)
        started = time.monotonic()
        result = agent.run("hi")
        assert time.monotonic() - started < 10.0
        assert result.status is RunStatus.ABORTED
        assert not (workspace / "late").exists()
        data, _ = check_log(result, workspace)
        abort = records(data, "abortRequested")[0]
        assert abort["phase"] == "tool" and abort["toolCallId"] == "c_bash"
        entries = tool_entries(data)
        assert [e["result"] for e in entries] == [
            {"type": "synthetic", "reason": "interrupted"},
            {"type": "synthetic", "reason": "aborted"},
        ]
        assert entries[0]["message"]["content"] == SYNTHETIC["interrupted"]
        assert entries[1]["message"]["content"] == SYNTHETIC["aborted"]
        assert [r["outcome"] for r in records(data, "operationFinished")] == ["aborted"]
        assert len(records(data, "stepAttempt")) == 1
        # Order: the abort request precedes the synthetic results (spec 15.2).
        kinds = [
            f["record"]["type"] if f["kind"] == "record" else f["entry"]["message"]["role"]
            for f in facts(data)
            if f["kind"] != "usage"
        ]
        assert kinds[-4:] == ["abortRequested", "tool", "tool", "operationFinished"]

    def test_abort_during_a_tool_that_finishes_keeps_its_real_result(self, workspace: Path) -> None:
        agent: Agent

        @tool(name="steady", parameters={"type": "object"})
        def steady(arguments: Mapping[str, Any], context: ToolContext) -> str:
            context.cancel.wait(5)  # finishes its work regardless: its outcome is known
            return "steady result"

        def on_event(event: Event) -> None:
            if event.kind == "tool_started":
                threading.Timer(0.1, agent.abort).start()

        model = scripted(
            {
                "tool_calls": [
                    {"id": "c1", "name": "steady", "arguments": {}},
                    {"id": "c2", "name": "steady", "arguments": {}},
                ]
            },
            {"content": "never asked"},
        )
        agent = Agent(model, [steady], workspace=workspace, on_event=on_event)
        result = agent.run("hi")
        assert result.status is RunStatus.ABORTED
        data, _ = check_log(result, workspace)
        entries = tool_entries(data)
        assert entries[1]["result"] == {"type": "synthetic", "reason": "aborted"}
        assert entries[0]["result"] == {"type": "success"}
        assert entries[0]["message"]["content"] == "steady result"

    def test_abort_before_a_call_applies_to_that_call_only(self, workspace: Path) -> None:
        agent = Agent(scripted({"content": "Fine."}), workspace=workspace)
        agent.abort()
        first = agent.run("hi")
        assert first.status is RunStatus.ABORTED
        data, _ = check_log(first, workspace)
        assert records(data, "stepAttempt") == []
        assert records(data, "abortRequested")[0]["phase"] == "model"
        second = agent.run("again", session=first.session_id)
        assert second.status is RunStatus.COMPLETED and second.text == "Fine."

    def test_events_and_usage(self, workspace: Path) -> None:
        seen: list[str] = []
        model = scripted(
            {
                "tool_calls": [{"id": "c", "name": "read", "arguments": {"path": "README.md"}}],
                "usage": {"input": 7, "output": 3, "cacheRead": 2, "cacheWrite": 1},
            },
            {"content": "ok", "usage": {"input": 1, "output": 1}},
        )
        agent = Agent(model, workspace=workspace, on_event=lambda e: seen.append(e.kind))
        result = agent.run("hi")
        assert result.usage.to_json() == {"input": 8, "output": 4, "cacheRead": 2, "cacheWrite": 1}
        assert seen[0] == "session" and seen[-1] == "operation_finished"
        assert "tool_started" in seen and "tool_finished" in seen
        assert agent.last_session == result.session_id
        second = agent.run("again", session=result.session_id)
        assert second.status is RunStatus.FAILED  # script exhausted: bad_response
        assert second.error is not None and second.error["code"] == "bad_response"
        assert second.usage.to_json() == {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
        assert second.session_usage == result.session_usage


class TestToolsAndSteps:
    def test_tool_exception_becomes_error_result(self, workspace: Path) -> None:
        @tool(name="explode", parameters={"type": "object"})
        def explode(arguments: Mapping[str, Any], context: ToolContext) -> str:
            raise RuntimeError("kaboom")

        model = scripted(
            {"tool_calls": [{"id": "c", "name": "explode", "arguments": {}}]},
            {"content": "It exploded."},
        )
        result = Agent(model, [explode], workspace=workspace).run("hi")
        assert result.status is RunStatus.COMPLETED and result.text == "It exploded."
        data, _ = check_log(result, workspace)
        (entry,) = tool_entries(data)
        assert entry["result"] == {"type": "error"}
        assert "RuntimeError: kaboom" in entry["message"]["content"]

    def test_tool_timeout(self, workspace: Path) -> None:
        model = scripted(
            {"tool_calls": [{"id": "c", "name": "bash", "arguments": {"command": "sleep 20"}}]},
            {"content": "Timed out."},
        )
        started = time.monotonic()
        result = Agent(model, workspace=workspace, tool_timeout=0.5).run("hi")
        assert time.monotonic() - started < 8.0
        assert result.status is RunStatus.COMPLETED
        data, _ = check_log(result, workspace)
        (entry,) = tool_entries(data)
        assert entry["result"] == {"type": "error"}

    def test_failed_step_moves_the_script_on(self, workspace: Path) -> None:
        """Position counts recorded steps, so a failed step is not asked again."""
        model = scripted(
            {"error": {"code": "rate_limited", "message": "slow down"}},
            {"content": "Now it works."},
        )
        agent = Agent(model, workspace=workspace)
        failed = agent.run("one")
        assert failed.status is RunStatus.FAILED
        assert failed.error == {"code": "rate_limited", "message": "slow down"}
        ok_run = agent.run("two", session=failed.session_id)
        assert ok_run.status is RunStatus.COMPLETED and ok_run.text == "Now it works."
        data, state = check_log(ok_run, workspace)
        assert [r["outcome"] for r in records(data, "operationFinished")] == [
            "failed",
            "completed",
        ]
        assert [m["role"] for m in state.transcript] == ["user", "user", "assistant"]

    def test_abort_during_compaction(self, workspace: Path) -> None:
        agent: Agent
        arm = {"on": False}

        def on_event(event: Event) -> None:
            if arm["on"] and event.kind == "model_started":
                threading.Timer(0.2, agent.abort).start()

        model = scripted(
            {"content": "First."},
            {"content": "Second."},
            {"content": "summary", "delay": 30},
            {"content": "Third."},
        )
        agent = Agent(model, workspace=workspace, on_event=on_event)
        sid = agent.run("one").session_id
        agent.run("two", session=sid)
        arm["on"] = True
        started = time.monotonic()
        result = agent.compact(sid)
        assert time.monotonic() - started < 5.0
        assert result.status is RunStatus.ABORTED
        data, state = check_log(result, workspace)
        abort = records(data, "abortRequested")[0]
        assert abort["operationKind"] == "compaction" and abort["phase"] == "compact"
        assert records(data, "stepFailed")[0]["error"] == ABORTED_ERROR
        assert records(data, "operationFinished")[-1]["outcome"] == "aborted"
        assert len(state.active_context) == 4  # not compacted
        arm["on"] = False
        assert agent.run("three", session=sid).text == "Third."


class TestScaling:
    def test_state_snapshots_do_not_rebuild_every_completed_tool(
        self, workspace: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The executor reads ``store.state`` after each of the 4 commits of a tool step.

        Each snapshot must not rebuild a ``ToolCallState`` for every tool the run has
        completed so far: that makes a run of n tool steps cost O(n^2) and is what puts
        ``bench/bench_runtime.py`` over its 1.5x target (1.9x at 100 steps, 2.7x at 300).
        """
        from tether.core import reducer

        built = Counter[str]()
        original = reducer._completed

        def counting(tool_state: Any) -> Any:
            built[tool_state.tool_started_id] += 1
            return original(tool_state)

        monkeypatch.setattr(reducer, "_completed", counting, raising=False)

        @tool(name="noop", parameters={"type": "object"})
        def noop(arguments: Mapping[str, Any], context: ToolContext) -> str:
            return "ok"

        steps = 40
        model = scripted(
            *[{"tool_calls": [{"id": f"c{i}", "name": "noop"}]} for i in range(steps)],
            {"content": "Done."},
        )
        result = Agent(model, [noop], workspace=workspace).run("go")
        assert result.status is RunStatus.COMPLETED
        total = sum(built.values())
        assert total <= 2 * steps, (
            f"{total} completed tool states built for {steps} tools "
            f"(the first tool {max(built.values())} times): O(n^2) state snapshots"
        )
