"""Named crash boundaries for crash-consistency testing.

Code marks each point where a crash is interesting with ``faults.hit("name")``. A test arms
one boundary through the environment of a child process:

``TETHER_CRASH_AT=NAME[@N]``
    crash on the N-th hit (default 1) of boundary ``NAME`` in this process;
``TETHER_CRASH_MODE=kill`` (default)
    ``SIGKILL`` to the own process: no cleanup, no buffered output, exactly like a power
    cut as far as the process is concerned (the page cache survives);
``TETHER_CRASH_MODE=exit``
    print ``INJECTED_CRASH boundary=NAME`` to stderr, flush, and ``os._exit(75)``;
``TETHER_CRASH_MODE=stop``
    print ``INJECTED_STOP boundary=NAME`` to stderr, flush, and stop the own process with
    ``SIGSTOP``; after ``SIGCONT`` it carries on as if nothing happened. For tests that need
    a real process frozen *between* two steps (a race made deterministic), e.g. a writer
    that holds a lock but has not yet recorded its pid.

The environment is read once, at import. When nothing is armed :func:`hit` costs one dict
lookup (to catch misspelt boundary names) and a comparison.

Adding a boundary is one line: ``register("runtime.after_effect", "…")`` next to the code
that calls ``hit("runtime.after_effect")``; every boundary must be registered before it is
hit, so a typo is a programming error rather than a silently untestable boundary.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tether.errors import EXIT_CRASH_INJECTED

__all__ = [
    "ARMED",
    "BOUNDARIES",
    "CRASH_EXIT_CODE",
    "UnknownBoundary",
    "armed_for",
    "configure",
    "hit",
    "register",
]

CRASH_EXIT_CODE = EXIT_CRASH_INJECTED
"""Exit status of a crash injected in ``exit`` mode (a row of ``tether.errors.EXIT_STATUSES``)."""

BOUNDARIES: dict[str, str] = {}
"""Every registered boundary: name → one-line description."""


class UnknownBoundary(LookupError):
    """``hit`` was called with a name nobody registered (a programming error)."""


def register(name: str, description: str) -> str:
    """Register a boundary (idempotent for the same description) and return its name."""
    if not name or any(c.isspace() for c in name) or "@" in name:
        raise ValueError(f"invalid boundary name: {name!r}")
    existing = BOUNDARIES.get(name)
    if existing is not None and existing != description:
        raise ValueError(f"boundary {name!r} is already registered: {existing}")
    BOUNDARIES[name] = description
    return name


def _parse(spec: str | None) -> tuple[str | None, int]:
    if spec is None or not spec.strip():
        return None, 0
    name, sep, count = spec.strip().partition("@")
    if not sep:
        return name, 1
    try:
        n = int(count)
    except ValueError:
        raise ValueError(f"TETHER_CRASH_AT: bad hit count in {spec!r}") from None
    if n < 1:
        raise ValueError(f"TETHER_CRASH_AT: hit count must be >= 1 in {spec!r}")
    return name, n


_TARGET: str | None = None
_TARGET_HIT = 0
_MODE = "kill"
_hits = 0
ARMED = False
"""Whether any boundary is armed in this process (read once from the environment)."""


def configure(crash_at: str | None, mode: str | None = None) -> None:
    """(Re)arm from explicit values, as the environment does at import; resets the counter.

    Meant for the process entry point and tests; ``configure(None)`` disarms.
    """
    global _TARGET, _TARGET_HIT, _MODE, _hits, ARMED
    target, n = _parse(crash_at)
    chosen = (mode or "kill").strip() or "kill"
    if chosen not in ("kill", "exit", "stop"):
        raise ValueError(f"TETHER_CRASH_MODE must be 'kill', 'exit' or 'stop', not {chosen!r}")
    _TARGET, _TARGET_HIT, _MODE, _hits = target, n, chosen, 0
    ARMED = target is not None


def armed_for(name: str) -> bool:
    """Whether boundary ``name`` is the armed one (it may still be waiting for its N-th hit)."""
    return _TARGET == name


def hit(name: str, before_crash: Callable[[], object] | None = None) -> None:
    """Pass boundary ``name``; crash here if it is armed and this is the N-th hit.

    ``before_crash`` runs just before the crash (e.g. to write half a line for a torn-write
    boundary); it is never called when the boundary does not fire.
    """
    global _hits
    if name not in BOUNDARIES:
        raise UnknownBoundary(f"crash boundary {name!r} is not registered")
    if name != _TARGET:
        return
    _hits += 1
    if _hits != _TARGET_HIT:
        return
    if before_crash is not None:
        before_crash()
    _crash(name)


def _crash(name: str) -> None:
    import signal  # only a crash point that fires needs it; every agent imports this module

    if _MODE == "stop":
        sys.stderr.write(f"INJECTED_STOP boundary={name}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued (SIGCONT): the boundary is passed
    if _MODE == "exit":
        sys.stderr.write(f"INJECTED_CRASH boundary={name}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    os.kill(os.getpid(), signal.SIGKILL)
    # SIGKILL cannot be caught; make sure nothing after the boundary ever runs.
    os._exit(CRASH_EXIT_CODE)  # pragma: no cover


configure(os.environ.get("TETHER_CRASH_AT"), os.environ.get("TETHER_CRASH_MODE"))
