"""Every module imports on its own, in a fresh interpreter, and the package's imports form no cycle.

The cycle check reads every import statement of every module (``checkmate.tf2`` included, imports
inside functions included), and a package's lazily exported names (its ``_LAZY`` table, loaded by its
``__getattr__`` on first use) as imports of the modules that define them: ``from checkmate import
tf2`` then ``tf2.RematModel``, or ``from checkmate.tf2 import RematModel``, imports
``checkmate.tf2.keras_model``. The fresh-interpreter checks leave out ``checkmate.tf2``, which needs
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


def lazy_exports(package_dir: Path = PACKAGE_DIR) -> dict[str, dict[str, str]]:
    """For each package whose ``__init__`` has a ``_LAZY`` table (``name: (module, attribute)``), the
    module each lazily exported name loads: ``{"checkmate.tf2": {"RematModel": "checkmate.tf2.keras_model", ...}}``."""
    out: dict[str, dict[str, str]] = {}
    for init in sorted(package_dir.rglob("__init__.py")):
        for node in ast.parse(init.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                table = ast.literal_eval(node.value)
                out[_module_name(init)] = {export: module for export, (module, _attr) in table.items()}
    return out


LAZY_EXPORTS = lazy_exports()


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def _imports(path: Path, name: str, modules, lazy: dict[str, dict[str, str]] | None = None) -> set[str]:
    """checkmate modules that ``name`` imports, wherever the import statement is.

    ``import P.Q`` (with or without ``as``) imports ``P.Q``; ``from P import x`` imports ``P`` (its
    namespace is read) and also ``P.x`` when that is a module. A lazily exported name of a package
    (``lazy``, by default :data:`LAZY_EXPORTS`) imports the module that defines it when it is imported
    (``from P import x``) or read as an attribute of the package (``P.x``, or ``alias.x`` where an
    import binds ``alias`` to ``P``; a binding anywhere in the file counts everywhere in it)."""
    lazy = LAZY_EXPORTS if lazy is None else lazy
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    bound: dict[str, str] = {}     # a local name -> the module or package an import binds it to
    for node in _runtime_import_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
            continue
        if node.level:
            base = name.split(".")
            base = base[:len(base) - node.level + (1 if is_package else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        out.add(target)
        out.update(f"{target}.{alias.name}" for alias in node.names)
        out.update(lazy[target][alias.name] for alias in node.names if alias.name in lazy.get(target, {}))
        for alias in node.names:
            bound[alias.asname or alias.name] = f"{target}.{alias.name}"
    # attribute reads of a lazily exporting package: P.x with P reached through a bound name
    for node in ast.walk(tree):
        parts = _dotted(node) if isinstance(node, ast.Attribute) else None
        if not parts or parts[0] not in bound:
            continue
        full = bound[parts[0]].split(".") + parts[1:]
        for i in range(1, len(full)):
            package, attr = ".".join(full[:i]), full[i]
            if attr in lazy.get(package, {}):
                out.add(lazy[package][attr])
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


def test_the_graph_sees_a_lazily_exported_name_as_an_import_of_its_module():
    source = textwrap.dedent("""
        import checkmate.tf2
        from checkmate import tf2
        from checkmate import tf2 as front
        from checkmate.tf2 import compile
        def wrap(step):
            return tf2.RematModel(step)
        def measured():
            return front.measure_peak_memory
        def zoo():
            return checkmate.tf2.zoo.build_model
        def unrelated(other):
            return other.RematModel, tf2.not_exported
    """)
    lazy = {"checkmate.tf2": {"RematModel": "checkmate.tf2.keras_model", "compile": "checkmate.tf2.step",
                              "measure_peak_memory": "checkmate.tf2.memory", "zoo": "checkmate.tf2.zoo"}}
    modules = {"checkmate", "checkmate.tf2", "checkmate.tf2.keras_model", "checkmate.tf2.step",
               "checkmate.tf2.memory", "checkmate.tf2.zoo", "checkmate.tf2.codegen"}
    path = Path("checkmate/tf2/example.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "read_text", lambda self, *a, **k: source)
        found = _imports(path, "checkmate.tf2.example", modules, lazy)
    assert found == {"checkmate", "checkmate.tf2", "checkmate.tf2.keras_model", "checkmate.tf2.step",
                     "checkmate.tf2.memory", "checkmate.tf2.zoo"}
    # a reference through the lazy name closes a cycle that the import statements alone do not show
    graph = {module: set() for module in modules}
    graph.update({"checkmate.tf2.keras_model": {"checkmate.tf2.step"}, "checkmate.tf2.step": found})
    assert find_cycle(graph) == ["checkmate.tf2.keras_model", "checkmate.tf2.step", "checkmate.tf2.keras_model"]


def test_the_package_lazy_table_is_read():
    exports = LAZY_EXPORTS["checkmate.tf2"]
    assert exports["RematModel"] == "checkmate.tf2.keras_model"
    assert exports["compile"] == "checkmate.tf2.step"
    assert all(module in import_graph() for module in exports.values())


def test_tf2_modules_import_in_either_order():
    pytest.importorskip("tensorflow")
    every = sorted(_module_name(p) for p in PACKAGE_DIR.joinpath("tf2").rglob("*.py"))
    for names in (every, every[::-1]):
        proc = _import_in_fresh_process(names)
        assert proc.returncode == 0, proc.stderr
