"""Anthropic's Messages API through the official ``anthropic`` SDK (optional extra).

Install with ``pip install 'tether[anthropic]'``. Like the OpenAI-compatible adapter:

* **No retries** (``max_retries=0``): one :meth:`AnthropicModel.complete` is at most one
  HTTP request, i.e. one ``stepAttempt``.
* **Streaming** (always): ``POST {base_url}/v1/messages`` with ``stream: true``; the events
  (``message_start``, ``content_block_start/delta/stop``, ``message_delta``,
  ``message_stop``, ``error``) are reassembled here; text and thinking deltas go to
  ``on_delta``. ``timeout`` is the first-byte timeout, ``idle_timeout`` bounds the silence
  between events; cancel and timeouts shut the connection down. A ``200 application/json``
  answer (a server that ignores ``stream``) is a whole Message, taken as the answer; an
  ``error`` event is classed like its HTTP status (:data:`STREAM_ERRORS`).
* **The request**: the normalized context (spec 6.2) is translated: the system prompt
  becomes ``system``; assistant tool calls become ``tool_use`` blocks (arguments parsed as
  JSON; arguments that are not a JSON object are sent as ``{}``); ``tool`` messages become
  ``tool_result`` blocks in a user turn (consecutive ones in one turn, as parallel tool use
  requires), with ``is_error: true`` for a failed one (``ModelRequest.failed_results``).
  **Prompt caching**: ``cache_control: {"type": "ephemeral"}`` breakpoints on
  the last tool definition, the system prompt and the last block of the last message, so a
  long agent loop reads its prefix from the cache (``cache=False`` turns them off).
* **Thinking**: enabled with the output option ``thinking`` (``{"type": "enabled",
  "budget_tokens": N}``, or ``{"type": "adaptive"}`` with ``output_config``), which
  ``[model] reasoning_effort`` derives per model family (``tether._models.options``).
  ``thinking`` and ``redacted_thinking`` blocks are kept verbatim (with their signatures)
  in :class:`~tether._models.base.Reasoning` (format ``anthropic``) and sent back at the
  start of their assistant turn, as the API requires during tool use.
* **Usage**: ``input_tokens`` (Anthropic's count excludes the cache), ``output_tokens``,
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``: already disjoint.
* ``max_tokens`` is required by the API: the output option ``max_tokens`` if given, else
  ``max_tokens=`` of the constructor (default 8192).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from tether._credentials import register_secret
from tether._models.anthropic_wire import MessagesBody
from tether._models.base import (
    MAX_SAFE_INTEGER,
    ModelRequest,
    ModelResponse,
    Reasoning,
    TokenUsage,
    ToolCallOut,
    default_call_id,
    has_unpaired_surrogate,
    redact,
    stop_reason_for,
    validate_output_options,
)
from tether._models.http_common import parse_base_url, plain, provider_message, retry_after_seconds
from tether.core.records import replace
from tether.errors import ConfigurationError, ModelError

if TYPE_CHECKING:
    import anthropic as anthropic_sdk
    import httpx2

    from tether._models.streaming import ConnectionTracker, DeltaSink, Emit

# The SDK, httpx and the streaming helpers (~0.5 s cold with the SDK) are imported by the
# methods that send: building an agent sends nothing, so it loads none of them.

__all__ = [
    "ADAPTER_IDENTITY",
    "DEFAULT_BASE_URL",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "FINISH_REASONS",
    "STREAM_ERRORS",
    "AnthropicModel",
    "MessagesStreamAccumulator",
]

ADAPTER_IDENTITY: Final = "anthropic:messages:v1"
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
ENV_API_KEY: Final = "ANTHROPIC_API_KEY"
ENV_BASE_URL: Final = "ANTHROPIC_BASE_URL"
DEFAULT_MAX_TOKENS: Final = 8192
_CACHE: Final = {"type": "ephemeral"}

STREAM_ERRORS: Final[Mapping[str, tuple[str, int]]] = {
    "invalid_request_error": ("provider_error", 400),
    "authentication_error": ("authentication", 401),
    "permission_error": ("provider_error", 403),
    "not_found_error": ("provider_error", 404),
    "request_too_large": ("provider_error", 413),
    "rate_limit_error": ("rate_limited", 429),
    "api_error": ("provider_error", 500),
    "timeout_error": ("provider_error", 504),
    "overloaded_error": ("provider_error", 529),
}
"""An ``error`` event inside a 200 stream, by its ``error.type``: the error code and the
HTTP status Anthropic gives the same error before the stream starts (its documented error
table), so the retry policy treats both forms alike — an overload is retried whether it
came as HTTP 529 or, as it usually does, as an event mid-stream. An unknown type is a
permanent ``provider_error``."""

FINISH_REASONS: Final[Mapping[str, str]] = {
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}
"""Anthropic ``stop_reason`` values that mean the answer was cut short; every other value
(``end_turn``, ``tool_use``, ``stop_sequence``, ``pause_turn``, ``refusal``) is decided by
the tool calls alone (:func:`~tether._models.base.stop_reason_for`)."""


_NAMED_HERE: Final = frozenset({"bad_response", "provider_error", "rate_limited", "authentication"})
"""Codes of errors found in the answer itself, which get the endpoint in front of them."""


def _bad(message: str) -> ModelError:
    return ModelError("bad_response", message)


class MessagesStreamAccumulator:
    """Reassembles the Messages API's stream events into one answer (pure)."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.stopped = False
        self.error: Any = None

    def feed(self, event: str, data: Mapping[str, Any]) -> list[Any]:
        from tether._models.streaming import Delta

        kind = data.get("type", event)
        out: list[Any] = []
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
                self.usage.update(message["usage"])
        elif kind == "content_block_start":
            index = data.get("index")
            block = data.get("content_block")
            if not isinstance(index, int) or not isinstance(block, Mapping):
                raise _bad("a content_block_start without index or block")
            self.blocks[index] = plain(block)
        elif kind == "content_block_delta":
            index = data.get("index")
            delta = data.get("delta")
            if not isinstance(index, int) or index not in self.blocks:
                raise _bad("a content_block_delta for an unknown block")
            if not isinstance(delta, Mapping):
                raise _bad("a content_block_delta without delta")
            block = self.blocks[index]
            dtype = delta.get("type")
            if dtype == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = block.get("text", "") + delta["text"]
                out.append(Delta("text", delta["text"]))
            elif dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
                out.append(Delta("reasoning", delta["thinking"]))
            elif dtype == "signature_delta" and isinstance(delta.get("signature"), str):
                block["signature"] = block.get("signature", "") + delta["signature"]
            elif dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self.partial_json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, Mapping) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), Mapping):
                self.usage.update({k: v for k, v in data["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            self.error = data.get("error", data)
        return out

    def whole(self, message: Mapping[str, Any]) -> None:
        """Take a complete (non-streamed) Message, as a server that ignores ``stream``
        answers, or its ``{"type": "error"}`` body."""
        if message.get("type") == "error":
            self.error = message.get("error", message)
            return
        content = message.get("content")
        if message.get("type", "message") != "message" or not isinstance(content, list):
            raise _bad("the JSON answer is not a Message (no content list)")
        for index, block in enumerate(content):
            if not isinstance(block, Mapping):
                raise _bad(f"content block #{index} is not an object")
            self.blocks[index] = plain(block)
        if isinstance(message.get("usage"), Mapping):
            self.usage.update({k: v for k, v in message["usage"].items() if v is not None})
        if isinstance(message.get("stop_reason"), str):
            self.stop_reason = message["stop_reason"]
        self.stopped = True

    def response(self, position: int) -> ModelResponse:
        if self.error is not None:
            said = provider_message({"error": self.error}) or "unspecified error"
            kind = self.error.get("type") if isinstance(self.error, Mapping) else None
            code: str = "provider_error"
            status: int | None = None
            if isinstance(kind, str) and kind in STREAM_ERRORS:
                code, status = STREAM_ERRORS[kind]
            shown = f" ({kind})" if isinstance(kind, str) and kind not in said else ""
            raise ModelError(code, f"provider reported an error: {said}{shown}", status=status)
        texts: list[str] = []
        calls: list[ToolCallOut] = []
        thinking: list[str] = []
        details: list[dict[str, Any]] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            btype = block.get("type")
            if btype == "text":
                texts.append(_checked(block.get("text", ""), "text block"))
            elif btype == "thinking":
                thinking.append(_checked(block.get("thinking", ""), "thinking block"))
                details.append(block)
            elif btype == "redacted_thinking":
                details.append(block)
            elif btype in ("tool_use", "server_tool_use"):
                parts = self.partial_json.get(index)
                if parts is not None:
                    arguments = "".join(parts)
                else:
                    given = block.get("input")
                    arguments = json.dumps(given if given is not None else {}, ensure_ascii=False)
                name = block.get("name")
                if not isinstance(name, str) or not name:
                    raise _bad(f"tool_use block #{index} has no name")
                raw_id = block.get("id")
                call_id = (
                    raw_id
                    if isinstance(raw_id, str) and raw_id
                    else default_call_id(position, len(calls))
                )
                calls.append(
                    ToolCallOut(
                        id=_checked(call_id, "tool_use id"),
                        name=_checked(name, "tool name"),
                        arguments=_checked(arguments or "{}", "tool input"),
                    )
                )
        if len({c.id for c in calls}) != len(calls):
            raise _bad("the answer repeats a tool_use id")
        finish = FINISH_REASONS.get(self.stop_reason or "", self.stop_reason)
        reasoning = (
            Reasoning(text="".join(thinking), details=tuple(details), format="anthropic")
            if details
            else None
        )
        return ModelResponse(
            content="".join(texts) if texts else None,
            tool_calls=tuple(calls),
            stop_reason=stop_reason_for(finish, bool(calls)),
            usage=_usage(self.usage),
            finish_reason=self.stop_reason,
            reasoning=reasoning,
        )


def _json_answer(raw: bytes, content_type: str) -> Mapping[str, Any]:
    """The JSON object of a non-streamed answer (``bad_response`` when it is none)."""
    try:
        data = json.loads(raw)
    except ValueError:
        snippet = " ".join(raw.decode("utf-8", "replace").split())[:200]
        shown = content_type.split(";")[0].strip() or "no content type"
        raise _bad(f"the answer is neither an event stream nor JSON ({shown}): {snippet}") from None
    if not isinstance(data, Mapping):
        raise _bad("the JSON answer is not an object")
    return data


def _checked(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{where} is not a string")
    if has_unpaired_surrogate(value):
        raise _bad(f"{where} contains an unpaired surrogate")
    return value


def _usage(usage: Mapping[str, Any]) -> TokenUsage:
    def count(name: str) -> int:
        value = usage.get(name)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(f"provider usage {name} is not an integer: {value!r}"[:200])
        if not 0 <= value <= MAX_SAFE_INTEGER:
            raise _bad(f"provider usage {name} is out of range: {value}")
        return value

    return TokenUsage(
        input=count("input_tokens"),
        output=count("output_tokens"),
        cache_read=count("cache_read_input_tokens"),
        cache_write=count("cache_creation_input_tokens"),
    )


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def build_messages(request: ModelRequest, *, cache: bool = True) -> list[dict[str, Any]]:
    """The Messages API ``messages`` for the normalized context of ``request``."""
    wire: list[dict[str, Any]] = []
    reasoning = list(request.reasoning) if request.reasoning else []

    def user_blocks() -> list[dict[str, Any]]:
        if wire and wire[-1]["role"] == "user":
            blocks: list[dict[str, Any]] = wire[-1]["content"]
            return blocks
        wire.append({"role": "user", "content": []})
        return cast(list[dict[str, Any]], wire[-1]["content"])

    for index, message in enumerate(request.messages):
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            text = content if isinstance(content, str) else json.dumps(plain(content))
            user_blocks().append({"type": "text", "text": text})
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id", "")),
                "content": content if isinstance(content, str) else "",
            }
            if index in request.failed_results:
                result["is_error"] = True
            user_blocks().append(result)
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            side = reasoning[index] if index < len(reasoning) else None
            if side is not None and side.format == "anthropic":
                blocks.extend(plain(d) for d in side.details)
            if isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
            for call in message.get("tool_calls") or ():
                function = call.get("function", {})
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "input": _tool_input(str(function.get("arguments") or "")),
                    }
                )
            if not blocks:
                blocks.append({"type": "text", "text": "(no answer)"})
            wire.append({"role": "assistant", "content": blocks})
        elif role == "system":  # a compaction summary may sit in the context as system text
            text = content if isinstance(content, str) else ""
            user_blocks().append({"type": "text", "text": text})
    if cache and wire and wire[-1]["content"]:
        last = wire[-1]["content"][-1]
        if last.get("type") not in ("thinking", "redacted_thinking"):
            last["cache_control"] = dict(_CACHE)
    return wire


def _translate(request: ModelRequest) -> list[dict[str, Any]]:
    """What one message becomes (:class:`~tether._models.anthropic_wire.MessagesBody`)."""
    return build_messages(request, cache=False)


def build_tools(request: ModelRequest, *, cache: bool = True) -> list[dict[str, Any]]:
    tools = [
        {
            "name": tool.get("name"),
            "description": tool.get("description", ""),
            "input_schema": plain(tool.get("parameters") or {"type": "object"}),
        }
        for tool in request.tools
    ]
    if cache and tools:
        tools[-1]["cache_control"] = dict(_CACHE)
    return tools


class AnthropicModel:
    """A :class:`~tether._models.base.ModelAdapter` for Anthropic's Messages API."""

    streaming = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        idle_timeout: float = 60.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        cache: bool = True,
        provider: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        if importlib.util.find_spec("anthropic") is None:  # found, not imported (see the top)
            raise ConfigurationError(
                "the Anthropic adapter needs the anthropic package: pip install 'tether[anthropic]'"
            )
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(
                "no model given after anthropic: (e.g. --model anthropic:claude-sonnet-4-5)"
            )
        for name, value in (("timeout", timeout), ("idle timeout", idle_timeout)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(f"the model {name} must be a positive number of seconds")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigurationError("max_tokens must be a positive integer")
        url = (base_url or DEFAULT_BASE_URL).strip()
        endpoint = parse_base_url(url, "the Anthropic base URL")
        for suffix in ("/v1/messages", "/v1"):
            # The SDK posts to {base_url}/v1/messages; a /v1 of the user's would make that
            # /v1/v1/messages, a bare 404 (an OpenAI-style TETHER_BASE_URL ends in /v1 too).
            if endpoint.identity_path.endswith(suffix):
                raise ConfigurationError(
                    f"the Anthropic base URL ends in {suffix}, which the SDK appends itself "
                    f"(it posts to BASE/v1/messages): use {endpoint.display[: -len(suffix)]}"
                )
        key = (api_key or "").strip()
        if not key:
            raise ConfigurationError(
                f"no API key for {endpoint.display}: set {ENV_API_KEY} (or pass --api-key); "
                "TETHER_API_KEY is not sent to Anthropic"
            )
        register_secret(key)
        headers = {str(k): str(v) for k, v in (extra_headers or {}).items()}
        for header in headers.values():
            register_secret(header)
        self._model = model.strip()
        self._endpoint = endpoint
        self._secrets = (key,)
        self._timeout = float(timeout)
        self._idle_timeout = float(idle_timeout)
        self._max_tokens = max_tokens
        self._cache = cache
        self._bodies = MessagesBody(_translate)
        self._provider = provider.strip() if provider else "anthropic"
        self._client_settings = (key, url, headers)
        self._connections: ConnectionTracker | None = None
        self._sdk_client: anthropic_sdk.Anthropic | None = None
        self._client_lock = threading.Lock()

    @property
    def _anthropic(self) -> Any:
        """The SDK's module (its error types)."""
        import anthropic  # loaded by the first request already (see the top of the module)

        return anthropic

    @property
    def _tracker(self) -> ConnectionTracker:
        """The tracker of this adapter's connections (an httpx backend), made on first use."""
        with self._client_lock:
            if self._connections is None:
                from tether._models.streaming import ConnectionTracker  # httpx: see the top

                self._connections = ConnectionTracker()
            return self._connections

    def prepare(self) -> None:
        """Make the SDK client now (importing the SDK and httpx) instead of at the first
        request: for a process about to send many first requests at once (a worker)."""
        self._client  # noqa: B018 - the property builds it

    @property
    def _client(self) -> anthropic_sdk.Anthropic:
        """The SDK's client, made at the first request (retries off; the tracked client)."""
        client = self._sdk_client
        if client is not None:
            return client
        # The first request's: the SDK, httpx and the tracked client (see the top).
        import anthropic
        import httpx2

        from tether._models.streaming import tracked_http_client

        tracker = self._tracker
        with self._client_lock:
            if self._sdk_client is None:
                key, url, headers = self._client_settings
                http_timeout = httpx2.Timeout(
                    self._timeout, read=max(self._timeout, self._idle_timeout) + 1.0
                )
                self._sdk_client = anthropic.Anthropic(
                    api_key=key,
                    base_url=url,
                    max_retries=0,
                    timeout=http_timeout,
                    default_headers=headers or None,
                    http_client=tracked_http_client(tracker, http_timeout),
                )
            return self._sdk_client

    @classmethod
    def from_env(
        cls,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        environ: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> AnthropicModel:
        """``api_key`` falls back to ``ANTHROPIC_API_KEY`` — never to ``TETHER_API_KEY``,
        the OpenAI-compatible endpoint's key (OpenRouter's by default): a key only goes to
        the provider it was given for. ``base_url`` falls back to ``ANTHROPIC_BASE_URL``,
        then to Anthropic's API."""
        env = os.environ if environ is None else environ
        key = (api_key or "").strip() or env.get(ENV_API_KEY, "").strip()
        url = (base_url or "").strip() or env.get(ENV_BASE_URL, "").strip()
        return cls(model, base_url=url or None, api_key=key or None, **kw)

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model(self) -> str:
        return self._model

    @property
    def adapter_identity(self) -> str:
        return ADAPTER_IDENTITY

    @property
    def routing_identity(self) -> str:
        return f"{self._endpoint.identity_path}/{self._model}"

    @property
    def open_connections(self) -> int:
        tracker = self._connections
        return 0 if tracker is None else tracker.open_connections

    def close(self) -> None:
        if self._sdk_client is not None:  # no client was made without a request
            self._sdk_client.close()

    def build_request(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` (without ``stream``)."""
        options = plain(request.output_options)
        max_tokens = options.pop("max_tokens", self._max_tokens)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": max_tokens,
            "messages": build_messages(request, cache=self._cache),
        }
        if request.system_prompt:
            system: dict[str, Any] = {"type": "text", "text": request.system_prompt}
            if self._cache:
                system["cache_control"] = dict(_CACHE)
            body["system"] = [system]
        tools = build_tools(request, cache=self._cache)
        if tools:
            body["tools"] = tools
        if options:
            body["extra_body"] = options
        return body

    # -- the request body in O(new bytes) (tether._models.anthropic_wire) --------------------

    def request_body(self, request: ModelRequest) -> bytes:
        """The bytes sent for ``request``: the JSON value of :meth:`build_request` with
        ``stream: true`` and its ``extra_body`` merged, the messages encoded once each."""
        shell = self.build_request(
            replace(request, messages=(), reasoning=(), failed_results=frozenset())
        )
        return self._bodies.body(shell, request, cache=self._cache)

    @property
    def encoded_messages(self) -> int:
        """Context messages encoded so far (each once; see :mod:`tether._models.encoded`)."""
        return self._bodies.encoded_messages

    @property
    def encoded_bytes(self) -> int:
        return self._bodies.encoded_bytes

    @contextlib.contextmanager
    def _open_stream(self, body: bytes) -> Iterator[httpx2.Response]:
        """``POST /v1/messages`` with ``body`` as it is, through the SDK's ``post`` (its auth,
        headers, client and error types; ``create`` would re-encode the history).

        The response is read to its end when the block ends normally, so the pool keeps
        the connection (a stream left at ``message_stop`` is closed instead)."""
        import httpx2  # loaded with the client (see _client)

        from tether._models.streaming import drain

        http = self._client.post("/v1/messages", cast_to=httpx2.Response, content=body, stream=True)
        started: list[Iterator[bytes]] = []
        iter_bytes = http.iter_bytes

        def kept(chunk_size: int | None = None) -> Iterator[bytes]:
            chunks = iter_bytes(chunk_size)
            started.append(chunks)
            return chunks

        http.iter_bytes = kept  # type: ignore[method-assign]
        try:
            yield http
            for chunks in started:
                drain(chunks)
        finally:
            http.close()

    def complete(
        self,
        request: ModelRequest,
        *,
        cancel: threading.Event | None = None,
        on_delta: DeltaSink | None = None,
    ) -> ModelResponse:
        validate_output_options(request.output_options)
        if cancel is not None and cancel.is_set():
            raise ModelError("aborted", "Operation aborted")
        body = self.request_body(request)
        where = self._endpoint.display
        import httpx2  # with the SDK at the first request (see the top of the module)

        from tether._models.streaming import SSEDecoder, lines_of, run_stream

        def work(emit: Emit) -> ModelResponse:
            with self._open_stream(body) as http:
                accumulator = MessagesStreamAccumulator()
                kind = http.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    # The server ignored ``stream: true`` (LiteLLM's mock models do): a whole
                    # Message is the answer, not a stream cut short to be retried.
                    emit(None)
                    accumulator.whole(_json_answer(http.read(), kind))
                    return accumulator.response(request.position)
                decoder = SSEDecoder()
                for line in lines_of(http.iter_bytes(), emit):
                    event = decoder.line(line)
                    if event is None:
                        continue
                    try:
                        data = json.loads(event[1])
                    except ValueError:
                        snippet = " ".join(event[1].split())[:200]
                        raise _bad(f"a streamed event is not JSON: {snippet}") from None
                    if not isinstance(data, Mapping):
                        raise _bad("a streamed event is not a JSON object")
                    for delta in accumulator.feed(event[0], data):
                        emit(delta)
                    if accumulator.stopped or accumulator.error is not None:
                        break
                if not accumulator.stopped and accumulator.error is None:
                    raise ModelError(
                        "connection",
                        f"the answer from {where} ended before it was complete (no message_stop)",
                    )
                return accumulator.response(request.position)

        try:
            return run_stream(
                work,
                cancel=cancel,
                tracker=self._tracker,
                first_byte_timeout=self._timeout,
                idle_timeout=self._idle_timeout,
                on_delta=on_delta,
                where=where,
            )
        except self._anthropic.AnthropicError as exc:
            raise self._map_error(exc) from None
        except httpx2.HTTPError as exc:
            raise ModelError(
                "connection",
                redact(
                    f"the answer from {where} broke off: {exc or type(exc).__name__}", self._secrets
                ),
            ) from None
        except ModelError as exc:
            if exc.code in _NAMED_HERE and not exc.message.startswith(where):
                raise ModelError(
                    exc.code,
                    redact(f"{where}: {exc.message}", self._secrets),
                    status=exc.status,
                    retry_after=exc.retry_after,
                ) from None
            raise

    def _map_error(self, exc: Exception) -> ModelError:
        anthropic = self._anthropic
        where = self._endpoint.display

        def clean(text: str) -> str:
            return redact(text, self._secrets)

        if isinstance(exc, anthropic.APITimeoutError):
            return ModelError("timeout", f"no answer from {where} within {self._timeout:g} s")
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = str(cause) if cause is not None and str(cause) else str(exc)
            return ModelError("connection", clean(f"cannot reach {where}: {detail}"))
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            said = provider_message(exc.body) or f"HTTP {status}"
            retry_after = retry_after_seconds(exc.response.headers)
            if isinstance(exc, anthropic.RateLimitError):
                return ModelError(
                    "rate_limited",
                    clean(f"rate limited by {where} (HTTP {status}): {said}"),
                    status=status,
                    retry_after=retry_after,
                )
            if isinstance(exc, anthropic.AuthenticationError):
                return ModelError(
                    "authentication",
                    clean(
                        f"{where} rejected the API key (HTTP {status}): {said}; check {ENV_API_KEY}"
                    ),
                    status=status,
                )
            if status == 404:
                return ModelError(
                    "provider_error",
                    clean(
                        f"{where} answered HTTP 404 for model {self._model!r}: {said} "
                        f"(check the model id and the base URL: tether posts to "
                        f"{where}/v1/messages)"
                    ),
                    status=status,
                )
            return ModelError(
                "provider_error",
                clean(f"{where} answered HTTP {status}: {said}"),
                status=status,
                retry_after=retry_after,
            )
        return ModelError("provider_error", clean(f"{where}: {exc}"))
