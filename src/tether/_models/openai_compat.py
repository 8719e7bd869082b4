"""OpenAI-compatible chat completions through the official ``openai`` SDK.

Works with OpenRouter (the default), OpenAI, vLLM, Ollama, llama.cpp and any other
server that speaks ``POST {base_url}/chat/completions``.

* **No retries.** The client is built with ``max_retries=0``: one :meth:`complete` call
  is at most one physical HTTP request, i.e. exactly one ``stepAttempt`` in the log.
  Rate limits, timeouts and server errors become a :class:`~tether.errors.ModelError`
  that the executor records as ``stepFailed`` (spec 15.2).
* **Streaming** (the default): the request is sent with ``stream: true`` and the SSE answer
  is reassembled (:mod:`tether._models.chat_stream`); text and reasoning deltas go to
  ``on_delta`` as they arrive. ``timeout`` is then a first-byte timeout and
  ``idle_timeout`` bounds the silence between chunks, so long answers never time out
  while they keep coming. The answer is returned only when complete (``[DONE]`` or the
  end of the body after a ``finish_reason``); a stream cut short is a ``connection`` error.
  A server that ignores ``stream`` and answers JSON is parsed as a whole answer.
  With ``stream=False``, ``timeout`` bounds each phase of the exchange *and* the whole call.
* **Cancellation.** The request runs on the caller's thread, watched by the process's
  watchdog (:func:`~tether._models.streaming.run_stream`). When ``cancel`` is set the call
  returns ``aborted`` at once and the connection is shut down
  (:class:`~tether._models.streaming.ConnectionTracker`), so the server sees the client go
  away and stops generating.
* **The request body in O(new bytes).** The body is built here, not by the SDK: every
  context message is encoded once (``orjson``) when it first enters a request and its bytes
  are reused by every later request of the session (:class:`~tether._models.encoded.
  EncodedPrefix`), so a request costs the encoding of the new messages plus one copy of
  the body. The bytes go through the SDK's own ``post`` (its auth, base URL, headers,
  client and error types), which sends a given body as is; the SDK's ``create`` would walk
  the whole history again on every request (``maybe_transform``: 95% of a long turn).
  :meth:`OpenAICompatibleModel.build_messages` is the value the body's ``messages``
  encodes, the reference the tests compare the bytes with.
* **One connection.** A streamed body is read to its end after ``[DONE]``, so the pool
  keeps the connection for the next request (:func:`~tether._models.streaming.drain`).
* **Raw parsing.** The answer is read as raw bytes and parsed here, so malformed bodies
  become clear ``bad_response`` errors and provider-specific usage fields (cache
  reads/writes) are visible.
* **Credentials** never appear in identities, error messages or logs; error texts are
  passed through :func:`~tether._models.base.redact`. The key is registered with
  :func:`tether._credentials.register_secret`, so commands do not get it and the session
  log masks it. A base URL with user info (``https://user:pass@host/v1``) is refused: the
  SDK would send it as HTTP Basic auth, whose base64 echo no masking can recognise.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from operator import is_
from typing import TYPE_CHECKING, Any, Final

from tether._credentials import register_secret
from tether._models.base import (
    MAX_SAFE_INTEGER,
    TokenUsage,
    default_call_id,
    has_unpaired_surrogate,
    redact,
    stop_reason_for,
    validate_output_options,
)
from tether._models.encoded import EncodedPrefix, dumps
from tether._models.http_common import (
    DEFAULT_BASE_URL,
    ENV_API_KEY,
    parse_base_url,
    plain,
    provider_message,
    retry_after_seconds,
)
from tether.errors import ConfigurationError, ModelError

if TYPE_CHECKING:
    import httpx2
    import openai

    from tether._models.http11 import HTTP11Transport
    from tether._models.messages import ModelRequest, ModelResponse, Reasoning, ToolCallOut
    from tether._models.streaming import ConnectionTracker, DeltaSink, Emit

__all__ = [
    "ADAPTER_IDENTITY",
    "DEFAULT_BASE_URL",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "OpenAICompatibleModel",
    "parse_chat_completion",
    "usage_from_json",
]

DEFAULT_TIMEOUT: Final = 60.0
DEFAULT_IDLE_TIMEOUT: Final = 60.0
ENV_BASE_URL: Final = "TETHER_BASE_URL"
ENV_MODEL: Final = "TETHER_MODEL"
ADAPTER_IDENTITY: Final = "openai-compatible:chat-completions:v1"

_LOCAL_PLACEHOLDER_KEY: Final = "tether-no-key"
"""Sent to local servers (Ollama, llama.cpp, vLLM without ``--api-key``) when no key is set."""

_GRACE: Final = 0.25
"""Extra seconds the caller waits beyond ``timeout`` so the SDK's own timeout wins."""

_PATH: Final = "/chat/completions"

_STREAM_TAIL: Final = b',"stream":true,"stream_options":{"include_usage":true}'

_KNOWN_PROVIDERS: Final = {
    "openrouter.ai": "openrouter",
    "api.openai.com": "openai",
    "api.deepseek.com": "deepseek",
    "api.groq.com": "groq",
    "api.together.xyz": "together",
    "api.mistral.ai": "mistral",
    "generativelanguage.googleapis.com": "google",
}


class OpenAICompatibleModel:
    """A :class:`~tether._models.base.ModelAdapter` for chat-completions servers.

    ``api_key`` may be omitted only for local servers (loopback, private or link-local
    addresses, ``localhost``); a placeholder key is sent then. ``timeout`` is in
    seconds. ``provider`` (the session header's provider name) defaults to a name
    derived from the host (``openrouter``, ``openai``, … or the host itself).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        provider: str | None = None,
        stream: bool = True,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(
                f"no model given: pass --model or set {ENV_MODEL} (for example "
                "'openai/gpt-4o-mini')"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ConfigurationError("the model timeout must be a number of seconds")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigurationError("the model timeout must be a positive number of seconds")
        if (
            isinstance(idle_timeout, bool)
            or not isinstance(idle_timeout, (int, float))
            or not math.isfinite(idle_timeout)
            or idle_timeout <= 0
        ):
            raise ConfigurationError("the model idle timeout must be a positive number of seconds")
        endpoint = parse_base_url(base_url or DEFAULT_BASE_URL, "the model base URL")
        key = (api_key or "").strip()
        if not key:
            if not endpoint.is_local:
                raise ConfigurationError(
                    f"no API key for {endpoint.display}: set {ENV_API_KEY} (or pass --api-key)"
                )
            key = _LOCAL_PLACEHOLDER_KEY
        self._sent_no_key = key == _LOCAL_PLACEHOLDER_KEY
        if provider is not None and not provider.strip():
            raise ConfigurationError("the provider name must not be empty")
        self._model = model.strip()
        self._endpoint = endpoint
        self._secrets = (key,)
        if key != _LOCAL_PLACEHOLDER_KEY:
            register_secret(key)
        self._timeout = float(timeout)
        self._idle_timeout = float(idle_timeout)
        self._stream = bool(stream)
        headers = {str(k): str(v) for k, v in (extra_headers or {}).items()}
        for value in headers.values():
            register_secret(value)  # a header may carry a credential (masked if long enough)
        # The connections' tracker is an httpx network backend: made with the client.
        self._connections: ConnectionTracker | None = None
        self._tracker_lock = threading.Lock()
        self._history = EncodedPrefix(_encode_message)
        self._pieces_lock = threading.Lock()
        self._system: tuple[str, bytes] = ("", b"")
        self._tools: tuple[list[Any], bytes] = ([], b"")
        self._provider = (
            provider.strip()
            if provider is not None
            else _KNOWN_PROVIDERS.get(endpoint.host, endpoint.host)
        )
        # The SDK client (and the import of the SDK, most of a second) waits for the first
        # request: building an agent, resuming a finished session or inspecting one never
        # pays for it.
        self._client_settings = ((base_url or DEFAULT_BASE_URL).strip(), key, headers, stream)
        self._sdk_client: openai.OpenAI | None = None
        self._template: _Template | None = None  # how the SDK sent the first request
        self._client_lock = threading.Lock()
        # The adapter's own transport, when its requests go as another adapter's SDK client
        # sent one and it never needed a client of its own (see _shared_template).
        self._own_transport: HTTP11Transport | None = None

    @property
    def _tracker(self) -> ConnectionTracker:
        """The tracker of this adapter's connections, made on first use."""
        tracker = self._connections
        if tracker is not None:
            return tracker
        # Imported here: the tracker and the streaming helpers bring httpx (~40 ms), which
        # building an agent does not need; the first request does.
        from tether._models.streaming import ConnectionTracker

        with self._tracker_lock:
            if self._connections is None:
                self._connections = ConnectionTracker()
            return self._connections

    def prepare(self) -> None:
        """Make the SDK client now (importing the SDK and httpx) instead of at the first
        request: for a process about to send many first requests at once (a worker)."""
        self._client  # noqa: B018 - the property builds it
        if self._stream:
            import tether._models.chat_stream  # noqa: F401 - what reads a streamed answer

    @property
    def _client(self) -> openai.OpenAI:
        """The SDK's client, made on first use (retries off; the tracked HTTP client)."""
        client = self._sdk_client
        if client is not None:
            return client
        import httpx2
        import openai

        from tether._models.streaming import tracked_http_client  # with httpx (see _tracker)

        tracker = self._tracker
        with self._client_lock:
            if self._sdk_client is None:
                base_url, key, headers, stream = self._client_settings
                read = (max(self._timeout, self._idle_timeout) + 1.0) if stream else self._timeout
                http_timeout = httpx2.Timeout(self._timeout, read=read)
                try:
                    self._sdk_client = openai.OpenAI(
                        base_url=base_url,
                        api_key=key,
                        max_retries=0,
                        timeout=http_timeout,
                        default_headers=headers or None,
                        http_client=tracked_http_client(tracker, http_timeout, self._heard),
                    )
                except openai.OpenAIError as exc:  # pragma: no cover - defensive
                    raise ConfigurationError(
                        f"cannot configure the model client: {self._redact(str(exc))}"
                    ) from None
                _BUILT[self._build_key()] = _what_was_built(self._sdk_client)
            return self._sdk_client

    def _build_key(self) -> tuple[Any, ...]:
        """What a client this adapter builds is made of: its settings, and the environment
        the SDK and httpx read as they build one (``OPENAI_*``: organization, project, auth;
        proxies; certificates). Adapters with equal keys build equal clients."""
        env = tuple(
            sorted(
                (name, value)
                for name, value in os.environ.items()
                if name.startswith("OPENAI_")
                or name.lower().endswith("_proxy")
                or name.startswith("SSL_CERT_")
            )
        )
        base_url, key, headers, stream = self._client_settings
        custom = tuple(sorted(headers.items())) if headers else ()
        return (base_url, key, custom, stream, self._timeout, self._idle_timeout, env)

    # -- construction from flags and environment ------------------------------------------

    @classmethod
    def from_env(
        cls,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        provider: str | None = None,
        environ: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> OpenAICompatibleModel:
        """Flags override ``TETHER_MODEL``, ``TETHER_BASE_URL`` and ``TETHER_API_KEY``.

        Empty values count as unset. The base URL defaults to OpenRouter. No other
        variable is consulted for the key (in particular not ``OPENAI_API_KEY``: a key
        meant for one provider is never sent to another).
        """
        env = os.environ if environ is None else environ

        def pick(flag: str | None, name: str) -> str | None:
            if flag is not None and flag.strip():
                return flag.strip()
            value = env.get(name, "").strip()
            return value or None

        chosen_model = pick(model, ENV_MODEL)
        chosen_url = pick(base_url, ENV_BASE_URL)
        if chosen_url is not None:
            source = "--base-url" if base_url and base_url.strip() else ENV_BASE_URL
            parse_base_url(chosen_url, source)
        return cls(
            chosen_model or "",
            base_url=chosen_url,
            api_key=pick(api_key, ENV_API_KEY),
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
            provider=provider,
            **settings,
        )

    # -- identity ---------------------------------------------------------------------------

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
        """``host[:port]/path/model`` of the endpoint; never contains credentials."""
        return f"{self._endpoint.identity_path}/{self._model}"

    @property
    def base_url(self) -> str:
        """The endpoint without user info, query or fragment (safe to show)."""
        return self._endpoint.display

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def idle_timeout(self) -> float:
        return self._idle_timeout

    @property
    def streaming(self) -> bool:
        """True: :meth:`complete` streams and accepts ``on_delta``."""
        return self._stream

    @property
    def open_connections(self) -> int:
        """Connections currently open to the server (for tests of cancellation)."""
        tracker = self._connections
        return 0 if tracker is None else tracker.open_connections

    def __repr__(self) -> str:
        return (
            f"OpenAICompatibleModel(model={self._model!r}, base_url={self._endpoint.display!r}, "
            f"timeout={self._timeout:g})"
        )

    def close(self) -> None:
        """Close the underlying HTTP client (abandoned requests then fail quietly)."""
        if self._sdk_client is not None:
            self._sdk_client.close()
        if self._own_transport is not None:
            self._own_transport.close()

    # -- the request ------------------------------------------------------------------------

    def build_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The wire ``messages`` as values: the system prompt (if not empty), then the context.

        This is the reference the request body's ``messages`` encode (:meth:`request_body`
        builds the bytes from messages encoded once; the tests compare the two). Messages
        are sent in their normalized form, except that an assistant message with
        ``content: null`` and no tool calls is sent with ``content: ""`` (servers reject a
        null content without calls), and an assistant message whose side record holds
        OpenRouter ``reasoning_details`` carries them again.
        """
        import orjson  # not at import: building an agent loads this module, and orjson takes ~18 ms

        wire: list[dict[str, Any]] = []
        if request.system_prompt:
            wire.append({"role": "system", "content": request.system_prompt})
        reasoning = list(request.reasoning)
        for index, message in enumerate(request.messages):
            side = reasoning[index] if index < len(reasoning) else None
            wire.append(orjson.loads(_wire_message(message, side)))
        return wire

    @staticmethod
    def build_tools(request: ModelRequest) -> list[dict[str, Any]]:
        """The wire ``tools``: each definition wrapped as ``{"type":"function",...}``."""
        return [{"type": "function", "function": plain(tool)} for tool in request.tools]

    def request_body(self, request: ModelRequest, *, stream: bool | None = None) -> bytes:
        """The JSON body of the request for ``request`` (streamed unless ``stream`` is false).

        The members ``model``, ``messages`` (:meth:`build_messages`), ``tools`` when there
        are any, ``stream`` and ``stream_options`` when streaming, then the output options.
        The context messages come from the encoded history, so this costs the encoding of
        the messages not seen before plus one copy of the body.
        """
        streamed = self._stream if stream is None else stream
        head = [b'{"model":', dumps(self._model), b',"messages":[']
        if request.system_prompt:
            head.append(self._system_piece(request.system_prompt))
            if len(request.messages):
                head.append(b",")
        tail = [b"]"]
        if request.tools:
            tail += (b',"tools":', self._tools_piece(request.tools))
        if streamed:
            tail.append(_STREAM_TAIL)
        if request.output_options:
            tail += (b",", dumps(request.output_options)[1:-1])
        tail.append(b"}")
        return self._history.join(
            b"".join(head), request.messages, request.reasoning, b"".join(tail)
        )

    @property
    def encoded_messages(self) -> int:
        """Context messages encoded so far (each once; see :mod:`tether._models.encoded`)."""
        return self._history.encoded_messages

    @property
    def encoded_bytes(self) -> int:
        """Bytes of the context messages encoded so far."""
        return self._history.encoded_bytes

    def _system_piece(self, prompt: str) -> bytes:
        with self._pieces_lock:
            if self._system[0] != prompt:  # a string compare: the prompt rarely changes
                self._system = (prompt, dumps({"role": "system", "content": prompt}))
            return self._system[1]

    def _tools_piece(self, tools: Sequence[Mapping[str, Any]]) -> bytes:
        """The encoded ``tools`` array; a registry hands out the same definitions each time."""
        with self._pieces_lock:
            cached, piece = self._tools
            if len(cached) != len(tools) or not all(map(is_, tools, cached)):
                piece = dumps([{"type": "function", "function": tool} for tool in tools])
                self._tools = (list(tools), piece)
            return piece

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
        status: int
        answer: bytes | Mapping[str, Any]
        if self._stream:
            status, answer = self._stream_exchange(body, cancel, on_delta)
        else:
            status, answer = self._exchange(body, cancel)
        try:
            return parse_chat_completion(
                answer, position=request.position, status=status, secrets=self._secrets
            )
        except ModelError as exc:
            raise ModelError(
                exc.code, f"{self._endpoint.display}: {exc.message}", status=status
            ) from None

    def _post(self, body: bytes, *, stream: bool) -> httpx2.Response:
        """One request: the first through the SDK's ``post``, the others as it sent that one.

        The body is sent as given (``content``); the raw response comes back (unread when
        ``stream``); an HTTP error status raises the SDK's error. The SDK's ``post`` costs
        ~0.3 ms a request above its own HTTP client (options models, header merging, auth
        hooks, the response wrapper), a third of a loopback exchange; for a client whose
        headers cannot change from one request to the next (:func:`_static_headers`), the
        next requests go straight to the SDK's HTTP client with the first one's URL,
        headers and timeouts (:meth:`_send_as_before`), through the transport the client
        picked for that URL.
        """
        template = self._template
        if template is None:
            template = self._template = self._shared_template()
        if template is not None:
            return self._send_as_before(template, body, stream=stream)
        import httpx2  # loaded with the client already (see _client)

        # What chat.completions.create asks of post besides the body: bearer auth.
        options: Any = {"security": {"bearer_auth": True}}
        client = self._client
        http = client.post(
            _PATH, cast_to=httpx2.Response, content=body, options=options, stream=stream
        )
        if _static_headers(client):
            sent = http.request  # after a redirect, the last request (_heard had the first)
            known = _SENT_HEADS[_head_key(client)] = _head_of(sent)
            self._template = self._client_template(known)
        return http

    def _heard(self, request: httpx2.Request) -> None:
        """The SDK's request to the model, as it goes out: other adapters with the same
        settings send theirs as it does from now on (:meth:`_shared_template`), not once
        its answer came back: a worker's sessions make their first requests together, and
        a slow model's first answer took seconds, all of them through ``post`` meanwhile."""
        client = self._sdk_client
        if client is None or request.method != "POST" or not _static_headers(client):
            return
        key = _head_key(client)
        if key not in _SENT_HEADS and request.url.path.endswith(_PATH):
            _SENT_HEADS[key] = _head_of(request)

    def _shared_template(self) -> _Template | None:
        """How another adapter's SDK client with the same settings sent its first request,
        on this adapter's own connections: a worker builds an adapter per session in flight,
        and each first request through ``post`` cost ~4x a later one. ``None``: none yet
        (or this client's headers may change: :func:`_static_headers`)."""
        if not _SENT_HEADS:
            return None
        built = None if self._sdk_client is not None else _BUILT.get(self._build_key())
        if built is not None:
            # A client like the one this adapter would build was built: what it sends is
            # known, and its transport was tether's own for every URL. This adapter needs
            # none of its own (~0.1-0.2 ms, a worker's every session) until an answer is an
            # error or a redirect; its connections are its own, as they would be.
            head, plain = built
            known = None if head is None else _SENT_HEADS.get(head)
            if known is None:
                return None
            if not plain:
                return self._client_template(known)
            with self._client_lock:
                if self._own_transport is None:
                    from tether._models.streaming import tracked_transport

                    self._own_transport = tracked_transport(self._tracker)
            return (*known, self._own_transport)
        client = self._client
        if not _static_headers(client):  # (checked first: such a client asks this each time)
            return None
        known = _SENT_HEADS.get(_head_key(client))
        return None if known is None else self._client_template(known)

    def _client_template(
        self, known: tuple[httpx2.URL, list[tuple[bytes, bytes]], dict[str, Any]]
    ) -> _Template:
        url, headers, extensions = known
        return (url, headers, extensions, _plain_transport(self._client._client, url))

    def _send_as_before(self, template: _Template, body: bytes, *, stream: bool) -> httpx2.Response:
        """Send ``body`` through the SDK's HTTP client as the SDK sent the first request,
        raising the errors its ``post`` raises (its ``request`` with ``max_retries=0``).

        The request goes straight to the client's transport for that URL
        (:class:`~tether._models.http11.HTTP11Transport`, :func:`_plain_transport`) with the
        first request's head: ``Client.send`` would add only redirects, cookies kept for
        redirects and its bookkeeping, and an ``httpx.Request`` costs ~20 us to build, so
        one is built only for an error or a redirect, which is handed back to the client
        (it follows redirects as it would have)."""
        import ssl

        import httpx2
        import openai

        url, headers, extensions, transport = template
        made = self._sdk_client  # (None: the adapter's own transport; a client when needed)

        def request() -> httpx2.Request:
            return httpx2.Request("POST", url, headers=headers, content=body, extensions=extensions)

        try:
            if transport is None or (made is not None and made._client.is_closed):
                http = self._client._client.send(request(), stream=stream)
            else:
                sent = [*headers, (b"Content-Length", b"%d" % len(body))]
                http = transport.send("POST", url, sent, body, extensions.get("timeout") or {})
                if http.is_redirect:
                    http.close()
                    http = self._client._client.send(request(), stream=stream)
                else:
                    if not http.is_success:
                        http.request = request()  # the SDK's error names it
                    if not stream:
                        http.read()
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=request()) from exc
        except (httpx2.RequestError, ssl.SSLError) as exc:
            raise openai.APIConnectionError(request=request()) from exc
        if not http.is_success:  # as the SDK's raise_for_status: every status but 2xx
            if not http.is_closed:
                http.read()
            raise self._client._make_status_error_from_response(http) from None
        return http

    def _stream_exchange(
        self,
        body: bytes,
        cancel: threading.Event | None,
        on_delta: DeltaSink | None,
    ) -> tuple[int, bytes | Mapping[str, Any]]:
        """Send the one streamed request; reassemble the chunks into a whole answer."""
        import httpx2
        import openai

        # Imported here with httpx (see _tracker): a request's, not a construction's.
        from tether._models.chat_stream import ChatStreamAccumulator
        from tether._models.streaming import Settled, SSEDecoder, drain, lines_of, run_stream

        where = self._endpoint.display

        def work(emit: Emit) -> tuple[int, bytes | Mapping[str, Any]]:
            http = self._post(body, stream=True)
            try:
                status = http.status_code
                kind = http.headers.get("content-type", "")
                if "text/event-stream" not in kind:  # the server ignored stream: true
                    emit(None)
                    return status, http.read()
                accumulator = ChatStreamAccumulator()
                decoder = SSEDecoder()
                done = False
                lines = lines_of(http.iter_bytes(), emit)
                for line in lines:
                    event = decoder.line(line)
                    if event is None:
                        continue
                    data = event[1]
                    if data == "[DONE]" or data.strip() == "[DONE]":
                        done = True
                        break
                    for delta in accumulator.feed(_chunk(data)):
                        emit(delta)
                if not done and accumulator.finish_reason is None and accumulator.error is None:
                    raise ModelError(
                        "connection",
                        f"the answer from {where} ended before it was complete "
                        f"({accumulator.chunks} chunks, no finish_reason)",
                    )
                result = (status, accumulator.completion())
                if done:
                    emit(Settled(result))
                    drain(lines)  # read to the end: the connection goes back to the pool
                return result
            finally:
                http.close()

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
        except openai.OpenAIError as exc:
            raise self._map_error(exc) from None
        except httpx2.HTTPError as exc:  # a read error after the headers
            raise ModelError(
                "connection",
                self._redact(f"the answer from {where} broke off: {exc or type(exc).__name__}"),
            ) from None

    def _exchange(self, body: bytes, cancel: threading.Event | None) -> tuple[int, bytes]:
        """Send the one request; wait for it, the deadline or cancel (:func:`run_stream`
        with a single deadline: nothing is emitted before the whole answer is read)."""
        import openai

        from tether._models.streaming import run_stream  # with httpx (see _tracker)

        def work(emit: Emit) -> tuple[int, bytes]:
            http = self._post(body, stream=False)
            return http.status_code, http.content

        try:
            return run_stream(
                work,
                cancel=cancel,
                tracker=self._tracker,
                first_byte_timeout=self._timeout + _GRACE,
                idle_timeout=self._timeout + _GRACE,
                on_delta=None,
                where=self._endpoint.display,
            )
        except openai.OpenAIError as exc:
            raise self._map_error(exc) from None
        except ModelError as exc:
            if exc.code != "timeout":
                raise
            raise ModelError(  # the SDK's own timeout normally wins (see _GRACE)
                "timeout", f"no answer from {self._endpoint.display} within {self._timeout:g} s"
            ) from None

    # -- errors -----------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def _map_error(self, exc: openai.OpenAIError) -> ModelError:
        import openai

        where = self._endpoint.display
        if isinstance(exc, openai.APITimeoutError):
            return ModelError("timeout", f"no answer from {where} within {self._timeout:g} s")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = str(cause) if cause is not None and str(cause) else exc.message
            return ModelError("connection", self._redact(f"cannot reach {where}: {detail}"))
        if isinstance(exc, openai.APIResponseValidationError):
            return ModelError(
                "bad_response", self._redact(f"{where} sent an invalid answer: {exc.message}")
            )
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            said = provider_message(exc.body) or f"HTTP {status}"
            retry_after = retry_after_seconds(exc.response.headers)
            if isinstance(exc, openai.RateLimitError):
                hint = (
                    f" (provider suggests retrying after {retry_after:g} s)"
                    if (retry_after is not None)
                    else ""
                )
                return ModelError(
                    "rate_limited",
                    self._redact(f"rate limited by {where} (HTTP {status}): {said}{hint}"),
                    status=status,
                    retry_after=retry_after,
                )
            if isinstance(exc, openai.AuthenticationError):
                if self._sent_no_key:
                    return ModelError(
                        "authentication",
                        self._redact(
                            f"{where} wants an API key (HTTP {status}): {said}; no key was "
                            f"sent: set {ENV_API_KEY}"
                        ),
                        status=status,
                    )
                return ModelError(
                    "authentication",
                    self._redact(
                        f"{where} rejected the API key (HTTP {status}): {said}; check {ENV_API_KEY}"
                    ),
                    status=status,
                )
            if status == 404 or (status == 400 and "model" in said.lower()):
                return ModelError(
                    "provider_error",
                    self._redact(
                        f"{where} answered HTTP {status} for model {self._model!r}: {said} "
                        "(check the model id and the base URL)"
                    ),
                    status=status,
                )
            return ModelError(
                "provider_error",
                self._redact(f"{where} answered HTTP {status}: {said}"),
                status=status,
                retry_after=retry_after,
            )
        return ModelError("provider_error", self._redact(f"{where}: {exc}"))


# -- the wire form of a message (encoded once per message) ------------------------------------


def _encode_message(
    message: Mapping[str, Any], side: Reasoning | None, state: None
) -> tuple[bytes, None]:
    """:class:`~tether._models.encoded.EncodedPrefix`'s encoder: pieces need no state."""
    return _wire_message(message, side), None


def _wire_message(message: Mapping[str, Any], side: Reasoning | None) -> bytes:
    """The bytes of one context message as the chat-completions API takes it.

    The normalized message as it is, except an assistant message with ``content: null``
    and no tool calls gets ``content: ""`` and one with an OpenRouter side record gets its
    ``reasoning_details`` back (:meth:`OpenAICompatibleModel.build_messages`)."""
    if message.get("role") == "assistant":
        openrouter = side is not None and side.format == "openrouter"
        empty = message.get("content") is None and not message.get("tool_calls")
        if openrouter or empty:
            item = dict(message)
            if empty:
                item["content"] = ""
            if openrouter:  # OpenRouter wants them back, verbatim, across tool calls
                assert side is not None
                item["reasoning_details"] = side.details
            return dumps(item)
    return dumps(message)


_Template = tuple["httpx2.URL", list[tuple[bytes, bytes]], dict[str, Any], "HTTP11Transport | None"]
"""A request as the SDK sent it: its URL, its raw headers but the length, its extensions
(the timeouts), and the transport the later ones go to (``None``: through the client)."""


_SENT_HEADS: dict[
    tuple[Any, ...], tuple[httpx2.URL, list[tuple[bytes, bytes]], dict[str, Any]]
] = {}
"""The first request's URL, head and extensions, by the client state they are made of
(:func:`_head_key`): shared by the adapters of a process with the same settings."""


_BUILT: dict[tuple[Any, ...], tuple[tuple[Any, ...] | None, bool]] = {}
"""By what a client was built from (``_build_key``): its head key (:func:`_head_key`;
``None``: its headers may change) and whether it sends every URL through tether's own
transport (:func:`_what_was_built`)."""


def _what_was_built(client: openai.OpenAI) -> tuple[tuple[Any, ...] | None, bool]:
    # Plain: no mount (a proxy from the environment is one; read defensively, an httpx that
    # names it otherwise keeps the client's path), so every URL goes where the base URL does.
    mounts = getattr(client._client, "_mounts", None)
    plain = (
        isinstance(mounts, dict)
        and not mounts
        and _plain_transport(client._client, client.base_url) is not None
    )
    return (_head_key(client) if _static_headers(client) else None), plain


def _head_key(client: openai.OpenAI) -> tuple[Any, ...]:
    """What the SDK builds a chat request's head from, for a client whose headers do not
    change (:func:`_static_headers`): its URL, credentials, organization and project
    (which it may read from the environment), custom headers, timeout and HTTP client
    headers (a value that is not a string is the SDK's ``Omit``: the header is left out)."""
    custom = tuple(
        (str(k), v if isinstance(v, str) else type(v).__name__)
        for k, v in client._custom_headers.items()
    )
    return (
        str(client.base_url),
        client.api_key,
        client.organization,
        client.project,
        custom,
        repr(client.timeout),
        tuple(client._client.headers.raw),
        repr(client._client.timeout),
    )


def _head_of(
    request: httpx2.Request,
) -> tuple[httpx2.URL, list[tuple[bytes, bytes]], dict[str, Any]]:
    """A request's URL, head (without its body's length) and extensions."""
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    return request.url, headers, dict(request.extensions)


def _static_headers(client: openai.OpenAI) -> bool:
    """Whether every request of ``client`` carries the headers its first one did.

    True for the clients this module builds (a fixed key, no provider runtime that signs
    or rewrites requests, no workload identity whose token expires, no key provider that
    refreshes the key); checked on the client rather than assumed, so a client that some
    future code builds otherwise, or an SDK that renames these attributes, keeps every
    request on the SDK's own path."""
    missing = object()
    hooks = ("_provider_runtime", "_workload_identity_auth", "_api_key_provider")
    return all(getattr(client, name, missing) is None for name in hooks) and hasattr(
        client, "_make_status_error_from_response"
    )


def _plain_transport(client: httpx2.Client, url: httpx2.URL) -> HTTP11Transport | None:
    """The transport ``client`` sends ``url`` through, when it is tether's and
    ``Client.send`` adds nothing to it: no auth flow, no event hooks (a proxy from the
    environment has a transport of httpx's: ``None``, the client sends)."""
    from tether._models.http11 import HTTP11Transport  # loaded with the client (see _client)

    if client.auth is not None or any(client.event_hooks.values()):
        return None
    transport = client._transport_for_url(url)
    return transport if isinstance(transport, HTTP11Transport) else None


def _chunk(data: str) -> Any:
    """One streamed chunk's JSON (orjson; the stdlib parser only for what orjson refuses, so
    an unpaired surrogate is reported as one, by the answer's checks)."""
    import orjson  # loaded by the first request's encoding already; a lookup here

    try:
        return orjson.loads(data)
    except ValueError:
        try:
            return json.loads(data)
        except ValueError:
            snippet = " ".join(data.split())[:200]
            raise _bad(f"a streamed chunk is not JSON: {snippet}") from None


# -- parsing (pure) ---------------------------------------------------------------------------


def _bad(message: str) -> ModelError:
    return ModelError("bad_response", message)


def _count(usage: Mapping[str, Any], name: str, where: str) -> int | None:
    value = usage.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"provider usage {where}{name} is not a number: {value!r}"[:300])
    if isinstance(value, float):
        if not value.is_integer():
            raise _bad(f"provider usage {where}{name} is not an integer: {value!r}")
        value = int(value)
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise _bad(f"provider usage {where}{name} is out of range: {value}")
    return value


def _first(*values: int | None) -> int:
    for value in values:
        if value is not None:
            return value
    return 0


def usage_from_json(usage: object) -> TokenUsage:
    """Convert a chat-completions ``usage`` object into the log's four counters.

    * ``output`` = ``completion_tokens`` (reasoning tokens included).
    * ``cache_read`` = ``prompt_tokens_details.cached_tokens`` (OpenAI, OpenRouter, vLLM),
      else ``cache_read_input_tokens`` (Anthropic-style), else ``prompt_cache_hit_tokens``
      (DeepSeek).
    * ``cache_write`` = ``prompt_tokens_details.cache_write_tokens`` (OpenRouter), else
      ``cache_creation_input_tokens`` (Anthropic-style).
    * ``input`` = the prompt tokens that were neither read from nor written to the cache:
      ``prompt_tokens - cache_read - cache_write``, because OpenAI-style ``prompt_tokens``
      includes cached tokens. If the cache counts exceed ``prompt_tokens`` the provider
      evidently reported ``prompt_tokens`` without them, and it is used as is.

    So the counters are disjoint and ``input + cache_read + cache_write`` is the whole
    prompt. A missing ``usage`` gives all zeros; malformed counters are a
    ``bad_response`` error.
    """
    if usage is None:
        return TokenUsage()
    if not isinstance(usage, Mapping):
        raise _bad("provider usage is not an object")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, Mapping):
        details = None
    d: Mapping[str, Any] = details or {}
    prompt = _first(_count(usage, "prompt_tokens", ""), _count(usage, "input_tokens", ""))
    output = _first(_count(usage, "completion_tokens", ""), _count(usage, "output_tokens", ""))
    cache_read = _first(
        _count(d, "cached_tokens", "prompt_tokens_details."),
        _count(usage, "cache_read_input_tokens", ""),
        _count(usage, "prompt_cache_hit_tokens", ""),
    )
    cache_write = _first(
        _count(d, "cache_write_tokens", "prompt_tokens_details."),
        _count(usage, "cache_creation_input_tokens", ""),
    )
    cached = cache_read + cache_write
    fresh = prompt - cached if cached <= prompt else prompt
    return TokenUsage(input=fresh, output=output, cache_read=cache_read, cache_write=cache_write)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{where} is not a string")
    if has_unpaired_surrogate(value):
        raise _bad(f"{where} contains an unpaired surrogate")
    return value


def _content(message: Mapping[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text parts, in order
        texts = [
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        content = "".join(texts) if texts else None
    if content is not None:
        content = _text(content, "message content")
    refusal = message.get("refusal")
    if not content and isinstance(refusal, str) and refusal.strip():
        content = _text(refusal, "message refusal")
    return content


def _arguments(value: object, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, (Mapping, list)):  # some servers send parsed arguments
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except ValueError:
            raise _bad(f"{where} is not valid JSON") from None
    raise _bad(f"{where} is neither a string nor a JSON object")


def _tool_calls(message: Mapping[str, Any], position: int) -> tuple[ToolCallOut, ...]:
    from tether._models.messages import ToolCallOut  # a call's values: see _models.base

    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        legacy = message.get("function_call")
        raw_calls = [{"type": "function", "function": legacy}] if legacy is not None else []
    if not isinstance(raw_calls, list):
        raise _bad("message tool_calls is not a list")
    calls: list[ToolCallOut] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_calls):
        where = f"tool call #{index}"
        if not isinstance(raw, Mapping):
            raise _bad(f"{where} is not an object")
        kind = raw.get("type", "function")
        if kind not in ("function", None):
            raise _bad(f"{where} has unsupported type {str(kind)[:40]!r}")
        function = raw.get("function")
        if not isinstance(function, Mapping):
            raise _bad(f"{where} has no function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where} has no function name")
        name = _text(name, f"{where} name")
        raw_id = raw.get("id")
        call_id = (
            _text(raw_id, f"{where} id")
            if isinstance(raw_id, str) and raw_id
            else default_call_id(position, index)
        )
        if call_id in seen:
            raise _bad(f"{where} repeats tool call id {call_id[:80]!r}")
        seen.add(call_id)
        arguments = _arguments(function.get("arguments"), f"{where} arguments")
        calls.append(ToolCallOut(id=call_id, name=name, arguments=arguments))
    return tuple(calls)


def parse_chat_completion(
    body: bytes | str | Mapping[str, Any],
    *,
    position: int = 0,
    status: int = 200,
    secrets: tuple[str, ...] = (),
) -> ModelResponse:
    """Parse a chat-completions response body into a :class:`ModelResponse`.

    Only the first choice is used. Malformed bodies raise ``bad_response``; an
    ``error`` object in a 2xx body (OpenRouter does this for upstream failures)
    raises ``provider_error`` with the provider's message. Bad tool arguments and
    unknown tool names are *not* errors (the planner handles them), nor is an empty
    answer. A ``Mapping`` is an answer already decoded (a reassembled stream).
    """
    if isinstance(body, Mapping):
        return _parse_completion(body, status=status, position=position, secrets=secrets)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        snippet = " ".join(text.split())[:200]
        raise _bad(
            redact(f"the answer (HTTP {status}) is not JSON: {snippet or 'empty body'}", secrets)
        ) from None
    if not isinstance(data, Mapping):
        raise _bad(f"the answer (HTTP {status}) is not a JSON object")
    return _parse_completion(data, status=status, position=position, secrets=secrets)


def _parse_completion(
    data: Mapping[str, Any], *, status: int, position: int, secrets: tuple[str, ...]
) -> ModelResponse:
    from tether._models.messages import ModelResponse  # a call's values: see _models.base

    choices = data.get("choices")
    error = data.get("error")
    if error is not None and not choices:
        said = provider_message(data) or "unspecified error"
        raise ModelError("provider_error", redact(f"provider reported an error: {said}", secrets))
    if not isinstance(choices, list) or not choices:
        raise _bad("the answer has no choices")
    choice = choices[0]
    if not isinstance(choice, Mapping):
        raise _bad("the answer's first choice is not an object")
    if choice.get("error") is not None:
        said = provider_message({"error": choice.get("error")}) or "unspecified error"
        raise ModelError("provider_error", redact(f"provider reported an error: {said}", secrets))
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise _bad("the answer's finish_reason is not a string")
    if finish == "error":
        raise ModelError("provider_error", "provider ended the answer with finish_reason 'error'")
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise _bad("the answer's first choice has no message")
    content = _content(message)
    calls = _tool_calls(message, position)
    raw_usage = data.get("usage")
    usage = usage_from_json(raw_usage)
    return ModelResponse(
        content=content,
        tool_calls=calls,
        stop_reason=stop_reason_for(finish, bool(calls)),
        usage=usage,
        finish_reason=finish,
        reasoning=_reasoning(message),
        reasoning_tokens=_reasoning_tokens(raw_usage),
        cost=_cost(raw_usage),
    )


def _reasoning(message: Mapping[str, Any]) -> Reasoning | None:
    """``reasoning`` (OpenRouter) or ``reasoning_content`` (DeepSeek, vLLM), plus
    OpenRouter's ``reasoning_details`` (sent back verbatim on later requests)."""
    from tether._models.messages import Reasoning  # a call's values: see _models.base

    text = ""
    for name in ("reasoning", "reasoning_content"):
        value = message.get(name)
        if isinstance(value, str) and value:
            text = _text(value, f"message {name}")
            break
    details = message.get("reasoning_details")
    kept = (
        tuple(plain(d) for d in details if isinstance(d, Mapping))
        if isinstance(details, list)
        else ()
    )
    if not text and not kept:
        return None
    return Reasoning(text=text, details=kept, format="openrouter" if kept else "text")


def _reasoning_tokens(usage: object) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("completion_tokens_details")
    if not isinstance(details, Mapping):
        return None
    try:
        return _count(details, "reasoning_tokens", "completion_tokens_details.")
    except ModelError:
        return None


def _cost(usage: object) -> float | None:
    if not isinstance(usage, Mapping):
        return None
    cost = usage.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        return None
    return float(cost) if math.isfinite(cost) and cost >= 0 else None
