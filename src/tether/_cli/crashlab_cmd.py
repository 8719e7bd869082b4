"""``tether crashlab``: kill real agent runs at every crash boundary and check the recovery."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tether._cli.common import EXIT_USAGE, InputError, emit_json, fail, handle_errors, printable
from tether._inputs import deeper_than
from tether.core.arguments import MAX_ARGUMENT_DEPTH
from tether.errors import EXIT_FAILED, EXIT_OK, InputTooDeep
from tether.testing.crashlab.matrix import (
    SAMPLE_IN_EVERY_SCENARIO,
    Case,
    CaseResult,
    Discovery,
    LabOptions,
    LabResult,
    fork_available,
    parse_boundary_filter,
    run_lab,
)
from tether.testing.crashlab.report import all_boundaries, render, summary_line, to_json
from tether.testing.crashlab.scenarios import (
    BUILTIN_SCENARIOS,
    Scenario,
    load_user_tool,
    scenario_unavailable,
    user_tool_scenario,
)

EXIT_PASS = EXIT_OK  # the lab found nothing wrong
EXIT_FAIL = EXIT_FAILED  # it found a case that fails
_DURABILITY = {
    "durable": "fdatasync at every durable point",
    "process": "no fsync: a killed process loses nothing, store.after_sync is never reached",
}


def register(app: typer.Typer) -> None:
    app.command("crashlab")(crashlab)


def crashlab(
    list_boundaries: Annotated[
        bool,
        typer.Option("--list-boundaries", help="Print every crash boundary with its description."),
    ] = False,
    list_scenarios: Annotated[
        bool, typer.Option("--list-scenarios", help="Print the built-in scenarios.")
    ] = False,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario", "-s", help="Run only this scenario (repeatable).", metavar="NAME"
        ),
    ] = None,
    boundary: Annotated[
        list[str] | None,
        typer.Option(
            "--boundary",
            "-b",
            help="Crash only at this boundary: NAME (every hit) or NAME@N (repeatable).",
            metavar="NAME[@N]",
        ),
    ] = None,
    tool: Annotated[
        str | None,
        typer.Option(
            "--tool",
            help="Check your own tool: MODULE:NAME (a Tool/EffectTool instance, class or "
            "factory), importable from the current directory.",
            metavar="MODULE:NAME",
        ),
    ] = None,
    tool_args: Annotated[
        str,
        typer.Option(
            "--args", help="The --tool call's arguments as a JSON object.", metavar="JSON"
        ),
    ] = "{}",
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            help="Parallel runs (default: the number of CPUs).",
            min=0,
            metavar="N",
            show_default=False,
        ),
    ] = 0,
    durability: Annotated[
        str,
        typer.Option(
            "--durability",
            help="Session store mode of the runs: durable (fdatasync every commit) or process.",
            metavar="MODE",
        ),
    ] = "durable",
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every run.")] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep every run folder (failing ones are always kept).")
    ] = False,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", help="Where run folders go (default: a temp folder).", metavar="DIR"
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Seconds one child process may take.", min=1.0, metavar="SECONDS"
        ),
    ] = 120.0,
    no_fork: Annotated[
        bool,
        typer.Option("--no-fork", help="Start a fresh interpreter per process instead of forking."),
    ] = False,
    power_loss: Annotated[
        bool,
        typer.Option(
            "--power-loss",
            help="Instead of killing processes, cut the power: record a run's file-system "
            "calls and recover every on-disk state a power cut could leave (needs strace).",
        ),
    ] = False,
    io_errors: Annotated[
        bool,
        typer.Option(
            "--io-errors",
            help="Fail each of tether's own write/fsync/rename/open/SQLite calls in turn "
            "(EIO, ENOSPC, EDQUOT, EROFS) under strace, then resume (a representative subset; "
            "every call with --full).",
        ),
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="With --power-loss or --io-errors: the whole exploration (default: a bounded "
            "subset that takes about a minute).",
        ),
    ] = False,
    plant: Annotated[
        str | None,
        typer.Option(
            "--plant",
            help="With --power-loss: run a store with a known durability bug "
            "(skip_dir_sync, skip_sync_before_effect) to see the lab catch it.",
            metavar="BUG",
        ),
    ] = None,
    site: Annotated[
        list[str] | None,
        typer.Option(
            "--site",
            help="With --io-errors: fail only this call: SYSCALL[@N][:ERRNO] (repeatable).",
            metavar="SYSCALL[@N][:ERRNO]",
        ),
    ] = None,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="A representative sample of the matrix (what make demo runs): every boundary "
            "at least once, before_effect/after_effect in every scenario, every scenario at "
            "least once; the runs left out are counted.",
        ),
    ] = False,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Run against a shared PostgreSQL store (postgresql://…): every run's session "
            "in a schema of its own there, dropped with the run folder's next reset.",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Kill real agent runs at every crash boundary and prove recovery never duplicates an effect.

    Every built-in scenario (driven by a scripted model: no API key) is run once to find the
    boundaries it passes; then, for every boundary and every N-th hit of it, the scenario
    runs in a child process that is killed there, is resumed, and resumed again. Each run
    is checked: never-replay effects happened at most once (exactly once where the log
    records the outcome), acknowledged commits survived, the log reduces and every tool call
    has one result, the second resume appended nothing, review items only where the
    outcome cannot be known.

    Examples:

        tether crashlab

        tether crashlab --sample

        tether crashlab --scenario publish-report --boundary after_effect

        tether crashlab --list-boundaries

        tether crashlab --power-loss [--full]

    The last line is `PASS duplicate_effects=0 scenarios=S boundaries=B runs=R` (exit 0),
    or `FAIL …` with the first counterexample and the command reproducing it (exit 1).
    With --tool the verdict is REVIEW (exit 1) when recovery cannot establish the outcome
    of your tool after some crash (no lookup). Exit 2: usage error.
    """
    with handle_errors():
        if list_boundaries:
            _list_boundaries(json_output)
            return
        if list_scenarios:
            _list_scenarios(json_output)
            return
        _below_the_process(
            power_loss=power_loss,
            io_errors=io_errors,
            full=full,
            plant=plant,
            site=bool(site),
            conflicts={
                "--boundary": bool(boundary),
                "--tool": tool is not None,
                "--store": store is not None,
                "--durability": durability != "durable",
                "--sample": sample,
            },
        )
        if power_loss:
            from tether._cli.crashlab_power import run_power

            run_power(
                names=list(scenario or []),
                full=full,
                plant=plant,
                jobs=jobs,
                json_output=json_output,
                verbose=verbose,
                keep=keep,
                workdir=workdir,
                timeout=timeout,
                fork=not no_fork and fork_available(),
            )
            return
        if io_errors:
            from tether._cli.crashlab_io import run_io_errors

            run_io_errors(
                scenarios=scenario or [],
                sites=site or [],
                full=full,
                jobs=jobs,
                json_output=json_output,
                verbose=verbose,
                keep=keep,
                workdir=workdir,
                timeout=timeout,
                no_fork=no_fork,
            )
            return
        if durability not in ("durable", "process"):
            raise InputError(f"--durability must be durable or process, not {durability!r}")
        try:
            wanted = parse_boundary_filter(boundary or ())
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if wanted:
            registered = all_boundaries()
            for name, _ in wanted:
                if name not in registered:
                    raise InputError(
                        f"unknown boundary {name!r} (see tether crashlab --list-boundaries)"
                    )
        scenarios, skipped, args_json = _scenarios(scenario or [], tool, tool_args)
        if not scenarios:
            fail("no scenario to run: " + "; ".join(f"{n}: {r}" for n, r in skipped), EXIT_USAGE)
        if store is not None:
            from tether._stores.postgres import connect, is_store_url

            if not is_store_url(store):
                raise InputError("--store must be a postgresql:// URL")
            connect(store).close()  # reachable (one line if not); each run makes its schema
        effective_jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        fork = not no_fork and fork_available()
        options = LabOptions(
            scenarios=scenarios,
            boundaries=list(boundary or ()),
            jobs=effective_jobs,
            durability=durability,
            timeout=timeout,
            workdir=workdir,
            keep=keep,
            fork=fork,
            reproduce=_reproducer(tool, args_json, durability),
            skipped=skipped,
            store=store,
            sample=sample,
        )
        try:
            result = _run(options, json_output, fork)
        finally:
            if store is not None:
                from tether.testing.crashlab.child import drop_lab_schemas

                drop_lab_schemas(keep=keep)
        _unreached(result, boundary or [])
        if json_output:
            emit_json(to_json(result, jobs=effective_jobs, fork=fork))
        else:
            console = Console(highlight=False)
            if not console.is_terminal:
                console = Console(width=200, highlight=False)
            render(result, console, verbose=verbose)
            typer.echo(summary_line(result))
        raise typer.Exit(EXIT_PASS if result.verdict == "PASS" else EXIT_FAIL)


def _below_the_process(
    *,
    power_loss: bool,
    io_errors: bool,
    full: bool,
    plant: str | None,
    site: bool,
    conflicts: dict[str, bool],
) -> None:
    """The options of the two labs below the process (power loss, I/O errors), checked.

    Their crash points are every recorded call, not boundaries; they test the file store
    in durable mode (what a power cut or a failing disk threatens); a user tool's effects
    cannot be rebuilt from a trace: so the matrix's own options are refused with them.
    """
    if power_loss and io_errors:
        raise InputError("--power-loss and --io-errors are two labs: run one at a time")
    if full and not (power_loss or io_errors):
        raise InputError("--full goes with --power-loss or --io-errors")
    if plant is not None and not power_loss:
        raise InputError("--plant goes with --power-loss")
    if site and not io_errors:
        raise InputError("--site needs --io-errors")
    lab = "--power-loss" if power_loss else "--io-errors" if io_errors else None
    if lab is None:
        return
    for flag, given in conflicts.items():
        if given:
            raise InputError(f"{lab} cannot be combined with {flag}")


def _list_boundaries(json_output: bool) -> None:
    boundaries = all_boundaries()
    if json_output:
        emit_json([{"name": n, "description": d} for n, d in boundaries.items()])
        return
    width = max((len(n) for n in boundaries), default=0)
    for name, description in boundaries.items():
        typer.echo(f"{name:<{width}}  {description}")


def _list_scenarios(json_output: bool) -> None:
    if json_output:
        emit_json([{"name": s.name, "title": s.title} for s in BUILTIN_SCENARIOS.values()])
        return
    width = max(len(n) for n in BUILTIN_SCENARIOS)
    for item in BUILTIN_SCENARIOS.values():
        typer.echo(f"{item.name:<{width}}  {item.title}")


def _scenarios(
    names: list[str], tool: str | None, tool_args: str
) -> tuple[list[Scenario], list[tuple[str, str]], str | None]:
    skipped: list[tuple[str, str]] = []
    if tool is not None:
        if names:
            raise InputError("--scenario and --tool cannot be combined")
        arguments, text = _tool_arguments(tool_args)
        return [_user_scenario(tool, arguments)], skipped, text
    unknown = [n for n in names if n not in BUILTIN_SCENARIOS]
    if unknown:
        known = ", ".join(BUILTIN_SCENARIOS)
        raise InputError(f"unknown scenario {unknown[0]!r} (known: {known})")
    chosen = [BUILTIN_SCENARIOS[n] for n in dict.fromkeys(names)] or list(
        BUILTIN_SCENARIOS.values()
    )
    out = []
    for item in chosen:
        reason = scenario_unavailable(item)
        if reason is not None:
            skipped.append((item.name, reason))
        else:
            out.append(item)
    return out, skipped, None


def _tool_arguments(text: str) -> tuple[dict[str, Any], str]:
    # The limit of tool-call arguments from a model, checked before json.loads, which
    # would recurse into deeper nesting until RecursionError.
    if deeper_than(text.encode("utf-8", "surrogatepass"), MAX_ARGUMENT_DEPTH):
        raise InputTooDeep("--args", MAX_ARGUMENT_DEPTH)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError("--args must be a JSON object")
    return value, text


def _user_scenario(ref: str, arguments: dict[str, Any]) -> Scenario:
    with tempfile.TemporaryDirectory(prefix="tether-crashlab-tool-") as folder:
        try:
            built = load_user_tool(ref, Path(folder), [os.getcwd()])
        except Exception as exc:
            raise InputError(f"cannot load --tool {ref}: {type(exc).__name__}: {exc}") from None
        errors = built.validation_errors(arguments)
        if errors:
            raise InputError(f"--args do not match {built.name}'s parameters: {errors[0]}")
        try:
            from tether._effects.contract import has_lookup

            lookup = has_lookup(built)
        except ImportError:
            lookup = False
        return user_tool_scenario(ref, arguments, built.name, has_lookup=lookup)


def _reproducer(tool: str | None, args_json: str | None, durability: str) -> Any:
    def reproduce(case: Case) -> str:
        argv = ["tether", "crashlab"]
        if tool is not None:
            argv += ["--tool", tool, "--args", args_json or "{}"]
        else:
            argv += ["--scenario", case.scenario]
        argv += ["--boundary", case.spec]
        if durability != "durable":
            argv += ["--durability", durability]
        return shlex.join(argv)

    return reproduce


def _sandbox_note() -> str:
    """How the lab's agents confine their bash commands (docs/sandbox.md): they are built
    with the default settings and the environment, as any agent is."""
    from tether._runtime.compose import sandbox_for
    from tether._settings import resolve_settings

    settings = resolve_settings({}, environ=os.environ, project=None)
    with tempfile.TemporaryDirectory() as scratch:
        box = sandbox_for(settings, Path(scratch))
        if not box.confined:
            return "off"
        mechanism = box.ensure()  # the lab's runs would refuse alike (exit 27)
    assert mechanism is not None
    return f"{box.policy.mode.value} (bubblewrap {mechanism.version})"


def _run(options: LabOptions, json_output: bool, fork: bool) -> LabResult:
    err = Console(stderr=True, highlight=False)
    if not err.is_terminal:
        err = Console(stderr=True, highlight=False, width=200)
    quiet = json_output or not err.is_terminal
    if not json_output:
        names = ", ".join(s.name for s in options.scenarios)
        mode = "fork server" if fork else "fresh interpreters"
        # soft_wrap: a long header is folded by the terminal, never cut by rich.
        err.print(
            f"tether crash lab: {len(options.scenarios)} scenarios ({names}); "
            f"durability={options.durability} ({_DURABILITY[options.durability]}); "
            f"jobs={options.jobs} ({mode}); sandbox={_sandbox_note()}",
            soft_wrap=True,
        )
        for name, reason in options.skipped:
            err.print(f"[yellow]skipped {name}[/]: {printable(reason)}", soft_wrap=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=err,
        disable=quiet,
        transient=False,
    ) as progress:
        task = progress.add_task("discovering boundaries", total=None, status="")
        failed = 0
        done = 0
        total = 0
        started = 0.0
        # Not on a terminal (CI, make demo | tee): plain lines every tenth of the runs.
        plain = not json_output and not err.is_terminal
        if plain:
            err.print("discovering boundaries…")

        def hook(event: str, payload: Any) -> None:
            nonlocal failed, done, total, started
            if event == "discovered":
                discoveries: list[Discovery] = payload
                total = sum(len(d.cases) for d in discoveries)
                started = time.monotonic()
                if options.sample and not json_output:
                    err.print(sample_note(discoveries), soft_wrap=True, markup=False)
                progress.update(task, description="crash runs", total=total, completed=0)
                if plain:
                    err.print(f"crash runs: 0/{total}")
            elif event == "case":
                case: CaseResult = payload
                failed += case.verdict == "fail"
                done += 1
                status = f"[red]{failed} failed[/]" if failed else ""
                progress.update(task, advance=1, status=status)
                if plain and (done == total or done % max(1, total // 10) == 0):
                    extra = f", {failed} failed" if failed else ""
                    left = _estimate(time.monotonic() - started, done, total)
                    err.print(f"crash runs: {done}/{total}{extra}{left}", markup=False)

        result = run_lab(options, hook)
    if not json_output:
        note = (
            "effects recovery: wired into the executor (journal for write/edit, lookup for "
            "effect tools, review items) — an `interrupted` result for an outcome it can "
            "establish is a failure"
            if result.strict
            else "effects recovery: NOT wired into the executor — write/edit/publish_report "
            "crashes end `interrupted` (outcome unknown, never repeated) and are only counted"
        )
        err.print(note, soft_wrap=True)
        kept = f"; run folders kept in {result.workdir}" if result.workdir.exists() else ""
        err.print(f"wall time {result.wall_seconds:.1f} s{kept}", markup=False, soft_wrap=True)
    return result


def _estimate(elapsed: float, done: int, total: int) -> str:
    """``, about 40 s left`` from the pace so far (nothing once every run is done)."""
    if done >= total or done <= 0:
        return ""
    return f", about {elapsed / done * (total - done):.0f} s left"


def sample_note(discoveries: list[Discovery]) -> str:
    """What a ``--sample`` runs and what it leaves to the whole lab (``make crashlab``)."""
    runs = sum(len(d.cases) for d in discoveries)
    left = sum(len(d.left_out) for d in discoveries)
    boundaries = len({c.boundary for d in discoveries for c in d.cases})
    scenarios = sum(1 for d in discoveries if d.cases)
    every = "/".join(SAMPLE_IN_EVERY_SCENARIO)
    return (
        f"representative sample: {runs} of {runs + left} crash runs: all {boundaries} "
        f"boundaries at least once, {every} in every scenario that reaches them, all "
        f"{scenarios} scenarios; left for the whole lab ({left} runs: the other hits of each "
        f"boundary and the other scenarios at each boundary): `make crashlab` "
        f"(tether crashlab)"
    )


def _unreached(result: LabResult, specs: list[str]) -> None:
    """A --boundary that no scenario reaches is a usage error, not a silent PASS."""
    if not specs:
        return
    reached = {(c.boundary, c.hit) for d in result.discoveries for c in d.reached}
    names = {b for b, _ in reached}
    for name, hit in parse_boundary_filter(specs):
        if (hit is None and name not in names) or (hit is not None and (name, hit) not in reached):
            most: dict[str, int] = {}
            for discovery in result.discoveries:
                for case in discovery.reached:
                    most[case.boundary] = max(most.get(case.boundary, 0), case.hit)
            hint = ", ".join(f"{b}@1..{n}" if n > 1 else f"{b}@1" for b, n in most.items())
            fail(
                f"boundary {name}{'' if hit is None else f'@{hit}'} is not reached by the "
                f"chosen scenarios (reached: {hint or 'none'})",
                EXIT_USAGE,
            )
