"""``tether authorizations``: the recorded decisions on side-effecting tool calls.

Every decision that came from a ``tether.toml`` rule, a person at the terminal or
``--yes`` was written to ``.tether/effects.db`` before its call started: who decided,
on what (tool, summary, arguments digest), why (rule and reason) and when.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tether._cli.common import WORKSPACE_HELP, emit_json, handle_errors, one_line, workspace_root
from tether._cli.session_pick import LastOption, session_id_for
from tether._cli.store_cmd import STORE_URL_ENV, StoreUrlOption
from tether._effects.authorization import AuthorizationStore
from tether._stores.file import sessions_dir_for
from tether._wsdb.sqlite import EffectsDB, effects_db_path, format_ms


def register(app: typer.Typer) -> None:
    app.command("authorizations")(authorizations)


def authorizations(
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            "-s",
            help="Only this session's decisions (id or unique prefix).",
            metavar="ID",
        ),
    ] = None,
    last: LastOption = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    store: StoreUrlOption = None,
) -> None:
    """List the authorization decisions recorded in this workspace, oldest first.

    Examples:

        tether authorizations --last

        tether authorizations --json
    """
    with handle_errors():
        root = workspace_root(workspace)
        url = store or os.environ.get(STORE_URL_ENV)
        if url:
            from tether._wsdb.postgres import PostgresEffectsDB

            shared = PostgresEffectsDB.open_url(url)
            try:
                decisions = AuthorizationStore(shared).list(session)
            finally:
                shared.close()
        else:
            session = session_id_for(session, last, sessions_dir_for(root))
            if not effects_db_path(root).exists():
                decisions = []
            else:
                db = EffectsDB.open_workspace(root)
                try:
                    decisions = AuthorizationStore(db).list(session)
                finally:
                    db.close()
        if json_output:
            emit_json([decision.to_json() for decision in decisions])
            return
        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=200)  # a pipe: never fold ids or times
        if not decisions:
            console.print("no authorization decisions recorded")
            return
        table = Table(box=None, pad_edge=False)
        # Ids and timestamps never fold; the session is shortened (its full id: --json).
        for column in ("when (UTC)", "session", "tool", "decision", "who"):
            table.add_column(column, no_wrap=True)
        for column in ("call", "why"):
            table.add_column(column, overflow="fold")
        for decision in decisions:
            why = decision.rule + (f": {decision.reason}" if decision.reason else "")
            cells = (
                (format_ms(decision.decided_at_ms) or "")[:19].replace("T", " "),
                decision.session_id[:13] + "…",
                one_line(decision.tool_name),
                decision.decision,
                one_line(decision.who),
                one_line(decision.summary),
                one_line(why),
            )
            table.add_row(*(Text(cell) for cell in cells))  # never markup: untrusted text
        console.print(table)
