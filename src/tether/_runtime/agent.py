"""The public agent: the composition root's parts, driven by the executor's loop."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tether._clock import Clock
from tether._ids import IdSource
from tether._models.base import ModelAdapter
from tether._project import BudgetConfig, ProjectConfig
from tether._runtime.compose import compose
from tether._runtime.events import EventSink
from tether._runtime.executor import Executor
from tether._runtime.guards import Authorizer
from tether._runtime.retry import RetryPolicy
from tether._stores.file import Durability
from tether._stores.protocol import SessionOpener
from tether._tools.base import Tool
from tether._wsdb.protocol import WorkspaceDBOpener
from tether.errors import ConfigurationError

__all__ = ["Agent"]


class Agent(Executor):
    """Runs an agent whose every step is written ahead to a session log.

    ``model`` is a :class:`~tether._models.base.ModelAdapter`; ``tools`` defaults to the
    built-ins (``read``, ``bash``, ``write``, ``edit``), plus ``verify`` when ``tether.toml``
    configures a check command. ``AGENTS.md`` in the workspace is appended to the system
    prompt. ``on_event`` receives progress events.

    ``project`` is the workspace's ``tether.toml`` (read from the workspace when omitted):
    the check command, the authorization policy and the budgets (``budget`` overrides
    them). ``authorize`` asks a person about calls the policy marks ``ask`` (without it
    nobody can be asked: such calls are denied); ``assume_yes`` answers every ``ask`` with
    yes. ``ask_by_default`` (default: whether ``authorize`` is given) makes ``ask`` the
    default for side-effecting tools no rule names, as in the REPL. ``park_approvals``
    parks an ``ask`` call nobody can be asked about instead of denying it: the run ends
    ``awaiting_approval`` until ``tether approve``/``deny`` decides (see
    :mod:`tether._effects.approvals`). ``require_verified``
    (default: ``[verify] required``) starts up to
    :data:`~tether._runtime.executor.MAX_FOLLOW_UPS` follow-up runs asking the model to
    verify when a run that changed files completes unverified.

    Credentials never reach the log or ``on_event``: every exact occurrence of a secret
    registered with :func:`tether._credentials.register_secret` (the model adapter registers
    its API key) or given in ``secrets`` is masked (:mod:`tether._runtime.masking`).

    The seams (default: the file store, ``.tether/effects.db``, the system clock, UUIDv7):
    ``session_store`` opens the session logs (:class:`~tether._stores.protocol.SessionOpener`,
    e.g. :class:`~tether._stores.memory.MemorySessions`), ``workspace_db`` opens the
    workspace database (:class:`~tether._wsdb.protocol.WorkspaceDBOpener`, e.g.
    :class:`~tether._wsdb.memory.MemoryWorkspace`), ``clock`` and ``ids`` are the time and id
    sources of the loop. ``store_url`` (default: ``$TETHER_STORE_URL``, else ``[store] url``)
    selects a shared PostgreSQL store instead of the file store (``docs/scale-out.md``).
    Everything is read and built by
    :func:`~tether._runtime.compose.compose`.
    """

    def __init__(
        self,
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
        model_retries: int = 0,
        retry_base_delay: float = 1.0,
    ) -> None:
        super().__init__(
            compose(
                model,
                tools,
                workspace=workspace,
                system_prompt=system_prompt,
                durability=durability,
                output_options=output_options,
                environment=environment,
                sessions_dir=sessions_dir,
                on_event=on_event,
                tool_timeout=tool_timeout,
                read_agents_md=read_agents_md,
                project=project,
                authorize=authorize,
                assume_yes=assume_yes,
                ask_by_default=ask_by_default,
                park_approvals=park_approvals,
                require_verified=require_verified,
                budget=budget,
                secrets=secrets,
                session_store=session_store,
                workspace_db=workspace_db,
                clock=clock,
                ids=ids,
                store_url=store_url,
            )
        )
        if isinstance(model_retries, bool) or not isinstance(model_retries, int):
            raise ConfigurationError("model_retries must be an integer")
        if not 0 <= model_retries <= 10:
            raise ConfigurationError("model_retries must be between 0 and 10")
        self.retry_policy = RetryPolicy(retries=model_retries, base_delay=float(retry_base_delay))
