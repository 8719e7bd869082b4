"""``tether mcp list``: the MCP servers of ``tether.toml``, their tools, digests and trust.

Starts each configured server (as a run would), lists its tools as the model sees them
(``SERVER__TOOL``), the first line of each description, the digest of each input schema,
whether tether replays the tool after a crash (only ``trusted_read_only`` tools are), its
lookup, and the hints the server gives (``readOnlyHint``, ``idempotentHint``, …: shown,
never trusted). ``--schemas`` adds each input schema as the model sees it; ``--json`` has
the whole description and the schema. The servers are stopped again when the command ends.

Exit status: 0 every server started; 2 a bad ``tether.toml``, or a server that did not
start or offers a tool tether cannot use (one line naming the server and why: a command
that is not there, or the exit status and last stderr line of one that exited, with its
log's path; the others are still listed).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
import typer
from rich.console import Console
from rich.text import Text

from tether._cli.agent_flags import cli_settings
from tether._cli.common import EXIT_USAGE, WORKSPACE_HELP, emit_json, handle_errors, workspace_root
from tether._mcp.config import McpServerConfig
from tether._mcp.manager import log_path, manager
from tether._mcp.tools import describe_server, launched
from tether._project import load_project_config
from tether._runtime.compose import sandbox_for
from tether._sandbox.bwrap import Sandbox
from tether.errors import ConfigurationError

mcp_app = typer.Typer(
    name="mcp",
    help="MCP servers configured in tether.toml ([mcp.servers.NAME]).",
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(mcp_app, name="mcp")


@mcp_app.command("list")
def list_servers(
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    schemas: Annotated[
        bool, typer.Option("--schemas", help="Show each tool's input schema too.")
    ] = False,
) -> None:
    """Start each configured MCP server and list its tools, descriptions, schema digests
    and trust.

    Examples:

        tether mcp list

        tether mcp list --schemas

        tether mcp list --json
    """
    failed = False
    with handle_errors():
        root = workspace_root(workspace)
        config = load_project_config(root)
        servers: list[dict[str, Any]] = []
        # The servers start as an agent would start them: stdio ones in its sandbox.
        sandbox = sandbox_for(cli_settings({}, project=config), root)
        configured = config.mcp.servers
        if any(s.command is not None and s.sandboxed for s in configured):
            sandbox.ensure()
        try:
            failures = prestart(launched(configured, root, sandbox), root)
            for server in launched(configured, root, sandbox):
                entry: dict[str, Any] = {
                    "server": server.name,
                    "transport": server.transport,
                    "endpoint": server.where(),
                }
                if server.command is not None:
                    entry["log"] = str(log_path(root, server.name))
                    entry["sandbox"] = _sandbox_text(server, sandbox)
                try:
                    if server in failures:  # not started a second time: one report
                        raise failures[server]
                    entry["tools"] = [info.to_json() for info in describe_server(server, root)]
                except ConfigurationError as exc:
                    entry["error"] = str(exc)
                    failed = True
                servers.append(entry)
        finally:
            manager().stop_all()
        if json_output:
            emit_json(servers)
        else:
            _show(servers, schemas=schemas)
    if failed:
        raise typer.Exit(EXIT_USAGE)


def _sandbox_text(server: McpServerConfig, sandbox: Sandbox) -> str:
    if not server.sandboxed:
        return "off for this server (sandbox = false in its table)"
    return sandbox.policy.describe()


def prestart(
    servers: Sequence[McpServerConfig], root: Path
) -> dict[McpServerConfig, ConfigurationError]:
    """Start the servers at once; the ones that did not start, with why."""
    failures: dict[McpServerConfig, ConfigurationError] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        started = [(server, pool.submit(manager().tools, server, root)) for server in servers]
        for server, future in started:
            try:
                future.result()
            except ConfigurationError as exc:
                failures[server] = exc
    return failures


_DESCRIPTION_WIDTH: Final = 100
"""Characters of a description's first line shown (``--json`` has all of it)."""


def first_line(description: str, width: int = _DESCRIPTION_WIDTH) -> str:
    """The first non-blank line of ``description``, shortened to ``width`` characters."""
    line = next((" ".join(x.split()) for x in description.splitlines() if x.strip()), "")
    if not line:
        return "(no description)"
    return line if len(line) <= width else line[: width - 1] + "…"


def _show(servers: list[dict[str, Any]], *, schemas: bool = False) -> None:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(highlight=False, stderr=True, soft_wrap=True)
    if not servers:
        out.print("no MCP servers configured ([mcp.servers.NAME] in tether.toml)")
        return
    for entry in servers:
        out.print(Text(f"{entry['server']}  ({entry['transport']}: {entry['endpoint']})"))
        if "sandbox" in entry:
            out.print(Text(f"  sandbox: {entry['sandbox']}"))
        if "error" in entry:
            err.print(Text(f"error: {entry['error']}"))
            continue
        if not entry["tools"]:
            out.print("  (no tools)")
        for tool in entry["tools"]:
            hints = ", ".join(f"{k}={str(v).lower()}" for k, v in sorted(tool["hints"].items()))
            # The name, then its digest (the line a reviewer compares), then the rest.
            out.print(Text(f"  {tool['name']}"))
            out.print(Text(f"      schema {tool['schemaDigest']}"))
            out.print(Text(f"      {first_line(tool['description'])}"))
            out.print(Text(f"      {tool['trust']}"))
            if hints:
                out.print(Text(f"      server hints (not trusted): {hints}"))
            if schemas:
                shown = orjson.dumps(tool["inputSchema"], option=orjson.OPT_INDENT_2).decode()
                out.print(Text("      input schema:"))
                out.print(Text("\n".join(f"        {line}" for line in shown.splitlines())))
