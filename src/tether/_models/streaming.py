"""Streaming plumbing shared by the HTTP adapters: SSE decoding, the watchdog, cancellation.

* :class:`SSEDecoder` turns the lines of a ``text/event-stream`` body into ``(event, data)``
  pairs (the WHATWG rules that matter: ``data:`` lines joined by newlines, ``event:``,
  comments ignored, a blank line dispatches).
* :class:`ConnectionTracker` is an httpcore network backend that remembers the sockets it
  opened, so :meth:`ConnectionTracker.abort` can shut them down from another thread. A
  ``shutdown(SHUT_RDWR)`` wakes a read that is blocked in the worker thread and makes the
  server see the connection close: the provider stops generating (and billing) instead of
  finishing an answer nobody will read.
* :func:`run_stream` runs the blocking exchange on a worker thread (:func:`in_worker`: kept
  daemon threads, as starting a thread per request costs a few hundred microseconds on a
  busy machine) and watches it from the caller's thread: the first-byte timeout until the
  first line arrives, then the idle timeout between lines, and the cancel event. Deltas
  (answer text, reasoning text) are handed to ``on_delta`` on the caller's thread.
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
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

import httpcore2
import httpx2

from tether._clock import wake_on
from tether.errors import ModelError

__all__ = [
    "ConnectionTracker",
    "Delta",
    "DeltaSink",
    "SSEDecoder",
    "Settled",
    "drain",
    "in_worker",
    "run_stream",
    "tracked_http_client",
]

_T = TypeVar("_T")

_POLL: Final = 0.02
"""How often (seconds) the watchdog checks ``cancel`` and the clock."""


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


class _TrackedStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, tracker: ConnectionTracker) -> None:
        self._inner = inner
        self._tracker = tracker
        tracker._add(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._tracker._discard(self)
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        self._tracker._discard(self)
        return _TrackedStream(
            self._inner.start_tls(ssl_context, server_hostname, timeout), self._tracker
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def shutdown(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


class ConnectionTracker(httpcore2.NetworkBackend):
    """A network backend that can shut down every connection it opened, from any thread."""

    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()
        self._lock = threading.Lock()
        self._open: set[_TrackedStream] = set()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _TrackedStream(stream, self)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:  # pragma: no cover - tether never uses unix sockets
        return _TrackedStream(self._inner.connect_unix_socket(path, timeout, socket_options), self)

    def sleep(self, seconds: float) -> None:  # pragma: no cover - pool internals
        self._inner.sleep(seconds)

    def _add(self, stream: _TrackedStream) -> None:
        with self._lock:
            self._open.add(stream)

    def _discard(self, stream: _TrackedStream) -> None:
        with self._lock:
            self._open.discard(stream)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def abort(self) -> None:
        """Shut down every open connection (the blocked reader wakes with an error)."""
        with self._lock:
            streams = list(self._open)
        for stream in streams:
            stream.shutdown()


def tracked_http_client(tracker: ConnectionTracker, timeout: httpx2.Timeout) -> httpx2.Client:
    """An HTTP client whose connections ``tracker`` can shut down.

    httpx has no public hook for the network backend of its default transport, so the
    transport's pool gets the tracker after construction; if a future httpx renames the
    attribute, cancellation degrades to abandoning the request (and a test fails).
    """
    transport = httpx2.HTTPTransport(verify=_default_ssl_context(*_ssl_environment()))
    pool = getattr(transport, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend"):
        pool._network_backend = tracker
    return httpx2.Client(transport=transport, timeout=timeout, follow_redirects=True)


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


# -- worker threads ---------------------------------------------------------------------------

_KEPT_WORKERS: Final = 4
"""Idle worker threads kept for the next request (one per session driven at once)."""

_idle_lock = threading.Lock()
_idle: list[queue.SimpleQueue[Callable[[], None]]] = []


def _worker(inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
    while True:
        job = inbox.get()
        try:
            job()
        except BaseException:  # pragma: no cover - a job reports its own outcome
            pass
        with _idle_lock:
            if len(_idle) >= _KEPT_WORKERS:
                return
            _idle.append(inbox)


def in_worker(job: Callable[[], None]) -> None:
    """Run ``job`` on a daemon worker thread, an idle one if there is one.

    A worker abandoned by its caller (a timeout, a cancel) is simply busy until its
    request ends; the next request gets another thread. ``job`` must not raise: it hands
    its outcome to whoever waits for it."""
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(
            target=_worker, args=(inbox,), name="tether-model-request", daemon=True
        ).start()
    inbox.put(job)


# -- the watchdog -----------------------------------------------------------------------------


Emit = Callable[[Delta | Settled | None], None]
"""What the worker calls: ``emit(None)`` when bytes arrived, ``emit(delta)`` for a delta,
``emit(Settled(answer))`` when the answer is complete (what is still read is only drained)."""


class _Progress:
    """What the request's thread has seen so far, written by ``emit`` and read by the
    waiting caller whenever it wakes. Plain attribute writes, not messages: a message per
    chunk would wake the caller for every token of a stream, and a worker waiting on
    hundreds of streams would spend its CPU handing the GIL back and forth. Only what the
    caller must act on wakes it: the first bytes (its deadline changes from the first-byte
    timeout to the idle timeout), a delta when someone listens (``on_delta``), the result,
    an error, a cancel."""

    __slots__ = ("last", "seen", "settled")

    def __init__(self, now: float) -> None:
        self.last = now  # when bytes last arrived (or the request started)
        self.seen = False  # whether any did: first-byte timeout before, idle timeout after
        self.settled: Settled | None = None


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
    """Run ``work`` on a worker thread; return its result or raise.

    Before the first ``emit`` the call fails with ``timeout`` after ``first_byte_timeout``
    seconds, afterwards after ``idle_timeout`` seconds without an ``emit``; ``cancel``
    fails it with ``aborted``. Both shut the connection down first. Exceptions of
    ``work`` are re-raised on the caller's thread. Once ``work`` emitted a
    :class:`Settled` answer, that answer is the result whatever happens next (a timeout
    or cancel while the body drains returns it; the drain goes on on its own thread).
    """
    inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    progress = _Progress(time.monotonic())

    def emit(delta: Delta | Settled | None) -> None:
        progress.last = time.monotonic()
        if not progress.seen:  # set after ``last``: a caller that sees it sees the new time
            progress.seen = True
            inbox.put(("wake", None))  # its deadline changes: the idle timeout's from now on
        if isinstance(delta, Settled):
            progress.settled = delta
        elif delta is not None and on_delta is not None:
            inbox.put(("delta", delta))

    def target() -> None:
        try:
            inbox.put(("done", work(emit)))
        except BaseException as exc:  # handed to the waiting caller
            inbox.put(("error", exc))

    in_worker(target)
    # A cancel that can wake this wait puts "wake" in the inbox; any other cancel is polled
    # (a worker's 1,000 sessions waiting on their models would wake 50,000 times a second).
    with wake_on(cancel, lambda: inbox.put(("wake", None))) as woken:
        poll = None if woken or cancel is None else _POLL
        while True:
            limit = idle_timeout if progress.seen else first_byte_timeout
            remaining = progress.last + limit - time.monotonic()
            try:
                kind, value = inbox.get(
                    timeout=max(remaining if poll is None else min(poll, remaining), 0.0)
                )
            except queue.Empty:
                kind, value = "wake", None
            settled = progress.settled
            if kind == "wake":
                seen = progress.seen
                limit = idle_timeout if seen else first_byte_timeout
                expired = time.monotonic() - progress.last >= limit
                if settled is not None and ((cancel is not None and cancel.is_set()) or expired):
                    tracker.abort()  # the drain stalled: give the connection up, keep the answer
                    return settled.value  # type: ignore[no-any-return]
                if cancel is not None and cancel.is_set():
                    tracker.abort()
                    raise ModelError("aborted", "Operation aborted") from None
                if expired:
                    tracker.abort()
                    if seen:
                        raise ModelError(
                            "timeout",
                            f"the answer from {where} stopped: nothing arrived for {limit:g} s "
                            "(idle timeout)",
                        ) from None
                    raise ModelError(
                        "timeout",
                        f"no answer from {where} within {limit:g} s (first-byte timeout)",
                    ) from None
                continue
            if kind == "delta":  # only sent when someone listens (see _Progress)
                if on_delta is not None:
                    try:
                        on_delta(value)
                    except BaseException:
                        tracker.abort()  # the caller is going away: so is the request
                        raise
                if cancel is not None and cancel.is_set() and settled is None:
                    tracker.abort()
                    raise ModelError("aborted", "Operation aborted")
                continue
            if kind == "error":
                if settled is not None:
                    return settled.value  # type: ignore[no-any-return]
                raise value
            return value  # type: ignore[no-any-return]


def drain(lines: Iterator[Any]) -> None:
    """Read what is left of a body after its last event, so its connection is kept.

    A server that breaks the connection at this point cost nothing: the answer is
    complete, and the pool simply does not keep that connection."""
    try:
        for _ in lines:
            pass
    except (httpx2.HTTPError, httpcore2.NetworkError, OSError):
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
