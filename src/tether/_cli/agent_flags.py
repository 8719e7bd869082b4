"""The agent commands' flags, generated from the one settings table, and the CLI's agent.

Rules of this module:

* Every command that builds an agent (``run``, ``resume``, ``retry``, ``repl``, ``submit``,
  ``worker``, ``plan``, ``replay``) is declared with :func:`agent_command`: it gets one flag
  per row of :data:`tether._settings.SETTINGS`, with the row's name, help and value check,
  and receives the values given as one :class:`Flags` mapping. A new setting is a row of the
  table; no command lists flags of its own for it.
* :func:`cli_settings` turns the flags (with what a continued session remembered, see
  :mod:`tether._cli.session_pick`) into one :class:`~tether._settings.Settings` value, and
  :func:`cli_agent` builds the agent from it through the one composition
  (:func:`tether._runtime.compose.compose`), like every other entry point: the CLI adds only
  its user interface (progress, the terminal's questions, the settings record).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, get_type_hints

import typer

from tether._cli.common import workspace_root
from tether._credentials import (
    Masker,
    hide_from_process_listing,
    register_secret,
    registered_secrets,
)
from tether._models.options import ConfiguredModel
from tether._project import find_workspace_root
from tether._settings import SETTINGS, Kind, Setting, Settings, resolve_settings

if TYPE_CHECKING:
    import threading

    from tether._cli.progress import CallArguments, Progress
    from tether._models import ModelAdapter, ModelRequest, ModelResponse
    from tether._project import ProjectConfig
    from tether._runtime import Agent
    from tether._stores.protocol import SessionOpener
    from tether._wsdb.protocol import WorkspaceDBOpener

__all__ = [
    "API_KEY_WARNING",
    "NO_INTERACTION",
    "Flags",
    "Interaction",
    "ObservedModel",
    "agent_command",
    "checked_sandbox",
    "cli_agent",
    "cli_settings",
    "location_flags",
    "quiet_agent",
]

API_KEY_WARNING = (
    "warning: --api-key is visible to other local users in the process list (ps) while "
    "tether starts; set TETHER_API_KEY instead"
)

Flags = Mapping[str, Any]
"""The settings given on the command line, by name (``None``/``False``/``()``: not given)."""

_TYPES: dict[Kind, Any] = {
    Kind.TEXT: str | None,
    Kind.PATH: Path | None,
    Kind.SECONDS: float | None,
    Kind.AMOUNT: float | None,
    Kind.COUNT: int | None,
    Kind.FLAG: bool,
    Kind.CHOICE: None,  # the row's own enum (Setting.choices)
    Kind.LIST: list[str] | None,
}
"""The Python type typer parses each kind of setting into."""

_LIMITS: dict[Kind, dict[str, Any]] = {
    Kind.SECONDS: {"min": 0.001},
    Kind.AMOUNT: {"min": 0.000001},
    Kind.COUNT: {"min": 1},
    Kind.CHOICE: {"case_sensitive": False},
}


def _defaults_note(row: Setting) -> str:
    """Where the value comes from when the flag is not given, in the table's order."""
    sources = ([f"${row.env}"] if row.env else []) + ([row.toml] if row.toml else [])
    sources += [row.fallback] if row.fallback else []
    return f" Default: {', else '.join(sources)}." if sources else ""


def _parameter(row: Setting) -> inspect.Parameter:
    names = [row.flag] + ([row.short] if row.short else [])
    option = typer.Option(
        *names,
        help=row.help + _defaults_note(row),
        metavar=row.metavar,
        show_default=False,
        **_LIMITS.get(row.kind, {}),
    )
    default = False if row.kind is Kind.FLAG else None
    return inspect.Parameter(
        row.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[
            (row.choices | None) if row.choices is not None else _TYPES[row.kind], option
        ],
    )


def agent_command(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn(<its own parameters>, flags: Flags)`` as a typer command whose flags are its own
    parameters plus one per setting of the table."""
    hints = get_type_hints(fn, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(fn).parameters.values()
        if p.name != "flags"
    ]
    generated = [_parameter(row) for row in SETTINGS]
    names = {row.name for row in SETTINGS}

    @functools.wraps(fn)
    def command(**values: Any) -> None:
        flags = {name: values.pop(name) for name in list(values) if name in names}
        fn(**values, flags=flags)

    parameters = own + generated
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    del command.__wrapped__  # typer must read the generated signature, not fn's
    return command


def cli_settings(flags: Flags, *, project: ProjectConfig | None = None) -> Settings:
    """The settings of a command: its flags, else the environment, else tether.toml."""
    from tether._project import load_project_config

    if project is None:
        project = load_project_config(workspace_root(flags.get("workspace")))
    return resolve_settings(flags, environ=os.environ, project=project)


@dataclass(frozen=True)
class Interaction:
    """How the CLI's user can be reached during a run."""

    interactive: bool = False
    """A person can answer authorization questions at the terminal."""
    ask_by_default: bool = False
    """Ask about every side-effecting call no rule names (the REPL on a terminal)."""


class ObservedModel(ConfiguredModel):
    """A model adapter that lets the progress display see the tool calls it returns.

    Delegates everything (identity included, so the configuration digest is unchanged).
    The arguments it passes on are masked with ``masker``, as the session log records
    them.
    """

    def __init__(
        self, inner: ModelAdapter, calls: CallArguments, masker: Masker | None = None
    ) -> None:
        super().__init__(inner, "")
        self._calls = calls
        self._masker = masker if masker is not None else Masker()

    def complete(
        self,
        request: ModelRequest,
        *,
        cancel: threading.Event | None = None,
        on_delta: Callable[[Any], None] | None = None,
    ) -> ModelResponse:
        response = super().complete(request, cancel=cancel, on_delta=on_delta)
        for call in response.tool_calls:
            self._calls.remember(call.id, self._masker.text(call.arguments))
        return response


NO_INTERACTION: Final = Interaction()
"""Nobody can be asked (a pipe, CI, a worker): ``ask`` calls are parked."""


def cli_agent(
    settings: Settings,
    progress: Progress,
    interaction: Interaction = NO_INTERACTION,
    *,
    on_event: Callable[[Any], None] | None = None,
    project: ProjectConfig | None = None,
) -> Agent:
    """The agent of an interactive command: ``settings`` composed with the CLI's seams (the
    progress display, the terminal's questions or parked approvals)."""
    from tether._cli.authorize import terminal_authorizer
    from tether._runtime import Agent

    progress.location = location_flags(settings)
    if settings.api_key is not None and settings.api_key.strip():
        typer.echo(API_KEY_WARNING, err=True)
        register_secret(settings.api_key)  # even when the model does not use it
    # Quietly: the command named a root found above the current folder once already.
    workspace = find_workspace_root(settings.workspace).path

    def observed(model: Any) -> Any:
        # Called once the model is loaded (its key registered) and before any MCP server
        # starts: from here on neither `ps` nor a command reading /proc/<tether>/cmdline or
        # environ shows the key (Python's own copies keep it).
        hide_from_process_listing(registered_secrets())
        return ObservedModel(model, progress.calls, Masker.for_process())

    agent = Agent(
        settings=settings,
        on_event=on_event if on_event is not None else progress.on_event,
        authorize=terminal_authorizer(progress, workspace) if interaction.interactive else None,
        ask_by_default=interaction.ask_by_default and interaction.interactive,
        park_approvals=not interaction.interactive,
        wrap_model=observed,
        project=project,  # tether.toml as the command read it: not parsed a second time
    )
    return checked_sandbox(agent)


def quiet_agent(
    settings: Settings,
    *,
    check_sandbox: bool = True,
    session_store: SessionOpener | None = None,
    workspace_db: WorkspaceDBOpener | None = None,
) -> Agent:
    """An agent for ``settings`` without progress output (``submit``, the worker's slots);
    ``check_sandbox=False`` for one that never runs a tool (``replay``); ``session_store``
    and ``workspace_db``: the openers a worker's agents share (default: the agent's own)."""
    from tether._runtime import Agent

    if settings.api_key is not None and settings.api_key.strip():
        register_secret(settings.api_key)

    def hidden(model: Any) -> Any:
        hide_from_process_listing(registered_secrets())  # before any MCP server starts
        return model

    return checked_sandbox(
        Agent(
            settings=settings,
            wrap_model=hidden,
            check_sandbox=check_sandbox,
            session_store=session_store,
            workspace_db=workspace_db,
        )
    )


def checked_sandbox(agent: Agent) -> Agent:
    """``agent``, its commands' sandbox checked now (fail closed, exit 27): a command
    refuses before it reads a prompt, writes a submission or claims a session, where the
    library's ``Agent`` checks at its first call (docs/sandbox.md)."""
    try:
        agent.parts.ensure_sandbox()
    except BaseException:
        agent.close()
        raise
    return agent


def location_flags(settings: Settings) -> str:
    """`` --workspace DIR`` / `` --sessions-dir DIR`` / `` --store URL`` when the printed
    commands need them."""
    import shlex

    flags = ""
    cwd = Path.cwd().resolve()
    if settings.workspace is not None and settings.workspace.resolve() != cwd:
        flags += f" --workspace {shlex.quote(str(settings.workspace.resolve()))}"
    if settings.sessions_dir is not None:
        flags += f" --sessions-dir {shlex.quote(str(settings.sessions_dir.resolve()))}"
    if settings.store is not None:
        from tether._stores.postgres import display_url

        flags += f" --store {shlex.quote(display_url(settings.store))}"
    return flags
