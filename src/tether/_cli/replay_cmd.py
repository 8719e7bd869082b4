"""``tether replay SESSION [--against CONFIG] [--crash-points | --crash-at LINE]``.

Re-drives a recorded session with the current code and configuration, with no side effect:
the model's answers and the tools' results are read from the log, nothing is sent and no
tool runs; tether's decisions (the planner's plans, the tool calls and their arguments, the
authorization policy's verdicts, the configuration digest) are recomputed and compared with
the log (:mod:`tether.core.replay`). The configuration is the one ``tether resume SESSION``
would use (the settings the session was run with, the workspace's ``tether.toml``,
``AGENTS.md`` and tools), or the one of ``--against`` (a ``tether.toml`` or a workspace).
docs/replay.md has the details.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from tether._cli.agent_flags import Flags, agent_command, cli_settings, quiet_agent
from tether._cli.common import InputError, emit_json, handle_errors, read_input
from tether._cli.inspect_cmd import session_file
from tether._cli.session_pick import LastOption, SessionArgument, agent_sessions_dir, with_recorded
from tether._inputs import MAX_SESSION_FILE_BYTES
from tether.core.current import CurrentConfiguration
from tether.core.policy import Policy
from tether.core.replay import crash_points, replay_log
from tether.errors import EXIT_FAILED

EXIT_DIVERGED = EXIT_FAILED
"""A divergence (or a blind re-run at a crash point): the run-failed status."""


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


@dataclass(frozen=True)
class ReplayConfiguration:
    """What a replay compares the log with (built without sending or running anything)."""

    current: CurrentConfiguration
    snapshot: Mapping[str, Any]
    policy: Policy


@agent_command
def replay(
    file: SessionArgument = None,
    last: LastOption = False,
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="Compare with this tether.toml (its folder is the workspace: AGENTS.md, "
            "tools) or workspace folder instead of the current configuration.",
            metavar="CONFIG",
            show_default=False,
        ),
    ] = None,
    crash_all: Annotated[
        bool,
        typer.Option(
            "--crash-points",
            help="Instead: plan recovery at every prefix of the log (a crash after every "
            "line) and check that no plan re-runs a started effect blindly.",
        ),
    ] = False,
    crash_at: Annotated[
        int | None,
        typer.Option(
            "--crash-at",
            help="Like --crash-points, at one boundary: a crash after log line LINE.",
            metavar="LINE",
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    *,
    flags: Flags,
) -> None:
    """Replay a recorded session with zero side effects and report the first divergence.

    Model answers and tool results come from the log; nothing is sent and nothing is
    executed. Tether's own decisions are recomputed and compared: the plans, the tool
    calls and their arguments, the policy's verdicts, and the configuration (system
    prompt with AGENTS.md, tool definitions, model settings).

    Examples:

        tether replay --last

        tether replay 01a2f3 --against ../new/tether.toml

        tether replay 01a2f3 --crash-points

    Exit status: 0 no divergence, 1 a divergence, a blind re-run at a crash point or a
    corrupt log (the message says which), 2 usage error, 3 no such session.
    """
    with handle_errors(str(file) if file is not None else "--last"):
        if crash_all and crash_at is not None:
            raise InputError("give --crash-points or --crash-at, not both")
        folder = agent_sessions_dir(flags.get("sessions_dir"), flags.get("workspace"))
        path = session_file(file, last, folder)
        data = read_input(path, "session file", limit=MAX_SESSION_FILE_BYTES)
        configuration = replay_configuration(flags, str(path), against)
        if crash_all or crash_at is not None:
            _crash_report(data, configuration.current, crash_at, json_output)
            return
        report = replay_log(
            data, configuration.current, configuration.snapshot, configuration.policy
        )
        if json_output:
            emit_json(report.to_json())
        elif report.first is None:
            typer.echo(
                f"replayed {report.lines} lines, {report.decisions} decisions: no divergence"
            )
        else:
            for divergence in report.divergences:
                typer.echo(divergence.text())
        if report.first is not None:
            if not json_output:
                typer.echo(f"error: {report.first.text()}", err=True)
            raise typer.Exit(EXIT_DIVERGED)


def _crash_report(
    data: bytes, current: CurrentConfiguration, only: int | None, json_output: bool
) -> None:
    checked, plans, bad = crash_points(data, current, only)
    if only is not None and checked == 0:
        raise InputError(f"--crash-at {only}: the log has no line {only}")
    if json_output:
        emit_json(
            {
                "ok": not bad,
                "boundaries": checked,
                "plans": plans,
                "blind": [{"line": b.line, "plan": b.plan, "problem": b.problem} for b in bad],
            }
        )
    else:
        for plan in plans:
            typer.echo(f"after line {only}: plans {plan}")
        for point in bad:
            typer.echo(point.text())
        if not bad:
            typer.echo(f"{checked} crash boundaries: no blind re-run of a started effect")
    if bad:
        raise typer.Exit(EXIT_DIVERGED)


def replay_configuration(
    flags: Flags, session: str, against: Path | None = None
) -> ReplayConfiguration:
    """The configuration ``tether resume SESSION`` would use (``against``: that
    ``tether.toml``'s or workspace's), as the replay compares it; nothing is sent."""
    from tether._project import find_workspace_root, load_project_config

    project = load_project_config(find_workspace_root(flags.get("workspace")).path)
    given = with_recorded(flags, session, project)
    if against is not None:
        workspace = against if against.is_dir() else against.parent
        if not workspace.is_dir() or (not against.is_dir() and not against.is_file()):
            raise InputError(f"--against {against}: no such tether.toml or workspace")
        given = {**given, "workspace": workspace}
        project = load_project_config(find_workspace_root(workspace).path)
    # Replay runs no tool: the sandbox's policy shapes the digest, its check would only
    # start a process.
    agent = quiet_agent(cli_settings(given, project=project), check_sandbox=False)
    try:
        configuration = agent.configuration
        return ReplayConfiguration(
            current=configuration.current,
            snapshot=configuration.snapshot,
            policy=agent.parts.project.policy,
        )
    finally:
        agent.close()
