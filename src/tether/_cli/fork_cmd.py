"""``tether fork SESSION [--at ENTRY | --turn N]``: a new session from a settled prefix of one.

The fork's log is the original's header with a new id and the original's transactions
through the cut, byte for byte (so it reduces exactly as that prefix does); the original is
only read. The cut must be settled (:mod:`tether.core.forks`): never inside an open model
attempt or between a tool's intent and its result. The lineage goes into a record beside
the new log (:mod:`tether._stores.lineage`; the header cannot hold it), the settings the
original was run with and its reasoning side records are copied, and the fork is runnable
at once with ``tether resume`` or ``tether run --session``. docs/replay.md has the details.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tether._cli.common import (
    InputError,
    SessionsDirOption,
    emit_json,
    handle_errors,
    read_input,
)
from tether._cli.inspect_cmd import session_file
from tether._cli.session_pick import LastOption, SessionArgument, settings_record
from tether._clock import SYSTEM_CLOCK
from tether._ids import new_uuid7
from tether._inputs import MAX_SESSION_FILE_BYTES
from tether._stores.file import SessionStore
from tether._stores.lineage import SIDECAR_NAME, Lineage, write_lineage
from tether._stores.reasoning import side_record_name
from tether._stores.sidecar import FileSidecar, sidecar_path
from tether.core.forks import CutPoint, LogMap, map_log
from tether.core.state import Header, SessionState
from tether.errors import TetherError


def register(app: typer.Typer) -> None:
    app.command("fork")(fork)


def fork(
    session: SessionArgument = None,
    last: LastOption = False,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Cut after the transaction holding this entry (a fact id of the log).",
            metavar="ENTRY",
            show_default=False,
        ),
    ] = None,
    turn: Annotated[
        int | None,
        typer.Option(
            "--turn",
            help="Cut as after turn N (turns are the session's runs, from 1; 0: before the first).",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the new session's lineage as JSON.")
    ] = False,
    sessions_dir: SessionsDirOption = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Fork a session of a shared store (postgresql://…) into the same store. "
            "Default: $TETHER_STORE_URL, else [store] url (not for a log's path or with "
            "--sessions-dir).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create a new session from a prefix of SESSION; SESSION is never changed.

    Without --at or --turn the whole log is copied through its last settled point.
    A cut inside an open model attempt, or between a tool's start and its result, is
    refused with the nearest valid points.

    Examples:

        tether fork 01a2f3 --turn 2

        tether fork --last --at 0193c1d2-…

    Exit status: 0 forked, 1 the log is corrupt, 2 usage error (including a cut that is
    not settled), 3 no such session.
    """
    with handle_errors(str(session) if session is not None else "--last"):
        if at is not None and turn is not None:
            raise InputError("give --at or --turn, not both")
        from tether._cli.store_cmd import default_store

        named_file = sessions_dir is not None or (session is not None and session.is_file())
        url = default_store(store, files_named=named_file)
        if url is not None:
            if session is None or last:
                raise InputError("with a store, give the session's id (no --last)")
            lineage = fork_store_session(url, str(session), at=at, turn=turn)
        else:
            path = session_file(session, last, sessions_dir)
            data = read_input(path, "session file", limit=MAX_SESSION_FILE_BYTES)
            lineage = fork_session(path, data, at=at, turn=turn)
        if json_output:
            emit_json(lineage.to_json())
        else:
            typer.echo(f"forked {lineage.session_id}: {lineage.text()}")
            typer.echo(f"continue it with: tether resume {lineage.session_id}")


def choose_cut(log: LogMap, *, at: str | None, turn: int | None) -> CutPoint:
    """The cut ``--at``/``--turn`` name (default: the last settled point)."""
    if at is not None:
        return log.cut_at(at)
    if turn is not None:
        return log.turn_end(turn)
    return CutPoint(log.last_settled())


def plan_fork(
    data: bytes, *, at: str | None, turn: int | None
) -> tuple[Lineage, Header, LogMap, CutPoint]:
    """The lineage of a fork of ``data`` (with a new session id), the original's header,
    the log's map and the cut (:class:`ConfigurationError` for a cut that is not settled)."""
    from tether._loading import reduce_session

    log = map_log(data)
    cut = choose_cut(log, at=at, turn=turn)
    header = reduce_session(data[: log.marks[0].end]).header
    new_id = new_uuid7()
    lineage = Lineage(
        session_id=new_id,
        fork_of=header.id,
        cut_after_line=cut.line,
        cut_after_entry=cut.mark.fact_ids[-1] if cut.mark.fact_ids else None,
        turn=_turn_of(cut),
        bytes=cut.end,
        forked_at=SYSTEM_CLOCK.now_ms(),
    )
    return lineage, header, log, cut


def fork_store_session(url: str, session: str, *, at: str | None, turn: int | None) -> Lineage:
    """Fork a session of the shared store at ``url`` into a new session of the same store:
    the fork's log is imported whole (one transaction of the store), its lineage is a
    sidecar record of the store (``tether_sidecars``)."""
    from tether._cli.store_cmd import open_store
    from tether._stores.postgres import PostgresSidecar
    from tether._stores.transaction import encode_header

    with open_store(url) as sessions:
        data = sessions.log_bytes(session)
        lineage, header, log, cut = plan_fork(data, at=at, turn=turn)
        head, _reducer = encode_header(
            session_id=lineage.session_id,
            created_at=lineage.forked_at,
            cwd=header.cwd,
            provider=header.provider,
            model=header.model,
            environment_identity=header.environment_identity,
        )
        sessions.import_log(head + data[log.marks[0].end : cut.end])
        # A sidecar row needs its session (a foreign key): the lineage follows the import,
        # so a crash in between leaves a fork without it (shown as no lineage, harmless).
        write_lineage(PostgresSidecar(sessions, lineage.session_id, SIDECAR_NAME), lineage)
    return lineage


def fork_session(path: Path, data: bytes, *, at: str | None, turn: int | None) -> Lineage:
    """Fork the log at ``path`` (its bytes ``data``) into a new session beside it."""
    lineage, header, log, cut = plan_fork(data, at=at, turn=turn)
    new_id = lineage.session_id
    folder = path.parent
    # The lineage first: a crash before the log exists leaves a record naming no session
    # (harmless), never a fork that does not say where it came from.
    write_lineage(FileSidecar(sidecar_path(folder, new_id, SIDECAR_NAME)), lineage)
    store = SessionStore.create(
        header.cwd,
        provider=header.provider,
        model=header.model,
        environment_identity=header.environment_identity,
        sessions_dir=folder,
        ids=lambda: new_id,
        body=data[log.marks[0].end : cut.end],
    )
    try:
        _copy_side_records(folder, header.id, new_id, store.state)
    finally:
        store.close()
    _copy_settings(header.cwd, header.id, new_id)
    return lineage


def _turn_of(cut: CutPoint) -> int | None:
    """The turn a cut ends (0: the header alone; ``None``: inside a turn)."""
    if cut.mark.ends_turn is not None:
        return cut.mark.ends_turn
    return 0 if cut.line == 1 else None


def _copy_side_records(folder: Path, old: str, new: str, state: SessionState) -> None:
    """The reasoning side records of the assistant entries the fork keeps (docs/models.md):
    the model gets its reasoning back on the next request, as in the original."""
    for entry_id, message in zip(state.transcript_ids, state.transcript, strict=False):
        if message.get("role") != "assistant":
            continue
        name = side_record_name(entry_id)
        record, _why = FileSidecar(sidecar_path(folder, old, name)).read()
        if record is not None:
            FileSidecar(sidecar_path(folder, new, name)).write(record)


def _copy_settings(cwd: str, old: str, new: str) -> None:
    """The settings the original was run with (model, endpoint, options): the record is
    bound to the log's configuration snapshots, which the fork has copied."""
    try:
        source = settings_record(Path(cwd), old)
        data, _why = source.read()
        if data is None:
            return
        json.loads(data)
        target = settings_record(Path(cwd), new)
        target.path.parent.mkdir(parents=True, exist_ok=True)
        target.write(data)
    except (OSError, ValueError, TetherError):
        # Not fatal: without the record a resume names the model with flags, as for any
        # session whose record is gone.
        return
