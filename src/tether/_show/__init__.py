"""``tether show``: gather a session's log and evidence, build its timeline, render it.

The shell half of :mod:`tether.core.timeline`: :func:`load_log` reads and reduces a log
(a corrupt line stops it: the lines before it are drawn and the log says where it stopped,
:attr:`SessionLog.stopped`; a log whose header is unreadable is reported, not drawn),
:func:`gather_evidence` reads what
the workspace's ``effects.db`` knows about the session's calls, and the renderers
(:mod:`tether._show.terminal`, :mod:`tether._show.page`) draw the pure timeline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tether._effects.rewind import is_rewind_evidence
from tether._inputs import MAX_SESSION_FILE_BYTES, read_file
from tether._loading import gc_paused, reduce_session
from tether.core import SessionState
from tether.core.timeline import DEFAULT_PAUSE_MS, Evidence, Timeline, build_timeline
from tether.errors import SessionCorruption

__all__ = [
    "SessionLog",
    "gather_evidence",
    "load_log",
    "parse_transactions",
    "session_timeline",
]

Transaction = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class SessionLog:
    """A log read from the session store: its bytes' meaning and its facts by line."""

    location: str
    size: int
    state: SessionState
    transactions: tuple[Transaction, ...]
    stopped: SessionCorruption | None = None
    """Why the log stops being readable (its ``line``): ``state`` and ``transactions`` are
    then those of the lines before it, which reduce; ``None`` when the whole log reduces."""


def parse_transactions(data: bytes) -> tuple[Transaction, ...]:
    """The facts of every committed line after the header, one tuple per line.

    ``data`` must be the committed region of a log that reduces: its framing and every
    line were checked then, so the lines are split and parsed without checking again.
    """
    out: list[Transaction] = []
    loads = orjson.loads
    for raw in data.split(b"\n")[1:]:
        if not raw.strip():
            continue
        value = loads(raw)
        out.append(tuple(value) if isinstance(value, list) else (value,))
    return tuple(out)


def load_log(path: Path) -> SessionLog:
    """Read, reduce and parse one session log, up to a corrupt line (``stopped``)."""
    data = read_file(path, f"session file {path}", limit=MAX_SESSION_FILE_BYTES)
    return log_from_bytes(data, str(path))


def log_from_bytes(data: bytes, location: str) -> SessionLog:
    """Reduce and parse a log's bytes, from whichever store holds them (a file, or the
    committed lines a shared store hands over by session id).

    A log that does not reduce is read up to the line that stops it: the lines before it
    were reduced before the reducer reached it, so they are the session as far as it can
    be read (nothing repairs a bad line in the middle; showing what precedes it is what
    a person needs to decide). Raises ``SessionCorruption`` when not even that reduces
    (the header is unreadable)."""
    stopped: SessionCorruption | None = None
    try:
        state = reduce_session(data)
        readable = data
    except SessionCorruption as exc:
        before = _lines_before(data, exc.line)
        if before is None:
            raise
        readable = before
        try:
            state = reduce_session(readable)
        except SessionCorruption:
            raise exc from None
        stopped = exc
    with gc_paused():
        transactions = parse_transactions(readable[: state.repaired_length])
    return SessionLog(location, len(data), state, transactions, stopped)


def _lines_before(data: bytes, line: int) -> bytes | None:
    """The bytes of lines ``1 … line - 1`` with their LFs, or ``None`` (no such lines)."""
    end = -1
    for _ in range(line - 1):
        end = data.find(b"\n", end + 1)
        if end < 0:
            return None
    return data[: end + 1] if end >= 0 else None


def gather_evidence(workspace: Path, session_id: str, shared_url: str | None = None) -> Evidence:
    """What ``<workspace>/.tether/effects.db`` records about the session (never creates it).

    With ``shared_url`` (a session of a PostgreSQL store) the reviews, authorizations and
    verifications come from that database, where every worker records them; the file-change
    journal stays with the workspace it describes (docs/scale-out.md)."""
    from tether._completion.evidence import VerificationStore
    from tether._effects.authorization import AuthorizationStore
    from tether._effects.journal import ActionJournal
    from tether._effects.review import ReviewStore
    from tether._wsdb.sqlite import EffectsDB, effects_db_path

    path = effects_db_path(workspace)
    local = EffectsDB.open_workspace(workspace) if path.exists() else None
    if local is None and shared_url is None:
        return Evidence(note=f"no effects database at {path}: no journal or ledger evidence")
    db: Any = local
    try:
        if shared_url is not None:
            from tether._wsdb.postgres import PostgresEffectsDB

            db = PostgresEffectsDB.open_url(shared_url)
        rows = ActionJournal(local).rows(session_id) if local is not None else []
        journal = {row.operation_id: row.to_json() for row in rows}
        reviews_store = ReviewStore(db)
        reconciliations: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for entry in reviews_store.reconciliations(session_id=session_id):
            if is_rewind_evidence(entry.evidence):
                continue
            reconciliations[entry.operation_id].append({**entry.to_json(), "atMs": entry.at_ms})
        reviews: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for item in reviews_store.list_all(session_id):
            reviews[item.operation_id].append(item.to_json())
        authorizations = {a.call_key: a.to_json() for a in AuthorizationStore(db).list(session_id)}
        verifications = [
            v.to_json()
            for v in VerificationStore(db).list(limit=1_000_000)
            if v.session_id == session_id
        ]
    finally:
        if db is not local:
            db.close()
        if local is not None:
            local.close()
    version, note = _current_version(workspace) if verifications else (None, None)
    return Evidence(
        journal=journal,
        reconciliations=dict(reconciliations),
        reviews=dict(reviews),
        authorizations=authorizations,
        verifications=verifications,
        artifact_version=version,
        note=note,
    )


def _current_version(workspace: Path) -> tuple[str | None, str | None]:
    """The workspace's artifact version now (to tell current checks from stale ones)."""
    from tether._completion.verify import workspace_scanner
    from tether._project import load_project_config
    from tether.errors import TetherError

    try:
        return workspace_scanner(workspace, load_project_config(workspace)).version().digest, None
    except TetherError as exc:
        return None, f"the current artifact version is unknown ({exc}): staleness not shown"


def session_timeline(
    log: SessionLog,
    workspace: Path | None,
    *,
    pause_ms: int = DEFAULT_PAUSE_MS,
    shared_url: str | None = None,
) -> Timeline:
    """The timeline of ``log`` with the evidence of ``workspace`` (default: the log's cwd)
    and, for a session of a shared store, of that store's database."""
    root = workspace if workspace is not None else Path(log.state.header.cwd)
    evidence = gather_evidence(root, log.state.header.id, shared_url)
    with gc_paused():
        return build_timeline(log.state, log.transactions, evidence, pause_ms=pause_ms)
