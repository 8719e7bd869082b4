"""The terminal view of a session timeline (``tether show SESSION``).

Operations in order, each with its steps, attempts and tool calls; gaps where the process
was down are printed where they happened (before the first fact after them). A long
session is summarised: the first and last :data:`EDGE` operations and every operation
with something to see (a crash, a retry, a failure, an abort, an unusual tool outcome, a
review) are shown; ``--all`` shows every one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rich.color import ColorSystem
from rich.console import Console
from rich.style import Style

from tether._text import printable
from tether.core.state import Usage
from tether.core.timeline import (
    Gap,
    OperationView,
    Timeline,
    ToolCallView,
    format_ms,
)
from tether.core.values import format_duration

__all__ = ["EDGE", "interesting", "render_timeline"]

EDGE = 10
"""Operations shown at each end of a summarised session."""


OUTCOME_STYLE = {
    "completed": "green",
    "success": "green",
    "passed": "green",
    "settled": "green",
    "failed": "red",
    "error": "red",
    "aborted": "yellow",
    "interrupted": "yellow",
    "truncated": "yellow",
    "superseded": "yellow",
    "unfinished": "magenta",
    "pending": "magenta",
    "open": "magenta",
}


def _clock(ms: int | None) -> str:
    if ms is None:
        return "?"
    return format_ms(ms)[11:23]


def _span(start: int | None, end: int | None) -> str:
    if start is None:
        return ""
    if end is None:
        return f"{_clock(start)} → (no end)"
    return f"{_clock(start)} → {_clock(end)} ({format_duration(end - start)})"


def _usage(usage: Usage) -> str:
    text = f"in {usage.input:,} out {usage.output:,}"
    if usage.cache_read or usage.cache_write:
        text += f" cache read {usage.cache_read:,} write {usage.cache_write:,}"
    return text


def interesting(op: OperationView, gap_ops: set[str]) -> bool:
    """Whether a summary must show this operation."""
    if op.outcome != "completed" or op.abort is not None or op.operation_id in gap_ops:
        return True
    for step in op.steps:
        if len(step.attempts) > 1 or any(a.outcome != "settled" for a in step.attempts):
            return True
        for call in step.tool_calls:
            if call.outcome not in ("success", "error") or call.reconciliations or call.reviews:
                return True
    return False


class _Lines:
    def __init__(self, gaps: Sequence[Gap]) -> None:
        self.lines: list[list[tuple[str, str]]] = []
        self.gaps = sorted(
            (g for g in gaps if g.before_seq is not None), key=lambda g: g.before_seq or 0
        )
        self.next_gap = 0

    def add(self, indent: int, *parts: tuple[str, str]) -> None:
        line = [("  " * indent, "")]
        line.extend((printable(text), style) for text, style in parts if text)
        self.lines.append(line)

    def gaps_until(self, seq: int | None, indent: int) -> None:
        """Print every gap that ends at or before fact ``seq``."""
        if seq is None:
            return
        while self.next_gap < len(self.gaps) and (self.gaps[self.next_gap].before_seq or 0) <= seq:
            self.gap(self.gaps[self.next_gap], indent)
            self.next_gap += 1

    def skip_gaps_until(self, seq: int) -> int:
        """Pass over the gaps that end at or before fact ``seq``; how many."""
        skipped = 0
        while self.next_gap < len(self.gaps) and (self.gaps[self.next_gap].before_seq or 0) <= seq:
            self.next_gap += 1
            skipped += 1
        return skipped

    def gap(self, gap: Gap, indent: int) -> None:
        label = {"crash": "✖ CRASH", "stop": "■ STOP", "queued": "⧖ QUEUED", "open": "… OPEN"}[
            gap.kind
        ]
        if gap.kind == "crash" and not gap.certain:
            label += " (inferred)"
        style = {
            "crash": "bold red",
            "stop": "bold blue",
            "queued": "bold cyan",
            "open": "bold magenta",
        }[gap.kind]
        self.add(
            indent,
            (f"{label} ", style),
            (f"{_span(gap.start_ms, gap.end_ms)}  after seq {gap.after_seq}: ", "dim"),
            (gap.evidence, ""),
        )
        if gap.recovery:
            self.add(indent + 1, ("recovery: ", "bold"), (gap.recovery, ""))


def _call(out: _Lines, call: ToolCallView, indent: int) -> None:
    out.gaps_until(call.start_seq, indent)
    head = f"tool #{call.index} {call.name} [{call.call_id}] "
    out.add(
        indent,
        (head, "bold"),
        (call.arguments or "(no arguments)", ""),
        (f"  replay {call.replay}" if call.replay else "  (never started)", "dim"),
    )
    auth = call.authorization
    if auth is not None:
        out.add(
            indent + 1,
            ("authorization: ", "dim"),
            (f"{auth.get('decision')} by {auth.get('who')} ({auth.get('rule')})", ""),
        )
    if call.started:
        out.add(
            indent + 1, ("started ", "dim"), (f"seq {call.start_seq} {_clock(call.start_ms)}", "")
        )
    if call.journal is not None:
        j = call.journal
        out.add(
            indent + 1,
            ("journal: ", "dim"),
            (
                f"{j.get('status')} {j.get('path')} before "
                f"{str(j.get('beforeHash') or '(absent)')[:19]} "
                f"after {str(j.get('afterHash') or '(absent)')[:19]}",
                "",
            ),
        )
    out.gaps_until(call.result_seq, indent + 1)
    check = call.verification
    if check is not None:
        state = "current" if check.current else "stale: the files changed since"
        out.add(
            indent + 1,
            ("verification: ", "dim"),
            (check.status, OUTCOME_STYLE.get(check.status, "")),
            (f" {check.command!r} on version {str(check.version_end)[:19]} ({state})", ""),
        )
    for decision in call.reconciliations:
        ev = decision.get("evidence") or {}
        lookup = ev.get("lookup") if isinstance(ev, dict) else None
        text = f"verdict {decision.get('verdict')}, action {decision.get('action')}"
        if isinstance(lookup, dict):
            text += f"; ledger lookup: {lookup.get('status')}"
        if call.recovered_from_ledger:
            text += "; recovered_from_ledger=true"
        out.add(indent + 1, ("reconciled: ", "bold cyan"), (text, ""))
    for item in call.reviews:
        text = f"item {item.get('id')} {item.get('status')}: {item.get('reason')}"
        if item.get("decision"):
            text += f" → {item.get('decision')}"
        out.add(indent + 1, ("review: ", "bold yellow"), (text, ""))
    style = OUTCOME_STYLE.get(call.outcome, "")
    if call.outcome == "pending":
        out.add(indent + 1, ("no result recorded", style))
    else:
        extra = " (recorded by recovery after a crash)" if call.recovered else ""
        if call.sandbox:
            extra += f" sandboxed ({call.sandbox})"
        out.add(
            indent + 1,
            ("result ", "dim"),
            (call.outcome, style),
            (f" seq {call.result_seq} {_span(call.start_ms, call.end_ms)}{extra}", "dim"),
        )
        if call.result:
            out.add(indent + 2, (call.result, "italic"))


def _operation(out: _Lines, op: OperationView) -> None:
    out.gaps_until(op.seq, 0)
    outcome = op.outcome + (f" ({op.completion})" if op.completion else "")
    out.add(
        0,
        (f"{op.kind} #{op.number} ", "bold"),
        (outcome, "bold " + OUTCOME_STYLE.get(op.outcome, "")),
        (f"  {_span(op.start_ms, op.end_ms)}", "dim"),
        (f"  {op.prompt!r}" if op.prompt else "", ""),
    )
    if op.error:
        out.add(1, ("error: ", "red"), (f"{op.error.get('code')}: {op.error.get('message')}", ""))
    for step in op.steps:
        for attempt in step.attempts:
            out.gaps_until(attempt.seq, 1)
            stop = f" {attempt.stop_reason}" if attempt.stop_reason else ""
            out.add(
                1,
                (f"step {step.number} attempt {attempt.attempt} ", ""),
                (attempt.outcome + stop, OUTCOME_STYLE.get(attempt.outcome, "")),
                (f"  {_span(attempt.start_ms, attempt.end_ms)}  {_usage(attempt.usage)}", "dim"),
            )
            if attempt.why:
                out.add(2, ("why: ", "dim"), (attempt.why, ""))
            if attempt.error:
                out.add(2, ("error: ", "red"), (str(attempt.error.get("message")), ""))
        for call in step.tool_calls:
            _call(out, call, 2)
    if op.abort is not None:
        phase = op.abort.get("phase")
        out.add(1, ("abort requested ", "yellow"), (f"phase {phase} seq {op.abort.get('seq')}", ""))
    out.add(1, ("usage ", "dim"), (_usage(op.usage), ""))


def _shown(timeline: Timeline, show_all: bool) -> Iterator[OperationView | int]:
    """The operations to print; an ``int`` stands for that many left out."""
    ops = timeline.operations
    if show_all or len(ops) <= 2 * EDGE:
        yield from ops
        return
    gap_ops = {g.operation_id for g in timeline.gaps if g.operation_id is not None}
    skipped = 0
    for position, op in enumerate(ops):
        if position < EDGE or position >= len(ops) - EDGE or interesting(op, gap_ops):
            if skipped:
                yield skipped
                skipped = 0
            yield op
        else:
            skipped += 1
    if skipped:
        yield skipped


def render_timeline(timeline: Timeline, console: Console, *, show_all: bool = False) -> None:
    """Print the timeline."""
    out = _Lines(timeline.gaps)
    out.add(
        0,
        ("Session ", "bold cyan"),
        (timeline.session_id, "bold"),
        (f"  {timeline.model} ({timeline.provider})  created {format_ms(timeline.created_ms)}", ""),
    )
    crashes = sum(1 for g in timeline.gaps if g.kind == "crash")
    out.add(
        1,
        (
            f"{timeline.facts:,} facts, {len(timeline.operations):,} operations, "
            f"{len(timeline.messages):,} messages, {crashes} crash(es); "
            f"{_span(timeline.start_ms, timeline.end_ms)}; now {timeline.current}",
            "dim",
        ),
    )
    if timeline.evidence_note:
        out.add(1, (timeline.evidence_note, "dim"))
    left_out = 0
    for item in _shown(timeline, show_all):
        if isinstance(item, int):
            left_out = item
            continue
        if left_out:
            stops = out.skip_gaps_until(item.seq - 1)
            text = f"… {left_out:,} operations not shown (nothing unusual"
            text += f", {stops:,} idle pauses" if stops else ""
            out.add(0, (text + "; --all shows them)", "dim"))
            left_out = 0
        _operation(out, item)
        out.skip_gaps_until(_last_seq(item))
    out.gaps_until(1 << 62, 0)
    for gap in timeline.gaps:
        if gap.before_seq is None:
            out.gap(gap, 0)
    if timeline.verifications:
        out.add(0, ("Verifications", "bold cyan"))
        for v in timeline.verifications:
            state = "current" if v.current else "stale (the files changed since)"
            out.add(
                1,
                (v.status, OUTCOME_STYLE.get(v.status, "")),
                (f" {v.command!r} at {_clock(v.start_ms)} ({format_duration(v.duration_ms)}) ", ""),
                (f"on version {str(v.version_end)[:19]}: {state}", "dim"),
            )
    out.add(0, ("Usage ", "bold cyan"), (_usage(timeline.usage), ""))
    write_lines(out.lines, console)


_COLOR_SYSTEMS = {
    "standard": ColorSystem.STANDARD,
    "256": ColorSystem.EIGHT_BIT,
    "truecolor": ColorSystem.TRUECOLOR,
    "windows": ColorSystem.WINDOWS,
}


def write_lines(lines: list[list[tuple[str, str]]], console: Console) -> None:
    """Write styled lines to the console's file: ANSI styles when it has colours, plain
    text otherwise. Never wrapped (a pipe gets whole lines); each style is parsed once.
    Rich's rendering pipeline is skipped: it costs tens of microseconds a line, and a
    10,000-turn session with ``--all`` has 80,000 of them."""
    system = _COLOR_SYSTEMS.get(console.color_system or "")
    styles: dict[str, Style] = {}
    chunks: list[str] = []
    for line in lines:
        parts = []
        for text, style in line:
            if system is None or not style:
                parts.append(text)
                continue
            parsed = styles.get(style)
            if parsed is None:
                parsed = styles[style] = Style.parse(style)
            parts.append(parsed.render(text, color_system=system))
        chunks.append("".join(parts).rstrip() + "\n")
    console.file.write("".join(chunks))
    console.file.flush()


def _last_seq(op: OperationView) -> int:
    seqs = [op.seq]
    for step in op.steps:
        seqs.extend(a.seq for a in step.attempts)
        for call in step.tool_calls:
            seqs.extend(s for s in (call.start_seq, call.result_seq) if s is not None)
    return max(seqs)
