"""Request bodies in O(new bytes), and one kept-alive connection (issue 31).

One long durable session per adapter (tool calls, parallel calls, tool results, OpenRouter reasoning
side records, non-ASCII text, a compaction and turns after it) is driven through a real
:class:`tether.Agent` with the OpenAI-compatible adapter against the loopback server.
Every request the adapter made is then checked against what the official SDK's
``chat.completions.create`` sends for the same request (the path tether used before, which
re-walked the whole history), as JSON values; the messages encoded per request are counted
(each new message once, nothing else); and the whole session used one TCP connection.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import openai
import orjson
import pytest

from fakeprovider import (
    Canned,
    FakeProvider,
    anthropic_stream,
    chunk,
    running,
    sse_data,
    streamed,
)
from tether import Agent
from tether._models.anthropic_native import AnthropicModel
from tether._models.base import ModelRequest, ModelResponse, Reasoning
from tether._models.http_common import plain
from tether._models.openai_compat import OpenAICompatibleModel
from tether._runtime.results import RunStatus

USAGE = {"prompt_tokens": 10, "completion_tokens": 3}
DETAIL = {"type": "reasoning.text", "index": 0, "format": "anthropic-claude-v1"}


@dataclass(frozen=True)
class Sent:
    """One ``complete`` call: the request as it was then, and the encoding counters."""

    request: ModelRequest
    messages: list[Mapping[str, Any]]
    encoded_messages: int
    encoded_bytes: int


class RecordingModel(OpenAICompatibleModel):
    """The real adapter, remembering each request and what encoding it cost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Sent] = []

    def complete(
        self, request: ModelRequest, *, cancel: threading.Event | None = None, on_delta: Any = None
    ) -> ModelResponse:
        before = (self.encoded_messages, self.encoded_bytes)
        try:
            return super().complete(request, cancel=cancel, on_delta=on_delta)
        finally:
            self.sent.append(
                Sent(
                    request,
                    list(request.messages),
                    self.encoded_messages - before[0],
                    self.encoded_bytes - before[1],
                )
            )


def tool_turn(index: int, *, parallel: bool = False, reasoning: bool = False) -> list[Canned]:
    """A turn: the model reads one file (or two at once), then answers in text."""
    calls = [
        {
            "index": 0,
            "id": f"call_{index}_a",
            "type": "function",
            "function": {"name": "read", "arguments": f'{{"path": "f{index}.txt"}}'},
        }
    ]
    if parallel:
        calls.append(
            {
                "index": 1,
                "id": f"call_{index}_b",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "ü.txt"}'},
            }
        )
    first: list[Any] = []
    if reasoning:
        first.append(
            chunk(
                reasoning=f"Think {index}.",
                reasoning_details=[{**DETAIL, "text": f"Think {index}.", "signature": "sig"}],
            )
        )
    first += [chunk(content=f"Reading {index}."), chunk(tool_calls=calls)]
    first += [chunk(finish_reason="tool_calls"), chunk(no_choices=True, usage=USAGE)]
    answer = f'Read {index}: «ok» ✓ \u2028 "quoted" \\ done.'
    return [
        streamed(*first),
        streamed(chunk(content=answer), chunk(finish_reason="stop", usage=USAGE)),
    ]


@dataclass
class Session:
    model: RecordingModel
    fake: FakeProvider
    compaction_index: int  # index in model.sent of the compaction request


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    workspace = tmp_path_factory.mktemp("ws")
    for index in range(12):
        (workspace / f"f{index}.txt").write_text(f"file {index}\n" * 20)
    (workspace / "ü.txt").write_text("unicode ✓\n")
    with running() as fake:
        model = RecordingModel(
            "fake/model", base_url=fake.base_url, extra_headers={"X-Title": "bodies"}
        )
        agent = Agent(
            model,
            workspace=workspace,
            sessions_dir=tmp_path_factory.mktemp("sessions"),
            model_options=["temperature=0.5"],
        )
        try:
            session_id: str | None = None
            for index in range(8):
                fake.enqueue(*tool_turn(index, parallel=index == 2, reasoning=index in (1, 5)))
                result = agent.run(f"read f{index}.txt, «please»", session=session_id)
                assert result.status is RunStatus.COMPLETED, result.message
                session_id = result.session_id
            assert session_id is not None
            compaction_index = len(model.sent)
            fake.enqueue(
                streamed(chunk(content="Summary: read eight files."), chunk(finish_reason="stop"))
            )
            result = agent.compact(session_id, keep_turns=1)
            assert result.status is RunStatus.COMPLETED, result.message
            for index in range(8, 11):
                fake.enqueue(*tool_turn(index, reasoning=index == 9))
                result = agent.run(f"read f{index}.txt", session=session_id)
                assert result.status is RunStatus.COMPLETED, result.message
        finally:
            agent.close()
        yield Session(model, fake, compaction_index)


def reference_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The ``messages`` tether handed the SDK before issue 31 (build_messages as it was)."""
    wire: list[dict[str, Any]] = []
    if request.system_prompt:
        wire.append({"role": "system", "content": request.system_prompt})
    reasoning = list(request.reasoning)
    for index, message in enumerate(request.messages):
        item = plain(message)
        if (
            item.get("role") == "assistant"
            and item.get("content") is None
            and not item.get("tool_calls")
        ):
            item["content"] = ""
        side = reasoning[index] if index < len(reasoning) else None
        if item.get("role") == "assistant" and side is not None and side.format == "openrouter":
            item["reasoning_details"] = [plain(d) for d in side.details]
        wire.append(item)
    return wire


def sdk_bodies(sent: list[Sent], *, stream: bool = True) -> list[Any]:
    """What the SDK's ``create`` sends for each request (to a second loopback server)."""
    with running() as reference:
        client = openai.OpenAI(base_url=reference.base_url, api_key="k", max_retries=0)
        for item in sent:
            request = ModelRequest(
                system_prompt=item.request.system_prompt,
                messages=item.messages,
                tools=item.request.tools,
                output_options=item.request.output_options,
                reasoning=item.request.reasoning,
            )
            tools = [{"type": "function", "function": plain(t)} for t in request.tools]
            if stream:
                reference.enqueue(streamed(chunk(content="x"), chunk(finish_reason="stop")))
                client.chat.completions.create(
                    model="fake/model",
                    messages=reference_messages(request),  # type: ignore[arg-type]
                    tools=tools or openai.omit,  # type: ignore[arg-type]
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=plain(request.output_options) or None,
                ).close()
            else:
                reference.enqueue(Canned(200, b"{}", {"Content-Type": "application/json"}))
                client.chat.completions.with_raw_response.create(
                    model="fake/model",
                    messages=reference_messages(request),  # type: ignore[arg-type]
                    tools=tools or openai.omit,  # type: ignore[arg-type]
                    extra_body=plain(request.output_options) or None,
                )
        client.close()
        return [r.body for r in reference.requests]


def test_bodies_are_the_sdk_bodies_across_a_long_session(session: Session) -> None:
    sent = session.model.sent
    bodies = [r.body for r in session.fake.requests]
    assert len(bodies) == len(sent) == 8 * 2 + 1 + 3 * 2
    assert bodies == sdk_bodies(sent)
    # What the session was made of, so the comparison covered it:
    last = bodies[-1]
    roles = [m["role"] for m in last["messages"]]
    assert roles[0] == "system" and "tool" in roles
    assert "Summary: read eight files." in str(last["messages"])  # compacted base
    everything = [m for body in bodies for m in body["messages"]]
    assert any(len(m.get("tool_calls", ())) == 2 for m in everything)  # parallel calls
    sides = [m["reasoning_details"] for m in everything if "reasoning_details" in m]
    assert sides and sides[0] == [{**DETAIL, "text": "Think 1.", "signature": "sig"}]
    assert any("«ok» ✓ \u2028" in str(m.get("content")) for m in everything)
    compaction = bodies[session.compaction_index]
    assert "tools" not in compaction and compaction["messages"][-1]["role"] == "user"
    assert all(b["temperature"] == 0.5 and b["stream"] is True for b in bodies)
    assert session.fake.requests[0].headers["x-title"] == "bodies"
    assert session.fake.requests[0].headers["authorization"] == "Bearer tether-no-key"


def test_each_request_encodes_only_its_new_messages(session: Session) -> None:
    sent = session.model.sent
    previous: list[Mapping[str, Any]] = []
    for index, item in enumerate(sent):
        shared = 0
        for old, new in zip(previous, item.messages, strict=False):
            if old is not new:
                break
            shared += 1
        new_messages = item.messages[shared:]
        assert item.encoded_messages == len(new_messages), index
        assert item.encoded_bytes <= sum(len(orjson.dumps(m)) + 600 for m in new_messages)
        if index == session.compaction_index + 1:  # the compacted context: a new base
            assert shared == 0 and item.encoded_messages == len(item.messages) <= 6
        elif index:
            assert shared >= len(previous) - 1 and item.encoded_messages <= 4, index
        previous = item.messages
    total = sum(len(item.messages) for item in sent)
    assert session.model.encoded_messages < total / 3  # against re-encoding the history


def test_the_whole_session_used_one_connection(session: Session) -> None:
    assert len(session.fake.requests) == 23
    assert session.fake.connections == 1


def test_non_streamed_bodies_and_connection(fake: FakeProvider) -> None:
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, stream=False)
    side = Reasoning(text="t", details=({**DETAIL, "text": "t"},), format="openrouter")
    messages: list[Mapping[str, Any]] = [{"role": "user", "content": "hi"}]
    requests = []
    for index in range(3):
        fake.enqueue(
            Canned(
                200,
                orjson.dumps(
                    {"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}
                ),
                {"Content-Type": "application/json"},
            )
        )
        request = ModelRequest(
            system_prompt="",
            messages=list(messages),
            tools=[{"name": "read", "description": "d", "parameters": {"type": "object"}}],
            reasoning=[None, side] if index else [],
        )
        response = model.complete(request)
        requests.append(request)
        # an empty answer is sent back with content "" (servers refuse null without calls)
        messages += [response.to_message(), {"role": "user", "content": f"again {index}"}]
    sent = [Sent(r, list(r.messages), 0, 0) for r in requests]
    assert [r.body for r in fake.requests] == sdk_bodies(sent, stream=False)
    assert fake.connections == 1
    assert fake.requests[1].body["messages"][1] == {
        "role": "assistant",
        "content": "",
        "reasoning_details": [{**DETAIL, "text": "t"}],
    }


def test_answer_kept_when_the_server_stalls_after_done(fake: FakeProvider) -> None:
    """After ``[DONE]`` the body is only drained: a stall there costs the connection, not
    the answer."""
    fake.enqueue(
        Canned(
            chunks=(
                (0.0, sse_data(chunk(content="Whole."))),
                (0.0, sse_data(chunk(finish_reason="stop", usage=USAGE))),
                (0.0, sse_data("[DONE]")),
                (5.0, b": late\n\n"),
            )
        )
    )
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, idle_timeout=0.3)
    response = model.complete(
        ModelRequest(system_prompt="", messages=[{"role": "user", "content": "hi"}])
    )
    assert response.content == "Whole."


def test_answer_kept_when_the_server_hangs_up_after_done(fake: FakeProvider) -> None:
    fake.enqueue(streamed(chunk(content="Whole."), chunk(finish_reason="stop"), hang_up=True))
    fake.enqueue(streamed(chunk(content="Again."), chunk(finish_reason="stop")))
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url)
    request = ModelRequest(system_prompt="", messages=[{"role": "user", "content": "hi"}])
    assert model.complete(request).content == "Whole."
    assert model.complete(request).content == "Again."  # on a new connection
    assert fake.connections == 2


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running() as provider:
        yield provider


def test_identity_not_equality(tmp_path: Path) -> None:
    """An equal message that is a new object is encoded again; a shared prefix is not."""
    from tether._models.encoded import EncodedPrefix, dumps

    cache = EncodedPrefix(lambda message, side, state: (dumps(message), None))
    a, b = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    assert cache.join(b"[", [a, b], [], b"]") == b'[{"role":"user","content":"a"},' + (
        b'{"role":"user","content":"b"}]'
    )
    assert cache.encoded_messages == 2
    cache.join(b"[", [a, b, {"role": "tool", "content": "c"}], [], b"]")
    assert cache.encoded_messages == 3
    assert orjson.loads(cache.join(b"[", [a, dict(b)], [], b"]"))[1] == b
    assert cache.encoded_messages == 4  # b's equal copy: encoded, and the tail dropped
    assert cache.join(b"", [], [], b"[]") == b"[]"


# -- the Anthropic adapter ----------------------------------------------------------------------


class RecordingAnthropic(AnthropicModel):
    """The real Anthropic adapter, remembering each request and what encoding it cost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Sent] = []

    def complete(
        self, request: ModelRequest, *, cancel: threading.Event | None = None, on_delta: Any = None
    ) -> ModelResponse:
        before = (self.encoded_messages, self.encoded_bytes)
        try:
            return super().complete(request, cancel=cancel, on_delta=on_delta)
        finally:
            self.sent.append(
                Sent(
                    request,
                    list(request.messages),
                    self.encoded_messages - before[0],
                    self.encoded_bytes - before[1],
                )
            )


def anthropic_turn(index: int, *, parallel: bool = False, thinking: bool = False) -> list[Canned]:
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": f"Think {index}.", "signature": "sig"})
    blocks.append({"type": "text", "text": f"Reading {index}."})
    blocks.append(
        {
            "type": "tool_use",
            "id": f"toolu_{index}_a",
            "name": "read",
            # turn 3 reads a file that is not there: a failed result, sent with is_error
            "input": {"path": "missing.txt" if index == 3 else f"f{index}.txt"},
        }
    )
    if parallel:
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{index}_b",
                "name": "read",
                "input": {"path": "ü.txt"},
            }
        )
    return [
        anthropic_stream(*blocks, stop_reason="tool_use"),
        anthropic_stream({"type": "text", "text": f'Read {index}: «ok» ✓ "q" \\ done.'}),
    ]


@pytest.fixture(scope="module")
def anthropic_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    workspace = tmp_path_factory.mktemp("ws")
    for index in range(8):
        (workspace / f"f{index}.txt").write_text(f"file {index}\n" * 20)
    (workspace / "ü.txt").write_text("unicode ✓\n")
    with running() as fake:
        model = RecordingAnthropic(
            "claude-fake", base_url=fake.root_url, api_key="sk-ant-test-1234"
        )
        agent = Agent(
            model,
            workspace=workspace,
            sessions_dir=tmp_path_factory.mktemp("sessions"),
            model_options=["temperature=0.5"],
        )
        try:
            session_id: str | None = None
            for index in range(5):
                fake.enqueue(*anthropic_turn(index, parallel=index == 1, thinking=index in (2, 3)))
                result = agent.run(f"read f{index}.txt, «please»", session=session_id)
                assert result.status is RunStatus.COMPLETED, result.message
                session_id = result.session_id
            assert session_id is not None
            compaction_index = len(model.sent)
            fake.enqueue(anthropic_stream({"type": "text", "text": "Summary: five files."}))
            result = agent.compact(session_id, keep_turns=1)
            assert result.status is RunStatus.COMPLETED, result.message
            for index in range(5, 7):
                fake.enqueue(*anthropic_turn(index, thinking=index == 6))
                result = agent.run(f"read f{index}.txt", session=session_id)
                assert result.status is RunStatus.COMPLETED, result.message
        finally:
            agent.close()
        yield Session(cast(Any, model), fake, compaction_index)


def test_anthropic_bodies_are_the_sdk_bodies(anthropic_session: Session) -> None:
    import anthropic

    model = cast(RecordingAnthropic, anthropic_session.model)
    sent = model.sent
    bodies = [r.body for r in anthropic_session.fake.requests]
    assert len(bodies) == len(sent) == 5 * 2 + 1 + 2 * 2
    with running() as reference:
        client = anthropic.Anthropic(base_url=reference.root_url, api_key="k", max_retries=0)
        for item in sent:
            reference.enqueue(anthropic_stream({"type": "text", "text": "x"}))
            request = dataclasses.replace(item.request, messages=item.messages)
            client.messages.create(stream=True, **model.build_request(request)).close()
        client.close()
        expected = [r.body for r in reference.requests]
    assert bodies == expected
    everything = [m for body in bodies for m in body["messages"]]
    blocks = [b for m in everything for b in m["content"]]
    assert any(b["type"] == "thinking" and b["signature"] == "sig" for b in blocks)
    assert any(b["type"] == "tool_result" and b.get("is_error") is True for b in blocks)
    assert any(
        m["role"] == "user" and [b["type"] for b in m["content"]] == ["tool_result"] * 2
        for m in everything
    )  # two results in one user turn
    assert all(b["messages"][-1]["content"][-1]["cache_control"] for b in bodies)
    assert "Summary: five files." in str(bodies[-1]["messages"])
    assert all(b["temperature"] == 0.5 and b["stream"] is True for b in bodies)
    headers = anthropic_session.fake.requests[0].headers
    assert "sk-ant-test-1234" in f"{headers.get('authorization')} {headers.get('x-api-key')}"
    assert headers["anthropic-version"]


def test_anthropic_encodes_only_new_messages_on_one_connection(
    anthropic_session: Session,
) -> None:
    sent = anthropic_session.model.sent
    previous: list[Mapping[str, Any]] = []
    for index, item in enumerate(sent):
        shared = 0
        for old, new in zip(previous, item.messages, strict=False):
            if old is not new:
                break
            shared += 1
        assert item.encoded_messages == len(item.messages) - shared, index
        if index and index != anthropic_session.compaction_index + 1:
            assert item.encoded_messages <= 4, index
        previous = item.messages
    assert anthropic_session.fake.connections == 1
