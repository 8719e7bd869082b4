"""Child process for the runtime's effect-recovery crash tests.

``python tests/effects_child.py run|resume WORKSPACE SCRIPT [SESSION] [--lookup ok|raise|none]``
builds an Agent with the built-in tools plus ``publish_report`` (the reference ledger)
and prints the RunResult as JSON, with the reconciliation events.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from tether._effects.contract import EffectTool, LookupResult
from tether._models import load_model
from tether._runtime import Agent
from tether._tools.base import ToolResult
from tether._tools.builtin import builtin_tools
from tether.testing.ledger import PublishReportTool, ReportLedger


class BlindPublish(PublishReportTool):
    """publish_report whose service cannot answer lookups (outage)."""

    def lookup(self, operation_id: str) -> LookupResult:
        raise ConnectionError("ledger lookup endpoint unreachable")


class NoLookupPublish(EffectTool):
    """An effect tool that declares no lookup: recovery can only say interrupted."""

    name = "publish_report"
    description = "Publish a report."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
        "required": ["title", "body"],
    }

    def __init__(self, ledger: ReportLedger) -> None:
        self.ledger = ledger
        super().__init__()

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        receipt = self.ledger.publish(operation_id, arguments["title"], arguments["body"])
        return ToolResult(f"published ({receipt})")


def main(argv: list[str]) -> int:
    mode, workspace, script = argv[0], Path(argv[1]), argv[2]
    session = argv[3] if len(argv) > 3 and not argv[3].startswith("--") else None
    lookup = argv[argv.index("--lookup") + 1] if "--lookup" in argv else "ok"
    ledger = ReportLedger.for_workspace(workspace)
    publish: EffectTool
    if lookup == "raise":
        publish = BlindPublish(ledger)
    elif lookup == "none":
        publish = NoLookupPublish(ledger)
    else:
        publish = PublishReportTool(ledger)
    seen: list[dict[str, Any]] = []
    agent = Agent(
        load_model(f"scripted:{script}"),
        [*builtin_tools(), publish],
        workspace=workspace,
        on_event=lambda event: seen.append(event.to_dict()),
    )
    try:
        result = agent.run("go") if mode == "run" else agent.resume(str(session))
    finally:
        agent.close()
    out = result.to_dict()
    out["events"] = [e for e in seen if e["event"] in ("tool_reconciled", "blocked")]
    sys.stdout.write(orjson.dumps(out).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
