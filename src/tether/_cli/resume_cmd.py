"""``tether resume SESSION [--abort]``: finish (or durably abort) a session's unfinished work."""

from __future__ import annotations

from typing import Annotated

import typer

from tether._cli.agent_flags import Flags, Interaction, agent_command
from tether._cli.run_cmd import JsonOption, run_agent_command, terminal_attached
from tether._cli.session_pick import LastOption
from tether.errors import ConfigurationError


def register(app: typer.Typer) -> None:
    app.command("resume")(resume)
    app.command("retry")(retry)


@agent_command
def resume(
    session: Annotated[
        str | None,
        typer.Argument(
            help="Session id, unique id prefix or path of the log (or --last).",
            metavar="SESSION",
            show_default=False,
        ),
    ] = None,
    last: LastOption = False,
    abort: Annotated[
        bool,
        typer.Option(
            "--abort",
            help="Abort the unfinished operation durably instead of continuing it: the open "
            "model attempt fails as aborted, a started tool becomes interrupted, queued "
            "calls aborted. Nothing is re-executed.",
        ),
    ] = False,
    json_output: JsonOption = False,
    *,
    flags: Flags,
) -> None:
    """Continue a session's unfinished operation exactly as its log says.

    An interrupted model call is retried once with the same configuration; a
    tool that is safe to replay is replayed, any other started tool gets an
    `interrupted` result. A session with nothing unfinished is left alone.
    Without --model etc. the model, endpoint and options the session was run
    with are used again.

    If recovery is blocked (the configuration, environment or a tool's replay
    declaration changed, or the retry was used up) the message names the gate,
    what changed, and the two ways out: restore the configuration, or
    `tether resume SESSION --abort`.

    Examples:

        tether resume --last

        tether resume 01a2f3 --abort

    Exit status: 0 completed, nothing to do, or aborted with --abort; 1 failed;
    2 usage error; 3 no such session; 4 session busy; 5 corrupt log;
    65 blocked; 130 aborted by Ctrl+C.
    """
    run_agent_command(
        flags,
        lambda agent, chosen: agent.resume(need_session(chosen), abort=abort),
        json_output=json_output,
        interaction=Interaction(interactive=terminal_attached()),
        session=session,
        last=last,
        require_session=True,
        abort_requested=abort,
    )


def need_session(chosen: str | None) -> str:
    """The session of a command that needs one (exit 2 without)."""
    if chosen is None:
        raise ConfigurationError("give a SESSION (an id, a unique id prefix or a path) or --last")
    return chosen


@agent_command
def retry(
    session: Annotated[
        str | None,
        typer.Argument(
            help="Session id, unique id prefix or path of the log (or --last).",
            metavar="SESSION",
            show_default=False,
        ),
    ] = None,
    last: LastOption = False,
    json_output: JsonOption = False,
    *,
    flags: Flags,
) -> None:
    """Run a failed (or aborted) last run again on its own prompt.

    The new run starts on the same user entry: the prompt is not appended a
    second time. Without --model etc. the settings the session was run with
    are used again.

    Examples:

        tether retry --last

        tether retry 01a2f3 --model openai/gpt-4o-mini

    Exit status: as `tether run`; 2 also when the last run did not fail or
    the session has unfinished work (`tether resume` it first).
    """
    run_agent_command(
        flags,
        lambda agent, chosen: agent.retry(need_session(chosen)),
        json_output=json_output,
        interaction=Interaction(interactive=terminal_attached()),
        session=session,
        last=last,
        require_session=True,
    )
