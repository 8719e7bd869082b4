"""Credentials stay out of everything tether writes, prints and hands to its commands.

Every case runs ``python -m tether`` as a real process against the loopback fake provider
(:mod:`fakeprovider`). The fake model misbehaves on purpose: its first answer runs ``bash``
commands that dump their own environment and the parent's (tether's) ``/proc/PID/environ``
and ``/proc/PID/cmdline`` into workspace files, repeats the key in a tool call's arguments
(``bash`` and ``write``) and calls ``verify``, whose check command dumps the same; its
final answer repeats the key in text. Afterwards the key must not occur in any byte under
the workspace (session log, ``effects.db`` and its WAL, the dumps), nor on stdout, stderr
or in ``tether inspect --json``, nor in what tether sends back to the model.
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

from fakeprovider import FakeProvider, completion, error, ok, running

ROOT = Path(__file__).resolve().parent.parent
KEY = "fake-key-Q7x9Rt2mZp4Lw8Vb"
"""The API key in use: long enough to be masked, and shaped like no known key pattern."""
OTHER = "other-provider-key-5Jd8Kq2N"
"""A key meant for another provider (``OPENAI_API_KEY``); commands must not get it."""
MASK = "[redacted]"


def _dump(prefix: str) -> str:
    """Shell commands that write a process's and its parent's environment to files."""
    return (
        f"env > {prefix}-env.txt; "
        f"tr '\\0' '\\n' < /proc/$PPID/environ > {prefix}-parent-env.txt; "
        f"tr '\\0' ' ' < /proc/$PPID/cmdline > {prefix}-parent-cmdline.txt; "
        "env"
    )


CHECK = _dump("check") + "; echo checked"
# The dumps are not part of the work: writing them must not make the check void.
TOML = f'[verify]\ncommand = {json.dumps(CHECK)}\n\n[artifact]\nignore = ["check-*.txt"]\n'


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return completion(f"Calling tools. By the way, the key is {KEY}.", tool_calls=list(calls))


def leaky_answers() -> list[dict[str, Any]]:
    return [
        _calls(
            {"id": "c_env", "name": "bash", "arguments": {"command": _dump("bash")}},
            {"id": "c_echo", "name": "bash", "arguments": {"command": f"echo {KEY} > echoed.txt"}},
            {
                "id": "c_write",
                "name": "write",
                "arguments": {"path": "written.txt", "content": f"key={KEY}\n"},
            },
            {"id": "c_verify", "name": "verify", "arguments": {}},
        ),
        completion(f"Done. Your key is {KEY}."),
    ]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running() as provider:
        yield provider


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "tether.toml").write_text(TOML)
    return root


def cli_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_") and k not in ("OPENAI_API_KEY", "OPENROUTER_API_KEY")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env["OPENAI_API_KEY"] = OTHER
    env.update(extra)
    return env


def tether(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=90,
        check=False,
    )


def run_leaky(
    fake: FakeProvider, workspace: Path, *, source: str, json_output: bool
) -> subprocess.CompletedProcess[str]:
    fake.enqueue(*(ok(answer) for answer in leaky_answers()))
    args = ["run", "go", "--model", "fake/model", "--base-url", fake.base_url, "--yes"]
    if json_output:
        args.append("--json")
    if source == "flag":
        args += ["--api-key", KEY]
        env = cli_env()
    else:
        env = cli_env(TETHER_API_KEY=KEY)
    return tether(*args, cwd=workspace, env=env)


def files_with(root: Path, needle: bytes) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle``."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and needle in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


def session_log(workspace: Path) -> Path:
    [path] = (workspace / ".tether" / "sessions").glob("*.jsonl")
    return path


def assert_key_absent(
    fake: FakeProvider, workspace: Path, result: subprocess.CompletedProcess[str]
) -> None:
    assert KEY not in result.stdout, result.stdout
    assert KEY not in result.stderr, result.stderr
    assert files_with(workspace, KEY.encode()) == []
    assert files_with(workspace, OTHER.encode()) == []
    inspected = tether("inspect", "--json", str(session_log(workspace)), cwd=workspace)
    assert inspected.returncode == 0, inspected.stderr
    assert KEY not in inspected.stdout
    # What the model gets back (its own words, the tool results) is the masked log.
    for request in fake.requests[1:]:
        assert KEY not in json.dumps(request.body)


@pytest.mark.parametrize("source", ["env", "flag"])
def test_the_key_is_in_no_log_output_file_or_child_environment(
    fake: FakeProvider, workspace: Path, source: str
) -> None:
    result = run_leaky(fake, workspace, source=source, json_output=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["status"] == "completed"
    assert_key_absent(fake, workspace, result)
    # The commands really ran, with a working environment and their parent's files read.
    for prefix in ("bash", "check"):
        assert "PATH=" in (workspace / f"{prefix}-env.txt").read_text()
        assert "PATH=" in (workspace / f"{prefix}-parent-env.txt").read_text()
        assert "tether" in (workspace / f"{prefix}-parent-cmdline.txt").read_text()
        assert "TETHER_API_KEY" not in (workspace / f"{prefix}-env.txt").read_text()
    # The key the model repeated in a call's arguments was masked before the call ran.
    assert (workspace / "echoed.txt").read_text() == f"{MASK}\n"
    assert (workspace / "written.txt").read_text() == f"key={MASK}\n"
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["text"] == f"Done. Your key is {MASK}."
    log = session_log(workspace).read_text()
    assert f"the key is {MASK}" in log
    if source == "flag":
        warning = [line for line in result.stderr.splitlines() if "--api-key" in line]
        assert len(warning) == 1 and "TETHER_API_KEY" in warning[0], result.stderr
        assert warning[0].startswith("warning: ")
    else:
        assert result.stderr == ""


def test_terminal_output_masks_the_key(fake: FakeProvider, workspace: Path) -> None:
    result = run_leaky(fake, workspace, source="env", json_output=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Done. Your key is {MASK}.\n"
    assert f"bash echo {MASK} > echoed.txt" in result.stderr
    assert_key_absent(fake, workspace, result)


def test_the_repl_warns_about_the_flag_and_masks_the_answer(
    fake: FakeProvider, workspace: Path
) -> None:
    fake.enqueue(ok(completion(f"Hello, holder of {KEY}.")))
    result = subprocess.run(
        [sys.executable, "-m", "tether", "repl", "--model", "fake/model",
         "--base-url", fake.base_url, "--api-key", KEY],
        cwd=workspace,
        env=cli_env(),
        input="hi\n/exit\n",
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"Hello, holder of {MASK}." in result.stdout
    assert result.stderr.splitlines()[0].startswith("warning: --api-key is visible")
    assert_key_absent(fake, workspace, result)


def test_a_provider_error_echoing_the_key_is_masked(fake: FakeProvider, workspace: Path) -> None:
    fake.enqueue(error(400, f"bad request from a client with key {KEY} (sent as {KEY})"))
    result = tether(
        "run", "go", "--model", "fake/model", "--base-url", fake.base_url, "--json",
        cwd=workspace,
        env=cli_env(TETHER_API_KEY=KEY),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "bad request from a client with key" in result.stdout
    assert_key_absent(fake, workspace, result)


@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_base_url_with_user_info_is_refused(
    fake: FakeProvider, workspace: Path, where: str
) -> None:
    password = "pw-Hunter2-Zq81xV"
    url = fake.base_url.replace("http://", f"http://alice:{password}@")
    fake.enqueue(ok(completion("should never be asked")))
    args = ["run", "go", "--model", "fake/model", "--api-key", KEY]
    env = cli_env()
    if where == "flag":
        args += ["--base-url", url]
    else:
        env["TETHER_BASE_URL"] = url
    result = tether(*args, cwd=workspace, env=env)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "user" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert password not in result.stderr + result.stdout
    assert KEY not in result.stderr + result.stdout
    assert fake.requests == []
    assert not (workspace / ".tether" / "sessions").exists()


def test_pass_env_lets_a_named_variable_through(fake: FakeProvider, workspace: Path) -> None:
    (workspace / "tether.toml").write_text(TOML + '\n[tools]\npass_env = ["OPENAI_API_KEY"]\n')
    fake.enqueue(
        ok(
            _calls(
                {
                    "id": "c_env",
                    "name": "bash",
                    "arguments": {"command": 'printf "%s" "$OPENAI_API_KEY" > passed.txt'},
                },
                {"id": "c_verify", "name": "verify", "arguments": {}},
            )
        ),
        ok(completion("Done.")),
    )
    result = tether(
        "run", "go", "--model", "fake/model", "--base-url", fake.base_url, "--yes",
        cwd=workspace,
        env=cli_env(TETHER_API_KEY=KEY),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (workspace / "passed.txt").read_text() == OTHER
    assert OTHER in (workspace / "check-env.txt").read_text()
    assert "TETHER_API_KEY" not in (workspace / "check-env.txt").read_text()


def test_tether_verify_and_the_git_hooks_of_its_scan_get_no_key(workspace: Path) -> None:
    """``tether verify`` runs the check (which dumps its parent's environment too) and the
    artifact version, whose ``git ls-files`` runs the workspace's own ``core.fsmonitor``
    command: a configuration the model can write."""
    (workspace / "tether.toml").write_text(TOML.replace('"check-*.txt"', '"*.txt"'))
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    subprocess.run(
        ["git", "-C", str(workspace), "config", "core.fsmonitor", "env > fsmonitor-env.txt; true"],
        check=True,
    )
    result = tether("verify", cwd=workspace, env=cli_env(TETHER_API_KEY=KEY))
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr
    assert "PATH=" in (workspace / "fsmonitor-env.txt").read_text()
    assert "PATH=" in (workspace / "check-parent-env.txt").read_text()
    assert files_with(workspace, KEY.encode()) == []
    assert files_with(workspace, OTHER.encode()) == []


def test_a_replay_runs_the_recorded_masked_arguments(fake: FakeProvider, workspace: Path) -> None:
    """The tool runs with the arguments as the log records them — masked — the first time
    and when recovery replays it after a crash between the effect and its result."""
    (workspace / f"notes-{MASK}.txt").write_text("the masked notes\n")
    fake.enqueue(
        ok(_calls({"id": "c_read", "name": "read", "arguments": {"path": f"notes-{KEY}.txt"}})),
        ok(completion("Read them.")),
    )
    args = ["--model", "fake/model", "--base-url", fake.base_url]
    crashed = tether(
        "run", "go", *args,
        cwd=workspace,
        env=cli_env(TETHER_API_KEY=KEY, TETHER_CRASH_AT="after_effect", TETHER_CRASH_MODE="kill"),
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr
    log = session_log(workspace)
    sid = log.stem.split("_", 1)[1]
    resumed = tether("resume", sid, *args, "--json", cwd=workspace, env=cli_env(TETHER_API_KEY=KEY))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "completed"
    facts = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    flat = [f for item in facts for f in (item if isinstance(item, list) else [item])]
    [started] = [f["record"] for f in flat if f.get("record", {}).get("type") == "toolStarted"]
    assert started["arguments"] == {"path": f"notes-{MASK}.txt"}
    [result] = [
        f["entry"]["message"]["content"]
        for f in flat
        if f["kind"] == "entry" and f["entry"].get("message", {}).get("role") == "tool"
    ]
    assert result == "the masked notes\n"
    assert_key_absent(fake, workspace, resumed)
