"""The ``bash`` built-in: real subprocesses, process groups, timeouts and aborts."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tether._tools import BashTool, ToolContext, ToolResult


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    state = data[data.rfind(b")") + 2 :].split()[0]
    return state not in (b"Z", b"X")


def wait_for_file(path: Path, timeout: float = 5.0) -> int:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.01)
    raise AssertionError(f"{path} was never written")


def bash(ws: Path, command: str, **kwargs: object) -> ToolResult:
    context = ToolContext(ws, "op-1", timeout=kwargs.pop("context_timeout", None))  # type: ignore[arg-type]
    tool = BashTool(kill_grace=float(kwargs.pop("kill_grace", 2.0)))  # type: ignore[arg-type]
    return tool.run({"command": command, **kwargs}, context)


def test_output_exit_code_and_cwd(ws: Path) -> None:
    result = bash(ws, "pwd; echo err >&2; cat; exit 3")
    assert result.content == f"{ws}\nerr\nexit code: 3"
    assert not result.is_error  # a non-zero exit is information, not a tool failure
    assert result.metadata["exit_code"] == 3
    ok = bash(ws, "true")
    assert ok.content == "(no output)\nexit code: 0" and not ok.is_error
    assert bash(ws, "printf 'no newline'").content == "no newline\nexit code: 0"


def test_killed_by_signal_and_invalid_utf8(ws: Path) -> None:
    result = bash(ws, "printf 'caf\\351\\n'; kill -9 $$")
    assert result.content == "caf\ufffd\nexit code: -9 (killed by SIGKILL)"


def test_output_is_capped_with_head_tail_and_note(ws: Path) -> None:
    tool = BashTool(output_head=100, output_tail=200)
    command = "for i in $(seq 1 2000); do echo line-$i; done"
    result = tool.run({"command": command}, ToolContext(ws, "op"))
    total = sum(len(f"line-{i}\n") for i in range(1, 2001))
    cut = total - 300
    assert result.metadata["output_bytes"] == total and result.metadata["cut_bytes"] == cut
    head, rest = result.content.split("\n[... cut: ", 1)
    assert head.startswith("line-1\nline-2\n") and len(head.encode()) <= 100
    note, tail = rest.split(" ...]\n", 1)
    assert note.startswith(f"{cut} bytes (") and note.endswith(" lines) of output not shown")
    assert tail.endswith("line-2000\nexit code: 0")
    assert len(result.content) < 500


def test_timeout_kills_the_whole_process_group(ws: Path) -> None:
    started = time.monotonic()
    result = bash(
        ws,
        "sh -c 'sleep 30 & echo $! > grandchild.pid; wait'; echo never",
        timeout=0.5,
    )
    elapsed = time.monotonic() - started
    grandchild = wait_for_file(ws / "grandchild.pid")
    assert not alive(grandchild)
    assert result.is_error and result.metadata["timed_out"]
    assert "timed out after 0.5 s" in result.content and "never" not in result.content
    assert elapsed < 3.0


def test_sigterm_is_followed_by_sigkill(ws: Path) -> None:
    command = "trap '' TERM; sh -c 'echo $$ > stubborn.pid; while :; do sleep 0.05; done'"
    started = time.monotonic()
    result = bash(ws, command, timeout=0.3, kill_grace=0.3)
    stubborn = wait_for_file(ws / "stubborn.pid")
    assert not alive(stubborn)
    assert result.metadata["timed_out"] and "SIGKILL" in result.content
    assert time.monotonic() - started < 3.0


def test_context_timeout_caps_the_argument(ws: Path) -> None:
    result = bash(ws, "sleep 10", timeout=100, context_timeout=0.3)
    assert result.metadata["timed_out"] and "after 0.3 s" in result.content


def test_cancel_kills_the_whole_process_group(ws: Path) -> None:
    context = ToolContext(ws, "op-1")
    timer = threading.Timer(0.3, context.cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        result = BashTool().run(
            {"command": "echo before; sleep 30 & echo $! > bg.pid; sleep 30"}, context
        )
    finally:
        timer.cancel()
    assert time.monotonic() - started < 3.0
    assert not alive(wait_for_file(ws / "bg.pid"))
    assert result.is_error and result.metadata["aborted"] and not result.metadata["timed_out"]
    assert result.content.startswith("before\n") and "aborted" in result.content


def test_cancel_before_start_runs_nothing(ws: Path) -> None:
    context = ToolContext(ws, "op-1")
    context.cancel.set()
    result = BashTool().run({"command": "touch ran"}, context)
    assert result.is_error and "aborted before" in result.content
    assert not (ws / "ran").exists()


def test_background_processes_do_not_outlive_the_command(ws: Path) -> None:
    started = time.monotonic()
    result = bash(ws, "sleep 30 & echo $! > bg.pid; echo done")
    assert result.content == "done\nexit code: 0"
    assert time.monotonic() - started < 3.0
    assert not alive(wait_for_file(ws / "bg.pid"))


def test_environment_can_be_replaced(ws: Path) -> None:
    tool = BashTool(env={"ONLY": "this", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    result = tool.run({"command": 'echo "$ONLY:${HOME:-unset}"'}, ToolContext(ws, "op"))
    assert result.content == "this:unset\nexit code: 0"
