"""``tether lab publish-report``: the crash lab one step at a time, for teaching and by hand.

The lab runs a real agent (scripted model, no API key) whose one tool call publishes a
report to the reference ledger (:mod:`tether.testing.ledger`), then answers. Its
state lives under ``.tether/lab/`` of the current directory::

    .tether/lab/lab.json       what the lab did (crash boundary, recoveries run)
    .tether/lab/script.json    the scripted model
    .tether/lab/workspace/     the agent's workspace: .tether/sessions/ (the session log),
                               .tether/ledger.db (the ledger), .tether/effects.db

1. ``--reset --crash-at BOUNDARY`` starts the run and crashes at ``before_effect`` (the
   intent is durable, nothing published), ``after_effect`` (published, the result not
   recorded) or ``after_result`` (the result is durable): ``INJECTED_CRASH boundary=NAME``
   on stderr, exit status 75.
2. A plain run recovers: the executor looks the pending call up in the ledger and fills in
   the result (``recovered_from_ledger=true``), or publishes once when it never happened,
   then finishes the run. Running it again finds nothing to do and changes nothing.
3. ``--report`` prints the timeline — planned, effect committed, result persisted,
   verified — and ``PASS duplicate_effects=0`` (or ``FAIL …``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tether import _faults as faults
from tether._runtime import events
from tether.errors import SessionCorruption
from tether.testing.crashlab.child import LogFacts, session_log_path

__all__ = [
    "CRASH_BOUNDARIES",
    "LAB_DIR",
    "LabReport",
    "lab_report",
    "recover",
    "reset",
    "start",
]

LAB_DIR: Final = Path(".tether") / "lab"
CRASH_BOUNDARIES: Final = ("before_effect", "after_effect", "after_result")
CALL_ID: Final = "call_publish"
TOOL: Final = "publish_report"
TITLE: Final = "Quarterly numbers"
SCRIPT: Final = {
    "model": "scripted/lab",
    "responses": [
        {
            "content": "Publishing the report.",
            "tool_calls": [
                {
                    "id": CALL_ID,
                    "name": TOOL,
                    "arguments": {"title": TITLE, "body": "Revenue up, duplicates zero."},
                }
            ],
            "usage": {"input": 60, "output": 12},
        },
        {"content": "Published.", "finish_reason": "stop", "usage": {"input": 90, "output": 2}},
    ],
}

Echo = Callable[[str], None]


class LabStateError(Exception):
    """The lab's state does not allow what was asked (no run yet, a run already exists)."""


@dataclass(frozen=True)
class _Paths:
    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def script(self) -> Path:
        return self.root / "script.json"

    @property
    def meta(self) -> Path:
        return self.root / "lab.json"

    @property
    def ledger(self) -> Path:
        return self.workspace / ".tether" / "ledger.db"

    @property
    def effects(self) -> Path:
        return self.workspace / ".tether" / "effects.db"


def _paths(root: Path | None) -> _Paths:
    return _Paths((root if root is not None else Path.cwd() / LAB_DIR).absolute())


def _meta(paths: _Paths) -> dict[str, Any]:
    try:
        value = json.loads(paths.meta.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _save_meta(paths: _Paths, meta: dict[str, Any]) -> None:
    paths.meta.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def reset(root: Path | None = None) -> Path:
    """Remove the lab's state; returns the lab folder."""
    paths = _paths(root)
    if paths.root.exists():
        shutil.rmtree(paths.root)
    return paths.root


def _agent(paths: _Paths, echo: Echo) -> Any:
    from tether._runtime import Agent
    from tether.testing.ledger import PublishReportTool
    from tether.testing.scripted import ScriptedModel

    return Agent(
        ScriptedModel.from_file(paths.script),
        [PublishReportTool.for_workspace(paths.workspace)],
        workspace=paths.workspace,
        read_agents_md=False,
        on_event=_narrator(echo),
    )


def _narrator(echo: Echo) -> Callable[[events.Event], None]:
    def narrate(event: events.Event) -> None:
        if isinstance(event, events.ToolReconciled):
            flag = "true" if event.recovered_from_ledger else "false"
            echo(
                f"reconciled {event.name} ({event.call_id}): verdict={event.verdict} "
                f"action={event.action} recovered_from_ledger={flag}"
            )
        elif isinstance(event, events.ToolStarted):
            how = "executing once more with the same operation id" if event.replay else "executing"
            echo(f"{how}: {event.name} ({event.call_id})")
        elif isinstance(event, events.ToolFinished):
            echo(f"result persisted: {event.name} ({event.call_id})")
        elif isinstance(event, events.ToolSkipped):
            echo(f"no result for {event.name} ({event.call_id}): {event.reason}")
        elif isinstance(event, events.Blocked):
            echo(f"blocked ({event.reason}): {event.detail}")

    return narrate


def _session_id(paths: _Paths) -> str | None:
    log = session_log_path(paths.workspace)
    if log is None:
        return None
    return log.name[: -len(".jsonl")].split("_", 1)[1]


def start(crash_at: str | None, echo: Echo, root: Path | None = None) -> str:
    """Start the lab run, crashing at ``crash_at`` (``exit`` mode: this process ends with
    status 75). Returns the run's final status when no crash was asked for."""
    if crash_at is not None and crash_at not in CRASH_BOUNDARIES:
        raise ValueError(f"--crash-at must be one of {', '.join(CRASH_BOUNDARIES)}")
    paths = _paths(root)
    if _session_id(paths) is not None:
        raise LabStateError(f"the lab already has a run in {paths.root}; add --reset to start over")
    paths.workspace.mkdir(parents=True, exist_ok=True)
    paths.script.write_text(json.dumps(SCRIPT, indent=1) + "\n")
    _save_meta(paths, {"crashAt": crash_at, "recoveries": 0})
    agent = _agent(paths, echo)
    if crash_at is not None:
        echo(f"lab: publishing a report; crash armed at {crash_at} (state in {paths.root})")
        faults.configure(crash_at, "exit")
    else:
        echo(f"lab: publishing a report, no crash (state in {paths.root})")
    try:
        result = agent.run("Publish the quarterly report.")
    finally:
        faults.configure(None)
        agent.close()
    echo(f"run {result.status.value}: {result.text or result.message or ''}".rstrip(": "))
    return str(result.status.value)


def recover(echo: Echo, root: Path | None = None) -> str:
    """Recover the lab run (or start it when there is none). Returns the final status."""
    paths = _paths(root)
    session = _session_id(paths)
    if session is None:
        return start(None, echo, root)
    from tether._stores.file import SessionStore

    state = SessionStore.open_read_only(session, workspace=paths.workspace).state
    if state.operation.kind == "idle":
        echo(
            "nothing to recover: the run already finished; the log, the ledger and the "
            "effects are unchanged"
        )
        return "idle"
    meta = _meta(paths)
    meta["recoveries"] = int(meta.get("recoveries", 0)) + 1
    _save_meta(paths, meta)
    crashed = meta.get("crashAt")
    echo(f"lab: recovering session {session}" + (f" (it crashed at {crashed})" if crashed else ""))
    lines: list[str] = []

    def tee(line: str) -> None:
        lines.append(line)
        echo(line)

    agent = _agent(paths, tee)
    try:
        result = agent.resume(session)
    finally:
        agent.close()
    if not lines:
        echo(f"the {TOOL} result was already persisted: nothing to reconcile")
    echo(f"run {result.status.value}: {result.text or result.message or ''}".rstrip(": "))
    return str(result.status.value)


# =========================================================================== the report


@dataclass
class LabReport:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    duplicates: int = 0

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        if self.passed:
            return "PASS duplicate_effects=0"
        return f"FAIL duplicate_effects={self.duplicates} {self.problems[0]}"


def _time(ms: int | None) -> str:
    from tether._wsdb.sqlite import format_ms

    return format_ms(ms) or "-"


def lab_report(root: Path | None = None) -> LabReport:
    """The timeline of the lab run and its verdict (reads only)."""
    paths = _paths(root)
    session = _session_id(paths)
    if session is None:
        raise LabStateError(
            f"no lab run in {paths.root}: start one with "
            "`tether lab publish-report --reset --crash-at after_effect`"
        )
    from tether._effects.review import ReviewStore
    from tether._loading import reduce_session
    from tether._wsdb.sqlite import EffectsDB
    from tether.testing.ledger import ReportLedger

    report = LabReport()
    log = session_log_path(paths.workspace)
    assert log is not None
    facts = LogFacts(log.read_bytes())
    try:
        state = reduce_session(facts.complete)
    except SessionCorruption as exc:
        report.problems.append(f"the session log does not reduce: {exc}")
        state = None
    publications = []
    if paths.ledger.exists():
        ledger = ReportLedger(paths.ledger)
        try:
            publications = ledger.publications()
        finally:
            ledger.close()
    reconciliations = []
    if paths.effects.exists():
        with EffectsDB.open_workspace(paths.workspace) as db:
            reconciliations = ReviewStore(db).reconciliations(session_id=session)

    meta = _meta(paths)
    out = report.lines
    out.append(f"lab state: {paths.root}")
    out.append(f"session:   {session}")
    crash = meta.get("crashAt")
    out.append(
        f"crash:     {crash + ' (injected)' if crash else 'none'}; "
        f"recoveries run: {int(meta.get('recoveries', 0))}"
    )
    out.append("")

    started = [f for f in facts.facts if _record(f).get("type") == "toolStarted"]
    ops = [str(f["id"]) for f in started if _record(f).get("toolCallId") == CALL_ID]
    op = ops[0] if ops else None
    results = [
        f
        for f in facts.facts
        if _entry(f).get("type") == "message"
        and (_entry(f).get("message") or {}).get("tool_call_id") == CALL_ID
    ]
    mine = [p for p in publications if p.operation_id in ops]
    others = [p for p in publications if p.operation_id not in ops]
    events_shown = 0

    def event(name: str, when: str, detail: str) -> None:
        nonlocal events_shown
        events_shown += 1
        out.append(f"  {events_shown}. {name:<17} {when:<24} {detail}")

    out.append("timeline:")
    if op is None:
        report.problems.append("the publish_report call was never planned (no toolStarted)")
    else:
        first = started[[str(f["id"]) for f in started].index(op)]
        event(
            "planned",
            _time(int(first["timestamp"])),
            f"toolStarted seq {first['seq']}, operation {op}",
        )
    for publication in mine:
        event(
            "effect committed",
            _time(publication.published_at_ms),
            f"ledger row, receipt {publication.receipt}",
        )
    decisions = [r for r in reconciliations if op is not None and r.operation_id == op]
    from_ledger = any(bool(r.evidence.get("recoveredFromLedger")) for r in decisions)
    executed_again = any(r.action == "execute" for r in decisions)
    for entry in results:
        body = _entry(entry)
        kind = (body.get("result") or {}).get("type")
        how = ""
        if from_ledger:
            how = ", recovered_from_ledger=true"
        elif executed_again:
            how = "; executed once during recovery: the ledger had no record of it"
        event(
            "result persisted",
            _time(int(entry["timestamp"])),
            f"result entry seq {entry['seq']} ({kind}{how})",
        )

    # ---- verification
    if len(mine) > 1:
        report.duplicates += len(mine) - 1
        report.problems.append(f"{len(mine)} ledger rows for operation {op}")
    if others:
        report.duplicates += len(others)
        report.problems.append(f"{len(others)} ledger rows for operations nobody started")
    if op is not None and not mine and results:
        kind = (_entry(results[0]).get("result") or {}).get("type")
        if kind == "success":
            report.problems.append("the result says published but the ledger has no row")
    if len(results) > 1:
        report.problems.append(f"the call has {len(results)} results")
    if not results:
        report.problems.append("no result persisted yet: recover with `tether lab publish-report`")
    elif mine:
        content = str((_entry(results[0]).get("message") or {}).get("content", ""))
        if mine[0].receipt not in content:
            report.problems.append("the persisted result does not carry the ledger's receipt")
    if state is not None and state.operation.kind != "idle":
        report.problems.append(
            f"the run is not finished ({state.operation.kind} in progress): recover with "
            "`tether lab publish-report`"
        )
    if report.passed:
        event(
            "verified",
            "(this report)",
            f"1 ledger row for the operation, 1 result, run finished; facts={facts.last_seq}",
        )
    out.append("")
    out.append(
        f"state: facts={facts.last_seq} ledger_rows={len(publications)} "
        f"results={len(results)} reconciliations={len(decisions)}"
    )
    for problem in report.problems:
        out.append(f"problem: {problem}")
    return report


def _record(fact: dict[str, Any]) -> dict[str, Any]:
    value = fact.get("record") if fact.get("kind") == "record" else None
    return value if isinstance(value, dict) else {}


def _entry(fact: dict[str, Any]) -> dict[str, Any]:
    value = fact.get("entry") if fact.get("kind") == "entry" else None
    return value if isinstance(value, dict) else {}
