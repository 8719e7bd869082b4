"""tether's functional core: the session contract and every decision made on it.

Rules of this package (``tests/test_core_purity.py`` keeps them):

1. **What lives here.** The session format (framing, canonical JSON and its digests, the
   typed fact constructors and their member tables), the reducer and the state it builds,
   the recovery planner (the current configuration, the plan types, tool-argument parsing
   and the decision procedure), the completion gate and the stop conditions, the
   authorization policy, the reconciliation decision tables, and the value types all of
   these take as input or give as output (tool result, lookup result, journal row, review
   item, artifact version, verification, evidence check), with ``records``, the frozen
   value type whose methods are not compiled per class. A function belongs here when its
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

from types import ModuleType
from typing import TYPE_CHECKING, Any

from tether.errors import SessionCorruption

if TYPE_CHECKING:  # at run time each name is loaded with its module on first use
    from tether.core.current import CurrentConfiguration
    from tether.core.planner import plan_recovery
    from tether.core.plans import Plan, RecoveryPlan
    from tether.core.reducer import Reducer, reduce_session
    from tether.core.state import SessionState

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


# Each loader imports one module of the names below. Loaded on first use (PEP 562): every
# import of a module of the core runs this file first, and an eager import here would load
# the planner, the reducer and their value types (most of the core) for a caller that needs
# one small module (building an agent needs the digests and the configuration snapshot).
def _current() -> ModuleType:
    import tether.core.current as module

    return module


def _planner() -> ModuleType:
    import tether.core.planner as module

    return module


def _plans() -> ModuleType:
    import tether.core.plans as module

    return module


def _reducer() -> ModuleType:
    import tether.core.reducer as module

    return module


def _state() -> ModuleType:
    import tether.core.state as module

    return module


_EXPORTS: dict[str, Any] = {
    "CurrentConfiguration": _current,
    "plan_recovery": _planner,
    "Plan": _plans,
    "RecoveryPlan": _plans,
    "Reducer": _reducer,
    "reduce_session": _reducer,
    "SessionState": _state,
}
"""Name → the loader of its module."""


def __getattr__(name: str) -> Any:
    loader = _EXPORTS.get(name)
    if loader is None:
        raise AttributeError(f"module 'tether.core' has no attribute {name!r}")
    value = getattr(loader(), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
