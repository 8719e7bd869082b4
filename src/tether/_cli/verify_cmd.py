"""``tether verify``: run the workspace's check command and record the evidence.

``tether verify`` runs ``[verify] command`` of ``tether.toml`` in the workspace, with the
artifact version (a digest of the workspace content) computed before and after, and
records command, exit status, output digest, both versions and duration in
``.tether/effects.db``. ``tether verify --status`` runs nothing: it says whether the files
as they are now are verified, and which files changed since the last passing check.

Exit status: 0 passed (``--status``: verified), 1 failed, timed out or void (the files
changed while it ran) (``--status``: stale, failed or missing), 2 usage error (no check
command, bad ``tether.toml``), 20 the effects database cannot be used, 30 the artifact
version cannot be computed (e.g. an unreadable file), 31 the check command could not run
(not found, not executable), 130 interrupted by Ctrl+C (the check's process group is
ended; nothing is recorded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tether._cli.common import (
    WORKSPACE_HELP,
    emit_json,
    handle_errors,
    one_line,
    printable,
    workspace_root,
)
from tether._completion.evidence import VerificationStatus
from tether._completion.verify import NO_COMMAND, Verifier, describe_verification
from tether._project import load_project_config
from tether._wsdb.sqlite import EffectsDB
from tether.core.gate import name_files
from tether.errors import EXIT_FAILED, ArtifactError, CheckCommandError, ConfigurationError

EXIT_NOT_VERIFIED = EXIT_FAILED


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)


def verify(
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
    ] = None,
    status: Annotated[
        bool,
        typer.Option(
            "--status",
            help="Run nothing: say whether the files as they are now are verified.",
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds the check may run (default: [verify] timeout, else 600).",
            metavar="SECONDS",
            min=0.001,
            show_default=False,
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run the check command of tether.toml and record the evidence.

    Examples:

        tether verify

        tether verify --status

    Exit status: 0 passed, 1 failed, timed out or void, 2 usage error, 30 the
    workspace cannot be read, 31 the check command could not run. With
    --status: 0 verified, 1 stale, failed or missing.
    """
    with handle_errors():
        root = workspace_root(workspace)
        project = load_project_config(root)
        if not status and project.verify.command is None:
            raise ConfigurationError(f"{NO_COMMAND} in {root}")
        db = EffectsDB.open_workspace(root)
        try:
            verifier = Verifier(root, project, db)
            code = (
                _status(verifier, json_output) if status else _run(verifier, timeout, json_output)
            )
        finally:
            db.close()
    raise typer.Exit(code)


def _status(verifier: Verifier, json_output: bool) -> int:
    check = verifier.assess()
    if json_output:
        emit_json(check.to_json())
    else:
        typer.echo(printable(check.message))
        if check.version is not None:
            typer.echo(f"version {check.version}")
    return 0 if check.verified else EXIT_NOT_VERIFIED


def _run(verifier: Verifier, timeout: float | None, json_output: bool) -> int:
    verification, changed = verifier.verify(timeout=timeout)
    status = verification.status
    if json_output:
        document: dict[str, Any] = verification.to_json()
        document["changedDuringRun"] = list(changed)
        emit_json(document)
    else:
        if verification.output_tail and status is not VerificationStatus.PASSED:
            typer.echo(verification.output_tail.rstrip("\n"), err=True)
        typer.echo(printable(describe_verification(verification, changed)))
        if changed:
            typer.echo(f"changed while it ran: {printable(name_files(list(changed)))}")
        typer.echo(f"evidence {verification.id}")
    if status is VerificationStatus.PASSED:
        return 0
    if status is VerificationStatus.ERROR:
        # No version at either end: the workspace could not be read; else the command
        # itself could not run (not found, not executable).
        unreadable = verification.version_start is None or verification.version_end is None
        if not json_output:
            typer.echo(
                f"error: {one_line(verification.error or 'the check could not run')}", err=True
            )
        return ArtifactError.exit_code if unreadable else CheckCommandError.exit_code
    return EXIT_NOT_VERIFIED
