"""``tether approvals`` / ``approve ID`` / ``deny ID``: decide parked calls from any terminal.

A run with nobody to ask (a pipe, CI, a worker) parks a call the policy says to ``ask``
about and stops with exit 67 naming the call (:mod:`tether._effects.approvals`). These
commands list the parked calls with what they would do in full (the command, the diff of
a ``write``/``edit`` against the file as it is now), and record a decision with who made
it; ``tether resume SESSION`` then carries it out. A call whose arguments or files changed
since it was proposed cannot be approved (it is void; the next resume proposes it again).

With a shared store (``--store``, else ``$TETHER_STORE_URL``, else ``[store] url``, as the
agent commands choose it) the parked calls are in the store's database, where every worker
parks them: any terminal that reaches the database decides them.

Exit status: 0 done, 2 usage error, 25 no such parked call, 26 already decided or void.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from tether import _faults as faults
from tether._cli.approval_view import call_details
from tether._cli.common import (
    WORKSPACE_HELP,
    emit_json,
    handle_errors,
    one_line,
    printable,
    workspace_root,
)
from tether._cli.session_pick import LastOption, session_id_for
from tether._cli.store_cmd import StoreUrlOption, default_store
from tether._effects.approvals import ApprovalRequest, ApprovalStore, parse_request_id
from tether._stores.file import sessions_dir_for
from tether._wsdb.sqlite import EffectsDB, effects_db_path, format_ms
from tether.errors import ApprovalDecided, ApprovalNotFound, ConfigurationError

DECIDING = faults.register(
    "approval.deciding", "tether approve/deny checked the call; the decision is not recorded"
)
DECIDED = faults.register(
    "approval.decided", "tether approve/deny recorded the decision; nothing printed yet"
)

WorkspaceOption = Annotated[
    Path | None,
    typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
]
IdArgument = Annotated[
    str,
    typer.Argument(
        help="The parked call's number (from `tether approvals`).", metavar="ID", show_default=False
    ),
]
AsOption = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Who decides, as recorded (default: your user name).",
        metavar="NAME",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    app.command("approvals")(approvals)
    app.command("approve")(approve)
    app.command("deny")(deny)


def _open(root: Path, url: str | None) -> EffectsDB | None:
    """The database holding the parked calls: the shared store's (``url``), else the
    workspace's ``effects.db`` (``None`` when it does not exist: nothing was parked)."""
    if url is not None:
        from tether._stores.postgres import is_store_url
        from tether._wsdb.postgres import PostgresEffectsDB

        if not is_store_url(url):
            raise ConfigurationError("a store URL must start with postgresql:// or postgres://")
        return PostgresEffectsDB.open_url(url)
    if not effects_db_path(root).exists():
        return None
    return EffectsDB.open_workspace(root)


def _session(session: str | None, last: bool, root: Path, url: str | None) -> str | None:
    """The session ``--session``/``--last`` name, in the store at ``url`` or the files."""
    if url is None:
        return session_id_for(session, last, sessions_dir_for(root))
    if session is not None and last:
        raise ConfigurationError("give --session or --last, not both")
    from tether._cli.store_cmd import newest_store_session, open_store

    if last:
        return newest_store_session(url)
    if session is None:
        return None
    with open_store(url) as sessions:
        return sessions.resolve(session)


def _who(name: str | None) -> str:
    if name is not None:
        if not name.strip():
            raise ConfigurationError("--as needs a name")
        return one_line(name)
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def approvals(
    workspace: WorkspaceOption = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session", "-s", help="Only this session's calls (id or unique prefix).", metavar="ID"
        ),
    ] = None,
    last: LastOption = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also the decided and void calls.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    store: StoreUrlOption = None,
) -> None:
    """List the calls waiting for a decision, with what each would do in full.

    Examples:

        tether approvals

        tether approvals --all --json
    """
    with handle_errors():
        root = workspace_root(workspace)
        url = default_store(store)
        session = _session(session, last, root, url)
        db = _open(root, url)
        requests: list[ApprovalRequest] = []
        if db is not None:
            try:
                requests = ApprovalStore(db).list(status=None if show_all else "proposed")
            finally:
                db.close()
        if session is not None:
            requests = [r for r in requests if r.session_id == session]
        if json_output:
            emit_json([request.as_dict() for request in requests])
            return
        console = Console(highlight=False, soft_wrap=True)
        if not requests:
            console.print(
                "no calls are waiting for approval" if not show_all else "no parked calls"
            )
            return
        real = Path(os.path.realpath(root))
        for request in requests:
            head = Text()
            head.append(f"#{request.id} ", style="bold")
            head.append(
                f"{request.status}  ", style="yellow" if request.status == "proposed" else ""
            )
            head.append(printable(f"{request.tool_name}: {one_line(request.summary)}"))
            console.print(head)
            console.print(
                Text(
                    f"  session {request.session_id}  proposed {format_ms(request.proposed_at_ms)}"
                    f"  rule: {one_line(request.rule)}",
                    style="dim",
                )
            )
            if request.status != "proposed":
                by = f" by {request.decided_by}" if request.decided_by else ""
                why = f": {one_line(request.reason)}" if request.reason else ""
                console.print(Text(f"  {request.status}{by}{why}", style="dim"))
                continue
            for line in call_details(request.tool_name, request.arguments, real):
                console.print(Text(f"    {line}"))
            console.print(
                Text(
                    f"  decide: tether approve {request.id} [--always]  |  "
                    f"tether deny {request.id} --why TEXT",
                    style="dim",
                )
            )


def _decide(
    workspace: Path | None,
    store_url: str | None,
    ident: str,
    *,
    approve: bool,
    who: str,
    why: str | None,
    always: bool,
) -> ApprovalRequest:
    from tether._completion.verify import workspace_scanner
    from tether._project import load_project_config
    from tether._runtime.guards import stale_reason

    request_id = parse_request_id(ident)
    root = workspace_root(workspace)
    db = _open(root, default_store(store_url))
    if db is None:
        raise ApprovalNotFound(f"no parked call #{request_id}: this workspace has none")
    try:
        store = ApprovalStore(db)
        request = store.get(request_id)
        if request.status != "proposed":  # decided once: this raises ApprovalDecided
            store.decide(request_id, approve=approve, who=who, reason=why, always=always)
        real = Path(os.path.realpath(root))
        if approve:  # a denial needs no fresh view: it never runs anything

            def version() -> str | None:
                return workspace_scanner(real, load_project_config(real)).version().digest

            stale = stale_reason(request, real, version)
            if stale is not None:
                store.void(request_id, stale)
                raise ApprovalDecided(
                    f"parked call #{request_id} is stale and now void: {stale}; "
                    f"`tether resume {request.session_id}` proposes it again"
                )
        faults.hit(DECIDING)
        decided = store.decide(request_id, approve=approve, who=who, reason=why, always=always)
        faults.hit(DECIDED)
        return decided
    finally:
        db.close()


def approve(
    ident: IdArgument,
    always: Annotated[
        bool,
        typer.Option(
            "--always",
            help="Also allow later calls of this tool under the same rule in this session.",
        ),
    ] = False,
    who: AsOption = None,
    workspace: WorkspaceOption = None,
    store: StoreUrlOption = None,
) -> None:
    """Approve a parked call; `tether resume SESSION` then runs it.

    Refused if the call was decided already, or if its files changed since it
    was proposed (it becomes void; the next resume proposes it again).

    Examples:

        tether approve 3

        tether approve 3 --always
    """
    with handle_errors():
        decided = _decide(
            workspace, store, ident, approve=True, who=_who(who), why=None, always=always
        )
        extra = " (and later calls under the same rule)" if always else ""
        typer.echo(
            f"approved call #{decided.id}{extra} as {decided.decided_by}; carry it out with: "
            f"tether resume {decided.session_id}"
        )


def deny(
    ident: IdArgument,
    why: Annotated[
        str,
        typer.Option(
            "--why", help="Why not; the model reads it.", metavar="TEXT", show_default=False
        ),
    ],
    who: AsOption = None,
    workspace: WorkspaceOption = None,
    store: StoreUrlOption = None,
) -> None:
    """Deny a parked call: it never runs; the model is told why on the next resume.

    Examples:

        tether deny 3 --why "not on the production config"
    """
    with handle_errors():
        if not why.strip():
            raise ConfigurationError("--why needs a reason")
        decided = _decide(
            workspace, store, ident, approve=False, who=_who(who), why=one_line(why), always=False
        )
        typer.echo(
            f"denied call #{decided.id} as {decided.decided_by}; the model is told on: "
            f"tether resume {decided.session_id}"
        )
