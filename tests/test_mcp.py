"""MCP servers as tools, against real servers started by the tests.

* ``tests/mcp_server.py`` — written with the SDK's server API, over stdio and over
  streamable HTTP on loopback;
* ``mcp-server-time`` — the reference server published on PyPI (a dev dependency), code
  nobody here wrote;
* ``tests/mcp_raw_server.py`` — a hand-written server that breaks the protocol.

Crash consistency is in ``tests/test_mcp_crash.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpkit import (
    RAW_SERVER,
    SERVER,
    child,
    child_env,
    free_port,
    lines,
    notes_server,
    pid_alive,
    script_calling,
    session_of,
    time_server,
    wait_for_port,
    workspace_with,
)
from tether._credentials import MASK
from tether._mcp.config import McpConfig, McpServerConfig
from tether._mcp.manager import IDEMPOTENCY_HEADER, manager
from tether._mcp.tools import (
    MAX_RESULT_CHARS,
    McpEffectTool,
    McpTool,
    mcp_tools,
    normalize_schema,
)
from tether._project import load_project_config, parse_project_config
from tether._tools.base import Rejection, Tool, ToolContext, ToolRegistry
from tether.core.canonical import tool_definition_digest
from tether.core.state import Replay
from tether.errors import ConfigurationError, ProjectConfigError


@pytest.fixture(autouse=True)
def _stop_servers() -> Iterator[None]:
    yield
    manager().stop_all()


def notes_config(workspace: Path, *extra: str, **settings: object) -> McpServerConfig:
    return McpServerConfig(
        name=str(settings.pop("name", "notes")),
        command=sys.executable,
        args=(str(SERVER), *extra),
        env=(("NOTES_DIR", str(workspace)),),
        **settings,  # type: ignore[arg-type]
    )


def tools_of(workspace: Path, *servers: McpServerConfig) -> dict[str, Tool]:
    return {t.name: t for t in mcp_tools(McpConfig(servers), workspace)}


def context(workspace: Path, operation: str = "op-1", timeout: float | None = None) -> ToolContext:
    return ToolContext(workspace=workspace, operation_id=operation, timeout=timeout)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = (tmp_path / "ws").resolve()
    root.mkdir()
    return root


# =========================================================================== configuration


def test_servers_are_read_from_tether_toml(tmp_path: Path) -> None:
    config = parse_project_config(
        textwrap.dedent(
            """
            [mcp.servers.notes]
            command = "python"
            args = ["server.py"]
            env = { TOKEN = "${NOTES_TOKEN}" }
            timeout = 5
            trusted_read_only = ["search"]
            [mcp.servers.notes.tools.append]
            lookup = "find_append"
            [mcp.servers.web]
            url = "http://127.0.0.1:9/mcp"
            headers = { Authorization = "Bearer x" }
            """
        )
    )
    notes, web = config.mcp.servers
    assert (notes.name, notes.command, notes.args, notes.transport) == (
        "notes",
        "python",
        ("server.py",),
        "stdio",
    )
    assert notes.env == (("TOKEN", "${NOTES_TOKEN}"),) and notes.timeout == 5.0
    assert notes.trusted_read_only == ("search",)
    assert notes.lookup_for("append") == "find_append"
    assert web.transport == "http" and web.headers == (("Authorization", "Bearer x"),)
    assert web.identity() == {"server": "web", "url": "http://127.0.0.1:9/mcp"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mcp]\nservers = 3", "tether.toml: [mcp] servers: expected a table of server tables"),
        ("[mcp.servers.a__b]\ncommand = 'x'", "[mcp.servers.a__b]: a server name is"),
        ("[mcp.servers.s]\n", "set either command (a stdio server) or url"),
        ("[mcp.servers.s]\ncommand = 'x'\nurl = 'http://h'", "set either command"),
        ("[mcp.servers.s]\nurl = 'ftp://h'", "[mcp.servers.s] url: expected an http://"),
        ("[mcp.servers.s]\ncommand = 'x'\nargs = 'y'", "args: expected a list of strings"),
        ("[mcp.servers.s]\ncommand = 'x'\ntimeout = 0", "timeout: expected a positive number"),
        ("[mcp.servers.s]\ncommand = 'x'\nheaders = {A = 'b'}", "headers: only for an HTTP"),
        ("[mcp.servers.s]\nurl = 'http://h'\nargs = []", "args: only for a stdio server"),
        ("[mcp.servers.s]\ncommand = 'x'\ncomand = 'y'", "unknown setting [mcp.servers.s] comand"),
        (
            "[mcp.servers.s]\ncommand = 'x'\n[mcp.servers.s.tools.t]\nlookup = 't'",
            "a tool cannot be its own lookup",
        ),
        (
            "[mcp.servers.s]\ncommand = 'x'\ntrusted_read_only = ['t']\n"
            "[mcp.servers.s.tools.t]\nlookup = 'u'",
            "'t' is trusted_read_only; a read-only tool needs no lookup",
        ),
    ],
)
def test_bad_server_settings_give_one_line(text: str, message: str) -> None:
    with pytest.raises(ProjectConfigError) as caught:
        parse_project_config(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_schemas_are_brought_into_the_digest_subset() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "name": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "when": {"type": "string", "format": "date-time", "description": "When."},
        },
    }
    assert normalize_schema(schema) == {
        "type": "object",
        "properties": {
            "name": {"type": ["string", "null"], "description": "(default: null)"},
            "when": {"type": "string", "description": "When."},
        },
    }
    with pytest.raises(ValueError, match="anyOf beyond a choice of plain types"):
        normalize_schema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}]})


# =========================================================================== the SDK server


def test_tools_are_named_by_server_and_never_replayed_unless_trusted(ws: Path) -> None:
    tools = tools_of(ws, notes_config(ws, trusted_read_only=("count_lines",)))
    assert {"notes__append", "notes__find_append", "notes__count_lines"} <= set(tools)
    # The server says find_append is read-only: shown, not trusted.
    find = tools["notes__find_append"]
    assert isinstance(find, McpTool) and find.hints == {"readOnlyHint": True}
    assert find.replay is Replay.NEVER
    count = tools["notes__count_lines"]
    assert count.replay is Replay.SAFE
    assert isinstance(count, McpTool)
    assert count.replay_key == f"mcp:notes:count_lines:{count.schema_digest}"
    assert count.schema_digest.startswith("sha256:")
    assert all(t.replay is Replay.NEVER for n, t in tools.items() if n != "notes__count_lines")


def test_the_definition_digest_covers_the_server_identity(ws: Path) -> None:
    plain = tools_of(ws, notes_config(ws))["notes__append"]
    manager().stop_all()
    other = tools_of(ws, notes_config(ws, "--another-command-line"))["notes__append"]
    assert plain.definition() == other.definition()  # the same tool, model-facing
    assert plain.definition_digest() != other.definition_digest()  # but another server
    assert plain.definition_digest() != tool_definition_digest(plain.definition())


def test_a_call_carries_its_operation_id_in_meta(ws: Path) -> None:
    whoami = tools_of(ws, notes_config(ws))["notes__whoami"]
    result = whoami.run({}, context(ws, "0190-op-meta"))
    assert not result.is_error
    assert json.loads(result.content)["operation"] == "0190-op-meta"


def test_arguments_are_validated_before_the_call(ws: Path) -> None:
    registry = ToolRegistry(list(tools_of(ws, notes_config(ws)).values()))
    rejected = registry.validate("notes__append", '{"line": 3}')
    assert isinstance(rejected, Rejection) and rejected.reason == "invalidArguments"
    assert not (ws / "calls.txt").exists()


def test_servers_are_reused_within_a_process(ws: Path) -> None:
    config = notes_config(ws)
    first = json.loads(tools_of(ws, config)["notes__whoami"].run({}, context(ws)).content)
    second = json.loads(tools_of(ws, config)["notes__whoami"].run({}, context(ws)).content)
    assert first["pid"] == second["pid"]


def test_a_tool_error_is_an_error_result(ws: Path) -> None:
    result = tools_of(ws, notes_config(ws))["notes__fail"].run({}, context(ws))
    assert result.is_error and result.content.startswith("Error")


def test_a_huge_result_is_cut_in_the_middle(ws: Path) -> None:
    result = tools_of(ws, notes_config(ws))["notes__huge"].run({"size": 300_000}, context(ws))
    assert not result.is_error
    assert len(result.content) < MAX_RESULT_CHARS + 100
    assert "[... cut: 250000 characters of the result not shown ...]" in result.content
    assert result.content.startswith("abcdef")


def test_a_server_that_exits_mid_call_gives_an_error_and_is_restarted(ws: Path) -> None:
    tools = tools_of(ws, notes_config(ws))
    before = json.loads(tools["notes__whoami"].run({}, context(ws)).content)["pid"]
    started = time.monotonic()
    died = tools["notes__die"].run({}, context(ws))
    assert time.monotonic() - started < 5
    assert died.is_error
    assert "the server closed the connection" in died.content
    assert "Whether the call took effect is unknown" in died.content
    after = json.loads(tools["notes__whoami"].run({}, context(ws)).content)["pid"]
    assert after != before


def test_a_hung_server_is_cut_off_at_the_timeout(ws: Path) -> None:
    tools = tools_of(ws, notes_config(ws, timeout=1.0))
    started = time.monotonic()
    hung = tools["notes__sleep"].run({"seconds": 60}, context(ws))
    assert time.monotonic() - started < 4
    assert hung.is_error and "no answer within 1 s" in hung.content
    # The agent's tool timeout cuts a server's timeout further.
    tools = tools_of(ws, notes_config(ws, timeout=30.0))
    started = time.monotonic()
    hung = tools["notes__sleep"].run({"seconds": 60}, context(ws, timeout=0.5))
    assert time.monotonic() - started < 4 and "no answer within 0.5 s" in hung.content
    assert not tools["notes__count_lines"].run({}, context(ws)).is_error  # restarted


def test_a_cancelled_call_returns_at_once(ws: Path) -> None:
    sleep = tools_of(ws, notes_config(ws))["notes__sleep"]
    ctx = context(ws)
    ctx.cancel.set()
    started = time.monotonic()
    result = sleep.run({"seconds": 60}, ctx)
    assert time.monotonic() - started < 2 and result.is_error
    assert "was not sent to MCP server 'notes'" in result.content  # set before: nothing sent
    assert "It did not take effect" in result.content
    ctx = context(ws)
    threading.Timer(0.5, ctx.cancel.set).start()  # Ctrl+C during the call
    started = time.monotonic()
    result = sleep.run({"seconds": 60}, ctx)
    assert time.monotonic() - started < 3 and result.is_error
    assert "the call was cancelled" in result.content and "is unknown" in result.content


def test_lookup_tool_answers_by_operation_id(ws: Path) -> None:
    server = notes_config(ws, lookups=(("append_once", "find_append"),))
    tool = tools_of(ws, server)["notes__append_once"]
    assert isinstance(tool, McpEffectTool) and tool.recovery.value == "lookupByOperationId"
    assert tool.lookup("op-x").status.value == "notFound"
    assert tool.run({"line": "l"}, context(ws, "op-x")).content == "appended 'l' once"
    found = tool.lookup("op-x")
    assert found.status.value == "committed" and found.result is not None
    assert found.result.content == "appended 'l' once"
    assert lines(ws / "notes.txt") == ["l"]


# =========================================================================== start-up errors


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            McpServerConfig(name="ghost", command="/nonexistent/mcp-server"),
            "MCP server 'ghost' (/nonexistent/mcp-server) did not start: ",
        ),
        (
            McpServerConfig(
                name="quits", command=sys.executable, args=("-c", "raise SystemExit(1)")
            ),
            "MCP server 'quits' (",
        ),
        (
            McpServerConfig(
                name="slow",
                command=sys.executable,
                args=(str(SERVER), "--slow-start", "30"),
                start_timeout=1.0,
            ),
            "did not start: no answer within 1 s",
        ),
    ],
)
def test_a_server_that_does_not_start_gives_one_line(
    ws: Path, server: McpServerConfig, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as caught:
        tools_of(ws, server)
    assert time.monotonic() - started < 10
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_tool_with_an_unusable_schema_is_a_start_up_error(ws: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        tools_of(ws, notes_config(ws, "--bad-schema"))
    text = str(caught.value)
    assert text.startswith("MCP server 'notes': tool 'plot' has an invalid input schema: ")
    assert "$defs" in text or "$ref" in text


def test_trust_and_lookups_must_name_tools_the_server_has(ws: Path) -> None:
    with pytest.raises(ConfigurationError, match="trusted_read_only names 'cuont_lines'"):
        tools_of(ws, notes_config(ws, trusted_read_only=("cuont_lines",)))
    with pytest.raises(ConfigurationError, match="lookup names 'find'"):
        tools_of(ws, notes_config(ws, lookups=(("append_once", "find"),)))


def test_an_unset_variable_in_env_is_a_start_up_error(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_TEST_UNSET", raising=False)
    server = McpServerConfig(
        name="notes", command=sys.executable, env=(("T", "${TETHER_TEST_UNSET}"),)
    )
    with pytest.raises(ConfigurationError, match=r"env T refers to \$\{TETHER_TEST_UNSET\}"):
        tools_of(ws, server)


# =========================================================================== broken protocol


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "the server sent a malformed JSON-RPC message"),
        ("not-jsonrpc", "the server sent a malformed JSON-RPC message"),
        ("exit", "the server closed the connection"),
        ("silent", "no answer within 1 s"),
        ("wrong-id", "no answer within 1 s"),
    ],
)
def test_a_server_breaking_the_protocol_gives_an_error_result(
    ws: Path, mode: str, message: str
) -> None:
    server = McpServerConfig(
        name="raw", command=sys.executable, args=(str(RAW_SERVER), mode), timeout=1.0
    )
    (garble,) = tools_of(ws, server).values()
    started = time.monotonic()
    result = garble.run({}, context(ws))
    assert time.monotonic() - started < 4
    assert result.is_error and message in result.content
    assert "\n" not in result.content


# =========================================================================== streamable HTTP


@pytest.fixture
def http_server(ws: Path) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, NOTES_DIR=str(ws))
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        manager().stop_all()
        process.kill()  # a sleep tool may still be running in it
        process.wait(10)


def test_http_server_gets_the_operation_id_in_meta_and_a_header(ws: Path, http_server: str) -> None:
    tools = tools_of(ws, McpServerConfig(name="web", url=http_server, timeout=2.0))
    seen = json.loads(tools["web__whoami"].run({}, context(ws, "op-over-http")).content)
    assert seen["operation"] == "op-over-http"
    assert seen["header"] == "op-over-http"  # Idempotency-Key
    assert IDEMPOTENCY_HEADER == "Idempotency-Key"
    assert tools["web__append"].run({"line": "h"}, context(ws)).content == "appended 'h'"
    assert lines(ws / "notes.txt") == ["h"]
    hung = tools["web__sleep"].run({"seconds": 30}, context(ws))
    assert hung.is_error and "no answer within 2 s" in hung.content


def test_an_http_server_that_is_not_there_gives_one_line(ws: Path) -> None:
    server = McpServerConfig(
        name="web", url=f"http://127.0.0.1:{free_port()}/mcp", start_timeout=5.0
    )
    with pytest.raises(ConfigurationError) as caught:
        tools_of(ws, server)
    assert str(caught.value).startswith("MCP server 'web' (http://127.0.0.1:")
    assert "did not start" in str(caught.value) and "\n" not in str(caught.value)


# =========================================================================== third-party server


def test_the_reference_time_server_from_pypi_works_in_an_agent_run(tmp_path: Path) -> None:
    script = script_calling(("time__get_current_time", {"timezone": "Etc/UTC"}))
    workspace = workspace_with(tmp_path, time_server(), script=script)
    ran = child("run", workspace)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"
    from tether.core import reduce_session

    _, log = session_of(workspace)
    (tool,) = [m for m in reduce_session(log.read_bytes()).transcript if m["role"] == "tool"]
    answer = json.loads(tool["content"])
    assert answer["timezone"] == "Etc/UTC" and "datetime" in answer
    # Its readOnlyHint is shown, not trusted: never replayed.
    tools = tools_of(workspace, *load_project_config(workspace).mcp.servers)
    assert tools["time__get_current_time"].replay is Replay.NEVER


# =========================================================================== agent and lifecycle


def test_a_server_whose_tools_changed_blocks_the_resume(tmp_path: Path) -> None:
    script = script_calling(("notes__append", {"line": "x"}))
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), script=script)
    crashed = child("run", workspace, crash_at="attempt_recorded")
    assert crashed.returncode == -9, crashed.stderr
    session, _ = session_of(workspace)
    (workspace / "tether.toml").write_text(notes_server(workspace, extra_args=("--extra-tool",)))
    resumed = child("resume", workspace, session)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "blocked" and result["blockedReason"] == "configuration_changed"
    assert "added notes__extra" in result["message"]
    assert f"tether resume {session} --abort" in result["message"]
    assert not (workspace / "notes.txt").exists()


def test_the_policy_applies_to_mcp_tools_and_secrets_are_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = script_calling(("notes__append", {"line": "x"}), ("notes__whoami", {}))
    table = notes_server(tmp_path / "ws").replace(
        "env = {", 'env = { NOTES_TOKEN = "${TETHER_TEST_NOTES_TOKEN}", '
    )
    policy = '[policy.tools]\nnotes__append = "deny"\n'
    workspace = workspace_with(tmp_path, table, policy, script=script)
    monkeypatch.setenv("TETHER_TEST_NOTES_TOKEN", "tok-5ecret-value-123")
    ran = child("run", workspace)
    assert ran.returncode == 0, ran.stderr
    assert not (workspace / "notes.txt").exists()  # denied: never sent to the server
    _, log = session_of(workspace)
    text = log.read_text()
    assert '\\"token\\": \\"' + MASK in text  # the server got it; the log has the mask
    assert "tok-5ecret-value-123" not in text


def test_stderr_of_a_stdio_server_goes_to_its_log(tmp_path: Path) -> None:
    script = script_calling(("notes__append", {"line": "x"}))
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), script=script)
    ran = child("run", workspace)
    assert ran.returncode == 0, ran.stderr
    assert "mcp test server starting" not in ran.stderr
    assert "mcp test server starting" in (workspace / ".tether/mcp/notes.log").read_text()


LIFECYCLE_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from tether._mcp.config import McpConfig, McpServerConfig
    from tether._mcp.tools import mcp_tools
    from tether._tools.base import ToolContext

    ws, server, how = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = McpServerConfig(name="notes", command=sys.executable, args=(server,))
    (whoami,) = [t for t in mcp_tools(McpConfig((config,)), ws) if t.name == "notes__whoami"]
    answer = whoami.run({}, ToolContext(workspace=ws, operation_id="op"))
    print(json.loads(answer.content)["pid"], flush=True)
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C
        time.sleep(30)
    if how == "sigkill":  # killed in the middle of a call the server is still busy with
        import threading
        (sleep,) = [t for t in mcp_tools(McpConfig((config,)), ws) if t.name == "notes__sleep"]
        context = ToolContext(workspace=ws, operation_id="op-2")
        threading.Thread(target=sleep.run, args=({"seconds": 60}, context), daemon=True).start()
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigint", "sigkill"])
def test_servers_are_stopped_on_exit_on_ctrl_c_and_when_tether_is_killed(
    ws: Path, how: str
) -> None:
    """Exit and Ctrl+C stop the server; SIGKILL of tether: its reaper kills the server,
    which would otherwise finish its 60 s call first (the SDK waits for running tools)."""
    process = subprocess.run(
        [sys.executable, "-c", LIFECYCLE_CHILD, str(ws), str(SERVER), how],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Ctrl+C: KeyboardInterrupt, and Python ends itself with SIGINT.
    expected = {"exit": 0, "sigint": -signal.SIGINT, "sigkill": -signal.SIGKILL}[how]
    assert process.returncode == expected, process.stderr
    if how == "sigint":
        assert "KeyboardInterrupt" in process.stderr
    pid = int(process.stdout.split()[0])
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = pid_alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the MCP server outlived tether"


# =========================================================================== tether mcp list


def run_cli(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", "mcp", "list", *args],
        cwd=workspace,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_mcp_list_shows_servers_tools_digests_and_trust(tmp_path: Path) -> None:
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws"), time_server())
    shown = run_cli(workspace)
    assert shown.returncode == 0, shown.stderr
    assert "notes  (stdio: " in shown.stdout and "time  (stdio: " in shown.stdout
    assert "  notes__count_lines\n      schema sha256:" in shown.stdout
    assert "trusted read-only: replayed after a crash" in shown.stdout
    assert "never replayed; recovered by lookup find_append" in shown.stdout
    assert "server hints (not trusted): idempotentHint=true, readOnlyHint=true" in shown.stdout
    listed = json.loads(run_cli(workspace, "--json").stdout)
    assert [s["server"] for s in listed] == ["notes", "time"]
    (current,) = [t for t in listed[1]["tools"] if t["serverTool"] == "get_current_time"]
    assert current["replay"] == "never" and current["hints"]["readOnlyHint"] is True
    assert current["replayKey"] == f"mcp:time:get_current_time:{current['schemaDigest']}"


def test_mcp_list_names_a_broken_server_and_exits_2(tmp_path: Path) -> None:
    broken = '[mcp.servers.broken]\ncommand = "/nonexistent/server"\n'
    workspace = workspace_with(tmp_path, broken, notes_server(tmp_path / "ws"))
    shown = run_cli(workspace)
    assert shown.returncode == 2
    assert "error: MCP server 'broken' (/nonexistent/server) did not start" in shown.stderr
    assert "notes__append" in shown.stdout  # the others are still listed
    assert "Traceback" not in shown.stderr


def test_mcp_list_without_servers(tmp_path: Path) -> None:
    workspace = workspace_with(tmp_path)
    shown = run_cli(workspace)
    assert shown.returncode == 0 and "no MCP servers configured" in shown.stdout


def test_mcp_list_shows_descriptions_and_with_schemas_the_input_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = workspace_with(tmp_path, notes_server(tmp_path / "ws", trusted=()))
    shown = run_cli(workspace, "--json")
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)
    (append,) = [t for t in listed[0]["tools"] if t["serverTool"] == "append"]
    assert append["description"] == "Append one line to notes.txt."
    assert append["inputSchema"]["required"] == ["line"]
    assert append["inputSchema"]["properties"]["line"]["type"] == "string"
    # The text view of the same listing (in-process: one server start is enough).
    from tether._cli.mcp_cmd import _show, first_line

    _show(listed, schemas=True)
    text = capsys.readouterr().out
    assert "  notes__count_lines\n      schema sha256:" in text
    assert "\n      Count the lines of notes.txt.\n" in text
    assert '      input schema:\n        {\n          "properties": {' in text
    assert first_line("\n  Does   a thing.\nMore.") == "Does a thing."
    assert first_line("x" * 300) == "x" * 99 + "…" and first_line("") == "(no description)"


def stdio_table(name: str, command: str, *args: str) -> str:
    return f"[mcp.servers.{name}]\ncommand = {json.dumps(command)}\nargs = {json.dumps(args)}\n"


def test_mcp_list_says_why_a_server_did_not_start(tmp_path: Path) -> None:
    exits = stdio_table("boom", "sh", "-c", "echo starting >&2; echo boom >&2; exit 3")
    one_liner = "import sys; print('reading config', file=sys.stderr); sys.exit('ValueError: no')"
    python = stdio_table("py", sys.executable, "-c", one_liner)
    missing = stdio_table("typo", "nosuch-mcp-server")
    workspace = workspace_with(tmp_path, exits, python, missing)
    shown = run_cli(workspace)
    assert shown.returncode == 2
    assert "Traceback" not in shown.stderr
    errors = shown.stderr.splitlines()
    assert len(errors) == 3, shown.stderr
    assert errors[0] == (
        "error: MCP server 'boom' (sh -c echo starting >&2; echo boom >&2; exit 3) did not "
        'start: it exited with status 3; its stderr ends "boom" (see .tether/mcp/boom.log)'
    )
    assert errors[1].startswith("error: MCP server 'py' (")
    assert errors[1].endswith(
        'did not start: it exited with status 1; its stderr ends "ValueError: no" '
        "(see .tether/mcp/py.log)"
    )
    assert errors[2] == (
        "error: MCP server 'typo' (nosuch-mcp-server) did not start: "
        "command 'nosuch-mcp-server' not found (not on PATH)"
    )
    # Each server was started once: one report, one start in its log.
    assert (workspace / ".tether/mcp/boom.log").read_text().count("--- tether starts") == 1


def test_run_names_a_missing_command_in_one_line(tmp_path: Path) -> None:
    workspace = workspace_with(
        tmp_path, stdio_table("typo", "nosuch-mcp-server"), script=script_calling()
    )
    ran = subprocess.run(
        [sys.executable, "-m", "tether", "run", "go", "--model", "scripted:script.json"],
        cwd=workspace,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 2
    assert ran.stderr == (
        "error: MCP server 'typo' (nosuch-mcp-server) did not start: "
        "command 'nosuch-mcp-server' not found (not on PATH)\n"
    )
