"""tether's command-line interface.

Each command lives in its own module exposing ``register(app)``; add a new command by
writing ``src/tether/cli/<name>_cmd.py`` and listing it in :data:`COMMAND_MODULES`.
Error mapping, input reading and JSON output are shared in :mod:`tether.cli.common`.

Exit status: 0 success, 1 corrupt session, 2 usage error (bad flags, unreadable or
malformed input files), 70 internal error (a bug in tether).
"""

from __future__ import annotations

import typer

from tether import __version__
from tether.cli import inspect_cmd, plan_cmd, sessions_cmd

app = typer.Typer(
    name="tether",
    help="Durable agent sessions: inspect, list and plan recovery of session logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (inspect_cmd, plan_cmd, sessions_cmd)
for _module in COMMAND_MODULES:
    _module.register(app)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tether {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Show the version and exit.",
        callback=_show_version,
        is_eager=True,
    ),
) -> None:
    """Inspect and plan recovery of tether session logs."""


def main() -> None:
    """Console-script entry point (``tether``) and ``python -m tether``."""
    app(prog_name="tether")


__all__ = ["app", "main"]
