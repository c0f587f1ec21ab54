"""Every manifest in tests/data/invalid is rejected by the real API server at `kubectl apply`,
with a message naming the offending field, and nothing is created (a stored model that a newer
rule refuses: tests/e2e/test_operator_outlived_model.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdwarden_localcluster.testing import Kubectl

from ._operator_helpers import ROOT, kubectl_with_crd, new_namespace

pytestmark = pytest.mark.e2e

INVALID = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))


def expected_field(path: Path) -> str:
    return path.read_text().splitlines()[0].removeprefix("# expect: ").strip()


@pytest.fixture(scope="module")
def kubectl(cluster) -> Kubectl:  # type: ignore[no-untyped-def]
    return kubectl_with_crd(cluster.kubeconfig)


@pytest.fixture(scope="module")
def namespace(kubectl: Kubectl) -> Iterator[str]:
    yield from new_namespace(kubectl, "pdwe-invalid-")


def test_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25


@pytest.fixture(scope="module")
def rejections(kubectl: Kubectl, namespace: str) -> dict[Path, subprocess.CompletedProcess[str]]:
    """`kubectl apply` of every invalid manifest, all done before any test reads the outcome."""
    return {m: kubectl.run("apply", "-n", namespace, "-f", str(m), check=False) for m in INVALID}


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.stem)
def test_api_server_rejects_and_names_the_field(
    rejections: dict[Path, subprocess.CompletedProcess[str]], manifest: Path
) -> None:
    field = expected_field(manifest)
    proc = rejections[manifest]
    assert proc.returncode != 0, f"{manifest.name} was accepted: {proc.stdout}"
    assert field in proc.stderr, f"{manifest.name}: expected {field!r} in: {proc.stderr.strip()}"


def test_nothing_was_created(
    kubectl: Kubectl, namespace: str, rejections: dict[Path, subprocess.CompletedProcess[str]]
) -> None:
    assert len(rejections) == len(INVALID)  # every manifest was applied before looking
    assert kubectl.items("disaggregatedmodels", namespace) == []
    assert kubectl.items("deployments", namespace) == []


def test_a_valid_manifest_is_accepted_in_the_same_namespace(kubectl: Kubectl, namespace: str) -> None:
    """Guards against a corpus that fails for an unrelated reason (CRD missing, RBAC)."""
    proc = kubectl.run(
        "apply", "-n", namespace, "--dry-run=server", "-f", str(ROOT / "examples" / "synthetic.yaml")
    )
    assert "created (server dry run)" in proc.stdout or "configured (server dry run)" in proc.stdout
