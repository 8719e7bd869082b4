"""Hubs: many sessions on a few threads, each session a greenlet that waits without a thread.

Why (issue 33): a worker drives a thousand sessions at once, and each spends nearly all its
time waiting for its model. With a thread per session, every socket read, statement and
lock released the GIL to one of hundreds of ready threads and queued behind them to get it
back: measured, a third of the worker's CPU went to those hand-offs. A hub is one thread
that runs many sessions as greenlets; a session that waits for its model's answer parks
(its greenlet switches back to the hub) and the hub's selector wakes it when the answer's
bytes arrive. A worker runs a few hubs, so a thousand waiting sessions cost a few threads.

The rules this module keeps:

* **Where a session parks.** Only at the waits made for it: :func:`wait_readable` (a
  model's socket, called by :mod:`tether._models.http11` before each read that would
  block; a command's output and exit, by :mod:`tether._procs`), :func:`wait_event` and
  :func:`pause` (the clock's ``wait`` and ``sleep``), :class:`Wake` (a group commit's
  follower waiting for its leader), :func:`wait_writable` (a connection being made, its TLS
  handshake) and :func:`offload` (a blocking call run on a helper thread: a tool's run, a
  host name's lookup). Anything else a session does (a statement, a lease check, encoding
  a request) runs on the hub's thread and holds it: it must be short. No lock may be held
  across a park (another session on the same thread taking it would never get it), so the
  parks are in code that holds none.
* **Which session runs next.** One a round, in the order of :meth:`Hub._wake`: sessions
  woken by a :class:`Wake`, started sessions that have not yet waited on the world, new
  ones, then the rest.
* **Off a hub, nothing changes.** Each function here is the plain blocking call when the
  caller is not a session on a hub (``tether run``, a library's thread, a helper thread):
  one thread-local read decides.
* **Who wakes a parked session.** Only its hub's thread switches to it: the selector (its
  socket is readable), a timer (its timeout) or :meth:`Hub.resume` from any thread (an
  offloaded call ended, an event was set), which queues it and pokes the hub's pipe. A
  park is woken once; whatever comes second is ignored.
* **A session that raises** ends alone: its exception goes to :func:`threading.excepthook`
  as a thread's would, and the hub goes on with the others.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import heapq
import itertools
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:  # loaded by the first hub: a process without one never needs it
    import greenlet

__all__ = [
    "Hub",
    "Wake",
    "offload",
    "on_hub",
    "pause",
    "wait_event",
    "wait_readable",
    "wait_writable",
]

_T = TypeVar("_T")

_POLL: Final = 0.05
"""How often (seconds) a parked :func:`wait_event` looks at an event that cannot wake it."""
_STALE: Final = 256
"""Woken parks the timer heap may hold before it is rebuilt (a model request's timer is
long: without this, each request would leave one behind for that long)."""

_local = threading.local()  # .hub: the hub whose thread this is


class _Park:
    """One park of one session: woken once, by whichever comes first."""

    __slots__ = ("fd", "glet", "timed", "urgent", "why", "woken")

    def __init__(self, glet: greenlet.greenlet, *, urgent: bool = False, ages: bool = True) -> None:
        if ages:  # a wait on the world: its session no longer counts as starting (Hub._wake)
            glet.waited = True
        self.glet = glet
        self.urgent = urgent  # runs before any other when woken (see Hub._wake)
        self.fd: Any = None  # registered with the selector while not None
        self.timed = False  # on the timer heap
        self.woken = False
        self.why = ""


class Hub:
    """One thread running sessions as greenlets (see the module docstring).

    ``helpers`` runs what :func:`offload` hands it (shared by a worker's hubs; the caller
    shuts it down)."""

    def __init__(self, name: str, helpers: ThreadPoolExecutor) -> None:
        self.helpers = helpers
        self._selector = selectors.DefaultSelector()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._selector.register(self._read, selectors.EVENT_READ, None)
        self._lock = threading.Lock()  # the count and the new sessions; never taken by a wake
        self._new: list[Callable[[], None]] = []
        # Wakes from other threads. A SimpleQueue's put takes no lock a signal handler could
        # interrupt (a WakingEvent's set may run in one); only the hub's thread decides which
        # wake of a park counts, so a park needs no lock either.
        self._wakes: queue.SimpleQueue[tuple[_Park, str]] = queue.SimpleQueue()
        self._live = 0
        self._closing = False
        self._timers: list[tuple[float, int, _Park]] = []
        self._stale = 0
        # Sessions ready to run, in this order (the hub's thread's alone, see _wake):
        # urgent ones, started ones that have not waited on the world yet, new ones, the
        # others.
        self._urgent: collections.deque[greenlet.greenlet] = collections.deque()
        self._starting: collections.deque[greenlet.greenlet] = collections.deque()
        self._fresh: collections.deque[greenlet.greenlet] = collections.deque()
        self._going: collections.deque[greenlet.greenlet] = collections.deque()
        self._ready = (self._urgent, self._starting, self._fresh, self._going)
        self._order = itertools.count()
        import greenlet

        self._greenlet = greenlet.greenlet
        self.current = greenlet.getcurrent
        self._main: greenlet.greenlet | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def sessions(self) -> int:
        """Sessions started here and not yet ended."""
        return self._live

    def spawn(self, run: Callable[[], None]) -> None:
        """Run ``run`` as a new session on this hub (from any thread)."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the hub is closed")
            self._new.append(run)
            self._live += 1
        self._poke()

    def resume(self, park: _Park, why: str) -> None:
        """Wake a parked session (from any thread, a signal handler included); a park's
        second wake is ignored."""
        self._wakes.put((park, why))
        self._poke()

    def close(self) -> None:
        """End the hub once its sessions have ended, and wait for that."""
        with self._lock:
            self._closing = True
        self._poke()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- on the hub's thread ----------------------------------------------------------------

    def park(
        self,
        fd: Any = None,
        timeout: float | None = None,
        events: int = selectors.EVENT_READ,
        setup: bool = False,
    ) -> str:
        """Switch away until ``fd`` is ready for ``events`` (readable by default:
        ``"ready"``), ``timeout`` passed (``"timeout"``) or :meth:`resume` (its ``why``).
        Called by the session itself. ``setup``: a step of getting a request out (a
        connection being made), after which the session still counts as starting."""
        park = _Park(self.current(), ages=not setup)
        if fd is not None:
            try:
                self._selector.register(fd, events, park)
            except (KeyError, ValueError, OSError):  # closed (or its number reused): the
                # read says what happened, on this thread
                return "ready"
            park.fd = fd
        return self._sleep(park, timeout)

    def _sleep(self, park: _Park, timeout: float | None) -> str:
        """(A session, on the hub's thread.) Switch to the hub until ``park`` is woken."""
        main = self._main
        assert main is not None
        if timeout is not None:
            park.timed = True
            heapq.heappush(self._timers, (time.monotonic() + timeout, next(self._order), park))
        try:
            while not park.woken:
                main.switch()
        finally:
            if park.fd is not None:
                self._selector.unregister(park.fd)
                park.fd = None
            if park.timed and park.why != "timeout":
                self._forget_timer()
        return park.why

    def _forget_timer(self) -> None:
        self._stale += 1
        if self._stale > _STALE and self._stale * 2 > len(self._timers):
            self._timers = [entry for entry in self._timers if not entry[2].woken]
            heapq.heapify(self._timers)
            self._stale = 0

    def _run(self) -> None:
        _local.hub = self
        self._main = self.current()
        while True:
            with self._lock:
                for run in self._new:
                    glet = self._greenlet(self._session(run), parent=self._main)
                    glet.waited = False
                    self._fresh.append(glet)
                self._new.clear()
                if self._closing and not self._live and not self._fresh:
                    break
            while True:
                try:
                    park, why = self._wakes.get_nowait()
                except queue.Empty:
                    break
                self._wake(park, why)
            self._wait(0.0 if any(self._ready) else None)
            # One session a round, from the first queue that has one (see _wake), chosen
            # after the wait: what it woke may come first.
            ready = next((each for each in self._ready if each), None)
            if ready is not None:
                self._switch(ready.popleft())
        self._selector.close()
        os.close(self._read)
        os.close(self._write)

    def _wait(self, timeout: float | None) -> None:
        """Wake the sessions whose sockets are ready or whose timers are due, waiting up to
        ``timeout`` (``None``: until one is, or the pipe is poked)."""
        if self._timers:
            due_in = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = due_in if timeout is None else min(timeout, due_in)
        due: list[tuple[_Park, str]] = []
        for key, _ in self._selector.select(timeout):
            park = key.data
            if park is None:  # the pipe: new sessions, resumed ones or a close
                try:
                    while os.read(self._read, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            self._selector.unregister(key.fd)
            park.fd = None
            due.append((park, "ready"))
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            due.append((heapq.heappop(self._timers)[2], "timeout"))
        for park, why in due:
            self._wake(park, why)

    def _wake(self, park: _Park, why: str) -> None:
        """(The hub's thread.) Queue a parked session to run, unless it was woken already.

        A session woken by a :class:`Wake` runs first: it may have been handed the group
        commit's lead, which every committer of every hub waits on (behind a hub's queue
        of new sessions, it held them all). Then a session that started and has not
        waited on the world yet (for an answer, a command, a pause, an offloaded call; not
        for a group commit or a connection being made); then a new session; then the
        others, each queue in the order its sessions became ready. So each new session gets
        to its first request before the next one starts, and both before the hub goes on
        with the answers the others are getting. Why: a worker's sessions start together,
        and a session's first request starts its clock. Started in turn with the others'
        next steps, the last of a thousand sessions sent its first request seconds late;
        all started before any went on, their thousand requests went out together and their
        thousand answers came back together, for the next steps to queue behind (measured:
        ~2.5 s late either way, at 1,000 sessions in flight)."""
        if park.woken:
            return
        park.woken, park.why = True, why
        if park.urgent:
            self._urgent.append(park.glet)
        else:
            (self._going if park.glet.waited else self._starting).append(park.glet)

    def _switch(self, glet: greenlet.greenlet) -> None:
        if not glet.dead:
            glet.switch()

    def _session(self, run: Callable[[], None]) -> Callable[[], None]:
        def session() -> None:
            try:
                run()
            except BaseException as exc:
                threading.excepthook(
                    threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, self._thread))
                )
            finally:
                with self._lock:
                    self._live -= 1

        return session

    def _poke(self) -> None:
        try:
            os.write(self._write, b"!")
        except (BlockingIOError, OSError):  # full: a poke is pending anyway; closed: ended
            pass


def _here() -> Hub | None:
    """The hub whose session is calling, or ``None`` (not on a hub, or its main loop)."""
    hub: Hub | None = getattr(_local, "hub", None)
    if hub is None or hub.current() is hub._main:
        return None
    return hub


def on_hub() -> bool:
    """Whether the caller is a session on a hub (so a blocking call would hold others)."""
    return _here() is not None


def wait_readable(sock: socket.socket | int, timeout: float | None, *, setup: bool = False) -> None:
    """Return when ``sock`` (a socket or a file descriptor) has bytes to read (or its peer
    closed it); raise :class:`TimeoutError` after ``timeout`` seconds. Off a hub: returns at
    once (the caller's blocking read waits instead). ``setup``: see :meth:`Hub.park`."""
    hub = _here()
    if hub is None:
        return
    if hub.park(sock, timeout, setup=setup) == "timeout":
        raise TimeoutError("timed out")


def pause(seconds: float) -> None:
    """``time.sleep(seconds)``, parked on a hub."""
    hub = _here()
    if hub is None:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        hub.park(timeout=left)


def wait_writable(sock: socket.socket, timeout: float | None, *, setup: bool = False) -> None:
    """Return when ``sock`` can be written to (a connection being made: made, or failed);
    raise :class:`TimeoutError` after ``timeout`` seconds. Off a hub: returns at once.
    ``setup``: see :meth:`Hub.park`."""
    hub = _here()
    if hub is None:
        return
    if hub.park(sock, timeout, selectors.EVENT_WRITE, setup) == "timeout":
        raise TimeoutError("timed out")


def wait_event(event: threading.Event, timeout: float) -> bool:
    """``event.wait(timeout)``, parked on a hub. An event with ``waking`` (the clock's
    :class:`~tether._clock.WakingEvent`) wakes the session when set; another is looked at
    every :data:`_POLL` seconds."""
    hub = _here()
    if hub is None:
        return event.wait(timeout)
    deadline = time.monotonic() + timeout
    waking = getattr(event, "waking", None)
    while not event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if waking is None:
            hub.park(timeout=min(left, _POLL))
            continue
        park = _Park(hub.current())
        with waking(functools.partial(hub.resume, park, "set")):
            hub._sleep(park, left)
    return event.is_set()


def offload(call: Callable[..., _T], *args: Any, setup: bool = False) -> _T:
    """``call(*args)`` on one of the hub's helper threads while the session is parked; its
    result or its exception, as if called here. Off a hub: called here. ``setup``: see
    :meth:`Hub.park`."""
    hub = _here()
    if hub is None:
        return call(*args)
    park = _Park(hub.current(), ages=not setup)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call(*args)))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            hub.resume(park, "done")

    # In the session's context (its trace's current span, say), as asyncio's to_thread does.
    hub.helpers.submit(contextvars.copy_context().run, run)
    hub._sleep(park, None)
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


class Wake:
    """A one-shot wake-up for the thread or session that made it: :meth:`wait` blocks its
    thread until :meth:`set` (from any thread), or parks it when it is a session on a hub.

    For a wait on another thread's work that holds nothing the waiter's hub needs (a group
    commit's follower waits for its leader, :class:`tether._stores.pgpool.GroupCommit`)."""

    __slots__ = ("_hub", "_lock", "_park")

    def __init__(self) -> None:
        hub = _here()
        self._hub = hub
        self._lock: threading.Lock | None = None
        self._park: _Park | None = None
        if hub is None:
            self._lock = threading.Lock()
            self._lock.acquire()
        else:
            self._park = _Park(hub.current(), urgent=True, ages=False)

    def wait(self) -> None:
        """(Its maker.) Until :meth:`set`."""
        if self._lock is not None:
            self._lock.acquire()
        else:
            assert self._hub is not None and self._park is not None
            self._hub._sleep(self._park, None)

    def set(self) -> None:
        """Wake the waiter (once; any thread)."""
        if self._lock is not None:
            self._lock.release()
        else:
            assert self._hub is not None and self._park is not None
            self._hub.resume(self._park, "set")
