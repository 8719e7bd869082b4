"""The adapters' HTTP/1.1 transport (``tether._models.http11``) against a real server.

A raw socket server on loopback answers as each test scripts it (fixed-length and chunked
bodies, a connection closed while idle, an answer cut short, no answer at all), so what is
checked is what crosses the wire: how many connections were made, which errors come back
(httpx's, as the SDKs expect), and that the tracker can end a blocked read.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx2
import pytest

from tether._models.streaming import ConnectionTracker, tracked_http_client

Script = Callable[[socket.socket, int], None]
"""``script(connection, index)``: answer on one accepted connection (``index``: how many
connections came before it)."""


class RawServer:
    """Accepts connections on loopback and hands each to ``script`` on a thread."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            index = self.connections
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn, index), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        with conn:
            try:
                self.script(conn, index)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def read_request(conn: socket.socket) -> bytes:
    """One request (head and a Content-Length body), or b"" when the client hung up."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return b""
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head


def fixed(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in ("HTTP/1.1 200 OK", *extra))
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(*pieces: bytes) -> bytes:
    out = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for piece in pieces:
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\n\r\n"


@pytest.fixture
def serve() -> Iterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script) -> RawServer:
        server = RawServer(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def client(tracker: ConnectionTracker | None = None, timeout: float = 5.0) -> httpx2.Client:
    return tracked_http_client(tracker or ConnectionTracker(), httpx2.Timeout(timeout))


def post(http: httpx2.Client, url: str, body: bytes = b"{}") -> httpx2.Response:
    return http.post(url, content=body, headers={"Content-Type": "application/json"})


def keep_answering(answer: bytes) -> Script:
    def script(conn: socket.socket, index: int) -> None:
        while read_request(conn):
            conn.sendall(answer)

    return script


class TestKeptAlive:
    @pytest.mark.parametrize(
        "answer", [fixed(b'{"ok": true}'), chunked(b"data: 1\n\n", b"data: [DONE]\n\n")]
    )
    def test_one_connection_for_many_requests(
        self, serve: Callable[[Script], RawServer], answer: bytes
    ) -> None:
        server = serve(keep_answering(answer))
        tracker = ConnectionTracker()
        with client(tracker) as http:
            bodies = [post(http, server.url, b"x" * 300_000).content for _ in range(3)]
            assert tracker.open_connections == 1  # idle in the pool, still tracked
        assert bodies == [bodies[0]] * 3 and bodies[0]
        assert server.connections == 1
        assert tracker.open_connections == 0  # closing the client closed it

    def test_a_streamed_answer_read_in_pieces(self, serve: Callable[[Script], RawServer]) -> None:
        events = [b"data: %d\n\n" % i for i in range(50)]
        server = serve(keep_answering(chunked(*events)))
        with client() as http, http.stream("POST", server.url, content=b"{}") as response:
            assert response.headers["content-type"] == "text/event-stream"
            assert b"".join(response.iter_bytes()) == b"".join(events)

    def test_an_idle_connection_the_server_closed_is_not_used(
        self, serve: Callable[[Script], RawServer]
    ) -> None:
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            conn.sendall(fixed(b"%d" % index))  # then hang up without saying so

        server = serve(script)
        with client() as http:
            first = post(http, server.url).content
            time.sleep(0.2)  # the server's close reaches the idle connection
            second = post(http, server.url).content
        assert (first, second) == (b"0", b"1")
        assert server.connections == 2

    def test_connection_close_is_honoured(self, serve: Callable[[Script], RawServer]) -> None:
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            conn.sendall(fixed(b"done", "Connection: close"))

        server = serve(script)
        tracker = ConnectionTracker()
        with client(tracker) as http:
            assert [post(http, server.url).content for _ in range(2)] == [b"done", b"done"]
            assert tracker.open_connections == 0
        assert server.connections == 2

    def test_an_answer_closed_early_closes_its_connection(
        self, serve: Callable[[Script], RawServer]
    ) -> None:
        server = serve(keep_answering(chunked(b"data: 1\n\n", b"x" * 100_000)))
        tracker = ConnectionTracker()
        with client(tracker) as http:
            with http.stream("POST", server.url, content=b"{}") as response:
                next(response.iter_raw(16))
            assert tracker.open_connections == 0
            assert post(http, server.url).status_code == 200
        assert server.connections == 2


class TestWire:
    def test_a_body_of_unknown_length_is_sent_chunked(
        self, serve: Callable[[Script], RawServer]
    ) -> None:
        received: list[bytes] = []

        def script(conn: socket.socket, index: int) -> None:
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                data += conn.recv(65536)
            received.append(data)
            conn.sendall(fixed(b"ok"))

        server = serve(script)
        with client() as http:
            answer = http.post(server.url, content=iter([b"hello ", b"world"]))
        assert answer.content == b"ok"
        head, _, body = received[0].partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower()
        assert body == b"b\r\nhello world\r\n0\r\n\r\n"

    def test_header_bytes_come_through_as_sent(self, serve: Callable[[Script], RawServer]) -> None:
        # Not ASCII: a server's own bytes (http.client reads the head as ISO-8859-1).
        server = serve(keep_answering(fixed(b"{}", "X-Note: café")))  # sent as UTF-8
        with client() as http:
            answer = post(http, server.url)
        assert answer.headers.raw[0] == (b"X-Note", "café".encode())


class TestErrors:
    def test_nobody_listening_is_a_connect_error(self) -> None:
        spare = socket.create_server(("127.0.0.1", 0))
        port = spare.getsockname()[1]
        spare.close()
        with client() as http, pytest.raises(httpx2.ConnectError):
            post(http, f"http://127.0.0.1:{port}/v1")

    def test_no_answer_in_time_is_a_read_timeout(
        self, serve: Callable[[Script], RawServer]
    ) -> None:
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            time.sleep(3)

        server = serve(script)
        started = time.monotonic()
        with client(timeout=0.3) as http, pytest.raises(httpx2.ReadTimeout):
            post(http, server.url)
        assert time.monotonic() - started < 2.5

    def test_a_hang_up_before_the_answer(self, serve: Callable[[Script], RawServer]) -> None:
        server = serve(lambda conn, index: (read_request(conn), None)[1])
        with client() as http, pytest.raises(httpx2.RemoteProtocolError, match="disconnected"):
            post(http, server.url)

    def test_a_body_cut_short(self, serve: Callable[[Script], RawServer]) -> None:
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

        server = serve(script)
        with client() as http, pytest.raises(httpx2.RemoteProtocolError, match="complete"):
            post(http, server.url)

    def test_not_http_at_all(self, serve: Callable[[Script], RawServer]) -> None:
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        server = serve(script)
        with client() as http, pytest.raises(httpx2.RemoteProtocolError):
            post(http, server.url)

    def test_an_unsupported_scheme(self) -> None:
        with client() as http, pytest.raises(httpx2.UnsupportedProtocol):
            post(http, "ftp://127.0.0.1/v1")

    def test_a_closed_client(self, serve: Callable[[Script], RawServer]) -> None:
        server = serve(keep_answering(fixed(b"{}")))
        http = client()
        http.close()
        with pytest.raises(RuntimeError):  # httpx's own refusal, before the transport
            post(http, server.url)


class TestTracked:
    def test_abort_ends_a_blocked_read(self, serve: Callable[[Script], RawServer]) -> None:
        # The watchdog's way to end an overdue or cancelled call: shut its sockets down.
        def script(conn: socket.socket, index: int) -> None:
            read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            time.sleep(5)

        server = serve(script)
        tracker = ConnectionTracker()
        with client(tracker, timeout=30) as http:
            threading.Timer(0.3, tracker.abort).start()
            started = time.monotonic()
            with http.stream("POST", server.url, content=b"{}") as response:
                pieces = response.iter_raw()
                assert next(pieces) == b"hello"
                with pytest.raises(httpx2.TransportError):
                    next(pieces)
            assert time.monotonic() - started < 3
            assert tracker.open_connections == 0

    def test_a_connection_made_while_doomed_is_shut_down(
        self, serve: Callable[[Script], RawServer]
    ) -> None:
        # The watchdog ends a call by shutting its connections down; one still being made
        # at that moment is shut down as soon as it is made (else the call would go on,
        # connected, after it was ended), until the ended call has returned (spare).
        server = serve(keep_answering(fixed(b"{}")))
        tracker = ConnectionTracker()
        tracker.doom()
        with client(tracker) as http, pytest.raises(httpx2.TransportError):
            post(http, server.url)
        tracker.spare()
        with client(tracker) as http:
            assert post(http, server.url).status_code == 200


HEADS = [
    b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Empty:\r\nX-Spaces:   padded  \r\n\r\n",
    b"X-Folded: first\r\n  second line\r\nContent-Length: 3\r\n\r\n",  # obs-fold
    b"Bad Name: x\r\nContent-Length: 3\r\n\r\n",  # not a header name
    b"X-Note: caf\xc3\xa9\r\nx-lower: v\r\n\r\n",
    b"No-Colon-Here\r\nContent-Length: 3\r\n\r\n",
    b"X-Tab:\tvalue\t\r\n\n",
]


@pytest.mark.parametrize("head", HEADS)
def test_the_head_parses_as_http_client_parses_it(head: bytes) -> None:
    # The fast path of _parse_head must give what http.client's email-based parser gives.
    import http.client
    import io

    from tether._models.http11 import _parse_head

    ours = _parse_head(io.BytesIO(head + b"body"))
    theirs = http.client.parse_headers(io.BytesIO(head + b"body"))
    assert ours.items() == theirs.items()
    assert ours.get_all("set-cookie") == theirs.get_all("set-cookie")
