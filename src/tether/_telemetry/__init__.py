"""OpenTelemetry export: spans out of the process, never in the way of a run.

The optional extra ``otel`` (``pip install 'tether[otel]'``: the OpenTelemetry SDK and the
OTLP/HTTP exporter) turns it on; without it, or when nothing asks for export, tether has no
telemetry at all (:func:`open_telemetry` returns ``None``). What asks for it, first match:

1. ``OTEL_SDK_DISABLED=true`` — off;
2. ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` — on, to there
   (the exporter reads the standard variables itself: headers, timeout, …);
3. ``[telemetry] endpoint`` in ``tether.toml`` (or ``enabled = true``: the standard default,
   ``http://localhost:4318``).

Rules of this module:

* export never blocks or fails a run: finished spans go to the standard batch processor
  (a bounded queue, a worker thread, a short schedule so a SIGKILL loses little more than
  the spans still open); a collector that cannot be reached costs one ``warning:`` line on
  stderr, after which this process drops its spans without trying the network again
  (:class:`_Exporter`); at exit the queue gets :data:`EXIT_FLUSH_SECONDS` at most;
* one trace per session, across crashes: the trace id of a session's root spans is derived
  from the session id (:func:`trace_id_for`), so every process that drives the session adds
  to the same trace;
* the caller works with plain values (names, attribute mappings) and opaque span handles:
  nothing outside this package imports ``opentelemetry``.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from tether.core.records import record

__all__ = [
    "EXIT_FLUSH_SECONDS",
    "Telemetry",
    "TelemetryConfig",
    "open_telemetry",
    "trace_id_for",
]

EXIT_FLUSH_SECONDS: Final = 2.0
"""How long the exit may wait for the spans still queued (a reachable collector)."""

SCHEDULE_MILLIS: Final = 200
"""The batch processor's pause between exports (the standard default is 5 s: a crash would
lose that much)."""

DEFAULT_ENDPOINT: Final = "http://localhost:4318"
TRACES_PATH: Final = "/v1/traces"

AttributeValue = str | bool | int | float | Sequence[str]


@record
class TelemetryConfig:
    """``[telemetry]`` of ``tether.toml``."""

    enabled: bool | None = None
    """``True``: export to ``endpoint`` (default localhost); ``False``: never export, even
    when the ``OTEL_*`` variables ask; ``None``: as the variables say."""
    endpoint: str | None = None
    """The OTLP/HTTP base URL (``/v1/traces`` is appended), e.g. ``http://localhost:4318``."""
    capture_content: bool = False
    """Put the model's answers (masked) on the chat spans (the GenAI convention's opt-in;
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` does it too)."""
    service_name: str = "tether"


def trace_id_for(session_id: str) -> int:
    """The trace id of a session: its id's 128 bits (a UUIDv7 is never zero), else a hash."""
    import uuid  # with the first span; uuid loads platform, which building an agent needs not

    try:
        value = uuid.UUID(session_id).int
    except ValueError:
        value = uuid.uuid5(uuid.NAMESPACE_URL, f"tether:{session_id}").int
    return value or 1


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def open_telemetry(
    config: TelemetryConfig, environ: Mapping[str, str] | None = None
) -> Telemetry | None:
    """The process's telemetry, or ``None`` when nothing asks for export (or the ``otel``
    extra is missing: then one ``warning:`` line says so, if something asked)."""
    env = os.environ if environ is None else environ
    if config.enabled is False or _truthy(env.get("OTEL_SDK_DISABLED")):
        return None
    from_env = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    endpoint: str | None = None
    if not from_env:
        if config.endpoint is None and not config.enabled:
            return None
        endpoint = (config.endpoint or DEFAULT_ENDPOINT).rstrip("/") + TRACES_PATH
    capture = config.capture_content or _truthy(
        env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    )
    return _shared(endpoint, capture, config.service_name, env)


_LOCK = threading.Lock()
_OPEN: dict[tuple[str | None, str], Telemetry] = {}


def _shared(
    endpoint: str | None, capture: bool, service: str, env: Mapping[str, str]
) -> Telemetry | None:
    """One exporter per endpoint per process: every agent of the process shares it."""
    with _LOCK:
        key = (endpoint, service)
        found = _OPEN.get(key)
        if found is None:
            try:
                found = Telemetry.start(endpoint, service, env)
            except ImportError:
                _warn(
                    "telemetry is configured but the 'otel' extra is not installed "
                    "(pip install 'tether[otel]'); no spans are exported"
                )
                return None
            _OPEN[key] = found
    return found.with_capture(capture)


_warned: set[str] = set()


def _warn(message: str) -> None:
    """One ``warning:`` line on stderr, once per process per message."""
    if message in _warned:
        return
    _warned.add(message)
    try:
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


_ROOT_TRACE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tether_root_trace", default=None
)


class Telemetry:
    """A tracer over the OTLP/HTTP exporter (see the module docstring)."""

    def __init__(
        self, tracer: Any, provider: Any, capture_content: bool, exporter: Any = None
    ) -> None:
        self._tracer = tracer
        self._provider = provider
        self.capture_content = capture_content
        self._exporter = exporter

    @property
    def down(self) -> bool:
        """The collector could not be reached: spans are no longer made at all (they would
        be dropped; making them would be all the cost an unreachable collector has)."""
        exporter = self._exporter
        return exporter is not None and bool(exporter.down)

    @classmethod
    def start(cls, endpoint: str | None, service: str, env: Mapping[str, str]) -> Telemetry:
        import logging  # the SDK's loggers: only once telemetry is on (like the SDK itself)

        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        # The exporter logs every failed batch with a traceback: one warning line instead.
        for name in ("opentelemetry.exporter", "opentelemetry.sdk"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

        class SessionIds(RandomIdGenerator):
            """Root spans take the session's trace id (one trace across crashes)."""

            def generate_trace_id(self) -> int:
                chosen = _ROOT_TRACE.get()
                return chosen if chosen is not None else super().generate_trace_id()

        timeout = _seconds(env.get("OTEL_EXPORTER_OTLP_TIMEOUT"), default=5.0)
        inner = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
        where = endpoint or getattr(inner, "_endpoint", "the OTLP endpoint")
        provider = TracerProvider(
            resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service}),
            id_generator=SessionIds(),
            shutdown_on_exit=False,
        )
        exporter = _exporter(inner, str(where))
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                schedule_delay_millis=_millis(env.get("OTEL_BSP_SCHEDULE_DELAY"), SCHEDULE_MILLIS),
                max_queue_size=2048,
            )
        )
        atexit.register(_close, provider, exporter)
        # A collector nobody listens on is found out at once, not after the exporter's
        # retries (seconds): from then on no span is made at all.
        threading.Thread(target=_probe, args=(str(where), exporter), daemon=True).start()
        return cls(provider.get_tracer("tether"), provider, False, exporter)

    def with_capture(self, capture: bool) -> Telemetry:
        if capture == self.capture_content:
            return self
        return Telemetry(self._tracer, self._provider, capture, self._exporter)

    # ------------------------------------------------------------------ spans

    def begin(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue],
        *,
        parent: Any = None,
        trace_of: str | None = None,
        kind: str = "internal",
    ) -> Any:
        """Start a span (a child of ``parent``, else a root in the trace of the session
        ``trace_of``); the handle goes to :meth:`end` and :meth:`event`. ``None`` once the
        collector is known to be down (every method takes ``None`` and does nothing)."""
        if self.down:
            return None
        from opentelemetry import trace

        context = trace.set_span_in_context(parent) if parent is not None else None
        span_kind = trace.SpanKind.CLIENT if kind == "client" else trace.SpanKind.INTERNAL
        token = _ROOT_TRACE.set(trace_id_for(trace_of) if trace_of and parent is None else None)
        try:
            return self._tracer.start_span(
                name, context=context, kind=span_kind, attributes=dict(attributes)
            )
        finally:
            _ROOT_TRACE.reset(token)

    def end(
        self,
        span: Any,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        error: str | None = None,
    ) -> None:
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        if attributes:
            span.set_attributes(dict(attributes))
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def event(self, span: Any, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        if span is not None:
            span.add_event(name, dict(attributes))

    def traceparent(self, span: Any) -> dict[str, str]:
        """The W3C trace context of ``span`` (``traceparent``, ``tracestate``)."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        if span is None:
            return carrier
        TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
        return carrier

    def flush(self, timeout: float = EXIT_FLUSH_SECONDS) -> None:
        """Export what is queued, waiting ``timeout`` seconds at most."""
        self._provider.force_flush(int(timeout * 1000))


def _close(provider: Any, exporter: Any) -> None:
    """At exit: what is queued gets a bounded flush (:data:`EXIT_FLUSH_SECONDS` once the
    collector has answered, :data:`FIRST_ANSWER_SECONDS` while it never has), then a retry
    still waiting is cut short and the worker stops: a collector that is down never holds
    the exit."""
    try:
        wait = EXIT_FLUSH_SECONDS if exporter.answered else FIRST_ANSWER_SECONDS
        if not exporter.down:
            # The SDK's flush exports in the calling thread with the exporter's own retries
            # (unbounded by its timeout argument): a thread of its own, waited for a while.
            flusher = threading.Thread(target=provider.force_flush, daemon=True)
            flusher.start()
            flusher.join(wait)
        exporter.abort()
        provider.shutdown()
    except Exception:  # pragma: no cover - never let telemetry fail an exit
        pass


FIRST_ANSWER_SECONDS: Final = 0.3
"""How long the exit waits for a collector that has not answered yet (a healthy one on the
same network answers in milliseconds)."""


PROBE_SECONDS: Final = 3.0
"""How long the first look at the collector may take to connect."""


def _probe(url: str, exporter: Any) -> None:
    """Connect to the collector once (in a thread of its own): a refused or unreachable
    address marks the exporter down, with its one warning line."""
    import socket  # only with telemetry on: this module is loaded by every agent

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), PROBE_SECONDS):
            return
    except OSError:
        exporter.give_up()


def _seconds(text: str | None, *, default: float) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if value > 0 else default


def _millis(text: str | None, default: int) -> int:
    try:
        value = int(text) if text else default
    except ValueError:
        return default
    return value if value >= 0 else default


def _exporter(inner: Any, where: str) -> Any:
    """``inner`` that gives up after its first failure: one warning line, then the spans
    of this process are dropped without touching the network (a collector that is down
    must not cost a retry per batch, nor a wait at exit)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Exporter(SpanExporter):
        def __init__(self) -> None:
            self.down = False
            self.answered = False

        def export(self, spans: Sequence[Any]) -> Any:
            if self.down:
                return SpanExportResult.FAILURE
            try:
                result = inner.export(spans)
            except Exception:
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                self.answered = True
            else:
                self.give_up()
            return result

        def give_up(self) -> None:
            if not self.answered:
                self.down = True
                _warn(f"telemetry: cannot export spans to {where}; this process sends no more")

        def abort(self) -> None:
            """Cut a retry's backoff short (the exporter's shutdown does)."""
            inner.shutdown()

        def shutdown(self) -> None:
            pass  # abort() did it

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return Exporter()


Hook = Callable[[], None]
