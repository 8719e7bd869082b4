"""``tether run PROMPT``: one agent run (optionally continuing a session).

Also the plumbing shared with ``tether resume`` and the REPL: preparing the agent of a
command (its flags come from the one settings table, :mod:`tether._cli.agent_flags`), the
SIGINT handling around an agent call, and the mapping of a :class:`RunResult` to an exit
status.

Exit status: 0 completed (or nothing to do), 1 the run failed (the model request failed,
the answer was empty, …), 2 usage error (no model, missing API key, unreadable script,
bad workspace), 3-10 session store errors (3 no such session, 4 session busy, 5 corrupt
log, …), 65 recovery is blocked, 70 internal error, 130 aborted (Ctrl+C).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from tether import errors
from tether._cli.agent_flags import (
    NO_INTERACTION,
    Flags,
    Interaction,
    agent_command,
    cli_agent,
    cli_settings,
)
from tether._cli.common import error_message, handle_errors, one_line, workspace_root
from tether._cli.progress import Progress, make_progress, resume_command
from tether._cli.session_pick import (
    agent_sessions_dir,
    pick_session,
    recording_sink,
    with_recorded,
)
from tether._credentials import Masker
from tether._stores.file import find_session
from tether.core.records import replace
from tether.errors import ConfigurationError, TetherError

if TYPE_CHECKING:  # the runtime and the adapters pull in the model SDKs: import them lazily
    from tether._runtime import Agent, RunResult

# The exit statuses of an agent call, from the one table (tether.errors.EXIT_STATUSES);
# re-exported under their old names for the other command modules.
EXIT_FAILED = errors.EXIT_FAILED
EXIT_BLOCKED = errors.EXIT_BLOCKED
EXIT_ABORTED = errors.EXIT_ABORTED
EXIT_AWAITING_APPROVAL = errors.EXIT_AWAITING_APPROVAL
EXIT_UNVERIFIED = errors.EXIT_UNVERIFIED


def exit_code_for(result: RunResult, *, abort_requested: bool = False) -> int:
    """The exit status of a finished agent call: its outcome's row of the table.

    ``abort_requested`` is true for ``tether resume --abort``: there an aborted outcome is
    what the user asked for, so it exits 0.
    """
    if result.unverified:
        return EXIT_UNVERIFIED
    code = errors.outcome_exit_code(result.status.value)
    return errors.EXIT_OK if abort_requested and code == EXIT_ABORTED else code


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


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object per line on stdout: every progress event, then "
        '{"event": "result", …}.',
    ),
]


def register(app: typer.Typer) -> None:
    app.command("run")(run)


@agent_command
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
    json_output: JsonOption = False,
    *,
    flags: Flags,
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
    run_agent_command(
        flags,
        lambda agent, chosen: agent.run(prompt, session=chosen),
        json_output=json_output,
        interaction=Interaction(interactive=not from_stdin and terminal_attached()),
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


def choose_session(flags: Flags, session: str | None, last: bool) -> str | None:
    """The session an agent command means: ``session`` as given, or the newest for ``last``."""
    if not last:
        return session
    folder = agent_sessions_dir(flags.get("sessions_dir"), flags.get("workspace"))
    return pick_session(session, last, folder)


def terminal_attached() -> bool:
    """Whether a person can answer questions: stdin and stderr are terminals."""
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def run_agent_command(
    flags: Flags,
    call: Callable[[Agent, str | None], RunResult],
    *,
    json_output: bool = False,
    interaction: Interaction = NO_INTERACTION,
    session: str | None = None,
    last: bool = False,
    require_session: bool = False,
    abort_requested: bool = False,
) -> NoReturn:
    """Build the agent, run ``call`` with progress and Ctrl+C handling, exit with its code.

    ``call`` gets the session meant (``session``, or the newest one for ``last``); for an
    existing session the settings it was run with fill in the flags not given (as far as
    its log vouches for them, :func:`~tether._cli.session_pick.with_recorded`)."""
    code = 0
    with agent_errors():
        agent, progress, chosen = prepare_agent(
            flags,
            json_output=json_output,
            interaction=interaction,
            session=session,
            last=last,
            require_session=require_session,
        )
        try:
            result = call_agent(agent, progress, lambda: call(agent, chosen))
        finally:
            # Let go of the session now (a shared store's lease, the file store's lock), so
            # the next command can have it at once rather than after the lease runs out.
            agent.close()
        progress.result(result)
        code = exit_code_for(result, abort_requested=abort_requested)
    raise typer.Exit(code)


def prepare_agent(
    flags: Flags,
    *,
    json_output: bool = False,
    interaction: Interaction = NO_INTERACTION,
    session: str | None = None,
    last: bool = False,
    require_session: bool = False,
) -> tuple[Agent, Progress, str | None]:
    """The agent of an interactive command, its progress display and the session meant."""
    from tether._project import load_project_config

    project = load_project_config(workspace_root(flags.get("workspace")))
    chosen = choose_session(flags, session, last)
    if require_session and chosen is None:
        raise ConfigurationError("give a SESSION (an id, a unique id prefix or a path) or --last")
    if chosen is not None:
        flags = with_recorded(flags, chosen, project)
    settings = cli_settings(flags, project=project)
    if chosen is not None and settings.store is None:
        # A mistyped session is "no such session" (exit 3) before anything else is built:
        # not "no model given", which is what the missing record would lead to.
        find_session(agent_sessions_dir(settings.sessions_dir, settings.workspace), chosen)
    progress = make_progress(json_output)
    sink = recording_sink(flags, settings, progress.on_event)
    agent = cli_agent(settings, progress, interaction, on_event=sink, project=project)
    return agent, progress, chosen


__all__ = [
    "EXIT_ABORTED",
    "EXIT_AWAITING_APPROVAL",
    "EXIT_BLOCKED",
    "EXIT_FAILED",
    "EXIT_UNVERIFIED",
    "JsonOption",
    "agent_errors",
    "call_agent",
    "exit_code_for",
    "interruptible",
    "masked_result",
    "prepare_agent",
    "register",
    "run",
    "terminal_attached",
]
