"""`pdwarden crd --apply`'s pure parts: when a CRD counts as served, what it reports, and the
flags that exclude each other. The apply itself runs against the real API server in
tests/e2e/test_helm_upgrade.py (the chart's pre-upgrade hook)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from pdwarden_operator.cli import crd
from pdwarden_operator.crd import CRD_NAME, build_crd
from pdwarden_operator.crd_install import Applied, CrdNotServed, served_versions

pytestmark = pytest.mark.unit


def stored(**conditions: str) -> dict[str, Any]:
    body = build_crd()
    body["status"] = {
        "conditions": [{"type": t, "status": s, "message": f"{t} says {s}"} for t, s in conditions.items()]
    }
    return body


def test_served_only_once_established_with_its_names_accepted() -> None:
    assert served_versions(stored()) is None
    assert served_versions(stored(NamesAccepted="True")) is None
    assert served_versions(stored(NamesAccepted="True", Established="False")) is None
    assert served_versions(stored(NamesAccepted="True", Established="True")) == ("v1alpha1",)


def test_refused_names_are_an_error_naming_the_crd() -> None:
    with pytest.raises(CrdNotServed, match=f"{CRD_NAME}: names not accepted: NamesAccepted says False"):
        served_versions(stored(NamesAccepted="False", Established="True"))


def test_summary_names_the_change_and_the_versions() -> None:
    applied = Applied(CRD_NAME, "updated", ("v1alpha1",), ("v1alpha1",))
    assert (
        applied.summary()
        == f"customresourcedefinition/{CRD_NAME} updated (served: v1alpha1; stored: v1alpha1)"
    )


@pytest.mark.parametrize("flags", [["--apply", "--write"], ["--apply", "--check"], ["--write", "--check"]])
def test_apply_write_and_check_exclude_each_other(flags: list[str]) -> None:
    result = CliRunner().invoke(crd, flags)
    assert result.exit_code == 2 and "exclude each other" in result.output
