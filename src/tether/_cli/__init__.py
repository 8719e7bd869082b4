"""tether's command-line interface.

Each command lives in its own module exposing ``register(app)``; add a new command by
writing ``src/tether/_cli/<name>_cmd.py`` and listing it in :data:`COMMAND_MODULES`.
Error mapping, input reading and JSON output are shared in :mod:`tether._cli.common`.

Exit status: 0 success, 1 corrupt session, 2 usage error (bad flags, unreadable or
malformed input files), 70 internal error (a bug in tether). The agent commands (``run``,
``resume``, ``repl``) add 1 run failed, 3-10 session store errors, 65 recovery blocked, 67 a call
awaits approval and 130 aborted (see :mod:`tether._cli.run_cmd`).

``tether`` without a command starts the interactive REPL (:mod:`tether._cli.repl`).
"""

from __future__ import annotations

import os

import typer

from tether import __version__
from tether._cli import (
    approvals_cmd,
    authorizations_cmd,
    crashlab_cmd,
    fork_cmd,
    inspect_cmd,
    lab_cmd,
    mcp_cmd,
    plan_cmd,
    repl,
    replay_cmd,
    resume_cmd,
    review_cmd,
    rewind_cmd,
    run_cmd,
    sandbox_cmd,
    sessions_cmd,
    show_cmd,
    store_cmd,
    verify_cmd,
)
from tether._cli.common import EXIT_USAGE
from tether._cli.help_format import plain_argument_help
from tether._credentials import hide_from_process_listing, register_secret
from tether._loading import freeze_for_exit
from tether.errors import EXIT_ABORTED

plain_argument_help()

app = typer.Typer(
    name="tether",
    help="Durable agent sessions: run agents, resume them after a crash, inspect, list and "
    "plan recovery of session logs. Without a command: the interactive REPL.",
    invoke_without_command=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

COMMAND_MODULES = (
    run_cmd,
    resume_cmd,
    repl,
    inspect_cmd,
    show_cmd,
    plan_cmd,
    sessions_cmd,
    review_cmd,
    rewind_cmd,
    crashlab_cmd,
    lab_cmd,
    verify_cmd,
    authorizations_cmd,
    mcp_cmd,
    store_cmd,
    approvals_cmd,
    sandbox_cmd,
    fork_cmd,
    replay_cmd,
)
for _module in COMMAND_MODULES:
    _module.register(app)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tether {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        help="Show the version and exit.",
        callback=_show_version,
        is_eager=True,
    ),
) -> None:
    """Run durable agents; inspect and plan recovery of tether session logs."""
    if ctx.invoked_subcommand is None:
        repl.start_repl({})


def main() -> None:
    """Console-script entry point (``tether``) and ``python -m tether``."""
    # tether's key is a secret for every command, even one that makes no model request
    # (the output of `tether verify` is masked too).
    register_secret(os.environ.get("TETHER_API_KEY", ""))
    # The commands tether starts can read their parent's /proc/PID/environ: blank the
    # credential variables there first (os.environ keeps them; children never get them).
    hide_from_process_listing(())
    try:
        code = app(prog_name="tether", standalone_mode=False)
    except typer.TyperException as exc:
        # A usage error (unknown flag, missing argument, bad value): one line, exit 2,
        # instead of typer's boxed panel.
        ctx = getattr(exc, "ctx", None)
        path = getattr(ctx, "command_path", None) or "tether"
        message = " ".join(exc.format_message().split())
        typer.echo(f"error: {message} (see '{path} --help')", err=True)
        raise SystemExit(EXIT_USAGE) from None
    except typer.Abort:
        raise SystemExit(EXIT_ABORTED) from None
    finally:
        # The command has ended; the process exits next (see freeze_for_exit).
        freeze_for_exit()
    raise SystemExit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
