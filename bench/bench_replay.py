"""``tether replay`` benchmark: replaying a long session against reducing it (a report).

Run ``make bench`` or ``.venv/bin/python bench/bench_replay.py [--turns N] [--repeat R]``.
On an N-turn session from :mod:`sessiongen` (default 1,000 turns), measured in the same
run, best of R, the repetitions alternating between the contenders:

* reduce — ``reduce_session(data)``: the baseline (what loading the log costs);
* replay — :func:`tether.core.replay.replay_log` with the configuration the log was
  recorded with and the default policy: the reducer line by line, the planner before every
  recorded decision, the configuration snapshot of every attempt and the policy's verdict
  on every call compared. Target: at most 2.0x reduce. The composition of the agent
  (reading ``tether.toml`` and the tools, once per command) is not part of it;
* for information: ``--crash-points`` (the planner after every line).

The exit status is always 0; a divergence would be a bug in the generator or in replay and
is printed.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sessiongen
from tether._loading import gc_paused, reduce_session
from tether.core.current import CurrentConfiguration, ToolDeclaration
from tether.core.policy import Policy
from tether.core.replay import crash_points, replay_log
from tether.core.state import Replay

TARGET = 2.0


def recorded_configuration() -> tuple[CurrentConfiguration, dict[str, Any]]:
    """The generator's configuration: its snapshot, and ``current`` with its two tools."""
    snapshot, digest = sessiongen._snapshot()
    tools = tuple(
        ToolDeclaration(tool["name"], tool["definitionDigest"], Replay.SAFE, "builtin:read:v1")
        for tool in snapshot["tools"]
    )
    return CurrentConfiguration(digest, "/workspace/tether-bench", tools), snapshot


def best_interleaved(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, action in runs.items():
            gc.collect()
            started = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = sessiongen.generate(args.turns)
    current, snapshot = recorded_configuration()
    policy = Policy()
    report = replay_log(data, current, snapshot, policy)
    print(
        f"session: {args.turns:,} turns, {len(data) / 1e6:.1f} MB; replay compared "
        f"{report.decisions:,} decisions, {len(report.divergences)} divergences"
    )
    for divergence in report.divergences[:3]:
        print("  " + divergence.text())

    def replay() -> None:
        with gc_paused():  # as the CLI's whole-log reductions do (tether._loading)
            replay_log(data, current, snapshot, policy)

    def crash() -> None:
        with gc_paused():
            crash_points(data, current)

    figures = best_interleaved(
        {"reduce": lambda: reduce_session(data), "replay": replay, "crash": crash}, args.repeat
    )
    reduce_s = figures["reduce"]
    ratio = figures["replay"] / reduce_s
    print(f"reduce_session                 {reduce_s * 1000:9.1f} ms  (baseline)")
    print(
        f"replay                         {figures['replay'] * 1000:9.1f} ms  {ratio:5.2f}x "
        f"reduce (target <= {TARGET:.1f}x: {'met' if ratio <= TARGET else 'NOT met'})"
    )
    print(
        f"replay --crash-points          {figures['crash'] * 1000:9.1f} ms  "
        f"{figures['crash'] / reduce_s:5.2f}x reduce (information)"
    )


if __name__ == "__main__":
    main()
