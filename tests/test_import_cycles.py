"""No import cycles among ``tether`` modules (issue 29).

The module graph is read from the source, not from ``sys.modules``: every ``import`` and
``from … import`` anywhere in a module counts — at top level, inside functions and under
``if TYPE_CHECKING:`` — because a type-only or deferred import is still a dependency
between the two modules, and a cycle of them is what makes the layers impossible to read
or to split. Resolution: relative imports against the module's package; ``from pkg import
name`` is an edge to the submodule ``pkg.name`` when there is one, else to ``pkg`` (its
``__init__``); ``import a.b.c`` is an edge to ``a.b.c``. Only edges between modules of the
scanned tree count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import tether

SRC = Path(tether.__file__).parent

ALLOWED_CYCLES: tuple[frozenset[str], ...] = ()
"""None: every module of tether can be read in an order in which nothing it imports comes
later (docs/architecture.md)."""


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the tree under ``root`` (the directory of ``package``), by name."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((package, *parts))] = path
    return names


def _targets(node: ast.AST, package: str, modules: Mapping[str, Path]) -> Iterable[str]:
    """The modules an import statement depends on (``package``: the importer's package)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:  # `import a.b.c` of a non-module c
                name = name.rpartition(".")[0]
            if name:
                yield name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            head = parts[: len(parts) - node.level + 1]
            base = ".".join([*head, base] if base else head)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in modules:
                yield submodule
            elif base in modules:
                yield base


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of the same tree it imports (anywhere in its source)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            for target in _targets(node, own_package, modules):
                if target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(frozenset(group))
    return found


def _describe(group: frozenset[str], graph: Mapping[str, set[str]]) -> str:
    edges = [f"    {a} -> {b}" for a in sorted(group) for b in sorted(graph[a] & group)]
    return f"  {len(group)} modules:\n" + "\n".join(edges)


def test_no_import_cycles_among_tether_modules() -> None:
    graph = import_graph(SRC, "tether")
    unexpected = [group for group in cycles(graph) if group not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles among tether modules:\n" + "\n".join(
        _describe(group, graph) for group in unexpected
    )


def test_the_checker_finds_a_planted_cycle(tmp_path: Path) -> None:
    """A cycle through a function-level import, a TYPE_CHECKING import and a relative one,
    beside a package-``__init__`` edge that closes a second cycle: both are found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub.c import C\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import d\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("import pkg.a\n")
    (pkg / "sub" / "c.py").write_text("from pkg import NAME\n\nclass C: ...\n")
    (pkg / "e.py").write_text("from pkg import a\n")  # imports into a cycle, is not in one

    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub.d"}
    assert graph["pkg.sub.c"] == {"pkg"}
    found = set(cycles(graph))
    assert found == {frozenset({"pkg.a", "pkg.b", "pkg.sub.d"}), frozenset({"pkg", "pkg.sub.c"})}


def test_the_checker_finds_no_cycle_in_a_tree_without_one(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("import os\n")
    assert cycles(import_graph(pkg, "pkg")) == []
