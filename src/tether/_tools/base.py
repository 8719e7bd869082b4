"""The tool contract: what a tool is, how it is declared, and how a call is validated.

A :class:`Tool` has a model-facing definition (``name``, ``description``, ``parameters``),
a trusted replay declaration (``replay``, ``replay_key``, spec 8.5) and a :meth:`Tool.run`
method. The executor (elsewhere) drives one call at a time, sequentially (spec 15.1)::

    outcome = registry.validate(name, call["function"]["arguments"])
    if isinstance(outcome, Rejection):      # pre-execution synthetic result (spec 7.4)
        ... append entry with outcome.reason / outcome.content
    else:                                   # ValidatedCall
        ... append toolStarted with outcome.arguments, outcome.declaration.replay, .replay_key
        result = outcome.tool.run(outcome.arguments, context)
        ... append the result entry: "error" if result.is_error else "success"

A tool also declares how a call left pending by a crash can be recovered
(:class:`RecoveryKind`, ``recovery``): by the spec alone (``none``: replayed if replay-safe,
else ``interrupted``), through the action journal (``journaledFileChange``: the tool plans
one file change, :class:`~tether._tools.builtin.FileChangeTool`), or by asking the service
(``lookupByOperationId``: the tool answers ``lookup(operation_id)``,
:class:`~tether._effects.contract.EffectTool`). The executor and recovery dispatch on that
declaration alone, never on a tool's class or name.

Trust rules for replay declarations (spec 8.5, 14.4 rule 9):

* Only the built-in tools of :mod:`tether._tools.builtin` may use ``builtin:`` replay keys;
  any other tool using one is a :class:`~tether.errors.ConfigurationError`.
* A tool named ``read`` that is not the built-in read tool is never replay-safe: its
  ``replay`` is forced to ``never`` whatever it declares.
* Any other user tool MAY declare ``replay = Replay.SAFE`` for its own name: it promises that
  running it again with the same arguments after a crash is harmless. Its key defaults to
  ``user:<name>:v1``; bump the version whenever the tool's effect changes, so that a session
  started with the old implementation is blocked instead of replayed (spec 14.4 rule 9).
"""

from __future__ import annotations

import re
import threading
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal

from tether._sandbox.bwrap import Sandbox
from tether._tools.workspace import ProtectedState
from tether.core.arguments import parse_tool_arguments
from tether.core.canonical import tool_definition_digest
from tether.core.contents import INVALID_ARGUMENTS, SYNTHETIC_CONTENT, UNKNOWN_TOOL
from tether.core.current import ToolDeclaration
from tether.core.kinds import Replay
from tether.core.records import field, record
from tether.core.stops import describe_call
from tether.core.toolresult import ToolResult
from tether.errors import ConfigurationError

if TYPE_CHECKING:
    # jsonschema (with attrs and referencing, ~25 ms to import) is loaded when a schema is
    # first checked or an argument first validated, not when tether is: the built-in tools'
    # schemas are tether's own and need no check at construction (see _check_parameters),
    # so building an agent and resuming a session never load it.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

__all__ = [
    "BUILTIN_MODULE",
    "BUILTIN_MODULES",
    "TOOL_NAME_PATTERN",
    "FunctionTool",
    "RecoveryKind",
    "Rejection",
    "RejectionReason",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "ValidatedCall",
    "is_arguments_context_form",
]

TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Tool names accepted by the providers' function-calling APIs."""

BUILTIN_MODULE: Final = "tether._tools.builtin"
"""Only classes defined in this module (or in :data:`BUILTIN_MODULES`) may use ``builtin:``
replay keys."""
BUILTIN_MODULES: Final = frozenset({BUILTIN_MODULE, "tether._completion.verify"})
"""Every module whose tool classes are tether's own: the file tools and ``verify``."""

_BUILTIN_PREFIX: Final = "builtin:"


# =========================================================================== values


class RecoveryKind(StrEnum):
    """How a call of a tool that a crash left pending (started, no result) is recovered."""

    NONE = "none"
    """Nothing can be observed: exactly spec 14.4 rule 9 (replayed when replay-safe, else
    ``interrupted``)."""
    JOURNALED = "journaledFileChange"
    """One planned file change, recorded in the action journal before it starts: recovery
    compares the journal with the file (:mod:`tether._effects.journal`). The tool provides
    ``plan_change``, ``result_text`` and ``result_metadata``
    (:class:`~tether._tools.builtin.FileChangeTool`)."""
    LOOKUP = "lookupByOperationId"
    """An effect a service commits once per operation id: recovery asks the service
    (``lookup(operation_id)``, :class:`~tether._effects.contract.EffectTool`)."""


@record(slots=True)
class ToolContext:
    """Everything a tool may depend on besides its arguments.

    * ``workspace`` — the real path of the workspace (already resolved); file tools never
      touch anything outside it, and ``bash`` runs with it as working directory.
    * ``operation_id`` — stable identity of this call across crashes: the ``toolStarted``
      fact id. A replay of the same call gets the same value.
    * ``cancel`` — set when the user aborts; long-running tools poll it and stop.
    * ``timeout`` — upper bound in seconds for the call, or ``None`` for the tool's default.
    * ``session_id`` — the session the call belongs to (``None`` outside a session).
    * ``protected`` — tether's own state, which the file tools never read or change: the
      agent passes its actual layout (its sessions directory wherever it is); ``None``
      means the default layout of ``workspace`` (``<workspace>/.tether``, sessions in
      it), for contexts made by hand. See :meth:`protected_state`.
    * ``fencing_token`` — the writer's lease epoch on a shared store (``None`` for the
      file store): it only grows, so a service that supports fencing can refuse a call
      carrying a lower token than one it has seen (``docs/scale-out.md``).
    * ``sandbox`` — the agent's confinement of the programs a tool runs
      (:class:`~tether._sandbox.bwrap.Sandbox`; docs/sandbox.md). An agent always passes
      its own; ``None`` (a context made by hand) runs them unconfined.
    """

    workspace: Path
    operation_id: str
    cancel: threading.Event = field(default_factory=threading.Event)
    timeout: float | None = None
    session_id: str | None = None
    protected: ProtectedState | None = None
    fencing_token: int | None = None
    sandbox: Sandbox | None = None

    def protected_state(self) -> ProtectedState:
        """``protected``, or the default layout of ``workspace`` when it is ``None``."""
        if self.protected is not None:
            return self.protected
        return ProtectedState.for_workspace(self.workspace)

    def __post_init__(self) -> None:
        if not self.workspace.is_absolute():
            raise ValueError(f"ToolContext.workspace must be absolute, got {self.workspace}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"ToolContext.timeout must be positive, got {self.timeout!r}")


# =========================================================================== tools


def _check_name(name: object) -> str:
    if not isinstance(name, str) or TOOL_NAME_PATTERN.fullmatch(name) is None:
        raise ConfigurationError(
            f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-'"
        )
    return name


def _check_parameters(name: str, parameters: object, *, builtin: bool) -> dict[str, Any]:
    if not isinstance(parameters, Mapping):
        raise ConfigurationError(f"tool {name!r}: parameters must be a JSON Schema object")
    if parameters.get("type") != "object":
        raise ConfigurationError(f'tool {name!r}: parameters must have "type": "object"')
    if not builtin:
        # The built-ins' schemas are constants of tether itself, checked against the
        # metaschema by tests/test_tools.py; checking them again at every construction would
        # cost the jsonschema import and ~3 ms a tool on every start and resume.
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise ConfigurationError(
                f"tool {name!r}: parameters are not a valid JSON Schema: {exc.message}"
            ) from None
    return _object_copy(parameters)


_BUILTIN_DEFINITIONS: dict[tuple[str, str, int], tuple[object, dict[str, Any], str]] = {}
"""A built-in tool's definition and digest by (name, description, its schema object):
the schemas are tether's own constants, so every construction of the same tool (a worker
builds the tools once per session in flight) shares one copy and one digest."""
_MAX_BUILTIN_DEFINITIONS: Final = 256


def _builtin_definition(name: str, description: str, source: object) -> tuple[dict[str, Any], str]:
    """The definition and digest of a built-in tool (see :data:`_BUILTIN_DEFINITIONS`);
    never mutated by its users (:meth:`Tool.definition` hands out copies)."""
    key = (name, description, id(source))
    known = _BUILTIN_DEFINITIONS.get(key)
    if known is not None and known[0] is source:
        return known[1], known[2]
    parameters = _check_parameters(name, source, builtin=True)
    definition = {"name": name, "description": description, "parameters": parameters}
    digest = tool_definition_digest(definition)  # raises CanonicalizationError
    if len(_BUILTIN_DEFINITIONS) >= _MAX_BUILTIN_DEFINITIONS:
        _BUILTIN_DEFINITIONS.clear()  # descriptions that vary without end: no memory grows
    _BUILTIN_DEFINITIONS[key] = (source, definition, digest)
    return definition, digest


def _builtin_validator(parameters: Mapping[str, Any]) -> Draft202012Validator:
    """The validator of a built-in tool's parameters, one per process for each shared
    definition (:data:`_BUILTIN_DEFINITIONS`; a validator is immutable, and validating is
    reentrant): a worker's every session built its own for its first call."""
    known = _BUILTIN_VALIDATORS.get(id(parameters))
    if known is not None and known[0] is parameters:
        return known[1]
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(parameters)
    if len(_BUILTIN_VALIDATORS) >= _MAX_BUILTIN_DEFINITIONS:
        _BUILTIN_VALIDATORS.clear()
    _BUILTIN_VALIDATORS[id(parameters)] = (parameters, validator)
    return validator


_BUILTIN_VALIDATORS: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON-like data (a schema, a definition): mappings become dicts, lists
    and tuples stay what they are, anything else is shared (strings, numbers, ``None``).
    Not :func:`copy.deepcopy`, whose module (with :mod:`weakref`) was ~0.6 ms of every
    first ``Agent(...)`` and which copies what a schema never holds."""
    if isinstance(value, Mapping):
        return _object_copy(value)
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


def _object_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _json_copy(item) for key, item in value.items()}


class Tool(ABC):
    """Base class of every tool.

    Subclasses set ``name``, ``description`` and ``parameters`` (as class attributes or in
    ``__init__`` before calling ``super().__init__()``), optionally ``replay`` and
    ``replay_key``, and implement :meth:`run`.

    Construction validates the definition: the name, a ``"type": "object"`` parameter
    schema that is valid JSON Schema (Draft 2020-12; a built-in's is checked by the tests
    instead) and stays within the keyword subset of
    spec 10.5 (:class:`~tether.errors.CanonicalizationError` names an unsupported keyword),
    and the replay declaration (see the module docstring). The definition is deep-copied
    and its digest computed once, so later mutation of the caller's dicts changes nothing.

    ``recovery`` declares how a call left pending by a crash is recovered
    (:class:`RecoveryKind`; default ``none``). A ``journaledFileChange`` tool must provide
    ``plan_change`` (subclass :class:`~tether._tools.builtin.FileChangeTool`), a
    ``lookupByOperationId`` tool ``lookup`` (subclass
    :class:`~tether._effects.contract.EffectTool`).

    ``run`` reports expected failures as ``ToolResult(is_error=True)``. Unexpected
    exceptions propagate; the executor asks :meth:`failure_result` what one means.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    replay: Replay = Replay.NEVER
    replay_key: str = ""
    recovery: RecoveryKind = RecoveryKind.NONE
    runs_commands: bool = False
    """``True`` for a tool whose calls run programs of the machine (``bash``): the agent's
    sandbox confines them (:attr:`ToolContext.sandbox`), and :meth:`confine` tells the
    model how."""
    parks: bool = False
    """``True`` for a tool whose :meth:`run` waits only where a worker's session parks
    (:mod:`tether._hub`: ``bash``, whose command's output and exit are waited for on the
    hub's ``epoll``): a worker runs its calls on the session's hub. Any other tool's calls
    run on a helper thread while the session is parked, so a tool that blocks (a network
    call, a long computation) holds no other session."""
    validates_in_run: bool = False
    """``True`` when :meth:`run` checks the arguments itself and answers a violation with an
    error result that says why (typed tools): the registry then lets the call through,
    since its rejection's text is fixed (spec 7.6) and could not tell the model."""

    _definition: dict[str, Any]
    _digest: str
    if TYPE_CHECKING:  # not in __annotations__: tether.Tool's hints resolve without jsonschema
        _validator: Draft202012Validator | None

    def __init__(self) -> None:
        name = _check_name(getattr(self, "name", None))
        description = getattr(self, "description", None)
        if not isinstance(description, str):
            raise ConfigurationError(f"tool {name!r}: description must be a string")
        builtin = type(self).__module__ in BUILTIN_MODULES
        source = getattr(self, "parameters", None)
        if builtin:
            definition, digest = _builtin_definition(name, description, source)
            parameters = definition["parameters"]
        else:
            parameters = _check_parameters(name, source, builtin=False)
            definition = {"name": name, "description": description, "parameters": parameters}
            digest = tool_definition_digest(definition)  # raises CanonicalizationError
        replay = self.replay
        if not isinstance(replay, Replay):
            raise ConfigurationError(f"tool {name!r}: replay must be a Replay, got {replay!r}")
        key = self.replay_key or f"user:{name}:v1"
        if not isinstance(key, str):
            raise ConfigurationError(f"tool {name!r}: replay_key must be a string")
        if key.startswith(_BUILTIN_PREFIX) and not builtin:
            raise ConfigurationError(
                f"tool {name!r}: replay key {key!r} is reserved for tether's built-in tools"
            )
        if name == "read" and not builtin:
            replay = Replay.NEVER  # spec: a user tool named read is never replay-safe
        recovery = self.recovery
        if not isinstance(recovery, RecoveryKind):
            raise ConfigurationError(
                f"tool {name!r}: recovery must be a RecoveryKind, got {recovery!r}"
            )
        # Recovery calls these on the strength of the declaration alone: check them now.
        for needed in _RECOVERY_NEEDS[recovery]:
            if not callable(getattr(self, needed, None)):
                raise ConfigurationError(
                    f"tool {name!r}: recovery {recovery.value!r} needs a {needed}() method"
                )
        self.name = name
        self.description = description
        self.parameters = MappingProxyType(parameters if builtin else _object_copy(parameters))
        self.replay = replay
        self.replay_key = key
        self._definition = definition
        self._digest = digest
        self._validator = None  # built on the first validation (validation_errors)

    def definition(self) -> dict[str, Any]:
        """The model-facing definition ``{"name", "description", "parameters"}`` (a copy)."""
        return _object_copy(self._definition)

    def definition_digest(self) -> str:
        """``definitionDigest`` of :meth:`definition` (spec 10.5)."""
        return self._digest

    def confine(self, note: str) -> None:
        """Tell the model what the sandbox lets this tool's commands do: ``note`` replaces
        any earlier one at the end of the description. The definition digest follows, so
        the sandbox is part of the configuration digest (a resume under another sandbox
        meets the configuration gate)."""
        base = self.__dict__.setdefault("_plain_description", self.description)
        self.description = base + note
        if type(self).__module__ in BUILTIN_MODULES:
            parameters = self._definition["parameters"]
            self._definition, self._digest = _builtin_definition(
                self.name, self.description, parameters
            )
            return
        self._definition = {**self._definition, "description": self.description}
        self._digest = tool_definition_digest(self._definition)

    def failure_result(self, failure: str) -> ToolResult | None:
        """What the model is told when :meth:`run` raised (``failure``: ``"Type: message"``).

        The default is an error result: the call failed. ``None`` means a raise says
        nothing about whether the call's effect happened (effect tools): the executor then
        asks the service (``lookupByOperationId``) or leaves the call pending for recovery.
        """
        return ToolResult.error(f"Error: tool {self.name!r} failed: {failure}")

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What a call does, as a person approving it reads it (default: the tool and its
        arguments on one line). Tools override it with what matters (bash: the command)."""
        return describe_call(self.name, arguments)

    def declaration(self) -> ToolDeclaration:
        """The trusted declaration the planner sees (an item of ``current.tools``)."""
        return ToolDeclaration(self.name, self._digest, self.replay, self.replay_key)

    def _prepare(self) -> None:
        """Build the argument validator now (importing jsonschema) instead of at the first
        call: for a process about to validate many first calls at once (a worker). Private:
        a user's tool may well have a ``prepare`` of its own."""
        if not self.validates_in_run:
            self._checker()

    def _checker(self) -> Draft202012Validator:
        validator = self._validator
        if validator is None:  # the first call: racing threads build equal validators
            parameters = self._definition["parameters"]
            if type(self).__module__ in BUILTIN_MODULES:
                validator = _builtin_validator(parameters)
            else:
                from jsonschema import Draft202012Validator

                validator = Draft202012Validator(parameters)
            self._validator = validator
        return validator

    def validation_errors(self, arguments: Mapping[str, Any]) -> list[str]:
        """Schema violations of ``arguments`` (empty when valid), most relevant first."""
        errors = list(self._checker().iter_errors(arguments))
        if not errors:
            return []
        from jsonschema.exceptions import best_match

        first = best_match(errors)
        rest = [e for e in errors if e is not first]
        return [_describe(first), *(_describe(e) for e in rest)]

    @abstractmethod
    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Execute the call with schema-valid ``arguments``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} replay={self.replay.value}>"


_RECOVERY_NEEDS: Final[Mapping[RecoveryKind, tuple[str, ...]]] = {
    RecoveryKind.NONE: (),
    RecoveryKind.JOURNALED: ("plan_change", "result_text", "result_metadata"),
    RecoveryKind.LOOKUP: ("lookup",),
}
"""The methods each recovery kind relies on."""


def _describe(error: ValidationError) -> str:
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"arguments{where}: {message}"


ToolFunction = Callable[[Mapping[str, Any], ToolContext], "ToolResult | str"]
"""A plain function usable as a tool: ``(arguments, context) -> ToolResult | str``."""


class FunctionTool(Tool):
    """A tool made of a function and a schema; a ``str`` return value is a success result."""

    def __init__(
        self,
        function: ToolFunction,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        replay: Replay = Replay.NEVER,
        replay_key: str | None = None,
    ) -> None:
        self.function = function
        self.name = name
        self.description = description
        self.parameters = parameters
        self.replay = replay
        self.replay_key = replay_key or ""
        super().__init__()

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        result = self.function(arguments, context)
        if isinstance(result, str):
            return ToolResult(result)
        if not isinstance(result, ToolResult):
            raise TypeError(
                f"tool {self.name!r} returned {type(result).__name__}, expected ToolResult or str"
            )
        return result


_MAPPING_ORIGINS: Final = frozenset({Mapping, MutableMapping, dict})
"""What the ``arguments`` parameter of the ``fn(arguments, context)`` form may be typed as."""


def is_arguments_context_form(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is the ``fn(arguments, context)`` form rather than a typed tool.

    It is when it has exactly two parameters (neither ``*args`` nor ``**kwargs``) and
    either neither has a type hint, or they are named ``arguments`` and ``context`` and
    typed, if at all, as a mapping (``Mapping``, ``dict``, ``Any``) and
    :class:`ToolContext`. Anything else is a typed tool (:mod:`tether._tools.typed`).
    """
    import inspect  # a function tool's signature; the built-in tools never need it

    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if len(parameters) != 2 or any(p.kind in variadic for p in parameters):
        return False
    empty = inspect.Parameter.empty
    if all(p.annotation is empty for p in parameters):
        return True
    if [p.name for p in parameters] != ["arguments", "context"]:
        return False
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # unresolvable string annotations: the names decide
        return True
    first, second = hints.get("arguments", Any), hints.get("context", ToolContext)
    mapping = first is Any or (typing.get_origin(first) or first) in _MAPPING_ORIGINS
    return mapping and second is ToolContext


# =========================================================================== registry


RejectionReason = Literal["unknownTool", "invalidArguments"]


@record(slots=True)
class ValidatedCall:
    """A call that may run: the tool, the effective arguments and the trusted declaration.

    ``arguments`` is what ``toolStarted.arguments`` records; ``declaration.replay`` and
    ``declaration.replay_key`` are ``toolStarted.replay`` / ``replayKey``.
    """

    tool: Tool
    arguments: dict[str, Any]
    declaration: ToolDeclaration


@record(slots=True)
class Rejection:
    """A call that must not run; answer it with a pre-execution synthetic result (7.4).

    ``content`` is the fixed text of spec 7.6 for ``reason``; ``detail`` says what exactly
    was wrong, for logs and the user (never for the session log's tool message).
    """

    reason: RejectionReason
    content: str
    detail: str


class ToolRegistry:
    """The tools of one runtime, in model-facing order, with unique names."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        by_name: dict[str, Tool] = {}
        for item in tools:
            if not isinstance(item, Tool):
                raise ConfigurationError(f"not a Tool: {item!r}")
            if not hasattr(item, "_digest"):
                raise ConfigurationError(
                    f"tool {type(item).__name__} was not initialised (call super().__init__())"
                )
            if item.name in by_name:
                raise ConfigurationError(f"duplicate tool name {item.name!r}")
            by_name[item.name] = item
        self._tools: dict[str, Tool] = by_name
        self._definitions: list[dict[str, Any]] | None = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        """Model-facing definitions, in order (what the adapter sends to the provider).

        The tools' own (immutable once built: :meth:`Tool.confine` replaces a definition,
        never changes it), shared by every request of every registry: a model request is
        built per step, and a worker builds a registry per session; deep-copying every
        schema each time was the largest part of building one. Treat them as read-only."""
        if self._definitions is None:
            self._definitions = [t._definition for t in self._tools.values()]
        return list(self._definitions)

    def snapshot_tools(self) -> list[dict[str, str]]:
        """``configurationSnapshot.tools``: ``[{"name", "definitionDigest"}, …]`` (10.2)."""
        return [{"name": t.name, "definitionDigest": t.definition_digest()} for t in self]

    def declarations(self) -> list[ToolDeclaration]:
        """The planner's ``current.tools`` (spec 14.1), in order."""
        return [t.declaration() for t in self._tools.values()]

    def validate(self, name: str, arguments_text: object) -> ValidatedCall | Rejection:
        """Decide whether a model's call may run (spec 14.4 rule 9, then the schema).

        Unknown name → ``unknownTool``. Arguments that are not strict JSON text of an
        object (:func:`~tether.core.arguments.parse_tool_arguments`), or that violate
        the tool's parameter schema (JSON Schema Draft 2020-12) → ``invalidArguments``;
        a tool that ``validates_in_run`` checks the schema itself, in ``run``.
        """
        found = self._tools.get(name) if isinstance(name, str) else None
        if found is None:
            return Rejection(
                UNKNOWN_TOOL, SYNTHETIC_CONTENT[UNKNOWN_TOOL], f"no tool named {name!r}"
            )
        arguments = parse_tool_arguments(arguments_text)
        if arguments is None:
            return Rejection(
                INVALID_ARGUMENTS,
                SYNTHETIC_CONTENT[INVALID_ARGUMENTS],
                f"tool {name!r}: arguments are not a JSON object",
            )
        problems = [] if found.validates_in_run else found.validation_errors(arguments)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return Rejection(
                INVALID_ARGUMENTS,
                SYNTHETIC_CONTENT[INVALID_ARGUMENTS],
                f"tool {name!r}: {problems[0]}{more}",
            )
        return ValidatedCall(found, arguments, found.declaration())
