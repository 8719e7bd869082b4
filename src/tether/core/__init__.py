"""tether's functional core: the session contract and every decision made on it.

Rules of this package (``tests/test_core_purity.py`` keeps them):

1. **What lives here.** The session format (framing, canonical JSON and its digests, the
   typed fact constructors and their member tables), the reducer and the state it builds,
   the recovery planner (the current configuration, the plan types, tool-argument parsing
   and the decision procedure), the completion gate and the stop conditions, the
   authorization policy, the reconciliation decision tables, and the value types all of
   these take as input or give as output (tool result, lookup result, journal row, review
   item, artifact version, verification, evidence check). A function belongs here when its
   answer depends on nothing but its arguments.
2. **What it imports.** Nothing of tether outside ``tether.core`` except
   :mod:`tether.errors` (itself pure), the standard library's pure parts and ``orjson``.
   Never the clock, the environment, the disk, randomness, processes, threads, signals,
   sockets or databases: no ``os``, ``time``, ``random``, ``subprocess``, ``sqlite3``,
   ``socket``, ``pathlib``, ``threading``, ``signal``, ``tempfile``, ``uuid``,
   ``datetime`` or ``gc``, and no hidden import through ``importlib``/``__import__``. The
   values such code needs (the time, an id, a file's hash, a database row) are passed in by
   the shell, which gathers them and carries the decisions out (the packages of ``tether``
   whose names start with an underscore).

Consequences: every module here can be imported and tested on its own, with plain values;
``import tether.core`` loads no database driver, process or thread machinery. Where a pure
function is made faster by touching the interpreter's state (loading a whole log with the
garbage collector paused), the shell wraps it (:mod:`tether._loading`).

The names below are the few most callers want; everything else is imported from its module
(``tether.core.plans``, ``tether.core.reconcile``, ``tether.core.values``, …).
"""

from tether.core.current import CurrentConfiguration
from tether.core.planner import plan_recovery
from tether.core.plans import Plan, RecoveryPlan
from tether.core.reducer import Reducer, reduce_session
from tether.core.state import SessionState
from tether.errors import SessionCorruption

__all__ = [
    "CurrentConfiguration",
    "Plan",
    "RecoveryPlan",
    "Reducer",
    "SessionCorruption",
    "SessionState",
    "plan_recovery",
    "reduce_session",
]
