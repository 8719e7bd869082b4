"""The scripted model: file validation, answers by position, errors, delays and cancel."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessionkit import SessionKit, expect_ok
from tether._models import ModelRequest, ModelResponse, ScriptedModel, TokenUsage, ToolCallOut
from tether.core.state import StopReason
from tether.errors import ConfigurationError, ModelError

DEMO: dict[str, Any] = {
    "model": "scripted/demo",
    "responses": [
        {
            "content": "Let me look.",
            "tool_calls": [
                {"id": "call_1", "name": "read", "arguments": {"path": "README.md"}},
                {"name": "read", "arguments": "{bad json"},
            ],
            "usage": {"input": 120, "output": 14, "cacheRead": 100, "cacheWrite": 5},
        },
        {"content": "Done.", "finish_reason": "stop", "delay": 0.05},
        {"error": {"code": "rate_limited", "message": "slow down"}},
        {
            "content": None,
            "finish_reason": "length",
            "tool_calls": [
                {
                    "id": "t",
                    "type": "function",
                    "function": {"name": "write", "arguments": '{"path":"a","content":"lo'},
                }
            ],
        },
        {},
        {"content": "x", "tool_calls": [{"name": "read"}], "finish_reason": "stop"},
    ],
}


def req(position: int) -> ModelRequest:
    return ModelRequest(
        system_prompt="s", messages=[{"role": "user", "content": "hi"}], position=position
    )


@pytest.fixture
def demo_file(tmp_path: Path) -> Path:
    path = tmp_path / "demo.json"
    path.write_text(json.dumps(DEMO, indent=2))
    return path


def test_answers_by_position(demo_file: Path) -> None:
    model = ScriptedModel.from_file(demo_file)
    assert len(model) == 6
    assert model.model == "scripted/demo"
    assert model.provider == "scripted"
    assert model.adapter_identity == "scripted:v1"
    assert model.routing_identity.startswith("scripted:")
    assert len(model.routing_identity) == len("scripted:") + 16

    first = model.complete(req(0))
    assert first.content == "Let me look."
    assert first.tool_calls == (
        ToolCallOut("call_1", "read", '{"path":"README.md"}'),
        ToolCallOut("call_0_1", "read", "{bad json"),
    )
    assert first.stop_reason is StopReason.TOOL_USE
    assert first.usage == TokenUsage(120, 14, 100, 5)

    second = model.complete(req(1))
    assert (second.content, second.stop_reason, second.tool_calls) == ("Done.", StopReason.STOP, ())
    assert second.usage == TokenUsage()

    with pytest.raises(ModelError) as info:
        model.complete(req(2))
    assert info.value.to_json() == {"code": "rate_limited", "message": "slow down"}

    third = model.complete(req(3))
    assert third.stop_reason is StopReason.LENGTH
    assert third.tool_calls[0] == ToolCallOut("t", "write", '{"path":"a","content":"lo')

    empty = model.complete(req(4))
    assert empty == ModelResponse(None, (), StopReason.STOP)

    # finish_reason "stop" with calls is normalized to toolUse (log rule)
    fixed = model.complete(req(5))
    assert fixed.stop_reason is StopReason.TOOL_USE
    assert fixed.tool_calls == (ToolCallOut("call_5_0", "read", "{}"),)


def test_same_position_same_answer(demo_file: Path) -> None:
    one = ScriptedModel.from_file(demo_file)
    two = ScriptedModel.from_file(demo_file)
    for position in (0, 1, 3, 4, 5):
        assert one.complete(req(position)) == one.complete(req(position))
        assert one.complete(req(position)) == two.complete(req(position))
    assert one.routing_identity == two.routing_identity


def test_new_process_gets_same_answer(demo_file: Path) -> None:
    """A resumed process (after a crash) asks for the same position and gets the same answer."""
    code = (
        "import json, sys\n"
        "from tether._models import ScriptedModel, ModelRequest\n"
        "m = ScriptedModel.from_file(sys.argv[1])\n"
        "r = m.complete(ModelRequest('s', [], position=int(sys.argv[2])))\n"
        "print(json.dumps([r.to_message(), r.stop_reason.value, r.usage.to_json(),"
        " m.routing_identity]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(demo_file), "0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    here = ScriptedModel.from_file(demo_file)
    mine = here.complete(req(0))
    assert json.loads(out.stdout) == [
        mine.to_message(),
        mine.stop_reason.value,
        mine.usage.to_json(),
        here.routing_identity,
    ]


def test_answers_are_writable(demo_file: Path) -> None:
    model = ScriptedModel.from_file(demo_file)
    for position in (0, 1, 3, 4, 5):
        response = model.complete(req(position))
        kit = SessionKit(tools=("read", "write"))
        kit.start_run()
        kit.step_attempt()
        kit.assistant(
            response.content,
            [call.to_json() for call in response.tool_calls],
            stop_reason=response.stop_reason.value,
        )
        u = response.usage
        kit.usage(
            input=u.input, output=u.output, cache_read=u.cache_read, cache_write=u.cache_write
        )
        expect_ok(kit)


def test_exhausted(demo_file: Path) -> None:
    model = ScriptedModel.from_file(demo_file)
    with pytest.raises(ModelError) as info:
        model.complete(req(6))
    assert info.value.code == "bad_response"
    assert "script exhausted at position 6" in info.value.message
    assert str(demo_file) in info.value.message


def test_routing_identity_follows_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"responses": [{"content": "a"}]}')
    before = ScriptedModel.from_file(path).routing_identity
    path.write_text('{"responses": [{"content": "b"}]}')
    after = ScriptedModel.from_file(path).routing_identity
    assert before != after
    same = ScriptedModel.from_json(b'{"responses": [{"content": "b"}]}').routing_identity
    assert same == after
    parsed = ScriptedModel.from_json({"responses": [{"content": "b"}]})
    assert (
        parsed.routing_identity
        == ScriptedModel.from_json({"responses": [{"content": "b"}]}).routing_identity
    )
    assert ScriptedModel.from_json({"responses": [{"content": "b"}]}).model == "scripted"


def test_delay_and_cancel() -> None:
    model = ScriptedModel.from_json({"responses": [{"content": "late", "delay": 5}]})
    cancel = threading.Event()
    timer = threading.Timer(0.1, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(ModelError) as info:
            model.complete(req(0), cancel=cancel)
    finally:
        timer.cancel()
    assert info.value.to_json() == {"code": "aborted", "message": "Operation aborted"}
    assert time.monotonic() - started < 1.5


def test_delay_waits() -> None:
    model = ScriptedModel.from_json({"responses": [{"content": "late", "delay": 0.2}]})
    started = time.monotonic()
    assert model.complete(req(0)).content == "late"
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    assert model.complete(req(0), cancel=threading.Event()).content == "late"
    assert time.monotonic() - started >= 0.2


def test_delayed_error() -> None:
    model = ScriptedModel.from_json(
        {"responses": [{"delay": 0.05, "error": {"code": "timeout", "message": "took too long"}}]}
    )
    with pytest.raises(ModelError) as info:
        model.complete(req(0))
    assert info.value.code == "timeout"


def test_cancel_before_call() -> None:
    model = ScriptedModel.from_json({"responses": [{"content": "x"}]})
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ModelError) as info:
        model.complete(req(0), cancel=cancel)
    assert info.value.code == "aborted"


def test_error_default_message() -> None:
    model = ScriptedModel.from_json({"responses": [{"error": {"code": "connection"}}]})
    with pytest.raises(ModelError) as info:
        model.complete(req(0))
    assert info.value.to_json() == {"code": "connection", "message": "scripted connection error"}


@pytest.mark.parametrize(
    ("script", "where", "says"),
    [
        ([], "at /:", "must be an object"),
        ({}, "at /responses:", "is required"),
        ({"responses": []}, "at /responses:", "non-empty array"),
        ({"responses": [{}], "extra": 1}, "at /extra:", "unknown member"),
        ({"responses": [{"contnet": "x"}]}, "at /responses/0/contnet:", "unknown member"),
        ({"responses": [{"content": 3}]}, "at /responses/0/content:", "must be a string"),
        ({"responses": [{}, {"tool_calls": {}}]}, "at /responses/1/tool_calls:", "array"),
        (
            {"responses": [{"tool_calls": [{"arguments": "{}"}]}]},
            "at /responses/0/tool_calls/0/name:",
            "is required",
        ),
        (
            {"responses": [{"tool_calls": [{"name": ""}]}]},
            "at /responses/0/tool_calls/0/name:",
            "non-empty string",
        ),
        (
            {"responses": [{"tool_calls": [{"name": "a", "arguments": 3}]}]},
            "at /responses/0/tool_calls/0/arguments:",
            "JSON object or a string",
        ),
        (
            {"responses": [{"tool_calls": [{"name": "a", "id": "x"}, {"name": "b", "id": "x"}]}]},
            "at /responses/0/tool_calls/1/id:",
            "duplicate tool call id",
        ),
        (
            {"responses": [{"tool_calls": [{"name": "a", "type": "web"}]}]},
            "at /responses/0/tool_calls/0/type:",
            '"function"',
        ),
        (
            {"responses": [{"tool_calls": [{"name": "a", "function": {"name": "a"}}]}]},
            "at /responses/0/tool_calls/0:",
            "not both",
        ),
        (
            {"responses": [{"finish_reason": "done"}]},
            "at /responses/0/finish_reason:",
            "must be one of",
        ),
        ({"responses": [{"usage": {"input": -1}}]}, "at /responses/0/usage/input:", "between"),
        ({"responses": [{"usage": {"input": 1.0}}]}, "at /responses/0/usage/input:", "integer"),
        (
            {"responses": [{"usage": {"prompt_tokens": 1}}]},
            "at /responses/0/usage/prompt_tokens:",
            "unknown member",
        ),
        ({"responses": [{"delay": -1}]}, "at /responses/0/delay:", "between 0"),
        ({"responses": [{"delay": "1"}]}, "at /responses/0/delay:", "number of seconds"),
        (
            {"responses": [{"error": {"code": "boom"}}]},
            "at /responses/0/error/code:",
            "must be one of",
        ),
        ({"responses": [{"error": {"message": "x"}}]}, "at /responses/0/error/code:", "required"),
        (
            {"responses": [{"error": {"code": "timeout"}, "content": "x"}]},
            "at /responses/0/content:",
            "not allowed together with error",
        ),
        (
            {"responses": [{"error": {"code": "timeout", "message": "a\nb"}}]},
            "at /responses/0/error/message:",
            "single line",
        ),
        ({"model": "", "responses": [{}]}, "at /model:", "non-empty string"),
        ({"responses": [{"content": "\ud800"}]}, "at /responses/0/content:", "surrogate"),
        (
            {"responses": [{"tool_calls": [{"name": "a", "arguments": {"k": "\udc00"}}]}]},
            "at /responses/0/tool_calls/0/arguments/k:",
            "surrogate",
        ),
        (
            {"responses": [{"tool_calls": [{"name": "a/b~c", "x": 1}]}]},
            "at /responses/0/tool_calls/0/x:",
            "unknown member",
        ),
    ],
)
def test_validation_errors(script: Any, where: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScriptedModel.from_json(script, source="demo.json")
    message = str(info.value)
    assert message.startswith("model script demo.json ")
    assert where in message, message
    assert says in message, message
    assert "\n" not in message


def test_pointer_escaping() -> None:
    with pytest.raises(ConfigurationError) as info:
        ScriptedModel.from_json({"responses": [{"a/b~c": 1}]}, source="s")
    assert "/responses/0/a~1b~0c" in str(info.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b'{"responses": [', "not valid JSON"),
        (b'{"responses": [{}], "responses": [{}]}', "duplicate member 'responses'"),
        (b'{"responses": [{"delay": NaN}]}', "NaN is not valid JSON"),
        (b'\xff{"responses": []}', "not valid UTF-8"),
        (b"", "not valid JSON"),
    ],
)
def test_bad_json_text(text: bytes, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScriptedModel.from_json(text, source="f.json")
    assert says in str(info.value)
    assert "f.json" in str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScriptedModel.from_file(tmp_path / "nope.json")
    assert "cannot read model script" in str(info.value)
    assert "nope.json" in str(info.value)
    with pytest.raises(ConfigurationError):
        ScriptedModel.from_file(tmp_path)  # a directory
