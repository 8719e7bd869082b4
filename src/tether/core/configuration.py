"""The agent's identity: configuration snapshot, digest and the planner's ``current``.

Pure: everything is computed from the values passed in. The snapshot (spec 10.2)
describes everything that shapes a model request; its digest gates retries after a
crash (spec 14.4 rule 5). The environment identity gates replays (rule 9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether.core.canonical import (
    configuration_digest,
    output_options_digest,
    system_prompt_digest,
)
from tether.core.current import CurrentConfiguration, ToolDeclaration
from tether.core.records import record

if TYPE_CHECKING:
    from tether.core.plans import BlockedReason
    from tether.core.state import ConfigurationSnapshot, Operation, SessionState

ENVIRONMENT_VARIABLE = "TETHER_ENVIRONMENT_IDENTITY"


def environment_identity(override: str | None, workspace_realpath: str) -> str:
    """Spec 15.1: the explicit override when non-empty (trimmed), else the workspace path."""
    if override is not None and override.strip():
        return override.strip()
    return workspace_realpath


@record
class AgentConfiguration:
    """The configuration snapshot of one agent and the planner input derived from it."""

    snapshot: Mapping[str, Any]
    digest: str
    current: CurrentConfiguration

    @classmethod
    def build(
        cls,
        *,
        model: str,
        adapter_identity: str,
        routing_identity: str,
        system_prompt: str,
        snapshot_tools: Sequence[Mapping[str, str]],
        declarations: Sequence[ToolDeclaration],
        output_options: Mapping[str, Any],
        environment: str,
    ) -> AgentConfiguration:
        """The snapshot and ``current`` of an agent, from plain values: ``snapshot_tools``
        is ``configurationSnapshot.tools`` (``[{"name", "definitionDigest"}, …]``, spec
        10.2) and ``declarations`` the planner's ``current.tools`` (14.1), both in the tool
        registry's order (``ToolRegistry.snapshot_tools()`` and ``.declarations()``)."""
        snapshot = {
            "model": model,
            "systemPromptDigest": system_prompt_digest(system_prompt),
            "tools": [dict(tool) for tool in snapshot_tools],
            "adapterIdentity": adapter_identity,
            "routingIdentity": routing_identity,
            "outputOptionsDigest": output_options_digest(output_options),
        }
        digest = configuration_digest(snapshot)
        current = CurrentConfiguration(
            configuration_digest=digest,
            environment_identity=environment,
            tools=tuple(declarations),
        )
        return cls(snapshot=snapshot, digest=digest, current=current)


_SNAPSHOT_LABELS = (
    ("model", "model"),
    ("system_prompt_digest", "system prompt (incl. AGENTS.md)"),
    ("adapter_identity", "model adapter"),
    ("routing_identity", "routing (endpoint/model route)"),
    ("output_options_digest", "output options"),
)


def snapshot_differences(recorded: ConfigurationSnapshot, current: Mapping[str, Any]) -> list[str]:
    """Human descriptions of what differs between a recorded and the current snapshot."""
    now = {
        "model": current["model"],
        "system_prompt_digest": current["systemPromptDigest"],
        "adapter_identity": current["adapterIdentity"],
        "routing_identity": current["routingIdentity"],
        "output_options_digest": current["outputOptionsDigest"],
    }
    changes: list[str] = []
    for attribute, label in _SNAPSHOT_LABELS:
        before = getattr(recorded, attribute)
        if before != now[attribute]:
            changes.append(f"{label}: {before} -> {now[attribute]}")
    before_tools = [(t.name, t.definition_digest) for t in recorded.tools]
    now_tools = [(t["name"], t["definitionDigest"]) for t in current["tools"]]
    if before_tools != now_tools:
        gone = sorted({n for n, _ in before_tools} - {n for n, _ in now_tools})
        new = sorted({n for n, _ in now_tools} - {n for n, _ in before_tools})
        changed = sorted(n for n, d in before_tools if any(n == m and d != e for m, e in now_tools))
        parts = []
        if gone:
            parts.append("removed " + ", ".join(gone))
        if new:
            parts.append("added " + ", ".join(new))
        if changed:
            parts.append("changed definition of " + ", ".join(changed))
        changes.append("tools: " + ("; ".join(parts) if parts else "order changed"))
    return changes


def explain_blocked(
    reason: BlockedReason,
    state: SessionState,
    configuration: AgentConfiguration,
) -> str:
    """One paragraph: which gate blocked recovery, what changed, and the ways out."""
    # Imported here: the plan types (with the reconciliation tables) are the planner's;
    # building an agent's snapshot, this module's other job, needs none of them.
    from tether.core.plans import BlockedReason
    from tether.core.state import RunOperation

    operation: Operation = state.operation
    step = getattr(operation, "step", None)
    session = state.header.id
    ways_out = (
        f"Either restore the configuration the session was recorded with and run "
        f"`tether resume {session}` again, or run `tether resume {session} --abort` to "
        "close the operation durably (nothing is re-executed)."
    )
    if reason is BlockedReason.ATTEMPTS_EXHAUSTED:
        return (
            "attempts exhausted: the model call of this step was already retried once after "
            "a crash and its outcome is unknown again; it is never tried a third time. "
            f"Run `tether resume {session} --abort` to close the operation."
        )
    if reason is BlockedReason.CONFIGURATION_CHANGED:
        what = "the configuration differs"
        if step is not None:
            diffs = snapshot_differences(step.configuration_snapshot, configuration.snapshot)
            if diffs:
                what = "; ".join(diffs)
        return (
            "configuration changed: the interrupted model call may only be retried with the "
            f"configuration it was started with ({what}). " + ways_out
        )
    pending = None
    if isinstance(operation, RunOperation):
        pending = next((t for t in operation.tool_calls if t.status.value == "pending"), None)
    if reason is BlockedReason.ENVIRONMENT_CHANGED:
        recorded = pending.environment_identity if pending is not None else "?"
        return (
            "environment changed: the interrupted tool call ran in environment "
            f"{recorded!r}, but this process runs in "
            f"{configuration.current.environment_identity!r}; it cannot be checked or "
            "replayed from here (set TETHER_ENVIRONMENT_IDENTITY or run from the original "
            "workspace). " + ways_out
        )
    detail = ""
    if pending is not None:
        declared = configuration.current.declaration(pending.tool_name)
        now = f"{declared.replay.value}/{declared.replay_key}" if declared else "not declared"
        detail = (
            f" (tool {pending.tool_name!r} was started as "
            f"{pending.replay.value}/{pending.replay_key}, now {now})"
        )
    return (
        "replay declaration changed: the interrupted tool call may only be replayed by the "
        f"same implementation{detail}. " + ways_out
    )
