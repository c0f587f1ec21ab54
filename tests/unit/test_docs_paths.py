"""The docs name only what exists: every file path in backquotes is a file of the repository
(a path, or the tail of one), and every `pdwarden_*` module they name can be imported."""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
SKIPPED_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"})
# `a/b.py`, `values.schema.json`: a file named in backquotes (no globs, no absolute paths)
FILE = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*\.(?:py|md|yaml|yml|json|toml|sh|txt|cfg|tpl))`")
PACKAGES = ("operator", "runtime", "contract", "bench", "testkit", "localcluster", "demo", "cli")
MODULE = re.compile(rf"`(pdwarden_(?:{'|'.join(PACKAGES)})(?:\.[a-z_0-9]+)*)`")


@cache
def repository_files() -> frozenset[str]:
    out = set()
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                if entry.name not in SKIPPED_DIRS and not entry.name.endswith(".egg-info"):
                    stack.append(entry)
            else:
                out.add(entry.relative_to(ROOT).as_posix())
    return frozenset(out)


def _exists(path: str) -> bool:
    return any(f == path or f.endswith(f"/{path}") for f in repository_files())


def _importable(module: str) -> bool:
    """The module, or (for `pkg.mod.name`) the module that holds the name, can be found."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        try:
            if importlib.util.find_spec(".".join(parts[:end])) is not None:
                return end >= len(parts) - 1
        except ModuleNotFoundError:
            continue
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_and_module_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = [p for p in FILE.findall(text) if not _exists(p)]
    missing += [m for m in MODULE.findall(text) if not _importable(m)]
    assert not missing, f"{doc.name} names what does not exist: {sorted(set(missing))}"


def test_the_check_finds_a_name_that_does_not_exist() -> None:
    assert not _exists("operator/pdwarden_operator/no_such_module.py")
    assert _exists("pdwarden_operator/render/runtime.py") and _exists("runtime.py")
    assert not _importable("pdwarden_operator.no_such_module.thing")
    assert _importable("pdwarden_operator.render.meta")
    assert _importable("pdwarden_operator.render.meta.served_name")
