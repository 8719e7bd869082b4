"""Benchmark: what the process-group runner adds to one short command.

Run: ``python bench/bench_procs.py`` (about 10 s; ``--calls``, ``--rounds``).

Contenders, each running ``true`` in a temporary directory and collecting its output:

* ``bare`` — the baseline: ``subprocess.run(["/bin/bash", "-c", "true"])`` in a new
  session with stdin from ``/dev/null`` and stdout+stderr captured, i.e. the least any
  supervisor of a bash command must do;
* ``bash_tool`` — :class:`tether._tools.builtin.BashTool` ``run``: the runner (gate,
  registration with the reaper, supervision, group check) plus the result text and the
  credential-free environment;
* ``check`` — :func:`tether._completion.check.run_check` of ``true`` (``/bin/sh``; fixed
  artifact version), for information.

Printed (target in brackets)::

    procs.bash_call added=0.9ms (bash_tool 2.3ms, bare 1.5ms per call)  [<= 3 ms] PASS

``added`` is the median over rounds of (median bash_tool call - median bare call); the
contenders alternate within each round so that load drifts hit both. The reaper is started
before timing (once per process; its start is not waited for anyway).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tether._completion.check import run_check
from tether._tools.base import ToolContext
from tether._tools.builtin import BashTool

TARGET_MS = 3.0


def bare_bash(root: Path) -> None:
    """The physical baseline of a supervised bash command: ``bash -c true`` in a new session,
    stdin from ``/dev/null``, the output captured."""
    subprocess.run(
        ["/bin/bash", "-c", "true"],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        check=True,
    )


def alternating_medians(
    contenders: dict[str, Callable[[], None]], *, rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per contender, the median call (ms) of each round; one warm-up call each first (it
    starts the reaper), and the order reversed every other round so that load drifts hit
    every contender alike."""
    for run in contenders.values():
        run()
    medians: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(rounds):
        order = list(contenders.items())
        if round_ % 2:
            order.reverse()
        for name, run in order:
            times = []
            for _ in range(calls):
                began = time.perf_counter()
                run()
                times.append((time.perf_counter() - began) * 1000)
            medians[name].append(statistics.median(times))
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per contender and round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        tool = BashTool()
        context = ToolContext(root, "bench")

        def bare() -> None:
            bare_bash(root)

        def bash_tool() -> None:
            result = tool.run({"command": "true"}, context)
            assert result.content.endswith("exit code: 0"), result.content

        def check() -> None:
            outcome = run_check(root, "true", timeout=10, version=lambda: "v")
            assert outcome.exit_status == 0

        contenders: dict[str, Callable[[], None]] = {
            "bare": bare,
            "bash_tool": bash_tool,
            "check": check,
        }
        medians = alternating_medians(contenders, rounds=args.rounds, calls=args.calls)
    added = statistics.median(
        tool_ms - bare_ms
        for tool_ms, bare_ms in zip(medians["bash_tool"], medians["bare"], strict=True)
    )
    tool_ms = statistics.median(medians["bash_tool"])
    bare_ms = statistics.median(medians["bare"])
    check_ms = statistics.median(medians["check"])
    verdict = "PASS" if added <= TARGET_MS else "MISS"
    print(
        f"procs.bash_call added={added:.1f}ms (bash_tool {tool_ms:.1f}ms, bare {bare_ms:.1f}ms "
        f"per call)  [<= {TARGET_MS:g} ms] {verdict}"
    )
    print(f"procs.check_call {check_ms:.1f}ms per call (run_check of `true`, for information)")


if __name__ == "__main__":
    main()
