"""Which effects database holds a session's evidence.

Recovery decides some pending calls from the *absence* of a record: no journal row, no
review decision, no authorization. That is only sound if the record would be there, so
before a session writes its first evidence to ``<workspace>/.tether/effects.db`` it records
*which* database that is, on both sides:

* on the session's side, a small record the session store keeps beside the log
  (:meth:`~tether._stores.protocol.SessionStoreProtocol.sidecar`; for the file store a
  hidden file in the sessions directory, ``.<session id>.evidence.json``, mode ``0600``,
  written to a temporary name, fsynced, renamed, directory fsynced:
  :class:`~tether._stores.sidecar.FileSidecar`)::

      {"format": "tether.evidence-binding", "version": 1, "sessionId": "…",
       "effectsDb": "<the database's identity>", "database": "/w/.tether/effects.db",
       "boundAt": 1767000000000, "replaced": []}

  The session log is not touched: its format is a strict published contract;
* in the workspace database (:class:`~tether._wsdb.protocol.WorkspaceDB`), a row of table
  ``sessions`` naming the session (written first, so a
  crash between the two leaves a database that names a session without a sidecar, which
  is repaired, never the other way round).

:func:`check_session` compares them each time a process opens the database for a session
(:func:`~tether.core.reconcile.judge_binding` is the pure decision, in the core): a missing
database, a database with another identity, one that does not name the session or an
unreadable sidecar means the session's evidence is **unknown** — recovery then sends what
depends on it to review instead of reading "no record" as "nothing happened". A session
that never wrote evidence is ``unbound``; it is bound by :func:`ensure_binding` before its
first record. A session whose database was lost is bound to the new one again
(:func:`bind_session` with ``previous``) only once nothing of it depends on the old
evidence any more: when it is idle.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Final

from tether._stores.protocol import SessionSidecar
from tether._stores.sidecar import FileSidecar, sidecar_path
from tether._wsdb.protocol import WorkspaceDB
from tether.core.reconcile import judge_binding
from tether.core.values import BINDING_FORMAT, BindingState, EvidenceCheck, SessionBinding
from tether.errors import EffectsDatabaseError

__all__ = [
    "BINDING_FORMAT",
    "SIDECAR_NAME",
    "BindingState",
    "EvidenceCheck",
    "SessionBinding",
    "bind_session",
    "binding_path",
    "check_session",
    "ensure_binding",
    "has_binding",
    "judge_binding",
    "read_binding",
    "write_binding",
]

_MAX_BYTES: Final = 64 * 1024
_MAX_REPLACED: Final = 32
"""Earlier databases kept in the sidecar's history (the oldest are dropped)."""
_WHAT: Final = "session evidence record"


# =========================================================================== the session's side


SIDECAR_NAME: Final = "evidence"
"""The name of the session's record (:meth:`SessionStoreProtocol.sidecar`): for the file
store, ``.<session id>.evidence.json`` next to the log."""

SessionSide = SessionSidecar | str | os.PathLike[str]
"""The session's record, or the sessions directory of a file store that holds it."""


def binding_path(sessions_dir: str | os.PathLike[str], session_id: str) -> Path:
    """``<sessions dir>/.<session id>.evidence.json``."""
    return sidecar_path(sessions_dir, session_id, SIDECAR_NAME)


def _side(side: SessionSide, session_id: str) -> SessionSidecar:
    if isinstance(side, str | os.PathLike):
        return FileSidecar(binding_path(side, session_id), _MAX_BYTES)
    return side


def read_binding(side: SessionSide, session_id: str) -> tuple[SessionBinding | None, str | None]:
    """``(binding, None)``, ``(None, None)`` when there is none, or ``(None, why)`` when
    it cannot be read (a link, not a regular file, too large, not a valid record)."""
    sidecar = _side(side, session_id)
    data, problem = sidecar.read()
    if data is None:
        return None, problem
    try:
        return SessionBinding.from_json(json.loads(data), session_id), None
    except ValueError as exc:
        return None, f"{sidecar.location}: {exc}"


def write_binding(side: SessionSide, binding: SessionBinding) -> Path:
    """Write the session's record atomically and durably; returns where it is (its path;
    for a store without files, its location as a path).

    Only the session's writer calls this (it holds the session lock). Raises
    :class:`~tether.errors.EffectsDatabaseError` on failure.
    """
    sidecar = _side(side, binding.session_id)
    data = (json.dumps(binding.to_json(), sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        sidecar.write(data)
    except OSError as exc:
        raise EffectsDatabaseError(sidecar.location, _cannot(exc), _WHAT) from None
    return Path(sidecar.location)


def _cannot(exc: OSError) -> str:
    why = "it is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    return f"cannot record which effects database holds the session's evidence ({why})"


def has_binding(side: SessionSide, session_id: str) -> bool:
    """Whether the session ever recorded which database holds its evidence (its record
    exists; no database is opened to find out)."""
    return _side(side, session_id).exists()


# =========================================================================== checking and binding


def _identity(db: WorkspaceDB) -> str:
    identity = db.identity
    if identity is None:
        raise EffectsDatabaseError(db.location, "has no identity (schema older than version 3)")
    return identity


def check_session(db: WorkspaceDB, side: SessionSide, session_id: str) -> EvidenceCheck:
    """Read the session's record and the database's identity and judge them (read only)."""
    recorded, unreadable = read_binding(side, session_id)
    return judge_binding(
        session_id,
        recorded,
        database=db.location,
        db_id=_identity(db),
        names_session=db.names_session(session_id),
        db_existed=db.existed,
        db_fresh=db.fresh,
        unreadable=unreadable,
    )


def bind_session(
    db: WorkspaceDB,
    side: SessionSide,
    session_id: str,
    *,
    previous: EvidenceCheck | None = None,
) -> EvidenceCheck:
    """Record that ``db`` holds the session's evidence: its row first, then the session's
    record.

    ``previous``: the check that found the session's earlier database missing or replaced;
    it is kept in the record's ``replaced`` history and the row's ``previous_db``. Call it
    for an unknown binding only when nothing of the session depends on the old evidence.
    """
    identity = _identity(db)
    now = db.now_ms()
    earlier: list[dict[str, Any]] = []
    old_id: str | None = None
    if previous is not None and previous.recorded is not None:
        earlier = [dict(item) for item in previous.recorded.replaced]
    if previous is not None and not previous.known:
        old_id = previous.expected_db
        earlier.append({"effectsDb": old_id, "state": previous.state.value, "reboundAt": now})
    db.bind_session(session_id, old_id, now)
    binding = SessionBinding(
        session_id, identity, db.location, now, tuple(earlier[-_MAX_REPLACED:])
    )
    write_binding(side, binding)
    return EvidenceCheck(
        BindingState.BOUND,
        session_id,
        db.location,
        identity,
        identity,
        f"the effects database {db.location} holds the session",
        binding,
    )


def ensure_binding(db: WorkspaceDB, side: SessionSide, session_id: str) -> EvidenceCheck:
    """The session's evidence check, binding it first when it has none yet.

    An unbound session is bound now (its first evidence is about to be written); a
    database that names the session whose record is gone gets the record back. A missing,
    replaced or unreadable binding is returned as it is: the caller decides with it.
    """
    check = check_session(db, side, session_id)
    if check.state is BindingState.UNBOUND or (
        check.state is BindingState.BOUND and check.recorded is None
    ):
        return bind_session(db, side, session_id)
    return check
