"""Typed tools (issue 32, item 1): ``@tool`` on an ordinary function with type hints.

The schema comes from the hints and the docstring, within the keyword subset of spec 10.5;
a call's arguments are validated by the same pydantic model and a violation reaches the
model as an error result with its reason (a registry rejection's text is fixed by spec
7.6); bad signatures are refused at decoration; the ``fn(arguments, context)`` form keeps
its meaning. The end-to-end test drives the real agent with a scripted model.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

import tether
from test_cli_run import tool_results
from tether import ToolResult, tool
from tether._tools.base import FunctionTool, ToolRegistry, ValidatedCall, is_arguments_context_form
from tether._tools.typed import TypedTool
from tether.core.canonical import tool_definition_digest
from tether.errors import ConfigurationError
from tether.lowlevel import ToolContext
from tether.testing import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = ToolContext(Path("/"), "op-1")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    """A point on the grid."""

    x: int
    y: int = 0


@dataclasses.dataclass
class Box:
    width: float
    tags: list[str] = dataclasses.field(default_factory=list)


def properties(made: FunctionTool) -> dict[str, Any]:
    return dict(made.definition()["parameters"]["properties"])


# ---------------------------------------------------------------- the issue's scenario


def test_the_issues_shout_tool_has_a_schema_and_runs() -> None:
    @tool
    def shout(text: str) -> str:
        """Shout a text.

        Args:
            text: What to shout.
        """
        return text.upper()

    assert isinstance(shout, TypedTool) and isinstance(shout, FunctionTool)
    assert shout.definition() == {
        "name": "shout",
        "description": "Shout a text.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "What to shout."}},
            "required": ["text"],
            "additionalProperties": False,
        },
    }
    registry = ToolRegistry([shout])
    validated = registry.validate("shout", '{"text": "hi"}')
    assert isinstance(validated, ValidatedCall)
    assert validated.tool.run(validated.arguments, CONTEXT) == ToolResult("HI")


# ---------------------------------------------------------------- schema from hints


def test_each_kind_of_hint_has_its_schema() -> None:
    @tool
    def everything(
        text: str,
        count: int,
        ratio: float,
        flag: bool,
        mode: Literal["fast", "slow"],
        only: Literal["this"],
        color: Color,
        numbers: list[int],
        weights: dict[str, float],
        anything: dict[str, Any],
        maybe: Optional[int],  # noqa: UP045 - the spelling the issue names
        either: int | str,
        point: Point,
        box: Box,
        unique: set[int],
    ) -> str:
        return "ok"

    got = properties(everything)
    assert got["text"] == {"type": "string"}
    assert got["count"] == {"type": "integer"}
    assert got["ratio"] == {"type": "number"}
    assert got["flag"] == {"type": "boolean"}
    assert got["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert got["only"] == {"type": "string", "const": "this"}
    assert got["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert got["numbers"] == {"type": "array", "items": {"type": "integer"}}
    assert got["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert got["anything"] == {"type": "object", "additionalProperties": True}
    assert got["maybe"] == {"type": ["integer", "null"]}
    assert got["either"] == {"type": ["integer", "string"]}
    assert got["point"] == {
        "type": "object",
        "description": "A point on the grid.",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer", "description": "Default: 0."},
        },
        "required": ["x"],
    }
    assert got["box"]["properties"] == {
        "width": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    }
    assert got["box"]["required"] == ["width"]
    assert got["unique"] == {"type": "array", "items": {"type": "integer"}}  # pydantic checks
    parameters = everything.definition()["parameters"]
    assert parameters["required"] == list(got)  # none has a default: all required, in order
    assert parameters["additionalProperties"] is False
    text = json.dumps(parameters)
    assert '"title"' not in text and "$ref" not in text and "anyOf" not in text


def test_an_optional_model_is_one_of_the_model_or_null() -> None:
    @tool
    def place(point: Point | None = None) -> str:
        return "ok"

    [model, null] = properties(place)["point"]["oneOf"]
    assert model["properties"]["x"] == {"type": "integer"} and null == {"type": "null"}
    assert properties(place)["point"]["description"] == "Default: null."


def test_defaults_make_arguments_optional_and_are_said_in_the_description() -> None:
    @tool
    def greet(name: str, times: int = 1, loud: bool = False, tag: str | None = None) -> str:
        """Greet someone.

        Args:
            name: Who.
            times: How often.
        """
        return "hi"

    parameters = greet.definition()["parameters"]
    assert parameters["required"] == ["name"]
    assert parameters["properties"]["times"] == {
        "type": "integer",
        "description": "How often. Default: 1.",
    }
    assert parameters["properties"]["loud"]["description"] == "Default: false."
    assert parameters["properties"]["tag"] == {
        "type": ["string", "null"],
        "description": "Default: null.",
    }


def test_a_context_parameter_gets_the_context_and_is_not_in_the_schema() -> None:
    @tool
    def where(path: str, context: ToolContext) -> str:
        return f"{context.operation_id}:{path}"

    @tool
    def only_context(ctx: ToolContext) -> str:
        return ctx.operation_id

    assert list(properties(where)) == ["path"]
    assert where.run({"path": "a"}, CONTEXT) == ToolResult("op-1:a")
    assert properties(only_context) == {} and only_context.run({}, CONTEXT).content == "op-1"


def test_the_schema_is_deterministic_and_within_the_digest_subset() -> None:
    def make() -> FunctionTool:
        @tool
        def pick(color: Color, point: Point, mode: Literal["a", "b"] = "a") -> str:
            return "ok"

        return pick

    first, second = make(), make()
    assert first.definition() == second.definition()
    assert first.definition_digest() == second.definition_digest()
    assert first.definition_digest() == tool_definition_digest(first.definition())


# ---------------------------------------------------------------- docstrings


GOOGLE = """Search the notes.

    Looks in every note.

    Args:
        query: The words to find.
        limit: At most this many.

    Returns:
        The matches.
    """

NUMPY = """Search the notes.

    Looks in every note.

    Parameters
    ----------
    query : str
        The words to find.
    limit : int
        At most this many.

    Returns
    -------
    str
        The matches.
    """

SPHINX = """Search the notes.

    Looks in every note.

    :param query: The words to find.
    :param limit: At most this many.
    :returns: The matches.
    """


@pytest.mark.parametrize("docstring", [GOOGLE, NUMPY, SPHINX], ids=["google", "numpy", "sphinx"])
def test_descriptions_come_from_each_docstring_style(docstring: str) -> None:
    def search(query: str, limit: int = 5) -> str:
        return query

    search.__doc__ = docstring
    made = tool(search)
    assert made.description == "Search the notes.\n\nLooks in every note."
    assert properties(made)["query"] == {"type": "string", "description": "The words to find."}
    assert properties(made)["limit"]["description"] == "At most this many. Default: 5."


def test_an_annotated_description_wins_over_the_docstring_and_the_decorator_over_both() -> None:
    @tool(name="lookup", description="Look a word up.")
    def find(word: Annotated[str, Field(description="The word, lower-case.")]) -> str:
        """Find.

        Args:
            word: ignored, the annotation says it.
        """
        return word

    assert (find.name, find.description) == ("lookup", "Look a word up.")
    assert properties(find)["word"]["description"] == "The word, lower-case."


# ---------------------------------------------------------------- validation and results


def test_a_wrong_typed_argument_is_an_error_result_with_its_reason() -> None:
    @tool
    def repeat(text: str, times: int, point: Point | None = None) -> str:
        return text * times

    registry = ToolRegistry([repeat])
    # The registry lets the call through (its rejection text carries no reason, 7.6) ...
    validated = registry.validate("repeat", '{"text": "a", "times": "2"}')
    assert isinstance(validated, ValidatedCall)
    # ... and the tool tells the model what was wrong, without running the function.
    result = validated.tool.run(validated.arguments, CONTEXT)
    assert result.is_error
    assert result.content == (
        "Error: invalid arguments for tool 'repeat'; it was not run:\n"
        '- times: Input should be a valid integer (got "2")'
    )
    nested = repeat.run({"text": "a", "times": 1, "point": {"x": "1"}, "extra": 0}, CONTEXT)
    assert nested.is_error
    assert '- point.x: Input should be a valid integer (got "1")' in nested.content
    assert "- extra: Extra inputs are not permitted" in nested.content
    missing = repeat.run({}, CONTEXT)
    assert "- text: Field required\n- times: Field required" in missing.content
    assert repeat.validation_errors({"text": "a", "times": 2}) == []
    assert repeat.validation_errors({"text": "a"}) == ["times: Field required"]
    # Arguments that are not a JSON object are still the registry's (spec 14.4 rule 9).
    assert not isinstance(registry.validate("repeat", "[1]"), ValidatedCall)


def test_validated_arguments_are_the_hinted_types() -> None:
    seen: list[Any] = []

    @tool
    def take(color: Color, point: Point, box: Box, ratio: float) -> str:
        seen.extend([color, point, box, ratio])
        return "ok"

    arguments = {"color": "blue", "point": {"x": 1}, "box": {"width": 2}, "ratio": 3}
    assert take.run(arguments, CONTEXT) == ToolResult("ok")
    assert seen == [Color.BLUE, Point(x=1, y=0), Box(2.0, []), 3.0]


def test_return_values() -> None:
    @tool
    def as_dict(n: int) -> dict[str, Any]:
        return {"n": n, "list": [1, 2]}

    @tool
    def as_model(n: int) -> Point:
        return Point(x=n)

    @tool
    def as_result(n: int) -> ToolResult:
        return ToolResult.error(f"no {n}", code=n)

    @tool
    def as_object(n: int) -> object:
        return object()

    assert as_dict.run({"n": 1}, CONTEXT) == ToolResult('{"n":1,"list":[1,2]}')
    assert as_model.run({"n": 2}, CONTEXT) == ToolResult('{"x":2,"y":0}')
    assert as_result.run({"n": 3}, CONTEXT) == ToolResult("no 3", True, {"code": 3})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        as_object.run({"n": 4}, CONTEXT)
    assert as_object.failure_result("TypeError: x") is not None  # the executor's answer


def test_an_async_tool_runs_to_completion_even_inside_a_running_loop() -> None:
    import asyncio

    @tool
    async def later(n: int, context: ToolContext) -> int:
        await asyncio.sleep(0)
        return n * 2

    assert properties(later) == {"n": {"type": "integer"}}
    assert later.run({"n": 21}, CONTEXT) == ToolResult("42")

    async def inside() -> ToolResult:
        return later.run({"n": 1}, CONTEXT)

    assert asyncio.run(inside()) == ToolResult("2")


# ---------------------------------------------------------------- signatures


def _variadic(*items: str) -> str:
    return ""


def _keywords(**options: str) -> str:
    return ""


def _positional(text: str, /) -> str:
    return ""


def _unhinted(text, count: int) -> str:  # type: ignore[no-untyped-def]
    return ""


def _two_contexts(a: ToolContext, b: ToolContext) -> str:
    return ""


def _recursive(node: Node) -> str:
    return ""


class Node(BaseModel):
    children: list[Node] = []


def _tuple(pair: tuple[int, str]) -> str:
    return ""


def _unknown(thing: Unknowable) -> str:  # type: ignore[name-defined]  # noqa: F821
    return ""


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (_variadic, r"@tool _variadic: parameter 'items': \*args and \*\*kwargs cannot"),
        (_keywords, r"@tool _keywords: parameter 'options': \*args and \*\*kwargs cannot"),
        (_positional, r"@tool _positional: parameter 'text': is positional-only"),
        (_unhinted, r"@tool _unhinted: parameter 'text': has no type hint"),
        (_two_contexts, r"@tool _two_contexts: parameter 'b': a second ToolContext"),
        (_recursive, r"@tool _recursive: parameter 'node': .* refers to itself"),
        (_tuple, r"@tool _tuple: parameter 'pair': .*prefixItems"),
        (_unknown, r"@tool _unknown: cannot resolve its type hints"),
    ],
)
def test_bad_signatures_are_refused_at_decoration_with_one_line(
    function: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        tool(function)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- the old form


def test_the_arguments_context_form_keeps_its_meaning() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }

    @tool(parameters=schema)
    def square(arguments, context):  # type: ignore[no-untyped-def]
        """Square an integer."""
        return str(arguments["n"] ** 2)

    @tool
    def noop(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "ok"

    @tool
    def loose(args, ctx):  # type: ignore[no-untyped-def]
        return "ok"

    for made in (square, noop, loose):
        assert type(made) is FunctionTool
    assert square.definition()["parameters"] == schema
    assert square.run({"n": 3}, CONTEXT) == ToolResult("9")
    assert noop.definition()["parameters"]["properties"] == {}
    # The old form keeps the registry's schema check (and its fixed rejection).
    assert not isinstance(ToolRegistry([square]).validate("square", '{"n": "3"}'), ValidatedCall)


def test_which_form_a_signature_is() -> None:
    def untyped(a, b):  # type: ignore[no-untyped-def]
        return ""

    def typed_old(arguments: dict[str, Any], context: ToolContext) -> str:
        return ""

    def mapping_only(arguments: Mapping[str, Any], context) -> str:  # type: ignore[no-untyped-def]
        return ""

    def renamed(args: Mapping[str, Any], ctx: ToolContext) -> str:
        return ""

    def typed_pair(arguments: str, context: ToolContext) -> str:
        return ""

    assert is_arguments_context_form(untyped)
    assert is_arguments_context_form(typed_old)
    assert is_arguments_context_form(mapping_only)
    assert not is_arguments_context_form(renamed)  # typed: a dict argument named "args"
    assert not is_arguments_context_form(typed_pair)
    assert isinstance(tool(typed_pair), TypedTool)


# ---------------------------------------------------------------- end to end


class Order(BaseModel):
    """An order to price."""

    item: str
    quantity: int = 1


def test_typed_tools_end_to_end_through_the_agent(tmp_path: Path) -> None:
    import asyncio

    ran: list[str] = []

    @tool
    def shout(text: str, times: int = 1) -> str:
        """Shout a text.

        Args:
            text: What to shout.
            times: How many times.
        """
        ran.append("shout")
        return " ".join([text.upper()] * times)

    @tool
    async def wait_then_add(a: int, b: int, context: ToolContext) -> dict[str, int]:
        """Add two numbers, eventually."""
        await asyncio.sleep(0)
        ran.append("add")
        return {"sum": a + b}

    @tool
    def price(order: Order) -> str:
        """Price an order."""
        ran.append("price")
        return f"{order.quantity} x {order.item}: {order.quantity * 3} EUR"

    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir()
    calls = [
        {"name": "shout", "arguments": {"text": "hi", "times": 2}},
        {"name": "wait_then_add", "arguments": {"a": 2, "b": 3}},
        {"name": "price", "arguments": {"order": {"item": "tea", "quantity": 2}}},
        {"name": "shout", "arguments": {"text": "hi", "times": "lots"}},
    ]
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {"model": "scripted/t", "responses": [{"tool_calls": calls}, {"content": "done"}]}
        )
    )
    agent = tether.Agent(
        ScriptedModel.from_file(script),
        [shout, wait_then_add, price],
        workspace=workspace,
    )
    try:
        result = agent.run("go")
    finally:
        agent.close()
    assert result.status.value == "completed"
    assert ran == ["shout", "add", "price"]  # the wrong-typed call did not run
    entries = tool_results(result.session_path)
    assert [(e["toolName"], e["result"]["type"]) for e in entries] == [
        ("shout", "success"),
        ("wait_then_add", "success"),
        ("price", "success"),
        ("shout", "error"),
    ]
    contents = [e["message"]["content"] for e in entries]
    assert contents[:3] == ["HI HI", '{"sum":5}', "2 x tea: 6 EUR"]
    assert contents[3] == (
        "Error: invalid arguments for tool 'shout'; it was not run:\n"
        '- times: Input should be a valid integer (got "lots")'
    )
    assert result.session_path.suffix == ".jsonl"  # the durable file store's log


# ---------------------------------------------------------------- docs


def test_the_docs_typed_tool_example_runs() -> None:
    text = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    section = text.split("### Typed tools", 1)[1].split("\n### ", 1)[0]
    [example] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(example, "docs/tools.md", "exec"), namespace)
    checked = namespace["checked"]
    assert checked is True
