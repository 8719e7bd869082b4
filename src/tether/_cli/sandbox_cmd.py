"""``tether sandbox check``: which mechanism confines the agent's commands, what it enforces,
and a self-test that tries forbidden things for real (:mod:`tether._sandbox.selftest`).

Exit 0 when everything the mode promises is enforced; 1 when a probe got through (or the
mode is ``off``: nothing is enforced); 27 when the mechanism does not work here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tether._cli.agent_flags import cli_settings
from tether._cli.common import WORKSPACE_HELP, emit_json, handle_errors
from tether._sandbox.policy import SandboxMode
from tether.errors import EXIT_FAILED

sandbox_app = typer.Typer(
    help="The sandbox of the commands the agent runs: see docs/sandbox.md.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("check")
def check(
    workspace: Annotated[
        Path | None,
        typer.Option("--workspace", "-w", help=WORKSPACE_HELP, metavar="DIR", show_default=False),
    ] = None,
    sandbox: Annotated[
        SandboxMode | None,
        typer.Option(
            "--sandbox",
            help="The mode to check (default: $TETHER_SANDBOX, else tether.toml's [sandbox] "
            "mode, else workspace-write).",
            metavar="MODE",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    network: Annotated[
        bool, typer.Option("--sandbox-network", help="Check with the network allowed.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Print the sandbox mechanism, its version and what it enforces, after trying a
    forbidden write, a forbidden read, a connection, a signal to tether and a remount.

    Examples:

        tether sandbox check

        tether sandbox check --sandbox read-only --json
    """
    from tether._runtime.compose import sandbox_for
    from tether._sandbox.selftest import run_self_test

    with handle_errors():
        flags = {"workspace": workspace, "sandbox": sandbox, "sandbox_network": network}
        settings = cli_settings(flags)
        box = sandbox_for(settings)
        report: dict[str, Any] = {"mode": box.policy.mode.value, "policy": box.policy.describe()}
        if not box.confined:
            report.update(mechanism=None, enforced=False, probes=[])
        else:
            mechanism = box.ensure()
            assert mechanism is not None
            probes = run_self_test(box)
            report.update(
                mechanism={"name": "bubblewrap", "version": mechanism.version,
                           "path": mechanism.program},
                enforced=all(p.enforced for p in probes),
                probes=[
                    {"name": p.name, "enforced": p.enforced, "detail": p.detail} for p in probes
                ],
            )  # fmt: skip
        if json_output:
            emit_json(report)
        else:
            _show(report)
    if not report["enforced"]:
        raise typer.Exit(EXIT_FAILED)


def _show(report: dict[str, Any]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    mechanism = report["mechanism"]
    if mechanism is None:
        out.print(Text(f"sandbox: {report['policy']}"))
        out.print("nothing is enforced: commands run with all of tether's rights")
        return
    out.print(Text(f"mechanism: bubblewrap {mechanism['version']} ({mechanism['path']})"))
    out.print(Text(f"mode: {report['policy']}"))
    out.print("confines: filesystem (mount namespace), network (network namespace), "
              "processes (PID namespace, die with tether), capabilities (all dropped)")  # fmt: skip
    for probe in report["probes"]:
        mark = "ok  " if probe["enforced"] else "FAIL"
        out.print(Text(f"  {mark} {probe['name']:<13} {probe['detail']}"))
    out.print("PASS: everything the mode promises is enforced" if report["enforced"]
              else "FAIL: something the mode promises is not enforced")  # fmt: skip


__all__ = ["check", "register"]
