"""Reducer benchmark: load time, per-transaction cost and memory (a report, not a test).

Run ``make bench`` or ``.venv/bin/python bench/bench_reduce.py [--turns N]``. All figures
are measured in the same run, on sessions from :mod:`sessiongen`:

* load — ``reduce_session(data)`` (the shell's entry point, :mod:`tether._loading`: the
  pure reducer with the cyclic collector paused) for an N-turn session against the plain
  baseline ``for line in data.split(b"\\n")[:-1]: json.loads(line)`` (target: at most
  2.0x); the same loop with ``orjson.loads``, and the pure ``tether.core.reduce_session``
  (collector left running), are shown for information.
* per-transaction — ``Reducer.check(line)`` (validate, apply, roll back) of the next
  turn's first transaction against a 10-turn state and against an N-turn state
  (target: at most 1.2x). Also shown: ``Reducer.apply`` of whole further turns.
* memory — bytes still allocated (tracemalloc) after ``load_reducer`` with only the
  reducer and its state alive; the input bytes were allocated before tracing started
  and are not counted (target: at most 3x the file size). Peak shown for information.

Timings are the best of several repetitions with ``time.perf_counter``; the garbage
collector stays enabled (as in a real process) and a full collection runs before each
repetition. The exit status is always 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sessiongen
from tether._loading import load_reducer, reduce_session
from tether.core.reducer import Reducer
from tether.core.reducer import reduce_session as pure_reduce_session

LOAD_TARGET = 2.0
APPLY_TARGET = 1.2
MEMORY_TARGET = 3.0


def _best_interleaved(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time of each callable; the repetitions alternate between the callables so
    that load from other processes on the machine affects all of them alike."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            result = run()
            elapsed = time.perf_counter() - start
            del result
            best[name] = min(best[name], elapsed)
    return best


def _json_baseline(data: bytes) -> None:
    for line in data.split(b"\n")[:-1]:
        json.loads(line)


def _orjson_baseline(data: bytes) -> None:
    for line in data.split(b"\n")[:-1]:
        orjson.loads(line)


def bench_load(data: bytes, turns: int, repeat: int) -> float:
    best = _best_interleaved(
        {
            "tether": lambda: reduce_session(data),
            "pure": lambda: pure_reduce_session(data),
            "json": lambda: _json_baseline(data),
            "orjson": lambda: _orjson_baseline(data),
        },
        repeat,
    )
    tether, pure, plain, fast = best["tether"], best["pure"], best["json"], best["orjson"]
    ratio = tether / plain
    print(
        f"reduce.load_{turns}_turns  ratio={ratio:.2f}x  (tether {tether:.2f}s, "
        f"pure core with gc running {pure:.2f}s, json.loads {plain:.2f}s, "
        f"orjson {fast:.2f}s, {len(data) / 1e6:.1f} MB, "
        f"{turns * sessiongen.FACTS_PER_TURN} facts)"
    )
    return ratio


def _check_rate(reducer: Reducer, line: bytes, calls: int) -> float:
    check = reducer.check
    start = time.perf_counter()
    for _ in range(calls):
        check(line)
    return (time.perf_counter() - start) / calls


def _apply_rate(reducer: Reducer, lines: list[bytes]) -> float:
    apply = reducer.apply
    start = time.perf_counter()
    for line in lines:
        apply(line)
    return (time.perf_counter() - start) / len(lines)


def bench_apply(
    small: Reducer, big: Reducer, small_turns: int, turns: int, content_chars: int, repeat: int
) -> float:
    small_line = sessiongen.next_transaction(small_turns, content_chars=content_chars)
    big_line = sessiongen.next_transaction(turns, content_chars=content_chars)
    calls = 2000
    small_best = big_best = float("inf")
    for _ in range(repeat):  # interleaved, so drift affects both sides alike
        gc.collect()
        small_best = min(small_best, _check_rate(small, small_line, calls))
        gc.collect()
        big_best = min(big_best, _check_rate(big, big_line, calls))
    ratio = big_best / small_best
    print(
        f"reduce.check_1_txn  ratio={ratio:.2f}x  ({small_turns} turns "
        f"{small_best * 1e6:.1f}us, {turns} turns {big_best * 1e6:.1f}us; "
        f"validate + roll back [user entry, runStarted], best of {repeat} x {calls})"
    )

    # Whole further turns through apply() (begin + commit), for information.
    per_round = 20
    small_apply = big_apply = float("inf")
    for round_index in range(repeat):
        offset = round_index * per_round
        small_lines: list[bytes] = []
        big_lines: list[bytes] = []
        for turn in range(per_round):
            small_lines += sessiongen.turn_lines(
                small_turns + offset + turn, content_chars=content_chars
            )
            big_lines += sessiongen.turn_lines(turns + offset + turn, content_chars=content_chars)
        gc.collect()
        small_apply = min(small_apply, _apply_rate(small, small_lines))
        gc.collect()
        big_apply = min(big_apply, _apply_rate(big, big_lines))
    print(
        f"reduce.apply_turns  ratio={big_apply / small_apply:.2f}x  "
        f"({small_turns}+ turns {small_apply * 1e6:.1f}us, {turns}+ turns "
        f"{big_apply * 1e6:.1f}us per transaction; {per_round} turns per round, "
        f"best of {repeat}; for information)"
    )
    return ratio


def bench_memory(data: bytes, turns: int) -> float:
    gc.collect()
    tracemalloc.start()
    reducer = load_reducer(data)
    state = reducer.state
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del state, reducer
    ratio = current / len(data)
    print(
        f"reduce.memory_{turns}_turns  ratio={ratio:.2f}x  (retained {current / 1e6:.1f} MB, "
        f"peak {peak / 1e6:.1f} MB, file {len(data) / 1e6:.1f} MB)"
    )
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--small-turns", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--content-chars",
        type=int,
        default=sessiongen.CONTENT_CHARS,
        help="size of each tool result (default %(default)s)",
    )
    args = parser.parse_args(argv)
    turns: int = args.turns
    chars: int = args.content_chars

    start = time.perf_counter()
    data = sessiongen.generate(turns, content_chars=chars)
    small_data = sessiongen.generate(args.small_turns, content_chars=chars)
    print(
        f"# python {sys.version.split()[0]}, {turns} turns ({len(data) / 1e6:.1f} MB, "
        f"tool results ~{chars} chars), generated in {time.perf_counter() - start:.1f}s; "
        f"gc enabled, best of {args.repeat}"
    )

    load_ratio = bench_load(data, turns, args.repeat)
    big = load_reducer(data)
    small = load_reducer(small_data)
    apply_ratio = bench_apply(small, big, args.small_turns, turns, chars, max(args.repeat, 5))
    del big, small
    memory_ratio = bench_memory(data, turns)

    for name, ratio, target in (
        ("load vs json.loads", load_ratio, LOAD_TARGET),
        (f"apply at {turns} vs {args.small_turns} turns", apply_ratio, APPLY_TARGET),
        ("memory vs file size", memory_ratio, MEMORY_TARGET),
    ):
        verdict = "PASS" if ratio <= target else "MISS"
        print(f"{verdict}  {name}: {ratio:.2f}x (target <= {target}x)")
    print(f"# total {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
