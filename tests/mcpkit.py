"""Helpers of the MCP tests: a workspace whose tether.toml names the test servers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
SERVER = TESTS / "mcp_server.py"
RAW_SERVER = TESTS / "mcp_raw_server.py"
CHILD = TESTS / "mcp_child.py"
SRC = TESTS.parent / "src"


def toml_string(value: str) -> str:
    return json.dumps(value)


def notes_server(
    workspace: Path,
    *,
    name: str = "notes",
    extra_args: tuple[str, ...] = (),
    timeout: float | None = None,
    trusted: tuple[str, ...] = ("count_lines",),
    lookups: dict[str, str] | None = None,
) -> str:
    """The TOML table of the SDK-written test server, its files in the workspace."""
    args = ", ".join(toml_string(a) for a in (str(SERVER), *extra_args))
    lines = [
        f"[mcp.servers.{name}]",
        f"command = {toml_string(sys.executable)}",
        f"args = [{args}]",
        f"env = {{ NOTES_DIR = {toml_string(str(workspace))} }}",
        f"trusted_read_only = [{', '.join(toml_string(t) for t in trusted)}]",
    ]
    if timeout is not None:
        lines.append(f"timeout = {timeout}")
    for tool, lookup in (
        lookups if lookups is not None else {"append_once": "find_append"}
    ).items():
        lines += [f"[mcp.servers.{name}.tools.{tool}]", f"lookup = {toml_string(lookup)}"]
    return "\n".join(lines) + "\n"


def time_server() -> str:
    """The TOML table of the third-party reference server ``mcp-server-time`` (PyPI)."""
    program = shutil.which("mcp-server-time", path=str(Path(sys.executable).parent))
    assert program is not None, "mcp-server-time is a dev dependency (pip install -e '.[dev]')"
    return f"[mcp.servers.time]\ncommand = {toml_string(program)}\n"


def workspace_with(tmp_path: Path, *tables: str, script: dict[str, Any] | None = None) -> Path:
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir(exist_ok=True)
    (workspace / "tether.toml").write_text("".join(tables))
    if script is not None:
        (workspace / "script.json").write_text(json.dumps(script))
    return workspace


def script_calling(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A scripted model that makes each call in its own step, then stops."""
    responses: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": arguments}], "finish_reason": "tool_calls"}
        for name, arguments in calls
    ]
    responses.append({"content": "Done.", "finish_reason": "stop"})
    return {"model": "scripted/mcp", "responses": responses}


def child_env(crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_CRASH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    if crash_at is not None:
        env["TETHER_CRASH_AT"] = crash_at
        env["TETHER_CRASH_MODE"] = "kill"
    return env


def child(
    mode: str, workspace: Path, *extra: str, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), mode, str(workspace), str(workspace / "script.json"), *extra],
        env=child_env(crash_at),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def session_of(workspace: Path) -> tuple[str, Path]:
    (log,) = (workspace / ".tether" / "sessions").glob("*.jsonl")
    return log.stem.split("_", 1)[1], log


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the HTTP test server exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the HTTP test server did not listen in time")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped) counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
