"""No command outlives tether: SIGKILL the agent (or ``tether verify``) mid-command.

Real processes throughout: the agent is ``tests/runtime_child.py`` with a scripted model
whose ``bash`` call records its process group id, sleeps and then appends to a marker
file; ``tether verify`` runs a check command that does the same. The parent kills the
process with SIGKILL while the command sleeps, then checks that within two seconds no
process of the command's group is alive, that the marker never appears (the effect does
not keep happening after the crash), and that recovery still records ``interrupted``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tether.core import reduce_session

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "runtime_child.py"
SLEEP = 3.0
"""How long the command sleeps before its effect; the test waits past it."""

COMMANDS = {
    "plain": f"echo $$ > pgid; sleep {SLEEP:g}; echo done >> marker",
    # A background grandchild in the same group, with an effect of its own.
    "background": (
        f"echo $$ > pgid; (sleep {SLEEP:g}; echo late >> marker) & "
        f"echo $! > bg.pid; sleep {SLEEP:g}; echo done >> marker"
    ),
}


def child_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_CRASH") and k != "TETHER_ENVIRONMENT_IDENTITY"
    }
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def wait_for_int(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def assert_group_dies_and_effect_never_happens(workspace: Path, killed_at: float) -> None:
    pgid = int((workspace / "pgid").read_text())
    deadline = killed_at + 2.0
    while group_members(pgid):
        assert time.monotonic() < deadline, f"group {pgid} outlived tether: {group_members(pgid)}"
        time.sleep(0.02)
    # Past the moment the command would have written its marker.
    time.sleep(max(0.0, killed_at + SLEEP + 1.0 - time.monotonic()))
    assert not (workspace / "marker").exists(), (workspace / "marker").read_text()


def kill_mid_command(argv: list[str], started: Path) -> None:
    """Start ``argv``, SIGKILL it once the command wrote ``started``, check the aftermath."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env()
    )
    try:
        wait_for_int(started)
        proc.kill()
        killed_at = time.monotonic()
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
    assert_group_dies_and_effect_never_happens(started.parent, killed_at)


def script(command: str) -> dict[str, Any]:
    return {
        "model": "scripted/orphans",
        "responses": [
            {
                "content": "Running it.",
                "tool_calls": [
                    {"id": "call_bash", "name": "bash", "arguments": {"command": command}}
                ],
            },
            {"content": "Done.", "finish_reason": "stop"},
        ],
    }


@pytest.mark.parametrize("variant", sorted(COMMANDS))
def test_sigkilled_agent_leaves_no_command_running(tmp_path: Path, variant: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script(COMMANDS[variant])))
    argv = [sys.executable, str(CHILD), "run", str(workspace), str(script_path)]
    kill_mid_command(argv, workspace / ("bg.pid" if variant == "background" else "pgid"))
    # Recovery is unchanged: the started call's outcome is unknown, so it is interrupted.
    [log] = (workspace / ".tether" / "sessions").glob("*.jsonl")
    sid = log.stem.split("_", 1)[1]
    resumed = subprocess.run(
        [sys.executable, str(CHILD), "resume", str(workspace), str(script_path), sid],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "completed"
    state = reduce_session(log.read_bytes())
    [tool_message] = [m for m in state.transcript if m["role"] == "tool"]
    assert tool_message["content"].startswith("Operation interrupted")
    assert not (workspace / "marker").exists()


def test_sigkilled_tether_verify_leaves_no_check_running(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    command = COMMANDS["background"]
    (workspace / "tether.toml").write_text(f"[verify]\ncommand = {json.dumps(command)}\n")
    argv = [sys.executable, "-m", "tether", "verify", "--workspace", str(workspace)]
    kill_mid_command(argv, workspace / "bg.pid")


# --------------------------------------------------------------------------- the runner


def _python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def test_the_gate_runs_nothing_when_it_is_not_opened(tmp_path: Path) -> None:
    from tether._procs import _GATE, _GATE_NAME

    read_end, write_end = os.pipe()
    os.close(write_end)  # tether died before opening the gate
    try:
        gate = subprocess.run(
            ["/bin/sh", "-c", _GATE, _GATE_NAME, "/bin/sh", "-c", "touch ran"],
            stdin=read_end,
            cwd=tmp_path,
            timeout=10,
            check=False,
        )
    finally:
        os.close(read_end)
    assert gate.returncode == 125
    assert not (tmp_path / "ran").exists()


def test_a_forked_child_has_its_own_reaper(tmp_path: Path) -> None:
    """A process forked after its parent ran a command (the crash lab's jobs) reports to a
    reaper of its own: killing it kills its command although the parent lives on."""
    code = f"""
import os, sys, time
from tether._procs import run_in_group
def run(command):
    run_in_group(["/bin/sh", "-c", command], cwd={str(tmp_path)!r}, env=dict(os.environ),
                 timeout=30, on_output=lambda data: None)
run("true")  # the parent's reaper is running now
pid = os.fork()
if pid == 0:
    run("echo $$ > pgid; sleep {SLEEP:g}; echo done >> marker")
    os._exit(0)
print(pid, flush=True)
time.sleep(30)
"""
    parent = _python(code)
    try:
        assert parent.stdout is not None
        forked = int(parent.stdout.readline())
        wait_for_int(tmp_path / "pgid")
        os.kill(forked, 9)
        killed_at = time.monotonic()
        assert_group_dies_and_effect_never_happens(tmp_path, killed_at)
        assert parent.poll() is None  # the parent (and its own reaper) lived on
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_the_reaper_exits_with_its_process(tmp_path: Path) -> None:
    code = f"""
import os
from tether import _procs as procs
procs.run_in_group(["/bin/true"], cwd={str(tmp_path)!r}, env={{}}, timeout=10,
                   on_output=lambda data: None)
print(procs._REAPER._pid, flush=True)
"""
    child = _python(code)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    reaper = int(out)
    deadline = time.monotonic() + 3
    while Path(f"/proc/{reaper}").exists() and _state(reaper) not in ("Z", "X"):
        assert time.monotonic() < deadline, "the reaper outlived its process"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return raw[raw.rfind(")") + 2 :].split()[0]
