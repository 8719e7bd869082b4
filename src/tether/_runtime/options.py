"""The keyword options of :class:`~tether._runtime.agent.Agent`, as one ``TypedDict``
(``tether.lowlevel`` exports it).

A module of its own, without ``from __future__ import annotations``: a ``TypedDict`` turns
each string annotation into a ``typing.ForwardRef`` and compiles it, 46 of them and ~0.8 ms
of every first ``Agent(...)`` (issue 31's 30 ms). Written with the types themselves, which a
construction loads anyway, only the three whose modules wait for a call stay strings, and
``typing.get_type_hints(Agent.__init__)`` still finds this class in the agent's module.
"""

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from tether._clock import Clock
from tether._ids import IdSource
from tether._models.base import ModelAdapter
from tether._project import BudgetConfig, ProjectConfig
from tether._runtime.guards import Authorizer
from tether._sandbox.policy import SandboxMode
from tether._stores.durability import Durability
from tether._telemetry import Telemetry
from tether.core.stops import BudgetTime

if TYPE_CHECKING:  # loaded with the executor, the store, the workspace database
    from tether._runtime.events import EventSink
    from tether._stores.protocol import SessionOpener
    from tether._wsdb.protocol import WorkspaceDBOpener

__all__ = ["AgentOptions"]


class AgentOptions(TypedDict, total=False):
    """The keyword options of :class:`Agent`: the settings (see :data:`tether._settings.SETTINGS`
    for each one's meaning, environment variable and ``tether.toml`` key) and the seams
    (:class:`~tether._runtime.compose.Seams`)."""

    # Settings.
    base_url: str | None
    api_key: str | None
    timeout: float | None
    model_options: Sequence[str] | None
    workspace: str | os.PathLike[str] | None
    sessions_dir: str | os.PathLike[str] | None
    durability: Durability | str | None
    system_prompt: str | None
    tool_timeout: float | None
    require_verified: bool | None
    assume_yes: bool | None
    max_steps: int | None
    max_tokens: int | None
    max_seconds: float | None
    budget_time: BudgetTime | str | None
    max_tool_calls: int | None
    max_cost_usd: float | None
    max_session_tokens: int | None
    max_session_cost_usd: float | None
    store: str | None
    store_url: str | None  # the name ``store`` had before the settings table; still accepted
    lease_seconds: float | None
    pool_size: int | None
    environment: str | None
    sandbox: SandboxMode | str | None
    sandbox_network: bool | None
    writable_roots: Sequence[str] | None
    deny_read: Sequence[str] | None
    # Seams.
    on_event: "EventSink | None"
    authorize: Authorizer | None
    ask_by_default: bool | None
    park_approvals: bool
    read_agents_md: bool
    project: ProjectConfig | None
    budget: BudgetConfig | None
    output_options: Mapping[str, Any] | None
    wrap_model: Callable[[ModelAdapter], ModelAdapter] | None
    secrets: Iterable[str]
    session_store: "SessionOpener | None"
    workspace_db: "WorkspaceDBOpener | None"
    clock: Clock | None
    ids: IdSource | None
    model_retries: int | None
    retry_base_delay: float
    check_sandbox: bool
    telemetry: Telemetry | None
