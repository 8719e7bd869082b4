"""Hubs (tether._hub): many sessions on one thread, each parked while it waits.

Every test runs real greenlets on a real hub thread and waits on real sockets, pipes and
processes. A hub that blocked its thread on one session's wait (instead of parking it)
fails them: the other sessions would never get to run while it waits.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest

from tether._clock import SYSTEM_CLOCK, WakingEvent
from tether._hub import Hub, offload, on_hub, pause, wait_event, wait_readable
from tether._models.http11 import HTTP11Transport
from tether._procs import run_in_group

WAIT = 10.0  # generous: only a broken hub ever waits this long


@pytest.fixture
def hub() -> Iterator[Hub]:
    helpers = ThreadPoolExecutor(8, thread_name_prefix="test-helper")
    the_hub = Hub("test-hub", helpers)
    yield the_hub
    the_hub.close()
    helpers.shutdown()


def _wait_for(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class _Sessions:
    """Spawns sessions on a hub and collects what they return or raise."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.results: dict[int, Any] = {}
        self.lock = threading.Lock()

    def spawn(self, key: int, run: Callable[[], Any]) -> None:
        def session() -> None:
            try:
                value = run()
            except BaseException as exc:
                value = exc
            with self.lock:
                self.results[key] = value

        self.hub.spawn(session)

    def wait(self, count: int) -> dict[int, Any]:
        _wait_for(lambda: len(self.results) >= count)
        return self.results


def test_sessions_wait_for_their_sockets_at_once(hub: Hub) -> None:
    pairs = [socket.socketpair() for _ in range(100)]
    parked = [0]
    sessions = _Sessions(hub)

    def reader(sock: socket.socket) -> Callable[[], bytes]:
        def run() -> bytes:
            assert on_hub()
            parked[0] += 1
            wait_readable(sock, WAIT)
            return sock.recv(100)

        return run

    for n, (ours, _) in enumerate(pairs):
        sessions.spawn(n, reader(ours))
    # All 100 are waiting at once, on one thread: none had its answer yet.
    _wait_for(lambda: parked[0] == 100)
    assert hub.sessions == 100
    for n, (_, theirs) in reversed(list(enumerate(pairs))):
        theirs.sendall(b"answer %d" % n)
    results = sessions.wait(100)
    assert results == {n: b"answer %d" % n for n in range(100)}
    _wait_for(lambda: hub.sessions == 0)
    for ours, theirs in pairs:
        ours.close()
        theirs.close()


def test_a_read_times_out_and_others_go_on(hub: Hub) -> None:
    silent, _peer = socket.socketpair()
    talking, talker = socket.socketpair()
    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: wait_readable(silent, 0.3))
    sessions.spawn(1, lambda: (wait_readable(talking, WAIT), talking.recv(10))[1])
    talker.sendall(b"hi")
    _wait_for(lambda: 1 in sessions.results)
    assert sessions.results[1] == b"hi"
    assert 0 not in sessions.results  # still waiting for its timeout
    results = sessions.wait(2)
    assert isinstance(results[0], TimeoutError)
    for sock in (silent, _peer, talking, talker):
        sock.close()


def test_a_peer_that_hangs_up_wakes_the_read(hub: Hub) -> None:
    ours, theirs = socket.socketpair()
    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: (wait_readable(ours, WAIT), ours.recv(10))[1])
    time.sleep(0.05)
    theirs.shutdown(socket.SHUT_RDWR)  # what the watchdog does to an overdue call
    assert sessions.wait(1)[0] == b""
    ours.close()
    theirs.close()


def test_offload_runs_on_a_helper_while_the_hub_goes_on(hub: Hub) -> None:
    release = threading.Event()
    sessions = _Sessions(hub)

    def blocking() -> str:
        release.wait(WAIT)
        return threading.current_thread().name

    sessions.spawn(0, lambda: offload(blocking))
    sessions.spawn(1, lambda: "quick")
    _wait_for(lambda: 1 in sessions.results)  # not held behind the offloaded call
    assert 0 not in sessions.results
    release.set()
    results = sessions.wait(2)
    assert results[0].startswith("test-helper")


def test_offload_raises_what_the_call_raised(hub: Hub) -> None:
    def fails() -> None:
        raise KeyError("missing")

    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: offload(fails))
    error = sessions.wait(1)[0]
    assert isinstance(error, KeyError)
    assert error.args == ("missing",)


def test_a_waking_event_ends_a_parked_wait(hub: Hub) -> None:
    event = WakingEvent()
    sessions = _Sessions(hub)
    started = time.monotonic()
    sessions.spawn(0, lambda: SYSTEM_CLOCK.wait(event, 60.0))
    sessions.spawn(1, lambda: "not held")
    _wait_for(lambda: 1 in sessions.results)
    threading.Timer(0.1, event.set).start()
    assert sessions.wait(2)[0] is True
    assert time.monotonic() - started < WAIT


def test_a_plain_event_is_polled_and_a_timeout_returns_false(hub: Hub) -> None:
    plain = threading.Event()
    never = WakingEvent()
    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: wait_event(plain, 60.0))
    sessions.spawn(1, lambda: wait_event(never, 0.2))
    _wait_for(lambda: 1 in sessions.results)
    assert sessions.results[1] is False
    plain.set()
    assert sessions.wait(2)[0] is True


def test_pause_parks(hub: Hub) -> None:
    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: SYSTEM_CLOCK.sleep(0.5))
    sessions.spawn(1, lambda: time.monotonic())
    started = time.monotonic()
    results = sessions.wait(2)
    assert results[1] - started < 0.5  # ran during the other's pause
    assert results[0] is None


def test_a_session_that_raises_is_reported_and_the_hub_goes_on(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))

    def broken() -> None:
        raise RuntimeError("a bug")

    hub.spawn(broken)
    sessions = _Sessions(hub)
    sessions.spawn(0, lambda: "after")
    assert sessions.wait(1)[0] == "after"
    _wait_for(lambda: bool(seen))
    assert isinstance(seen[0], RuntimeError)
    _wait_for(lambda: hub.sessions == 0)


def test_off_a_hub_everything_is_the_plain_call() -> None:
    assert not on_hub()
    ours, theirs = socket.socketpair()
    wait_readable(ours, 0.0)  # returns at once: the caller's read blocks instead
    assert offload(threading.current_thread) is threading.current_thread()
    event = threading.Event()
    assert wait_event(event, 0.01) is False
    started = time.monotonic()
    pause(0.05)
    assert time.monotonic() - started >= 0.05
    ours.close()
    theirs.close()


def test_a_closed_hub_takes_no_session() -> None:
    helpers = ThreadPoolExecutor(1)
    hub = Hub("closing", helpers)
    hub.close()
    with pytest.raises(RuntimeError, match="closed"):
        hub.spawn(lambda: None)
    helpers.shutdown()


def test_a_command_parks_its_session(hub: Hub, tmp_path: Any) -> None:
    sessions = _Sessions(hub)

    def command() -> tuple[int | None, bytes]:
        out: list[bytes] = []
        finished = run_in_group(
            ["/bin/sh", "-c", "sleep 0.5; echo done"],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin"},
            timeout=WAIT,
            on_output=out.append,
        )
        return finished.returncode, b"".join(out)

    sessions.spawn(0, command)
    sessions.spawn(1, lambda: "while the command ran")
    _wait_for(lambda: 1 in sessions.results)
    assert 0 not in sessions.results
    assert sessions.wait(2)[0] == (0, b"done\n")


class _Gathering(BaseHTTPRequestHandler):
    """Answers no request before ``expected`` requests are in at once (or 5 s passed)."""

    expected = 0
    arrived = 0
    lock = threading.Lock()
    all_in = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        with cls.lock:
            cls.arrived += 1
            if cls.arrived == cls.expected:
                cls.all_in.set()
        together = cls.all_in.wait(5.0)
        body = b'{"together": %s}' % (b"true" if together else b"false")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Tracker:
    def add(self, connection: Any) -> None:
        pass

    def discard(self, connection: Any) -> None:
        pass


def test_model_requests_wait_for_their_answers_together(hub: Hub) -> None:
    """20 requests from 20 sessions of one hub thread are all in flight at once: each
    session's read of its answer parks it. (Blocked in its read, the first session would
    hold the thread, and the server would answer it alone, after 5 s, "together": false.)"""
    import ssl

    class Handler(_Gathering):
        expected = 20
        arrived = 0
        lock = threading.Lock()
        all_in = threading.Event()

    class Server(ThreadingHTTPServer):
        request_queue_size = 64  # twenty connections at once (socketserver's default: 5)

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = httpx2.URL(f"http://127.0.0.1:{server.server_address[1]}/v1/chat")
    transport = HTTP11Transport(_Tracker(), ssl.create_default_context())
    sessions = _Sessions(hub)

    def request() -> bytes:
        response = transport.send(
            "POST",
            url,
            [(b"Host", b"127.0.0.1"), (b"Content-Length", b"2")],
            b"{}",
            {"connect": WAIT, "read": WAIT, "write": WAIT},
        )
        return b"".join(response.stream)  # type: ignore[union-attr]

    try:
        for n in range(20):
            sessions.spawn(n, request)
        results = sessions.wait(20)
        assert set(results.values()) == {b'{"together": true}'}
    finally:
        transport.close()
        server.shutdown()
        server.server_close()


def test_a_tls_connection_is_made_parked_and_checked(hub: Hub, tmp_path: Any) -> None:
    """A session on a hub connects over TLS (the connect and each handshake step parked):
    the answer arrives through a certificate its authority signed, and a certificate for
    another name is refused, as off a hub."""
    import ssl

    import trustme

    authority = trustme.CA()
    served = authority.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.configure_cert(server_context)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    sessions = _Sessions(hub)

    def request(context: ssl.SSLContext, host: str) -> bytes:
        transport = HTTP11Transport(_Tracker(), context)
        try:
            response = transport.send(
                "POST",
                httpx2.URL(f"https://{host}:{port}/v1/chat"),
                [(b"Host", host.encode()), (b"Content-Length", b"2")],
                b"{}",
                {"connect": WAIT, "read": WAIT, "write": WAIT},
            )
            return b"".join(response.stream)  # type: ignore[union-attr]
        finally:
            transport.close()

    try:
        sessions.spawn(0, lambda: request(trusting, "127.0.0.1"))
        sessions.spawn(1, lambda: request(ssl.create_default_context(), "127.0.0.1"))
        results = sessions.wait(2)
        assert results[0] == b'{"ok": true}'
        assert isinstance(results[1], httpx2.ConnectError)
        assert "certificate verify failed" in str(results[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_refused_connection_fails_at_once_parked(hub: Hub) -> None:
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens there now
    transport = HTTP11Transport(_Tracker(), __import__("ssl").create_default_context())
    sessions = _Sessions(hub)
    sessions.spawn(
        0,
        lambda: transport.send(
            "POST",
            httpx2.URL(f"http://127.0.0.1:{port}/"),
            [(b"Host", b"127.0.0.1"), (b"Content-Length", b"0")],
            b"",
            {"connect": WAIT, "read": WAIT, "write": WAIT},
        ),
    )
    error = sessions.wait(1)[0]
    assert isinstance(error, httpx2.ConnectError)
    assert "refused" in str(error).lower()
    transport.close()


def test_each_new_session_gets_to_its_first_wait_before_the_next_starts(hub: Hub) -> None:
    """Three sessions queued at once: each runs through a step of its start (a connection
    being made, which does not count as waiting on the world) to its first wait on the
    world before the next starts; the ones waiting on the world go on only after that
    (tether._hub.Hub._wake)."""
    from tether._hub import wait_writable

    log: list[str] = []
    hold = threading.Event()
    ours, theirs = socket.socketpair()  # writable at once, as a connection just made

    def blocker() -> None:  # holds the hub's thread while the three are queued
        hold.wait(WAIT)

    def session(n: int) -> None:
        log.append(f"start {n}")
        wait_writable(ours, WAIT, setup=True)
        log.append(f"resumed {n}")
        pause(0.05)  # a wait on the world
        log.append(f"on {n}")

    hub.spawn(blocker)
    _wait_for(lambda: hub.sessions == 1)
    for n in range(3):
        hub.spawn(lambda n=n: session(n))
    hold.set()
    _wait_for(lambda: len(log) == 9)
    assert log == [
        "start 0",
        "resumed 0",
        "start 1",
        "resumed 1",
        "start 2",
        "resumed 2",
        "on 0",
        "on 1",
        "on 2",
    ]
    ours.close()
    theirs.close()


def test_a_session_woken_by_a_wake_runs_before_new_ones(hub: Hub) -> None:
    """A Wake's session (a group commit's follower, maybe just handed the lead that every
    committer waits on) runs before the hub's queue of new sessions, even when it has
    waited on the world before (which puts a session behind new ones otherwise)."""
    from tether._hub import Wake

    log: list[str] = []
    hold = threading.Event()
    wakes: list[Wake] = []

    def follower() -> None:
        pause(0.01)  # has waited on the world: no longer starting
        wake = Wake()
        wakes.append(wake)
        wake.wait()
        log.append("follower")

    hub.spawn(follower)
    _wait_for(lambda: bool(wakes))
    hub.spawn(lambda: hold.wait(WAIT))  # holds the hub's thread meanwhile
    _wait_for(lambda: hub.sessions == 2)
    time.sleep(0.05)
    for n in range(2):
        hub.spawn(lambda n=n: log.append(f"new {n}"))
    wakes[0].set()
    hold.set()
    _wait_for(lambda: len(log) == 3)
    assert log == ["follower", "new 0", "new 1"]
