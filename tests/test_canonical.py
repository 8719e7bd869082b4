"""Canonical JSON and digests (spec section 10)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.core.canonical import (
    SourceDigestBuilder,
    _fast,
    _fast_path_applies,
    _reference,
    canonical_json,
    configuration_digest,
    output_options_digest,
    sha256_digest,
    source_digest,
    system_prompt_digest,
    tool_definition_digest,
)
from tether.errors import CanonicalizationError

ZERO = "sha256:" + "0" * 64

# --------------------------------------------------------------------------- spec 10.6

SPEC_CONFIGURATION_CANONICAL = (
    '{"adapterIdentity":"openrouter:chat-completions:v1","model":"test/model",'
    '"outputOptionsDigest":"sha256:0000000000000000000000000000000000000000000000000000000000000000",'
    '"routingIdentity":"openrouter:test/model",'
    '"systemPromptDigest":"sha256:0000000000000000000000000000000000000000000000000000000000000000",'
    '"tools":[{"definitionDigest":"sha256:0000000000000000000000000000000000000000000000000000000000000000",'
    '"name":"read"}]}'
)
SPEC_SOURCE_CANONICAL = (
    '[{"message":{"content":"inspect","role":"user"},'
    '"sourceEntryId":"018f0000-0000-7000-8000-000000000002"},'
    '{"message":{"content":null,"role":"assistant","tool_calls":[{"function":'
    '{"arguments":"{\\"path\\":\\"README.md\\"}","name":"read"},"id":"call_1","type":"function"}]},'
    '"sourceEntryId":"018f0000-0000-7000-8000-000000000008"},'
    '{"message":{"content":"contents","role":"tool","tool_call_id":"call_1"},'
    '"sourceEntryId":"018f0000-0000-7000-8000-00000000000a"},'
    '{"message":{"content":"done","role":"assistant"},'
    '"sourceEntryId":"018f0000-0000-7000-8000-00000000000e"}]'
)


def spec_snapshot() -> dict[str, Any]:
    # Members deliberately out of canonical order.
    return {
        "tools": [{"name": "read", "definitionDigest": ZERO}],
        "systemPromptDigest": ZERO,
        "routingIdentity": "openrouter:test/model",
        "outputOptionsDigest": ZERO,
        "model": "test/model",
        "adapterIdentity": "openrouter:chat-completions:v1",
    }


def spec_sources() -> list[tuple[str, dict[str, Any]]]:
    call = {
        "type": "function",
        "id": "call_1",
        "function": {"name": "read", "arguments": '{"path":"README.md"}'},
    }
    return [
        ("018f0000-0000-7000-8000-000000000002", {"role": "user", "content": "inspect"}),
        (
            "018f0000-0000-7000-8000-000000000008",
            {"role": "assistant", "tool_calls": [call], "content": None},
        ),
        (
            "018f0000-0000-7000-8000-00000000000a",
            {"tool_call_id": "call_1", "role": "tool", "content": "contents"},
        ),
        ("018f0000-0000-7000-8000-00000000000e", {"role": "assistant", "content": "done"}),
    ]


def test_spec_configuration_example() -> None:
    canonical = canonical_json(spec_snapshot())
    assert canonical == SPEC_CONFIGURATION_CANONICAL.encode()
    assert len(canonical) == 425
    assert canonical == _reference(spec_snapshot(), False)
    expected = "sha256:83d5da8892d877c5f94a6ff60ea8babcd1138107dcb80ed8f747372346bb5f75"
    assert configuration_digest(spec_snapshot()) == expected


def test_spec_source_example() -> None:
    array = [{"sourceEntryId": i, "message": m} for i, m in spec_sources()]
    assert canonical_json(array) == SPEC_SOURCE_CANONICAL.encode()
    expected = "sha256:db6327a0c5d143e3edccd8272ac325be493a617be09fb0de3763af44a11838a2"
    assert source_digest(spec_sources()) == expected
    builder = SourceDigestBuilder()
    for entry_id, message in spec_sources():
        builder.add(entry_id, message)
    assert builder.digest() == expected


# --------------------------------------------------------------------------- strings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"', r'"\""'),
        ("\\", r'"\\"'),
        ("\b\t\n\f\r", r'"\b\t\n\f\r"'),
        ("\x00\x01\x0b\x0e\x1a\x1f", r'"\u0000\u0001\u000b\u000e\u001a\u001f"'),
        ("/", '"/"'),
        ("\x7f", '"\x7f"'),
        ("\u2028\u2029", '"\u2028\u2029"'),
        ("é€😀\ufeff", '"é€😀\ufeff"'),
        ("", '""'),
    ],
)
def test_string_escaping(text: str, expected: str) -> None:
    assert canonical_json(text) == expected.encode("utf-8")
    assert _reference(text, False) == expected.encode("utf-8")
    assert canonical_json({text: text}) == ("{" + expected + ":" + expected + "}").encode()


def test_every_control_character() -> None:
    named = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
    for code in range(0x20):
        escaped = named.get(code, f"\\u{code:04x}")
        assert canonical_json(chr(code)) == f'"{escaped}"'.encode()


@given(st.text(st.characters(codec="utf-8")))
def test_string_matches_python_json(text: str) -> None:
    # Python's json escapes exactly the spec's set (lower-case \u00xx) when not ASCII-only.
    assert canonical_json(text) == json.dumps(text, ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- ordering


def test_member_order_is_utf16_code_units() -> None:
    # Code-point order puts U+E000 first; UTF-16 (U+1F600 = D83D DE00) puts the emoji first.
    value = {"\ue000": "a", "\U0001f600": "b", "z": None, "Z": None, "": None}
    expected = '{"":null,"Z":null,"z":null,"\U0001f600":"b","\ue000":"a"}'
    assert canonical_json(value) == expected.encode()
    # The fast encoder (like orjson) sorts by code point, which is why non-ASCII names
    # leave the fast path.
    assert not _fast_path_applies(value)
    assert _fast(value) != expected.encode()
    assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS) != expected.encode()


def test_arrays_keep_order_and_tuples_are_arrays() -> None:
    assert canonical_json(["b", "a", None, [], {}]) == b'["b","a",null,[],{}]'
    assert canonical_json(("x", ("y",))) == b'["x",["y"]]'


def test_deep_nesting_beyond_orjson_limit() -> None:
    value: Any = "x"
    for _ in range(300):
        value = [value]
    assert canonical_json(value) == b"[" * 300 + b'"x"' + b"]" * 300


# --------------------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    "value",
    [
        "\ud800",
        "a\udc00b",
        "\ud83d\ude00",  # a surrogate pair as two Python code points is still unpaired
        {"\ud800": "x"},
        {"k": "\udfff"},
        {"\ue000\ud800": None},  # non-ASCII name: reference path
        [{"a": ["ok", "\ud800"]}],
    ],
)
def test_unpaired_surrogates_rejected(value: Any) -> None:
    with pytest.raises(CanonicalizationError, match="surrogate"):
        canonical_json(value)


@pytest.mark.parametrize(
    "value",
    [True, False, 0, 1.5, {"a": True}, [1], {1: "x"}, b"x", {"x"}, object()],
)
def test_non_subset_values_rejected(value: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, 2**53, -(2**53), 10**30, {1: 2}, b"", 1j]
)
def test_rejected_even_with_scalars(value: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value, allow_scalars=True)


def test_error_names_the_location() -> None:
    with pytest.raises(CanonicalizationError, match=re.escape(r"$.a[1].b")):
        canonical_json({"a": [None, {"b": True}]})


def test_cycle_rejected() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(CanonicalizationError):
        canonical_json(cycle)


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("bits", "expected"),
    [  # RFC 8785 appendix B
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ],
)
def test_rfc8785_numbers(bits: str, expected: str) -> None:
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert canonical_json(value, allow_scalars=True) == expected.encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.0, "2"),
        (0.5, "0.5"),
        (-1.5, "-1.5"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (123e-20, "1.23e-18"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1.5e300, "1.5e+300"),
        (0, "0"),
        (-7, "-7"),
        (2**53 - 1, "9007199254740991"),
        (True, "true"),
        (False, "false"),
    ],
)
def test_number_formatting(value: float, expected: str) -> None:
    assert canonical_json(value, allow_scalars=True) == expected.encode()


_ES_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?(e[+-][1-9][0-9]*)?")


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_round_trips_in_shortest_form(value: float) -> None:
    text = canonical_json(value, allow_scalars=True).decode()
    assert _ES_NUMBER.fullmatch(text), text
    assert float(text) == value
    significant = re.sub(r"e.*|[-.]", "", text).strip("0")
    assert len(significant) <= len(re.sub(r"e.*|[-.]", "", repr(abs(value))).strip("0") or "0")


def test_scalars_inside_structures() -> None:
    value = {"b": [1, 2.5, True, None], "a": {"x": -0.0, "y": 100.0}}
    expected = b'{"a":{"x":0,"y":100},"b":[1,2.5,true,null]}'
    assert canonical_json(value, allow_scalars=True) == expected


# --------------------------------------------------------------------------- fast path

_keys = st.one_of(
    st.text(st.characters(codec="ascii"), max_size=6),
    st.sampled_from(["\ue000", "\U0001f600", "\uffff", "\U00010000", "é", "a\ue000"]),
    st.text(max_size=4),
)
_texts = st.one_of(
    st.text(),
    st.text(st.characters(max_codepoint=0x7F)),
    st.text(st.sampled_from(['"', "\\", "/", "\x7f", "\u2028", "\u2029", "\x00", "\x1f", "é"])),
)
_values = st.recursive(
    st.none() | _texts,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_keys, inner, max_size=5)
    ),
    max_leaves=30,
)


@given(_values)
def test_fast_path_equals_reference(value: Any) -> None:
    reference = _reference(value, False)
    if _fast_path_applies(value):
        assert _fast(value) == reference
    assert canonical_json(value) == reference
    assert canonical_json(value, allow_scalars=True) == reference
    assert json.loads(reference) == json.loads(json.dumps(value))


@given(st.dictionaries(st.text(st.characters(codec="ascii")), _texts, max_size=8))
def test_fast_path_taken_for_ascii_names(value: dict[str, str]) -> None:
    assert _fast_path_applies(value)
    assert canonical_json(value) == _reference(value, False)


@given(_values, st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))
def test_surrogates_rejected_on_both_paths(value: Any, surrogate: str) -> None:
    for bad in ([value, surrogate], {"k": [value, "x" + surrogate]}, {surrogate: value}):
        with pytest.raises(CanonicalizationError, match="surrogate"):
            canonical_json(bad)


# --------------------------------------------------------------------------- digests


def test_sha256_digest() -> None:
    assert sha256_digest(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_system_prompt_digest() -> None:
    text = "You are helpful. é"
    assert system_prompt_digest(text) == sha256_digest(text.encode("utf-8"))
    with pytest.raises(CanonicalizationError):
        system_prompt_digest("\ud800")


def test_output_options_digest() -> None:
    options = {"temperature": 0.7, "max_tokens": 1024, "stream": False, "stop": None}
    expected = b'{"max_tokens":1024,"stop":null,"stream":false,"temperature":0.7}'
    assert output_options_digest(options) == sha256_digest(expected)
    assert output_options_digest({"t": 2.0}) == sha256_digest(b'{"t":2}')
    with pytest.raises(CanonicalizationError):
        output_options_digest({"t": math.nan})


READ_TOOL: dict[str, Any] = {
    "name": "read",
    "description": "Read a file.",
    "parameters": {
        "type": "object",
        "title": "Read",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^[^\\0]+$"},
            "offset": {"type": "integer", "minimum": 0, "exclusiveMaximum": 1e9},
            "mode": {"enum": ["text", "bytes"], "description": "How to read."},
            "lines": {
                "type": "array",
                "items": {"type": ["number", "null"], "multipleOf": 0.5},
                "minItems": 0,
                "maxItems": 10,
            },
            "pick": {"oneOf": [{"const": 1}, {"type": "boolean"}]},
            "opts": {
                "type": "object",
                "additionalProperties": {"type": "string", "maximum": 3, "exclusiveMinimum": 0},
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
}


def test_tool_definition_digest() -> None:
    definition = {**READ_TOOL, "handler": "ignored"}
    model_facing = {k: READ_TOOL[k] for k in ("name", "description", "parameters")}
    canonical = canonical_json(model_facing, allow_scalars=True)
    assert b'"exclusiveMaximum":1000000000' in canonical
    assert b'"additionalProperties":false' in canonical
    assert tool_definition_digest(definition) == "sha256:" + hashlib.sha256(canonical).hexdigest()


@pytest.mark.parametrize(
    ("parameters", "keyword"),
    [
        ({"type": "object", "$ref": "#/x"}, "$ref"),
        ({"properties": {"p": {"type": "string", "format": "uri"}}}, "format"),
        ({"items": {"anyOf": []}}, "anyOf"),
        ({"oneOf": [{"type": "string"}, {"default": 1}]}, "default"),
        ({"additionalProperties": {"examples": []}}, "examples"),
        ({"properties": {"a": {"properties": {"b": {"uniqueItems": True}}}}}, "uniqueItems"),
    ],
)
def test_unknown_schema_keyword_rejected(parameters: dict[str, Any], keyword: str) -> None:
    definition = {"name": "t", "description": "d", "parameters": parameters}
    with pytest.raises(CanonicalizationError, match=re.escape(repr(keyword))):
        tool_definition_digest(definition)


@pytest.mark.parametrize(
    "definition",
    [
        {"name": "t", "parameters": {}},
        {"name": 1, "description": "d", "parameters": {}},
        {"name": "t", "description": "d", "parameters": []},
        {"name": "t", "description": "d", "parameters": {"type": "float"}},
        {"name": "t", "description": "d", "parameters": {"type": []}},
        {"name": "t", "description": "d", "parameters": {"oneOf": {}}},
        {"name": "t", "description": "d", "parameters": {"properties": []}},
        {"name": "t", "description": "d", "parameters": {"enum": [math.nan]}},
    ],
)
def test_malformed_tool_definition_rejected(definition: dict[str, Any]) -> None:
    with pytest.raises(CanonicalizationError):
        tool_definition_digest(definition)


# --------------------------------------------------------------------------- builder

_messages = st.dictionaries(
    st.sampled_from(["role", "content", "tool_call_id", "tool_calls", "é", "\U0001f600"]),
    _values,
    max_size=4,
)


@given(st.lists(st.tuples(st.text(max_size=40), _messages), max_size=8))
def test_builder_matches_source_digest(items: list[tuple[str, dict[str, Any]]]) -> None:
    builder = SourceDigestBuilder()
    assert builder.digest() == source_digest([]) == sha256_digest(b"[]")
    for count, (entry_id, message) in enumerate(items, start=1):
        builder.add(entry_id, message)
        assert len(builder) == count
        assert builder.digest() == source_digest(items[:count])
        assert builder.digest() == builder.digest()  # not consumed


def test_builder_copy_is_independent() -> None:
    builder = SourceDigestBuilder()
    builder.add("a", {"role": "user", "content": "x"})
    twin = builder.copy()
    twin.add("b", {"role": "user", "content": "y"})
    assert builder.digest() == source_digest([("a", {"role": "user", "content": "x"})])
    assert len(twin) == 2
    assert twin.digest() != builder.digest()


def test_builder_rejects_without_changing_state() -> None:
    builder = SourceDigestBuilder()
    builder.add("a", {"content": None})
    before = builder.digest()
    with pytest.raises(CanonicalizationError):
        builder.add("b", {"content": "\ud800"})
    assert builder.digest() == before
