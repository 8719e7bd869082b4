"""What one agent call knows about its session's evidence in the workspace database.

Recovery may decide from the *absence* of a record (no journal row, no review decision, no
authorization) only when the workspace database is the one holding the session's evidence
(:mod:`tether._effects.binding`). :class:`SessionEvidence` keeps, for the call in progress:

* the workspace database, opened on first use (only journaled or lookup tools, their
  recovery and the guards' records need it) through the opener the composition root chose;
* the check of the binding between session and database, made once per call before the
  session's first evidence is read or written (an unbound session is bound then);
* the assistant entry whose next call a crashed process may have decided already.

The guards reach the database through :meth:`SessionEvidence.records`, so the session is
bound before they write anything for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._runtime.guards import EarlierDecision
from tether.core.kinds import ToolStatus

if TYPE_CHECKING:
    from tether._effects.binding import EvidenceCheck
    from tether._stores.protocol import SessionStoreProtocol
    from tether._wsdb.protocol import WorkspaceDB, WorkspaceDBOpener
    from tether.core.state import SessionState

# The binding's functions (tether._effects.binding, with the sidecar and the journal's
# modules) are imported by the methods that use them: every agent builds a SessionEvidence,
# and only a call that drives a session reaches its evidence.

__all__ = ["SessionEvidence", "undecided_entry"]


class SessionEvidence:
    """The workspace database and the session's binding to it, for one agent."""

    def __init__(self, opener: WorkspaceDBOpener) -> None:
        self._opener = opener
        self._db: WorkspaceDB | None = None
        self._store: SessionStoreProtocol | None = None
        self._check: EvidenceCheck | None = None
        self._resumed_entry: str | None = None
        self._unbound: SessionStoreProtocol | None = None
        """A store whose session had no record when last looked: only this object binds
        it (``check``), and the open store holds the session, so no other process does."""

    def db(self) -> WorkspaceDB:
        """The workspace database (opened on first use)."""
        if self._db is None:
            self._db = self._opener()
        return self._db

    def close(self) -> None:
        """Close the database if it was opened (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        self._check = None
        self._unbound = None

    def attach(self, store: SessionStoreProtocol) -> None:
        """Start working on ``store`` (once per call, also when it drives twice): the last
        call's check is forgotten, and the assistant entry whose next call a crashed
        process may have decided already is noted (see :func:`undecided_entry`)."""
        if store is self._store:
            return
        self._store = store
        self._check = None
        self._resumed_entry = undecided_entry(store.state)

    def check(self, store: SessionStoreProtocol) -> EvidenceCheck:
        """Whether the database holds the session's evidence (checked once per call).

        A session without evidence yet is bound to the database now, before its first
        record (:func:`~tether._effects.binding.ensure_binding`); a missing or replaced
        database is reported as it is, and recovery decides with it.
        """
        if self._check is None or self._check.session_id != store.session_id:
            from tether._effects.binding import SIDECAR_NAME, ensure_binding  # see the top

            self._check = ensure_binding(self.db(), store.sidecar(SIDECAR_NAME), store.session_id)
            if self._unbound is store:  # bound now (also after a later attach)
                self._unbound = None
        return self._check

    def records(self) -> WorkspaceDB:
        """The database for the guards' records (authorizations, failures, verifications):
        the session is bound to it before they write anything for it."""
        db = self.db()
        store = self._store
        if store is not None and not store.closed:
            self.check(store)
        return db

    def has_binding(self, store: SessionStoreProtocol) -> bool:
        """Whether the session ever recorded evidence (its record exists; no database is
        opened to find out)."""
        if self._check is not None and self._check.session_id == store.session_id:
            return True
        if store is self._unbound:  # a run's start asks each time: one stat saved
            return False
        from tether._effects.binding import SIDECAR_NAME, has_binding  # see the top

        if has_binding(store.sidecar(SIDECAR_NAME), store.session_id):
            return True
        self._unbound = store
        return False

    def rebind_if_lost(self, store: SessionStoreProtocol) -> None:
        """A session that is idle again after its database was lost or replaced is bound to
        the current one before a new run starts: nothing unfinished depends on the old
        evidence any more (every call of it is answered), and the new run's evidence must be
        checkable again."""
        self.attach(store)  # an idle session was not driven yet: this call starts here
        if not self.has_binding(store):
            return
        check = self.check(store)
        if not check.known:
            from tether._effects.binding import SIDECAR_NAME, bind_session  # see the top

            self._check = bind_session(
                self.db(), store.sidecar(SIDECAR_NAME), store.session_id, previous=check
            )

    def earlier_decision(
        self, store: SessionStoreProtocol, assistant_entry_id: str
    ) -> EarlierDecision:
        """Whether a crashed process may have decided the call about to start (only the
        first call started for the entry noted by :meth:`attach`)."""
        if assistant_entry_id != self._resumed_entry:
            return EarlierDecision.NONE
        self._resumed_entry = None
        if not self.has_binding(store):
            return EarlierDecision.NONE  # no record was ever written for this session
        known = self.check(store).known
        return EarlierDecision.RECORDED if known else EarlierDecision.UNKNOWN


def undecided_entry(state: SessionState) -> str | None:
    """The assistant entry whose next call a crashed process may have decided already.

    Calls are authorized one at a time, right before each starts; a decision that is
    durable while its ``toolStarted`` is not can only belong to the first unanswered call
    of the current step, and only when no call of it is pending (a pending call means the
    crash came while it ran, before any later call was decided). ``None`` when the
    operation is not a run that will start such a call.
    """
    operation = state.operation
    # Imported here: the state's classes are a session's (loaded with it), not an agent's.
    from tether.core.state import RunOperation

    if not isinstance(operation, RunOperation) or operation.abort_requested:
        return None
    if any(tool.status is ToolStatus.PENDING for tool in operation.tool_calls):
        return None
    for position in range(len(state.transcript) - 1, -1, -1):
        message = state.transcript[position]
        if message.get("role") == "assistant":
            return state.transcript_ids[position] if message.get("tool_calls") else None
    return None
