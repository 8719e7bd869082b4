"""Review items and the reconciliation log (tables ``review_items``, ``reconciliations``).

When recovery cannot establish what a started call did (a file with neither the before- nor
the after-content, an effect whose lookup cannot tell), the run stops, blocked, and a
*review item* names the call and its evidence. A person decides:

* ``applied`` — the call took effect; its result becomes a success result saying so;
* ``notApplied`` — it did not; its result becomes an error result saying so;
* ``abort`` — abort the run (the call gets the ``interrupted`` result, spec 15.2).

The decision is recorded first (durably, with time and note); appending the result it implies
to the session log is the caller's next step, and recovery re-derives that same result from
the recorded decision if the process dies in between (:mod:`tether._effects.recovery`).

At most one item per operation id is open at a time; opening it again returns the open
item. Every reconciliation and decision is kept in ``reconciliations`` with its time and
evidence (JSON).

The values are in :mod:`tether.core.values` and the SQLite tables in
:class:`~tether._wsdb.sqlite_review.ReviewStore` (beside the database, which makes it); all
are re-exported here.
"""

from __future__ import annotations

from tether._wsdb.sqlite_review import ReviewStore
from tether.core.values import ReconciliationEntry, ReviewDecision, ReviewItem, ReviewStatus

__all__ = [
    "ReconciliationEntry",
    "ReviewDecision",
    "ReviewItem",
    "ReviewStatus",
    "ReviewStore",
]
