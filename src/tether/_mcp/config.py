"""``[mcp.servers.NAME]`` in ``tether.toml``: the MCP servers whose tools an agent gets (pure).

Each server is a stdio command or a streamable-HTTP URL::

    [mcp.servers.notes]
    command = "python"
    args = ["notes_server.py"]
    env = { NOTES_DIR = "notes" }          # values may name variables: "${NOTES_TOKEN}"
    timeout = 30                           # seconds per call (default 60)
    trusted_read_only = ["search"]         # replayed after a crash (default: none)

    [mcp.servers.notes.tools.append]
    lookup = "find_append"                 # a tool of the same server, asked by operation id

    [mcp.servers.tickets]
    url = "http://127.0.0.1:8931/mcp"
    headers = { Authorization = "Bearer ${TICKETS_TOKEN}" }

Every problem raises :class:`~tether.errors.ProjectConfigError` naming the file and the
setting. ``${NAME}`` references are kept as written here; they are expanded (and the values
registered as secrets) only when the server is started (:mod:`tether._mcp.manager`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

from tether.core.policy import check_known, show_value, toml_key
from tether.core.records import field, record
from tether.errors import ProjectConfigError

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "McpConfig",
    "McpServerConfig",
    "mcp_config_from_mapping",
    "server_name_pattern",
]

DEFAULT_CALL_TIMEOUT: Final = 60.0
"""Seconds one tool call may take (the agent's tool timeout cuts it further)."""
DEFAULT_START_TIMEOUT: Final = 30.0
"""Seconds a server has to start, initialize and list its tools."""


@cache
def server_name_pattern() -> re.Pattern[str]:
    """Server names: letters, digits, ``-`` and single ``_`` (``__`` separates server and
    tool). Compiled by the first ``[mcp]`` table, not by every ``tether.toml`` read."""
    return re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")


_MAX_SERVER_NAME: Final = 32


@cache
def _env_name() -> re.Pattern[str]:
    """An environment variable's name (compiled for the first ``[mcp]`` table of names)."""
    return re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_SERVER_KEYS: Final = (
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "timeout",
    "start_timeout",
    "trusted_read_only",
    "tools",
    "sandbox",
)


@record
class McpServerConfig:
    """One ``[mcp.servers.NAME]`` table.

    Exactly one of ``command`` (stdio) and ``url`` (streamable HTTP) is set. ``lookups``
    maps a tool to the tool of the same server that answers whether an operation id
    committed (``[mcp.servers.NAME.tools.TOOL] lookup = "…"``).
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = DEFAULT_CALL_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    trusted_read_only: tuple[str, ...] = ()
    lookups: tuple[tuple[str, str], ...] = ()
    sandboxed: bool = True
    """A stdio server runs inside the agent's sandbox unless its table says
    ``sandbox = false`` (docs/sandbox.md)."""
    launch: tuple[str, ...] = ()
    """The command line that actually starts a stdio server (the sandbox's wrapping of
    ``command`` and ``args``); empty: ``command`` itself. Set by the shell, never read from
    ``tether.toml``; part of the value, so servers under two sandboxes are two servers."""

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    def identity(self) -> dict[str, Any]:
        """What identifies the server in its tools' definition digests: the name and the
        command line or URL (never the environment or headers, which may hold secrets)."""
        if self.command is not None:
            return {"server": self.name, "command": [self.command, *self.args]}
        return {"server": self.name, "url": self.url}

    def where(self) -> str:
        """The command line or URL, for messages."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)

    def lookup_for(self, tool: str) -> str | None:
        return dict(self.lookups).get(tool)


@record
class McpConfig:
    """``[mcp]``: the configured servers, in file order."""

    servers: tuple[McpServerConfig, ...] = field(default_factory=tuple)


def mcp_config_from_mapping(table: Mapping[str, Any], source: str) -> McpConfig:
    """The :class:`McpConfig` of the parsed ``[mcp]`` table."""
    check_known(source, "[mcp]", table, ("servers",))
    servers = table.get("servers", {})
    if not isinstance(servers, Mapping):
        raise _bad(source, "[mcp] servers", "a table of server tables", servers)
    parsed = []
    for name, server in servers.items():
        where = f"[mcp.servers.{toml_key(str(name))}]"
        if (
            not isinstance(name, str)
            or len(name) > _MAX_SERVER_NAME
            or not server_name_pattern().fullmatch(name)
        ):
            raise ProjectConfigError(
                f"{source}: {where}: a server name is 1-{_MAX_SERVER_NAME} letters, digits, "
                "'-' or single '_'"
            )
        if not isinstance(server, Mapping):
            raise _bad(source, where, "a table", server)
        parsed.append(_server(source, where, name, server))
    return McpConfig(servers=tuple(parsed))


def _server(source: str, where: str, name: str, table: Mapping[str, Any]) -> McpServerConfig:
    check_known(source, where, table, _SERVER_KEYS)
    command = table.get("command")
    url = table.get("url")
    if (command is None) == (url is None):
        raise ProjectConfigError(
            f"{source}: {where}: set either command (a stdio server) or url (streamable HTTP)"
        )
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise _bad(source, f"{where} command", "a non-empty program name or path", command)
    if url is not None and (not isinstance(url, str) or not re.fullmatch(r"https?://\S+", url)):
        raise _bad(source, f"{where} url", "an http:// or https:// URL", url)
    args = _strings(source, f"{where} args", table.get("args", []))
    if url is not None:
        for key in ("args", "env", "cwd"):
            if key in table:
                raise ProjectConfigError(f"{source}: {where} {key}: only for a stdio server")
    if command is not None and "headers" in table:
        raise ProjectConfigError(f"{source}: {where} headers: only for an HTTP server")
    sandboxed = table.get("sandbox", True)
    if not isinstance(sandboxed, bool):
        raise _bad(source, f"{where} sandbox", "true or false", sandboxed)
    if url is not None and "sandbox" in table:
        raise ProjectConfigError(f"{source}: {where} sandbox: only for a stdio server")
    env = _pairs(source, f"{where} env", table.get("env", {}), names=True)
    headers = _pairs(source, f"{where} headers", table.get("headers", {}), names=False)
    cwd = table.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise _bad(source, f"{where} cwd", "a directory path", cwd)
    timeout = _seconds(source, f"{where} timeout", table.get("timeout", DEFAULT_CALL_TIMEOUT))
    start = _seconds(
        source, f"{where} start_timeout", table.get("start_timeout", DEFAULT_START_TIMEOUT)
    )
    trusted = _strings(source, f"{where} trusted_read_only", table.get("trusted_read_only", []))
    tools = table.get("tools", {})
    if not isinstance(tools, Mapping):
        raise _bad(source, f"{where} tools", "a table of tool tables", tools)
    lookups: list[tuple[str, str]] = []
    for tool, settings in tools.items():
        at = f"[mcp.servers.{toml_key(name)}.tools.{toml_key(str(tool))}]"
        if not isinstance(settings, Mapping):
            raise _bad(source, at, "a table", settings)
        check_known(source, at, settings, ("lookup",))
        lookup = settings.get("lookup")
        if lookup is None:
            continue
        if not isinstance(lookup, str) or not lookup:
            raise _bad(source, f"{at} lookup", "the name of a tool of the same server", lookup)
        if lookup == tool:
            raise ProjectConfigError(f"{source}: {at} lookup: a tool cannot be its own lookup")
        if tool in trusted:
            raise ProjectConfigError(
                f"{source}: {at} lookup: {tool!r} is trusted_read_only; a read-only tool "
                "needs no lookup"
            )
        lookups.append((str(tool), lookup))
    return McpServerConfig(
        name=name,
        command=command,
        args=args,
        env=env,
        cwd=cwd,
        url=url,
        headers=headers,
        timeout=timeout,
        start_timeout=start,
        trusted_read_only=tuple(dict.fromkeys(trusted)),
        lookups=tuple(lookups),
        sandboxed=sandboxed,
    )


def _strings(source: str, setting: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(source, setting, "a list of strings", value)
    return tuple(value)


def _pairs(source: str, setting: str, value: object, *, names: bool) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise _bad(source, setting, "a table of strings", value)
    out = []
    for key, item in value.items():
        if names and not _env_name().fullmatch(str(key)):
            raise _bad(source, setting, "environment variable names (letters, digits, _)", key)
        if not isinstance(item, str):
            raise _bad(source, f"{setting} {toml_key(str(key))}", "a string", item)
        out.append((str(key), item))
    return tuple(out)


def _seconds(source: str, setting: str, value: object) -> float:
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    raise _bad(source, setting, "a positive number of seconds", value)


def _bad(source: str, setting: str, expected: str, value: object) -> ProjectConfigError:
    return ProjectConfigError(f"{source}: {setting}: expected {expected}, got {show_value(value)}")
