"""``tether.core.records`` behaves as ``@dataclass(frozen=True)`` does for what it supports.

The property test declares the same fields twice, once as a record and once as a frozen
dataclass, and checks every observable the module's rules promise on both: construction
(or the same kind of error) from the same arguments, the field values, ``repr``, equality
and hashing, ``replace``, refused assignment, ``__match_args__``, pickling and copying.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.core import records
from tether.core.records import FrozenRecordError, field, fields, record, replace

# One field: (default kind, repr, compare, init). A field without a default is always
# taken by __init__ (dataclasses requires it too).
_KINDS = ("none", "value", "factory")
_field_specs = st.tuples(st.sampled_from(_KINDS), st.booleans(), st.booleans(), st.booleans())


def _ordered(specs: list[tuple[str, bool, bool, bool]]) -> list[tuple[str, bool, bool, bool]]:
    """Fields without a default first (the rule both kinds enforce), the others after."""
    return [s for s in specs if s[0] == "none"] + [s for s in specs if s[0] != "none"]


def _declare(specs: list[tuple[str, bool, bool, bool]], *, as_record: bool, slots: bool) -> type:
    """A class ``C`` with fields ``f0``… as ``specs`` say, as a record or a dataclass."""
    make_field: Any = field if as_record else dataclasses.field
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": __name__}
    for index, (kind, shown, compared, init) in enumerate(specs):
        name = f"f{index}"
        namespace["__annotations__"][name] = "Any"
        options = {"repr": shown, "compare": compared, "init": init or kind == "none"}
        if kind == "value":
            namespace[name] = make_field(default=index * 10, **options)
        elif kind == "factory":
            namespace[name] = make_field(default_factory=lambda index=index: (index,), **options)
        elif not options["repr"] or not options["compare"]:
            namespace[name] = make_field(**options)
    cls = type("C", (), namespace)
    cls.__qualname__ = "C"
    if as_record:
        return record(slots=slots)(cls)
    return dataclasses.dataclass(frozen=True, slots=slots)(cls)


def _build(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return cls(*args, **kwargs)
    except TypeError as exc:
        return TypeError(str(exc).split("(")[0] if "(" in str(exc) else "")


def _params(specs: list[tuple[str, bool, bool, bool]]) -> list[str]:
    return [f"f{i}" for i, (kind, _, _, init) in enumerate(specs) if init or kind == "none"]


def _compile_init(cls: type, params: list[str]) -> None:
    """Build ``cls`` until its ``__init__`` is the one compiled for it (``_COMPILE_AFTER``)."""
    while cls.__dict__["__init__"] is records._init:
        cls(**{name: 0 for name in params})


@given(st.lists(_field_specs, max_size=6).map(_ordered), st.booleans(), st.booleans(), st.data())
def test_a_record_behaves_as_the_frozen_dataclass_of_the_same_fields(
    specs: list[tuple[str, bool, bool, bool]], slots: bool, compiled: bool, data: st.DataObject
) -> None:
    ours = _declare(specs, as_record=True, slots=slots)
    theirs = _declare(specs, as_record=False, slots=slots)
    params = _params(specs)
    if compiled:  # the same promises hold once the class is hot
        _compile_init(ours, params)
    # Arguments that are mostly valid (some by position, some by keyword, defaults left
    # out) and sometimes not: one too many, a name twice, an unknown name.
    positional = data.draw(st.integers(0, len(params) + 1), label="positional")
    named = data.draw(
        st.lists(st.sampled_from([*params, "nope"]), max_size=3, unique=True), label="named"
    )
    values = iter(data.draw(st.lists(st.integers(0, 3), min_size=12, max_size=12)))
    args = tuple(next(values) for _ in range(positional))
    kwargs = {name: next(values) for name in named}

    mine, reference = _build(ours, args, kwargs), _build(theirs, args, kwargs)
    assert isinstance(mine, TypeError) == isinstance(reference, TypeError), (mine, reference)
    if isinstance(mine, TypeError):
        return
    names = [f"f{i}" for i in range(len(specs))]
    assert [getattr(mine, n) for n in names] == [getattr(reference, n) for n in names]
    assert repr(mine) == repr(reference)
    assert ours.__match_args__ == theirs.__match_args__ == tuple(_params(specs))
    assert [f.name for f in fields(ours)] == [f.name for f in dataclasses.fields(theirs)]

    # Equality and hashing: the same arguments give equal instances, whose hashes agree;
    # fields left out of comparison do not count.
    again = ours(*args, **kwargs)
    assert mine == again and hash(mine) == hash(again)
    assert mine != reference  # another class is never equal, as with dataclasses
    changes = {name: 99 for name in _params(specs)[:1]}
    changed, changed_reference = replace(mine, **changes), dataclasses.replace(reference, **changes)
    assert [getattr(changed, n) for n in names] == [getattr(changed_reference, n) for n in names]
    assert (changed == mine) == (changed_reference == reference)
    assert dataclasses.replace(mine, **changes) == changed  # dataclasses' helpers take it too
    assert dataclasses.asdict(mine) == dataclasses.asdict(reference)

    for name in [*names, "other"]:
        with pytest.raises(AttributeError):
            setattr(mine, name, 1)
        with pytest.raises(AttributeError):
            delattr(mine, name)
    globals()["C"] = ours  # pickle finds a class by its module and name
    for twin in (pickle.loads(pickle.dumps(mine)), copy.copy(mine), copy.deepcopy(mine)):
        assert type(twin) is ours and twin == mine
        assert [getattr(twin, n) for n in names] == [getattr(mine, n) for n in names]
    assert hasattr(mine, "__dict__") != slots


@pytest.mark.parametrize("compiled", [False, True])
def test_construction_errors_name_the_argument(compiled: bool) -> None:
    @record
    class Point:
        x: int
        y: int = 0

    if compiled:
        _compile_init(Point, ["x", "y"])
        assert Point.__init__.__qualname__.endswith("Point.__init__")
    assert Point(1) == Point(x=1, y=0) and Point(1, 2).y == 2
    for call, message in [
        (lambda: Point(), r"Point.__init__\(\) missing 1 required (positional )?argument: 'x'"),
        (lambda: Point(1, x=2), "multiple values for argument 'x'"),
        (lambda: Point(1, z=2), "unexpected keyword argument 'z'"),
        (lambda: Point(1, 2, 3), "takes (from 2 to )?3 positional arguments but 4 were given"),
    ]:
        with pytest.raises(TypeError, match=message):
            call()


def test_a_hot_class_gets_its_own_init_and_keeps_post_init_and_factories() -> None:
    checked: list[int] = []

    @record(slots=True)
    class Hot:
        a: int
        b: tuple[int, ...] = field(default_factory=tuple)
        c: list[int] = field(default_factory=list, init=False, compare=False)

        def __post_init__(self) -> None:
            checked.append(self.a)

    made = [Hot(i) for i in range(records._COMPILE_AFTER + 2)]
    assert Hot.__dict__["__init__"] is not records._init
    assert checked == list(range(records._COMPILE_AFTER + 2))
    assert made[-1] == Hot(records._COMPILE_AFTER + 1, ()) and made[-1].c == []
    assert made[-1].c is not made[-2].c  # a factory per instance, as before

    class Plain(Hot):  # not a record: it shares Hot's table and __init__
        pass

    assert Plain(5).a == 5


def test_declaration_errors_match_dataclasses() -> None:
    with pytest.raises(TypeError, match="non-default argument 'y' follows default argument"):

        @record
        class Backwards:
            x: int = 0
            y: int

    with pytest.raises(ValueError, match="mutable default"):

        @record
        class Shared:
            items: list[int] = []  # noqa: RUF012 - the mistake under test

    @dataclasses.dataclass(frozen=True)
    class Plain:
        x: int

    with pytest.raises(TypeError, match="cannot derive from a dataclass"):

        @record
        class Mixed(Plain):
            y: int = 0


def test_post_init_checks_every_construction_replace_included() -> None:
    @record(slots=True)
    class Positive:
        n: int
        twice: int = field(default=0, init=False)

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError("n must be positive")
            object.__setattr__(self, "twice", self.n * 2)

    value = Positive(3)
    assert value.twice == 6 and replace(value, n=4).twice == 8
    with pytest.raises(ValueError, match="positive"):
        replace(value, n=0)
    with pytest.raises(ValueError, match="init=False"):
        replace(value, twice=1)
    with pytest.raises(FrozenRecordError, match="cannot assign to field 'n'"):
        value.n = 5  # type: ignore[misc]


def test_class_variables_and_own_methods_are_kept() -> None:
    @record
    class Named:
        LIMIT: ClassVar[int] = 3
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

    assert [f.name for f in fields(Named)] == ["name"] and Named.LIMIT == 3
    assert repr(Named("a")) == "<a>"


def test_a_mutable_record_assigns_and_is_not_hashable() -> None:
    @record(frozen=False, slots=True)
    class Counter:
        seen: list[int] = field(default_factory=list)
        total: int = 0

    counter = Counter()
    counter.total += 2
    counter.seen.append(1)
    assert counter == Counter([1], 2) and Counter().seen == []
    with pytest.raises(TypeError, match="unhashable"):
        hash(counter)


def test_replace_takes_a_dataclass_and_dataclasses_helpers_take_a_record() -> None:
    @dataclasses.dataclass(frozen=True)
    class Plain:
        x: int

    @record(slots=True)
    class Rec:
        x: int
        tags: tuple[str, ...] = field(default_factory=tuple, compare=False)
        hidden: int = field(default=0, init=False, repr=False)

    assert replace(Plain(1), x=2) == Plain(2)
    with pytest.raises(TypeError):
        fields(Plain)
    with pytest.raises(TypeError):
        replace(Rec, x=1)
    # Code written for the frozen dataclasses these types were keeps working.
    value = Rec(1, ("a",))
    assert dataclasses.is_dataclass(value) and dataclasses.is_dataclass(Rec)
    assert [f.name for f in dataclasses.fields(Rec)] == ["x", "tags", "hidden"]
    assert [(f.init, f.repr, f.compare) for f in dataclasses.fields(value)] == [
        (True, True, True),
        (True, True, False),
        (False, False, True),
    ]
    assert dataclasses.replace(value, x=2) == Rec(2) and dataclasses.replace(value, x=2).tags == (
        "a",
    )
    assert dataclasses.asdict(value) == {"x": 1, "tags": ("a",), "hidden": 0}
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(value, hidden=1)


@pytest.mark.parametrize("slots", [False, True])
def test_inheritance_orders_and_overrides_fields_as_dataclasses_do(slots: bool) -> None:
    def declare(make: Any, make_field: Any) -> tuple[type, type]:
        base_ns: dict[str, Any] = {
            "__annotations__": {"kind": "str", "a": "int"},
            "__module__": __name__,
            "kind": "event",
            "a": 1,
        }
        base = make(type("Event", (), base_ns))
        derived_ns: dict[str, Any] = {
            "__annotations__": {"b": "str", "kind": "str", "c": "tuple[int, ...]"},
            "__module__": __name__,
            "b": "",
            "kind": "started",
            "c": make_field(default_factory=tuple, compare=False),
        }
        return base, make(type("Started", (base,), derived_ns))

    ours_base, ours = declare(record(slots=slots), field)
    theirs = declare(dataclasses.dataclass(frozen=True, slots=slots), dataclasses.field)[1]
    assert [f.name for f in fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    assert ours.__match_args__ == theirs.__match_args__ == ("kind", "a", "b", "c")
    for args, kwargs in [((), {}), (("x", 2), {"b": "y"}), ((), {"c": (1,)})]:
        mine, reference = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert repr(mine).replace("Started", "") == repr(reference).replace("Started", "")
        assert dataclasses.asdict(mine) == dataclasses.asdict(reference)
        assert isinstance(mine, ours_base) and mine == ours(*args, **kwargs)
        assert mine != ours_base() and replace(mine, a=5).a == 5
    assert ours().kind == "started" and ours_base().kind == "event"
    with pytest.raises(AttributeError):
        ours().b = "z"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="non-default argument 'd' follows default argument"):

        @record
        class Late(ours_base):  # type: ignore[valid-type,misc]
            d: int
