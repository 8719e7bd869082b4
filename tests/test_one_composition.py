"""One way to build an agent: the settings table, its precedence, the flags generated from
it, and one configuration digest whichever entry point drives a session.

The entry points run as real processes (``python -m tether``); the shared-store cases run
against the real PostgreSQL server of ``tests/pgkit.py`` and crash the first process with a
real ``SIGKILL`` at a named boundary (``TETHER_CRASH_AT``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st

from pgkit import pg_store, pg_url  # noqa: F401 (fixtures)
from tether._cli import app
from tether._project import parse_project_config
from tether._runtime.agent import AgentOptions
from tether._settings import SETTINGS, Kind, Settings, resolve_settings
from tether.core.reducer import Reducer

AGENT_COMMANDS = ("run", "resume", "retry", "repl", "submit", "worker", "plan", "replay")

SCRIPT = {
    "model": "scripted/one",
    "responses": [
        {
            "content": "Counting.",
            "tool_calls": [
                {"id": "c1", "name": "bash", "arguments": {"command": "echo x >> count.txt"}}
            ],
        },
        {"content": "Done.", "finish_reason": "stop"},
    ],
}

TOML = """\
[model]
model = "scripted:script.json"
temperature = 0.2
max_tokens = 300

[verify]
command = "true"
"""


# --------------------------------------------------------------------------- the table


def test_the_table_and_the_settings_value_name_the_same_settings() -> None:
    names = [row.name for row in SETTINGS]
    assert names == [f.name for f in fields(Settings)]
    flags = [row.flag for row in SETTINGS] + [row.short for row in SETTINGS if row.short]
    assert len(flags) == len(set(flags)), "two settings share a flag"
    assert all(row.help.strip() for row in SETTINGS)
    # Every setting is an option of the library's Agent too.
    assert set(names) - {"model"} <= set(AgentOptions.__annotations__)  # model: positional
    # What enters the digest: what shapes a model request, and nothing that does not.
    digest = {row.name for row in SETTINGS if row.digest}
    # The sandbox's rows enter it through the definitions of the tools that run commands.
    # (deny_read hides more or less, and which of its paths exist differs between machines.)
    sandbox = {"sandbox", "sandbox_network", "writable_roots"}
    assert digest == {"model", "base_url", "model_options", "system_prompt", *sandbox}
    assert not any(row.remembered for row in SETTINGS if row.name == "api_key")
    # Every "[table] key" names an attribute of the parsed tether.toml.
    for row in SETTINGS:
        row.toml_value(PROJECT)


@pytest.mark.parametrize("command", AGENT_COMMANDS)
def test_every_agent_command_has_every_setting(command: str) -> None:
    click_app: Any = typer.main.get_command(app)
    params = click_app.commands[command].params
    opts = {opt for param in params for opt in param.opts}
    missing = [row.flag for row in SETTINGS if row.flag not in opts]
    assert missing == [], f"tether {command} lacks {missing}"


PROJECT = parse_project_config(
    '[model]\nmodel = "toml/model"\ntimeout = 7\n'
    '[budget]\nmax_steps = 9\n[store]\nlease_seconds = 4\n[verify]\ncommand = "true"\n'
)


def test_precedence_is_flag_then_environment_then_toml_then_default() -> None:
    def resolve(flags: dict[str, Any], env: dict[str, str]) -> Settings:
        return resolve_settings(flags, environ=env, project=PROJECT)

    assert resolve({}, {}).model == "toml/model"
    assert resolve({}, {"TETHER_MODEL": "env/model"}).model == "env/model"
    assert resolve({"model": "flag/model"}, {"TETHER_MODEL": "env/model"}).model == "flag/model"
    assert resolve({}, {"TETHER_MODEL": "  "}).model == "toml/model"  # blank is unset
    assert resolve({}, {}).timeout == 7 and resolve({"timeout": 3.0}, {}).timeout == 3.0
    assert resolve({}, {}).max_steps == 9 and resolve({}, {}).max_tokens is None
    assert resolve({}, {}).lease_seconds == 4
    assert resolve({}, {"TETHER_LEASE_SECONDS": "2.5"}).lease_seconds == 2.5
    assert resolve({}, {}).durability.value == "durable"
    assert resolve({"durability": "process"}, {}).durability.value == "process"
    bare = resolve_settings({}, environ={}, project=None)
    assert bare == Settings()


def test_bad_values_and_unknown_names_are_one_line_errors() -> None:
    from tether.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="TETHER_LEASE_SECONDS must be a positive"):
        resolve_settings({}, environ={"TETHER_LEASE_SECONDS": "soon"}, project=None)
    with pytest.raises(ConfigurationError, match="unknown setting 'modle'"):
        resolve_settings({"modle": "x"}, environ={}, project=None)


_TEXT = st.text(alphabet="abcxyz/:-", min_size=1, max_size=8)


@given(flag=st.none() | _TEXT, env=st.none() | _TEXT, toml=st.none() | _TEXT)
def test_the_first_source_given_wins(flag: str | None, env: str | None, toml: str | None) -> None:
    project = parse_project_config("" if toml is None else f"[model]\nmodel = {json.dumps(toml)}\n")
    environ = {} if env is None else {"TETHER_MODEL": env}
    got = resolve_settings({"model": flag}, environ=environ, project=project).model
    assert got == next((v for v in (flag, env, toml) if v is not None), None)


def test_text_settings_read_environment_values_as_text() -> None:
    rows = [row for row in SETTINGS if row.env and row.kind is Kind.TEXT]
    environ = {row.env: f" value-of-{row.name} " for row in rows if row.env}
    settings = resolve_settings({}, environ=environ, project=None)
    for row in rows:
        assert getattr(settings, row.name) == f"value-of-{row.name}"


# --------------------------------------------------------------------------- entry points


def tether(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    scrubbed = ("TETHER_MODEL", "TETHER_STORE_URL", "TETHER_CRASH_AT", "TETHER_BASE_URL")
    full = {k: v for k, v in os.environ.items() if k not in scrubbed}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=full,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "tether.toml").write_text(TOML)
    (workspace / "script.json").write_text(json.dumps(SCRIPT))
    (workspace / "AGENTS.md").write_text("Count carefully.\n")
    return workspace


def attempt_digests(log: bytes) -> list[str]:
    digests = []
    for line in log.splitlines():
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:  # a line is a transaction
            record = fact.get("record", {})
            if record.get("type") == "stepAttempt":
                digests.append(record["configurationDigest"])
    return digests


def session_logs(ws: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in (ws / ".tether" / "sessions").glob("*.jsonl")}


def library_digest(ws: Path) -> str:
    code = (
        "import sys; from tether import Agent\n"
        f"agent = Agent(workspace={str(ws)!r})\n"
        "print(agent.configuration.digest)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ws, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_every_entry_point_yields_one_configuration_digest(ws: Path) -> None:
    """run, the REPL (piped), retry, resume, plan and the library Agent: the same workspace and
    the same inputs give one digest, with the model named only in [model]."""
    ran = tether("run", "count", "--yes", cwd=ws)
    assert ran.returncode == 0, ran.stderr
    repl = tether("repl", "--yes", cwd=ws, stdin="count\n/exit\n")
    assert repl.returncode == 0, repl.stderr
    # A run killed with its model attempt open, resumed: attempt 2 is under the same digest
    # (the reducer refuses a second attempt under another).
    killed = tether("run", "count", "--yes", cwd=ws, env={"TETHER_CRASH_AT": "attempt_recorded"})
    assert killed.returncode == -9
    logs = session_logs(ws)
    assert len(logs) == 3
    [crashed] = [sid for sid, log in logs.items() if b"operationFinished" not in log]
    resumed = tether("resume", crashed, "--yes", cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    digests = {d for log in session_logs(ws).values() for d in attempt_digests(log)}
    assert len(digests) == 1, digests
    [digest] = digests
    assert library_digest(ws) == digest
    planned = tether("plan", crashed, "--json", cwd=ws)
    assert planned.returncode == 0, planned.stderr
    # A flag that shapes the request changes it, the same way in every command.
    other = tether("plan", crashed, "--json", "--model-option", "temperature=0.9", cwd=ws)
    assert other.returncode == 0, other.stderr


@pytest.mark.parametrize("boundary", ["before_effect", "attempt_recorded"])
@pytest.mark.parametrize("finisher", ["worker", "resume"])
def test_a_killed_shared_store_session_is_finished_under_one_digest(
    pg_store: str,  # noqa: F811
    ws: Path,
    boundary: str,
    finisher: str,
) -> None:
    """The issue's acceptance: started by `tether run --store`, killed during a tool call or
    with a model attempt open, finished by `tether worker` or `tether resume` alike, with one
    configuration digest on every attempt and the [model] options kept; the model is named
    only in [model]."""
    store = ["--store", pg_store, "--lease-seconds", "1"]
    killed = tether("run", "count", "--yes", *store, cwd=ws, env={"TETHER_CRASH_AT": boundary})
    assert killed.returncode == -9, killed.stderr
    [row] = json.loads(tether("sessions", *store[:2], "--json", cwd=ws).stdout)
    session = row["id"]
    if finisher == "worker":
        done = tether("worker", *store, "--yes", "--until-empty", cwd=ws)
    else:
        # The killed process's lease (1 s, on the database's clock) must run out first.
        deadline = time.monotonic() + 30
        while (done := tether("resume", session, *store, "--yes", cwd=ws)).returncode == 4:
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.3)
    assert done.returncode == 0, done.stderr
    log = tether("export", session, *store[:2], cwd=ws).stdout.encode()
    state = Reducer.load(log).state
    assert state.transcript[-1]["content"] == "Done."
    digests = attempt_digests(log)
    assert len(digests) >= 2 and len(set(digests)) == 1, digests
    assert library_digest(ws) == digests[0]


def test_submit_and_worker_take_the_model_from_tether_toml(
    pg_store: str,  # noqa: F811
    ws: Path,
) -> None:
    store = ["--store", pg_store]
    submitted = tether("submit", "count", *store, cwd=ws)
    assert submitted.returncode == 0, submitted.stderr
    session = submitted.stdout.strip()
    worked = tether("worker", *store, "--yes", "--until-empty", cwd=ws)
    assert worked.returncode == 0, worked.stderr
    log = tether("export", session, *store, cwd=ws).stdout.encode()
    assert Reducer.load(log).state.transcript[-1]["content"] == "Done."
    assert set(attempt_digests(log)) == {library_digest(ws)}


@pytest.mark.parametrize("boundary", ["before_effect", "attempt_recorded"])
def test_a_killed_file_store_session_is_resumed_under_one_digest(ws: Path, boundary: str) -> None:
    killed = tether("run", "count", "--yes", cwd=ws, env={"TETHER_CRASH_AT": boundary})
    assert killed.returncode == -9
    [session] = session_logs(ws)
    resumed = tether("resume", session, "--yes", cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    log = session_logs(ws)[session]
    assert Reducer.load(log).state.transcript[-1]["content"] == "Done."
    assert set(attempt_digests(log)) == {library_digest(ws)}


def test_docs_cli_lists_the_settings_table_as_the_code_has_it() -> None:
    """docs/cli.md's "Common flags" table: one row per setting, with its variable, its
    tether.toml key and its digest and remembered columns as the code declares them."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = text.split("### Common flags: the settings table", 1)[1].split("\n\n`run`", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    assert len(rows) == len(SETTINGS)
    for row, line in zip(SETTINGS, rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0].startswith(f"`{row.flag}"), (row.name, cells[0])
        if row.env:
            assert cells[1] == f"`{row.env}`", (row.name, cells[1])
        if row.toml:
            assert cells[2] == f"`{row.toml}`", (row.name, cells[2])
        assert cells[4] == ("yes" if row.digest else "no"), row.name
        assert cells[5] in (("yes",) if row.remembered else ("no", "never")), row.name


@pytest.mark.parametrize(
    "command", [("resume", "0badc0de"), ("run", "hi", "--session", "0badc0de")]
)
def test_a_mistyped_session_is_no_such_session_not_no_model(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Issue 32, item 4: without --model, a mistyped id used to say "no model given"."""
    (tmp_path / ".tether" / "sessions").mkdir(parents=True)
    result = tether(*command, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: no session '0badc0de'"), result.stderr
    assert "model" not in result.stderr


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("scriptd:/tmp/x.json", "unknown model prefix 'scriptd:' in 'scriptd:/tmp/x.json': did "
         "you mean 'scripted:'?"),
        ("antropic:claude", "did you mean 'anthropic:'?"),
        ("anthropic:", "no model given after anthropic: (e.g. --model anthropic:claude-"),
    ],
)  # fmt: skip
def test_a_mistyped_model_prefix_is_named_not_sent_to_the_default_endpoint(
    tmp_path: Path, model: str, said: str
) -> None:
    """Issue 32, item 5: a typo in the prefix went to OpenRouter ("no API key for …")."""
    result = tether("run", "hi", "--model", model, cwd=tmp_path, env={"TETHER_API_KEY": "k" * 24})
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and "openrouter" not in result.stderr, result.stderr


def test_a_colon_in_a_model_id_is_still_a_model_id() -> None:
    from tether._models import _refuse_misspelt_prefix

    for spec in ("llama3:8b", "meta-llama/llama-3-8b-instruct:free", "qwen2.5:7b", "gpt-4o"):
        _refuse_misspelt_prefix(spec)  # no error


def test_last_without_sessions_is_not_read_as_a_session_id(tmp_path: Path) -> None:
    """Issue 32, item 11: --last with a missing sessions folder said "no session '--last'"."""
    result = tether("resume", "--last", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("error: --last: no session in "), result.stderr
    assert "(no such folder yet)" in result.stderr and "'--last'" not in result.stderr


def test_a_blank_flag_is_not_given() -> None:
    """`--model ''` falls through to the variable, as a blank variable falls through."""
    settings = resolve_settings(
        {"model": "  ", "base_url": ""}, environ={"TETHER_MODEL": "env/model"}, project=PROJECT
    )
    assert settings.model == "env/model" and settings.base_url is None
