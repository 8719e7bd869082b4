"""What the guards hand a person: the question about a call the policy says to ``ask`` for
(:class:`AuthorizationRequest`, what an ``authorize`` callback receives) and a call parked
until a person decides (:class:`ParkedCall`).

They are :mod:`tether._runtime.guards`'s names (import them from there or from here): they
live in a module of their own so that building an agent, which builds its guards, does not
create their classes; the first call the policy asks about loads them (start-up,
``bench/README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.core.records import record

__all__ = ["AuthorizationRequest", "ParkedCall"]


@record
class AuthorizationRequest:
    """What the terminal asks about: one tool call the policy says to ``ask`` for."""

    tool_name: str
    arguments: Mapping[str, Any]
    summary: str
    rule: str
    reason: str | None


@record
class ParkedCall:
    """A call parked for approval: the run stops until a person decides."""

    request_id: int
    session_id: str
    tool_name: str
    summary: str
    note: str | None = None
    """Why it was parked again (an earlier decision became void), if it was."""

    def message(self, location: str = "") -> str:
        again = f"{self.note}; " if self.note else ""
        return (
            f"awaiting approval: call #{self.request_id} ({self.tool_name}: {self.summary}) "
            f"is parked; {again}decide with `tether approve {self.request_id}` or "
            f"`tether deny {self.request_id} --why TEXT` (see `tether approvals`), then run "
            f"`tether resume {self.session_id}{location}`"
        )
