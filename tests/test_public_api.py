"""The public API: exactly these names, each importable, and ``import tether`` stays light.

Changing the public surface is a decision: it changes this list, the README and the
changelog together (trio's test of exported names is the model).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest

import tether

PUBLIC = [
    "Agent",
    "CurrentConfiguration",
    "EffectTool",
    "LookupResult",
    "RunResult",
    "RunStatus",
    "SessionCorruption",
    "SessionState",
    "TetherError",
    "Tool",
    "ToolResult",
    "builtin_tools",
    "load_model",
    "plan_recovery",
    "reduce_session",
    "tool",
]


def test_the_exported_names_are_pinned() -> None:
    assert tether.__all__ == PUBLIC
    assert sorted(tether._EXPORTS) == PUBLIC
    assert sorted(n for n in dir(tether) if not n.startswith("_")) == PUBLIC


def test_every_exported_name_resolves_to_its_object() -> None:
    from tether._loading import reduce_session
    from tether._runtime.agent import Agent
    from tether.errors import TetherError

    for name in PUBLIC:
        assert getattr(tether, name) is not None, name
    assert tether.Agent is Agent
    assert tether.reduce_session is reduce_session
    assert issubclass(tether.SessionCorruption, TetherError)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tether.SessionStore  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "SessionStore" in str(exc)
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("tether.SessionStore should not exist")


def test_import_tether_loads_no_runtime() -> None:
    # Names load on first use: `import tether` pulls in neither the agent runtime nor the
    # model SDKs nor the databases.
    code = (
        "import sys, tether\n"
        "heavy = [m for m in ('openai', 'sqlite3', 'subprocess', 'tether._runtime') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_the_readme_example_imports_work() -> None:
    from tether import Agent, EffectTool, LookupResult, ToolResult, load_model, tool

    assert callable(load_model) and callable(tool)
    assert issubclass(EffectTool, tether.Tool)
    assert LookupResult.not_found().status.value == "notFound"
    assert ToolResult("x").content == "x"
    assert Agent.__name__ == "Agent"


def test_every_public_name_reports_tether_as_its_module() -> None:
    # trio's rule: where a public name is defined is private; it says where to import it
    # from. Its qualified name stays what it is.
    for name in PUBLIC:
        value = getattr(tether, name)
        assert value.__module__ == "tether", name
        assert value.__qualname__ == name, name


def test_the_module_is_rewritten_when_a_name_is_first_loaded() -> None:
    code = (
        "import tether._runtime.results as r, tether\n"
        "before = r.RunResult.__module__\n"
        "tether.RunResult\n"
        "import typing; typing.get_type_hints(r.RunResult)\n"
        "print(before, r.RunResult.__module__, r.RunResult.__qualname__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["tether._runtime.results", "tether", "RunResult"]


def _public_objects() -> dict[int, str]:
    """``id`` → dotted name of everything reachable from the three public namespaces."""
    import tether.lowlevel as lowlevel
    import tether.testing as testing

    reachable = {}
    for namespace in (tether, lowlevel, testing):
        for name in namespace.__all__:
            reachable[id(getattr(namespace, name))] = f"{namespace.__name__}.{name}"
    return reachable


def _named_types(hint: Any) -> Iterator[type]:
    """Every class ``hint`` names: ``Sequence[Tool] | None`` → Sequence, Tool, NoneType."""
    if isinstance(hint, (list, tuple)):  # the parameters of a Callable
        for item in hint:
            yield from _named_types(item)
    elif typing.get_origin(hint) is not None:
        origin = typing.get_origin(hint)
        if isinstance(origin, type):
            yield origin
        for arg in typing.get_args(hint):
            yield from _named_types(arg)
    elif isinstance(hint, type):
        yield hint


def _signatures(value: Any) -> Iterator[tuple[str, Any]]:
    """``(where, function or class)`` for a public name's annotated surfaces: a function;
    a class's own annotations, its constructor and its public methods (inherited ones
    included)."""
    if isinstance(value, types.FunctionType):
        yield value.__qualname__, value
        return
    if not isinstance(value, type) or issubclass(value, BaseException):
        return
    yield value.__qualname__, value
    for attr in sorted(dir(value)):
        if attr.startswith("_") and attr != "__init__":
            continue
        member = inspect.getattr_static(value, attr)
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if isinstance(member, types.FunctionType):
            yield f"{value.__qualname__}.{attr}", member


def test_public_signatures_name_only_public_types() -> None:
    reachable = _public_objects()
    private = []
    walked = 0
    for name in PUBLIC:
        value = getattr(tether, name)
        if callable(value) and not isinstance(value, type):
            inspect.signature(value)  # a public function has a signature
        for where, surface in _signatures(value):
            walked += 1
            for hint in typing.get_type_hints(surface).values():
                for named in _named_types(hint):
                    module = named.__module__
                    if module.startswith("tether._") and id(named) not in reachable:
                        private.append(f"{where}: {module}.{named.__qualname__}")
    assert walked > 40  # the walk saw the methods, not only the names
    assert sorted(set(private)) == []


def test_the_signature_walk_finds_a_private_type() -> None:
    from tether._tools.base import ValidatedCall

    def leaky(call: ValidatedCall | None, n: int) -> list[dict[str, ValidatedCall]]:
        raise NotImplementedError

    hints = typing.get_type_hints(leaky, localns={"ValidatedCall": ValidatedCall})
    named = {t for hint in hints.values() for t in _named_types(hint)}
    assert ValidatedCall in named and id(ValidatedCall) not in _public_objects()


# ---------------------------------------------------------------- the two other namespaces

LOWLEVEL = [
    "MAX_SAFE_INTEGER",
    "AgentOptions",
    "AuthorizationRequest",
    "BudgetConfig",
    "Clock",
    "Composition",
    "Durability",
    "EffectsDB",
    "Event",
    "FileSessions",
    "FunctionTool",
    "Masker",
    "MemorySessions",
    "MemoryWorkspace",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "Observations",
    "PendingTransaction",
    "Plan",
    "ProjectConfig",
    "ProtectedState",
    "RecoveryKind",
    "Reducer",
    "SessionOpener",
    "SessionStore",
    "SessionStoreProtocol",
    "Settings",
    "ToolContext",
    "ToolDeclaration",
    "ToolRegistry",
    "WorkspaceDB",
    "WorkspaceDBOpener",
    "arguments_digest",
    "canonical_json",
    "configuration_digest",
    "facts",
    "load_reducer",
    "tool_definition_digest",
]

TESTING = [
    "BUILTIN_SCENARIOS",
    "CRASH_EXIT_CODE",
    "LabOptions",
    "LabResult",
    "Publication",
    "PublishReportTool",
    "ReportLedger",
    "ScriptedModel",
    "crash_boundaries",
    "register_boundary",
    "run_lab",
    "summary_line",
]


def test_the_lowlevel_names_are_pinned_and_resolve() -> None:
    import tether.lowlevel as lowlevel
    from tether._stores.file import SessionStore
    from tether._stores.memory import MemorySessions
    from tether.core import facts
    from tether.core.reducer import Reducer

    assert lowlevel.__all__ == LOWLEVEL
    assert sorted(lowlevel._EXPORTS) == sorted(LOWLEVEL)
    for name in LOWLEVEL:
        assert getattr(lowlevel, name) is not None, name
    assert lowlevel.Reducer is Reducer
    assert lowlevel.facts is facts
    assert lowlevel.SessionStore is SessionStore
    assert lowlevel.MemorySessions is MemorySessions
    assert sorted(n for n in dir(lowlevel) if not n.startswith("_")) == sorted(LOWLEVEL)
    with pytest.raises(AttributeError, match="Agent"):
        lowlevel.Agent  # noqa: B018


def test_the_testing_names_are_pinned_and_resolve() -> None:
    import tether.testing as testing
    from tether._faults import register
    from tether.testing.ledger import ReportLedger
    from tether.testing.scripted import ScriptedModel

    assert testing.__all__ == TESTING
    assert sorted(testing._EXPORTS) == sorted(TESTING)
    for name in TESTING:
        assert getattr(testing, name) is not None, name
    assert testing.ScriptedModel is ScriptedModel
    assert testing.ReportLedger is ReportLedger
    assert testing.register_boundary is register
    assert "before_effect" in testing.crash_boundaries()
    with pytest.raises(AttributeError, match="Reducer"):
        testing.Reducer  # noqa: B018


def test_import_lowlevel_and_testing_load_nothing_until_used() -> None:
    code = (
        "import sys, tether.lowlevel, tether.testing\n"
        "heavy = [m for m in ('openai', 'sqlite3', 'subprocess', 'tether._runtime', "
        "'tether._stores.file') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
