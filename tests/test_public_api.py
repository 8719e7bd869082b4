"""The public API: exactly these names, each importable, and ``import tether`` stays light.

Changing the public surface is a decision: it changes this list, the README and the
changelog together (trio's test of exported names is the model).
"""

from __future__ import annotations

import subprocess
import sys

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
    from tether._runtime.agent import Agent
    from tether._loading import reduce_session
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
