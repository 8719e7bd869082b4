"""Effects: the action journal, the effect contract, reconciliation and review (the shell).

* :mod:`tether._wsdb.sqlite` — ``.tether/effects.db`` (SQLite, WAL, ``synchronous=FULL``,
  versioned schema);
* :mod:`.journal` — the action journal of ``write``/``edit`` and :func:`observe_file`;
* :mod:`.contract` — :class:`EffectTool` (``execute(arguments, operation_id)``, ``lookup``)
  and :func:`safe_lookup`;
* :mod:`.review` — review items and the reconciliation log;
* :mod:`.binding` — which ``effects.db`` holds a session's evidence;
* :mod:`.recovery` — gathering observations and recording decisions.

The values they exchange (``JournalRow``, ``LookupResult``, ``ReviewItem``, …) are
:mod:`tether.core.values`; the pure decisions (``reconcile_file``, ``decide_pending``,
``judge_binding``) :mod:`tether.core.reconcile`. Both are re-exported here. See
``docs/effects.md``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time each name is loaded with its module on first use
    from tether._effects.contract import (
        EffectTool,
        FunctionEffectTool,
        LookupResult,
        LookupStatus,
        effect_tool,
        has_lookup,
        safe_lookup,
    )
    from tether._effects.journal import (
        ActionJournal,
        FileVerdict,
        JournalRow,
        JournalStatus,
        Verdict,
        arguments_digest,
        is_journaled,
        journaled_edit,
        journaled_run,
        journaled_write,
        observe_file,
        reconcile_file,
    )
    from tether._effects.recovery import (
        PendingObservation,
        RecoveryAction,
        RecoveryDecision,
        decide_pending,
        observe_pending,
        reconcile_pending,
        record_decision,
    )
    from tether._effects.review import ReviewDecision, ReviewItem, ReviewStore
    from tether._wsdb.sqlite import EffectsDB, effects_db_path

__all__ = [
    "ActionJournal",
    "EffectTool",
    "EffectsDB",
    "FileVerdict",
    "FunctionEffectTool",
    "JournalRow",
    "JournalStatus",
    "LookupResult",
    "LookupStatus",
    "PendingObservation",
    "RecoveryAction",
    "RecoveryDecision",
    "ReviewDecision",
    "ReviewItem",
    "ReviewStore",
    "Verdict",
    "arguments_digest",
    "decide_pending",
    "effect_tool",
    "effects_db_path",
    "has_lookup",
    "is_journaled",
    "journaled_edit",
    "journaled_run",
    "journaled_write",
    "observe_file",
    "observe_pending",
    "reconcile_file",
    "reconcile_pending",
    "record_decision",
    "safe_lookup",
]

# Where each name is defined. Loaded on first use (PEP 562): importing one module of this
# package (the guards import .authorization, every agent has guards) runs this file first,
# and eager re-exports would load the journal, SQLite and recovery with it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "EffectTool",
            "FunctionEffectTool",
            "LookupResult",
            "LookupStatus",
            "effect_tool",
            "has_lookup",
            "safe_lookup",
        ),
        "tether._effects.contract",
    ),
    **dict.fromkeys(
        (
            "ActionJournal",
            "FileVerdict",
            "JournalRow",
            "JournalStatus",
            "Verdict",
            "arguments_digest",
            "is_journaled",
            "journaled_edit",
            "journaled_run",
            "journaled_write",
            "observe_file",
            "reconcile_file",
        ),
        "tether._effects.journal",
    ),
    **dict.fromkeys(
        (
            "PendingObservation",
            "RecoveryAction",
            "RecoveryDecision",
            "decide_pending",
            "observe_pending",
            "reconcile_pending",
            "record_decision",
        ),
        "tether._effects.recovery",
    ),
    **dict.fromkeys(("ReviewDecision", "ReviewItem", "ReviewStore"), "tether._effects.review"),
    **dict.fromkeys(("EffectsDB", "effects_db_path"), "tether._wsdb.sqlite"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether._effects' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
