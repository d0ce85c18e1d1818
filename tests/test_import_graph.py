"""Imports run one way: the module graph of ``dataproto/``, ``stages/`` and ``flows/`` has no circles
where the layering says there must be none.

The graph is read from the source with :mod:`ast`, never by importing: every ``import`` and
``from … import`` counts, at module level and inside functions or methods alike (an import moved
into a function still ties the two modules together), except those under ``if TYPE_CHECKING:``
(annotations only, never executed). Relative imports are resolved against the importing module's
package, and ``from package import name`` points at the submodule ``package.name`` when that is a
module file, else at the package (its ``__init__.py``). Importing ``a.b.c`` runs ``a/__init__.py``
and ``a/b/__init__.py`` as well; those implicit parent-package edges are not drawn, so a package
that re-exports its submodules does not make every sibling import a circle.

Rules:

- ``stages/config`` and ``stages/algos`` together hold no import cycle, and the edges between the
  two folders all run one way: config validates names against the algos registries and builds the
  settings the math reads, so ``stages.config`` → ``stages.algos``, never back.
- the modules under ``flows/`` hold no cycle that goes through ``flows`` modules only.

A failure names the cycle's modules in order (``a → b → c → a``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = ("dataproto", "stages", "flows")
CONFIG, ALGOS = "stages.config", "stages.algos"

Graph = Mapping[str, set[str]]


# --- the module graph ---------------------------------------------------------------------------


def module_files(root: Path = REPO, packages: Iterable[str] = SOURCE_PACKAGES) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``packages`` (``a/__init__.py`` is ``a``)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except the bodies of ``if TYPE_CHECKING:``
    (their ``else:`` branches run, so they are kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from … import`` reads from (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The modules among ``known`` that ``module`` (whose code is ``source``) imports.

    ``import a.b`` → ``a.b``; ``from a import b`` → ``a.b`` when that is a known module, else
    ``a``; relative imports are resolved first. Names outside ``known`` (third-party, stdlib) are
    dropped, as is an import of the module itself.
    """
    known = set(known)
    found: set[str] = set()
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
            continue
        base = _resolve_base(node, module, is_package)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in known:
                found.add(submodule)
            elif base in known:
                found.add(base)
    found.discard(module)
    return found


def build_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module → the modules it imports (within ``modules``)."""
    return {
        name: imports_of(
            path.read_text(encoding="utf-8"), name, path.name == "__init__.py", modules
        )
        for name, path in modules.items()
    }


# --- cycles -------------------------------------------------------------------------------------


def find_cycles(graph: Graph, nodes: Iterable[str] | None = None) -> list[list[str]]:
    """One cycle per strongly connected component of ``graph`` restricted to ``nodes`` (all by
    default) that has one, each as ``[a, b, …, a]`` in import order; ``[]`` when there is none.

    Tarjan's algorithm (iterative) finds the components; a breadth-first search inside each gives
    a shortest cycle through its smallest module name, so the report is deterministic.
    """
    inside = set(graph) if nodes is None else set(nodes)
    edges = {n: sorted(m for m in graph.get(n, ()) if m in inside) for n in sorted(inside)}
    cycles = []
    for component in _strong_components(edges):
        start = min(component)
        if len(component) > 1 or start in edges[start]:
            cycles.append(_shortest_cycle(edges, start, component))
    return sorted(cycles)


def _strong_components(edges: Mapping[str, list[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def _shortest_cycle(edges: Mapping[str, list[str]], start: str, within: set[str]) -> list[str]:
    """``[start, …, start]``: the shortest path back to ``start`` inside ``within``."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in edges[node]:
                if child not in within:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]  # [start, start]: a self-import
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def describe(cycles: list[list[str]]) -> str:
    return "\n".join(" → ".join(cycle) for cycle in cycles)


def in_folder(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def edges_between(graph: Graph, source: str, target: str) -> list[tuple[str, str]]:
    """Every edge from a module of package ``source`` to one of package ``target``."""
    return sorted(
        (module, imported)
        for module, imported_set in graph.items()
        if in_folder(module, source)
        for imported in imported_set
        if in_folder(imported, target)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph(module_files())


# --- the rules ----------------------------------------------------------------------------------


def test_config_and_algos_hold_no_import_cycle(graph: dict[str, set[str]]) -> None:
    layer = [m for m in graph if in_folder(m, CONFIG) or in_folder(m, ALGOS)]
    cycles = find_cycles(graph, layer)
    assert not cycles, f"import cycles among stages/config and stages/algos:\n{describe(cycles)}"


def test_config_imports_algos_and_never_the_reverse(graph: dict[str, set[str]]) -> None:
    downward = edges_between(graph, CONFIG, ALGOS)
    upward = edges_between(graph, ALGOS, CONFIG)
    assert downward, "stages/config no longer imports stages/algos: is the graph read at all?"
    assert not upward, "stages/algos imports stages/config (imports run config → algos only):\n" + (
        "\n".join(f"{a} → {b}" for a, b in upward)
    )


def test_flows_hold_no_import_cycle(graph: dict[str, set[str]]) -> None:
    flows = [m for m in graph if in_folder(m, "flows")]
    cycles = find_cycles(graph, flows)
    assert not cycles, f"import cycles among flows modules:\n{describe(cycles)}"


# --- the machinery, on hand-made inputs (so the rules cannot pass vacuously) --------------------


def test_find_cycles_on_a_small_graph() -> None:
    graph = {
        "a": {"b"},
        "b": {"c", "x"},
        "c": {"a"},  # a → b → c → a
        "d": {"d"},  # a self-import
        "e": {"f"},
        "f": set(),  # acyclic tail
        "x": {"y"},
        "y": {"x", "a"},  # x ↔ y, and y → a joins both circles into one component
    }
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["d", "d"]]
    assert find_cycles(graph, ["a", "b", "c", "e", "f"]) == [["a", "b", "c", "a"]]
    assert find_cycles(graph, ["x", "y", "e"]) == [["x", "y", "x"]]
    assert find_cycles(graph, ["a", "b", "x", "e", "f"]) == []  # c and y left out: no circle
    assert find_cycles({"p": {"q"}, "q": set()}) == []
    assert describe([["a", "b", "a"]]) == "a → b → a"


def test_find_cycles_reports_a_long_cycle_in_order() -> None:
    names = [f"m{i:02d}" for i in range(30)]
    graph = {name: {names[(i + 1) % 30]} for i, name in enumerate(names)}
    graph["m05"].add("m00")  # a shortcut: the shortest cycle through m00 is m00 … m05 → m00
    assert find_cycles(graph) == [[*names[:6], "m00"]]


def test_imports_of_counts_functions_and_resolves_names() -> None:
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b", "pkg.sub.c", "pkg.sub.d", "pkg.e", "pkg.f"}
    source = (
        "from __future__ import annotations\n"
        "import os, pkg.a\n"
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"  # relative: the submodule pkg.sub.b
        "from .d import thing\n"  # relative to pkg.sub
        "from .. import helper\n"  # a name in pkg/__init__.py, not a module: the package
        "if TYPE_CHECKING:\n"
        "    from pkg.e import Annotation\n"  # annotations only: not an edge
        "else:\n"
        "    from pkg.f import Runtime\n"  # the else branch runs: an edge
        "def late():\n"
        "    from pkg.sub import c\n"  # inside a function: an edge all the same
        "    class Inner:\n"
        "        def method(self):\n"
        "            import numpy, pkg.sub.mod\n"  # third-party and itself: dropped
    )
    found = imports_of(source, "pkg.sub.mod", is_package=False, known=known | {"pkg.sub.mod"})
    assert found == {"pkg", "pkg.a", "pkg.f", "pkg.sub.b", "pkg.sub.c", "pkg.sub.d"}
    init = "from . import a, missing\nfrom .sub.c import x\n"
    assert imports_of(init, "pkg", is_package=True, known=known) == {"pkg.a", "pkg.sub.c"}


def test_module_files_names_packages_by_their_folder(tmp_path: Path) -> None:
    for relative in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "other/x.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("from pkg.sub import leaf\n", encoding="utf-8")
    modules = module_files(tmp_path, ["pkg"])
    assert sorted(modules) == ["pkg", "pkg.sub", "pkg.sub.leaf"]
    assert build_graph(modules)["pkg"] == {"pkg.sub.leaf"}
    assert build_graph(modules)["pkg.sub.leaf"] == set()  # an import of itself is no edge
