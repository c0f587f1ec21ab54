"""What runtime/Dockerfile installs: (non-editable) wheels built from exactly the sources the
Dockerfile copies must carry the sglang engine, the hardening, the start-up hook and the
command, and nothing of the operator, the local cluster, the benchmarks or the demo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NEEDED = (
    "pdwarden_runtime/cli.py",
    "pdwarden_runtime/doctor.py",
    "pdwarden_runtime/engines/sglang_engine.py",
    "pdwarden_runtime/hardening/__init__.py",
    "pdwarden_runtime/hardening/nixl.py",
    "pdwarden_runtime/sglang_boot/__init__.py",
    "pdwarden_runtime/sglang_boot/activate.py",
    "pdwarden_runtime/sglang_boot/probe.py",
    "pdwarden_runtime/sglang_boot/prom_bridge.py",
    "pdwarden_runtime/sglang_boot/site/sitecustomize.py",
    "pdwarden_cli/main.py",
    "pdwarden_contract/__init__.py",
)
NEVER = ("pdwarden_operator/", "pdwarden_localcluster/", "pdwarden_bench/", "pdwarden_demo/", "tests/")


def copied_sources() -> list[str]:
    """The COPY sources of runtime/Dockerfile."""
    sources: list[str] = []
    for line in (ROOT / "runtime" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            sources += line.split()[1:-1]
    return sources


def test_the_image_wheels_have_the_sglang_engine_and_its_hook_and_nothing_else(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in copied_sources():
        origin = ROOT / rel
        target = src / rel
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    out = tmp_path / "wheel"
    for distribution in ("core", "runtime"):  # the Dockerfile's `pip install` of the two
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                str(src / distribution),
                "-w",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    wheels = sorted(out.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["pdwarden", "pdwarden_runtime"]
    names = {n for wheel in wheels for n in zipfile.ZipFile(wheel).namelist()}
    missing = [n for n in NEEDED if n not in names]
    assert not missing, f"the image's pdwarden wheels lack {missing}"
    assert not [n for n in names if n.startswith(NEVER)], (
        "the runtime image would carry more than the runtime"
    )
