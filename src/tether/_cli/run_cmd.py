"""``tether run PROMPT``: one agent run (optionally continuing a session).

Also the plumbing shared with ``tether resume`` and the REPL: the common agent flags,
building the :class:`~tether._runtime.agent.Agent`, the SIGINT handling around an
agent call, and the mapping of a :class:`RunResult` to an exit status.

Exit status: 0 completed (or nothing to do), 1 the run failed (the model request failed,
the answer was empty, …), 2 usage error (no model, missing API key, unreadable script,
bad workspace), 3-10 session store errors (3 no such session, 4 session busy, 5 corrupt
log, …), 65 recovery is blocked, 70 internal error, 130 aborted (Ctrl+C).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from tether import errors
from tether._cli.common import (
    WORKSPACE_HELP,
    error_message,
    handle_errors,
    one_line,
    workspace_root,
)
from tether._cli.progress import CallArguments, Progress, make_progress, resume_command
from tether._cli.session_pick import (
    agent_sessions_dir,
    pick_session,
    recording_sink,
    with_recorded,
)
from tether._credentials import (
    Masker,
    hide_from_process_listing,
    register_secret,
    registered_secrets,
)
from tether._stores.file import Durability
from tether.errors import ConfigurationError, TetherError

if TYPE_CHECKING:  # the runtime and the adapters pull in the model SDKs: import them lazily
    from tether._models import ModelAdapter, ModelRequest, ModelResponse
    from tether._runtime import Agent, RunResult

# The exit statuses of an agent call, from the one table (tether.errors.EXIT_STATUSES);
# re-exported under their old names for the other command modules.
EXIT_FAILED = errors.EXIT_FAILED
EXIT_BLOCKED = errors.EXIT_BLOCKED
EXIT_ABORTED = errors.EXIT_ABORTED
EXIT_AWAITING_APPROVAL = errors.EXIT_AWAITING_APPROVAL
EXIT_UNVERIFIED = errors.EXIT_UNVERIFIED

API_KEY_WARNING = (
    "warning: --api-key is visible to other local users in the process list (ps) while "
    "tether starts; set TETHER_API_KEY instead"
)


def exit_code_for(result: RunResult, *, abort_requested: bool = False) -> int:
    """The exit status of a finished agent call: its outcome's row of the table.

    ``abort_requested`` is true for ``tether resume --abort``: there an aborted outcome is
    what the user asked for, so it exits 0.
    """
    if result.unverified:
        return EXIT_UNVERIFIED
    code = errors.outcome_exit_code(result.status.value)
    return errors.EXIT_OK if abort_requested and code == EXIT_ABORTED else code


# --------------------------------------------------------------------------- common flags


class DurabilityChoice(StrEnum):
    durable = "durable"
    process = "process"


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="A shared session store, postgresql://… (default: $TETHER_STORE_URL, else "
        "[store] url in tether.toml, else the local file store). See docs/scale-out.md.",
        metavar="URL",
        show_default=False,
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Model id for the OpenAI-compatible endpoint (e.g. openai/gpt-4o-mini), or "
        "scripted:PATH for a scripted model. Default: $TETHER_MODEL.",
        metavar="MODEL",
        show_default=False,
    ),
]
BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="Endpoint of the OpenAI-compatible API (default: $TETHER_BASE_URL, else "
        "https://openrouter.ai/api/v1).",
        metavar="URL",
        show_default=False,
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="API key (default: $TETHER_API_KEY). Never printed or logged. Prefer "
        "$TETHER_API_KEY: other local users can read a flag in the process list.",
        metavar="KEY",
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Seconds one model request may take (default 60).",
        metavar="SECONDS",
        min=0.001,
        show_default=False,
    ),
]
ModelOptionsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--model-option",
        help="A [model] setting of tether.toml for this run, as KEY=VALUE in TOML syntax "
        "(repeatable): temperature=0.2, max_tokens=4096, reasoning_effort=high, "
        "'provider={order=[\"anthropic\"]}', tool_choice=required, "
        "parallel_tool_calls=false, idle_timeout=120, retries=0, stream=false, "
        "api_key_env=MY_KEY. See docs/config.md.",
        metavar="KEY=VALUE",
        show_default=False,
    ),
]
WorkspaceOption = Annotated[
    Path | None,
    typer.Option(
        "--workspace",
        "-w",
        help="Workspace the tools work in, whose tether.toml and .tether/ are used. "
        + WORKSPACE_HELP,
        metavar="DIR",
        show_default=False,
    ),
]
AgentSessionsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--sessions-dir",
        help="Folder of session logs (default: .tether/sessions in the workspace).",
        metavar="DIR",
        show_default=False,
    ),
]
DurabilityOption = Annotated[
    DurabilityChoice,
    typer.Option(
        "--durability",
        help="durable: fdatasync every commit (survives power loss); process: write only "
        "(survives a crash of tether, not of the machine).",
        case_sensitive=False,
    ),
]
SystemPromptOption = Annotated[
    str | None,
    typer.Option(
        "--system-prompt",
        help="System prompt (default: tether's own). AGENTS.md in the workspace is appended.",
        metavar="TEXT",
        show_default=False,
    ),
]
ToolTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--tool-timeout",
        help="Upper bound in seconds for one tool call (e.g. a bash command).",
        metavar="SECONDS",
        min=0.001,
        show_default=False,
    ),
]
RequireVerifiedOption = Annotated[
    bool,
    typer.Option(
        "--require-verified",
        help="A run that changed files must end with a passing check of the files as they "
        "are now ([verify] command of tether.toml): up to two follow-up runs ask the model "
        "to verify; exit 66 if it is still unverified. Default: [verify] required.",
    ),
]
YesOption = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Allow every call the policy of tether.toml says to ask about (deny rules "
        "still deny). The decision is recorded as '--yes'.",
    ),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option(
        "--max-steps",
        help="Model steps a run may take (default: [budget] max_steps, unlimited).",
        metavar="N",
        min=1,
        show_default=False,
    ),
]
MaxTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        help="Input + output tokens a run may use (default: [budget] max_tokens, unlimited).",
        metavar="N",
        min=1,
        show_default=False,
    ),
]
MaxSecondsOption = Annotated[
    float | None,
    typer.Option(
        "--max-seconds",
        help="Wall time of a run in seconds (default: [budget] max_seconds, unlimited).",
        metavar="SECONDS",
        min=0.001,
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object per line on stdout: every progress event, then "
        '{"event": "result", …}.',
    ),
]


@dataclass(frozen=True)
class AgentSettings:
    """The common flags of ``run``, ``resume`` and the REPL."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    workspace: Path | None = None
    sessions_dir: Path | None = None
    durability: DurabilityChoice = DurabilityChoice.durable
    system_prompt: str | None = None
    tool_timeout: float | None = None
    json_output: bool = False
    require_verified: bool = False
    assume_yes: bool = False
    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    interactive: bool = False
    """A person can answer authorization questions at the terminal."""
    model_options: tuple[str, ...] = ()
    """``--model-option KEY=VALUE`` items (override ``[model]`` of tether.toml)."""
    ask_by_default: bool = False
    """Ask about every side-effecting call no rule names (the REPL on a terminal)."""
    store: str | None = None
    """``--store URL``: a shared session store."""


class ObservedModel:
    """A model adapter that lets the progress display see the tool calls it returns.

    Delegates everything (identity included, so the configuration digest is unchanged).
    The arguments it passes on are masked with ``masker``, as the session log records
    them.
    """

    def __init__(
        self, inner: ModelAdapter, calls: CallArguments, masker: Masker | None = None
    ) -> None:
        self._inner = inner
        self._calls = calls
        self._masker = masker if masker is not None else Masker()

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def model(self) -> str:
        return self._inner.model

    @property
    def adapter_identity(self) -> str:
        return self._inner.adapter_identity

    @property
    def routing_identity(self) -> str:
        return self._inner.routing_identity

    @property
    def streaming(self) -> bool:
        return bool(getattr(self._inner, "streaming", False))

    def complete(
        self,
        request: ModelRequest,
        *,
        cancel: threading.Event | None = None,
        on_delta: Callable[[Any], None] | None = None,
    ) -> ModelResponse:
        from tether._models.base import call_model

        response = call_model(self._inner, request, cancel=cancel, on_delta=on_delta)
        for call in response.tool_calls:
            self._calls.remember(call.id, self._masker.text(call.arguments))
        return response


def build_agent(settings: AgentSettings, progress: Progress) -> Agent:
    """The agent for ``settings``; raises ConfigurationError (exit 2) on bad input."""
    from tether._cli.authorize import terminal_authorizer
    from tether._models import load_model
    from tether._project import load_project_config
    from tether._runtime import Agent

    progress.location = location_flags(settings)
    # One root for the policy (tether.toml), the state (.tether/) and the tools: started
    # in a subfolder, the agent works on the workspace that subfolder belongs to.
    workspace = workspace_root(settings.workspace)
    project = load_project_config(workspace)
    budget = project.budget
    if settings.max_steps is not None:
        budget = replace(budget, max_steps=settings.max_steps)
    if settings.max_tokens is not None:
        budget = replace(budget, max_tokens=settings.max_tokens)
    if settings.max_seconds is not None:
        budget = replace(budget, max_seconds=settings.max_seconds)
    if settings.api_key is not None and settings.api_key.strip():
        typer.echo(API_KEY_WARNING, err=True)
        register_secret(settings.api_key)  # even when the model does not use it
    from tether._models.options import (
        ConfiguredModel,
        identity_suffix,
        merge,
        output_options_for,
        parse_model_options,
    )

    config = merge(project.model, parse_model_options(settings.model_options), "--model-option")
    env = os.environ
    spec = (settings.model or "").strip() or env.get("TETHER_MODEL", "").strip() or config.model
    base_url = (
        (settings.base_url or "").strip() or env.get("TETHER_BASE_URL", "").strip() or None
    ) or config.base_url
    api_key = settings.api_key
    if not (api_key or "").strip() and config.api_key_env:
        api_key = env.get(config.api_key_env, "").strip() or None
        if api_key is None:
            raise ConfigurationError(
                f"[model] api_key_env names {config.api_key_env}, which is not set"
            )
    inner = load_model(
        spec,
        base_url=base_url,
        api_key=api_key,
        timeout=settings.timeout if settings.timeout is not None else config.timeout,
        idle_timeout=config.idle_timeout,
        stream=config.stream,
        extra_headers=config.extra_headers or None,
    )
    api = "anthropic" if inner.adapter_identity.startswith("anthropic:") else "chat-completions"
    host = inner.routing_identity.split("/", 1)[0]
    output_options = output_options_for(config, api=api, base_host=host)
    model: ModelAdapter = ConfiguredModel(inner, identity_suffix(config))
    # From here on neither `ps` nor a command reading /proc/<tether>/cmdline or environ
    # shows the key the adapter registered (Python's own copies keep it).
    hide_from_process_listing(registered_secrets())
    return Agent(
        ObservedModel(model, progress.calls, Masker.for_process()),
        workspace=workspace,
        system_prompt=settings.system_prompt,
        durability=Durability(settings.durability.value),
        sessions_dir=settings.sessions_dir,
        on_event=recording_sink(settings, progress.on_event),
        tool_timeout=settings.tool_timeout,
        project=project,
        budget=budget,
        authorize=terminal_authorizer(progress, workspace) if settings.interactive else None,
        assume_yes=settings.assume_yes,
        ask_by_default=settings.ask_by_default and settings.interactive,
        park_approvals=not settings.interactive,
        require_verified=True if settings.require_verified else None,
        store_url=settings.store,
        output_options=output_options or None,
        model_retries=config.retries,
    )


def location_flags(settings: AgentSettings) -> str:
    """`` --workspace DIR`` / `` --sessions-dir DIR`` when the printed commands need them."""
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


# --------------------------------------------------------------------------- Ctrl+C


@contextmanager
def interruptible(agent: Agent, progress: Progress) -> Iterator[None]:
    """Handle SIGINT for the duration of one agent call.

    The first Ctrl+C asks the agent to abort (it records ``abortRequested`` and finishes
    the operation as aborted); the second exits at once with status 130, leaving the
    session resumable. The previous handler is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            agent.abort()
            try:
                progress.aborting()
            except Exception:  # never let rendering break the abort
                pass
            return
        progress.exit_now(agent.last_session)
        os._exit(EXIT_ABORTED)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def call_agent(agent: Agent, progress: Progress, call: Callable[[], RunResult]) -> RunResult:
    """Run ``call`` (an agent method) with Ctrl+C handling; the spinner always stops.

    The result comes back with the agent's credentials masked in its texts, ready to be
    shown. An error after the session was opened (a failed write, say) is reported as one
    ``error:`` line followed by the command that resumes the session.
    """
    progress.begin()
    try:
        with interruptible(agent, progress):
            return masked_result(call(), agent.masker)
    except TetherError as exc:
        progress.close()
        if progress.opened is None or isinstance(exc, ConfigurationError):
            raise  # nothing to resume: one error line
        typer.echo(f"error: {one_line(agent.masker.text(error_message(exc)))}", err=True)
        progress.notice(f"resume with: {resume_command(progress.opened, progress.location)}")
        raise typer.Exit(exc.exit_code) from None
    finally:
        progress.close()


def masked_result(result: RunResult, masker: Masker) -> RunResult:
    """``result`` with credentials masked in the texts that come from the model or the
    provider (the final text, the message, the error); the log holds them masked already."""
    if not masker:
        return result
    error = result.error
    return replace(
        result,
        text=None if result.text is None else masker.text(result.text),
        message=None if result.message is None else masker.text(result.message),
        error=None if error is None else {k: masker.text(v) for k, v in error.items()},
    )


@contextmanager
def agent_errors() -> Iterator[None]:
    """:func:`handle_errors`, plus a quiet exit 130 for a Ctrl+C outside an agent call."""
    try:
        with handle_errors():
            yield
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_ABORTED) from None


# --------------------------------------------------------------------------- command


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    prompt: Annotated[
        str,
        typer.Argument(
            help="What the agent should do; - reads it from stdin.",
            metavar="PROMPT",
            show_default=False,
        ),
    ],
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            "-s",
            help="Continue this session (id, unique id prefix or path) instead of starting "
            "a new one. Unfinished work in it is finished first. Without --model etc. it "
            "uses the model, endpoint and options the session was run with.",
            metavar="ID",
            show_default=False,
        ),
    ] = None,
    last: Annotated[
        bool,
        typer.Option("--last", "-l", help="Continue the session with the latest activity."),
    ] = False,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    timeout: TimeoutOption = None,
    model_option: ModelOptionsOption = None,
    workspace: WorkspaceOption = None,
    sessions_dir: AgentSessionsDirOption = None,
    durability: DurabilityOption = DurabilityChoice.durable,
    system_prompt: SystemPromptOption = None,
    tool_timeout: ToolTimeoutOption = None,
    require_verified: RequireVerifiedOption = False,
    assume_yes: YesOption = False,
    max_steps: MaxStepsOption = None,
    max_tokens: MaxTokensOption = None,
    max_seconds: MaxSecondsOption = None,
    json_output: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Run the agent once on PROMPT and print its answer.

    Progress goes to stderr, the final answer to stdout; with --json, stdout
    carries one JSON event per line instead. Every step is written ahead to
    the session log; the last lines name the session and the commands that
    resume or continue it.

    Ctrl+C aborts the run durably (exit 130); a second Ctrl+C exits at once
    and the session stays resumable with `tether resume ID`.

    Calls the policy of tether.toml says to ask about are asked on the
    terminal (yes / no / always for this rule). Without one (a pipe, CI, a
    worker) such a call is parked: the run stops with exit 67 naming the
    call, `tether approve ID` or `tether deny ID --why TEXT` decides from any
    terminal, and `tether resume SESSION` carries it out (--yes allows them).
    A completed run that changed files reports whether a passing check backs
    it (see `tether verify`).

    Examples:

        tether run --model openai/gpt-4o-mini "add a test for parse()"

        tether run --last "now update the changelog"

        cat task.md | tether run - --model scripted:demo.json

    Exit status: 0 completed, 1 failed (also repeated_failure and
    budget_exhausted), 2 usage error (no model, no API key, bad tether.toml,
    …), 3 no such session, 4 session busy, 5 corrupt session log, 65 blocked,
    66 still unverified with --require-verified, 67 a call awaits approval,
    130 aborted.
    """
    from_stdin = prompt == "-"
    if from_stdin:
        with agent_errors():
            prompt = read_prompt_from_stdin()
    settings = AgentSettings(
        model=model,
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        model_options=tuple(model_option or ()),
        workspace=workspace,
        sessions_dir=sessions_dir,
        durability=durability,
        system_prompt=system_prompt,
        tool_timeout=tool_timeout,
        json_output=json_output,
        require_verified=require_verified,
        assume_yes=assume_yes,
        max_steps=max_steps,
        max_tokens=max_tokens,
        max_seconds=max_seconds,
        interactive=not from_stdin and terminal_attached(),
        store=store,
    )
    run_agent_command(
        settings,
        lambda agent, chosen: agent.run(prompt, session=chosen),
        session=session,
        last=last,
    )


MAX_STDIN_PROMPT = 1 << 20
"""Characters a prompt read from stdin (``tether run -``) may have."""


def read_prompt_from_stdin() -> str:
    """The prompt of ``tether run -``: all of stdin (exit 2 if empty or too long)."""
    text = sys.stdin.read(MAX_STDIN_PROMPT + 1)
    if len(text) > MAX_STDIN_PROMPT:
        raise ConfigurationError(
            f"the prompt on stdin is longer than {MAX_STDIN_PROMPT} characters"
        )
    if not text.strip():
        raise ConfigurationError("the prompt on stdin is empty")
    return text.strip("\n")


def choose_session(settings: AgentSettings, session: str | None, last: bool) -> str | None:
    """The session an agent command means: ``session`` as given, or the newest for ``last``."""
    if not last:
        return session
    return pick_session(
        session, last, agent_sessions_dir(settings.sessions_dir, settings.workspace)
    )


def terminal_attached() -> bool:
    """Whether a person can answer questions: stdin and stderr are terminals."""
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def run_agent_command(
    settings: AgentSettings,
    call: Callable[[Agent, str | None], RunResult],
    *,
    session: str | None = None,
    last: bool = False,
    require_session: bool = False,
    abort_requested: bool = False,
) -> NoReturn:
    """Build the agent, run ``call`` with progress and Ctrl+C handling, exit with its code.

    ``call`` gets the session meant (``session``, or the newest one for ``last``); for an
    existing session the settings it was run with fill in the flags not given."""
    code = 0
    with agent_errors():
        chosen = choose_session(settings, session, last)
        if require_session and chosen is None:
            raise ConfigurationError(
                "give a SESSION (an id, a unique id prefix or a path) or --last"
            )
        if chosen is not None:
            settings = with_recorded(settings, chosen)
        progress = make_progress(settings.json_output)
        agent = build_agent(settings, progress)
        result = call_agent(agent, progress, lambda: call(agent, chosen))
        progress.result(result)
        code = exit_code_for(result, abort_requested=abort_requested)
    raise typer.Exit(code)


__all__ = [
    "API_KEY_WARNING",
    "EXIT_ABORTED",
    "EXIT_AWAITING_APPROVAL",
    "EXIT_BLOCKED",
    "EXIT_FAILED",
    "EXIT_UNVERIFIED",
    "AgentSettings",
    "ObservedModel",
    "agent_errors",
    "build_agent",
    "call_agent",
    "exit_code_for",
    "interruptible",
    "location_flags",
    "masked_result",
    "register",
    "run",
    "terminal_attached",
]
