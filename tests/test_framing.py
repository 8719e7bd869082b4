"""Byte framing and strict JSON syntax of session logs (spec section 2, 3, 12).

Every rule of section 2 with its exact code and line: the committed region and
torn tail (2.1), line numbering, blank lines and CR (2.2), the encoded-surrogate
scan and strict UTF-8 (2.3), strict JSON (2.4) and the precedence order (2.5).
None of these errors carries a ``seq``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from sessionkit import SessionKit, expect_error, expect_ok
from tether.core import Reducer, SessionCorruption, reduce_session

SURROGATE = b"\xed\xa0\x80"  # U+D800 encoded as UTF-8: never valid


def _session() -> SessionKit:
    kit = SessionKit()
    kit.tool_run()
    kit.usage()
    return kit


def _header() -> bytes:
    return SessionKit().header_line()


def _user_line(kit: SessionKit, content_json: bytes) -> bytes:
    """A user entry line for the next seq whose content is the raw JSON ``content_json``."""
    fork = kit.fork()
    fact = fork.user("PLACEHOLDER")
    line = orjson.dumps(fact)
    assert line.count(b'"PLACEHOLDER"') == 1
    return line.replace(b'"PLACEHOLDER"', content_json)


def _lines(*lines: bytes) -> bytes:
    return b"".join(line + b"\n" for line in lines)


# ---------------------------------------------------------------------- 2.1 missing LF


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b" ",
        b"garbage",
        b"\xff\xfe",  # invalid UTF-8, but no LF: rule 1 wins
        b"{" + SURROGATE + b"}",  # encoded surrogate, but no LF
        b"\r",
    ],
)
def test_no_lf_is_missing_header(data: bytes) -> None:
    expect_error(data, "MISSING_HEADER", 1)


def test_valid_header_without_lf_is_missing_header() -> None:
    expect_error(_header(), "MISSING_HEADER", 1)


def test_complete_session_without_final_lf_loses_only_its_last_line() -> None:
    kit = _session()
    data = kit.bytes()
    state = expect_ok(data[:-1])
    previous = data[:-1].rfind(b"\n") + 1
    assert state.to_json() == reduce_session(data[:previous]).to_json()
    assert state.repaired_length == previous


def test_header_only() -> None:
    kit = SessionKit()
    data = kit.bytes()
    state = expect_ok(data)
    assert state.to_json() == {
        "header": {
            "id": kit.header["id"],
            "createdAt": kit.header["createdAt"],
            "cwd": "/workspace",
            "provider": "openrouter",
            "model": "test/model",
            "environmentIdentity": "fixture",
        },
        "transcript": [],
        "activeContext": [],
        "usage": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "operation": {"kind": "idle"},
        "repairedLength": len(data),
    }


# ---------------------------------------------------------------------- 2.1 torn tail


@pytest.mark.parametrize(
    "tail",
    [
        b"{",
        b'{"kind":"entry","seq":',
        b"\xff\xfe\xfd",  # invalid UTF-8 in the tail is never decoded
        SURROGATE,  # nor is an encoded surrogate
        b"\r",
        b"   ",
        b"[]",
        b"\x00",
    ],
)
def test_torn_tail_is_ignored(tail: bytes) -> None:
    kit = _session()
    data = kit.bytes()
    state = expect_ok(data + tail)
    assert state.repaired_length == len(data)
    assert state.to_json() == reduce_session(data).to_json()


def test_torn_tail_that_is_a_complete_valid_fact_is_ignored() -> None:
    kit = _session()
    data = kit.bytes()
    fork = kit.fork()
    fork.user("never committed")
    tail = fork.lines()[-1]
    assert b"\n" not in tail
    state = expect_ok(data + tail)
    assert state.repaired_length == len(data)
    assert {"role": "user", "content": "never committed"} not in list(state.transcript)
    # ... and once its LF is written it counts.
    assert expect_ok(data + tail + b"\n").transcript[-1] == {
        "role": "user",
        "content": "never committed",
    }


def test_torn_tail_after_header_only() -> None:
    header = _header() + b"\n"
    state = expect_ok(header + b'{"kind":')
    assert state.repaired_length == len(header)


def test_torn_tail_after_an_invalid_line_does_not_hide_it() -> None:
    data = _lines(_header(), b"nope") + b"{"
    expect_error(data, "MALFORMED_JSON", 2)


# ---------------------------------------------------------------------- 2.3 encoding


def test_encoded_surrogate_reports_its_line_even_if_an_earlier_line_is_invalid() -> None:
    data = _lines(_header(), b"not json", b'"' + SURROGATE + b'"')
    expect_error(data, "MALFORMED_JSON", 3)


def test_encoded_surrogate_inside_a_valid_string() -> None:
    kit = _session()
    line = _user_line(kit, b'"a' + SURROGATE + b'b"')
    data = kit.bytes() + line + b"\n"
    expect_error(data, "MALFORMED_JSON", kit.next_line)


@pytest.mark.parametrize("pattern", [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb0\x80"])
def test_encoded_surrogate_in_header(pattern: bytes) -> None:
    header = _header().replace(b'"/workspace"', b'"/work' + pattern + b'"')
    expect_error(header + b"\n", "MALFORMED_JSON", 1)


def test_encoded_surrogate_takes_precedence_over_invalid_utf8() -> None:
    # Invalid UTF-8 on line 2, the surrogate pattern only on line 4: the scan runs first.
    data = _lines(_header(), b'"\xff"', b"1", b'"' + SURROGATE + b'"')
    expect_error(data, "MALFORMED_JSON", 4)


def test_first_encoded_surrogate_wins() -> None:
    data = _lines(_header(), b"1", b'"' + SURROGATE + b'"', b'"' + SURROGATE + b'"')
    expect_error(data, "MALFORMED_JSON", 3)


def test_invalid_utf8_is_always_line_1() -> None:
    kit = _session()
    lines = kit.lines()
    assert len(lines) >= 5
    lines[4] = lines[4].replace(b'"type"', b'"ty\xffpe"')
    lines[1] = b"not json either"  # a JSON error on line 2 does not matter
    expect_error(_lines(*lines), "INVALID_UTF8", 1)


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff",
        b"\xc0\xaf",  # overlong
        b"\xe2\x82",  # truncated sequence
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\xed\xa0\x41",  # 0xED 0xA0 but no continuation byte: not the surrogate pattern
        b"\x80",  # lone continuation byte
    ],
)
def test_invalid_utf8_variants(bad: bytes) -> None:
    data = _lines(_header(), b'"x' + bad + b'"')
    expect_error(data, "INVALID_UTF8", 1)


def test_invalid_utf8_takes_precedence_over_empty_first_line() -> None:
    expect_error(b"\n" + _header() + b"\n\xff\n", "INVALID_UTF8", 1)


def test_invalid_utf8_takes_precedence_over_blank_and_crlf() -> None:
    expect_error(_lines(_header(), b"", b"1\r", b"\xfe"), "INVALID_UTF8", 1)


def test_highest_bmp_code_point_below_surrogates_is_fine() -> None:
    kit = _session()
    line = _user_line(kit, b'"\xed\x9f\xbf"')  # U+D7FF
    state = expect_ok(kit.bytes() + line + b"\n")
    assert state.transcript[-1]["content"] == "\ud7ff"


def test_raw_non_ascii_is_fine() -> None:
    kit = SessionKit()
    kit.simple_run("héllo wörld – 😀 \u2028 \u00a0", "ok ✓")
    state = expect_ok(kit)
    assert state.transcript[0]["content"] == "héllo wörld – 😀 \u2028 \u00a0"


def test_byte_order_mark_is_not_stripped() -> None:
    expect_error(b"\xef\xbb\xbf" + _header() + b"\n", "MALFORMED_JSON", 1)


def test_byte_order_mark_on_a_later_line() -> None:
    kit = _session()
    lines = kit.lines()
    lines[2] = b"\xef\xbb\xbf" + lines[2]
    expect_error(_lines(*lines), "MALFORMED_JSON", 3)


# ---------------------------------------------------------------------- 2.2 lines


@pytest.mark.parametrize("data", [b"\n", b"\n\n", b"\n" + _header() + b"\n"])
def test_empty_first_line_is_missing_header(data: bytes) -> None:
    expect_error(data, "MISSING_HEADER", 1)


def test_blank_line_after_header() -> None:
    expect_error(_header() + b"\n\n", "BLANK_LINE", 2)


def test_blank_line_later_reports_its_line() -> None:
    kit = _session()
    lines = kit.lines()
    lines.insert(3, b"")
    expect_error(_lines(*lines), "BLANK_LINE", 4)


def test_blank_line_before_a_torn_tail() -> None:
    expect_error(_header() + b"\n\n{", "BLANK_LINE", 2)


def test_blank_line_then_garbage() -> None:
    expect_error(_lines(_header(), b"", b"garbage"), "BLANK_LINE", 2)


def test_errors_are_reported_in_line_order() -> None:
    # An invalid fact on line 2 wins over a blank line 3 and garbage on line 4.
    kit = SessionKit()
    bad = kit.user()
    bad["seq"] = 7
    lines = [*kit.lines(), b"", b"garbage"]
    expect_error(_lines(*lines), "SEQ_MISMATCH", 2, 7)


def test_crlf_on_header() -> None:
    expect_error(_header() + b"\r\n", "CRLF_NOT_ALLOWED", 1)


def test_crlf_on_a_later_line() -> None:
    kit = _session()
    lines = kit.lines()
    lines[3] += b"\r"
    expect_error(_lines(*lines), "CRLF_NOT_ALLOWED", 4)


def test_crlf_is_checked_before_json() -> None:
    expect_error(_lines(_header(), b"not json\r"), "CRLF_NOT_ALLOWED", 2)


def test_lone_cr_line_is_crlf_not_blank() -> None:
    expect_error(_lines(_header(), b"\r"), "CRLF_NOT_ALLOWED", 2)


def test_crlf_only_at_end_of_committed_region_counts() -> None:
    # A CR in the torn tail is ignored.
    data = _header() + b"\n"
    assert expect_ok(data + b"\r").repaired_length == len(data)


def test_cr_inside_a_line_is_json_whitespace() -> None:
    kit = _session()
    lines = kit.lines()
    lines[0] = lines[0].replace(b'"kind":', b'\r"kind"\r:\r', 1)
    lines[2] = b"\r" + lines[2].replace(b",", b",\r", 1)
    data = _lines(*lines)
    state = expect_ok(data)
    assert state.to_json() | {"repairedLength": 0} == reduce_session(kit.bytes()).to_json() | {
        "repairedLength": 0
    }


def test_raw_cr_inside_a_string_is_malformed() -> None:
    kit = SessionKit()
    line = _user_line(kit, b'"a\rb"')
    expect_error(_lines(kit.header_line(), line), "MALFORMED_JSON", 2)


@pytest.mark.parametrize("line", [b" ", b"\t", b"  \t ", b" \r\t "])
def test_whitespace_only_line_is_malformed(line: bytes) -> None:
    if line.endswith(b"\r"):
        pytest.skip("a trailing CR is CRLF_NOT_ALLOWED")
    expect_error(_lines(_header(), line), "MALFORMED_JSON", 2)


@pytest.mark.parametrize("line", [b" ", b"\t"])
def test_whitespace_only_header_is_malformed(line: bytes) -> None:
    expect_error(_lines(line), "MALFORMED_JSON", 1)


def test_surrounding_json_whitespace_is_fine() -> None:
    kit = _session()
    lines = [b" \t" + line + b" \t " for line in kit.lines()]
    expect_ok(_lines(*lines))


# ---------------------------------------------------------------------- 2.4 JSON syntax


def _session_with_line(line: bytes) -> tuple[bytes, int]:
    kit = _session()
    return kit.bytes() + line + b"\n", kit.next_line


@pytest.mark.parametrize(
    "content",
    [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"'text'",
        b"undefined",
        b"True",
        b"01",
        b"+1",
        b"0x10",
        b".5",
        b"1.",
        b'"a\\x41"',  # invalid escape
        b'"a\\u12"',  # short unicode escape
        b'"tab\there"',  # raw control character in a string
        b'"nul\x00here"',
        b'"unterminated',
        b'"a" "b"',
        b'["a",]',  # trailing comma in an array
        b'{"a":1,}',  # trailing comma in an object
        b"/* comment */ 1",
        b"1 // comment",
        b"{a:1}",
    ],
)
def test_non_standard_json_is_malformed(content: bytes) -> None:
    kit = _session()
    data, line = _session_with_line(_user_line(kit, content))
    expect_error(data, "MALFORMED_JSON", line)


@pytest.mark.parametrize(
    "replace",
    [
        (b'"timestamp":', b'"timestamp":NaN,"x":'),
        (b"}", b",}"),
    ],
)
def test_malformed_fact_envelope(replace: tuple[bytes, bytes]) -> None:
    kit = _session()
    line = orjson.dumps(kit.fork().user())
    old, new = replace
    data, number = _session_with_line(line.replace(old, new, 1))
    expect_error(data, "MALFORMED_JSON", number)


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b"}",
        b"[",
        b"[1,2",
        b'{"a"}',
        b'{"a":}',
        b'{"a" 1}',
        b"{} {}",
        b"{}x",
        b"[]]",
        b"1 2",
        b"nul",
        b"\x7f",
    ],
)
def test_syntax_errors_and_trailing_garbage(line: bytes) -> None:
    data, number = _session_with_line(line)
    expect_error(data, "MALFORMED_JSON", number)


def test_trailing_comma_in_header() -> None:
    expect_error(_header()[:-1] + b",}\n", "MALFORMED_JSON", 1)


def test_raw_del_inside_a_string_is_fine() -> None:
    kit = _session()
    data, _ = _session_with_line(_user_line(kit, b'"a\x7fb"'))
    assert expect_ok(data).transcript[-1]["content"] == "a\x7fb"


def test_escaped_slash_and_control_escapes_are_fine() -> None:
    kit = _session()
    data, _ = _session_with_line(_user_line(kit, b'"a\\/b\\n\\t\\u0001\\"\\\\"'))
    assert expect_ok(data).transcript[-1]["content"] == 'a/b\n\t\x01"\\'


# --- duplicate member names


def test_duplicate_member_in_header_is_malformed_not_invalid_header() -> None:
    header = _header()[:-1] + b',"cwd":"/other"}'
    expect_error(header + b"\n", "MALFORMED_JSON", 1)


def test_duplicate_member_at_depth() -> None:
    kit = _session()
    content = b'"x","content":"y"'
    data, line = _session_with_line(_user_line(kit, content))
    expect_error(data, "MALFORMED_JSON", line)


def test_duplicate_member_with_identical_value() -> None:
    kit = _session()
    fact = orjson.dumps(kit.fork().user())
    line = fact.replace(b'"kind":"entry"', b'"kind":"entry","kind":"entry"')
    data, number = _session_with_line(line)
    expect_error(data, "MALFORMED_JSON", number)


def test_duplicate_member_spelled_with_an_escape() -> None:
    kit = _session()
    # "\u0063ontent" is "content" after unescaping.
    data, line = _session_with_line(_user_line(kit, b'"x","\\u0063ontent":"y"'))
    expect_error(data, "MALFORMED_JSON", line)


def test_duplicate_member_a_vs_escaped_a_deep_in_tool_arguments() -> None:
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.assistant(None, ["read"])
    fact = kit.fork().tool_started(0, arguments={"a": 1, "PLACEHOLDER": 2})
    line = orjson.dumps(fact).replace(b'"PLACEHOLDER"', b'"\\u0061"')
    data = kit.bytes() + line + b"\n"
    expect_error(data, "MALFORMED_JSON", kit.next_line)
    # Without the duplicate the same shape is fine.
    ok = orjson.dumps(fact).replace(b'"PLACEHOLDER"', b'"\\u0062"')
    state = expect_ok(kit.bytes() + ok + b"\n")
    assert state.operation.tool_calls[0].arguments == {"a": 1, "b": 2}  # type: ignore[union-attr]


def test_duplicate_member_inside_array_item() -> None:
    kit = SessionKit()
    kit.start_run()
    fact = kit.fork().step_attempt()
    line = orjson.dumps(fact).replace(b'"name":"read"', b'"name":"read","name":"read"')
    expect_error(kit.bytes() + line + b"\n", "MALFORMED_JSON", kit.next_line)


def test_same_member_name_in_different_objects_is_fine() -> None:
    kit = SessionKit()
    kit.simple_run()
    expect_ok(kit)  # "type", "id", ... occur at several depths


# --- surrogate escapes


@pytest.mark.parametrize(
    "content",
    [
        b'"\\ud800"',
        b'"\\udc00"',
        b'"\\ud800\\u0041"',
        b'"a\\ud800"',
        b'"\\ud800b"',
        b'"\\uD800"',
        b'"\\ud800\\ud800"',
        b'"\\ude00\\ud83d"',  # reversed pair
        b'"\\udbff"',
        b'"\\udfff"',
    ],
)
def test_lone_surrogate_escape_value_is_malformed(content: bytes) -> None:
    kit = _session()
    data, line = _session_with_line(_user_line(kit, content))
    expect_error(data, "MALFORMED_JSON", line)


@pytest.mark.parametrize("name", [b'"\\ud800"', b'"\\udc00"', b'"x\\ud800\\u0041"'])
def test_lone_surrogate_escape_member_name_is_malformed(name: bytes) -> None:
    kit = _session()
    fact = orjson.dumps(kit.fork().user())
    line = fact[:-1] + b"," + name + b":1}"
    data, number = _session_with_line(line)
    expect_error(data, "MALFORMED_JSON", number)


def test_lone_surrogate_escape_in_header() -> None:
    header = _header().replace(b'"/workspace"', b'"/work\\ud800"')
    expect_error(header + b"\n", "MALFORMED_JSON", 1)


def test_lone_surrogate_in_an_unknown_header_member_is_malformed_not_invalid_header() -> None:
    header = _header()[:-1] + b',"\\udc00":1}'
    expect_error(header + b"\n", "MALFORMED_JSON", 1)


@pytest.mark.parametrize("escape", [b'"\\ud83d\\ude00"', b'"\\uD83D\\uDE00"'])
def test_paired_surrogate_escape_is_fine(escape: bytes) -> None:
    kit = _session()
    data, _ = _session_with_line(_user_line(kit, escape))
    assert expect_ok(data).transcript[-1]["content"] == "😀"


def test_escaped_backslash_before_u_is_not_a_surrogate_escape() -> None:
    kit = _session()
    data, _ = _session_with_line(_user_line(kit, b'"\\\\ud800"'))
    assert expect_ok(data).transcript[-1]["content"] == "\\ud800"


# ---------------------------------------------------------------------- non-compact forms


def _reformat(line: bytes, *, reverse: bool, ensure_ascii: bool) -> bytes:
    def reorder(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            if reverse:
                items.reverse()
            return {key: reorder(member) for key, member in items}
        if isinstance(value, list):
            return [reorder(item) for item in value]
        return value

    value = reorder(json.loads(line))
    text = json.dumps(value, ensure_ascii=ensure_ascii, separators=(" , ", " : "))
    return (" " + text + "\t").encode("utf-8")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_non_compact_formatting_gives_the_same_state(reverse: bool, ensure_ascii: bool) -> None:
    kit = SessionKit()
    kit.tool_run('inspect é 😀 \u2028 "quoted" \\ back/slash')
    kit.usage()
    kit.compact(keep=3, summary="sümmary 😀")
    kit.simple_run("again ünïcode", "fine \u00e9")
    reformatted = [
        _reformat(line, reverse=reverse, ensure_ascii=ensure_ascii) for line in kit.lines()
    ]
    data = _lines(*reformatted)
    state = expect_ok(data)
    expected = reduce_session(kit.bytes()).to_json()
    assert state.to_json() | {"repairedLength": 0} == expected | {"repairedLength": 0}
    assert state.repaired_length == len(data)


def test_escaped_non_ascii_equals_raw() -> None:
    kit = _session()
    escaped, _ = _session_with_line(_user_line(kit, b'"caf\\u00e9"'))
    raw, _ = _session_with_line(_user_line(kit, '"café"'.encode()))
    assert expect_ok(escaped).transcript[-1] == expect_ok(raw).transcript[-1]


def test_reordered_snapshot_members_keep_the_digest() -> None:
    kit = SessionKit()
    kit.start_run()
    fact = kit.step_attempt()
    snapshot = fact["record"]["configurationSnapshot"]
    fact["record"]["configurationSnapshot"] = dict(reversed(list(snapshot.items())))
    state = expect_ok(kit)
    assert state.operation.step.configuration_snapshot.to_json() == snapshot  # type: ignore[union-attr]


# ---------------------------------------------------------------------- integer tokens


@pytest.mark.parametrize("token", [b"1.0", b"1e0", b"1E0", b"10e-1", b"0.1e1", b"1.00"])
def test_non_integer_seq_token_is_invalid_fact_without_seq(token: bytes) -> None:
    kit = SessionKit()
    line = orjson.dumps(kit.fork().user()).replace(b'"seq":1,', b'"seq":' + token + b",")
    assert token in line
    expect_error(_lines(kit.header_line(), line), "INVALID_FACT", 2, None)


@pytest.mark.parametrize("token", [b"0", b"-1", b"true", b'"1"', b"null", b"9007199254740992"])
def test_invalid_seq_values(token: bytes) -> None:
    kit = SessionKit()
    line = orjson.dumps(kit.fork().user()).replace(b'"seq":1,', b'"seq":' + token + b",")
    expect_error(_lines(kit.header_line(), line), "INVALID_FACT", 2, None)


@pytest.mark.parametrize(
    "token", [b"1.0", b"1e3", b"-1", b"123456789012345678901234567890", b"1e400"]
)
def test_non_integer_timestamp_is_invalid_fact(token: bytes) -> None:
    kit = SessionKit()
    fact = kit.fork().user()
    line = orjson.dumps(fact).replace(
        b'"timestamp":' + str(fact["timestamp"]).encode(), b'"timestamp":' + token
    )
    expect_error(_lines(kit.header_line(), line), "INVALID_FACT", 2, 1)


@pytest.mark.parametrize("token", [b"1710000000000.0", b"1.71e12"])
def test_non_integer_created_at_is_invalid_header(token: bytes) -> None:
    header = _header().replace(b"1710000000000", token)
    expect_error(header + b"\n", "INVALID_HEADER", 1)


@pytest.mark.parametrize("token", [b"2.0", b"2e0", b"20e-1", b"0.2E1", b"2.000"])
def test_numeric_version_equal_to_two_is_accepted(token: bytes) -> None:
    header = _header().replace(b'"version":2', b'"version":' + token)
    assert token in header
    expect_ok(header + b"\n")


def test_non_integer_tool_index_attempt_and_usage_counter() -> None:
    kit = SessionKit()
    kit.start_run()
    attempt = kit.fork().step_attempt()
    line = orjson.dumps(attempt).replace(b'"attempt":1', b'"attempt":1.0')
    expect_error(kit.bytes() + line + b"\n", "INVALID_FACT", kit.next_line, attempt["seq"])

    kit.step_attempt()
    kit.assistant(None, ["read"])
    started = kit.fork().tool_started(0)
    line = orjson.dumps(started).replace(b'"toolIndex":0', b'"toolIndex":0.0')
    expect_error(kit.bytes() + line + b"\n", "INVALID_FACT", kit.next_line, started["seq"])

    usage = kit.fork().usage(input=10)
    line = orjson.dumps(usage).replace(b'"input":10', b'"input":1e1')
    expect_error(kit.bytes() + line + b"\n", "INVALID_FACT", kit.next_line, usage["seq"])

    synthetic = kit.fork().synthetic(0, "unknownTool")
    line = orjson.dumps(synthetic).replace(b'"toolIndex":0', b'"toolIndex":0e0')
    expect_error(kit.bytes() + line + b"\n", "INVALID_FACT", kit.next_line, synthetic["seq"])


def test_big_integers_take_the_strict_path() -> None:
    kit = SessionKit()
    kit.simple_run()
    usage = kit.fork().usage()
    line = orjson.dumps(usage).replace(b'"input":10', b'"input":99999999999999999999999')
    expect_error(kit.bytes() + line + b"\n", "INVALID_FACT", kit.next_line, usage["seq"])


# ---------------------------------------------------------------------- incremental API


def test_from_header_line_checks_framing() -> None:
    with pytest.raises(SessionCorruption) as info:
        Reducer.from_header_line(b"")
    assert (info.value.code, info.value.line) == ("MISSING_HEADER", 1)
    with pytest.raises(SessionCorruption) as info:
        Reducer.from_header_line(_header() + b"\r")
    assert (info.value.code, info.value.line) == ("CRLF_NOT_ALLOWED", 1)
    with pytest.raises(SessionCorruption) as info:
        Reducer.from_header_line(b"\xef\xbb\xbf" + _header())
    assert (info.value.code, info.value.line) == ("MALFORMED_JSON", 1)


def test_apply_checks_line_framing() -> None:
    reducer = Reducer.from_header_line(_header())
    for raw, code in [(b"", "BLANK_LINE"), (b"1\r", "CRLF_NOT_ALLOWED"), (b" ", "MALFORMED_JSON")]:
        with pytest.raises(SessionCorruption) as info:
            reducer.apply(raw)
        assert (info.value.code, info.value.line, info.value.seq) == (code, 2, None)
    assert reducer.length == len(_header()) + 1
    assert reducer.next_seq == 1


@pytest.mark.parametrize(
    "pad",
    [b"\x0c", b"\x0b", b"\xc2\xa0", b"\xe2\x80\xa8", b"\xe3\x80\x80", b"\x00", b"\x1c"],
    ids=["ff", "vt", "nbsp", "ls", "ideographic", "nul", "fs"],
)
@pytest.mark.parametrize("where", ["before", "after"])
def test_only_space_tab_cr_lf_are_json_whitespace(pad: bytes, where: str) -> None:
    kit = _session()
    lines = kit.lines()
    lines[2] = pad + lines[2] if where == "before" else lines[2] + pad
    expect_error(_lines(*lines), "MALFORMED_JSON", 3)


@pytest.mark.parametrize("pad", [b"\x0c", b"\xc2\xa0"])
def test_non_json_whitespace_around_header(pad: bytes) -> None:
    expect_error(pad + _header() + b"\n", "MALFORMED_JSON", 1)
