"""The shared-store commands (``docs/scale-out.md``).

* ``tether store init --store URL`` — create tether's tables (idempotent);
* ``tether export SESSION --store URL [-o FILE]`` — a session as a session-v2 file;
* ``tether import FILE --store URL`` — a session-v2 file as a session of the store;
* ``tether submit PROMPT [--session ID] --store URL`` — accept a prompt durably, return;
* ``tether worker --store URL [--concurrency N]`` — drive unfinished sessions until
  ``SIGTERM`` (or, with ``--until-empty``, until none is left); ``--status``: the queue
  and the leases per worker.

``tether sessions --store URL`` and ``tether inspect SESSION --store URL`` use
:func:`list_store_sessions` and :func:`read_store_log`. Every error is one line with the
exit code of :mod:`tether.errors` (10 store unreachable, 11 fenced, 12 schema).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tether._cli.agent_flags import Flags, agent_command, cli_settings, quiet_agent
from tether._cli.common import (
    emit_json,
    handle_errors,
    printable,
    read_input,
)
from tether._inputs import MAX_SUBMIT_BYTES
from tether.errors import ConfigurationError

if TYPE_CHECKING:
    from tether._settings import Settings
    from tether._stores.postgres import PostgresSessions

MAX_IMPORT_BYTES = 1 << 30
STORE_URL_ENV = "TETHER_STORE_URL"

store_app = typer.Typer(
    help="A shared session store (postgresql://…): see docs/scale-out.md.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")
    app.command("export")(export)
    app.command("import")(import_)
    app.command("submit")(submit)
    app.command("worker")(worker)


def store_url(given: str | None) -> str:
    """``--store``, else ``$TETHER_STORE_URL``; exit 2 when neither names one."""
    from tether._stores.postgres import STORE_URL_ENV, is_store_url

    url = given or os.environ.get(STORE_URL_ENV)
    if not url:
        raise ConfigurationError(
            f"no store given: pass --store postgresql://…, set {STORE_URL_ENV} or [store] "
            "url in tether.toml"
        )
    if not is_store_url(url):
        raise ConfigurationError("a store URL must start with postgresql:// or postgres://")
    return url


def default_store(given: str | None, *, files_named: bool = False) -> str | None:
    """The shared store a reading command (``sessions``, ``inspect``, ``show``) uses:
    ``--store``, else — unless the command was pointed at files (``--sessions-dir``, a
    log's path) — ``$TETHER_STORE_URL``, else ``[store] url`` of the workspace's
    tether.toml, as the agent commands choose it (the settings table). ``None``: the file
    store."""
    if given:
        return given
    if files_named:
        return None
    from tether._project import find_workspace_root, load_project_config

    url = os.environ.get(STORE_URL_ENV, "").strip()
    if url:
        return url
    return load_project_config(find_workspace_root().path).store.url


def newest_store_session(url: str) -> str:
    """The id of the newest session of the store at ``url`` (``--last``)."""
    from tether.errors import SessionNotFound

    with open_store(url) as sessions:
        rows = sessions.sessions()
    if not rows:
        from tether._stores.postgres import display_url

        raise SessionNotFound("--last", display_url(url))
    return max(rows, key=lambda row: (row.created_at, row.session_id)).session_id


def open_store(given: str | None) -> PostgresSessions:
    from tether._stores.postgres import PostgresSessions

    return PostgresSessions(store_url(given))


StoreUrlOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="The store, postgresql://… (default: $TETHER_STORE_URL).",
        metavar="URL",
        show_default=False,
    ),
]


def read_store_log(url: str | None, session: str) -> bytes:
    """The committed lines of ``session`` in the store at ``url`` (for ``inspect``)."""
    with open_store(url) as sessions:
        return sessions.log_bytes(session)


def list_store_sessions(url: str | None, json_output: bool) -> None:
    """``tether sessions --store URL``."""
    with open_store(url) as sessions:
        rows = sessions.sessions()
    if json_output:
        emit_json([row.to_json() for row in rows])
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    if not rows:
        console.print("no sessions")
        return
    table = Table(box=None, pad_edge=False)
    for name in ("id", "created (UTC)", "status", "operation", "lines", "lease owner", "epoch"):
        table.add_column(name, no_wrap=True)
    table.add_column("lease expires (database clock)", no_wrap=True)
    for row in rows:
        table.add_row(
            row.session_id,
            row.created_at[:19].replace("T", " "),
            row.status,
            row.operation,
            str(row.lines),
            printable(row.lease_owner or "-"),
            str(row.lease_epoch),
            (row.lease_expires or "-")[:23],
        )
    console.print(table)


@store_app.command("init")
def init(store: StoreUrlOption = None) -> None:
    """Create tether's tables in the database (idempotent).

    Examples:

        tether store init --store postgresql://db/tether

    Exit status: 0 created or already there, 10 unreachable, 12 a newer schema.
    """
    from tether._stores.postgres import SCHEMA_VERSION, display_url, init_schema

    with handle_errors():
        url = store_url(store)
        created = init_schema(url)
        state = "created" if created else "already present"
        typer.echo(f"tether schema version {SCHEMA_VERSION} {state} in {display_url(url)}")


def export(
    session: Annotated[str, typer.Argument(help="Session id or unique prefix.", metavar="SESSION")],
    store: StoreUrlOption = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write the file here (default: stdout).", metavar="FILE"
        ),
    ] = None,
) -> None:
    """Write a session of the store as a session-v2 file (its lines as committed).

    Examples:

        tether export 01a2 --store postgresql://db/tether -o session.jsonl

    Exit status: 0 written, 3 no such session, 7 ambiguous prefix, 10/12 store errors.
    """
    with handle_errors():
        data = read_store_log(store, session)
        if output is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            tmp = output.with_name(f".{output.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, output)


def import_(
    file: Annotated[Path, typer.Argument(help="A session-v2 file (.jsonl).", metavar="FILE")],
    store: StoreUrlOption = None,
) -> None:
    """Load a session-v2 file into the store as a session (its id is the file's).

    Examples:

        tether import session.jsonl --store postgresql://db/tether

    Exit status: 0 imported (the id is printed), 1/5 the file is not a valid session (or
    the id exists already), 2 unreadable file, 10/12 store errors.
    """
    with handle_errors():
        data = read_input(file, "session file", limit=MAX_IMPORT_BYTES)
        with open_store(store) as sessions:
            typer.echo(sessions.import_log(data))


def _store_settings(flags: Flags) -> Settings:
    """The settings of ``submit`` and ``worker``: a shared store is required."""
    settings = cli_settings(flags)
    store_url(settings.store)  # exit 2 without one, or with another kind of URL
    return settings


@agent_command
def submit(
    prompt: Annotated[
        str | None,
        typer.Argument(help="What the agent should do (or --from FILE).", metavar="PROMPT"),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option("--session", "-s", help="Add the run to this session.", metavar="ID"),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help='Submit every line of a JSON-lines file ({"prompt": …, "session": …}).',
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    *,
    flags: Flags,
) -> None:
    """Accept PROMPT durably as a run (user entry + runStarted) and print the session id.

    Nothing runs here: `tether worker` picks the session up. With --from FILE, one run per
    line of a JSON-lines file (docs/scale-out.md, "Submitting many"), each in a new session
    unless the line names one: on a PostgreSQL store 1,000 new sessions per transaction; the
    ids are printed in the file's order as each group is durable. Without a store, --from
    writes to the file store (drive each with `tether resume ID`).

    Examples:

        tether submit "fix the failing test" --store postgresql://db/tether --model gpt-4o-mini

        tether submit --from prompts.jsonl --store postgresql://db/tether --model gpt-4o-mini

    Exit status: 0 accepted, 2 usage error (no store, no model, an unfinished session, a bad
    line of FILE), 3 no such session, 4 busy, 10-12 store errors.
    """
    from tether._runtime.worker import parse_submissions, submit_all
    from tether._runtime.worker import submit as submit_prompt

    with handle_errors():
        if from_file is None:
            if prompt is None:
                raise ConfigurationError("give a PROMPT or --from FILE")
            agent = quiet_agent(_store_settings(flags))
            try:
                typer.echo(submit_prompt(agent, prompt, session))
            finally:
                agent.close()
            return
        if prompt is not None or session is not None:
            raise ConfigurationError(
                "--from FILE takes the prompts (and sessions) from the file: give no PROMPT "
                "or --session with it"
            )
        items = parse_submissions(
            read_input(from_file, "prompts file", limit=MAX_SUBMIT_BYTES), str(from_file)
        )
        settings = cli_settings(flags)
        agent = quiet_agent(settings)
        try:

            def accepted(ids: list[str]) -> None:
                typer.echo("\n".join(ids))
                sys.stdout.flush()

            count = submit_all(agent, items, accepted=accepted)
        finally:
            agent.close()
        if settings.store is None:
            typer.echo(
                f"accepted {count} runs in the file store; drive each with `tether resume ID` "
                "(a worker needs --store)",
                err=True,
            )


@agent_command
def worker(
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            help="Sessions in flight at once (1 to 10000).",
            metavar="N",
        ),
    ] = 1,
    until_empty: Annotated[
        bool,
        typer.Option(
            "--until-empty",
            help="Exit once no unfinished session of this environment is left.",
        ),
    ] = False,
    status_every: Annotated[
        float,
        typer.Option(
            "--status-every",
            help="A status line on stderr every S seconds (0: none).",
            metavar="S",
        ),
    ] = 10.0,
    status: Annotated[
        bool,
        typer.Option(
            "--status",
            help="Print the queue and the leases of each worker, from the store, and exit.",
        ),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="With --status: one JSON object.")
    ] = False,
    *,
    flags: Flags,
) -> None:
    """Drive the unfinished sessions of the store, up to CONCURRENCY at a time.

    Claims the oldest unfinished session of this worker's environment whose lease is
    free or expired, drives it as `tether resume` would, releases it; every session in
    flight shares the process's one store opener (its connections, one lease renewal for
    all). A store outage slows the worker down (fewer sessions in flight, retries); it
    exits only when the store stays away (30 s) with nothing in flight, and a worker
    started before its database answers waits for it the same way. SIGTERM: no new claims;
    each session being driven stops after its current step (a model answer or a tool
    result committed), unfinished, its lease released for another worker; exit 0.

    With --status: the queue (queued, running, parked, idle) and one line per worker with
    its leases, read from the store (--json: one object); nothing is driven.

    Examples:

        tether worker --store postgresql://db/tether --model gpt-4o-mini --concurrency 500

        tether worker --status --store postgresql://db/tether

    Exit status: 0 stopped, 2 usage error, 10 the store stayed unreachable, 11 fenced
    (this worker lost a lease: it was paused past its expiry; it stops at once).
    """
    from tether._runtime.worker import (
        Worker,
        check_concurrency,
        fleet_openers,
        fleet_status,
        when_reachable,
    )
    from tether._stores.postgres import DEFAULT_LEASE_SECONDS

    with handle_errors():
        if status:
            fleet = fleet_status(store_url(cli_settings(flags).store))
            if json_output:
                emit_json(fleet.to_json())
            else:
                typer.echo("\n".join(fleet.lines()))
            return
        if json_output:
            raise ConfigurationError("--json goes with --status")
        check_concurrency(concurrency)
        settings = _store_settings(flags)

        def log(line: str) -> None:
            typer.echo(f"worker {os.getpid()}: {printable(line)}", err=True)

        stopping = threading.Event()
        workers: list[Worker] = []

        def on_term(signum: int, frame: FrameType | None) -> None:
            # Only events are set here: the handler may run while the main thread holds any
            # lock (the worker's own loop writes the line).
            stopping.set()
            for work in workers:
                work.stop("SIGTERM")

        signal.signal(signal.SIGTERM, on_term)
        # A worker may start before its database answers: it waits as it would for a claim.
        opened = when_reachable(lambda: fleet_openers(settings), stop=stopping, log=log)
        if opened is None:
            log("SIGTERM before the store answered: stopped, nothing claimed")
            return
        sessions, workspace_db = opened
        try:
            work = Worker(
                lambda: quiet_agent(
                    settings, session_store=sessions, workspace_db=workspace_db.opener()
                ),
                concurrency=concurrency,
                until_empty=until_empty,
                log=log,
                status_every=status_every,
            )
            workers.append(work)
            if stopping.is_set():  # a SIGTERM between the two
                work.stop("SIGTERM")
            lease = settings.lease_seconds or DEFAULT_LEASE_SECONDS
            log(f"started: concurrency {concurrency}, lease {lease} s, owner {sessions.owner}")
            report = work.run()
        finally:
            workspace_db.close()
            sessions.close()
        if report.fenced is not None:
            raise report.fenced
        if report.failed is not None:
            raise report.failed
        log(f"stopped after {len(report.driven)} sessions")


__all__: list[Any] = [
    "STORE_URL_ENV",
    "StoreUrlOption",
    "default_store",
    "list_store_sessions",
    "newest_store_session",
    "read_store_log",
    "register",
    "store_app",
]
