"""Child process for the honest-completion crash tests (``tests/test_completion.py``).

Usage::

    python tests/completion_child.py run    WORKSPACE SCRIPT ASKED [PROMPT]
    python tests/completion_child.py resume WORKSPACE SCRIPT ASKED SESSION [--no-terminal]

Builds ``Agent(load_model("scripted:SCRIPT"), workspace=WORKSPACE)`` with ``tether.toml``
read from the workspace and an authorizer that appends one line per question to the file
ASKED and answers yes (``--no-terminal``: no authorizer, nobody can be asked), runs or
resumes, and prints the RunResult as one JSON line.
Crashes are armed through ``TETHER_CRASH_AT`` / ``TETHER_CRASH_MODE`` (tether._faults).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("run", "resume"):
        sys.stderr.write(__doc__ or "")
        return 2
    from tether._models import load_model
    from tether._runtime import Agent
    from tether._runtime.guards import AuthorizationRequest

    command, workspace, script, asked, *rest = argv

    def authorize(request: AuthorizationRequest) -> bool:
        with open(asked, "a", encoding="utf-8") as handle:
            handle.write(f"{request.tool_name} {request.summary}\n")
        return True

    terminal = "--no-terminal" not in rest
    agent = Agent(
        load_model(f"scripted:{script}"),
        workspace=workspace,
        authorize=authorize if terminal else None,
    )
    try:
        if command == "run":
            result = agent.run(rest[0] if rest else "do it")
        else:
            result = agent.resume(rest[0])
    finally:
        agent.close()
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
