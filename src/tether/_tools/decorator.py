"""``tether.tool``: a function as a tool, in its typed form or its old one.

It stands apart from :mod:`tether._tools.base` (the contract) because it chooses between
:class:`~tether._tools.base.FunctionTool` (the old ``function(arguments, context)`` form)
and :mod:`tether._tools.typed` (type hints and pydantic, loaded on first use), and the
typed form is built on the contract: the contract must not import it back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, overload

from tether._tools.base import FunctionTool, is_arguments_context_form
from tether.core.kinds import Replay

__all__ = ["tool"]


@overload
def tool(function: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    replay: Replay = Replay.NEVER,
    replay_key: str | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    replay: Replay = Replay.NEVER,
    replay_key: str | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a function: a typed function, or ``function(arguments, context)``.

    A function with type hints is a typed tool (:mod:`tether._tools.typed`): its parameter
    schema comes from the hints, its description and the parameters' from the docstring,
    its arguments are validated by the same model and a violation is told to the model; a
    parameter typed :class:`ToolContext` receives the context; a ``str`` return value is
    the text, any other JSON-serialisable value its JSON::

        @tool
        def shout(text: str, times: int = 1) -> str:
            \"\"\"Shout a text.

            Args:
                text: What to shout.
                times: How many times.
            \"\"\"
            return " ".join([text.upper()] * times)

    The old form ``function(arguments, context)`` (:func:`is_arguments_context_form`)
    keeps its meaning: ``parameters`` is its hand-written JSON schema (default: no
    arguments) and the arguments arrive as a mapping, checked against it by the registry::

        @tool(parameters={"type": "object", "properties": {"n": {"type": "integer"}},
                          "required": ["n"], "additionalProperties": False})
        def square(arguments, context):
            \"\"\"Square an integer.\"\"\"
            return str(arguments["n"] ** 2)

    ``name`` defaults to the function's name, ``description`` to its docstring (for a
    typed tool, without the argument sections). ``replay``/``replay_key`` are declared
    here, never inferred. A signature that is neither form (a parameter without a type
    hint, ``*args``, a positional-only parameter) is a :class:`ConfigurationError`.
    """

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        if parameters is None and not is_arguments_context_form(fn):
            from tether._tools.typed import typed_tool  # pydantic loads on first use

            return typed_tool(
                fn, name=name, description=description, replay=replay, replay_key=replay_key
            )
        return FunctionTool(
            fn,
            name=name if name is not None else getattr(fn, "__name__", ""),
            description=(description if description is not None else _doc(fn)),
            parameters=(
                parameters
                if parameters is not None
                else {"type": "object", "properties": {}, "additionalProperties": False}
            ),
            replay=replay,
            replay_key=replay_key,
        )

    if function is not None:
        return wrap(function)
    return wrap


def _doc(fn: Callable[..., Any]) -> str:
    """A function tool's description: its docstring, cleaned as ``help()`` shows it."""
    import inspect  # only for a function tool without a description; ~5 ms to load

    return inspect.getdoc(fn) or ""
