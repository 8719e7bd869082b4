"""Spans of the OpenTelemetry GenAI conventions, from the agent's progress events.

One span per agent invocation (``invoke_agent``: one call of ``run``, ``resume``, ``retry``
or ``compact``, in one process), per model attempt (``chat {model}``) and per tool call
(``execute_tool {name}``), with the standard attributes (``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.conversation.id`` = the session
id, ``gen_ai.tool.call.id``; errors as the span status). The invocation spans of a session
are roots of one trace whose id is derived from the session id, so the spans of a resumed
run join the trace of the process that crashed (:func:`tether._telemetry.trace_id_for`).

Recovery decisions are span events ``tether.recovery`` on the invocation span, with the
decision and the plan that made it (:data:`HANDLERS` says which event means which); a
retry's backoff (a durable wait) is a span of its own.

Rules of this module:

* :data:`HANDLERS` is the one table from event type to what it does to the spans; an event
  it does not name changes nothing;
* telemetry never fails a run: a handler's error is swallowed (and the span left as is);
* without telemetry (:class:`Tracing` over ``None``) every method is a cheap no-op;
* message content goes on a span only when capture is on, after tether's secret masking
  (the events reach this sink masked).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache, partial
from typing import TYPE_CHECKING, Any, Final

from tether._mcp.trace import TRACE_CONTEXT
from tether._telemetry import Telemetry

if TYPE_CHECKING:
    import tether._runtime.events as events

__all__ = ["RECOVERY_EVENT", "Tracing", "handlers"]

RECOVERY_EVENT: Final = "tether.recovery"
AGENT_NAME: Final = "tether"


def _legacy_names() -> bool:
    """Whether to add the pre-1.37 attribute names too (``gen_ai.system``): unless
    ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest GenAI conventions only."""
    opt_in = os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return "gen_ai_latest_experimental" not in {p.strip() for p in opt_in.split(",")}


class Tracing:
    """The spans of one agent (see the module docstring)."""

    def __init__(self, telemetry: Telemetry | None, *, model: str = "", provider: str = "") -> None:
        self.telemetry = telemetry
        self.model = model
        self.provider = provider
        self._legacy = _legacy_names()
        self._session: str | None = None
        self._invocation: Any = None
        self._chat: Any = None
        self._tools: dict[str, Any] = {}
        self._wait: Any = None

    @property
    def enabled(self) -> bool:
        return self.telemetry is not None

    def _common(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gen_ai.provider.name": self.provider}
        if self._legacy:
            out["gen_ai.system"] = self.provider
        if self._session is not None:
            out["gen_ai.conversation.id"] = self._session
        return out

    # ------------------------------------------------------------------ invocation

    @contextmanager
    def invocation(self, session_id: str) -> Iterator[None]:
        """The ``invoke_agent`` span around one call on ``session_id``."""
        telemetry = self.telemetry
        if telemetry is None or self._invocation is not None:
            yield  # no telemetry, or a call inside a call (a follow-up run): one span
            return
        self._session = session_id
        span = telemetry.begin(
            "invoke_agent",
            {
                **self._common(),
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": AGENT_NAME,
                "gen_ai.request.model": self.model,
            },
            trace_of=session_id,
        )
        self._invocation = span
        error: str | None = None
        try:
            yield
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            self._finish_children()
            self._invocation = None
            _quietly(lambda: telemetry.end(span, error=error))

    def _finish_children(self) -> None:
        """Spans still open when the call ends (a stop, an error) end with it."""
        telemetry = self.telemetry
        assert telemetry is not None
        for span in [self._chat, self._wait, *self._tools.values()]:
            if span is not None:
                _quietly(partial(telemetry.end, span, error="unfinished"))
        self._chat = self._wait = None
        self._tools.clear()

    def on_event(self, event: events.Event) -> None:
        """The event sink (composed before the user's, after masking)."""
        if self.telemetry is None or self._invocation is None:
            return
        import tether._runtime.events as events  # loaded already: an event was made

        handler = handlers().get(type(event))
        if self._wait is not None and type(event) is not events.RetryScheduled:
            _quietly(self._end_wait)
        if handler is not None:
            _quietly(lambda: handler(self, event))

    # ------------------------------------------------------------------ handlers

    def _recovery(self, decision: str, plan: str, **attributes: Any) -> None:
        assert self.telemetry is not None
        self.telemetry.event(
            self._invocation,
            RECOVERY_EVENT,
            {"tether.recovery.decision": decision, "tether.recovery.plan": plan, **attributes},
        )

    def _model_started(self, event: events.ModelStarted) -> None:
        assert self.telemetry is not None
        if self._chat is not None:
            self.telemetry.end(self._chat, error="unfinished")
        self._chat = self.telemetry.begin(
            f"chat {self.model}",
            {
                **self._common(),
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": self.model,
                "tether.attempt": event.attempt,
                "tether.operation": event.operation,
            },
            parent=self._invocation,
            kind="client",
        )
        if event.attempt > 1:
            self._recovery("retried_attempt", "startStep", **{"tether.attempt": event.attempt})

    def _model_finished(self, event: events.ModelFinished) -> None:
        assert self.telemetry is not None
        if self._chat is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.response.model": self.model,
            "gen_ai.response.finish_reasons": [event.stop_reason],
        }
        if self.telemetry.capture_content and event.text:
            message = {"role": "assistant", "parts": [{"type": "text", "content": event.text}]}
            attributes["gen_ai.output.messages"] = json.dumps([message], ensure_ascii=False)
        self._chat.set_attributes(attributes)

    def _usage(self, event: events.UsageReported) -> None:
        assert self.telemetry is not None
        if self._chat is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": event.input + event.cache_read + event.cache_write,
            "gen_ai.usage.output_tokens": event.output,
        }
        if event.cache_read:
            attributes["gen_ai.usage.cache_read.input_tokens"] = event.cache_read
        if event.cost is not None:
            attributes["tether.cost_usd"] = event.cost
        span, self._chat = self._chat, None
        self.telemetry.end(span, attributes=attributes)

    def _model_failed(self, event: events.ModelFailed) -> None:
        assert self.telemetry is not None
        span, self._chat = self._chat, None
        if span is not None:
            self.telemetry.end(span, error=event.code or "model_error")

    def _tool_started(self, event: events.ToolStarted) -> None:
        assert self.telemetry is not None
        span = self._tools[event.call_id] = self.telemetry.begin(
            f"execute_tool {event.name}",
            {
                **self._common(),
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": event.name,
                "gen_ai.tool.call.id": event.call_id,
                "tether.tool.replay": event.replay,
            },
            parent=self._invocation,
        )
        # An MCP tools/call made while this span is open carries its trace context.
        TRACE_CONTEXT.set(partial(self.telemetry.traceparent, span))
        if event.replay:
            self._recovery("replayed_call", "startTool", **_call(event.name, event.call_id))

    def _tool_finished(self, event: events.ToolFinished) -> None:
        assert self.telemetry is not None
        span = self._tools.pop(event.call_id, None)
        TRACE_CONTEXT.set(None)
        if span is not None:
            self.telemetry.end(span, error="tool_error" if event.is_error else None)

    def _tool_skipped(self, event: events.ToolSkipped) -> None:
        if event.reason == "interrupted":
            self._recovery(
                "interrupted_call", "appendSynthetic", **_call(event.name, event.call_id)
            )
        else:
            assert self.telemetry is not None
            self.telemetry.event(
                self._invocation,
                "tether.tool.skipped",
                {**_call(event.name, event.call_id), "tether.reason": event.reason},
            )

    def _tool_reconciled(self, event: events.ToolReconciled) -> None:
        decision = "needs_review" if event.review_item is not None else "reconciled"
        attributes: dict[str, Any] = {
            **_call(event.name, event.call_id),
            "tether.recovery.verdict": event.verdict,
            "tether.recovery.action": event.action,
            "tether.recovery.from_ledger": event.recovered_from_ledger,
        }
        if event.review_item is not None:
            attributes["tether.review_item"] = event.review_item
        self._recovery(decision, "reconcile", **attributes)

    def _retry_scheduled(self, event: events.RetryScheduled) -> None:
        assert self.telemetry is not None
        self._end_wait()
        self._wait = self.telemetry.begin(
            "wait retry_backoff",
            {
                "tether.retry.reason": event.reason,
                "tether.retry.delay_seconds": event.delay,
                "tether.retry": event.retry,
            },
            parent=self._invocation,
        )

    def _end_wait(self) -> None:
        span, self._wait = self._wait, None
        if span is not None and self.telemetry is not None:
            self.telemetry.end(span)

    def _approval_parked(self, event: events.ApprovalParked) -> None:
        assert self.telemetry is not None
        self.telemetry.event(
            self._invocation,
            "tether.approval.parked",
            {**_call(event.name, event.call_id), "tether.approval.request": event.request_id},
        )

    def _blocked(self, event: events.Blocked) -> None:
        assert self.telemetry is not None
        self.telemetry.event(self._invocation, "tether.blocked", {"tether.reason": event.reason})

    def _operation_finished(self, event: events.OperationFinished) -> None:
        assert self.telemetry is not None
        self.telemetry.event(
            self._invocation,
            "tether.operation.finished",
            {"tether.operation": event.operation, "tether.outcome": event.outcome},
        )


def _call(name: str, call_id: str) -> dict[str, Any]:
    return {"gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}


def _quietly(action: Callable[[], object]) -> None:
    """Telemetry never fails a run."""
    try:
        action()
    except Exception:  # pragma: no cover - a broken exporter or SDK
        pass


@cache
def handlers() -> Mapping[type, Callable[[Tracing, Any], None]]:
    """Event type → what it does to the spans (the one table). Made on first use: every
    agent builds a :class:`Tracing`, and only one with telemetry reads the table, so the
    event types' module (~18 records) is not loaded to build an agent."""
    import tether._runtime.events as events  # loaded already: an event was made

    return {
        events.ModelStarted: Tracing._model_started,
        events.ModelFinished: Tracing._model_finished,
        events.UsageReported: Tracing._usage,
        events.ModelFailed: Tracing._model_failed,
        events.ToolStarted: Tracing._tool_started,
        events.ToolFinished: Tracing._tool_finished,
        events.ToolSkipped: Tracing._tool_skipped,
        events.ToolReconciled: Tracing._tool_reconciled,
        events.RetryScheduled: Tracing._retry_scheduled,
        events.ApprovalParked: Tracing._approval_parked,
        events.Blocked: Tracing._blocked,
        events.OperationFinished: Tracing._operation_finished,
    }
