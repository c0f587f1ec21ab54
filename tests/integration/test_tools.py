"""The pinned kubectl, helm and promtool: the venv runs exactly the binaries the installer pinned."""

from __future__ import annotations

import re
import subprocess

import pytest

from pdwarden_localcluster import tools
from pdwarden_localcluster.paths import venv_bin

pytestmark = pytest.mark.integration


def run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_the_venv_links_point_at_the_pinned_binaries() -> None:
    tools.install(progress=False)
    for name in tools.TOOLS:
        assert (venv_bin() / name).resolve() == tools.tool_path(name).resolve(), name


def test_helm_is_the_pinned_version() -> None:
    out = run(str(tools.require("helm")), "version", "--template", "{{.Version}}")
    assert out.strip() == tools.HELM_VERSION


def test_promtool_is_the_version_of_the_pinned_package() -> None:
    tools.install(progress=False)
    pin = tools.PROMETHEUS_PACKAGE
    package = (pin.directory() / "VERSION").read_text()  # e.g. prometheus_2.42.0+ds-5+deb12u1_amd64.deb
    # apt-get download fetched exactly the pinned version (the .deb name carries it, `:`-free)
    assert package.startswith(f"prometheus_{pin.version}_"), package
    match = re.match(r"prometheus_(\d+\.\d+\.\d+)", package)
    assert match, package
    assert f"promtool, version {match.group(1)}" in run(str(tools.require("promtool")), "--version")
