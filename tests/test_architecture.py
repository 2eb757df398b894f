"""The layering DEVELOPERS.md promises, checked on the source: which unit imports which.

A unit is a top-level module or subpackage of ``mmdatagen`` (``sim``, ``loadgen``, ``errors``...).
Every import counts, also one inside a function (a lazy import is still a dependency).
"""
from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mmdatagen"

# Units that sit at the bottom: they may import nothing above them.
FOUNDATION = {"errors", "rng", "lifecycle", "exportmodel"}
# unit -> units it must never import (directly or lazily).
FORBIDDEN = {
    "sim": {"loadgen", "commands", "cli", "analysis", "report"},
    "analysis": {"sim", "loadgen", "commands", "cli", "report"},
    "settings": {"sim", "loadgen", "analysis", "commands", "cli", "generate", "dataset", "report"},
    "plans": {"settings", "content", "io", "sim", "loadgen", "analysis", "commands", "cli"},
    "content": {"settings", "plans", "sim", "loadgen", "analysis", "commands", "cli", "generate"},
    "io": {"settings", "plans", "content", "sim", "loadgen", "analysis", "commands", "cli"},
    "caches": {"settings", "sim", "loadgen", "analysis", "commands", "cli", "io"},
    "vlm": {"settings", "sim", "loadgen", "analysis", "commands", "cli", "io"},
}
CLI_EDGE = {"cli", "commands"}


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module's syntax tree, parsed once for all the checks of a worker."""
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """The mmdatagen modules ``path`` imports, as absolute dotted names."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    here = list(rel.parts) if path.name == "__init__.py" else list(rel.parts[:-1])
    if path.name == "__init__.py":
        here = here[:-1]
    found: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mmdatagen"))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("mmdatagen"):
                    found.add(node.module)
                continue
            base = here[: len(here) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:
                found.update(".".join([*base, a.name]) for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        src = _unit(module)
        edges[src].update(u for u in map(_unit, _imports(path)) if u != src)
    return edges


GRAPH = _graph()


def test_graph_is_read():
    # the reader must see the edges everyone relies on, or every check below passes vacuously
    assert "sim" in GRAPH["loadgen"]
    assert "settings" in GRAPH["commands"]
    assert "errors" in GRAPH["plans"]
    assert {"content", "plans"} <= GRAPH["settings"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every back edge of a depth-first walk, as the cycle it closes (empty: a DAG)."""
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(unit: str, stack: list[str]) -> None:
        seen[unit] = 1
        for nxt in sorted(graph.get(unit, ())):
            if seen.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt] if nxt in stack else [unit, nxt])
            elif nxt not in seen:
                visit(nxt, [*stack, nxt])
        seen[unit] = 2

    for unit in sorted(graph):
        if unit not in seen:
            visit(unit, [unit])
    return cycles


def test_no_cycles_between_units():
    assert _cycles(GRAPH) == []


@functools.cache
def _package_graphs() -> dict[str, dict[str, set[str]]]:
    """Per package (``mmdatagen`` and each subpackage): which of its direct members (modules,
    subpackages, its own ``__init__``) import which, lazy imports included."""
    graphs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        package = ".".join(parts[:-1])
        src = parts[-1]
        for name in _imports(path):
            if name == package:
                dst = "__init__"
            elif name.startswith(package + "."):
                dst = name[len(package) + 1:].split(".")[0]
            else:
                continue
            if dst != src:
                graphs[package][src].add(dst)
    return graphs


def test_package_graphs_are_read():
    graphs = _package_graphs()
    assert "kernels" in graphs["mmdatagen.analysis"]["lru"]
    assert "engine" in graphs["mmdatagen.sim"]["protocol"]


@pytest.mark.parametrize("package", sorted(_package_graphs()))
def test_no_cycles_inside_a_package(package):
    """No circle of imports between the modules of one package (issue 19): each package's
    modules form layers too."""
    assert _cycles(_package_graphs()[package]) == []


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_layers_point_down(unit):
    assert GRAPH[unit] & FORBIDDEN[unit] == set()


def test_foundation_imports_only_foundation():
    for unit in FOUNDATION:
        assert GRAPH.get(unit, set()) <= FOUNDATION | {"__init__"}, unit


def test_only_the_cli_edge_imports_click():
    users = set()
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "click" or n.startswith("click.") for n in names):
                users.add(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    assert users, "no click import found: the scan is broken"
    assert {u for u in users if _unit(u) not in CLI_EDGE} == {"mmdatagen.settings.cli"}


def test_no_function_over_60_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in _nodes(path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert long == []
