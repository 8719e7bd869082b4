"""A real HTTP server on loopback that speaks the chat-completions protocol.

Tests queue canned answers and point the real ``openai`` SDK (through
:class:`tether._models.openai_compat.OpenAICompatibleModel`) at :attr:`FakeProvider.base_url`.
Every request is recorded (path, headers, parsed JSON body), so a test can assert that one
``complete`` call made exactly one HTTP request (no retries) and what was sent.

``POST /v1/chat/completions`` pops the next queued :class:`Canned` answer; with an empty
queue it answers HTTP 500 ``fake provider: no answer queued``. Slow answers wait on a stop
event, so :meth:`FakeProvider.close` never hangs on them.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Canned:
    """One HTTP answer: status, raw body bytes, headers, and a delay before sending."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    chunks: tuple[tuple[float, bytes], ...] | None = None
    """Streamed answer: ``(pause before, bytes)`` pieces sent with chunked encoding."""
    hang_up: bool = False
    """After the chunks, drop the connection instead of ending the body properly."""


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any  # parsed JSON, or the raw text if it was not JSON


def completion(
    content: str | None = "Hello.",
    *,
    tool_calls: Sequence[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    model: str = "fake/model",
    extra_message: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat-completion JSON object; ``tool_calls`` items are ``{"id","name","arguments"}``
    (``arguments`` a string, or an object that is JSON-encoded) or full wire objects."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        wire = []
        for call in tool_calls:
            if "function" in call:
                wire.append(dict(call))
                continue
            arguments = call.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            wire.append(
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
            )
        message["tool_calls"] = wire
    if extra_message:
        message.update(extra_message)
    if finish_reason is None:
        finish_reason = "tool_calls" if tool_calls else "stop"
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    body["usage"] = (
        dict(usage)
        if usage is not None
        else {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    )
    return body


def ok(payload: Mapping[str, Any], *, delay: float = 0.0) -> Canned:
    """HTTP 200 with a JSON body."""
    return Canned(
        200,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json"},
        delay,
    )


def error(
    status: int,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    type_: str = "error",
    code: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> Canned:
    """An OpenAI-style error: ``{"error": {"message", "type", "code"}}``."""
    inner: dict[str, Any] = {"message": message, "type": type_, "code": code}
    if metadata is not None:
        inner["metadata"] = dict(metadata)
    return Canned(
        status,
        json.dumps({"error": inner}).encode(),
        {"Content-Type": "application/json", **(headers or {})},
    )


def raw(status: int, body: bytes, content_type: str = "application/json") -> Canned:
    """Any bytes, e.g. a malformed JSON body."""
    return Canned(status, body, {"Content-Type": content_type})


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr
        pass

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        try:
            return json.loads(data) if data else None
        except ValueError:
            return data.decode("utf-8", "replace")

    def do_POST(self) -> None:
        body = self._read_body()
        provider = self.server.provider
        provider.record(
            Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        if self.path.rstrip("/") not in provider.paths:
            answer = Canned(
                404, b'{"error": {"message": "not found"}}', {"Content-Type": "application/json"}
            )
        else:
            answer = provider.next_answer()
        if answer.delay and self._pause(answer.delay):
            return  # server is shutting down or the client left: drop the connection
        if answer.chunks is not None:
            self._stream(answer)
            return
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)
            self.wfile.flush()
        except OSError:
            pass  # the client gave up (timeout or cancel): nothing to do

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``; True when the server stops or the client closed meanwhile."""
        end = time.monotonic() + seconds
        provider = self.server.provider
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if provider.stopping.is_set():
                return True
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.02))
            if readable:
                try:
                    peek = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    peek = b""
                if not peek:
                    provider.note_disconnect()
                    return True

    def _stream(self, answer: Canned) -> None:
        provider = self.server.provider
        try:
            self.send_response(answer.status)
            headers = {"Content-Type": "text/event-stream", **dict(answer.headers)}
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            assert answer.chunks is not None
            for pause, data in answer.chunks:
                if pause and self._pause(pause):
                    self.close_connection = True
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if answer.hang_up:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            provider.note_disconnect()
            self.close_connection = True

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    provider: FakeProvider

    def process_request(self, request: Any, client_address: Any) -> None:
        self.provider.note_connection()  # one call per accepted TCP connection
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (an aborted or timed-out request, a test ending) is part of
        # what the tests do; socketserver would print its traceback to the terminal.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeProvider:
    """The server; use :func:`running` or call :meth:`close` at teardown."""

    def __init__(self) -> None:
        # The process forgets the first requests its adapters sent (tether._models.
        # openai_compat shares them by settings): this server may have an earlier one's
        # port, and a test's "first request" must go through the SDK's post as in a new
        # process.
        from tether._models import openai_compat

        openai_compat._SENT_HEADS.clear()
        openai_compat._BUILT.clear()
        self._lock = threading.Lock()
        self._queue: deque[Canned] = deque()
        self._requests: list[Recorded] = []
        self.stopping = threading.Event()
        self.disconnected = threading.Event()
        """Set when a client closed its connection while an answer was still coming."""
        self.connections = 0
        """TCP connections accepted so far (a kept-alive client opens one)."""
        self.paths = {"/v1/chat/completions", "/v1/messages"}
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.provider = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The server root (the Anthropic SDK appends ``/v1/messages`` itself)."""
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *answers: Canned) -> None:
        with self._lock:
            self._queue.extend(answers)

    def next_answer(self) -> Canned:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return error(500, "fake provider: no answer queued")

    def note_disconnect(self) -> None:
        self.disconnected.set()

    def note_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def record(self, request: Recorded) -> None:
        with self._lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def send_first_request(self, model: Any) -> None:
        """Have ``model`` (an adapter of this server) send its first request now, answered
        ahead of anything queued, and forget that request.

        An adapter sends its first request through the SDK's ``post`` and the later ones as
        the SDK sent that one (``OpenAICompatibleModel._send_as_before``); a test that runs
        both ways checks that a session's later requests behave as its first.
        """
        from tether._models.messages import ModelRequest

        first = ok(completion("the first answer"))
        with self._lock:
            self._queue.appendleft(first)
            seen = len(self._requests)
        answer = model.complete(
            ModelRequest(
                system_prompt="",
                messages=({"role": "user", "content": "first"},),
                tools=(),
                position=0,
            )
        )
        assert answer.content == "the first answer", answer
        with self._lock:
            assert len(self._requests) == seen + 1
            del self._requests[seen:]

    def in_order(self, make: Any, order: str) -> Any:
        """``make()``, an adapter of this server, ready to send the request ``order`` names
        (one of :data:`REQUEST_ORDERS`): its first, a later one (its first sent now, see
        :meth:`send_first_request`), or a first one sent as another adapter with the same
        settings sent its own (a worker's sessions: that adapter builds no SDK client)."""
        model = make()
        if order == "later request":
            self.send_first_request(model)
        elif order == "a sibling's later request":
            self.send_first_request(make())
        return model

    def close(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@contextmanager
def running() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    try:
        yield provider
    finally:
        provider.close()


# -- streaming (server-sent events) ------------------------------------------------------------


REQUEST_ORDERS = ("first request", "later request", "a sibling's later request")
"""The requests a test of an adapter runs with (:meth:`FakeProvider.in_order`)."""


def sse_data(payload: Any) -> bytes:
    """One SSE event carrying ``payload`` as JSON (or a raw string such as ``[DONE]``)."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {text}\n\n".encode()


def chunk(
    *,
    content: str | None = None,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning",
    reasoning_details: Sequence[Mapping[str, Any]] | None = None,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    no_choices: bool = False,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta[reasoning_field] = reasoning
    if reasoning_details is not None:
        delta["reasoning_details"] = [dict(d) for d in reasoning_details]
    if tool_calls is not None:
        delta["tool_calls"] = [dict(c) for c in tool_calls]
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake/model",
        "choices": []
        if no_choices
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = dict(usage)
    return body


def streamed(
    *events: Any,
    pause: float = 0.0,
    pauses: Mapping[int, float] | None = None,
    done: bool = True,
    hang_up: bool = False,
    status: int = 200,
) -> Canned:
    """A streamed answer: each event (a chunk object, or raw bytes) as one SSE event.

    ``pause`` seconds pass before every event, ``pauses[i]`` before event ``i`` instead;
    ``done`` appends ``data: [DONE]``; ``hang_up`` drops the connection after the events.
    """
    pieces: list[tuple[float, bytes]] = []
    for index, event in enumerate(events):
        wait = (pauses or {}).get(index, pause)
        pieces.append((wait, event if isinstance(event, bytes) else sse_data(event)))
    if done:
        pieces.append((pause, sse_data("[DONE]")))
    return Canned(status=status, chunks=tuple(pieces), hang_up=hang_up)


# -- Anthropic Messages API streams ------------------------------------------------------------


def anthropic_event(data: Mapping[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_stream(
    *blocks: Mapping[str, Any],
    stop_reason: str = "end_turn",
    usage: Mapping[str, Any] | None = None,
    output_tokens: int = 7,
    pause: float = 0.0,
    pauses: Mapping[int, float] | None = None,
    complete: bool = True,
    hang_up: bool = False,
) -> Canned:
    """A streamed Messages answer. Each block is ``{"type": "text", "text": ...}``,
    ``{"type": "thinking", "thinking": ..., "signature": ...}``, ``{"type":
    "redacted_thinking", "data": ...}`` or ``{"type": "tool_use", "id", "name", "input"}``;
    text, thinking and tool input are streamed in two deltas each. ``pauses[i]`` is the
    pause before event ``i``; ``complete=False`` stops before ``message_stop``."""
    start_usage = dict(
        usage
        if usage is not None
        else {"input_tokens": 12, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    )
    start_usage.setdefault("output_tokens", 1)
    events: list[Mapping[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": "claude-fake",
                "content": [],
                "stop_reason": None,
                "usage": start_usage,
            },
        }
    ]

    def halves(text: str) -> list[str]:
        cut = len(text) // 2
        return [part for part in (text[:cut], text[cut:]) if part]

    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for part in halves(block["text"]):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": part},
                    }
                )
        elif kind == "thinking":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
            for part in halves(block["thinking"]):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": part},
                    }
                )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                }
            )
        elif kind == "redacted_thinking":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": dict(block)}
            )
        elif kind == "tool_use":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {
                        "type": "tool_use",
                        "id": block["id"],
                        "name": block["name"],
                        "input": {},
                    },
                }
            )
            for part in halves(json.dumps(block["input"])):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": part},
                    }
                )
        events.append({"type": "content_block_stop", "index": index})
        if index == 0:
            events.append({"type": "ping"})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
    )
    if complete:
        events.append({"type": "message_stop"})
    else:
        events = events[:-1]
    pieces = tuple(
        ((pauses or {}).get(i, pause), anthropic_event(event)) for i, event in enumerate(events)
    )
    return Canned(status=200, chunks=pieces, hang_up=hang_up)


def anthropic_error(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> Canned:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Canned(
        status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )


def watchdog_wakes() -> int:
    """How often the process's model-call watchdog has woken so far
    (:class:`tether._models.streaming._Watchdog`): a call waiting for its answer must not
    wake it, except when its cancel can only be polled."""
    from tether._models import streaming

    return streaming._the_watchdog().wakes


def fresh_watchdog(monkeypatch: Any) -> None:
    """A watchdog of the test's own from now on, so that its wakes are the test's calls'
    alone (the process's other one goes on ending the earlier tests' calls)."""
    from tether._models import streaming

    monkeypatch.setattr(streaming, "_watchdog", streaming._Watchdog())
