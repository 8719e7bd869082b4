"""``tether fork`` and ``tether replay`` (docs/replay.md) on real recorded sessions.

Sessions are recorded by the real agent (the library's ``Agent``, in-process: fast) with a
scripted model or a real HTTP model server on loopback, and tools that count their calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from fakeprovider import FakeProvider, completion, ok
from pgkit import pg_store, pg_url  # noqa: F401 (fixtures)
from tether._cli.fork_cmd import fork_session
from tether._models import OpenAICompatibleModel, ScriptedModel
from tether._runtime import Agent, RunStatus
from tether._stores.lineage import SIDECAR_NAME, read_lineage
from tether._stores.sidecar import FileSidecar, sidecar_path
from tether._tools.decorator import tool
from tether.core import CurrentConfiguration, reduce_session
from tether.core.forks import map_log
from tether.core.plans import StartTool, ToolMode
from tether.core.replay import _blind, crash_points, replay_log
from tether.core.state import Replay, RunOperation
from tether.errors import ConfigurationError
from tether.testing.replay import assert_replays, replay_cases, replay_session

SCHEMAS = Path(__file__).resolve().parent / "conformance" / "schemas"

CALLS: dict[str, int] = {}


@tool(name="note")
def note(text: str) -> str:
    """Append a line to notes.txt (a side effect: never replayed)."""
    CALLS["note"] = CALLS.get("note", 0) + 1
    with open(NOTES[0], "a", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return "noted"


@tool(name="lookup", replay=Replay.SAFE, replay_key="test:lookup:v1")
def lookup(key: str) -> str:
    """Look a key up (read-only)."""
    CALLS["lookup"] = CALLS.get("lookup", 0) + 1
    return f"value of {key}"


@tool(name="remember")
def remember(text: str) -> str:
    """Append a line to notes.txt (a side effect: never replayed)."""
    raise AssertionError("replay ran a tool")


NOTES: list[Path] = [Path("/nonexistent")]

TURN_1 = [
    {"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}}]},
    {"tool_calls": [{"name": "note", "arguments": {"text": "one"}}]},
    {"content": "turn one done"},
]
TURN_2 = [
    {"tool_calls": [{"name": "note", "arguments": {"text": "two"}}]},
    {"content": "turn two done"},
]


def scripted(responses: list[dict[str, Any]]) -> ScriptedModel:
    return ScriptedModel.from_json({"model": "scripted/replay", "responses": responses})


def agent(workspace: Path, responses: list[dict[str, Any]], **options: Any) -> Agent:
    tools = options.pop("tools", [note, lookup])
    return Agent(scripted(responses), tools, workspace=workspace, sandbox="off", **options)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    NOTES[0] = ws / "notes.txt"
    CALLS.clear()
    return ws


@pytest.fixture
def recorded(workspace: Path) -> Path:
    """A two-turn session: lookup + note + answer, then note + answer."""
    with agent(workspace, TURN_1 + TURN_2) as a:
        first = a.run("turn one")
        assert first.status is RunStatus.COMPLETED
        second = a.run("turn two", session=first.session_id)
        assert second.status is RunStatus.COMPLETED
    assert CALLS == {"lookup": 1, "note": 2}
    return second.session_path


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def first_ids(path: Path) -> list[str]:
    """The id of each line's first fact, by line number ('' for the header)."""
    out = ["", ""]
    for raw in lines_of(path)[1:]:
        value = json.loads(raw)
        out.append((value if isinstance(value, list) else [value])[0]["id"])
    return out


def line_with(path: Path, kind: str, name: str | None = None, nth: int = 0) -> int:
    """The line number of the ``nth`` transaction holding a ``kind`` record (of ``name``)."""
    found = []
    for number, raw in enumerate(lines_of(path)[1:], start=2):
        value = json.loads(raw)
        for fact in value if isinstance(value, list) else [value]:
            record = fact.get("record")
            if record is not None and record["type"] == kind:
                if name is None or record.get("toolName") == name:
                    found.append(number)
                    break
    return found[nth]


def validator() -> tuple[Draft202012Validator, Draft202012Validator]:
    schema = json.loads((SCHEMAS / "session.schema.json").read_bytes())
    registry: Registry[Any] = Registry().with_resource(
        schema.get("$id", "session.schema.json"), Resource.from_contents(schema, DRAFT202012)
    )
    base = schema.get("$id", "session.schema.json")
    defs = schema.get("$defs", {})
    header_name = next(n for n in defs if "header" in n.lower())
    tx_name = next(n for n in defs if "transaction" in n.lower())
    header = Draft202012Validator({"$ref": f"{base}#/$defs/{header_name}"}, registry=registry)
    transaction = Draft202012Validator({"$ref": f"{base}#/$defs/{tx_name}"}, registry=registry)
    return header, transaction


# --------------------------------------------------------------------------- fork


def test_a_fork_is_a_settled_prefix_that_both_reducers_accept(recorded: Path) -> None:
    original = recorded.read_bytes()
    log = map_log(original)
    assert log.turns == 2
    lineage = fork_session(recorded, original, at=None, turn=1)
    assert recorded.read_bytes() == original  # the original is never modified
    fork = next(p for p in recorded.parent.glob("*.jsonl") if lineage.session_id in p.name)
    data = fork.read_bytes()
    cut = log.turn_end(1)
    # The original's transactions through the end of turn 1, byte for byte.
    assert data.split(b"\n", 1)[1] == original[log.marks[0].end : cut.end]
    state = reduce_session(data)
    assert state.header.id == lineage.session_id
    assert state.last_finished is not None and state.last_finished.outcome == "completed"
    assert [m["content"] for m in state.transcript if m["role"] == "user"] == ["turn one"]
    # The reference rules: every line validates against the format's published schema.
    header, transaction = validator()
    raw_lines = lines_of(fork)
    header.validate(json.loads(raw_lines[0]))
    for raw in raw_lines[1:]:
        transaction.validate(json.loads(raw))
    record = read_lineage(FileSidecar(sidecar_path(fork.parent, lineage.session_id, SIDECAR_NAME)))
    assert record == lineage
    assert record.fork_of == reduce_session(original).header.id and record.turn == 1


def test_a_cut_inside_an_attempt_or_a_tool_call_is_refused_with_the_nearest_points(
    recorded: Path,
) -> None:
    data = recorded.read_bytes()
    ids = first_ids(recorded)
    for line in (line_with(recorded, "stepAttempt"), line_with(recorded, "toolStarted", "note")):
        with pytest.raises(ConfigurationError) as caught:
            fork_session(recorded, data, at=ids[line], turn=None)
        message = str(caught.value)
        assert "\n" not in message and "nearest valid points" in message
        assert f"line {line - 1} " in message and f"line {line + 1} " in message
    with pytest.raises(ConfigurationError, match="has 2 finished turns"):
        fork_session(recorded, data, at=None, turn=3)
    assert len(list(recorded.parent.glob("*.jsonl"))) == 1  # nothing was created


def test_turn_zero_is_the_header_alone(recorded: Path) -> None:
    lineage = fork_session(recorded, recorded.read_bytes(), at=None, turn=0)
    assert lineage.turn == 0 and lineage.cut_after_line == 1
    fork = next(p for p in recorded.parent.glob("*.jsonl") if lineage.session_id in p.name)
    assert len(lines_of(fork)) == 1 and reduce_session(fork.read_bytes()).transcript == []


def test_resume_of_a_fork_never_runs_an_effect_recorded_before_the_cut(
    workspace: Path, recorded: Path
) -> None:
    # Cut inside turn 1, after the note's result: settled, the run still open.
    ids = first_ids(recorded)
    after_note = line_with(recorded, "toolStarted", "note") + 1
    lineage = fork_session(recorded, recorded.read_bytes(), at=ids[after_note], turn=None)
    assert lineage.turn is None
    before = dict(CALLS)
    notes = (workspace / "notes.txt").read_text()
    # The script continues where the fork's log ends: attempt 3 answers turn one.
    with agent(workspace, TURN_1 + TURN_2) as a:
        result = a.resume(lineage.session_id)
    assert result.status is RunStatus.COMPLETED and result.text == "turn one done"
    assert CALLS == before  # neither lookup nor note ran again
    assert (workspace / "notes.txt").read_text() == notes


# --------------------------------------------------------------------------- replay


def test_a_recorded_session_replays_without_divergence_and_runs_nothing(
    workspace: Path, recorded: Path
) -> None:
    before = dict(CALLS)
    with agent(workspace, TURN_1 + TURN_2) as a:
        report = assert_replays(recorded, a, crash_points_too=True)
    assert report.decisions >= 9 and report.first is None
    assert CALLS == before
    # The pytest helper: a directory of logs becomes one case per log.
    cases = replay_cases(recorded.parent)
    assert [case.values[0] for case in cases] == [recorded]


def test_a_changed_system_prompt_diverges_at_the_first_model_attempt(
    workspace: Path, recorded: Path
) -> None:
    (workspace / "AGENTS.md").write_text("Always answer in French.\n")
    with agent(workspace, TURN_1 + TURN_2) as a:
        report = replay_session(recorded, a)
    first = report.first
    assert first is not None and first.line == line_with(recorded, "stepAttempt")
    assert first.what == "configuration" and "system prompt" in first.detail
    assert "diverges at line" in first.text()


def test_a_renamed_tool_diverges_at_its_first_call(workspace: Path, recorded: Path) -> None:
    with agent(workspace, TURN_1 + TURN_2, tools=[remember, lookup]) as a:
        report = replay_session(recorded, a)
    config = [d for d in report.divergences if d.what == "configuration"]
    assert config and config[0].line == line_with(recorded, "stepAttempt")
    assert "removed note" in config[0].detail and "added remember" in config[0].detail
    calls = [d for d in report.divergences if d.what == "tool"]
    assert calls and calls[0].line == line_with(recorded, "toolStarted", "note")
    assert "'note'" in calls[0].detail and "renamed or removed" in calls[0].detail


def test_a_changed_policy_rule_diverges_at_the_gate(workspace: Path, recorded: Path) -> None:
    (workspace / "tether.toml").write_text('[policy.tools]\nnote = "deny"\n')
    with agent(workspace, TURN_1 + TURN_2) as a:
        report = replay_session(recorded, a)
    gates = [d for d in report.divergences if d.what == "gate"]
    assert gates and gates[0].line == line_with(recorded, "toolStarted", "note")
    assert "now denied by tether.toml [policy.tools] note" in gates[0].detail
    assert [d for d in report.divergences if d.what != "gate"] == []


def test_changed_arguments_are_named(workspace: Path, recorded: Path) -> None:
    # The log's own record of the call is edited: the model asked for "one", the log says
    # the runtime started the tool with "uno" (a decision the planner does not take).
    data = recorded.read_bytes().replace(
        b'"arguments":{"text":"one"}', b'"arguments":{"text":"uno"}'
    )
    with agent(workspace, TURN_1 + TURN_2) as a:
        configuration = a.configuration
        report = replay_log(
            data, configuration.current, configuration.snapshot, a.parts.project.policy
        )
    first = report.first
    assert first is not None and first.what == "argument" and "text" in first.detail
    assert first.line == line_with(recorded, "toolStarted", "note")


def test_crash_points_never_plan_a_blind_rerun(workspace: Path, recorded: Path) -> None:
    data = recorded.read_bytes()
    with agent(workspace, TURN_1 + TURN_2) as a:
        current = a.configuration.current
    checked, _plans, bad = crash_points(data, current)
    assert checked == len(lines_of(recorded)) and bad == []
    # The check itself: a replay of a never-replay call is a blind re-run.
    started = line_with(recorded, "toolStarted", "note")
    _n, plans, _ = crash_points(data, current, only=started)
    assert plans[0]["type"] == "appendSynthetic"  # interrupted, never re-run
    prefix = b"\n".join(lines_of(recorded)[:started]) + b"\n"
    state = reduce_session(prefix)
    assert isinstance(state.operation, RunOperation)
    call = state.operation.tool_calls[-1]
    blind = StartTool(
        ToolMode.REPLAY,
        call.assistant_entry_id,
        call.tool_index,
        call.tool_name,
        call.arguments,
        call.tool_started_id,
    )
    assert "not declared safe" in (_blind(blind, state) or "")


# --------------------------------------------------------------------------- no traffic


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


def test_replay_sends_nothing_and_runs_no_tool(workspace: Path, fake: FakeProvider) -> None:
    fake.enqueue(
        ok(completion("", tool_calls=[{"id": "c1", "name": "note", "arguments": {"text": "x"}}])),
        ok(completion("done")),
    )
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, api_key="k", timeout=5)
    with Agent(model, [note, lookup], workspace=workspace, sandbox="off") as a:
        result = a.run("go")
    assert result.status is RunStatus.COMPLETED and len(fake.requests) == 2

    @tool(name="note")
    def exploding(text: str) -> str:
        """Append a line to notes.txt (a side effect: never replayed)."""
        raise AssertionError("replay ran a tool")

    exploding_note = exploding
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, api_key="k", timeout=5)
    with Agent(model, [exploding_note, lookup], workspace=workspace, sandbox="off") as a:
        report = replay_session(result.session_path, a)
    assert len(fake.requests) == 2  # the loopback server saw no request
    assert report.decisions >= 3
    assert all(d.what == "configuration" for d in report.divergences)  # only the tool's body


def test_current_configuration_is_only_read(recorded: Path) -> None:
    # A hand-made current: the planner's input, no agent at all.
    data = recorded.read_bytes()
    current = CurrentConfiguration("sha256:" + "0" * 64, "nowhere", ())
    report = replay_log(data, current, _snapshot_of(data))
    tools = [d for d in report.divergences if d.what == "tool"]
    assert tools and "renamed or removed" in tools[0].detail


def _snapshot_of(data: bytes) -> dict[str, Any]:
    for raw in data.split(b"\n")[1:]:
        value = json.loads(raw)
        for fact in value if isinstance(value, list) else [value]:
            record = fact.get("record")
            if record is not None and record["type"] == "stepAttempt":
                snapshot: dict[str, Any] = record["configurationSnapshot"]
                return snapshot
    raise AssertionError("no stepAttempt")


# --------------------------------------------------------------------------- crash lab


def test_a_crash_lab_session_replays_without_divergence(tmp_path: Path) -> None:
    """A real crash-lab run (multi-call: bash, read, write, bash, edit) killed with SIGKILL
    after an effect, then resumed, replays with no divergence and no blind re-run."""
    from tether.testing.crashlab.child import (
        WORKSPACE,
        _agent,
        _Instruments,
        prepare_run_dir,
        session_log_path,
    )
    from tether.testing.crashlab.matrix import SpawnRunner
    from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS

    scenario = BUILTIN_SCENARIOS["multi-call"]
    run_dir = tmp_path / "run"
    prepare_run_dir(run_dir, scenario, "durable")
    spawn = SpawnRunner()
    crashed = spawn.run(
        ["multi-call", str(run_dir), "run"],
        env={"TETHER_CRASH_AT": "after_effect@2", "TETHER_CRASH_MODE": "kill"},
        out=run_dir / "out" / "r",
        timeout=60,
    )
    assert crashed.returncode == -9, (crashed.returncode, crashed.stderr)  # SIGKILL
    resumed = spawn.run(
        ["multi-call", str(run_dir), "resume"], env={}, out=run_dir / "out" / "s", timeout=60
    )
    assert resumed.returncode == 0, resumed.stderr
    log = session_log_path(run_dir / WORKSPACE)
    assert log is not None
    lab_agent = _agent(scenario, run_dir, "durable", _Instruments(run_dir))
    try:
        report = assert_replays(log, lab_agent, crash_points_too=True)
    finally:
        lab_agent.close()
    assert report.decisions >= 10


# --------------------------------------------------------------------------- the commands


def test_the_commands(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tether fork`` and ``tether replay`` as a user runs them (in-process CliRunner)."""
    from typer.testing import CliRunner

    from tether._cli import app

    monkeypatch.chdir(workspace)
    (workspace / "README.md").write_text("hello\n")
    script = {
        "model": "scripted/cli",
        "responses": [
            {"tool_calls": [{"name": "read", "arguments": {"path": "README.md"}}]},
            {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "1"}}]},
            {"content": "done"},
        ],
    }
    (workspace / "script.json").write_text(json.dumps(script))
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, list(args), catch_exceptions=False)

    run = cli("run", "go", "--model", "scripted:script.json", "--sandbox", "off")
    assert run.exit_code == 0, run.output
    (log,) = (workspace / ".tether" / "sessions").glob("*.jsonl")
    session = log.stem.split("_", 1)[1]

    same = cli("replay", session, "--sandbox", "off")
    assert same.exit_code == 0 and "no divergence" in same.output, same.output

    (workspace / "AGENTS.md").write_text("Be terse.\n")
    changed = cli("replay", session, "--sandbox", "off")
    assert changed.exit_code == 1, changed.output
    assert "diverges at line 3" in changed.output and "system prompt" in changed.output
    (workspace / "AGENTS.md").unlink()

    other = workspace / "candidate"
    other.mkdir()
    (other / "tether.toml").write_text('[policy.tools]\nwrite = "deny"\n')
    against = cli("replay", session, "--sandbox", "off", "--against", str(other / "tether.toml"))
    assert against.exit_code == 1 and "gate" in against.output, against.output
    assert "now denied by tether.toml [policy.tools] write" in against.output

    crash = cli("replay", session, "--sandbox", "off", "--crash-points", "--json")
    assert crash.exit_code == 0 and json.loads(crash.output)["ok"] is True, crash.output

    refused = cli("fork", session, "--at", first_ids(log)[3])
    assert refused.exit_code == 2 and "nearest valid points" in refused.output

    forked = cli("fork", session, "--turn", "1", "--json")
    assert forked.exit_code == 0, forked.output
    lineage = json.loads(forked.output)
    assert lineage["forkOf"] == session and lineage["turn"] == 1
    shown = cli("inspect", lineage["sessionId"])
    assert shown.exit_code == 0 and f"forked from {session} after turn 1" in shown.output


def test_a_corrupt_decision_line_is_the_formats_error(workspace: Path, recorded: Path) -> None:
    from tether.errors import SessionCorruption

    lines = lines_of(recorded)
    step = line_with(recorded, "stepAttempt")
    for bad in (b'{"kind":"record","record":{"type":"stepAttempt"}}', b'{"stepAttempt": '):
        broken = b"\n".join([*lines[: step - 1], bad, *lines[step:]]) + b"\n"
        with agent(workspace, TURN_1) as a:
            configuration = a.configuration
        with pytest.raises(SessionCorruption) as caught:
            replay_log(broken, configuration.current, configuration.snapshot)
        assert caught.value.line == step


# --------------------------------------------------------------------------- PostgreSQL


def test_fork_on_the_postgresql_store(recorded: Path, pg_store: str) -> None:  # noqa: F811
    """``tether fork --store URL``: the fork is a session of the same store."""
    from typer.testing import CliRunner

    from tether._cli import app
    from tether._stores.postgres import PostgresSessions, PostgresSidecar

    original = recorded.read_bytes()
    with PostgresSessions(pg_store) as sessions:
        session = sessions.import_log(original)
    result = CliRunner().invoke(
        app, ["fork", session, "--store", pg_store, "--turn", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    lineage = json.loads(result.output)
    assert lineage["forkOf"] == session and lineage["turn"] == 1
    with PostgresSessions(pg_store) as sessions:
        data = sessions.log_bytes(lineage["sessionId"])
        assert sessions.log_bytes(session) == original  # the original is unchanged
        record = read_lineage(PostgresSidecar(sessions, lineage["sessionId"], SIDECAR_NAME))
    cut = map_log(original).turn_end(1)
    assert data.split(b"\n", 1)[1] == original[map_log(original).marks[0].end : cut.end]
    assert reduce_session(data).header.id == lineage["sessionId"]
    assert record is not None and not isinstance(record, str) and record.fork_of == session


def test_fork_and_rewind_number_turns_alike_through_a_retry(workspace: Path) -> None:
    """A retried prompt stays one turn for both (core.turns is the one numbering): its end
    is the retry's finish, and what rewind calls "after turn 1" is what a fork at turn 1
    leaves out."""
    from tether.core.framing import committed_lines
    from tether.core.turns import tool_calls_after, turn_count

    failing = {"error": {"code": "authentication", "message": "no"}}
    with agent(workspace, [failing, *TURN_1, *TURN_2]) as a:
        first = a.run("turn one")
        assert first.status is RunStatus.FAILED
        assert a.retry(first.session_id).status is RunStatus.COMPLETED
        assert a.run("turn two", session=first.session_id).status is RunStatus.COMPLETED
        log = first.session_path.read_bytes()
    lines, _ = committed_lines(log)
    next(lines)
    facts: list[dict[str, Any]] = []
    for raw in lines:
        value = json.loads(raw)
        facts.extend(value if isinstance(value, list) else [value])
    mapped = map_log(log)
    assert turn_count(facts) == mapped.turns == 2
    cut = mapped.turn_end(1)
    kept = {i for mark in mapped.marks[: cut.line] for i in mark.fact_ids}
    after = tool_calls_after(facts, 1)
    assert after and all(call.operation_id not in kept for call in after)
    assert all(call.turn == 2 for call in after)
    # The retry's run finished inside the cut: nothing of turn 1 is after it.
    assert not [c for c in tool_calls_after(facts, 0) if c.turn == 1 and c.operation_id not in kept]
