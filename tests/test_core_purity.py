"""``tether.core`` stays pure: the import rule of ``tether/core/__init__.py``, checked.

Two checks, from two sides:

* statically, the syntax tree of every module of ``tether.core`` (and of
  ``tether.errors``, which the core may import and which must therefore be pure too) is
  walked: an import of a module that reaches the clock, the environment, the disk,
  randomness, processes, threads, signals, sockets or databases, or of any tether module
  outside the core, fails — relative imports, imports inside functions and imports through
  ``importlib``/``__import__`` included;
* dynamically, a fresh interpreter imports ``tether.core`` and must not have loaded a
  database driver, process, socket or thread module, ``jsonschema`` or any tether module
  outside the core (``orjson``, a pure third-party parser, is allowed: it brings
  ``datetime`` and ``uuid`` along for its own serializers, which is why those are checked
  statically only).

The checker itself is tested on small sources, so that a walk that silently saw nothing
cannot pass.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.core
import tether.errors

FORBIDDEN_MODULES = frozenset(
    {
        "os",
        "time",
        "random",
        "subprocess",
        "sqlite3",
        "socket",
        "pathlib",
        "threading",
        "signal",
        "tempfile",
        "uuid",
        "datetime",
        "gc",
        # The doors to everything above, by name at run time.
        "importlib",
    }
)
"""Top-level names of the modules the core never imports (``os.path`` is ``os``)."""

ALLOWED_TETHER = ("tether.core", "tether.errors")
"""The tether modules the core may import: its own, and the one error hierarchy."""

CORE_DIR = Path(tether.core.__file__).parent
ERRORS_FILE = Path(tether.errors.__file__)


def _modules() -> list[tuple[str, Path]]:
    """``(dotted name, file)`` of every module of ``tether.core`` and of ``tether.errors``."""
    found: list[tuple[str, Path]] = []
    for path in sorted(CORE_DIR.rglob("*.py")):
        parts = path.relative_to(CORE_DIR).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(("tether", "core", *parts)), path))
    found.append(("tether.errors", ERRORS_FILE))
    return found


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of ``from <node.module> import …`` inside ``package``."""
    if node.level == 0:
        return node.module or ""
    base = package.split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _is_tether(name: str) -> bool:
    return name == "tether" or name.startswith("tether.")


def _allowed_tether(name: str) -> bool:
    return any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED_TETHER)


def _imported(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``tree``, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, package)
            yield node.lineno, source
            if _is_tether(source):
                # ``from tether import _faults`` imports the module tether._faults.
                for alias in node.names:
                    yield node.lineno, f"{source}.{alias.name}"


def _dynamic_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Calls of ``__import__`` or ``import_module`` (however they were reached)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in ("__import__", "import_module"):
            yield node.lineno, f"{name}(...)"


def violations(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """What in ``source`` (the text of ``module``) breaks the core's import rule."""
    tree = ast.parse(source)
    package = _package_of(module, is_package)
    found: list[str] = []
    for line, name in _imported(tree, package):
        top = name.partition(".")[0]
        if top in FORBIDDEN_MODULES:
            found.append(f"{module}:{line}: imports {name}")
        elif _is_tether(name) and name != "tether" and not _allowed_tether(name):
            found.append(f"{module}:{line}: imports {name}, a tether module outside the core")
    for line, call in _dynamic_imports(tree):
        found.append(f"{module}:{line}: imports at run time with {call}")
    return found


# =========================================================================== the checker


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import os", "tether.core.x", False),
        ("import os.path as p", "tether.core.x", False),
        ("from pathlib import Path", "tether.core.x", False),
        ("def f():\n    import time\n", "tether.core.x", False),
        ("from datetime import UTC", "tether.core.x", False),
        ("import gc", "tether.core.x", False),
        ("import tether._faults", "tether.core.x", False),
        ("from tether import _faults", "tether.core.x", False),
        ("from tether._tools.base import ToolResult", "tether.core.x", False),
        ("from .. import _ids", "tether.core.x", False),
        ("from .._wsdb import sqlite", "tether.core.x", False),
        ("from . import _loading", "tether.errors", False),
        ("from .. import _stores", "tether.core", True),
        ("__import__('time')", "tether.core.x", False),
        ("import importlib", "tether.core.x", False),
        ("loader.import_module('sqlite3')", "tether.core.x", False),
    ],
)
def test_the_checker_finds_every_kind_of_forbidden_import(
    source: str, module: str, is_package: bool
) -> None:
    assert violations(source, module, is_package=is_package)


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("from tether.core import facts", "tether.core.x", False),
        ("from . import facts\nfrom .state import Usage", "tether.core.x", False),
        ("from .facts import HEADER", "tether.core", True),
        ("from tether.errors import SessionCorruption", "tether.core.x", False),
        ("from .. import errors", "tether.core.x", False),
        ("import hashlib, json, math, re\nimport orjson", "tether.core.x", False),
        ("from collections.abc import Mapping\nfrom types import MappingProxyType", "m", False),
        ("from __future__ import annotations", "tether.core.x", False),
    ],
)
def test_the_checker_accepts_the_allowed_imports(
    source: str, module: str, is_package: bool
) -> None:
    assert violations(source, module, is_package=is_package) == []


def test_the_walk_sees_every_module_of_the_core() -> None:
    names = {name for name, _ in _modules()}
    for expected in (
        "tether.core",
        "tether.core.reducer",
        "tether.core.planner",
        "tether.core.plans",
        "tether.core.current",
        "tether.core.arguments",
        "tether.core.reconcile",
        "tether.core.values",
        "tether.core.gate",
        "tether.core.policy",
        "tether.errors",
    ):
        assert expected in names


# =========================================================================== the rule


@pytest.mark.parametrize(("module", "path"), _modules(), ids=lambda value: str(value))
def test_core_module_imports_nothing_impure(module: str, path: Path) -> None:
    found = violations(
        path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py"
    )
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("every_module", [False, True], ids=["package", "every module"])
def test_importing_the_core_loads_no_impure_module(every_module: bool) -> None:
    # A fresh interpreter: this test process has long loaded everything. Importing every
    # module matters: before the core was pure, ``import tether.core`` alone looked fine
    # while ``tether.core.configuration`` loaded jsonschema, subprocess and threading
    # (through the tool registry) and ``tether.core.gate`` sqlite3 and signal.
    # The package loads its names on first use (PEP 562): each is looked up too.
    names = [name for name, _ in _modules()] if every_module else ["tether.core"]
    script = (
        "import importlib, json, sys\n"
        "before = set(sys.modules)\n"
        f"for name in {names!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    for attr in getattr(module, '__all__', ()):\n"
        "        getattr(module, attr)\n"
        "print(json.dumps({'before': sorted(before), 'after': sorted(sys.modules)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(done.stdout)
    after = set(loaded["after"])
    new = after - set(loaded["before"])
    for name in ("sqlite3", "subprocess", "socket", "threading", "signal", "jsonschema"):
        assert name not in after, f"import tether.core loaded {name}"
    outside = sorted(n for n in new if _is_tether(n) and n != "tether" and not _allowed_tether(n))
    assert outside == [], f"import tether.core loaded shell modules: {outside}"
    assert "tether.core.reducer" in new  # the import did happen in that interpreter
