"""The core's value types and the concepts that now exist once (issue 12).

* :func:`tether.core.values.format_ms` is integer arithmetic, and agrees with the
  ``datetime`` formatting it replaced for every time tether records;
* one usage type: ``tether._models.TokenUsage`` *is* :class:`tether.core.state.Usage`, with
  the validation the adapters relied on, and one way to sum it (``+``, checked);
* one safe-integer constant, one arguments digest;
* the reducer's gc pause lives in the shell: the pure ``tether.core.reduce_session`` never
  touches the collector, ``tether._loading`` pauses it around a whole-log load and restores
  it, and both give the same state; no other module of tether touches the collector's
  switch.
"""

from __future__ import annotations

import gc
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionkit import SessionKit
from tether import _loading
from tether._models import TokenUsage
from tether._models import base as models_base
from tether._runtime import guards
from tether.core import canonical, reducer
from tether.core.canonical import MAX_SAFE_INTEGER, arguments_digest
from tether.core.state import Usage
from tether.core.values import format_ms
from tether.errors import SessionCorruption

# The last millisecond datetime can show (9999-12-31T23:59:59.999Z).
_LAST_MS = 253_402_300_799_999


def _datetime_format(ms: int) -> str:
    """What ``tether._wsdb.sqlite.format_ms`` computed before it moved into the core."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@given(st.integers(min_value=0, max_value=_LAST_MS))
def test_format_ms_agrees_with_datetime(ms: int) -> None:
    assert format_ms(ms) == _datetime_format(ms)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),  # a leap day of a 400-year leap year
        (4_107_542_399_999, "2100-02-28T23:59:59.999Z"),  # 2100 is no leap year
        (_LAST_MS, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_format_ms_calendar_edges(ms: int, text: str) -> None:
    assert format_ms(ms) == text == _datetime_format(ms)
    assert format_ms(None) is None


def test_one_usage_type_with_the_adapters_validation() -> None:
    assert TokenUsage is Usage
    assert Usage(1, 2, 3, 4).to_json() == {
        "input": 1,
        "output": 2,
        "cacheRead": 3,
        "cacheWrite": 4,
    }
    assert Usage(cache_write=MAX_SAFE_INTEGER).cache_write == MAX_SAFE_INTEGER
    with pytest.raises(ValueError, match="out of range"):
        Usage(output=MAX_SAFE_INTEGER + 1)
    with pytest.raises(ValueError):
        Usage(-1)
    with pytest.raises(TypeError):
        Usage(True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Usage(1.0)  # type: ignore[arg-type]


def test_usage_sums_and_differences_are_checked_usages() -> None:
    # The one summing function: the executor's run total, the timeline's step and
    # operation totals and a run's share of the session total all use it.
    from tether.core import timeline

    a, b = Usage(1, 2, 3, 4), Usage(10, 20, 30, 40)
    assert a + b == Usage(11, 22, 33, 44)
    assert sum((a, b), Usage()) == a + b
    assert (a + b) - a == b
    assert Usage.from_json(b.to_json()) == b
    with pytest.raises(ValueError, match="out of range"):
        Usage(input=MAX_SAFE_INTEGER) + Usage(input=1)
    with pytest.raises(ValueError, match="out of range"):
        a - b  # a total never shrinks
    assert not hasattr(timeline, "UsageView")


def test_one_safe_integer_constant() -> None:
    assert MAX_SAFE_INTEGER == 2**53 - 1
    assert models_base.MAX_SAFE_INTEGER is canonical.MAX_SAFE_INTEGER
    assert reducer.MAX_SAFE_INTEGER is canonical.MAX_SAFE_INTEGER
    assert not hasattr(reducer, "MAX_SAFE") and not hasattr(canonical, "_MAX_SAFE_INTEGER")


def test_one_arguments_digest() -> None:
    assert guards.arguments_digest is arguments_digest
    assert arguments_digest({"b": 1, "a": [1.0, "x"]}) == arguments_digest({"a": [1, "x"], "b": 1})
    # Outside canonical JSON (an integer beyond 2**53 - 1): still a stable digest.
    big = {"n": MAX_SAFE_INTEGER + 1, "a": 1}
    assert arguments_digest(big) == arguments_digest({"a": 1, "n": MAX_SAFE_INTEGER + 1})
    assert arguments_digest(big) != arguments_digest({"n": MAX_SAFE_INTEGER, "a": 1})


def _log() -> bytes:
    kit = SessionKit()
    kit.simple_run("hello", "hi there")
    kit.tool_run("inspect")
    return kit.bytes()


def test_the_pure_reducer_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("the pure reducer touched the garbage collector")

    monkeypatch.setattr(gc, "disable", refuse)
    monkeypatch.setattr(gc, "enable", refuse)
    state = reducer.reduce_session(_log())
    assert state.last_seq > 0


def test_loading_pauses_the_collector_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _log()
    expected = reducer.reduce_session(data).to_json()
    seen: list[bool] = []
    pure_load = reducer.Reducer.load

    def observing_load(raw: bytes) -> reducer.Reducer:
        seen.append(gc.isenabled())
        return pure_load(raw)

    monkeypatch.setattr(reducer.Reducer, "load", staticmethod(observing_load))
    assert gc.isenabled()
    state = _loading.reduce_session(data)
    assert seen == [False] and gc.isenabled()
    assert state.to_json() == expected

    gc.disable()  # a caller that had the collector off keeps it off
    try:
        _loading.load_reducer(data)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_loading_restores_the_collector_when_the_log_is_corrupt() -> None:
    data = _log() + b'{"kind":"entry"}\n'
    with pytest.raises(SessionCorruption):
        _loading.reduce_session(data)
    assert gc.isenabled()


def test_only_loading_switches_the_collector() -> None:
    from pathlib import Path

    import tether

    root = Path(tether.__file__).parent
    switching = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(call in path.read_text() for call in ("gc.disable(", "gc.freeze(", "gc.set_thr"))
    )
    assert switching == ["_loading.py"]


def test_collecting_less_often_restores_the_thresholds() -> None:
    before = gc.get_threshold()
    with _loading.gc_less_often(20_000):
        assert gc.get_threshold() == (20_000, *before[1:])
        with _loading.gc_less_often(100):  # never more often than already
            assert gc.get_threshold()[0] == 20_000
    assert gc.get_threshold() == before
    with pytest.raises(KeyError), _loading.gc_less_often(5_000):
        raise KeyError("x")
    assert gc.get_threshold() == before
