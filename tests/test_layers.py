"""The package's layers: every module imports only from its own layer or the layers under it, and no modules
import each other in a loop (docs/ARCHITECTURE.md draws the layers)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# lowest first; a module may import from its own layer and every layer before it
LAYERS = ["core", "search|measurement|storage", "authoring", "running|triton_tuning", "reporting", "model", "cli",
          "__main__"]


def _layer(module: str) -> int:
    part = module.split(".")[1] if module.count(".") else ""
    for i, names in enumerate(LAYERS):
        if part in names.split("|"):
            return i
    raise AssertionError(f"{module}: in no layer of {LAYERS}")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "evotune").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every evotune module ``path`` imports, at any depth of the file (a deferred import counts too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("evotune"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("evotune"))
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.count(".")))
def test_a_module_imports_nothing_from_a_layer_above_its_own(module):
    up = sorted(i for i in _graph()[module] if i != "evotune" and i.count(".") and _layer(i) > _layer(module))
    assert not up, f"{module} imports from above its layer: {up}"


def test_no_modules_import_each_other_in_a_loop():
    graph = {m: {i for i in deps if i != "evotune"} for m, deps in _graph().items() if m != "evotune"}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            # a package's __init__ that only hands on its modules' names is no loop with them
            if n.startswith(m + ".") or m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (loop := visit(n)):
                return loop
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            loop = visit(m)
            assert loop is None, f"import loop: {' -> '.join(loop)}"


def test_spaces_import_only_the_authoring_api():
    offenders = []
    for folder in ("search_spaces", "examples", "tests/spaces"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _imports(path):
                if name.split(".")[:2] != ["evotune", "authoring"] and name != "evotune":
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def test_only_the_rdb_adapter_imports_a_private_optuna_module():
    """Optuna's private modules change without notice: one adapter reads them, after checking Optuna's version."""
    offenders = []
    for path in sorted((ROOT / "evotune").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:  # ``from optuna import _x`` names a module too
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "optuna" and any(part.startswith("_") for part in name.split(".")):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
                    break
    assert offenders == ["evotune/storage/optuna_rdb.py: optuna.storages._rdb"], offenders
