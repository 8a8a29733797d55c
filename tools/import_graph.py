"""echo2's import graph, read from the source with `ast`, and the layer rule checked over it.

Packages sit in layers that only point down (LAYERS, lowest first): a module imports from its
own layer or a lower one, and packages of one layer may import each other only while the
package graph stays acyclic. Neither modules nor packages may import in a cycle. Every import
statement counts, module level or inside a function (a deferred import still ties the two
modules together, it only hides the cycle until the function runs), except those under
`if TYPE_CHECKING:`, which never run. Imports by a string name (importlib) are not seen here;
tests/unit/test_module_imports.py imports every module on its own, which catches their cycles.

The checks are functions over a list of `Import` edges, so a test can feed them made-up edges.
"""

from __future__ import annotations

import ast
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    ("config",),
    ("protocol",),
    ("policy", "planner"),
    ("broadcast", "tasks", "envs", "models"),
    ("coordinator", "learner", "rollout", "sim", "report"),
    ("launch",),
    ("cli", "echo2"),
)
"""Lowest first. "echo2" stands for the top-level modules (echo2/__init__.py, echo2/__main__.py)."""
LAYER_OF = {package: index for index, packages in enumerate(LAYERS) for package in packages}
LAYER_ORDER = " < ".join(", ".join(packages) for packages in LAYERS)
TOP_LEVEL_MODULES = ("echo2", "echo2.__main__")


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module, e.g. "echo2.config.run"."""
    target: str
    """The echo2 module it imports (the package's __init__ when a name comes from a package)."""
    path: str
    """The importer's file, as the report names it."""
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target}"


def package_of(module: str) -> str:
    return "echo2" if module in TOP_LEVEL_MODULES else module.split(".")[1]


def module_names(src_dir: Path) -> dict[str, Path]:
    """Every module under `src_dir`/echo2 by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((src_dir / "echo2").rglob("*.py")):
        parts = list(path.relative_to(src_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def collect_imports(src_dir: Path) -> list[Import]:
    """Every echo2 -> echo2 import statement under `src_dir`/echo2 (see the module docstring)."""
    modules = module_names(src_dir)
    edges: list[Import] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        shown = str(path.relative_to(src_dir.parent)) if src_dir.parent in path.parents else str(path)
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, modules):
                edges.append(Import(module, target, shown, node.lineno))
    return sorted(edges, key=lambda e: (e.path, e.line, e.target))


def _runtime_imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)  # the body runs under a type checker only
        else:
            pending.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if _is_echo2(alias.name)]
    if node.level:  # relative: `from . import x` in package a.b is a.b.x
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if not _is_echo2(source):
        return []
    # `from package import submodule` imports the submodule; any other name comes from the package
    return sorted({f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names})


def _is_echo2(module: str) -> bool:
    return module == "echo2" or module.startswith("echo2.")


def layer_violations(imports: Iterable[Import]) -> list[str]:
    """An import of a package from a higher layer, or of (or by) a package with no layer."""
    problems = []
    for edge in imports:
        source, target = package_of(edge.importer), package_of(edge.target)
        unknown = [p for p in (source, target) if p not in LAYER_OF]
        if unknown:
            problems.append(f"{edge.where()}: package {unknown[0]!r} has no layer (add it to LAYERS: {LAYER_ORDER})")
        elif LAYER_OF[target] > LAYER_OF[source]:
            problems.append(f"{edge.where()}: upward import, {source} (layer {LAYER_OF[source]}) may not import "
                            f"{target} (layer {LAYER_OF[target]}); layers, lowest first: {LAYER_ORDER}")
    return problems


def module_cycles(imports: Iterable[Import]) -> list[str]:
    """Modules that import each other, directly or around a longer loop."""
    by_edge = {(e.importer, e.target): e for e in imports if e.importer != e.target}
    return [f"module cycle {' -> '.join(cycle)}: " + "; ".join(by_edge[pair].where() for pair in _pairs(cycle))
            for cycle in _cycles(by_edge)]


def package_cycles(imports: Iterable[Import]) -> list[str]:
    """Packages that import each other (each step of the loop named by one of its imports)."""
    by_edge: dict[tuple[str, str], Import] = {}
    for edge in imports:
        pair = (package_of(edge.importer), package_of(edge.target))
        if pair[0] != pair[1]:
            by_edge.setdefault(pair, edge)
    return [f"package cycle {' -> '.join(cycle)}: " + "; ".join(by_edge[pair].where() for pair in _pairs(cycle))
            for cycle in _cycles(by_edge)]


def check(imports: Iterable[Import]) -> list[str]:
    """Every broken rule, one message each; empty when the graph follows the layers."""
    edges = list(imports)
    return layer_violations(edges) + package_cycles(edges) + module_cycles(edges)


def _pairs(cycle: list[str]) -> list[tuple[str, str]]:
    return list(zip(cycle, cycle[1:], strict=False))


def _cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """One shortest loop per strongly connected component, as [a, b, ..., a], a its first node."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    loops = []
    for component in _components(graph):
        start = min(component)
        loops.append(_shortest_loop(graph, start, component))
    return sorted(loops)


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one node (Kosaraju, iterative: no recursion limit)."""
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    finished: list[str] = []
    seen: set[str] = set()
    for root in nodes:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(sorted(graph.get(root, ()))))]
        while stack:
            node, children = stack[-1]
            child = next((c for c in children if c not in seen), None)
            if child is None:
                finished.append(node)
                stack.pop()
            else:
                seen.add(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    reverse: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            reverse[target].add(source)
    assigned: set[str] = set()
    components = []
    for root in reversed(finished):
        if root in assigned:
            continue
        component, pending = {root}, [root]
        assigned.add(root)
        while pending:
            for source in reverse[pending.pop()] - assigned:
                assigned.add(source)
                component.add(source)
                pending.append(source)
        if len(component) > 1:
            components.append(component)
    return components


def _shortest_loop(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & within):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a strongly connected component but on no loop")
