"""``tether plan SESSION [--current CURRENT.json]``: the next recovery action of a session.

Without ``--current`` the current configuration is computed as ``tether resume`` would
build it: the model, endpoint and options the session was run with (or the flags given),
the tools and ``tether.toml`` of the workspace, the environment identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from tether._cli.agent_flags import Flags, agent_command, cli_settings
from tether._cli.common import (
    InputError,
    emit_json,
    handle_errors,
    load_json_object,
    one_line,
    read_input,
)
from tether._cli.inspect_cmd import session_file
from tether._cli.session_pick import LastOption, SessionArgument, agent_sessions_dir, with_recorded
from tether._inputs import MAX_CURRENT_BYTES, MAX_SESSION_FILE_BYTES
from tether._loading import reduce_session
from tether.core import CurrentConfiguration, SessionState, plan_recovery
from tether.core.state import CompactionOperation, RunOperation
from tether.errors import ConfigurationError

BLOCKED_ADVICE = {
    "configuration_changed": "restore the configuration or abort",
    "environment_changed": "run in the original environment or abort",
    "replay_declaration_changed": "restore the tool's replay declaration or abort",
    "attempts_exhausted": "both attempts of the step were interrupted; abort the operation",
}


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


@agent_command
def plan(
    file: SessionArgument = None,
    last: LastOption = False,
    current: Annotated[
        Path | None,
        typer.Option(
            "--current",
            "-c",
            help="JSON file with the runtime's current configuration "
            "({configurationDigest, environmentIdentity, tools}) instead of computing it.",
            metavar="CURRENT.json",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the plan as JSON (spec 14.2).")
    ] = False,
    *,
    flags: Flags,
) -> None:
    """Show the single next recovery action for a session (pure: nothing is written).

    The current configuration is the one `tether resume SESSION` would use
    (the session's recorded model and options unless flags are given);
    --current FILE overrides it.

    Examples:

        tether plan --last

        tether plan 01a2f3 --json

    Exit status: 0 a plan was computed, 1 the log is corrupt, 2 usage error
    (including a FILE or CURRENT.json that is unreadable, not a regular file, too large,
    nested too deeply or malformed, or no model known for the session).
    """
    with handle_errors(str(file) if file is not None else "--last"):
        folder = agent_sessions_dir(flags.get("sessions_dir"), flags.get("workspace"))
        path = session_file(file, last, folder)
        data = read_input(path, "session file", limit=MAX_SESSION_FILE_BYTES)
        state = reduce_session(data)
        if current is not None:
            configuration = load_current(current)
        else:
            configuration = current_configuration(flags, str(path))
        result = plan_recovery(state, configuration).to_json()
        if json_output:
            emit_json(result)
        else:
            typer.echo(one_line(describe_plan(result, state)))


def current_configuration(flags: Flags, session: str) -> CurrentConfiguration:
    """The configuration ``tether resume SESSION`` would resume with, given ``flags``."""
    from tether._cli.agent_flags import quiet_agent
    from tether._project import find_workspace_root, load_project_config

    project = load_project_config(find_workspace_root(flags.get("workspace")).path)
    agent = quiet_agent(cli_settings(with_recorded(flags, session, project), project=project))
    try:
        return agent.configuration.current
    finally:
        agent.close()


def load_current(path: Path) -> CurrentConfiguration:
    """Parse CURRENT.json into a :class:`CurrentConfiguration` (exit 2 on any problem)."""
    raw = load_json_object(path, "current configuration", limit=MAX_CURRENT_BYTES)
    try:
        return CurrentConfiguration.from_json(raw)
    except ConfigurationError as exc:
        raise InputError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        raise InputError(f"invalid current configuration {path}: {detail}") from None


# --------------------------------------------------------------------------- wording


def _operation_name(state: SessionState) -> str:
    operation = state.operation
    if isinstance(operation, RunOperation):
        return "run"
    if isinstance(operation, CompactionOperation):
        return "compaction"
    return "operation"


def _step_id(state: SessionState) -> str | None:
    operation = state.operation
    if isinstance(operation, (RunOperation, CompactionOperation)) and operation.step is not None:
        return operation.step.step_id
    return None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('code')}: {error.get('message')}"
    return str(error)


def describe_plan(plan: dict[str, Any], state: SessionState) -> str:
    """One sentence saying what a writer would do next (spec 14.2/15.3)."""
    kind = plan.get("type")
    op = _operation_name(state)
    if kind == "finish":
        outcome = plan.get("outcome")
        final = plan.get("finalEntryId")
        if outcome == "completed" and final is None:
            return "nothing to do: no operation is in progress"
        if outcome == "completed":
            completion = plan.get("completion")
            how = f" ({completion})" if completion else ""
            return f"finish the {op} as completed{how} with final entry {final}"
        if outcome == "failed":
            return f"finish the {op} as failed ({_error_text(plan.get('error'))})"
        if outcome == "aborted":
            return f"finish the {op} as aborted"
        return f"finish the {op} as {outcome}"
    if kind == "startStep":
        call = "compaction call" if plan.get("stepKind") == "compaction" else "model call"
        context = plan.get("contextThroughEntryId")
        if plan.get("attempt") == 2:
            return f"retry the {call}: attempt 2 of step {plan.get('stepId')} at context {context}"
        return f"start the {call}: attempt 1 of a new step at context {context}"
    if kind == "startTool":
        tool = f"#{plan.get('toolIndex')} {plan.get('toolName')}"
        source = f"of assistant entry {plan.get('assistantEntryId')}"
        arguments = orjson.dumps(plan.get("arguments"), default=str).decode()
        if plan.get("mode") == "replay":
            return (
                f"replay tool call {tool} {source} (toolStarted {plan.get('toolStartedId')}) "
                f"with its persisted arguments {arguments}"
            )
        return f"start tool call {tool} {source}: record toolStarted, then execute with {arguments}"
    if kind == "appendSynthetic":
        results = plan.get("results") or []
        items = "; ".join(
            f"#{item.get('toolIndex')} {item.get('toolName')} "
            f"[{item.get('toolCallId')}]: {item.get('reason')}"
            for item in results
        )
        noun = "result" if len(results) == 1 else "results"
        return f"append {len(results)} synthetic tool {noun}: {items}"
    if kind == "closeAttempt":
        step = _step_id(state)
        which = f" of step {step}" if step else ""
        return f"close the open attempt{which} as failed ({_error_text(plan.get('error'))})"
    if kind == "blocked":
        reason = str(plan.get("reason"))
        advice = BLOCKED_ADVICE.get(reason, "restore the previous conditions or abort")
        return f"blocked: {reason} — {advice}"
    return f"plan: {plan}"
