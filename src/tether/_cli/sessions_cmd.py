"""``tether sessions``: list the session logs of a workspace.

Never changes or repairs a log; removes only what interrupted creates provably left behind
(``docs/store.md``, "Leftovers of interrupted creates").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether._cli.common import (
    InputError,
    SessionsDirOption,
    emit_json,
    handle_errors,
    one_line,
    printable,
    resolve_sessions_dir,
)
from tether._cli.inspect_cmd import format_timestamp, last_outcome_text
from tether._stores.file import SessionSummary, list_sessions

if TYPE_CHECKING:
    from tether._models.prices import Price
    from tether._runtime.spend import Cost


def register(app: typer.Typer) -> None:
    app.command("sessions")(sessions)


def sessions(
    sessions_dir: SessionsDirOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="List the sessions of a shared store (postgresql://…): status, current "
            "operation, lease owner, epoch and expiry. Default: $TETHER_STORE_URL, else "
            "[store] url (not with --sessions-dir).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
) -> None:
    """List sessions: id, last activity, model, status (an unfinished operation, or how
    the last run ended, with its error), the first prompt and size; --json has it all.

    Examples:

        tether sessions

        tether sessions --json

    Exit status: 0 listed (also when there are none), 2 --sessions-dir does not exist.
    """
    from tether._cli.store_cmd import default_store, list_store_sessions

    with handle_errors():
        url = default_store(store, files_named=sessions_dir is not None)
        if url is not None:
            list_store_sessions(url, json_output)
            return
        if sessions_dir is not None and not sessions_dir.is_dir():
            raise InputError(f"sessions folder {str(sessions_dir)!r} does not exist")
        summaries = list_sessions(resolve_sessions_dir(sessions_dir))
        from tether._runtime.spend import workspace_prices

        prices = workspace_prices()
        if json_output:
            emit_json(
                [
                    {**summary.to_json(), "costUsd": summary_cost(summary, prices).to_json()}
                    for summary in summaries
                ]
            )
            return
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)  # a pipe or file: never fold ids
        render_sessions(summaries, console, prices)


def short_time(ms: int) -> str:
    """``YYYY-MM-DD HH:MM:SS`` (UTC) for the table; the full ISO text is in ``--json``."""
    text = format_timestamp(ms)
    return text[:19].replace("T", " ") if text[:4].isdigit() else text


PROMPT_WIDTH = 40
"""Characters of the first prompt in the table (the full text is in ``--json``)."""


def _operation_text(summary: SessionSummary) -> str:
    if summary.error is not None:
        return f"unreadable: {summary.error.code}"
    operation = summary.operation or "?"
    if operation != "idle":
        operation += " unfinished (tether resume)"
    elif summary.last_outcome is not None and summary.last_kind is not None:
        operation = last_outcome_text(summary.last_kind, summary.last_outcome, summary.last_error)
    if summary.torn_tail:
        operation += f" (torn tail: {summary.torn_tail} bytes)"
    return operation


def _prompt_text(summary: SessionSummary) -> str:
    if summary.first_prompt is None:
        return "-"
    text = one_line(summary.first_prompt)
    return text if len(text) <= PROMPT_WIDTH else text[: PROMPT_WIDTH - 1] + "…"


def summary_cost(summary: SessionSummary, prices: Mapping[str, Price]) -> Cost:
    """The session's cost: the costs its answers reported, the rest at the model's price."""
    from tether._models.prices import price_for
    from tether._runtime.spend import Cost, cost_of_answers

    if summary.usage is None:
        return Cost(known=False)
    price = price_for(summary.model or "", prices)
    return cost_of_answers(summary.reported, summary.usage, price)


def _cost_cell(cost: Cost) -> str:
    return f"${cost.usd:.4f}" if cost.known else (f"≥${cost.usd:.4f}" if cost.usd else "?")


def render_sessions(
    summaries: list[SessionSummary],
    console: Console,
    prices: Mapping[str, Price] | None = None,
) -> None:
    if not summaries:
        console.print("no sessions")
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=36)
    table.add_column("last activity (UTC)", no_wrap=True)
    table.add_column("model", overflow="fold")
    table.add_column("status", overflow="fold")
    table.add_column("first prompt", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    for summary in summaries:
        table.add_row(
            Text(printable(summary.id or summary.path.name)),
            short_time(summary.last_activity),
            Text(printable(summary.model or "-")),
            Text(_operation_text(summary)),
            Text(_prompt_text(summary)),
            f"{summary.size:,}",
            _cost_cell(summary_cost(summary, prices or {})),
        )
    console.print(table)
