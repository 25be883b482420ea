"""The project's import structure: no cycles between its modules, no core importing an adapter, and a
tap that does not load the rule catalogue.

The graph is read from the source with ``ast``, so it holds every import a module can make: those at
the top, those inside functions (an import deferred into a function still ties the two modules
together; deferring it only hides a cycle until the call) and those under ``if TYPE_CHECKING:``.
Type-only imports count too: a cycle through them cannot fail at run time, but the types of one module
still depend on the other, and the point is a structure that reads from the bottom up.

An import names the module it loads: ``from codec.api import X`` is an edge to ``codec.api`` and
``from codec import api`` one to ``codec.api`` too, while ``from codec import decode_request`` is an
edge to the package ``codec`` (its ``__init__``). A package's ``__init__`` runs before any of its
modules, but that implicit step is not an edge, or every package that re-exports its modules would
be a cycle.

The same imports, read at the level of top-level packages, must run one way: down ``LAYERS``.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The packages that ship (pyproject.toml, ``[tool.setuptools.packages.find]``).
PACKAGES = ("airflow_dags", "checks", "codec", "deploy", "kpconfig", "kpmon", "streaming", "tap")
#: The packages from the top down (docs/architecture.md, "Who imports whom"): a package imports only
#: packages of a lower layer. The CLI uses everything; the config home sits under every adapter that
#: reads it and above the checks' settings it is made of. Packages of one layer import nothing of each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"kpmon"}),
    frozenset({"airflow_dags"}),
    frozenset({"deploy"}),
    frozenset({"streaming", "tap"}),
    frozenset({"kpconfig"}),
    frozenset({"checks"}),
    frozenset({"codec"}),
)
#: Sans-I/O cores and the adapters around them (docs/architecture.md, "Packages").
CORES = frozenset({"codec", "checks"})
ADAPTERS = frozenset(PACKAGES) - CORES
#: What the tap may load of the checks: the config model's settings and alert context (kpconfig/model.py)
#: and what they are made of. Not the engine, the rule interface or the rules.
TAP_CHECKS_MODULES = frozenset({"checks", "checks.settings", "checks.alerts", "checks.model"})


def project_modules() -> dict[str, Path]:
    """Dotted module name → source file, for every module of the shipped packages."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names ``node`` loads: a module, or a package and a name that may be its module."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        yield f"{base}.{alias.name}"


def import_graph() -> dict[str, dict[str, int]]:
    """Module → {project module it imports: line of the first such import}."""
    modules = project_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, is_package):
                # The longest project module the name starts with: ``codec.api.Request`` → ``codec.api``.
                target = name
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Top-level package → {other package it imports: 1}, from the module graph."""
    packages: dict[str, dict[str, int]] = {package: {} for package in PACKAGES}
    for module, edges in graph.items():
        for target in edges:
            if target.split(".")[0] != module.split(".")[0]:
                packages[module.split(".")[0]][target.split(".")[0]] = 1
    return packages


def _package_imports(graph: dict[str, dict[str, int]], package: str, target: str) -> list[str]:
    """Every module of ``package`` that imports from ``target``, with the line: what to move."""
    return [
        f"{module} imports {name} (line {line})"
        for module, edges in sorted(graph.items())
        if module.split(".")[0] == package
        for name, line in sorted(edges.items())
        if name.split(".")[0] == target
    ]


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle path (first module repeated at the end) per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth-first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt not in component:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_graph_sees_imports_in_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    # The finder itself: a cycle hidden in a function or a TYPE_CHECKING block is still a cycle.
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from codec.api import Request\n"
        "def f():\n    from . import errors\n    import codec.wire\n"
    )
    tree = ast.parse(source)
    names = [
        n
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for n in _imported(node, "codec.nested", False)
    ]
    assert names == ["typing.TYPE_CHECKING", "codec.api.Request", "codec.errors", "codec.wire"]
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(graph, cycle) for cycle in found)


def test_cores_import_no_adapter() -> None:
    graph = import_graph()
    wrong = [
        f"{module} imports {target} (line {line})"
        for module, edges in sorted(graph.items())
        if module.split(".")[0] in CORES
        for target, line in sorted(edges.items())
        if target.split(".")[0] in ADAPTERS
    ]
    assert not wrong, "a core imports an adapter:\n" + "\n".join(wrong)


def test_no_package_cycles() -> None:
    graph = import_graph()
    packages = package_graph(graph)
    found = cycles(packages)
    assert not found, "import cycles between packages:\n" + "\n".join(
        " -> ".join(cycle)
        + ":\n  "
        + "\n  ".join(line for a, b in itertools.pairwise(cycle) for line in _package_imports(graph, a, b))
        for cycle in found
    )


def test_packages_import_only_downward() -> None:
    assert sorted(frozenset().union(*LAYERS)) == sorted(PACKAGES), "every package has one layer"
    layer = {package: depth for depth, members in enumerate(LAYERS) for package in members}
    graph = import_graph()
    wrong = [
        line
        for package, targets in sorted(package_graph(graph).items())
        for target in sorted(targets)
        if layer[target] <= layer[package]
        for line in _package_imports(graph, package, target)
    ]
    order = " > ".join("/".join(sorted(members)) for members in LAYERS)
    assert not wrong, f"imports against the package order {order}:\n" + "\n".join(wrong)


def test_package_checks_fire() -> None:
    # The finders themselves, on a made-up graph: one import back up is a cycle and a wrong direction.
    graph = {"kpmon.cli": {"tap.app": 3}, "tap.app": {"kpmon.config": 7}, "kpmon.config": {}}
    packages = {"kpmon": {"tap": 1}, "tap": {"kpmon": 1}}
    assert {k: v for k, v in package_graph(graph).items() if v} == packages
    assert cycles(packages) == [["kpmon", "tap", "kpmon"]]
    assert _package_imports(graph, "tap", "kpmon") == ["tap.app imports kpmon.config (line 7)"]


@pytest.mark.parametrize("entry", ["tap.app", "kpmon.commands.tap"])
def test_tap_does_not_load_the_rule_catalogue(entry: str) -> None:
    # The tap builds its settings from the config model; that must not load the engine or the rules.
    # A fresh interpreter, because this one has imported everything already.
    probe = f"import json, sys, {entry}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    names = set(json.loads(done.stdout))
    assert "kpconfig.model" in names, f"{entry} no longer imports the config model: revisit this test"
    loaded = {name for name in names if name.split(".")[0] == "checks"}
    assert loaded <= TAP_CHECKS_MODULES, f"importing {entry} loads {sorted(loaded - TAP_CHECKS_MODULES)}"
