"""Benchmark: the harness as users run it, one Agent and one session over many turns.

Run: ``python bench/bench_harness.py`` (600 turns, about 10 s on a fast disk; ``--turns``,
``--long`` for 5,000 turns, ``--dir``, ``--process``, ``--profile``). Everything happens in a
temporary directory (default: ``$TMPDIR``).

Workload (issue "The harness at the physical limit"): one :class:`tether.Agent` in
``durable`` mode with the scripted model, and one session. Each turn is
``agent.run(prompt, session=…)`` with a 400-byte prompt; the model answers with one call of
the built-in ``read`` tool on a 2,000-byte file, then with a 400-byte answer. That is the
writer sequence of spec 15.2: [user entry, ``runStarted``], ``stepAttempt``, [assistant,
usage], ``toolStarted``, tool result, ``stepAttempt``, [assistant, usage,
``operationFinished``], and four durable points (``fdatasync``) per turn
(``docs/runtime.md``, "Durable points").

Printed (targets in brackets), each ratio measured in this run:

* ``harness.turn`` — the median turn against the physical baseline: the same bytes the
  turn appended to the log, written in four ``os.write`` + ``os.fdatasync`` calls to a
  scratch file (one per durable point) [<= 1.5x];
* ``harness.growth`` — the median of the last 50 turns over the median of the first 50
  [<= 1.2x];
* ``harness.store_commit`` — one store-only commit of a turn's transaction against a bare
  ``os.write`` + ``os.fdatasync`` of the same bytes [<= 1.2x];
* ``harness.memory`` (``--long``): the reduced state the agent holds for the session,
  object by object, against the log's size [<= 3x];
* ``harness.breakdown`` (``--process``, information): the durable turn split into the
  time inside the log's ``fdatasync`` calls (the store's sync seam, timed) and the rest,
  against the same turn in process mode (no syncs, the harness's work alone);
* ``harness.timeline`` (``--timeline``, information): a durable turn as the sequence of
  its syncs and the agent's progress events (``ModelStarted`` just before the model
  request, ``ToolStarted`` just before the tool runs), each segment's median in µs; and
  ``harness.after_sync``, the work between each sync and the action it precedes: the most
  of a turn that syncing on a background thread, waited for before the action, could hide.

Everything is measured on the same file system, so the baseline has the same disk. Other
processes on the machine (a test run, a build) disturb the figures: the turn baseline is
sampled between turns so that a disturbance hits both alike.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from tether import Agent, RunStatus
from tether.lowlevel import Durability, FileSessions, facts
from tether.testing import ScriptedModel

TURN_TARGET = 1.5
GROWTH_TARGET = 1.2
COMMIT_TARGET = 1.2
POINTS_PER_TURN = 4
WINDOW = 50

PROMPT = ("Please read data.txt and tell me what it says. " * 9)[:400]
ANSWER = ("The file lists the figures of the quarter, all in order. " * 8)[:400]
FILE_TEXT = ("0123456789 abcdefghij klmnopqrstuvwxyz ABCDEFGHIJ KLMNOP\n" * 40)[:2000]


def script(turns: int) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for i in range(turns):
        responses.append(
            {
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "name": "read", "arguments": {"path": "data.txt"}}
                ],
                "usage": {"input": 400 + i, "output": 20},
            }
        )
        responses.append({"content": ANSWER, "usage": {"input": 900 + i, "output": 100}})
    return {"model": "scripted/bench", "responses": responses}


def baseline_turn(scratch: int, chunks: list[bytes]) -> float:
    """Four os.write + os.fdatasync of the turn's bytes, one per durable point."""
    t0 = time.perf_counter()
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(scratch, view) :]
        os.fdatasync(scratch)
    return time.perf_counter() - t0


def split(data: bytes, parts: int) -> list[bytes]:
    step = max(1, -(-len(data) // parts))
    return [data[i : i + step] for i in range(0, len(data), step)] or [b""]


def run_turns(
    root: Path,
    turns: int,
    durability: Durability,
    *,
    memory: bool = False,
    timeline: bool = False,
) -> dict[str, Any]:
    workspace = root / f"harness-{durability.value}-{turns}{'-timeline' if timeline else ''}"
    workspace.mkdir()
    (workspace / "data.txt").write_text(FILE_TEXT)
    scratch_path = workspace / "scratch.bin"
    scratch = os.open(scratch_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    model = ScriptedModel.from_json(script(turns))
    agent_turns: list[float] = []
    base_turns: list[float] = []
    sync_turns: list[float] = []  # time inside the log's fdatasync calls, per turn
    synced = [0.0]
    marks: list[tuple[str, float]] = []  # --timeline: (what, when) of the current turn
    timelines: list[list[tuple[str, float]]] = []
    log_path: Path | None = None
    size = 0
    agent = Agent(
        model,
        workspace=workspace,
        durability=durability,
        read_agents_md=False,
        on_event=_marker(marks) if timeline else None,
    )
    try:
        session: str | None = None
        for _ in range(turns):
            synced[0] = 0.0
            marks.clear()
            t0 = time.perf_counter()
            marks.append(("run", t0))
            result = agent.run(PROMPT, session=session)
            agent_turns.append(time.perf_counter() - t0)
            marks.append(("returned", t0 + agent_turns[-1]))
            sync_turns.append(synced[0])
            if session is None and agent._executor._held is not None:
                # The store's sync seam, timed: what of a turn is the disk's, and what ours.
                agent._executor._held._sync = _timed(  # type: ignore[attr-defined]
                    agent._executor._held._sync,  # type: ignore[attr-defined]
                    synced,
                    marks if timeline else None,
                )
            elif timeline:
                timelines.append(list(marks))
            if result.status is not RunStatus.COMPLETED:
                raise SystemExit(f"benchmark turn did not complete: {result.to_json()}")
            session = result.session_id
            log_path = result.session_path
            with open(log_path, "rb") as log:
                log.seek(size)
                appended = log.read()
            size += len(appended)
            base_turns.append(baseline_turn(scratch, split(appended, POINTS_PER_TURN)))
        held = None
        if memory:
            # The state the agent holds for the session, measured object by object.
            store = agent._executor._held
            assert store is not None
            held = deep_size(store.state)
    finally:
        agent.close()
    os.close(scratch)
    assert log_path is not None
    return {
        "agent": agent_turns,
        "base": base_turns,
        "sync": sync_turns,
        "log_bytes": log_path.stat().st_size,
        "held_bytes": held,
        "timelines": timelines,
    }


def _timed(sync: Any, total: list[float], marks: list[tuple[str, float]] | None) -> Any:
    def timed(fd: int) -> None:
        t0 = time.perf_counter()
        try:
            sync(fd)
        finally:
            t1 = time.perf_counter()
            total[0] += t1 - t0
            if marks is not None:
                marks.extend((("sync", t0), ("synced", t1)))

    return timed


# The events that mark a turn's progress: model_started is emitted just before the model
# request, tool_started just before the tool runs, tool_finished once its result is committed.
_MARKED = {"model_started": "model", "tool_started": "tool", "tool_finished": "tool done"}


def _marker(marks: list[tuple[str, float]]) -> Any:
    def on_event(event: Any) -> None:
        what = _MARKED.get(event.kind)
        if what is not None:
            marks.append((what, time.perf_counter()))

    return on_event


def timeline(figures: dict[str, Any]) -> list[str]:
    """The median of each segment of a durable turn, in the order the turn makes them."""
    turns = figures["timelines"]
    if not turns:
        return ["harness.timeline  (info)  needs at least 2 turns (the first one sets it up)"]
    shape = [what for what, _ in turns[0]]
    same = [t for t in turns if [what for what, _ in t] == shape]
    parts: list[str] = []
    after_sync = 0.0
    for i in range(len(shape) - 1):
        median = statistics.median(t[i + 1][1] - t[i][1] for t in same) * 1e6
        label = "fdatasync" if shape[i] == "sync" else f"{shape[i]}->{shape[i + 1]}"
        parts.append(f"{label} {median:.0f}")
        if shape[i] == "synced":
            after_sync += median
    return [
        f"harness.timeline  (info, median us, {len(same)} turns)  " + " | ".join(parts),
        f"harness.after_sync  (info)  {after_sync:.0f}us a turn between the syncs and the "
        "actions they precede: the most a background sync could overlap",
    ]


def deep_size(root: object) -> int:
    """Bytes of every object reachable from ``root`` (each counted once; classes, modules
    and functions, which the state shares with the interpreter, are not counted)."""
    shared = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, shared):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def store_commit(root: Path, rounds: int = 200) -> tuple[float, float]:
    """Median store-only commit of one fact against os.write + fdatasync of its line."""
    workspace = root / "store-only"
    workspace.mkdir()
    sessions = FileSessions(workspace, durability=Durability.DURABLE)
    store = sessions.create(provider="bench", model="bench", environment_identity="bench")
    scratch = os.open(workspace / "scratch.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ours: list[float] = []
    theirs: list[float] = []
    try:
        for i in range(rounds):
            fact = facts.user_entry(entry_id=f"01900000-0000-7000-8000-{i:012d}", content=PROMPT)
            before = store.path.stat().st_size
            t0 = time.perf_counter()
            store.commit([fact])
            ours.append(time.perf_counter() - t0)
            with open(store.path, "rb") as log:
                log.seek(before)
                line = log.read()
            theirs.append(baseline_turn(scratch, [line]))
    finally:
        store.close()
        os.close(scratch)
    return statistics.median(ours), statistics.median(theirs)


def report(turns: int, figures: dict[str, Any], durability: Durability) -> list[str]:
    agent, base = figures["agent"], figures["base"]
    median_agent = statistics.median(agent)
    median_base = statistics.median(base)
    window = min(WINDOW, max(1, turns // 4))
    first = statistics.median(agent[:window])
    last = statistics.median(agent[-window:])
    tag = "" if durability is Durability.DURABLE else f".{durability.value}"
    lines = [
        f"harness.turn{tag}  ratio={median_agent / median_base:.2f}x  (median turn "
        f"{median_agent * 1e3:.2f}ms, 4 x os.write+fdatasync of the same bytes "
        f"{median_base * 1e3:.2f}ms; {turns} turns)  [target <= {TURN_TARGET}x]",
        f"harness.growth{tag}  ratio={last / first:.2f}x  (last {window} turns "
        f"{last * 1e3:.2f}ms, first {window} {first * 1e3:.2f}ms)  [target <= {GROWTH_TARGET}x]",
    ]
    if figures["held_bytes"] is not None:
        held = figures["held_bytes"]
        size = figures["log_bytes"]
        lines.append(
            f"harness.memory{tag}  ratio={held / size:.2f}x  (reduced state {held / 1e6:.1f} MB, "
            f"log {size / 1e6:.1f} MB)  [target <= 3.0x]"
        )
    return lines


def breakdown(durable: dict[str, Any], process: dict[str, Any]) -> str:
    """Where a durable turn goes: the log's fdatasync calls, and the rest (the harness's
    own work), against the same turn in process mode (no syncs: the work alone)."""
    syncs = statistics.median(durable["sync"])
    rest = statistics.median(t - s for t, s in zip(durable["agent"], durable["sync"], strict=True))
    alone = statistics.median(process["agent"])
    return (
        f"harness.breakdown  (info)  durable turn = fdatasync {syncs * 1e3:.2f}ms + the rest "
        f"{rest * 1e3:.2f}ms; the same turn in process mode {alone * 1e3:.2f}ms "
        f"(the rest takes {rest / alone:.2f}x as long between syncs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=600, help="turns in the session (600)")
    parser.add_argument("--long", action="store_true", help="5,000 turns, with memory")
    parser.add_argument("--memory", action="store_true", help="also measure the held state")
    parser.add_argument("--process", action="store_true", help="also process durability")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the sessions")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the run")
    parser.add_argument("--timeline", action="store_true", help="also time a turn's segments")
    args = parser.parse_args(argv)
    turns = 5000 if args.long else args.turns
    if turns < 1:
        parser.error("--turns must be at least 1")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tether-bench-") as tmp:
        root = Path(tmp)
        print(f"# python {sys.version.split()[0]}, {turns} turns, directory {root}")
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            run_turns(root, turns, Durability.PROCESS if args.process else Durability.DURABLE)
            profiler.disable()
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("cumulative").print_stats(30)
            stats.sort_stats("tottime").print_stats(20)
            return 0
        figures = run_turns(root, turns, Durability.DURABLE, memory=args.long or args.memory)
        lines = report(turns, figures, Durability.DURABLE)
        if args.process:
            process = run_turns(root, turns, Durability.PROCESS)
            lines += report(turns, process, Durability.PROCESS)
            lines.append(breakdown(figures, process))
        if args.timeline:
            lines += timeline(run_turns(root, turns, Durability.DURABLE, timeline=True))
        ours, theirs = store_commit(root)
        lines.append(
            f"harness.store_commit  ratio={ours / theirs:.2f}x  (commit {ours * 1e6:.1f}us, "
            f"os.write+fdatasync of the same line {theirs * 1e6:.1f}us)  "
            f"[target <= {COMMIT_TARGET}x]"
        )
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
