"""Child process for the lost-evidence crash tests (``tests/test_evidence_crash.py``).

Usage::

    python tests/evidence_child.py run    WORKSPACE SCRIPT [--ask yes|no] [--repl]
    python tests/evidence_child.py resume WORKSPACE SCRIPT SESSION [--ask yes|no] [--repl]

Builds ``Agent(load_model("scripted:SCRIPT"), workspace=WORKSPACE)`` with the built-in
tools plus ``publish_report``. ``--ask yes|no``: a person at a terminal who answers every
question so (each question is appended to ``WORKSPACE/../asked.txt``); without it nobody
can be asked. ``--repl``: side-effecting calls no rule names are asked about, as in the
REPL (without it they are allowed by default, as by ``tether run``/``resume`` on a
terminal). Prints the RunResult as one JSON line, with the reconciliation events.
Crashes are armed through ``TETHER_CRASH_AT`` / ``TETHER_CRASH_MODE`` (tether._faults).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("run", "resume"):
        sys.stderr.write(__doc__ or "")
        return 2
    from tether._models import load_model
    from tether._runtime import Agent
    from tether._runtime.guards import AuthorizationRequest
    from tether._tools.builtin import builtin_tools
    from tether.testing.ledger import PublishReportTool

    command, workspace, script, *rest = argv
    answer = rest[rest.index("--ask") + 1] if "--ask" in rest else None
    asked = Path(workspace).resolve().parent / "asked.txt"

    def authorize(request: AuthorizationRequest) -> bool:
        with open(asked, "a", encoding="utf-8") as handle:
            handle.write(f"{request.tool_name} {request.summary} [{request.rule}]\n")
        return answer == "yes"

    seen: list[dict[str, Any]] = []
    agent = Agent(
        load_model(f"scripted:{script}"),
        [*builtin_tools(), PublishReportTool.for_workspace(workspace)],
        workspace=workspace,
        authorize=authorize if answer is not None else None,
        ask_by_default="--repl" in rest,
        on_event=lambda event: seen.append(event.to_dict()),
    )
    try:
        result = agent.run("go") if command == "run" else agent.resume(rest[0])
    finally:
        agent.close()
    out = result.to_dict()
    out["events"] = [e for e in seen if e["event"] in ("tool_reconciled", "blocked")]
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
