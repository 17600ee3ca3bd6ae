"""The package graph: every package of mriprep imports only packages of lower layers, and no
module imports itself back through others (docs/design.md, "Layers").

Every import counts, at module level, inside functions, and under ``TYPE_CHECKING``: a
lazy import is still a dependency, and a type-only one still ties the modules' meanings.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import mriprep

PACKAGE_ROOT = Path(mriprep.__file__).parent

# Lowest first; a package may import only packages before it. docs/design.md says why
# each one sits where it does.
LAYERS = ("core", "inputs", "cache", "splits", "stages", "pipelines", "qc", "check",
          "maintenance", "run", "training", "outputs", "demo", "cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``mriprep...`` name a module imports (modules and the names taken from them)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("mriprep.")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(path):
            # "from mriprep.cache import Cache" names a module only up to "mriprep.cache"
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def _package(module: str) -> str:
    """``mriprep.cache.store`` -> ``cache``; the top-level modules belong to no layer."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and (PACKAGE_ROOT / parts[1]).is_dir() else ""


def test_every_package_is_in_a_layer():
    packages = {p.name for p in PACKAGE_ROOT.iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS), (
        "a package was added or removed: give it its layer in LAYERS and in "
        f"docs/design.md; unplaced {sorted(packages - set(LAYERS))}, "
        f"gone {sorted(set(LAYERS) - packages)}")


def test_packages_import_only_lower_layers():
    rank = {package: i for i, package in enumerate(LAYERS)}
    upward = []
    for module, targets in _graph().items():
        source = _package(module)
        for target in targets:
            destination = _package(target)
            if source and destination and rank[destination] > rank[source]:
                upward.append(f"{module} ({source}) imports {target} ({destination})")
    assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(
        sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    """The finder itself, on a graph with one cycle and one chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
