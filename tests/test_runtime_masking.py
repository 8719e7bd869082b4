"""The agent's masking layer, in process: log, events and tool arguments; the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether._credentials import MASK, Masker
from tether._models import ScriptedModel
from tether._runtime import Agent, RunStatus
from tether._runtime import events as ev
from tether._runtime.masking import mask_commits, masked_sink
from tether._stores.file import SessionStore
from tether.core import reduce_session
from tether.errors import ConfigurationError

SECRET = "in-process-Secret-4Kq9Zr"


def scripted(*responses: dict[str, Any]) -> ScriptedModel:
    return ScriptedModel.from_json({"model": "scripted/masking", "responses": list(responses)})


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    root = tmp_path / "ws"
    root.mkdir()
    return root


def test_log_events_and_tool_arguments_are_masked(workspace: Path) -> None:
    seen: list[ev.Event] = []
    model = scripted(
        {
            "content": f"I know {SECRET}.",
            "tool_calls": [
                {"id": "c1", "name": "write", "arguments": {"path": "k.txt", "content": SECRET}},
                {"id": f"c-{SECRET}", "name": "nosuch", "arguments": {}},
            ],
        },
        {"content": f"Wrote {SECRET}."},
    )
    agent = Agent(model, workspace=workspace, secrets=[SECRET], on_event=seen.append)
    result = agent.run(f"remember {SECRET}")
    assert result.status is RunStatus.COMPLETED
    data = result.session_path.read_bytes()
    assert SECRET.encode() not in data
    state = reduce_session(data)  # still a valid log: references stay consistent
    assert state.transcript[0]["content"] == f"remember {MASK}"
    assert result.text == f"Wrote {MASK}."
    assert (workspace / "k.txt").read_text() == MASK  # the call ran with what was recorded
    texts = json.dumps([event.to_dict() for event in seen])
    assert SECRET not in texts and f"I know {MASK}." in texts
    assert any(isinstance(e, ev.ToolSkipped) and e.call_id == f"c-{MASK}" for e in seen)


def test_short_secrets_are_not_masked(workspace: Path) -> None:
    agent = Agent(scripted({"content": "the word pass"}), workspace=workspace, secrets=["pass"])
    assert agent.masker.text("pass") == "pass"
    result = agent.run("say pass")
    assert result.text == "the word pass"
    assert b"the word pass" in result.session_path.read_bytes()


def test_a_secret_in_the_recorded_configuration_is_refused(workspace: Path) -> None:
    model = ScriptedModel.from_json(
        {"model": f"scripted/{SECRET}", "responses": [{"content": "x"}]}
    )
    with pytest.raises(ConfigurationError) as info:
        Agent(model, workspace=workspace, secrets=[SECRET])
    assert SECRET not in str(info.value) and "configuration" in str(info.value)


def test_a_secret_in_the_prompt_is_not_recorded(workspace: Path) -> None:
    """The system prompt (and AGENTS.md) is recorded only as a digest; the model gets it."""
    (workspace / "AGENTS.md").write_text(f"Use {SECRET} for the API.\n")
    agent = Agent(scripted({"content": "ok"}), workspace=workspace, secrets=[SECRET])
    result = agent.run("go")
    assert result.status is RunStatus.COMPLETED
    assert SECRET.encode() not in result.session_path.read_bytes()


def test_without_secrets_nothing_is_wrapped(workspace: Path) -> None:
    def sink(event: ev.Event) -> None:
        pass

    assert masked_sink(sink, Masker()) is sink
    assert masked_sink(None, Masker((SECRET,))) is None
    with SessionStore.create(workspace, provider="p", model="m", environment_identity="e") as store:
        assert "commit" not in vars(mask_commits(store, Masker()))
        assert "commit" in vars(mask_commits(store, Masker((SECRET,))))


def test_masked_event_keeps_identity_when_clean() -> None:
    event = ev.CompletionChecked(status="ok", message=f"m {SECRET}", changed_files=(SECRET, "a"))
    masked = ev.masked(event, Masker((SECRET,)).text)
    assert masked.message == f"m {MASK}" and masked.changed_files == (MASK, "a")
    clean = ev.ToolStarted(name="bash", call_id="c1")
    assert ev.masked(clean, Masker((SECRET,)).text) is clean
