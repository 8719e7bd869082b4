"""tether.testing: what tether's own proof is made of, for testing code built on tether.

* the crash lab (``run_lab``, ``LabOptions``, ``BUILTIN_SCENARIOS``, ``summary_line``):
  kill real agent runs at every durable boundary and check recovery (``docs/crashlab.md``);
* named crash boundaries (``crash_boundaries``, ``register_boundary``, ``CRASH_EXIT_CODE``;
  a process crashes at one when started with ``TETHER_CRASH_AT=NAME[@N]``);
* ``ScriptedModel``: a model adapter that plays a JSON script, no network, no key;
* the demo ledger: ``ReportLedger`` (a SQLite service that commits each operation id at
  most once) and ``PublishReportTool``, the effect tool the crash lab publishes with.

Names are loaded on first use (PEP 562); ``tests/test_public_api.py`` pins them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, tuple[str, str]] = {
    # the crash lab
    "run_lab": ("tether.testing.crashlab.matrix", "run_lab"),
    "LabOptions": ("tether.testing.crashlab.matrix", "LabOptions"),
    "LabResult": ("tether.testing.crashlab.matrix", "LabResult"),
    "BUILTIN_SCENARIOS": ("tether.testing.crashlab.scenarios", "BUILTIN_SCENARIOS"),
    "summary_line": ("tether.testing.crashlab.report", "summary_line"),
    # crash boundaries
    "crash_boundaries": ("tether.testing.crashlab.report", "all_boundaries"),
    "register_boundary": ("tether._faults", "register"),
    "CRASH_EXIT_CODE": ("tether._faults", "CRASH_EXIT_CODE"),
    # the scripted model and the demo ledger
    "ScriptedModel": ("tether.testing.scripted", "ScriptedModel"),
    "ReportLedger": ("tether.testing.ledger", "ReportLedger"),
    "PublishReportTool": ("tether.testing.ledger", "PublishReportTool"),
    "Publication": ("tether.testing.ledger", "Publication"),
}

__all__ = [  # sorted; the same names as _EXPORTS (tests/test_public_api.py checks both)
    "BUILTIN_SCENARIOS",
    "CRASH_EXIT_CODE",
    "LabOptions",
    "LabResult",
    "Publication",
    "PublishReportTool",
    "ReportLedger",
    "ScriptedModel",
    "crash_boundaries",
    "register_boundary",
    "run_lab",
    "summary_line",
]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads on demand
    from tether._faults import CRASH_EXIT_CODE
    from tether._faults import register as register_boundary
    from tether.testing.crashlab.matrix import LabOptions, LabResult, run_lab
    from tether.testing.crashlab.report import all_boundaries as crash_boundaries
    from tether.testing.crashlab.report import summary_line
    from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS
    from tether.testing.ledger import Publication, PublishReportTool, ReportLedger
    from tether.testing.scripted import ScriptedModel


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'tether.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    # The subpackages (crashlab, ledger, scripted) stay importable by their own names.
    return list(__all__)
