"""``tether review``: calls whose outcome could not be established after a crash."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
from tether._cli.store_cmd import STORE_URL_ENV, StoreUrlOption
from tether._effects.review import ReviewDecision, ReviewStore
from tether._runtime.review import resolve_review
from tether._wsdb.sqlite import EffectsDB, effects_db_path

review_app = typer.Typer(
    help="List and resolve review items: calls whose outcome recovery could not establish.",
    no_args_is_help=False,
    invoke_without_command=True,
)

WorkspaceOption = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
]


def register(app: typer.Typer) -> None:
    app.add_typer(review_app, name="review")


@review_app.callback()
def review(
    ctx: typer.Context,
    workspace: WorkspaceOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    store: StoreUrlOption = None,
) -> None:
    """List open review items with their reasons and evidence.

    Examples:

        tether review

        tether review resolve 3 --applied --note "checked the file by hand"
    """
    if ctx.invoked_subcommand is not None:
        return
    with handle_errors():
        root = workspace_root(workspace)
        url = store or os.environ.get(STORE_URL_ENV)
        if url:
            from tether._wsdb.postgres import PostgresEffectsDB

            shared = PostgresEffectsDB.open_url(url)
            try:
                items = ReviewStore(shared).list_open()
            finally:
                shared.close()
        elif not effects_db_path(root).exists():
            items = []
        else:
            db = EffectsDB.open_workspace(root)
            try:
                items = ReviewStore(db).list_open()
            finally:
                db.close()
        if json_output:
            emit_json([item.to_json() for item in items])
            return
        console = Console()
        if not items:
            console.print("no open review items")
            return
        table = Table(box=None, pad_edge=False)
        for column in ("item", "session", "tool", "operation", "reason"):
            table.add_column(column, overflow="fold")
        for item in items:
            table.add_row(
                str(item.id),
                item.session_id,
                printable(item.tool_name),
                item.operation_id,
                one_line(item.reason),
            )
        console.print(table)
        console.print(
            "resolve with: tether review resolve ITEM --applied|--not-applied|--abort "
            "[--note TEXT], then tether resume SESSION"
        )


@review_app.command("resolve")
def resolve(
    item: Annotated[str, typer.Argument(help="Review item number.", metavar="ITEM")],
    applied: Annotated[bool, typer.Option("--applied", help="The effect took place.")] = False,
    not_applied: Annotated[
        bool, typer.Option("--not-applied", help="The effect did not take place.")
    ] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Abort the run instead.")] = False,
    note: Annotated[
        str | None, typer.Option("--note", help="Why (kept as evidence).", metavar="TEXT")
    ] = None,
    workspace: WorkspaceOption = None,
    sessions_dir: SessionsDirOption = None,
    store: StoreUrlOption = None,
) -> None:
    """Record a decision and append the result it implies; then the run can be resumed.

    Examples:

        tether review resolve 3 --applied

        tether review resolve 3 --abort --note "not safe to finish"
    """
    with handle_errors():
        chosen = [
            d
            for d, flag in (
                (ReviewDecision.APPLIED, applied),
                (ReviewDecision.NOT_APPLIED, not_applied),
                (ReviewDecision.ABORT, abort),
            )
            if flag
        ]
        if len(chosen) != 1:
            raise InputError("choose exactly one of --applied, --not-applied, --abort")
        root = workspace_root(workspace)
        outcome = resolve_review(
            root,
            item,
            chosen[0],
            note,
            sessions_dir=sessions_dir,
            store_url=store or os.environ.get(STORE_URL_ENV) or None,
        )
        appended = {
            "result": "appended the call's result",
            "abortRequested": "recorded the abort request",
            "nothing": "the call was no longer pending; nothing appended",
        }[outcome.appended]
        typer.echo(
            f"review item {outcome.item.id} resolved as {chosen[0].value}; {appended}. "
            f"Continue with: tether resume {outcome.item.session_id}"
        )
