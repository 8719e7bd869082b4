"""Typed tools: ``@tool`` on an ordinary function with type hints (issue 32).

:func:`~tether._tools.base.tool` hands a function here when it is not the
``fn(arguments, context)`` form (:func:`~tether._tools.base.is_arguments_context_form`).
From the signature and the docstring this module builds a :class:`TypedTool`:

* the parameter schema comes from the type hints, through a pydantic model with one field
  per parameter (``extra="forbid"``), and is then fitted to the JSON Schema subset tool
  definitions may use (spec 10.5, :func:`_fit`): ``$ref`` inlined, ``anyOf`` as a ``type``
  list or ``oneOf``, ``title`` dropped (it is noise, and pydantic versions word it
  differently, which would change the definition digest), a default said in the
  description. A type the subset cannot describe (a recursive model, a fixed-length tuple)
  is refused when the tool is made;
* the description is the docstring's summary and body; each parameter's description is
  its entry in the docstring's argument section (Google, NumPy or Sphinx style, read by
  ``docstring_parser``), unless its annotation carries one
  (``Annotated[str, Field(description=…)]``);
* a parameter annotated :class:`~tether._tools.base.ToolContext` receives the context and
  is not part of the schema.

Validation. A typed tool does its own validation, in :meth:`TypedTool.run`, with the same
pydantic model in strict JSON mode (an ``integer`` is not the string ``"5"``, as the
schema says): a violation is an error result whose text says what was wrong. It does not
let the registry reject the call (``validates_in_run``), because a rejected call is
answered by the ``invalidArguments`` synthetic result, whose text is fixed by spec 7.6
and carries no reason, so the model could not correct its call. The price is a
``toolStarted`` record for a call that then fails at once without any effect.

Result. A ``str`` is the text, a :class:`~tether.core.values.ToolResult` passes through,
anything else JSON-serialisable (pydantic models and dataclasses included) is the JSON
text. An ``async def`` function is run to completion in the calling thread (in a thread
of its own if that thread already runs an event loop).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import threading
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

import docstring_parser
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from tether._tools.base import FunctionTool, ToolContext, ToolResult
from tether.core.canonical import tool_definition_digest
from tether.core.kinds import Replay
from tether.errors import CanonicalizationError, ConfigurationError

__all__ = ["TypedTool", "typed_tool"]

_MAX_REASONS: Final = 5
"""Validation errors listed in the error result; the rest are counted."""

_DROPPED: Final = frozenset(
    {"title", "format", "examples", "uniqueItems", "deprecated", "readOnly", "writeOnly"}
)
"""Keywords that only annotate or narrow a schema, dropped from the model-facing one:
pydantic still validates them (a ``set`` still has unique items), and the subset of
spec 10.5 has no room for them."""

_FORMS: Final = (
    "(the old form is exactly fn(arguments, context) with a hand-written schema "
    "in @tool(parameters=...))"
)


# =========================================================================== signature


class _Parameter(typing.NamedTuple):
    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty when required
    description: str | None


def _hints(function: Callable[..., Any], label: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception as exc:  # NameError, TypeError: unresolvable string annotations
        raise ConfigurationError(
            f"@tool {label}: cannot resolve its type hints ({type(exc).__name__}: {exc})"
        ) from None


def _carries_description(hint: Any) -> bool:
    if typing.get_origin(hint) is not typing.Annotated:
        return False
    return any(
        isinstance(meta, FieldInfo) and meta.description is not None
        for meta in typing.get_args(hint)[1:]
    )


def _signature(
    function: Callable[..., Any], label: str, docs: Mapping[str, str]
) -> tuple[list[_Parameter], str | None]:
    """The schema's parameters and the name of the context parameter (if any)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"@tool {label}: no signature ({exc})") from None
    hints = _hints(function, label)
    parameters: list[_Parameter] = []
    context: str | None = None
    for parameter in signature.parameters.values():
        where = f"@tool {label}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"{where}: *args and **kwargs cannot be tool arguments; name each one"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"{where}: is positional-only; tool arguments are passed by name"
            )
        if parameter.name not in hints:
            raise ConfigurationError(f"{where}: has no type hint {_FORMS}")
        hint = hints[parameter.name]
        if hint is ToolContext:
            if context is not None:
                raise ConfigurationError(f"{where}: a second ToolContext parameter")
            context = parameter.name
            continue
        description = None if _carries_description(hint) else docs.get(parameter.name)
        parameters.append(_Parameter(parameter.name, hint, parameter.default, description))
    return parameters, context


def _docstring(function: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (summary and body, without the sections) and each argument's."""
    text = inspect.getdoc(function) or ""
    if not text:
        return "", {}
    parsed = docstring_parser.parse(text)
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    arguments = {p.arg_name: p.description for p in parsed.params if p.description}
    return "\n\n".join(parts), arguments


# =========================================================================== schema


def _model(label: str, parameters: list[_Parameter]) -> type[BaseModel]:
    """One field per parameter. Fields get neutral names and the parameter's name as
    alias, so that any parameter name works (``json``, ``model_config``, ``_x``)."""
    fields: dict[str, Any] = {}
    for index, parameter in enumerate(parameters):
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        # A description passed as None would still override one in an Annotated hint.
        if parameter.description is None:
            info: FieldInfo = Field(default, alias=parameter.name)
        else:
            info = Field(default, alias=parameter.name, description=parameter.description)
        fields[f"p{index}"] = (parameter.hint, info)
    try:
        return create_model(f"{label}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    except Exception as exc:  # pydantic's PydanticSchemaGenerationError, TypeError
        raise ConfigurationError(
            f"@tool {label}: its type hints cannot be validated: {type(exc).__name__}: {exc}"
        ) from None


def _resolve(
    node: Mapping[str, Any], defs: Mapping[str, Any], seen: frozenset[str]
) -> tuple[dict[str, Any], frozenset[str]]:
    """``node`` with its ``$ref`` (or a one-item ``allOf``) replaced by the target, merged
    with the node's own keywords (a description beside a ``$ref`` wins)."""
    node = dict(node)
    while "$ref" in node or ("allOf" in node and len(node["allOf"]) == 1):
        if "$ref" in node:
            name = str(node.pop("$ref")).rsplit("/", 1)[-1]
            if name in seen:
                raise _Unfit(f"the type {name} refers to itself")
            seen = seen | {name}
            target = dict(defs[name])
        else:
            target = dict(node.pop("allOf")[0])
        target.update(node)
        node = target
    return node, seen


class _Unfit(Exception):
    """A schema the subset of spec 10.5 cannot express."""


def _fit(schema: Any, defs: Mapping[str, Any], seen: frozenset[str] = frozenset()) -> Any:
    """``schema`` within the keyword subset of spec 10.5 (see the module docstring)."""
    if not isinstance(schema, Mapping):
        return schema  # true / false
    node, seen = _resolve(schema, defs, seen)
    if "anyOf" in node:
        branches = [_fit(b, defs, seen) for b in node.pop("anyOf")]
        if all(isinstance(b, Mapping) and set(b) == {"type"} for b in branches):
            types: list[Any] = []
            for branch in branches:
                more = branch["type"] if isinstance(branch["type"], list) else [branch["type"]]
                types.extend(t for t in more if t not in types)
            node["type"] = types[0] if len(types) == 1 else types
        else:
            node["oneOf"] = branches
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key == "default":
            continue
        if key == "properties":
            out[key] = {name: _fit(sub, defs, seen) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _fit(value, defs, seen)
        elif key == "oneOf":
            out[key] = [_fit(sub, defs, seen) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    if "default" in node:
        said = f"Default: {json.dumps(node['default'], ensure_ascii=False)}."
        out["description"] = f"{out['description']} {said}" if "description" in out else said
    return out


def _schema(label: str, model: type[BaseModel]) -> dict[str, Any]:
    try:
        raw = model.model_json_schema(by_alias=True)
    except Exception as exc:  # PydanticInvalidForJsonSchema and friends
        raise ConfigurationError(
            f"@tool {label}: its type hints have no JSON Schema: {type(exc).__name__}: {exc}"
        ) from None
    defs = raw.pop("$defs", {})
    properties: dict[str, Any] = {}
    for name, sub in raw.get("properties", {}).items():
        where = f"@tool {label}: parameter {name!r}"
        try:
            fitted = _fit(sub, defs)
            check = {"type": "object", "properties": {name: fitted}}
            tool_definition_digest({"name": "x", "description": "", "parameters": check})
        except (_Unfit, CanonicalizationError) as exc:
            raise ConfigurationError(
                f"{where}: its type cannot be described to the model ({exc})"
            ) from None
        properties[name] = fitted
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if raw.get("required"):
        schema["required"] = list(raw["required"])
    schema["additionalProperties"] = False
    return schema


# =========================================================================== the tool


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
    got = ""
    if error.get("type") != "missing" and "input" in error:
        try:
            got = f" (got {json.dumps(error['input'], ensure_ascii=False)[:80]})"
        except (TypeError, ValueError):
            got = ""
    return f"{where}: {error.get('msg', 'invalid')}{got}"


def _complete(result: Any) -> Any:
    """An awaitable's value, run in this thread (or a fresh one if a loop runs here)."""
    if not inspect.isawaitable(result):
        return result

    async def wait() -> Any:
        return await result

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    box: list[Any] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            box.append(asyncio.run(wait()))
        except BaseException as exc:  # handed back to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=work, name="tether-async-tool")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return box[0]


def _as_result(name: str, value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(value)
    try:
        text = orjson.dumps(
            value, default=to_jsonable_python, option=orjson.OPT_NON_STR_KEYS
        ).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        kind = type(value).__name__
        raise TypeError(f"tool {name!r} returned {kind}, not JSON-serialisable: {exc}") from None
    return ToolResult(text)


class TypedTool(FunctionTool):
    """A tool made of a function with type hints (see the module docstring).

    ``wrapped`` is the function; ``arguments_model`` the pydantic model that validates a
    call's arguments and that the parameter schema was made from."""

    wrapped: Callable[..., Any]
    arguments_model: type[BaseModel]

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        replay: Replay = Replay.NEVER,
        replay_key: str | None = None,
    ) -> None:
        label = getattr(function, "__qualname__", None) or repr(function)
        summary, docs = _docstring(function)
        parameters, context = _signature(function, label, docs)
        self.wrapped = function
        self.arguments_model = _model(label, parameters)
        self._names = [(f"p{i}", p.name) for i, p in enumerate(parameters)]
        self._context = context
        super().__init__(
            self._call,
            name=name if name is not None else getattr(function, "__name__", ""),
            description=description if description is not None else summary,
            parameters=_schema(label, self.arguments_model),
            replay=replay,
            replay_key=replay_key,
        )

    validates_in_run = True  # so that the model reads why its call was refused

    def validation_errors(self, arguments: Mapping[str, Any]) -> list[str]:
        """What is wrong with ``arguments`` by the pydantic model (empty when valid); the
        registry does not ask (``validates_in_run``), :meth:`run` says it to the model."""
        try:
            self._validate(arguments)
        except ValidationError as exc:
            return [_describe(error) for error in exc.errors()]
        return []

    def _validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        # Strict JSON mode, from the arguments' JSON text: what the schema says, no
        # coercion of "5" into 5, yet enums, models and dataclasses come from JSON values.
        return self.arguments_model.model_validate_json(
            json.dumps(arguments, ensure_ascii=False), strict=True
        )

    def _call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        try:
            validated = self._validate(arguments)
        except ValidationError as exc:
            errors = exc.errors()
            reasons = [_describe(error) for error in errors[:_MAX_REASONS]]
            if len(errors) > _MAX_REASONS:
                reasons.append(f"(and {len(errors) - _MAX_REASONS} more)")
            lines = "\n".join(f"- {reason}" for reason in reasons)
            return ToolResult.error(
                f"Error: invalid arguments for tool {self.name!r}; it was not run:\n{lines}"
            )
        keywords = {name: getattr(validated, field) for field, name in self._names}
        if self._context is not None:
            keywords[self._context] = context
        return _as_result(self.name, _complete(self.wrapped(**keywords)))


def typed_tool(
    function: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    replay: Replay,
    replay_key: str | None,
) -> TypedTool:
    """``@tool`` on a typed function (called by :func:`~tether._tools.base.tool`)."""
    return TypedTool(
        function, name=name, description=description, replay=replay, replay_key=replay_key
    )
