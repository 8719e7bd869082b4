"""The model adapters' HTTP/1.1 transport: httpx's transport seam on the standard library.

The SDKs send through an ``httpx`` client that tether builds (:func:`tracked_http_client`
in :mod:`tether._models.streaming`); this module is that client's transport for ``http`` and
``https`` URLs. It speaks HTTP/1.1 with :mod:`http.client`, keeps connections alive per
origin and registers every connection with the adapter's
:class:`~tether._models.streaming.ConnectionTracker`, so that a cancelled or overdue call
can still be ended by shutting its socket down.

Why not httpx's default transport (httpcore and h11): a model request is a large body out
and a short answer back, and on loopback httpcore's and h11's event machinery (header
objects, validation by regular expressions, the pool's request queue) cost ~0.25 ms a
request above the same exchange on :mod:`http.client`, a third of a turn's own work at
200 turns (``bench/bench_loop.py``). Everything else stays httpx's and the SDKs': the
``Request`` and ``Response`` objects, redirects, proxies (mounted by the client from the
environment, with httpx's own transports), content decoding, and the SDKs' error types.

Rules of this module:

* **Errors are httpx's.** A failure to connect is ``ConnectError``/``ConnectTimeout``,
  while sending ``WriteError``/``WriteTimeout``, while reading ``ReadError``/
  ``ReadTimeout``, and a peer that breaks the protocol (or hangs up before its answer is
  complete) ``RemoteProtocolError``; the SDKs map these as they map httpcore's.
* **A connection goes back to the pool only when its answer was read to the end** and the
  server did not ask to close it; an answer closed early closes its connection.
* **An idle connection is checked before reuse**: a socket that is readable while idle
  was closed by the server (or sent garbage) and is dropped, as httpcore does.
* **Timeouts are the request's** (``extensions["timeout"]``): ``connect`` for the
  connection, ``write`` while the request is sent, ``read`` while the answer is read.
"""

from __future__ import annotations

import email.parser
import errno
import http.client
import os
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol, cast

import httpx2

from tether._hub import offload, on_hub, wait_readable, wait_writable

__all__ = ["HTTP11Transport", "Shutdown", "Tracker"]

_IDLE_PER_ORIGIN: Final = 8
"""Idle connections kept per origin (an adapter drives one request at a time; a few sessions
may share it)."""

_CHUNK: Final = 65536

_NAME: Final = re.compile(r"[!-9;-~]+")
"""A header name as the email parser takes one: printable ASCII but the colon, no space."""

Origin = tuple[str, str, int]


class Shutdown(Protocol):
    """A connection as a tracker sees it."""

    def shutdown(self) -> None:
        """Shut the socket down: a read blocked on it wakes with an error."""


class Tracker(Protocol):
    """Where the transport registers its connections
    (:class:`tether._models.streaming.ConnectionTracker`)."""

    def add(self, connection: Shutdown) -> None: ...

    def discard(self, connection: Shutdown) -> None: ...


class _Connection:
    """One kept-alive connection; the tracker shuts it down from any thread."""

    __slots__ = ("http",)

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.http = conn

    def shutdown(self) -> None:
        sock = self.http.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


class _HubSocketIO(socket.SocketIO):
    """The raw reader under an answer. On a hub (:mod:`tether._hub`), a read parks the
    session until the socket has bytes, so that waiting for a model holds no thread; off a
    hub it is :class:`socket.SocketIO`'s read. A TLS socket with decrypted bytes pending
    is read at once: its file descriptor may have nothing more to say."""

    def readinto(self, b: Any) -> int | None:
        sock = cast(socket.socket, self._sock)  # type: ignore[attr-defined]
        if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            try:
                wait_readable(sock, sock.gettimeout())
            except TimeoutError:
                self._timeout_occurred = True  # as SocketIO marks it
                raise
        return super().readinto(b)


class _Response(http.client.HTTPResponse):
    """:class:`http.client.HTTPResponse` whose head is parsed without the ``email`` package.

    ``begin`` is http.client's own, but for the headers: ``parse_headers`` runs the email
    feed parser (~25 us for a model server's half-dozen headers, as much as the rest of the
    exchange's Python); a head of plain ``Name: value`` lines is split here instead, into
    the same :class:`http.client.HTTPMessage`. Anything else (a folded continuation line,
    a line without a colon) goes to ``parse_headers`` as before."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        raw = cast(Any, self.fp).raw
        if type(raw) is socket.SocketIO:
            raw.__class__ = _HubSocketIO  # the same object and layout, the read above

    def begin(self) -> None:
        if cast(Any, self).headers is not None:  # begun already (None until then)
            return
        while True:
            version, status, reason = self._read_status()  # type: ignore[attr-defined]
            if status != http.client.CONTINUE:
                break
            http.client._read_headers(self.fp)  # type: ignore[attr-defined]
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = _parse_head(self.fp)
        encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(encoding and encoding.lower() == "chunked")
        self.chunk_left = None
        self.will_close = self._check_close()  # type: ignore[attr-defined]
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        if (
            status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
            or 100 <= status < 200
            or self._method == "HEAD"  # type: ignore[attr-defined]
        ):
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


def _parse_head(fp: Any) -> http.client.HTTPMessage:
    """The header lines up to the blank line, as http.client's ``parse_headers`` gives them."""
    lines: list[bytes] = http.client._read_headers(fp)  # type: ignore[attr-defined]
    message = http.client.HTTPMessage()
    for raw in lines:
        if raw in (b"\r\n", b"\n", b""):
            break
        name, colon, value = raw.decode("iso-8859-1").partition(":")
        if not colon or _NAME.fullmatch(name) is None:
            # Folded or malformed: the email parser's rules, on the same lines.
            text = b"".join(lines).decode("iso-8859-1")
            parser = email.parser.Parser(_class=http.client.HTTPMessage)
            return parser.parsestr(text)
        message[name] = value.lstrip(" \t").rstrip("\r\n")  # as the email parser keeps it
    return message


class HTTP11Transport(httpx2.BaseTransport):
    """An httpx transport over :mod:`http.client` (see the module docstring)."""

    def __init__(self, tracker: Tracker, ssl_context: ssl.SSLContext) -> None:
        self._tracker = tracker
        self._ssl_context = ssl_context
        self._lock = threading.Lock()
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False
        self.on_request: Callable[[httpx2.Request], None] | None = None
        """Called with each request :meth:`handle_request` is about to send (an adapter
        learns how its SDK sends a request before the answer comes)."""

    # -- the exchange -------------------------------------------------------------------------

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.on_request is not None:
            self.on_request(request)
        body = request.read()
        if request.headers.get("transfer-encoding", "").lower() == "chunked":
            # A body of unknown length (a generator): read whole, sent as one chunk.
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        return self.send(
            request.method,
            request.url,
            request.headers.raw,
            body,
            request.extensions.get("timeout") or {},
            request,
        )

    def send(
        self,
        method: str,
        url: httpx2.URL,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Mapping[str, float | None],
        request: httpx2.Request | None = None,
    ) -> httpx2.Response:
        """One exchange, from its parts: what :meth:`handle_request` does with a request's.

        An adapter that sends the same request again and again with another body calls it
        directly, without building an ``httpx.Request`` each time (~20 us); ``request``,
        for the errors, may then be ``None``, and the response has none set."""
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx2.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme}://'.", request=request
            )
        origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        connection = self._connection(origin, timeouts.get("connect"), request)
        conn = connection.http
        sock = conn.sock
        try:
            assert sock is not None
            sock.settimeout(timeouts.get("write"))
            target = url.raw_path.decode("ascii")
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body or None)  # one send: the head and the body together
        except BaseException as exc:
            self._drop(connection)
            if isinstance(exc, Exception):
                raise _mapped(exc, request, httpx2.WriteTimeout, httpx2.WriteError) from exc
            raise
        try:
            sock.settimeout(timeouts.get("read"))
            answer = conn.getresponse()
        except BaseException as exc:
            self._drop(connection)
            if isinstance(exc, Exception):
                raise _mapped(exc, request, httpx2.ReadTimeout, httpx2.ReadError) from exc
            raise
        # http.client decodes the head as ISO-8859-1: encoded back, the bytes are the server's
        # (httpx would encode text as ASCII, and fail on any other byte).
        headers_in = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.getheaders()]
        return httpx2.Response(
            answer.status,
            headers=headers_in,
            stream=_Body(self, connection, answer, origin, request),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": answer.reason.encode("latin-1", "replace"),
            },
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
        for connection in idle:
            self._drop(connection)

    # -- the pool -----------------------------------------------------------------------------

    def _connection(
        self, origin: Origin, timeout: float | None, request: httpx2.Request | None
    ) -> _Connection:
        """An idle connection to ``origin`` that is still good, or a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise httpx2.ConnectError("the HTTP client is closed", request=request)
                idle = self._idle.get(origin)
                connection = idle.pop() if idle else None
            if connection is None:
                return self._connect(origin, timeout, request)
            if _still_good(connection.http.sock):
                return connection
            self._drop(connection)

    def _connect(
        self, origin: Origin, timeout: float | None, request: httpx2.Request | None
    ) -> _Connection:
        scheme, host, port = origin
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=self._ssl_context
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.response_class = _Response
        try:
            if on_hub():  # a worker's session: parked while the connection is made
                context = self._ssl_context if scheme == "https" else None
                conn.sock = _parked_connection(host, port, timeout, context)
            else:
                conn.connect()
            sock = conn.sock
            assert sock is not None
            # The last segment of a request must not wait for the ACK of the one before.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, Exception):
                raise _mapped(exc, request, httpx2.ConnectTimeout, httpx2.ConnectError) from exc
            raise
        connection = _Connection(conn)
        self._tracker.add(connection)  # shut down at once if its call is being ended
        return connection

    def _put_back(self, origin: Origin, connection: _Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if not self._closed and len(idle) < _IDLE_PER_ORIGIN:
                idle.append(connection)
                return
        self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        self._tracker.discard(connection)
        connection.http.close()


class _Body(httpx2.SyncByteStream):
    """An answer's body as it arrives; the connection goes back to the pool at its end."""

    def __init__(
        self,
        transport: HTTP11Transport,
        connection: _Connection,
        answer: http.client.HTTPResponse,
        origin: Origin,
        request: httpx2.Request | None,
    ) -> None:
        self._transport = transport
        self._connection: _Connection | None = connection
        self._answer = answer
        self._origin = origin
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        answer = self._answer
        try:
            while True:
                chunk = answer.read1(_CHUNK)
                if not chunk:
                    break
                yield chunk
            if answer.length:  # the peer hung up before the promised length
                raise http.client.IncompleteRead(b"", answer.length)
            answer.read()  # ends the answer (a fixed length read to its end stays open)
        except Exception as exc:
            self.close()
            raise _mapped(exc, self._request, httpx2.ReadTimeout, httpx2.ReadError) from exc
        self._finish()

    def _finish(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._answer.isclosed() and not self._answer.will_close:
            self._transport._put_back(self._origin, connection)
        else:
            self._transport._drop(connection)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:  # not read to its end: the connection cannot be reused
            self._answer.close()
            self._transport._drop(connection)


def _still_good(sock: socket.socket | None) -> bool:
    """Whether an idle connection can carry a request: open, and nothing to read (an idle
    socket that is readable was closed by the server, or holds bytes nobody asked for)."""
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def _parked_connection(
    host: str, port: int, timeout: float | None, context: ssl.SSLContext | None
) -> socket.socket:
    """What ``connect()`` of :mod:`http.client` makes (a TCP connection, TLS over it with
    ``context``), made by a session on a hub without holding the hub's thread: the connect
    and each step of the handshake park the session until the socket is ready
    (:mod:`tether._hub`). A host name is looked up on a helper thread (``getaddrinfo``
    blocks); an address is used as it is. Each address is tried in turn, as
    :func:`socket.create_connection` does; ``timeout`` bounds the whole and stays on the
    socket."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    try:
        addresses = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except socket.gaierror:  # a name, not an address
        addresses = offload(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, setup=True)
    failure: Exception = OSError(f"no address for {host}")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                wait_writable(sock, left(), setup=True)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))
            if context is not None:
                sock = context.wrap_socket(
                    sock, server_hostname=host, do_handshake_on_connect=False
                )
                while True:
                    try:
                        sock.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        wait_readable(sock, left(), setup=True)
                    except ssl.SSLWantWriteError:
                        wait_writable(sock, left(), setup=True)
            sock.settimeout(timeout)
            return sock
        except Exception as exc:  # the next address, as create_connection does
            sock.close()
            failure = exc
        except BaseException:
            sock.close()
            raise
    raise failure


def _mapped(
    exc: Exception,
    request: httpx2.Request | None,
    timeout: type[httpx2.TimeoutException],
    failure: type[httpx2.TransportError],
) -> Exception:
    """The httpx error for ``exc``, raised while connecting, sending or reading."""
    if isinstance(exc, httpx2.HTTPError):
        return exc
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return timeout(str(exc) or "timed out", request=request)
    if isinstance(exc, http.client.RemoteDisconnected):
        return httpx2.RemoteProtocolError(
            "Server disconnected without sending a response.", request=request
        )
    if isinstance(exc, http.client.IncompleteRead):
        return httpx2.RemoteProtocolError(
            "peer closed connection without sending complete message body", request=request
        )
    if isinstance(exc, http.client.HTTPException):
        return httpx2.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, (OSError, ValueError)):
        return failure(str(exc) or type(exc).__name__, request=request)
    return exc
