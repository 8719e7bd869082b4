"""A fork's lineage: which session, cut where, a forked session came from.

The session format's header has exactly eight members (docs/SESSION_FORMAT.md 4), so the
lineage of a fork cannot be in the log; like the evidence binding it is a record the
session store keeps beside the log (for the file store a hidden file,
``.<session id>.fork.json``, written atomically and durably by
:class:`~tether._stores.sidecar.FileSidecar`)::

    {"format": "tether.fork", "version": 1, "sessionId": "<the fork>",
     "forkOf": "<the original>", "cutAfterLine": 7, "cutAfterEntry": "<fact id>",
     "turn": 2, "bytes": 4180, "forkedAt": 1767000000000}

``turn`` is the turn the cut ends (``null`` for a cut with ``--at`` inside a turn);
``cutAfterEntry`` is the id of the last fact kept (``null``: the header alone); ``bytes``
the length of the original's prefix that was copied (its transactions are byte-identical in
the fork). The record is informative: nothing in recovery depends on it, so an unreadable
one is shown as such and never stops a command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from tether._stores.protocol import SessionSidecar

__all__ = ["LINEAGE_FORMAT", "SIDECAR_NAME", "Lineage", "read_lineage", "write_lineage"]

SIDECAR_NAME: Final = "fork"
LINEAGE_FORMAT: Final = "tether.fork"


@dataclass(frozen=True, slots=True)
class Lineage:
    session_id: str
    fork_of: str
    cut_after_line: int
    cut_after_entry: str | None
    turn: int | None
    bytes: int
    forked_at: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LINEAGE_FORMAT,
            "version": 1,
            "sessionId": self.session_id,
            "forkOf": self.fork_of,
            "cutAfterLine": self.cut_after_line,
            "cutAfterEntry": self.cut_after_entry,
            "turn": self.turn,
            "bytes": self.bytes,
            "forkedAt": self.forked_at,
        }

    def text(self) -> str:
        """``forked from <id> after turn 2 (line 7)``."""
        where = f"after turn {self.turn}" if self.turn is not None else "inside a turn"
        entry = f", entry {self.cut_after_entry}" if self.cut_after_entry else ""
        return f"forked from {self.fork_of} {where} (line {self.cut_after_line}{entry})"


def write_lineage(sidecar: SessionSidecar, lineage: Lineage) -> None:
    sidecar.write(json.dumps(lineage.to_json(), sort_keys=True).encode("utf-8"))


def read_lineage(sidecar: SessionSidecar) -> Lineage | str | None:
    """The record (``None``: the session is no fork; a string: why it cannot be read)."""
    data, why = sidecar.read()
    if why is not None:
        return why
    if data is None:
        return None
    try:
        value = json.loads(data)
        if value.get("format") != LINEAGE_FORMAT or value.get("version") != 1:
            return f"{sidecar.location}: not a tether.fork record"
        return Lineage(
            session_id=str(value["sessionId"]),
            fork_of=str(value["forkOf"]),
            cut_after_line=int(value["cutAfterLine"]),
            cut_after_entry=value["cutAfterEntry"],
            turn=value["turn"],
            bytes=int(value["bytes"]),
            forked_at=int(value["forkedAt"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{sidecar.location}: unreadable lineage record ({type(exc).__name__})"
