"""Child process for the model crash tests (``tests/test_models_crash.py``).

Usage::

    python tests/models_child.py run    WORKSPACE BASE_URL RETRIES [PROMPT]
    python tests/models_child.py resume WORKSPACE BASE_URL RETRIES SESSION

Builds ``Agent(OpenAICompatibleModel("fake/model", base_url=BASE_URL), workspace=WORKSPACE,
model_retries=RETRIES, retry_base_delay=0.2)`` (streaming, as the CLI uses it), runs a prompt
or resumes SESSION, and prints the RunResult as one JSON line on stdout. Progress events go
to stderr as JSON lines, flushed, so a test can kill the child at a chosen moment (for example
after the first ``model_delta`` or ``retry_scheduled``). Crash injection:
``TETHER_CRASH_AT`` / ``TETHER_CRASH_MODE`` (see :mod:`tether._faults`).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("run", "resume"):
        sys.stderr.write(__doc__ or "")
        return 2
    from tether._models import OpenAICompatibleModel
    from tether._runtime import Agent

    command, workspace, base_url, retries, *rest = argv

    def show(event: object) -> None:
        to_json = getattr(event, "to_json", None)
        if to_json is not None:
            sys.stderr.write(to_json() + "\n")  # one line of JSON text
            sys.stderr.flush()

    model = OpenAICompatibleModel("fake/model", base_url=base_url, api_key="test", timeout=10)
    agent = Agent(
        model,
        workspace=workspace,
        on_event=show,
        model_retries=int(retries),
        retry_base_delay=0.2,
        assume_yes=True,
    )
    if command == "run":
        result = agent.run(rest[0] if rest else "do it")
    else:
        result = agent.resume(rest[0])
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
