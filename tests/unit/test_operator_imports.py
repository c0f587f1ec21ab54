"""The operator imports only `pdwarden_runtime.contract` from the runtime (AST scan)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "pdwarden_operator"
ALLOWED = {"pdwarden_runtime", "pdwarden_runtime.contract"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "pdwarden_runtime":
                found += [(node.lineno, f"pdwarden_runtime.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_operator_uses_only_the_runtime_contract() -> None:
    files = sorted(OPERATOR.rglob("*.py"))
    assert files, "operator sources not found"
    bad = [
        f"{p.relative_to(OPERATOR.parent)}:{line}: {mod}"
        for p in files
        for line, mod in _imports(p)
        if mod.startswith("pdwarden_runtime") and mod not in ALLOWED
    ]
    assert bad == []


def test_the_scan_sees_a_violation(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from pdwarden_runtime import status\nimport pdwarden_runtime.metrics\n")
    mods = [m for _, m in _imports(sample)]
    assert "pdwarden_runtime.status" in mods and "pdwarden_runtime.metrics" in mods
