"""How a tool call runs, by the recovery kind its tool declares: one table, :data:`RUNNERS`.

The executor looks a call's :class:`Runner` up by
:attr:`~tether._tools.base.Tool.recovery` and nothing else (never the tool's class or
name). A runner has two steps around the call's ``toolStarted``:

* ``prepare`` runs *before* ``toolStarted`` is committed: what recovery needs to be durable
  first (a journaled file change records its planned change; the other kinds need nothing);
* ``run`` runs *after* it and returns the call's result, or ``None`` when the outcome is
  unknown (the call stays pending; the planner or reconciliation decides).

=======================  ==================================  ===================================
kind                     prepare                             run
=======================  ==================================  ===================================
``none``                 nothing                             ``tool.run``; a raise is the tool's
                                                             ``failure_result`` (an error result;
                                                             ``None`` for an effect tool)
``journaledFileChange``  plan + journal intent               the prepared change through the
                         (``journal.intent_prepared``)       journal; a re-execution only from
                                                             the recorded intent
``lookupByOperationId``  nothing                             ``tool.run``; when a raise leaves
                                                             the outcome unknown, ask the service
=======================  ==================================  ===================================

A new kind of tool recovery is a new :class:`~tether._tools.base.RecoveryKind`, a row here,
and its observation in :func:`tether._effects.recovery.observe_pending`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from tether._effects.contract import LookupStatus, as_lookup, safe_lookup
from tether._effects.journal import (
    PreparedChange,
    journaled_resume,
    prepare_journaled,
    run_prepared,
)
from tether._runtime.evidence import SessionEvidence
from tether._stores.protocol import SessionStoreProtocol
from tether._tools.base import RecoveryKind, Tool, ToolContext, ToolResult
from tether._tools.workspace import ProtectedState
from tether.core.records import record

__all__ = ["RUNNERS", "CallSite", "Runner"]


@record(slots=True)
class CallSite:
    """What the runners need of the agent: the workspace, tether's own state the file tools
    never touch, and the session's evidence (the workspace database)."""

    workspace: Path
    protected: ProtectedState
    evidence: SessionEvidence


Prepare = Callable[
    [CallSite, SessionStoreProtocol, Tool, str, Mapping[str, Any]], PreparedChange | None
]
"""``(site, store, tool, started_id, arguments)``, before ``toolStarted``."""
Run = Callable[
    [CallSite, SessionStoreProtocol, Tool, Mapping[str, Any], ToolContext, PreparedChange | None],
    ToolResult | None,
]
"""``(site, store, tool, arguments, context, prepared)``, after ``toolStarted``."""


@record(slots=True)
class Runner:
    """How calls of one recovery kind run (see the module table)."""

    prepare: Prepare
    run: Run


def _prepare_nothing(
    site: CallSite,
    store: SessionStoreProtocol,
    tool: Tool,
    started_id: str,
    arguments: Mapping[str, Any],
) -> None:
    return None


def _prepare_journaled(
    site: CallSite,
    store: SessionStoreProtocol,
    tool: Tool,
    started_id: str,
    arguments: Mapping[str, Any],
) -> PreparedChange:
    """The journal's intent is durable before toolStarted: a started call without a journal
    row can then only mean lost evidence, never "not applied"."""
    db = site.evidence.db()
    site.evidence.check(store)  # bound before its first evidence
    return prepare_journaled(
        tool,
        site.workspace,
        db.journal,
        store.session_id,
        started_id,
        arguments,
        protected=site.protected,
    )


def _run_journaled(
    site: CallSite,
    store: SessionStoreProtocol,
    tool: Tool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    prepared: PreparedChange | None,
) -> ToolResult | None:
    journal = site.evidence.db().journal
    if prepared is not None:
        return run_prepared(site.workspace, journal, prepared, protected=context.protected)
    # A re-execution that reconciliation decided: only from the recorded intent (None
    # without one: left pending, the next reconciliation reviews it).
    return journaled_resume(
        tool,
        site.workspace,
        journal,
        store.session_id,
        context.operation_id,
        arguments,
        protected=context.protected,
    )


def _run_tool(
    site: CallSite,
    store: SessionStoreProtocol,
    tool: Tool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    prepared: PreparedChange | None,
) -> ToolResult | None:
    """Run the tool; a raise is its :meth:`~tether._tools.base.Tool.failure_result`."""
    try:
        return tool.run(arguments, context)
    except Exception as exc:  # a tool's own failure must not lose the session
        return tool.failure_result(f"{type(exc).__name__}: {exc}")


def _run_looked_up(
    site: CallSite,
    store: SessionStoreProtocol,
    tool: Tool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    prepared: PreparedChange | None,
) -> ToolResult | None:
    """Run the tool; when a raise leaves the outcome unknown, ask the service."""
    try:
        return tool.run(arguments, context)
    except Exception as exc:  # a tool's own failure must not lose the session
        failure = f"{type(exc).__name__}: {exc}"
        known = tool.failure_result(failure)
        if known is not None:
            return known
    # The raise says nothing arrived, not that nothing happened. Ask the service.
    lookup = safe_lookup(as_lookup(tool), context.operation_id)
    if lookup.status is LookupStatus.COMMITTED and lookup.result is not None:
        return lookup.result
    if lookup.status is LookupStatus.NOT_FOUND:
        return ToolResult.error(
            f"Error: {tool.name} failed ({failure}); the service has no record of "
            "the operation, so it did not take effect."
        )
    return None


RUNNERS: Final[Mapping[RecoveryKind, Runner]] = {
    RecoveryKind.NONE: Runner(_prepare_nothing, _run_tool),
    RecoveryKind.JOURNALED: Runner(_prepare_journaled, _run_journaled),
    RecoveryKind.LOOKUP: Runner(_prepare_nothing, _run_looked_up),
}
"""A tool's declared recovery kind → how its calls run."""
