"""Child process for the MCP tests: an Agent whose tools include the MCP servers of the
workspace's ``tether.toml``.

``python tests/mcp_child.py run|resume WORKSPACE SCRIPT [SESSION]`` prints the RunResult
as one JSON line (with the ``tool_reconciled`` and ``blocked`` events) on stdout. Crash
injection is armed through ``TETHER_CRASH_AT`` / ``TETHER_CRASH_MODE`` as for
``tests/runtime_child.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from tether._models import load_model
from tether._runtime import Agent


def main(argv: list[str]) -> int:
    mode, workspace, script = argv[0], Path(argv[1]), argv[2]
    session = argv[3] if len(argv) > 3 else None
    seen: list[dict[str, Any]] = []
    agent = Agent(
        load_model(f"scripted:{script}"),
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
