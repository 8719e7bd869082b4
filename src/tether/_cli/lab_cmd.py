"""``tether lab publish-report``: crash, recover and verify one effect, step by step."""

from __future__ import annotations

from typing import Annotated

import typer

from tether._cli.common import InputError, handle_errors
from tether.errors import EXIT_FAILED, EXIT_OK

lab_app = typer.Typer(
    name="lab",
    help="Step-by-step crash labs (state in .tether/lab/ of the current directory).",
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")


@lab_app.command("publish-report")
def publish_report(
    reset: Annotated[
        bool, typer.Option("--reset", help="Wipe .tether/lab/ first and start a new run.")
    ] = False,
    crash_at: Annotated[
        str | None,
        typer.Option(
            "--crash-at",
            help="Crash the new run at before_effect, after_effect or after_result "
            "(prints INJECTED_CRASH boundary=NAME, exit status 75).",
            metavar="BOUNDARY",
        ),
    ] = None,
    report: Annotated[
        bool,
        typer.Option("--report", help="Print the event timeline and PASS/FAIL; changes nothing."),
    ] = False,
) -> None:
    """Publish a report with a real agent, crash it at a boundary, recover, verify.

    \b
    tether lab publish-report --reset --crash-at after_effect   # crashes (exit 75)
    tether lab publish-report                                   # recovers
    tether lab publish-report                                   # again: changes nothing
    tether lab publish-report --report                          # PASS duplicate_effects=0

    Recovery looks the pending call up in the ledger and fills in its result
    (recovered_from_ledger=true), or publishes once when it never happened.
    Exit status: 0 done (--report: PASS), 1 --report found a problem, 2 usage error,
    75 the injected crash.
    """
    from tether.testing.crashlab import lab

    with handle_errors():
        if report and (reset or crash_at is not None):
            raise InputError(
                "--report only reads; it cannot be combined with --reset or --crash-at"
            )
        if crash_at is not None and crash_at not in lab.CRASH_BOUNDARIES:
            raise InputError(
                f"--crash-at must be one of {', '.join(lab.CRASH_BOUNDARIES)}, not {crash_at!r}"
            )
        try:
            if report:
                outcome = lab.lab_report()
                for line in outcome.lines:
                    typer.echo(line)
                typer.echo(outcome.verdict)
                raise typer.Exit(EXIT_OK if outcome.passed else EXIT_FAILED)
            if reset:
                lab.reset()
            if reset or crash_at is not None:
                lab.start(crash_at, typer.echo)
            else:
                lab.recover(typer.echo)
        except lab.LabStateError as exc:
            raise InputError(str(exc)) from None
