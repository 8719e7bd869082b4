"""The composition root: everything an agent is built from, read and built in one place.

Every entry point — ``tether run``, the REPL, ``resume``, ``retry``, ``submit``, ``worker``,
the crash lab and the library :class:`~tether.Agent` — builds its agent with :func:`compose`
from one :class:`~tether._settings.Settings` value (the one settings table,
:mod:`tether._settings`) and the :class:`Seams` it plugs in. So the same workspace and the
same settings give the same configuration digest whichever way a session is driven.

:func:`compose` is the only part of the runtime that reads the outside world to configure
an agent — ``tether.toml``, the workspace's ``AGENTS.md``, the model's key variable — and
that chooses implementations: the model adapter (:func:`load_configured_model`), the tool
registry (the built-ins, plus ``verify`` when a check command is configured), the guards,
the configuration snapshot, the session-store opener (the file store unless a shared store
is set), the workspace-database opener (``.tether/effects.db`` unless another is given),
the clock and the id source. The executor (:mod:`tether._runtime.executor`) receives the
result, a :class:`Composition`, and reads nothing else.

Steps, in this order (so the first problem is the one reported):

1. the workspace (the setting, else the root found from the current folder) must be a
   directory; its real path is the tools' root;
2. ``tether.toml`` (unless the seams give it), the budget and ``require_verified``
   (which needs a check command);
3. the guards, over the workspace database of this agent (:class:`SessionEvidence`);
4. the model: the adapter the settings name (or the caller's), ``[model]``'s request
   options and identity suffix, the retries;
5. the state the tools must never touch (:class:`~tether._tools.workspace.ProtectedState`)
   and the sandbox of the commands the agent runs (:mod:`tether._sandbox`);
6. the tools: the caller's or the built-ins, plus ``verify`` for a configured check
   command, plus the tools of the MCP servers of ``[mcp.servers]`` (started now if this
   process has not started them yet, :mod:`tether._mcp`); names must be unique; when any
   of them runs programs, the sandbox is checked (it fails closed) before an MCP server
   starts, else at the agent's first call (:meth:`Composition.ensure_sandbox`);
7. the system prompt, with ``AGENTS.md`` appended (:func:`load_agents_md`);
8. the environment identity and the configuration snapshot;
9. the masker (a credential in the snapshot is refused) and the masked event sink;
10. the session-store opener, the workspace-database opener, the clock and the ids;
11. the spans: the ``telemetry`` seam, else what the ``OTEL_*`` variables and
    ``[telemetry]`` ask for (:mod:`tether._runtime.tracing`; usually nothing).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tether._clock import SYSTEM_CLOCK, Clock
from tether._credentials import Masker
from tether._ids import IdSource, new_uuid7
from tether._inputs import read_optional_file
from tether._models.base import ModelAdapter
from tether._models.options import (
    ConfiguredModel,
    ModelConfig,
    identity_suffix,
    merge,
    output_options_for,
    parse_model_options,
)
from tether._project import (
    CONFIG_FILE,
    BudgetConfig,
    ProjectConfig,
    find_workspace_root,
    load_project_config,
)
from tether._runtime.evidence import SessionEvidence
from tether._runtime.guards import Authorizer, Guards
from tether._runtime.masking import masked_sink
from tether._runtime.retry import RetryPolicy
from tether._runtime.spend import Spending
from tether._runtime.tracing import Tracing
from tether._sandbox.bwrap import Sandbox
from tether._sandbox.policy import DEFAULT_DENY_READ, SandboxMode, exposed_roots, resolve_policy
from tether._settings import Settings
from tether._stores.durability import Durability
from tether._stores.opener import FileSessions
from tether._telemetry import Telemetry, open_telemetry
from tether._tools.base import Tool, ToolRegistry
from tether._tools.builtin import builtin_tools
from tether._tools.workspace import ProtectedState
from tether.core.configuration import AgentConfiguration, environment_identity
from tether.core.records import field, record, replace
from tether.errors import ConfigurationError

if TYPE_CHECKING:  # types only: the event types' module is the executor's to load, the
    # seams' protocols load with what implements them
    from tether._runtime.events import Event, EventSink
    from tether._stores.protocol import SessionOpener
    from tether._wsdb.protocol import WorkspaceDB, WorkspaceDBOpener

__all__ = [
    "AGENTS_FILE",
    "DEFAULT_SYSTEM_PROMPT",
    "ENVIRONMENT_VARIABLE",
    "MAX_AGENTS_BYTES",
    "Composition",
    "LoadedModel",
    "Seams",
    "compose",
    "load_agents_md",
    "load_configured_model",
    "model_config",
    "system_prompt_for",
]

DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a careful software agent working in a workspace. Use the tools to read "
    "files, run commands and make edits. Be concise. When you are done, answer with a "
    "short summary of what you did and what you verified."
)
AGENTS_FILE: Final = "AGENTS.md"
MAX_AGENTS_BYTES: Final = 64 * 1024
ENVIRONMENT_VARIABLE: Final = "TETHER_ENVIRONMENT_IDENTITY"


@record
class Composition:
    """What the executor is built from (see the module docstring)."""

    workspace: Path
    model: ModelAdapter
    project: ProjectConfig
    budget: BudgetConfig
    require_verified: bool
    registry: ToolRegistry
    guards: Guards
    system_prompt: str
    durability: Durability
    output_options: Mapping[str, Any]
    sessions_dir: Path | None
    protected: ProtectedState
    sandbox: Sandbox
    tool_timeout: float | None
    environment: str
    configuration: AgentConfiguration
    masker: Masker
    on_event: EventSink | None
    sessions: SessionOpener
    evidence: SessionEvidence
    clock: Clock
    ids: IdSource
    owned_sessions: Any = None
    """The session opener compose made itself and the agent closes (a shared store's
    connections and lease renewal), or ``None``."""
    settings: Settings = field(default_factory=Settings)
    """The settings the agent was built from."""
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    """Automatic retries of a transient model failure."""
    tracing: Tracing = field(default_factory=lambda: Tracing(None))
    """The OpenTelemetry spans of this agent (:mod:`tether._runtime.tracing`)."""
    spending: Spending = field(default_factory=lambda: Spending(""))
    """The money side of the spend: the model's price (``[prices]``, else tether's table)
    and the costs providers reported (:mod:`tether._runtime.spend`)."""
    sandbox_due: bool = False
    """Some tool runs commands: :meth:`ensure_sandbox` checks the sandbox (once) before the
    first call drives a session (it fails closed)."""

    def ensure_sandbox(self) -> None:
        """Check the sandbox's mechanism when the tools need it (once per agent and policy;
        :class:`~tether.errors.SandboxUnavailable` when it cannot work). The executor calls
        it before it opens or creates a session, so a refused agent leaves no trace."""
        if self.sandbox_due:
            self.sandbox.ensure()

    def close(self) -> None:
        """Close what was opened for the agent: the workspace database, a shared store's
        connections (idempotent; both are opened anew when used again)."""
        try:
            self.evidence.close()
        finally:
            if self.owned_sessions is not None:
                self.owned_sessions.close()


def load_agents_md(workspace: Path) -> str | None:
    """The first :data:`MAX_AGENTS_BYTES` of the workspace's ``AGENTS.md`` as text.

    ``None`` when there is none or it is blank; the rest of a longer file is ignored. It
    must be a regular file. A symbolic link is followed only to a file inside the
    workspace: the text goes to the model provider, and a link must not carry a file
    from elsewhere (a key, a credentials file) into the prompt. A FIFO, a device, a
    directory, a link leading outside or an unreadable file raises
    :class:`~tether.errors.InputFileError` (exit 2) — it never blocks and is never
    silently skipped.
    """
    path = workspace / AGENTS_FILE
    data = read_optional_file(
        path, str(path), limit=MAX_AGENTS_BYTES, truncate=True, within=workspace
    )
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if text.strip() else None


@record
class Seams:
    """What an entry point plugs in besides its :class:`~tether._settings.Settings`: the
    callbacks of its user interface and the implementations tests and embedders inject.

    None of these enters the configuration digest: what shapes a model request is a setting.
    """

    on_event: EventSink | None = None
    authorize: Authorizer | None = None
    """Asks a person about a call the policy marks ``ask`` (none: nobody can be asked)."""
    ask_by_default: bool | None = None
    """``ask`` for side-effecting calls no rule names (default: whether ``authorize`` is
    given), as in the REPL."""
    park_approvals: bool = False
    """Park an ``ask`` call nobody can be asked about, instead of denying it."""
    read_agents_md: bool = True
    project: ProjectConfig | None = None
    """``tether.toml`` already read (default: read from the workspace)."""
    budget: BudgetConfig | None = None
    """The run budget instead of ``[budget]`` and the budget settings."""
    output_options: Mapping[str, Any] | None = None
    """The request options instead of those ``[model]`` and ``--model-option`` give."""
    wrap_model: Callable[[ModelAdapter], ModelAdapter] | None = None
    """Wraps the configured model (the CLI's progress display watches its answers); the
    wrapper must keep the identities, so the configuration digest is unchanged."""
    secrets: Iterable[str] = ()
    session_store: SessionOpener | None = None
    workspace_db: WorkspaceDBOpener | None = None
    clock: Clock | None = None
    ids: IdSource | None = None
    model_retries: int | None = None
    """Automatic retries of a transient model failure (default: ``[model] retries`` for a
    model tether loads from the settings; 0 for an adapter the caller built, whose client
    is the caller's to configure)."""
    retry_base_delay: float = 1.0
    telemetry: Telemetry | None = None
    """Where spans go (default: what the ``OTEL_*`` variables and ``[telemetry]`` of
    ``tether.toml`` say, :func:`tether._telemetry.open_telemetry`; usually nothing)."""
    check_sandbox: bool = True
    """Check the sandbox's mechanism before any tool can run (fail closed). ``False`` only
    for an agent that never runs a tool (``tether replay`` compares configurations): the
    policy, and so the digest, are the same; only the check's process is not started."""


@record
class LoadedModel:
    """The model an agent talks to, as the settings and ``[model]`` configure it."""

    adapter: ModelAdapter
    output_options: Mapping[str, Any]
    retries: int
    config: ModelConfig


def model_config(settings: Settings, project: ProjectConfig) -> ModelConfig:
    """``[model]`` of tether.toml with ``--model-option`` over it."""
    return merge(project.model, parse_model_options(settings.model_options), "--model-option")


def load_configured_model(
    settings: Settings,
    project: ProjectConfig,
    given: ModelAdapter | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> LoadedModel:
    """The model of ``settings`` (or ``given``, an adapter the caller built), wrapped so that
    its routing identity names the ``[model]`` key variable and extra headers, with the
    request options ``[model]`` and ``--model-option`` give.

    Everything that shapes the configuration digest on the model's side is decided here, for
    every entry point alike.
    """
    from tether._models import load_model

    env = os.environ if environ is None else environ
    config = model_config(settings, project)
    inner = given
    if inner is None:
        api_key = settings.api_key if (settings.api_key or "").strip() else None
        if api_key is None and config.api_key_env:
            api_key = env.get(config.api_key_env, "").strip() or None
            if api_key is None:
                raise ConfigurationError(
                    f"[model] api_key_env names {config.api_key_env}, which is not set"
                )
        inner = load_model(
            settings.model or config.model,
            base_url=settings.base_url or config.base_url,
            api_key=api_key,
            timeout=settings.timeout if settings.timeout is not None else config.timeout,
            idle_timeout=config.idle_timeout,
            stream=config.stream,
            extra_headers=config.extra_headers or None,
            environ=env,
        )
    api = "anthropic" if inner.adapter_identity.startswith("anthropic:") else "chat-completions"
    host = inner.routing_identity.split("/", 1)[0]
    options = output_options_for(config, api=api, base_host=host, model=inner.model)
    retries = config.retries if given is None else 0
    return LoadedModel(ConfiguredModel(inner, identity_suffix(config)), options, retries, config)


def _budget(settings: Settings, project: ProjectConfig) -> BudgetConfig:
    """The run budget: the budget settings (flags over ``[budget]``, which they default to)."""
    return replace(
        project.budget,
        max_steps=settings.max_steps,
        max_tokens=settings.max_tokens,
        max_seconds=settings.max_seconds,
        time=settings.budget_time,
        max_tool_calls=settings.max_tool_calls,
        max_cost_usd=settings.max_cost_usd,
        max_session_tokens=settings.max_session_tokens,
        max_session_cost_usd=settings.max_session_cost_usd,
    )


def compose(
    settings: Settings,
    model: ModelAdapter | None = None,
    tools: Sequence[Tool] | None = None,
    seams: Seams = Seams(),
) -> Composition:
    """Build everything an agent needs from one settings value (the module docstring gives
    the steps). ``model`` is an adapter the caller built (default: the one ``settings``
    names); ``tools`` replaces the built-ins."""
    # 1. The workspace: the settings name it, or the one the current folder belongs to.
    real = Path(os.path.realpath(find_workspace_root(settings.workspace).path))
    # 2. tether.toml, the budget, require_verified.
    config = seams.project if seams.project is not None else load_project_config(real)
    limits = seams.budget if seams.budget is not None else _budget(settings, config)
    required = settings.require_verified or config.verify.required
    if required and config.verify.command is None:
        from tether._completion.verify import NO_COMMAND  # the gate's modules: only here

        raise ConfigurationError(f"verification is required but {NO_COMMAND}")
    # 3. The guards, over this agent's workspace database.
    store_url = settings.store if seams.session_store is None else None
    evidence = SessionEvidence(_workspace_db(real, store_url, seams))
    guards = Guards(
        real,
        config,
        evidence.records,
        authorize=seams.authorize,
        assume_yes=settings.assume_yes,
        ask_by_default=seams.ask_by_default,
        park=seams.park_approvals,
    )
    # 4. The model, its request options and its retries.
    adapter, options, retries = _model(settings, config, model, seams)
    # 5. The layout the tools must never touch, the sandbox; 6. the tools (the sandbox
    # checked before any MCP server starts); 7. the system prompt and AGENTS.md.
    protected = ProtectedState.for_workspace(real, settings.sessions_dir)
    sandbox = _sandbox(settings, real, protected)
    registry, sandbox_due = _registry(tools, config, real, guards, sandbox, seams.check_sandbox)
    prompt = system_prompt_for(settings, real, read_agents_md=seams.read_agents_md)
    # 8. The configuration snapshot.
    identity = environment_identity(settings.environment, str(real))
    configuration = AgentConfiguration.build(
        model=adapter.model,
        adapter_identity=adapter.adapter_identity,
        routing_identity=adapter.routing_identity,
        system_prompt=prompt,
        snapshot_tools=registry.snapshot_tools(),
        declarations=registry.declarations(),
        output_options=options,
        environment=identity,
    )  # everything that shapes a model request; its digest gates retries after a crash
    # 9. The masker; 10. where sessions go, the clock and the ids.
    masker = _masker(configuration, seams.secrets)
    time_source = seams.clock if seams.clock is not None else SYSTEM_CLOCK
    id_source = seams.ids if seams.ids is not None else new_uuid7
    sessions, owned = _sessions(settings, store_url, real, seams, time_source, id_source)
    # 11. The spans (telemetry: the seam, else the OTEL_* variables and [telemetry]).
    telemetry = seams.telemetry if seams.telemetry is not None else open_telemetry(config.telemetry)
    tracing = Tracing(telemetry, model=adapter.model, provider=adapter.provider)
    return Composition(
        workspace=real,
        model=adapter,
        project=config,
        budget=limits,
        require_verified=required,
        registry=registry,
        guards=guards,
        system_prompt=prompt,
        durability=Durability(settings.durability),
        output_options=options,
        sessions_dir=settings.sessions_dir,
        protected=protected,
        sandbox=sandbox,
        tool_timeout=settings.tool_timeout,
        environment=identity,
        configuration=configuration,
        masker=masker,
        on_event=masked_sink(
            _tee(tracing.on_event, seams.on_event) if tracing.enabled else seams.on_event, masker
        ),
        sessions=sessions,
        evidence=evidence,
        clock=time_source,
        ids=id_source,
        owned_sessions=owned,
        settings=settings,
        retry_policy=RetryPolicy(retries=retries, base_delay=float(seams.retry_base_delay)),
        spending=Spending(adapter.model, dict(config.prices)),
        tracing=tracing,
        sandbox_due=sandbox_due,
    )


def _model(
    settings: Settings, config: ProjectConfig, given: ModelAdapter | None, seams: Seams
) -> tuple[ModelAdapter, Mapping[str, Any], int]:
    """The model as the settings configure it (wrapped by the seam), its request options
    (the seam's, else ``[model]``'s) and its automatic retries."""
    loaded = load_configured_model(settings, config, given)
    adapter = seams.wrap_model(loaded.adapter) if seams.wrap_model else loaded.adapter
    options = seams.output_options if seams.output_options is not None else loaded.output_options
    retries = seams.model_retries if seams.model_retries is not None else loaded.retries
    return adapter, dict(options), retries


def _workspace_db(workspace: Path, store_url: str | None, seams: Seams) -> WorkspaceDBOpener:
    """The seam's opener, else: on a shared store its tables are in the store's database
    (the file-change journal stays in .tether/effects.db); else .tether/effects.db."""
    if seams.workspace_db is not None:
        return seams.workspace_db
    if store_url:
        return _shared_db_opener(workspace, store_url)
    return _effects_db_opener(workspace)


_TETHER_SOURCES: Final = Path(__file__).resolve().parents[2]
"""The folder tether's package is imported from (``src/`` of a checkout, or
``site-packages``)."""


@functools.cache
def _own_roots() -> tuple[Path, ...]:
    """The folders under a private root that tether's own interpreter and sources need
    (:func:`~tether._sandbox.policy.exposed_roots`), found once: they are this process's
    and do not move while it runs (resolving them was a third of building an agent)."""
    return exposed_roots((sys.prefix, sys.exec_prefix, sys.base_prefix, _TETHER_SOURCES))


def sandbox_for(settings: Settings, workspace: Path | None = None) -> Sandbox:
    """The sandbox an agent built from ``settings`` would have (``tether sandbox check``,
    ``tether mcp list``), on ``workspace`` (default: the settings' workspace)."""
    real = Path(os.path.realpath(workspace or find_workspace_root(settings.workspace).path))
    return _sandbox(settings, real, ProtectedState.for_workspace(real, settings.sessions_dir))


def _sandbox(settings: Settings, workspace: Path, protected: ProtectedState) -> Sandbox:
    """The agent's sandbox: the settings' mode and paths, tether's own state hidden, and
    ``tether.toml`` (whose ``[policy]`` says what the agent may do) read-only."""
    policy = resolve_policy(
        SandboxMode(settings.sandbox),
        workspace=workspace,
        network=settings.sandbox_network,
        writable_roots=settings.writable_roots,
        deny_read=(*DEFAULT_DENY_READ, *settings.deny_read),
        hidden=(protected.state_dir, protected.sessions_dir),
        read_only=(workspace / CONFIG_FILE,),
        # tether's own environment stays visible where the private /tmp would hide it (a
        # checkout or venv under /tmp): the commands run its Python, its MCP servers. Not
        # sys.path, whose first entry may be the current folder.
        exposed=_own_roots(),
        home=os.path.expanduser("~"),
    )
    return Sandbox(policy)


def _registry(
    tools: Sequence[Tool] | None,
    config: ProjectConfig,
    workspace: Path,
    guards: Guards,
    sandbox: Sandbox,
    check_sandbox: bool = True,
) -> tuple[ToolRegistry, bool]:
    """The caller's tools or the built-ins, plus ``verify`` for a configured check command,
    plus the MCP servers' tools; names must be unique. Fail closed: when a tool runs
    programs under a sandbox that cannot work here, the agent's first call is refused
    (:class:`~tether.errors.SandboxUnavailable`) before it opens a session — the second
    value says the check is due (:meth:`Composition.ensure_sandbox`); an MCP server is
    started here, so with one the check is made now, before it starts."""
    chosen = list(tools) if tools is not None else builtin_tools(pass_env=config.tools.pass_env)
    if config.verify.command is not None and all(t.name != "verify" for t in chosen):
        # Imported here: the completion gate's modules are needed only with a check command.
        from tether._completion.verify import VerifyTool

        chosen.append(VerifyTool(lambda: guards.verifier))
    confined = [t for t in chosen if t.runs_commands]
    servers = any(s.sandboxed for s in config.mcp.servers if s.command is not None)
    if check_sandbox and (servers or (confined and config.mcp.servers)):
        sandbox.ensure()  # before any server starts: a refused agent starts nothing
    for tool in confined:
        tool.confine(sandbox.policy.tool_note())
    if config.mcp.servers:
        # Imported here: the MCP manager brings asyncio, ssl and a thread pool (~15 ms), and
        # an agent without MCP servers (most, and every resume of one) needs none of them.
        from tether._mcp.tools import mcp_tools

        # Starts the servers not running yet (stdio ones inside the sandbox).
        chosen.extend(mcp_tools(config.mcp, workspace, sandbox))
    # The check of the commands' sandbox waits for the first call: one bubblewrap process
    # (~7-20 ms) is most of what building an agent would cost, and an agent that never
    # drives a session (inspecting its configuration, a finished session) needs none.
    due = check_sandbox and bool(confined)
    return ToolRegistry(chosen), due


def _masker(configuration: AgentConfiguration, secrets: Iterable[str]) -> Masker:
    """Credentials are masked in every fact and event; one in the configuration snapshot
    could not be, since the log records the snapshot's digest with it (the prompt itself
    is only recorded as a digest), so it is refused."""
    masker = Masker.for_process(secrets)
    if masker.contains(configuration.snapshot):
        raise ConfigurationError(
            "a credential occurs in the agent's configuration (model id, endpoint or tool "
            "declarations), which every model attempt records; remove it"
        )
    return masker


def _sessions(
    settings: Settings,
    store_url: str | None,
    workspace: Path,
    seams: Seams,
    clock: Clock,
    ids: IdSource,
) -> tuple[SessionOpener, Any]:
    """The session opener, and the one compose made itself that the agent closes."""
    if seams.session_store is not None:
        return seams.session_store, None
    if store_url:
        shared = _shared_sessions(settings, store_url, workspace, clock, ids)
        return shared, shared
    mode = Durability(settings.durability)
    return FileSessions(workspace, settings.sessions_dir, mode, clock=clock.now_ms, ids=ids), None


def system_prompt_for(settings: Settings, workspace: Path, *, read_agents_md: bool = True) -> str:
    """The system prompt of ``settings`` (or tether's own) with ``AGENTS.md`` appended."""
    prompt = settings.system_prompt if settings.system_prompt is not None else DEFAULT_SYSTEM_PROMPT
    agents = load_agents_md(workspace) if read_agents_md else None
    if agents is not None:
        prompt = f"{prompt}\n\n# {AGENTS_FILE}\n\n{agents}"
    return prompt


def _shared_sessions(
    settings: Settings, url: str, workspace: Path, clock: Clock, ids: IdSource
) -> SessionOpener:
    """A shared store's opener (docs/scale-out.md); imported here: it needs tether[postgres]."""
    from tether._stores.postgres import DEFAULT_LEASE_SECONDS, PostgresSessions, is_store_url

    if not is_store_url(url):
        raise ConfigurationError("a store URL must start with postgresql:// or postgres://")
    lease = settings.lease_seconds or DEFAULT_LEASE_SECONDS
    # Every opener of the URL in the process shares one pool (tether._stores.pgpool): a
    # worker's agents, one opener each, hold pool_size connections in all.
    return PostgresSessions(
        url,
        str(workspace),
        lease_seconds=lease,
        clock=clock.now_ms,
        ids=ids,
        pool_size=settings.pool_size,
    )


def _shared_db_opener(workspace: Path, url: str) -> WorkspaceDBOpener:
    """The journal in ``<workspace>/.tether/effects.db``, the other tables at ``url``."""

    def open_split() -> WorkspaceDB:
        from tether._wsdb.postgres import PostgresEffectsDB, SplitWorkspaceDB
        from tether._wsdb.sqlite import EffectsDB  # see _effects_db_opener

        # On the process's pool of the store (opened by the session opener, of its size).
        shared = PostgresEffectsDB.open_url(url)
        try:
            return SplitWorkspaceDB(EffectsDB.open_workspace(workspace), shared)
        except BaseException:
            shared.close()
            raise

    return open_split


def _effects_db_opener(workspace: Path) -> WorkspaceDBOpener:
    """``<workspace>/.tether/effects.db``, opened when first needed."""

    def open_effects_db() -> WorkspaceDB:
        # Imported here: SQLite and the tables' modules load when the database is opened
        # (a call that needs evidence), not when an agent is built.
        from tether._wsdb.sqlite import EffectsDB

        return EffectsDB.open_workspace(workspace)

    return open_effects_db


def _tee(tracing: EventSink, sink: EventSink | None) -> EventSink:
    """The spans see every event first; then the caller's sink, if any."""
    if sink is None:
        return tracing
    user = sink

    def both(event: Event) -> None:
        tracing(event)
        user(event)

    return both
