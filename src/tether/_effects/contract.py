"""The effect contract: tools with side effects outside the workspace (a service, an API).

An effect tool implements :meth:`EffectTool.execute` ``(arguments, operation_id)``. The
``operation_id`` is the ``toolStarted`` fact id: stable for that call across crashes and
resumes. The tool hands it to the service as its idempotency key, so the service commits
the effect at most once per operation id.

Optionally the tool implements :meth:`EffectTool.lookup` ``(operation_id)``: ask the
service whether that operation committed. It answers with a
:class:`~tether.core.values.LookupResult` (a core value type, re-exported here):

* ``committed`` with the call's result (the same text ``execute`` would have returned);
* ``not found``: the service never committed it;
* ``unknowable`` with a reason: the service cannot tell.

Recovery of a pending effect call (see :mod:`tether._effects.recovery`): committed → the
result is filled in from the service, nothing executed; not found → executed once more with
the same operation id; unknowable, a failing or hanging lookup (:func:`safe_lookup`) → the
call goes to review. An effect tool *without* a lookup is ``interrupted`` exactly as the
session format says.

Effect tools are never replay-safe (``replay`` is always ``never``). An effect tool with a
lookup declares the recovery kind ``lookupByOperationId``, one without it ``none``
(:class:`~tether._tools.base.RecoveryKind`). An exception from ``execute`` says nothing
arrived, not that nothing happened (:meth:`EffectTool.failure_result` is ``None``): the
executor asks the service, or leaves the call pending.
"""

from __future__ import annotations

import math
import threading
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, cast

from tether._tools.base import RecoveryKind, Tool, ToolContext
from tether.core.kinds import Replay
from tether.core.values import LookupResult, LookupStatus, ToolResult
from tether.errors import ConfigurationError

__all__ = [
    "DEFAULT_LOOKUP_TIMEOUT",
    "EffectFunction",
    "EffectTool",
    "FunctionEffectTool",
    "LookupFunction",
    "LookupResult",
    "LookupStatus",
    "LookupTool",
    "as_lookup",
    "effect_tool",
    "has_lookup",
    "safe_lookup",
]

DEFAULT_LOOKUP_TIMEOUT = 10.0
"""Seconds :func:`safe_lookup` waits for an answer by default."""


class LookupTool(Protocol):
    """What recovery needs of a ``lookupByOperationId`` tool: its name and its lookup."""

    name: str

    def lookup(self, operation_id: str) -> LookupResult: ...


class EffectTool(Tool):
    """Base class of a tool with an external side effect.

    Subclasses set ``name``, ``description`` and ``parameters`` like any :class:`Tool` and
    implement :meth:`execute`; they may implement :meth:`lookup`. ``replay`` must stay
    ``never`` (declaring ``safe`` is a :class:`~tether.errors.ConfigurationError`). The
    recovery kind follows from :attr:`has_lookup` and is set when the tool is built.
    """

    replay: Replay = Replay.NEVER
    effect: ClassVar[bool] = True

    def __init__(self) -> None:
        if self.replay is not Replay.NEVER:
            raise ConfigurationError(
                f"effect tool {getattr(self, 'name', type(self).__name__)!r}: effect tools are "
                "never replay-safe; leave replay as Replay.NEVER"
            )
        self.recovery = RecoveryKind.LOOKUP if self.has_lookup else RecoveryKind.NONE
        super().__init__()

    @abstractmethod
    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        """Perform the effect once for ``operation_id`` (pass it to the service as its
        idempotency key). Expected failures are error results."""

    def lookup(self, operation_id: str) -> LookupResult:
        """Ask the service whether ``operation_id`` committed (optional)."""
        raise NotImplementedError(f"effect tool {self.name!r} has no lookup")

    @property
    def has_lookup(self) -> bool:
        """Whether this tool can answer :meth:`lookup`."""
        return type(self).lookup is not EffectTool.lookup

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """The tool contract: ``execute(arguments, context.operation_id)``."""
        result: object = self.execute(arguments, context.operation_id)
        if isinstance(result, str):
            return ToolResult(result)
        if not isinstance(result, ToolResult):
            raise TypeError(
                f"effect tool {self.name!r} returned {type(result).__name__}, "
                "expected ToolResult or str"
            )
        return result

    def failure_result(self, failure: str) -> ToolResult | None:
        """``None``: an effect tool that raised (timeout, connection reset, …) says that
        nothing arrived, not that nothing happened; the outcome is unknown."""
        return None


EffectFunction = Callable[[Mapping[str, Any], str], "ToolResult | str"]
"""``(arguments, operation_id) -> ToolResult | str``."""

LookupFunction = Callable[[str], LookupResult]
"""``(operation_id) -> LookupResult``."""


class FunctionEffectTool(EffectTool):
    """An effect tool made of an execute function and, optionally, a lookup function."""

    def __init__(
        self,
        function: EffectFunction,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        lookup: LookupFunction | None = None,
        replay_key: str | None = None,
    ) -> None:
        self.function = function
        self.lookup_function = lookup
        self.name = name
        self.description = description
        self.parameters = parameters
        self.replay_key = replay_key or ""
        super().__init__()

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        result = self.function(arguments, operation_id)
        if isinstance(result, str):
            return ToolResult(result)
        if not isinstance(result, ToolResult):
            raise TypeError(
                f"effect tool {self.name!r} returned {type(result).__name__}, "
                "expected ToolResult or str"
            )
        return result

    def lookup(self, operation_id: str) -> LookupResult:
        if self.lookup_function is None:
            raise NotImplementedError(f"effect tool {self.name!r} has no lookup")
        return self.lookup_function(operation_id)

    @property
    def has_lookup(self) -> bool:
        return self.lookup_function is not None


def effect_tool(
    *,
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    lookup: LookupFunction | None = None,
    replay_key: str | None = None,
) -> Callable[[EffectFunction], FunctionEffectTool]:
    """Declare an effect tool from ``execute(arguments, operation_id)``::

    @effect_tool(name="send_invoice", description="Send an invoice.",
                 parameters={...}, lookup=lambda op: ...)
    def send_invoice(arguments, operation_id):
        return billing.send(arguments["customer"], idempotency_key=operation_id)
    """

    def wrap(function: EffectFunction) -> FunctionEffectTool:
        return FunctionEffectTool(
            function,
            name=name,
            description=description,
            parameters=parameters,
            lookup=lookup,
            replay_key=replay_key,
        )

    return wrap


def as_lookup(tool: Tool) -> LookupTool:
    """``tool`` as the lookup its declaration (``lookupByOperationId``) promises; checked
    when the tool was built (:class:`~tether._tools.base.Tool` requires ``lookup``)."""
    if tool.recovery is not RecoveryKind.LOOKUP:
        raise TypeError(f"tool {tool.name!r} has no lookup")
    return cast(LookupTool, tool)


def has_lookup(tool: Tool) -> bool:
    """Whether ``tool`` declares the recovery kind ``lookupByOperationId``."""
    return tool.recovery is RecoveryKind.LOOKUP


def safe_lookup(
    tool: LookupTool, operation_id: str, timeout: float = DEFAULT_LOOKUP_TIMEOUT
) -> LookupResult:
    """``tool.lookup(operation_id)`` bounded by ``timeout`` seconds; never raises for the
    lookup's own failures.

    The lookup runs in a daemon worker thread. An exception, a wrong return type or no
    answer within ``timeout`` becomes ``unknowable`` with the reason. (A hung lookup's
    thread cannot be stopped; it is left behind and its eventual answer is ignored.)
    Raises :class:`TypeError` for a tool without a lookup.
    """
    if getattr(tool, "recovery", None) is not RecoveryKind.LOOKUP:
        raise TypeError(f"tool {getattr(tool, 'name', tool)!r} has no lookup")
    if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"lookup timeout must be a positive number, got {timeout!r}")
    box: list[object] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            box.append(tool.lookup(operation_id))
        except BaseException as exc:  # reported as unknowable, never re-raised here
            failure.append(exc)

    worker = threading.Thread(target=work, name=f"tether-lookup-{tool.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return LookupResult.unknowable(
            f"the lookup of {tool.name} did not answer within {timeout:g} s"
        )
    if failure:
        exc = failure[0]
        message = " ".join(str(exc).split()) or "(no message)"
        return LookupResult.unknowable(
            f"the lookup of {tool.name} failed: {type(exc).__name__}: {message}"
        )
    answer = box[0] if box else None
    if not isinstance(answer, LookupResult):
        return LookupResult.unknowable(
            f"the lookup of {tool.name} returned {type(answer).__name__}, not a LookupResult"
        )
    return answer
