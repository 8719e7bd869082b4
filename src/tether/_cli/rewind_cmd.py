"""``tether rewind SESSION --turn N [--dry-run]``: put back the files the session's tools
changed after turn N (the rules are in :mod:`tether._effects.rewind`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether._cli.common import (
    WORKSPACE_HELP,
    InputError,
    SessionsDirOption,
    emit_json,
    handle_errors,
    one_line,
    printable,
    workspace_root,
)
from tether._cli.session_pick import LastOption, pick_session
from tether._effects.rewind import RewindPlan, StepStatus, rewind_session
from tether._stores.file import sessions_dir_for
from tether.errors import RewindNeedsReview

_VERBS: dict[StepStatus, str] = {
    StepStatus.PENDING: "would restore",
    StepStatus.RESTORED: "restored",
    StepStatus.UNCHANGED: "already at its earlier version",
    StepStatus.REVIEW: "NEEDS REVIEW",
    StepStatus.SKIPPED: "left as it is",
}
"""How each step's status reads in the plan (``pending`` only in a dry run)."""


def register(app: typer.Typer) -> None:
    app.command("rewind")(rewind)


def describe(plan: RewindPlan, *, dry_run: bool) -> list[str]:
    """The plan or its outcome, one line each (also the REPL's ``/rewind``)."""
    head = "plan of the rewind" if dry_run else "rewind"
    resumed = " (finishing an interrupted rewind)" if plan.resumed else ""
    lines = [f"{head} of session {plan.session_id} to turn {plan.turn}{resumed}"]
    if not plan.steps:
        lines.append("  no file changed by the journaled tools after that turn")
    for step in plan.steps:
        gone = " (created by the session: deleted)" if step.before_hash is None else ""
        line = f"  {_VERBS[step.status]}: {printable(step.path)}{gone}  [turn {step.turn}, "
        line += f"{printable(step.tool_name)} {step.operation_id}]"
        if step.status is StepStatus.REVIEW:
            line += (
                f"\n      expected {step.after_hash}, found {step.found_hash}: "
                f"{one_line(step.reason)} "
                + (
                    "(it would go to review)"
                    if step.review_item is None
                    else f"(review item {step.review_item})"
                )
            )
        lines.append(line)
    if plan.not_restorable:
        lines.append("not restorable (the journal cannot know what these changed):")
        for item in plan.not_restorable:
            lines.append(
                f"  turn {item.turn} {printable(item.tool_name)}: {one_line(item.command)}"
            )
    return lines


def rewind(
    turn: Annotated[
        int,
        typer.Option(
            "--turn",
            help="Go back to as after this turn (turns count from 1; 0: before the first).",
            metavar="N",
        ),
    ],
    session: Annotated[
        str | None,
        typer.Argument(
            help="Session id, unique id prefix or path.", metavar="SESSION", show_default=False
        ),
    ] = None,
    last: LastOption = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan; change nothing.")
    ] = False,
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
    ] = None,
    sessions_dir: SessionsDirOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Restore the files the session's tools changed after turn N, newest first.

    Each file is restored only if it still holds the session's version; a file changed
    since is left as it is and listed for review (exit 24). Changes made by bash cannot
    be known and are listed as not restorable. Running it again finishes an interrupted
    rewind. Details: docs/rewind.md.

    Examples:

        tether rewind 0190c3 --turn 2 --dry-run

        tether rewind --last --turn 0
    """
    with handle_errors(session):
        root = workspace_root(workspace)
        chosen = pick_session(session, last, sessions_dir or sessions_dir_for(root))
        if chosen is None:
            raise InputError("name a session (or --last)")
        plan = rewind_session(root, chosen, turn, dry_run=dry_run, sessions_dir=sessions_dir)
        if json_output:
            emit_json({**plan.to_json(), "resumed": plan.resumed, "dryRun": dry_run})
        else:
            for line in describe(plan, dry_run=dry_run):
                typer.echo(line)
        if plan.resumed and plan.turn != turn:
            typer.echo(f"that was an earlier rewind; run it again for turn {turn}", err=True)
        review = plan.review
        if review and not dry_run:
            raise RewindNeedsReview(
                tuple(step.path for step in review), tuple(step.review_item for step in review)
            )
