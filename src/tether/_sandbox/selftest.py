"""``tether sandbox check``'s proof: forbidden things tried for real, under the real sandbox.

Rules of this module:

* Every probe is a command run through the same :class:`~tether._sandbox.bwrap.Sandbox` and
  the same runner as the ``bash`` tool, in a scratch workspace made for the check (under
  ``/var/tmp``, which the sandbox does not replace, so that "outside" is a real folder of
  the host), with the mode and network setting of the agent's policy.
* A probe passes on what the **host** sees afterwards where the host can tell (the file
  outside was not written, the listener saw no connection), not on what the command
  printed; only the probes of things the host cannot observe (a signal, a remount) read
  the command's own report.
* The probes are a table (:data:`PROBES`): name, what it shows, and when it applies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tether._procs import Supervision, run_in_group
from tether._sandbox.bwrap import Sandbox
from tether._sandbox.policy import MODE_GRANTS, SandboxPolicy
from tether.core.records import replace

__all__ = ["PROBES", "Probe", "ProbeResult", "run_self_test"]

_SECRET: Final = "tether-sandbox-check-secret"


@dataclass(frozen=True)
class Scratch:
    """The check's own little world: a workspace, a folder outside it, a secret file, a
    listener on loopback, and this process's id."""

    root: Path
    workspace: Path
    outside: Path
    secret: Path
    state: Path
    port: int
    pid: int
    listener: socket.socket

    def connected(self) -> bool:
        """Whether anything connected to the listener (host side, without waiting)."""
        self.listener.setblocking(False)
        try:
            peer, _ = self.listener.accept()
        except (BlockingIOError, OSError):
            return False
        peer.close()
        return True


@dataclass(frozen=True)
class ProbeResult:
    name: str
    enforced: bool
    detail: str


@dataclass(frozen=True)
class Probe:
    """One forbidden (or, for the workspace, allowed) thing: the command that tries it and
    how the host judges the outcome (``judge(scratch, output) -> (enforced, detail)``)."""

    name: str
    command: Callable[[Scratch], str]
    judge: Callable[[Scratch, str, SandboxPolicy], tuple[bool, str]]


def _wrote(path: Path) -> bool:
    return path.exists()


def _judge_workspace(s: Scratch, _out: str, policy: SandboxPolicy) -> tuple[bool, str]:
    may = MODE_GRANTS[policy.mode].write_workspace
    did = _wrote(s.workspace / "inside")
    if may:
        return did, "a write inside the workspace " + ("worked" if did else "FAILED")
    return not did, "a write inside the workspace was " + ("MADE" if did else "refused")


def _judge_outside(s: Scratch, _out: str, _p: SandboxPolicy) -> tuple[bool, str]:
    did = _wrote(s.outside / "escaped")
    return not did, f"a write to {s.outside} was " + ("MADE" if did else "refused")


def _judge_secret(_s: Scratch, out: str, _p: SandboxPolicy) -> tuple[bool, str]:
    leaked = _SECRET in out
    return not leaked, "a deny_read file was " + ("READ" if leaked else "not readable")


def _judge_state(s: Scratch, _out: str, _p: SandboxPolicy) -> tuple[bool, str]:
    did = _wrote(s.state / "forged")
    return not did, "a write to tether's .tether/ was " + ("MADE" if did else "refused")


def _judge_network(s: Scratch, _out: str, policy: SandboxPolicy) -> tuple[bool, str]:
    reached = s.connected()
    if policy.network:
        return True, "network allowed by the configuration (" + (
            "a loopback listener was reached)" if reached else "the listener was not reached)"
        )
    return not reached, "a connection to a loopback listener was " + (
        "MADE" if reached else "refused"
    )


def _judge_pid(_s: Scratch, out: str, _p: SandboxPolicy) -> tuple[bool, str]:
    seen = "pid=signalled" in out
    return not seen, "tether's own process was " + ("SIGNALLED" if seen else "out of reach")


def _judge_caps(_s: Scratch, out: str, _p: SandboxPolicy) -> tuple[bool, str]:
    remounted = "remount=done" in out
    nested = "userns=done" in out
    if remounted or nested:
        return False, "REMOUNTED /" if remounted else "a nested user namespace was MADE"
    return True, "remounting / and nested user namespaces were refused"


PROBES: Final[tuple[Probe, ...]] = (
    Probe("workspace", lambda s: f"echo x > {s.workspace}/inside", _judge_workspace),
    Probe("write outside", lambda s: f"echo x > {s.outside}/escaped", _judge_outside),
    Probe("read denied", lambda s: f"cat {s.secret}", _judge_secret),
    Probe("tether state", lambda s: f"echo x > {s.state}/forged", _judge_state),
    Probe(
        "network",
        lambda s: f"(exec 3<>/dev/tcp/127.0.0.1/{s.port}) 2>/dev/null && echo network=reached",
        _judge_network,
    ),
    Probe("processes", lambda s: f"kill -0 {s.pid} 2>/dev/null && echo pid=signalled", _judge_pid),
    Probe(
        "capabilities",
        lambda s: (
            "mount -o remount,rw / 2>/dev/null && echo remount=done; "
            "unshare -U true 2>/dev/null && echo userns=done"
        ),
        _judge_caps,
    ),
)


def _scratch_root() -> Path:
    for base in ("/var/tmp", tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            return Path(tempfile.mkdtemp(prefix="tether-sandbox-check-", dir=base))
    return Path(tempfile.mkdtemp(prefix="tether-sandbox-check-"))


def run_self_test(sandbox: Sandbox) -> list[ProbeResult]:
    """Run every probe under ``sandbox``'s mode and network setting (the mechanism checked
    first: :class:`~tether.errors.SandboxUnavailable` when it does not work)."""
    root = Path(os.path.realpath(_scratch_root()))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        scratch = Scratch(
            root=root,
            workspace=root / "workspace",
            outside=root / "outside",
            secret=root / "secret",
            state=root / "workspace" / ".tether",
            port=listener.getsockname()[1],
            pid=os.getpid(),
            listener=listener,
        )
        for folder in (scratch.workspace, scratch.outside, scratch.state):
            folder.mkdir(parents=True)
        scratch.secret.write_text(_SECRET)
        policy = replace(
            sandbox.policy,
            workspace=scratch.workspace,
            writable_roots=(),
            deny_read=(scratch.secret,),
            hidden=(scratch.state,),
            read_only=(),
        )
        probe_box = Sandbox(policy)
        probe_box.ensure()
        results = []
        for probe in PROBES:
            chunks: list[bytes] = []
            run_in_group(
                probe_box.wrap(["/bin/bash", "-c", probe.command(scratch)], scratch.workspace),
                cwd=scratch.workspace,
                env=dict(os.environ),
                timeout=20.0,
                on_output=chunks.append,
                supervision=Supervision(kill_grace=0.5),
            )
            output = b"".join(chunks).decode("utf-8", "replace")
            enforced, detail = probe.judge(scratch, output, policy)
            results.append(ProbeResult(probe.name, enforced, detail))
        return results
    finally:
        listener.close()
        shutil.rmtree(root, ignore_errors=True)
