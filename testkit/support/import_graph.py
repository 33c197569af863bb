"""The package's own import graph, read from its source: every ``import`` and ``from ...
import`` of a ``tokenpath.*`` module anywhere in a module (module level and inside
functions; not under ``if TYPE_CHECKING:``, which never runs), each folder mapped onto its
``tokenpath.*`` name as setup.py maps it. tests/test_layers.py checks it for cycles and for
imports from the ground floor upward."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE_ROOTS = {"tokenpath": "tokenpath", "tokenpath.collector": "collector",
                   "tokenpath.agent": "agent", "tokenpath.instrumentation": "instrumentation",
                   "tokenpath.dashboards": "dashboards"}


def modules() -> dict[str, Path]:
    """Every module of the package by its import name."""
    out: dict[str, Path] = {}
    for package, folder in NAMESPACE_ROOTS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            out.setdefault(name, path)
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (name for child in node.orelse for name in _imports(child, module,
                                                                          is_package))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        yield from _imports(node, module, is_package)


def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    known = modules()
    out: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for imported in _imports(tree, name, path.name == "__init__.py"):
            if imported in known and imported != name:
                targets.add(imported)
        out[name] = targets
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found
