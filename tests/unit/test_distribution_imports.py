"""Each product distribution imports only its own packages and the contract (AST scan): the
operator never the runtime, the runtime never the operator, neither the development tools
(local cluster, test kit, benchmarks, demo), since no image installs them beside each other.
The development tools keep their layers too: the local cluster stands alone but for the
operator's kubeconfig reader (one reader of the file), the test kit uses it and the products,
and neither the test kit nor the demo imports a benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# source directory -> the pdwarden packages (or single modules) its code may import
DISTRIBUTIONS = {
    ROOT / "operator" / "pdwarden_operator": {"pdwarden_operator", "pdwarden_contract"},
    ROOT / "runtime" / "pdwarden_runtime": {"pdwarden_runtime", "pdwarden_contract"},
    ROOT / "core" / "pdwarden_cli": {"pdwarden_cli"},
    ROOT / "core" / "pdwarden_contract": {"pdwarden_contract"},
}

PRODUCTS = {"pdwarden_operator", "pdwarden_runtime", "pdwarden_contract"}
DEV_TOOLS = {
    ROOT / "localcluster" / "pdwarden_localcluster": {
        "pdwarden_localcluster",
        "pdwarden_operator.kube.credentials",
    },
    ROOT / "testkit" / "pdwarden_testkit": {"pdwarden_testkit", "pdwarden_localcluster", *PRODUCTS},
    ROOT / "bench" / "pdwarden_bench": {
        "pdwarden_bench",
        "pdwarden_testkit",
        "pdwarden_localcluster",
        *PRODUCTS,
    },
    ROOT / "demo" / "pdwarden_demo": {
        "pdwarden_demo",
        "pdwarden_testkit",
        "pdwarden_localcluster",
        *PRODUCTS,
    },
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def violations(source: Path, allowed: set[str]) -> list[str]:
    return [
        f"{p.relative_to(source.parent)}:{line}: {mod}"
        for p in sorted(source.rglob("*.py"))
        for line, mod in _imports(p)
        if mod.split(".")[0].startswith("pdwarden_") and not {mod, mod.split(".")[0]} & allowed
    ]


@pytest.mark.parametrize("source", sorted(DISTRIBUTIONS), ids=lambda p: p.name)
def test_a_product_package_imports_only_itself_and_the_contract(source: Path) -> None:
    assert sorted(source.rglob("*.py")), f"{source} has no sources"
    assert violations(source, DISTRIBUTIONS[source]) == []


@pytest.mark.parametrize("source", sorted(DEV_TOOLS), ids=lambda p: p.name)
def test_a_development_package_imports_only_the_layers_below_it(source: Path) -> None:
    assert sorted(source.rglob("*.py")), f"{source} has no sources"
    assert violations(source, DEV_TOOLS[source]) == []


def test_the_scan_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "sample.py").write_text(
        "from pdwarden_runtime import status\nimport pdwarden_localcluster.testing\n"
        "import pdwarden_contract as c\nimportlib.import_module('pdwarden_testkit.ports')\n"
    )
    found = violations(tmp_path, {"pdwarden_operator", "pdwarden_contract"})
    assert [v.split(": ")[1] for v in found] == [
        "pdwarden_runtime",
        "pdwarden_localcluster.testing",
        "pdwarden_testkit.ports",
    ]
