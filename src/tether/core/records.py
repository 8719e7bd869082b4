"""Records: frozen value types whose methods are shared, not compiled for each class.

Why this module exists: :mod:`dataclasses` writes each class's ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` as source text and compiles
it when the class is created, about 0.13 ms a method on CPython 3.11. The 48 value types a
process created before its first ``Agent(...)`` spent 37 ms there, more than the whole
start-up target (issue 31; ``bench/bench_resume.py``'s start-up figures), and importing
:mod:`dataclasses` loads :mod:`inspect` and the :mod:`ast` machinery with it. A record's
methods are the same few functions for every record class, reading the class's field table
(``__record__``), so creating a record class costs what creating a plain class does.

Rules of this module (``tests/test_records.py`` compares records with dataclasses of the
same declaration, field by field, under hypothesis):

1. **Declared like a frozen dataclass**, and read as one by type checkers
   (:func:`typing.dataclass_transform`): annotated names in order are the fields; a class
   attribute is a field's default; :func:`field` gives a ``default_factory`` or leaves a
   field out of ``__init__`` (set from its default), of ``repr`` or of comparison.
   ``ClassVar`` annotations are not fields. A field without a default after one with a
   default is a ``TypeError``, a mutable (unhashable) default a ``ValueError``, as in
   :mod:`dataclasses`.
2. **Behaves like** ``@dataclass(frozen=True)``: the ``__init__`` takes the fields by
   position or keyword and then calls ``__post_init__`` if the class has one; instances
   compare equal only to instances of the same class with equal compared fields, hash by
   those fields, and refuse assignment and deletion (:class:`FrozenRecordError`, an
   ``AttributeError``); ``repr`` is ``Name(field=value, ...)``; ``__match_args__`` lists
   the fields. ``frozen=False`` gives a mutable record (unhashable, like a dataclass with
   ``eq`` and without ``frozen``); ``slots=True`` gives ``__slots__`` as dataclasses does;
   ``eq=False`` keeps the class's own equality and hash (or object's). A method the class
   body defines itself is kept.
3. **The dataclasses helpers** have their counterparts here: :func:`replace` (which
   takes a dataclass instance too, so code holding both kinds calls one function) and
   :func:`fields`. ``dataclasses``' own (``replace``, ``fields``, ``asdict``,
   ``is_dataclass``) take a record too: its ``__dataclass_fields__`` is built on first
   use (importing :mod:`dataclasses` then), so code written for the frozen dataclasses
   these types were (``tether.lowlevel`` exports some) keeps working.
4. **Inheritance** as in dataclasses: a record may derive from records (not from a
   dataclass); the bases' fields come first, and a field declared again keeps its place
   and takes its new default. **Not supported**, because no record needs them: ordering,
   ``InitVar``, keyword-only fields.

The cost moved, not removed, is a generic ``__init__``: it binds arguments in a loop
instead of running generated code, several microseconds a construction. So a class built
:data:`_COMPILE_AFTER` times gets the ``__init__`` dataclasses would have written, compiled
then: a process compiles only the ``__init__`` of the classes it builds again and again (a
loop's plans and events), never at start-up. Records are for value types built a few times
a run or a step (settings, configuration, composition, tool declarations, plans, evidence,
progress events); the reducer's per-fact state types stay dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["Field", "FrozenRecordError", "field", "fields", "record", "replace"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class _Missing:
    """The type of :data:`MISSING`: no default given."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenRecordError(AttributeError):
    """Assignment to, or deletion of, an attribute of a frozen record."""


class Field:
    """One field of a record: its name, default or default factory, whether ``__init__``
    takes it, and whether it is shown by ``repr`` and used by comparison and hashing."""

    __slots__ = ("compare", "default", "default_factory", "init", "name", "repr")

    def __init__(
        self,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        compare: bool = True,
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r})"


@overload
def field(*, default: _T, init: bool = ..., repr: bool = ..., compare: bool = ...) -> _T: ...
@overload
def field(
    *, default_factory: Callable[[], _T], init: bool = ..., repr: bool = ..., compare: bool = ...
) -> _T: ...
@overload
def field(*, init: bool = ..., repr: bool = ..., compare: bool = ...) -> Any: ...
def field(
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field's options, as :func:`dataclasses.field` takes them."""
    return Field(default, default_factory, init, repr, compare)


class _Spec:
    """What a record class's shared methods read: its field table, precomputed."""

    __slots__ = (
        "accepted",
        "built",
        "compared",
        "fields",
        "hidden",
        "index",
        "names",
        "optional",
        "owner",
        "params",
        "post_init",
        "shown",
        "std_fields",
    )

    owner: type
    fields: tuple[Field, ...]
    names: tuple[str, ...]
    index: frozenset[str]
    params: tuple[str, ...]
    accepted: frozenset[str]
    optional: tuple[tuple[str, Any, Callable[[], Any] | None], ...]
    hidden: tuple[tuple[str, Any, Callable[[], Any] | None], ...]
    shown: tuple[str, ...]
    compared: Callable[[Any], tuple[Any, ...]]
    post_init: bool
    std_fields: dict[str, Any] | None
    built: int

    def __init__(self, cls: type, table: tuple[Field, ...]) -> None:
        self.owner = cls
        self.fields = table
        self.names = tuple(f.name for f in table)
        self.index = frozenset(self.names)
        self.params = tuple(f.name for f in table if f.init)  # what __init__ takes, in order
        self.accepted = frozenset(self.params)
        # (name, default, factory): the parameters that may be left out, and the fields
        # __init__ does not take (each set from its default)
        self.optional = tuple(_default_of(f) for f in table if f.init and _has_default(f))
        self.hidden = tuple(_default_of(f) for f in table if not f.init)
        compared = tuple(f.name for f in table if f.compare)
        # a getter giving a tuple whatever the count, so equality and hashing are one call
        self.compared = (
            attrgetter(*compared)
            if len(compared) > 1
            else _one_field(compared[0])
            if compared
            else _no_fields
        )
        self.shown = tuple(f.name for f in table if f.repr)
        self.post_init = hasattr(cls, "__post_init__")
        self.std_fields = None
        self.built = 0  # instances made by the shared __init__ (see _COMPILE_AFTER)


def _has_default(f: Field) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _default_of(f: Field) -> tuple[str, Any, Callable[[], Any] | None]:
    return f.name, f.default, None if f.default_factory is MISSING else f.default_factory


def _one_field(name: str) -> Callable[[Any], tuple[Any, ...]]:
    def compared(obj: Any) -> tuple[Any, ...]:
        return (getattr(obj, name),)

    return compared


def _no_fields(_: object) -> tuple[Any, ...]:
    return ()


_set = object.__setattr__
_super: Any = super  # mypy reads super()'s first argument as needing a literal class


_COMPILE_AFTER = 16
"""Instances of one record class after which its ``__init__`` is compiled for it.

A class built a few times a process (most records: settings, configuration, declarations)
keeps the shared ``__init__``, which costs nothing to set up; a class built again and again
(a plan or an event each step) gets the ``__init__`` dataclasses would have written, which
binds its arguments in about a fifth of the time. Compiling costs ~0.1 ms, paid once."""


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = self.__record__
    spec.built += 1
    if spec.built >= _COMPILE_AFTER:  # not ==: two threads may count past it together
        _install_compiled_init(spec)
    params = spec.params
    if len(args) > len(params):
        raise TypeError(
            f"{spec.owner.__qualname__}.__init__() takes {len(params) + 1} positional "
            f"arguments but {len(args) + 1} were given"
        )
    values = dict(zip(params, args, strict=False))  # fewer arguments than fields is usual
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(
                f"{spec.owner.__qualname__}.__init__() got multiple values for argument {key!r}"
            )
        if key not in spec.accepted:
            raise TypeError(
                f"{spec.owner.__qualname__}.__init__() got an unexpected keyword argument {key!r}"
            )
        values[key] = value
    if len(values) < len(params):
        for name, default, factory in spec.optional:
            if name not in values:
                values[name] = default if factory is None else factory()
        if len(values) < len(params):
            missing = [name for name in params if name not in values]
            listed = ", ".join(repr(name) for name in missing)
            raise TypeError(
                f"{spec.owner.__qualname__}.__init__() missing {len(missing)} required "
                f"argument{'s' if len(missing) > 1 else ''}: {listed}"
            )
    for name, default, factory in spec.hidden:
        values[name] = default if factory is None else factory()
    for name in spec.names:  # in field order, whatever order the keywords came in
        _set(self, name, values[name])
    if spec.post_init:
        self.__post_init__()


def _install_compiled_init(spec: _Spec) -> None:
    """Give ``spec``'s class an ``__init__`` made for its fields (rule 2 holds for both)."""
    owner = spec.owner
    if owner.__dict__.get("__init__") is not _init:
        return  # a class that wrote its own, or a plain subclass sharing its base's table
    scope: dict[str, Any] = {"_set": _set, "_MISSING": MISSING}
    params: list[str] = []
    body: list[str] = []
    for index, f in enumerate(spec.fields):
        name = f.name
        if f.init:
            if f.default_factory is not MISSING:
                scope[f"_factory{index}"] = f.default_factory
                params.append(f"{name}=_MISSING")
                body.append(
                    f"_set(self, {name!r}, _factory{index}() if {name} is _MISSING else {name})"
                )
                continue
            if f.default is not MISSING:
                scope[f"_default{index}"] = f.default
                params.append(f"{name}=_default{index}")
            else:
                params.append(name)
            body.append(f"_set(self, {name!r}, {name})")
        elif f.default_factory is not MISSING:
            scope[f"_factory{index}"] = f.default_factory
            body.append(f"_set(self, {name!r}, _factory{index}())")
        else:
            scope[f"_default{index}"] = f.default
            body.append(f"_set(self, {name!r}, _default{index})")
    if spec.post_init:
        body.append("self.__post_init__()")
    source = "def __init__(self{}):\n    {}\n".format(
        "".join(", " + p for p in params), "\n    ".join(body or ["pass"])
    )
    exec(source, scope)  # the text is made of field names only, as dataclasses does
    made = scope["__init__"]
    made.__qualname__ = f"{owner.__qualname__}.__init__"
    made.__module__ = owner.__module__
    owner.__init__ = made  # type: ignore[misc]


def _repr(self: Any) -> str:
    spec: _Spec = self.__record__
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in spec.shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    compared = self.__record__.compared
    return compared(self) == compared(other)


def _hash(self: Any) -> int:
    return hash(self.__record__.compared(self))


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    spec: _Spec = self.__record__
    if type(self) is spec.owner or name in spec.index:
        raise FrozenRecordError(f"cannot assign to field {name!r}")
    _super(spec.owner, self).__setattr__(name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    spec: _Spec = self.__record__
    if type(self) is spec.owner or name in spec.index:
        raise FrozenRecordError(f"cannot delete field {name!r}")
    _super(spec.owner, self).__delattr__(name)


def _getstate(self: Any) -> list[Any]:
    # A slotted frozen record has no __dict__ for pickle and copy to restore, and its
    # __setattr__ refuses them: state goes through these two, as dataclasses does it.
    return [getattr(self, name) for name in self.__record__.names]


def _setstate(self: Any, state: list[Any]) -> None:
    for name, value in zip(self.__record__.names, state, strict=True):
        _set(self, name, value)


class _DataclassFields:
    """A record's ``__dataclass_fields__``: :class:`dataclasses.Field` objects made from its
    field table when first asked for, so :mod:`dataclasses`' helpers take a record as the
    frozen dataclass it is declared as (rule 3); nothing imports :mod:`dataclasses` before."""

    def __get__(self, instance: object, owner: type) -> dict[str, Any]:
        spec: _Spec = owner.__record__  # type: ignore[attr-defined]
        if spec.std_fields is None:
            import dataclasses

            kind = getattr(dataclasses, "_FIELD", None)  # how dataclasses marks a field
            annotations = spec.owner.__dict__.get("__annotations__", {})  # noqa: RUF063
            table: dict[str, Any] = {}
            for f in spec.fields:
                made: Any = dataclasses.field(
                    default=f.default if f.default is not MISSING else dataclasses.MISSING,
                    default_factory=(
                        f.default_factory
                        if f.default_factory is not MISSING
                        else dataclasses.MISSING
                    ),
                    init=f.init,
                    repr=f.repr,
                    compare=f.compare,
                )
                made.name, made.type, made._field_type = f.name, annotations.get(f.name), kind
                table[f.name] = made
            spec.std_fields = table
        return spec.std_fields


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):  # ``from __future__ import annotations``
        head = annotation.split("[", 1)[0].strip()
        return head in ("ClassVar", "typing.ClassVar")
    origin = getattr(annotation, "__origin__", annotation)
    return getattr(origin, "_name", None) == "ClassVar"


def _field_table(cls: type) -> tuple[Field, ...]:
    # As dataclasses: the fields of the record bases first (the furthest base first), then
    # the class's own; a field declared again keeps its place and takes the new options.
    table: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        spec = base.__dict__.get("__record__")
        if isinstance(spec, _Spec):
            table.update((f.name, f) for f in spec.fields)
        elif "__dataclass_fields__" in base.__dict__:
            raise TypeError(f"{cls.__qualname__}: a record cannot derive from a dataclass")
    # the class's own annotations; inspect.get_annotations would import inspect, which is
    # what this module avoids
    own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
    for name, annotation in own.items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        spec = value if isinstance(value, Field) else Field(default=value)
        spec.name = name
        default = spec.default
        if default is not MISSING and type(default).__hash__ is None:
            raise ValueError(
                f"mutable default {type(default)} for field {name} is not allowed: "
                "use default_factory"
            )
        table[name] = spec
    seen_default = False
    for spec in table.values():
        if not spec.init:
            continue  # not a parameter: its place among the defaults does not matter
        if spec.default is MISSING and spec.default_factory is MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {spec.name!r} follows default argument")
        else:
            seen_default = True
    return tuple(table.values())


_SHARED: dict[str, Any] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}


def _process(cls: type[_R], *, frozen: bool, slots: bool, eq: bool) -> type[_R]:
    table = _field_table(cls)
    own = cls.__dict__
    shared = _SHARED if eq else {"__init__": _init, "__repr__": _repr}
    methods = {name: fn for name, fn in shared.items() if name not in own}
    # dataclasses' hash table: a class that defines __eq__ and no __hash__ gets a None
    # __hash__ from Python itself; that is not "defines its own"
    explicit_hash = own.get("__hash__", MISSING) not in (MISSING, None)
    if eq and not explicit_hash:
        methods["__hash__"] = _hash if frozen else None
    if frozen:
        methods["__setattr__"] = _frozen_setattr
        methods["__delattr__"] = _frozen_delattr
    methods["__match_args__"] = tuple(f.name for f in table if f.init)
    methods["__dataclass_fields__"] = _DataclassFields()
    if slots:
        body = {key: value for key, value in own.items() if key not in ("__dict__", "__weakref__")}
        for spec in table:
            body.pop(spec.name, None)
        inherited = {
            name for base in cls.__mro__[1:] for name in base.__dict__.get("__slots__", ())
        }
        body["__slots__"] = tuple(f.name for f in table if f.name not in inherited)
        if frozen:
            methods["__getstate__"] = _getstate
            methods["__setstate__"] = _setstate
        body.update(methods)
        metaclass: Any = type(cls)
        made: type[_R] = metaclass(cls.__name__, cls.__bases__, body)
        made.__qualname__ = cls.__qualname__
    else:
        made = cls
        for name, value in methods.items():
            setattr(made, name, value)
        for spec in table:  # as dataclasses: a default stays the class attribute
            if isinstance(own.get(spec.name), Field):  # a plain default is in place already
                if spec.default is MISSING:
                    delattr(made, spec.name)
                else:
                    setattr(made, spec.name, spec.default)
    made.__record__ = _Spec(made, table)  # type: ignore[attr-defined]
    return made


@overload
def record(cls: type[_R], /) -> type[_R]: ...
@overload
def record(
    *, frozen: bool = True, slots: bool = False, eq: bool = True
) -> Callable[[type[_R]], type[_R]]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(
    cls: type[_R] | None = None, /, *, frozen: bool = True, slots: bool = False, eq: bool = True
) -> type[_R] | Callable[[type[_R]], type[_R]]:
    """Make ``cls`` a record (see the module's rules): ``@record`` or
    ``@record(slots=True)``, ``@record(frozen=False)`` for a mutable one, ``eq=False`` to
    keep the class's own (or object's) equality and hash."""

    def wrap(target: type[_R]) -> type[_R]:
        return _process(target, frozen=frozen, slots=slots, eq=eq)

    return wrap if cls is None else wrap(cls)


def _spec_of(obj: object) -> _Spec | None:
    spec = getattr(obj, "__record__", None)
    return spec if isinstance(spec, _Spec) else None


def fields(class_or_instance: object) -> tuple[Field, ...]:
    """The fields of a record class or instance, in declaration order."""
    spec = _spec_of(class_or_instance)
    if spec is None:
        raise TypeError(f"{class_or_instance!r} is not a record or a record class")
    return spec.fields


def replace(obj: _R, /, **changes: Any) -> _R:
    """A copy of ``obj`` with ``changes``, built through ``__init__`` (so ``__post_init__``
    checks it again), as :func:`dataclasses.replace`; a dataclass instance is handed to
    that, so code holding both kinds calls one function."""
    spec = _spec_of(obj)
    if spec is None or isinstance(obj, type):
        import dataclasses  # only where a dataclass is handed in

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    for name in spec.params:
        if name not in changes:
            changes[name] = getattr(obj, name)
    for name in spec.index.difference(spec.accepted).intersection(changes):
        raise ValueError(f"field {name} is declared with init=False, it cannot be replaced")
    made: _R = type(obj)(**changes)
    return made
