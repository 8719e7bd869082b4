"""``tether mcp list``: the MCP servers of ``tether.toml``, their tools, digests and trust.

Starts each configured server (as a run would), lists its tools as the model sees them
(``SERVER__TOOL``), the digest of each input schema, whether tether replays the tool after
a crash (only ``trusted_read_only`` tools are), its lookup, and the hints the server
gives (``readOnlyHint``, ``idempotentHint``, …: shown, never trusted). The servers are
stopped again when the command ends.

Exit status: 0 every server started; 2 a bad ``tether.toml``, or a server that did not
start or offers a tool tether cannot use (one line naming the server; the others are
still listed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tether._cli.common import EXIT_USAGE, WORKSPACE_HELP, emit_json, handle_errors, workspace_root
from tether._mcp.config import McpServerConfig
from tether._mcp.manager import log_path, manager
from tether._mcp.tools import describe_server
from tether._project import load_project_config
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
) -> None:
    """Start each configured MCP server and list its tools, schema digests and trust.

    Examples:

        tether mcp list

        tether mcp list --json
    """
    failed = False
    with handle_errors():
        root = workspace_root(workspace)
        config = load_project_config(root)
        servers: list[dict[str, Any]] = []
        try:
            prestart(config.mcp.servers, root)
            for server in config.mcp.servers:
                entry: dict[str, Any] = {
                    "server": server.name,
                    "transport": server.transport,
                    "endpoint": server.where(),
                }
                if server.command is not None:
                    entry["log"] = str(log_path(root, server.name))
                try:
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
            _show(servers)
    if failed:
        raise typer.Exit(EXIT_USAGE)


def prestart(servers: Sequence[McpServerConfig], root: Path) -> None:
    """Start the servers at once (a failure is reported by :func:`describe_server`)."""
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        for future in [pool.submit(manager().tools, server, root) for server in servers]:
            with contextlib.suppress(ConfigurationError):
                future.result()


def _show(servers: list[dict[str, Any]]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(highlight=False, stderr=True, soft_wrap=True)
    if not servers:
        out.print("no MCP servers configured ([mcp.servers.NAME] in tether.toml)")
        return
    for entry in servers:
        out.print(Text(f"{entry['server']}  ({entry['transport']}: {entry['endpoint']})"))
        if "error" in entry:
            err.print(Text(f"error: {entry['error']}"))
            continue
        if not entry["tools"]:
            out.print("  (no tools)")
        for tool in entry["tools"]:
            hints = ", ".join(f"{k}={str(v).lower()}" for k, v in sorted(tool["hints"].items()))
            out.print(Text(f"  {tool['name']}"))
            out.print(Text(f"      schema {tool['schemaDigest']}"))
            out.print(Text(f"      {tool['trust']}"))
            if hints:
                out.print(Text(f"      server hints (not trusted): {hints}"))
