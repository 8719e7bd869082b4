"""``tether show SESSION|--last [--json] [--html FILE]``: a session as a timeline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tether._cli.common import (
    InputError,
    SessionsDirOption,
    corruption_message,
    emit_json,
    fail,
    handle_errors,
    printable,
    resolve_sessions_dir,
)
from tether._cli.store_cmd import (
    StoreUrlOption,
    default_store,
    newest_store_session,
    read_store_log,
)
from tether._show import SessionLog, load_log, log_from_bytes, session_timeline
from tether._show.page import write_page
from tether._show.terminal import render_timeline, write_lines
from tether._stores.file import find_session, list_sessions
from tether.core.timeline import DEFAULT_PAUSE_MS, Timeline
from tether.errors import SessionNotFound, exit_code_of

if TYPE_CHECKING:
    from tether._runtime.spend import Cost
    from tether._stores.lineage import Lineage
    from tether._stores.reasoning import SideRecord


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def open_session(session: str | None, last: bool, sessions_dir: Path | None) -> SessionLog:
    """The log named by SESSION (a file, an id or a unique prefix) or ``--last``.

    The one place ``show`` meets the session store: it goes through the store's finder
    (the file store today), and everything after it works on the log's facts.
    """
    if (session is None) == (not last):
        raise InputError("name one session: SESSION or --last")
    if last:
        folder = resolve_sessions_dir(sessions_dir)
        readable = [s for s in list_sessions(folder) if s.error is None]
        if not readable:
            raise SessionNotFound("--last", str(folder))
        return load_log(max(readable, key=lambda s: s.last_activity).path)
    assert session is not None
    path = Path(session)
    if not path.exists() and path.parent == Path("."):
        path = find_session(resolve_sessions_dir(sessions_dir), session)
    return load_log(path)


def show(
    session: Annotated[
        str | None,
        typer.Argument(
            help="Session log (.jsonl), or a session id or unique id prefix.",
            metavar="SESSION",
            show_default=False,
        ),
    ] = None,
    last: Annotated[
        bool, typer.Option("--last", help="The session with the latest activity.")
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the timeline as one JSON document.")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Write the timeline as one self-contained HTML page (no network).",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option("--all", help="Show every operation (a long session is summarised)."),
    ] = False,
    pause_ms: Annotated[
        int,
        typer.Option(
            "--pause-ms",
            min=1,
            metavar="MS",
            help="A pause this long where the runtime does not wait counts as a gap.",
        ),
    ] = DEFAULT_PAUSE_MS,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Workspace whose .tether/effects.db holds the evidence (default: the "
            "session's cwd, as its header records it).",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    sessions_dir: SessionsDirOption = None,
    store: StoreUrlOption = None,
) -> None:
    """Show a session as a timeline: operations, steps and attempts, tool calls with
    their authorization, result and reconciliation evidence, reviews, verifications,
    usage, and the gaps where the process was down (crash or stop) with the recovery
    that followed.

    Examples:

        tether show --last

        tether show 01a2 --html timeline.html

        tether show 01a2 --json

    A corrupt log is drawn up to the line that stops it, marked there, and exits 1.

    Exit status: 0 shown, 1 the log is corrupt, 2 usage error, 3 no such session, 7
    ambiguous id prefix, 20 the effects database cannot be read.
    """
    with handle_errors():
        named_file = sessions_dir is not None or (session is not None and Path(session).is_file())
        url = default_store(store, files_named=named_file)
        if url:
            if (session is None) == (not last):
                raise InputError("give a session (its id) or --last, one of the two")
            # read_store_log checks the URL (store_url) before anything else uses it.
            chosen = newest_store_session(url) if last else str(session)
            log = log_from_bytes(read_store_log(url, chosen), chosen)
        else:
            log = open_session(session, last, sessions_dir)
        timeline = session_timeline(log, workspace, pause_ms=pause_ms, shared_url=url or None)
        _draw(timeline, log, html, json_output, show_all, _cost(log, workspace))
        if log.stopped is not None:
            # What was readable is drawn; the exit status still says the log is corrupt.
            name = session if session is not None else "--last"
            fail(corruption_message(log.stopped, name, shown=True), exit_code_of(type(log.stopped)))


def _cost(log: SessionLog, workspace: Path | None) -> Cost:
    """The session's cost (``tether._runtime.spend``): the costs its answers reported (the
    side records beside a file log), the rest at the price of ``[prices]`` or tether's table."""
    from tether._runtime.spend import log_cost, workspace_prices
    from tether._stores.reasoning import parse_side_record, side_record_name
    from tether._stores.sidecar import FileSidecar, sidecar_path

    path = Path(log.location)
    session_id = log.state.header.id

    def read(entry_id: str) -> SideRecord | None:
        if not path.is_file():
            return None  # a shared store's log: only the prices apply
        where = sidecar_path(path.parent, session_id, side_record_name(entry_id))
        data, _ = FileSidecar(where).read()
        return parse_side_record(data, entry_id) if data is not None else None

    return log_cost(log.state, read, workspace_prices(str(workspace) if workspace else None))


def log_lineage(log: SessionLog) -> Lineage | str | None:
    """The fork lineage record beside a file log (docs/replay.md), if any."""
    from tether._stores.lineage import SIDECAR_NAME, read_lineage
    from tether._stores.sidecar import FileSidecar, sidecar_path

    path = Path(log.location)
    if not path.is_file():
        return None
    return read_lineage(FileSidecar(sidecar_path(path.parent, log.state.header.id, SIDECAR_NAME)))


def _draw(
    timeline: Timeline,
    log: SessionLog,
    html: Path | None,
    json_output: bool,
    show_all: bool,
    cost: Cost,
) -> None:
    if html is not None:
        try:
            size = write_page(timeline, html)
        except OSError as exc:
            raise InputError(f"cannot write {html}: {exc.strerror or exc}") from None
        typer.echo(f"wrote {html} ({size:,} bytes)", err=True)
        if not json_output:
            return
    stopped = log.stopped
    if json_output:
        document = timeline.to_json()
        document["costUsd"] = cost.to_json()
        lineage = log_lineage(log)
        if lineage is not None and not isinstance(lineage, str):
            document["lineage"] = lineage.to_json()
        if stopped is not None:
            document["unreadable"] = {**stopped.to_json(), "detail": stopped.detail}
        emit_json(document)
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    render_timeline(timeline, console, show_all=show_all)
    write_lines([[("Cost ", "bold cyan"), (cost.text(), "")]], console)
    lineage = log_lineage(log)
    if lineage is not None:
        text = lineage if isinstance(lineage, str) else lineage.text()
        write_lines([[("Lineage ", "bold cyan"), (printable(text), "")]], console)
    if stopped is not None:
        detail = f" ({printable(stopped.detail)})" if stopped.detail else ""
        seq = f", seq {stopped.seq}" if stopped.seq is not None else ""
        write_lines(
            [
                [
                    ("✖ UNREADABLE ", "bold red"),
                    (
                        f"from line {stopped.line:,}{seq}: {stopped.code}{detail}; the "
                        f"timeline above is the {stopped.line - 1:,} line(s) before it, "
                        "nothing after it is shown",
                        "",
                    ),
                ]
            ],
            console,
        )
