"""The composition root: everything an agent is built from, read and built in one place.

:func:`compose` is the only part of the runtime that reads the outside world to configure
an agent — ``tether.toml``, the workspace's ``AGENTS.md``, the environment
(``TETHER_ENVIRONMENT_IDENTITY``) — and that chooses implementations: the tool registry
(the built-ins, plus ``verify`` when a check command is configured), the guards, the
configuration snapshot, the session-store opener (the file store unless another is given),
the workspace-database opener (``.tether/effects.db`` unless another is given), the clock
and the id source. The executor (:mod:`tether._runtime.executor`) receives the result, a
:class:`Composition`, and reads nothing else.

Steps, in this order (so the first problem is the one reported):

1. the workspace must be a directory; its real path is the tools' root;
2. ``tether.toml`` (unless ``project`` is given), the budget and ``require_verified``
   (which needs a check command);
3. the guards, over the workspace database of this agent (:class:`SessionEvidence`);
4. the tools: ``tools`` or the built-ins, plus ``verify`` for a configured check command,
   plus the tools of the MCP servers of ``[mcp.servers]`` (started now if this process
   has not started them yet, :mod:`tether._mcp`); names must be unique;
5. the system prompt, with ``AGENTS.md`` appended (:func:`load_agents_md`);
6. durability, output options, the sessions directory and the state the file tools must
   never touch (:class:`~tether._tools.workspace.ProtectedState`);
7. the environment identity and the configuration snapshot;
8. the masker (a credential in the snapshot is refused) and the masked event sink;
9. the session-store opener, the workspace-database opener, the clock and the ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tether._clock import SYSTEM_CLOCK, Clock
from tether._completion.verify import NO_COMMAND, VerifyTool
from tether._credentials import Masker
from tether._ids import IdSource, new_uuid7
from tether._inputs import read_optional_file
from tether._mcp.tools import mcp_tools
from tether._models.base import ModelAdapter
from tether._project import BudgetConfig, ProjectConfig, load_project_config
from tether._runtime.events import EventSink
from tether._runtime.evidence import SessionEvidence
from tether._runtime.guards import Authorizer, Guards
from tether._runtime.masking import masked_sink
from tether._stores.file import Durability, FileSessions
from tether._stores.protocol import SessionOpener
from tether._tools.base import Tool, ToolRegistry
from tether._tools.builtin import builtin_tools
from tether._tools.workspace import ProtectedState
from tether._wsdb.protocol import WorkspaceDB, WorkspaceDBOpener
from tether._wsdb.sqlite import EffectsDB
from tether.core.configuration import AgentConfiguration, environment_identity
from tether.errors import ConfigurationError

__all__ = [
    "AGENTS_FILE",
    "DEFAULT_SYSTEM_PROMPT",
    "ENVIRONMENT_VARIABLE",
    "MAX_AGENTS_BYTES",
    "Composition",
    "compose",
    "load_agents_md",
]

DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a careful software agent working in a workspace. Use the tools to read "
    "files, run commands and make edits. Be concise. When you are done, answer with a "
    "short summary of what you did and what you verified."
)
AGENTS_FILE: Final = "AGENTS.md"
MAX_AGENTS_BYTES: Final = 64 * 1024
ENVIRONMENT_VARIABLE: Final = "TETHER_ENVIRONMENT_IDENTITY"
STORE_URL_ENV: Final = "TETHER_STORE_URL"
"""A shared session store's URL (``postgresql://…``); ``[store] url`` in tether.toml too."""
LEASE_ENV: Final = "TETHER_LEASE_SECONDS"


@dataclass(frozen=True)
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


def compose(
    model: ModelAdapter,
    tools: Sequence[Tool] | None = None,
    *,
    workspace: str | os.PathLike[str] = ".",
    system_prompt: str | None = None,
    durability: Durability | str = Durability.DURABLE,
    output_options: Mapping[str, Any] | None = None,
    environment: str | None = None,
    sessions_dir: str | os.PathLike[str] | None = None,
    on_event: EventSink | None = None,
    tool_timeout: float | None = None,
    read_agents_md: bool = True,
    project: ProjectConfig | None = None,
    authorize: Authorizer | None = None,
    assume_yes: bool = False,
    ask_by_default: bool | None = None,
    park_approvals: bool = False,
    require_verified: bool | None = None,
    budget: BudgetConfig | None = None,
    secrets: Iterable[str] = (),
    session_store: SessionOpener | None = None,
    workspace_db: WorkspaceDBOpener | None = None,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    store_url: str | None = None,
) -> Composition:
    """Read the configuration and build everything an agent needs (the parameters are
    :class:`~tether._runtime.agent.Agent`'s)."""
    # 1. The workspace.
    root = Path(workspace)
    if not root.is_dir():
        raise ConfigurationError(f"workspace {str(root)!r} is not a directory")
    real = Path(os.path.realpath(root))
    # 2. tether.toml, the budget, require_verified.
    config = project if project is not None else load_project_config(real)
    limits = budget if budget is not None else config.budget
    required = require_verified if require_verified is not None else config.verify.required
    if required and config.verify.command is None:
        raise ConfigurationError(f"verification is required but {NO_COMMAND}")
    # 3. The guards, over this agent's workspace database: on a shared store its tables are
    # in the store's database, the file-change journal stays in .tether/effects.db.
    if store_url is None and session_store is None:
        store_url = os.environ.get(STORE_URL_ENV) or config.store.url
    if workspace_db is not None:
        opener = workspace_db
    elif store_url and session_store is None:
        opener = _shared_db_opener(real, store_url)
    else:
        opener = _effects_db_opener(real)
    evidence = SessionEvidence(opener)
    guards = Guards(
        real,
        config,
        evidence.records,
        authorize=authorize,
        assume_yes=assume_yes,
        ask_by_default=ask_by_default,
        park=park_approvals,
    )
    # 4. The tools.
    chosen = list(tools) if tools is not None else builtin_tools(pass_env=config.tools.pass_env)
    if config.verify.command is not None and all(t.name != "verify" for t in chosen):
        chosen.append(VerifyTool(lambda: guards.verifier))
    if config.mcp.servers:
        chosen.extend(mcp_tools(config.mcp, real))  # starts the servers not running yet
    registry = ToolRegistry(chosen)
    # 5. The system prompt and AGENTS.md.
    prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
    agents = load_agents_md(real) if read_agents_md else None
    if agents is not None:
        prompt = f"{prompt}\n\n# {AGENTS_FILE}\n\n{agents}"
    # 6. Durability, output options, the layout the file tools must never touch.
    mode = Durability(durability)
    options: Mapping[str, Any] = dict(output_options or {})
    sessions_path = Path(sessions_dir) if sessions_dir is not None else None
    protected = ProtectedState.for_workspace(real, sessions_path)
    # 7. The environment identity and the configuration snapshot.
    if environment is None:
        environment = os.environ.get(ENVIRONMENT_VARIABLE)
    identity = environment_identity(environment, str(real))
    configuration = AgentConfiguration.build(
        model=model.model,
        adapter_identity=model.adapter_identity,
        routing_identity=model.routing_identity,
        system_prompt=prompt,
        snapshot_tools=registry.snapshot_tools(),
        declarations=registry.declarations(),
        output_options=options,
        environment=identity,
    )
    # 8. Credentials are masked in every fact and event; one in the configuration snapshot
    # could not be, since the log records the snapshot's digest with it (the prompt itself
    # is only recorded as a digest).
    masker = Masker.for_process(secrets)
    if masker.contains(configuration.snapshot):
        raise ConfigurationError(
            "a credential occurs in the agent's configuration (model id, endpoint or tool "
            "declarations), which every model attempt records; remove it"
        )
    # 9. Where sessions and evidence go, the clock and the ids.
    time_source = clock if clock is not None else SYSTEM_CLOCK
    id_source = ids if ids is not None else new_uuid7
    owned: Any = None
    if session_store is not None:
        sessions: SessionOpener = session_store
    elif store_url:
        # A shared store (docs/scale-out.md); imported here: it needs tether[postgres].
        from tether._stores.postgres import DEFAULT_LEASE_SECONDS, PostgresSessions, is_store_url

        if not is_store_url(store_url):
            raise ConfigurationError("a store URL must start with postgresql:// or postgres://")
        lease = config.store.lease_seconds or float(
            os.environ.get(LEASE_ENV) or DEFAULT_LEASE_SECONDS
        )
        sessions = owned = PostgresSessions(
            store_url, str(real), lease_seconds=lease, clock=time_source.now_ms, ids=id_source
        )
    else:
        sessions = FileSessions(real, sessions_path, mode, clock=time_source.now_ms, ids=id_source)
    return Composition(
        workspace=real,
        model=model,
        project=config,
        budget=limits,
        require_verified=required,
        registry=registry,
        guards=guards,
        system_prompt=prompt,
        durability=mode,
        output_options=options,
        sessions_dir=sessions_path,
        protected=protected,
        tool_timeout=tool_timeout,
        environment=identity,
        configuration=configuration,
        masker=masker,
        on_event=masked_sink(on_event, masker),
        sessions=sessions,
        evidence=evidence,
        clock=time_source,
        ids=id_source,
        owned_sessions=owned,
    )


def _shared_db_opener(workspace: Path, url: str) -> WorkspaceDBOpener:
    """The journal in ``<workspace>/.tether/effects.db``, the other tables at ``url``."""

    def open_split() -> WorkspaceDB:
        from tether._wsdb.postgres import PostgresEffectsDB, SplitWorkspaceDB

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
        return EffectsDB.open_workspace(workspace)

    return open_effects_db
