"""Streaming plumbing shared by the HTTP adapters: SSE decoding, the watchdog, cancellation.

* :class:`SSEDecoder` turns the lines of a ``text/event-stream`` body into ``(event, data)``
  pairs (the WHATWG rules that matter: ``data:`` lines joined by newlines, ``event:``,
  comments ignored, a blank line dispatches).
* :class:`ConnectionTracker` remembers the connections the adapter's transport opened
  (:mod:`tether._models.http11`), so :meth:`ConnectionTracker.abort` can shut them down
  from another thread. A ``shutdown(SHUT_RDWR)`` wakes a read that is blocked in the
  calling thread and makes the server see the connection close: the provider stops
  generating (and billing) instead of finishing an answer nobody will read.
* :func:`run_stream` runs the blocking exchange on the caller's thread, watched by the
  process's one watchdog thread (:class:`_Watchdog`): the first-byte timeout until the
  first line arrives, then the idle timeout between lines, and the cancel event. Deltas
  (answer text, reasoning text) are handed to ``on_delta`` as they are read. Not a thread
  per request: handing a request to another thread and its answer back cost two thread
  switches (~0.1 ms on a quiet machine, more on a busy one), and a worker with a thousand
  sessions in flight held a thousand more threads.
* **One connection, kept alive.** The pool puts a connection back only when its response
  was read to the end; a stream abandoned at its last event (``[DONE]``, ``message_stop``)
  is closed instead, and the next request pays a new connection (a TLS handshake against a
  provider). So an adapter reads the body to its end after the last event
  (:func:`drain`), having first handed the complete answer over with ``emit(Settled(...))``:
  a server that stalls or drops the connection after its last event can no longer turn a
  complete answer into a timeout or an error.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
import queue
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import httpx2

from tether._clock import WakingEvent, wake_on
from tether.errors import ModelError

if TYPE_CHECKING:  # the transport module loads with the first client (tracked_http_client)
    from tether._models.http11 import HTTP11Transport, Shutdown

__all__ = [
    "ConnectionTracker",
    "Delta",
    "DeltaSink",
    "SSEDecoder",
    "Settled",
    "drain",
    "run_stream",
    "tracked_http_client",
    "tracked_transport",
]

_T = TypeVar("_T")

_POLL: Final = 0.02
"""How often (seconds) the watchdog checks a cancel that cannot wake it."""
_SLACK: Final = 0.01
"""How late (seconds) the watchdog may end a call past its deadline, so that calls due
close together end in one wake."""
_STALE: Final = 64
"""Ended calls the watchdog's heap may hold before it is rebuilt (see ``unwatch``)."""


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of an answer as it streams in: ``channel`` ``text`` or ``reasoning``."""

    channel: Literal["text", "reasoning"]
    text: str


DeltaSink = Callable[[Delta], None]


@dataclass(frozen=True, slots=True)
class Settled:
    """The complete answer, handed to :func:`run_stream` before the body is drained."""

    value: Any


class SSEDecoder:
    """Incremental server-sent-events decoder over text lines (without line endings)."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def line(self, text: str) -> tuple[str, str] | None:
        """Feed one line; returns ``(event, data)`` when the line completes an event."""
        if text[:5] == "data:":  # most lines: tested first
            self._data.append(text[6:] if text[5:6] == " " else text[5:])
            return None
        if text == "":
            if not self._data:
                self._event = ""
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._data, self._event = [], ""
            return out
        if text.startswith(":"):
            return None
        name, _, value = text.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def end(self) -> tuple[str, str] | None:
        """The event still buffered when the body ended without a blank line."""
        return self.line("") if self._data else None


# -- cancellation that closes the connection --------------------------------------------------


class ConnectionTracker:
    """The open connections of one adapter, which :meth:`abort` shuts down from any thread.

    The adapter's transport (:class:`tether._models.http11.HTTP11Transport`) adds every
    connection it opens and discards it when closed; a connection is anything with a
    ``shutdown()`` that wakes a read blocked on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Shutdown] = set()
        self._doomed = 0  # calls ended by the watchdog that are still running

    def add(self, connection: Shutdown) -> None:
        with self._lock:
            self._open.add(connection)
            doomed = self._doomed > 0
        if doomed:  # made while its call was being ended (it was still connecting)
            connection.shutdown()

    def discard(self, connection: Shutdown) -> None:
        with self._lock:
            self._open.discard(connection)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def abort(self) -> None:
        """Shut down every open connection (the blocked reader wakes with an error)."""
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            connection.shutdown()

    def doom(self) -> None:
        """:meth:`abort`, and shut down at once every connection made until :meth:`spare`:
        a call ended while it was still connecting must not go on once connected."""
        with self._lock:
            self._doomed += 1
        self.abort()

    def spare(self) -> None:
        """The call :meth:`doom` ended has returned: connections may live again."""
        with self._lock:
            self._doomed -= 1


def tracked_http_client(
    tracker: ConnectionTracker,
    timeout: httpx2.Timeout,
    on_request: Callable[[httpx2.Request], None] | None = None,
) -> httpx2.Client:
    """An HTTP client whose connections ``tracker`` can shut down: httpx's client (the
    SDKs' own), on tether's HTTP/1.1 transport (:mod:`tether._models.http11`), which calls
    ``on_request`` with each request it is about to send."""
    transport = tracked_transport(tracker)
    transport.on_request = on_request
    return httpx2.Client(transport=transport, timeout=timeout, follow_redirects=True)


def tracked_transport(tracker: ConnectionTracker) -> HTTP11Transport:
    """Tether's HTTP/1.1 transport (what :func:`tracked_http_client` sends through), its
    connections tracked by ``tracker``."""
    from tether._models.http11 import HTTP11Transport

    return HTTP11Transport(tracker, _default_ssl_context(*_ssl_environment()))


def _ssl_environment() -> tuple[str | None, str | None]:
    return os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")


def _default_ssl_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx's default verifying context, built once per process (per ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR``, which it reads) and shared by every client.

    Building it loads the system's CA bundle, ~20 ms that every adapter (so every
    ``Agent(...)`` and every resume) paid again; one context serves any number of clients
    and threads (it is what httpx and :mod:`ssl` recommend). Under a lock: a worker's
    sessions make their first requests together, and :func:`functools.cache` alone let 14
    of them build it at once.
    """
    with _ssl_lock:
        return _build_ssl_context(cert_file, cert_dir)


_ssl_lock = threading.Lock()


@functools.cache
def _build_ssl_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx2.create_ssl_context(verify=True)


# -- the watchdog -----------------------------------------------------------------------------


Emit = Callable[[Delta | Settled | None], None]
"""What ``work`` calls: ``emit(None)`` when bytes arrived, ``emit(delta)`` for a delta,
``emit(Settled(answer))`` when the answer is complete (what is still read is only drained)."""


class _Watch:
    """One model call the watchdog watches: written by the calling thread (``last``,
    ``seen``, ``settled`` are plain attribute writes, made per chunk without waking
    anyone), read by the watchdog when a deadline it computed comes; ``fired`` is set by
    the watchdog, under ``lock``, only while ``done`` is false."""

    __slots__ = (
        "cancel",
        "done",
        "entries",
        "fired",
        "first_byte",
        "idle",
        "last",
        "lock",
        "seen",
        "settled",
        "tracker",
    )

    def __init__(
        self,
        tracker: ConnectionTracker,
        cancel: threading.Event | None,
        first_byte: float,
        idle: float,
    ) -> None:
        self.tracker = tracker
        self.cancel = cancel
        self.first_byte = first_byte
        self.idle = idle
        self.last = time.monotonic()  # when bytes last arrived (or the request started)
        self.seen = False  # whether any did: first-byte timeout before, idle timeout after
        self.settled: Settled | None = None
        self.fired: Literal["timeout", "aborted"] | None = None
        self.done = False
        self.entries = 0  # (the watchdog's, under its lock) its entries in the heap
        self.lock = threading.Lock()

    def deadline(self) -> float:
        return self.last + (self.idle if self.seen else self.first_byte)

    def fire(self, why: Literal["timeout", "aborted"]) -> None:
        """Shut the call's connection down (its blocked read ends in an error the caller
        turns into ``why``), unless the call has ended meanwhile: its connection may by now
        serve the adapter's next request."""
        with self.lock:
            if self.done or self.fired is not None:
                return
            self.fired = why
            self.tracker.doom()

    def end(self) -> Literal["timeout", "aborted"] | None:
        """(The caller.) The call is over: nothing fires after this; what fired before."""
        with self.lock:
            if not self.done and self.fired is not None:
                self.tracker.spare()
            self.done = True
            return self.fired


class _Watchdog:
    """The one thread that ends the model calls of a process that overrun their deadlines
    or are cancelled, by shutting their connections down.

    Why a thread of its own: a call runs on its caller's thread, blocked in a socket read,
    so something else must end it. One thread for every call of the process (not one per
    call): a worker's thousand sessions waiting on their models add no thread and no
    thread switch per request. A call costs a heap push and a lock; the watchdog sleeps
    until the earliest deadline, and wakes early only for a deadline earlier than that
    one (rare: the timeouts of a process are alike), a cancel, or every :data:`_POLL`
    seconds while a call's cancel cannot wake it (a plain :class:`threading.Event`).
    Deadlines move as bytes arrive without telling the watchdog: when an entry's time
    comes it reads the call's progress and, if bytes came meanwhile, files it again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._stale = 0  # entries of the heap whose call has ended
        self._polled: set[_Watch] = set()
        self._count = itertools.count()
        # Cancels and nudges: a SimpleQueue, whose put is safe in a signal handler (a
        # WakingEvent's set may run in tether run's SIGINT handler).
        self._inbox: queue.SimpleQueue[_Watch | None] = queue.SimpleQueue()
        self._sleeping_until = math.inf
        self.wakes = 0
        """How often the thread woke (the tests count it: a waiting call must cost none)."""
        self._thread = threading.Thread(target=self._run, name="tether-model-watchdog", daemon=True)
        self._thread.start()

    def watch(self, watch: _Watch, polled: bool) -> None:
        deadline = watch.deadline()
        with self._lock:
            self._file(watch, deadline)
            if polled:
                self._polled.add(watch)
            nudge = polled or deadline < self._sleeping_until
        if nudge:
            self._inbox.put(None)

    def unwatch(self, watch: _Watch) -> None:
        """(The call has ended.) Its entry is dropped lazily: when the heap holds more
        ended calls than live ones it is rebuilt, so a process making hundreds of requests a
        second neither grows it nor wakes the watchdog for each ended one."""
        with self._lock:
            self._polled.discard(watch)
            self._stale += watch.entries
            if self._stale > _STALE and self._stale * 2 > len(self._heap):
                live = []
                for entry in self._heap:
                    if entry[2].done:
                        entry[2].entries = 0
                    else:
                        live.append(entry)
                heapq.heapify(live)
                self._heap = live
                self._stale = 0

    def wake(self, watch: _Watch) -> None:
        """A cancel was set (possibly in a signal handler: only a put)."""
        self._inbox.put(watch)

    def refile(self, watch: _Watch) -> None:
        """The call's deadline moved earlier (its first bytes came and its idle timeout is
        shorter than its first-byte timeout): file it again at the new one."""
        deadline = watch.deadline()
        with self._lock:
            self._file(watch, deadline)
            nudge = deadline < self._sleeping_until
        if nudge:
            self._inbox.put(None)

    def _file(self, watch: _Watch, deadline: float) -> None:
        heapq.heappush(self._heap, (deadline, next(self._count), watch))
        watch.entries += 1

    def _run(self) -> None:
        inbox = self._inbox
        while True:
            with self._lock:
                now = time.monotonic()
                # A little late, to end the calls due close together in one wake.
                due = self._heap[0][0] + _SLACK if self._heap else math.inf
                until = min(due, now + _POLL) if self._polled else due
                self._sleeping_until = until
            try:
                woken: _Watch | None = inbox.get(
                    timeout=None if until == math.inf else max(until - now, 0.0)
                )
            except queue.Empty:
                woken = None
            self.wakes += 1
            try:
                if woken is not None:
                    woken.fire("aborted")
                self._check(time.monotonic())
            except Exception:  # pragma: no cover - the thread must outlive any one call
                # Nothing here is expected to raise (a shutdown's OSError is caught where it
                # is made); but a watchdog that died would leave every later call of the
                # process to the HTTP client's own read timeout.
                continue

    def _check(self, now: float) -> None:
        fire: list[tuple[_Watch, Literal["timeout", "aborted"]]] = []
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                _, _, watch = heapq.heappop(heap)
                watch.entries -= 1
                if watch.done:
                    self._stale -= 1
                    continue
                deadline = watch.deadline()
                if deadline > now:  # bytes came since: file it at its new deadline
                    self._file(watch, deadline)
                    continue
                fire.append((watch, "timeout"))
            for watch in self._polled:
                if watch.cancel is not None and watch.cancel.is_set():
                    fire.append((watch, "aborted"))
        for watch, why in fire:
            watch.fire(why)


_watchdog_lock = threading.Lock()
_watchdog: _Watchdog | None = None


def _the_watchdog() -> _Watchdog:
    global _watchdog
    dog = _watchdog
    if dog is None:
        with _watchdog_lock:
            if _watchdog is None:
                _watchdog = _Watchdog()
            dog = _watchdog
    return dog


def _forget_watchdog() -> None:  # a forked child has no watchdog thread: it makes its own
    global _watchdog, _watchdog_lock
    _watchdog = None
    _watchdog_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_watchdog)


def run_stream(
    work: Callable[[Emit], _T],
    *,
    cancel: threading.Event | None,
    tracker: ConnectionTracker,
    first_byte_timeout: float,
    idle_timeout: float,
    on_delta: DeltaSink | None,
    where: str,
) -> _T:
    """Run ``work`` on this thread, watched; return its result or raise.

    Before the first ``emit`` the call fails with ``timeout`` after ``first_byte_timeout``
    seconds, afterwards after ``idle_timeout`` seconds without an ``emit``; ``cancel``
    fails it with ``aborted``. Both shut the connection down (the watchdog's doing, see
    :class:`_Watchdog`), which ends ``work``'s blocked read. Deltas go to ``on_delta`` as
    ``work`` emits them. Once ``work`` emitted a :class:`Settled` answer, that answer is
    the result whatever happens next (a timeout or cancel while the body drains ends the
    drain, not the answer).
    """
    if cancel is not None and cancel.is_set():
        raise ModelError("aborted", "Operation aborted")
    watch = _Watch(tracker, cancel, first_byte_timeout, idle_timeout)
    dog = _the_watchdog()

    def emit(delta: Delta | Settled | None) -> None:
        watch.last = time.monotonic()
        if not watch.seen:  # set after ``last``: the watchdog that sees it sees the new time
            watch.seen = True
            if watch.idle < watch.first_byte:
                dog.refile(watch)
        if delta is None:
            return
        if isinstance(delta, Settled):
            watch.settled = delta
            return
        if on_delta is not None:
            try:
                on_delta(delta)
            except BaseException:
                tracker.abort()  # the caller is going away: so is the request
                raise
        if cancel is not None and cancel.is_set():  # seen at once while bytes flow
            watch.fire("aborted")
            raise ModelError("aborted", "Operation aborted")

    polled = cancel is not None and not isinstance(cancel, WakingEvent)
    dog.watch(watch, polled)
    try:
        with wake_on(cancel, lambda: dog.wake(watch)):
            try:
                result = work(emit)
            except BaseException as exc:
                fired = watch.end()
                settled = watch.settled
                if settled is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    return settled.value  # type: ignore[no-any-return]
                if fired == "aborted":
                    raise ModelError("aborted", "Operation aborted") from None
                if fired == "timeout":
                    raise _timeout(watch, where) from None
                raise
            return result
    finally:
        watch.end()
        dog.unwatch(watch)


def _timeout(watch: _Watch, where: str) -> ModelError:
    if watch.seen:
        return ModelError(
            "timeout",
            f"the answer from {where} stopped: nothing arrived for {watch.idle:g} s (idle timeout)",
        )
    return ModelError(
        "timeout", f"no answer from {where} within {watch.first_byte:g} s (first-byte timeout)"
    )


def drain(lines: Iterator[Any]) -> None:
    """Read what is left of a body after its last event, so its connection is kept.

    A server that breaks the connection at this point cost nothing: the answer is
    complete, and the pool simply does not keep that connection."""
    try:
        for _ in lines:
            pass
    except (httpx2.HTTPError, OSError):
        pass


def lines_of(chunks: Iterator[bytes], emit: Emit) -> Iterator[str]:
    """Decode a byte stream into text lines, calling ``emit(None)`` for every chunk.

    Linear in the bytes: a line that spans many chunks is joined once, when its end
    arrives (re-splitting a growing buffer per chunk would be quadratic in a long line)."""
    pending: list[bytes] = []
    for chunk in chunks:
        emit(None)
        if b"\n" not in chunk:
            if chunk:
                pending.append(chunk)
            continue
        lines = chunk.split(b"\n")
        if pending:
            pending.append(lines[0])
            lines[0] = b"".join(pending)
        last = lines.pop()
        pending = [last] if last else []
        for raw in lines:
            yield raw.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield b"".join(pending).rstrip(b"\r").decode("utf-8", "replace")
