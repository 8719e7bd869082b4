"""What a confined command may do: the sandbox's modes and the policy of one agent.

Rules of this module:

* It decides, it does not act: :class:`SandboxPolicy` is a frozen value built once per agent
  (by the composition, :mod:`tether._runtime.compose`) from the settings and tether's own
  layout, and :func:`bwrap_arguments` turns it into bubblewrap's command line. Nothing here
  starts a process or reads the environment; the paths it is given are already absolute
  and resolved (:func:`resolve_policy` does that). The only look at the disk when the
  command line is built is whether a masked path exists and is a folder.
* The filesystem view is a **table read in order** (:data:`_LAYERS`): each layer is applied
  after the ones above it, and a later mount wins where two overlap. So the workspace is
  bound writable over the read-only root, the ``deny_read`` paths are masked over both,
  and tether's own state is masked last, even when it sits inside the workspace.
* What a mode grants is a table too (:data:`MODE_GRANTS`), not an if-chain.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Final

from tether.core.records import record
from tether.errors import ConfigurationError

__all__ = [
    "DEFAULT_DENY_READ",
    "MODE_GRANTS",
    "SandboxMode",
    "SandboxPolicy",
    "bwrap_arguments",
    "resolve_policy",
]


class SandboxMode(StrEnum):
    """How much of the machine a command the agent runs may change.

    ``workspace-write`` is the default, as in Codex: an agent is there to change the
    workspace, and nothing else (see docs/sandbox.md for why, and for the threat model).
    """

    OFF = "off"
    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"


@record
class Grants:
    """What a mode lets a command do besides reading the (unmasked) machine."""

    confined: bool
    write_workspace: bool
    write_roots: bool


MODE_GRANTS: Final[Mapping[SandboxMode, Grants]] = {
    SandboxMode.OFF: Grants(confined=False, write_workspace=True, write_roots=True),
    SandboxMode.READ_ONLY: Grants(confined=True, write_workspace=False, write_roots=False),
    SandboxMode.WORKSPACE_WRITE: Grants(confined=True, write_workspace=True, write_roots=True),
}

DEFAULT_DENY_READ: Final[tuple[str, ...]] = (
    "~/.ssh",
    "~/.aws",
    "~/.config/gcloud",
    "~/.azure",
    "~/.netrc",
    "~/.docker",
    "~/.kube",
    "~/.gnupg",
    "~/.pgpass",
    "~/.git-credentials",
    "~/.config/gh",
)
"""Credentials a command has no business reading (the issue's list, and their neighbours)."""


@record
class SandboxPolicy:
    """The confinement of one agent's commands; all paths absolute and resolved.

    ``hidden`` is tether's own state (the workspace's ``.tether/``, the sessions
    directory): masked by an empty read-only folder, so a command can neither read the
    logs nor change the records crash recovery trusts. ``read_only`` are files a command
    may read but not change (the workspace's ``tether.toml``, whose ``[policy]`` decides
    what the agent may do). ``deny_read`` are masked the same way as ``hidden``.
    ``exposed`` are folders under the sandbox's private ``/tmp`` (or ``/run``) that stay
    visible, read-only: where the programs it starts live (tether's own Python
    environment, an MCP server's command) when they were installed there.
    """

    mode: SandboxMode
    workspace: Path
    network: bool = False
    writable_roots: tuple[Path, ...] = ()
    deny_read: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()
    exposed: tuple[Path, ...] = ()

    @property
    def confined(self) -> bool:
        return MODE_GRANTS[self.mode].confined

    def describe(self) -> str:
        """One line: the mode and what it lets through (for tool results and ``check``)."""
        if not self.confined:
            return "off (commands run with all of tether's rights)"
        grants = MODE_GRANTS[self.mode]
        writes = ["the workspace"] if grants.write_workspace else []
        if grants.write_roots and self.writable_roots:
            writes.append(f"{len(self.writable_roots)} more folder(s)")
        where = "only " + " and ".join(writes) if writes else "nothing"
        network = "network on" if self.network else "network off"
        return f"{self.mode.value}: writes {where} (and a private /tmp); {network}"

    def tool_note(self) -> str:
        """What the model is told about its commands (part of the tool's definition, so
        the mode, the network and the writable roots enter the configuration digest; the
        ``deny_read`` list does not: which of its paths exist differs between machines)."""
        if not self.confined:
            return ""
        grants = MODE_GRANTS[self.mode]
        writes = "the workspace (and /tmp)" if grants.write_workspace else "only /tmp"
        if grants.write_roots and self.writable_roots:
            writes += ", and " + ", ".join(str(root) for root in self.writable_roots)
        network = "" if self.network else " There is no network access."
        return (
            f" Commands run in a sandbox ({self.mode.value}): they may write {writes}; "
            f"tether's .tether/ folder and credential folders are hidden.{network}"
        )


# --------------------------------------------------------------------------- resolving


def _expanded(text: str, home: str, base: Path) -> str:
    """``text`` with ``~`` as ``home``, taken in ``base`` when relative (not resolved)."""
    if text == "~" or text.startswith("~/"):
        text = home + text[1:]
    return os.path.join(base, text)  # an absolute ``text`` stays itself


def _absolute(text: str, home: str, base: Path) -> Path:
    return Path(os.path.realpath(_expanded(text, home, base)))


def resolve_policy(
    mode: SandboxMode,
    *,
    workspace: Path,
    network: bool,
    writable_roots: Iterable[str],
    deny_read: Iterable[str],
    hidden: Iterable[Path],
    read_only: Iterable[Path] = (),
    exposed: Iterable[str | os.PathLike[str]] = (),
    home: str,
) -> SandboxPolicy:
    """The policy with every path expanded (``~`` is ``home``; a relative path is taken in
    the workspace) and resolved. A writable root that does not exist is a
    :class:`ConfigurationError`: bubblewrap could not bind it, and a silent skip would hide
    a typo. A ``deny_read`` path that does not exist is dropped (nothing to read)."""
    real = Path(os.path.realpath(workspace))
    roots: list[Path] = []
    for text in writable_roots:
        root = _absolute(text, home, real)
        if not root.is_dir():
            raise ConfigurationError(
                f"[sandbox] writable_roots: {text!r} is not an existing folder"
            )
        roots.append(root)
    # One lstat rules out a path that is not there (most of the defaults, on most machines)
    # before its real path is resolved, component by component.
    denied = [
        p
        for p in (
            _absolute(t, home, real) for t in deny_read if os.path.lexists(_expanded(t, home, real))
        )
        if os.path.lexists(p)
    ]
    return SandboxPolicy(
        mode=mode,
        workspace=real,
        network=network,
        writable_roots=tuple(roots),
        deny_read=tuple(denied),
        hidden=tuple(Path(os.path.realpath(p)) for p in hidden),
        read_only=tuple(Path(os.path.realpath(p)) for p in read_only if p.is_file()),
        exposed=exposed_roots(exposed),
    )


PRIVATE_ROOTS: Final = (Path("/tmp"), Path("/run"))
"""Folders the sandbox replaces with empty private ones (see :data:`_BASE`)."""


def exposed_roots(paths: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    """The folders to keep visible for ``paths`` that lie under a private root: each one's
    top folder there (``/tmp/ci/venv/bin/python`` → ``/tmp/ci``), so that a program
    installed there finds its libraries beside it. Paths elsewhere need nothing."""
    found: set[Path] = set()
    for text in paths:
        real = os.path.realpath(text)
        for root in _PRIVATE_PREFIXES:
            if real.startswith(root):  # strictly under it: the root itself is not exposed
                top = Path(root + real[len(root) :].split("/", 1)[0])
                if top.is_dir():
                    found.add(top)
    return tuple(sorted(found))


_PRIVATE_PREFIXES: Final = tuple(f"{root}/" for root in PRIVATE_ROOTS)


# --------------------------------------------------------------------------- bubblewrap

_NAMESPACES: Final = (
    # A user namespace of its own, in which every capability is then dropped: root outside
    # keeps its capabilities inside bwrap otherwise, and could remount / read-write.
    "--unshare-user",
    # Its own process ids: the command cannot see or signal tether or any other process,
    # and when bwrap dies (--die-with-parent: when tether dies) the namespace's init dies
    # and the kernel kills every process in it, setsid'd escapees included.
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
)
_HARDENING: Final = (
    "--die-with-parent",
    "--new-session",  # no TIOCSTI into tether's terminal
    "--disable-userns",  # no nested user namespace to regain capabilities in
    "--cap-drop",
    "ALL",
)
_BASE: Final = (
    ("--ro-bind", "/", "/"),
    ("--dev", "/dev"),
    ("--proc", "/proc"),
    ("--tmpfs", "/tmp"),  # private: nothing another process keeps in /tmp is seen
    # Host daemons' Unix sockets (a database, docker, D-Bus) are a way out that a network
    # namespace does not close.
    ("--tmpfs", "/run"),
)


def _mask(path: Path) -> list[str]:
    """Mount an empty read-only thing over ``path``: a folder over a folder, ``/dev/null``
    over anything else."""
    text = str(path)
    if not os.path.lexists(text):
        return []  # nothing there to read (the shell creates .tether/ before any command)
    if path.is_dir():
        return ["--tmpfs", text, "--remount-ro", text]
    return ["--ro-bind", "/dev/null", text]


def _layers(policy: SandboxPolicy) -> list[str]:
    grants = MODE_GRANTS[policy.mode]
    out: list[str] = [arg for layer in _BASE for arg in layer]
    for path in policy.exposed:
        out += ["--ro-bind", str(path), str(path)]
    workspace = str(policy.workspace)
    out += ["--bind" if grants.write_workspace else "--ro-bind", workspace, workspace]
    if grants.write_roots:
        for root in policy.writable_roots:
            out += ["--bind", str(root), str(root)]
    for path in policy.read_only:
        out += ["--ro-bind", str(path), str(path)]
    masked: list[Path] = []
    for path in (*policy.deny_read, *policy.hidden):
        # Under a folder masked already: hidden with it (and its empty read-only folder
        # could not hold another mount point).
        if not any(path == m or m in path.parents for m in masked):
            out += _mask(path)
            masked.append(path)
    return out


def bwrap_arguments(
    program: str,
    policy: SandboxPolicy,
    argv: Sequence[str],
    *,
    cwd: Path,
) -> list[str]:
    """bubblewrap's command line that runs ``argv`` in ``cwd`` under ``policy`` (which must
    be confined). The order of the mounts is the order of :func:`_layers`."""
    if not policy.confined:
        raise ValueError("bwrap_arguments needs a confining policy")
    args = [program, *_HARDENING, *_NAMESPACES]
    if not policy.network:
        args.append("--unshare-net")
    args += _layers(policy)
    # TMPDIR may name a host folder the command cannot write; /tmp is its own.
    args += ["--setenv", "TMPDIR", "/tmp", "--chdir", str(cwd), "--", *argv]
    return args
