"""MCP tools: each tool of a configured MCP server as a tether tool named ``SERVER__TOOL``.

* **Definition.** The server's name, description and input schema, with the schema brought
  into the keyword subset of spec 10.5 (:func:`normalize_schema`: annotations such as
  ``default``, ``format`` and ``$schema`` are dropped, a ``default`` is added to the
  description, ``anyOf`` of plain types becomes a ``type`` list); anything else is an
  invalid schema and a start-up error naming the server and the tool. Arguments are
  validated against it before the call, like a built-in's.
* **Identity.** The ``definitionDigest`` covers the model-facing definition *and* the
  server's name and command line or URL (:meth:`McpServerConfig.identity`), so a server
  whose tools changed, or another server under the same name, makes a resume
  ``configuration_changed``.
* **Replay.** Every MCP tool is ``never``, whatever the server's ``readOnlyHint`` /
  ``idempotentHint`` say (they are only shown). ``trusted_read_only = ["tool"]`` in
  ``tether.toml`` makes a tool replay-safe with the replay key
  ``mcp:SERVER:TOOL:<digest of its input schema>``.
* **Idempotency.** Every call carries its operation id (the ``toolStarted`` id) in
  ``_meta`` (and over HTTP in ``Idempotency-Key``). A tool with a configured ``lookup`` is
  an :class:`~tether._effects.contract.EffectTool` of recovery kind
  ``lookupByOperationId``: the lookup tool is called with ``{"operation_id": …}`` and
  answers ``{"status": "committed", "result": "…"}`` or ``{"status": "notFound"}`` (as
  JSON text or structured content); anything else is ``unknowable``.
* **Failures.** A server that exits, hangs past the timeout or answers garbage gives an
  error result saying the outcome is unknown (an effect tool with a lookup asks the lookup
  instead); a server error (``isError`` or a JSON-RPC error) is an error result; a result
  over :data:`MAX_RESULT_CHARS` is cut in the middle with a note.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from tether._effects.contract import EffectTool, LookupResult
from tether._mcp.config import McpConfig, McpServerConfig
from tether._mcp.manager import Answer, McpCallFailed, ServerTool, manager
from tether._sandbox.bwrap import Sandbox
from tether._tools.base import TOOL_NAME_PATTERN, Tool, ToolContext, ToolResult
from tether.core.canonical import canonical_json, sha256_digest
from tether.core.kinds import Replay
from tether.core.records import replace
from tether.errors import CanonicalizationError, ConfigurationError

__all__ = [
    "LOOKUP_ARGUMENT",
    "MAX_RESULT_CHARS",
    "SEPARATOR",
    "McpEffectTool",
    "McpTool",
    "ToolInfo",
    "describe_server",
    "mcp_tools",
    "normalize_schema",
    "render_answer",
]

SEPARATOR: Final = "__"
"""Between the server's name and the tool's: ``notes__append``."""
LOOKUP_ARGUMENT: Final = "operation_id"
"""The one argument a lookup tool is called with."""
MAX_RESULT_CHARS: Final = 50_000
"""A longer result keeps its first 40 000 and last 10 000 characters."""
_HEAD: Final = 40_000
_TAIL: Final = 10_000

_DROPPED: Final = frozenset({
    "$schema", "$id", "$comment", "default", "examples", "format", "readOnly", "writeOnly",
    "deprecated", "contentMediaType", "contentEncoding",
})  # fmt: skip
"""Annotations without effect on validation: dropped from the model-facing schema."""
_ANNOTATIONS: Final = frozenset({"title", "description"})


def normalize_schema(schema: object, where: str = "inputSchema") -> dict[str, Any]:
    """``schema`` in the keyword subset of spec 10.5, or :class:`ValueError` saying why."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"{where} is not a JSON Schema object")
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in _DROPPED:
            continue
        if keyword == "properties":
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.properties is not an object")
            out[keyword] = {
                str(k): normalize_schema(v, f"{where}.properties.{k}") for k, v in value.items()
            }
        elif keyword == "items" or (
            keyword == "additionalProperties" and isinstance(value, Mapping)
        ):
            out[keyword] = normalize_schema(value, f"{where}.{keyword}")
        elif keyword == "oneOf" and isinstance(value, list):
            out[keyword] = [normalize_schema(v, f"{where}.oneOf[{i}]") for i, v in enumerate(value)]
        elif keyword == "anyOf" and isinstance(value, list):
            types = _plain_types(value)
            if types is None or "type" in schema:
                raise ValueError(f"{where} uses anyOf beyond a choice of plain types")
            out["type"] = types
        else:
            out[keyword] = value
    if "default" in schema:
        try:
            shown = orjson.dumps(schema["default"]).decode()
        except TypeError:
            shown = repr(schema["default"])
        if len(shown) <= 200:
            text = out.get("description")
            note = f"(default: {shown})"
            out["description"] = f"{text} {note}" if isinstance(text, str) and text else note
    return out


def _plain_types(branches: list[Any]) -> list[str] | None:
    types: list[str] = []
    for branch in branches:
        if not isinstance(branch, Mapping) or not isinstance(branch.get("type"), str):
            return None
        if set(branch) - {"type"} - _ANNOTATIONS - _DROPPED:
            return None
        types.append(branch["type"])
    return list(dict.fromkeys(types)) or None


def _schema_digest(parameters: Mapping[str, Any]) -> str:
    return sha256_digest(canonical_json(parameters, allow_scalars=True))


def render_answer(answer: Answer) -> str:
    """The text the model sees for a server's answer."""
    parts: list[str] = []
    for block in answer.blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            size = len(str(block.get("data", ""))) * 3 // 4
            parts.append(f"[{kind}: {block.get('mimeType', '?')}, {size} bytes not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.get('uri', '?')}]")
        elif kind == "resource":
            resource = block.get("resource") or {}
            if isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
                parts.append(resource["text"])
            else:
                uri = resource.get("uri", "?") if isinstance(resource, Mapping) else "?"
                parts.append(f"[resource: {uri}, binary content not shown]")
        else:
            parts.append(f"[{kind} content not shown]")
    if not parts and answer.structured is not None:
        parts.append(orjson.dumps(answer.structured, option=orjson.OPT_SORT_KEYS).decode())
    text = "\n".join(parts) if parts else "(no output)"
    if len(text) > MAX_RESULT_CHARS:
        cut = len(text) - _HEAD - _TAIL
        text = (
            text[:_HEAD]
            + f"\n[... cut: {cut} characters of the result not shown ...]\n"
            + text[-_TAIL:]
        )
    if answer.is_error and not text.startswith("Error"):
        text = f"Error: {text}"
    return text


@dataclass(frozen=True)
class ToolInfo:
    """What ``tether mcp list`` shows of one tool (``input_schema`` as the model sees it:
    normalized, the schema ``schema_digest`` is of)."""

    name: str
    server_tool: str
    schema_digest: str
    replay: str
    replay_key: str
    trust: str
    hints: Mapping[str, bool]
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "serverTool": self.server_tool,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
            "schemaDigest": self.schema_digest,
            "replay": self.replay,
            "replayKey": self.replay_key,
            "trust": self.trust,
            "hints": dict(self.hints),
        }


class _McpBase:
    """What both MCP tool classes share (mixed into a :class:`Tool`)."""

    server: McpServerConfig
    workspace: Path
    server_tool: str
    hints: Mapping[str, bool]
    schema_digest: str
    name: str
    description: str
    parameters: Mapping[str, Any]
    replay_key: str
    _digest: str
    _definition: dict[str, Any]

    def _setup(
        self,
        server: McpServerConfig,
        workspace: Path,
        listed: ServerTool,
        parameters: dict[str, Any],
    ) -> None:
        self.server = server
        self.workspace = workspace
        self.server_tool = listed.name
        self.hints = dict(listed.hints)
        self.name = f"{server.name}{SEPARATOR}{listed.name}"
        self.description = listed.description
        self.parameters = parameters
        self.schema_digest = _schema_digest(parameters)
        self.replay_key = f"mcp:{server.name}:{listed.name}:{self.schema_digest}"

    def _bind_identity(self) -> None:
        """The digest covers the server's identity too (after :meth:`Tool.__init__`)."""
        self._digest = sha256_digest(
            canonical_json({**self._definition, "mcp": self.server.identity()}, allow_scalars=True)
        )

    def _timeout(self, context: ToolContext | None) -> float:
        bound = self.server.timeout
        if context is not None and context.timeout is not None:
            bound = min(bound, context.timeout)
        return bound if math.isfinite(bound) else self.server.timeout

    def _call(
        self, arguments: Mapping[str, Any], operation_id: str, context: ToolContext | None
    ) -> Answer:
        return manager().call(
            self.server,
            self.workspace,
            self.server_tool,
            arguments,
            operation_id,
            timeout=self._timeout(context),
            cancel=context.cancel if context is not None else None,
        )


class McpTool(_McpBase, Tool):
    """A tool of an MCP server: ``never`` replayed unless ``trusted_read_only`` names it."""

    def __init__(
        self,
        server: McpServerConfig,
        workspace: Path,
        listed: ServerTool,
        parameters: dict[str, Any],
        *,
        trusted: bool = False,
    ) -> None:
        self._setup(server, workspace, listed, parameters)
        self.replay = Replay.SAFE if trusted else Replay.NEVER
        Tool.__init__(self)
        self._bind_identity()

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        try:
            answer = self._call(arguments, context.operation_id, context)
        except McpCallFailed as exc:
            if not exc.sent:
                return ToolResult.error(
                    f"Error: {self.server_tool} was not sent to MCP server "
                    f"{self.server.name!r}: {exc}. It did not take effect.",
                    mcp_failure=str(exc),
                )
            return ToolResult.error(
                f"Error: MCP server {self.server.name!r} gave no answer to "
                f"{self.server_tool}: {exc}. Whether the call took effect is unknown.",
                mcp_failure=str(exc),
            )
        return ToolResult(render_answer(answer), is_error=answer.is_error)


class McpEffectTool(_McpBase, EffectTool):
    """A tool of an MCP server with a configured lookup: recovery kind
    ``lookupByOperationId``; a call without an answer is looked up, never re-run blindly."""

    def __init__(
        self,
        server: McpServerConfig,
        workspace: Path,
        listed: ServerTool,
        parameters: dict[str, Any],
        *,
        lookup_tool: str,
    ) -> None:
        self._setup(server, workspace, listed, parameters)
        self.lookup_tool = lookup_tool
        EffectTool.__init__(self)
        self._bind_identity()

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        # McpCallFailed propagates: the outcome is unknown and the runner asks the lookup.
        answer = self._call(arguments, operation_id, None)
        return ToolResult(render_answer(answer), is_error=answer.is_error)

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        try:
            answer = self._call(arguments, context.operation_id, context)
        except McpCallFailed as exc:
            if exc.sent:
                raise  # the outcome is unknown: the runner asks the lookup
            return ToolResult.error(
                f"Error: {self.server_tool} was not sent to MCP server "
                f"{self.server.name!r}: {exc}. It did not take effect."
            )
        return ToolResult(render_answer(answer), is_error=answer.is_error)

    def lookup(self, operation_id: str) -> LookupResult:
        answer = manager().call(
            self.server,
            self.workspace,
            self.lookup_tool,
            {LOOKUP_ARGUMENT: operation_id},
            operation_id,
            timeout=self.server.timeout,
        )
        return interpret_lookup(self.lookup_tool, answer)


def interpret_lookup(lookup_tool: str, answer: Answer) -> LookupResult:
    """A lookup tool's answer as a :class:`LookupResult` (see the module docstring)."""
    text = render_answer(answer)
    if answer.is_error:
        return LookupResult.unknowable(f"the lookup {lookup_tool} failed: {text[:200]}")
    data: Any = None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        data = answer.structured
    if (
        isinstance(data, Mapping)
        and "status" not in data
        and isinstance(data.get("result"), Mapping)
    ):
        data = data["result"]
    status = data.get("status") if isinstance(data, Mapping) else None
    if status == "committed":
        assert isinstance(data, Mapping)
        result = data.get("result", "")
        return LookupResult.committed(
            ToolResult(
                result if isinstance(result, str) else orjson.dumps(result).decode(),
                is_error=data.get("isError") is True,
            )
        )
    if status == "notFound":
        return LookupResult.not_found()
    return LookupResult.unknowable(
        f"the lookup {lookup_tool} answered neither committed nor notFound: {text[:200]}"
    )


def _build(server: McpServerConfig, workspace: Path, listed: Sequence[ServerTool]) -> list[Tool]:
    names = {t.name for t in listed}
    for wanted, setting in [
        *((t, "trusted_read_only") for t in server.trusted_read_only),
        *((t, "tools") for t, _ in server.lookups),
        *((lk, "lookup") for _, lk in server.lookups),
    ]:
        if wanted not in names:
            raise ConfigurationError(
                f"MCP server {server.name!r}: {setting} names {wanted!r}, which the server "
                f"does not offer (it offers: {', '.join(sorted(names)) or 'no tools'})"
            )
    tools: list[Tool] = []
    for item in listed:
        name = f"{server.name}{SEPARATOR}{item.name}"
        if TOOL_NAME_PATTERN.fullmatch(name) is None:
            raise ConfigurationError(
                f"MCP server {server.name!r}: tool {item.name!r} cannot be named {name!r} "
                "(tool names are 1-64 letters, digits, '_' or '-')"
            )
        try:
            parameters = normalize_schema(item.input_schema)
            if "type" not in parameters:
                parameters["type"] = "object"
            lookup = server.lookup_for(item.name)
            tool: Tool
            if lookup is not None:
                tool = McpEffectTool(server, workspace, item, parameters, lookup_tool=lookup)
            else:
                trusted = item.name in server.trusted_read_only
                tool = McpTool(server, workspace, item, parameters, trusted=trusted)
        except (ValueError, ConfigurationError, CanonicalizationError) as exc:
            raise ConfigurationError(
                f"MCP server {server.name!r}: tool {item.name!r} has an invalid input schema: {exc}"
            ) from None
        tools.append(tool)
    return tools


def launched(
    servers: Sequence[McpServerConfig], workspace: Path, sandbox: Sandbox | None
) -> tuple[McpServerConfig, ...]:
    """``servers`` with the command line that starts each stdio server inside ``sandbox``
    (unless the server opted out, ``sandbox = false``)."""
    if sandbox is None or not sandbox.confined:
        return tuple(servers)
    out = []
    for server in servers:
        if server.command is not None and server.sandboxed:
            cwd = Path(os.path.realpath(workspace / server.cwd if server.cwd else workspace))
            # A command that cannot be found is left as it is: it fails to start with the
            # SDK's clear "not found", and nothing runs unconfined.
            found = shutil.which(server.command, path=_search_path(server))
            if found is None and "/" in server.command and os.access(cwd / server.command, os.X_OK):
                found = str(cwd / server.command)
            if found is not None:
                # The server's program (and a working folder outside the workspace, which
                # is bound already) stay visible where the private /tmp would hide them.
                inside = cwd == sandbox.policy.workspace or sandbox.policy.workspace in cwd.parents
                box = sandbox.exposing([found] if inside else [found, cwd])
                launch = box.wrap([server.command, *server.args], cwd)
                server = replace(server, launch=tuple(launch))
        out.append(server)
    return tuple(out)


def _search_path(server: McpServerConfig) -> str | None:
    """Where the server's command is looked up: its own ``PATH`` when its table sets one."""
    given = dict(server.env).get("PATH")
    return given if given is not None and "${" not in given else os.environ.get("PATH")


def mcp_tools(config: McpConfig, workspace: Path, sandbox: Sandbox | None = None) -> list[Tool]:
    """The tools of every configured server, in configuration order (servers are started
    as needed, stdio ones inside ``sandbox``; a server that does not start is a
    :class:`ConfigurationError` naming it)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "tether.toml configures MCP servers, but the mcp package is not installed "
            "(pip install 'tether[mcp]')"
        ) from None
    servers = launched(config.servers, workspace, sandbox)
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:  # start them at once
        started = [pool.submit(manager().tools, server, workspace) for server in servers]
        listings = [future.result() for future in started]  # the first failure, in order
    tools: list[Tool] = []
    for server, listing in zip(servers, listings, strict=True):
        tools.extend(_build(server, workspace, listing))
    return tools


def describe_server(server: McpServerConfig, workspace: Path) -> list[ToolInfo]:
    """What ``tether mcp list`` shows of one server's tools (starting it if needed)."""
    infos = []
    for tool in _build(server, workspace, manager().tools(server, workspace)):
        assert isinstance(tool, McpTool | McpEffectTool)
        if isinstance(tool, McpEffectTool):
            trust = f"never replayed; recovered by lookup {tool.lookup_tool}"
        elif tool.replay is Replay.SAFE:
            trust = "trusted read-only: replayed after a crash"
        else:
            trust = "never replayed (untrusted)"
        infos.append(
            ToolInfo(
                name=tool.name,
                server_tool=tool.server_tool,
                schema_digest=tool.schema_digest,
                replay=tool.replay.value,
                replay_key=tool.replay_key,
                trust=trust,
                hints=tool.hints,
                description=tool.description,
                input_schema=tool.parameters,
            )
        )
    return infos
