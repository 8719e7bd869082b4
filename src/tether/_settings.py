"""The one settings table: every option an agent is built from, declared once.

Rules of this module:

* :data:`SETTINGS` is the table. A row names a setting (an attribute of :class:`Settings`), its
  type, its default, its ``tether.toml`` key, its environment variable, its command-line flag,
  its help, whether it enters the configuration digest, and whether a session remembers it
  (``.tether/settings/<id>.json``, see :mod:`tether._cli.session_pick`).
* Every agent command's flags are generated from the table (:mod:`tether._cli.agent_flags`),
  so a new option is one row here (and one field of :class:`Settings`, which a test keeps in
  step) and every command has it; docs/config.md lists the table.
* The value of a setting is the first of, highest first: the flag, the environment
  variable, ``tether.toml``, the default. :func:`resolve_settings` is that rule; it reads
  nothing itself (the environment and the parsed ``tether.toml`` are passed in), so the
  precedence is testable as a pure function.
* Only :class:`Settings` (with the workspace's files: ``tether.toml``'s tables, ``AGENTS.md``,
  the tools) decides the configuration digest: every entry point (``tether run``, the REPL,
  ``resume``, ``retry``, ``submit``, ``worker``, the crash lab, the library ``Agent``) builds
  its agent from one :class:`Settings` value through the one composition
  (:func:`tether._runtime.compose.compose`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tether._sandbox.policy import SandboxMode
from tether._stores.durability import Durability
from tether.core.records import record, replace
from tether.core.stops import BudgetTime
from tether.errors import ConfigurationError

if TYPE_CHECKING:
    from tether._project import ProjectConfig

__all__ = [
    "SETTINGS",
    "Durability",
    "Setting",
    "Settings",
    "override_settings",
    "resolve_settings",
]


class Kind(StrEnum):
    """How a setting's value is written on the command line and in the environment."""

    TEXT = "text"
    PATH = "path"
    SECONDS = "seconds"  # a positive, finite number
    AMOUNT = "amount"  # a positive, finite number of US dollars
    COUNT = "count"  # a positive integer
    FLAG = "flag"  # a boolean switch: given or not
    CHOICE = "choice"  # one of the values of the row's ``choices`` enum
    LIST = "list"  # a repeatable flag


@record
class Setting:
    """One row of the table (see the module docstring)."""

    name: str
    kind: Kind
    default: Any
    help: str
    flag: str
    short: str | None = None
    env: str | None = None
    toml: str | None = None
    """The ``tether.toml`` key, as the docs name it (``[model] base_url``); a table alone
    (``[model]``) is read by the setting's own code, not by :func:`resolve_settings`."""
    digest: bool = False
    """Whether the value enters the configuration digest (changing it meets the gate)."""
    remembered: bool = False
    """Whether a session remembers the value (never a credential)."""
    metavar: str | None = None
    fallback: str | None = None
    """The default in words, for the help (``60``, ``unlimited``), when it is not nothing."""
    choices: type[StrEnum] | None = None
    """The enum a :attr:`Kind.CHOICE` setting takes its values from."""

    def toml_value(self, project: ProjectConfig) -> Any:
        """The value ``tether.toml`` gives (parsed and checked already), or ``None``.

        ``[table] key`` is ``project.table.key``: the parsed configuration's attributes
        are named as the file's tables and keys."""
        if self.toml is None or " " not in self.toml:
            return None
        table, key = self.toml.split(" ", 1)
        return attrgetter(f"{table.strip('[]')}.{key}")(project)


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "model", Kind.TEXT, None, short="-m", flag="--model", env="TETHER_MODEL",
        toml="[model] model", digest=True, remembered=True, metavar="MODEL",
        help="Model id for the OpenAI-compatible endpoint (e.g. openai/gpt-4o-mini), "
        "anthropic:MODEL, or scripted:PATH for a scripted model.",
    ),
    Setting(
        "base_url", Kind.TEXT, None, flag="--base-url", env="TETHER_BASE_URL",
        toml="[model] base_url", digest=True, remembered=True,
        metavar="URL",
        fallback="https://openrouter.ai/api/v1 for the OpenAI-compatible API; for "
        "anthropic: $ANTHROPIC_BASE_URL, else https://api.anthropic.com",
        help="Endpoint of the model API: the root before /chat/completions (…/v1) for the "
        "OpenAI-compatible API; the root before /v1/messages, without /v1, for anthropic:.",
    ),
    Setting(
        # No variable here: each adapter reads its own provider's ($TETHER_API_KEY for the
        # OpenAI-compatible API, $ANTHROPIC_API_KEY for anthropic:), so that a key only goes
        # to the provider it was given for.
        "api_key", Kind.TEXT, None, flag="--api-key", metavar="KEY",
        fallback="$TETHER_API_KEY ($ANTHROPIC_API_KEY for anthropic:, never "
        "$TETHER_API_KEY), or the variable [model] api_key_env names",
        help="API key. Never printed or logged. Prefer a variable: other local users can "
        "read a flag in the process list.",
    ),
    Setting(
        "timeout", Kind.SECONDS, None, flag="--timeout", toml="[model] timeout",
        remembered=True, metavar="SECONDS",
        fallback="60", help="Seconds one model request may take.",
    ),
    Setting(
        "model_options", Kind.LIST, (), flag="--model-option", toml="[model]", digest=True,
        metavar="KEY=VALUE",
        help="A [model] setting of tether.toml for this run, as KEY=VALUE in TOML syntax "
        "(repeatable): temperature=0.2, max_tokens=4096, reasoning_effort=high, "
        "'provider={order=[\"anthropic\"]}', tool_choice=required, "
        "parallel_tool_calls=false, idle_timeout=120, retries=0, stream=false, "
        "api_key_env=MY_KEY. See docs/config.md.",
    ),
    Setting(
        "workspace", Kind.PATH, None, short="-w", flag="--workspace", metavar="DIR",
        fallback="the nearest folder at or above the current one holding tether.toml or "
        ".tether/, no higher than a git top level; else the current folder",
        help="Workspace the tools work in, whose tether.toml and .tether/ are used.",
    ),
    Setting(
        "sessions_dir", Kind.PATH, None, flag="--sessions-dir", metavar="DIR",
        fallback=".tether/sessions in the workspace", help="Folder of session logs.",
    ),
    Setting(
        "durability", Kind.CHOICE, Durability.DURABLE, flag="--durability", choices=Durability,
        fallback="durable", help="durable: fdatasync every commit (survives power loss); process: "
        "write only (survives a crash of tether, not of the machine).",
    ),
    Setting(
        "system_prompt", Kind.TEXT, None, flag="--system-prompt", digest=True,
        remembered=True, metavar="TEXT",
        fallback="tether's own",
        help="System prompt. AGENTS.md in the workspace is appended.",
    ),
    Setting(
        "tool_timeout", Kind.SECONDS, None, flag="--tool-timeout", remembered=True,
        metavar="SECONDS", help="Upper bound in seconds for one tool call (e.g. a bash command).",
    ),
    Setting(
        "require_verified", Kind.FLAG, False, flag="--require-verified",
        toml="[verify] required",
        help="A run that changed files must end with a passing check of the files as they "
        "are now ([verify] command of tether.toml): up to two follow-up runs ask the model "
        "to verify; exit 66 if it is still unverified.",
    ),
    Setting(
        "assume_yes", Kind.FLAG, False, short="-y", flag="--yes",
        help="Allow every call the policy of tether.toml says to ask about (deny rules "
        "still deny). The decision is recorded as '--yes'.",
    ),
    Setting(
        "max_steps", Kind.COUNT, None, flag="--max-steps", toml="[budget] max_steps",
        metavar="N", fallback="unlimited",
        help="Model steps a run may take.",
    ),
    Setting(
        "max_tokens", Kind.COUNT, None, flag="--max-tokens", toml="[budget] max_tokens",
        metavar="N",
        fallback="unlimited", help="Input + output tokens a run may use.",
    ),
    Setting(
        "max_seconds", Kind.SECONDS, None, flag="--max-seconds", toml="[budget] max_seconds",
        metavar="SECONDS",
        fallback="unlimited",
        help="Time a run may take in seconds, from its first start, as --budget-time counts it.",
    ),
    Setting(
        "budget_time", Kind.CHOICE, BudgetTime.ACTIVE, flag="--budget-time",
        toml="[budget] time", choices=BudgetTime, metavar="MODE", fallback="active",
        help="What --max-seconds counts: active (the time processes drove the run; a crash's "
        "downtime and a wait for a person do not count) or wall (wall-clock time).",
    ),
    Setting(
        "max_tool_calls", Kind.COUNT, None, flag="--max-tool-calls",
        toml="[budget] max_tool_calls", metavar="N", fallback="unlimited",
        help="Tool calls a run may start.",
    ),
    Setting(
        "max_cost_usd", Kind.AMOUNT, None, flag="--max-cost-usd",
        toml="[budget] max_cost_usd", metavar="USD", fallback="unlimited",
        help="US dollars a run may spend (the provider's reported cost, else [prices]).",
    ),
    Setting(
        "max_session_tokens", Kind.COUNT, None, flag="--max-session-tokens",
        toml="[budget] max_session_tokens", metavar="N", fallback="unlimited",
        help="Input + output tokens the whole session may use.",
    ),
    Setting(
        "max_session_cost_usd", Kind.AMOUNT, None, flag="--max-session-cost-usd",
        toml="[budget] max_session_cost_usd", metavar="USD", fallback="unlimited",
        help="US dollars the whole session may spend.",
    ),
    Setting(
        "store", Kind.TEXT, None, flag="--store", env="TETHER_STORE_URL", toml="[store] url",
        metavar="URL",
        fallback="the local file store",
        help="A shared session store, postgresql://… (see docs/scale-out.md).",
    ),
    Setting(
        "lease_seconds", Kind.SECONDS, None, flag="--lease-seconds",
        env="TETHER_LEASE_SECONDS", toml="[store] lease_seconds",
        metavar="SECONDS",
        fallback="30", help="Length of a writer's lease on a session of a shared store.",
    ),
    Setting(
        "pool_size", Kind.COUNT, None, flag="--pool-size", env="TETHER_STORE_POOL_SIZE",
        toml="[store] pool_size", metavar="N", fallback="10",
        help="Most connections a process opens to a shared store (one pool for all its "
        "sessions, lease renewals and workspace tables).",
    ),
    Setting(
        "environment", Kind.TEXT, None, flag="--environment",
        env="TETHER_ENVIRONMENT_IDENTITY", metavar="ID",
        fallback="the workspace path",
        help="The environment identity. Replays of tools are "
        "gated on it, and a worker only drives sessions recorded with its identity.",
    ),
    # The sandbox: what the commands the agent runs (bash, MCP stdio servers) may do. The
    # rows enter the digest through the tools' definitions (the model is told its confines),
    # so a resume under another sandbox meets the configuration gate.
    Setting(
        "sandbox", Kind.CHOICE, SandboxMode.WORKSPACE_WRITE, flag="--sandbox",
        env="TETHER_SANDBOX", toml="[sandbox] mode", digest=True, choices=SandboxMode,
        metavar="MODE", fallback="workspace-write",
        help="Confinement of the commands the agent runs (bubblewrap): off, read-only, or "
        "workspace-write (writes only in the workspace; tether's .tether/ and credential "
        "folders hidden). See docs/sandbox.md.",
    ),
    Setting(
        "sandbox_network", Kind.FLAG, False, flag="--sandbox-network",
        env="TETHER_SANDBOX_NETWORK", toml="[sandbox] network", digest=True,
        help="Let sandboxed commands reach the network (off by default).",
    ),
    Setting(
        "writable_roots", Kind.LIST, (), flag="--writable-root", toml="[sandbox] writable_roots",
        digest=True, metavar="DIR",
        help="A folder besides the workspace that sandboxed commands may write (repeatable; "
        "e.g. a cache).",
    ),
    Setting(
        "deny_read", Kind.LIST, (), flag="--deny-read", toml="[sandbox] deny_read",
        metavar="PATH",
        fallback="~/.ssh, ~/.aws, ~/.config/gcloud, ~/.netrc, ~/.docker and other credential "
        "folders, always",
        help="A path sandboxed commands may not read, added to the built-in list (repeatable).",
    ),
)  # fmt: skip
"""The table. The order is the order of the flags in ``--help``."""

_BY_NAME: Final = {row.name: row for row in SETTINGS}


@record
class Settings:
    """One value of every setting of :data:`SETTINGS` (a test keeps the two in step)."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    model_options: tuple[str, ...] = ()
    workspace: Path | None = None
    sessions_dir: Path | None = None
    durability: Durability = Durability.DURABLE
    system_prompt: str | None = None
    tool_timeout: float | None = None
    require_verified: bool = False
    assume_yes: bool = False
    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    budget_time: BudgetTime = BudgetTime.ACTIVE
    max_tool_calls: int | None = None
    max_cost_usd: float | None = None
    max_session_tokens: int | None = None
    max_session_cost_usd: float | None = None
    store: str | None = None
    lease_seconds: float | None = None
    pool_size: int | None = None
    environment: str | None = None
    sandbox: SandboxMode = SandboxMode.WORKSPACE_WRITE
    sandbox_network: bool = False
    writable_roots: tuple[str, ...] = ()
    deny_read: tuple[str, ...] = ()


def _parse_env(row: Setting, text: str) -> Any:
    """A setting's value from its environment variable (blank means unset)."""
    value = text.strip()
    if row.kind is Kind.SECONDS:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise ConfigurationError(
                f"{row.env} must be a positive number of seconds, got {text!r}"
            )
        return number
    if row.kind is Kind.COUNT:
        if not value.isdigit() or int(value) < 1:
            raise ConfigurationError(f"{row.env} must be a positive whole number, got {text!r}")
        return int(value)
    if row.kind is Kind.PATH:
        return Path(value)
    if row.kind is Kind.CHOICE:
        assert row.choices is not None
        try:
            return row.choices(value.lower())
        except ValueError:
            known = ", ".join(c.value for c in row.choices)
            raise ConfigurationError(f"{row.env} must be one of {known}, got {text!r}") from None
    if row.kind is Kind.FLAG:
        answer = _SWITCHES.get(value.lower())
        if answer is None:
            raise ConfigurationError(f"{row.env} must be true or false (1/0), got {text!r}")
        return answer
    return value


_SWITCHES: Final = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}


def _normal(row: Setting, value: Any) -> Any:
    """A flag value in the type :class:`Settings` holds."""
    if row.kind is Kind.LIST:
        return tuple(value)
    if row.kind is Kind.CHOICE:
        assert row.choices is not None
        try:
            return row.choices(value)
        except ValueError:
            known = ", ".join(c.value for c in row.choices)
            raise ConfigurationError(f"{row.name} must be one of {known}, got {value!r}") from None
    if row.kind is Kind.PATH:
        return Path(value)
    return value


def _given(row: Setting, value: Any) -> bool:
    """Whether a flag value counts as given: a blank text (``--model ''``) does not, as a
    blank variable does not, so the next source applies."""
    if row.kind is Kind.FLAG:
        return value is True
    if row.kind is Kind.LIST:
        return bool(value)
    if row.kind is Kind.TEXT and isinstance(value, str):
        return bool(value.strip())
    return value is not None


def resolve_settings(
    flags: Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    project: ProjectConfig | None,
) -> Settings:
    """Each setting from its flag, else its environment variable, else ``tether.toml``, else
    its default. ``flags`` maps names to the values given (a ``None``, a ``False`` flag or an
    empty list is "not given"); an unknown name is a :class:`ConfigurationError`."""
    unknown = sorted(set(flags) - set(_BY_NAME))
    if unknown:
        raise ConfigurationError(f"unknown setting {unknown[0]!r}")
    values: dict[str, Any] = {}
    for row in SETTINGS:
        flag = flags.get(row.name)
        if _given(row, flag):
            values[row.name] = _normal(row, flag)
            continue
        text = environ.get(row.env, "") if row.env else ""
        if text.strip():
            values[row.name] = _parse_env(row, text)
            continue
        if project is not None:
            configured = row.toml_value(project)
            if configured is not None:
                values[row.name] = configured
                continue
        values[row.name] = row.default
    return Settings(**values)


def override_settings(settings: Settings, given: Mapping[str, Any]) -> Settings:
    """``settings`` with the values ``given`` (as flags: those not given are kept)."""
    unknown = sorted(set(given) - set(_BY_NAME))
    if unknown:
        raise ConfigurationError(f"unknown setting {unknown[0]!r}")
    changes = {
        name: _normal(_BY_NAME[name], value)
        for name, value in given.items()
        if _given(_BY_NAME[name], value)
    }
    return replace(settings, **changes) if changes else settings
