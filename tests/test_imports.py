"""Every module imports on its own, in a fresh interpreter, and module-level imports form no cycle.

``checkmate.tf2`` needs TensorFlow and is left out; ``checkmate.__main__`` runs the CLI when imported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _top_level_imports(path: Path, name: str) -> set[str]:
    """checkmate modules that ``name`` imports when it is loaded (not under TYPE_CHECKING, not inside
    functions). ``from P import x`` counts as importing ``P.x`` when that is a module, else ``P``."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m in MODULES and m != name}


def test_module_level_imports_have_no_cycle():
    graph = {name: _top_level_imports(path, name) for name, path in MODULES.items()}
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
