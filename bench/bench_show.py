"""``tether show`` benchmark: rendering a long session against reducing it (a report).

Run ``make bench`` or ``.venv/bin/python bench/bench_show.py [--turns N] [--repeat R]``.
On an N-turn session from :mod:`sessiongen` (default 10,000 turns, 64 MB), measured in
the same run, best of R:

* reduce — ``reduce_session(data)``: the baseline, what ``tether inspect`` pays;
* render — what ``tether show`` does on top of that: parse the committed lines into facts
  (``parse_transactions``), build the pure timeline (``build_timeline``) and print the
  terminal view (summarised, the default) into an in-memory terminal. Target: at most
  2.0x reduce;
* for information: the ``--all`` terminal view, the ``--html`` page and its size against
  the log's, and the physical floor ``orjson.loads`` of every line.

The collector runs as in the command (paused while facts and timeline are built, as the
reducer's loader does). The exit status is always 0.
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console

import sessiongen
from tether._loading import gc_paused
from tether._show import parse_transactions
from tether._show.page import page_html
from tether._show.terminal import render_timeline
from tether.core import reduce_session
from tether.core.timeline import Timeline, build_timeline

TARGET = 2.0


def best(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        value = action()
        times.append(time.perf_counter() - started)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = sessiongen.generate(args.turns)
    print(f"session: {args.turns:,} turns, {len(data) / 1e6:.1f} MB")

    reduce_s, state = best(lambda: reduce_session(data), args.repeat)

    def timeline() -> Timeline:
        with gc_paused():
            transactions = parse_transactions(data[: state.repaired_length])
            return build_timeline(state, transactions)

    def render(show_all: bool) -> Timeline:
        built = timeline()
        console = Console(file=io.StringIO(), width=160, force_terminal=True)
        render_timeline(built, console, show_all=show_all)
        return built

    render_s, built = best(lambda: render(False), args.repeat)
    render_all_s, _ = best(lambda: render(True), max(1, args.repeat - 1))
    html_s, page = best(lambda: page_html(built), max(1, args.repeat - 1))

    def floor() -> None:
        for line in data.split(b"\n")[:-1]:
            orjson.loads(line)

    floor_s, _ = best(floor, args.repeat)

    ratio = render_s / reduce_s
    print(f"reduce_session                 {reduce_s * 1000:9.1f} ms  (baseline)")
    print(
        f"show, terminal (summarised)    {render_s * 1000:9.1f} ms  {ratio:5.2f}x reduce "
        f"(target <= {TARGET:.1f}x: {'met' if ratio <= TARGET else 'NOT met'})"
    )
    print(
        f"show, terminal --all           {render_all_s * 1000:9.1f} ms  "
        f"{render_all_s / reduce_s:5.2f}x reduce (information)"
    )
    print(
        f"show, --html page              {html_s * 1000:9.1f} ms  "
        f"{html_s / reduce_s:5.2f}x reduce; {len(page) / 1e6:.1f} MB = "
        f"{len(page) / len(data):.2f}x the log"
    )
    print(
        f"orjson.loads of every line     {floor_s * 1000:9.1f} ms  "
        f"{floor_s / reduce_s:5.2f}x reduce (physical floor of any parse)"
    )


if __name__ == "__main__":
    main()
