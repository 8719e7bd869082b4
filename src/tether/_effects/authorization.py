"""Authorization decisions of tool calls (table ``authorizations``).

Before a tool call with effects starts, someone (the policy, the user, ``--yes``) decides
whether it may run. The decision is recorded durably before the call starts, keyed by the
session and a *call key* that identifies the call before it has a ``toolStarted`` id
(:func:`call_key`: ``"<assistantEntryId>:<toolIndex>"``).

The first decision for a call wins: recording again (after a crash, on a retry) returns the
existing row unchanged, so a call is never decided twice with different outcomes.

The value is :class:`~tether.core.values.Authorization` and the SQLite table
:class:`~tether._wsdb.sqlite_authorization.AuthorizationStore` (beside the database, which
makes it); both are re-exported here.
"""

from __future__ import annotations

from tether._wsdb.rules import SUMMARY_LIMIT
from tether._wsdb.sqlite_authorization import AuthorizationStore
from tether.core.values import Authorization

__all__ = [
    "SUMMARY_LIMIT",
    "Authorization",
    "AuthorizationStore",
    "call_key",
]


def call_key(assistant_entry_id: str, tool_index: int) -> str:
    """The key of one tool call of a session: ``"<assistantEntryId>:<toolIndex>"``."""
    if isinstance(tool_index, bool) or not isinstance(tool_index, int) or tool_index < 0:
        raise ValueError(f"tool_index must be a non-negative int, got {tool_index!r}")
    return f"{assistant_entry_id}:{tool_index}"
