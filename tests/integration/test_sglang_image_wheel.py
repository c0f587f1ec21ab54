"""What runtime/Dockerfile installs: a (non-editable) wheel built from exactly the sources
the Dockerfile copies must carry the sglang engine, the hardening and the start-up hook."""

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
)


def copied_sources() -> list[str]:
    """The COPY sources of runtime/Dockerfile."""
    sources: list[str] = []
    for line in (ROOT / "runtime" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            sources += line.split()[1:-1]
    return sources


def test_the_image_wheel_has_the_sglang_engine_and_its_hook(tmp_path: Path) -> None:
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("pdwarden-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in NEEDED if n not in names]
    assert not missing, f"the image's pdwarden wheel lacks {missing}"
