"""Replay a recorded session against a configuration: the first divergence (pure).

``tether replay`` re-drives a log with the current code and configuration and no side effect:
the model's answers and the tools' results are the log's own (they are outcomes of the
world, never asked for again); what is recomputed are tether's *decisions*, and each is
compared with the one the log recorded, in log order:

* **configuration**: the configuration snapshot of every ``stepAttempt`` against the current
  one (model, system prompt with ``AGENTS.md``, tool definitions, adapter, routing, output
  options), each distinct difference once, at the first attempt that shows it;
* **plan**: before every transaction that holds a decision of the runtime (a model attempt,
  a tool's start, a synthetic result, an aborted attempt's close, a completed finish), the
  recovery planner (:func:`tether.core.planner.plan_recovery`, the procedure the executor
  follows) on the state so far must plan that very action: the same step and boundary,
  the same call (tool name, index) with the same **arguments**, the same synthetic reason,
  the same finish;
* **gate**: the authorization policy (:func:`tether.core.policy.decide`, non-interactive,
  ``ask`` answered yes) for every started call, against what the log shows: a call the
  policy denied has its ``permission denied`` result in its ``toolStarted`` transaction, any
  other call ran. A person's denial is a person's, not the policy's: not compared.

What is not a decision is not compared: a prompt, an abort request, a compaction's start
(the user's), an answer, a model error, a tool's result, a run the shell stopped (budget,
error, Ctrl+C).

:func:`crash_points` is the crash lab on a recorded log: the planner at every prefix (every
place a process could have died) must never plan a blind re-run of a started effect (a
replay of a call not declared ``safe`` when started, a second start of a started call).

Pure (``tether.core`` rule): bytes and values in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from tether.core.configuration import snapshot_differences
from tether.core.current import CurrentConfiguration
from tether.core.framing import committed_lines
from tether.core.planner import plan_recovery
from tether.core.plans import StartStep, StartTool, ToolMode
from tether.core.policy import Decision, Policy, ToolKind, decide
from tether.core.reducer import Reducer
from tether.core.state import (
    IdleOperation,
    Replay,
    RunOperation,
    SessionState,
    _snapshot_from_json,
)

__all__ = [
    "CrashPoint",
    "Divergence",
    "ReplayReport",
    "crash_points",
    "replay_log",
]

POLICY_DENIAL: Final = "Error: permission denied: "
"""The start of the result of a call the policy denied (``tether._runtime.guards``)."""

PERSON_DENIAL: Final = "Error: permission denied by a person: "


@dataclass(frozen=True, slots=True)
class Divergence:
    """One decision the current configuration takes differently from the log."""

    line: int
    """The log line (1 is the header) whose transaction holds the recorded decision."""
    entry: str
    """The id of that transaction's first fact."""
    what: str
    """``configuration``, ``plan``, ``tool``, ``argument`` or ``gate``."""
    detail: str
    """What changed, in words."""

    def text(self) -> str:
        return f"diverges at line {self.line} (entry {self.entry}): {self.what}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "entry": self.entry, "what": self.what, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ReplayReport:
    lines: int
    decisions: int
    """How many recorded decisions were recomputed and compared."""
    divergences: tuple[Divergence, ...] = field(default=())

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.divergences,
            "lines": self.lines,
            "decisions": self.decisions,
            "divergences": [d.to_json() for d in self.divergences],
        }


_DECISION_WORDS: Final = re.compile(
    rb'"(?:stepAttempt|toolStarted|operationFinished|stepFailed|synthetic)"'
).search
"""A line holding a decision has one of these (its record's or result's type); a line
without any (a prompt, an answer, a tool's output: most of a log's bytes) is only reduced,
never parsed a second time. A word inside a text only costs a parse."""


_MALFORMED: Final = (ValueError, KeyError, TypeError, AttributeError, IndexError)
"""What looking at the facts of a line the reducer has not validated yet can raise: the
line is then fed to the reducer, which reports it as the format's error."""


def replay_log(
    data: bytes,
    current: CurrentConfiguration,
    snapshot: Mapping[str, Any],
    policy: Policy | None = None,
) -> ReplayReport:
    """Compare every recorded decision of ``data`` with the one ``current``, ``snapshot``
    (the current configuration snapshot, spec 10.2) and ``policy`` take (module
    docstring); raises :class:`~tether.errors.SessionCorruption` for a corrupt log."""
    replay = _Replay(current, snapshot, policy)
    # Every line goes through the reducer's strict parse, which accepts only UTF-8; the
    # file-wide check is the load's business when it reports an error (Reducer.load).
    lines, _end = committed_lines(data, check_utf8=False)
    reducer = Reducer.from_header_line(next(lines))
    for raw in lines:
        # A line that may hold a decision is looked at while the reducer is still before
        # it (the planner needs the state before the decision); any other line (a
        # prompt, an answer, a tool's output: most of a log's bytes) is only reduced.
        if _DECISION_WORDS(raw) is not None:
            try:
                value = orjson.loads(raw)
                replay.line(reducer, value if isinstance(value, list) else [value])
            except _MALFORMED:
                reducer.feed(raw)  # an invalid line: raises the format's error
                raise  # a valid line: a bug of this module, not the log's
        reducer.feed(raw)
    return ReplayReport(reducer.line_count, replay.decisions, tuple(replay.found))


class _Replay:
    """The comparisons of :func:`replay_log`, one transaction at a time."""

    def __init__(
        self, current: CurrentConfiguration, snapshot: Mapping[str, Any], policy: Policy | None
    ) -> None:
        self.current = current
        self.snapshot = snapshot
        self.policy = policy
        self.found: list[Divergence] = []
        self.seen: set[str] = set()
        self.decisions = 0

    def line(self, reducer: Reducer, facts: Sequence[Mapping[str, Any]]) -> None:
        current = self.current
        line = reducer.line_count + 1
        first = facts[0]
        for fact in facts:
            record = fact.get("record")
            if (
                record is not None
                and record["type"] == "stepAttempt"
                and record["configurationDigest"] != current.configuration_digest
            ):
                recorded = _snapshot_from_json(record["configurationSnapshot"])
                for change in snapshot_differences(recorded, self.snapshot):
                    if change not in self.seen:
                        self.seen.add(change)
                        self.found.append(
                            Divergence(line, str(fact["id"]), "configuration", change)
                        )
        record = first.get("record")
        fast = _SAME.get(record["type"]) if record is not None else None
        if fast is not None or _recorded_decision(first) is not None:
            # The state is taken only where a decision is compared (a snapshot per line
            # is most of the cost of a replay over a plain load).
            state = reducer.state
            if not isinstance(state.operation, IdleOperation):
                self.decisions += 1
                plan = plan_recovery(state, current)
                if fast is None or record is None or not fast(record, plan):
                    expected = _recorded_decision(first)
                    problem = _compare(expected, plan.to_json()) if expected else None
                    if problem is not None:
                        self.found.append(Divergence(line, str(first["id"]), *problem))
        if self.policy is not None:
            for fact in facts:
                record = fact.get("record")
                if record is not None and record["type"] == "toolStarted":
                    self.decisions += 1
                    verdict = _gate(record, facts, current, self.policy)
                    if verdict is not None:
                        self.found.append(Divergence(line, str(fact["id"]), "gate", verdict))


def _same_step(record: Mapping[str, Any], plan: object) -> bool:
    return (
        type(plan) is StartStep
        and plan.attempt == record["attempt"]
        and plan.context_through_entry_id == record["contextThroughEntryId"]
        and plan.step_kind.value == record["stepKind"]
        and (plan.step_id is None or plan.step_id == record["stepId"])
    )


def _same_tool(record: Mapping[str, Any], plan: object) -> bool:
    return (
        type(plan) is StartTool
        and plan.mode is ToolMode.START
        and plan.assistant_entry_id == record["assistantEntryId"]
        and plan.tool_index == record["toolIndex"]
        and plan.tool_name == record["toolName"]
        and plan.arguments == record["arguments"]
    )


_SAME: Final[Mapping[str, Callable[[Mapping[str, Any], object], bool]]] = {
    "stepAttempt": _same_step,
    "toolStarted": _same_tool,
}
"""The common decisions, compared on the typed plan (the JSON forms are built only for a
difference, to describe it)."""


def _recorded_decision(fact: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plan (spec 14.2 shape, the members that can be checked) the runtime carried out
    in the transaction that starts with ``fact``; ``None`` when that is no decision."""
    record = fact.get("record")
    if record is not None:
        kind = record["type"]
        if kind == "stepAttempt":
            out = {
                "type": "startStep",
                "stepKind": record["stepKind"],
                "attempt": record["attempt"],
                "contextThroughEntryId": record["contextThroughEntryId"],
            }
            if record["attempt"] == 2:
                out["stepId"] = record["stepId"]
            return out
        if kind == "toolStarted":
            return {
                "type": "startTool",
                "mode": "start",
                "assistantEntryId": record["assistantEntryId"],
                "toolIndex": record["toolIndex"],
                "toolName": record["toolName"],
                "arguments": record["arguments"],
            }
        if kind == "operationFinished" and record["outcome"] == "completed":
            out = {"type": "finish", "outcome": "completed"}
            for name in ("completion", "finalEntryId"):
                if name in record:
                    out[name] = record[name]
            return out
        if kind == "stepFailed" and record["error"].get("code") == "aborted":
            return {"type": "closeAttempt"}
        return None
    body = fact.get("entry")
    if body is None or body.get("type") != "message":
        return None
    result = body.get("result")
    if body["message"]["role"] == "tool" and result is not None:
        if result.get("type") == "synthetic":
            return {
                "type": "appendSynthetic",
                "toolName": body.get("toolName"),
                "reason": result.get("reason"),
            }
    return None


def _compare(expected: Mapping[str, Any], planned: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(what, detail)`` when the plan is not the recorded decision."""
    if expected["type"] == "appendSynthetic":
        if planned["type"] != "appendSynthetic":
            return "plan", (
                f"the log appended a {expected['reason']!r} result for "
                f"{expected['toolName']!r}; now: {_describe(planned)}"
            )
        item = planned["results"][0]
        if item["reason"] != expected["reason"]:
            return "plan", (
                f"the log answered {expected['toolName']!r} with {expected['reason']!r}; "
                f"now {item['reason']!r}"
            )
        return None
    if expected["type"] == "startTool":
        return _compare_tool(expected, planned)
    if expected["type"] == "finish" and planned["type"] == "finish":
        extra = {k: planned.get(k) for k in expected}
        if extra == dict(expected):
            return None
    elif all(planned.get(k) == v for k, v in expected.items()):
        return None
    return "plan", f"the log did {_describe(expected)}; now: {_describe(planned)}"


def _compare_tool(
    expected: Mapping[str, Any], planned: Mapping[str, Any]
) -> tuple[str, str] | None:
    name = expected["toolName"]
    if planned["type"] == "appendSynthetic" and planned["results"][0]["reason"] == "unknownTool":
        return "tool", (
            f"the log called tool {name!r}, which is no tool now (renamed or removed); "
            "the call would be answered 'unknownTool'"
        )
    if planned["type"] != "startTool" or planned.get("mode") != "start":
        return "plan", f"the log started tool {name!r}; now: {_describe(planned)}"
    if planned["toolName"] != name or planned["toolIndex"] != expected["toolIndex"]:
        return "tool", (
            f"the log started {name!r} (call #{expected['toolIndex']}); now "
            f"{planned['toolName']!r} (call #{planned['toolIndex']})"
        )
    if planned["arguments"] != expected["arguments"]:
        changed = sorted(
            k
            for k in set(planned["arguments"]) | set(expected["arguments"])
            if planned["arguments"].get(k) != expected["arguments"].get(k)
        )
        return "argument", f"tool {name!r}: arguments differ in {', '.join(changed)}"
    return None


def _describe(plan: Mapping[str, Any]) -> str:
    kind = plan["type"]
    if kind == "startStep":
        return f"model attempt {plan.get('attempt')} at {plan.get('contextThroughEntryId')}"
    if kind == "startTool":
        return f"{plan.get('mode')} tool {plan.get('toolName')!r}"
    if kind == "appendSynthetic":
        reasons = plan.get("results") or [plan]
        return "synthetic " + ", ".join(f"{r.get('reason')!r}" for r in reasons)
    if kind == "finish":
        return f"finish {plan.get('outcome')}" + (
            f"/{plan['completion']}" if plan.get("completion") else ""
        )
    if kind == "blocked":
        return f"blocked ({plan.get('reason')})"
    return str(kind)


def _gate(
    record: Mapping[str, Any],
    facts: Sequence[Mapping[str, Any]],
    current: CurrentConfiguration,
    policy: Policy,
) -> str | None:
    """The policy's verdict on a started call against what the log shows (``None``: same)."""
    result = next(
        (
            f["entry"]
            for f in facts
            if f.get("entry") is not None and f["id"] == record["resultEntryId"]
        ),
        None,
    )
    content = result["message"]["content"] if result is not None else None
    if isinstance(content, str) and content.startswith(PERSON_DENIAL):
        return None  # a person's decision, not the policy's
    denied = isinstance(content, str) and content.startswith(POLICY_DENIAL)
    name = record["toolName"]
    declared = current.declaration(name)
    replay = declared.replay if declared is not None else Replay(record["replay"])
    kind = ToolKind.READ_ONLY if replay is Replay.SAFE else ToolKind.SIDE_EFFECT
    verdict = decide(
        policy, name, record["arguments"], kind=kind, interactive=False, assume_yes=True
    )
    now_denied = verdict.decision is Decision.DENY
    if denied and not now_denied:
        return f"the call of {name!r} was denied; now allowed by {verdict.rule}"
    if now_denied and not denied:
        why = f" ({verdict.reason})" if verdict.reason else ""
        return f"the call of {name!r} ran; now denied by {verdict.rule}{why}"
    return None


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """The planner's answer at one prefix (a crash after ``line``) that re-runs an effect."""

    line: int
    plan: Mapping[str, Any]
    problem: str

    def text(self) -> str:
        return f"crash after line {self.line}: {self.problem}"


def crash_points(
    data: bytes, current: CurrentConfiguration, only: int | None = None
) -> tuple[int, list[Mapping[str, Any]], list[CrashPoint]]:
    """The planner at every prefix of ``data`` (or only after line ``only``): how many
    prefixes, the plans (for ``only``), and every blind re-run of a started effect."""
    lines, _end = committed_lines(data)
    reducer = Reducer.from_header_line(next(lines))
    checked = 0
    plans: list[Mapping[str, Any]] = []
    bad: list[CrashPoint] = []

    def check() -> None:
        nonlocal checked
        line = reducer.line_count
        if only is not None and line != only:
            return
        checked += 1
        state = reducer.state
        plan = plan_recovery(state, current)
        if only is not None:
            plans.append(plan.to_json())
        problem = _blind(plan, state)
        if problem is not None:
            bad.append(CrashPoint(line, plan.to_json(), problem))

    check()
    for raw in lines:
        reducer.feed(raw)
        check()
    return checked, plans, bad


def _blind(plan: object, state: SessionState) -> str | None:
    """Why ``plan`` would run a started effect again without knowing its outcome."""
    if not isinstance(plan, StartTool):
        return None
    operation = state.operation
    if not isinstance(operation, RunOperation):
        return None
    started = [
        call
        for call in operation.tool_calls
        if call.assistant_entry_id == plan.assistant_entry_id and call.tool_index == plan.tool_index
    ]
    if plan.mode is ToolMode.START and started:
        first = started[0].tool_started_id
        return f"plans a second start of {plan.tool_name!r} (started as {first})"
    if plan.mode is ToolMode.REPLAY and any(call.replay is not Replay.SAFE for call in started):
        return f"plans a replay of {plan.tool_name!r}, which was not declared safe to replay"
    return None
