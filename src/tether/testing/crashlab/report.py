"""The crash lab's output: rich tables, the JSON document and the verdict line."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from tether import _faults as faults
from tether.testing.crashlab.matrix import CaseResult, LabResult, summarize_boundaries

__all__ = [
    "OUTSIDE_THE_LAB",
    "all_boundaries",
    "first_failure",
    "render",
    "summary_line",
    "to_json",
]

_SKIP_MODULES = ("tether.__main__", "tether._cli", "tether.testing.crashlab")

OUTSIDE_THE_LAB: dict[str, str] = {
    "approval.parked": "tests/test_approvals.py (a parked run needs a person to go on)",
    "approval.deciding": "tests/test_approvals.py (tether approve/deny, not an agent run)",
    "approval.decided": "tests/test_approvals.py (tether approve/deny, not an agent run)",
    "rewind.planned": "tests/test_rewind.py (tether rewind, not an agent run)",
    "rewind.step_applied": "tests/test_rewind.py (tether rewind, not an agent run)",
    "rewind.step_recorded": "tests/test_rewind.py (tether rewind, not an agent run)",
}
"""Boundaries no lab scenario can reach, and the test that kills a process at each."""


def all_boundaries() -> dict[str, str]:
    """Every registered crash boundary (name → description), after importing all of tether.

    Modules register their boundaries at import, so every module of the package is
    imported first (a module that fails to import is skipped).
    """
    import tether

    for info in pkgutil.walk_packages(tether.__path__, prefix="tether."):
        if info.name.startswith(_SKIP_MODULES):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional module that cannot load registers nothing
            continue
    return dict(faults.BOUNDARIES)


def _everything(result: LabResult) -> list[CaseResult]:
    return [*(d.baseline for d in result.discoveries), *result.results]


def first_failure(result: LabResult) -> CaseResult | None:
    """The first failing case in matrix order (uncrashed baselines first)."""
    failures = result.failures
    return failures[0] if failures else None


def _first_review(result: LabResult) -> CaseResult | None:
    for case in _everything(result):
        if case.verdict == "review":
            return case
    return None


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def summary_line(result: LabResult) -> str:
    """``PASS duplicate_effects=0 scenarios=S boundaries=B runs=R`` (or FAIL/REVIEW …)."""
    verdict = result.verdict
    head = (
        f"{verdict} duplicate_effects={result.duplicate_effects} "
        f"scenarios={len(result.discoveries)} boundaries={len(result.boundaries)} "
        f"runs={len(result.results)}"
    )
    if verdict == "FAIL":
        case = first_failure(result)
        assert case is not None
        head += (
            f" failed={len(result.failures)} first={case.case.key}"
            f" reason={_quote(case.failures[0])} reproduce={_quote(case.reproduce)}"
        )
    elif verdict == "REVIEW":
        unknown = sum(r.unknown for r in _everything(result))
        reviews = sum(len(r.reviews) for r in _everything(result))
        head += f" unknown_outcomes={unknown} review_items={reviews}"
        case = _first_review(result)
        if case is not None:
            head += f" first={case.case.key} reproduce={_quote(case.reproduce)}"
    return head


def to_json(result: LabResult, *, jobs: int, fork: bool) -> dict[str, Any]:
    failure = first_failure(result)
    return {
        "verdict": result.verdict,
        "summary": summary_line(result),
        "duplicateEffects": result.duplicate_effects,
        "scenarios": len(result.discoveries),
        "boundaries": len(result.boundaries),
        "runs": len(result.results),
        "failed": len(result.failures),
        "durability": result.options.durability,
        "jobs": jobs,
        "forkServer": fork,
        "effectsIntegrated": result.strict,
        "wallSeconds": round(result.wall_seconds, 2),
        "skipped": [{"scenario": s, "reason": r} for s, r in result.options.skipped],
        "scenarioSummary": _scenario_rows(result),
        "boundarySummary": summarize_boundaries(result.results),
        "firstFailure": None if failure is None else failure.to_json(),
        "reproduce": None if failure is None else failure.reproduce,
        "baselines": [d.baseline.to_json() for d in result.discoveries],
        "cases": [r.to_json() for r in result.results],
    }


def _scenario_rows(result: LabResult) -> list[dict[str, Any]]:
    rows = []
    for discovery in result.discoveries:
        name = discovery.scenario.name
        mine = [r for r in result.results if r.case.scenario == name]
        everything = [discovery.baseline, *mine]
        rows.append(
            {
                "scenario": name,
                "title": discovery.scenario.title,
                "runs": len(mine),
                "boundaries": len({r.case.boundary for r in mine}),
                "effectsChecked": sum(
                    1 for r in mine for e in r.effects.values() if e.get("count") is not None
                ),
                "duplicateEffects": sum(r.duplicates for r in everything),
                "unknownOutcomes": sum(r.unknown for r in mine),
                "reviewItems": sum(len(r.reviews) for r in mine),
                "failed": sum(1 for r in everything if r.verdict == "fail"),
                "verdict": _verdict(everything),
            }
        )
    return rows


def _verdict(cases: Sequence[CaseResult]) -> str:
    if any(c.verdict == "fail" for c in cases):
        return "FAIL"
    if any(c.verdict == "review" for c in cases):
        return "REVIEW"
    return "PASS"


_STYLE = {"PASS": "green", "FAIL": "bold red", "REVIEW": "yellow"}


def _styled(verdict: str) -> str:
    style = _STYLE.get(verdict, "")
    return f"[{style}]{verdict}[/]" if style else verdict


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _table(title: str, columns: Sequence[tuple[str, str]], rows: list[list[str]]) -> Table:
    """A borderless table; ``kind`` is ``key`` (never wrapped), ``num`` (right-aligned,
    never shortened), ``text`` (takes the remaining width) or ``verdict``."""
    table = Table(
        title=title, title_justify="left", box=None, pad_edge=False, collapse_padding=True
    )
    for index, (header, kind) in enumerate(columns):
        widest = max((len(row[index]) for row in rows), default=0)
        widest = max(widest, *(len(word) for word in header.split()))
        if kind == "key":
            table.add_column(header, no_wrap=True, min_width=widest)
        elif kind == "num":
            table.add_column(header, justify="right", min_width=widest)
        elif kind == "text":
            table.add_column(header, ratio=1)
        else:
            table.add_column(header, no_wrap=True, min_width=6)
    for row in rows:
        table.add_row(
            *(_styled(cell) if columns[i][1] == "verdict" else cell for i, cell in enumerate(row))
        )
    return table


def render(result: LabResult, console: Console, *, verbose: bool = False) -> None:
    """The tables and the failure details (everything but the last line)."""
    scenario_rows = [
        [
            row["scenario"],
            row["title"],
            str(row["runs"]),
            str(row["boundaries"]),
            str(row["effectsChecked"]),
            str(row["duplicateEffects"]),
            str(row["unknownOutcomes"]),
            str(row["reviewItems"]),
            row["verdict"],
        ]
        for row in _scenario_rows(result)
    ]
    columns = [("scenario", "key"), ("what it does", "text")]
    columns += [(c, "num") for c in ("runs", "boundaries", "effects", "dupl.", "unknown")]
    columns += [("reviews", "num"), ("result", "verdict")]
    console.print(_table("scenarios", columns, scenario_rows))
    console.print()

    reasons: dict[str, list[str]] = {}
    boundary_rows = []
    for row in summarize_boundaries(result.results):
        low, high = row["factsAppendedMin"], row["factsAppendedMax"]
        facts = "-" if low is None else (str(low) if low == high else f"{low}–{high}")
        for reason, n in row["reviewReasons"].items():
            reasons.setdefault(reason, []).append(f"{row['boundary']} ×{n}")
        boundary_rows.append(
            [
                row["boundary"],
                str(row["runs"]),
                str(row["hits"]),
                f"{_ms(row['recoveryMedianMs'])}/{_ms(row['recoveryMaxMs'])}",
                facts,
                f"≤{row['maxEffects']}" if row["effectOps"] else "-",
                str(row["unknown"]),
                str(row["reviewCount"]),
                "FAIL" if row["failed"] else "PASS",
            ]
        )
    columns = [("boundary", "key"), ("runs", "num"), ("N", "num")]
    columns += [("recovery ms med/max", "num"), ("facts added", "num")]
    columns += [("effects per op id", "num"), ("unknown", "num"), ("reviews", "num")]
    columns += [("result", "verdict")]
    console.print(_table("boundaries", columns, boundary_rows))
    for reason, where in reasons.items():
        console.print(
            f"review reason: {reason} ({', '.join(where)})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    if verbose:
        console.print()
        run_rows = []
        for case in _everything(result):
            effects = ", ".join(
                f"{e['tool']} {_short(key, 14)}={e['count']} ({e['outcome']})"
                if e.get("count") is not None
                else f"{e['tool']} ({e['outcome']})"
                for key, e in case.effects.items()
            )
            for item in case.reconciled:
                effects += f"; reconciled {item['tool']}: {item['verdict']} → {item['action']}"
            run_rows.append(
                [
                    case.case.key if case.crashed else f"{case.case.scenario}:no crash",
                    case.resume_status or "-",
                    _ms(case.recovery_ms),
                    "-" if case.facts_appended is None else str(case.facts_appended),
                    effects or "-",
                    "; ".join(str(r.get("reason")) for r in case.reviews) or "-",
                    case.verdict.upper(),
                ]
            )
        columns = [("case", "key"), ("resume", "key"), ("recovery ms", "num")]
        columns += [("facts added", "num"), ("effects", "text"), ("reviews", "text")]
        columns += [("result", "verdict")]
        console.print(_table("runs", columns, run_rows))

    failures = result.failures
    if failures:
        first = failures[0]
        console.print()
        console.print(
            f"[bold red]counterexample[/]: {first.case.key} ({len(failures)} failing runs)"
        )
        for message in first.failures:
            console.print(f"  - {message}", markup=False, highlight=False, soft_wrap=True)
        if first.run_dir:
            console.print(f"  run folder: {first.run_dir}", markup=False, highlight=False)
        console.print(
            f"  reproduce:  {first.reproduce}", markup=False, highlight=False, soft_wrap=True
        )
        if first.child_command:
            console.print(
                f"  by hand:    {first.child_command}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        others = sorted({f.case.key for f in failures[1:]})
        if others:
            shown = ", ".join(others[:8]) + (" …" if len(others) > 8 else "")
            console.print(f"  also failing: {shown}", markup=False, highlight=False)
    elif result.verdict == "REVIEW":
        console.print()
        console.print(
            "[yellow]review[/]: no duplicate effect, but recovery could not establish the "
            "outcome of the tool in some runs (it has no lookup, or its lookup could not tell). "
            "Give the tool a lookup(operation_id) to make every crash recoverable.",
        )
