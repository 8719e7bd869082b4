"""The approval question on a real terminal: ``tether run`` inside tmux, answered with
keystrokes (yes, no, always) and interrupted with Ctrl+C at the question."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_cli_run import cli_env, run_cli, script

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None and os.environ.get("CI") != "true",
    reason="tmux is not installed (.ci/run installs it)",
)

QUESTION = "[y]es / [n]o / [a]lways for this rule:"


class Pane:
    """One tmux session on a tmux server of its own (``-L``): tests on other workers start
    and end theirs at the same time, and a session started while the shared default server
    exits with another test's last session fails ("server exited unexpectedly", seen in
    CI)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def tmux(self, *args: str) -> list[str]:
        return ["tmux", "-L", self.name, *args]

    def text(self) -> str:
        return subprocess.run(
            self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", self.name),
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def wait_for(self, needle: str, count: int = 1, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if text.count(needle) >= count:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} (x{count}) never appeared:\n{self.text()}")

    def keys(self, *keys: str) -> None:
        subprocess.run(self.tmux("send-keys", "-t", self.name, *keys), check=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[tuple[Path, Pane]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "tether.toml").write_text('[policy.tools]\nbash = "ask"\nwrite = "ask"\n')
    name = f"tether-test-{uuid.uuid4().hex[:8]}"
    env = cli_env()
    exports = "".join(
        f"export {key}={shlex.quote(value)}\n"
        for key, value in env.items()
        if key.isidentifier() and key not in ("TMUX", "TMUX_PANE")
    )
    (tmp_path / "env.sh").write_text(exports + f"cd {shlex.quote(str(workspace))}\n")
    pane = Pane(name)
    subprocess.run(
        pane.tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "60", "sh"), check=True
    )
    pane.keys(f". {shlex.quote(str(tmp_path / 'env.sh'))}", "Enter")
    try:
        yield workspace, pane
    finally:
        subprocess.run(pane.tmux("kill-server"), check=False)


def start(pane: Pane, *args: str) -> None:
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "tether", *args))
    pane.keys(f'{command}; echo "EX""IT=$?"', "Enter")  # the typed line never reads EXIT=


def bash(command: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def test_yes_no_and_always_at_the_terminal(terminal: tuple[Path, Pane]) -> None:
    workspace, pane = terminal
    (workspace / "notes.txt").write_text("old line\n")
    write = {
        "tool_calls": [
            {"name": "write", "arguments": {"path": "notes.txt", "content": "new line\n"}}
        ]
    }
    model = script(
        workspace,
        [
            write,
            bash("echo 2 >> log.txt"),
            bash("echo 3 >> log.txt"),
            bash("echo 4 >> log.txt"),
            {"content": "done"},
        ],
    )
    start(pane, "run", "go", "--model", model)
    shown = pane.wait_for(QUESTION)
    assert "-old line" in shown and "+new line" in shown  # the diff, before the question
    pane.keys("y", "Enter")
    shown = pane.wait_for(QUESTION, 2)
    assert "$ echo 2 >> log.txt" in shown  # the command in full
    pane.keys("n", "Enter")
    pane.wait_for(QUESTION, 3)
    pane.keys("a", "Enter")
    shown = pane.wait_for("EXIT=")
    assert "EXIT=0" in shown, shown
    assert shown.count(QUESTION) == 3  # the fourth call was allowed by "always"
    assert "declined by a person, not run" in shown
    assert (workspace / "notes.txt").read_text() == "new line\n"
    assert (workspace / "log.txt").read_text() == "3\n4\n"
    decisions = json.loads(run_cli("authorizations", "--json", cwd=workspace).stdout)
    assert [(d["toolName"], d["decision"], d["who"]) for d in decisions] == [
        ("write", "allow", "user"),
        ("bash", "deny", "user"),
        ("bash", "allow", "user"),
        ("bash", "allow", "user"),
    ]
    assert "always" in decisions[3]["reason"]


def test_ctrl_c_at_the_question_decides_nothing(terminal: tuple[Path, Pane]) -> None:
    workspace, pane = terminal
    model = script(workspace, [bash("echo 1 >> log.txt"), {"content": "done"}])
    start(pane, "run", "go", "--model", model)
    pane.wait_for(QUESTION)
    pane.keys("C-c")
    shown = pane.wait_for("EXIT=")
    assert "EXIT=130" in shown, shown
    assert "the session stays resumable" in shown
    assert not (workspace / "log.txt").exists()
    assert json.loads(run_cli("authorizations", "--json", cwd=workspace).stdout) == []
    [path] = sorted((workspace / ".tether" / "sessions").glob("*.jsonl"))
    session_id = path.stem.split("_", 1)[1]
    pane.keys("clear", "Enter")
    start(pane, "resume", session_id, "--model", model)
    pane.wait_for(QUESTION)  # asked again: nothing was decided
    pane.keys("y", "Enter")
    assert "EXIT=0" in pane.wait_for("EXIT=")
    assert (workspace / "log.txt").read_text() == "1\n"
