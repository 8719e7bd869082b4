"""Child process for the runtime crash tests (``tests/test_runtime_crash.py``).

Usage::

    python tests/runtime_child.py run     WORKSPACE SCRIPT [PROMPT]
    python tests/runtime_child.py resume  WORKSPACE SCRIPT SESSION [--abort]
    python tests/runtime_child.py compact WORKSPACE SCRIPT SESSION

Builds ``Agent(load_model("scripted:SCRIPT"), workspace=WORKSPACE)``, runs a new prompt
(default ``"do it"``), resumes ``SESSION`` (``--abort``: ``Agent.resume(abort=True)``) or
compacts it (``Agent.compact``, keeping the last turn), and prints the
:class:`~tether._runtime.RunResult` as one JSON line on stdout; exit 0.
Progress events go to stderr, one JSON line each, so a test can see how far a killed
child got.

Crash injection is armed through the environment (read by :mod:`tether._faults` at
import): ``TETHER_CRASH_AT=NAME[@N]`` and ``TETHER_CRASH_MODE=kill|exit``. A crash in
``kill`` mode ends the process by ``SIGKILL`` (return code ``-9``) before anything is
printed on stdout.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("run", "resume", "compact"):
        sys.stderr.write(__doc__ or "")
        return 2
    from tether._models import load_model
    from tether._runtime import Agent

    command, workspace, script, *rest = argv

    def show(event: object) -> None:
        to_json = getattr(event, "to_json", None)
        if to_json is not None:  # one line of JSON text
            sys.stderr.write(to_json() + "\n")
            sys.stderr.flush()

    agent = Agent(load_model(f"scripted:{script}"), workspace=workspace, on_event=show)
    if command == "run":
        prompt = rest[0] if rest else "do it"
        result = agent.run(prompt)
    else:
        if not rest:
            sys.stderr.write(f"{command} needs a SESSION\n")
            return 2
        if command == "compact":
            result = agent.compact(rest[0])
        else:
            result = agent.resume(rest[0], abort="--abort" in rest[1:])
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
