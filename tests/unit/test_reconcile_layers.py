"""The reconcile pass's planner is pure: `reconcile/planner.py` imports nothing from
`pdwarden_operator.kube` (the only package that calls the Kubernetes API), neither itself nor
through any module it imports, the packages above them included (Python runs a package's
`__init__.py` before its modules). An AST scan of the sources, like test_distribution_imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SOURCES = Path(__file__).resolve().parents[2] / "operator"
PLANNER = "pdwarden_operator.reconcile.planner"
KUBE = "pdwarden_operator.kube"


def module_file(root: Path, module: str) -> Path | None:
    """The source of `module` under `root` (None: not a module there, e.g. a name in one)."""
    path = root.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imports(root: Path, module: str) -> set[str]:
    """What `module` imports, as dotted names: each module, each name imported from one (it may
    be a submodule: `from pdwarden_operator import kube`), and every package above them."""
    path = module_file(root, module)
    assert path is not None, f"{module} is not under {root}"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            )
            source = ".".join(p for p in (base, node.module or "") if p)
            found |= {source, *(f"{source}.{alias.name}" for alias in node.names)}
    parents = {".".join(name.split(".")[:end]) for name in found for end in range(1, name.count(".") + 1)}
    return found | parents


def reached(root: Path, start: str) -> set[str]:
    """Every dotted name `start` imports, directly or through the modules under `root` it imports."""
    seen: set[str] = set()
    todo = [start, *(".".join(start.split(".")[:end]) for end in range(1, start.count(".") + 1))]
    while todo:
        for name in imports(root, todo.pop()) - seen:
            seen.add(name)
            if module_file(root, name) is not None:
                todo.append(name)
    return seen


def from_kube(names: set[str]) -> list[str]:
    return sorted(n for n in names if n == KUBE or n.startswith(f"{KUBE}."))


def test_the_planner_imports_nothing_from_kube() -> None:
    assert from_kube(imports(SOURCES, PLANNER)) == []


def test_nor_does_any_module_the_planner_imports() -> None:
    names = reached(SOURCES, PLANNER)
    assert "pdwarden_operator.render.children" in names, "the scan follows the planner's imports"
    assert from_kube(names) == []


def test_the_scan_sees_kube_however_it_is_reached(tmp_path: Path) -> None:
    package = tmp_path / "pdwarden_operator"
    (package / "reconcile").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    # the planner's own package runs first, and what it imports
    (package / "reconcile" / "__init__.py").write_text("from . import run\n")
    (package / "reconcile" / "run.py").write_text("from pdwarden_operator import kube\n")
    (package / "reconcile" / "planner.py").write_text("import json\n")
    (package / "reconcile" / "helpers.py").write_text("from ..kube.apply import get\n")
    assert from_kube(imports(tmp_path, PLANNER)) == []
    assert from_kube(reached(tmp_path, PLANNER)) == [KUBE]
    helpers = "pdwarden_operator.reconcile.helpers"
    assert from_kube(imports(tmp_path, helpers)) == [KUBE, f"{KUBE}.apply", f"{KUBE}.apply.get"]
