"""``tether crashlab --io-errors [--full]``: fail tether's own system calls, then recover.

The driver and the rendering of :mod:`tether.testing.crashlab.iofaults`; the option hook
is in :mod:`tether._cli.crashlab_cmd`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from tether._cli.common import EXIT_USAGE, InputError, emit_json, fail, printable
from tether.errors import EXIT_FAILED, EXIT_OK
from tether.testing.crashlab.iofaults import (
    BOUNDED_SCENARIOS,
    ERRNOS,
    FULL_SCENARIOS,
    IoCaseResult,
    IoDiscovery,
    IoLabOptions,
    IoLabResult,
    parse_site_filter,
    run_io_lab,
)
from tether.testing.crashlab.matrix import fork_available
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS, Scenario, scenario_unavailable
from tether.testing.crashlab.strace import strace_problem

EXIT_PASS = EXIT_OK  # the lab found nothing wrong
EXIT_FAIL = EXIT_FAILED  # it found a case that fails


def run_io_errors(
    *,
    scenarios: Sequence[str],
    sites: Sequence[str],
    full: bool,
    jobs: int,
    json_output: bool,
    verbose: bool,
    keep: bool,
    workdir: Path | None,
    timeout: float,
    no_fork: bool,
) -> None:
    """Run the I/O-error lab and exit: 0 PASS, 1 FAIL, 2 usage (or no strace)."""
    try:
        wanted = parse_site_filter(sites)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    chosen = _scenarios(scenarios, full)
    problem = strace_problem()
    if problem is not None:
        fail(f"the I/O-error lab needs strace: {problem}", EXIT_USAGE)
    effective_jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
    fork = not no_fork and fork_available()
    options = IoLabOptions(
        scenarios=chosen,
        full=full,
        jobs=effective_jobs,
        timeout=timeout,
        workdir=workdir,
        keep=keep,
        fork=fork,
        sites=wanted,
        plant=os.environ.get("TETHER_LAB_IO_PLANT") or None,
    )
    err = Console(stderr=True, highlight=False, width=200)
    if not json_output:
        names = ", ".join(s.name for s in chosen)
        err.print(
            f"tether crash lab, I/O errors ({'full' if full else 'bounded'}): "
            f"{len(chosen)} scenarios ({names}); errnos {', '.join(ERRNOS)}; "
            f"jobs={effective_jobs} ({'fork server' if fork else 'fresh interpreters'})",
            markup=False,
        )
    done = 0
    total = 0
    failed = 0

    def hook(event: str, payload: Any) -> None:
        nonlocal done, total, failed
        if json_output:
            return
        if event == "discovered":
            discoveries: list[IoDiscovery] = payload
            total = sum(len(d.cases) for d in discoveries)
            for d in discoveries:
                if d.error is not None:
                    err.print(f"{d.scenario.name}: {printable(d.error)}", markup=False)
                else:
                    err.print(
                        f"{d.scenario.name}: {len(d.sites)} calls on tether's files, "
                        f"{len(d.cases)} faulted runs",
                        markup=False,
                    )
        elif event == "case":
            item: IoCaseResult = payload
            done += 1
            failed += item.verdict == "fail"
            if verbose or item.verdict == "fail":
                _print_case(err, item)
            if done == total or done % max(1, total // 10) == 0:
                extra = f", {failed} failed" if failed else ""
                err.print(f"faulted runs: {done}/{total}{extra}", markup=False)

    result = run_io_lab(options, hook)
    if wanted and not result.results and not any(d.error for d in result.discoveries):
        fail(
            "no call matches --site " + ", ".join(sites) + " (see --verbose for the calls)",
            EXIT_USAGE,
        )
    if json_output:
        emit_json(to_json(result))
    else:
        out = Console(highlight=False, width=200)
        for item in result.failures[:20]:
            _print_case(out, item, details=True)
        if len(result.failures) > 20:
            out.print(f"… and {len(result.failures) - 20} more failures", markup=False)
        for item in result.unaimed[:5]:
            out.print(
                f"not aimed: {item.case.key} on {item.case.site.path}: {item.aim}", markup=False
            )
        outcomes = Counter(r.outcome for r in result.ran)
        out.print(
            "outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
            markup=False,
        )
        kept = f"; run folders kept in {result.workdir}" if result.workdir.exists() else ""
        err.print(f"wall time {result.wall_seconds:.1f} s{kept}", markup=False)
        typer.echo(summary_line(result))
    raise typer.Exit(EXIT_PASS if result.verdict == "PASS" else EXIT_FAIL)


def _scenarios(names: Sequence[str], full: bool) -> list[Scenario]:
    unknown = [n for n in names if n not in BUILTIN_SCENARIOS]
    if unknown:
        raise InputError(f"unknown scenario {unknown[0]!r} (known: {', '.join(BUILTIN_SCENARIOS)})")
    picked = list(dict.fromkeys(names)) or list(FULL_SCENARIOS if full else BOUNDED_SCENARIOS)
    chosen = []
    for name in picked:
        scenario = BUILTIN_SCENARIOS[name]
        reason = scenario_unavailable(scenario)
        if reason is not None:
            if names:
                fail(f"scenario {name} cannot run here: {printable(reason)}", EXIT_USAGE)
            continue
        chosen.append(scenario)
    return chosen


def _print_case(console: Console, item: IoCaseResult, *, details: bool = False) -> None:
    case = item.case
    head = (
        f"{item.verdict.upper():<7} {case.scenario} {case.site.syscall}@{case.site.hit} "
        f"{case.errno} {case.site.file_class} {case.site.path} -> {item.outcome or '-'}"
    )
    console.print(head, markup=False)
    if item.result is not None and (details or item.verdict == "fail"):
        for failure in item.result.failures[:5]:
            console.print(f"    {printable(failure)}", markup=False)
        if item.verdict == "fail":
            console.print(f"    reproduce: {item.result.reproduce}", markup=False)
            if item.result.child_command:
                console.print(f"    by hand:   {item.result.child_command}", markup=False)


def summary_line(result: IoLabResult) -> str:
    """``PASS io_errors runs=R calls=C errnos=E scenarios=S lost_acknowledged=0 …``."""
    head = (
        f"{result.verdict} io_errors runs={len(result.ran)} calls={result.calls} "
        f"errnos={result.errnos} scenarios={len(result.discoveries)} "
        f"lost_acknowledged={result.lost_acknowledged} "
        f"duplicate_effects={result.duplicate_effects} unaimed={len(result.unaimed)} "
        f"seconds={result.wall_seconds:.0f}"
    )
    broken = [d for d in result.discoveries if d.error is not None]
    if broken:
        head += f' discovery_failed={broken[0].scenario.name} reason="{broken[0].error}"'
    if result.failures:
        first = result.failures[0]
        assert first.result is not None
        reason = first.result.failures[0] if first.result.failures else ""
        head += (
            f" failed={len(result.failures)} first={first.case.key}"
            f' reason="{reason}" reproduce="{first.result.reproduce}"'
        )
    return head


def to_json(result: IoLabResult) -> dict[str, Any]:
    return {
        "mode": "io_errors",
        "verdict": result.verdict,
        "full": result.options.full,
        "runs": len(result.ran),
        "calls": result.calls,
        "errnos": sorted({r.case.errno for r in result.ran}),
        "lostAcknowledged": result.lost_acknowledged,
        "duplicateEffects": result.duplicate_effects,
        "unaimed": len(result.unaimed),
        "seconds": round(result.wall_seconds, 1),
        "outcomes": dict(Counter(r.outcome for r in result.ran)),
        "scenarios": [
            {
                "name": d.scenario.name,
                "calls": len(d.sites),
                "otherThreads": d.background,
                "runs": len(d.cases),
                "error": d.error,
            }
            for d in result.discoveries
        ],
        "failures": [r.to_json() for r in result.failures],
        "cases": [r.to_json() for r in result.results],
    }
