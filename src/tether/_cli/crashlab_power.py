"""``tether crashlab --power-loss``: recover every on-disk state a power cut could leave."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from tether._cli.common import EXIT_USAGE, InputError, emit_json, fail, printable
from tether.errors import EXIT_FAILED, EXIT_OK
from tether.testing.crashlab.powerlab import (
    BOUNDED_SCENARIOS,
    FULL_SCENARIOS,
    PLANTS,
    PowerOptions,
    PowerResult,
    StateResult,
    run_power_lab,
    strace_problem,
)
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS, Scenario, scenario_unavailable

EXIT_PASS = EXIT_OK  # the lab found nothing wrong
EXIT_FAIL = EXIT_FAILED  # it found a case that fails


def power_scenarios(names: list[str], full: bool) -> list[Scenario]:
    """The scenarios to explore: the named ones, or the bounded or full default set."""
    unknown = [n for n in names if n not in BUILTIN_SCENARIOS]
    if unknown:
        raise InputError(f"unknown scenario {unknown[0]!r} (known: {', '.join(BUILTIN_SCENARIOS)})")
    chosen = [BUILTIN_SCENARIOS[n] for n in dict.fromkeys(names)] or [
        BUILTIN_SCENARIOS[n] for n in (FULL_SCENARIOS if full else BOUNDED_SCENARIOS)
    ]
    for item in chosen:
        why = _unsupported(item)
        if why is not None:
            raise InputError(f"scenario {item.name!r} cannot run under --power-loss: {why}")
    return chosen


def _unsupported(scenario: Scenario) -> str | None:
    if scenario.tamper:
        return "it changes files between the crash and the resume"
    if scenario.abort_on is not None:
        return "it is stopped by a person, not by a cut"
    if scenario.user_tool:
        return "a user tool's effects cannot be replayed from a trace"
    if any(spec.kind == "mcp" for spec in scenario.effects):
        return "its MCP server is a separate process with files of its own"
    return scenario_unavailable(scenario)


def run_power(
    *,
    names: list[str],
    full: bool,
    plant: str | None,
    jobs: int,
    json_output: bool,
    verbose: bool,
    keep: bool,
    workdir: Path | None,
    timeout: float,
    fork: bool,
) -> None:
    if plant is not None and plant not in PLANTS:
        raise InputError(f"unknown --plant {plant!r} (known: {', '.join(PLANTS)})")
    scenarios = power_scenarios(names, full)
    problem = strace_problem()
    if problem is not None:
        fail(f"--power-loss records the run with strace: {problem}", EXIT_USAGE)
    options = PowerOptions(
        scenarios=scenarios,
        full=full,
        jobs=jobs if jobs > 0 else (os.cpu_count() or 1),
        timeout=timeout,
        workdir=workdir,
        keep=keep,
        fork=fork,
        plant=plant,
    )
    err = Console(stderr=True, highlight=False, width=None if json_output else 200)
    if not json_output:
        form = "full" if full else "bounded (--full explores up to 64 states per cut)"
        err.print(
            f"tether crash lab, power loss: {len(scenarios)} scenarios "
            f"({', '.join(s.name for s in scenarios)}); {form}; model: POSIX with ext4 "
            "data=ordered (unsynced data and directory entries may be lost)",
            markup=False,
        )
        if plant is not None:
            err.print(f"planted bug: {plant}: {PLANTS[plant]} (the lab must FAIL)", markup=False)
    counted = {"states": 0, "failed": 0}

    def progress(event: str, payload: Any) -> None:
        if event != "state" or json_output:
            return
        state: StateResult = payload
        counted["states"] += 1
        counted["failed"] += state.failed
        if verbose or (state.failed and counted["failed"] <= 3):
            err.print(_line(state), markup=False)
        elif counted["states"] % 50 == 0:
            err.print(f"states recovered: {counted['states']}", markup=False)

    result = run_power_lab(options, progress)
    if json_output:
        emit_json(result.to_json())
    else:
        _render(result)
    raise typer.Exit(EXIT_PASS if result.verdict == "PASS" else EXIT_FAIL)


def _line(state: StateResult) -> str:
    verdict = "FAIL" if state.failed else "ok  "
    return f"{verdict} {state.scenario} state {state.number}: cut after {state.call} ({state.kind})"


def _render(result: PowerResult) -> None:
    out = Console(highlight=False, width=200)
    for summary in result.scenarios:
        line = (
            f"{summary.scenario}: {summary.calls} calls traced, {summary.cuts} cuts, "
            f"{summary.states} distinct states"
        )
        if summary.error:
            line += f" — {summary.error}"
        out.print(printable(line), markup=False)
    failures = result.failures
    if failures:
        first = failures[0]
        out.print("", markup=False)
        out.print(
            f"first violation: {first.scenario} state {first.number}, cut after "
            f"{first.call} ({first.kind})",
            markup=False,
        )
        out.print("  the state lost:", markup=False)
        for item in first.lost or ("nothing (every write had been synced)",):
            out.print(f"    {printable(item)}", markup=False)
        out.print("  recovery then:", markup=False)
        for failure in first.result.failures:
            out.print(f"    {printable(failure)}", markup=False)
        if first.copy:
            out.print(f"  the state as recovered: {first.copy}", markup=False)
        if len(failures) > 1:
            out.print(f"  ({len(failures) - 1} more failing states)", markup=False)
    typer.echo(result.summary())
