"""tether.lowlevel: the store, reducer and seam internals, for people building on tether.

``import tether`` gives the agent and the pure session contract (about 15 names). This
namespace gives the pieces below them, for someone writing a new session store, a new
workspace database, a new tool kind or a model adapter, or reading logs by hand:

* the incremental reducer and the fact constructors of the format (``Reducer``,
  ``PendingTransaction``, ``facts``), the canonical digests, and the plan types;
* the two seams and their implementations: ``SessionStoreProtocol`` / ``SessionOpener``
  with the file store (``SessionStore``, ``FileSessions``) and the in-memory one
  (``MemorySessions``); ``WorkspaceDB`` with ``EffectsDB`` (SQLite) and ``MemoryWorkspace``;
* the tool and model seams (``RecoveryKind``, ``ToolContext``, ``ToolRegistry``,
  ``FunctionTool`` (what ``tether.tool`` makes), ``ModelAdapter``, ``ModelRequest``,
  ``ModelResponse``);
* the other types ``tether.Agent`` takes: its options (``AgentOptions``: the settings of the
  one settings table and the seams), a resolved ``Settings`` value, the project settings
  (``ProjectConfig``, ``BudgetConfig``), the ``Clock`` and ``WorkspaceDBOpener`` seams, and
  what ``on_event`` and ``authorize`` receive (``Event``, ``AuthorizationRequest``); what an
  agent exposes (``Composition``, the parts it was built from; ``Masker``, its credential
  masking; ``ProtectedState``, tether's own state the file tools never touch).

These names are stable within a minor release but are closer to the implementation than
``tether``'s; ``tests/test_public_api.py`` pins them. As in ``tether``, each is loaded on
first use (PEP 562), so importing this module costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # the pure contract below the public functions
    "Reducer": "tether.core.reducer",
    "PendingTransaction": "tether.core.reducer",
    "facts": "tether.core",
    "canonical_json": "tether.core.canonical",
    "arguments_digest": "tether.core.canonical",
    "tool_definition_digest": "tether.core.canonical",
    "configuration_digest": "tether.core.canonical",
    "MAX_SAFE_INTEGER": "tether.core.canonical",
    "Plan": "tether.core.plans",
    "Observations": "tether.core.plans",
    "ToolDeclaration": "tether.core.current",
    "load_reducer": "tether._loading",
    # the session-store seam
    "SessionStoreProtocol": "tether._stores.protocol",
    "SessionOpener": "tether._stores.protocol",
    "SessionStore": "tether._stores.file",
    "FileSessions": "tether._stores.opener",
    "Durability": "tether._stores.file",
    "MemorySessions": "tether._stores.memory",
    # the workspace-database seam
    "WorkspaceDB": "tether._wsdb.protocol",
    "EffectsDB": "tether._wsdb.sqlite",
    "MemoryWorkspace": "tether._wsdb.memory",
    # the tool and model seams
    "RecoveryKind": "tether._tools.base",
    "ToolContext": "tether._tools.base",
    "ToolRegistry": "tether._tools.base",
    "ModelAdapter": "tether._models.base",
    "ModelRequest": "tether._models.base",
    "ModelResponse": "tether._models.base",
    "FunctionTool": "tether._tools.base",
    # the other types in tether.Agent's signature
    "AgentOptions": "tether._runtime.options",
    "Settings": "tether._settings",
    "Composition": "tether._runtime.compose",
    "Masker": "tether._credentials",
    "ProtectedState": "tether._tools.workspace",
    "ProjectConfig": "tether._project",
    "BudgetConfig": "tether._project",
    "Clock": "tether._clock",
    "WorkspaceDBOpener": "tether._wsdb.protocol",
    "Event": "tether._runtime.events",
    "AuthorizationRequest": "tether._runtime.guards",
}

__all__ = [  # sorted; the same names as _EXPORTS (tests/test_public_api.py checks both)
    "MAX_SAFE_INTEGER",
    "AgentOptions",
    "AuthorizationRequest",
    "BudgetConfig",
    "Clock",
    "Composition",
    "Durability",
    "EffectsDB",
    "Event",
    "FileSessions",
    "FunctionTool",
    "Masker",
    "MemorySessions",
    "MemoryWorkspace",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "Observations",
    "PendingTransaction",
    "Plan",
    "ProjectConfig",
    "ProtectedState",
    "RecoveryKind",
    "Reducer",
    "SessionOpener",
    "SessionStore",
    "SessionStoreProtocol",
    "Settings",
    "ToolContext",
    "ToolDeclaration",
    "ToolRegistry",
    "WorkspaceDB",
    "WorkspaceDBOpener",
    "arguments_digest",
    "canonical_json",
    "configuration_digest",
    "facts",
    "load_reducer",
    "tool_definition_digest",
]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads on demand
    from tether._clock import Clock
    from tether._credentials import Masker
    from tether._loading import load_reducer
    from tether._models.base import ModelAdapter, ModelRequest, ModelResponse
    from tether._project import BudgetConfig, ProjectConfig
    from tether._runtime.compose import Composition
    from tether._runtime.events import Event
    from tether._runtime.guards import AuthorizationRequest
    from tether._runtime.options import AgentOptions
    from tether._settings import Settings
    from tether._stores.file import Durability, SessionStore
    from tether._stores.memory import MemorySessions
    from tether._stores.opener import FileSessions
    from tether._stores.protocol import SessionOpener, SessionStoreProtocol
    from tether._tools.base import FunctionTool, RecoveryKind, ToolContext, ToolRegistry
    from tether._tools.workspace import ProtectedState
    from tether._wsdb.memory import MemoryWorkspace
    from tether._wsdb.protocol import WorkspaceDB, WorkspaceDBOpener
    from tether._wsdb.sqlite import EffectsDB
    from tether.core import facts
    from tether.core.canonical import (
        MAX_SAFE_INTEGER,
        arguments_digest,
        canonical_json,
        configuration_digest,
        tool_definition_digest,
    )
    from tether.core.current import ToolDeclaration
    from tether.core.plans import Observations, Plan
    from tether.core.reducer import PendingTransaction, Reducer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tether.lowlevel' has no attribute {name!r}")
    parent = importlib.import_module(module)
    # ``facts`` is a module of its own: a submodule is an attribute only once imported.
    value = getattr(parent, name, None)
    if value is None:
        value = importlib.import_module(f"{module}.{name}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return list(__all__)
