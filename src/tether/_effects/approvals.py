"""Parked approvals: calls waiting durably for a person (tables ``approval_requests`` and
``approval_grants``).

Where the policy says ``ask`` and nobody can be asked here (no terminal, a worker, a
script), the runtime *parks* the call instead of denying it: it records a proposed
request with the call's full arguments, their digest, the artifact version and the state
of the files the call touches, and the run stops (status ``awaiting_approval``). A person
then decides from any terminal (``tether approve ID [--always]`` / ``tether deny ID --why
TEXT``); the next ``tether resume`` carries the decision out. A decision is written in one
transaction, so a process killed while parking or approving leaves either the old row or
the new one, never half of it.

Lifecycle of a request: ``proposed`` → ``approved`` | ``denied`` (once: a second decision is
refused) and any of them → ``void`` when the call's arguments or the files it touches changed
since it was proposed (the resume that notices proposes it again, as a new request).

``--always`` also records a *grant*: later calls of the same tool under the same rule in the
same session are allowed without asking (the terminal's "always" answer records the same).

The request value is :class:`~tether.core.values.ApprovalRequest` and the tables are
:class:`~tether._wsdb.sqlite_approvals.ApprovalStore` (beside the SQLite database, which makes
it); both are re-exported here. The runtime reaches them through
:class:`~tether._wsdb.protocol.ApprovalTable`.
"""

from __future__ import annotations

from tether._wsdb.sqlite_approvals import ApprovalStore
from tether.core.values import ApprovalRequest
from tether.errors import ApprovalNotFound

__all__ = [
    "ApprovalRequest",
    "ApprovalStore",
    "parse_request_id",
]


def parse_request_id(text: str) -> int:
    """``12`` or ``#12`` → 12; anything else raises :class:`ApprovalNotFound`."""
    raw = text.strip().removeprefix("#")
    if not raw.isdigit() or int(raw) <= 0:
        raise ApprovalNotFound(f"no parked call {text!r}: ids are numbers (see `tether approvals`)")
    return int(raw)
