"""Every manifest in tests/data/invalid is rejected by the real API server at `kubectl apply`,
with a message naming the offending field, and nothing is created (a stored model that a newer
rule refuses: tests/e2e/test_operator_outlived_model.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pdwarden_operator.models import parse_spec
from pdwarden_operator.reconcile.errors import describe_validation_error
from pdwarden_operator.resource.rules import Part
from pdwarden_testkit.kubectl import Kubectl

from ._operator_helpers import ROOT, kubectl_with_crd, new_namespace

pytestmark = pytest.mark.e2e

INVALID = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))


def _parts(base: type[Part]) -> list[type[Part]]:
    """Every part of the resource (importing models imports them all)."""
    return [m for sub in base.__subclasses__() for m in (sub, *_parts(sub))]


RULED = [m for m in _parts(Part) if m.RULES]


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


def _rule_broken(manifest: Path) -> str | None:
    """The message of the cross-field Rule the manifest breaks, as the models give it."""
    rules = {r.message for model in RULED for r in model.RULES}
    try:
        parse_spec((yaml.safe_load(manifest.read_text()) or {}).get("spec") or {})
    except ValidationError as exc:
        return next((m for m in rules if m in describe_validation_error(exc)), None)
    return None


def test_a_broken_rule_reads_the_same_from_the_api_server_and_the_operator(
    rejections: dict[Path, subprocess.CompletedProcess[str]],
) -> None:
    """A Rule is written once: its CEL and the models' check break on the same manifests, with
    its one message."""
    checked = 0
    for manifest, proc in rejections.items():
        message = _rule_broken(manifest)
        if message is not None:
            checked += 1
            assert message in proc.stderr, f"{manifest.name}: {message!r} not in {proc.stderr.strip()}"
    assert checked >= 20


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
