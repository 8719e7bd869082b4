"""``tether inspect FILE``: reduce a session log and show what it means."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tether._cli.common import (
    InputError,
    SessionsDirOption,
    emit_json,
    handle_errors,
    one_line,
    printable,
    read_input,
    resolve_sessions_dir,
)
from tether._cli.session_pick import LastOption, newest_session
from tether._inputs import MAX_SESSION_FILE_BYTES
from tether._loading import reduce_session
from tether._stores.file import find_session, reduce_log_file
from tether.core import SessionCorruption, SessionState
from tether.core.contents import sandbox_of
from tether.core.state import (
    CompactionOperation,
    Message,
    RunOperation,
    Step,
    ToolCallState,
    ToolStatus,
)
from tether.core.values import format_ms
from tether.errors import ConfigurationError

RECENT_MESSAGES = 5
"""How many of the last transcript messages the human view shows."""

PREVIEW_WIDTH = 72
"""Maximum characters of one abbreviated message."""


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)


def inspect(
    file: Annotated[
        Path | None,
        typer.Argument(
            help="Session log (.jsonl) to reduce, or a session id or unique id prefix.",
            metavar="SESSION",
            show_default=False,
        ),
    ] = None,
    last: LastOption = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print {"ok": true, "state": …, "costUsd": …} or {"ok": false, "error": …} '
            "as JSON.",
        ),
    ] = False,
    sessions_dir: SessionsDirOption = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Read SESSION from a shared store (postgresql://…) instead of a file. "
            "Default: $TETHER_STORE_URL, else [store] url (not for a log's path or with "
            "--sessions-dir).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Reduce a session log and show its header, operation, transcript and usage.

    SESSION is a file, or the id (or a unique prefix) of a session in the sessions
    folder. Nothing is written: a torn tail is reported, not repaired.

    Examples:

        tether inspect --last

        tether inspect 01a2f3 --json

    Exit status: 0 the log reduces, 1 the log is corrupt, 2 usage error, 3 no such
    session, 7 ambiguous id prefix.
    """
    with handle_errors(str(file) if file is not None else "--last"):
        log_dir: Path | None = None
        from tether._cli.store_cmd import default_store, newest_store_session, read_store_log

        named_file = sessions_dir is not None or (file is not None and file.is_file())
        url = default_store(store, files_named=named_file)
        reduce: Callable[[bytes], SessionState] = reduce_session
        if url is not None:
            if (file is None) == (not last):
                raise ConfigurationError("give a session (its id) or --last, one of the two")
            data = read_store_log(url, newest_store_session(url) if last else str(file))
        else:
            path = session_file(file, last, sessions_dir)
            data = read_input(path, "session file", limit=MAX_SESSION_FILE_BYTES)
            log_dir = path.parent
            reduce = partial(reduce_log_file, path)  # from its checkpoint, if one matches
        if not json_output:
            render_state(reduce(data), file_size=len(data), console=Console(), log_dir=log_dir)
            return
        try:
            state = reduce(data)
        except SessionCorruption as exc:
            emit_json({"ok": False, "error": exc.to_json()})
            raise typer.Exit(exc.exit_code) from None
        # "ok" and "state" exactly as the spec's conformance fixtures have them (the state
        # keeps its six public members); the cost is tether's, so it stands beside them.
        cost = _session_cost(state, _side_records(state, log_dir))
        emit_json({"ok": True, "state": state.to_json(), "costUsd": cost.to_json()})


def session_file(file: Path | None, last: bool, sessions_dir: Path | None) -> Path:
    """The log a read-only command means: a file, an id or unique prefix, or ``--last``."""
    if file is None and not last:
        raise InputError("give a SESSION (a file, an id or a unique id prefix) or --last")
    if last:
        if file is not None:
            raise InputError("give a SESSION or --last, not both")
        folder = resolve_sessions_dir(sessions_dir)
        return find_session(folder, newest_session(folder))
    assert file is not None
    if not file.exists() and file.parent == Path("."):
        return find_session(resolve_sessions_dir(sessions_dir), str(file))
    return file


# --------------------------------------------------------------------------- rendering


# The CLI's name for the one time formatter, tether.core.values.format_ms (out-of-range
# times are "<ms> ms since the epoch" there too).
format_timestamp = format_ms


def abbreviate(text: str, width: int = PREVIEW_WIDTH) -> str:
    """One line of at most ``width`` characters."""
    flat = one_line(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def message_preview(message: Message) -> str:
    """A one-line summary of a normalized message."""
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        preview = abbreviate(f"[{message.get('tool_call_id')}] {content or '(empty)'}")
        sandbox = sandbox_of(content)  # the preview may not reach the last line
        return f"{preview} [sandboxed: {sandbox}]" if sandbox else preview
    text = content if isinstance(content, str) and content.strip() else ""
    calls = message.get("tool_calls") or []
    if calls:
        names = ", ".join(
            f"{call['function']['name']}({call['function']['arguments']})" for call in calls
        )
        text = f"{text} → {names}" if text else f"→ {names}"
    return abbreviate(text or "(no text)")


class _Report:
    """Aligned ``label  value`` lines; sections start with a bold heading."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, bool]] = []

    def section(self, title: str, value: str) -> None:
        if self.rows:
            self.rows.append(("", "", False))
        self.rows.append((title, printable(value), True))

    def row(self, label: str, value: object) -> None:
        self.rows.append(("  " + printable(label), printable(str(value)), False))

    def render(self, console: Console) -> None:
        width = max((len(label) for label, _, _ in self.rows), default=0) + 2
        for label, value, heading in self.rows:
            line = Text(label.ljust(width), style="bold cyan" if heading else "bold")
            line.append(value, style="bold" if heading else "")
            line.rstrip()
            console.print(line, soft_wrap=True, highlight=False)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _step_rows(report: _Report, step: Step) -> None:
    report.row("step", f"{step.step_id} ({step.step_kind.value})")
    report.row("attempt", f"{step.attempt} of 2, {step.status.value} ({step.attempt_id})")
    report.row("context", f"through entry {step.context_through_entry_id}")
    if step.stop_reason is not None:
        report.row("stop reason", step.stop_reason.value)
    if step.settled_entry_id is not None:
        report.row("settled by", f"entry {step.settled_entry_id}")
    report.row("configuration", step.configuration_digest)


def _tool_line(tool: ToolCallState) -> str:
    return (
        f"#{tool.tool_index} {tool.tool_name} [{tool.tool_call_id}] {tool.status.value}, "
        f"replay {tool.replay.value}, toolStarted {tool.tool_started_id}"
    )


def _side_records(state: SessionState, log_dir: Path | None) -> dict[str, Any]:
    """The reasoning side records next to the log (docs/models.md), by entry id."""
    if log_dir is None:
        return {}
    from tether._stores.reasoning import parse_side_record, side_record_name
    from tether._stores.sidecar import FileSidecar, sidecar_path

    out: dict[str, Any] = {}
    for entry_id, message in zip(state.transcript_ids, state.transcript, strict=False):
        if message.get("role") != "assistant":
            continue
        name = side_record_name(entry_id)
        data, _ = FileSidecar(sidecar_path(log_dir, state.header.id, name)).read()
        record = parse_side_record(data, entry_id) if data is not None else None
        if record is not None:
            out[entry_id] = record
    return out


def _session_cost(state: SessionState, sides: dict[str, Any]) -> Any:
    """The session's cost (:func:`tether._runtime.spend.log_cost`) with the workspace's
    ``[prices]``."""
    from tether._runtime.spend import log_cost, workspace_prices

    return log_cost(state, sides.get, workspace_prices())


def _retry_lines(state: SessionState, log_dir: Path | None) -> list[str]:
    """``retried after rate limit (2 s)`` for each automatic retry (docs/models.md)."""
    if log_dir is None:
        return []
    import json

    from tether._runtime.retry import REASONS, describe
    from tether._stores.sidecar import FileSidecar, sidecar_path

    data, _ = FileSidecar(sidecar_path(log_dir, state.header.id, "retry")).read()
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return []
    if not isinstance(record, dict):
        return []
    lines = [
        describe({**h, "reason": h.get("reason")})
        for h in record.get("history", [])
        if isinstance(h, dict)
    ]
    if record.get("exhausted"):
        reason = REASONS.get(str(record.get("reason")), str(record.get("reason")))
        lines.append(f"gave up after {reason}: retries used up")
    elif (
        not record.get("startedOperationId")
        and state.last_finished is not None
        and state.last_finished.operation_id == record.get("failedOperationId")
    ):
        lines.append(f"retry {record.get('retry')} pending (resume continues the schedule)")
    return lines


def last_outcome_text(kind: str, outcome: str, error: Mapping[str, str] | None) -> str:
    """``last run failed: rate_limited: slow down`` / ``last run completed``."""
    text = f"last {kind} {outcome}"
    if error is not None:
        text += f": {error.get('code', '?')}: {error.get('message', '')}"
    return one_line(text)


def render_state(
    state: SessionState, *, file_size: int, console: Console, log_dir: Path | None = None
) -> None:
    """Print the human view of a reduced session."""
    report = _Report()
    header = state.header
    report.section("Session", header.id)
    report.row("created", format_timestamp(header.created_at))
    report.row("cwd", header.cwd)
    report.row("provider", header.provider)
    report.row("model", header.model)
    report.row("environment", header.environment_identity)
    if log_dir is not None:
        from tether._stores.lineage import SIDECAR_NAME, read_lineage
        from tether._stores.sidecar import FileSidecar, sidecar_path

        lineage = read_lineage(FileSidecar(sidecar_path(log_dir, header.id, SIDECAR_NAME)))
        if lineage is not None:
            report.row("lineage", lineage if isinstance(lineage, str) else lineage.text())

    operation = state.operation
    if isinstance(operation, RunOperation):
        report.section("Operation", f"run {operation.operation_id}")
        report.row("input", f"entry {operation.input_entry_id}")
        if operation.step is None:
            report.row("step", "none yet (no model attempt recorded)")
        else:
            _step_rows(report, operation.step)
        pending = sum(1 for tool in operation.tool_calls if tool.status is ToolStatus.PENDING)
        report.row("tool calls", f"{len(operation.tool_calls)} started, {pending} without a result")
        for tool in operation.tool_calls:
            report.row("", _tool_line(tool))
        report.row("abort", "requested" if operation.abort_requested else "not requested")
    elif isinstance(operation, CompactionOperation):
        report.section("Operation", f"compaction {operation.operation_id}")
        report.row("input", f"through entry {operation.input_through_entry_id}")
        report.row("result", f"entry {operation.result_entry_id}")
        if operation.step is None:
            report.row("step", "none yet (no model attempt recorded)")
        else:
            _step_rows(report, operation.step)
        report.row("abort", "requested" if operation.abort_requested else "not requested")
    else:
        report.section("Operation", "idle (nothing in progress)")
    finished = state.last_finished
    if finished is not None:
        report.row("last", last_outcome_text(finished.kind, finished.outcome, finished.error))

    total = len(state.transcript)
    roles = Counter(str(message.get("role")) for message in state.transcript)
    by_role = ", ".join(f"{role} {roles[role]}" for role in ("user", "assistant", "tool"))
    report.section("Transcript", f"{_plural(total, 'message')} ({by_role})")
    report.row("active context", _plural(len(state.active_context), "message"))
    first = max(0, total - RECENT_MESSAGES)
    if first:
        report.row("…", f"{_plural(first, 'earlier message')} not shown")
    sides = _side_records(state, log_dir)
    ids = list(state.transcript_ids)
    for index in range(first, total):
        message = state.transcript[index]
        report.row(f"{index + 1}. {message.get('role')}", message_preview(message))
        side = sides.get(ids[index]) if index < len(ids) else None
        if side is not None and side.reasoning is not None and side.reasoning.text:
            report.row("   thinking", abbreviate(" ".join(side.reasoning.text.split())))

    usage = state.usage
    report.section(
        "Usage",
        f"input {usage.input}, output {usage.output}, "
        f"cache read {usage.cache_read}, cache write {usage.cache_write}",
    )
    for line in _retry_lines(state, log_dir):
        report.row("retry", line)
    tokens = [s.reasoning_tokens for s in sides.values() if s.reasoning_tokens is not None]
    costs = [s.cost for s in sides.values() if s.cost is not None]
    if tokens:
        report.row("reasoning tokens", f"{sum(tokens)} (included in output)")
    if costs:
        report.row("cost reported", f"{sum(costs):.6f}")
    report.row("cost", _session_cost(state, sides).text())

    torn = file_size - state.repaired_length
    log = f"{state.repaired_length} bytes committed"
    if torn > 0:
        log += f"; torn tail: {_plural(torn, 'byte')} would be cut on repair"
    else:
        log += ", no torn tail"
    report.section("Log", log)
    report.render(console)
