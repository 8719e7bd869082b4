"""Effect tools for ``tests/test_crashlab.py``, checked with ``tether crashlab --tool``.

* :data:`BAD` — not idempotent, no lookup, and it claims to be replay-safe: after a crash
  between running and recording its result, recovery runs it again, so the invoice goes out
  twice. The crash lab must say FAIL.
* :data:`NO_LOOKUP` — an honest effect tool (never replayed) without a lookup and without an
  idempotency key: a crash after it ran leaves an outcome nobody can establish. The crash
  lab must say REVIEW (never PASS).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tether._effects.contract import EffectTool
from tether._tools.base import Tool, ToolContext, ToolResult
from tether.core.state import Replay

PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {"customer": {"type": "string"}},
    "required": ["customer"],
    "additionalProperties": False,
}


def _send(workspace: Path, customer: str) -> int:
    outbox = workspace / "invoices-sent.txt"
    with outbox.open("a") as handle:
        handle.write(f"invoice to {customer}\n")
    return len(outbox.read_text().splitlines())


class ReplayingInvoiceTool(Tool):
    """Sends an invoice every time it runs, yet declares itself safe to replay."""

    name = "send_invoice"
    description = "Send an invoice to a customer."
    parameters = PARAMETERS
    replay = Replay.SAFE

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        count = _send(context.workspace, arguments["customer"])
        return ToolResult(f"invoice #{count} sent")


class NoLookupInvoiceTool(EffectTool):
    """An effect tool without a lookup that ignores its operation id."""

    name = "send_invoice"
    description = "Send an invoice to a customer."
    parameters = PARAMETERS

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        super().__init__()

    @classmethod
    def for_workspace(cls, workspace: Path) -> NoLookupInvoiceTool:
        return cls(workspace)

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        count = _send(self.workspace, arguments["customer"])
        return ToolResult(f"invoice #{count} sent")


BAD = ReplayingInvoiceTool()
NO_LOOKUP = NoLookupInvoiceTool
