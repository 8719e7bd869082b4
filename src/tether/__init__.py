"""tether: run AI agents so that a crash never makes a side effect happen twice.

The public API is the names below and nothing else; ``tests/test_public_api.py`` pins them.

Layout of the package (trio's ``__init__`` is the model):

* ``tether`` — these names: the agent, its results, tools, effect tools, the model loader,
  and the pure functions of the session contract.
* ``tether.core`` — the pure functional core (format, digests, state, reducer, planner,
  completion gate, stop conditions, policy). It reads no clock, disk, environment or
  randomness.
* ``tether.lowlevel`` — the store, reducer and seam internals (the reducer, fact
  constructors, digests, the session-store and workspace-database protocols and their
  implementations), for people building a store, a tool kind or an adapter.
* ``tether.testing`` — the crash lab, crash boundaries, the scripted model and the demo
  ledger.
* ``tether.errors`` — the one exception hierarchy (every error derives from
  :class:`TetherError`).
* Everything with a leading underscore (``tether._runtime``, ``tether._stores``, …) is the
  imperative shell and private: it may change in any release.

Names are loaded on first use (PEP 562), so ``import tether`` stays cheap and importing the
pure ``tether.core`` never pulls in the runtime, its SDKs or its databases.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # the agent
    "Agent": "tether._runtime.agent",
    "RunResult": "tether._runtime.results",
    "RunStatus": "tether._runtime.results",
    "load_model": "tether._models",
    # tools
    "Tool": "tether._tools.base",
    "ToolResult": "tether.core.values",
    "tool": "tether._tools.base",
    "builtin_tools": "tether._tools.builtin",
    "EffectTool": "tether._effects.contract",
    "LookupResult": "tether.core.values",
    # the session contract
    "reduce_session": "tether._loading",
    "plan_recovery": "tether.core.planner",
    "CurrentConfiguration": "tether.core.current",
    "SessionState": "tether.core.state",
    # errors
    "SessionCorruption": "tether.errors",
    "TetherError": "tether.errors",
}

__all__ = [  # sorted; the same names as _EXPORTS (tests/test_public_api.py checks both)
    "Agent",
    "CurrentConfiguration",
    "EffectTool",
    "LookupResult",
    "RunResult",
    "RunStatus",
    "SessionCorruption",
    "SessionState",
    "TetherError",
    "Tool",
    "ToolResult",
    "builtin_tools",
    "load_model",
    "plan_recovery",
    "reduce_session",
    "tool",
]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads on demand
    from tether._effects.contract import EffectTool
    from tether._loading import reduce_session
    from tether._models import load_model
    from tether._runtime.agent import Agent
    from tether._runtime.results import RunResult, RunStatus
    from tether._tools.base import Tool, tool
    from tether._tools.builtin import builtin_tools
    from tether.core.current import CurrentConfiguration
    from tether.core.planner import plan_recovery
    from tether.core.state import SessionState
    from tether.core.values import LookupResult, ToolResult
    from tether.errors import SessionCorruption, TetherError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
