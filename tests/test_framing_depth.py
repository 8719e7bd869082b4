"""Nesting depth of session lines: ``MAX_LINE_DEPTH`` levels or ``MALFORMED_JSON``.

The spec (sections 2.4, 3) sets no depth limit; RFC 8259 lets a parser set one. Without
one the verdict on a deep line depended on the parser and the call stack: orjson read up
to 1,024 levels and then failed to write them back (exit 70 from ``tether inspect``), the
strict path's ``json`` module raised :class:`RecursionError` near 1,000. Now a line up to
:data:`MAX_LINE_DEPTH` levels deep is read like any other, and a deeper one is always
``MALFORMED_JSON`` at its line (no ``seq``: a framing error), whichever path parses it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionkit import SessionKit, expect_error, expect_ok
from tether._cli.common import dumps_json
from tether._inputs import nesting_depth
from tether.core import Reducer, SessionCorruption, framing, plan_recovery
from tether.core.current import CurrentConfiguration
from tether.core.framing import MAX_LINE_DEPTH, parse_line


def test_the_limit_is_orjsons_writing_limit() -> None:
    """The fast path relies on it (checked at import); this orjson must agree."""
    assert MAX_LINE_DEPTH == 254
    assert framing._ORJSON_BOUNDS_DEPTH


@pytest.fixture(params=[True, False], ids=["orjson-bounds-depth", "explicit-check"])
def bounds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run a test with the fast path trusted, and as for an orjson that writes deeper."""
    monkeypatch.setattr(framing, "_ORJSON_BOUNDS_DEPTH", request.param)
    return bool(request.param)


def _nested(kinds: list[bool], siblings: list[str], spaced: bool) -> bytes:
    """JSON text nesting one array (False) or object (True) per item of ``kinds``.

    Every level also holds a string sibling full of brackets and quotes, which must not
    count. ``spaced`` adds whitespace, so orjson's fast path cannot take the line.
    """
    gap = b" " if spaced else b""
    prefix: list[bytes] = []
    suffix: list[bytes] = []
    for level, is_object in enumerate(kinds):
        sibling = json.dumps(siblings[level % len(siblings)]).encode() if siblings else b'""'
        if is_object:
            prefix.append(b"{" + gap + b'"s":' + gap + sibling + b"," + gap + b'"k":' + gap)
            suffix.append(gap + b"}")
        else:
            prefix.append(b"[" + gap + sibling + b"," + gap)
            suffix.append(gap + b"]")
    return b"".join(prefix) + b"1" + b"".join(reversed(suffix))


TRICKY = st.text(alphabet='[]{}"\\ab\u00e9', max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    depth=st.one_of(
        st.integers(1, 20),
        st.integers(MAX_LINE_DEPTH - 3, MAX_LINE_DEPTH + 3),
        st.integers(MAX_LINE_DEPTH + 4, 1100),
    ),
    seed=st.lists(st.booleans(), min_size=1, max_size=8),
    siblings=st.lists(TRICKY, max_size=3),
    spaced=st.booleans(),
    trusted=st.booleans(),
)
def test_depth_verdict_is_exact_on_every_path(
    depth: int, seed: list[bool], siblings: list[str], spaced: bool, trusted: bool
) -> None:
    """A line parses iff it nests at most MAX_LINE_DEPTH levels; never another exception."""
    kinds = [seed[i % len(seed)] for i in range(depth)]
    raw = _nested(kinds, siblings, spaced)
    saved = framing._ORJSON_BOUNDS_DEPTH
    framing._ORJSON_BOUNDS_DEPTH = trusted
    try:
        if depth <= MAX_LINE_DEPTH:
            assert parse_line(raw, 7) == json.loads(raw)
        else:
            with pytest.raises(SessionCorruption) as info:
                parse_line(raw, 7)
            error = info.value
            assert (error.code, error.line, error.seq) == ("MALFORMED_JSON", 7, None)
            assert error.detail == f"nested deeper than {MAX_LINE_DEPTH} levels"
    finally:
        framing._ORJSON_BOUNDS_DEPTH = saved


@pytest.mark.parametrize("depth", [MAX_LINE_DEPTH + 1, 1024, 1025, 100_000])
def test_deep_header_line_is_malformed_json(depth: int, bounds: bool) -> None:
    data = b"[" * depth + b"]" * depth + b"\n"
    expect_error(data, "MALFORMED_JSON", 1)


def _deep_tool_call(levels: int) -> tuple[SessionKit, dict[str, Any]]:
    """A session ending in a toolStarted line that nests exactly ``levels`` deep.

    fact (1) > record (2) > arguments (3) > "deep" (4) > … The line is written by hand:
    orjson (the kit's writer) stops at 254 levels.
    """
    kit = SessionKit()
    kit.start_run()
    kit.step_attempt()
    kit.assistant(None, ["read"])
    inner = levels - 3
    deep = b"[" * inner + b"]" * inner
    started = kit.fork().tool_started(0, arguments={"path": "README.md", "deep": "DEEP"})
    kit.line(orjson.dumps(started).replace(b'"DEEP"', deep))
    started["record"]["arguments"]["deep"] = json.loads(deep)
    assert nesting_depth(kit.lines()[-1]) == levels
    return kit, started


def test_tool_arguments_up_to_the_limit_are_read_and_written_back(bounds: bool) -> None:
    kit, started = _deep_tool_call(MAX_LINE_DEPTH)
    state = expect_ok(kit)
    arguments = state.operation.tool_calls[0].arguments  # type: ignore[union-attr]
    assert arguments == started["record"]["arguments"]
    # tether inspect --json puts the arguments deeper than orjson writes.
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(state.to_json(), default=dict)
    document = json.loads(dumps_json({"ok": True, "state": state.to_json()}))
    assert document["state"]["operation"]["toolCalls"][0]["arguments"] == arguments
    # The planner hands the arguments on (replay of a safe tool).
    current = CurrentConfiguration.from_json(
        {
            "configurationDigest": state.operation.step.configuration_digest,  # type: ignore[union-attr]
            "environmentIdentity": "fixture",
            "tools": [
                {
                    "name": "read",
                    "definitionDigest": "sha256:" + "0" * 64,
                    "replay": "safe",
                    "replayKey": "builtin:read:v1",
                }
            ],
        }
    )
    plan = plan_recovery(state, current).to_json()
    assert json.loads(dumps_json(plan))["arguments"] == arguments


def test_tool_arguments_one_level_deeper_are_malformed_json(bounds: bool) -> None:
    kit, _ = _deep_tool_call(MAX_LINE_DEPTH + 1)
    expect_error(kit, "MALFORMED_JSON", len(kit.lines()))


def test_incremental_check_refuses_a_deep_candidate_and_keeps_the_state() -> None:
    kit, _ = _deep_tool_call(MAX_LINE_DEPTH + 1)
    header, *lines = kit.lines()
    reducer = Reducer.from_header_line(header)
    for raw in lines[:-1]:
        reducer.apply(raw)
    before = reducer.state.to_json()
    with pytest.raises(SessionCorruption) as info:
        reducer.check(lines[-1])
    assert (info.value.code, info.value.seq) == ("MALFORMED_JSON", None)
    assert reducer.state.to_json() == before


def test_a_deep_line_after_an_invalid_line_does_not_hide_it() -> None:
    kit = SessionKit()
    data = kit.bytes() + b"[]\n" + b"[" * 300 + b"]" * 300 + b"\n"
    expect_error(data, "EMPTY_TRANSACTION", 2)


def test_brackets_inside_strings_do_not_count(bounds: bool) -> None:
    kit = SessionKit()
    kit.simple_run(prompt="[" * 5000 + "{" * 5000 + '\\"]' * 10, answer="}" * 300)
    state = expect_ok(kit)
    assert state.transcript[0]["content"].startswith("[" * 5000)
