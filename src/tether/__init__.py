"""tether: run AI agents so that a crash never makes a side effect happen twice.

The public API is the names below and nothing else; ``tests/test_public_api.py`` pins them.

Layout of the package (trio's ``__init__`` is the model):

* ``tether`` — these names: the agent, its results, tools, effect tools, the model loader,
  and the pure functions of the session contract. Each reports ``tether`` as its
  ``__module__`` (its ``__qualname__`` is unchanged), wherever it is defined, and every
  type its signature names is public too (``tests/test_public_api.py`` walks them).
* ``tether.core`` — the pure functional core (format, digests, state, reducer, planner,
  completion gate, stop conditions, policy). It reads no clock, disk, environment or
  randomness.
* ``tether.lowlevel`` — the store, reducer and seam internals (the reducer, fact
  constructors, digests, the session-store and workspace-database protocols and their
  implementations, and the types the agent's seams take), for people building a store, a
  tool kind or an adapter.
* ``tether.testing`` — the crash lab, crash boundaries, the scripted model and the demo
  ledger.
* ``tether.errors`` — the one exception hierarchy (every error derives from
  :class:`TetherError`) and the one table of exit statuses.
* Everything with a leading underscore (``tether._runtime``, ``tether._stores``, …) is the
  imperative shell and private: it may change in any release.

Names are loaded on first use (PEP 562), so ``import tether`` stays cheap and importing the
pure ``tether.core`` never pulls in the runtime, its SDKs or its databases.
"""

from __future__ import annotations

import importlib
import sys
import types
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
    "tool": "tether._tools.decorator",
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
    from tether._tools.base import Tool
    from tether._tools.builtin import builtin_tools
    from tether._tools.decorator import tool
    from tether.core.current import CurrentConfiguration
    from tether.core.planner import plan_recovery
    from tether.core.state import SessionState
    from tether.core.values import LookupResult, ToolResult
    from tether.errors import SessionCorruption, TetherError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    value = _publish(getattr(importlib.import_module(module), name))
    globals()[name] = value  # later lookups skip this function
    return value


def _publish(value: Any) -> Any:
    """``value`` made to report ``tether`` as its module, as trio does for its names.

    Where a public name is defined is private (``tether._runtime.agent``); its ``repr``, its
    documentation and a traceback should name the place to import it from. Done when the
    name is first loaded (the definitions are loaded lazily), once; ``__qualname__`` stays.

    A class's string annotations (``from __future__ import annotations``) are resolved
    first: ``typing.get_type_hints`` looks them up in the namespace of ``__module__``, which
    from now on is this one (functions keep theirs: they are looked up in ``__globals__``).
    """
    if not isinstance(value, (type, types.FunctionType)) or value.__module__ == __name__:
        return value
    if isinstance(value, type):
        _resolve_annotations(value)
    value.__module__ = __name__
    return value


def _resolve_annotations(cls: type) -> None:
    """Replace ``cls``'s own string annotations by what they name, in its defining module.

    What ``inspect.get_annotations(cls, eval_str=True)`` does, without importing
    :mod:`inspect` (~5 ms, a sixth of a first ``Agent(...)``'s budget)."""
    own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - the docstring says why
    if not any(isinstance(hint, str) for hint in own.values()):
        return
    scope = vars(sys.modules[cls.__module__])
    try:
        cls.__annotations__ = {
            name: eval(hint, scope, dict(vars(cls))) if isinstance(hint, str) else hint
            for name, hint in own.items()
        }
    except NameError:  # a name imported for type checkers only: leave the strings
        return


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
