"""Loading a whole session log: the pure reducer with the cyclic garbage collector paused.

:mod:`tether.core` is pure and never touches the interpreter's global state, so the one
optimisation of a whole-log load that does lives here, in the shell: every place that folds a
complete log into a state — the session stores (file, memory, PostgreSQL), the CLI,
``tether show`` and the public ``tether.reduce_session`` — goes through :func:`load_reducer`
or :func:`reduce_session`, and whatever else builds many long-lived objects from a whole log
(``tether show``'s facts and timeline) pauses the collector with :func:`gc_paused`, a
worker driving many sessions at once collects less often (:func:`gc_less_often`), and the
command line's exit leaves what is still reachable uncollected (:func:`freeze_for_exit`):
this module is the one place that touches it.
The result is exactly the pure reducer's (:meth:`tether.core.reducer.Reducer.load`,
:func:`tether.core.reduce_session`); only the time differs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from tether.core.reducer import Reducer
from tether.core.state import SessionState

__all__ = ["freeze_for_exit", "gc_less_often", "gc_paused", "load_reducer", "reduce_session"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a whole log is folded in.

    Loading allocates a few long-lived container objects per fact and frees the parsed
    JSON right away; the generational collector would repeatedly traverse the growing state
    (10-15% of the load time of a large log) only to find nothing, because the reducer
    creates no reference cycles outside an open transaction. Reference counting still frees
    everything as usual. The previous setting is restored (a collector the caller had
    disabled stays disabled).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def gc_less_often(first: int) -> Iterator[None]:
    """Run the youngest generation's collection every ``first`` allocations instead of
    every 700 (the interpreter's default), for the length of the block.

    A worker holds the objects of hundreds of sessions in flight (their states, agents and
    threads); each young collection that promotes survivors brings the older generations'
    collections, which traverse all of them and find almost nothing: 12-17% of a worker's
    CPU with 1,000 sessions in flight (a ``perf`` profile), about 13% less CPU a session
    with ``first`` at 20,000. Reference counting frees everything as before; only cycles
    wait a little longer. The previous thresholds are restored.
    """
    previous = gc.get_threshold()
    gc.set_threshold(max(first, previous[0]), *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def freeze_for_exit() -> None:
    """For a process about to exit (the command line, once its command has ended): freeze
    everything it still holds (:func:`gc.freeze`), so that the interpreter's exit neither
    collects it cycle by cycle nor walks it to find the few cycles that are garbage.

    Why: a worker that drove a thousand sessions holds its slots (agents, executors, their
    cycles) until it exits; after the last session ended, the exit's collections took
    0.4-0.6 s, and collecting first, here, would still take 0.2 s (measured,
    ``bench/bench_fleet.py``).
    Nothing is lost: every store, log and connection was closed by the command (files are
    written unbuffered, and the standard streams are flushed at exit as before), and the
    exit's handlers (:mod:`atexit`: telemetry's flush, ``weakref.finalize``) still run. A
    finalizer of an object left in a cycle may not run, as Python allows at exit; the
    memory goes back to the operating system with the process."""
    gc.freeze()


def load_reducer(data: bytes) -> Reducer:
    """:meth:`Reducer.load` of a whole log (torn tail ignored), with the collector paused;
    raises :class:`~tether.errors.SessionCorruption` exactly as the pure reducer does."""
    with gc_paused():
        return Reducer.load(data)


def reduce_session(data: bytes) -> SessionState:
    """Reduce a whole session log (spec section 11), or raise
    :class:`~tether.errors.SessionCorruption`: the public entry point, the pure
    :func:`tether.core.reduce_session` with the collector paused."""
    return load_reducer(data).state
