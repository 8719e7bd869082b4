"""The trace context a ``tools/call`` carries (kept apart from the manager, which loads
asyncio: the runtime's tracing sets it on every run, MCP or not)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping

__all__ = ["TRACE_CONTEXT"]

TRACE_CONTEXT: contextvars.ContextVar[Callable[[], Mapping[str, str]] | None] = (
    contextvars.ContextVar("tether_mcp_trace_context", default=None)
)
"""How to make the W3C trace context (``traceparent``, ``tracestate``) of the tool call
being made in this thread, set by the runtime's tracing (``tether._runtime.tracing``) while
the call's span is open: a ``tools/call`` sends it in ``_meta``, as MCP's trace-context
proposal has it, so the server's spans join the session's trace."""
