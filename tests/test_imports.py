"""Every module imports on its own, in a fresh interpreter, and the package's imports form no cycle.

The cycle check reads every import statement of every module (``checkmate.tf2`` included, imports
inside functions included). The fresh-interpreter checks leave out ``checkmate.tf2``, which needs
TensorFlow (its modules are imported together, in both orders, where TensorFlow is installed), and
``checkmate.__main__``, which runs the CLI when imported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import checkmate

PACKAGE_DIR = Path(checkmate.__file__).resolve().parent
SKIPPED = ("checkmate.tf2", "checkmate.__main__")


def _module_name(path: Path) -> str:
    parts = ("checkmate",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    return {name: path for name, path in found.items()
            if not any(name == skip or name.startswith(skip + ".") for skip in SKIPPED)}


MODULES = _modules()


def _import_in_fresh_process(names: list[str]) -> subprocess.CompletedProcess:
    code = "; ".join(f"import {name}" for name in names)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_imports_alone(module):
    proc = _import_in_fresh_process([module])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_all_modules_import_in_either_order(order):
    names = sorted(MODULES, reverse=order == "reversed")
    proc = _import_in_fresh_process(names)
    assert proc.returncode == 0, proc.stderr


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_import_nodes(tree: ast.AST):
    """Every import statement that can run: at module level, in functions and methods, in
    try/except and if blocks; not under ``if TYPE_CHECKING`` (type checkers only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(path: Path, name: str, modules) -> set[str]:
    """checkmate modules that ``name`` imports, wherever the import statement is.

    ``import P.Q`` (with or without ``as``) imports ``P.Q``; ``from P import x`` imports ``P`` (its
    namespace is read) and also ``P.x`` when that is a module."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = name.split(".")
            base = base[:len(base) - node.level + (1 if is_package else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        out.add(target)
        out.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    """The import graph of every module of the package, ``checkmate.tf2`` included."""
    every = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    return {name: _imports(path, name, every) for name, path in every.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it is acyclic."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        state[root] = 1
        todo = [iter(sorted(graph[root]))]
        while todo:
            dep = next(todo[-1], None)
            if dep is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            elif dep not in state:
                state[dep] = 1
                path.append(dep)
                todo.append(iter(sorted(graph[dep])))
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "checkmate.tf2.step" in graph and "checkmate.tf2.keras_model" in graph   # tf2 is covered
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_function_level_imports_and_a_cycle_through_them():
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        from checkmate.solvers import registry
        if TYPE_CHECKING:
            from checkmate.solvers import milp
        def later():
            import checkmate.solvers.staged as staged
            from checkmate.graph import Graph
    """)
    modules = {"checkmate.solvers", "checkmate.solvers.registry", "checkmate.solvers.milp",
               "checkmate.solvers.staged", "checkmate.graph"}
    path = Path("checkmate/solvers/example.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "read_text", lambda self, *a, **k: source)
        found = _imports(path, "checkmate.solvers.example", modules)
    assert found == {"checkmate.solvers", "checkmate.solvers.registry", "checkmate.solvers.staged", "checkmate.graph"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_tf2_modules_import_in_either_order():
    pytest.importorskip("tensorflow")
    every = sorted(_module_name(p) for p in PACKAGE_DIR.joinpath("tf2").rglob("*.py"))
    for names in (every, every[::-1]):
        proc = _import_in_fresh_process(names)
        assert proc.returncode == 0, proc.stderr
