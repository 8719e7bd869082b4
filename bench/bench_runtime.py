"""Benchmark: the agent loop's overhead per tool step against the store's bare commits.

Run: ``python bench/bench_runtime.py`` (about 5 s; ``--steps``, ``--rounds``, ``--dir``,
``--profile``). Everything happens in a temporary directory (default: ``$TMPDIR``).

Workload: one run of the :class:`~tether._runtime.Agent` in ``durable`` mode with the
scripted model and a single no-op user tool. The script answers ``--steps`` times with one
call of the no-op tool and then with a final ``stop`` answer, so every tool step is the
writer sequence of spec 15.2 — four transactions, each ``fdatasync``-ed:

1. ``stepAttempt``
2. [assistant entry ``toolUse``, usage]
3. ``toolStarted``
4. tool result entry

plus the fixed part of the run ([user entry, ``runStarted``], the final attempt, answer
and ``operationFinished``).

Baseline: the *same facts* — read back from the log the agent just wrote, stripped of
``seq`` and ``timestamp`` (the store assigns those) and built before the clock starts —
committed transaction by transaction straight through :class:`SessionStore` in the same
durability mode. Both sides open an existing session that holds only its header (lock,
read, reduce, sync) and close it at the end, so the only difference is the harness:
planning, building requests, the model call, validating and running the tool, events.

Printed (target in brackets)::

    runtime.tool_step ratio=1.02x (agent 3.10ms/step, bare store 3.04ms/step)  [<= 1.5x]

The ratio is the median of per-round ratios; each round runs the agent and the baseline
back to back, alternating which goes first, so drifts in machine load cancel out. The
``process``-mode figures (no fsync) are printed for information: they show the harness's
CPU cost on its own, which a sync-bound durable step hides.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tether._models import ScriptedModel
from tether._runtime import Agent, RunStatus
from tether._stores.file import Durability, SessionStore
from tether._tools.base import ToolContext
from tether._tools.decorator import tool

TARGET = 1.5


@tool(name="noop", parameters={"type": "object", "properties": {}, "additionalProperties": False})
def noop(arguments: Mapping[str, Any], context: ToolContext) -> str:
    """Do nothing."""
    return "ok"


def script(steps: int) -> dict[str, Any]:
    responses: list[dict[str, Any]] = [
        {
            "content": None,
            "tool_calls": [{"id": f"call_{i}", "name": "noop", "arguments": {}}],
            "usage": {"input": 100 + i, "output": 5},
        }
        for i in range(steps)
    ]
    responses.append({"content": "Done.", "usage": {"input": 100 + steps, "output": 2}})
    return {"model": "scripted/bench", "responses": responses}


def empty_session(workspace: Path, agent: Agent, durability: Durability) -> str:
    with SessionStore.create(
        workspace,
        provider=agent.model.provider,
        model=agent.model.model,
        environment_identity=agent.environment,
        durability=durability,
    ) as store:
        return store.session_id


def agent_round(
    root: Path, model: ScriptedModel, steps: int, durability: Durability, tag: str
) -> tuple[float, Path]:
    workspace = root / f"agent-{tag}"
    workspace.mkdir()
    agent = Agent(model, [noop], workspace=workspace, durability=durability, read_agents_md=False)
    session = empty_session(workspace, agent, durability)
    t0 = time.perf_counter()
    result = agent.run("go", session=session)
    elapsed = time.perf_counter() - t0
    if result.status is not RunStatus.COMPLETED:
        raise SystemExit(f"benchmark run did not complete: {result.to_json()}")
    return elapsed, result.session_path


def transactions_of(log: Path) -> list[list[dict[str, Any]]]:
    """The log's transactions as commit() input: seq and timestamp removed, ids kept."""
    out = []
    for line in log.read_bytes().split(b"\n")[1:-1]:
        value = json.loads(line)
        facts = value if isinstance(value, list) else [value]
        out.append([{k: v for k, v in f.items() if k not in ("seq", "timestamp")} for f in facts])
    return out


def bare_round(
    root: Path,
    transactions: list[list[dict[str, Any]]],
    agent: Agent,
    durability: Durability,
    tag: str,
) -> float:
    workspace = root / f"bare-{tag}"
    workspace.mkdir()
    session = empty_session(workspace, agent, durability)
    t0 = time.perf_counter()
    with SessionStore.open(session, workspace=workspace, durability=durability) as store:
        for facts in transactions:
            store.commit(facts)
    return time.perf_counter() - t0


def measure(
    root: Path, steps: int, rounds: int, durability: Durability
) -> tuple[float, float, float, float]:
    """Medians of: ratio, agent s/step, bare s/step, (agent - bare) s/step; per round."""
    model = ScriptedModel.from_json(script(steps))
    probe = Agent(model, [noop], workspace=root, read_agents_md=False)
    # Warm-up (imports, caches) and the facts for the baseline.
    _, log = agent_round(root, model, steps, durability, f"{durability.value}-warm")
    transactions = transactions_of(log)
    assert len(transactions) == 4 * steps + 4, len(transactions)
    bare_round(root, transactions, probe, durability, f"{durability.value}-warm")
    ratios, ours, theirs, extra = [], [], [], []
    for r in range(rounds):
        tag = f"{durability.value}-{r}"
        if r % 2:
            a, _ = agent_round(root, model, steps, durability, tag)
            b = bare_round(root, transactions, probe, durability, tag)
        else:
            b = bare_round(root, transactions, probe, durability, tag)
            a, _ = agent_round(root, model, steps, durability, tag)
        ratios.append(a / b)
        ours.append(a / steps)
        theirs.append(b / steps)
        extra.append((a - b) / steps)
    return (
        statistics.median(ratios),
        statistics.median(ours),
        statistics.median(theirs),
        statistics.median(extra),
    )


def profile(root: Path, steps: int, durability: Durability) -> None:
    model = ScriptedModel.from_json(script(steps))
    profiler = cProfile.Profile()
    profiler.enable()
    agent_round(root, model, steps, durability, f"{durability.value}-profile")
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=100, help="tool steps per run (100)")
    parser.add_argument("--rounds", type=int, default=11, help="paired rounds (11)")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the sessions")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        if args.profile:
            profile(root, args.steps, Durability.DURABLE)
            return 0
        ratio, agent, bare, overhead = measure(root, args.steps, args.rounds, Durability.DURABLE)
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(
            f"runtime.tool_step ratio={ratio:.2f}x (agent {agent * 1e3:.2f}ms/step, "
            f"bare store {bare * 1e3:.2f}ms/step)  [target <= {TARGET}x: {verdict}]"
        )
        p_ratio, p_agent, p_bare, p_overhead = measure(
            root, args.steps, args.rounds, Durability.PROCESS
        )
        print(
            f"runtime.tool_step.process ratio={p_ratio:.2f}x (agent {p_agent * 1e3:.2f}ms/step, "
            f"bare store {p_bare * 1e3:.2f}ms/step)  [information: no fsync]"
        )
        print(
            f"  harness overhead per tool step: durable {overhead * 1e3:.2f}ms, "
            f"process {p_overhead * 1e3:.2f}ms "
            f"({args.steps} tool steps x {args.rounds} rounds, 4 transactions per step)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
