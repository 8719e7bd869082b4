"""Failed tool calls and the artifact version they failed at (table ``tool_failures``).

Keyed by the ``toolStarted`` id of the call; recording the same call again is ignored (the
first record stays), so recording is idempotent across a crash and a retry. The id of the
call's result entry may be kept too, to find the failure of a given result
(:meth:`FailureStore.by_result_entry`).

The value is :class:`~tether.core.values.ToolFailure` and the SQLite table
:class:`~tether._wsdb.sqlite_failures.FailureStore` (beside the database, which makes it); both
are re-exported here.
"""

from __future__ import annotations

from tether._wsdb.sqlite_failures import FailureStore
from tether.core.values import ToolFailure

__all__ = ["FailureStore", "ToolFailure"]
