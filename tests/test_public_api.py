"""The public API: exactly these names, each importable, and ``import tether`` stays light.

Changing the public surface is a decision: it changes this list, the README and the
changelog together (trio's test of exported names is the model).
"""

from __future__ import annotations

import subprocess
import sys

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


# ---------------------------------------------------------------- the two other namespaces

LOWLEVEL = [
    "MAX_SAFE_INTEGER",
    "Durability",
    "EffectsDB",
    "FileSessions",
    "MemorySessions",
    "MemoryWorkspace",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "Observations",
    "PendingTransaction",
    "Plan",
    "RecoveryKind",
    "Reducer",
    "SessionOpener",
    "SessionStore",
    "SessionStoreProtocol",
    "ToolContext",
    "ToolDeclaration",
    "ToolRegistry",
    "WorkspaceDB",
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
