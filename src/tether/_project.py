"""The project configuration file ``tether.toml``: finding the workspace, loading, validation.

``<workspace>/tether.toml`` configures the check command (``[verify]``), the artifact version
(``[artifact]``), per-run budgets (``[budget]``), the authorization policy (``[policy]``,
see :mod:`tether.core.policy`), what commands get (``[tools]``) and the MCP servers
(``[mcp.servers.NAME]``, see :mod:`tether._mcp.config`). A missing file is not an error:
every setting has a default. Any other problem — unreadable file, a directory at that
path, invalid TOML, an unknown table or key, a value of the wrong type — raises
:class:`ProjectConfigError` with one line naming the file and the setting, e.g.::

    tether.toml: [verify] timeout: expected a positive number of seconds, got "ten"

:func:`parse_project_config` is pure (text in, config out); :func:`load_project_config` reads
the file. See ``docs/config.md``.

**The workspace root.** Every command works on one workspace, found by
:func:`find_workspace_root`: starting at the current directory and going up one parent at
a time, the first directory that holds ``tether.toml`` or ``.tether`` is the root; the
search stops at the filesystem root, and after a *git top level* (a directory holding
``.git``, a folder or a file): a ``tether.toml`` above the repository is not used. When
nothing is found the starting directory is the root. :func:`choose_root` is the pure
rule (the names present at each level in, the root out).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

from tether._inputs import MAX_CONFIG_BYTES, read_optional_file
from tether._mcp.config import McpConfig, mcp_config_from_mapping
from tether._models.options import ModelConfig, model_config_from_mapping
from tether._models.prices import Price
from tether._sandbox.policy import SandboxMode
from tether._telemetry import TelemetryConfig
from tether._tools.workspace import TETHER_DIR
from tether.core.policy import (
    Policy,
    check_known,
    policy_from_mapping,
    show_value,
    toml_key,
)
from tether.core.records import field, record, replace
from tether.core.stops import BudgetTime
from tether.errors import ConfigurationError, InputFileError, ProjectConfigError

__all__ = [
    "CONFIG_FILE",
    "GIT_MARKER",
    "ROOT_MARKERS",
    "ArtifactConfig",
    "BudgetConfig",
    "BudgetTime",
    "ProjectConfig",
    "StoreConfig",
    "ToolsConfig",
    "VerifyConfig",
    "WorkspaceRoot",
    "choose_root",
    "find_workspace_root",
    "load_project_config",
    "parse_project_config",
    "project_config_from_mapping",
]

CONFIG_FILE: Final = "tether.toml"
"""The name of the project configuration file, relative to the workspace."""

DEFAULT_VERIFY_TIMEOUT: Final = 600.0

ROOT_MARKERS: Final = (CONFIG_FILE, TETHER_DIR)
"""Names that make a directory the workspace root, in the order they are named."""
GIT_MARKER: Final = ".git"
"""A directory holding this name is a git top level: the search goes no higher."""


@record
class VerifyConfig:
    """``[verify]``: the check command, its timeout, and the completion gate."""

    command: str | None = None
    timeout: float = DEFAULT_VERIFY_TIMEOUT
    required: bool = False


@record
class ArtifactConfig:
    """``[artifact]``: extra ignore patterns for the artifact version."""

    ignore: tuple[str, ...] = ()


@record
class BudgetConfig:
    """``[budget]``: per-run limits; ``None`` means unlimited."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    time: BudgetTime = BudgetTime.ACTIVE
    """What ``max_seconds`` counts."""
    max_tool_calls: int | None = None
    """Tool calls a run may start (a replay after a crash is not a new one)."""
    max_cost_usd: float | None = None
    """US dollars per run (the provider's reported cost, else ``[prices]``)."""
    max_session_tokens: int | None = None
    """Input + output tokens of the whole session, every run and compaction counted."""
    max_session_cost_usd: float | None = None
    """US dollars of the whole session."""


@record
class ToolsConfig:
    """``[tools]``: what the commands tether starts (``bash``, the check) get from it."""

    pass_env: tuple[str, ...] = ()
    """Environment variables passed through although they hold a credential (see
    :func:`tether._credentials.child_environment`)."""


@record
class StoreConfig:
    """``[store]``: where sessions are kept (``url``: ``None`` is the local file store)."""

    url: str | None = None
    """A ``postgresql://`` URL of a shared store (``docs/scale-out.md``)."""
    lease_seconds: float | None = None
    """The length of a writer's lease on a session of a shared store."""
    pool_size: int | None = None
    """The most connections a process opens to the shared store."""


@record
class SandboxConfig:
    """``[sandbox]``: how the commands the agent runs are confined (docs/sandbox.md);
    ``None`` is "not set here" (the setting's default applies)."""

    mode: SandboxMode | None = None
    network: bool | None = None
    writable_roots: tuple[str, ...] | None = None
    deny_read: tuple[str, ...] | None = None


@record
class ProjectConfig:
    """Everything ``tether.toml`` configures; ``path`` is the file read (``None``: absent)."""

    verify: VerifyConfig = field(default_factory=VerifyConfig)
    artifact: ArtifactConfig = field(default_factory=ArtifactConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    """``[telemetry]``: OpenTelemetry export (:mod:`tether._telemetry`)."""
    prices: tuple[tuple[str, Price], ...] = ()
    """``[prices]``: (model id, price) pairs, before tether's built-in table
    (:mod:`tether._models.prices`); a tuple so the configuration stays hashable."""
    policy: Policy = field(default_factory=Policy)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    """``[model]``: the model, endpoint and request options (docs/config.md)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    path: Path | None = None


# --------------------------------------------------------------------------- the root


@record
class WorkspaceRoot:
    """The workspace a command works on, and how it was chosen.

    ``path`` is the root's real path; ``start`` the real path of the directory the
    search started from (the current directory). ``marker`` names what made ``path`` the
    root (``"tether.toml"`` or ``".tether"``); it is ``None`` when nothing was found (then
    ``path`` is ``start``) or when the root was given explicitly (``explicit``: the
    ``--workspace`` flag; no search was made).
    """

    path: Path
    start: Path
    marker: str | None = None
    explicit: bool = False

    @property
    def notice(self) -> str | None:
        """The line that says which root is used, when a search found one above ``start``.

        ``None`` when the root is the starting directory or was given explicitly.
        """
        if self.explicit or self.marker is None or self.path == self.start:
            return None
        shown = f"{self.marker}/" if self.marker == TETHER_DIR else self.marker
        return f"workspace: {self.path} (found {shown} above the current directory)"


def choose_root(levels: Iterable[tuple[Path, Collection[str]]]) -> tuple[Path, str] | None:
    """The root and its marker, given the names present at each level (pure).

    ``levels`` are ``(directory, names)`` pairs from the starting directory upward;
    ``names`` need only say which of :data:`ROOT_MARKERS` and :data:`GIT_MARKER` the
    directory holds. The first directory holding a root marker wins (``tether.toml``
    named before ``.tether`` when it holds both); a directory holding ``.git`` and no
    marker ends the search, as does the end of ``levels``: ``None``, nothing found.
    Levels after the deciding one are never looked at (``levels`` may be lazy).
    """
    for directory, names in levels:
        for marker in ROOT_MARKERS:
            if marker in names:
                return directory, marker
        if GIT_MARKER in names:
            return None
    return None


def _levels(start: Path) -> Iterator[tuple[Path, frozenset[str]]]:
    """``start`` and each of its parents up to ``/``, with the marker names each holds.

    ``lexists``: any kind of entry counts (a broken ``tether.toml`` is then reported as
    an error by :func:`load_project_config` instead of being skipped for one higher up,
    which could apply a weaker policy).
    """
    current = start
    while True:
        names = (*ROOT_MARKERS, GIT_MARKER)
        yield current, frozenset(n for n in names if os.path.lexists(current / n))
        parent = current.parent
        if parent == current:
            return
        current = parent


def find_workspace_root(
    workspace: str | os.PathLike[str] | None = None,
    *,
    start: str | os.PathLike[str] | None = None,
) -> WorkspaceRoot:
    """The workspace root of a command: ``workspace`` if given, else the search's result.

    ``workspace`` (the ``--workspace`` flag) is used as is, without a search; it must be
    a directory (:class:`~tether.errors.ConfigurationError` otherwise). Without it the
    search of :func:`choose_root` runs from ``start`` (default: the current directory,
    by its real path); when it finds nothing, ``start`` is the root.
    """
    if start is None:
        try:
            start = os.getcwd()
        except FileNotFoundError:
            raise ConfigurationError("the current directory no longer exists") from None
    begin = Path(os.path.realpath(start))
    if workspace is not None:
        if not os.path.isdir(workspace):
            raise ConfigurationError(f"workspace {os.fspath(workspace)!r} is not a directory")
        return WorkspaceRoot(Path(os.path.realpath(workspace)), begin, explicit=True)
    found = choose_root(_levels(begin))
    if found is None:
        return WorkspaceRoot(begin, begin)
    return WorkspaceRoot(found[0], begin, found[1])


# --------------------------------------------------------------------------- loading


def load_project_config(workspace: str | os.PathLike[str]) -> ProjectConfig:
    """Read and validate ``<workspace>/tether.toml``; defaults when there is no such file.

    A symbolic link is followed (it is the user's own file); a dangling link, a directory or
    any other non-regular file at that path is an error, as is an unreadable file.
    """
    path = Path(workspace) / CONFIG_FILE
    data = _read(path)
    if data is None:
        return ProjectConfig()
    return replace(parse_project_config(data, source=CONFIG_FILE), path=path)


def _read(path: Path) -> str | None:
    """The file's text, or ``None`` when there is no file (and no link) at ``path``.

    Through :func:`tether._inputs.read_optional_file`: never blocks on a FIFO, never reads a
    device, and refuses a file over :data:`~tether._inputs.MAX_CONFIG_BYTES` unread.
    """
    try:
        raw = read_optional_file(path, CONFIG_FILE, limit=MAX_CONFIG_BYTES)
    except InputFileError as exc:
        # Still a ProjectConfigError: callers and tests catch the configuration's own error.
        raise ProjectConfigError(str(exc)) from exc
    if raw is None:
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProjectConfigError(
            f"{CONFIG_FILE} is not valid TOML: it is not UTF-8 text "
            f"(byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


# --------------------------------------------------------------------------- parsing


def parse_project_config(text: str, *, source: str = CONFIG_FILE) -> ProjectConfig:
    """The :class:`ProjectConfig` of the TOML ``text`` (pure; ``path`` is ``None``).

    ``source`` names the file in error messages.
    """
    # Imported here: a workspace without a tether.toml parses no TOML.
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProjectConfigError(f"{source} is not valid TOML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise ProjectConfigError(f"{source} is not valid TOML: nested too deeply") from None
    return project_config_from_mapping(data, source=source)


_SECTIONS: Final = (
    "verify",
    "artifact",
    "budget",
    "prices",
    "policy",
    "tools",
    "mcp",
    "store",
    "model",
    "sandbox",
    "telemetry",
)


def project_config_from_mapping(
    data: Mapping[str, Any], *, source: str = CONFIG_FILE
) -> ProjectConfig:
    """The :class:`ProjectConfig` of an already parsed TOML document (pure)."""
    for name, value in data.items():
        if name not in _SECTIONS:
            shown = toml_key(str(name))
            shown = f"[{shown}]" if isinstance(value, Mapping) else shown
            known = ", ".join(f"[{s}]" for s in _SECTIONS)
            raise ProjectConfigError(f"{source}: unknown setting {shown} (known: {known})")
        if not isinstance(value, Mapping):
            raise ProjectConfigError(
                f"{source}: [{name}]: expected a table, got {show_value(value)}"
            )
    return ProjectConfig(
        verify=_verify(source, data.get("verify", {})),
        artifact=_artifact(source, data.get("artifact", {})),
        budget=_budget(source, data.get("budget", {})),
        prices=_prices(source, data.get("prices", {})),
        telemetry=_telemetry(source, data.get("telemetry", {})),
        policy=policy_from_mapping(data.get("policy", {}), source),
        tools=_tools(source, data.get("tools", {})),
        mcp=mcp_config_from_mapping(data.get("mcp", {}), source),
        store=_store(source, data.get("store", {})),
        model=model_config_from_mapping(data.get("model", {}), source),
        sandbox=_sandbox(source, data.get("sandbox", {})),
    )


def _sandbox(source: str, table: Mapping[str, Any]) -> SandboxConfig:
    check_known(source, "[sandbox]", table, ("mode", "network", "writable_roots", "deny_read"))
    mode = table.get("mode")
    if mode is not None:
        choices = " | ".join(f'"{m.value}"' for m in SandboxMode)
        if not isinstance(mode, str) or mode not in {m.value for m in SandboxMode}:
            raise _bad(source, "[sandbox] mode", choices, mode)
        mode = SandboxMode(mode)
    network = table.get("network")
    if network is not None and not isinstance(network, bool):
        # A list of allowed hosts would need a filtering proxy, which tether does not have:
        # say so rather than read a list as "on".
        raise _bad(source, "[sandbox] network", "true or false (no host lists)", network)
    lists: dict[str, tuple[str, ...] | None] = {}
    for key in ("writable_roots", "deny_read"):
        value = table.get(key)
        if value is None:
            lists[key] = None
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise _bad(source, f"[sandbox] {key}", "a list of paths", value)
        lists[key] = tuple(value)
    return SandboxConfig(
        mode=mode,
        network=network,
        writable_roots=lists["writable_roots"],
        deny_read=lists["deny_read"],
    )


def _store(source: str, table: Mapping[str, Any]) -> StoreConfig:
    check_known(source, "[store]", table, ("url", "lease_seconds", "pool_size"))
    url = table.get("url")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://"))
    ):
        raise _bad(source, "[store] url", "a postgresql:// URL", url)
    lease = None
    if "lease_seconds" in table:
        lease = _positive_number(source, "[store] lease_seconds", table["lease_seconds"])
    pool = None
    if "pool_size" in table:
        pool = _positive_int(source, "[store] pool_size", table["pool_size"], "connections")
    return StoreConfig(url=url, lease_seconds=lease, pool_size=pool)


def _verify(source: str, table: Mapping[str, Any]) -> VerifyConfig:
    check_known(source, "[verify]", table, ("command", "timeout", "required"))
    command = table.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise _bad(source, "[verify] command", "a non-empty shell command string", command)
    timeout = DEFAULT_VERIFY_TIMEOUT
    if "timeout" in table:
        timeout = _positive_number(source, "[verify] timeout", table["timeout"])
    required = table.get("required", False)
    if not isinstance(required, bool):
        raise _bad(source, "[verify] required", "true or false", required)
    return VerifyConfig(command=command, timeout=timeout, required=required)


def _artifact(source: str, table: Mapping[str, Any]) -> ArtifactConfig:
    check_known(source, "[artifact]", table, ("ignore",))
    ignore = table.get("ignore", [])
    if not isinstance(ignore, list):
        raise _bad(source, "[artifact] ignore", "a list of non-empty pattern strings", ignore)
    for index, pattern in enumerate(ignore, 1):
        if not isinstance(pattern, str) or not pattern.strip():
            raise _bad(
                source, f"[artifact] ignore: item {index}", "a non-empty pattern string", pattern
            )
    return ArtifactConfig(ignore=tuple(ignore))


def _budget(source: str, table: Mapping[str, Any]) -> BudgetConfig:
    check_known(source, "[budget]", table, (*_BUDGET_KEYS, "time"))
    values: dict[str, Any] = {}
    if "time" in table:
        time = table["time"]
        if not isinstance(time, str) or time not in {t.value for t in BudgetTime}:
            choices = " | ".join(f'"{t.value}"' for t in BudgetTime)
            raise _bad(source, "[budget] time", choices, time)
        values["time"] = BudgetTime(time)
    for key, unit in _BUDGET_KEYS.items():
        if key not in table:
            continue
        setting = f"[budget] {key}"
        if unit is None:
            values[key] = _positive_number(source, setting, table[key])
        elif unit == "dollars":
            values[key] = _positive_amount(source, setting, table[key], unit)
        else:
            values[key] = _positive_int(source, setting, table[key], unit)
    return BudgetConfig(**values)


_BUDGET_KEYS: Final[Mapping[str, str | None]] = {
    "max_steps": "steps",
    "max_tokens": "tokens",
    "max_seconds": None,  # seconds
    "max_tool_calls": "tool calls",
    "max_cost_usd": "dollars",
    "max_session_tokens": "tokens",
    "max_session_cost_usd": "dollars",
}
"""``[budget]``'s keys and the unit their error names (``None``: seconds)."""


def _telemetry(source: str, table: Mapping[str, Any]) -> TelemetryConfig:
    check_known(
        source, "[telemetry]", table, ("enabled", "endpoint", "capture_content", "service_name")
    )
    for key in ("enabled", "capture_content"):
        if key in table and not isinstance(table[key], bool):
            raise _bad(source, f"[telemetry] {key}", "true or false", table[key])
    endpoint = table.get("endpoint")
    if endpoint is not None and (
        not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))
    ):
        raise _bad(source, "[telemetry] endpoint", "an http:// or https:// URL", endpoint)
    service = table.get("service_name", "tether")
    if not isinstance(service, str) or not service.strip():
        raise _bad(source, "[telemetry] service_name", "a non-empty string", service)
    return TelemetryConfig(
        enabled=table.get("enabled"),
        endpoint=endpoint,
        capture_content=table.get("capture_content", False),
        service_name=service,
    )


_PRICE_KEYS: Final = ("input", "cached_input", "cache_write", "output", "reasoning")


def _prices(source: str, table: Mapping[str, Any]) -> tuple[tuple[str, Price], ...]:
    """``[prices."MODEL"]`` tables: dollars per million tokens (``input`` and ``output``
    required)."""
    out: dict[str, Price] = {}
    for model, row in table.items():
        where = f"[prices.{toml_key(str(model))}]"
        if not isinstance(row, Mapping):
            raise _bad(source, where, "a table of prices per million tokens", row)
        check_known(source, where, row, _PRICE_KEYS)
        for key in ("input", "output"):
            if key not in row:
                raise ProjectConfigError(f"{source}: {where}: {key} is required")
        values = {
            key: _amount(source, f"{where} {key}", row[key]) for key in _PRICE_KEYS if key in row
        }
        out[str(model)] = Price(**values)
    return tuple(out.items())


def _amount(source: str, setting: str, value: object) -> float:
    """A price: a finite number, zero allowed (a free model)."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    ):
        return float(value)
    raise _bad(source, setting, "a number of dollars per million tokens, 0 or more", value)


def _positive_amount(source: str, setting: str, value: object, unit: str) -> float:
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    raise _bad(source, setting, f"a positive number of {unit}", value)


@cache
def _env_name() -> re.Pattern[str]:
    """A variable name ``[tools] pass_env`` may list; compiled only when it lists one."""
    return re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tools(source: str, table: Mapping[str, Any]) -> ToolsConfig:
    check_known(source, "[tools]", table, ("pass_env",))
    names = table.get("pass_env", [])
    expected = "a list of environment variable names"
    if not isinstance(names, list):
        raise _bad(source, "[tools] pass_env", expected, names)
    for index, name in enumerate(names, 1):
        if not isinstance(name, str) or not _env_name().fullmatch(name):
            raise _bad(
                source,
                f"[tools] pass_env: item {index}",
                "an environment variable name (letters, digits, _)",
                name,
            )
    return ToolsConfig(pass_env=tuple(dict.fromkeys(names)))


def _positive_number(source: str, setting: str, value: object) -> float:
    return _positive_amount(source, setting, value, "seconds")


def _positive_int(source: str, setting: str, value: object, unit: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _bad(source, setting, f"a positive whole number of {unit}", value)


def _bad(source: str, setting: str, expected: str, value: object) -> ProjectConfigError:
    return ProjectConfigError(f"{source}: {setting}: expected {expected}, got {show_value(value)}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
