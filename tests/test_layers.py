"""docs/architecture.md's layers hold: each package imports only the packages above it.

The order is :data:`LAYERS`; the doc's table must list exactly it. Every import of every
module under ``src/tether`` counts — at the top level, inside a function, under
``TYPE_CHECKING`` — as ``tests/test_import_cycles.py`` reads them."""

from __future__ import annotations

import re
from pathlib import Path

import tether
from test_import_cycles import import_graph

SRC = Path(tether.__file__).parent
DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"

LAYERS = (
    "tether.errors",
    "tether.core",
    "tether._text",
    "tether._hub",
    "tether._clock",
    "tether._ids",
    "tether._dirs",
    "tether._faults",
    "tether._inputs",
    "tether._loading",
    "tether._credentials",
    "tether._procs",
    "tether._sandbox",
    "tether._models",
    "tether._stores",
    "tether._wsdb",
    "tether._tools",
    "tether._effects",
    "tether._mcp",
    "tether._telemetry",
    "tether._project",
    "tether._completion",
    "tether._settings",
    "tether._show",
    "tether._runtime",
    "tether",
    "tether.lowlevel",
    "tether.testing",
    "tether._cli",
    "tether.__main__",
)
"""Lowest first: a package may import itself and the packages before it."""


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the package ``module`` belongs to."""
    parts = module.split(".")
    package = ".".join(parts[:2]) if len(parts) > 1 else parts[0]
    return LAYERS.index(package)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a later (higher) layer than its own."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )


def test_every_module_belongs_to_a_layer() -> None:
    graph = import_graph(SRC, "tether")
    for module in graph:
        layer_of(module)  # ValueError names a package the table lacks


def test_no_package_imports_a_layer_above_it() -> None:
    assert upward_imports(import_graph(SRC, "tether")) == []


def test_the_check_finds_an_upward_import() -> None:
    """So the test above cannot pass for want of looking: the core importing the runtime
    and the stores importing the CLI are caught."""
    planted = {
        "tether.core.reducer": {"tether._runtime.executor", "tether.errors"},
        "tether._stores.file": {"tether._cli.common", "tether._models.base"},
    }
    assert upward_imports(planted) == [
        "tether._stores.file imports tether._cli.common",
        "tether.core.reducer imports tether._runtime.executor",
    ]


def test_the_architecture_doc_lists_the_layers_in_this_order() -> None:
    text = DOC.read_text()
    section = text.split("**Which package may import which.**", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([a-z_.]+)` \|", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
    assert tuple(name for _, name in rows) == LAYERS
